/* test_pct.c -- util/pct: %XX percent-decoding. */
#include <check.h>
#include <string.h>

#include "util/err.h"
#include "util/pct.h"

struct vec {
    const char *in;
    unsigned flags;
    const char *out; /* decoded, with room to spare */
};

static const struct vec vecs[] = {
    {"plain", 0, "plain"},
    {"", 0, ""},
    {"a%20b%2Fc%2fd", 0, "a b/c/d"},
    {"%41%42%43", 0, "ABC"},
    {"p%40ss%3Aw%25rd", 0, "p@ss:w%rd"},
    /* not a whole escape: copied as it is */
    {"%zz", 0, "%zz"},
    {"%4", 0, "%4"},
    {"x%", 0, "x%"},
    {"%%41", 0, "%A"},
    {"%4g%g4", 0, "%4g%g4"},
    {"%%%", 0, "%%%"},
    /* '+' only with PCT_PLUS, and %2B stays a '+' */
    {"a+b", 0, "a+b"},
    {"a+b%2Bc", PCT_PLUS, "a b+c"},
    {"+%zz+%4", PCT_PLUS, " %zz %4"},
    /* bytes above 0x7f */
    {"caf%C3%A9", 0, "caf\xc3\xa9"},
};

START_TEST(test_pct_vectors)
{
    const struct vec *v = &vecs[_i];
    char out[64];
    size_t n = 99;

    memset(out, 'X', sizeof(out));
    ck_assert_int_eq(pct_decode(out, sizeof(out), v->in, strlen(v->in), v->flags, &n), 0);
    ck_assert_str_eq(out, v->out);
    ck_assert_uint_eq(n, strlen(v->out));
    /* the length, not the NUL, ends it; NULL outlen is fine */
    ck_assert_int_eq(pct_decode(out, sizeof(out), v->in, strlen(v->in), v->flags, NULL),
                     0);
    ck_assert_str_eq(out, v->out);
}
END_TEST

/* Only n bytes are read: an escape cut by n is not one. */
START_TEST(test_pct_bounded_input)
{
    char out[16];
    size_t n;
    ck_assert_int_eq(pct_decode(out, sizeof(out), "a%41", 3, 0, &n), 0);
    ck_assert_str_eq(out, "a%4");
    ck_assert_int_eq(pct_decode(out, sizeof(out), "%41%42", 3, 0, &n), 0);
    ck_assert_str_eq(out, "A");
    ck_assert_int_eq(pct_decode(out, sizeof(out), "zzz", 0, 0, &n), 0);
    ck_assert_str_eq(out, "");
    ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(test_pct_nul)
{
    char out[16];
    size_t n;
    ck_assert_int_eq(pct_decode(out, sizeof(out), "a%00b", 5, 0, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_mem_eq(out, "a\0b", 4);
}
END_TEST

/* Out of room: CR_ERANGE, the longest prefix that fits (escapes whole),
 * NUL-terminated; nothing written past size. */
START_TEST(test_pct_out_of_room)
{
    char out[8];
    size_t n;

    memset(out, 'X', sizeof(out));
    ck_assert_int_eq(pct_decode(out, 5, "ab%41d", 6, 0, &n), 0);
    ck_assert_str_eq(out, "abAd");
    ck_assert_uint_eq(n, 4);
    memset(out, 'X', sizeof(out));
    ck_assert_int_eq(pct_decode(out, 4, "ab%41d", 6, 0, &n), CR_ERANGE);
    ck_assert_str_eq(out, "abA");
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(out[4], 'X');
    ck_assert_int_eq(pct_decode(out, 3, "%41%42%43", 9, 0, &n), CR_ERANGE);
    ck_assert_str_eq(out, "AB");
    ck_assert_int_eq(pct_decode(out, 1, "a", 1, 0, &n), CR_ERANGE);
    ck_assert_str_eq(out, "");
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(pct_decode(out, 1, "", 0, 0, &n), 0);
    ck_assert_str_eq(out, "");
    /* size 0: nothing written at all */
    out[0] = 'X';
    ck_assert_int_eq(pct_decode(out, 0, "a", 1, 0, &n), CR_ERANGE);
    ck_assert_int_eq(out[0], 'X');
    ck_assert_uint_eq(n, 0);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("pct");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_pct_vectors, 0, sizeof(vecs) / sizeof(vecs[0]));
    tcase_add_test(tc, test_pct_bounded_input);
    tcase_add_test(tc, test_pct_nul);
    tcase_add_test(tc, test_pct_out_of_room);
    suite_add_tcase(s, tc);
    return s;
}
