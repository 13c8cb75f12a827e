/* test_sqs_broker.c -- the SQS transport's pure arithmetic: how many
 * messages a poll may ask for, and the back-off of a failed call. */
#include <check.h>

#include "net/sqs_broker_int.h"
#include "protocol/sqs.h"

START_TEST(test_receive_room)
{
    /* no window: always a full batch */
    ck_assert_int_eq(sqs_receive_room(0, 0, 0), SQS_BATCH_MAX);
    ck_assert_int_eq(sqs_receive_room(0, 500, 30), SQS_BATCH_MAX);
    ck_assert_int_eq(sqs_receive_room(-1, 3, 0), SQS_BATCH_MAX);
    /* the free room, at most ten */
    ck_assert_int_eq(sqs_receive_room(8, 0, 0), 8);
    ck_assert_int_eq(sqs_receive_room(40, 0, 0), SQS_BATCH_MAX);
    ck_assert_int_eq(sqs_receive_room(40, 25, 0), 10);
    ck_assert_int_eq(sqs_receive_room(40, 25, 8), 7);
    ck_assert_int_eq(sqs_receive_room(1, 0, 0), 1);
    /* full (or over, after the window shrank): no poll */
    ck_assert_int_eq(sqs_receive_room(1, 1, 0), 0);
    ck_assert_int_eq(sqs_receive_room(4, 2, 2), 0);
    ck_assert_int_eq(sqs_receive_room(4, 9, 0), 0);
    /* a negative count (never expected) is read as none */
    ck_assert_int_eq(sqs_receive_room(4, -3, -3), 4);
}
END_TEST

START_TEST(test_backoff)
{
    /* 200 ms doubling, halves jittered: [d/2, d] */
    ck_assert_uint_eq(sqs_backoff_ms(1, 10000, 0), 100);
    ck_assert_uint_eq(sqs_backoff_ms(1, 10000, 1), 200);
    ck_assert_uint_eq(sqs_backoff_ms(2, 10000, 1), 400);
    ck_assert_uint_eq(sqs_backoff_ms(3, 10000, 0.5), 600);
    /* capped, also for absurd attempt counts */
    ck_assert_uint_eq(sqs_backoff_ms(10, 10000, 1), 10000);
    ck_assert_uint_eq(sqs_backoff_ms(1000000, 10000, 1), 10000);
    ck_assert_uint_eq(sqs_backoff_ms(1000000, 10000, 0), 5000);
    /* jitter out of 0..1 is clamped; attempt 0 reads as the first */
    ck_assert_uint_eq(sqs_backoff_ms(1, 10000, -4), 100);
    ck_assert_uint_eq(sqs_backoff_ms(1, 10000, 7), 200);
    ck_assert_uint_eq(sqs_backoff_ms(0, 10000, 1), 200);
    /* a cap below the first step */
    ck_assert_uint_eq(sqs_backoff_ms(1, 50, 1), 50);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sqs_broker");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_receive_room);
    tcase_add_test(tc, test_backoff);
    suite_add_tcase(s, tc);
    return s;
}
