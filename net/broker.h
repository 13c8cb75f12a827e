/* broker.h -- the broker face: one API over the transports that carry Celery's
 * messages, chosen by the URL's scheme.
 *
 * - amqp:// and amqps:// (net/rmq_broker.c): RabbitMQ over AMQP 0-9-1 (rabbitmq-c).
 * - redis://, rediss://, redis+socket://, unix:// and sentinel:// (net/redis_broker.c):
 *   kombu's Redis transport, as Python producers and workers write it.
 * - sqs:// (net/sqs_broker.c): Amazon SQS as kombu's SQS transport uses it
 *   (JSON protocol, SigV4 by libcurl). No fanout: no remote control, no
 *   events; one long poll per queue; acks are DeleteMessageBatch, a requeue
 *   a visibility change; transport options are kombu's SQS ones.
 *
 * Callers (the worker's switchboard, remote control, events, metrics, the
 * gateway, the dlq tool) see only this header. A transport allocates and fills
 * a struct delivery (protocol/message.h) for every message it receives, with
 * the priority already on the engine's scale (higher = more urgent) and its
 * capabilities in caps, and keeps its own record of it in d->rec. Not
 * thread-safe: loop thread only. */
#ifndef CR_BROKER_H
#define CR_BROKER_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <cjson/cJSON.h>

#include "protocol/message.h"
#include "util/err.h"

struct broker_config {
    const char *url; /* amqp://user:pass@host:port/vhost, or redis://...; AMQP
                      * also takes a failover list "amqp://a;amqp://b" */
    /* AMQP: Celery's broker_failover_strategy for a URL list, "round-robin"
     * (NULL: the default) or "shuffle"; broker_new() refuses others. */
    const char *failover_strategy;
    char *const *queues; /* names to declare and consume */
    int nqueues;
    int prefetch_count;          /* basic.qos; 0 = unlimited */
    int heartbeat;               /* seconds; 0 disables */
    double connect_timeout;      /* seconds */
    const char *dlx;             /* dead-letter exchange to declare, or NULL */
    const char *dlq;             /* its queue, bound with "#" */
    const char *connection_name; /* shown by the broker (with the role), or NULL */
    /* 0: one window for the whole task channel (basic.qos global, as Celery
     * sets it on RabbitMQ), moved live by broker_set_prefetch(). 1: a window
     * per task consumer (basic.qos global=0 before each basic.consume), so a
     * queue whose window is full never holds back another queue's messages;
     * RabbitMQ fixes such a window when the consumer starts, so a new count
     * applies from the next consume (reconnect, add_consumer) on. */
    int per_consumer_qos;
    /* AMQP: declare the task queues x-queue-type quorum (Celery's
     * task_default_queue_type "quorum"). Quorum queues refuse a channel-wide
     * window, so this implies per_consumer_qos. Whatever is set here, a
     * broker that refuses global QoS (540 NOT_IMPLEMENTED: a queue declared
     * quorum by the application) makes the connection open again once with
     * per-consumer QoS, which then stays for every reconnect. */
    int quorum;
    /* AMQP: native delayed delivery (celery_delayed_0..27 and
     * celery_delayed_delivery, as a Celery 5.5+ worker declares them), with
     * every consumed task queue bound to celery_delayed_delivery by
     * "#.<queue>". BROKER_DELAYED_AUTO: only while QoS is per consumer.
     * While it is declared, deliveries have MSG_CAP_DELAYED. */
    int delayed_delivery; /* BROKER_DELAYED_* */
    /* Redis: Celery's broker_transport_options as a JSON object (visibility
     * timeout, priority steps, global_keyprefix, master_name, ...), or NULL.
     * broker_new() refuses an AMQP URL given any. */
    const char *transport_options;
    size_t max_message_bytes; /* Redis: a larger envelope is refused; 0: none */
    /* AMQP: x-consumer-timeout (ms) on each task consumer, on a node that
     * takes a per-consumer delivery timeout (RabbitMQ 3.12 and later); 0:
     * none, the node's consumer_timeout applies. */
    int64_t consumer_timeout_ms;
};

#define BROKER_DELAYED_OFF 0
#define BROKER_DELAYED_AUTO 1
#define BROKER_DELAYED_ON 2

struct broker;

/* Takes d (free it with delivery_free()). Called for each complete delivery. */
typedef void broker_delivery_fn(struct broker *b, struct delivery *d, void *privdata);
/* up = 1 after every successful (re)connect, 0 when the connection is lost. */
typedef void broker_conn_fn(struct broker *b, int up, void *privdata);
/* Publisher confirm for one broker_publish(): ok = 1 when the broker took the
 * message, 0 on nack or connection loss. Called exactly once per accepted
 * publish, never from inside broker_publish(). */
typedef void broker_confirm_fn(struct broker *b, int ok, void *privdata);

/* Returns a new broker (not yet connected) of the transport cfg->url names, or
 * NULL with err set: CR_EINVAL for a URL or transport options it refuses (one
 * line, password redacted), CR_ENOMEM. The config strings are borrowed and must
 * outlive the broker. */
struct broker *broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                          broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                          void *privdata, struct cr_err *err);

/* 1 when url names a Redis transport (redis, rediss, redis+socket, unix,
 * sentinel), else 0 (AMQP). */
int broker_url_is_redis(const char *url);
/* 1 when url names Amazon SQS (sqs://), else 0. */
int broker_url_is_sqs(const char *url);

/* "amqp", "redis" or "sqs": for logs, and for what differs on the wire (events go
 * to a fanout exchange on Redis, as Celery switches them). */
const char *broker_transport(const struct broker *b);

/* What this transport's deliveries can do now: MSG_CAP_* of
 * protocol/message.h, the value a new delivery carries in d->caps. AMQP has
 * MSG_CAP_DELAYED while native delayed delivery is declared on the
 * connection, the consumed task queues bound to it (see
 * broker_config.delayed_delivery). */
unsigned broker_delivery_caps(const struct broker *b);
/* 1 when the task consumers have a window each (per_consumer_qos, quorum, or
 * the broker refused global QoS), so broker_set_prefetch() cannot raise it
 * live for held eta tasks; 0 otherwise (Redis: 0). */
int broker_qos_per_consumer(const struct broker *b);

/* Connects, declares, sets qos and starts consuming. Blocking (bounded by the
 * connect timeout and a 10 s RPC timeout); call at start-up. Returns 0 or an
 * error with a one-line reason (password redacted) in err.
 * Redis: waits for its three connections (BRPOP, commands, pub/sub); the
 * bindings (`_kombu.binding.*` members) of every consumed queue and of the
 * dead-letter queue are written, a first restore of dead workers' messages
 * runs, and BRPOP starts from the loop. */
int broker_connect(struct broker *b, struct cr_err *err);

/* Start-up only (runs the loop): waits until the fanout consumers added so
 * far are subscribed for sure, so a broadcast sent after it returns is heard.
 * Redis: the PSUBSCRIBE confirmations; AMQP: nothing to wait for. Returns 0,
 * or CR_ETIMEDOUT after timeout_ms (the subscriptions still complete later). */
int broker_wait_subscribed(struct broker *b, int timeout_ms);

/* After a lost connection the broker reconnects by itself with backoff; this
 * says whether it is connected now (Redis: all three connections up). The
 * generation changes with each AMQP connection, never on Redis. */
int broker_connected(const struct broker *b);
unsigned broker_generation(const struct broker *b);
/* Number of reconnects since start. */
unsigned long broker_reconnects(const struct broker *b);
/* 1 while the broker blocks publishing (connection.blocked: a memory or disk
 * alarm), with its reason in *why when why is not NULL (borrowed, valid until
 * the next call into the broker); 0 otherwise. Redis: always 0 (a refused
 * write fails its publish instead). */
int broker_blocked(const struct broker *b, const char **why);

/* Acks or rejects a delivery this broker handed over, and marks it settled
 * (d->settled). A delivery from an older connection generation is silently
 * skipped (the broker already requeued it), and so is a second settle of the
 * same delivery, or one consumed no_ack. d is not kept: it may be freed on
 * return.
 *
 * An ack is batched: it is recorded now and sent before the loop next waits for
 * I/O, together with the other acks of the iteration, as one basic.ack with
 * multiple = 1 where the deliveries below it are all settled (or one frame each
 * above a delivery still in progress), and by broker_free() at the latest. A
 * connection lost before then drops it, and the broker redelivers. A reject is
 * sent at once. Returns 0 or CR_EBROKER (a write failed now: the connection is
 * being re-established).
 *
 * Redis: an ack removes the delivery's record (MULTI ZREM unacked_index /
 * HDEL unacked / EXEC, the iteration's acks in one transaction); one made
 * while the connection is down is sent when it is back. reject(requeue = 0)
 * is an ack. reject(requeue = 1) puts the message back on its own priority
 * list with the redelivered flags, in one script that also removes the
 * record, and only if the record is unchanged: at the tail (LPUSH, kombu's
 * requeue) while consuming, at the head (RPUSH, kombu's restore) after
 * broker_stop_consuming(), so that other workers take it at once.
 *
 * SQS: an ack is a DeleteMessageBatch entry (per queue, ten at most), sent
 * with the iteration's others; reject(requeue = 0) too (the dead letter is
 * the caller's publish); reject(requeue = 1) makes the message visible again
 * after wait_time_seconds (ChangeMessageVisibilityBatch, kombu 5.6.2's rule,
 * so that an open long poll cannot take it back). A failed settle is retried
 * with back-off on throttling and 5xx, else logged: the message comes back
 * after its visibility timeout. Always 0 but CR_ENOMEM. */
int broker_ack(struct broker *b, struct delivery *d);
int broker_reject(struct broker *b, struct delivery *d, int requeue);

/* Whether d (handed over by b, not yet settled) can still be settled: AMQP
 * while the connection it came on is up; Redis always (its record lives in
 * Redis, and an ack made while a connection is down waits for it). */
int broker_live(const struct broker *b, const struct delivery *d);

/* Publishes o (borrowed for the call) to o->exchange with o->routing_key,
 * with publisher confirms. Returns 0 (cb will be called exactly once) or an
 * error (cb never called). While the broker blocks publishing the message is
 * copied and held, in order, and sent when it unblocks (cb waits); held past a
 * bound (or with o->no_hold) it is refused with CR_EBROKER.
 *
 * Redis: a kombu envelope with a fresh uuid4 delivery tag. Exchange "": LPUSH
 * to the routing key's queue (its priority bucket); a fanout exchange
 * (declared so, or celery.pidbox / celeryev): PUBLISH on its channel; any
 * other: the queues its binding set names (direct: equal key; topic: kombu's
 * match), none matching drops it as kombu does (ok = 1). The confirm is
 * Redis's reply (ok = 0 on an error reply or a lost connection); nothing is
 * ever held. CR_EBROKER while the commands connection is down.
 *
 * SQS: SendMessage of kombu's base64 envelope (exchange "", the routing key
 * the Celery queue) to the queue the routing key names (a publish to the
 * dead-letter exchange goes to the dead-letter queue); a queue not seen yet
 * is resolved first (GetQueueUrl, CreateQueue when missing). The confirm is
 * SQS's answer, after retries with back-off on throttling and 5xx.
 * CR_EINVAL for a queue name SQS refuses or one not in predefined_queues. */
int broker_publish(struct broker *b, const struct outbound *o, broker_confirm_fn *cb,
                   void *privdata);

/* A queue to declare (with its exchange and binding) and consume. */
struct broker_queue {
    const char *name;
    const char *exchange;      /* NULL or "": bind nothing */
    const char *exchange_type; /* "direct", "fanout" or "topic" */
    int exchange_durable;
    const char *routing_key; /* binding key */
    int durable;
    int exclusive;
    int auto_delete;
    const cJSON *arguments; /* queue arguments (x-expires, ...), or NULL */
    int no_ack;
    int no_consume; /* declare (and redeclare on reconnect) but never consume */
    /* AMQP: one of the worker's own durable queues (a park queue). Declared
     * quorum, with reject-publish overflow and at-least-once dead-lettering,
     * whenever the task queues are quorum: by configuration (quorum above) or
     * as the broker's refusal of global QoS showed. Redis: ignored. */
    int follow_quorum;
};

/* Fills q with what Celery declares for a task queue by name: a durable
 * direct exchange of the same name, a durable queue bound with its name
 * (name borrowed). */
void broker_task_queue(struct broker_queue *q, const char *name);

/* Adds a consumer (everything in q is copied). It is declared and consumed on
 * every (re)connect; while connected the declarations and basic.consume go out
 * at once without waiting for replies, so this never blocks. A queue already
 * consumed is left as it is. Returns 0, or CR_ENOMEM / CR_ERANGE (too many).
 * Redis: the declaration is the binding member (SADD); a fanout queue is
 * consumed with PSUBSCRIBE (deliveries no_ack), any other joins the BRPOP
 * from its next round (a no_ack one without records). Queue arguments,
 * durability and exclusivity mean nothing there. */
int broker_add_consumer(struct broker *b, const struct broker_queue *q);
/* Stops consuming a queue (basic.cancel) and forgets it. Returns 0, or
 * CR_ENOTFOUND when the queue is not consumed. Redis: leaves the BRPOP; a
 * fanout or auto-delete queue's binding is removed (SREM) and its pattern
 * unsubscribed, a task queue's binding stays (restores through its exchange
 * need it). */
int broker_cancel_consumer(struct broker *b, const char *queue);
/* Names of the consumed queues, for inspect active_queues: calls fn for each. */
void broker_each_consumer(const struct broker *b,
                          void (*fn)(const struct broker_queue *q, void *arg), void *arg);

/* Declares an exchange now (nowait) and on every reconnect. Returns 0 or CR_ENOMEM.
 * Redis: remembered only (its type routes publishes), as kombu keeps
 * exchanges in memory; CR_ERANGE past a bound. */
int broker_declare_exchange(struct broker *b, const char *name, const char *type,
                            int durable);

/* The answer to one broker_queue_stats(): ok = 1 with the queue's ready
 * message count and consumer count; ok = 0 when the queue does not exist or
 * the connection was lost. */
typedef void broker_queue_stats_fn(struct broker *b, int ok, uint32_t messages,
                                   uint32_t consumers, void *privdata);
/* Polls a queue's depth with a passive queue.declare on a second channel, sent
 * without waiting, so a missing queue (which closes the channel it was asked
 * on) never disturbs the channel that consumes and acks. cb is called exactly
 * once, never from inside this call, unless cancelled first. Returns 0, or
 * CR_EBROKER (not connected, or the poll channel is reopening after an error)
 * or CR_ENOMEM, and then cb is never called.
 * Redis: the sum of LLEN over the queue's priority lists (one transaction);
 * consumers is always 0 (Redis does not know them); a missing queue is an
 * empty one (ok = 1, 0 messages). */
int broker_queue_stats(struct broker *b, const char *queue, broker_queue_stats_fn *cb,
                       void *privdata);
/* Drops the pending polls made with privdata: their callbacks are never
 * called (for an owner freed before the broker). */
void broker_queue_stats_cancel(struct broker *b, void *privdata);

/* Sets basic.qos prefetch_count (sent without waiting): at once for the
 * channel-wide window, from the next consume on with per_consumer_qos.
 * Redis: the next BRPOP goes only while popped-but-unsettled deliveries are
 * fewer (0: no bound), one window for all queues. */
void broker_set_prefetch(struct broker *b, int prefetch_count);

/* Stops consuming task queues (basic.cancel on every consumer with acks, sent
 * without waiting). Redis: no BRPOP after this; the one blocked is ended
 * (CLIENT UNBLOCK) and a message it still returns goes back to the head of
 * its list; from now on a requeue is a restore (see broker_reject()). */
void broker_stop_consuming(struct broker *b);

/* Sends the acks still batched, closes the connections (unacked deliveries go
 * back to their queues) and frees. Pending confirms and held publishes are
 * called with ok = 0. NULL is a no-op.
 * Redis: a delivery's record outlives the connections, so the unsettled ones
 * are restored here (to the head of their lists, redelivered) and the
 * mailbox's binding removed; this runs the loop until Redis has answered,
 * 3 s at most (the owner's loop is ending). What is still unrestored comes
 * back after the visibility timeout.
 * SQS: the open long polls are let end (what they bring is held too), then
 * every held message is made visible again (ChangeMessageVisibilityBatch,
 * 0, or wait_time_seconds if a poll is still open after 3 s); the loop runs
 * until SQS has answered, 3 s at most. */
void broker_free(struct broker *b);

#endif
