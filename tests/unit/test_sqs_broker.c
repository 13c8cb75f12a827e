/* test_sqs_broker.c -- the SQS transport's pure parts: a held message's
 * session tag, the back-off of a failed call, and how the pending
 * settlements are cut into batches. (How many messages a poll may ask for is
 * the session's: test_vsession.c, test_long_polls_window.) */
#include <check.h>
#include <string.h>

#include "net/sqs_broker_int.h"
#include "protocol/sqs.h"
#include "util/alloc.h"

START_TEST(test_tag)
{
    static const char *const receipts[] = {"AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a+/==", "r",
                                           "a b c", "x\n y"};
    size_t qlen = 99;
    for (size_t i = 0; i < sizeof(receipts) / sizeof(receipts[0]); i++) {
        char *t = sqs_tag_new("celery.fifo", receipts[i]);
        const char *r;
        ck_assert_ptr_nonnull(t);
        r = sqs_tag_split(t, &qlen);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(qlen, strlen("celery.fifo"));
        ck_assert(!strncmp(t, "celery.fifo", qlen));
        ck_assert_str_eq(r, receipts[i]); /* the first space splits */
        ck_assert_ptr_eq(r, t + qlen + 1);
        cr_free(t);
    }
    /* malformed: no space, an empty queue name or receipt */
    qlen = 99;
    ck_assert_ptr_null(sqs_tag_split("", &qlen));
    ck_assert_ptr_null(sqs_tag_split("celery", &qlen));
    ck_assert_ptr_null(sqs_tag_split(" receipt", &qlen));
    ck_assert_ptr_null(sqs_tag_split("celery ", &qlen));
    ck_assert_uint_eq(qlen, 99);
    /* out of memory */
    cr_alloc_fail_after(1);
    ck_assert_ptr_null(sqs_tag_new("celery", "r"));
    ck_assert_int_eq(cr_alloc_failed(), 1);
    cr_alloc_fail_after(0);
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

/* Builds a list of n nodes from queue ids q[] and kinds d[]. */
static struct sqs_pending *list_of(struct sqs_pending *v, const int *q, const int *d,
                                   int n, const int *queues)
{
    for (int i = 0; i < n; i++) {
        v[i].queue = &queues[q[i]];
        v[i].del = d[i];
        v[i].next = i + 1 < n ? &v[i + 1] : NULL;
    }
    return n ? &v[0] : NULL;
}

START_TEST(test_batch_take)
{
    static const int queues[3] = {0, 1, 2};
    struct sqs_pending v[32], *list, *b;
    int q[32], d[32], n;

    /* empty */
    list = NULL;
    ck_assert_ptr_null(sqs_batch_take(&list, &n));
    ck_assert_int_eq(n, 0);

    /* 25 deletes on one queue: 10, 10, 5, in order */
    for (int i = 0; i < 25; i++)
        q[i] = 0, d[i] = 1;
    list = list_of(v, q, d, 25, queues);
    b = sqs_batch_take(&list, &n);
    ck_assert_int_eq(n, 10);
    ck_assert_ptr_eq(b, &v[0]);
    for (int i = 0; i < 10; i++, b = b->next)
        ck_assert_ptr_eq(b, &v[i]);
    ck_assert_ptr_null(b);
    ck_assert_ptr_eq(list, &v[10]);
    sqs_batch_take(&list, &n);
    ck_assert_int_eq(n, 10);
    b = sqs_batch_take(&list, &n);
    ck_assert_int_eq(n, 5);
    ck_assert_ptr_eq(b, &v[20]);
    ck_assert_ptr_null(list);

    /* mixed: queue and kind both split; the rest keep their order */
    {
        static const int mq[] = {0, 1, 0, 0, 2, 0, 1};
        static const int md[] = {1, 1, 0, 1, 1, 1, 1};
        list = list_of(v, mq, md, 7, queues);
    }
    b = sqs_batch_take(&list, &n); /* queue 0 deletes: 0, 3, 5 */
    ck_assert_int_eq(n, 3);
    ck_assert_ptr_eq(b, &v[0]);
    ck_assert_ptr_eq(b->next, &v[3]);
    ck_assert_ptr_eq(b->next->next, &v[5]);
    ck_assert_ptr_null(b->next->next->next);
    ck_assert_ptr_eq(list, &v[1]);
    ck_assert_ptr_eq(list->next, &v[2]);
    ck_assert_ptr_eq(list->next->next, &v[4]);
    ck_assert_ptr_eq(list->next->next->next, &v[6]);
    ck_assert_ptr_null(list->next->next->next->next);
    b = sqs_batch_take(&list, &n); /* queue 1 deletes: 1, 6 */
    ck_assert_int_eq(n, 2);
    ck_assert_ptr_eq(b->next, &v[6]);
    b = sqs_batch_take(&list, &n); /* queue 0, visibility: 2 */
    ck_assert_int_eq(n, 1);
    ck_assert_ptr_eq(b, &v[2]);
    ck_assert_int_eq(b->del, 0);
    b = sqs_batch_take(&list, &n); /* queue 2: 4 */
    ck_assert_int_eq(n, 1);
    ck_assert_ptr_eq(b, &v[4]);
    ck_assert_ptr_null(list);
    ck_assert_ptr_null(sqs_batch_take(&list, &n));
    ck_assert_int_eq(n, 0);

    /* twelve of one queue among others: ten now, the two left behind the others */
    for (int i = 0; i < 14; i++)
        q[i] = i == 3 || i == 8 ? 1 : 0, d[i] = 1;
    list = list_of(v, q, d, 14, queues);
    b = sqs_batch_take(&list, &n);
    ck_assert_int_eq(n, 10);
    for (; b; b = b->next)
        ck_assert_ptr_eq(b->queue, &queues[0]);
    ck_assert_ptr_eq(list, &v[3]);
    ck_assert_ptr_eq(list->next, &v[8]);
    ck_assert_ptr_eq(list->next->next, &v[12]);
    ck_assert_ptr_eq(list->next->next->next, &v[13]);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sqs_broker");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_tag);
    tcase_add_test(tc, test_backoff);
    tcase_add_test(tc, test_batch_take);
    suite_add_tcase(s, tc);
    return s;
}
