/* test_dlq_sqs.c -- the pure rules of `celeriac dlq` over SQS: where a dead
 * letter goes back to, and when a scan of the dead-letter queue stops. */
#include <check.h>
#include <string.h>

#include "cmd/dlq_int.h"

/* A dead letter's headers: its original exchange, routing key and queue;
 * NULL leaves a header out. */
static cJSON *headers(const char *ex, const char *rk, const char *q)
{
    cJSON *h = cJSON_CreateObject();
    ck_assert_ptr_nonnull(h);
    if (ex)
        cJSON_AddStringToObject(h, "x-celeriac-original-exchange", ex);
    if (rk)
        cJSON_AddStringToObject(h, "x-celeriac-original-routing-key", rk);
    if (q)
        cJSON_AddStringToObject(h, "x-celeriac-original-queue", q);
    return h;
}

static const struct {
    const char *ex, *rk, *q, *want;
} targets[] = {
    /* as the worker and kombu publish on SQS: the routing key is the queue */
    {"", "llm.high", "llm.high", "llm.high"},
    {"", "celery", NULL, "celery"},
    /* a named exchange: the queue it was consumed from */
    {"celery", "celery", "celery", "celery"},
    {"tasks", "route.key", "llm.low", "llm.low"},
    /* a named exchange and no queue: the routing key */
    {"tasks", "route.key", "", "route.key"},
    {"tasks", "route.key", NULL, "route.key"},
    /* no exchange header reads "" */
    {NULL, "jobs.fifo", "other", "jobs.fifo"},
    /* only the queue */
    {"", "", "celery", "celery"},
    {NULL, NULL, "celery", "celery"},
    /* nothing says where */
    {"", "", "", NULL},
    {NULL, NULL, NULL, NULL},
    {"tasks", "", "", NULL},
};

START_TEST(test_target)
{
    cJSON *h = headers(targets[_i].ex, targets[_i].rk, targets[_i].q);
    const char *got = dlq__sqs_target(h);
    if (targets[_i].want)
        ck_assert_str_eq(got ? got : "(null)", targets[_i].want);
    else
        ck_assert_ptr_null(got);
    cJSON_Delete(h);
}
END_TEST

START_TEST(test_target_ignores_non_strings)
{
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "x-celeriac-original-routing-key", 7);
    cJSON_AddNullToObject(h, "x-celeriac-original-queue");
    ck_assert_ptr_null(dlq__sqs_target(h));
    cJSON_AddStringToObject(h, "x-celeriac-original-exchange", "");
    cJSON_DeleteItemFromObject(h, "x-celeriac-original-queue");
    cJSON_AddStringToObject(h, "x-celeriac-original-queue", "q");
    ck_assert_str_eq(dlq__sqs_target(h), "q");
    cJSON_Delete(h);
}
END_TEST

START_TEST(test_next_wait)
{
    /* pages keep coming: short polls */
    ck_assert_int_eq(dlq__sqs_next_wait(10, 0, 10, 0), 0);
    ck_assert_int_eq(dlq__sqs_next_wait(3, 0, 13, 100), 0);
    /* an empty short poll is confirmed by a long poll of 1 s */
    ck_assert_int_eq(dlq__sqs_next_wait(0, 0, 13, 100), 1);
    ck_assert_int_eq(dlq__sqs_next_wait(0, 0, 0, 0), 1);
    /* which found more: short polls again */
    ck_assert_int_eq(dlq__sqs_next_wait(2, 1, 15, 1200), 0);
    /* an empty long poll ends the scan */
    ck_assert_int_eq(dlq__sqs_next_wait(0, 1, 15, 1300), -1);
    ck_assert_int_eq(dlq__sqs_next_wait(0, 1, 0, 1000), -1);
    /* the caps, whatever the page */
    ck_assert_int_eq(dlq__sqs_next_wait(10, 0, DLQ_SQS_SCAN_MAX - 1, 0), 0);
    ck_assert_int_eq(dlq__sqs_next_wait(10, 0, DLQ_SQS_SCAN_MAX, 0), -1);
    ck_assert_int_eq(dlq__sqs_next_wait(0, 0, DLQ_SQS_SCAN_MAX + 5, 0), -1);
    ck_assert_int_eq(dlq__sqs_next_wait(10, 0, 20, DLQ_SQS_SCAN_MS - 1), 0);
    ck_assert_int_eq(dlq__sqs_next_wait(10, 0, 20, DLQ_SQS_SCAN_MS), -1);
    ck_assert_int_eq(dlq__sqs_next_wait(0, 0, 20, DLQ_SQS_SCAN_MS), -1);
}
END_TEST

/* The hold of a received dead letter outlasts a scan
 * by enough that no page comes back into a later one of the same scan. */
START_TEST(test_scan_fits_in_the_hold)
{
    ck_assert_int_le(DLQ_SQS_SCAN_MS, DLQ_SQS_HOLD_S * 1000 / 2);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("dlq_sqs");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_target, 0, sizeof(targets) / sizeof(targets[0]));
    tcase_add_test(tc, test_target_ignores_non_strings);
    tcase_add_test(tc, test_next_wait);
    tcase_add_test(tc, test_scan_fits_in_the_hold);
    suite_add_tcase(s, tc);
    return s;
}
