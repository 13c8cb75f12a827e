/* test_progress.c -- the progress batcher: when text goes to the stream and the
 * PROGRESS meta, with a fake clock; malformed use and an OOM sweep. And the
 * stream's names (protocol/progress.h). */
#include <check.h>
#include <string.h>

#include "protocol/progress.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"
#include "worker/progress.h"

static const struct progress_policy both = {1, 1, 100, 16, 500};

/* One step: at `now`, add `text` (NULL: just ask), then expect `due` and
 * `wait` (ms until due, -1 nothing pending); `took` marks writes done. */
struct step {
    int64_t now;
    const char *text;
    int due;
    int64_t wait;
    int took; /* PROGRESS_DUE_* mask written after the check */
};

struct vec {
    const char *name;
    struct progress_policy pol;
    struct step steps[12];
};

#define S PROGRESS_DUE_STREAM
#define M PROGRESS_DUE_META
static const struct vec vecs[] = {
    {"nothing pending",
     {1, 1, 100, 16, 500},
     {{0, NULL, 0, -1, 0}, {1000, NULL, 0, -1, 0}}},
    {"time window",
     {1, 1, 100, 16, 500},
     {{0, "a", 0, 100, 0},
      {50, "b", 0, 50, 0},
      {99, NULL, 0, 1, 0},
      {100, NULL, S | M, 0, S | M},
      {150, "c", 0, 100, 0},
      {250, NULL, S, 0, S},
      {600, NULL, M, 0, M},
      {600, NULL, 0, -1, 0}}},
    {"size forces a write at once",
     {1, 1, 100, 16, 500},
     {{0, "0123456789", 0, 100, 0}, {1, "abcdef", S, 0, S}, {2, NULL, 0, 98, 0}}},
    {"meta is throttled harder than the stream",
     {1, 1, 100, 1000, 500},
     {{0, "a", 0, 100, 0},
      {100, NULL, S | M, 0, S | M},
      {200, "b", 0, 100, 0},
      {300, NULL, S, 0, S},
      {400, "c", 0, 100, 0},
      {500, NULL, S, 0, S},
      {599, NULL, 0, 1, 0},
      {600, NULL, M, 0, M}}},
    {"meta only (--progress meta)",
     {0, 1, 100, 16, 500},
     {{0, "0123456789abcdefghij", 0, 100, 0},
      {100, NULL, M, 0, M},
      {200, "x", 0, 400, 0}}},
    {"stream only",
     {1, 0, 100, 16, 500},
     {{0, "x", 0, 100, 0}, {100, NULL, S, 0, S}, {5000, NULL, 0, -1, 0}}},
    {"empty deltas count tokens but write no text",
     {1, 1, 100, 16, 500},
     {{0, "", 0, 100, 0}, {100, NULL, M, 0, M}, {200, NULL, 0, -1, 0}}},
    {"a late tick writes once",
     {1, 1, 100, 16, 500},
     {{0, "a", 0, 100, 0}, {10000, NULL, S | M, 0, S | M}, {10001, NULL, 0, -1, 0}}},
};
#undef S
#undef M

START_TEST(test_vectors)
{
    const struct vec *v = &vecs[_i];
    struct progress_batch b;
    long tokens = 0;
    progress_batch_init(&b);
    for (int i = 0; i < 12 && (i == 0 || v->steps[i].now); i++) {
        const struct step *s = &v->steps[i];
        if (s->text) {
            ck_assert_int_eq(progress_batch_add(&b, s->text, strlen(s->text), s->now), 0);
            tokens++;
        }
        ck_assert_msg(progress_batch_due(&b, &v->pol, s->now) == s->due,
                      "%s step %d: due %d, want %d", v->name, i,
                      progress_batch_due(&b, &v->pol, s->now), s->due);
        ck_assert_msg(progress_batch_wait_ms(&b, &v->pol, s->now) == s->wait,
                      "%s step %d: wait %lld, want %lld", v->name, i,
                      (long long)progress_batch_wait_ms(&b, &v->pol, s->now),
                      (long long)s->wait);
        if (s->took & PROGRESS_DUE_STREAM)
            progress_batch_took_stream(&b);
        if (s->took & PROGRESS_DUE_META)
            progress_batch_took_meta(&b, s->now);
    }
    ck_assert_int_eq(b.tokens, tokens);
    progress_batch_release(&b);
}
END_TEST

START_TEST(test_text_is_kept_in_order_across_writes)
{
    struct progress_batch b;
    char all[64] = "";
    progress_batch_init(&b);
    for (int i = 0; i < 26; i++) {
        char c = (char)('a' + i);
        ck_assert_int_eq(progress_batch_add(&b, &c, 1, i * 30), 0);
        if (progress_batch_due(&b, &both, i * 30) & PROGRESS_DUE_STREAM) {
            strncat(all, b.text.data, b.text.len);
            progress_batch_took_stream(&b);
        }
    }
    strncat(all, b.text.data ? b.text.data : "", b.text.len);
    ck_assert_str_eq(all, "abcdefghijklmnopqrstuvwxyz");
    ck_assert_int_eq(b.tokens, 26);
    progress_batch_release(&b);
    /* release leaves a usable, empty batch */
    ck_assert_int_eq(b.text.len, 0);
    ck_assert_int_eq(progress_batch_wait_ms(&b, &both, 0), -1);
    progress_batch_release(&b);
}
END_TEST

START_TEST(test_clock_going_backwards)
{
    struct progress_batch b;
    progress_batch_init(&b);
    ck_assert_int_eq(progress_batch_add(&b, "x", 1, 1000), 0);
    /* an earlier now never makes anything due early, nor a negative wait */
    ck_assert_int_eq(progress_batch_due(&b, &both, 500), 0);
    ck_assert_int_eq(progress_batch_wait_ms(&b, &both, 500), 600);
    progress_batch_release(&b);
}
END_TEST

/* Every allocation failure leaves the batch as it was and reports CR_ENOMEM. */
START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1; n < 100; n++) {
        struct progress_batch b;
        int rc = 0, failed;
        progress_batch_init(&b);
        cr_alloc_fail_after(n);
        for (int i = 0; i < 50 && rc == 0; i++)
            rc = progress_batch_add(&b, "0123456789abcdef0123456789abcdef", 32, i);
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        if (!failed) {
            ck_assert_int_eq(rc, 0);
            ck_assert_int_eq(b.text.len, 50 * 32);
            progress_batch_release(&b);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_int_eq(b.text.len % 32, 0);
        ck_assert_int_eq((long)b.text.len / 32, b.tokens);
        progress_batch_release(&b);
    }
    ck_assert_int_lt(n, 100);
}
END_TEST

/* The names the writer and the gateway share. */
START_TEST(test_write_budget)
{
    /* Up to the budget the configured interval holds; past it, the interval
     * grows so that ntasks / interval stays at PROGRESS_WRITES_PER_S. */
    ck_assert_int_eq(progress_budget_interval_ms(100, 0), 100);
    ck_assert_int_eq(progress_budget_interval_ms(100, -3), 100);
    ck_assert_int_eq(progress_budget_interval_ms(100, 1), 100);
    ck_assert_int_eq(progress_budget_interval_ms(100, PROGRESS_WRITES_PER_S / 10), 100);
    ck_assert_int_eq(progress_budget_interval_ms(100, PROGRESS_WRITES_PER_S / 5), 200);
    ck_assert_int_eq(progress_budget_interval_ms(100, PROGRESS_WRITES_PER_S * 2), 2000);
    ck_assert_int_eq(progress_budget_interval_ms(5000, PROGRESS_WRITES_PER_S * 2), 5000);
    ck_assert_int_eq(progress_budget_interval_ms(1, 2147483647L),
                     (int64_t)2147483647L * 1000 / PROGRESS_WRITES_PER_S);
}
END_TEST

START_TEST(test_wire_names)
{
    struct buf b;
    char start[24];
    buf_init(&b);
    ck_assert_int_eq(progress_key(&b, "7d2c-1"), 0);
    ck_assert_str_eq(b.data, "celeriac:progress:7d2c-1");
    buf_release(&b);
    buf_init(&b);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(progress_key(&b, "x"), CR_ENOMEM);
    cr_alloc_fail_after(0);
    buf_release(&b);

    ck_assert_int_eq(progress_range_after(start, sizeof(start), 0), 0);
    ck_assert_str_eq(start, "(0-0");
    ck_assert_int_eq(progress_range_after(start, sizeof(start), 42), 0);
    ck_assert_str_eq(start, "(0-42");
    ck_assert_int_eq(progress_range_after(start, sizeof(start), INT64_MAX), 0);
    ck_assert_str_eq(start, "(0-9223372036854775807");
    ck_assert_int_eq(progress_range_after(start, 6, 42), 0);
    ck_assert_int_eq(progress_range_after(start, 6, 420), CR_ERANGE);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("progress");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_vectors, 0, (int)(sizeof(vecs) / sizeof(vecs[0])));
    tcase_add_test(tc, test_text_is_kept_in_order_across_writes);
    tcase_add_test(tc, test_clock_going_backwards);
    tcase_add_test(tc, test_oom_sweep);
    tcase_add_test(tc, test_write_budget);
    tcase_add_test(tc, test_wire_names);
    suite_add_tcase(s, tc);
    return s;
}
