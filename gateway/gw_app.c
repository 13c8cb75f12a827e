/* gw_app.c -- the gateway's endpoints, wired to RabbitMQ, the result backend
 * and Redis pub/sub on one loop (see gw_app.h, gw_msg.h, gw_hub.h). */
#include "gw_app.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#include "gw_msg.h"
#include "gw_server.h"
#include "gw_hub.h"
#include "gw_rq.h"
#include "gw_sub.h"
#include "gw_trace.h"
#include "net/broker.h"
#include "net/backend.h"
#include "protocol/celery_msg.h"
#include "protocol/tracectx.h"
#include "protocol/progress.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/uuid.h"

#define CRON_MS 500
#define JSON_TYPE "application/json"

/* The page, embedded from gateway/page.html by gw_page.c. */
extern const char gw_page_html[];
extern const char gw_page_html_end[];

struct gw_app {
    uv_loop_t *loop;
    const struct gw_app_config *cfg;
    struct broker_config bcfg;
    struct broker *broker;
    struct backend *backend;
    struct gw_sub *sub;
    struct gw_hub *hub;
    struct gw_server *srv;
    struct gw_server_config scfg;
    struct gw_rules rules;
    uv_timer_t *cron;       /* heap: freed in its close callback */
    struct gw_trace *trace; /* OTEL_* tracing; NULL when off */
    char origin[300];       /* "gen<pid>@<host>", as Python clients name themselves */
    char reply_to[37];
    int stopping;
};

/* ------------------------------------------------------------- replies */

static void respond_json(struct gw_conn *c, int status, const char *json, size_t len)
{
    gw_conn_respond(c, status, JSON_TYPE, json, len);
}

static void respond_error(struct gw_conn *c, const struct gw_error *e)
{
    struct buf b;
    buf_init(&b);
    if (gw_error_json(e, &b) == 0)
        respond_json(c, e->status, b.data, b.len);
    else
        gw_conn_respond(c, 500, JSON_TYPE, NULL, 0);
    buf_release(&b);
}

static void respond_oom(struct gw_conn *c)
{
    static const char msg[] =
        "{\"error\": {\"status\": 503, \"code\": \"out_of_memory\", \"message\": "
        "\"out of memory\"}}";
    respond_json(c, 503, msg, sizeof(msg) - 1);
}

static void respond_obj(struct gw_conn *c, int status, cJSON *obj)
{
    struct buf b;
    buf_init(&b);
    if (obj && py_json_dumps(obj, &b) == 0)
        respond_json(c, status, b.data, b.len);
    else
        respond_oom(c);
    buf_release(&b);
    cJSON_Delete(obj);
}

/* ----------------------------------------------------------- submitting */

struct publish_ctx {
    struct gw_app *app;
    struct gw_conn *c;
    char id[GW_TASK_ID_MAX + 1];
};

static void on_confirm(struct broker *b, int ok, void *privdata)
{
    struct publish_ctx *pc = privdata;
    struct gw_error e;
    (void)b;
    if (!ok) {
        gw_error_set(&e, 503, "broker_unavailable",
                     "the broker did not confirm the message; try again");
        respond_error(pc->c, &e);
    } else {
        struct buf out;
        buf_init(&out);
        if (buf_puts(&out, "{\"task_id\": ") ||
            gw_json_str(&out, pc->id, strlen(pc->id)) ||
            buf_printf(&out,
                       ", \"state\": \"PENDING\", \"status_url\": \"/v1/tasks/%s\", "
                       "\"stream_url\": \"/v1/tasks/%s/stream\"}",
                       pc->id, pc->id))
            respond_oom(pc->c);
        else
            respond_json(pc->c, 202, out.data, out.len);
        buf_release(&out);
    }
    gw_conn_unref(pc->c);
    cr_free(pc);
}

static int json_content_type(const char *ct)
{
    size_t n;
    if (!ct)
        return 1; /* curl -d without -H, and similar: be lenient */
    n = strcspn(ct, ";");
    while (n && ct[n - 1] == ' ')
        n--;
    return n == 16 && !strncasecmp(ct, "application/json", 16);
}

/* The submit's place in a trace (gateway/gw_trace.h): the caller's W3C
 * trace context, when valid, continued; the message carries the context
 * where opentelemetry-instrumentation-celery puts it (top-level headers), so
 * the worker's task span continues the trace. A malformed traceparent is
 * dropped, never an error; on OOM the message goes without it. */
static void pass_trace(struct gw_app *app, const struct gw_conn *c,
                       const struct task_msg *tm, const char *queue, cJSON *headers)
{
    const char *tp, *ts;
    gw_conn_trace(c, &tp, &ts);
    gw_trace_submit(app->trace, tp, ts, tm->task, tm->id, queue, headers);
}

static void submit(struct gw_app *app, struct gw_conn *c)
{
    struct gw_submit s;
    struct gw_error e;
    struct task_msg tm;
    struct gw_props gp;
    struct outbound p;
    struct publish_ctx *pc = NULL;
    struct buf body;
    cJSON *headers = NULL;
    unsigned char rnd[16];
    struct timespec ts;
    const char *data;
    size_t len;
    char id[GW_TASK_ID_MAX + 1];
    int rc;

    if (gw_conn_length_required(c)) {
        gw_error_set(&e, 411, "length_required",
                     "send the body with a Content-Length (chunked bodies are not read)");
        respond_error(c, &e);
        return;
    }
    if (gw_conn_body_too_big(c)) {
        gw_error_set(&e, 413, "body_too_large", "request body is over %zu bytes",
                     app->cfg->max_body_bytes);
        respond_error(c, &e);
        return;
    }
    if (!json_content_type(gw_conn_content_type(c))) {
        gw_error_set(&e, 415, "unsupported_media_type",
                     "send the task as application/json");
        respond_error(c, &e);
        return;
    }
    gw_submit_init(&s);
    task_msg_init(&tm);
    buf_init(&body);
    data = gw_conn_body(c, &len);
    rc = gw_submit_parse(data, len, &app->rules, &s, &e);
    if (rc == CR_EINVAL) {
        respond_error(c, &e);
        goto out;
    }
    if (rc)
        goto oom;
    if (s.task_id) {
        snprintf(id, sizeof(id), "%s", s.task_id);
    } else {
        if (uv_random(NULL, NULL, rnd, sizeof(rnd), 0, NULL)) {
            gw_error_set(&e, 503, "no_entropy", "cannot make a task id");
            respond_error(c, &e);
            goto out;
        }
        cr_uuid4(rnd, id);
    }
    /* Dates in the message are wall-clock; the loop's clock is monotonic. */
    clock_gettime(CLOCK_REALTIME, &ts);
    if (gw_submit_to_task(&s, id, app->origin,
                          (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000, &tm, &gp))
        goto oom;
    if (celery_msg_encode_v2(&tm, &body, &headers))
        goto oom;
    pass_trace(app, c, &tm, s.queue, headers);
    pc = cr_calloc(1, sizeof(*pc));
    if (!pc)
        goto oom;
    pc->app = app;
    pc->c = c;
    snprintf(pc->id, sizeof(pc->id), "%s", id);
    memset(&p, 0, sizeof(p));
    p.content_type = "application/json";
    p.content_encoding = "utf-8";
    p.correlation_id = id;
    p.reply_to = app->reply_to;
    p.delivery_mode = 2;
    p.priority = gp.priority;
    p.expiration = gp.expiration[0] ? gp.expiration : NULL;
    p.headers = headers;
    p.exchange = "";
    p.routing_key = s.queue;
    p.body = body.data;
    p.body_len = body.len;
    gw_conn_ref(c);
    rc = broker_publish(app->broker, &p, on_confirm, pc);
    if (rc) {
        gw_conn_unref(c);
        cr_free(pc);
        gw_error_set(&e, 503, "broker_unavailable", "the broker is not reachable: %s",
                     cr_strerror(rc));
        respond_error(c, &e);
        goto out;
    }
    LOG(LOG_INFO, "gateway: task %s[%s] sent to queue %s", s.task, id, s.queue);
    goto out;
oom:
    respond_oom(c);
out:
    cJSON_Delete(headers);
    buf_release(&body);
    task_msg_release(&tm);
    gw_submit_release(&s);
}

/* --------------------------------------------------------------- status */

struct status_ctx {
    struct gw_conn *c;
    char id[GW_TASK_ID_MAX + 1];
};

static void status_done(struct status_ctx *sc)
{
    gw_conn_unref(sc->c);
    cr_free(sc);
}

static void on_status_rq(int status, const char *meta, size_t len, void *privdata)
{
    struct status_ctx *sc = privdata;
    if (status == 0)
        respond_obj(sc->c, 200, gw_meta_summary(sc->id, meta, len));
    else if (status == CR_ENOMEM)
        respond_oom(sc->c);
    status_done(sc);
}

/* No Celery meta: an RQ job's state, if there is one (gw_rq.h). */
static void on_status_meta(struct backend *bk, int status, const char *value, size_t len,
                           void *privdata)
{
    struct status_ctx *sc = privdata;
    if (status == 0 && !value) {
        if (gw_rq_read(bk, sc->id, 0, on_status_rq, sc) == 0)
            return;
        respond_oom(sc->c);
    } else if (status == 0) {
        respond_obj(sc->c, 200, gw_meta_summary(sc->id, value, len));
    }
    status_done(sc);
}

static void status(struct gw_app *app, struct gw_conn *c, const char *id)
{
    struct status_ctx *sc = cr_calloc(1, sizeof(*sc));
    if (!sc) {
        respond_oom(c);
        return;
    }
    sc->c = c;
    snprintf(sc->id, sizeof(sc->id), "%s", id);
    gw_conn_ref(c);
    if (backend_get(app->backend, id, on_status_meta, sc)) {
        gw_conn_unref(c);
        cr_free(sc);
        respond_oom(c);
    }
}

/* ------------------------------------------------------------ requests */

static int authorized(struct gw_app *app, struct gw_conn *c)
{
    char token[512];
    int rc = gw_query_get(gw_conn_query(c), "token", token, sizeof(token));
    return gw_auth_ok(app->cfg->auth_token, gw_conn_authorization(c),
                      rc == 1 ? token : NULL);
}

static void on_request(struct gw_server *srv, struct gw_conn *c, void *privdata)
{
    struct gw_app *app = privdata;
    struct gw_route r;
    struct gw_error e;
    (void)srv;

    if (gw_route_parse(gw_conn_method(c), gw_conn_path(c), gw_conn_query(c), &r, &e)) {
        respond_error(c, &e);
        return;
    }
    if (r.kind == GW_ROUTE_PREFLIGHT) { /* browsers send no credentials here */
        gw_conn_respond(c, 204, JSON_TYPE, NULL, 0);
        return;
    }
    if (r.kind == GW_ROUTE_HEALTH) {
        char out[320];
        int n = snprintf(out, sizeof(out),
                         "{\"status\": \"ok\", \"broker\": %s, \"redis\": %s, "
                         "\"websockets\": %zu, \"queued_bytes\": %zu, "
                         "\"websockets_dropped\": %zu, \"unauthenticated\": %zu, "
                         "\"unauthenticated_closed\": %zu}",
                         broker_connected(app->broker) ? "true" : "false",
                         backend_connected(app->backend) ? "true" : "false",
                         gw_server_ws_count(app->srv), gw_hub_queued(app->hub),
                         gw_hub_drops(app->hub), gw_server_untrusted(app->srv),
                         gw_server_evicted(app->srv));
        respond_json(c, 200, out, (size_t)n);
        return;
    }
    if (!authorized(app, c)) {
        gw_error_set(&e, 401, "unauthorized",
                     "missing or wrong bearer token (Authorization: Bearer <token>)");
        respond_error(c, &e);
        return;
    }
    gw_conn_trust(c);
    switch (r.kind) {
    case GW_ROUTE_PAGE:
        gw_conn_respond(c, 200, "text/html; charset=utf-8", gw_page_html,
                        (size_t)(gw_page_html_end - gw_page_html) - 1);
        return;
    case GW_ROUTE_SUBMIT:
        submit(app, c);
        return;
    case GW_ROUTE_STATUS:
        status(app, c, r.task_id);
        return;
    case GW_ROUTE_STREAM:
        gw_error_set(&e, 426, "upgrade_required", "open this URL as a WebSocket");
        respond_error(c, &e);
        return;
    default:
        gw_error_set(&e, 404, "not_found", "no such path");
        respond_error(c, &e);
        return;
    }
}

/* ----------------------------------------------------------- websockets */

/* Tells a WebSocket client why it is refused, then closes (4000 + status). */
static void ws_refuse(struct gw_conn *c, const struct gw_error *e)
{
    struct buf b;
    buf_init(&b);
    if (buf_printf(&b, "{\"type\": \"error\", \"status\": %d, \"code\": ", e->status) ==
            0 &&
        gw_json_str(&b, e->code, strlen(e->code)) == 0 &&
        buf_puts(&b, ", \"error\": ") == 0 &&
        gw_json_str(&b, e->message, strlen(e->message)) == 0 && buf_putc(&b, '}') == 0)
        gw_conn_send(c, b.data, b.len);
    buf_release(&b);
    gw_conn_close(c, 4000 + e->status, e->code);
}

static void on_ws_open(struct gw_server *srv, struct gw_conn *c, void *privdata)
{
    struct gw_app *app = privdata;
    struct gw_route r;
    struct gw_error e;
    struct gw_session *s;
    (void)srv;

    if (gw_route_parse("GET", gw_conn_path(c), gw_conn_query(c), &r, &e)) {
        ws_refuse(c, &e);
        return;
    }
    if (r.kind != GW_ROUTE_STREAM) {
        gw_error_set(&e, 404, "not_found",
                     "WebSockets are served at /v1/tasks/{id}/stream");
        ws_refuse(c, &e);
        return;
    }
    if (!authorized(app, c)) {
        gw_error_set(&e, 401, "unauthorized", "missing or wrong token (?token=...)");
        ws_refuse(c, &e);
        return;
    }
    gw_conn_trust(c);
    s = gw_hub_join(app->hub, r.task_id, r.from_seq, c, (int64_t)uv_now(app->loop));
    if (!s) {
        gw_error_set(&e, 503, "out_of_memory", "out of memory");
        ws_refuse(c, &e);
        return;
    }
    gw_conn_set_data(c, s);
}

static void on_ws_written(struct gw_server *srv, struct gw_conn *c, size_t len,
                          void *privdata)
{
    struct gw_app *app = privdata;
    struct gw_session *s = gw_conn_data(c);
    (void)srv;
    if (s)
        gw_hub_on_written(app->hub, s, len);
}

static void on_ws_close(struct gw_server *srv, struct gw_conn *c, void *privdata)
{
    struct gw_app *app = privdata;
    struct gw_session *s = gw_conn_data(c);
    (void)srv;
    if (s) {
        gw_conn_set_data(c, NULL);
        gw_hub_leave(app->hub, s);
    }
}

/* ------------------------------------------------------------- hub ops */

static int channel_names(const char *id, struct buf *prog, struct buf *meta)
{
    buf_init(prog);
    buf_init(meta);
    if (progress_key(prog, id) || buf_printf(meta, "%s%s", BACKEND_META_PREFIX, id)) {
        buf_release(prog);
        buf_release(meta);
        return CR_ENOMEM;
    }
    return 0;
}

static int op_subscribe(struct gw_hub *h, const char *id, void *privdata)
{
    struct gw_app *app = privdata;
    struct buf a, b;
    const char *ch[2];
    int rc;
    (void)h;
    if (app->stopping || channel_names(id, &a, &b))
        return CR_ENOMEM;
    /* Progress first: the meta channel's confirmation then means both. */
    ch[0] = a.data;
    ch[1] = b.data;
    rc = gw_sub_subscribe(app->sub, 2, ch);
    buf_release(&a);
    buf_release(&b);
    return rc;
}

static void op_unsubscribe(struct gw_hub *h, const char *id, void *privdata)
{
    struct gw_app *app = privdata;
    struct buf a, b;
    const char *ch[2];
    (void)h;
    if (app->stopping || channel_names(id, &a, &b))
        return;
    ch[0] = a.data;
    ch[1] = b.data;
    gw_sub_unsubscribe(app->sub, 2, ch);
    buf_release(&a);
    buf_release(&b);
}

struct read_ctx {
    struct gw_app *app;
    uint64_t ticket;
    char id[GW_TASK_ID_MAX + 1];
};

static void on_xrange(struct backend *bk, int status, const struct redisReply *r,
                      void *privdata)
{
    struct read_ctx *rc = privdata;
    struct gw_app *app = rc->app;
    const redisReply *reply = (const redisReply *)r;
    struct gw_entry *es = NULL;
    size_t n = 0;
    (void)bk;

    if (status || app->stopping)
        goto done;
    if (!reply || reply->type != REDIS_REPLY_ARRAY) {
        if (reply && reply->type == REDIS_REPLY_ERROR)
            LOG(LOG_ERROR, "gateway: reading progress of %s: %s", rc->id, reply->str);
        gw_hub_on_fetch_failed(app->hub, rc->id, rc->ticket);
        goto done;
    }
    es = cr_calloc(reply->elements ? reply->elements : 1, sizeof(*es));
    if (!es) {
        gw_hub_on_fetch_failed(app->hub, rc->id, rc->ticket);
        goto done;
    }
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *ent = reply->element[i];
        const redisReply *f;
        const char *names[16], *values[16];
        size_t nl[16], vl[16], nf = 0;
        if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 ||
            ent->element[0]->type != REDIS_REPLY_STRING ||
            ent->element[1]->type != REDIS_REPLY_ARRAY)
            continue;
        f = ent->element[1];
        for (size_t k = 0; k + 1 < f->elements && nf < 16; k += 2) {
            if (f->element[k]->type != REDIS_REPLY_STRING ||
                f->element[k + 1]->type != REDIS_REPLY_STRING)
                continue;
            names[nf] = f->element[k]->str;
            nl[nf] = (size_t)f->element[k]->len;
            values[nf] = f->element[k + 1]->str;
            vl[nf] = (size_t)f->element[k + 1]->len;
            nf++;
        }
        if (gw_entry_parse(ent->element[0]->str, (size_t)ent->element[0]->len, nf, names,
                           nl, values, vl, &es[n]) == 0)
            n++;
    }
    gw_hub_on_entries(app->hub, rc->id, rc->ticket, es, n,
                      reply->elements < GW_FETCH_COUNT);
done:
    cr_free(es);
    cr_free(rc);
}

/* A read's context, freed by its callback. NULL on OOM. */
static struct read_ctx *read_ctx_new(struct gw_app *app, const char *id, uint64_t ticket)
{
    struct read_ctx *rc = cr_calloc(1, sizeof(*rc));
    if (!rc)
        return NULL;
    rc->app = app;
    rc->ticket = ticket;
    snprintf(rc->id, sizeof(rc->id), "%s", id);
    return rc;
}

static int op_fetch(struct gw_hub *h, const char *id, int64_t after, uint64_t ticket,
                    void *privdata)
{
    struct gw_app *app = privdata;
    struct read_ctx *rc;
    struct buf key;
    char start[40], count[16];
    const char *argv[6];
    int err;
    (void)h;
    if (app->stopping)
        return CR_ECANCELED;
    rc = read_ctx_new(app, id, ticket);
    if (!rc)
        return CR_ENOMEM;
    buf_init(&key);
    if (progress_key(&key, id)) {
        cr_free(rc);
        return CR_ENOMEM;
    }
    /* "(" makes the start exclusive (Redis 6.2+); 40 bytes hold any int64. */
    progress_range_after(start, sizeof(start), after);
    snprintf(count, sizeof(count), "%d", GW_FETCH_COUNT);
    argv[0] = "XRANGE";
    argv[1] = key.data;
    argv[2] = start;
    argv[3] = "+";
    argv[4] = "COUNT";
    argv[5] = count;
    err = backend_command(app->backend, 6, argv, NULL, on_xrange, rc);
    buf_release(&key);
    if (err)
        cr_free(rc);
    return err;
}

static void on_meta_rq(int status, const char *meta, size_t len, void *privdata)
{
    struct read_ctx *rc = privdata;
    if (!rc->app->stopping) {
        if (status == 0)
            gw_hub_on_meta(rc->app->hub, rc->id, rc->ticket, meta, len);
        else if (status == CR_ENOMEM)
            gw_hub_on_meta_failed(rc->app->hub, rc->id, rc->ticket);
    }
    cr_free(rc);
}

/* No Celery meta: an RQ job's state, if there is one (gw_rq.h). */
static void on_meta(struct backend *bk, int status, const char *value, size_t len,
                    void *privdata)
{
    struct read_ctx *rc = privdata;
    if (status == 0 && !value && !rc->app->stopping) {
        if (gw_rq_read(bk, rc->id, 1, on_meta_rq, rc) == 0)
            return;
        gw_hub_on_meta_failed(rc->app->hub, rc->id, rc->ticket);
    } else if (status == 0 && !rc->app->stopping) {
        gw_hub_on_meta(rc->app->hub, rc->id, rc->ticket, value, len);
    }
    cr_free(rc);
}

static int op_get_meta(struct gw_hub *h, const char *id, uint64_t ticket, void *privdata)
{
    struct gw_app *app = privdata;
    struct read_ctx *rc;
    (void)h;
    if (app->stopping)
        return CR_ECANCELED;
    rc = read_ctx_new(app, id, ticket);
    if (!rc)
        return CR_ENOMEM;
    if (backend_get(app->backend, id, on_meta, rc)) {
        cr_free(rc);
        return CR_ENOMEM;
    }
    return 0;
}

static void op_send(struct gw_session *s, const char *text, size_t len, void *privdata)
{
    (void)privdata;
    gw_conn_send(gw_session_data(s), text, len);
}

static void op_close(struct gw_session *s, void *privdata)
{
    (void)privdata;
    gw_conn_close(gw_session_data(s), 1000, "done");
}

/* 1008 (policy) whichever limit it was, with the reason in the text: 1013
 * (try again later) would say it better, but Python's websocket-client as
 * Debian 12 ships it rejects that code as invalid. The page resumes from its
 * last seq on any close before the result. */
static void op_drop(struct gw_session *s, int reason, void *privdata)
{
    (void)privdata;
    gw_conn_drop(gw_session_data(s), 1008,
                 reason == GW_DROP_BUDGET ? "over the gateway's memory budget"
                                          : "too slow");
}

static const struct gw_hub_ops hub_ops = {
    op_subscribe, op_unsubscribe, op_fetch, op_get_meta, op_send, op_close, op_drop,
};

/* ------------------------------------------------------------- pub/sub */

/* Copies the task id after prefix into id; 0 when channel is not one of ours. */
static int channel_task(const char *channel, size_t len, const char *prefix,
                        char id[GW_TASK_ID_MAX + 1])
{
    size_t n = strlen(prefix);
    if (len <= n || len - n > GW_TASK_ID_MAX || memcmp(channel, prefix, n))
        return 0;
    memcpy(id, channel + n, len - n);
    id[len - n] = '\0';
    return 1;
}

static void on_sub_msg(struct gw_sub *s, const char *channel, size_t clen,
                       const char *payload, size_t len, void *privdata)
{
    struct gw_app *app = privdata;
    char id[GW_TASK_ID_MAX + 1];
    (void)s;
    if (channel_task(channel, clen, PROGRESS_KEY_PREFIX, id))
        gw_hub_on_notify(app->hub, id);
    else if (channel_task(channel, clen, BACKEND_META_PREFIX, id))
        gw_hub_on_meta_published(app->hub, id, payload, len);
}

static void on_sub_event(struct gw_sub *s, enum gw_sub_event ev, const char *channel,
                         size_t clen, void *privdata)
{
    struct gw_app *app = privdata;
    char id[GW_TASK_ID_MAX + 1];
    (void)s;
    if (app->stopping)
        return;
    if (ev == GW_SUB_UP)
        gw_hub_resubscribe(app->hub);
    else if (ev == GW_SUB_DOWN)
        gw_hub_on_sub_lost(app->hub);
    else if (channel_task(channel, clen, BACKEND_META_PREFIX, id))
        gw_hub_on_subscribed(app->hub, id);
}

/* ----------------------------------------------------------- lifecycle */

static void on_cron(uv_timer_t *t)
{
    struct gw_app *app = t->data;
    gw_hub_tick(app->hub, (int64_t)uv_now(app->loop));
}

static void on_broker_msg(struct broker *b, struct delivery *m, void *privdata)
{
    (void)b;
    (void)privdata;
    delivery_free(m); /* nothing is consumed; never called */
}

static const struct gw_server_handlers server_handlers = {on_request, on_ws_open,
                                                          on_ws_close, on_ws_written};

struct gw_app *gw_app_new(uv_loop_t *loop, const struct gw_app_config *cfg,
                          struct cr_err *err)
{
    struct gw_app *app = cr_calloc(1, sizeof(*app));
    struct backend_config bc = {0};
    unsigned char rnd[16];
    char host[256];

    if (!app) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    app->loop = loop;
    app->cfg = cfg;
    app->rules.tasks = cfg->tasks;
    app->rules.ntasks = cfg->ntasks;
    app->rules.queues = cfg->queues;
    app->rules.nqueues = cfg->nqueues;
    app->rules.default_queue = cfg->nqueues ? cfg->queues[0] : "celery";
    if (gethostname(host, sizeof(host)))
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    snprintf(app->origin, sizeof(app->origin), "gen%ld@%s", (long)getpid(), host);
    if (uv_random(NULL, NULL, rnd, sizeof(rnd), 0, NULL) == 0)
        cr_uuid4(rnd, app->reply_to);

    app->hub = gw_hub_new(&hub_ops, app);
    app->cron = cr_malloc(sizeof(*app->cron));
    if (!app->hub || !app->cron) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        gw_hub_free(app->hub);
        cr_free(app->cron);
        cr_free(app);
        return NULL;
    }
    gw_hub_set_limits(app->hub, GW_WS_QUEUE_MAX, cfg->max_buffered_bytes);
    uv_timer_init(loop, app->cron);
    app->cron->data = app;
    /* The broker's URL and transport options (an SQS region, a Redis
     * master_name) are checked here, before the wait for the result backend:
     * a mistyped option is the start-up error, not a 10 s wait for Redis
     * followed by it. broker_new() opens no connection. */
    app->bcfg.url = cfg->broker_url;
    app->bcfg.transport_options = cfg->broker_transport_options;
    app->bcfg.heartbeat = 60;
    app->bcfg.connect_timeout = 5;
    app->broker = broker_new(loop, &app->bcfg, on_broker_msg, NULL, app, err);
    if (!app->broker)
        goto fail;
    /* Declare each queue clients may send to, as Celery's producer does, so a
     * task sent before any worker ran is kept rather than dropped unroutable
     * (on SQS: created as kombu creates it, under queue_name_prefix). */
    for (int i = 0; i < cfg->nqueues; i++) {
        struct broker_queue q;
        broker_task_queue(&q, cfg->queues[i]);
        q.no_consume = 1;
        if (broker_add_consumer(app->broker, &q)) {
            cr_err_set(err, CR_ENOMEM, "out of memory");
            goto fail;
        }
    }
    bc.url = cfg->backend_url;
    bc.result_expires = 0;
    bc.timeout = cfg->redis_timeout;
    bc.health_check_interval = cfg->redis_health_check_interval;
    app->backend = backend_new(loop, &bc, err);
    if (!app->backend)
        goto fail;
    if (backend_wait_connected(app->backend, loop, 10000, err))
        goto fail;
    app->sub =
        gw_sub_new(loop, cfg->backend_url, cfg->redis_timeout,
                   cfg->redis_health_check_interval, on_sub_msg, on_sub_event, app, err);
    if (!app->sub)
        goto fail;
    if (broker_connect(app->broker, err))
        goto fail;
    app->scfg.host = cfg->host;
    app->scfg.port = cfg->port;
    app->scfg.max_body_bytes = cfg->max_body_bytes;
    app->scfg.cors_origin = cfg->cors_origin;
    app->scfg.header_timeout = cfg->header_timeout;
    app->scfg.max_untrusted = cfg->max_unauthenticated;
    app->srv = gw_server_new(loop, &app->scfg, &server_handlers, app, err);
    if (!app->srv)
        goto fail;
    app->trace = gw_trace_new(loop, (const char *const *)environ, err);
    if (!app->trace && err->code)
        goto fail;
    uv_timer_start(app->cron, on_cron, CRON_MS, CRON_MS);
    return app;
fail:
    gw_app_free(app);
    return NULL;
}

int gw_app_port(const struct gw_app *app)
{
    return gw_server_port(app->srv);
}

const char *gw_app_addresses(const struct gw_app *app)
{
    return gw_server_addresses(app->srv);
}

static void on_cron_closed(uv_handle_t *h)
{
    cr_free(h);
}

void gw_app_free(struct gw_app *app)
{
    if (!app)
        return;
    /* Sockets first, while the hub is there for their close callbacks. */
    gw_server_free(app->srv);
    app->stopping = 1;
    gw_sub_free(app->sub);
    broker_free(app->broker);
    backend_free(app->backend);
    gw_hub_free(app->hub);
    gw_trace_free(app->trace);
    uv_timer_stop(app->cron);
    uv_close((uv_handle_t *)app->cron, on_cron_closed);
    cr_free(app);
}
