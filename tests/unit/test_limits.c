/* test_limits.c -- a provider's limits (llm/limits.c): the token estimate a
 * call is charged before its usage comes, and the pattern lookup with
 * allocation failures. */
#include <check.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "llm/limits.h"
#include "util/alloc.h"

static long est(const char *body, int chat)
{
    return llm_limits_estimate(body, strlen(body), chat);
}

START_TEST(test_estimate)
{
    static const struct {
        const char *body;
        int chat;
        long want;
    } v[] = {
        /* bytes / 4, plus the answer's bound */
        {"{\"max_tokens\": 50}", 1, 4 + 50},
        {"{\"max_tokens\":7,\"x\":1}", 1, 5 + 7},
        {"{\"max_completion_tokens\" :\n 12}", 1, 7 + 12},
        {"{\"options\":{\"num_predict\":30}}", 1, 7 + 30},
        /* no bound: the default answer */
        {"{\"model\":\"m\"}", 1, 3 + LLM_LIMIT_DEFAULT_ANSWER},
        /* a key without a number after it is skipped for the next one */
        {"{\"m\":\"\\\"max_tokens\\\"\",\"max_tokens\":9}", 1, 9 + 9},
        {"{\"max_tokens\":null}", 1, 4 + LLM_LIMIT_DEFAULT_ANSWER},
        {"{\"max_tokens\"", 1, 3 + LLM_LIMIT_DEFAULT_ANSWER},
        {"{\"max_tokens\":", 1, 3 + LLM_LIMIT_DEFAULT_ANSWER},
        /* embeddings: the input only */
        {"{\"input\":\"abcdefgh\",\"max_tokens\":9}", 0, 8},
        {"", 1, LLM_LIMIT_DEFAULT_ANSWER},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        ck_assert_msg(est(v[i].body, v[i].chat) == v[i].want, "%s: %ld want %ld",
                      v[i].body, est(v[i].body, v[i].chat), v[i].want);
    /* a huge number is capped, not overflowed */
    ck_assert_int_le(est("{\"max_tokens\":99999999999999999999999}", 1), 200000000);
    ck_assert_int_eq(llm_limits_estimate(NULL, 0, 1), LLM_LIMIT_DEFAULT_ANSWER);
}
END_TEST

static const char *const DOC = "{\"a*\": {\"rpm\": 5}, \"ab\": {\"tpm\": 6}, "
                               "\"*\": {\"concurrency\": 7}}";

START_TEST(test_parse_oom_sweep)
{
    cJSON *o = cJSON_Parse(DOC);
    int passed = 0;
    ck_assert_ptr_nonnull(o);
    for (int n = 1; n < 10 && !passed; n++) {
        struct llm_limits l = {0};
        struct cr_err err = {0};
        int rc;
        cr_alloc_fail_after(n);
        rc = llm_limits_parse(&l, o, "p", &err);
        cr_alloc_fail_after(0);
        if (rc) {
            ck_assert_int_eq(rc, CR_ENOMEM);
            ck_assert_int_eq(l.n, 0);
            continue;
        }
        passed = 1;
        ck_assert_int_eq(l.n, 3);
        ck_assert(llm_limits_find(&l, "ab")->tpm == 6);
        ck_assert(llm_limits_find(&l, "abc")->rpm == 5);
        ck_assert(llm_limits_find(&l, "b")->concurrency == 7);
        llm_limits_release(&l);
    }
    ck_assert(passed);
    cJSON_Delete(o);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("limits");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_estimate);
    tcase_add_test(tc, test_parse_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
