/* test_pool.c -- llm/pool: weighted and least-busy choice of a pool's
 * target with cooled targets skipped, checked step by step and against a
 * plain model over 100,000 random steps (a fixed seed: it cannot fail by
 * chance). */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm/pool.h"

START_TEST(test_weighted_order)
{
    /* 3:1 in smooth order: a a b a, never b b */
    struct llm_pool_state st;
    struct llm_pool_member m[2] = {{3, 0, 0}, {1, 0, 0}};
    static const int want[8] = {0, 0, 1, 0, 0, 0, 1, 0};
    memset(&st, 0, sizeof(st));
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 2, 0, NULL), want[i]);
}
END_TEST

START_TEST(test_weighted_shares_exact)
{
    /* any whole number of rounds holds the exact shares */
    struct llm_pool_state st;
    struct llm_pool_member m[4] = {{5, 0, 0}, {3, 0, 0}, {1, 0, 0}, {1, 0, 0}};
    long n[4] = {0};
    memset(&st, 0, sizeof(st));
    for (int i = 0; i < 1000; i++)
        n[llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 4, i, NULL)]++;
    ck_assert_int_eq(n[0], 500);
    ck_assert_int_eq(n[1], 300);
    ck_assert_int_eq(n[2], 100);
    ck_assert_int_eq(n[3], 100);
}
END_TEST

START_TEST(test_cooled_skipped)
{
    struct llm_pool_state st;
    struct llm_pool_member m[3] = {{3, 0, 500}, {1, 0, 0}, {1, 0, 200}};
    int64_t w = -1;
    memset(&st, 0, sizeof(st));
    /* at 100 only the second is open */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 100, &w), 1);
    ck_assert_int_eq(w, -1); /* not touched */
    /* all cooled: none, and the wait until the first opens */
    m[1].cool_until_ms = 300;
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 100, &w), -1);
    ck_assert_int_eq(w, 100);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 100, &w), -1);
    ck_assert_int_eq(w, 100);
    /* at 200 the third opens: it is picked; at 500 all are */
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 200, &w), 2);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 250, &w), 2);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 500, &w), 0);
}
END_TEST

START_TEST(test_standby_weight_zero)
{
    /* weight 0: used only while every weighted target is cooled */
    struct llm_pool_state st;
    struct llm_pool_member m[3] = {{2, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    memset(&st, 0, sizeof(st));
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 0, NULL), 0);
    m[0].cool_until_ms = 100;
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 0, NULL), 1);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 0, NULL), 2);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 0, NULL), 1);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 3, 100, NULL), 0);
}
END_TEST

START_TEST(test_least_busy_and_ties)
{
    struct llm_pool_state st;
    struct llm_pool_member m[3] = {{0, 4, 0}, {0, 2, 0}, {0, 7, 0}};
    memset(&st, 0, sizeof(st));
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 0, NULL), 1);
    /* ties go round in turn, not always to the first */
    m[0].busy = m[1].busy = m[2].busy = 1;
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 0, NULL), 2);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 0, NULL), 0);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_LEAST_BUSY, m, 3, 0, NULL), 1);
}
END_TEST

START_TEST(test_bad_sizes_and_names)
{
    struct llm_pool_state st;
    struct llm_pool_member m[LLM_POOL_MAX + 1];
    memset(&st, 0, sizeof(st));
    memset(m, 0, sizeof(m));
    m[0].weight = 1;
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 0, 0, NULL), -1);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, LLM_POOL_MAX + 1, 0, NULL),
                     -1);
    ck_assert_int_eq(llm_pool_pick(&st, LLM_POOL_WEIGHTED, m, 1, 0, NULL), 0);
    ck_assert_int_eq(llm_pool_strategy_of("weighted"), LLM_POOL_WEIGHTED);
    ck_assert_int_eq(llm_pool_strategy_of("least-busy"), LLM_POOL_LEAST_BUSY);
    ck_assert_int_eq(llm_pool_strategy_of("least_busy"), 0);
    ck_assert_int_eq(llm_pool_strategy_of("round-robin"), 0);
    ck_assert_int_eq(llm_pool_strategy_of(NULL), 0);
}
END_TEST

/* A fixed-seed generator: the same steps on every run. */
static uint32_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* 100,000 random steps: targets cool and warm, calls start and end, time
 * moves; each pick is checked against what a plain model says is allowed,
 * and the weighted shares over the steps with every target open converge. */
START_TEST(test_random_against_model)
{
    enum { N = 5, STEPS = 100000 };
    static const long weights[N] = {5, 3, 1, 1, 2};
    struct llm_pool_state sw, sl;
    struct llm_pool_member m[N];
    long all_open_picks[N] = {0}, all_open = 0, none = 0;
    int64_t now = 0;
    uint64_t seed = 38;

    memset(&sw, 0, sizeof(sw));
    memset(&sl, 0, sizeof(sl));
    for (int i = 0; i < N; i++)
        m[i] = (struct llm_pool_member){weights[i], 0, 0};
    for (long step = 0; step < STEPS; step++) {
        uint32_t r = rnd(&seed) % 100;
        int i = (int)(rnd(&seed) % N), nopen = 0, k;
        int64_t w = -1, soonest = INT64_MAX;

        if (r < 1) /* an outage: every target cooled for up to 100 ms */
            for (int j = 0; j < N; j++)
                m[j].cool_until_ms = now + 1 + rnd(&seed) % 100;
        else if (r < 3) /* a 429: one target cooled for up to 300 ms */
            m[i].cool_until_ms = now + 1 + rnd(&seed) % 300;
        else if (r < 30 && m[i].busy > 0)
            m[i].busy--;
        else if (r < 40)
            now += rnd(&seed) % 50;
        for (int j = 0; j < N; j++) {
            nopen += m[j].cool_until_ms <= now;
            if (m[j].cool_until_ms > now && m[j].cool_until_ms < soonest)
                soonest = m[j].cool_until_ms;
        }

        k = llm_pool_pick(&sl, LLM_POOL_LEAST_BUSY, m, N, now, &w);
        if (!nopen) {
            ck_assert_int_eq(k, -1);
            ck_assert_int_eq(w, soonest - now);
            ck_assert_int_gt(w, 0);
            none++;
            now += w; /* the caller waits (or falls back) */
            continue;
        }
        ck_assert_int_ge(k, 0);
        ck_assert_int_le(m[k].cool_until_ms, now);
        for (int j = 0; j < N; j++) /* never busier than an open one */
            if (m[j].cool_until_ms <= now)
                ck_assert_int_le(m[k].busy, m[j].busy);
        m[k].busy++;

        k = llm_pool_pick(&sw, LLM_POOL_WEIGHTED, m, N, now, &w);
        ck_assert_int_ge(k, 0);
        ck_assert_int_le(m[k].cool_until_ms, now);
        if (nopen == N) {
            all_open_picks[k]++;
            all_open++;
        }
    }
    /* the model was exercised: both regimes happened often */
    ck_assert_int_gt(none, 100);
    ck_assert_int_gt(all_open, STEPS / 4);
    for (int j = 0; j < N; j++) {
        double want = (double)weights[j] / 12.0 * (double)all_open;
        double got = (double)all_open_picks[j];
        ck_assert_msg(got > want * 0.98 && got < want * 1.02,
                      "target %d: %.0f picks, %.0f expected", j, got, want);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_weighted_order);
    tcase_add_test(tc, test_weighted_shares_exact);
    tcase_add_test(tc, test_cooled_skipped);
    tcase_add_test(tc, test_standby_weight_zero);
    tcase_add_test(tc, test_least_busy_and_ties);
    tcase_add_test(tc, test_bad_sizes_and_names);
    tcase_add_test(tc, test_random_against_model);
    suite_add_tcase(s, tc);
    return s;
}
