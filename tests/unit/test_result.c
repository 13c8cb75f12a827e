/* test_result.c -- result meta JSON, Python-flavoured JSON and repr(), checked
 * byte for byte against Celery 5.2.6 and Python 3.11 output. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* {JSON text, repr(json.loads(text)), json.dumps(json.loads(text))}, generated
 * with /usr/bin/python3 (3.11) and pasted here. */
static const struct {
    const char *json, *repr, *dumps;
} vec[] = {
    {"0", "0", "0"},
    {"-0", "0", "0"},
    {"1", "1", "1"},
    {"-1", "-1", "-1"},
    {"42", "42", "42"},
    {"2147483647", "2147483647", "2147483647"},
    {"2147483648", "2147483648", "2147483648"},
    {"-2147483649", "-2147483649", "-2147483649"},
    {"9007199254740992", "9007199254740992", "9007199254740992"},
    {"1.0", "1.0", "1.0"},
    {"-0.0", "-0.0", "-0.0"},
    {"0.1", "0.1", "0.1"},
    {"0.5", "0.5", "0.5"},
    {"1.5", "1.5", "1.5"},
    {"100.0", "100.0", "100.0"},
    {"1e16", "1e+16", "1e+16"},
    {"1e15", "1000000000000000.0", "1000000000000000.0"},
    {"1.5e16", "1.5e+16", "1.5e+16"},
    {"1e-05", "1e-05", "1e-05"},
    {"0.0001", "0.0001", "0.0001"},
    {"0.00012345", "0.00012345", "0.00012345"},
    {"1e100", "1e+100", "1e+100"},
    {"1e-100", "1e-100", "1e-100"},
    {"3.141592653589793", "3.141592653589793", "3.141592653589793"},
    {"2.5e-7", "2.5e-07", "2.5e-07"},
    {"1E3", "1000.0", "1000.0"},
    {"1e22", "1e+22", "1e+22"},
    {"5e-324", "5e-324", "5e-324"},
    {"1.7976931348623157e308", "1.7976931348623157e+308", "1.7976931348623157e+308"},
    {"123.456", "123.456", "123.456"},
    {"0.30000000000000004", "0.30000000000000004", "0.30000000000000004"},
    {"-2.5", "-2.5", "-2.5"},
    {"true", "True", "true"},
    {"false", "False", "false"},
    {"null", "None", "null"},
    {"\"\"", "''", "\"\""},
    {"\"abc\"", "'abc'", "\"abc\""},
    {"\"it's\"", "\"it's\"", "\"it's\""},
    {"\"say \\\"hi\\\"\"", "'say \"hi\"'", "\"say \\\"hi\\\"\""},
    {"\"both ' and \\\"\"", "'both \\' and \"'", "\"both ' and \\\"\""},
    {"\"back\\\\slash\"", "'back\\\\slash'", "\"back\\\\slash\""},
    {"\"tab\\tnl\\ncr\\r\"", "'tab\\tnl\\ncr\\r'", "\"tab\\tnl\\ncr\\r\""},
    {"\"\\u0001\\u001f\\u007f\"", "'\\x01\\x1f\\x7f'", "\"\\u0001\\u001f\\u007f\""},
    {"\"\\b\\f\"", "'\\x08\\x0c'", "\"\\b\\f\""},
    {"\"h\\u00e9llo\"", "'h\303\251llo'", "\"h\\u00e9llo\""},
    {"\"\\u65e5\\u672c\"", "'\346\227\245\346\234\254'", "\"\\u65e5\\u672c\""},
    {"\"\\ud83d\\ude00\"", "'\360\237\230\200'", "\"\\ud83d\\ude00\""},
    {"\"\\u0080\\u009f\\u00a0\\u00ad\"", "'\\x80\\x9f\\xa0\\xad'",
     "\"\\u0080\\u009f\\u00a0\\u00ad\""},
    {"\"\\u2028\\u2029\\u200b\\ufeff\"", "'\\u2028\\u2029\\u200b\\ufeff'",
     "\"\\u2028\\u2029\\u200b\\ufeff\""},
    {"\"\\ue000\"", "'\\ue000'", "\"\\ue000\""},
    {"\"\\u0378\"", "'\\u0378'", "\"\\u0378\""},
    {"\"\\udb40\\udc01\"", "'\\U000e0001'", "\"\\udb40\\udc01\""},
    {"\"\\u00ff\\u0100\"", "'\303\277\304\200'", "\"\\u00ff\\u0100\""},
    {"\"\\ufffd\"", "'\357\277\275'", "\"\\ufffd\""},
    {"\"/\"", "'/'", "\"/\""},
    {"[]", "[]", "[]"},
    {"{}", "{}", "{}"},
    {"[1, 2, 3]", "[1, 2, 3]", "[1, 2, 3]"},
    {"[[]]", "[[]]", "[[]]"},
    {"{\"a\": 1}", "{'a': 1}", "{\"a\": 1}"},
    {"{\"a\": [1, {\"b\": null}], \"c\": \"d\"}", "{'a': [1, {'b': None}], 'c': 'd'}",
     "{\"a\": [1, {\"b\": null}], \"c\": \"d\"}"},
    {"[1.0, 2, \"x\", true, null, {\"k\": false}]",
     "[1.0, 2, 'x', True, None, {'k': False}]",
     "[1.0, 2, \"x\", true, null, {\"k\": false}]"},
    {"{\"it's\": \"v\"}", "{\"it's\": 'v'}", "{\"it's\": \"v\"}"},
    {"{\"\": \"\"}", "{'': ''}", "{\"\": \"\"}"},
    {"{\"nested\": {\"deep\": [[[1.25]]]}}", "{'nested': {'deep': [[[1.25]]]}}",
     "{\"nested\": {\"deep\": [[[1.25]]]}}"},
};

static cJSON *parse(const char *text)
{
    cJSON *v = NULL;
    struct cr_err err;
    int rc = py_json_parse(text, strlen(text), &v, &err);
    ck_assert_msg(rc == 0, "%s: %s", text, err.msg);
    return v;
}

START_TEST(test_repr_vectors)
{
    cJSON *v = parse(vec[_i].json);
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_repr(v, &b, 0), 0);
    ck_assert_msg(strcmp(b.data, vec[_i].repr) == 0, "%s: got <%s> want <%s>",
                  vec[_i].json, b.data, vec[_i].repr);
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_dumps_vectors)
{
    cJSON *v = parse(vec[_i].json), *back;
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    ck_assert_msg(strcmp(b.data, vec[_i].dumps) == 0, "%s: got <%s> want <%s>",
                  vec[_i].json, b.data, vec[_i].dumps);
    /* and what we write reads back to the same value, float-ness included */
    back = parse(b.data);
    ck_assert(cJSON_Compare(v, back, 1));
    if (cJSON_IsNumber(v))
        ck_assert_int_eq(v->type & PY_JSON_FLOAT, back->type & PY_JSON_FLOAT);
    cJSON_Delete(back);
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

/* Values cJSON can hold that JSON text cannot: checked against Python too. */
START_TEST(test_repr_special_numbers)
{
    struct {
        double d;
        int flt;
        const char *repr, *dumps;
    } t[] = {
        {NAN, 1, "nan", "NaN"},
        {INFINITY, 1, "inf", "Infinity"},
        {-INFINITY, 0, "-inf", "-Infinity"},
        {2.0, 1, "2.0", "2.0"},
        {2.0, 0, "2", "2"},
        {-0.0, 0, "0", "0"},
        {1e20, 0, "100000000000000000000", "100000000000000000000"},
        {0.1 + 0.2, 0, "0.30000000000000004", "0.30000000000000004"},
        {1e16, 1, "1e+16", "1e+16"},
        {123456.789e3, 1, "123456789.0", "123456789.0"},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        cJSON *n = t[i].flt ? py_json_float(t[i].d) : cJSON_CreateNumber(t[i].d);
        struct buf a, b;
        buf_init(&a);
        buf_init(&b);
        ck_assert(cJSON_IsNumber(n));
        ck_assert_int_eq(py_repr(n, &a, 0), 0);
        ck_assert_int_eq(py_json_dumps(n, &b), 0);
        ck_assert_str_eq(a.data, t[i].repr);
        ck_assert_str_eq(b.data, t[i].dumps);
        buf_release(&a);
        buf_release(&b);
        cJSON_Delete(n);
    }
}
END_TEST

START_TEST(test_float_flag_survives_cjson)
{
    cJSON *v = parse("[1.0, 2]"), *dup = cJSON_Duplicate(v, 1);
    char *printed = cJSON_PrintUnformatted(v);
    ck_assert(cJSON_IsNumber(cJSON_GetArrayItem(dup, 0)));
    ck_assert(cJSON_GetArrayItem(dup, 0)->type & PY_JSON_FLOAT);
    ck_assert(!(cJSON_GetArrayItem(dup, 1)->type & PY_JSON_FLOAT));
    ck_assert(cJSON_Compare(v, dup, 1));
    ck_assert_str_eq(printed, "[1,2]"); /* cJSON's own printer ignores the bit */
    cJSON_free(printed);
    cJSON_Delete(dup);
    cJSON_Delete(v);
}
END_TEST

/* Invalid UTF-8 in a hand-built string: U+FFFD, never raw bytes. */
START_TEST(test_invalid_utf8_strings)
{
    cJSON *s = cJSON_CreateString("a\xff"
                                  "b\xc3");
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_repr(s, &b, 0), 0);
    ck_assert_str_eq(b.data, "'a\xEF\xBF\xBD"
                             "b\xEF\xBF\xBD'");
    buf_reset(&b);
    ck_assert_int_eq(py_json_dumps(s, &b), 0);
    ck_assert_str_eq(b.data, "\"a\\ufffdb\\ufffd\"");
    buf_release(&b);
    cJSON_Delete(s);
}
END_TEST

static const struct {
    const char *json;
    size_t max;
    const char *want;
} cutv[] = {
    {"[1, 2, 3]", 0, "[1, 2, 3]"},
    {"[1, 2, 3]", 9, "[1, 2, 3]"},
    {"[1, 2, 3]", 8, "[1, 2, 3..."},
    {"[1, 2, 3]", 4, "[1, ..."},
    {"[1, 2, 3]", 1, "[..."},
    {"\"h\\u00e9llo\"", 8, "'h\xC3\xA9llo'"},
    {"\"h\\u00e9llo\"", 3, "'h..."},
    {"\"h\\u00e9llo\"", 4, "'h\xC3\xA9..."},
    {"\"\\ud83d\\ude00\\ud83d\\ude00\"", 5, "'\xF0\x9F\x98\x80..."},
    {"\"\\ud83d\\ude00\\ud83d\\ude00\"", 4, "'..."},
    {"{\"key\": \"value\"}", 6, "{'key'..."},
};

START_TEST(test_repr_truncation)
{
    cJSON *v = parse(cutv[_i].json);
    struct buf b;
    buf_init(&b);
    buf_puts(&b, ">");
    ck_assert_int_eq(py_repr(v, &b, cutv[_i].max), 0);
    ck_assert_str_eq(b.data + 1, cutv[_i].want);
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

/* A huge value with a small limit must not be rendered in full. */
START_TEST(test_repr_truncation_huge)
{
    size_t n = 10 * 1024 * 1024;
    char *s = malloc(n + 1);
    cJSON *v;
    struct buf b;
    memset(s, 'a', n);
    s[n] = '\0';
    v = cJSON_CreateString(s);
    free(s);
    buf_init(&b);
    ck_assert_int_eq(py_repr(v, &b, 1024), 0);
    ck_assert_uint_eq(b.len, 1027);
    ck_assert(b.cap < 4096);
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

/* ---- strict parser ---- */

static const struct {
    const char *text;
    size_t len; /* 0: strlen */
} bad_json[] = {
    {"", 0},
    {"   ", 0},
    {"[", 0},
    {"[1,]", 0},
    {"{\"a\":1,}", 0},
    {"[1 2]", 0},
    {"{\"a\" 1}", 0},
    {"{1: 2}", 0},
    {"{\"a\"}", 0},
    {"01", 0},
    {"1.", 0},
    {".5", 0},
    {"-", 0},
    {"-a", 0},
    {"+1", 0},
    {"1e", 0},
    {"1e+", 0},
    {"nan", 0},
    {"-NaN", 0},
    {"NaNa", 0},
    {"Inf", 0},
    {"infinity", 0},
    {"+Infinity", 0},
    {"-Infinityx", 0},
    {"tru", 0},
    {"nul", 0},
    {"True", 0},
    {"[1] x", 0},
    {"[1][2]", 0},
    {"\"abc", 0},
    {"\"\\x\"", 0},
    {"\"\\u12\"", 0},
    {"\"\\u12g4\"", 0},
    {"\"a\tb\"", 0},
    {"\"\x01\"", 0},
    {"\"\xff\"", 0},
    {"\"\xc0\xaf\"", 0},
    {"\"\xe0\x80\xaf\"", 0},
    {"\"\xed\xa0\x80\"", 0},
    {"\"\xf4\x90\x80\x80\"", 0},
    {"\"\xc3\"", 0},
    {"\"\\ud800\"", 0},
    {"\"\\udc00\"", 0},
    {"\"\\ud800\\u0041\"", 0},
    {"\"\\ud800x\"", 0},
    {"\"\\u0000\"", 0},
    {"[1]\0", 4},
    {"\0[1]", 4},
    {"[1,\0 2]", 7},
    {"1234567890123456789012345678901234567890123456789012345678901234", 0},
    {"\xef\xbb\xbf[1]", 0}, /* a BOM is not JSON whitespace */
    {"[1]\x0b", 0},
};

START_TEST(test_parse_bad)
{
    const char *t = bad_json[_i].text;
    size_t len = bad_json[_i].len ? bad_json[_i].len : strlen(t);
    cJSON *v = (cJSON *)1;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(py_json_parse(t, len, &v, &err), CR_EDECODE);
    ck_assert_ptr_null(v);
    ck_assert_int_eq(err.code, CR_EDECODE);
    ck_assert(err.msg[0] != '\0');
}
END_TEST

static const char *const good_json[] = {
    " [1] ",
    "\t\r\n{}\n",
    "\"\\/\\b\\f\\n\\r\\t\\\"\\\\\"",
    "-0.0e+0",
    "1E-2",
    "123456789012345678901234567890123456789012345678901234567890123",
    "{\"a\": {\"a\": 1}, \"a\": 2}",
    "\"\\uD83D\\uDE00\"",
    "\"\xf4\x8f\xbf\xbf\"",
    "[true, false, null]",
};

START_TEST(test_parse_good)
{
    cJSON *v = NULL;
    ck_assert_int_eq(py_json_parse(good_json[_i], strlen(good_json[_i]), &v, NULL), 0);
    ck_assert_ptr_nonnull(v);
    cJSON_Delete(v);
}
END_TEST

static char *nested(int depth)
{
    char *s = malloc((size_t)depth * 2 + 1);
    memset(s, '[', (size_t)depth);
    memset(s + depth, ']', (size_t)depth);
    s[depth * 2] = '\0';
    return s;
}

START_TEST(test_parse_depth)
{
    char *ok = nested(PY_JSON_MAX_DEPTH), *deep = nested(PY_JSON_MAX_DEPTH + 1);
    char *huge = nested(100000);
    cJSON *v = NULL;
    ck_assert_int_eq(py_json_parse(ok, strlen(ok), &v, NULL), 0);
    cJSON_Delete(v);
    ck_assert_int_eq(py_json_parse(deep, strlen(deep), &v, NULL), CR_EDECODE);
    ck_assert_int_eq(py_json_parse(huge, strlen(huge), &v, NULL), CR_EDECODE);
    /* depth counts objects too, and is per branch, not cumulative */
    ck_assert_int_eq(py_json_parse("[{\"a\": [[]]}, [[{}]]]", 21, &v, NULL), 0);
    cJSON_Delete(v);
    free(ok);
    free(deep);
    free(huge);
}
END_TEST

START_TEST(test_parse_float_marks)
{
    cJSON *v = parse(
        "{\"a\": 1, \"b\": [2.0, \"3.5\", 4e0, -5], \"c\": {\"1.5\": 6}, \"d\": 7.25}");
    ck_assert(!(cJSON_GetObjectItem(v, "a")->type & PY_JSON_FLOAT));
    ck_assert(cJSON_GetArrayItem(cJSON_GetObjectItem(v, "b"), 0)->type & PY_JSON_FLOAT);
    ck_assert(cJSON_GetArrayItem(cJSON_GetObjectItem(v, "b"), 2)->type & PY_JSON_FLOAT);
    ck_assert(
        !(cJSON_GetArrayItem(cJSON_GetObjectItem(v, "b"), 3)->type & PY_JSON_FLOAT));
    ck_assert(
        !(cJSON_GetObjectItem(cJSON_GetObjectItem(v, "c"), "1.5")->type & PY_JSON_FLOAT));
    ck_assert(cJSON_GetObjectItem(v, "d")->type & PY_JSON_FLOAT);
    cJSON_Delete(v);
}
END_TEST

/* Python's json reads and writes these; so do we, both ways. */
START_TEST(test_parse_nonfinite)
{
    const char *text =
        "[NaN, Infinity, -Infinity, 1e400, -1e400, \"NaN\", {\"Infinity\": 1.5}, 2]";
    cJSON *v = parse(text);
    struct buf b;
    ck_assert(isnan(cJSON_GetArrayItem(v, 0)->valuedouble));
    ck_assert(isinf(cJSON_GetArrayItem(v, 1)->valuedouble) &&
              cJSON_GetArrayItem(v, 1)->valuedouble > 0);
    ck_assert(isinf(cJSON_GetArrayItem(v, 2)->valuedouble) &&
              cJSON_GetArrayItem(v, 2)->valuedouble < 0);
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    /* Python: json.dumps(json.loads(text)) */
    ck_assert_str_eq(b.data, "[NaN, Infinity, -Infinity, Infinity, -Infinity, \"NaN\", "
                             "{\"Infinity\": 1.5}, 2]");
    buf_reset(&b);
    ck_assert_int_eq(py_repr(v, &b, 0), 0);
    /* Python: repr(json.loads(text)) */
    ck_assert_str_eq(b.data, "[nan, inf, -inf, inf, -inf, 'NaN', {'Infinity': 1.5}, 2]");
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_utf8_next)
{
    uint32_t cp = 0;
    ck_assert_uint_eq(py_utf8_next("A", 1, &cp), 1);
    ck_assert_uint_eq(cp, 'A');
    ck_assert_uint_eq(py_utf8_next("\xc3\xa9", 2, &cp), 2);
    ck_assert_uint_eq(cp, 0xe9);
    ck_assert_uint_eq(py_utf8_next("\xe2\x82\xac", 3, &cp), 3);
    ck_assert_uint_eq(cp, 0x20ac);
    ck_assert_uint_eq(py_utf8_next("\xf0\x9f\x98\x80", 4, &cp), 4);
    ck_assert_uint_eq(cp, 0x1f600);
    ck_assert_uint_eq(py_utf8_next("\xf0\x9f\x98\x80", 3, &cp), 0);
    ck_assert_uint_eq(py_utf8_next("\xc1\xbf", 2, &cp), 0);
    ck_assert_uint_eq(py_utf8_next("\x80", 1, &cp), 0);
    ck_assert_uint_eq(py_utf8_next("\xf5\x80\x80\x80", 4, &cp), 0);
    ck_assert_uint_eq(py_utf8_next("\xe2\x28\xa1", 3, &cp), 0);
    ck_assert_uint_eq(py_utf8_next("", 0, &cp), 0);
}
END_TEST

/* ---- meta ---- */

#define DONE_US INT64_C(1796006784831674) /* 2026-11-30T02:46:24.831674+00:00 */

/* Expected texts: Celery 5.2.6's backend.store_result() output captured with
 * /usr/bin/python3 (date_done replaced by the aware form main writes). */
START_TEST(test_meta_success)
{
    cJSON *res = cJSON_CreateNumber(4);
    struct result_meta m = {
        .task_id = "t2", .status = "SUCCESS", .result = res, .date_done_us = DONE_US};
    char *s = result_meta_encode(&m);
    ck_assert_str_eq(s, "{\"status\": \"SUCCESS\", \"result\": 4, \"traceback\": null, "
                        "\"children\": [], \"date_done\": "
                        "\"2026-11-30T02:46:24.831674+00:00\", \"task_id\": \"t2\"}");
    cr_free(s);
    cJSON_Delete(res);
}
END_TEST

START_TEST(test_meta_failure)
{
    cJSON *exc = result_exc_new("KeyError", "builtins", "missing");
    struct result_meta m = {.task_id = "t3",
                            .status = "FAILURE",
                            .result = exc,
                            .traceback = "Traceback (most recent call last):\n  ...\n"
                                         "KeyError: ('missing', 1)\n",
                            .date_done_us = DONE_US};
    char *s;
    cJSON_AddItemToArray(cJSON_GetObjectItem(exc, "exc_message"), cJSON_CreateNumber(1));
    s = result_meta_encode(&m);
    ck_assert_str_eq(
        s, "{\"status\": \"FAILURE\", \"result\": {\"exc_type\": \"KeyError\", "
           "\"exc_message\": [\"missing\", 1], \"exc_module\": \"builtins\"}, "
           "\"traceback\": \"Traceback (most recent call last):\\n  ...\\nKeyError: "
           "('missing', 1)\\n\", \"children\": [], \"date_done\": "
           "\"2026-11-30T02:46:24.831674+00:00\", \"task_id\": \"t3\"}");
    cr_free(s);
    cJSON_Delete(exc);
}
END_TEST

START_TEST(test_meta_retry)
{
    cJSON *exc = result_exc_new("ValueError", "builtins", "temp");
    struct result_meta m = {.task_id = "t4",
                            .status = "RETRY",
                            .result = exc,
                            .traceback = "celery.exceptions.Retry: Retry in 7s\n",
                            .date_done_us = -1};
    char *s = result_meta_encode(&m);
    ck_assert_str_eq(s,
                     "{\"status\": \"RETRY\", \"result\": {\"exc_type\": \"ValueError\", "
                     "\"exc_message\": [\"temp\"], \"exc_module\": \"builtins\"}, "
                     "\"traceback\": \"celery.exceptions.Retry: Retry in 7s\\n\", "
                     "\"children\": [], \"date_done\": null, \"task_id\": \"t4\"}");
    cr_free(s);
    cJSON_Delete(exc);
}
END_TEST

START_TEST(test_meta_started)
{
    cJSON *res = cJSON_CreateObject();
    struct result_meta m = {
        .task_id = "t5", .status = "STARTED", .result = res, .date_done_us = -1};
    char *s;
    cJSON_AddNumberToObject(res, "pid", 8326);
    cJSON_AddStringToObject(res, "hostname", "celery@testhost");
    s = result_meta_encode(&m);
    ck_assert_str_eq(
        s, "{\"status\": \"STARTED\", \"result\": {\"pid\": 8326, \"hostname\": "
           "\"celery@testhost\"}, \"traceback\": null, \"children\": [], "
           "\"date_done\": null, \"task_id\": \"t5\"}");
    cr_free(s);
    cJSON_Delete(res);
}
END_TEST

START_TEST(test_meta_revoked)
{
    cJSON *exc = result_exc_new("TaskRevokedError", "celery.exceptions", "revoked");
    struct result_meta m = {
        .task_id = "t6", .status = "REVOKED", .result = exc, .date_done_us = DONE_US};
    char *s = result_meta_encode(&m);
    ck_assert_str_eq(
        s, "{\"status\": \"REVOKED\", \"result\": {\"exc_type\": "
           "\"TaskRevokedError\", \"exc_message\": [\"revoked\"], "
           "\"exc_module\": \"celery.exceptions\"}, \"traceback\": null, "
           "\"children\": [], \"date_done\": \"2026-11-30T02:46:24.831674+00:00\", "
           "\"task_id\": \"t6\"}");
    cr_free(s);
    cJSON_Delete(exc);
}
END_TEST

static const char extended_want[] =
    "{\"status\": \"SUCCESS\", \"result\": {\"text\": \"h\\u00e9llo\", \"score\": 1.0}, "
    "\"traceback\": null, \"children\": [], \"date_done\": "
    "\"2026-11-30T02:46:24.831674+00:00\", \"group_id\": \"g1\", \"parent_id\": \"p1\", "
    "\"name\": \"proj.add\", \"args\": [2, 2], \"kwargs\": {\"k\": \"v\"}, \"worker\": "
    "\"celery@testhost\", \"retries\": 1, \"queue\": \"celery\", \"task_id\": \"t1\"}";

struct ext_inputs {
    cJSON *res, *args, *kwargs;
};

static void ext_init(struct ext_inputs *in)
{
    in->res = parse("{\"text\": \"h\xc3\xa9llo\", \"score\": 1.0}");
    in->args = parse("[2, 2]");
    in->kwargs = parse("{\"k\": \"v\"}");
}

static void ext_release(struct ext_inputs *in)
{
    cJSON_Delete(in->res);
    cJSON_Delete(in->args);
    cJSON_Delete(in->kwargs);
}

static char *ext_encode(const struct ext_inputs *in)
{
    struct result_meta m = {.task_id = "t1",
                            .status = "SUCCESS",
                            .result = in->res,
                            .date_done_us = DONE_US,
                            .group_id = "g1",
                            .parent_id = "p1",
                            .extended = 1,
                            .name = "proj.add",
                            .args = in->args,
                            .kwargs = in->kwargs,
                            .worker = "celery@testhost",
                            .retries = 1,
                            .queue = "celery"};
    return result_meta_encode(&m);
}

static char *extended_meta(void)
{
    struct ext_inputs in;
    char *s;
    ext_init(&in);
    s = ext_encode(&in);
    ext_release(&in);
    return s;
}

START_TEST(test_meta_extended)
{
    char *s = extended_meta();
    ck_assert_str_eq(s, extended_want);
    cr_free(s);
}
END_TEST

START_TEST(test_meta_extended_stamps)
{
    /* Celery 5.3+: stamped_headers, then each stamp as a key, before task_id;
     * a stamp named like a key Celery writes is left out; empty stamps add
     * nothing. */
    struct ext_inputs in;
    cJSON *names = parse("[\"m\", \"queue\"]");
    cJSON *stamps = parse("{\"m\": [\"a\", 1], \"queue\": \"x\", \"b\": null}");
    cJSON *none = parse("{}");
    struct result_meta m;
    char *out;
    ext_init(&in);
    m = (struct result_meta){.task_id = "t1",
                             .status = "SUCCESS",
                             .result = in.res,
                             .date_done_us = -1,
                             .extended = 1,
                             .name = "n",
                             .args = in.args,
                             .kwargs = in.kwargs,
                             .worker = "w",
                             .queue = "celery",
                             .stamped_headers = names,
                             .stamps = stamps};
    out = result_meta_encode(&m);
    ck_assert_ptr_nonnull(strstr(out,
                                 "\"queue\": \"celery\", \"stamped_headers\": [\"m\", "
                                 "\"queue\"], \"m\": [\"a\", 1], \"b\": null, "
                                 "\"task_id\": \"t1\"}"));
    cr_free(out);
    m.stamps = none;
    out = result_meta_encode(&m);
    ck_assert_ptr_null(strstr(out, "stamped_headers"));
    cr_free(out);
    m.stamps = stamps;
    m.extended = 0;
    out = result_meta_encode(&m);
    ck_assert_ptr_null(strstr(out, "stamped_headers"));
    cr_free(out);
    cJSON_Delete(names);
    cJSON_Delete(stamps);
    cJSON_Delete(none);
    ext_release(&in);
}
END_TEST

START_TEST(test_meta_group_parent)
{
    cJSON *res = cJSON_CreateString("ok");
    struct result_meta m = {.task_id = "t7",
                            .status = "SUCCESS",
                            .result = res,
                            .date_done_us = DONE_US,
                            .group_id = "g1",
                            .parent_id = "p1"};
    char *s = result_meta_encode(&m);
    ck_assert_str_eq(s,
                     "{\"status\": \"SUCCESS\", \"result\": \"ok\", \"traceback\": null, "
                     "\"children\": [], \"date_done\": "
                     "\"2026-11-30T02:46:24.831674+00:00\", \"group_id\": \"g1\", "
                     "\"parent_id\": \"p1\", \"task_id\": \"t7\"}");
    cr_free(s);
    /* empty ids are falsy in Celery and not written; children may be given */
    m.group_id = "";
    m.parent_id = "";
    m.result = NULL;
    m.date_done_us = -1;
    m.children = parse("[[[\"c1\", null], null]]");
    s = result_meta_encode(&m);
    ck_assert_str_eq(s,
                     "{\"status\": \"SUCCESS\", \"result\": null, \"traceback\": null, "
                     "\"children\": [[[\"c1\", null], null]], \"date_done\": null, "
                     "\"task_id\": \"t7\"}");
    cr_free(s);
    cJSON_Delete((cJSON *)m.children);
    cJSON_Delete(res);
}
END_TEST

START_TEST(test_exc_new)
{
    cJSON *e = result_exc_new("ValueError", "builtins", NULL);
    struct buf b;
    buf_init(&b);
    py_json_dumps(e, &b);
    ck_assert_str_eq(b.data, "{\"exc_type\": \"ValueError\", \"exc_message\": [], "
                             "\"exc_module\": \"builtins\"}");
    cJSON_Delete(e);
    buf_reset(&b);
    e = result_exc_new(NULL, NULL, "x");
    py_json_dumps(e, &b);
    ck_assert_str_eq(b.data, "{\"exc_type\": null, \"exc_message\": [\"x\"], "
                             "\"exc_module\": null}");
    cJSON_Delete(e);
    buf_release(&b);
}
END_TEST

START_TEST(test_meta_status)
{
    char st[16];
    const char *ok = "{\"status\": \"SUCCESS\", \"result\": 4}";
    ck_assert_int_eq(result_meta_status(ok, strlen(ok), st, sizeof(st)), 0);
    ck_assert_str_eq(st, "SUCCESS");
    ck_assert_int_eq(result_meta_status(ok, strlen(ok), st, 4), 0);
    ck_assert_str_eq(st, "SUC");
    ck_assert_int_eq(result_meta_status(ok, strlen(ok), st, 0), 0);
    ck_assert_int_eq(result_meta_status(ok, 10, st, sizeof(st)), CR_EDECODE);
    ck_assert_int_eq(result_meta_status("[1]", 3, st, sizeof(st)), CR_EDECODE);
    ck_assert_int_eq(result_meta_status("{\"status\": 1}", 13, st, sizeof(st)),
                     CR_EDECODE);
    ck_assert_int_eq(result_meta_status("{}", 2, st, sizeof(st)), CR_EDECODE);
    ck_assert_int_eq(result_meta_status("", 0, st, sizeof(st)), CR_EDECODE);
    ck_assert_int_eq(result_meta_status(NULL, 0, st, sizeof(st)), CR_EDECODE);
    {
        char *s = extended_meta();
        ck_assert_int_eq(result_meta_status(s, strlen(s), st, sizeof(st)), 0);
        ck_assert_str_eq(st, "SUCCESS");
        cr_free(s);
    }
}
END_TEST

/* The traceback text, as worker.c stored it with a FAILURE or RETRY meta and
 * as events.c sent it (no module, NULLs defaulted) before the two shared it. */
static const struct {
    const char *task, *module, *type, *message, *want;
} tracebacks[] = {
    {"llm.chat", "celeriac.exceptions", "RateLimitError", "Error code: 429 - slow down",
     "Traceback (most recent call last):\n  File \"celeriac\", in llm.chat\n"
     "celeriac.exceptions.RateLimitError: Error code: 429 - slow down\n"},
    {"tasks.add", "builtins", "ValueError", "bad \xc3\xa9",
     "Traceback (most recent call last):\n  File \"celeriac\", in tasks.add\n"
     "ValueError: bad \xc3\xa9\n"},
    {"t", "billiard.exceptions", "TimeLimitExceeded", "",
     "Traceback (most recent call last):\n  File \"celeriac\", in t\n"
     "billiard.exceptions.TimeLimitExceeded: \n"},
    {"t", NULL, "Boom", "m",
     "Traceback (most recent call last):\n  File \"celeriac\", in t\nBoom: m\n"},
    {"t", "", "Boom", "m",
     "Traceback (most recent call last):\n  File \"celeriac\", in t\nBoom: m\n"},
    {NULL, NULL, NULL, NULL,
     "Traceback (most recent call last):\n  File \"celeriac\", in unknown\n"
     "Exception: \n"},
};

START_TEST(test_traceback)
{
    struct buf b;

    buf_init(&b);
    ck_assert_int_eq(buf_puts(&b, "kept|"), 0);
    ck_assert_int_eq(result_traceback(&b, tracebacks[_i].task, tracebacks[_i].module,
                                      tracebacks[_i].type, tracebacks[_i].message),
                     0);
    ck_assert_str_eq(b.data + 5, tracebacks[_i].want);
    ck_assert(memcmp(b.data, "kept|", 5) == 0);
    buf_release(&b);
}
END_TEST

START_TEST(test_traceback_oom)
{
    struct buf b;
    long n;

    for (n = 1;; n++) {
        int rc;
        buf_init(&b);
        cr_alloc_fail_after(n);
        rc = result_traceback(&b, "t", "m", "E", "message");
        cr_alloc_fail_after(0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
        buf_release(&b);
    }
    ck_assert_str_eq(b.data,
                     "Traceback (most recent call last):\n  File \"celeriac\", in t\n"
                     "m.E: message\n");
    buf_release(&b);
}
END_TEST

/* ---- OOM sweeps: fail allocation n = 1, 2, ... until the call succeeds ---- */

START_TEST(test_oom_parse_dumps_repr)
{
    const char *text = "{\"a\": [1, 2.5, \"x\\u00e9\", {\"b\": null, \"c\": [true]}], "
                       "\"d\": \"\\ud83d\\ude00\"}";
    long n;
    for (n = 1;; n++) {
        cJSON *v = NULL;
        int rc;
        cr_alloc_fail_after(n);
        rc = py_json_parse(text, strlen(text), &v, NULL);
        cr_alloc_fail_after(0);
        if (rc == 0) {
            cJSON_Delete(v);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_ptr_null(v);
    }
    ck_assert(n > 5);
    for (int which = 0; which < 2; which++) {
        cJSON *v = parse(text);
        for (n = 1;; n++) {
            struct buf b;
            int rc;
            buf_init(&b);
            cr_alloc_fail_after(n);
            rc = which ? py_repr(v, &b, 20) : py_json_dumps(v, &b);
            cr_alloc_fail_after(0);
            buf_release(&b);
            if (rc == 0)
                break;
            ck_assert_int_eq(rc, CR_ENOMEM);
        }
        cJSON_Delete(v);
    }
}
END_TEST

START_TEST(test_oom_meta)
{
    long n;
    char *s;
    struct ext_inputs in;
    ext_init(&in);
    for (n = 1;; n++) {
        cr_alloc_fail_after(n);
        s = ext_encode(&in);
        cr_alloc_fail_after(0);
        if (s)
            break;
    }
    ext_release(&in);
    ck_assert_str_eq(s, extended_want);
    cr_free(s);
    for (n = 1;; n++) {
        cJSON *e;
        cr_alloc_fail_after(n);
        e = result_exc_new("KeyError", "builtins", "m");
        cr_alloc_fail_after(0);
        if (e) {
            cJSON_Delete(e);
            break;
        }
    }
    ck_assert(n > 3);
    for (n = 1;; n++) {
        char st[8];
        int rc;
        cr_alloc_fail_after(n);
        rc = result_meta_status("{\"status\": \"X\"}", 15, st, sizeof(st));
        cr_alloc_fail_after(0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("result");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_repr_vectors, 0, sizeof(vec) / sizeof(vec[0]));
    tcase_add_loop_test(tc, test_dumps_vectors, 0, sizeof(vec) / sizeof(vec[0]));
    tcase_add_test(tc, test_repr_special_numbers);
    tcase_add_test(tc, test_float_flag_survives_cjson);
    tcase_add_test(tc, test_invalid_utf8_strings);
    tcase_add_loop_test(tc, test_repr_truncation, 0, sizeof(cutv) / sizeof(cutv[0]));
    tcase_add_test(tc, test_repr_truncation_huge);
    tcase_add_loop_test(tc, test_parse_bad, 0, sizeof(bad_json) / sizeof(bad_json[0]));
    tcase_add_loop_test(tc, test_parse_good, 0, sizeof(good_json) / sizeof(good_json[0]));
    tcase_add_test(tc, test_parse_depth);
    tcase_add_test(tc, test_parse_float_marks);
    tcase_add_test(tc, test_parse_nonfinite);
    tcase_add_test(tc, test_utf8_next);
    tcase_add_test(tc, test_meta_success);
    tcase_add_test(tc, test_meta_failure);
    tcase_add_test(tc, test_meta_retry);
    tcase_add_test(tc, test_meta_started);
    tcase_add_test(tc, test_meta_revoked);
    tcase_add_test(tc, test_meta_extended);
    tcase_add_test(tc, test_meta_extended_stamps);
    tcase_add_test(tc, test_meta_group_parent);
    tcase_add_test(tc, test_exc_new);
    tcase_add_test(tc, test_meta_status);
    tcase_add_loop_test(tc, test_traceback, 0,
                        sizeof(tracebacks) / sizeof(tracebacks[0]));
    tcase_add_test(tc, test_traceback_oom);
    tcase_add_test(tc, test_oom_parse_dumps_repr);
    tcase_add_test(tc, test_oom_meta);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}
