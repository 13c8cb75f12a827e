/* broker_int.h -- what a transport implements behind net/broker.h. For the
 * transports (net/rmq_broker.c, net/redis_broker.c, net/sqs_broker.c) and
 * net/broker.c only.
 *
 * A transport's handle begins with a struct broker whose vt points at its one
 * static table. Each entry is the transport's own function: it takes the
 * struct broker and casts it once to the transport's handle, and has the
 * contract of the broker_*() function of the same name in broker.h, which
 * calls it directly. */
#ifndef CR_BROKER_INT_H
#define CR_BROKER_INT_H

#include "broker.h"

struct broker_vtab {
    const char *name; /* broker_transport() */
    unsigned caps;    /* broker_delivery_caps(), with the ones below */
    /* Caps that come and go with the connection, or NULL. */
    unsigned (*live_caps)(const struct broker *b);
    /* broker_qos_per_consumer(), or NULL (0). */
    int (*qos_per_consumer)(const struct broker *b);
    int (*connect)(struct broker *b, struct cr_err *err);
    int (*connected)(const struct broker *b);
    int (*wait_subscribed)(struct broker *b,
                           int timeout_ms); /* NULL: nothing to wait for */
    unsigned (*generation)(const struct broker *b);
    unsigned long (*reconnects)(const struct broker *b);
    int (*blocked)(const struct broker *b, const char **why);
    int (*ack)(struct broker *b, struct delivery *d);
    int (*reject)(struct broker *b, struct delivery *d, int requeue);
    int (*live)(const struct broker *b, const struct delivery *d);
    int (*publish)(struct broker *b, const struct outbound *o, broker_confirm_fn *cb,
                   void *privdata);
    int (*add_consumer)(struct broker *b, const struct broker_queue *q);
    int (*cancel_consumer)(struct broker *b, const char *queue);
    void (*each_consumer)(const struct broker *b,
                          void (*fn)(const struct broker_queue *q, void *arg), void *arg);
    int (*declare_exchange)(struct broker *b, const char *name, const char *type,
                            int durable);
    int (*queue_stats)(struct broker *b, const char *queue, broker_queue_stats_fn *cb,
                       void *privdata);
    void (*queue_stats_cancel)(struct broker *b, void *privdata);
    void (*set_prefetch)(struct broker *b, int prefetch_count);
    void (*stop_consuming)(struct broker *b);
    void (*free)(struct broker *b);
};

struct broker {
    const struct broker_vtab *vt;
};

/* A transport's own copy of a consumer's queue (broker_add_consumer copies
 * everything): *dst = *src with the strings and the arguments duplicated.
 * Returns 0, or CR_ENOMEM with dst holding nothing (released). */
int broker_queue_copy(struct broker_queue *dst, const struct broker_queue *src);
/* Frees what broker_queue_copy() duplicated and clears q. */
void broker_queue_release(struct broker_queue *q);

/* The transports' constructors (broker_new() picks one by URL). Same contract
 * as broker_new(). */
struct broker *rmq_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                              broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                              void *privdata, struct cr_err *err);
struct broker *redis_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                                broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                                void *privdata, struct cr_err *err);
struct broker *sqs_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                              broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                              void *privdata, struct cr_err *err);

#endif
