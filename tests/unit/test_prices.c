/* test_prices.c -- llm/prices: parsing a provider's "prices", matching a
 * model to its pattern, and the cost of an answer. */
#include <check.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "llm/prices.h"
#include "util/alloc.h"

static int parse(struct llm_prices *p, const char *json, struct cr_err *err)
{
    cJSON *o = cJSON_Parse(json);
    int rc;
    ck_assert_ptr_nonnull(o);
    memset(err, 0, sizeof(*err));
    rc = llm_prices_parse(p, o, "acme", err);
    cJSON_Delete(o);
    return rc;
}

#define NEAR(a, b) ck_assert_msg(fabs((a) - (b)) < 1e-12, "%.15g != %.15g", (a), (b))

START_TEST(test_parse_and_match)
{
    struct llm_prices p = {0};
    struct cr_err err;
    const struct llm_price *pr;
    ck_assert_int_eq(
        parse(&p,
              "{\"gpt-4o\": {\"input\": 2.5, \"output\": 10, \"cached_input\": "
              "1.25}, \"gpt-4o*\": {\"input\": 3, \"output\": 12}, "
              "\"gpt-4o-mini*\": {\"input\": 0.15, \"output\": 0.6}, "
              "\"*\": {\"input\": 1, \"output\": 2, \"cache_write\": 1.25}}",
              &err),
        0);
    ck_assert_int_eq(p.n, 4);
    pr = llm_prices_find(&p, "gpt-4o");
    ck_assert_str_eq(pr->pattern, "gpt-4o"); /* exact beats every prefix */
    NEAR(pr->cached_input, 1.25);
    NEAR(pr->cache_write, 2.5); /* defaults to input */
    ck_assert_str_eq(llm_prices_find(&p, "gpt-4o-2024-08-06")->pattern, "gpt-4o*");
    ck_assert_str_eq(llm_prices_find(&p, "gpt-4o-mini-2024")->pattern, "gpt-4o-mini*");
    ck_assert_str_eq(llm_prices_find(&p, "claude")->pattern, "*");
    NEAR(llm_prices_find(&p, "claude")->cached_input, 1.0);
    ck_assert_ptr_null(llm_prices_find(&p, NULL));
    ck_assert_ptr_null(llm_prices_find(NULL, "x"));
    /* by the model sent, else by the one served */
    ck_assert_str_eq(llm_prices_pick(&p, "gpt-4o", "other")->pattern, "gpt-4o");
    llm_prices_release(&p);
    ck_assert_int_eq(parse(&p, "{\"gpt-4o\": {\"input\": 1, \"output\": 1}}", &err), 0);
    ck_assert_str_eq(llm_prices_pick(&p, "my-deployment", "gpt-4o")->pattern, "gpt-4o");
    ck_assert_ptr_null(llm_prices_pick(&p, "a", "b"));
    llm_prices_release(&p);
    ck_assert_int_eq(parse(&p, "{}", &err), 0);
    ck_assert_int_eq(p.n, 0);
    ck_assert_ptr_null(llm_prices_find(&p, "x"));
    llm_prices_release(&p);
}
END_TEST

START_TEST(test_pattern_score)
{
    ck_assert_int_eq(llm_pattern_score("abc", "abc"), LONG_MAX);
    ck_assert_int_eq(llm_pattern_score("abc", "abcd"), -1);
    ck_assert_int_eq(llm_pattern_score("ab*", "abcd"), 2);
    ck_assert_int_eq(llm_pattern_score("ab*", "ab"), 2);
    ck_assert_int_eq(llm_pattern_score("ab*", "a"), -1);
    ck_assert_int_eq(llm_pattern_score("*", ""), 0);
}
END_TEST

START_TEST(test_refusals)
{
    static const struct {
        const char *doc, *want;
    } bad[] = {
        {"[]", "'prices' must be an object"},
        {"{\"m\": 3}", "prices 'm' must be an object"},
        {"{\"m\": {\"input\": 1}}", "needs 'input' and 'output'"},
        {"{\"m\": {\"output\": 1}}", "needs 'input' and 'output'"},
        {"{\"m\": {\"input\": 1, \"output\": 1, \"cached\": 1}}", "unknown key 'cached'"},
        {"{\"m\": {\"input\": -1, \"output\": 1}}", "'input' must be USD"},
        {"{\"m\": {\"input\": \"1\", \"output\": 1}}", "'input' must be USD"},
        {"{\"m\": {\"input\": 1, \"output\": 1e7}}", "'output' must be USD"},
        {"{\"a*b\": {\"input\": 1, \"output\": 1}}", "prefix ending in '*'"},
        {"{\"\": {\"input\": 1, \"output\": 1}}", "prefix ending in '*'"},
    };
    struct llm_prices p = {0};
    struct cr_err err;
    char many[8192];
    size_t n = 0;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(parse(&p, bad[i].doc, &err), CR_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].want), "%s: got '%s'", bad[i].doc, err.msg);
        ck_assert_msg(strstr(err.msg, "acme"), "%s", err.msg);
        ck_assert_int_eq(p.n, 0);
        ck_assert_ptr_null(p.items);
    }
    /* a pattern of 200 bytes, and 65 patterns */
    n = (size_t)snprintf(many, sizeof(many), "{\"");
    memset(many + n, 'm', 200);
    n += 200;
    n += (size_t)snprintf(many + n, sizeof(many) - n,
                          "\": {\"input\": 1, \"output\": 1}}");
    ck_assert_int_eq(parse(&p, many, &err), CR_EINVAL);
    n = (size_t)snprintf(many, sizeof(many), "{");
    for (int i = 0; i <= LLM_PRICES_MAX; i++)
        n +=
            (size_t)snprintf(many + n, sizeof(many) - n,
                             "%s\"m%d\": {\"input\": 1, \"output\": 1}", i ? "," : "", i);
    snprintf(many + n, sizeof(many) - n, "}");
    ck_assert_int_eq(parse(&p, many, &err), CR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "over 64 prices"));
}
END_TEST

START_TEST(test_cost)
{
    struct llm_price pr = {"m", 2.5, 10, 1.25, 3.75};
    /* OpenAI: 1000 prompt tokens, 400 of them cached, 200 completion */
    NEAR(llm_price_cost(&pr, 1000, 200, 400, -1),
         (600 * 2.5 + 400 * 1.25 + 200 * 10) / 1e6);
    /* Anthropic: prompt counts both cache parts */
    NEAR(llm_price_cost(&pr, 1000, 0, 300, 100),
         (600 * 2.5 + 300 * 1.25 + 100 * 3.75) / 1e6);
    /* parts not said count as none */
    NEAR(llm_price_cost(&pr, 1000, 1000, -1, -1), (1000 * 2.5 + 1000 * 10) / 1e6);
    /* cached over prompt: the plain part stays at 0 */
    NEAR(llm_price_cost(&pr, 10, 0, 20, -1), 20 * 1.25 / 1e6);
    NEAR(llm_price_cost(&pr, 0, 0, -1, -1), 0.0);
    ck_assert(llm_price_cost(&pr, -1, 5, -1, -1) < 0);
    ck_assert(llm_price_cost(&pr, 5, -1, -1, -1) < 0);
    ck_assert(llm_price_cost(NULL, 5, 5, -1, -1) < 0);
}
END_TEST

START_TEST(test_parse_oom)
{
    struct llm_prices p = {0};
    struct cr_err err;
    int rc;
    for (long n = 1;; n++) {
        cJSON *o =
            cJSON_Parse("{\"a\": {\"input\": 1, \"output\": 2}, \"b*\": {\"input\": "
                        "3, \"output\": 4}}");
        memset(&err, 0, sizeof(err));
        cr_alloc_fail_after(n);
        rc = llm_prices_parse(&p, o, "acme", &err);
        cr_alloc_fail_after(0);
        cJSON_Delete(o);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_int_eq(p.n, 0);
    }
    ck_assert_int_eq(p.n, 2);
    llm_prices_release(&p);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("prices");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse_and_match);
    tcase_add_test(tc, test_pattern_score);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_cost);
    tcase_add_test(tc, test_parse_oom);
    suite_add_tcase(s, tc);
    return s;
}
