/* span.c -- span records and their OTLP protobuf and JSON encodings. */
#include "span.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "../util/alloc.h"
#include "pyjson.h"

/* ------------------------------------------------------------ the record */

/* A bounded copy of s, valid UTF-8: at most SPAN_MAX_STR bytes, cut at a
 * character boundary, each byte of a bad sequence written as '?'. */
static char *bounded(const char *s)
{
    size_t n = strlen(s), i = 0, o = 0;
    char *out = cr_malloc((n < SPAN_MAX_STR ? n : SPAN_MAX_STR) + 1);
    if (!out)
        return NULL;
    while (i < n) {
        uint32_t cp;
        size_t k = py_utf8_next(s + i, n - i, &cp);
        if (k == 0) {
            if (o + 1 > SPAN_MAX_STR)
                break;
            out[o++] = '?';
            i++;
            continue;
        }
        if (o + k > SPAN_MAX_STR)
            break;
        memcpy(out + o, s + i, k);
        o += k;
        i += k;
    }
    out[o] = '\0';
    return out;
}

struct span *span_new(const char *name, enum span_kind kind, const struct trace_ctx *ctx)
{
    struct span *s = cr_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->name = bounded(name ? name : "");
    if (!s->name) {
        cr_free(s);
        return NULL;
    }
    s->kind = kind;
    s->ctx = *ctx;
    return s;
}

void span_free(struct span *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nattrs; i++)
        cr_free(s->attrs[i].s);
    cr_free(s->name);
    cr_free(s->status_msg);
    cr_free(s);
}

int span_attr_str(struct span *s, const char *key, const char *value)
{
    char *v;
    if (!value)
        return 0;
    if (s->nattrs == SPAN_MAX_ATTRS) {
        s->dropped_attrs++;
        return 0;
    }
    if (!(v = bounded(value)))
        return CR_ENOMEM;
    s->attrs[s->nattrs].key = key;
    s->attrs[s->nattrs].is_int = 0;
    s->attrs[s->nattrs].is_list = 0;
    s->attrs[s->nattrs++].s = v;
    return 0;
}

int span_attr_str_list(struct span *s, const char *key, const char *value)
{
    int n = s->nattrs, rc = span_attr_str(s, key, value);
    if (rc == 0 && s->nattrs > n)
        s->attrs[n].is_list = 1;
    return rc;
}

int span_attr_int(struct span *s, const char *key, int64_t value)
{
    if (s->nattrs == SPAN_MAX_ATTRS) {
        s->dropped_attrs++;
        return 0;
    }
    s->attrs[s->nattrs].key = key;
    s->attrs[s->nattrs].is_int = 1;
    s->attrs[s->nattrs].is_list = 0;
    s->attrs[s->nattrs].s = NULL;
    s->attrs[s->nattrs++].i = value;
    return 0;
}

int span_set_status(struct span *s, enum span_status code, const char *msg)
{
    s->status = code;
    cr_free(s->status_msg);
    s->status_msg = NULL;
    if (msg && !(s->status_msg = bounded(msg)))
        return CR_ENOMEM;
    return 0;
}

/* ----------------------------------------------------------- protobuf */

/* Wire types */
#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_I32 5

/* Room left for a nested message's length, filled in by close_msg(): five
 * bytes hold any 32-bit length; close_msg() moves the body back over what
 * the varint did not need, so the output is the canonical encoding. */
#define LEN_ROOM 5

struct pb {
    struct buf *b;
    int err;
};

static void raw(struct pb *p, const void *d, size_t n)
{
    if (!p->err && buf_append(p->b, d, n))
        p->err = CR_ENOMEM;
}

static size_t varint_bytes(uint64_t v, uint8_t out[10])
{
    size_t n = 0;
    do {
        out[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            out[n] |= 0x80;
        n++;
    } while (v);
    return n;
}

static void varint(struct pb *p, uint64_t v)
{
    uint8_t d[10];
    raw(p, d, varint_bytes(v, d));
}

static void tag(struct pb *p, unsigned field, unsigned wt)
{
    varint(p, (uint64_t)field << 3 | wt);
}

static void bytes_field(struct pb *p, unsigned field, const void *d, size_t n)
{
    tag(p, field, WT_LEN);
    varint(p, n);
    raw(p, d, n);
}

static void str_field(struct pb *p, unsigned field, const char *s)
{
    if (s && *s) /* proto3: an empty string is not written */
        bytes_field(p, field, s, strlen(s));
}

static void fixed64_field(struct pb *p, unsigned field, uint64_t v)
{
    uint8_t d[8];
    for (int i = 0; i < 8; i++)
        d[i] = (uint8_t)(v >> (8 * i));
    tag(p, field, WT_I64);
    raw(p, d, 8);
}

static void fixed32_field(struct pb *p, unsigned field, uint32_t v)
{
    uint8_t d[4];
    for (int i = 0; i < 4; i++)
        d[i] = (uint8_t)(v >> (8 * i));
    tag(p, field, WT_I32);
    raw(p, d, 4);
}

static void varint_field(struct pb *p, unsigned field, uint64_t v)
{
    if (v) {
        tag(p, field, WT_VARINT);
        varint(p, v);
    }
}

static size_t open_msg(struct pb *p, unsigned field)
{
    static const uint8_t room[LEN_ROOM] = {0};
    tag(p, field, WT_LEN);
    raw(p, room, LEN_ROOM);
    return p->err ? 0 : p->b->len;
}

static void close_msg(struct pb *p, size_t body_at)
{
    uint8_t d[10];
    size_t n, k;
    if (p->err)
        return;
    n = p->b->len - body_at;
    k = varint_bytes(n, d);
    memmove(p->b->data + body_at - LEN_ROOM + k, p->b->data + body_at, n);
    memcpy(p->b->data + body_at - LEN_ROOM, d, k);
    p->b->len -= LEN_ROOM - k;
}

/* KeyValue { string key = 1; AnyValue value = 2; }
 * AnyValue { string string_value = 1; int64 int_value = 3; } */
static void kv_str(struct pb *p, unsigned field, const char *key, const char *value)
{
    size_t at = open_msg(p, field), v;
    str_field(p, 1, key);
    v = open_msg(p, 2);
    bytes_field(p, 1, value, strlen(value)); /* "" is a value: written */
    close_msg(p, v);
    close_msg(p, at);
}

/* AnyValue { ArrayValue array_value = 5; } ArrayValue { AnyValue values = 1; } */
static void kv_str_list(struct pb *p, unsigned field, const char *key, const char *value)
{
    size_t at = open_msg(p, field), v, arr, one;
    str_field(p, 1, key);
    v = open_msg(p, 2);
    arr = open_msg(p, 5);
    one = open_msg(p, 1);
    bytes_field(p, 1, value, strlen(value));
    close_msg(p, one);
    close_msg(p, arr);
    close_msg(p, v);
    close_msg(p, at);
}

static void kv_int(struct pb *p, unsigned field, const char *key, int64_t value)
{
    size_t at = open_msg(p, field), v;
    str_field(p, 1, key);
    v = open_msg(p, 2);
    tag(p, 3, WT_VARINT);
    varint(p, (uint64_t)value); /* int64: two's complement, ten bytes if < 0 */
    close_msg(p, v);
    close_msg(p, at);
}

/* Span.flags: the W3C flags in the low byte; 0x100 says whether the parent
 * is remote is known, 0x200 that it is (a task's parent came in a message). */
static uint32_t span_flags(const struct span *s)
{
    return s->ctx.flags | 0x100u | (s->has_parent && s->parent_remote ? 0x200u : 0);
}

/* Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5,
 * kind 6, start 7, end 8, attributes 9, dropped_attributes_count 10,
 * status 15 { message 2, code 3 }, flags 16. */
static void pb_span(struct pb *p, const struct span *s)
{
    size_t at = open_msg(p, 2);
    bytes_field(p, 1, s->ctx.trace_id, TRACE_ID_BYTES);
    bytes_field(p, 2, s->ctx.span_id, SPAN_ID_BYTES);
    str_field(p, 3, s->ctx.state);
    if (s->has_parent)
        bytes_field(p, 4, s->parent_id, SPAN_ID_BYTES);
    str_field(p, 5, s->name);
    varint_field(p, 6, (uint64_t)s->kind);
    fixed64_field(p, 7, s->start_ns);
    fixed64_field(p, 8, s->end_ns);
    for (int i = 0; i < s->nattrs; i++) {
        if (s->attrs[i].is_int)
            kv_int(p, 9, s->attrs[i].key, s->attrs[i].i);
        else if (s->attrs[i].is_list)
            kv_str_list(p, 9, s->attrs[i].key, s->attrs[i].s);
        else
            kv_str(p, 9, s->attrs[i].key, s->attrs[i].s);
    }
    varint_field(p, 10, (uint64_t)s->dropped_attrs);
    if (s->status != SPAN_STATUS_UNSET || s->status_msg) {
        size_t st = open_msg(p, 15);
        str_field(p, 2, s->status_msg);
        varint_field(p, 3, (uint64_t)s->status);
        close_msg(p, st);
    }
    fixed32_field(p, 16, span_flags(s));
    close_msg(p, at);
}

/* ExportTraceServiceRequest { ResourceSpans resource_spans = 1; }
 * ResourceSpans { Resource resource = 1; ScopeSpans scope_spans = 2; }
 * Resource { KeyValue attributes = 1; }
 * ScopeSpans { InstrumentationScope scope = 1; Span spans = 2; }
 * InstrumentationScope { string name = 1; string version = 2; } */
int otlp_encode_proto(const struct otlp_resource *r, struct span *const *spans, size_t n,
                      struct buf *out)
{
    struct pb p = {out, 0};
    size_t rs = open_msg(&p, 1), res, ss, sc;

    res = open_msg(&p, 1);
    for (size_t i = 0; i < r->nattrs; i++)
        kv_str(&p, 1, r->attrs[i].key, r->attrs[i].value);
    close_msg(&p, res);
    ss = open_msg(&p, 2);
    sc = open_msg(&p, 1);
    str_field(&p, 1, r->scope_name);
    str_field(&p, 2, r->scope_version);
    close_msg(&p, sc);
    for (size_t i = 0; i < n; i++)
        pb_span(&p, spans[i]);
    close_msg(&p, ss);
    close_msg(&p, rs);
    return p.err;
}

/* --------------------------------------------------------------- JSON */

struct js {
    struct buf *b;
    int err;
};

static void jraw(struct js *j, const char *s)
{
    if (!j->err && buf_puts(j->b, s))
        j->err = CR_ENOMEM;
}

static void jstr(struct js *j, const char *s)
{
    if (!j->err && py_json_string(j->b, s))
        j->err = CR_ENOMEM;
}

static void jhex(struct js *j, const uint8_t *id, size_t n)
{
    char hex[2 * TRACE_ID_BYTES + 3];
    hex[0] = '"';
    tracectx_hex(id, n, hex + 1);
    hex[2 * n + 1] = '"';
    hex[2 * n + 2] = '\0';
    jraw(j, hex);
}

static void jfmt_u64(struct js *j, uint64_t v, int quoted)
{
    char d[32];
    snprintf(d, sizeof(d), quoted ? "\"%" PRIu64 "\"" : "%" PRIu64, v);
    jraw(j, d);
}

static void jkv_str(struct js *j, const char *key, const char *value)
{
    jraw(j, "{\"key\":");
    jstr(j, key);
    jraw(j, ",\"value\":{\"stringValue\":");
    jstr(j, value);
    jraw(j, "}}");
}

static void jkv_str_list(struct js *j, const char *key, const char *value)
{
    jraw(j, "{\"key\":");
    jstr(j, key);
    jraw(j, ",\"value\":{\"arrayValue\":{\"values\":[{\"stringValue\":");
    jstr(j, value);
    jraw(j, "}]}}}");
}

static void jkv_int(struct js *j, const char *key, int64_t value)
{
    char d[48];
    jraw(j, "{\"key\":");
    jstr(j, key);
    snprintf(d, sizeof(d), ",\"value\":{\"intValue\":\"%" PRId64 "\"}}", value);
    jraw(j, d);
}

static void js_span(struct js *j, const struct span *s)
{
    jraw(j, "{\"traceId\":");
    jhex(j, s->ctx.trace_id, TRACE_ID_BYTES);
    jraw(j, ",\"spanId\":");
    jhex(j, s->ctx.span_id, SPAN_ID_BYTES);
    if (s->ctx.state[0]) {
        jraw(j, ",\"traceState\":");
        jstr(j, s->ctx.state);
    }
    if (s->has_parent) {
        jraw(j, ",\"parentSpanId\":");
        jhex(j, s->parent_id, SPAN_ID_BYTES);
    }
    jraw(j, ",\"flags\":");
    jfmt_u64(j, span_flags(s), 0);
    jraw(j, ",\"name\":");
    jstr(j, s->name);
    jraw(j, ",\"kind\":");
    jfmt_u64(j, (uint64_t)s->kind, 0);
    jraw(j, ",\"startTimeUnixNano\":");
    jfmt_u64(j, s->start_ns, 1);
    jraw(j, ",\"endTimeUnixNano\":");
    jfmt_u64(j, s->end_ns, 1);
    jraw(j, ",\"attributes\":[");
    for (int i = 0; i < s->nattrs; i++) {
        if (i)
            jraw(j, ",");
        if (s->attrs[i].is_int)
            jkv_int(j, s->attrs[i].key, s->attrs[i].i);
        else if (s->attrs[i].is_list)
            jkv_str_list(j, s->attrs[i].key, s->attrs[i].s);
        else
            jkv_str(j, s->attrs[i].key, s->attrs[i].s);
    }
    jraw(j, "]");
    if (s->dropped_attrs) {
        jraw(j, ",\"droppedAttributesCount\":");
        jfmt_u64(j, (uint64_t)s->dropped_attrs, 0);
    }
    jraw(j, ",\"status\":{");
    if (s->status_msg) {
        jraw(j, "\"message\":");
        jstr(j, s->status_msg);
        jraw(j, ",");
    }
    jraw(j, "\"code\":");
    jfmt_u64(j, (uint64_t)s->status, 0);
    jraw(j, "}}");
}

int otlp_encode_json(const struct otlp_resource *r, struct span *const *spans, size_t n,
                     struct buf *out)
{
    struct js j = {out, 0};
    jraw(&j, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    for (size_t i = 0; i < r->nattrs; i++) {
        if (i)
            jraw(&j, ",");
        jkv_str(&j, r->attrs[i].key, r->attrs[i].value);
    }
    jraw(&j, "]},\"scopeSpans\":[{\"scope\":{\"name\":");
    jstr(&j, r->scope_name ? r->scope_name : "");
    jraw(&j, ",\"version\":");
    jstr(&j, r->scope_version ? r->scope_version : "");
    jraw(&j, "},\"spans\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            jraw(&j, ",");
        js_span(&j, spans[i]);
    }
    jraw(&j, "]}]}]}");
    return j.err;
}
