/* span.h -- one finished (or running) trace span, and its OTLP encodings
 * (ExportTraceServiceRequest as protobuf and as JSON, for OTLP/HTTP).
 * Pure: no I/O, no clock (times are given).
 *
 * The protobuf is written by hand: six messages of opentelemetry-proto
 * (collector/trace/v1, trace/v1, common/v1, resource/v1), encode only.
 * Debian's protobuf-c would need the .proto files vendored, protoc-c at build
 * time and its generated code, for less than this file's encoder.
 *
 * Bounds: a span holds at most SPAN_MAX_ATTRS attributes (more are counted
 * in dropped_attrs, as OTLP's dropped_attributes_count), strings (name,
 * attribute values, status message) are cut to SPAN_MAX_STR bytes at a
 * character boundary and invalid UTF-8 becomes '?', so what is encoded is
 * always valid for a collector whatever a message carried. */
#ifndef CR_SPAN_H
#define CR_SPAN_H

#include <stddef.h>
#include <stdint.h>

#include "../util/buf.h"
#include "otel_conf.h"
#include "tracectx.h"

#define SPAN_MAX_ATTRS 20
#define SPAN_MAX_STR 512
/* Strings of a span are kept in the record itself while they fit in this
 * many bytes (a task's run span takes about 250); a longer one is allocated
 * on its own. One allocation per span, not one per attribute. */
#define SPAN_TEXT_INLINE 640

/* opentelemetry.proto.trace.v1.Span.SpanKind */
enum span_kind {
    SPAN_KIND_INTERNAL = 1,
    SPAN_KIND_SERVER = 2,
    SPAN_KIND_CLIENT = 3,
    SPAN_KIND_PRODUCER = 4,
    SPAN_KIND_CONSUMER = 5,
};

/* opentelemetry.proto.trace.v1.Status.StatusCode */
enum span_status {
    SPAN_STATUS_UNSET = 0,
    SPAN_STATUS_OK = 1,
    SPAN_STATUS_ERROR = 2,
};

struct span_attr {
    const char *key; /* borrowed: a string literal */
    int is_int;
    int is_list; /* a string array of one element */
    int64_t i;
    char *s;        /* owned by the span when !is_int (in its text, or allocated) */
    size_t key_len; /* strlen(key), and strlen(s) when !is_int: kept for the */
    size_t len;     /* encoders, which would measure them again and again */
};

/* Every pointer is owned by the span: span_free(). */
struct span {
    /* the span's own context: trace id, span id, flags, tracestate */
    struct trace_ctx ctx;
    uint8_t parent_id[SPAN_ID_BYTES];
    int has_parent;
    int parent_remote; /* the parent came from another process */
    char *name;
    enum span_kind kind;
    uint64_t start_ns, end_ns; /* Unix epoch nanoseconds */
    enum span_status status;
    char *status_msg; /* NULL: none */
    struct span_attr attrs[SPAN_MAX_ATTRS];
    int nattrs;
    int dropped_attrs;
    struct span *next; /* free for the owner's list (the exporter's queue) */
    /* private: the strings that fit, NUL-terminated one after the other */
    size_t text_used;
    char text[SPAN_TEXT_INLINE];
};

/* Returns a new span named name (copied, bounded) of that kind, in the
 * trace ctx says (ctx->span_id is this span's id), or NULL on OOM. */
struct span *span_new(const char *name, enum span_kind kind, const struct trace_ctx *ctx);
/* NULL is a no-op. */
void span_free(struct span *s);

/* A bounded free list of span records, so that a busy worker reuses them
 * rather than asking malloc for two records of ~2 KB per task (records that
 * large skip glibc's per-size caches). The owner embeds it; one thread. */
struct span_pool {
    /* private */
    struct span *free;
    size_t n, max;
};

/* An empty pool that will keep at most max records. */
void span_pool_init(struct span_pool *p, size_t max);
/* Frees the records it keeps; p is then empty (init it again to reuse). */
void span_pool_release(struct span_pool *p);
/* span_new(), taking a kept record when p has one (p NULL: span_new()).
 * Returns a new span (free it with span_pool_put() or span_free()), or NULL
 * on OOM. */
struct span *span_pool_new(struct span_pool *p, const char *name, enum span_kind kind,
                           const struct trace_ctx *ctx);
/* Takes s: frees its strings and keeps its record in p, or frees it when p
 * is full or NULL. NULL s is a no-op. */
void span_pool_put(struct span_pool *p, struct span *s);

/* Adds an attribute (key borrowed, a literal; value copied, bounded). When
 * the span is full the attribute is counted as dropped. 0, or CR_ENOMEM (the
 * span is unchanged). A NULL value adds nothing. */
int span_attr_str(struct span *s, const char *key, const char *value);
int span_attr_int(struct span *s, const char *key, int64_t value);
/* The same, as a string array of one element (the semantic conventions'
 * string[] attributes, such as gen_ai.response.finish_reasons). */
int span_attr_str_list(struct span *s, const char *key, const char *value);
/* Sets the status and its message (copied, bounded; NULL: none). 0 or
 * CR_ENOMEM (the code is set anyway). */
int span_set_status(struct span *s, enum span_status code, const char *msg);

/* What every request says about the sender: the resource attributes
 * (otel_conf's, service.name first) and the instrumentation scope. */
struct otlp_resource {
    const struct otel_kv *attrs;
    size_t nattrs;
    const char *scope_name;
    const char *scope_version;
};

/* Appends one ExportTraceServiceRequest holding spans[0..n) under one
 * resource and scope, as protobuf (Content-Type application/x-protobuf) or
 * as OTLP's JSON mapping (application/json: ids as hex, 64-bit integers and
 * times as decimal strings, enums as numbers). 0, or CR_ENOMEM: the
 * protobuf encoder then leaves out as it was; the JSON one leaves a partial
 * request in it (reset it). */
int otlp_encode_proto(const struct otlp_resource *r, struct span *const *spans, size_t n,
                      struct buf *out);
int otlp_encode_json(const struct otlp_resource *r, struct span *const *spans, size_t n,
                     struct buf *out);

#endif
