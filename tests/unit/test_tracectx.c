/* test_tracectx.c -- W3C traceparent / tracestate, span ids, and where a
 * Celery message carries them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/celery_msg.h"
#include "protocol/tracectx.h"
#include "util/alloc.h"
#include "util/err.h"

#define TP_OK "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

START_TEST(test_parse_good)
{
    struct trace_ctx c;
    char out[TRACEPARENT_LEN + 1];
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(tracectx_parse_traceparent(&c, TP_OK, strlen(TP_OK)), 0);
    ck_assert_uint_eq(c.trace_id[0], 0x4b);
    ck_assert_uint_eq(c.trace_id[15], 0x36);
    ck_assert_uint_eq(c.span_id[0], 0x00);
    ck_assert_uint_eq(c.span_id[7], 0xb7);
    ck_assert_uint_eq(c.flags, 1);
    tracectx_format_traceparent(&c, out);
    ck_assert_str_eq(out, TP_OK);
    /* not sampled, other flags kept as sent */
    ck_assert_int_eq(tracectx_parse_traceparent(
                         &c, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                         TRACEPARENT_LEN),
                     0);
    ck_assert_uint_eq(c.flags, 0);
    /* a later version: the first fields, more after a dash */
    ck_assert_int_eq(
        tracectx_parse_traceparent(
            &c, "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-ever", 66),
        0);
    ck_assert_uint_eq(c.flags, 9);
    tracectx_format_traceparent(&c, out);
    ck_assert_str_eq(out, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09");
}
END_TEST

static const char *const bad_tp[] = {
    "",
    "00",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "0-04bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7\0-01",
};

START_TEST(test_parse_bad)
{
    struct trace_ctx c, before;
    const char *s = bad_tp[_i];
    size_t n = _i == (int)(sizeof(bad_tp) / sizeof(bad_tp[0])) - 1 ? 56 : strlen(s);
    memset(&c, 0x5a, sizeof(c));
    before = c;
    ck_assert_int_eq(tracectx_parse_traceparent(&c, s, n), CR_EPROTO);
    ck_assert_int_eq(memcmp(&c, &before, sizeof(c)), 0);
}
END_TEST

START_TEST(test_parse_random_bytes)
{
    /* every mutation of one byte of a good value: no crash, and only a
     * mutation to another lowercase hex digit in an id or the flags is
     * still accepted */
    char s[TRACEPARENT_LEN + 1];
    struct trace_ctx c;
    for (int pos = 0; pos < TRACEPARENT_LEN; pos++)
        for (int b = 0; b < 256; b++) {
            int rc, hex = (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f');
            memcpy(s, TP_OK, sizeof(s));
            s[pos] = (char)b;
            rc = tracectx_parse_traceparent(&c, s, TRACEPARENT_LEN);
            if (pos == 2 || pos == 35 || pos == 52)
                ck_assert_int_eq(rc, b == '-' ? 0 : CR_EPROTO);
            /* another version (never ff from 00 by one byte) reads as 00 */
            else
                ck_assert_int_eq(rc, hex ? 0 : CR_EPROTO);
        }
}
END_TEST

START_TEST(test_state)
{
    struct trace_ctx c;
    char big[2000];
    size_t n = 0;

    static const char st[] = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    ck_assert_int_eq(tracectx_set_state(&c, st, sizeof(st) - 1), 0);
    ck_assert_str_eq(c.state, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
    ck_assert_int_eq(tracectx_set_state(&c, " a=1 ,, b=2\t,", 13), 0);
    ck_assert_str_eq(c.state, "a=1,b=2");
    ck_assert_int_eq(tracectx_set_state(&c, "", 0), CR_EPROTO);
    ck_assert_str_eq(c.state, "");
    ck_assert_int_eq(tracectx_set_state(&c, "a=1\n", 4), CR_EPROTO);
    ck_assert_str_eq(c.state, "");
    ck_assert_int_eq(tracectx_set_state(&c, "a=\xc3\xa9", 4), CR_EPROTO);
    ck_assert_int_eq(tracectx_set_state(&c, NULL, 0), CR_EPROTO);
    /* 33 members: dropped whole */
    for (int i = 0; i < 33; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "%sk%d=v", i ? "," : "", i);
    ck_assert_int_eq(tracectx_set_state(&c, big, n), CR_EPROTO);
    ck_assert_str_eq(c.state, "");
    /* 32 long members: kept from the front up to the bound */
    n = 0;
    for (int i = 0; i < 32; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "%sk%02d=%040d", i ? "," : "", i,
                              i);
    ck_assert_int_eq(tracectx_set_state(&c, big, n), 0);
    ck_assert_uint_le(strlen(c.state), TRACESTATE_MAX);
    ck_assert_uint_gt(strlen(c.state), TRACESTATE_MAX - 50);
    ck_assert_int_eq(strncmp(c.state, big, strlen(c.state)), 0);
    ck_assert_int_eq(big[strlen(c.state)], ',');
}
END_TEST

START_TEST(test_rng)
{
    struct trace_rng a, b;
    uint8_t t1[16], t2[16], s1[8], s2[8];
    char hex[33];
    trace_rng_seed(&a, 42);
    trace_rng_seed(&b, 42);
    trace_rng_trace_id(&a, t1);
    trace_rng_trace_id(&b, t2);
    ck_assert_int_eq(memcmp(t1, t2, 16), 0);
    trace_rng_span_id(&a, s1);
    trace_rng_span_id(&a, s2);
    ck_assert_int_ne(memcmp(s1, s2, 8), 0);
    ck_assert(!tracectx_id_is_zero(s1, 8));
    trace_rng_seed(&b, 43);
    trace_rng_trace_id(&b, t2);
    ck_assert_int_ne(memcmp(t1, t2, 16), 0);
    tracectx_hex(s1, 8, hex);
    ck_assert_uint_eq(strlen(hex), 16);
    /* the first value of splitmix64 seeded with 0 (published test vector) */
    trace_rng_seed(&a, 0);
    ck_assert(trace_rng_next(&a) == UINT64_C(0xe220a8397b1dcdaf));
}
END_TEST

/* A v2 message as a Celery producer with opentelemetry-instrumentation-celery
 * sends it: the context as two top-level headers. */
static int decode_with(const char *headers_json, struct task_msg *m)
{
    cJSON *h = cJSON_Parse(headers_json);
    struct celery_raw_msg raw;
    struct cr_err err = {0};
    static const char body[] = "[[], {}, {\"callbacks\": null, \"errbacks\": null, "
                               "\"chain\": null, \"chord\": null}]";
    int rc;
    memset(&raw, 0, sizeof(raw));
    raw.content_type = "application/json";
    raw.headers = h;
    raw.body = body;
    raw.body_len = sizeof(body) - 1;
    task_msg_init(m);
    rc = celery_msg_decode(&raw, m, &err);
    cJSON_Delete(h);
    return rc;
}

START_TEST(test_from_message)
{
    struct task_msg m;
    struct trace_ctx c;
    char out[TRACEPARENT_LEN + 1];

    ck_assert_int_eq(decode_with("{\"lang\": \"py\", \"task\": \"llm.generate\", \"id\": "
                                 "\"t1\", \"root_id\": \"t1\", \"parent_id\": null, "
                                 "\"traceparent\": \"" TP_OK
                                 "\", \"tracestate\": \"a=1\"}",
                                 &m),
                     0);
    ck_assert_int_eq(celery_msg_trace_ctx(&m, &c), 1);
    tracectx_format_traceparent(&c, out);
    ck_assert_str_eq(out, TP_OK);
    ck_assert_str_eq(c.state, "a=1");
    task_msg_release(&m);

    /* no context, a bad one, a non-string one: none, and the task decodes */
    ck_assert_int_eq(decode_with("{\"task\": \"x\", \"id\": \"t2\"}", &m), 0);
    ck_assert_int_eq(celery_msg_trace_ctx(&m, &c), 0);
    task_msg_release(&m);
    ck_assert_int_eq(decode_with("{\"task\": \"x\", \"id\": \"t2\", \"traceparent\": "
                                 "\"00-zz\", \"tracestate\": \"a=1\"}",
                                 &m),
                     0);
    ck_assert_int_eq(celery_msg_trace_ctx(&m, &c), 0);
    task_msg_release(&m);
    ck_assert_int_eq(
        decode_with("{\"task\": \"x\", \"id\": \"t2\", \"traceparent\": 5}", &m), 0);
    ck_assert_int_eq(celery_msg_trace_ctx(&m, &c), 0);
    task_msg_release(&m);
    /* a bad tracestate alone is dropped */
    ck_assert_int_eq(
        decode_with("{\"task\": \"x\", \"id\": \"t2\", \"traceparent\": \"" TP_OK
                    "\", \"tracestate\": [1]}",
                    &m),
        0);
    ck_assert_int_eq(celery_msg_trace_ctx(&m, &c), 1);
    ck_assert_str_eq(c.state, "");
    task_msg_release(&m);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("tracectx");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse_good);
    tcase_add_loop_test(tc, test_parse_bad, 0, (int)(sizeof(bad_tp) / sizeof(bad_tp[0])));
    tcase_add_test(tc, test_parse_random_bytes);
    tcase_add_test(tc, test_state);
    tcase_add_test(tc, test_rng);
    tcase_add_test(tc, test_from_message);
    suite_add_tcase(s, tc);
    return s;
}
