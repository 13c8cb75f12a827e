/* celery_msg.h -- Celery task messages (protocol v2 and v1, JSON) to and from
 * struct task_msg. Pure: no I/O, no clock.
 *
 * The decoder is given what the broker delivered (properties, headers already
 * converted to JSON by rmq_json, body bytes) and keeps the whole message, so a
 * later retry or dead-letter can republish it unchanged. */
#ifndef CR_CELERY_MSG_H
#define CR_CELERY_MSG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"
#include "tracectx.h"

/* What arrived (all borrowed for the duration of the call). */
struct celery_raw_msg {
    const char *content_type;     /* may be NULL */
    const char *content_encoding; /* may be NULL */
    const cJSON *headers;         /* application headers as a JSON object, or NULL */
    const char *correlation_id;   /* may be NULL */
    const char *reply_to;         /* may be NULL */
    int delivery_mode;            /* 0 when absent */
    int priority;                 /* 0 when absent */
    const char *body;
    size_t body_len;
};

/* A decoded task. Every pointer is owned by the struct: task_msg_release(). */
struct task_msg {
    int proto;       /* 2 (task header present) or 1 (body dict) */
    char *id;        /* task id; never NULL after a successful decode */
    char *task;      /* task name; never NULL after a successful decode */
    char *shadow;    /* NULL unless set */
    char *root_id;   /* defaults to id when absent */
    char *parent_id; /* NULL when absent */
    char *group;     /* NULL when absent */
    long group_index;
    int has_group_index;
    int retries;
    char *eta;              /* ISO text as sent, or NULL */
    char *expires;          /* ISO text as sent, or NULL */
    int64_t eta_us;         /* epoch microseconds, or -1 when absent */
    int64_t expires_us;     /* epoch microseconds, or -1 when absent */
    double time_limit_hard; /* seconds; 0 when not set */
    double time_limit_soft; /* seconds; 0 when not set */
    int ignore_result;      /* -1 when the message does not say, else 0/1 */
    char *argsrepr;
    char *kwargsrepr;
    char *origin;
    cJSON *args;    /* JSON array (never NULL after success) */
    cJSON *kwargs;  /* JSON object (never NULL after success) */
    cJSON *embed;   /* JSON object, or NULL (v2 embed null, absent or Celery's
                     * default of four nulls, which encode_v2 writes back
                     * for NULL; v1 without callbacks, errbacks and chord) */
    cJSON *headers; /* v2: the headers Celery does not define (x-death, custom
                     * ones), in order; v1: every header. celery_msg_headers()
                     * gives the whole set. */
    /* properties */
    char *content_type;
    char *content_encoding;
    char *correlation_id;
    char *reply_to;
    int delivery_mode;
    int priority;
};

/* Zeroes *m so that task_msg_release() is always safe on it; eta_us, expires_us
 * and ignore_result start at -1 ("absent"). */
void task_msg_init(struct task_msg *m);
/* Frees everything m owns and re-inits it. */
void task_msg_release(struct task_msg *m);

/* The name shown for the task in logs, events, inspect replies and metrics,
 * as Celery shows it: the shadow name when the message has one, else the task
 * name, else "unknown" (a message that failed to decode). Borrowed from m
 * (or static); never NULL. */
const char *task_msg_display_name(const struct task_msg *m);

/* Decodes one message. Returns 0, or an error with detail in err:
 *  CR_ECONTENT  content type other than JSON (pickle, yaml, msgpack, ...) or a
 *               compression header: the body is never deserialized;
 *  CR_EDECODE   body is not valid UTF-8 JSON, or is nested deeper than 64;
 *  CR_EPROTO    valid JSON of the wrong shape (v2 body not [args, kwargs, embed],
 *               kwargs not an object, missing id or task, bad eta/expires/timelimit);
 *  CR_ENOMEM.
 * Even on error, out->id and out->task are filled when they could be read, so the
 * caller can store a FAILURE for that id. out must be task_msg_init()ed; the
 * caller releases it in every case.
 *
 * Rules, in order:
 * - headers that are not an object: CR_EPROTO (Python rejects them too).
 * - content type: only the media type counts ("application/json; charset=utf-8"
 *   is JSON, case-insensitive); NULL or "" means JSON. content_encoding is not
 *   consulted: the body must be UTF-8 whatever it says.
 * - a "compression" header that is not null: CR_ECONTENT.
 * - the body is parsed with py_json_parse() (pyjson.h): strict UTF-8 and RFC 8259,
 *   depth <= 64, float-ness of numbers kept. Failure: CR_EDECODE.
 * - a body dict is protocol 1 (proto = 1), also when a "task" header exists:
 *   each field is taken from the headers when present there (even as null),
 *   else from the body ("hybrid"); args/kwargs/callbacks/errbacks/chord only come
 *   from the body; args defaults to [], kwargs to {}; group falls back to
 *   "taskset"; "utc" is ignored (naive times are UTC). callbacks, errbacks and
 *   chord are moved into embed (v2 key order, chain null).
 * - a body list is protocol 2 and needs a "task" header; it must have 2 or 3
 *   items (embed absent, null or an object).
 * - id and task must be non-empty strings. shadow, root_id, parent_id, group,
 *   eta and expires must be strings or null; group_index an integral number or
 *   null; retries an integral number in 0..INT_MAX (null = 0); timelimit null or
 *   a 2-item list of null or numbers >= 0; ignore_result a bool, number or null.
 *   Anything else is CR_EPROTO. argsrepr, kwargsrepr and origin are display-only
 *   and ignored when they are not strings.
 * - root_id that is absent, null or "" becomes id (as Celery's as_task_v2).
 * - a repeated key counts with its last value (as Python's dict). */
int celery_msg_decode(const struct celery_raw_msg *in, struct task_msg *out,
                      struct cr_err *err);

/* Encodes m as a protocol v2 message: body JSON "[args, kwargs, embed]" appended
 * to *body, and *headers set to a new JSON object holding m->headers with the
 * decoded fields (id, task, retries, eta, expires, root_id, parent_id, group,
 * group_index, timelimit, ...) written over it, so unknown custom headers are
 * kept. Returns 0 or CR_ENOMEM (then *headers is NULL and *body is unchanged).
 *
 * The result has the form Celery 5.2.6's as_task_v2 gives: the body is written
 * as json.dumps() does (", " separators, ensure_ascii) and the headers are, in
 * this order, lang ("py"), task, id, shadow, eta, expires, group, group_index,
 * retries, timelimit [hard, soft], root_id, parent_id, argsrepr, kwargsrepr,
 * origin, ignore_result, then every other key of m->headers in its original order.
 * Mapping from m: NULL strings and unset values become null; eta/expires use the
 * text as received, else eta_us/expires_us formatted as UTC (+00:00) when >= 0;
 * time limits of 0 are null; root_id NULL becomes id; ignore_result -1 is false
 * (Celery always sends a bool); a NULL argsrepr/kwargsrepr is computed from
 * args/kwargs with py_repr (args as a tuple, at most 1024 bytes + "..."); a NULL
 * embed is written as {"callbacks": null, "errbacks": null, "chain": null,
 * "chord": null}; NULL args/kwargs as [] / {}. origin is not invented: callers
 * publishing a new message set it to their nodename first. */
int celery_msg_encode_v2(const struct task_msg *m, struct buf *body, cJSON **headers);

/* The headers to send m again as it came (a dead letter, a parked copy): for v2
 * the encode_v2 headers, which are byte for byte those Celery 5.2.6 sent (the
 * captured fixtures are tested so); for v1 the headers as received. New
 * object, or NULL on OOM. */
cJSON *celery_msg_headers(const struct task_msg *m);

/* The W3C trace context a producer put in m (tracectx.h says where
 * opentelemetry-instrumentation-celery writes it): the "traceparent" and
 * "tracestate" headers, read from m->headers, which keeps every header
 * Celery does not define (v2) or every header (v1). A header that is not a
 * string, or a traceparent tracectx_parse_traceparent() refuses, counts as
 * absent; a bad tracestate is dropped alone. Returns 1 with *out filled, or
 * 0 (no usable context: *out untouched). Never an error: a producer's
 * malformed context must not fail its task. */
int celery_msg_trace_ctx(const struct task_msg *m, struct trace_ctx *out);

#endif
