/* test_util.c -- buf, err and alloc. */
#include <check.h>
#include <string.h>

#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

START_TEST(test_buf_grow)
{
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(buf_printf(&b, "%d,", i), 0);
    ck_assert(strncmp(b.data, "0,1,2,", 6) == 0);
    buf_consume(&b, 2);
    ck_assert(strncmp(b.data, "1,2,", 4) == 0);
    buf_release(&b);
}
END_TEST

START_TEST(test_buf_limit)
{
    struct buf b;
    buf_init(&b);
    b.max_bytes = 4;
    ck_assert_int_eq(buf_puts(&b, "abcd"), 0);
    ck_assert_int_eq(buf_puts(&b, "e"), CR_ETOOBIG);
    ck_assert_str_eq(b.data, "abcd");
    buf_release(&b);
}
END_TEST

START_TEST(test_buf_oom)
{
    struct buf b;
    buf_init(&b);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(buf_puts(&b, "x"), CR_ENOMEM);
    ck_assert_int_eq(cr_alloc_failed(), 1);
    ck_assert_int_eq(buf_puts(&b, "x"), 0);
    buf_release(&b);
}
END_TEST

START_TEST(test_err)
{
    struct cr_err e;
    ck_assert_int_eq(cr_err_set(&e, CR_EPROTO, "bad id '%s'", "x"), CR_EPROTO);
    ck_assert_str_eq(e.msg, "bad id 'x'");
    ck_assert_str_eq(cr_strerror(CR_ENOMEM), "out of memory");
    ck_assert_int_eq(cr_err_set(NULL, CR_EIO, "x"), CR_EIO);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("core");
    SRunner *sr;
    int failed;
    cr_alloc_init();
    tcase_add_test(tc, test_buf_grow);
    tcase_add_test(tc, test_buf_limit);
    tcase_add_test(tc, test_buf_oom);
    tcase_add_test(tc, test_err);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
