/* tracectx.h -- W3C Trace Context (traceparent, tracestate) and span ids.
 * Pure: no I/O, no clock; randomness comes from a generator the caller seeds.
 *
 * Where a Celery producer puts the context: opentelemetry-instrumentation-celery
 * (its _trace_before_publish) calls the global propagator's inject() on the
 * `headers` dict of Celery's before_task_publish signal. With task protocol 2
 * (Celery >= 4 default) that dict is the message's own header table, so
 * "traceparent" and, when not empty, "tracestate" arrive as two top-level
 * string headers next to "id", "task" and "root_id" (AMQP application headers;
 * kombu's Redis envelope "headers"). With protocol 1 the signal's headers are
 * empty and the instrumentation injects nothing. On the consumer side it
 * extracts from the task's request, whose attributes are those same headers;
 * celery_msg_trace_ctx() (celery_msg.h) reads them from there. */
#ifndef CR_TRACECTX_H
#define CR_TRACECTX_H

#include <stddef.h>
#include <stdint.h>

#define TRACE_ID_BYTES 16
#define SPAN_ID_BYTES 8
/* "00-" 32 hex "-" 16 hex "-" 2 hex */
#define TRACEPARENT_LEN 55
/* The W3C text asks to pass on at least 512 characters of tracestate. */
#define TRACESTATE_MAX 512
#define TRACESTATE_MAX_MEMBERS 32
#define TRACE_FLAG_SAMPLED 0x01u

/* One span's place in a trace, as traceparent carries it, and the vendor
 * state that travels with it. Plain data: copy it freely. */
struct trace_ctx {
    uint8_t trace_id[TRACE_ID_BYTES];
    uint8_t span_id[SPAN_ID_BYTES];
    uint8_t flags;
    char state[TRACESTATE_MAX + 1]; /* "" when none */
};

/* Parses a traceparent value (n bytes, need not be NUL-terminated) into c's
 * ids and flags; c->state is left alone. Returns 0, or CR_EPROTO for anything
 * the W3C text says to ignore: wrong length, a version that is not two
 * lowercase hex digits or is "ff", a version 00 value longer than 55, upper
 * case or non-hex digits, missing dashes, an all-zero trace or span id. A
 * later version is read as 00 when its first 55 bytes are well formed and
 * byte 56, if any, is '-'. On error c is unchanged. */
int tracectx_parse_traceparent(struct trace_ctx *c, const char *s, size_t n);

/* Writes c as a version 00 traceparent: exactly TRACEPARENT_LEN characters
 * and a NUL into out. */
void tracectx_format_traceparent(const struct trace_ctx *c,
                                 char out[TRACEPARENT_LEN + 1]);

/* Keeps a tracestate value (n bytes) in c->state. Values with a control or
 * non-ASCII byte, or more than 32 members, are dropped whole (c->state ""),
 * as the W3C text says; one longer than TRACESTATE_MAX loses members from
 * its end until it fits. Empty members (",,") are dropped. Returns 0 when
 * something was kept, CR_EPROTO when c->state ends up "". */
int tracectx_set_state(struct trace_ctx *c, const char *s, size_t n);

/* Whether an id is all zeros (invalid as a trace or span id). */
int tracectx_id_is_zero(const uint8_t *id, size_t n);

/* Lowercase hex of n bytes into out (2n characters and a NUL). */
void tracectx_hex(const uint8_t *id, size_t n, char *out);

/* A small generator for trace and span ids (splitmix64). Seed it from real
 * randomness once (the worker does); tests seed it with constants. */
struct trace_rng {
    uint64_t s;
};

void trace_rng_seed(struct trace_rng *r, uint64_t seed);
uint64_t trace_rng_next(struct trace_rng *r);
/* A new random trace id or span id, never all zeros. */
void trace_rng_trace_id(struct trace_rng *r, uint8_t out[TRACE_ID_BYTES]);
void trace_rng_span_id(struct trace_rng *r, uint8_t out[SPAN_ID_BYTES]);

#endif
