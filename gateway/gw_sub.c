/* gw_sub.c -- the gateway's Redis pub/sub connection (hiredis async on libuv). */
#include "gw_sub.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include "worker/redis_uv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "worker/log.h"

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
    int connected;
    int freeing;
    int64_t backoff_ms;
    uv_timer_t *timer; /* heap: freed in its close callback */
};

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
    (void)ac;
    if (!reply || s->freeing)
        return;
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

static void on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    (void)ac;
    (void)privdata;
    if (reply && reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_ERROR, "gateway: redis pub/sub: %s", reply->str);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct gw_sub *s = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;
    if (!s)
        return;
    uv_timer_stop(s->timer);
    if (status != REDIS_OK) {
        LOG(LOG_DEBUG, "gateway: cannot connect to redis %s:%d: %s", s->host, s->port,
            ac->errstr);
        s->ac = NULL; /* hiredis frees it after this callback */
        schedule_reconnect(s);
        return;
    }
    s->connected = 1;
    s->backoff_ms = 0;
    /* AUTH goes first on the wire; its reply comes before any subscription. */
    if (s->password) {
        if (s->user)
            redisAsyncCommand(ac, on_auth, NULL, "AUTH %s %s", s->user, s->password);
        else
            redisAsyncCommand(ac, on_auth, NULL, "AUTH %s", s->password);
    }
    s->on_event(s, GW_SUB_UP, NULL, 0, s->privdata);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    struct gw_sub *s = cac->data;
    (void)status;
    if (!s)
        return;
    s->ac = NULL;
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
        redisAsyncContext *ac = s->ac;
        ac->data = NULL;
        s->ac = NULL;
        redisAsyncFree(ac);
        schedule_reconnect(s);
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

struct gw_sub *gw_sub_new(uv_loop_t *loop, const char *url, gw_sub_msg_fn *on_msg,
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
