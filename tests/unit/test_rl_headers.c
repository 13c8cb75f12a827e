/* test_rl_headers.c -- llm/rl_headers: the reset durations OpenAI writes,
 * fed whole, byte by byte (every prefix) and malformed; which headers count;
 * the hold they make. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "llm/rl_headers.h"
#include "protocol/isotime.h"
#include "util/err.h"

static const struct {
    const char *in;
    int64_t ms;
} good[] = {
    {"1s", 1000},          {"6m0s", 360000},      {"20ms", 20},
    {"1h2m3.5s", 3723500}, {"0.5s", 500},         {"0s", 0},
    {"1.25ms", 2}, /* rounded up */
    {"999us", 1},          {"1500\xc2\xb5s", 2},  {"2ns", 1},
    {"17.123s", 17123},    {"7m12s", 432000},     {" 1s ", 1000},
    {"2", 2000}, /* a bare number: seconds */
    {"0.25", 250},         {"1m30s250ms", 90250}, {"24h", 86400000},
};

static const char *const bad[] = {
    "",   "  ",    "s",   "ms",  "1x",   "1m30", "-1s",       "+1s",      "1 s", "1s2",
    ".s", "1..5s", "1s-", "25h", "1e3s", "abc",  "1h60m0s1x", "\xc2\xb5", "1sm",
};

START_TEST(test_duration_whole)
{
    int64_t ms = -7;
    ck_assert_msg(llm_rl_duration_ms(good[_i].in, strlen(good[_i].in), &ms) == 0, "%s",
                  good[_i].in);
    ck_assert_msg(ms == good[_i].ms, "%s: %lld", good[_i].in, (long long)ms);
}
END_TEST

START_TEST(test_duration_malformed)
{
    int64_t ms = -7;
    ck_assert_msg(llm_rl_duration_ms(bad[_i], strlen(bad[_i]), &ms) == CR_EINVAL, "%s",
                  bad[_i]);
    ck_assert_int_eq(ms, -7);
}
END_TEST

/* Byte by byte: each prefix of a good value is read alone, as a header cut
 * short would be. It is a duration of its own or an error, never past its
 * bytes: a copy without a terminator proves no byte after len is read. */
START_TEST(test_duration_byte_by_byte)
{
    const char *in = good[_i].in;
    size_t n = strlen(in);
    for (size_t k = 0; k <= n; k++) {
        char cut[64];
        int64_t ms = -7, again = -8;
        int rc;
        memcpy(cut, in, k);
        memset(cut + k, '9', sizeof(cut) - k); /* digits after: must not count */
        rc = llm_rl_duration_ms(cut, k, &ms);
        ck_assert(rc == 0 || rc == CR_EINVAL);
        if (rc == 0) {
            char copy[64];
            memcpy(copy, in, k);
            copy[k] = 0;
            ck_assert_int_eq(llm_rl_duration_ms(copy, k, &again), 0);
            ck_assert_int_eq(ms, again);
            ck_assert_int_ge(ms, 0);
        } else {
            ck_assert_int_eq(ms, -7);
        }
    }
    ck_assert_int_eq(llm_rl_duration_ms(NULL, 0, &(int64_t){0}), CR_EINVAL);
}
END_TEST

START_TEST(test_header_kinds)
{
    static const struct {
        const char *name;
        int ok, which, reset;
    } v[] = {
        {"x-ratelimit-remaining-requests", 1, 0, 0},
        {"X-RateLimit-Reset-Requests", 1, 0, 1},
        {"x-ratelimit-remaining-tokens", 1, 1, 0},
        {"x-ratelimit-reset-tokens", 1, 1, 1},
        {"anthropic-ratelimit-requests-remaining", 1, 0, 0},
        {"anthropic-ratelimit-requests-reset", 1, 0, 1},
        {"anthropic-ratelimit-tokens-remaining", 1, 1, 0},
        {"anthropic-ratelimit-input-tokens-reset", 1, 2, 1},
        {"anthropic-ratelimit-output-tokens-remaining", 1, 3, 0},
        {"x-ratelimit-limit-requests", 0, 0, 0},
        {"x-ratelimit-remaining-input-tokens", 0, 0, 0},
        {"x-ratelimit-remaining-requestsx", 0, 0, 0},
        {"anthropic-ratelimit-requests-limit", 0, 0, 0},
        {"retry-after", 0, 0, 0},
        {"x-ratelimit-remaining-", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        int which = -1, reset = -1;
        int ok = llm_rl_header_kind(v[i].name, strlen(v[i].name), &which, &reset);
        ck_assert_msg(ok == v[i].ok, "%s", v[i].name);
        if (ok) {
            ck_assert_int_eq(which, v[i].which);
            ck_assert_int_eq(reset, v[i].reset);
        }
    }
}
END_TEST

START_TEST(test_hold)
{
    const int64_t now = 1765000000000LL;
    char when[40];
    struct llm_rl_headers h;

    memset(&h, 0, sizeof(h));
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 0); /* nothing said */
    h.remaining[0] = "3";
    h.reset[0] = "1s";
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 0); /* some left */
    h.remaining[0] = "0";
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 1000);
    h.remaining[1] = " 0 ";
    h.reset[1] = "6m0s"; /* the longer wins, within the bound */
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), LLM_RL_MAX_HOLD_MS);
    h.reset[1] = "1.5s";
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 1500);
    h.reset[1] = "soon"; /* unusable: that one says nothing */
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 1000);
    h.remaining[0] = "0x";
    h.remaining[1] = "-0";
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 0);
    /* Anthropic: an RFC 3339 time */
    memset(&h, 0, sizeof(h));
    iso8601_format((now + 2500) * 1000, when);
    h.remaining[2] = "0";
    h.reset[2] = when;
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 2500);
    ck_assert_int_eq(llm_rl_hold_ms(&h, now + 5000), 0); /* past already */
    h.reset[2] = "2025-13-01T00:00:00Z";
    ck_assert_int_eq(llm_rl_hold_ms(&h, now), 0);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rl_headers");
    TCase *tc = tcase_create("core");
    int ngood = (int)(sizeof(good) / sizeof(good[0]));
    tcase_add_loop_test(tc, test_duration_whole, 0, ngood);
    tcase_add_loop_test(tc, test_duration_malformed, 0,
                        (int)(sizeof(bad) / sizeof(bad[0])));
    tcase_add_loop_test(tc, test_duration_byte_by_byte, 0, ngood);
    tcase_add_test(tc, test_header_kinds);
    tcase_add_test(tc, test_hold);
    suite_add_tcase(s, tc);
    return s;
}
