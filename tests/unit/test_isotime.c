/* test_isotime.c -- ISO-8601 parse/format against values computed by Python. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/isotime.h"
#include "util/alloc.h"
#include "util/err.h"

/* Expected epochs from Python: datetime.fromisoformat(s) - epoch, in us. */
static const struct {
    const char *text;
    int64_t us;
} good[] = {
    {"2026-11-30T02:46:24.831674+00:00", INT64_C(1796006784831674)},
    {"2030-01-02T03:04:05.678901+00:00", INT64_C(1893553445678901)},
    {"2030-01-02T03:04:05.678901Z", INT64_C(1893553445678901)},
    {"2030-01-02T03:04:05.678901", INT64_C(1893553445678901)},
    {"2030-01-02 03:04:05.678901", INT64_C(1893553445678901)},
    {"2030-01-02T03:04:05.6789019999", INT64_C(1893553445678901)},
    {"2030-01-02T03:04:05,678901", INT64_C(1893553445678901)},
    {"2030-01-02T03:04:05.5", INT64_C(1893553445500000)},
    {"2030-01-02T03:04", INT64_C(1893553440000000)},
    {"2030-01-02T03:04Z", INT64_C(1893553440000000)},
    {"1970-01-01T00:00:00+00:00", 0},
    {"1970-01-01T00:00:00", 0},
    {"1969-12-31T23:59:59.999999+00:00", -1},
    {"2000-02-29T12:00:00+00:00", INT64_C(951825600000000)},
    {"0001-01-01T00:00:00+00:00", INT64_C(-62135596800000000)},
    {"9999-12-31T23:59:59.999999+00:00", INT64_C(253402300799999999)},
    {"2024-02-29T23:59:59+00:00", INT64_C(1709251199000000)},
    {"1900-03-01T00:00:00+00:00", INT64_C(-2203891200000000)},
    {"2030-06-07T08:09:10-05:30", INT64_C(1907069950000000)},
    {"2030-06-07T08:09:10-0530", INT64_C(1907069950000000)},
    {"2030-06-07T08:09:10+14:00", INT64_C(1906999750000000)},
    {"2030-06-07T08:09:10+14", INT64_C(1906999750000000)},
};

static const char *const bad[] = {
    "",
    "2030",
    "2030-01-02",
    "2030-01-02T",
    "2030-01-02T03",
    "2030-01-02T03:",
    "2030-01-02X03:04:05",
    "30-01-02T03:04:05",
    "2030-1-02T03:04:05",
    "2030-13-01T00:00:00",
    "2030-00-01T00:00:00",
    "2030-02-29T00:00:00",
    "1900-02-29T00:00:00",
    "2030-04-31T00:00:00",
    "2030-01-00T00:00:00",
    "2030-01-01T24:00:00",
    "2030-01-01T23:60:00",
    "2030-01-01T23:59:60",
    "2030-01-01T00:00:00.",
    "2030-01-01T00:00:00.x",
    "2030-01-01T00:00:00+",
    "2030-01-01T00:00:00+1",
    "2030-01-01T00:00:00+24:00",
    "2030-01-01T00:00:00+01:60",
    "2030-01-01T00:00:00+01:",
    "2030-01-01T00:00:00Z ",
    "2030-01-01T00:00:00 ",
    "2030-01-01T00:00:00z",
    "0000-01-01T00:00:00",
    "2030-01-01T00:00:00+00:00trailing",
    "2030-01-01T0a:00:00",
    "-030-01-01T00:00:00",
};

START_TEST(test_parse_good)
{
    int64_t us = 12345;
    ck_assert_int_eq(iso8601_parse(good[_i].text, &us), 0);
    ck_assert_msg(us == good[_i].us, "%s: got %lld want %lld", good[_i].text,
                  (long long)us, (long long)good[_i].us);
}
END_TEST

START_TEST(test_parse_bad)
{
    int64_t us = 777;
    ck_assert_int_eq(iso8601_parse(bad[_i], &us), CR_EINVAL);
    ck_assert_int_eq(us, 777);
}
END_TEST

START_TEST(test_parse_null)
{
    int64_t us;
    ck_assert_int_eq(iso8601_parse(NULL, &us), CR_EINVAL);
    ck_assert_int_eq(iso8601_parse("2030-01-01T00:00:00", NULL), CR_EINVAL);
}
END_TEST

/* Python: datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat() */
static const struct {
    int64_t us;
    const char *text;
} fmt[] = {
    {0, "1970-01-01T00:00:00+00:00"},
    {-1, "1969-12-31T23:59:59.999999+00:00"},
    {INT64_C(1796006784831674), "2026-11-30T02:46:24.831674+00:00"},
    {INT64_C(1796006784000000), "2026-11-30T02:46:24+00:00"},
    {INT64_C(1796006784000001), "2026-11-30T02:46:24.000001+00:00"},
    {INT64_C(951825600000000), "2000-02-29T12:00:00+00:00"},
    {INT64_C(-62135596800000000), "0001-01-01T00:00:00+00:00"},
    {INT64_C(253402300799999999), "9999-12-31T23:59:59.999999+00:00"},
    {INT64_C(-2203891200000000), "1900-03-01T00:00:00+00:00"},
};

START_TEST(test_format)
{
    char out[40];
    memset(out, 'x', sizeof(out));
    iso8601_format(fmt[_i].us, out);
    ck_assert_str_eq(out, fmt[_i].text);
}
END_TEST

START_TEST(test_format_extremes)
{
    char out[40];
    int64_t us;
    iso8601_format(INT64_MAX, out);
    ck_assert(strlen(out) < 40);
    iso8601_format(INT64_MIN, out);
    ck_assert(strlen(out) < 40);
    iso8601_format(INT64_C(253402300800000000), out); /* year 10000 */
    ck_assert_str_eq(out, "10000-01-01T00:00:00+00:00");
    ck_assert_int_eq(iso8601_parse("10000-01-01T00:00:00", &us), CR_EINVAL);
}
END_TEST

/* Every day from 1600 to 2400 at a varying time of day: format then parse. */
START_TEST(test_round_trip_days)
{
    int64_t start = INT64_C(-11676096000) * 1000000; /* 1600-01-01 */
    for (int64_t day = 0; day < 292200; day += 1) {
        int64_t us = start + day * INT64_C(86400000000) + (day * 7919 % 86400) * 1000000 +
                     (day % 3 ? day % 1000000 : 0);
        int64_t back = 0;
        char out[40];
        iso8601_format(us, out);
        ck_assert_msg(iso8601_parse(out, &back) == 0, "%s", out);
        ck_assert_msg(back == us, "%s", out);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("isotime");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_parse_good, 0, sizeof(good) / sizeof(good[0]));
    tcase_add_loop_test(tc, test_parse_bad, 0, sizeof(bad) / sizeof(bad[0]));
    tcase_add_test(tc, test_parse_null);
    tcase_add_loop_test(tc, test_format, 0, sizeof(fmt) / sizeof(fmt[0]));
    tcase_add_test(tc, test_format_extremes);
    tcase_add_test(tc, test_round_trip_days);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}
