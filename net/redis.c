/* redis.c -- the one Redis URL parser, hiredis async glue for libuv that
 * reports poll errors, and the connection manager on top of them. */
#include "redis.h"

#include <ctype.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "net/tls_pump.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/pct.h"

/* ------------------------------------------------------------ URL (pure) */

/* The entry as messages may show it: whatever stands for a password (after
 * the user's ':', or the whole of "secret@") becomes "**". scheme_len: the
 * bytes of "redis://" or its kin at the start of url. */
static void shown_url(const char *url, size_t scheme_len, const char *at,
                      const char *colon, char *out, size_t size)
{
    if (!at)
        snprintf(out, size, "%.*s", (int)(size - 1), url);
    else if (colon)
        snprintf(out, size, "%.*s:**%s", (int)(colon - url), url, at);
    else
        snprintf(out, size, "%.*s**%s", (int)scheme_len, url, at);
}

/* Copies [s, s+n) into out (size bytes); 0, or -1 when it does not fit. */
static int copy_part(char *out, size_t size, const char *s, size_t n)
{
    if (n >= size)
        return -1;
    memcpy(out, s, n);
    out[n] = '\0';
    return 0;
}

/* A database number: decimal 0..INT_MAX, the whole of [s, s+n). */
static int parse_db(const char *s, size_t n, int *db)
{
    long v = 0;
    if (!n || n > 10)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v > INT_MAX)
        return -1;
    *db = (int)v;
    return 0;
}

static int key_is(const char *k, size_t kn, const char *name)
{
    return kn == strlen(name) && !memcmp(k, name, kn);
}

/* One key=value of the query. */
static int query_pair(struct redis_url *out, const char *k, size_t kn, const char *v,
                      size_t vn, const char *what, const char *shown, struct cr_err *err)
{
    char val[512];
    /* %XX and '+' decoded as Python's parse_qs does */
    if (pct_decode(val, sizeof(val), v, vn, PCT_PLUS, NULL))
        return cr_err_set(err, CR_EINVAL, "%s URL option '%.*s' too long in '%s'", what,
                          (int)kn, k, shown);
    if (out->kind == REDIS_URL_UNIX) {
        if (key_is(k, kn, "virtual_host") || key_is(k, kn, "db")) {
            if (parse_db(val, strlen(val), &out->db))
                return cr_err_set(err, CR_EINVAL, "invalid database in %s URL '%s'", what,
                                  shown);
        } else if (key_is(k, kn, "password")) {
            snprintf(out->password, sizeof(out->password), "%s", val);
        }
        return 0;
    }
    if (kn < 4 || memcmp(k, "ssl_", 4))
        return 0;
    /* kombu would turn a redis:// URL with ssl_ keys into TLS, Celery's
     * result backend refuses it: we refuse it for both rather than guess. */
    if (!out->tls.on)
        return cr_err_set(err, CR_EINVAL,
                          "%s URL '%s' has TLS option '%.*s' but is not rediss://", what,
                          shown, (int)kn, k);
    if (key_is(k, kn, "ssl_cert_reqs")) {
        /* The six spellings kombu and Celery take, and no others. */
        if (!strcmp(val, "required") || !strcmp(val, "CERT_REQUIRED"))
            out->tls.cert_reqs = REDIS_TLS_VERIFY_REQUIRED;
        else if (!strcmp(val, "optional") || !strcmp(val, "CERT_OPTIONAL"))
            out->tls.cert_reqs = REDIS_TLS_VERIFY_OPTIONAL;
        else if (!strcmp(val, "none") || !strcmp(val, "CERT_NONE"))
            out->tls.cert_reqs = REDIS_TLS_VERIFY_NONE;
        else
            return cr_err_set(err, CR_EINVAL,
                              "invalid ssl_cert_reqs '%s' in %s URL (want required, "
                              "optional or none, or CERT_REQUIRED, CERT_OPTIONAL or "
                              "CERT_NONE)",
                              val, what);
        out->tls.cert_reqs_given = 1;
    } else if (key_is(k, kn, "ssl_check_hostname")) {
        if (!strcasecmp(val, "true") || !strcmp(val, "1") || !strcasecmp(val, "yes"))
            out->tls.check_hostname = 1;
        else if (!strcasecmp(val, "false") || !strcmp(val, "0") || !strcasecmp(val, "no"))
            out->tls.check_hostname = 0;
        else
            return cr_err_set(err, CR_EINVAL,
                              "invalid ssl_check_hostname '%s' in %s URL (want true or "
                              "false)",
                              val, what);
    } else if (key_is(k, kn, "ssl_ca_certs")) {
        snprintf(out->tls.ca_certs, sizeof(out->tls.ca_certs), "%s", val);
    } else if (key_is(k, kn, "ssl_certfile")) {
        snprintf(out->tls.certfile, sizeof(out->tls.certfile), "%s", val);
    } else if (key_is(k, kn, "ssl_keyfile")) {
        snprintf(out->tls.keyfile, sizeof(out->tls.keyfile), "%s", val);
    } else if (key_is(k, kn, "ssl_ca_path")) {
        snprintf(out->tls.ca_path, sizeof(out->tls.ca_path), "%s", val);
    } else if (key_is(k, kn, "ssl_ca_data") || key_is(k, kn, "ssl_password") ||
               key_is(k, kn, "ssl_validate_ocsp") ||
               key_is(k, kn, "ssl_validate_ocsp_stapled") ||
               key_is(k, kn, "ssl_ocsp_context") ||
               key_is(k, kn, "ssl_ocsp_expected_cert")) {
        /* redis-py's, which celeriac does not do: refused rather than
         * silently dropped, since each one weakens or changes the check. */
        return cr_err_set(err, CR_EINVAL, "TLS option '%.*s' in %s URL is not supported",
                          (int)kn, k, what);
    } else {
        /* kombu hands every ssl_ key to redis-py, which refuses a name it
         * does not know (TypeError): a typo must not go unnoticed. */
        return cr_err_set(err, CR_EINVAL,
                          "unknown TLS option '%.*s' in %s URL (want ssl_cert_reqs, "
                          "ssl_ca_certs, ssl_ca_path, ssl_certfile, ssl_keyfile or "
                          "ssl_check_hostname)",
                          (int)kn, k, what);
    }
    return 0;
}

/* The query after '?' (q points past it), up to end. */
static int parse_query(struct redis_url *out, const char *q, const char *end,
                       const char *what, const char *shown, struct cr_err *err)
{
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        if (eq && query_pair(out, q, (size_t)(eq - q), eq + 1, (size_t)(stop - eq - 1),
                             what, shown, err))
            return err->code;
        q = stop + (amp ? 1 : 0);
    }
    return 0;
}

/* host[:port][/db] of one entry, from p (past the credentials) to end; the
 * query, if any, is left at *query. */
static int parse_host(const char *p, const char *end, char *host, size_t host_size,
                      int *port, int *db, const char **query, const char *what,
                      const char *shown, struct cr_err *err)
{
    const char *hostend;
    if (*p == '[') { /* [v6]:port */
        const char *close = memchr(p, ']', (size_t)(end - p));
        if (!close || close == p + 1 || (close + 1 < end && !strchr(":/?", close[1])))
            return cr_err_set(err, CR_EINVAL, "invalid IPv6 host in %s URL '%s'", what,
                              shown);
        if (copy_part(host, host_size, p + 1, (size_t)(close - p - 1)))
            return cr_err_set(err, CR_EINVAL, "%s host name too long in '%s'", what,
                              shown);
        hostend = close + 1;
    } else {
        hostend = p;
        while (hostend < end && !strchr(":/?", *hostend))
            hostend++;
        if (hostend > p && copy_part(host, host_size, p, (size_t)(hostend - p)))
            return cr_err_set(err, CR_EINVAL, "%s host name too long in '%s'", what,
                              shown);
    }
    p = hostend;
    if (p < end && *p == ':') {
        long v = 0;
        const char *d = p + 1;
        while (d < end && isdigit((unsigned char)*d) && v <= 65535)
            v = v * 10 + (*d++ - '0');
        if (d == p + 1 || v <= 0 || v > 65535 || (d < end && *d != '/' && *d != '?'))
            return cr_err_set(err, CR_EINVAL, "invalid port in %s URL '%s'", what, shown);
        *port = (int)v;
        p = d;
    }
    if (p < end && *p == '/' && p + 1 < end && p[1] != '?') {
        const char *q = memchr(p, '?', (size_t)(end - p));
        const char *dbend = q ? q : end;
        if (parse_db(p + 1, (size_t)(dbend - p - 1), db))
            return cr_err_set(err, CR_EINVAL, "invalid database in %s URL '%s'", what,
                              shown);
        p = dbend;
    }
    *query = memchr(p, '?', (size_t)(end - p));
    return 0;
}

/* Credentials from scheme_len to the last '@' of [url, end). */
static int parse_creds(const char *url, const char *end, size_t scheme_len, char *user,
                       size_t user_size, char *password, size_t password_size,
                       const char **rest, char *shown, size_t shown_size,
                       const char *what, struct cr_err *err)
{
    const char *p = url + scheme_len, *at = NULL, *colon = NULL;
    char entry[REDIS_URL_MAX_BYTES + 1];
    for (const char *s = p; s < end; s++)
        if (*s == '@')
            at = s;
    if (at)
        colon = memchr(p, ':', (size_t)(at - p));
    memcpy(entry, url, (size_t)(end - url));
    entry[end - url] = '\0';
    shown_url(entry, scheme_len, at ? entry + (at - url) : NULL,
              colon ? entry + (colon - url) : NULL, shown, shown_size);
    *rest = p;
    if (!at)
        return 0;
    /* redis://password@host is how some clients spell it. */
    {
        const char *pw = colon ? colon + 1 : p;
        if (colon && copy_part(user, user_size, p, (size_t)(colon - p)))
            return cr_err_set(err, CR_EINVAL, "%s URL user name too long in '%s'", what,
                              shown);
        if (copy_part(password, password_size, pw, (size_t)(at - pw)))
            return cr_err_set(err, CR_EINVAL, "%s URL password too long in '%s'", what,
                              shown);
    }
    *rest = at + 1;
    return 0;
}

static int parse_sentinels(struct redis_url *out, const char *url, const char *what,
                           struct cr_err *err)
{
    const char *p = url;
    char shown[512];
    for (;;) {
        const char *semi = strchr(p, ';');
        const char *end = semi ? semi : p + strlen(p), *rest, *query;
        struct redis_url_sentinel *s;
        char user[256] = "", password[512] = "";
        int db = 0;

        if (strncmp(p, "sentinel://", 11) || end < p + 11)
            return cr_err_set(err, CR_EINVAL,
                              "%s URL entry %d is not sentinel:// (each ';' entry must "
                              "be)",
                              what, out->n_sentinels + 1);
        if (out->n_sentinels == REDIS_URL_MAX_SENTINELS)
            return cr_err_set(err, CR_EINVAL, "%s URL lists more than %d sentinels", what,
                              REDIS_URL_MAX_SENTINELS);
        s = &out->sentinels[out->n_sentinels];
        snprintf(s->host, sizeof(s->host), "localhost");
        s->port = REDIS_SENTINEL_DEFAULT_PORT;
        if (parse_creds(p, end, 11, user, sizeof(user), password, sizeof(password), &rest,
                        shown, sizeof(shown), what, err) ||
            parse_host(rest, end, s->host, sizeof(s->host), &s->port, &db, &query, what,
                       shown, err))
            return err->code;
        if (out->n_sentinels == 0) {
            memcpy(out->user, user, sizeof(user));
            memcpy(out->password, password, sizeof(password));
            out->db = db;
        }
        out->n_sentinels++;
        if (!semi)
            break;
        p = semi + 1;
    }
    memcpy(out->host, out->sentinels[0].host, sizeof(out->host));
    out->port = out->sentinels[0].port;
    return 0;
}

int redis_url_parse_flags(struct redis_url *out, const char *url, const char *what,
                          int flags, struct cr_err *err)
{
    const char *end, *rest, *query = NULL;
    char shown[512];
    size_t len, scheme_len;

    memset(out, 0, sizeof(*out));
    snprintf(out->host, sizeof(out->host), "localhost");
    out->port = REDIS_DEFAULT_PORT;
    out->tls.check_hostname = -1;
    len = strnlen(url, REDIS_URL_MAX_BYTES + 1);
    if (!strncmp(url, "redis://", 8)) {
        scheme_len = 8;
    } else if (!strncmp(url, "rediss://", 9)) {
        scheme_len = 9;
        out->tls.on = 1;
    } else if (!strncmp(url, "redis+socket://", 15) || !strncmp(url, "unix://", 7)) {
        out->kind = REDIS_URL_UNIX;
        scheme_len = url[0] == 'u' ? 7 : 15;
    } else if (!strncmp(url, "sentinel://", 11)) {
        out->kind = REDIS_URL_SENTINEL;
        scheme_len = 11;
    } else {
        return cr_err_set(err, CR_EINVAL,
                          "unsupported %s URL (want redis://, rediss://, "
                          "redis+socket://, unix:// or sentinel://)",
                          what);
    }
    if (len > REDIS_URL_MAX_BYTES)
        return cr_err_set(err, CR_EINVAL, "%s URL too long (over %d bytes)", what,
                          REDIS_URL_MAX_BYTES);
    end = url + len;
    if (out->kind == REDIS_URL_SENTINEL)
        return parse_sentinels(out, url, what, err);
    if (out->kind == REDIS_URL_UNIX) {
        const char *path = url + scheme_len, *q = strchr(path, '?');
        size_t n = q ? (size_t)(q - path) : strlen(path);
        if (path[0] != '/' || n < 2)
            return cr_err_set(err, CR_EINVAL,
                              "%s URL '%s' names no socket path (want "
                              "redis+socket:///path/to.sock)",
                              what, url);
        if (copy_part(out->socket_path, sizeof(out->socket_path), path, n))
            return cr_err_set(err, CR_EINVAL,
                              "%s URL socket path too long (over %zu "
                              "bytes)",
                              what, sizeof(out->socket_path) - 1);
        /* The query may hold a password: never quote it. */
        snprintf(shown, sizeof(shown), "%.*s", (int)(scheme_len + n), url);
        return q ? parse_query(out, q + 1, end, what, shown, err) : 0;
    }
    if (parse_creds(url, end, scheme_len, out->user, sizeof(out->user), out->password,
                    sizeof(out->password), &rest, shown, sizeof(shown), what, err) ||
        parse_host(rest, end, out->host, sizeof(out->host), &out->port, &out->db, &query,
                   what, shown, err))
        return err->code;
    if (query && parse_query(out, query + 1, end, what, shown, err))
        return err->code;
    if (out->tls.on && out->tls.check_hostname == 1 &&
        out->tls.cert_reqs == REDIS_TLS_VERIFY_NONE)
        /* Python's ssl refuses the pair too (ValueError). */
        return cr_err_set(err, CR_EINVAL,
                          "%s URL asks for ssl_check_hostname without checking the "
                          "certificate: set ssl_cert_reqs=required",
                          what);
    if (out->tls.on && !out->tls.cert_reqs_given && (flags & REDIS_URL_TLS_STRICT))
        return cr_err_set(err, CR_EINVAL,
                          "%s URL is rediss:// without ssl_cert_reqs: add "
                          "?ssl_cert_reqs=required (or optional, or none) as Celery "
                          "requires",
                          what);
    return 0;
}

int redis_url_parse(struct redis_url *out, const char *url, const char *what,
                    struct cr_err *err)
{
    return redis_url_parse_flags(out, url, what, 0, err);
}

/* ------------------------------------------------------------ libuv glue */

struct redis_uv {
    redisAsyncContext *ac; /* NULL once hiredis has let go */
    uv_poll_t poll;
    int events;  /* what hiredis wants watched */
    int polled;  /* what the poll handle watches */
    int read_on; /* see redis_conn_read_on() */
};

/* hiredis reads per readable event with read_on, at most (16 KB each:
 * 512 KB). */
#define READS_PER_EVENT 32

/* A reply begun but not yet whole in hiredis's reader: bytes left unparsed,
 * or an array with elements still to come. */
static int reply_partial(const redisAsyncContext *ac)
{
    const redisReader *rd = ac->c.reader;
    return rd && (rd->ridx >= 0 || rd->pos < rd->len);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct redis_uv *r = h->data;
    if (status < 0) {
        r->polled = 0;
        /* libuv has stopped the handle: let hiredis find the error itself.
         * A write attempt covers a failed connect, a read everything else. */
        if (r->ac && (r->ac->c.flags & REDIS_CONNECTED))
            redisAsyncHandleRead(r->ac);
        else if (r->ac)
            redisAsyncHandleWrite(r->ac);
        return;
    }
    if (r->ac && (events & UV_READABLE)) {
        /* hiredis reads 16 KB a call; with read_on a begun reply is read on
         * while the kernel holds more (redis_conn_read_on()). */
        redisAsyncHandleRead(r->ac);
        for (int i = 1;
             r->ac && r->read_on && i < READS_PER_EVENT && reply_partial(r->ac); i++) {
            int pending = 0;
            if (ioctl(r->ac->c.fd, FIONREAD, &pending) != 0 || pending <= 0)
                break;
            redisAsyncHandleRead(r->ac);
        }
    }
    /* The read may have freed the context (disconnect): check again. */
    if (r->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(r->ac);
}

/* hiredis asks for the write event on every command, though it is already
 * watched while its buffer waits. libuv's uv_poll_start() takes the descriptor
 * out of epoll and puts it back even when nothing changes: two system calls
 * per command, four per task in the concurrency bench. */
static void update(struct redis_uv *r)
{
    if (r->events == r->polled)
        return;
    r->polled = r->events;
    if (r->events)
        uv_poll_start(&r->poll, r->events, on_poll);
    else
        uv_poll_stop(&r->poll);
}

static void add_read(void *p)
{
    struct redis_uv *r = p;
    r->events |= UV_READABLE;
    update(r);
}

static void del_read(void *p)
{
    struct redis_uv *r = p;
    r->events &= ~UV_READABLE;
    update(r);
}

static void add_write(void *p)
{
    struct redis_uv *r = p;
    r->events |= UV_WRITABLE;
    update(r);
}

static void del_write(void *p)
{
    struct redis_uv *r = p;
    r->events &= ~UV_WRITABLE;
    update(r);
}

static void on_closed(uv_handle_t *h)
{
    cr_free(h->data);
}

static void cleanup(void *p)
{
    struct redis_uv *r = p;
    r->ac = NULL;
    uv_poll_stop(&r->poll);
    uv_close((uv_handle_t *)&r->poll, on_closed);
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    struct redis_uv *r;
    if (ac->ev.data)
        return REDIS_ERR;
    r = cr_calloc(1, sizeof(*r));
    if (!r)
        return REDIS_ERR;
    if (uv_poll_init_socket(loop, &r->poll, ac->c.fd) != 0) {
        cr_free(r);
        return REDIS_ERR;
    }
    r->ac = ac;
    r->poll.data = r;
    ac->ev.data = r;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    return REDIS_OK;
}

/* The glue of an attached context (NULL once hiredis has let go). */
static void uv_read_on(redisAsyncContext *ac, int on)
{
    struct redis_uv *r = ac->ev.data;
    if (r)
        r->read_on = on;
}

/* ------------------------------------------------------------ connection */

#define CONNECT_TIMEOUT_MS 5000
#define RECONNECT_MAX_MS 5000
/* Commands queued in hiredis's output buffer beyond this are written at once
 * rather than at the socket's next write event (see redis_conn_send()). */
#define EAGER_WRITE_BYTES (64 * 1024)

struct redis_conn {
    uv_loop_t *loop;
    struct redis_url url;
    uint64_t timeout_ms; /* 0: none */
    uint64_t health_ms;  /* 0: no probe */
    uint64_t connect_ms;
    int probe_argc;
    const char *const *probe_argv;
    int (*handshake_passes)(const char *error);
    int say_refusals;
    int read_on; /* redis_conn_read_on(), kept across reconnects */
    redis_conn_event_fn *on_event;
    void *privdata;

    /* sentinel:// only */
    char master_name[256];
    char sentinel_user[256];
    char sentinel_password[512];
    int order[REDIS_URL_MAX_SENTINELS]; /* url.sentinels[], the last that answered first
                                         */
    redisAsyncContext *disc; /* asking order[disc_at] for the master, or NULL */
    int disc_at;
    char disc_why[200];          /* why the last sentinel asked did not tell */
    redisAsyncContext *watch_ac; /* SUBSCRIBEd to +switch-master, or NULL */

    redisAsyncContext *ac; /* NULL while disconnected */
    /* rediss:// only: the settings, loaded by redis_conn_new(), and the pump
     * that carries ac over TLS (NULL while there is no ac). hiredis talks to
     * the pump's unix socket; the pump ends with ac (end_pump()). */
    struct tls_ctx *tls;
    struct tls_pump *pump;
    int up;        /* Redis answered the handshake: commands may be sent */
    int handshake; /* handshake replies still awaited on ac */
    int refused;   /* the last handshake was refused (AUTH, SELECT) */
    int freeing;
    int ever_up;
    int loud; /* failures are worth an error line (see redis_conn_news) */
    unsigned long reconnects;
    unsigned long generation;
    unsigned long failures; /* attempts failed, all told */
    int64_t backoff_ms;
    /* The one deadline of the connection's state: the first connect, the
     * connect (and handshake) timeout, the reconnect delay, or while up the
     * watchdog of on_watch(). Closed by redis_conn_free(), whose close
     * callback frees the struct. */
    uv_timer_t timer;
    char last_error[200];
    char said[200]; /* the failure last said loudly: each said once */

    uint64_t heard_ms;  /* last reply, or the send that ended a quiet spell */
    uint64_t watch_due; /* when the watchdog fires next, while up */
    int probe_out;      /* a health probe is unanswered */
    size_t inflight;    /* redis_conn_send() commands unanswered */
};

static const char *const ping_argv[] = {"PING"};

/* Frees the pump of the connection that has just gone. Its reason, when it
 * had one, is the better one: hiredis only saw its socket closed. Returns
 * why, or the pump's reason copied into buf. */
static const char *end_pump(struct redis_conn *c, const char *why, char *buf, size_t size)
{
    if (!c->pump)
        return why;
    if (tls_pump_error(c->pump)[0] && buf) {
        snprintf(buf, size, "%s", tls_pump_error(c->pump));
        why = buf;
    }
    tls_pump_free(c->pump);
    c->pump = NULL;
    return why;
}

static void start_connect(struct redis_conn *c);
static void start_switch_watch(struct redis_conn *c);

static void emit(struct redis_conn *c, enum redis_conn_event ev, const char *why,
                 int refused, int loud)
{
    struct redis_conn_news news = {why, refused, loud};
    c->on_event(c, ev, &news, c->privdata);
}

/* A timer callback gets the timer, not the connection: go through its data. */
static void on_reconnect_timer(uv_timer_t *t)
{
    start_connect(t->data);
}

static void schedule_reconnect(struct redis_conn *c)
{
    if (c->freeing)
        return;
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : 250;
    if (c->backoff_ms > RECONNECT_MAX_MS)
        c->backoff_ms = RECONNECT_MAX_MS;
    uv_timer_start(&c->timer, on_reconnect_timer, (uint64_t)c->backoff_ms, 0);
}

/* A connection attempt failed. Loud once per distinct reason, not at each
 * retry of an outage; before the first connection not at all (unless
 * say_refusals and Redis refused), as redis_conn_wait() reports the last
 * reason. */
static void connect_failed(struct redis_conn *c, const char *why, int refused)
{
    int loud;
    snprintf(c->last_error, sizeof(c->last_error), "%s", why);
    c->failures++;
    loud = c->loud && strcmp(c->last_error, c->said);
    if (loud)
        snprintf(c->said, sizeof(c->said), "%s", c->last_error);
    emit(c, REDIS_CONN_FAILED, c->last_error, refused, loud);
    schedule_reconnect(c);
}

/* Ends the connection at once. Detached first, so that no callback of it
 * schedules anything: the unanswered commands come back to their callbacks
 * with CR_EBACKEND; the caller decides what follows. Safe inside one of its
 * reply callbacks, where hiredis defers the free until the callback returns. */
static void drop_connection(struct redis_conn *c)
{
    redisAsyncContext *ac = c->ac;
    c->up = 0;
    c->handshake = 0;
    c->probe_out = 0;
    c->ac = NULL;
    ac->data = NULL;
    redisAsyncFree(ac);
    end_pump(c, NULL, NULL, 0);
}

static void on_watch(uv_timer_t *t);

/* Makes the watchdog fire no later than due (an absolute uv_now() time).
 * Only ever brought forward here: when it fires early, on_watch() works out
 * the real deadline and sets it again, so a busy connection does not restart
 * the timer at every command. */
static void watch_by(struct redis_conn *c, uint64_t due)
{
    uint64_t now = uv_now(c->loop);
    if (uv_is_active((uv_handle_t *)&c->timer) && c->watch_due <= due)
        return;
    c->watch_due = due;
    uv_timer_start(&c->timer, on_watch, due > now ? due - now : 0, 0);
}

static void on_probe(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    if (c->freeing || ac != c->ac || !r)
        return; /* a lost connection: on_disconnect() or drop_connection() */
    c->probe_out = 0;
    c->heard_ms = uv_now(c->loop);
    if (!c->inflight && c->health_ms)
        watch_by(c, c->heard_ms + c->health_ms);
}

/* While up: a command unanswered for the timeout with nothing heard meanwhile
 * means the connection is gone though its socket is open (a partition drops
 * packets, and TCP would take many minutes to give up). It is dropped and
 * rebuilt by the path an error takes, so what was in flight comes back to its
 * owner to send again. Quiet for the health-check interval, it sends the
 * probe, which the timeout then covers. */
static void on_watch(uv_timer_t *t)
{
    struct redis_conn *c = t->data;
    uint64_t now = uv_now(c->loop), quiet = now - c->heard_ms;

    if (!c->up || !c->ac)
        return;
    if (c->inflight || c->probe_out) {
        if (!c->timeout_ms)
            return;
        if (quiet < c->timeout_ms) {
            watch_by(c, c->heard_ms + c->timeout_ms);
            return;
        }
        drop_connection(c);
        emit(c, REDIS_CONN_SILENT, NULL, 0, 0);
        schedule_reconnect(c);
        return;
    }
    if (!c->health_ms)
        return;
    if (quiet < c->health_ms) {
        watch_by(c, c->heard_ms + c->health_ms);
        return;
    }
    if (redisAsyncCommandArgv(c->ac, on_probe, c, c->probe_argc,
                              (const char **)c->probe_argv, NULL) != REDIS_OK)
        return;
    c->probe_out = 1;
    c->heard_ms = now;
    if (c->timeout_ms)
        watch_by(c, now + c->timeout_ms);
}

/* Redis answered the handshake: the connection is up. */
static void connection_up(struct redis_conn *c)
{
    uv_timer_stop(&c->timer);
    if (c->ever_up)
        c->reconnects++;
    c->ever_up = 1;
    c->loud = 1;
    c->up = 1;
    c->refused = 0;
    c->backoff_ms = 0;
    c->last_error[0] = '\0';
    c->said[0] = '\0';
    c->probe_out = 0;
    c->heard_ms = uv_now(c->loop);
    if (c->health_ms)
        watch_by(c, c->heard_ms + c->health_ms);
    start_switch_watch(c);
    emit(c, REDIS_CONN_UP, NULL, 0, 0);
}

/* A reply to AUTH, SELECT or the PING that stands in for them. Until all
 * have come back without error the connection does not count: a wrong
 * password is then one failed connect, not "up" followed by every command
 * refused with NOAUTH. An error Redis lifts by itself (LOADING, BUSY...) is an
 * answer (as handshake_passes says), and the owner's commands meet it. */
static void on_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    redisReply *reply = r;

    if (c->freeing || ac != c->ac || !reply || c->up)
        return;
    if (reply->type == REDIS_REPLY_ERROR && !c->handshake_passes(reply->str)) {
        char why[sizeof(c->last_error)];
        snprintf(why, sizeof(why), "%s", reply->str);
        c->refused = 1;
        if (c->say_refusals)
            c->loud = 1;
        drop_connection(c);
        connect_failed(c, why, 1);
        return;
    }
    if (--c->handshake == 0)
        connection_up(c);
}

/* The reply to ROLE, on sentinel:// connections: the server must say it is
 * the master, else the attempt fails and the next one asks the sentinels
 * again (they may not have noticed a failover yet). */
static void on_role(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    redisReply *reply = r, *first;
    char why[sizeof(c->last_error)];

    if (c->freeing || ac != c->ac || !reply || c->up)
        return;
    first =
        reply->type == REDIS_REPLY_ARRAY && reply->elements ? reply->element[0] : NULL;
    if (first &&
        (first->type == REDIS_REPLY_STRING || first->type == REDIS_REPLY_STATUS) &&
        first->len == 6 && !memcmp(first->str, "master", 6)) {
        if (--c->handshake == 0)
            connection_up(c);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR)
        snprintf(why, sizeof(why), "ROLE refused by %.60s:%d: %.100s", c->url.host,
                 c->url.port, reply->str);
    else
        snprintf(why, sizeof(why),
                 "%.60s:%d, named by the sentinels, is not a master (ROLE "
                 "says %.20s)",
                 c->url.host, c->url.port,
                 first && first->type == REDIS_REPLY_STRING ? first->str : "?");
    drop_connection(c);
    connect_failed(c, why, 0);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;

    if (!c)
        return;
    if (status != REDIS_OK) {
        char buf[sizeof(c->last_error)];
        /* hiredis frees the context after this callback. */
        c->ac = NULL;
        connect_failed(c, end_pump(c, ac->errstr, buf, sizeof(buf)), 0);
        return;
    }
    c->generation++;
    /* The connect timeout goes on running until Redis has answered these,
     * which go first on the wire; commands wait for connection_up(). */
    c->handshake = 0;
    if (c->url.password[0]) {
        if (c->url.user[0])
            redisAsyncCommand(ac, on_handshake, c, "AUTH %s %s", c->url.user,
                              c->url.password);
        else
            redisAsyncCommand(ac, on_handshake, c, "AUTH %s", c->url.password);
        c->handshake++;
    }
    if (c->url.db) {
        redisAsyncCommand(ac, on_handshake, c, "SELECT %d", c->url.db);
        c->handshake++;
    }
    if (c->url.kind == REDIS_URL_SENTINEL) {
        /* A sentinel's answer may be stale (a failover under way, or a
         * sentinel cut off from the others): only the server knows. */
        redisAsyncCommand(ac, on_role, c, "ROLE");
        c->handshake++;
    }
    if (!c->handshake) {
        /* TCP alone proves nothing: a proxy or a load balancer accepts
         * connections for a Redis that may not answer. */
        redisAsyncCommand(ac, on_handshake, c, "PING");
        c->handshake++;
    }
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    char buf[sizeof(c->last_error)];
    const char *why;
    (void)status;
    if (!c)
        return;
    c->ac = NULL;
    c->probe_out = 0;
    why = end_pump(c, cac->errstr[0] ? cac->errstr : NULL, buf, sizeof(buf));
    if (c->handshake) {
        c->handshake = 0;
        connect_failed(c, why ? why : "connection closed", 0);
        return;
    }
    if (c->up) {
        c->up = 0;
        emit(c, REDIS_CONN_LOST, why ? why : "closed", 0, 0);
    }
    schedule_reconnect(c);
}

static void on_connect_timeout(uv_timer_t *t)
{
    struct redis_conn *c = t->data;
    if (c->ac && !c->up) {
        char buf[sizeof(c->last_error)];
        const char *why =
            c->handshake > 0 ? "no reply to the handshake" : "connection timed out";
        /* Over TLS hiredis is connected at once, to the pump: the pump knows
         * whether the server's TCP or TLS is what is missing. */
        if (c->pump && tls_pump_stalled(c->pump)) {
            snprintf(buf, sizeof(buf), "%s", tls_pump_stalled(c->pump));
            why = buf;
        }
        drop_connection(c);
        connect_failed(c, why, 0);
    }
}

static void ask_sentinel(struct redis_conn *c);

/* Connects to the server itself: the URL's, or the master a sentinel named. */
static void connect_server(struct redis_conn *c)
{
    redisAsyncContext *ac;

    if (c->tls) {
        struct cr_err e = {0};
        c->pump = tls_pump_new(c->loop, c->tls, c->url.host, c->url.port, &e);
        if (!c->pump) {
            connect_failed(c, e.msg, 0);
            return;
        }
        /* A unix connect to a listening socket is done at once. */
        ac = redisAsyncConnectUnix(tls_pump_path(c->pump));
    } else if (c->url.kind == REDIS_URL_UNIX) {
        ac = redisAsyncConnectUnix(c->url.socket_path);
    } else {
        ac = redisAsyncConnect(c->url.host, c->url.port);
    }
    if (!ac || ac->err) {
        char why[sizeof(c->last_error)];
        snprintf(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        end_pump(c, NULL, NULL, 0);
        connect_failed(c, why, 0);
        return;
    }
    ac->data = c;
    if (redis_uv_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        end_pump(c, NULL, NULL, 0);
        connect_failed(c, "cannot attach to loop", 0);
        return;
    }
    uv_read_on(ac, c->read_on);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
    uv_timer_start(&c->timer, on_connect_timeout, c->connect_ms, 0);
}

static void start_connect(struct redis_conn *c)
{
    if (c->freeing || c->ac || c->disc)
        return;
    if (c->url.kind == REDIS_URL_SENTINEL) {
        c->disc_at = 0;
        c->disc_why[0] = '\0';
        ask_sentinel(c);
        return;
    }
    connect_server(c);
}

/* ------------------------------------------------------------ sentinel */

/* Asks the sentinel at c->order[c->disc_at] where the master is, over a
 * connection of its own, closed once it has answered. Each step below is a
 * hiredis callback; a failure moves on to the next sentinel, and when none is
 * left the attempt fails like a refused connect (then the backoff, then the
 * first sentinel again). */
static void next_sentinel(struct redis_conn *c, const char *why)
{
    const struct redis_url_sentinel *s = &c->url.sentinels[c->order[c->disc_at]];
    snprintf(c->disc_why, sizeof(c->disc_why), "sentinel %s:%d: %.140s", s->host, s->port,
             why);
    c->disc_at++;
    ask_sentinel(c);
}

/* Ends the discovery connection; safe inside its callbacks (hiredis defers). */
static void drop_disc(struct redis_conn *c)
{
    redisAsyncContext *ac = c->disc;
    c->disc = NULL;
    if (ac) {
        ac->data = NULL;
        redisAsyncFree(ac);
    }
}

static void on_disc_timeout(uv_timer_t *t)
{
    struct redis_conn *c = t->data;
    if (!c->disc)
        return;
    drop_disc(c);
    next_sentinel(c, "timed out");
}

static void on_disc_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    redisReply *reply = r;
    char why[160];
    if (c->freeing || ac != c->disc || !reply || reply->type != REDIS_REPLY_ERROR)
        return;
    snprintf(why, sizeof(why), "AUTH refused: %.120s", reply->str);
    drop_disc(c);
    next_sentinel(c, why);
}

/* The reply to SENTINEL get-master-addr-by-name: [ip, port], or nil for a
 * name the sentinel does not monitor. Bounded: only a two-element array of
 * short strings is taken. */
static void on_disc_addr(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    redisReply *reply = r;
    char host[sizeof(c->url.host)], why[160];
    long port = 0;

    if (c->freeing || ac != c->disc || !reply)
        return;
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        reply->element[1]->type == REDIS_REPLY_STRING && reply->element[0]->len &&
        reply->element[0]->len < sizeof(host) && reply->element[1]->len < 6) {
        char *end;
        memcpy(host, reply->element[0]->str, reply->element[0]->len);
        host[reply->element[0]->len] = '\0';
        port = strtol(reply->element[1]->str, &end, 10);
        if (*end || port <= 0 || port > 65535)
            port = 0;
    }
    if (!port) {
        if (reply->type == REDIS_REPLY_ERROR)
            snprintf(why, sizeof(why), "%.140s", reply->str);
        else if (reply->type == REDIS_REPLY_NIL)
            snprintf(why, sizeof(why), "does not know master '%.100s'", c->master_name);
        else
            snprintf(why, sizeof(why), "unexpected reply to get-master-addr-by-name");
        drop_disc(c);
        next_sentinel(c, why);
        return;
    }
    drop_disc(c);
    /* redis-py's rule: the sentinel that answered is asked first next time. */
    if (c->disc_at) {
        int s = c->order[c->disc_at];
        memmove(c->order + 1, c->order, (size_t)c->disc_at * sizeof(c->order[0]));
        c->order[0] = s;
    }
    memcpy(c->url.host, host, sizeof(host));
    c->url.port = (int)port;
    connect_server(c);
}

static void send_sentinel_auth(struct redis_conn *c, redisAsyncContext *ac,
                               redisCallbackFn *cb)
{
    if (!c->sentinel_password[0])
        return;
    if (c->sentinel_user[0])
        redisAsyncCommand(ac, cb, c, "AUTH %s %s", c->sentinel_user,
                          c->sentinel_password);
    else
        redisAsyncCommand(ac, cb, c, "AUTH %s", c->sentinel_password);
}

static void on_disc_connect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    if (!c)
        return;
    if (status != REDIS_OK) {
        c->disc = NULL; /* hiredis frees it after this callback */
        next_sentinel(c, ac->errstr);
        return;
    }
    send_sentinel_auth(c, ac, on_disc_auth);
    redisAsyncCommand(ac, on_disc_addr, c, "SENTINEL get-master-addr-by-name %s",
                      c->master_name);
}

static void on_disc_disconnect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    (void)status;
    if (!c)
        return;
    c->disc = NULL;
    next_sentinel(c, cac->errstr[0] ? cac->errstr : "connection closed");
}

static void ask_sentinel(struct redis_conn *c)
{
    const struct redis_url_sentinel *s;
    redisAsyncContext *ac;

    if (c->freeing)
        return;
    if (c->disc_at >= c->url.n_sentinels) {
        char why[sizeof(c->last_error)];
        snprintf(why, sizeof(why), "no sentinel gave master '%.40s' (last: %.120s)",
                 c->master_name, c->disc_why);
        connect_failed(c, why, 0);
        return;
    }
    s = &c->url.sentinels[c->order[c->disc_at]];
    ac = redisAsyncConnect(s->host, s->port);
    if (!ac || ac->err) {
        char why[160];
        snprintf(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        next_sentinel(c, why);
        return;
    }
    ac->data = c;
    if (redis_uv_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        next_sentinel(c, "cannot attach to loop");
        return;
    }
    redisAsyncSetConnectCallback(ac, on_disc_connect);
    redisAsyncSetDisconnectCallback(ac, on_disc_disconnect);
    c->disc = ac;
    uv_timer_start(&c->timer, on_disc_timeout, c->connect_ms, 0);
}

/* +switch-master messages: "<name> <old ip> <old port> <new ip> <new port>".
 * One for our master while up drops the connection at once, so the next
 * attempt (after the shortest backoff) asks the sentinels again, instead of
 * waiting for an error on the demoted server. */
static void on_switch(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_conn *c = privdata;
    redisReply *reply = r, *msg;
    size_t n = strlen(c->master_name);
    char why[sizeof(c->last_error)];

    if (c->freeing || ac != c->watch_ac || !reply || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements != 3 || reply->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(reply->element[0]->str, "message"))
        return;
    msg = reply->element[2];
    if (msg->type != REDIS_REPLY_STRING || msg->len <= n || msg->str[n] != ' ' ||
        memcmp(msg->str, c->master_name, n) || !c->up || !c->ac)
        return;
    snprintf(why, sizeof(why), "sentinel: master '%.60s' switched (%.100s)",
             c->master_name, msg->str + n + 1);
    drop_connection(c);
    emit(c, REDIS_CONN_LOST, why, 0, 0);
    schedule_reconnect(c);
}

static void on_watch_connect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    if (!c)
        return;
    if (status != REDIS_OK) {
        c->watch_ac = NULL; /* tried again at the next UP */
        return;
    }
    send_sentinel_auth(c, ac, NULL);
    redisAsyncCommand(ac, on_switch, c, "SUBSCRIBE +switch-master");
}

static void on_watch_disconnect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    (void)status;
    if (c)
        c->watch_ac = NULL;
}

/* Subscribes to +switch-master on the sentinel that answered last. If that
 * sentinel goes away, the subscription is made again at the next UP; until
 * then a failover is still met through the lost connection or -READONLY. */
static void start_switch_watch(struct redis_conn *c)
{
    const struct redis_url_sentinel *s = &c->url.sentinels[c->order[0]];
    redisAsyncContext *ac;

    if (c->freeing || c->watch_ac || c->url.kind != REDIS_URL_SENTINEL)
        return;
    ac = redisAsyncConnect(s->host, s->port);
    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        return;
    }
    ac->data = c;
    if (redis_uv_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_watch_connect);
    redisAsyncSetDisconnectCallback(ac, on_watch_disconnect);
    c->watch_ac = ac;
}

/* ------------------------------------------------------------ commands */

int redis_refusal_passes(const char *e)
{
    static const char *const codes[] = {"OOM ",        "READONLY ",   "LOADING ", "BUSY ",
                                        "MASTERDOWN ", "NOREPLICAS ", "TRYAGAIN "};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (!strncmp(e, codes[i], strlen(codes[i])))
            return 1;
    return 0;
}

/* Every owner's reply goes through here: the liveness the watchdog needs is
 * counted once, for both kinds of command. */
static void on_req_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    struct redis_req *req = privdata;
    struct redis_conn *c = req->conn;
    redisReply *reply = r;

    if (req->counted)
        c->inflight--;
    if (c->freeing) {
        req->cb(req, CR_ECANCELED, NULL);
        return;
    }
    if (!reply) {
        /* The connection went away with this command unanswered. hiredis
         * calls this before the disconnect callback: say it here while we
         * know, so that the owner hears LOST before the command comes back. */
        if (req->counted && c->up && ac == c->ac) {
            c->up = 0;
            emit(c, REDIS_CONN_LOST, ac->errstr[0] ? ac->errstr : "closed", 0, 0);
        }
        req->cb(req, CR_EBACKEND, NULL);
        return;
    }
    if (ac == c->ac && c->up && c->url.kind == REDIS_URL_SENTINEL &&
        reply->type == REDIS_REPLY_ERROR && !strncmp(reply->str, "READONLY ", 9)) {
        /* Our master was demoted: the owner gets the refusal (and sends
         * again, as it does for READONLY), the connection goes, and the next
         * attempt asks the sentinels. */
        drop_connection(c);
        emit(c, REDIS_CONN_LOST, "the master became read-only (a failover)", 0, 0);
        schedule_reconnect(c);
    }
    if (ac == c->ac) {
        c->heard_ms = uv_now(c->loop);
        if (!c->inflight && !c->probe_out && c->health_ms)
            watch_by(c, c->heard_ms + c->health_ms);
    }
    req->cb(req, 0, reply);
}

/* Writes what the socket takes of hiredis's output buffer now, without
 * waiting for the write event. A plain write() and not
 * redisAsyncHandleWrite(), which frees the context when the write fails, even
 * from inside a reply callback (where the result store sends again after
 * NOSCRIPT) or the connect callback. A failure here is left for hiredis to
 * meet at the write event, outside any callback. */
static void write_ahead(redisAsyncContext *ac)
{
    redisContext *rc = &ac->c;
    ssize_t n;

    if (!(rc->flags & REDIS_CONNECTED) || rc->fd < 0)
        return;
    n = write(rc->fd, rc->obuf, sdslen(rc->obuf));
    if (n > 0)
        sdsrange(rc->obuf, n, -1);
}

static int send_req(struct redis_conn *c, struct redis_req *req, redis_reply_fn *cb,
                    int argc, const char *const *argv, const size_t *argvlen, int counted)
{
    if (!c->up || !c->ac)
        return CR_EBACKEND;
    req->conn = c;
    req->cb = cb;
    req->counted = counted;
    if (redisAsyncCommandArgv(c->ac, on_req_reply, req, argc, (const char **)argv,
                              argvlen) != REDIS_OK)
        return CR_EBACKEND;
    if (counted && !c->inflight++ && !c->probe_out) {
        /* A quiet spell ends: the timeout runs from here. */
        c->heard_ms = uv_now(c->loop);
        if (c->timeout_ms)
            watch_by(c, c->heard_ms + c->timeout_ms);
    }
    /* When many tasks end in one loop turn (10,000 streams finishing at once),
     * their stores and progress writes would all wait in hiredis's output
     * buffer for the write event, and that buffer's peak is RSS. Write it out
     * once it is large. */
    if (sdslen(c->ac->c.obuf) >= EAGER_WRITE_BYTES)
        write_ahead(c->ac);
    return 0;
}

int redis_conn_send(struct redis_conn *c, struct redis_req *req, redis_reply_fn *cb,
                    int argc, const char *const *argv, const size_t *argvlen)
{
    return send_req(c, req, cb, argc, argv, argvlen, 1);
}

int redis_conn_send_pubsub(struct redis_conn *c, struct redis_req *req,
                           redis_reply_fn *cb, int argc, const char *const *argv,
                           const size_t *argvlen)
{
    return send_req(c, req, cb, argc, argv, argvlen, 0);
}

/* ------------------------------------------------------------ lifecycle */

struct tls_ctx *redis_tls_ctx_new(const struct redis_url_tls *t, struct cr_err *err)
{
    /* Python's CERT_OPTIONAL is CERT_REQUIRED on a client: the server always
     * shows a certificate, and it is checked. */
    struct tls_settings ts = {
        .verify = t->cert_reqs != REDIS_TLS_VERIFY_NONE,
        .check_hostname = t->check_hostname == 1,
        .ca_file = t->ca_certs,
        .ca_path = t->ca_path,
        .cert_file = t->certfile,
        .key_file = t->keyfile,
    };
    return tls_ctx_new(&ts, err);
}

static uint64_t seconds_to_ms(double s)
{
    return s > 0 ? (uint64_t)(s * 1000 + 0.5) : 0;
}

void redis_conn_read_on(struct redis_conn *c, int on)
{
    c->read_on = on;
    if (c->ac)
        uv_read_on(c->ac, on);
}

struct redis_conn *redis_conn_new(uv_loop_t *loop, const struct redis_conn_config *cfg,
                                  struct cr_err *err)
{
    struct redis_conn *c;
    struct tls_ctx *tls = NULL;
    if (cfg->url->kind == REDIS_URL_SENTINEL &&
        (!cfg->master_name || !cfg->master_name[0])) {
        cr_err_set(err, CR_EINVAL,
                   "sentinel:// needs master_name in the transport options");
        return NULL;
    }
    if (cfg->master_name && strlen(cfg->master_name) >= sizeof(c->master_name)) {
        cr_err_set(err, CR_EINVAL, "master_name too long");
        return NULL;
    }
    /* The files are read here, at start-up, once for every connection to
     * come: a missing CA or key is a start-up error, not a retry loop. */
    if (cfg->url->tls.on) {
        tls = redis_tls_ctx_new(&cfg->url->tls, err);
        if (!tls)
            return NULL;
    }
    c = cr_calloc(1, sizeof(*c));
    if (!c) {
        tls_ctx_free(tls);
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    c->loop = loop;
    c->tls = tls;
    c->url = *cfg->url;
    c->timeout_ms = seconds_to_ms(cfg->timeout);
    c->health_ms = seconds_to_ms(cfg->health_check_interval);
    c->connect_ms = cfg->connect_timeout > 0 ? seconds_to_ms(cfg->connect_timeout)
                                             : CONNECT_TIMEOUT_MS;
    c->probe_argc = cfg->probe_argv ? cfg->probe_argc : 1;
    c->probe_argv = cfg->probe_argv ? cfg->probe_argv : ping_argv;
    c->handshake_passes =
        cfg->handshake_passes ? cfg->handshake_passes : redis_refusal_passes;
    c->say_refusals = cfg->say_refusals;
    c->on_event = cfg->on_event;
    c->privdata = cfg->privdata;
    snprintf(c->master_name, sizeof(c->master_name), "%s",
             cfg->master_name ? cfg->master_name : "");
    snprintf(c->sentinel_user, sizeof(c->sentinel_user), "%s",
             cfg->sentinel_user ? cfg->sentinel_user : "");
    snprintf(c->sentinel_password, sizeof(c->sentinel_password), "%s",
             cfg->sentinel_password ? cfg->sentinel_password : "");
    for (int i = 0; i < REDIS_URL_MAX_SENTINELS; i++)
        c->order[i] = i;
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    /* Not from inside this call: a failure at once would be an event before
     * the owner holds the connection. */
    uv_timer_start(&c->timer, on_reconnect_timer, 0, 0);
    return c;
}

int redis_conn_wait(struct redis_conn *c, int timeout_ms)
{
    uint64_t deadline = uv_now(c->loop) + (uint64_t)timeout_ms;
    while (!c->up) {
        uv_update_time(c->loop);
        if (c->refused)
            return CR_EPEER;
        if (uv_now(c->loop) >= deadline)
            return CR_ETIMEDOUT;
        uv_run(c->loop, UV_RUN_ONCE);
    }
    return 0;
}

int redis_conn_up(const struct redis_conn *c)
{
    return c->up;
}

const struct redis_url *redis_conn_url(const struct redis_conn *c)
{
    return &c->url;
}

const char *redis_conn_last_error(const struct redis_conn *c)
{
    return c->last_error;
}

unsigned long redis_conn_generation(const struct redis_conn *c)
{
    return c->generation;
}

unsigned long redis_conn_reconnects(const struct redis_conn *c)
{
    return c->reconnects;
}

unsigned long redis_conn_failures(const struct redis_conn *c)
{
    return c->failures;
}

int redis_conn_refused(const struct redis_conn *c)
{
    return c->refused;
}

size_t redis_conn_inflight(const struct redis_conn *c)
{
    return c->inflight;
}

uint64_t redis_conn_timeout_ms(const struct redis_conn *c)
{
    return c->timeout_ms;
}

static void on_closed_free(uv_handle_t *h)
{
    struct redis_conn *c = h->data;
    tls_ctx_free(c->tls);
    cr_free(c);
}

void redis_conn_free(struct redis_conn *c)
{
    if (!c)
        return;
    c->freeing = 1;
    uv_timer_stop(&c->timer);
    if (c->ac) {
        redisAsyncContext *ac = c->ac;
        c->ac = NULL;
        /* The callbacks of what is in flight run from here with a NULL reply
         * and see `freeing`, so they get CR_ECANCELED. */
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    end_pump(c, NULL, NULL, 0);
    drop_disc(c);
    if (c->watch_ac) {
        redisAsyncContext *ac = c->watch_ac;
        c->watch_ac = NULL;
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    uv_close((uv_handle_t *)&c->timer, on_closed_free);
}

/* ------------------------------------------------------------ arguments */

void redis_args_init(struct redis_args *a)
{
    memset(a, 0, sizeof(*a));
    buf_init(&a->store);
}

void redis_args_release(struct redis_args *a)
{
    buf_release(&a->store);
    cr_free(a->off);
    cr_free(a->len);
    cr_free(a->argv);
}

void redis_args_add(struct redis_args *a, const void *p, size_t n)
{
    if (a->oom)
        return;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        size_t *off = cr_realloc(a->off, (size_t)cap * sizeof(*off));
        size_t *len = off ? cr_realloc(a->len, (size_t)cap * sizeof(*len)) : NULL;
        if (off)
            a->off = off;
        if (!off || !len) {
            a->oom = 1;
            return;
        }
        a->len = len;
        a->cap = cap;
    }
    a->off[a->n] = a->store.len;
    a->len[a->n] = n;
    /* A NUL after each, so that an empty argument still has a byte. */
    if (buf_append(&a->store, p, n) || buf_putc(&a->store, '\0')) {
        a->oom = 1;
        return;
    }
    a->n++;
}

void redis_args_s(struct redis_args *a, const char *s)
{
    redis_args_add(a, s, strlen(s));
}

const char **redis_args_argv(struct redis_args *a)
{
    if (a->oom)
        return NULL;
    cr_free(a->argv);
    a->argv = cr_malloc((size_t)(a->n ? a->n : 1) * sizeof(*a->argv));
    if (!a->argv)
        return NULL;
    for (int i = 0; i < a->n; i++)
        a->argv[i] = a->store.data + a->off[i];
    return a->argv;
}
