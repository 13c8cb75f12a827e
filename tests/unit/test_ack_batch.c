/* test_ack_batch.c -- ack batching against a model of RabbitMQ's per-channel
 * unacked set: no frame may name a tag the broker no longer holds (406
 * "unknown delivery tag"), none may cover a delivery the worker has not acked,
 * and every ack must reach the broker. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"
#include "net/ack_batch.h"

/* ------------------------------------------------------------ the model */

enum { W_OPEN, W_ACKED, W_REJECTED };

struct model {
    int n;             /* tags 1..n may be used */
    char *outstanding; /* the broker still holds the delivery */
    char *worker;      /* W_* per tag */
    int lo;            /* lowest tag that may be outstanding */
    long frames;
};

static void model_init(struct model *m, int n)
{
    m->n = n;
    m->outstanding = calloc((size_t)n + 2, 1);
    m->worker = calloc((size_t)n + 2, 1);
    m->lo = 1;
    m->frames = 0;
}

static void model_free(struct model *m)
{
    free(m->outstanding);
    free(m->worker);
}

/* basic.ack as RabbitMQ takes it. */
static void model_ack(struct model *m, uint64_t tag, int multiple)
{
    ck_assert_uint_ge(tag, 1);
    ck_assert_uint_le(tag, (uint64_t)m->n);
    ck_assert_msg(m->outstanding[tag], "ack of unknown delivery tag %llu",
                  (unsigned long long)tag);
    m->frames++;
    if (!multiple) {
        ck_assert_int_eq(m->worker[tag], W_ACKED);
        m->outstanding[tag] = 0;
        return;
    }
    for (uint64_t t = (uint64_t)m->lo; t <= tag; t++)
        if (m->outstanding[t]) {
            ck_assert_msg(m->worker[t] == W_ACKED,
                          "multiple ack %llu covers open tag %llu",
                          (unsigned long long)tag, (unsigned long long)t);
            m->outstanding[t] = 0;
        }
    while (m->lo <= m->n && !m->outstanding[m->lo] && m->worker[m->lo] != W_OPEN)
        m->lo++;
}

static void model_flush(struct model *m, struct ack_batch *a)
{
    uint64_t upto;
    const uint64_t *singles;
    size_t n = ack_batch_flush(a, &upto, &singles);
    if (upto)
        model_ack(m, upto, 1);
    for (size_t i = 0; i < n; i++)
        model_ack(m, singles[i], 0);
    ck_assert_uint_eq(ack_batch_npending(a), 0);
}

static void deliver(struct model *m, struct ack_batch *a, uint64_t tag, int want)
{
    m->outstanding[tag] = 1;
    ck_assert_int_eq(ack_batch_received(a, tag), want);
}

static void do_ack(struct model *m, struct ack_batch *a, uint64_t tag)
{
    int rc;
    m->worker[tag] = W_ACKED;
    rc = ack_batch_ack(a, tag);
    ck_assert_int_ge(rc, 0);
    if (rc == 1)
        model_ack(m, tag, 0);
}

static void do_reject(struct model *m, struct ack_batch *a, uint64_t tag)
{
    int rc = ack_batch_reject(a, tag);
    ck_assert(rc == 0 || rc == 1); /* untracked ones are rejected all the same */
    m->worker[tag] = W_REJECTED;
    ck_assert_msg(m->outstanding[tag], "reject of unknown delivery tag");
    m->outstanding[tag] = 0;
}

/* Every acked delivery has reached the broker; open ones are still held. */
static void model_check_done(struct model *m)
{
    for (int t = 1; t <= m->n; t++) {
        if (m->worker[t] == W_OPEN)
            continue;
        ck_assert_msg(!m->outstanding[t], "tag %d acked but never sent", t);
    }
}

/* ------------------------------------------------------------ vectors */

START_TEST(test_contiguous_is_one_frame)
{
    struct ack_batch a;
    uint64_t upto;
    const uint64_t *s;
    ack_batch_init(&a);
    for (uint64_t t = 1; t <= 5; t++)
        ck_assert_int_eq(ack_batch_received(&a, t), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 2), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 3), 0);
    ck_assert_uint_eq(ack_batch_npending(&a), 3);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 3);
    /* nothing pending: nothing to send */
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 0);
    ack_batch_release(&a);
}
END_TEST

START_TEST(test_gap_sends_singles)
{
    struct ack_batch a;
    uint64_t upto;
    const uint64_t *s;
    size_t n;
    ack_batch_init(&a);
    for (uint64_t t = 1; t <= 5; t++)
        ck_assert_int_eq(ack_batch_received(&a, t), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 2), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 5), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 3), 0);
    n = ack_batch_flush(&a, &upto, &s);
    ck_assert_uint_eq(upto, 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(s[0], 2);
    ck_assert_uint_eq(s[1], 5);
    ck_assert_uint_eq(s[2], 3);
    /* the gap closes: 1 alone (2, 3 were sent), then 4 alone */
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 1);
    ck_assert_int_eq(ack_batch_ack(&a, 4), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 4);
    ack_batch_release(&a);
}
END_TEST

START_TEST(test_reject_is_not_a_gap)
{
    struct ack_batch a;
    uint64_t upto;
    const uint64_t *s;
    ack_batch_init(&a);
    for (uint64_t t = 1; t <= 4; t++)
        ck_assert_int_eq(ack_batch_received(&a, t), 0);
    ck_assert_int_eq(ack_batch_reject(&a, 2), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 3), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 3);
    /* a rejected tag at the top is never a multiple ack's tag */
    ck_assert_int_eq(ack_batch_reject(&a, 4), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 0);
    ack_batch_release(&a);
}
END_TEST

START_TEST(test_double_and_untracked)
{
    struct ack_batch a;
    uint64_t upto;
    const uint64_t *s;
    ack_batch_init(&a);
    /* nothing received yet: untracked, the caller sends it */
    ck_assert_int_eq(ack_batch_ack(&a, 1), 1);
    ck_assert_int_eq(ack_batch_reject(&a, 1), 1);
    ck_assert_int_eq(ack_batch_received(&a, 1), 0);
    ck_assert_int_eq(ack_batch_received(&a, 2), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), CR_EINVAL);
    ck_assert_int_eq(ack_batch_reject(&a, 1), CR_EINVAL);
    ck_assert_int_eq(ack_batch_ack(&a, 3), 1);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 1);
    /* settled and passed: still a double settle */
    ck_assert_int_eq(ack_batch_ack(&a, 1), CR_EINVAL);
    ack_batch_release(&a);
}
END_TEST

START_TEST(test_clear_drops_pending)
{
    struct ack_batch a;
    uint64_t upto;
    const uint64_t *s;
    ack_batch_init(&a);
    for (uint64_t t = 1; t <= 3; t++)
        ck_assert_int_eq(ack_batch_received(&a, t), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 3), 0);
    ack_batch_clear(&a); /* a new connection: tags start again */
    ck_assert_uint_eq(ack_batch_npending(&a), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 0);
    ck_assert_int_eq(ack_batch_received(&a, 1), 0);
    ck_assert_int_eq(ack_batch_ack(&a, 1), 0);
    ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
    ck_assert_uint_eq(upto, 1);
    ack_batch_release(&a);
}
END_TEST

START_TEST(test_out_of_sequence)
{
    struct model m;
    struct ack_batch a;
    model_init(&m, 10);
    ack_batch_init(&a);
    deliver(&m, &a, 1, 0);
    deliver(&m, &a, 2, 0);
    deliver(&m, &a, 4, CR_EPROTO); /* 3 never came */
    deliver(&m, &a, 5, 1);
    do_ack(&m, &a, 5); /* untracked: sent at once */
    ck_assert(!m.outstanding[5]);
    do_ack(&m, &a, 2);
    do_ack(&m, &a, 4);
    model_flush(&m, &a);
    do_ack(&m, &a, 1);
    model_flush(&m, &a);
    model_check_done(&m);
    ack_batch_clear(&a);
    ck_assert_int_eq(ack_batch_received(&a, 1), 0); /* tracked again */
    ack_batch_release(&a);
    model_free(&m);
}
END_TEST

/* A delivery held across many later ones (an eta task) leaves the ring for
 * late[], so memory does not grow with the deliveries that pass it. */
START_TEST(test_held_delivery_bounded)
{
    struct model m;
    struct ack_batch a;
    const int n = 5000;
    model_init(&m, n);
    ack_batch_init(&a);
    a.window_max = 64;
    for (int t = 1; t <= n; t++) {
        deliver(&m, &a, (uint64_t)t, 0);
        if (t > 1 && t != 100)
            do_ack(&m, &a, (uint64_t)t);
        if (t % 7 == 0)
            model_flush(&m, &a);
        ck_assert_uint_le(a.cap, 64);
        ck_assert_uint_le(a.nlate, 2);
    }
    model_flush(&m, &a);
    do_ack(&m, &a, 100);
    model_flush(&m, &a);
    do_ack(&m, &a, 1);
    model_flush(&m, &a);
    model_check_done(&m);
    ck_assert_uint_eq(a.nlate, 0);
    /* all settled: the next acks batch again */
    for (int t = n + 1; t <= n + 10; t++)
        ck_assert_int_eq(ack_batch_received(&a, (uint64_t)t), 0);
    for (int t = n + 1; t <= n + 10; t++)
        ck_assert_int_eq(ack_batch_ack(&a, (uint64_t)t), 0);
    {
        uint64_t upto;
        const uint64_t *s;
        ck_assert_uint_eq(ack_batch_flush(&a, &upto, &s), 0);
        ck_assert_uint_eq(upto, (uint64_t)n + 10);
    }
    ack_batch_release(&a);
    model_free(&m);
}
END_TEST

/* Random deliveries, acks, rejects and flushes, some deliveries held long,
 * against the broker model; loop index = seed and ring cap. */
START_TEST(test_random_against_model)
{
    struct model m;
    struct ack_batch a;
    const int n = 20000;
    int next = 1, open = 0;
    int *openv = malloc(sizeof(int) * (size_t)n);
    long frames_acked = 0;
    srand((unsigned)_i + 1);
    model_init(&m, n);
    ack_batch_init(&a);
    a.window_max = _i % 2 ? 64 : 1024;
    while (next <= n || open > 0) {
        int r = rand() % 100;
        if (next <= n && (r < 45 || open == 0)) {
            deliver(&m, &a, (uint64_t)next, 0);
            openv[open++] = next++;
        } else if (r < 90 && open > 0) {
            /* settle a random open delivery, or mostly an old one when
             * prefetch-like pressure says so */
            int k = rand() % 4 ? rand() % open : 0;
            int t = openv[k];
            /* the first few hundred of every thousand are held until the end */
            if (t % 1000 < 3 && next <= n)
                continue;
            openv[k] = openv[--open];
            if (rand() % 10 == 0)
                do_reject(&m, &a, (uint64_t)t);
            else {
                do_ack(&m, &a, (uint64_t)t);
                frames_acked++;
            }
        } else {
            model_flush(&m, &a);
        }
        ck_assert_uint_le(a.cap, a.window_max);
    }
    model_flush(&m, &a);
    model_check_done(&m);
    /* the point of it all: far fewer frames than acks */
    ck_assert_int_lt(m.frames, frames_acked);
    ack_batch_release(&a);
    model_free(&m);
    free(openv);
}
END_TEST

/* Every allocation failure still gives a correct frame sequence. */
START_TEST(test_oom_sweep)
{
    long k;
    for (k = 1; k < 200; k++) {
        struct model m;
        struct ack_batch a;
        const int n = 600;
        int failed;
        model_init(&m, n);
        ack_batch_init(&a);
        a.window_max = 64;
        cr_alloc_fail_after(k);
        for (int t = 1; t <= n; t++) {
            int rc;
            m.outstanding[t] = 1;
            rc = ack_batch_received(&a, (uint64_t)t);
            ck_assert(rc == 0 || rc == 1 || rc == CR_ENOMEM);
            /* 1 and 2 held; the rest acked two behind */
            if (t > 4)
                do_ack(&m, &a, (uint64_t)t - 2);
            if (t % 5 == 0)
                model_flush(&m, &a);
        }
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        do_ack(&m, &a, 1);
        do_ack(&m, &a, 2);
        do_ack(&m, &a, (uint64_t)n - 1);
        do_ack(&m, &a, (uint64_t)n);
        model_flush(&m, &a);
        model_check_done(&m);
        ack_batch_release(&a);
        model_free(&m);
        if (!failed)
            break;
    }
    ck_assert_int_lt(k, 200);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("ack_batch");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_contiguous_is_one_frame);
    tcase_add_test(tc, test_gap_sends_singles);
    tcase_add_test(tc, test_reject_is_not_a_gap);
    tcase_add_test(tc, test_double_and_untracked);
    tcase_add_test(tc, test_clear_drops_pending);
    tcase_add_test(tc, test_out_of_sequence);
    tcase_add_test(tc, test_held_delivery_bounded);
    tcase_add_loop_test(tc, test_random_against_model, 0, 6);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
