/* test_startup_retry.c -- the start-up retry rule: kombu's schedule and
 * Celery's bound. */
#include <check.h>

#include "util/startup_retry.h"

START_TEST(test_schedule_is_kombus)
{
    static const int64_t want[] = {2000,  4000,  6000,  8000,  10000, 12000,
                                   14000, 16000, 18000, 20000, 22000, 24000,
                                   26000, 28000, 30000, 30000, 30000};
    struct startup_retry r;
    startup_retry_init(&r, 1, 0);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        ck_assert_int_eq(startup_retry_next(&r), want[i]);
        ck_assert_int_eq(r.retries, (int)i + 1);
    }
}
END_TEST

START_TEST(test_bound)
{
    struct startup_retry r;
    /* max_retries 2: two waits, then no third (three attempts in all). */
    startup_retry_init(&r, 1, 2);
    ck_assert_int_eq(startup_retry_next(&r), 2000);
    ck_assert_int_eq(startup_retry_next(&r), 4000);
    ck_assert_int_eq(startup_retry_next(&r), -1);
    ck_assert_int_eq(startup_retry_next(&r), -1);
    ck_assert_int_eq(r.retries, 2);
}
END_TEST

START_TEST(test_off_is_one_attempt)
{
    struct startup_retry r;
    startup_retry_init(&r, 0, 100);
    ck_assert_int_eq(startup_retry_next(&r), -1);
    ck_assert_int_eq(r.retries, 0);
}
END_TEST

START_TEST(test_zero_is_for_ever)
{
    struct startup_retry r;
    startup_retry_init(&r, 1, 0);
    for (int i = 0; i < 100000; i++)
        ck_assert_int_gt(startup_retry_next(&r), 0);
    r.retries = 2147483647; /* the count saturates, the wait stays capped */
    ck_assert_int_eq(startup_retry_next(&r), 30000);
    ck_assert_int_eq(r.retries, 2147483647);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("startup_retry");
    TCase *tc = tcase_create("rule");
    tcase_add_test(tc, test_schedule_is_kombus);
    tcase_add_test(tc, test_bound);
    tcase_add_test(tc, test_off_is_one_attempt);
    tcase_add_test(tc, test_zero_is_for_ever);
    suite_add_tcase(s, tc);
    return s;
}
