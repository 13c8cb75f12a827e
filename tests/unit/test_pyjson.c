/* test_pyjson.c -- the strict JSON scanner (py_json_scan_*), the one that
 * py_json_parse() and the OpenAI chunk fast path share: whole texts, every
 * truncation, malformed texts, limits, the object and array walkers, and the
 * string decoder against cJSON's. json.dumps()/repr() are in test_result.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/pyjson.h"
#include "util/alloc.h"

/* Texts the scanner accepts; each is also accepted by py_json_parse(). */
static const char *const good[] = {
    "0",
    "-0.0e+0",
    "1E-2",
    "123456789012345678901234567890123456789012345678901234567890123",
    "\"\"",
    "\"plain ascii with spaces and ~\"",
    "\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"",
    "\"\\u00e9\\u4E2D\\ud83d\\ude00\"",
    "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf\x7f\"",
    "true",
    "false",
    "null",
    "NaN",
    "-Infinity",
    "[]",
    " [ ] ",
    "{}",
    "\t\r\n{ }\n",
    "[1, \"a\", true, null, {\"k\": [2.5, -3e10]}]",
    "{\"a\": {\"a\": 1}, \"a\": 2}",
    "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}",
    "[[[[[[[[[[]]]]]]]]]]",
};

/* {text, length (0 = strlen), expected why, expected pos}. */
static const struct {
    const char *text;
    size_t len;
    const char *why;
    size_t pos;
} bad[] = {
    {"", 0, "unexpected end", 0},
    {"   ", 0, "unexpected end", 3},
    {"[1,]", 0, "unexpected character", 3},
    {"[,1]", 0, "unexpected character", 1},
    {"{,}", 0, "expected key", 1},
    {"{\"a\" 1}", 0, "expected ':'", 5},
    {"{\"a\": 1,}", 0, "expected key", 8},
    {"{'a': 1}", 0, "expected key", 1},
    {"[1 2]", 0, "expected ',' or end of container", 3},
    {"[1", 0, "unexpected end", 2},
    {"01", 0, "trailing data", 1},
    {"1.", 0, "bad number", 2},
    {"1e", 0, "bad number", 2},
    {"-", 0, "bad number", 1},
    {".5", 0, "unexpected character", 0},
    {"+1", 0, "unexpected character", 0},
    {"tru", 0, "bad literal", 0},
    {"nan", 0, "bad literal", 0},
    {"Inf", 0, "bad literal", 0},
    {"\"abc", 0, "unterminated string", 4},
    {"\"a\\", 0, "unterminated string", 3},
    {"\"\\x\"", 0, "bad escape", 3},
    {"\"\\u12\"", 0, "truncated \\u escape", 3},
    {"\"\\u12g4\"", 0, "bad \\u escape", 6},
    {"\"\\u0000\"", 0, "\\u0000 in string", 7},
    {"\"\\udc00\"", 0, "lone low surrogate", 7},
    {"\"\\ud800\"", 0, "lone high surrogate", 7},
    {"\"\\ud800\\u0041\"", 0, "lone high surrogate", 13},
    {"\"a\tb\"", 0, "control character in string", 2},
    {"\"\x01\"", 0, "control character in string", 1},
    {"\"\xff\"", 0, "invalid UTF-8", 1},
    {"\"ab\xc0\xaf\"", 0, "invalid UTF-8", 3},
    {"\"\xed\xa0\x80\"", 0, "invalid UTF-8", 1},
    {"\"\xf4\x90\x80\x80\"", 0, "invalid UTF-8", 1},
    {"\"\xc3\"", 0, "invalid UTF-8", 1},
    {"[1]\0", 4, "trailing data", 3},
    {"\0[1]", 4, "unexpected character", 0},
    {"\"a\0b\"", 5, "control character in string", 2},
    {"1234567890123456789012345678901234567890123456789012345678901234", 0,
     "number too long", 64},
    {"\xef\xbb\xbf[1]", 0, "unexpected character", 0},
    {"[1]\x0b", 0, "trailing data", 3},
    {"\f[1]", 0, "unexpected character", 0},
};

/* Scans len bytes copied to a buffer of exactly that size, so that ASan sees
 * any read past the end. */
static int scan_exact(const char *text, size_t len, struct py_json_scan *sc)
{
    char *copy = malloc(len ? len : 1);
    int rc;

    ck_assert_ptr_nonnull(copy);
    memcpy(copy, text, len);
    py_json_scan_init(sc, copy, len);
    rc = py_json_scan_text(sc);
    /* sc->s points into copy: report with the caller's text */
    sc->s = text;
    free(copy);
    return rc;
}

START_TEST(test_scan_good)
{
    const char *t = good[_i];
    struct py_json_scan sc;
    cJSON *v = NULL;

    ck_assert_msg(scan_exact(t, strlen(t), &sc) == 0, "'%s': %s at %zu", t, sc.why,
                  sc.pos);
    ck_assert_ptr_null(sc.why);
    ck_assert_uint_eq(sc.pos, strlen(t));
    ck_assert_int_eq(sc.depth, 0);
    ck_assert_int_eq(py_json_parse(t, strlen(t), &v, NULL), 0);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_scan_bad)
{
    const char *t = bad[_i].text;
    size_t len = bad[_i].len ? bad[_i].len : strlen(t);
    struct py_json_scan sc;
    struct cr_err err = {0, ""};
    char want[128];
    cJSON *v = NULL;

    ck_assert_int_eq(scan_exact(t, len, &sc), -1);
    ck_assert_ptr_nonnull(sc.why);
    ck_assert_msg(strcmp(sc.why, bad[_i].why) == 0, "'%s': why '%s', not '%s'", t, sc.why,
                  bad[_i].why);
    ck_assert_msg(sc.pos == bad[_i].pos, "'%s': pos %zu, not %zu", t, sc.pos,
                  bad[_i].pos);
    /* py_json_parse() reports exactly what the scanner found */
    ck_assert_int_eq(py_json_parse(t, len, &v, &err), CR_EDECODE);
    ck_assert_ptr_null(v);
    snprintf(want, sizeof(want), "bad JSON at byte %zu: %s", bad[_i].pos, bad[_i].why);
    ck_assert_str_eq(err.msg, want);
}
END_TEST

/* Every proper prefix of a text is refused (unless the text is a number or
 * only whitespace was cut off), never read past, and judged as py_json_parse()
 * judges it. */
START_TEST(test_scan_truncated)
{
    const char *t = good[_i];
    size_t n = strlen(t);

    for (size_t k = 0; k < n; k++) {
        struct py_json_scan sc;
        cJSON *v = NULL;
        int rc = scan_exact(t, k, &sc), prc = py_json_parse(t, k, &v, NULL);

        cJSON_Delete(v);
        ck_assert_int_eq(rc == 0, prc == 0);
        ck_assert_uint_le(sc.pos, k);
        if (rc == 0)
            ck_assert_msg(strchr("-0123456789", t[0]) ||
                              strspn(t + k, " \t\r\n") == n - k,
                          "prefix %zu of '%s' accepted", k, t);
        else
            ck_assert_ptr_nonnull(sc.why);
    }
}
END_TEST

/* Every byte of a valid text in turn replaced by bytes that matter to a
 * scanner: the scan never reads past the end and agrees with py_json_parse(). */
START_TEST(test_scan_mutated)
{
    static const char subst[] = {'"', '\\', '{', '}', '[', ']',  ',',    ':',
                                 '0', '-',  'e', ' ', 'u', '\0', '\x01', '\x80'};
    const char *t = good[_i];
    size_t n = strlen(t);
    char *m = malloc(n);

    ck_assert_ptr_nonnull(m);
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < sizeof(subst); k++) {
            struct py_json_scan sc;
            cJSON *v = NULL;
            int rc;

            memcpy(m, t, n);
            m[i] = subst[k];
            rc = scan_exact(m, n, &sc);
            ck_assert_int_eq(rc == 0, py_json_parse(m, n, &v, NULL) == 0);
            cJSON_Delete(v);
            ck_assert_uint_le(sc.pos, n);
            ck_assert(rc == 0 ? sc.why == NULL : sc.why != NULL);
        }
    }
    free(m);
}
END_TEST

/* depth copies of open, then mid, then depth copies of close. */
static char *nested_mid(const char *open, const char *mid, const char *close, int depth)
{
    size_t a = strlen(open), m = strlen(mid), b = strlen(close);
    char *s = malloc((size_t)depth * (a + b) + m + 1), *p = s;

    ck_assert_ptr_nonnull(s);
    for (int i = 0; i < depth; i++, p += a)
        memcpy(p, open, a);
    memcpy(p, mid, m);
    p += m;
    for (int i = 0; i < depth; i++, p += b)
        memcpy(p, close, b);
    *p = '\0';
    return s;
}

static char *nested(const char *open, const char *close, int depth)
{
    return nested_mid(open, "", close, depth);
}

START_TEST(test_scan_depth)
{
    char *arr_ok = nested("[", "]", PY_JSON_MAX_DEPTH);
    char *arr_deep = nested("[", "]", PY_JSON_MAX_DEPTH + 1);
    char *obj_ok = nested_mid("{\"k\":", "{}", "}", PY_JSON_MAX_DEPTH - 1);
    char *obj_deep = nested_mid("{\"k\":", "{}", "}", PY_JSON_MAX_DEPTH);
    char *mixed = nested_mid("[{\"k\":", "0", "}]", PY_JSON_MAX_DEPTH / 2 + 1);
    char *huge = nested("[", "]", 200000);
    struct py_json_scan sc;

    ck_assert_int_eq(scan_exact(arr_ok, strlen(arr_ok), &sc), 0);
    ck_assert_int_eq(scan_exact(arr_deep, strlen(arr_deep), &sc), -1);
    ck_assert_str_eq(sc.why, "nested too deep");
    ck_assert_uint_eq(sc.pos, PY_JSON_MAX_DEPTH);
    ck_assert_int_eq(scan_exact(obj_ok, strlen(obj_ok), &sc), 0);
    ck_assert_int_eq(scan_exact(obj_deep, strlen(obj_deep), &sc), -1);
    ck_assert_str_eq(sc.why, "nested too deep");
    ck_assert_int_eq(scan_exact(mixed, strlen(mixed), &sc), -1);
    ck_assert_str_eq(sc.why, "nested too deep");
    ck_assert_int_eq(scan_exact(huge, strlen(huge), &sc), -1);
    ck_assert_str_eq(sc.why, "nested too deep");
    /* depth is per branch, not cumulative */
    ck_assert_int_eq(scan_exact("[{\"a\": [[]]}, [[{}]]]", 21, &sc), 0);
    free(arr_ok);
    free(arr_deep);
    free(obj_ok);
    free(obj_deep);
    free(mixed);
    free(huge);
}
END_TEST

START_TEST(test_scan_numbers)
{
    static const char *const ok[] = {"0", "-0", "10", "1.5", "1e5", "1E+5", "-1.25e-3"};
    static const char *const no[] = {"", "-", "00x", "1.", ".1", "1e", "1e+", "NaN", "x"};
    char longest[PY_JSON_MAX_NUMBER + 2];
    struct py_json_scan sc;

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        py_json_scan_init(&sc, ok[i], strlen(ok[i]));
        ck_assert_int_eq(py_json_scan_number(&sc), 0);
        ck_assert_uint_eq(sc.pos, strlen(ok[i]));
        ck_assert_int_eq(sc.nonfinite, 0);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        py_json_scan_init(&sc, no[i], strlen(no[i]));
        /* "00x" scans as "0", then stops */
        if (py_json_scan_number(&sc) == 0)
            ck_assert_uint_lt(sc.pos, strlen(no[i]));
        else
            ck_assert_str_eq(sc.why, "bad number");
    }
    memset(longest, '7', sizeof(longest));
    py_json_scan_init(&sc, longest, PY_JSON_MAX_NUMBER);
    ck_assert_int_eq(py_json_scan_number(&sc), 0);
    py_json_scan_init(&sc, longest, PY_JSON_MAX_NUMBER + 1);
    ck_assert_int_eq(py_json_scan_number(&sc), -1);
    ck_assert_str_eq(sc.why, "number too long");
    /* non-finite values are values, not numbers */
    py_json_scan_init(&sc, "[Infinity]", 10);
    ck_assert_int_eq(py_json_scan_text(&sc), 0);
    ck_assert_int_eq(sc.nonfinite, 1);
}
END_TEST

/* The decoded bytes of a string are cJSON's, byte for byte. */
static const char *const strings[] = {
    "\"\"",
    "\"abc\"",
    "\"a\\nb\\t\\\"q\\\"\\\\ \\/ \\b\\f\\r\"",
    "\"\\u00e9\\u4e2d\\ud83d\\ude00\\u007f\"",
    "\"\\uD83D\\uDE00 upper \\u00C9 \\u0041\"",
    "\"\\u0080\\u07ff\\u0800\\uffff\\udbff\\udfff\"",
    "\"raw \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 and \\u00e9\"",
};

START_TEST(test_string_unescape)
{
    const char *t = strings[_i];
    struct py_json_scan sc;
    struct py_json_str s;
    cJSON *v = cJSON_ParseWithLength(t, strlen(t));
    char out[256];

    ck_assert_ptr_nonnull(v);
    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_string(&sc, &s), 0);
    ck_assert_uint_eq(sc.pos, strlen(t));
    ck_assert_ptr_eq(s.p, t + 1);
    ck_assert_uint_eq(s.raw, strlen(t) - 2);
    ck_assert_uint_eq(s.len, strlen(v->valuestring));
    ck_assert_int_eq(s.raw == s.len, strchr(t, '\\') == NULL);
    memset(out, 'X', sizeof(out));
    py_json_unescape(&s, out);
    ck_assert(memcmp(out, v->valuestring, s.len) == 0);
    ck_assert_int_eq(out[s.len], 'X'); /* no NUL, nothing past len */
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_string_not_at_quote)
{
    struct py_json_scan sc;
    struct py_json_str s;

    py_json_scan_init(&sc, "abc", 3);
    ck_assert_int_eq(py_json_scan_string(&sc, &s), -1);
    ck_assert_str_eq(sc.why, "expected string");
    py_json_scan_init(&sc, "", 0);
    ck_assert_int_eq(py_json_scan_string(&sc, &s), -1);
}
END_TEST

/* ---------------------------------------------------------------- walkers */

struct walk {
    char keys[256];
    size_t elements;
    int refuse_at; /* member or element number that refuses, or -1 */
    int calls;
    const char *why; /* set by the refusing callback, or NULL */
};

static int walk_member(struct py_json_scan *sc, const struct py_json_str *key,
                       void *privdata)
{
    struct walk *w = privdata;
    size_t n = strlen(w->keys);

    if (w->calls++ == w->refuse_at) {
        if (w->why)
            sc->why = w->why;
        return 1;
    }
    ck_assert_uint_lt(n + key->raw + 1, sizeof(w->keys));
    memcpy(w->keys + n, key->p, key->raw);
    w->keys[n + key->raw] = ',';
    w->keys[n + key->raw + 1] = '\0';
    return py_json_scan_value(sc);
}

static int walk_element(struct py_json_scan *sc, size_t index, void *privdata)
{
    struct walk *w = privdata;

    ck_assert_uint_eq(index, w->elements);
    if (w->calls++ == w->refuse_at)
        return -1;
    w->elements++;
    return py_json_scan_value(sc);
}

START_TEST(test_walk_object)
{
    const char *t = "{ \"a\" : 1 , \"b\\n\":[2,{}], \"\":\"x\" }";
    struct walk w = {"", 0, -1, 0, NULL};
    struct py_json_scan sc;

    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), 0);
    ck_assert_uint_eq(sc.pos, strlen(t));
    ck_assert_int_eq(sc.depth, 0);
    ck_assert_str_eq(w.keys, "a,b\\n,,"); /* raw key bytes, escapes kept */

    /* a refusal stops the scan, at the value refused */
    memset(&w, 0, sizeof(w));
    w.refuse_at = 1;
    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), -1);
    ck_assert_str_eq(sc.why, "value refused");
    ck_assert_int_eq(sc.s[sc.pos], '[');
    ck_assert_str_eq(w.keys, "a,");

    /* the callback's own why is kept */
    memset(&w, 0, sizeof(w));
    w.why = "not wanted";
    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), -1);
    ck_assert_str_eq(sc.why, "not wanted");

    /* not an object, an empty one, a broken one */
    memset(&w, 0, sizeof(w));
    w.refuse_at = -1;
    py_json_scan_init(&sc, "[]", 2);
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), -1);
    ck_assert_str_eq(sc.why, "expected object");
    py_json_scan_init(&sc, "{ }", 3);
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), 0);
    ck_assert_int_eq(w.calls, 0);
    py_json_scan_init(&sc, "{\"a\":1", 6);
    ck_assert_int_eq(py_json_scan_object(&sc, walk_member, &w), -1);
    ck_assert_str_eq(sc.why, "unexpected end");
}
END_TEST

START_TEST(test_walk_array)
{
    const char *t = "[ 1, \"two\" , [3], {\"4\": 4} ]";
    struct walk w = {"", 0, -1, 0, NULL};
    struct py_json_scan sc;

    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_array(&sc, walk_element, &w), 0);
    ck_assert_uint_eq(w.elements, 4);
    ck_assert_uint_eq(sc.pos, strlen(t));

    memset(&w, 0, sizeof(w));
    w.refuse_at = 2;
    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_array(&sc, walk_element, &w), -1);
    ck_assert_str_eq(sc.why, "value refused");
    ck_assert_uint_eq(w.elements, 2);

    memset(&w, 0, sizeof(w));
    w.refuse_at = -1;
    py_json_scan_init(&sc, "[]", 2);
    ck_assert_int_eq(py_json_scan_array(&sc, walk_element, &w), 0);
    ck_assert_int_eq(w.calls, 0);
    py_json_scan_init(&sc, "{}", 2);
    ck_assert_int_eq(py_json_scan_array(&sc, walk_element, &w), -1);
    ck_assert_str_eq(sc.why, "expected array");
    py_json_scan_init(&sc, "[1;2]", 5);
    ck_assert_int_eq(py_json_scan_array(&sc, walk_element, &w), -1);
    ck_assert_str_eq(sc.why, "expected ',' or end of container");
}
END_TEST

/* A walker's container counts towards the depth limit like any other. */
static int deeper(struct py_json_scan *sc, size_t index, void *privdata)
{
    (void)index;
    (void)privdata;
    if (sc->pos < sc->len && sc->s[sc->pos] == '[')
        return py_json_scan_array(sc, deeper, NULL);
    return py_json_scan_value(sc);
}

START_TEST(test_walk_depth)
{
    char *ok = nested("[", "]", PY_JSON_MAX_DEPTH), *deep = nested("[", "]", 1000);
    struct py_json_scan sc;

    py_json_scan_init(&sc, ok, strlen(ok));
    ck_assert_int_eq(py_json_scan_array(&sc, deeper, NULL), 0);
    py_json_scan_init(&sc, deep, strlen(deep));
    ck_assert_int_eq(py_json_scan_array(&sc, deeper, NULL), -1);
    ck_assert_str_eq(sc.why, "nested too deep");
    ck_assert_int_eq(sc.depth, PY_JSON_MAX_DEPTH + 1);
    free(ok);
    free(deep);
}
END_TEST

/* The scanner allocates nothing. */
START_TEST(test_scan_no_alloc)
{
    struct py_json_scan sc;
    const char *t = good[sizeof(good) / sizeof(good[0]) - 3];

    cr_alloc_fail_after(1);
    py_json_scan_init(&sc, t, strlen(t));
    ck_assert_int_eq(py_json_scan_text(&sc), 0);
    ck_assert_int_eq(cr_alloc_failed(), 0);
    cr_alloc_fail_after(0);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("pyjson");
    TCase *tc = tcase_create("scan");

    tcase_add_loop_test(tc, test_scan_good, 0, sizeof(good) / sizeof(good[0]));
    tcase_add_loop_test(tc, test_scan_bad, 0, sizeof(bad) / sizeof(bad[0]));
    tcase_add_loop_test(tc, test_scan_truncated, 0, sizeof(good) / sizeof(good[0]));
    tcase_add_loop_test(tc, test_scan_mutated, 0, sizeof(good) / sizeof(good[0]));
    tcase_add_test(tc, test_scan_depth);
    tcase_add_test(tc, test_scan_numbers);
    tcase_add_loop_test(tc, test_string_unescape, 0,
                        sizeof(strings) / sizeof(strings[0]));
    tcase_add_test(tc, test_string_not_at_quote);
    tcase_add_test(tc, test_walk_object);
    tcase_add_test(tc, test_walk_array);
    tcase_add_test(tc, test_walk_depth);
    tcase_add_test(tc, test_scan_no_alloc);
    suite_add_tcase(s, tc);
    return s;
}
