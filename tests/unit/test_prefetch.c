/* test_prefetch.c -- engine_prefetch_count(): the basic.qos window, bounded. */
#include <check.h>
#include <limits.h>

#include "engine/engine.h"

struct vec {
    int concurrency, multiplier;
    size_t neta;
    int want;
};

static const struct vec vecs[] = {
    {100, 4, 0, 400},
    {100, 4, 7, 407},
    {1, 1, 0, 1},
    {16383, 4, 3, 65535},
    {16383, 4, 4, 65535},
    {ENGINE_MAX_CONCURRENCY, 1000, 0, 65535},
    /* what repeated pool_grows used to reach: 2^29 x 4 overflowed an int */
    {1 << 29, 4, 0, 65535},
    {INT_MAX, INT_MAX, (size_t)-1, 65535},
    /* never 0, which means "no limit" to the broker */
    {0, 4, 0, 1},
    {-5, 4, 0, 1},
    {100, 0, 0, 1},
    {0, 0, 100000, 65535},
};

START_TEST(test_prefetch_vectors)
{
    const struct vec *v = &vecs[_i];
    ck_assert_int_eq(engine_prefetch_count(v->concurrency, v->multiplier, v->neta),
                     v->want);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("prefetch");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_prefetch_vectors, 0, sizeof(vecs) / sizeof(vecs[0]));
    suite_add_tcase(s, tc);
    return s;
}
