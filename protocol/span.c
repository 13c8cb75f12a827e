/* span.c -- span records and their OTLP protobuf and JSON encodings. */
#include "span.h"

#include <assert.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "../util/alloc.h"
#include "pyjson.h"

/* ------------------------------------------------------------ the record */

/* The length of s's bounded copy: at most SPAN_MAX_STR bytes, cut at a
 * character boundary, each byte of a bad sequence counted as one '?'. ASCII,
 * what nearly every value is, is taken without decoding. */
static size_t bounded_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k;
        if ((unsigned char)s[i] < 0x80) {
            if (i + 1 > SPAN_MAX_STR)
                break;
            i++;
            continue;
        }
        k = py_utf8_next(s + i, n - i, &cp);
        if (k == 0)
            k = 1; /* one '?' for the byte */
        if (i + k > SPAN_MAX_STR)
            break;
        i += k;
    }
    return i;
}

/* Writes the bounded copy of s's first len bytes (len from bounded_len())
 * into out, and a NUL. */
static void bounded_copy(char *out, const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = (unsigned char)s[i] < 0x80 ? 1 : py_utf8_next(s + i, len - i, &cp);
        if (k == 0) {
            out[i++] = '?';
            continue;
        }
        memcpy(out + i, s + i, k);
        i += k;
    }
    out[len] = '\0';
}

/* Whether s's n bytes are all ASCII, eight at a time. */
static int is_ascii(const char *s, size_t n)
{
    uint64_t w, acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, s + i, 8);
        acc |= w;
    }
    for (; i < n; i++)
        acc |= (unsigned char)s[i];
    return !(acc & UINT64_C(0x8080808080808080));
}

/* A bounded, valid UTF-8 copy of s owned by the span: in its text while
 * there is room, else allocated. A short ASCII value, nearly every one, is
 * copied as it is. */
static char *keep(struct span *sp, const char *s, size_t *len_out)
{
    size_t n = strlen(s), len;
    int plain = n <= SPAN_MAX_STR && is_ascii(s, n);
    char *out;
    len = plain ? n : bounded_len(s, n);
    if (len + 1 <= SPAN_TEXT_INLINE - sp->text_used) {
        out = sp->text + sp->text_used;
        sp->text_used += len + 1;
    } else if (!(out = cr_malloc(len + 1))) {
        return NULL;
    }
    if (plain) {
        memcpy(out, s, len);
        out[len] = '\0';
    } else {
        bounded_copy(out, s, len);
    }
    if (len_out)
        *len_out = len;
    return out;
}

static void unkeep(struct span *sp, char *p)
{
    if (p && (p < sp->text || p >= sp->text + SPAN_TEXT_INLINE))
        cr_free(p);
}

/* Frees the strings and sets the record as span_new() would. */
static int span_setup(struct span *s, const char *name, enum span_kind kind,
                      const struct trace_ctx *ctx)
{
    memset(s, 0, offsetof(struct span, text));
    s->name = keep(s, name ? name : "", NULL);
    if (!s->name)
        return CR_ENOMEM;
    s->kind = kind;
    s->ctx = *ctx;
    return 0;
}

static void span_clear_strings(struct span *s)
{
    for (int i = 0; i < s->nattrs; i++)
        unkeep(s, s->attrs[i].s);
    unkeep(s, s->name);
    unkeep(s, s->status_msg);
}

struct span *span_new(const char *name, enum span_kind kind, const struct trace_ctx *ctx)
{
    return span_pool_new(NULL, name, kind, ctx);
}

void span_free(struct span *s)
{
    if (!s)
        return;
    span_clear_strings(s);
    cr_free(s);
}

void span_pool_init(struct span_pool *p, size_t max)
{
    p->free = NULL;
    p->n = 0;
    p->max = max;
}

void span_pool_release(struct span_pool *p)
{
    while (p->free) {
        struct span *s = p->free;
        p->free = s->next;
        cr_free(s); /* strings were freed when it was put back */
    }
    p->n = 0;
}

struct span *span_pool_new(struct span_pool *p, const char *name, enum span_kind kind,
                           const struct trace_ctx *ctx)
{
    struct span *s;
    if (p && p->free) {
        s = p->free;
        p->free = s->next;
        p->n--;
    } else if (!(s = cr_malloc(sizeof(*s)))) {
        return NULL;
    }
    if (span_setup(s, name, kind, ctx)) {
        cr_free(s);
        return NULL;
    }
    return s;
}

void span_pool_put(struct span_pool *p, struct span *s)
{
    if (!s)
        return;
    if (!p || p->n >= p->max) {
        span_free(s);
        return;
    }
    span_clear_strings(s);
    s->next = p->free;
    p->free = s;
    p->n++;
}

int span_attr_str(struct span *s, const char *key, const char *value)
{
    char *v;
    size_t len;
    if (!value)
        return 0;
    if (s->nattrs == SPAN_MAX_ATTRS) {
        s->dropped_attrs++;
        return 0;
    }
    if (!(v = keep(s, value, &len)))
        return CR_ENOMEM;
    s->attrs[s->nattrs].key = key;
    s->attrs[s->nattrs].key_len = strlen(key);
    s->attrs[s->nattrs].len = len;
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
    s->attrs[s->nattrs].key_len = strlen(key);
    s->attrs[s->nattrs].len = 0;
    s->attrs[s->nattrs].is_int = 1;
    s->attrs[s->nattrs].is_list = 0;
    s->attrs[s->nattrs].s = NULL;
    s->attrs[s->nattrs++].i = value;
    return 0;
}

int span_set_status(struct span *s, enum span_status code, const char *msg)
{
    s->status = code;
    unkeep(s, s->status_msg); /* room it took in the text is not given back */
    s->status_msg = NULL;
    if (msg && !(s->status_msg = keep(s, msg, NULL)))
        return CR_ENOMEM;
    return 0;
}

/* ----------------------------------------------------------- protobuf */

/* Two passes: the size of every message first, then the bytes, written
 * once into a buffer reserved for the whole request. A nested message's
 * length is then known before its body, so nothing is moved afterwards, and
 * the output is the canonical encoding (shortest varints). Sizes are
 * computed again for each level of nesting, which costs less than moving
 * the bodies (a kv is three levels deep at most). */

/* Wire types */
#define WT_VARINT 0
#define WT_I64 1
#define WT_LEN 2
#define WT_I32 5

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* A length-delimited field whose body is n bytes. */
static size_t ld_size(unsigned field, size_t n)
{
    return vlen((uint64_t)field << 3 | WT_LEN) + vlen(n) + n;
}

/* proto3: an empty string is not written */
static size_t str_size(unsigned field, const char *s)
{
    return s && *s ? ld_size(field, strlen(s)) : 0;
}

static size_t varint_field_size(unsigned field, uint64_t v)
{
    return v ? vlen((uint64_t)field << 3) + vlen(v) : 0;
}

/* KeyValue { string key = 1; AnyValue value = 2; }
 * AnyValue { string string_value = 1; int64 int_value = 3;
 *            ArrayValue array_value = 5; } ArrayValue { AnyValue values = 1; }
 * The value's body by kind: "" is a value, so a string is always written. */
static size_t any_size(const struct span_attr *a)
{
    if (a->is_int)
        return 1 + vlen((uint64_t)a->i); /* int64: ten bytes if < 0 */
    if (a->is_list)
        return ld_size(5, ld_size(1, ld_size(1, a->len)));
    return ld_size(1, a->len);
}

/* proto3: an empty key is not written */
static size_t kv_size(const struct span_attr *a, size_t any)
{
    return (a->key_len ? ld_size(1, a->key_len) : 0) + ld_size(2, any);
}

/* Span.flags: the W3C flags in the low byte; 0x100 says whether the parent
 * is remote is known, 0x200 that it is (a task's parent came in a message). */
static uint32_t span_flags(const struct span *s)
{
    return s->ctx.flags | 0x100u | (s->has_parent && s->parent_remote ? 0x200u : 0);
}

/* Status { string message = 2; StatusCode code = 3; } */
static size_t status_size(const struct span *s)
{
    return str_size(2, s->status_msg) + varint_field_size(3, (uint64_t)s->status);
}

static int has_status(const struct span *s)
{
    return s->status != SPAN_STATUS_UNSET || s->status_msg;
}

/* Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5,
 * kind 6, start 7, end 8, attributes 9, dropped_attributes_count 10,
 * status 15, flags 16. */
static size_t span_size(const struct span *s)
{
    size_t n = ld_size(1, TRACE_ID_BYTES) + ld_size(2, SPAN_ID_BYTES);
    n += str_size(3, s->ctx.state);
    if (s->has_parent)
        n += ld_size(4, SPAN_ID_BYTES);
    n += str_size(5, s->name);
    n += varint_field_size(6, (uint64_t)s->kind);
    n += 2 * (1 + 8); /* fixed64 7 and 8 */
    for (int i = 0; i < s->nattrs; i++)
        n += ld_size(9, kv_size(&s->attrs[i], any_size(&s->attrs[i])));
    n += varint_field_size(10, (uint64_t)s->dropped_attrs);
    if (has_status(s))
        n += ld_size(15, status_size(s));
    return n + 2 + 4; /* fixed32 16: a two-byte tag */
}

/* The writer: p walks a buffer the sizes above reserved. */
struct pw {
    uint8_t *p;
};

static void put_varint(struct pw *w, uint64_t v)
{
    while (v >= 0x80) {
        *w->p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *w->p++ = (uint8_t)v;
}

static void put_tag(struct pw *w, unsigned field, unsigned wt)
{
    put_varint(w, (uint64_t)field << 3 | wt);
}

/* The head of a length-delimited field of n bytes; its body follows. */
static void put_ld(struct pw *w, unsigned field, size_t n)
{
    put_tag(w, field, WT_LEN);
    put_varint(w, n);
}

static void put_bytes(struct pw *w, unsigned field, const void *d, size_t n)
{
    put_ld(w, field, n);
    memcpy(w->p, d, n);
    w->p += n;
}

static void put_str(struct pw *w, unsigned field, const char *s)
{
    if (s && *s)
        put_bytes(w, field, s, strlen(s));
}

static void put_varint_field(struct pw *w, unsigned field, uint64_t v)
{
    if (v) {
        put_tag(w, field, WT_VARINT);
        put_varint(w, v);
    }
}

static void put_fixed(struct pw *w, unsigned field, unsigned wt, uint64_t v, int nbytes)
{
    put_tag(w, field, wt);
    for (int i = 0; i < nbytes; i++)
        *w->p++ = (uint8_t)(v >> (8 * i));
}

static void put_kv(struct pw *w, unsigned field, const struct span_attr *a)
{
    size_t any = any_size(a);
    put_ld(w, field, kv_size(a, any));
    if (a->key_len)
        put_bytes(w, 1, a->key, a->key_len);
    put_ld(w, 2, any);
    if (a->is_int) {
        put_tag(w, 3, WT_VARINT);
        put_varint(w, (uint64_t)a->i);
    } else if (a->is_list) {
        put_ld(w, 5, ld_size(1, ld_size(1, a->len)));
        put_ld(w, 1, ld_size(1, a->len));
        put_bytes(w, 1, a->s, a->len);
    } else {
        put_bytes(w, 1, a->s, a->len);
    }
}

static void put_span(struct pw *w, const struct span *s)
{
    put_ld(w, 2, span_size(s));
    put_bytes(w, 1, s->ctx.trace_id, TRACE_ID_BYTES);
    put_bytes(w, 2, s->ctx.span_id, SPAN_ID_BYTES);
    put_str(w, 3, s->ctx.state);
    if (s->has_parent)
        put_bytes(w, 4, s->parent_id, SPAN_ID_BYTES);
    put_str(w, 5, s->name);
    put_varint_field(w, 6, (uint64_t)s->kind);
    put_fixed(w, 7, WT_I64, s->start_ns, 8);
    put_fixed(w, 8, WT_I64, s->end_ns, 8);
    for (int i = 0; i < s->nattrs; i++)
        put_kv(w, 9, &s->attrs[i]);
    put_varint_field(w, 10, (uint64_t)s->dropped_attrs);
    if (has_status(s)) {
        put_ld(w, 15, status_size(s));
        put_str(w, 2, s->status_msg);
        put_varint_field(w, 3, (uint64_t)s->status);
    }
    put_fixed(w, 16, WT_I32, span_flags(s), 4);
}

/* A resource attribute as a span's string attribute, for put_kv(). */
static void resource_attr(struct span_attr *a, const struct otel_kv *kv)
{
    a->key = kv->key;
    a->key_len = strlen(kv->key);
    a->s = (char *)kv->value;
    a->len = strlen(kv->value);
}

/* ExportTraceServiceRequest { ResourceSpans resource_spans = 1; }
 * ResourceSpans { Resource resource = 1; ScopeSpans scope_spans = 2; }
 * Resource { KeyValue attributes = 1; }
 * ScopeSpans { InstrumentationScope scope = 1; Span spans = 2; }
 * InstrumentationScope { string name = 1; string version = 2; } */
int otlp_encode_proto(const struct otlp_resource *r, struct span *const *spans, size_t n,
                      struct buf *out)
{
    size_t res = 0, scope, ss, rs, total;
    struct span_attr a;
    struct pw w;

    memset(&a, 0, sizeof(a));
    for (size_t i = 0; i < r->nattrs; i++) {
        resource_attr(&a, &r->attrs[i]);
        res += ld_size(1, kv_size(&a, any_size(&a)));
    }
    scope = str_size(1, r->scope_name) + str_size(2, r->scope_version);
    ss = ld_size(1, scope);
    for (size_t i = 0; i < n; i++)
        ss += ld_size(2, span_size(spans[i]));
    rs = ld_size(1, res) + ld_size(2, ss);
    total = ld_size(1, rs);
    if (buf_reserve(out, total))
        return CR_ENOMEM;

    w.p = (uint8_t *)out->data + out->len;
    put_ld(&w, 1, rs);
    put_ld(&w, 1, res);
    for (size_t i = 0; i < r->nattrs; i++) {
        resource_attr(&a, &r->attrs[i]);
        put_kv(&w, 1, &a);
    }
    put_ld(&w, 2, ss);
    put_ld(&w, 1, scope);
    put_str(&w, 1, r->scope_name);
    put_str(&w, 2, r->scope_version);
    for (size_t i = 0; i < n; i++)
        put_span(&w, spans[i]);
    /* the sizes and the writer describe the same bytes */
    assert((char *)w.p == out->data + out->len + total);
    out->len += total;
    out->data[out->len] = '\0';
    return 0;
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
