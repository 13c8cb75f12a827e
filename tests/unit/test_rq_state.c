/* test_rq_state.c -- RQ statuses as Celery states, the exception a traceback
 * ends with, the meta built from a job hash and its newest result entry
 * (whole, malformed, over the limits, with every allocation failing in
 * turn), and when a watch is told STARTED for a job that ended. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "protocol/isotime.h"
#include "protocol/pyjson.h"
#include "protocol/rq_job.h"
#include "protocol/rq_state.h"
#include "util/alloc.h"
#include "util/base64.h"
#include "util/buf.h"

/* ------------------------------------------------------------- statuses */

static const struct {
    const char *in;
    size_t len; /* 0: strlen(in) */
    const char *want;
} statuses[] = {
    {"queued", 0, "PENDING"},
    {"deferred", 0, "PENDING"},
    {"scheduled", 0, "PENDING"},
    {"created", 0, "PENDING"},
    {"started", 0, "STARTED"},
    {"finished", 0, "SUCCESS"},
    {"failed", 0, "FAILURE"},
    {"stopped", 0, "REVOKED"},
    {"canceled", 0, "REVOKED"},
    /* malformed: never a guess */
    {"", 0, NULL},
    {"Finished", 0, NULL},
    {"FINISHED", 0, NULL},
    {"finished ", 0, NULL},
    {" started", 0, NULL},
    {"finishe", 0, NULL},
    {"queue", 0, NULL},
    {"cancelled", 0, NULL},
    {"SUCCESS", 0, NULL},
    {"finished\0x", 10, NULL},
    {"started\n", 0, NULL},
    {"\xff\xfe", 0, NULL},
    {"1", 0, NULL},
};

START_TEST(test_statuses)
{
    const char *in = statuses[_i].in;
    size_t len = statuses[_i].len ? statuses[_i].len : strlen(in);
    const char *got = rq_status_state(in, len);
    if (statuses[_i].want)
        ck_assert_str_eq(got, statuses[_i].want);
    else
        ck_assert_msg(got == NULL, "'%s' gave %s", in, got);
}
END_TEST

START_TEST(test_status_edges)
{
    char big[4096];
    ck_assert_ptr_null(rq_status_state(NULL, 0));
    ck_assert_ptr_null(rq_status_state(NULL, 8));
    /* a prefix of the right length only */
    ck_assert_str_eq(rq_status_state("finishedXYZ", 8), "SUCCESS");
    ck_assert_ptr_null(rq_status_state("finished", 7));
    memset(big, 'a', sizeof(big));
    ck_assert_ptr_null(rq_status_state(big, sizeof(big)));
}
END_TEST

/* ------------------------------------------------------------ tracebacks */

static const struct {
    const char *text;
    const char *type, *module, *message; /* module NULL: none */
} excs[] = {
    {"Traceback (most recent call last):\n  File \"celeriac\", line 1, in f\n"
     "rq.timeouts.JobTimeoutException: Task exceeded maximum timeout value (5 seconds)\n",
     "JobTimeoutException", "rq.timeouts",
     "Task exceeded maximum timeout value (5 seconds)"},
    {"Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n"
     "    1 / 0\nZeroDivisionError: division by zero\n",
     "ZeroDivisionError", NULL, "division by zero"},
    /* chained: the last exception is the one */
    {"Traceback (most recent call last):\n  File \"a\", line 1, in f\nKeyError: 'k'\n\n"
     "During handling of the above exception, another exception occurred:\n\n"
     "Traceback (most recent call last):\n  File \"b\", line 2, in g\n"
     "ValueError: bad\n",
     "ValueError", NULL, "bad"},
    /* a message of several lines is kept whole */
    {"Traceback (most recent call last):\n  File \"a\", line 1, in f\n"
     "openai.BadRequestError: line one\nline two\n\n",
     "BadRequestError", "openai", "line one\nline two"},
    /* no message */
    {"Traceback (most recent call last):\n  File \"a\", line 1, in "
     "f\nKeyboardInterrupt\n",
     "KeyboardInterrupt", NULL, ""},
    {"Traceback (most recent call last):\n  File \"a\", line 1, in f\nE:\n", "E", NULL,
     ""},
    /* RQ's own lines, no traceback */
    {"Job stopped by user, work-horse terminated.", "Exception", NULL,
     "Job stopped by user, work-horse terminated."},
    {"Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); ", "Exception",
     NULL, "Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); "},
    {"Moved to FailedJobRegistry at 2026-12-07 10:00:00.123456\r\n", "Exception", NULL,
     "Moved to FailedJobRegistry at 2026-12-07 10:00:00.123456"},
    /* malformed */
    {"", "Exception", NULL, ""},
    {"\n\n", "Exception", NULL, ""},
    {"Traceback (most recent call last):\n", "Exception", NULL, ""},
    {"Traceback (most recent call last):\n  only frames\n    and more\n", "Exception",
     NULL, ""},
    {"Traceback (most recent call last):", "Exception", NULL, ""},
    {"9Type: x", "Exception", NULL, "9Type: x"},
    {"bad.: x", "Exception", NULL, "bad.: x"},
    {".x: y", "Exception", NULL, ".x: y"},
    {"a b: c", "Exception", NULL, "a b: c"},
    {"a.b.C: m", "C", "a.b", "m"},
    {"\xff\xfe: m", "Exception", NULL, "\xff\xfe: m"},
};

static void eq(const char *p, size_t n, const char *want)
{
    ck_assert_msg(n == strlen(want) && !memcmp(p, want, n), "'%.*s' != '%s'", (int)n, p,
                  want);
}

START_TEST(test_exc_parse)
{
    struct rq_exc x;
    rq_exc_parse(excs[_i].text, strlen(excs[_i].text), &x);
    eq(x.type, x.type_len, excs[_i].type);
    if (excs[_i].module)
        eq(x.module, x.module_len, excs[_i].module);
    else
        ck_assert_ptr_null(x.module);
    eq(x.message, x.message_len, excs[_i].message);
}
END_TEST

START_TEST(test_exc_parse_null_and_nul)
{
    struct rq_exc x;
    static const char t[] = "Val\0ue: x";
    rq_exc_parse(NULL, 5, &x);
    eq(x.type, x.type_len, "Exception");
    ck_assert_uint_eq(x.message_len, 0);
    rq_exc_parse(t, sizeof(t) - 1, &x);
    eq(x.type, x.type_len, "Exception");
    ck_assert_uint_eq(x.message_len, sizeof(t) - 1);
}
END_TEST

/* ------------------------------------------------------------------ metas */

static struct rq_limits lim;

static void setup(void)
{
    rq_limits_init(&lim);
}

/* base64(zlib(text)): a results stream's exc_string. */
static char *exc_string(const char *text)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(rq_exc_string(&b, text, strlen(text)), 0);
    return buf_detach(&b);
}

static char *b64(const void *p, size_t n)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(base64_encode(p, n, &b), 0);
    return buf_detach(&b);
}

static char *zlib_of(const char *text, size_t *n)
{
    uLongf cap = compressBound(strlen(text));
    char *out = malloc(cap);
    ck_assert_int_eq(compress((Bytef *)out, &cap, (const Bytef *)text, strlen(text)),
                     Z_OK);
    *n = cap;
    return out;
}

static void set(const char **p, size_t *n, const char *s)
{
    *p = s;
    *n = s ? strlen(s) : 0;
}

static struct rq_state_in job(const char *status, const char *ended_at, const char *type,
                              const char *value)
{
    struct rq_state_in in;
    memset(&in, 0, sizeof(in));
    in.task_id = "J";
    set(&in.status, &in.status_len, status);
    set(&in.ended_at, &in.ended_at_len, ended_at);
    set(&in.type, &in.type_len, type);
    set(&in.value, &in.value_len, value);
    return in;
}

/* The meta of in, parsed; NULL when there is none. */
static cJSON *meta_of(const struct rq_state_in *in)
{
    char *m = NULL;
    size_t n = 7;
    cJSON *v = NULL;
    struct cr_err err;
    ck_assert_int_eq(rq_state_meta(in, &lim, &m, &n), 0);
    if (!m) {
        ck_assert_uint_eq(n, 0);
        return NULL;
    }
    ck_assert_uint_eq(n, strlen(m));
    ck_assert_msg(py_json_parse(m, n, &v, &err) == 0, "%s: %s", m, err.msg);
    ck_assert_str_eq(cJSON_GetObjectItem(v, "task_id")->valuestring, "J");
    cr_free(m);
    return v;
}

static const char *str_of(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int is_null(const cJSON *o, const char *k)
{
    return cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, k));
}

#define TS "2026-12-07T08:24:38.040468Z"
#define ISO "2026-12-07T08:24:38.040468+00:00"
/* 'echo: Hello' pickled as CPython writes it, and {'text':'hi','n':7} */
#define ECHO_B64 "gAWVDwAAAAAAAACMC2VjaG86IEhlbGxvlC4="
#define DICT_B64 "gAWVFwAAAAAAAAB9lCiMBHRleHSUjAJoaZSMAW6USwd1Lg=="

START_TEST(test_meta_success)
{
    struct rq_state_in in = job("finished", TS, "1", ECHO_B64);
    cJSON *m = meta_of(&in), *r;
    char *js;
    ck_assert_str_eq(str_of(m, "status"), "SUCCESS");
    ck_assert_str_eq(str_of(m, "result"), "echo: Hello");
    ck_assert(is_null(m, "traceback"));
    ck_assert_str_eq(str_of(m, "date_done"), ISO);
    cJSON_Delete(m);

    in = job("finished", TS, "1", DICT_B64);
    m = meta_of(&in);
    r = cJSON_GetObjectItem(m, "result");
    ck_assert_str_eq(str_of(r, "text"), "hi");
    ck_assert_int_eq(cJSON_GetObjectItem(r, "n")->valueint, 7);
    cJSON_Delete(m);

    /* JSONSerializer: json.dumps(value).encode() */
    js = b64("{\"a\": [1, 2.5]}", 15);
    in = job("finished", TS, "1", js);
    m = meta_of(&in);
    r = cJSON_GetObjectItem(m, "result");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(r, "a")), 2);
    cJSON_Delete(m);
    free(js);

    /* None: no return_value in the entry */
    in = job("finished", TS, "1", NULL);
    m = meta_of(&in);
    ck_assert_str_eq(str_of(m, "status"), "SUCCESS");
    ck_assert(is_null(m, "result"));
    cJSON_Delete(m);
}
END_TEST

/* A finished job whose result cannot be read is still SUCCESS; its result
 * reads as null, and nothing it holds is run or trusted. */
START_TEST(test_meta_success_unreadable)
{
    static const unsigned char global[] = "\x80\x04\x63os\nsystem\n\x2e";
    static const unsigned char trunc[] = "\x80\x04\x8c\x0b"
                                         "echo";
    char *g = b64(global, sizeof(global) - 1), *t = b64(trunc, sizeof(trunc) - 1);
    char *notjson = b64("{nope", 5);
    const char *values[] = {g, t, notjson, "!!!not base64!!!", "gAWV", "", "===="};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        struct rq_state_in in = job("finished", TS, "1", values[i]);
        cJSON *m = meta_of(&in);
        ck_assert_str_eq(str_of(m, "status"), "SUCCESS");
        ck_assert_msg(is_null(m, "result"), "value %zu", i);
        cJSON_Delete(m);
    }
    {
        /* the newest entry is a failure (a later run): no result */
        struct rq_state_in in = job("finished", TS, "2", ECHO_B64);
        cJSON *m = meta_of(&in);
        ck_assert(is_null(m, "result"));
        ck_assert(is_null(m, "traceback"));
        cJSON_Delete(m);
        in = job("finished", TS, "9", ECHO_B64);
        m = meta_of(&in);
        ck_assert(is_null(m, "result"));
        cJSON_Delete(m);
    }
    free(g);
    free(t);
    free(notjson);
}
END_TEST

START_TEST(test_meta_over_limits)
{
    struct rq_state_in in = job("finished", TS, "1", ECHO_B64);
    struct rq_limits small = lim;
    char *m = NULL;
    size_t n;
    small.max_data_bytes = 8; /* the pickle is 26 bytes */
    ck_assert_int_eq(rq_state_meta(&in, &small, &m, &n), 0);
    ck_assert_ptr_nonnull(strstr(m, "\"result\": null"));
    cr_free(m);
    /* a traceback inflating past the limit reads as none */
    {
        char *text = malloc(100001), *es;
        memset(text, 'x', 100000);
        memcpy(text, "ValueError: ", 12);
        text[100000] = '\0';
        es = exc_string(text);
        in = job("failed", TS, "2", es);
        small = lim;
        small.max_inflated_bytes = 1000;
        ck_assert_int_eq(rq_state_meta(&in, &small, &m, &n), 0);
        ck_assert_ptr_nonnull(strstr(m, "\"status\": \"FAILURE\", \"result\": null, "
                                        "\"traceback\": null"));
        cr_free(m);
        free(es);
        free(text);
    }
}
END_TEST

START_TEST(test_meta_failure)
{
    const char *tb =
        "Traceback (most recent call last):\n  File \"celeriac\", line 1, in "
        "mymod.llm_inference\nopenai.BadRequestError: bad prompt\n";
    char *es = exc_string(tb), *zi;
    size_t zn;
    struct rq_state_in in = job("failed", TS, "2", es);
    cJSON *m = meta_of(&in), *r;
    ck_assert_str_eq(str_of(m, "status"), "FAILURE");
    r = cJSON_GetObjectItem(m, "result");
    ck_assert_str_eq(str_of(r, "exc_type"), "BadRequestError");
    ck_assert_str_eq(str_of(r, "exc_module"), "openai");
    ck_assert_str_eq(
        cJSON_GetArrayItem(cJSON_GetObjectItem(r, "exc_message"), 0)->valuestring,
        "bad prompt");
    ck_assert_str_eq(str_of(m, "traceback"), tb);
    ck_assert_str_eq(str_of(m, "date_done"), ISO);
    cJSON_Delete(m);

    /* 1.13's cleanup of an abandoned job: exc_info in the hash, no entry */
    zi = zlib_of("Moved to FailedJobRegistry at 2026-12-07 10:00:00", &zn);
    in = job("failed", TS, NULL, NULL);
    in.exc_info = zi;
    in.exc_info_len = zn;
    m = meta_of(&in);
    r = cJSON_GetObjectItem(m, "result");
    ck_assert_str_eq(str_of(r, "exc_type"), "Exception");
    ck_assert_ptr_null(cJSON_GetObjectItem(r, "exc_module"));
    ck_assert_str_eq(
        cJSON_GetArrayItem(cJSON_GetObjectItem(r, "exc_message"), 0)->valuestring,
        "Moved to FailedJobRegistry at 2026-12-07 10:00:00");
    cJSON_Delete(m);
    /* the newest entry wins over the hash's exc_info */
    in.type = "2";
    in.type_len = 1;
    in.value = es;
    in.value_len = strlen(es);
    m = meta_of(&in);
    ck_assert_str_eq(str_of(m, "traceback"), tb);
    cJSON_Delete(m);
    /* exc_info not compressed: read as it is, as RQ falls back */
    in = job("failed", TS, NULL, NULL);
    in.exc_info = "KeyError: 'x'";
    in.exc_info_len = 13;
    m = meta_of(&in);
    ck_assert_str_eq(str_of(cJSON_GetObjectItem(m, "result"), "exc_type"), "KeyError");
    cJSON_Delete(m);
    /* nothing to say why */
    in = job("failed", "not a date", "1", ECHO_B64);
    m = meta_of(&in);
    ck_assert_str_eq(str_of(m, "status"), "FAILURE");
    ck_assert(is_null(m, "result"));
    ck_assert(is_null(m, "traceback"));
    ck_assert(is_null(m, "date_done"));
    cJSON_Delete(m);
    free(zi);
    free(es);
}
END_TEST

START_TEST(test_meta_revoked_and_waiting)
{
    char *es = exc_string("Job stopped by user, work-horse terminated.");
    struct rq_state_in in = job("stopped", TS, "2", es);
    cJSON *m = meta_of(&in), *r;
    ck_assert_str_eq(str_of(m, "status"), "REVOKED");
    r = cJSON_GetObjectItem(m, "result");
    ck_assert_str_eq(str_of(r, "exc_type"), "Exception");
    cJSON_Delete(m);
    in = job("canceled", TS, NULL, NULL);
    m = meta_of(&in);
    ck_assert_str_eq(str_of(m, "status"), "REVOKED");
    ck_assert(is_null(m, "result"));
    ck_assert_str_eq(str_of(m, "date_done"), ISO);
    cJSON_Delete(m);
    /* not ended: no result, no date, whatever the hash holds */
    for (int i = 0; i < 3; i++) {
        static const char *const st[] = {"started", "queued", "scheduled"};
        static const char *const want[] = {"STARTED", "PENDING", "PENDING"};
        in = job(st[i], TS, "1", ECHO_B64);
        m = meta_of(&in);
        ck_assert_str_eq(str_of(m, "status"), want[i]);
        ck_assert(is_null(m, "result"));
        ck_assert(is_null(m, "date_done"));
        cJSON_Delete(m);
    }
    /* unknown or absent status: no meta at all */
    in = job("weird", TS, "1", ECHO_B64);
    ck_assert_ptr_null(meta_of(&in));
    in = job(NULL, NULL, NULL, NULL);
    ck_assert_ptr_null(meta_of(&in));
    free(es);
}
END_TEST

START_TEST(test_meta_oom_sweep)
{
    const char *tb =
        "Traceback (most recent call last):\n  File \"celeriac\", line 1, in "
        "f\nrq.timeouts.JobTimeoutException: too long\n";
    char *es = exc_string(tb);
    struct rq_state_in ins[3];
    ins[0] = job("finished", TS, "1", DICT_B64);
    ins[1] = job("failed", TS, "2", es);
    ins[2] = job("started", NULL, NULL, NULL);
    for (int i = 0; i < 3; i++) {
        char *want = NULL;
        size_t wn;
        long k;
        ck_assert_int_eq(rq_state_meta(&ins[i], &lim, &want, &wn), 0);
        ck_assert_ptr_nonnull(want);
        for (k = 1; k < 10000; k++) {
            char *m = (char *)1;
            size_t n = 1;
            long failed;
            int rc;
            cr_alloc_fail_after(k);
            rc = rq_state_meta(&ins[i], &lim, &m, &n);
            failed = cr_alloc_failed();
            cr_alloc_fail_after(0);
            if (failed == 0) {
                ck_assert_int_eq(rc, 0);
                ck_assert_str_eq(m, want);
                cr_free(m);
                break;
            }
            ck_assert_msg(rc == CR_ENOMEM, "job %d pass %ld: rc %d", i, k, rc);
            ck_assert_ptr_null(m);
            ck_assert_uint_eq(n, 0);
        }
        ck_assert_int_lt(k, 10000);
        cr_free(want);
    }
    free(es);
}
END_TEST

/* ------------------------------------------------------------------ holds */

START_TEST(test_hold)
{
    /* ended at TS; now_us relative to it */
    int64_t ended;
    struct rq_state_in in;
    static const struct {
        const char *status, *stream, *ended_at;
        int64_t after_ms;
        int want;
    } v[] = {
        {"finished", "PROGRESS", TS, 100, 1},
        {"finished", "STARTED", TS, 9999, 1},
        {"failed", "PROGRESS", TS, 0, 1},
        {"stopped", "PROGRESS", TS, -3000, 1}, /* the worker's clock ahead */
        {"finished", "PROGRESS", TS, 10000, 0},
        {"finished", "PROGRESS", TS, -10000, 0},
        {"finished", "SUCCESS", TS, 100, 0},
        {"failed", "FAILURE", TS, 100, 0},
        {"stopped", "REVOKED", TS, 100, 0},
        {"finished", NULL, TS, 100, 0}, /* no stream: a Python worker's job */
        {"started", "PROGRESS", TS, 100, 0},
        {"canceled", "PROGRESS", TS, 100, 0},
        {"queued", "RETRY", TS, 100, 0},
        {"finished", "PROGRESS", "", 100, 0},
        {"finished", "PROGRESS", NULL, 100, 0},
        {"finished", "PROGRESS", "yesterday", 100, 0},
        {"finished", "RETRY", TS, 100, 1},
    };
    ck_assert_int_eq(iso8601_parse(TS, &ended), 0);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        in = job(v[i].status, v[i].ended_at, NULL, NULL);
        ck_assert_msg(rq_state_hold(&in, v[i].stream,
                                    v[i].stream ? strlen(v[i].stream) : 0,
                                    ended + v[i].after_ms * 1000) == v[i].want,
                      "case %zu", i);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rq_state");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_statuses, 0,
                        (int)(sizeof(statuses) / sizeof(statuses[0])));
    tcase_add_test(tc, test_status_edges);
    tcase_add_loop_test(tc, test_exc_parse, 0, (int)(sizeof(excs) / sizeof(excs[0])));
    tcase_add_test(tc, test_exc_parse_null_and_nul);
    tcase_add_test(tc, test_meta_success);
    tcase_add_test(tc, test_meta_success_unreadable);
    tcase_add_test(tc, test_meta_over_limits);
    tcase_add_test(tc, test_meta_failure);
    tcase_add_test(tc, test_meta_revoked_and_waiting);
    tcase_add_test(tc, test_meta_oom_sweep);
    tcase_add_test(tc, test_hold);
    suite_add_tcase(s, tc);
    return s;
}
