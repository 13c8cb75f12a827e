/* gw_sub.c -- the gateway's Redis pub/sub connection, on net/redis.c. */
#include "gw_sub.h"

#include <hiredis/hiredis.h>
#include <string.h>

#include "net/redis.h"
#include "util/alloc.h"
#include "util/log.h"

struct gw_sub {
    struct redis_conn *conn; /* connects, probes, reconnects */
    struct redis_req req;    /* every SUBSCRIBE and UNSUBSCRIBE, and their messages */
    gw_sub_msg_fn *on_msg;
    gw_sub_event_fn *on_event;
    void *privdata;
    int freeing;
};

/* A subscriber connection is quiet by nature, so it is probed. Not with PING:
 * hiredis 0.14 hands a subscribed connection's "pong" to whichever callback
 * it met last and keeps the PING's own until the end. A SUBSCRIBE to a
 * channel nobody publishes on is answered to its own callback, and subscribing
 * it again replaces that callback, so nothing piles up. */
#define HEALTH_CHANNEL "celeriac:gateway-health"
static const char *const probe_argv[] = {"SUBSCRIBE", HEALTH_CHANNEL};

static void on_reply(struct redis_req *req, int status, struct redisReply *r)
{
    struct gw_sub *s = req->data;
    redisReply *reply = (redisReply *)r;
    if (status || s->freeing)
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

/* The connection's news in the gateway's words. A connect failure is said
 * once per distinct reason (the first time at DEBUG only: the gateway has
 * just connected its backend to the same Redis), a refused password even the
 * first time (say_refusals). A lost connection, or a probe unanswered for the
 * timeout, tells the owner GW_SUB_DOWN; GW_SUB_UP follows the reconnect, and
 * the owner subscribes again. */
static void on_conn_event(struct redis_conn *c, enum redis_conn_event ev,
                          const struct redis_conn_news *news, void *privdata)
{
    struct gw_sub *s = privdata;
    const struct redis_url *u = redis_conn_url(c);

    switch (ev) {
    case REDIS_CONN_UP:
        s->on_event(s, GW_SUB_UP, NULL, 0, s->privdata);
        break;
    case REDIS_CONN_FAILED:
        if (news->loud)
            LOG(LOG_ERROR, "gateway: cannot connect to redis %s:%d: %s; retrying",
                u->host, u->port, news->why);
        else
            LOG(LOG_DEBUG, "gateway: cannot connect to redis %s:%d: %s", u->host, u->port,
                news->why);
        break;
    case REDIS_CONN_LOST:
        LOG(LOG_ERROR, "gateway: redis pub/sub connection lost; reconnecting");
        s->on_event(s, GW_SUB_DOWN, NULL, 0, s->privdata);
        break;
    case REDIS_CONN_SILENT:
        LOG(LOG_ERROR,
            "gateway: redis pub/sub connection lost: no reply from %s:%d for %g s; "
            "reconnecting",
            u->host, u->port, (double)redis_conn_timeout_ms(c) / 1000);
        s->on_event(s, GW_SUB_DOWN, NULL, 0, s->privdata);
        break;
    }
}

/* A subscriber's handshake passes only LOADING: SUBSCRIBE is served while
 * Redis loads, where most other refusals would refuse it too. */
static int handshake_passes(const char *error)
{
    return !strncmp(error, "LOADING", 7);
}

struct gw_sub *gw_sub_new(uv_loop_t *loop, const char *url, double timeout,
                          double health_check_interval, gw_sub_msg_fn *on_msg,
                          gw_sub_event_fn *on_event, void *privdata, struct cr_err *err)
{
    struct gw_sub *s;
    struct redis_url u;
    struct redis_conn_config rc;

    if (redis_url_parse(&u, url, "result backend", err))
        return NULL;
    u.db = 0; /* pub/sub is server-wide: no SELECT */
    s = cr_calloc(1, sizeof(*s));
    if (!s) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    s->req.data = s;
    s->on_msg = on_msg;
    s->on_event = on_event;
    s->privdata = privdata;
    memset(&rc, 0, sizeof(rc));
    rc.url = &u;
    rc.timeout = timeout;
    rc.health_check_interval = health_check_interval;
    rc.probe_argc = 2;
    rc.probe_argv = probe_argv;
    rc.handshake_passes = handshake_passes;
    rc.say_refusals = 1;
    rc.on_event = on_conn_event;
    rc.privdata = s;
    s->conn = redis_conn_new(loop, &rc, err);
    if (!s->conn) {
        cr_free(s);
        return NULL;
    }
    return s;
}

int gw_sub_connected(const struct gw_sub *s)
{
    return redis_conn_up(s->conn);
}

static int command(struct gw_sub *s, const char *verb, int n, const char *const *channels)
{
    const char **argv;
    int rc;
    if (!redis_conn_up(s->conn))
        return CR_EBACKEND;
    argv = cr_calloc((size_t)n + 1, sizeof(*argv));
    if (!argv)
        return CR_ENOMEM;
    argv[0] = verb;
    for (int i = 0; i < n; i++)
        argv[i + 1] = channels[i];
    rc = redis_conn_send_pubsub(s->conn, &s->req, on_reply, n + 1, argv, NULL);
    cr_free(argv);
    return rc;
}

int gw_sub_subscribe(struct gw_sub *s, int n, const char *const *channels)
{
    return command(s, "SUBSCRIBE", n, channels);
}

int gw_sub_unsubscribe(struct gw_sub *s, int n, const char *const *channels)
{
    return command(s, "UNSUBSCRIBE", n, channels);
}

void gw_sub_free(struct gw_sub *s)
{
    if (!s)
        return;
    s->freeing = 1;
    redis_conn_free(s->conn); /* the callbacks of s->req run from here */
    cr_free(s);
}
