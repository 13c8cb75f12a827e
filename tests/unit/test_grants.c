/* test_grants.c -- llm/grants: the local stock of prepaid request grants
 * (take, lapse, drop on cooling), the batch-size rule and the fit in the
 * shared burst; and 100,000 random steps of a fleet sharing one rpm limit
 * through it, every call sent checked against llm/limiter.c. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm/grants.h"
#include "llm/limiter.h"

START_TEST(test_apply)
{
    ck_assert_int_eq(grants_apply(1200, 0, 0), 1);
    ck_assert_int_eq(grants_apply(GRANTS_MIN_RPM, 0, 0), 1);
    ck_assert_int_eq(grants_apply(599, 0, 0), 0);
    ck_assert_int_eq(grants_apply(0, 0, 0), 0);
    ck_assert_int_eq(grants_apply(1200, 1000, 0), 0); /* tokens vary per call */
    ck_assert_int_eq(grants_apply(1200, 0, 4), 0);    /* permits are named leases */
}
END_TEST

START_TEST(test_take_lapse_drop)
{
    struct grants g = {0};
    int64_t w;
    ck_assert_int_eq(grants_take(&g, 0, &w), 0);
    ck_assert_int_eq(w, 0);
    /* three due at once (first due in the past), asked at 990, answered at 1000 */
    grants_put(&g, 3, -40, 60000, 990, 1000);
    ck_assert_int_eq(grants_held(&g, 1000), 3);
    ck_assert_int_eq(grants_take(&g, 1010, &w), 1);
    ck_assert_int_eq(grants_held(&g, 1010), 2);
    /* lapsing GRANTS_LIFE_MS after their time, counted from the question */
    ck_assert_int_eq(grants_held(&g, 990 + GRANTS_LIFE_MS - 1), 2);
    ck_assert_int_eq(grants_take(&g, 990 + GRANTS_LIFE_MS, &w), 0);
    ck_assert_int_eq(w, 0);
    ck_assert_int_eq(g.n, 0);
    /* due later (the burst spent): 1,200 rpm, the first in 100 ms, the
     * second 50 ms after it; each waits for its time */
    grants_put(&g, 2, 100, 1200, 2000, 2000);
    ck_assert_int_eq(grants_take(&g, 2000, &w), 0);
    ck_assert_int_eq(w, 100);
    ck_assert_int_eq(grants_take(&g, 2099, &w), 0);
    ck_assert_int_eq(w, 1);
    ck_assert_int_eq(grants_take(&g, 2100, &w), 1);
    ck_assert_int_eq(grants_take(&g, 2100, &w), 0);
    ck_assert_int_eq(w, 50);
    ck_assert_int_eq(grants_held(&g, 2150 + GRANTS_LIFE_MS - 1), 1);
    ck_assert_int_eq(grants_take(&g, 2150 + GRANTS_LIFE_MS, &w), 0);
    ck_assert_int_eq(w, 0);
    /* an answer that came after its slots lapsed holds nothing */
    grants_put(&g, 2, -10, 1200, 3000, 3000 + GRANTS_LIFE_MS + 100);
    ck_assert_int_eq(g.n, 0);
    /* a cooling drops them all */
    grants_put(&g, 5, 0, 6000, 4000, 4000);
    grants_drop(&g);
    ck_assert_int_eq(grants_take(&g, 4000, &w), 0);
    ck_assert_int_eq(w, 0);
    /* never more than GRANTS_MAX held; nonsense counts hold nothing */
    grants_put(&g, 100, 0, 60000, 5000, 5000);
    ck_assert_int_eq(grants_held(&g, 5000), GRANTS_MAX);
    grants_drop(&g);
    grants_put(&g, -3, 0, 1200, 5000, 5000);
    grants_put(&g, 0, 0, 1200, 5000, 5000);
    ck_assert_int_eq(grants_held(&g, 5000), 0);
}
END_TEST

START_TEST(test_batch_rule)
{
    struct grants g = {0};
    /* one call now and then: nothing prepaid */
    grants_note_ask(&g, 0);
    ck_assert_int_eq(grants_batch(&g, 6000, 0), 0);
    for (int i = 0; i < 20; i++)
        grants_note_ask(&g, 1 + i);
    /* many asking: bounded by the rpm's yield in GRANTS_SPAN_MS and GRANTS_MAX */
    ck_assert_int_eq(grants_batch(&g, 599, 21), 0);
    ck_assert_int_eq(grants_batch(&g, 600, 21), 1);
    ck_assert_int_eq(grants_batch(&g, 1200, 21), 2);
    ck_assert_int_eq(grants_batch(&g, 3000, 21), 5);
    ck_assert_int_eq(grants_batch(&g, 60000, 21), GRANTS_MAX);
    /* the stock not spent: nothing more */
    grants_put(&g, 1, 0, 1200, 21, 21);
    ck_assert_int_eq(grants_batch(&g, 60000, 21), 0);
    ck_assert_int_eq(grants_batch(&g, 60000, 21 + GRANTS_LIFE_MS), GRANTS_MAX);
    /* three asking in the window: two extra at most */
    memset(&g, 0, sizeof(g));
    grants_note_ask(&g, 5000);
    grants_note_ask(&g, 5010);
    grants_note_ask(&g, 5020);
    ck_assert_int_eq(grants_batch(&g, 60000, 5020), 2);
    /* the window before still counts; two windows later nothing does */
    grants_note_ask(&g, 5000 + GRANTS_LIFE_MS);
    ck_assert_int_eq(grants_batch(&g, 60000, 5000 + GRANTS_LIFE_MS), 2);
    grants_note_ask(&g, 5000 + 4 * GRANTS_LIFE_MS);
    ck_assert_int_eq(grants_batch(&g, 60000, 5000 + 4 * GRANTS_LIFE_MS), 0);
}
END_TEST

START_TEST(test_fit)
{
    int64_t first;
    /* 1,200 rpm: 50 ms a slot; burst 950 ms, life 150 ms. An empty bucket:
     * all 8 due at once (their time is past) */
    ck_assert_int_eq(grants_fit(50, 0, 1200, 950, 150, 8, &first), 8);
    ck_assert_int_lt(first, 0);
    ck_assert_int_eq(grants_fit(50, 0, 1200, 950, 150, 2, &first), 2);
    /* the burst spent (the call just fit it): the next slots are due once a
     * call could go with a burst of 800 ms, only those within 250 ms */
    ck_assert_int_eq(grants_fit(950, 0, 1200, 950, 150, 8, &first), 2);
    ck_assert_int_eq(first, 200);
    ck_assert_int_eq(grants_fit(1000, 0, 1200, 950, 150, 8, &first), 1);
    ck_assert_int_eq(first, 250);
    ck_assert_int_eq(grants_fit(1001, 0, 1200, 950, 150, 8, &first), 0);
    ck_assert_int_eq(grants_fit(0, 0, 1200, 950, 150, 0, &first), 0);
    ck_assert_int_eq(grants_fit(0, 0, 0, 950, 150, 3, &first), 0);
}
END_TEST

/* The shared state as the Redis script keeps it: a GCRA tat and a cooling. */
struct shared {
    double tat;
    int64_t cool;
};

#define BURST (LIM_BURST_MS - 50) /* the shared check's burst, as the worker asks */

/* One try on the shared state, with k extras asked: -1 refused, else the
 * extras granted (charged), the first due in *first ms. */
static int shared_try(struct shared *s, double rpm, int64_t now, int k, int64_t *first)
{
    double t = 60000.0 / rpm, base = s->tat > (double)now ? s->tat : (double)now;
    int extra;
    if (s->cool > now)
        return -1;
    if (base + t - (double)now - BURST > 0 && s->tat > (double)now)
        return -1;
    s->tat = base + t;
    extra = grants_fit(s->tat, now, rpm, BURST, GRANTS_LIFE_MS, k, first);
    s->tat += extra * t;
    return extra;
}

START_TEST(test_random_against_limiter)
{
    enum { W = 3 };
    static const double rpms[] = {600, 1200, 3000, 20000};
    for (unsigned r = 0; r < sizeof(rpms) / sizeof(rpms[0]); r++) {
        double rpm = rpms[r];
        struct lim_config cfg = {.rpm = rpm};
        struct lim_state oracle;
        struct shared sh = {0};
        struct grants g[W];
        int64_t now = 1, wait;
        long sent = 0, cached = 0;
        int64_t first = -1;
        memset(g, 0, sizeof(g));
        ck_assert_int_eq(lim_init(&oracle, &cfg), 0);
        srand(42 + r);
        for (int step = 0; step < 25000; step++) {
            int w = rand() % W, kind = rand() % 100;
            now += rand() % (kind < 5 ? 400 : 15);
            if (kind == 0) {
                /* a 429: the fleet cools, every stock is dropped */
                int64_t until = now + 1 + rand() % 2000;
                if (until > sh.cool)
                    sh.cool = until;
                lim_cool(&oracle, until);
                for (int i = 0; i < W; i++)
                    grants_drop(&g[i]);
                continue;
            }
            grants_note_ask(&g[w], now);
            if (grants_take(&g[w], now, &wait)) {
                cached++;
            } else if (wait > 0) {
                continue; /* a slot held is due later: the call waits for it */
            } else {
                int64_t due;
                int extra =
                    shared_try(&sh, rpm, now, grants_batch(&g[w], rpm, now), &due);
                if (extra < 0)
                    continue;
                grants_put(&g[w], extra, due, rpm, now, now);
            }
            /* every call sent passes the limit as a provider applies it */
            ck_assert_msg(lim_try(&oracle, &cfg, now, 0, 1, &wait) == 1,
                          "rpm %.0f step %d: a call over the limit", rpm, step);
            if (first < 0)
                first = now;
            sent++;
        }
        /* and over the whole run, no more than the limit's pace and a burst */
        ck_assert(sent <= (double)(now - first) * rpm / 60000.0 + rpm / 60.0 + 1);
        /* the stock served many calls without asking */
        ck_assert_msg(cached > sent / 10, "rpm %.0f: %ld of %ld from the stock", rpm,
                      cached, sent);
        lim_release(&oracle);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("grants");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_apply);
    tcase_add_test(tc, test_take_lapse_drop);
    tcase_add_test(tc, test_batch_rule);
    tcase_add_test(tc, test_fit);
    tcase_add_test(tc, test_random_against_limiter);
    suite_add_tcase(s, tc);
    return s;
}
