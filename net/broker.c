/* broker.c -- the broker face: picks a transport by URL scheme and forwards
 * every call to its table (broker_int.h) in one hop. */
#include "broker_int.h"

#include <string.h>
#include <strings.h>

#include "util/alloc.h"
#include "util/err.h"

void broker_task_queue(struct broker_queue *q, const char *name)
{
    memset(q, 0, sizeof(*q));
    q->name = name;
    q->exchange = name;
    q->exchange_type = "direct";
    q->exchange_durable = 1;
    q->routing_key = name;
    q->durable = 1;
}

int broker_queue_copy(struct broker_queue *dst, const struct broker_queue *src)
{
    *dst = *src;
    dst->name = cr_strdup(src->name);
    dst->exchange = src->exchange ? cr_strdup(src->exchange) : NULL;
    dst->exchange_type = src->exchange_type ? cr_strdup(src->exchange_type) : NULL;
    dst->routing_key = src->routing_key ? cr_strdup(src->routing_key) : NULL;
    dst->arguments = src->arguments ? cJSON_Duplicate(src->arguments, 1) : NULL;
    if (!dst->name || (src->exchange && !dst->exchange) ||
        (src->exchange_type && !dst->exchange_type) ||
        (src->routing_key && !dst->routing_key) || (src->arguments && !dst->arguments)) {
        broker_queue_release(dst);
        return CR_ENOMEM;
    }
    return 0;
}

void broker_queue_release(struct broker_queue *q)
{
    cr_free((char *)q->name);
    cr_free((char *)q->exchange);
    cr_free((char *)q->exchange_type);
    cr_free((char *)q->routing_key);
    cJSON_Delete((cJSON *)q->arguments);
    memset(q, 0, sizeof(*q));
}

int broker_url_is_redis(const char *url)
{
    static const char *const schemes[] = {"redis://", "rediss://", "redis+socket://",
                                          "unix://", "sentinel://"};
    if (!url)
        return 0;
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        if (!strncasecmp(url, schemes[i], strlen(schemes[i])))
            return 1;
    }
    return 0;
}

struct broker *broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                          broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                          void *privdata, struct cr_err *err)
{
    if (broker_url_is_redis(cfg->url))
        return redis_broker_new(loop, cfg, on_delivery, on_conn, privdata, err);
    if (broker_url_is_sqs(cfg->url))
        return sqs_broker_new(loop, cfg, on_delivery, on_conn, privdata, err);
    if (cfg->transport_options && *cfg->transport_options) {
        cr_err_set(
            err, CR_EINVAL,
            "broker transport options are for a Redis or SQS broker; this one is AMQP");
        return NULL;
    }
    return rmq_broker_new(loop, cfg, on_delivery, on_conn, privdata, err);
}

const char *broker_transport(const struct broker *b)
{
    return b->vt->name;
}

unsigned broker_delivery_caps(const struct broker *b)
{
    unsigned caps = b->vt->caps | (b->vt->live_caps ? b->vt->live_caps(b) : 0);
    /* A per-consumer window is fixed when its consumer starts: set_prefetch
     * does not move it. */
    if (broker_qos_per_consumer(b))
        caps &= ~MSG_CAP_PREFETCH;
    return caps;
}

int broker_qos_per_consumer(const struct broker *b)
{
    return b->vt->qos_per_consumer ? b->vt->qos_per_consumer(b) : 0;
}

int broker_connect(struct broker *b, struct cr_err *err)
{
    return b->vt->connect(b, err);
}

int broker_wait_subscribed(struct broker *b, int timeout_ms)
{
    return b->vt->wait_subscribed ? b->vt->wait_subscribed(b, timeout_ms) : 0;
}

int broker_connected(const struct broker *b)
{
    return b->vt->connected(b);
}

unsigned broker_generation(const struct broker *b)
{
    return b->vt->generation(b);
}

unsigned long broker_reconnects(const struct broker *b)
{
    return b->vt->reconnects(b);
}

int broker_blocked(const struct broker *b, const char **why)
{
    return b->vt->blocked(b, why);
}

int broker_ack(struct broker *b, struct delivery *d)
{
    return b->vt->ack(b, d);
}

int broker_reject(struct broker *b, struct delivery *d, int requeue)
{
    return b->vt->reject(b, d, requeue);
}

int broker_live(const struct broker *b, const struct delivery *d)
{
    return b->vt->live(b, d);
}

int broker_publish(struct broker *b, const struct outbound *o, broker_confirm_fn *cb,
                   void *privdata)
{
    return b->vt->publish(b, o, cb, privdata);
}

int broker_add_consumer(struct broker *b, const struct broker_queue *q)
{
    return b->vt->add_consumer(b, q);
}

int broker_cancel_consumer(struct broker *b, const char *queue)
{
    return b->vt->cancel_consumer(b, queue);
}

void broker_each_consumer(const struct broker *b,
                          void (*fn)(const struct broker_queue *q, void *arg), void *arg)
{
    b->vt->each_consumer(b, fn, arg);
}

int broker_declare_exchange(struct broker *b, const char *name, const char *type,
                            int durable)
{
    return b->vt->declare_exchange(b, name, type, durable);
}

int broker_queue_stats(struct broker *b, const char *queue, broker_queue_stats_fn *cb,
                       void *privdata)
{
    return b->vt->queue_stats(b, queue, cb, privdata);
}

void broker_queue_stats_cancel(struct broker *b, void *privdata)
{
    b->vt->queue_stats_cancel(b, privdata);
}

void broker_set_prefetch(struct broker *b, int prefetch_count)
{
    b->vt->set_prefetch(b, prefetch_count);
}

void broker_stop_consuming(struct broker *b)
{
    b->vt->stop_consuming(b);
}

void broker_free(struct broker *b)
{
    if (b)
        b->vt->free(b);
}
