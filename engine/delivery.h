/* delivery.h -- a message as the engine sees it, whatever transport brought it,
 * and a message the engine asks a transport to publish. No I/O.
 *
 * A transport (net/rmq_broker.c, net/redis_broker.c) fills a struct
 * delivery for each message it hands to engine_on_delivery() and keeps what only
 * it needs behind `tag`. The engine reads the fields, never the tag, and asks
 * the transport's capabilities through `caps`, never its name. */
#ifndef CR_ENGINE_DELIVERY_H
#define CR_ENGINE_DELIVERY_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

/* What the transport that brought a delivery can do. */
#define DELIVERY_CAP_CONFIRMS 1u /* publishes are confirmed (engine_on_confirm) */
#define DELIVERY_CAP_PRIORITY 2u /* messages carry a priority (see `priority`) */
#define DELIVERY_CAP_PREFETCH 4u /* a prefetch window that set_prefetch moves */
#define DELIVERY_CAP_PARK 8u     /* park queues: a TTL copy that comes back */
#define DELIVERY_CAP_DELAYED 16u /* native delayed delivery (celery_delayed_*) */

struct delivery {
    /* public: set by the transport, then read-only (all borrowed from the
     * transport's message, valid until the engine releases the delivery) */
    const char *body; /* NUL-terminated; body_len excludes it */
    size_t body_len;
    const char *content_type;
    const char *content_encoding;
    const char *correlation_id;
    const char *reply_to;
    int delivery_mode;
    /* Higher = more urgent, on the engine's scale 0..ENGINE_PRIORITY_MAX
     * (larger values are clamped, negative ones count as 0). The transport
     * maps its own scale into it: AMQP's basic priority already reads this
     * way; kombu's Redis transport, where 0 is the most urgent, must invert.
     * Read only when caps has DELIVERY_CAP_PRIORITY; otherwise every delivery
     * counts as priority 0. */
    int priority;
    /* The priority as the message carried it, on its transport's own scale
     * (AMQP's as is; kombu's Redis numbers, where 0 is the most urgent):
     * what copies republished from it carry (retries, dead letters, parked
     * copies), so they keep the urgency their producer gave them. */
    int wire_priority;
    const char *exchange;    /* where it was published */
    const char *routing_key; /* with what key */
    const char *queue;       /* the queue it was consumed from */
    int redelivered;
    uint64_t received_ms; /* loop time it arrived */
    unsigned caps;        /* DELIVERY_CAP_* of its transport */
    /* Header table as JSON, or NULL. The delivery owns it; the engine may drop
     * it (cJSON_Delete, then NULL) once it has decoded what it needs. */
    cJSON *headers;
    int headers_bad; /* an entry could not be converted (headers holds the rest) */
    const char *headers_err; /* why, or NULL */
    void *tag;               /* private to the transport */
    /* Set by the transport when an ack or reject of it went out on the
     * connection it came on: the engine never settles it again. */
    int settled;
    unsigned flags; /* the engine's: DELIVERY_F_* */
};

#define DELIVERY_F_PARKING 1u /* a parked copy is on its way (unconfirmed) */

/* A message to publish (retry, dead letter, parked copy, canvas follow-up).
 * Everything borrowed for the call to engine_ops.publish. */
struct outbound {
    const char *exchange;
    const char *routing_key;
    const char *content_type;
    const char *content_encoding;
    const char *correlation_id;
    const char *reply_to;
    int delivery_mode;
    /* On the transport's own scale, as a Celery producer writes it on that
     * broker (see struct delivery's wire_priority). */
    int priority;
    const cJSON *headers;
    const char *body;
    size_t body_len;
    const char *expiration; /* the AMQP expiration (ms, decimal), or NULL */
};

#endif
