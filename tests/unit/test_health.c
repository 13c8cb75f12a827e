/* test_health.c -- when a provider's failures are an outage worth a WARNING. */
#include <check.h>
#include <string.h>

#include "llm/health.h"
#include "util/err.h"

#define S LLM_HEALTH_SUCCESS
#define F LLM_HEALTH_FAILURE
#define N LLM_HEALTH_NEUTRAL

static const struct llm_health_rule rule = LLM_HEALTH_RULE_DEFAULT;

/* Feeds one outcome and returns what is due, keeping the report. */
static struct llm_health_report rep;

static enum llm_health_say note(struct llm_health *h, enum llm_health_kind k, int64_t ms)
{
    return llm_health_note(h, &rule, k, ms, &rep);
}

START_TEST(test_failing_once_after_three)
{
    struct llm_health h;
    llm_health_init(&h);
    ck_assert_int_eq(note(&h, F, 1000), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 1200), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 1500), LLM_HEALTH_FAILING);
    ck_assert_int_eq(rep.failed, 3);
    ck_assert_int_eq(rep.for_ms, 500);
    ck_assert_int_eq(h.failing, 1);
    /* Hundreds more within the minute: not a word. */
    for (int i = 0; i < 500; i++)
        ck_assert_int_eq(note(&h, F, 1500 + i * 100), LLM_HEALTH_QUIET);
    ck_assert_int_eq(rep.failed, 503);
}
END_TEST

START_TEST(test_reminder_rate_limited)
{
    struct llm_health h;
    int stills = 0;
    llm_health_init(&h);
    for (int i = 0; i < 3; i++)
        note(&h, F, 0);
    ck_assert_int_eq(h.failing, 1);
    ck_assert_int_eq(note(&h, F, 59999), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 60000), LLM_HEALTH_STILL);
    ck_assert_int_eq(rep.failed, 5);
    ck_assert_int_eq(rep.failed_since, 2); /* the two since the first line */
    ck_assert_int_eq(rep.for_ms, 60000);
    /* One failure a second for ten minutes: one reminder a minute. */
    for (int64_t t = 61000; t <= 660000; t += 1000)
        if (note(&h, F, t) == LLM_HEALTH_STILL) {
            stills++;
            ck_assert_int_eq(rep.failed_since, 60);
        }
    ck_assert_int_eq(stills, 10);
    /* No call ends for an hour: nothing is due until one does. */
    ck_assert_int_eq(note(&h, F, 4000000), LLM_HEALTH_STILL);
    ck_assert_int_eq(rep.failed_since, 1);
}
END_TEST

START_TEST(test_recovery_once)
{
    struct llm_health h;
    llm_health_init(&h);
    for (int i = 0; i < 10; i++)
        note(&h, F, 1000 + i * 1000);
    ck_assert_int_eq(note(&h, S, 75000), LLM_HEALTH_RECOVERED);
    ck_assert_int_eq(rep.failed, 10);
    ck_assert_int_eq(rep.for_ms, 74000);
    ck_assert_int_eq(h.failing, 0);
    ck_assert_int_eq(h.run, 0);
    ck_assert_int_eq(note(&h, S, 75001), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, S, 75002), LLM_HEALTH_QUIET);
}
END_TEST

START_TEST(test_short_runs_stay_quiet)
{
    struct llm_health h;
    llm_health_init(&h);
    /* Two failures then a success, over and over: never an outage. */
    for (int i = 0; i < 100; i++) {
        ck_assert_int_eq(note(&h, F, i * 300), LLM_HEALTH_QUIET);
        ck_assert_int_eq(note(&h, F, i * 300 + 100), LLM_HEALTH_QUIET);
        ck_assert_int_eq(note(&h, S, i * 300 + 200), LLM_HEALTH_QUIET);
    }
    ck_assert_int_eq(h.said, 0);
}
END_TEST

START_TEST(test_slow_failures_span)
{
    struct llm_health h;
    llm_health_init(&h);
    /* One call at a time, each timing out after 30 s: the second says it. */
    ck_assert_int_eq(note(&h, F, 30000), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 61000), LLM_HEALTH_FAILING);
    ck_assert_int_eq(rep.failed, 2);
    ck_assert_int_eq(rep.for_ms, 31000);
    /* A lone failure is never enough, however long ago the last success. */
    llm_health_init(&h);
    note(&h, S, 0);
    ck_assert_int_eq(note(&h, F, 1000000), LLM_HEALTH_QUIET);
}
END_TEST

START_TEST(test_lone_400_silent)
{
    struct llm_health h;
    llm_health_init(&h);
    /* Permanent failures (neutral) never start anything... */
    for (int i = 0; i < 50; i++)
        ck_assert_int_eq(note(&h, N, i * 10), LLM_HEALTH_QUIET);
    ck_assert_int_eq(h.run, 0);
    /* ...nor end a run: a 400 between timeouts is about its request. */
    note(&h, F, 1000);
    note(&h, F, 1100);
    ck_assert_int_eq(note(&h, N, 1150), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 1200), LLM_HEALTH_FAILING);
    ck_assert_int_eq(note(&h, N, 1300), LLM_HEALTH_QUIET);
    ck_assert_int_eq(h.failing, 1);
}
END_TEST

START_TEST(test_flapping_rate_limited)
{
    struct llm_health h;
    int failing = 0, recovered = 0;
    llm_health_init(&h);
    /* Down three calls, up one, every second, for five minutes: one
     * FAILING (and its RECOVERED) a minute at most. */
    for (int64_t t = 0; t < 300000; t += 1000) {
        for (int i = 0; i < 3; i++)
            failing += note(&h, F, t + i * 100) == LLM_HEALTH_FAILING;
        recovered += note(&h, S, t + 500) == LLM_HEALTH_RECOVERED;
    }
    ck_assert_int_eq(failing, 5);
    ck_assert_int_eq(recovered, 5);
    /* A run held back by the limit is said once the minute has passed. */
    llm_health_init(&h);
    for (int i = 0; i < 3; i++)
        note(&h, F, i);
    ck_assert_int_eq(note(&h, S, 10), LLM_HEALTH_RECOVERED);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(note(&h, F, 20 + i), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 59999), LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&h, F, 60002), LLM_HEALTH_FAILING);
    ck_assert_int_eq(rep.failed, 5);
}
END_TEST

START_TEST(test_providers_independent)
{
    struct llm_health a, b;
    llm_health_init(&a);
    llm_health_init(&b);
    /* a fails while b answers: only a speaks, and b's successes do not
     * end a's outage. */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(note(&b, S, i * 10 + 5), LLM_HEALTH_QUIET);
        ck_assert_int_eq(note(&a, F, i * 10),
                         i == 2 ? LLM_HEALTH_FAILING : LLM_HEALTH_QUIET);
    }
    ck_assert_int_eq(a.failing, 1);
    ck_assert_int_eq(b.failing, 0);
    /* b fails too: its own FAILING, at once (a's line does not hold it). */
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(note(&b, F, 100 + i),
                         i == 2 ? LLM_HEALTH_FAILING : LLM_HEALTH_QUIET);
    ck_assert_int_eq(note(&a, S, 200), LLM_HEALTH_RECOVERED);
    ck_assert_int_eq(b.failing, 1);
    ck_assert_int_eq(note(&b, S, 300), LLM_HEALTH_RECOVERED);
}
END_TEST

/* ---------------------------------------------------------- classification */

struct kind_vec {
    const char *what;
    enum llm_verdict verdict;
    int code;
    long status;
    int curl;
    enum llm_health_kind want;
};

static const struct kind_vec kinds[] = {
    {"success", LLM_OK, 0, 200, 0, S},
    {"connection refused", LLM_RETRYABLE, CR_ELLM, 0, 7, F},
    {"curl timeout", LLM_RETRYABLE, CR_ETIMEDOUT, 0, 28, F},
    {"first-byte timeout", LLM_RETRYABLE, CR_ETIMEDOUT, 0, 42, F},
    {"idle timeout after 200", LLM_RETRYABLE, CR_ETIMEDOUT, 200, 42, F},
    {"reset mid-stream", LLM_RETRYABLE, CR_ELLM, 200, 56, F},
    {"certificate refused", LLM_PERMANENT, CR_ELLM, 0, 60, N},
    {"500", LLM_RETRYABLE, CR_ELLM, 500, 0, F},
    {"503", LLM_RETRYABLE, CR_ELLM, 503, 0, F},
    {"529 overloaded", LLM_RETRYABLE, CR_ELLM, 529, 0, F},
    {"429", LLM_RETRYABLE, CR_ELLM, 429, 0, F},
    {"429 insufficient_quota", LLM_PERMANENT, CR_ELLM, 429, 0, N},
    {"408", LLM_RETRYABLE, CR_ELLM, 408, 0, F},
    {"stream cut", LLM_RETRYABLE, CR_ELLM, 200, 0, F},
    {"invalid JSON answer", LLM_PERMANENT, CR_ELLM, 200, 0, N},
    {"400", LLM_PERMANENT, CR_ELLM, 400, 0, N},
    {"401", LLM_PERMANENT, CR_ELLM, 401, 0, N},
    {"404", LLM_PERMANENT, CR_ELLM, 404, 0, N},
    {"409 retried", LLM_RETRYABLE, CR_ELLM, 409, 0, N},
    {"400 with x-should-retry", LLM_RETRYABLE, CR_ELLM, 400, 0, N},
    {"revoked", LLM_PERMANENT, CR_ECANCELED, 200, 42, N},
    {"out of memory", LLM_PERMANENT, CR_ENOMEM, 0, 42, N},
};

START_TEST(test_kind)
{
    const struct kind_vec *v = &kinds[_i];
    struct llm_result res;
    memset(&res, 0, sizeof(res));
    res.verdict = v->verdict;
    res.code = v->code;
    res.http_status = v->status;
    res.curl_code = v->curl;
    ck_assert_msg(llm_health_kind(&res) == v->want, "%s: got %d, want %d", v->what,
                  llm_health_kind(&res), v->want);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("health");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_failing_once_after_three);
    tcase_add_test(tc, test_reminder_rate_limited);
    tcase_add_test(tc, test_recovery_once);
    tcase_add_test(tc, test_short_runs_stay_quiet);
    tcase_add_test(tc, test_slow_failures_span);
    tcase_add_test(tc, test_lone_400_silent);
    tcase_add_test(tc, test_flapping_rate_limited);
    tcase_add_test(tc, test_providers_independent);
    tcase_add_loop_test(tc, test_kind, 0, (int)(sizeof(kinds) / sizeof(kinds[0])));
    suite_add_tcase(s, tc);
    return s;
}
