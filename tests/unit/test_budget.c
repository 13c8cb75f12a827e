/* test_budget.c -- llm/budget: a provider's daily spend limit across a fleet. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "llm/budget.h"

static int parse(struct llm_budget *b, const char *json, struct cr_err *err)
{
    cJSON *o = cJSON_Parse(json);
    int rc;
    ck_assert_ptr_nonnull(o);
    memset(err, 0, sizeof(*err));
    rc = llm_budget_parse(b, o, "acme", err);
    cJSON_Delete(o);
    return rc;
}

START_TEST(test_parse)
{
    static const struct {
        const char *doc, *want;
    } bad[] = {
        {"5", "'budget' must be an object"},
        {"{}", "usd_per_day must be"},
        {"{\"usd_per_day\": 0}", "usd_per_day must be"},
        {"{\"usd_per_day\": -3}", "usd_per_day must be"},
        {"{\"usd_per_day\": \"10\"}", "usd_per_day must be"},
        {"{\"usd_per_day\": 1e12}", "usd_per_day must be"},
        {"{\"usd_per_day\": 1, \"usd_per_month\": 9}", "unknown key 'usd_per_month'"},
    };
    struct llm_budget b;
    struct cr_err err;
    ck_assert_int_eq(parse(&b, "{\"usd_per_day\": 12.5}", &err), 0);
    ck_assert(b.usd_per_day == 12.5 && b.day == -1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(parse(&b, bad[i].doc, &err), CR_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].want) && strstr(err.msg, "acme"), "%s: %s",
                      bad[i].doc, err.msg);
    }
}
END_TEST

START_TEST(test_day)
{
    ck_assert_int_eq(llm_budget_day(0), 0);
    ck_assert_int_eq(llm_budget_day(86399999), 0);
    ck_assert_int_eq(llm_budget_day(86400000), 1);
    ck_assert_int_eq(llm_budget_day(-1), -1);
    /* 2026-12-07T19:00:00Z */
    ck_assert_int_eq(llm_budget_day(1796670000000LL), 20794);
}
END_TEST

START_TEST(test_spend_shared_and_alone)
{
    struct llm_budget b = {.usd_per_day = 1.0, .day = -1};
    double a;
    ck_assert_int_eq(llm_budget_open(&b, 100), 1);
    llm_budget_add(&b, 100, 0.4);
    ck_assert_int_eq(llm_budget_open(&b, 100), 1);
    a = llm_budget_take(&b, 100);
    ck_assert(fabs(a - 0.4) < 1e-12);
    ck_assert_double_eq(llm_budget_take(&b, 100), 0);         /* nothing new */
    ck_assert(fabs(llm_budget_spent(&b, 100) - 0.4) < 1e-12); /* sending counts */
    /* the shared count answers: the fleet spent 0.9 with ours */
    llm_budget_sent(&b, 100, a, 1, 0.9);
    ck_assert(fabs(llm_budget_spent(&b, 100) - 0.9) < 1e-12);
    /* Redis away: the next increment fails and is counted alone */
    llm_budget_add(&b, 100, 0.05);
    a = llm_budget_take(&b, 100);
    llm_budget_sent(&b, 100, a, 0, 0);
    ck_assert(fabs(llm_budget_spent(&b, 100) - 0.95) < 1e-12);
    ck_assert_int_eq(llm_budget_open(&b, 100), 1);
    /* another worker's spend, read back */
    llm_budget_read(&b, 100, 1.0);
    ck_assert_int_eq(llm_budget_open(&b, 100), 0);
    llm_budget_read(&b, 100, 0.2); /* an older read does not lower it */
    ck_assert_int_eq(llm_budget_open(&b, 100), 0);
    /* a new UTC day opens it again; the old day's answers are ignored */
    ck_assert_int_eq(llm_budget_open(&b, 101), 1);
    llm_budget_sent(&b, 100, 0.05, 1, 5.0);
    ck_assert_double_eq(llm_budget_spent(&b, 101), 0);
    /* a clock stepping back keeps the later day */
    ck_assert_int_eq(llm_budget_open(&b, 100), 1);
    ck_assert_int_eq(b.day, 101);
    /* no budget: always open */
    b.usd_per_day = 0;
    llm_budget_read(&b, 101, 1e9);
    ck_assert_int_eq(llm_budget_open(&b, 101), 1);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("budget");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_day);
    tcase_add_test(tc, test_spend_shared_and_alone);
    suite_add_tcase(s, tc);
    return s;
}
