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
#include <unistd.h>

#include "util/alloc.h"

/* ------------------------------------------------------------ URL (pure) */

/* The URL as messages may show it: whatever stands for a password (after
 * the user's ':', or the whole of "secret@") becomes "**". */
static void shown_url(const char *url, const char *at, const char *colon, char *out,
                      size_t size)
{
    if (!at)
        snprintf(out, size, "%s", url);
    else if (colon)
        snprintf(out, size, "%.*s:**%s", (int)(colon - url), url, at);
    else
        snprintf(out, size, "redis://**%s", at);
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

int redis_url_parse(struct redis_url *out, const char *url, const char *what,
                    struct cr_err *err)
{
    const char *p, *at, *colon = NULL, *hostend;
    char shown[512];
    size_t len;

    memset(out, 0, sizeof(*out));
    snprintf(out->host, sizeof(out->host), "localhost");
    out->port = REDIS_DEFAULT_PORT;
    if (strncmp(url, "redis://", 8))
        return cr_err_set(err, CR_EINVAL, "unsupported %s URL (want redis://)", what);
    len = strnlen(url, REDIS_URL_MAX_BYTES + 1);
    if (len > REDIS_URL_MAX_BYTES)
        return cr_err_set(err, CR_EINVAL, "%s URL too long (over %d bytes)", what,
                          REDIS_URL_MAX_BYTES);
    p = url + 8;
    at = strrchr(p, '@');
    if (at)
        colon = memchr(p, ':', (size_t)(at - p));
    shown_url(url, at, colon, shown, sizeof(shown));
    if (at) {
        /* redis://password@host is how some clients spell it. */
        const char *pw = colon ? colon + 1 : p;
        if (colon && copy_part(out->user, sizeof(out->user), p, (size_t)(colon - p)))
            return cr_err_set(err, CR_EINVAL, "%s URL user name too long in '%s'", what,
                              shown);
        if (copy_part(out->password, sizeof(out->password), pw, (size_t)(at - pw)))
            return cr_err_set(err, CR_EINVAL, "%s URL password too long in '%s'", what,
                              shown);
        p = at + 1;
    }
    if (*p == '[') { /* [v6]:port */
        const char *close = strchr(p, ']');
        if (!close || close == p + 1 || (close[1] && !strchr(":/?", close[1])))
            return cr_err_set(err, CR_EINVAL, "invalid IPv6 host in %s URL '%s'", what,
                              shown);
        if (copy_part(out->host, sizeof(out->host), p + 1, (size_t)(close - p - 1)))
            return cr_err_set(err, CR_EINVAL, "%s host name too long in '%s'", what,
                              shown);
        hostend = close + 1;
    } else {
        hostend = p + strcspn(p, ":/?");
        if (hostend > p &&
            copy_part(out->host, sizeof(out->host), p, (size_t)(hostend - p)))
            return cr_err_set(err, CR_EINVAL, "%s host name too long in '%s'", what,
                              shown);
    }
    p = hostend;
    if (*p == ':') {
        char *end = NULL;
        long port = isdigit((unsigned char)p[1]) ? strtol(p + 1, &end, 10) : 0;
        if (port <= 0 || port > 65535 || (*end && *end != '/' && *end != '?'))
            return cr_err_set(err, CR_EINVAL, "invalid port in %s URL '%s'", what, shown);
        out->port = (int)port;
        p = end;
    }
    if (*p == '/' && p[1] && p[1] != '?') {
        char *end = NULL;
        long db;
        errno = 0;
        db = isdigit((unsigned char)p[1]) ? strtol(p + 1, &end, 10) : -1;
        if (db < 0 || errno || db > INT_MAX || (*end && *end != '?'))
            return cr_err_set(err, CR_EINVAL, "invalid database in %s URL '%s'", what,
                              shown);
        out->db = (int)db;
    }
    return 0;
}

/* ------------------------------------------------------------ libuv glue */

struct redis_uv {
    redisAsyncContext *ac; /* NULL once hiredis has let go */
    uv_poll_t poll;
    int events; /* what hiredis wants watched */
    int polled; /* what the poll handle watches */
};

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
    if (r->ac && (events & UV_READABLE))
        redisAsyncHandleRead(r->ac);
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
    int probe_argc;
    const char *const *probe_argv;
    int (*handshake_passes)(const char *error);
    int say_refusals;
    redis_conn_event_fn *on_event;
    void *privdata;

    redisAsyncContext *ac; /* NULL while disconnected */
    int up;                /* Redis answered the handshake: commands may be sent */
    int handshake;         /* handshake replies still awaited on ac */
    int refused;           /* the last handshake was refused (AUTH, SELECT) */
    int freeing;
    int ever_up;
    int loud; /* failures are worth an error line (see redis_conn_news) */
    unsigned long reconnects;
    unsigned long generation;
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

static void start_connect(struct redis_conn *c);

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

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct redis_conn *c = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;

    if (!c)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback. */
        c->ac = NULL;
        connect_failed(c, ac->errstr, 0);
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
    (void)status;
    if (!c)
        return;
    c->ac = NULL;
    c->probe_out = 0;
    if (c->handshake) {
        c->handshake = 0;
        connect_failed(c, cac->errstr[0] ? cac->errstr : "connection closed", 0);
        return;
    }
    if (c->up) {
        c->up = 0;
        emit(c, REDIS_CONN_LOST, cac->errstr[0] ? cac->errstr : "closed", 0, 0);
    }
    schedule_reconnect(c);
}

static void on_connect_timeout(uv_timer_t *t)
{
    struct redis_conn *c = t->data;
    if (c->ac && !c->up) {
        int answered_tcp = c->handshake > 0;
        drop_connection(c);
        connect_failed(
            c, answered_tcp ? "no reply to the handshake" : "connection timed out", 0);
    }
}

static void start_connect(struct redis_conn *c)
{
    redisAsyncContext *ac;

    if (c->freeing || c->ac)
        return;
    ac = redisAsyncConnect(c->url.host, c->url.port);
    if (!ac || ac->err) {
        char why[sizeof(c->last_error)];
        snprintf(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        connect_failed(c, why, 0);
        return;
    }
    ac->data = c;
    if (redis_uv_attach(ac, c->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        connect_failed(c, "cannot attach to loop", 0);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
    uv_timer_start(&c->timer, on_connect_timeout, CONNECT_TIMEOUT_MS, 0);
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

static uint64_t seconds_to_ms(double s)
{
    return s > 0 ? (uint64_t)(s * 1000 + 0.5) : 0;
}

struct redis_conn *redis_conn_new(uv_loop_t *loop, const struct redis_conn_config *cfg,
                                  struct cr_err *err)
{
    struct redis_conn *c = cr_calloc(1, sizeof(*c));
    if (!c) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    c->loop = loop;
    c->url = *cfg->url;
    c->timeout_ms = seconds_to_ms(cfg->timeout);
    c->health_ms = seconds_to_ms(cfg->health_check_interval);
    c->probe_argc = cfg->probe_argv ? cfg->probe_argc : 1;
    c->probe_argv = cfg->probe_argv ? cfg->probe_argv : ping_argv;
    c->handshake_passes =
        cfg->handshake_passes ? cfg->handshake_passes : redis_refusal_passes;
    c->say_refusals = cfg->say_refusals;
    c->on_event = cfg->on_event;
    c->privdata = cfg->privdata;
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
    cr_free(h->data);
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
    uv_close((uv_handle_t *)&c->timer, on_closed_free);
}
