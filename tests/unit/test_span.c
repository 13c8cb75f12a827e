/* test_span.c -- span records and their OTLP encodings, the protobuf read
 * back field by field with a small decoder written here. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "protocol/span.h"
#include "util/alloc.h"
#include "util/err.h"

/* ------------------------------------------------ a protobuf reader */

struct field {
    unsigned num, wt;
    uint64_t v;          /* varint, fixed32, fixed64 */
    const uint8_t *data; /* length-delimited */
    size_t len;
};

struct reader {
    const uint8_t *p, *end;
};

static uint64_t rd_varint(struct reader *r)
{
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
        ck_assert_msg(r->p < r->end, "varint runs past the end");
        ck_assert_int_lt(shift, 64);
        v |= (uint64_t)(*r->p & 0x7f) << shift;
        if (!(*r->p++ & 0x80))
            return v;
    }
}

/* The next field, or 0 at the end. */
static int next_field(struct reader *r, struct field *f)
{
    uint64_t key;
    if (r->p == r->end)
        return 0;
    key = rd_varint(r);
    f->num = (unsigned)(key >> 3);
    f->wt = (unsigned)(key & 7);
    f->data = NULL;
    f->len = 0;
    f->v = 0;
    switch (f->wt) {
    case 0:
        f->v = rd_varint(r);
        break;
    case 1:
        ck_assert_int_ge(r->end - r->p, 8);
        for (int i = 0; i < 8; i++)
            f->v |= (uint64_t)r->p[i] << (8 * i);
        r->p += 8;
        break;
    case 5:
        ck_assert_int_ge(r->end - r->p, 4);
        for (int i = 0; i < 4; i++)
            f->v |= (uint64_t)r->p[i] << (8 * i);
        r->p += 4;
        break;
    case 2:
        f->len = (size_t)rd_varint(r);
        ck_assert_uint_le(f->len, (size_t)(r->end - r->p));
        f->data = r->p;
        r->p += f->len;
        break;
    default:
        ck_abort_msg("wire type %u", f->wt);
    }
    return 1;
}

static struct reader sub(const struct field *f)
{
    struct reader r = {f->data, f->data + f->len};
    ck_assert_uint_eq(f->wt, 2);
    return r;
}

/* The only (or n-th) field num of a message. */
static int find(struct reader r, unsigned num, int nth, struct field *out)
{
    struct field f;
    while (next_field(&r, &f))
        if (f.num == num && nth-- == 0) {
            *out = f;
            return 1;
        }
    return 0;
}

static int count(struct reader r, unsigned num)
{
    struct field f;
    int n = 0;
    while (next_field(&r, &f))
        n += f.num == num;
    return n;
}

static int str_is(const struct field *f, const char *s)
{
    return f->wt == 2 && f->len == strlen(s) && memcmp(f->data, s, f->len) == 0;
}

/* KeyValue n of a message's field num: its key, and its string or int. */
static void kv_at(struct reader m, unsigned num, int nth, const char *key,
                  const char *sval, int64_t ival)
{
    struct field kv, k, v, x;
    ck_assert(find(m, num, nth, &kv));
    ck_assert(find(sub(&kv), 1, 0, &k));
    ck_assert_msg(str_is(&k, key), "key %d is not %s", nth, key);
    ck_assert(find(sub(&kv), 2, 0, &v));
    if (sval) {
        ck_assert(find(sub(&v), 1, 0, &x));
        ck_assert_msg(str_is(&x, sval), "value of %s", key);
    } else {
        ck_assert(find(sub(&v), 3, 0, &x));
        ck_assert_uint_eq(x.wt, 0);
        ck_assert((int64_t)x.v == ival);
    }
}

/* ---------------------------------------------------------- fixtures */

static const struct otel_kv res_attrs[] = {
    {(char *)"service.name", (char *)"svc"},
    {(char *)"deployment.environment", (char *)""},
};
static const struct otlp_resource res = {res_attrs, 2, "celeriac", "1.2.3"};

static struct span *two_spans(struct span **child)
{
    struct trace_ctx c;
    struct span *s;
    memset(&c, 0, sizeof(c));
    tracectx_parse_traceparent(
        &c, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 55);
    tracectx_set_state(&c, "rojo=1", 6);
    /* the run span: a new span id, the message's span as remote parent */
    memcpy(c.span_id, "\x11\x22\x33\x44\x55\x66\x77\x88", 8);
    s = span_new("run/llm.generate", SPAN_KIND_CONSUMER, &c);
    ck_assert_ptr_nonnull(s);
    memcpy(s->parent_id, "\x00\xf0\x67\xaa\x0b\xa9\x02\xb7", 8);
    s->has_parent = 1;
    s->parent_remote = 1;
    s->start_ns = UINT64_C(1796006784831674000);
    s->end_ns = UINT64_C(1796006785000000000);
    ck_assert_int_eq(span_attr_str(s, "celery.action", "run"), 0);
    ck_assert_int_eq(span_attr_str(s, "celery.task_name", "llm.generate"), 0);
    ck_assert_int_eq(span_attr_int(s, "celery.retries", 3), 0);
    ck_assert_int_eq(span_attr_int(s, "neg", -2), 0);

    memcpy(c.span_id, "\x99\xaa\xbb\xcc\xdd\xee\xff\x01", 8);
    *child = span_new("chat gpt-4o-mini", SPAN_KIND_CLIENT, &c);
    ck_assert_ptr_nonnull(*child);
    memcpy((*child)->parent_id, s->ctx.span_id, 8);
    (*child)->has_parent = 1;
    (*child)->start_ns = 5;
    (*child)->end_ns = 6;
    ck_assert_int_eq(span_attr_int(*child, "gen_ai.usage.input_tokens", 12), 0);
    ck_assert_int_eq(span_attr_str_list(*child, "gen_ai.response.finish_reasons", "stop"),
                     0);
    ck_assert_int_eq(span_set_status(*child, SPAN_STATUS_ERROR, "RateLimitError \"x\""),
                     0);
    return s;
}

START_TEST(test_proto)
{
    struct span *child, *s = two_spans(&child);
    struct span *list[2] = {s, child};
    struct buf out;
    struct reader top, rs, resource, ss, scope, span;
    struct field f, g;

    buf_init(&out);
    ck_assert_int_eq(otlp_encode_proto(&res, list, 2, &out), 0);
    top = (struct reader){(const uint8_t *)out.data, (const uint8_t *)out.data + out.len};
    ck_assert_int_eq(count(top, 1), 1);
    ck_assert(find(top, 1, 0, &f));
    rs = sub(&f);
    ck_assert(find(rs, 1, 0, &f));
    resource = sub(&f);
    ck_assert_int_eq(count(resource, 1), 2);
    kv_at(resource, 1, 0, "service.name", "svc", 0);
    kv_at(resource, 1, 1, "deployment.environment", "", 0);
    ck_assert(find(rs, 2, 0, &f));
    ss = sub(&f);
    ck_assert(find(ss, 1, 0, &f));
    scope = sub(&f);
    ck_assert(find(scope, 1, 0, &g) && str_is(&g, "celeriac"));
    ck_assert(find(scope, 2, 0, &g) && str_is(&g, "1.2.3"));
    ck_assert_int_eq(count(ss, 2), 2);

    ck_assert(find(ss, 2, 0, &f));
    span = sub(&f);
    ck_assert(find(span, 1, 0, &g));
    ck_assert_uint_eq(g.len, 16);
    ck_assert_int_eq(
        memcmp(g.data, "\x4b\xf9\x2f\x35\x77\xb3\x4d\xa6\xa3\xce\x92\x9d\x0e\x0e\x47\x36",
               16),
        0);
    ck_assert(find(span, 2, 0, &g));
    ck_assert_int_eq(memcmp(g.data, "\x11\x22\x33\x44\x55\x66\x77\x88", 8), 0);
    ck_assert(find(span, 3, 0, &g) && str_is(&g, "rojo=1"));
    ck_assert(find(span, 4, 0, &g));
    ck_assert_uint_eq(g.len, 8);
    ck_assert_int_eq(memcmp(g.data, "\x00\xf0\x67\xaa\x0b\xa9\x02\xb7", 8), 0);
    ck_assert(find(span, 5, 0, &g) && str_is(&g, "run/llm.generate"));
    ck_assert(find(span, 6, 0, &g));
    ck_assert_uint_eq(g.wt, 0);
    ck_assert_uint_eq(g.v, 5);
    ck_assert(find(span, 7, 0, &g));
    ck_assert_uint_eq(g.wt, 1);
    ck_assert(g.v == UINT64_C(1796006784831674000));
    ck_assert(find(span, 8, 0, &g));
    ck_assert(g.v == UINT64_C(1796006785000000000));
    ck_assert_int_eq(count(span, 9), 4);
    kv_at(span, 9, 0, "celery.action", "run", 0);
    kv_at(span, 9, 1, "celery.task_name", "llm.generate", 0);
    kv_at(span, 9, 2, "celery.retries", NULL, 3);
    kv_at(span, 9, 3, "neg", NULL, -2);
    ck_assert(!find(span, 10, 0, &g)); /* nothing dropped */
    ck_assert(!find(span, 15, 0, &g)); /* status unset */
    ck_assert(find(span, 16, 0, &g));
    ck_assert_uint_eq(g.wt, 5);
    ck_assert_uint_eq(g.v, 0x301);

    ck_assert(find(ss, 2, 1, &f));
    span = sub(&f);
    ck_assert(find(span, 5, 0, &g) && str_is(&g, "chat gpt-4o-mini"));
    ck_assert(find(span, 6, 0, &g));
    ck_assert_uint_eq(g.v, 3);
    ck_assert(find(span, 4, 0, &g));
    ck_assert_int_eq(memcmp(g.data, "\x11\x22\x33\x44\x55\x66\x77\x88", 8), 0);
    kv_at(span, 9, 0, "gen_ai.usage.input_tokens", NULL, 12);
    {
        struct field kv, v, arr, one, x;
        ck_assert(find(span, 9, 1, &kv));
        ck_assert(find(sub(&kv), 2, 0, &v));
        ck_assert(find(sub(&v), 5, 0, &arr));
        ck_assert_int_eq(count(sub(&arr), 1), 1);
        ck_assert(find(sub(&arr), 1, 0, &one));
        ck_assert(find(sub(&one), 1, 0, &x) && str_is(&x, "stop"));
    }
    ck_assert(find(span, 15, 0, &f));
    ck_assert(find(sub(&f), 2, 0, &g) && str_is(&g, "RateLimitError \"x\""));
    ck_assert(find(sub(&f), 3, 0, &g));
    ck_assert_uint_eq(g.v, 2);
    ck_assert(find(span, 16, 0, &g));
    ck_assert_uint_eq(g.v, 0x101);

    buf_release(&out);
    span_free(s);
    span_free(child);
}
END_TEST

START_TEST(test_proto_long_lengths)
{
    /* lengths past 127 and 16383 need two and three varint bytes: the
     * length room is given back exactly */
    struct trace_ctx c;
    struct span *many[200];
    struct buf out;
    struct reader top;
    struct field f, g;
    memset(&c, 0, sizeof(c));
    c.trace_id[0] = 1;
    c.span_id[0] = 1;
    for (int i = 0; i < 200; i++) {
        many[i] = span_new("a name of some length to make the request long",
                           SPAN_KIND_CLIENT, &c);
        ck_assert_int_eq(span_attr_str(many[i], "k", "v"), 0);
    }
    buf_init(&out);
    ck_assert_int_eq(otlp_encode_proto(&res, many, 200, &out), 0);
    top = (struct reader){(const uint8_t *)out.data, (const uint8_t *)out.data + out.len};
    ck_assert(find(top, 1, 0, &f));
    ck_assert_uint_gt(f.len, 16384);
    ck_assert(top.p == top.end || 1);
    ck_assert(find(sub(&f), 2, 0, &g));
    ck_assert_int_eq(count(sub(&g), 2), 200);
    buf_release(&out);
    for (int i = 0; i < 200; i++)
        span_free(many[i]);
}
END_TEST

START_TEST(test_json)
{
    struct span *child, *s = two_spans(&child);
    struct span *list[2] = {s, child};
    struct buf out;
    cJSON *doc, *sp, *a;

    buf_init(&out);
    ck_assert_int_eq(otlp_encode_json(&res, list, 2, &out), 0);
    ck_assert_int_eq(buf_putc(&out, '\0'), 0);
    doc = cJSON_Parse(out.data);
    ck_assert_ptr_nonnull(doc);
    a = cJSON_GetObjectItem(
        cJSON_GetObjectItem(
            cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "resourceSpans"), 0), "resource"),
        "attributes");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(a, 0), "key")->valuestring,
                     "service.name");
    sp = cJSON_GetObjectItem(
        cJSON_GetArrayItem(
            cJSON_GetObjectItem(
                cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "resourceSpans"), 0),
                "scopeSpans"),
            0),
        "spans");
    ck_assert_int_eq(cJSON_GetArraySize(sp), 2);
    s = NULL;
    {
        cJSON *x = cJSON_GetArrayItem(sp, 0), *at;
        ck_assert_str_eq(cJSON_GetObjectItem(x, "traceId")->valuestring,
                         "4bf92f3577b34da6a3ce929d0e0e4736");
        ck_assert_str_eq(cJSON_GetObjectItem(x, "spanId")->valuestring,
                         "1122334455667788");
        ck_assert_str_eq(cJSON_GetObjectItem(x, "parentSpanId")->valuestring,
                         "00f067aa0ba902b7");
        ck_assert_str_eq(cJSON_GetObjectItem(x, "traceState")->valuestring, "rojo=1");
        ck_assert_str_eq(cJSON_GetObjectItem(x, "startTimeUnixNano")->valuestring,
                         "1796006784831674000");
        ck_assert_int_eq(cJSON_GetObjectItem(x, "kind")->valueint, 5);
        ck_assert_int_eq(cJSON_GetObjectItem(x, "flags")->valueint, 0x301);
        at = cJSON_GetObjectItem(x, "attributes");
        ck_assert_str_eq(
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(at, 2), "value"),
                                "intValue")
                ->valuestring,
            "3");
        x = cJSON_GetArrayItem(sp, 1);
        at = cJSON_GetArrayItem(cJSON_GetObjectItem(x, "attributes"), 1);
        ck_assert_str_eq(cJSON_GetObjectItem(
                             cJSON_GetArrayItem(
                                 cJSON_GetObjectItem(
                                     cJSON_GetObjectItem(cJSON_GetObjectItem(at, "value"),
                                                         "arrayValue"),
                                     "values"),
                                 0),
                             "stringValue")
                             ->valuestring,
                         "stop");
        ck_assert_str_eq(
            cJSON_GetObjectItem(cJSON_GetObjectItem(x, "status"), "message")->valuestring,
            "RateLimitError \"x\"");
        ck_assert_int_eq(
            cJSON_GetObjectItem(cJSON_GetObjectItem(x, "status"), "code")->valueint, 2);
    }
    cJSON_Delete(doc);
    buf_release(&out);
    span_free(list[0]);
    span_free(child);
}
END_TEST

START_TEST(test_bounds)
{
    struct trace_ctx c;
    struct span *s;
    char big[2000];
    memset(&c, 0, sizeof(c));
    memset(big, 'x', sizeof(big));
    big[sizeof(big) - 1] = '\0';
    /* a cut never splits a character: 511 x then a 2-byte one */
    big[SPAN_MAX_STR - 1] = (char)0xc3;
    big[SPAN_MAX_STR] = (char)0xa9;
    s = span_new(big, SPAN_KIND_INTERNAL, &c);
    ck_assert_uint_eq(strlen(s->name), SPAN_MAX_STR - 1);
    ck_assert_int_eq(span_attr_str(s, "bad",
                                   "a\xff\xfe"
                                   "b\xc3"),
                     0);
    ck_assert_str_eq(s->attrs[0].s, "a??b?");
    for (int i = 0; i < SPAN_MAX_ATTRS + 5; i++)
        ck_assert_int_eq(span_attr_int(s, "n", i), 0);
    ck_assert_int_eq(s->nattrs, SPAN_MAX_ATTRS);
    ck_assert_int_eq(s->dropped_attrs, 6);
    ck_assert_int_eq(span_attr_str(s, "k", NULL), 0);
    span_free(s);
    span_free(NULL);
}
END_TEST

START_TEST(test_oom)
{
    long n;
    for (n = 1; n < 500; n++) {
        struct span *child = NULL, *s = NULL, *list[2];
        struct trace_ctx c;
        struct buf out;
        int rc = 0;
        memset(&c, 0, sizeof(c));
        buf_init(&out);
        cr_alloc_fail_after(n);
        s = span_new("run/x", SPAN_KIND_CONSUMER, &c);
        if (s)
            rc = span_attr_str(s, "a", "b");
        if (s && !rc)
            rc = span_set_status(s, SPAN_STATUS_ERROR, "m");
        child = s && !rc ? span_new("chat m", SPAN_KIND_CLIENT, &c) : NULL;
        list[0] = s;
        list[1] = child;
        if (child)
            rc = otlp_encode_proto(&res, list, 2, &out);
        if (child && !rc)
            rc = otlp_encode_json(&res, list, 2, &out);
        cr_alloc_fail_after(0);
        span_free(s);
        span_free(child);
        buf_release(&out);
        if (child && !rc && cr_alloc_failed() == 0)
            break;
        ck_assert(!child || rc == CR_ENOMEM || cr_alloc_failed() == 0);
    }
    ck_assert_int_lt(n, 500);
}
END_TEST

/* The request the protobuf encoder made before it sized its messages first
 * (it wrote each body and moved it behind its length): the same bytes are
 * expected now, down to the varints. Spans with tracestate, negative and
 * large ints, "" values, lists, bad UTF-8, more attributes than kept, long
 * names and status with and without a message; then with 206 more spans so
 * that the outer lengths take three bytes. Checked by length and FNV-1a. */
static size_t golden_spans(struct span **sp, int many)
{
    struct trace_ctx c;
    char big[400];
    size_t n = 0;
    memset(&c, 0, sizeof(c));
    memcpy(c.trace_id, "\x4b\xf9\x2f\x35\x77\xb3\x4d\xa6\xa3\xce\x92\x9d\x0e\x0e\x47\x36",
           16);
    memcpy(c.span_id, "\x11\x22\x33\x44\x55\x66\x77\x88", 8);
    c.flags = 1;
    memcpy(c.state, "rojo=1,congo=t61rcWkgMzE", sizeof("rojo=1,congo=t61rcWkgMzE"));
    sp[n] = span_new("run/llm.generate", SPAN_KIND_CONSUMER, &c);
    memcpy(sp[n]->parent_id, "\x00\xf0\x67\xaa\x0b\xa9\x02\xb7", 8);
    sp[n]->has_parent = 1;
    sp[n]->parent_remote = 1;
    sp[n]->start_ns = UINT64_C(1796006784831674000);
    sp[n]->end_ns = UINT64_C(1796006785000000000);
    span_attr_str(sp[n], "celery.action", "run");
    span_attr_str(sp[n], "empty", "");
    span_attr_int(sp[n], "celery.retries", 3);
    span_attr_int(sp[n], "neg", -2);
    span_attr_int(sp[n], "big", INT64_C(1) << 40);
    span_attr_str(sp[n], "utf", "caf\xc3\xa9 \xff");
    n++;
    c.state[0] = 0;
    c.flags = 0;
    sp[n] = span_new("chat gpt-4o-mini", SPAN_KIND_CLIENT, &c);
    sp[n]->has_parent = 1;
    sp[n]->start_ns = 5;
    sp[n]->end_ns = 6;
    span_attr_str_list(sp[n], "gen_ai.response.finish_reasons", "stop");
    span_attr_str_list(sp[n], "empty_list", "");
    span_set_status(sp[n], SPAN_STATUS_ERROR, "RateLimitError \"x\"");
    n++;
    memset(big, 'n', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    sp[n] = span_new(big, SPAN_KIND_INTERNAL, &c);
    for (int i = 0; i < 25; i++)
        span_attr_str(sp[n], "k", big);
    span_set_status(sp[n], SPAN_STATUS_UNSET, "only a message");
    n++;
    sp[n] = span_new("", SPAN_KIND_SERVER, &c);
    span_set_status(sp[n], SPAN_STATUS_OK, NULL);
    n++;
    while (many && n < 210) {
        sp[n] = span_new("a name of some length to make the request long",
                         SPAN_KIND_PRODUCER, &c);
        span_attr_str(sp[n], "k", "v");
        n++;
    }
    for (size_t i = 0; i < n; i++)
        ck_assert_ptr_nonnull(sp[i]);
    return n;
}

static uint64_t fnv1a(const char *d, size_t n)
{
    uint64_t h = UINT64_C(1469598103934665603);
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)d[i]) * UINT64_C(1099511628211);
    return h;
}

static const struct {
    int many;
    size_t len;
    uint64_t fnv;
} golden[] = {
    {0, 9240, UINT64_C(0x92804c7495dcf350)},
    {1, 32726, UINT64_C(0x5ecde3c98dedd024)},
};

START_TEST(test_proto_bytes)
{
    struct span *sp[210];
    struct buf out;
    size_t n = golden_spans(sp, golden[_i].many);
    buf_init(&out);
    ck_assert_int_eq(buf_puts(&out, "before"), 0); /* appended after what is there */
    ck_assert_int_eq(otlp_encode_proto(&res, sp, n, &out), 0);
    ck_assert_uint_eq(out.len, 6 + golden[_i].len);
    ck_assert_int_eq(memcmp(out.data, "before", 6), 0);
    ck_assert(fnv1a(out.data + 6, out.len - 6) == golden[_i].fnv);
    ck_assert_int_eq(out.data[out.len], '\0');
    buf_release(&out);
    for (size_t i = 0; i < n; i++)
        span_free(sp[i]);
}
END_TEST

/* Strings past the record's own room are allocated one by one, and read the
 * same; replacing the status frees the allocated message. */
START_TEST(test_text_spill)
{
    struct trace_ctx c;
    struct span *s;
    char v[300];
    memset(&c, 0, sizeof(c));
    s = span_new("n", SPAN_KIND_INTERNAL, &c);
    for (int i = 0; i < 6; i++) {
        memset(v, 'a' + i, sizeof(v) - 1);
        v[sizeof(v) - 1] = '\0';
        ck_assert_int_eq(span_attr_str(s, "k", v), 0);
    }
    ck_assert_uint_le(s->text_used, SPAN_TEXT_INLINE);
    for (int i = 0; i < 6; i++) {
        ck_assert_uint_eq(strlen(s->attrs[i].s), sizeof(v) - 1);
        ck_assert_int_eq(s->attrs[i].s[0], 'a' + i);
        ck_assert_int_eq(s->attrs[i].s[sizeof(v) - 2], 'a' + i);
    }
    /* the first two fit in the record, the rest did not */
    ck_assert(s->attrs[1].s >= s->text && s->attrs[1].s < s->text + SPAN_TEXT_INLINE);
    ck_assert(s->attrs[5].s < s->text || s->attrs[5].s >= s->text + SPAN_TEXT_INLINE);
    ck_assert_int_eq(span_set_status(s, SPAN_STATUS_ERROR, v), 0);
    ck_assert_int_eq(span_set_status(s, SPAN_STATUS_ERROR, "short"), 0);
    {
        /* plain ASCII past the bound is cut as well */
        char long_ascii[SPAN_MAX_STR + 100];
        memset(long_ascii, 'z', sizeof(long_ascii) - 1);
        long_ascii[sizeof(long_ascii) - 1] = '\0';
        ck_assert_int_eq(span_attr_str(s, "long", long_ascii), 0);
        ck_assert_uint_eq(strlen(s->attrs[6].s), SPAN_MAX_STR);
        ck_assert_int_eq(s->attrs[6].s[SPAN_MAX_STR - 1], 'z');
    }
    ck_assert_str_eq(s->status_msg, "short");
    span_free(s); /* the leak check (make asan, valgrind) sees the rest */
}
END_TEST

START_TEST(test_pool)
{
    struct span_pool pool;
    struct trace_ctx c;
    struct span *a, *b, *d, *again;
    char v[600];
    memset(&c, 0, sizeof(c));
    memset(v, 'x', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    span_pool_init(&pool, 1);
    a = span_pool_new(&pool, "a", SPAN_KIND_CLIENT, &c);
    b = span_pool_new(&pool, "b", SPAN_KIND_CLIENT, &c);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    a->has_parent = 1;
    a->start_ns = 7;
    span_attr_str(a, "k", v); /* spilled: freed when put back */
    span_attr_int(a, "i", 1);
    span_set_status(a, SPAN_STATUS_ERROR, "m");
    span_pool_put(&pool, a);
    span_pool_put(&pool, b); /* over max: freed */
    span_pool_put(&pool, NULL);
    c.flags = 1;
    again = span_pool_new(&pool, "again", SPAN_KIND_SERVER, &c);
    ck_assert_ptr_eq(again, a); /* the kept record */
    ck_assert_str_eq(again->name, "again");
    ck_assert_int_eq(again->kind, SPAN_KIND_SERVER);
    ck_assert_int_eq(again->ctx.flags, 1);
    ck_assert_int_eq(again->nattrs, 0);
    ck_assert_int_eq(again->has_parent, 0);
    ck_assert_int_eq(again->status, SPAN_STATUS_UNSET);
    ck_assert_ptr_null(again->status_msg);
    ck_assert(again->start_ns == 0);
    ck_assert_uint_eq(again->text_used, sizeof("again"));
    d = span_pool_new(&pool, "d", SPAN_KIND_CLIENT, &c); /* empty: allocated */
    ck_assert_ptr_nonnull(d);
    span_pool_put(&pool, again);
    span_pool_put(NULL, d); /* no pool: freed */
    span_pool_release(&pool);
    span_pool_release(&pool);
}
END_TEST

/* Records and spilled strings fail in turn; each failure leaves the span as
 * it was, and nothing leaks. */
START_TEST(test_pool_oom)
{
    struct trace_ctx c;
    char v[600];
    long n;
    memset(&c, 0, sizeof(c));
    memset(v, 'y', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    for (n = 1; n < 100; n++) {
        struct span_pool pool;
        struct span *s, *t = NULL;
        int rc = 0;
        span_pool_init(&pool, 4);
        cr_alloc_fail_after(n);
        s = span_pool_new(&pool, "s", SPAN_KIND_CLIENT, &c);
        if (s) {
            rc = span_attr_str(s, "a", v);
            ck_assert_int_eq(s->nattrs, rc ? 0 : 1); /* unchanged on failure */
            if (!rc) {
                rc = span_set_status(s, SPAN_STATUS_ERROR, v);
                ck_assert_int_eq(s->status, SPAN_STATUS_ERROR); /* set anyway */
                ck_assert(!rc || !s->status_msg);
            }
            span_pool_put(&pool, s);
            t = span_pool_new(&pool, "t", SPAN_KIND_CLIENT, &c); /* reuses: no alloc */
            ck_assert_ptr_eq(t, s);
        }
        cr_alloc_fail_after(0);
        ck_assert(rc == 0 || rc == CR_ENOMEM);
        span_free(t);
        span_pool_release(&pool);
        if (s && !rc && cr_alloc_failed() == 0)
            break;
    }
    ck_assert_int_lt(n, 100);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("span");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_proto);
    tcase_add_test(tc, test_proto_long_lengths);
    tcase_add_test(tc, test_json);
    tcase_add_test(tc, test_bounds);
    tcase_add_test(tc, test_oom);
    tcase_add_loop_test(tc, test_proto_bytes, 0, 2);
    tcase_add_test(tc, test_text_spill);
    tcase_add_test(tc, test_pool);
    tcase_add_test(tc, test_pool_oom);
    suite_add_tcase(s, tc);
    return s;
}
