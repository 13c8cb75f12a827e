/* test_ratelimit.c -- rate-limit parsing and token buckets, with a fake clock. */
#include <check.h>

#include "util/alloc.h"
#include "engine/ratelimit.h"

START_TEST(test_parse)
{
    ck_assert_double_eq_tol(ratelimit_parse("10/s"), 10, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse("10"), 10, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse("120/m"), 2, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse("3600/h"), 1, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse("1.5/s"), 1.5, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse(""), 0, 1e-9);
    ck_assert_double_eq_tol(ratelimit_parse("0"), 0, 1e-9);
    ck_assert(ratelimit_parse("ten/s") < 0);
    ck_assert(ratelimit_parse("10/d") < 0);
    ck_assert(ratelimit_parse("-1/s") < 0);
    ck_assert(ratelimit_parse("10/ss") < 0);
}
END_TEST

START_TEST(test_bucket_rate)
{
    struct ratelimit tb;
    int64_t now = 1000;
    int taken = 0;
    ratelimit_init(&tb, 2, now); /* 2/s, burst 2 */
    ck_assert_int_eq(ratelimit_take(&tb, now), 0);
    ck_assert_int_eq(ratelimit_take(&tb, now), 0);
    ck_assert_int_eq(ratelimit_take(&tb, now), 500);
    ck_assert_int_eq(ratelimit_take(&tb, now + 499), 1);
    ck_assert_int_eq(ratelimit_take(&tb, now + 500), 0);
    /* over 10 s of fake time, about 20 tokens are given */
    for (int64_t t = now + 501; t < now + 10500; t += 10)
        if (ratelimit_take(&tb, t) == 0)
            taken++;
    ck_assert_int_ge(taken, 19);
    ck_assert_int_le(taken, 21);
}
END_TEST

START_TEST(test_bucket_slow_and_unlimited)
{
    struct ratelimit tb;
    ratelimit_init(&tb, 1.0 / 60, 0); /* 1/m */
    ck_assert_int_eq(ratelimit_take(&tb, 0), 0);
    ck_assert_int_eq(ratelimit_take(&tb, 0), 60000);
    ck_assert_int_eq(ratelimit_take(&tb, 30000), 30000);
    ck_assert_int_eq(ratelimit_take(&tb, 60000), 0);
    ratelimit_init(&tb, 0, 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(ratelimit_take(&tb, 0), 0);
    /* the clock going backwards never adds tokens */
    ratelimit_init(&tb, 1, 5000);
    ck_assert_int_eq(ratelimit_take(&tb, 5000), 0);
    ck_assert_int_gt(ratelimit_take(&tb, 1000), 0);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("ratelimit");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse);
    tcase_add_test(tc, test_bucket_rate);
    tcase_add_test(tc, test_bucket_slow_and_unlimited);
    suite_add_tcase(s, tc);
    return s;
}
