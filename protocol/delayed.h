/* delayed.h -- RabbitMQ native delayed delivery as Celery 5.5+ lays it out:
 * names, routing keys and the hold-or-delay decision. Pure: no I/O, no clock.
 *
 * The topology is a chain of 28 topic exchanges, celery_delayed_27 down to
 * celery_delayed_0, one per binary digit of a delay in whole seconds, most
 * significant first. A routing key spells the delay as 28 dot-separated
 * digits followed by the destination routing key ("0.0.....1.0.1.celery" for
 * 5 s to queue celery). Level L routes a key whose L-th digit (from the left,
 * counting 27 down) is 1 into queue celery_delayed_L, whose fixed message TTL
 * of 2^L seconds dead-letters into the next level's exchange; a 0 digit goes
 * straight to the next exchange by an exchange-to-exchange binding. After
 * level 0 the message reaches celery_delayed_delivery, where each consumed
 * queue is bound with "#.<queue>". See docs/internals/delayed-delivery.md. */
#ifndef CR_DELAYED_H
#define CR_DELAYED_H

#include <stddef.h>
#include <stdint.h>

#define DELAYED_LEVELS 28
#define DELAYED_MAX_LEVEL (DELAYED_LEVELS - 1)
/* The largest delay the chain can spell, in seconds (2^28 - 1, about 8.5
 * years); a longer one is sent for this long and delayed again on arrival. */
#define DELAYED_MAX_S ((UINT64_C(1) << DELAYED_LEVELS) - 1)
/* The exchange a delayed message is published to, and where it lands. */
#define DELAYED_ENTRY_EXCHANGE "celery_delayed_27"
#define DELAYED_DELIVERY_EXCHANGE "celery_delayed_delivery"

/* Writes the exchange (and queue) name of a level, 0..DELAYED_MAX_LEVEL, into
 * out. Returns 0, or CR_EINVAL for a bad level or CR_ERANGE when out is too
 * small (out is then "" when size > 0). */
int delayed_level_name(int level, char *out, size_t size);

/* Writes the routing key that delays a message by delay_s seconds (1 ..
 * DELAYED_MAX_S) on its way to routing key rk (non-empty) into out. Returns the
 * length written, or CR_EINVAL (delay out of range, empty rk) or CR_ERANGE (out
 * too small; out is "" when size > 0). out needs 2 * DELAYED_LEVELS + strlen(rk)
 * + 1 bytes. */
int delayed_routing_key(uint64_t delay_s, const char *rk, char *out, size_t size);

/* Reads a routing key made by delayed_routing_key(): the delay into *delay_s
 * and where the destination key starts into *rk_off. Returns 0 or CR_EINVAL
 * (not 28 binary digits each followed by a dot, or nothing after them). */
int delayed_parse_routing_key(const char *key, size_t len, uint64_t *delay_s,
                              size_t *rk_off);

/* The binding key of level L's queue on its exchange (digit L is 1) and of
 * the next level's exchange on it (digit L is 0): "*." repeated 27 - L times,
 * then "1.#" or "0.#". Same return as delayed_level_name(). */
int delayed_level_binding(int level, int digit, char *out, size_t size);

/* The hold-or-delay decision for a task whose eta is eta_us (epoch us) at
 * now_us: 0 when it should be held here (no eta, due, or within horizon_s
 * seconds), else the delay in whole seconds to send it through the chain for
 * (the fraction is cut, as Celery's producer cuts it: the worker holds the
 * rest on arrival), capped at DELAYED_MAX_S. A negative eta_us means none. */
uint64_t delayed_delay_s(int64_t eta_us, int64_t now_us, double horizon_s);

#endif
