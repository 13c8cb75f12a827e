/* test_policy.c -- failure classification, Retry-After and backoff. */
#include <check.h>
#include <stdint.h>

#include "llm/policy.h"
#include "util/alloc.h"

struct class_vec {
    int curl;
    long status;
    const char *code, *type, *should_retry;
    int incomplete;
    enum llm_verdict want;
};

#define R LLM_RETRYABLE
#define P LLM_PERMANENT

static const struct class_vec class_vecs[] = {
    /* Success, and success that was not. */
    {0, 200, NULL, NULL, NULL, 0, LLM_OK},
    {0, 204, "", "", NULL, 0, LLM_OK},
    {0, 200, NULL, NULL, "false", 0, LLM_OK},
    {0, 200, NULL, NULL, NULL, 1, R},
    {0, 200, "server_error", NULL, NULL, 1, R},
    {0, 200, NULL, NULL, "false", 1, P},
    /* Transport failures: retried. */
    {6, 0, NULL, NULL, NULL, 0, R},
    {7, 0, NULL, NULL, NULL, 0, R},
    {28, 0, NULL, NULL, NULL, 0, R},
    {35, 0, NULL, NULL, NULL, 0, R},
    {52, 0, NULL, NULL, NULL, 0, R},
    {55, 0, NULL, NULL, NULL, 0, R},
    {56, 200, NULL, NULL, NULL, 0, R},
    {16, 200, NULL, NULL, NULL, 0, R},
    {92, 200, NULL, NULL, NULL, 0, R},
    {18, 200, NULL, NULL, NULL, 0, R},
    {5, 0, NULL, NULL, NULL, 0, R},  /* unknown to the table: retried */
    {47, 0, NULL, NULL, NULL, 0, R}, /* too many redirects */
    /* Configuration faults and our own aborts: never retried. */
    {1, 0, NULL, NULL, NULL, 0, P},
    {3, 0, NULL, NULL, NULL, 0, P},
    {60, 0, NULL, NULL, NULL, 0, P},
    {23, 200, NULL, NULL, NULL, 0, P},
    {42, 200, NULL, NULL, NULL, 0, P},
    {42, 200, NULL, NULL, "true", 0, P},
    {23, 500, NULL, NULL, NULL, 0, P}, /* the curl code wins */
    /* Statuses. */
    {0, 408, NULL, NULL, NULL, 0, R},
    {0, 409, NULL, NULL, NULL, 0, R},
    {0, 429, NULL, NULL, NULL, 0, R},
    {0, 429, "rate_limit_exceeded", "requests", NULL, 0, R},
    {0, 429, "insufficient_quota", NULL, NULL, 0, P},
    {0, 429, NULL, "insufficient_quota", NULL, 0, P},
    {0, 429, "insufficient_quota", "insufficient_quota", "true", 0, P},
    {0, 500, NULL, NULL, NULL, 0, R},
    {0, 502, NULL, NULL, NULL, 0, R},
    {0, 503, NULL, NULL, NULL, 0, R},
    {0, 504, NULL, NULL, NULL, 0, R},
    {0, 529, NULL, NULL, NULL, 0, R},
    {0, 599, NULL, NULL, NULL, 0, R},
    {0, 400, "context_length_exceeded", NULL, NULL, 0, P},
    {0, 401, NULL, NULL, NULL, 0, P},
    {0, 403, NULL, NULL, NULL, 0, P},
    {0, 404, NULL, NULL, NULL, 0, P},
    {0, 413, NULL, NULL, NULL, 0, P},
    {0, 422, NULL, NULL, NULL, 0, P},
    {0, 418, NULL, NULL, NULL, 0, P},
    {0, 451, NULL, NULL, NULL, 0, P},
    {0, 301, NULL, NULL, NULL, 0, P},
    {0, 0, NULL, NULL, NULL, 0, R},
    /* x-should-retry overrides the status. */
    {0, 400, NULL, NULL, "true", 0, R},
    {0, 401, NULL, NULL, " True ", 0, R},
    {0, 503, NULL, NULL, "false", 0, P},
    {0, 429, NULL, NULL, "FALSE", 0, P},
    {0, 503, NULL, NULL, "maybe", 0, R},
    {0, 400, NULL, NULL, "", 0, P},
    {0, 400, NULL, NULL, "truex", 0, P},
};

START_TEST(test_classify)
{
    const struct class_vec *v = &class_vecs[_i];
    enum llm_verdict got = llm_classify(v->curl, v->status, v->code, v->type,
                                        v->should_retry, v->incomplete);
    ck_assert_msg(got == v->want, "curl %d status %ld xsr '%s': got %d want %d", v->curl,
                  v->status, v->should_retry ? v->should_retry : "(null)", got, v->want);
}
END_TEST

/* 1994-11-06T08:49:37Z, the RFC 9110 example date. */
#define NOW_MS INT64_C(784111777000)

struct ra_vec {
    const char *ms, *ra;
    int64_t now, want;
};

static const struct ra_vec ra_vecs[] = {
    {NULL, NULL, NOW_MS, -1},
    {"1500", NULL, NOW_MS, 1500},
    {"1500.2", NULL, NOW_MS, 1501}, /* rounded up: never earlier than asked */
    {"0.5", NULL, NOW_MS, 1},
    {"0", NULL, NOW_MS, 0},
    {"-1", NULL, NOW_MS, 0}, /* Azure may send -1 */
    {NULL, "2", NOW_MS, 2000},
    {NULL, "1.5", NOW_MS, 1500},
    {NULL, "0.0001", NOW_MS, 1},
    {NULL, " 7 ", NOW_MS, 7000},
    {NULL, "+3", NOW_MS, 3000},
    {NULL, "-5", NOW_MS, 0},
    {NULL, "0", NOW_MS, 0},
    {"250", "10", NOW_MS, 250},  /* retry-after-ms wins */
    {"soon", "3", NOW_MS, 3000}, /* an unusable ms header falls through */
    {"", "3", NOW_MS, 3000},
    {NULL, "99999999999999999999999", NOW_MS, INT64_C(1000000000000000)},
    {NULL, "", NOW_MS, -1},
    {NULL, "soon", NOW_MS, -1},
    {NULL, "1e3", NOW_MS, -1},
    {NULL, "12abc", NOW_MS, -1},
    {NULL, ".", NOW_MS, -1},
    {NULL, "1.", NOW_MS, 1000},
    {NULL, ".5", NOW_MS, 500},
    {NULL, "nan", NOW_MS, -1},
    {NULL, "inf", NOW_MS, -1},
    /* HTTP dates. */
    {NULL, "Sun, 06 Nov 1994 08:51:37 GMT", NOW_MS, 120000},
    {NULL, "Sun, 06 Nov 1994 08:49:37 GMT", NOW_MS, 0},
    {NULL, "Sun, 06 Nov 1994 08:49:36 GMT", NOW_MS, 0},
    {NULL, "Sun, 06 Nov 1994 08:49:38 GMT", NOW_MS - 500, 1500},
    {NULL, "Mon, 07 Nov 1994 00:00:00 GMT", NOW_MS, 54623000},
    {NULL, "Thu, 29 Feb 2024 00:00:10 GMT", INT64_C(1709164800000), 10000},
    {NULL, "Fri, 01 Mar 2024 00:00:00 GMT", INT64_C(1709164800000), 86400000},
    {NULL, "Mon, 01 Mar 2100 00:00:00 GMT", 0, INT64_C(4107542400000)},
    {NULL, "Thu, 01 Jan 1970 00:00:01 GMT", 0, 1000},
    {NULL, "Wed, 31 Dec 1969 23:59:59 GMT", -2000, 1000},
    {NULL, "Sat, 31 Dec 2016 23:59:60 GMT", INT64_C(1483228800000), 0},
    {NULL, "  Sun, 06 Nov 1994 08:51:37 GMT  ", NOW_MS, 120000},
    {NULL, "Fri, 30 Feb 2024 00:00:00 GMT", 0, -1},
    {NULL, "Thu, 29 Feb 2100 00:00:00 GMT", 0, -1},
    {NULL, "Sun, 06 Nov 1994 08:49:37 UTC", NOW_MS, -1},
    {NULL, "Sun, 06 Nov 1994 24:00:00 GMT", NOW_MS, -1},
    {NULL, "Sun, 06 Nov 1994 08:60:00 GMT", NOW_MS, -1},
    {NULL, "Sun, 00 Nov 1994 08:49:37 GMT", NOW_MS, -1},
    {NULL, "Sun, 6 Nov 1994 08:49:37 GMT", NOW_MS, -1},
    {NULL, "Sun, 06 Foo 1994 08:49:37 GMT", NOW_MS, -1},
    {NULL, "Xyz, 06 Nov 1994 08:49:37 GMT", NOW_MS, -1},
    {NULL, "Sun, 06 Nov 94 08:49:37 GMT", NOW_MS, -1},
    {NULL, "Sun, 06 Nov 1994 08:49:37 GMT x", NOW_MS, -1},
    {NULL, "Sun, 06 Nov 1994 08:49:37", NOW_MS, -1},
    {NULL, "Sunday, 06-Nov-94 08:49:37 GMT", NOW_MS, -1}, /* RFC 850: not supported */
    {NULL, "Sun Nov  6 08:49:37 1994", NOW_MS, -1},       /* asctime: not supported */
};

START_TEST(test_retry_after)
{
    const struct ra_vec *v = &ra_vecs[_i];
    int64_t got = llm_retry_after_ms(v->ms, v->ra, v->now);
    ck_assert_msg(got == v->want, "ms '%s' ra '%s': got %lld want %lld",
                  v->ms ? v->ms : "(null)", v->ra ? v->ra : "(null)", (long long)got,
                  (long long)v->want);
}
END_TEST

START_TEST(test_backoff_exact)
{
    struct llm_backoff def = {0};
    struct llm_backoff sdk = {500, 2.0, 8000, 0};
    struct llm_backoff slow = {1000, 1.5, 0, 0};
    uint64_t seed = 42;

    ck_assert_int_eq(llm_backoff_ms(&def, 0, &seed), 1000);
    ck_assert_int_eq(llm_backoff_ms(&def, 1, &seed), 2000);
    ck_assert_int_eq(llm_backoff_ms(&def, 5, &seed), 32000);
    ck_assert_int_eq(llm_backoff_ms(&def, 6, &seed), 60000);
    ck_assert_int_eq(llm_backoff_ms(&def, 100, &seed), 60000);
    ck_assert_int_eq(llm_backoff_ms(&def, 100000, &seed), 60000);
    ck_assert_int_eq(llm_backoff_ms(&def, -3, &seed), 1000);
    ck_assert_int_eq(seed, 42); /* no jitter, no draw */
    ck_assert_int_eq(llm_backoff_ms(&sdk, 0, NULL), 500);
    ck_assert_int_eq(llm_backoff_ms(&sdk, 3, NULL), 4000);
    ck_assert_int_eq(llm_backoff_ms(&sdk, 4, NULL), 8000);
    ck_assert_int_eq(llm_backoff_ms(&sdk, 9, NULL), 8000);
    ck_assert_int_eq(llm_backoff_ms(&slow, 2, NULL), 2250);
}
END_TEST

START_TEST(test_backoff_jitter_bounds)
{
    struct llm_backoff b = {0};
    uint64_t seed = 0x1234567u;
    int retries, i;

    b.jitter = 1;
    for (retries = 0; retries < 10; retries++) {
        int64_t d = 1000 * ((int64_t)1 << retries), lo = INT64_MAX, hi = 0;
        double sum = 0;
        if (d > 60000)
            d = 60000;
        /* No assertion inside the loop: each one costs Check a syscall. */
        for (i = 0; i < 20000; i++) {
            int64_t v = llm_backoff_ms(&b, retries, &seed);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
            sum += (double)v;
        }
        ck_assert_int_ge(lo, 1);
        ck_assert_int_le(hi, d);
        ck_assert_int_gt(hi, d - d / 100); /* the top of the range is reached */
        /* Full jitter: the mean is about d/2. */
        ck_assert_double_gt(sum / 20000, 0.45 * (double)d);
        ck_assert_double_lt(sum / 20000, 0.55 * (double)d);
    }
}
END_TEST

START_TEST(test_backoff_determinism)
{
    struct llm_backoff b = {250, 3.0, 30000, 1};
    uint64_t s1 = 99, s2 = 99, s3 = 100, z = 0;
    int i, same = 0;

    for (i = 0; i < 50; i++) {
        int64_t a = llm_backoff_ms(&b, i % 6, &s1);
        int64_t c = llm_backoff_ms(&b, i % 6, &s2);
        int64_t d = llm_backoff_ms(&b, i % 6, &s3);
        ck_assert_int_eq(a, c);
        same += a == d;
    }
    ck_assert_int_lt(same, 10);
    ck_assert(s1 == s2 && s1 != 99);
    /* A zero seed is repaired rather than stuck at zero. */
    ck_assert_int_ge(llm_backoff_ms(&b, 2, &z), 1);
    ck_assert(z != 0);
    /* No seed: no jitter. */
    ck_assert_int_eq(llm_backoff_ms(&b, 2, NULL), 2250);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_classify, 0,
                        (int)(sizeof(class_vecs) / sizeof(class_vecs[0])));
    tcase_add_loop_test(tc, test_retry_after, 0,
                        (int)(sizeof(ra_vecs) / sizeof(ra_vecs[0])));
    tcase_add_test(tc, test_backoff_exact);
    tcase_add_test(tc, test_backoff_jitter_bounds);
    tcase_add_test(tc, test_backoff_determinism);
    suite_add_tcase(s, tc);
    return s;
}
