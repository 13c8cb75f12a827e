/* gw_sub.c -- the gateway's Redis pub/sub connection (hiredis async on libuv). */
#include "gw_sub.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include "net/redis.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"

#define CONNECT_TIMEOUT_MS 5000
#define RECONNECT_MAX_MS 5000

struct gw_sub {
    uv_loop_t *loop;
    char *host;
    int port;
    char *user;
    char *password;
    gw_sub_msg_fn *on_msg;
    gw_sub_event_fn *on_event;
    void *privdata;
    redisAsyncContext *ac;
    int connected;   /* Redis answered the AUTH (or PING) a connection opens with */
    int handshaking; /* that reply is awaited */
    int ever_connected;
    int freeing;
    int64_t backoff_ms;
    /* heap: freed in its close callback. The connect (and handshake)
     * timeout, the reconnect delay, or while connected the watchdog. */
    uv_timer_t *timer;
    uint64_t timeout_ms; /* 0: none */
    uint64_t health_ms;  /* 0: no probe */
    uint64_t heard_ms;   /* anything last heard, or the probe sent */
    int probe_out;       /* the health probe is unanswered */
    char logged_error[200];
};

/* A subscriber connection is quiet by nature, so it is probed. Not with PING:
 * hiredis 0.14 hands a subscribed connection's "pong" to whichever callback
 * it met last and keeps the PING's own until the end. A SUBSCRIBE to a
 * channel nobody publishes on is answered to its own callback, and subscribing
 * it again replaces that callback, so nothing piles up. */
#define HEALTH_CHANNEL "celeriac:gateway-health"

static void start_connect(struct gw_sub *s);

static void on_reconnect_timer(uv_timer_t *t)
{
    start_connect(t->data);
}

static int parse_url(struct gw_sub *s, const char *url, struct cr_err *err)
{
    const char *p, *at, *end;
    if (strncmp(url, "redis://", 8))
        return cr_err_set(err, CR_EINVAL,
                          "unsupported result backend URL (want redis://)");
    p = url + 8;
    at = strrchr(p, '@');
    s->port = 6379;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon) {
            if (colon > p && !(s->user = cr_strndup(p, (size_t)(colon - p))))
                return CR_ENOMEM;
            s->password = cr_strndup(colon + 1, (size_t)(at - colon - 1));
        } else {
            s->password = cr_strndup(p, (size_t)(at - p));
        }
        if (!s->password)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        p = at + 1;
    }
    end = p + strcspn(p, ":/?");
    s->host = end > p ? cr_strndup(p, (size_t)(end - p)) : cr_strdup("localhost");
    if (!s->host)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    if (*end == ':') {
        char *e;
        long port = strtol(end + 1, &e, 10);
        if (e == end + 1 || port <= 0 || port > 65535)
            return cr_err_set(err, CR_EINVAL, "invalid port in result backend URL");
        s->port = (int)port;
    }
    return 0;
}

static void schedule_reconnect(struct gw_sub *s)
{
    if (s->freeing)
        return;
    s->backoff_ms = s->backoff_ms ? s->backoff_ms * 2 : 250;
    if (s->backoff_ms > RECONNECT_MAX_MS)
        s->backoff_ms = RECONNECT_MAX_MS;
    uv_timer_start(s->timer, on_reconnect_timer, (uint64_t)s->backoff_ms, 0);
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    struct gw_sub *s = privdata;
    redisReply *reply = r;
    if (!reply || s->freeing)
        return;
    if (ac == s->ac)
        s->heard_ms = uv_now(s->loop);
    if (reply->type == REDIS_REPLY_ERROR) {
        LOG(LOG_ERROR, "gateway: redis pub/sub: %s", reply->str);
        return;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING)
        return;
    if (!strcmp(reply->element[0]->str, "message") &&
        reply->element[2]->type == REDIS_REPLY_STRING) {
        s->on_msg(s, reply->element[1]->str, (size_t)reply->element[1]->len,
                  reply->element[2]->str, (size_t)reply->element[2]->len, s->privdata);
    } else if (!strcmp(reply->element[0]->str, "subscribe")) {
        s->on_event(s, GW_SUB_SUBSCRIBED, reply->element[1]->str,
                    (size_t)reply->element[1]->len, s->privdata);
    }
}

/* Said once per distinct reason (the first time at DEBUG only: the gateway
 * has just connected its backend to the same Redis), not at every retry. */
static void connect_failed(struct gw_sub *s, const char *why)
{
    if (s->ever_connected && strncmp(s->logged_error, why, sizeof(s->logged_error) - 1)) {
        LOG(LOG_ERROR, "gateway: cannot connect to redis %s:%d: %s; retrying", s->host,
            s->port, why);
        snprintf(s->logged_error, sizeof(s->logged_error), "%s", why);
    } else {
        LOG(LOG_DEBUG, "gateway: cannot connect to redis %s:%d: %s", s->host, s->port,
            why);
    }
    schedule_reconnect(s);
}

/* Ends the connection at once, its callbacks detached (safe inside one of
 * them: hiredis then frees it when the callback returns). */
static void drop_connection(struct gw_sub *s)
{
    redisAsyncContext *ac = s->ac;
    s->connected = 0;
    s->handshaking = 0;
    s->probe_out = 0;
    s->ac = NULL;
    ac->data = NULL;
    redisAsyncFree(ac);
}

static void on_watch(uv_timer_t *t);

static void watch_in(struct gw_sub *s, uint64_t due)
{
    uint64_t now = uv_now(s->loop);
    uv_timer_start(s->timer, on_watch, due > now ? due - now : 0, 0);
}

static void on_probe(redisAsyncContext *ac, void *r, void *privdata)
{
    struct gw_sub *s = privdata;
    if (s->freeing || ac != s->ac || !r)
        return;
    s->probe_out = 0;
    s->heard_ms = uv_now(s->loop);
}

/* Quiet for the health-check interval, the connection is probed; the probe
 * unanswered for the timeout, it is dropped and rebuilt as a lost one is:
 * the owner hears GW_SUB_DOWN, then GW_SUB_UP, and subscribes again. The
 * timer is not moved at every message: when it fires early it is set again
 * from what was last heard. */
static void on_watch(uv_timer_t *t)
{
    struct gw_sub *s = t->data;
    uint64_t now = uv_now(s->loop), quiet = now - s->heard_ms;
    const char *argv[2] = {"SUBSCRIBE", HEALTH_CHANNEL};

    if (!s->connected || !s->ac)
        return;
    if (s->probe_out) {
        if (!s->timeout_ms)
            return;
        if (quiet < s->timeout_ms) {
            watch_in(s, s->heard_ms + s->timeout_ms);
            return;
        }
        LOG(LOG_ERROR,
            "gateway: redis pub/sub connection lost: no reply from %s:%d for %g s; "
            "reconnecting",
            s->host, s->port, (double)s->timeout_ms / 1000);
        drop_connection(s);
        s->on_event(s, GW_SUB_DOWN, NULL, 0, s->privdata);
        schedule_reconnect(s);
        return;
    }
    if (quiet < s->health_ms) {
        watch_in(s, s->heard_ms + s->health_ms);
        return;
    }
    if (redisAsyncCommandArgv(s->ac, on_probe, s, 2, argv, NULL) != REDIS_OK)
        return;
    s->probe_out = 1;
    s->heard_ms = now;
    if (s->timeout_ms)
        watch_in(s, now + s->timeout_ms);
}

/* The reply to AUTH (or to the PING that stands in for it). Only then is the
 * connection up: a refused password is one failed connect, said once, and
 * not "up" with every SUBSCRIBE refused after it. */
static void on_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    struct gw_sub *s = privdata;
    redisReply *reply = r;

    if (s->freeing || ac != s->ac || !reply || !s->handshaking)
        return;
    s->handshaking = 0;
    if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "LOADING", 7)) {
        char why[sizeof(s->logged_error)];
        snprintf(why, sizeof(why), "%s", reply->str);
        drop_connection(s);
        /* A refused password is worth saying even the first time. */
        s->ever_connected = 1;
        connect_failed(s, why);
        return;
    }
    uv_timer_stop(s->timer);
    s->connected = 1;
    s->ever_connected = 1;
    s->backoff_ms = 0;
    s->logged_error[0] = '\0';
    s->heard_ms = uv_now(s->loop);
    if (s->health_ms)
        watch_in(s, s->heard_ms + s->health_ms);
    s->on_event(s, GW_SUB_UP, NULL, 0, s->privdata);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct gw_sub *s = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    if (!s)
        return;
    if (status != REDIS_OK) {
        s->ac = NULL; /* hiredis frees it after this callback */
        connect_failed(s, ac->errstr);
        return;
    }
    /* The connect timeout runs on until this is answered. */
    s->handshaking = 1;
    if (s->password && s->user)
        redisAsyncCommand(ac, on_handshake, s, "AUTH %s %s", s->user, s->password);
    else if (s->password)
        redisAsyncCommand(ac, on_handshake, s, "AUTH %s", s->password);
    else
        redisAsyncCommand(ac, on_handshake, s, "PING");
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    struct gw_sub *s = cac->data;
    (void)status;
    if (!s)
        return;
    s->ac = NULL;
    s->probe_out = 0;
    if (s->handshaking) {
        s->handshaking = 0;
        connect_failed(s, cac->errstr[0] ? cac->errstr : "connection closed");
        return;
    }
    if (s->connected) {
        LOG(LOG_ERROR, "gateway: redis pub/sub connection lost; reconnecting");
        s->connected = 0;
        s->on_event(s, GW_SUB_DOWN, NULL, 0, s->privdata);
    }
    schedule_reconnect(s);
}

static void on_connect_timeout(uv_timer_t *t)
{
    struct gw_sub *s = t->data;
    if (s->ac && !s->connected) {
        int tcp_up = s->handshaking;
        drop_connection(s);
        connect_failed(s, tcp_up ? "no reply to the handshake" : "connection timed out");
    }
}

static void start_connect(struct gw_sub *s)
{
    redisAsyncContext *ac;
    if (s->freeing || s->ac)
        return;
    ac = redisAsyncConnect(s->host, s->port);
    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        schedule_reconnect(s);
        return;
    }
    ac->data = s;
    if (redis_uv_attach(ac, s->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        schedule_reconnect(s);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    s->ac = ac;
    uv_timer_start(s->timer, on_connect_timeout, CONNECT_TIMEOUT_MS, 0);
}

static void free_fields(struct gw_sub *s)
{
    cr_free(s->host);
    cr_free(s->user);
    cr_free(s->password);
}

struct gw_sub *gw_sub_new(uv_loop_t *loop, const char *url, double timeout,
                          double health_check_interval, gw_sub_msg_fn *on_msg,
                          gw_sub_event_fn *on_event, void *privdata, struct cr_err *err)
{
    struct gw_sub *s = cr_calloc(1, sizeof(*s));
    int rc;
    if (!s) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    rc = parse_url(s, url, err);
    if (rc == CR_ENOMEM)
        cr_err_set(err, CR_ENOMEM, "out of memory");
    s->timer = rc ? NULL : cr_malloc(sizeof(*s->timer));
    if (!s->timer) {
        if (!rc)
            cr_err_set(err, CR_ENOMEM, "out of memory");
        free_fields(s);
        cr_free(s);
        return NULL;
    }
    s->loop = loop;
    s->timeout_ms = timeout > 0 ? (uint64_t)(timeout * 1000 + 0.5) : 0;
    s->health_ms =
        health_check_interval > 0 ? (uint64_t)(health_check_interval * 1000 + 0.5) : 0;
    s->on_msg = on_msg;
    s->on_event = on_event;
    s->privdata = privdata;
    uv_timer_init(loop, s->timer);
    s->timer->data = s;
    start_connect(s);
    return s;
}

int gw_sub_connected(const struct gw_sub *s)
{
    return s->connected;
}

static int command(struct gw_sub *s, const char *verb, int n, const char *const *channels)
{
    const char **argv;
    size_t *lens;
    int rc;
    if (!s->connected || !s->ac)
        return CR_EBACKEND;
    argv = cr_calloc((size_t)n + 1, sizeof(*argv));
    lens = cr_calloc((size_t)n + 1, sizeof(*lens));
    if (!argv || !lens) {
        cr_free(argv);
        cr_free(lens);
        return CR_ENOMEM;
    }
    argv[0] = verb;
    lens[0] = strlen(verb);
    for (int i = 0; i < n; i++) {
        argv[i + 1] = channels[i];
        lens[i + 1] = strlen(channels[i]);
    }
    rc = redisAsyncCommandArgv(s->ac, on_reply, s, n + 1, argv, lens);
    cr_free(argv);
    cr_free(lens);
    return rc == REDIS_OK ? 0 : CR_EBACKEND;
}

int gw_sub_subscribe(struct gw_sub *s, int n, const char *const *channels)
{
    return command(s, "SUBSCRIBE", n, channels);
}

int gw_sub_unsubscribe(struct gw_sub *s, int n, const char *const *channels)
{
    return command(s, "UNSUBSCRIBE", n, channels);
}

static void on_timer_closed(uv_handle_t *h)
{
    cr_free(h);
}

void gw_sub_free(struct gw_sub *s)
{
    if (!s)
        return;
    s->freeing = 1;
    uv_timer_stop(s->timer);
    if (s->ac) {
        redisAsyncContext *ac = s->ac;
        s->ac = NULL;
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    uv_close((uv_handle_t *)s->timer, on_timer_closed);
    free_fields(s);
    cr_free(s);
}
