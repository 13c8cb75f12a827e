/* message.h -- one message, whatever transport carries it: a delivery (what a
 * broker handed over) and an outbound message (what to publish). No I/O.
 *
 * A transport (net/rmq_broker.c, net/redis_broker.c) allocates the delivery,
 * fills it, keeps what only it needs in `rec`, and hands it on; the receiver
 * (the engine, the remote-control mailbox) reads the public fields, asks the
 * transport's abilities through `caps`, never its name, and settles it through
 * the broker face (net/broker.h), which marks it `settled`. The same outbound
 * message goes to every transport and to kombu's envelope encoder
 * (protocol/kombu.h). */
#ifndef CR_MESSAGE_H
#define CR_MESSAGE_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

/* What the transport that brought a delivery can do. */
#define MSG_CAP_CONFIRMS 1u /* publishes are confirmed */
#define MSG_CAP_PRIORITY 2u /* messages carry a priority (see `priority`) */
#define MSG_CAP_PREFETCH 4u /* a prefetch window that set_prefetch moves */
#define MSG_CAP_PARK 8u     /* park queues: a TTL copy that comes back */
#define MSG_CAP_DELAYED 16u /* native delayed delivery (celery_delayed_*) */

/* The transport's own record of a delivery: what it settles by. Only the
 * transport that filled it reads it. */
struct delivery_rec {
    uint64_t seq;        /* a number (AMQP: the channel's delivery tag) */
    char *id;            /* a string, owned (Redis: kombu's delivery tag, the
                          * key of the unacked entry), or NULL */
    unsigned generation; /* the connection it came on (AMQP) */
};

/* One delivery. Every string is the delivery's own (NULL when the message had
 * none, except body); the receiver frees it with delivery_free(). */
struct delivery {
    /* public: set by the transport, then read-only */
    char *body; /* NUL-terminated; body_len excludes it */
    size_t body_len;
    char *content_type;
    char *content_encoding;
    char *correlation_id;
    char *reply_to;
    char *expiration;
    char *message_id;
    int delivery_mode;
    /* Higher = more urgent, on the engine's scale 0..ENGINE_PRIORITY_MAX
     * (larger values are clamped, negative ones count as 0). The transport
     * maps its own scale into it: AMQP's basic priority already reads this
     * way; kombu's Redis transport, where 0 is the most urgent, must invert.
     * Read only when caps has MSG_CAP_PRIORITY; otherwise every delivery
     * counts as priority 0. */
    int priority;
    /* The priority as the message carried it, on its transport's own scale
     * (AMQP's as is; kombu's Redis numbers, where 0 is the most urgent):
     * what copies republished from it carry (retries, dead letters, parked
     * copies), so they keep the urgency their producer gave them. */
    int wire_priority;
    char *exchange;    /* where it was published */
    char *routing_key; /* with what key */
    char *queue;       /* the queue whose consumer received it */
    int redelivered;
    int no_ack;           /* consumed without acks: settling it does nothing */
    uint64_t received_ms; /* loop time it arrived */
    unsigned caps;        /* MSG_CAP_* of its transport when it arrived */
    /* Header table as JSON, or NULL. The receiver may drop it (cJSON_Delete,
     * then NULL) once it has decoded what it needs. */
    cJSON *headers;
    int headers_bad;   /* an entry could not be converted (headers holds the rest) */
    char *headers_err; /* why, or NULL */

    /* read-only: set by the transport when an ack or reject of it went out
     * (or was recorded to go out); settling it again does nothing */
    int settled;

    /* the receiver's own bookkeeping (the engine's DELIVERY_F_*) */
    unsigned flags;

    /* private: the transport's */
    struct delivery_rec rec;
};

/* Returns a new zeroed delivery, or NULL on OOM. */
struct delivery *delivery_new(void);
/* Frees d, its strings, its headers and its record. NULL is a no-op. */
void delivery_free(struct delivery *d);

/* A message to publish. Everything borrowed for the call that takes it;
 * NULL omits a property. */
struct outbound {
    const char *exchange;    /* NULL reads "" (the default exchange) */
    const char *routing_key; /* NULL reads "" */
    const char *content_type;
    const char *content_encoding;
    const char *correlation_id;
    const char *reply_to;
    const char *expiration; /* ms, decimal, or NULL */
    int delivery_mode;      /* 0 omits */
    /* On the transport's own scale, as a Celery producer writes it on that
     * broker (see struct delivery's wire_priority); < 0 omits. */
    int priority;
    const cJSON *headers;
    const char *body;
    size_t body_len;
    /* Refused rather than held while the broker blocks publishing: for
     * messages worth nothing late, such as events. */
    int no_hold;
};

#endif
