/* test_limiter.c -- llm/limiter: GCRA per-minute limits, leased permits and
 * cooling, with the time passed in; checked step by step and against a plain
 * model over 100,000 random steps. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "llm/limiter.h"
#include "util/alloc.h"
#include "util/err.h"

START_TEST(test_rpm_paced_per_second)
{
    /* 600 rpm: one call per 100 ms, a second's worth (10) at once at most. */
    struct lim_config cfg = {.rpm = 600};
    struct lim_state s;
    int64_t w;
    int n = 0;
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    while (lim_try(&s, &cfg, 0, 0, 1, &w))
        n++;
    ck_assert_int_eq(n, 10); /* the tat may run 1000 ms ahead of now */
    ck_assert_int_ge(w, 99);
    ck_assert_int_le(w, 100);
    ck_assert_int_eq(lim_try(&s, &cfg, w - 2, 0, 1, &w), 0);
    ck_assert_int_eq(lim_try(&s, &cfg, 100, 0, 1, &w), 1);
    /* a minute later: a second's burst again, not a minute's */
    n = 0;
    while (lim_try(&s, &cfg, 120000, 0, 1, &w))
        n++;
    ck_assert_int_eq(n, 10);
    lim_release(&s);
}
END_TEST

START_TEST(test_tpm_estimate_then_correct)
{
    /* 60,000 tpm: 1 token per ms; a burst of 1,000 tokens */
    struct lim_config cfg = {.tpm = 60000};
    struct lim_state s;
    int64_t w;
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 800, 1, &w), 1);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 800, 1, &w), 0);
    ck_assert_int_eq(w, 600);
    /* the first call used 100 tokens, not 800: 700 given back */
    lim_correct(&s, &cfg, 800, 100);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 800, 1, &w), 1);
    /* more than estimated: the next call waits for the difference too */
    lim_correct(&s, &cfg, 800, 1800);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 100, 1, &w), 0);
    ck_assert_int_eq(w, 1000);
    /* a call bigger than the burst goes once the limit has caught up */
    ck_assert_int_eq(lim_try(&s, &cfg, 2900, 5000, 1, &w), 1);
    ck_assert_int_eq(lim_try(&s, &cfg, 2900, 1, 1, &w), 0);
    lim_release(&s);
}
END_TEST

START_TEST(test_permits_leased)
{
    struct lim_config cfg = {.concurrency = 2, .lease_ms = 30000};
    struct lim_state s;
    int64_t w;
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 0, 7, &w), 1);
    ck_assert_int_eq(lim_try(&s, &cfg, 0, 0, 8, &w), 1);
    ck_assert_int_eq(lim_try(&s, &cfg, 10, 0, 9, &w), 0);
    ck_assert_int_eq(w, 29990); /* when the first lease would run out */
    ck_assert_int_eq(lim_in_flight(&s, 10), 2);
    lim_done(&s, 20, 7);
    ck_assert_int_eq(lim_in_flight(&s, 20), 1);
    ck_assert_int_eq(lim_try(&s, &cfg, 20, 0, 9, &w), 1);
    /* holder 8 dies (no renewal); 9 renews: 8's permit comes back at 30 s */
    lim_renew(&s, &cfg, 25000, 9);
    ck_assert_int_eq(lim_try(&s, &cfg, 29999, 0, 10, &w), 0);
    ck_assert_int_eq(lim_try(&s, &cfg, 30000, 0, 10, &w), 1);
    ck_assert_int_eq(lim_in_flight(&s, 30000), 2);
    ck_assert_int_eq(lim_in_flight(&s, 55020), 1); /* 9's renewed lease ends */
    lim_release(&s);
}
END_TEST

START_TEST(test_cooling)
{
    struct lim_config cfg = {.rpm = 6000};
    struct lim_state s;
    int64_t w;
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    lim_cool(&s, 5000);
    lim_cool(&s, 3000); /* an earlier end does not shorten it */
    ck_assert_int_eq(lim_try(&s, &cfg, 100, 0, 1, &w), 0);
    ck_assert_int_eq(w, 4900);
    ck_assert_int_eq(lim_try(&s, &cfg, 5000, 0, 1, &w), 1);
    lim_release(&s);
}
END_TEST

START_TEST(test_init_oom)
{
    struct lim_config cfg = {.concurrency = 5};
    struct lim_state s;
    cr_alloc_fail_after(1);
    ck_assert_int_eq(lim_init(&s, &cfg), CR_ENOMEM);
    cr_alloc_fail_after(0);
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    lim_release(&s);
}
END_TEST

/* The plain model: every grant kept with its time and actual tokens; the
 * limits' promises checked over every window that ends at a grant. */
struct grant {
    int64_t t;
    long tokens;
};

/* The grants g[i..ng) against the limits, up to now. */
static void check_window(const struct lim_config *cfg, const struct grant *g,
                         const long *tok_sum, long ng, long i, int64_t now, int step)
{
    double len = (double)(now - g[i].t);
    long req = ng - i, tok = tok_sum[ng] - tok_sum[i];
    /* Not ck_assert: each of those marks a point through a pipe, and this
     * runs 6 million times. */
    if (req > 1 + (len + LIM_BURST_MS) * cfg->rpm / 60000.0 + 1e-9)
        ck_abort_msg("step %d: %ld requests in %.0f ms", step, req, len);
    if (tok > 820 + (len + LIM_BURST_MS) * cfg->tpm / 60000.0 + 1e-6)
        ck_abort_msg("step %d: %ld tokens in %.0f ms", step, tok, len);
}

START_TEST(test_random_against_model)
{
    struct lim_config cfg = {
        .rpm = 1200, .tpm = 90000, .concurrency = 8, .lease_ms = 5000};
    struct lim_state s;
    struct grant *g = malloc(100000 * sizeof(*g));
    long *tok_sum = calloc(100001, sizeof(*tok_sum)); /* tokens of g[0..i) */
    long lo = 0;
    struct {
        uint64_t holder;
        int64_t until;
    } live[64];
    int nlive = 0;
    long ng = 0, waits = 0;
    int64_t now = 0, cool = 0;
    unsigned x = 2026;
    ck_assert_ptr_nonnull(g);
    ck_assert_int_eq(lim_init(&s, &cfg), 0);
    for (int step = 0; step < 100000; step++) {
        int64_t w;
        long est, actual;
        x = x * 1103515245u + 12345u;
        now += (x >> 16) % 40;
        /* calls that end, and holders that die without a word */
        for (int i = 0; i < nlive;) {
            if (live[i].until <= now) {
                if (live[i].holder % 7)
                    lim_done(&s, now, live[i].holder);
                live[i] = live[--nlive];
            } else {
                lim_renew(&s, &cfg, now, live[i].holder);
                i++;
            }
        }
        x = x * 1103515245u + 12345u;
        if ((x >> 16) % 500 == 0) {
            cool = now + 1 + (x >> 8) % 3000;
            lim_cool(&s, cool);
        }
        x = x * 1103515245u + 12345u;
        est = 20 + (long)((x >> 16) % 400);
        actual = est / 2 + (long)((x >> 4) % (unsigned)est);
        if (!lim_try(&s, &cfg, now, est, (uint64_t)step + 1, &w)) {
            if (w <= 0)
                ck_abort_msg("step %d: refused without a wait", step);
            waits++;
            continue;
        }
        if (now < cool) /* nothing while cooling */
            ck_abort_msg("step %d: a call at %lld while cooling until %lld", step,
                         (long long)now, (long long)cool);
        lim_correct(&s, &cfg, est, actual);
        g[ng++] = (struct grant){now, actual};
        if (nlive >= 64)
            ck_abort_msg("step %d: more live calls than permits", step);
        live[nlive].holder = (uint64_t)step + 1;
        live[nlive].until = now + 10 + (x >> 20) % 400;
        nlive++;
        /* concurrency, by the model's own count of the calls running (each
         * renews its permit), and by the limiter's */
        if (nlive > 8 || lim_in_flight(&s, now) > 8)
            ck_abort_msg("step %d: %d calls running, %ld permits", step, nlive,
                         lim_in_flight(&s, now));
        /* rpm: any window [a, now] holds at most 1 + (len + burst) / T
         * requests; tokens at most a call's worth over (len + burst) * rate.
         * Checked for the windows from the last 64 grants (where bursts
         * show) and for the last minute (prefix sums). */
        tok_sum[ng] = tok_sum[ng - 1] + actual;
        while (g[lo].t < now - 60000)
            lo++;
        for (long i = ng - 1; i >= 0 && i >= ng - 64; i--)
            check_window(&cfg, g, tok_sum, ng, i, now, step);
        if (lo < ng - 64)
            check_window(&cfg, g, tok_sum, ng, lo, now, step);
    }
    /* it did limit, and it let most of the time's worth through */
    ck_assert_int_gt(waits, 1000);
    ck_assert_int_gt(ng, 1000);
    lim_release(&s);
    free(tok_sum);
    free(g);
}
END_TEST

START_TEST(test_share)
{
    struct lim_config cfg = {
        .rpm = 600, .tpm = 90000, .concurrency = 5, .lease_ms = 3000};
    struct lim_config out;
    struct lim_state s;
    int64_t w;
    int n = 0;
    lim_share(&cfg, 3, &out);
    ck_assert(out.rpm == 200 && out.tpm == 30000);
    ck_assert_int_eq(out.concurrency, 1); /* 5 / 3 rounded down: 3 never hold 6 */
    ck_assert_int_eq(out.lease_ms, 3000);
    lim_share(&cfg, 2, &out);
    ck_assert_int_eq(out.concurrency, 2);
    lim_share(&cfg, 9, &out); /* more workers than permits: one each */
    ck_assert_int_eq(out.concurrency, 1);
    for (long k = -1; k <= 1; k++) {
        lim_share(&cfg, k, &out);
        ck_assert(out.rpm == 600 && out.tpm == 90000 && out.concurrency == 5);
    }
    cfg.concurrency = 0; /* no limit stays none */
    lim_share(&cfg, 4, &out);
    ck_assert_int_eq(out.concurrency, 0);
    /* a share of 600 rpm among 4 paces at 150 rpm: a second's worth at once */
    ck_assert_int_eq(lim_init(&s, &out), 0);
    while (lim_try(&s, &out, 0, 0, 1, &w))
        n++;
    ck_assert_int_eq(n, 2);   /* 2.5 a second */
    ck_assert_int_eq(w, 200); /* the third fits the second 200 ms later */
    lim_release(&s);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("limiter");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_rpm_paced_per_second);
    tcase_add_test(tc, test_tpm_estimate_then_correct);
    tcase_add_test(tc, test_permits_leased);
    tcase_add_test(tc, test_cooling);
    tcase_add_test(tc, test_init_oom);
    tcase_add_test(tc, test_share);
    tcase_add_test(tc, test_random_against_model);
    suite_add_tcase(s, tc);
    return s;
}
