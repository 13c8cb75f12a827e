/* test_rmq_caps.c -- RabbitMQ versions from server-properties, and which of
 * them may deny global QoS (and so are asked). */
#include <check.h>
#include <string.h>

#include "protocol/rmq_caps.h"
#include "util/err.h"

static const struct {
    const char *v;
    int major, minor, deniable;
} good[] = {
    {"3.10.8", 3, 10, 0}, {"3.13.7", 3, 13, 0}, {"4.0.5", 4, 0, 1},
    {"4.2.9", 4, 2, 1},   {"4.3.0", 4, 3, 1},   {"4.3.0-rc.1", 4, 3, 1},
    {"4.10.2", 4, 10, 1}, {"5.0.0", 5, 0, 1},   {"4.3", 4, 3, 1},
    {"0.0.0", 0, 0, 0},   {"3.99", 3, 99, 0},   {"9999.9999", 9999, 9999, 1},
};

START_TEST(versions)
{
    int a = -1, b = -1;
    const char *v = good[_i].v;
    ck_assert_int_eq(rmq_version_parse(v, strlen(v), &a, &b), 0);
    ck_assert_int_eq(a, good[_i].major);
    ck_assert_int_eq(b, good[_i].minor);
    ck_assert_int_eq(rmq_global_qos_deniable(v, strlen(v)), good[_i].deniable);
}
END_TEST

/* Every cut of a version: a prefix that stops before the minor's first digit
 * is refused, one that stops inside it reads what it holds, and no cut reads
 * past its length (the buffer is not terminated where it is cut). */
START_TEST(every_cut)
{
    const char *v = "4.31.0";
    char buf[16];
    for (size_t n = 0; n <= strlen(v); n++) {
        int a = -1, b = -1;
        memset(buf, '7', sizeof(buf));
        memcpy(buf, v, n);
        int rc = rmq_version_parse(buf, n, &a, &b);
        if (n < 3) {
            ck_assert_int_eq(rc, CR_EINVAL);
            ck_assert_int_eq(rmq_global_qos_deniable(buf, n), 1);
        } else {
            ck_assert_int_eq(rc, 0);
            ck_assert_int_eq(a, 4);
            ck_assert_int_eq(b, n == 3 ? 3 : 31);
        }
    }
}
END_TEST

START_TEST(malformed)
{
    static const char *bad[] = {"",        ".",       "4",   "4.",   ".3",
                                "v4.3.0",  " 4.3",    "4-3", "4..3", "x.y",
                                "12345.1", "4.12345", "-4.3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int a = -1, b = -1;
        ck_assert_msg(rmq_version_parse(bad[i], strlen(bad[i]), &a, &b) == CR_EINVAL,
                      "%s", bad[i]);
        ck_assert_int_eq(a, -1);
        /* an unknown broker is asked, not assumed */
        ck_assert_int_eq(rmq_global_qos_deniable(bad[i], strlen(bad[i])), 1);
    }
    ck_assert_int_eq(rmq_global_qos_deniable(NULL, 0), 1);
}
END_TEST

/* x-consumer-timeout: RabbitMQ 3.12 and later; an unknown broker gets none. */
START_TEST(consumer_timeout_arg)
{
    static const struct {
        const char *v;
        int yes;
    } cases[] = {{"3.10.8", 0}, {"3.11.28", 0}, {"3.12.0", 1}, {"3.13.7", 1},
                 {"4.0.5", 1},  {"4.3.0", 1},   {"10.0", 1},   {"", 0},
                 {"x.y", 0},    {"3", 0},       {"2.99.1", 0}, {"3.12", 1}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(rmq_consumer_timeout_arg(cases[i].v, strlen(cases[i].v)) ==
                          cases[i].yes,
                      "%s", cases[i].v);
    ck_assert_int_eq(rmq_consumer_timeout_arg(NULL, 0), 0);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rmq_caps");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, versions, 0, (int)(sizeof(good) / sizeof(good[0])));
    tcase_add_test(tc, every_cut);
    tcase_add_test(tc, malformed);
    tcase_add_test(tc, consumer_timeout_arg);
    suite_add_tcase(s, tc);
    return s;
}
