/* redis.h -- the one Redis connection manager on the libuv loop (hiredis async),
 * shared by the result store (net/backend.c), through it the progress writer,
 * and the gateway's pub/sub (gateway/gw_sub.c).
 *
 * Three layers, each usable alone:
 * - redis_url_parse(): the one Redis URL parser. Pure.
 * - redis_uv_attach(): hiredis async contexts on a libuv loop.
 * - struct redis_conn: one connection kept up -- connect with a timeout,
 *   AUTH / SELECT / PING before it counts as up, reconnect with backoff, a
 *   command timeout and an idle health probe. It keeps no queue: a command
 *   sent while down is refused, and its owner decides (the result store
 *   queues and sends again, the subscriber subscribes again on UP).
 *
 * Names: ours are snake_case redis_url_ / redis_conn_; hiredis's are camelCase
 * (redisAsyncContext, redisReply), so the two never collide.
 * Not thread-safe: loop thread only. */
#ifndef CR_REDIS_H
#define CR_REDIS_H

#include <hiredis/async.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "util/buf.h"
#include "util/err.h"

/* ------------------------------------------------------------ URL (pure) */

#define REDIS_URL_MAX_BYTES 2048 /* a longer URL is refused whole */
#define REDIS_DEFAULT_PORT 6379
#define REDIS_SENTINEL_DEFAULT_PORT 26379
#define REDIS_URL_MAX_SENTINELS 16 /* more ';' entries are refused */

enum redis_url_kind {
    REDIS_URL_TCP,      /* redis:// or rediss:// */
    REDIS_URL_UNIX,     /* redis+socket:// or unix:// */
    REDIS_URL_SENTINEL, /* sentinel://h1[;sentinel://h2...] */
};

/* ssl_cert_reqs, as Python's ssl module names them. */
enum redis_tls_verify {
    REDIS_TLS_VERIFY_NONE,     /* "none", "CERT_NONE" */
    REDIS_TLS_VERIFY_OPTIONAL, /* "optional", "CERT_OPTIONAL" */
    REDIS_TLS_VERIFY_REQUIRED, /* "required", "CERT_REQUIRED" */
};

struct redis_url_tls {
    int on;                          /* rediss:// */
    int cert_reqs_given;             /* ssl_cert_reqs was in the query */
    enum redis_tls_verify cert_reqs; /* REDIS_TLS_VERIFY_NONE when not given */
    int check_hostname;              /* ssl_check_hostname: 1, 0, or -1 when not given */
    char ca_certs[512];              /* ssl_ca_certs: "" when none (the system's store) */
    char certfile[512]; /* ssl_certfile: the client certificate, "" when none */
    char keyfile[512];  /* ssl_keyfile: "" when none (the key is in certfile) */
    char ca_path[512];  /* ssl_ca_path: a directory of CAs, "" when none */
};

struct redis_url_sentinel {
    char host[256];
    int port; /* REDIS_SENTINEL_DEFAULT_PORT when none */
};

struct redis_url {
    enum redis_url_kind kind;
    /* TCP: the server. SENTINEL: the first sentinel until the connection
     * manager has found the master, then the master (what logs show). */
    char host[256];        /* "localhost" when the URL names none; IPv6 without [] */
    int port;              /* REDIS_DEFAULT_PORT when none */
    int db;                /* 0 when none */
    char user[256];        /* "" when none */
    char password[512];    /* "" when none: no AUTH is sent */
    char socket_path[108]; /* UNIX: the socket (sun_path's size) */
    struct redis_url_tls tls;
    /* SENTINEL: the sentinels in the URL's order (db, user and password come
     * from the first entry; the others' are ignored, as kombu does). */
    int n_sentinels;
    struct redis_url_sentinel sentinels[REDIS_URL_MAX_SENTINELS];
};

/* Parses every Redis URL form Celery (kombu, the Redis result backend) takes:
 * - redis://[[user]:password@]host[:port][/db][?query]:
 *   the credentials run to the last '@' of the entry, so a password may hold
 *   '@' and '/' unescaped; they are taken as written (no %XX decoding);
 *   "redis://secret@host" is a password, as some clients spell it; an IPv6
 *   host is written in brackets: redis://[::1]:6380/0; the port is 1..65535,
 *   the database a decimal 0..INT_MAX (Redis refuses a number beyond its
 *   "databases" setting when we SELECT it); query keys are ignored;
 * - rediss://...: the same over TLS. Query keys (values %XX-decoded):
 *   ssl_cert_reqs (required, optional, none, CERT_REQUIRED, CERT_OPTIONAL or
 *   CERT_NONE, exactly), ssl_ca_certs, ssl_ca_path, ssl_certfile,
 *   ssl_keyfile, ssl_check_hostname (true/false/1/0/yes/no; true needs
 *   ssl_cert_reqs other than none); redis-py's other ssl_ keys are refused as
 *   not supported, any other ssl_ key as unknown (kombu passes them all to
 *   redis-py, which refuses names it does not know); an ssl_ key in a
 *   redis:// URL is refused; other keys are ignored. Without ssl_cert_reqs,
 *   Celery's result backend refuses the URL (flag REDIS_URL_TLS_STRICT) while
 *   kombu's broker verifies nothing and warns: then cert_reqs_given is 0 and
 *   the caller warns;
 * - redis+socket:///path/to.sock or unix:///path/to.sock, with the database
 *   in the query as virtual_host=N or db=N and a password as password=...;
 * - sentinel://[[user]:password@]host[:port][/db][;sentinel://host[:port]...]:
 *   up to REDIS_URL_MAX_SENTINELS sentinels (port 26379 when none).
 * what names the URL in messages ("result backend" gives "invalid port in
 * result backend URL '...'"). Returns 0, or CR_EINVAL with detail in err (the
 * password is never quoted); out is then unspecified. */
#define REDIS_URL_TLS_STRICT 1 /* rediss:// needs ssl_cert_reqs */
int redis_url_parse_flags(struct redis_url *out, const char *url, const char *what,
                          int flags, struct cr_err *err);
/* redis_url_parse_flags() with no flags: the broker's rules. */
int redis_url_parse(struct redis_url *out, const char *url, const char *what,
                    struct cr_err *err);

/* ------------------------------------------------------------ TLS */

struct tls_ctx; /* net/tls_pump.h */

/* The TLS settings of a rediss:// URL, loaded (this reads the CA, certificate
 * and key files). Returns a new context for tls_pump_new(), freed with
 * tls_ctx_free(); or NULL with err set (see tls_ctx_new()). */
struct tls_ctx *redis_tls_ctx_new(const struct redis_url_tls *t, struct cr_err *err);

/* ------------------------------------------------------------ libuv glue */

/* Attaches ac to loop. Returns REDIS_OK, or REDIS_ERR (then ac is untouched
 * and the caller frees it). The glue is freed by hiredis through its cleanup
 * hook when the context goes away.
 *
 * Our own glue instead of hiredis's adapters/libuv.h, because that one (as
 * shipped in Debian's hiredis 0.14) drops every poll error: libuv stops a poll
 * handle on POLLERR and reports a negative status, the adapter returns without
 * telling hiredis, and the connection hangs forever with its commands
 * unanswered (seen when Redis is shut down under load). Here an error is handed
 * to hiredis as readiness, so its read or write fails and it disconnects
 * normally, calling every pending callback. */
int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);

/* ------------------------------------------------------------ connection */

struct redis_conn;
struct redisReply;

enum redis_conn_event {
    REDIS_CONN_UP,     /* Redis answered the handshake: commands may be sent */
    REDIS_CONN_FAILED, /* an attempt failed (why); another follows after the backoff */
    REDIS_CONN_LOST,   /* the connection went away (why: hiredis's reason, or
                        * "closed"); a new one follows after the backoff */
    REDIS_CONN_SILENT, /* a command or probe went unanswered for the timeout with
                        * nothing heard meanwhile: dropped, rebuilt as LOST is */
};

/* What an event says. why is borrowed for the call (NULL for UP and SILENT). */
struct redis_conn_news {
    const char *why;
    /* FAILED: Redis refused the handshake (WRONGPASS, NOAUTH, a bad database):
     * retrying the same credentials will not help. */
    int refused;
    /* FAILED: worth an error line -- a reason not said since the connection
     * was last up, once it has been up (or after a refusal, see say_refusals);
     * otherwise a debug line. Each reason is loud once per outage. */
    int loud;
};

/* Called for each event from the loop (or from inside redis_conn_wait(), which
 * runs it), never from inside another redis_conn_*() call. The owner must not
 * free the connection from inside it. */
typedef void redis_conn_event_fn(struct redis_conn *c, enum redis_conn_event ev,
                                 const struct redis_conn_news *news, void *privdata);

/* An error reply Redis lifts by itself: out of memory, a replica or a node not
 * writable yet, a dataset still loading, a script still running (OOM, READONLY,
 * LOADING, BUSY, MASTERDOWN, NOREPLICAS, TRYAGAIN). */
int redis_refusal_passes(const char *error);

struct redis_conn_config {
    const struct redis_url *url; /* copied; db 0 sends no SELECT */
    /* Seconds a command (or the probe) may go unanswered, with nothing else
     * heard meanwhile, before the connection counts as lost (SILENT); 0: for
     * ever. */
    double timeout;
    /* Seconds of quiet after which the connection is probed (the timeout then
     * covers the probe); 0: never. */
    double health_check_interval;
    /* The probe: NULL gives PING. Borrowed for the life of the connection. A
     * subscribed connection cannot PING (hiredis 0.14 mixes up its replies),
     * so the gateway's subscriber SUBSCRIBEs a channel nobody publishes on. */
    int probe_argc;
    const char *const *probe_argv;
    /* Which error replies to the handshake still count as an answer (the
     * connection is then up, and the owner meets the condition in its own
     * commands); NULL: redis_refusal_passes(). Any other error is a refusal. */
    int (*handshake_passes)(const char *error);
    /* A refusal is loud even before the first connection: set it when nobody
     * waits for the first connection to report it (redis_conn_wait()). */
    int say_refusals;
    /* sentinel:// only. The master's name (required; copied), and the
     * credentials for the connections to the sentinels (Celery's
     * sentinel_kwargs username/password; NULL or "": none, copied). The
     * URL's own credentials and database are the master's. */
    const char *master_name;
    /* Seconds each connect (and its handshake) may take; 0: 5. */
    double connect_timeout;
    const char *sentinel_user;
    const char *sentinel_password;
    redis_conn_event_fn *on_event;
    void *privdata;
};

/* A command's registration, embedded by its owner (libuv's uv_req_t): it must
 * stay valid until its callback has seen the last reply. */
struct redis_req;
/* reply is borrowed for the call. status 0 with a reply (an error reply too);
 * CR_EBACKEND with NULL when the connection went away unanswered (the LOST or
 * SILENT event, if any, came first); CR_ECANCELED with NULL from inside
 * redis_conn_free(). */
typedef void redis_reply_fn(struct redis_req *req, int status, struct redisReply *reply);
struct redis_req {
    /* public */
    void *data; /* the owner's */
    /* private */
    struct redis_conn *conn;
    redis_reply_fn *cb;
    int counted; /* awaits one reply, under the timeout */
};

/* Returns a new connection that starts connecting at the next loop turn (and
 * again after every loss), or NULL with err set: CR_ENOMEM, or CR_EINVAL for
 * sentinel:// without master_name, or rediss:// whose CA, certificate or key
 * cannot be loaded (read here, once). cfg is copied. Free with
 * redis_conn_free().
 *
 * rediss:// goes through net/tls_pump.h: hiredis connects to the pump's
 * private unix socket, the pump carries the bytes over TLS, and a TLS failure
 * is the attempt's reason ("TLS: certificate verify failed (...)") like any
 * other, with the same backoff.
 *
 * redis+socket:// connects to the unix socket. sentinel:// first asks the
 * sentinels in turn, each over a short-lived connection of its own (AUTH with
 * the sentinel credentials, then SENTINEL get-master-addr-by-name), moves the
 * one that answered to the front, connects to the address it gave and sends
 * ROLE in the handshake: only a "master" answer counts as up, anything else is
 * a failed attempt, and the next one asks the sentinels again. While up, one
 * sentinel connection stays SUBSCRIBEd to +switch-master: a switch of our
 * master, or a -READONLY reply to any command, drops the connection (LOST)
 * and the next attempt finds the new master. Every connect (to a sentinel or
 * to Redis) is bounded by the connect timeout. */
struct redis_conn *redis_conn_new(uv_loop_t *loop, const struct redis_conn_config *cfg,
                                  struct cr_err *err);

/* on: once a reply has begun, read on while the kernel holds more, up to
 * 512 KB per readable event, instead of hiredis's one 16 KB read per loop
 * turn. For a connection whose replies are large and wanted whole at once: a
 * Redis broker's pop replies of a few hundred envelopes came in over as many
 * turns as they had 16 KB pieces, each turn as long as the busiest other work
 * (a batch of finished LLM calls), and the intake stalled for most of a
 * second. Not for every connection, nor always: where small replies stream
 * in, or where a quick turnover rewards interleaving a reply's messages with
 * the rest of the loop's work, reading on cost up to half the dispatch rate
 * (docs/benchmarks.md). Kept across reconnects; 0 at first. */
void redis_conn_read_on(struct redis_conn *c, int on);

/* Runs the loop until up or timeout_ms passes. For start-up only. Returns 0,
 * CR_EPEER at once when Redis refused the handshake, or CR_ETIMEDOUT; the
 * reason is redis_conn_last_error(). */
int redis_conn_wait(struct redis_conn *c, int timeout_ms);

/* Sends a command with one reply (argv copied; argvlen NULL: strlen), which
 * the timeout then covers. cb is called exactly once if this returns 0, never
 * from inside this call. Returns 0, or CR_EBACKEND when not up or when hiredis
 * cannot take it (cb never called). When hiredis's output buffer holds
 * 64 KiB or more, what the socket takes is written at once (see write_ahead). */
int redis_conn_send(struct redis_conn *c, struct redis_req *req, redis_reply_fn *cb,
                    int argc, const char *const *argv, const size_t *argvlen);

/* SUBSCRIBE / UNSUBSCRIBE and their kin: cb is called for every reply to the
 * command, the confirmations and then the messages, until the subscription
 * ends or the connection goes; they are not awaited under the timeout.
 * Otherwise as redis_conn_send(). */
int redis_conn_send_pubsub(struct redis_conn *c, struct redis_req *req,
                           redis_reply_fn *cb, int argc, const char *const *argv,
                           const size_t *argvlen);

/* read-only */
int redis_conn_up(const struct redis_conn *c);
const struct redis_url *redis_conn_url(const struct redis_conn *c);
/* The last failure (hiredis's or Redis's words), "" once up. */
const char *redis_conn_last_error(const struct redis_conn *c);
/* Connections made (TCP up): tells one from the next. */
unsigned long redis_conn_generation(const struct redis_conn *c);
/* Times it came up again after having been up. */
unsigned long redis_conn_reconnects(const struct redis_conn *c);
/* Connection attempts that failed (FAILED events), all told: a start-up
 * wait can stop at the next one and say why. */
unsigned long redis_conn_failures(const struct redis_conn *c);
/* 1 when Redis refused the last handshake (AUTH, SELECT): the same
 * credentials will not do better. */
int redis_conn_refused(const struct redis_conn *c);
/* Commands sent by redis_conn_send() and not yet answered. */
size_t redis_conn_inflight(const struct redis_conn *c);
uint64_t redis_conn_timeout_ms(const struct redis_conn *c);

/* Disconnects: every registered callback gets CR_ECANCELED before this
 * returns; no event afterwards. The memory goes at the next loop turn.
 * NULL is a no-op. */
void redis_conn_free(struct redis_conn *c);

/* The arguments of one command, gathered in one buffer for
 * redis_conn_send(). Embed it: redis_args_init() / redis_args_release(). An
 * allocation that fails marks it (oom), and later adds do nothing: a caller
 * checks once, at redis_args_argv(). */
struct redis_args {
    /* read-only */
    size_t *len; /* each argument's length */
    int n;
    int oom;
    /* private */
    struct buf store;
    size_t *off;
    const char **argv;
    int cap;
};

void redis_args_init(struct redis_args *a);
void redis_args_release(struct redis_args *a);
/* Adds n bytes at p (copied) as one argument. */
void redis_args_add(struct redis_args *a, const void *p, size_t n);
/* Adds a NUL-terminated string as one argument. */
void redis_args_s(struct redis_args *a, const char *s);
/* The argv of the arguments gathered, or NULL on OOM. Valid until the next
 * redis_args_add() or redis_args_release(). */
const char **redis_args_argv(struct redis_args *a);

#endif
