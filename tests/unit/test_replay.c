/* test_replay.c -- the ring of recent confirmed writes: order, age, count
 * and byte bounds, ownership on every path, and a failed ring allocation. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/replay.h"

static char *dup(const char *s)
{
    char *p = cr_strdup(s);
    ck_assert_ptr_nonnull(p);
    return p;
}

START_TEST(test_order_and_age)
{
    struct replay r;
    struct replay_entry e;
    replay_init(&r, 8, 0, 10000);
    replay_put(&r, dup("a"), NULL, 0, 1, 1000, 1000);
    replay_put(&r, dup("b"), dup("vb"), 2, 2, 5000, 5000);
    replay_put(&r, dup("c"), NULL, 0, 3, 9000, 9000);
    /* already too old when put: freed at once */
    replay_put(&r, dup("old"), NULL, 0, 0, 1000, 20000);
    /* the put at 20000 dropped a, b and c, all older than 10 s then */
    ck_assert_int_eq(replay_count(&r), 0);
    replay_release(&r);

    replay_init(&r, 8, 0, 10000);
    replay_put(&r, dup("a"), NULL, 0, 1, 1000, 1000);
    replay_put(&r, dup("b"), dup("vb"), 2, 2, 5000, 5000);
    replay_put(&r, dup("c"), NULL, 0, 3, 9000, 9000);
    /* at 12000 "a" is 11 s old: skipped; then b and c, oldest first */
    ck_assert_int_eq(replay_take(&r, 12000, &e), 1);
    ck_assert_str_eq(e.key, "b");
    ck_assert_str_eq(e.value, "vb");
    ck_assert_int_eq(e.aux, 2);
    ck_assert_uint_eq(e.at, 5000);
    cr_free(e.key);
    cr_free(e.value);
    ck_assert_int_eq(replay_take(&r, 12000, &e), 1);
    ck_assert_str_eq(e.key, "c");
    ck_assert_ptr_null(e.value);
    cr_free(e.key);
    ck_assert_int_eq(replay_take(&r, 12000, &e), 0);
    ck_assert_int_eq(replay_count(&r), 0);
    /* a time in the future is young */
    replay_put(&r, dup("d"), NULL, 0, 0, 50000, 40000);
    ck_assert_int_eq(replay_take(&r, 40000, &e), 1);
    cr_free(e.key);
    replay_release(&r);
}
END_TEST

START_TEST(test_bounds)
{
    struct replay r;
    struct replay_entry e;
    char k[16];
    /* by count: the oldest go */
    replay_init(&r, 4, 0, 10000);
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        replay_put(&r, dup(k), NULL, 0, i, 100, 100);
    }
    ck_assert_int_eq(replay_count(&r), 4);
    ck_assert_int_eq(replay_take(&r, 100, &e), 1);
    ck_assert_str_eq(e.key, "k6");
    cr_free(e.key);
    replay_release(&r);
    /* by bytes: "k0"+"xxxx" is 6 bytes; 13 hold two; one over 13 is not kept */
    replay_init(&r, 100, 13, 10000);
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        replay_put(&r, dup(k), dup("xxxx"), 4, 0, 100, 100);
    }
    ck_assert_int_eq(replay_count(&r), 2);
    replay_put(&r, dup("big"), dup("0123456789abc"), 13, 0, 100, 100);
    ck_assert_int_eq(replay_count(&r), 2);
    ck_assert_int_eq(replay_take(&r, 100, &e), 1);
    ck_assert_str_eq(e.key, "k1");
    cr_free(e.key);
    cr_free(e.value);
    replay_release(&r);
    /* released and used again */
    replay_put(&r, dup("again"), NULL, 0, 0, 100, 100);
    ck_assert_int_eq(replay_count(&r), 1);
    replay_release(&r);
}
END_TEST

/* Every allocation failing in turn: nothing leaks (the ASan run checks), a
 * failed ring allocation loses only the entry, and the clean pass keeps it. */
START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1; n < 100; n++) {
        struct replay r;
        struct replay_entry e;
        char *k = cr_strdup("key"), *v;
        long failed;
        int kept;
        ck_assert_ptr_nonnull(k);
        v = cr_strdup("value");
        ck_assert_ptr_nonnull(v);
        replay_init(&r, 16, 0, 1000);
        cr_alloc_fail_after(n);
        replay_put(&r, k, v, 5, 0, 10, 10);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        kept = replay_take(&r, 10, &e);
        if (kept) {
            cr_free(e.key);
            cr_free(e.value);
        }
        replay_release(&r);
        if (!failed) {
            ck_assert_int_eq(kept, 1);
            break;
        }
        ck_assert_int_eq(kept, 0);
    }
    ck_assert_int_gt(n, 1);
    ck_assert_int_lt(n, 100);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_order_and_age);
    tcase_add_test(tc, test_bounds);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
