/* test_esc.c -- util/esc: control characters made visible for logs and terminals. */
#include <check.h>
#include <string.h>

#include "util/esc.h"

struct vec {
    const char *in;
    const char *out;
    unsigned flags;
};

static const struct vec vecs[] = {
    {"plain text, kept", "plain text, kept", 0},
    {"id\n[2026-01-01 00:00:00,000: ERROR/MainProcess] forged",
     "id\\n[2026-01-01 00:00:00,000: ERROR/MainProcess] forged", 0},
    {"a\r\tb", "a\\r\\tb", 0},
    {"\x1b[2Jclear", "\\x1b[2Jclear", 0},
    {"bell\x07 del\x7f", "bell\\x07 del\\x7f", 0},
    /* valid UTF-8 is kept, C1 controls written as UTF-8 are not */
    {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
     "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 0},
    {"csi\xc2\x9b"
     "2J",
     "csi\\u009b2J", 0},
    /* bytes that are not UTF-8: a lone C1 byte, a cut sequence, an overlong
     * form, a surrogate */
    {"raw\x9b"
     "2J",
     "raw\\x9b2J", 0},
    {"cut\xe2\x82", "cut\\xe2\\x82", 0},
    {"over\xc0\xaf", "over\\xc0\\xaf", 0},
    {"sur\xed\xa0\x80", "sur\\xed\\xa0\\x80", 0},
    /* layout kept on request, other controls still escaped */
    {"{\n\t\"a\": 1\r\x1b}", "{\n\t\"a\": 1\\r\\x1b}", ESC_KEEP_LAYOUT},
    {"", "", 0},
};

START_TEST(test_esc_vectors)
{
    const struct vec *v = &vecs[_i];
    char out[256];
    size_t n = esc_ctl(out, sizeof(out), v->in, strlen(v->in), v->flags);
    ck_assert_msg(!strcmp(out, v->out), "case %d: got '%s'", _i, out);
    ck_assert_uint_eq(n, strlen(v->out));
    ck_assert_int_eq(esc_ctl_needed(v->in, strlen(v->in), v->flags),
                     strcmp(v->in, v->out) != 0);
}
END_TEST

/* A NUL inside the input is escaped too (a length, not a C string). */
START_TEST(test_esc_nul)
{
    char out[32];
    esc_ctl(out, sizeof(out), "a\0b", 3, 0);
    ck_assert_str_eq(out, "a\\x00b");
    ck_assert_int_eq(esc_ctl_needed("a\0b", 3, 0), 1);
}
END_TEST

/* A full output stops before an escape or a character that does not fit. */
START_TEST(test_esc_truncates_whole)
{
    char out[5];
    ck_assert_uint_eq(esc_ctl(out, sizeof(out), "abc\ndef", 7, 0), 3);
    ck_assert_str_eq(out, "abc");
    ck_assert_uint_eq(esc_ctl(out, sizeof(out), "abcd\xc3\xa9", 6, 0), 4);
    ck_assert_str_eq(out, "abcd");
    ck_assert_uint_eq(esc_ctl(out, 1, "abc", 3, 0), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("esc");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_esc_vectors, 0, sizeof(vecs) / sizeof(vecs[0]));
    tcase_add_test(tc, test_esc_nul);
    tcase_add_test(tc, test_esc_truncates_whole);
    suite_add_tcase(s, tc);
    return s;
}
