/* test_rq_job.c -- RQ's job hash and worker fields (protocol/rq_job.c): key
 * names as RQ spells them, the timestamp text, the job hash fields (whole,
 * malformed, every prefix of a captured hash), the heartbeat and retry rules
 * of rq-protocol.md section 8, and the failure text with an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "unit.h"
#include "protocol/rq_job.h"
#include "util/alloc.h"
#include "util/base64.h"
#include "util/buf.h"

START_TEST(test_keys)
{
    static const struct {
        enum rq_key_kind kind;
        const char *want;
    } v[] = {
        {RQ_KEY_QUEUE, "rq:queue:x"},
        {RQ_KEY_JOB, "rq:job:x"},
        {RQ_KEY_DEPENDENTS, "rq:job:x:dependents"},
        {RQ_KEY_DEPENDENCIES, "rq:job::x:dependencies"},
        {RQ_KEY_RESULTS, "rq:results:x"},
        {RQ_KEY_STARTED, "rq:wip:x"},
        {RQ_KEY_FINISHED, "rq:finished:x"},
        {RQ_KEY_FAILED, "rq:failed:x"},
        {RQ_KEY_DEFERRED, "rq:deferred:x"},
        {RQ_KEY_SCHEDULED, "rq:scheduled:x"},
        {RQ_KEY_WORKER, "rq:worker:x"},
        {RQ_KEY_WORKERS_OF, "rq:workers:x"},
        {RQ_KEY_PUBSUB, "rq:pubsub:x"},
        {RQ_KEY_SCHED_LOCK, "rq:scheduler-lock:x"},
        {RQ_KEY_EXECUTION, "rq:execution:x"},
        {RQ_KEY_EXECUTIONS, "rq:executions:x"},
    };
    char k[RQ_KEY_SIZE], big[RQ_KEY_MAX_NAME + 2];
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ck_assert_int_eq(rq_key(k, v[i].kind, "x"), 0);
        ck_assert_str_eq(k, v[i].want);
    }
    ck_assert_int_eq(rq_key(k, RQ_KEY_JOB, ""), CR_EINVAL);
    ck_assert_str_eq(k, "");
    ck_assert_int_eq(rq_key(k, RQ_KEY_JOB, NULL), CR_EINVAL);
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    ck_assert_int_eq(rq_key(k, RQ_KEY_SCHED_LOCK, big), CR_EINVAL);
    big[RQ_KEY_MAX_NAME] = '\0';
    ck_assert_int_eq(rq_key(k, RQ_KEY_DEPENDENCIES, big), 0);
    ck_assert_uint_eq(strlen(k),
                      strlen("rq:job::") + RQ_KEY_MAX_NAME + strlen(":dependencies"));
}
END_TEST

START_TEST(test_ts)
{
    char ts[RQ_TS_SIZE];
    /* 2026-12-07T08:24:38.040468Z, the capture's enqueued job */
    rq_ts_format(ts, 1796631878040468LL);
    ck_assert_str_eq(ts, "2026-12-07T08:24:38.040468Z");
    rq_ts_format(ts, 0);
    ck_assert_str_eq(ts, "1970-01-01T00:00:00.000000Z");
    rq_ts_format(ts, 1796631878000001LL);
    ck_assert_str_eq(ts, "2026-12-07T08:24:38.000001Z");
    rq_ts_format(ts, -1);
    ck_assert_str_eq(ts, "1969-12-31T23:59:59.999999Z");
}
END_TEST

/* A hash as RQ 1.13's enqueue writes it (rq-protocol.md 2), plus retry fields. */
static const char *const captured[] = {
    "created_at",
    "2026-12-07T08:24:38.040468Z",
    "data",
    "x\x9c"
    "k`",
    "success_callback_name",
    "",
    "failure_callback_name",
    "",
    "started_at",
    "",
    "ended_at",
    "",
    "last_heartbeat",
    "",
    "worker_name",
    "",
    "origin",
    "default",
    "description",
    "tasks.llm_inference('Hello')",
    "enqueued_at",
    "2026-12-07T08:24:38.042564Z",
    "timeout",
    "180",
    "status",
    "queued",
    "retries_left",
    "2",
    "retry_intervals",
    "[1, 2]",
    "result_ttl",
    "-1",
    "meta",
    "\x80\x05}\x94.",
};
#define NCAPTURED (sizeof(captured) / sizeof(captured[0]))

static void lens_of(const char *const *f, size_t *len, size_t n)
{
    for (size_t i = 0; i < n; i++)
        len[i] = strlen(f[i]);
}

START_TEST(test_parse_captured)
{
    size_t len[NCAPTURED];
    struct rq_job j;
    struct cr_err err = {0};
    lens_of(captured, len, NCAPTURED);
    ck_assert_int_eq(rq_job_parse(&j, captured, len, NCAPTURED, &err), 0);
    ck_assert_uint_eq(j.data_len, 4);
    ck_assert_int_eq(memcmp(j.data, "x\x9ck`", 4), 0);
    ck_assert_uint_eq(j.origin_len, 7);
    ck_assert_int_eq(memcmp(j.origin, "default", 7), 0);
    ck_assert_int_eq(memcmp(j.status, "queued", j.status_len), 0);
    ck_assert_int_eq(j.timeout_s, 180);
    ck_assert_int_eq(j.result_ttl_s, -1);
    ck_assert_int_eq(j.failure_ttl_s, -2);
    ck_assert_int_eq(j.retries_left, 2);
    ck_assert_int_eq(j.nintervals, 2);
    ck_assert_int_eq(j.intervals[0], 1);
    ck_assert_int_eq(j.intervals[1], 2);
    ck_assert_ptr_null(j.callback);
    ck_assert_uint_eq(j.meta_len, 5);
    ck_assert_int_eq(memcmp(j.meta, "\x80\x05}\x94.", 5), 0);
}
END_TEST

/* Every whole-pair prefix parses or says that data is missing; odd counts
 * are refused. */
START_TEST(test_parse_prefixes)
{
    size_t len[NCAPTURED];
    lens_of(captured, len, NCAPTURED);
    for (size_t n = 0; n <= NCAPTURED; n++) {
        struct rq_job j;
        struct cr_err err = {0};
        int rc = rq_job_parse(&j, captured, len, n, &err);
        if (n % 2)
            ck_assert_int_eq(rc, CR_EDECODE);
        else if (n < 4)
            ck_assert_msg(rc == CR_EDECODE && strstr(err.msg, "no 'data'"), "%zu: %s", n,
                          err.msg);
        else
            ck_assert_int_eq(rc, 0);
    }
}
END_TEST

START_TEST(test_parse_defaults)
{
    const char *f[] = {"data", "", "timeout", "", "retry_intervals", ""};
    size_t len[6];
    struct rq_job j;
    struct cr_err err = {0};
    lens_of(f, len, 6);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 6, &err), 0);
    ck_assert_int_eq(j.timeout_s, RQ_DEFAULT_TIMEOUT_S);
    ck_assert_int_eq(j.result_ttl_s, -2);
    ck_assert_int_eq(j.retries_left, 0);
    ck_assert_int_eq(j.nintervals, 0);
    ck_assert_uint_eq(j.origin_len, 0);
    ck_assert_ptr_null(j.meta);
}
END_TEST

static const struct {
    const char *field, *value;
} malformed[] = {
    {"timeout", "1h"},
    {"timeout", "18 0"},
    {"timeout", "+5"},
    {"timeout", "99999999999999999999999"},
    {"result_ttl", "x"},
    {"failure_ttl", "1.5"},
    {"retries_left", "-"},
    {"retry_intervals", "1, 2"},
    {"retry_intervals", "[1, 2"},
    {"retry_intervals", "[1,, 2]"},
    {"retry_intervals", "[-1]"},
    {"retry_intervals", "[1] x"},
    {"retry_intervals", "[,]"},
    {"retry_intervals", "[99999999999999999999]"},
};

START_TEST(test_parse_malformed)
{
    const char *f[4] = {"data", "x", malformed[_i].field, malformed[_i].value};
    size_t len[4];
    struct rq_job j;
    struct cr_err err = {0};
    lens_of(f, len, 4);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 4, &err), CR_EDECODE);
    ck_assert_msg(strstr(err.msg, malformed[_i].field) != NULL, "%s", err.msg);
}
END_TEST

START_TEST(test_parse_intervals_forms)
{
    const char *f[4] = {"data", "x", "retry_intervals", NULL};
    static const char *const ok[] = {"[]", "[5]", " [1,2 , 3] ", "[0, 0]"};
    static const int want_n[] = {0, 1, 3, 2};
    char many[1024];
    size_t len[4], k = 0;
    struct rq_job j;
    struct cr_err err = {0};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        f[3] = ok[i];
        lens_of(f, len, 4);
        ck_assert_int_eq(rq_job_parse(&j, f, len, 4, &err), 0);
        ck_assert_int_eq(j.nintervals, want_n[i]);
    }
    /* one more than RQ_MAX_INTERVALS */
    many[k++] = '[';
    for (int i = 0; i <= RQ_MAX_INTERVALS; i++)
        k += (size_t)snprintf(many + k, sizeof(many) - k, i ? ", %d" : "%d", i);
    many[k++] = ']';
    many[k] = '\0';
    f[3] = many;
    lens_of(f, len, 4);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 4, &err), CR_EDECODE);
}
END_TEST

START_TEST(test_parse_callbacks)
{
    const char *f[] = {"data",
                       "x",
                       "success_callback_name",
                       "",
                       "failure_callback_name",
                       "tasks.report",
                       "stopped_callback_name",
                       "tasks.other"};
    size_t len[8];
    struct rq_job j;
    struct cr_err err = {0};
    lens_of(f, len, 8);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 8, &err), 0);
    ck_assert_ptr_nonnull(j.callback);
    ck_assert_int_eq(memcmp(j.callback, "tasks.report", j.callback_len), 0);
    ck_assert_str_eq(j.callback_field, "on_failure");
    f[3] = "tasks.ok";
    lens_of(f, len, 8);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 8, &err), 0);
    ck_assert_str_eq(j.callback_field, "on_success");
    f[3] = "";
    f[5] = "";
    lens_of(f, len, 8);
    ck_assert_int_eq(rq_job_parse(&j, f, len, 8, &err), 0);
    ck_assert_str_eq(j.callback_field, "on_stopped");
}
END_TEST

START_TEST(test_heartbeat_ttl)
{
    /* the capture: defaults give 90, job_timeout=2 gave 62 */
    ck_assert_int_eq(rq_heartbeat_ttl(180, 0, 30), 90);
    ck_assert_int_eq(rq_heartbeat_ttl(2, 0, 30), 62);
    ck_assert_int_eq(rq_heartbeat_ttl(-1, 1000, 30), 90);
    ck_assert_int_eq(rq_heartbeat_ttl(0, 5, 30), 90);
    ck_assert_int_eq(rq_heartbeat_ttl(100, 90, 30), 70);
}
END_TEST

START_TEST(test_retry_interval)
{
    struct rq_job j;
    memset(&j, 0, sizeof(j));
    ck_assert_int_eq(rq_retry_interval(&j), 0);
    /* Retry(max=3, interval=[10, 30, 60]) waits 10, 30, 60 */
    j.nintervals = 3;
    j.intervals[0] = 10;
    j.intervals[1] = 30;
    j.intervals[2] = 60;
    j.retries_left = 3;
    ck_assert_int_eq(rq_retry_interval(&j), 10);
    j.retries_left = 2;
    ck_assert_int_eq(rq_retry_interval(&j), 30);
    j.retries_left = 1;
    ck_assert_int_eq(rq_retry_interval(&j), 60);
    /* Retry(max=5, interval=[10, 60]): 10, 10, 10, 10, 60 */
    j.nintervals = 2;
    j.intervals[1] = 60;
    for (long left = 5; left >= 2; left--) {
        j.retries_left = left;
        ck_assert_int_eq(rq_retry_interval(&j), 10);
    }
    j.retries_left = 1;
    ck_assert_int_eq(rq_retry_interval(&j), 60);
}
END_TEST

START_TEST(test_expiry_score)
{
    char s[32];
    rq_expiry_score(s, 1000, 500, 1);
    ck_assert_str_eq(s, "1500");
    rq_expiry_score(s, 1000, -1, 1);
    ck_assert_str_eq(s, "+inf");
    rq_expiry_score(s, 1000, -1, 0);
    ck_assert_str_eq(s, "-1");
    rq_expiry_score(s, 1796631878, RQ_DEFAULT_FAILURE_TTL_S, 0);
    ck_assert_str_eq(s, "1828167878");
}
END_TEST

static char *inflate_b64(const char *b64, size_t n)
{
    unsigned char *z = malloc(n);
    long zn = base64_decode(b64, n, z, BASE64_STRICT);
    uLongf outn = 65536;
    char *out = malloc(outn + 1);
    ck_assert_int_ge(zn, 0);
    ck_assert_int_eq(uncompress((Bytef *)out, &outn, z, (uLong)zn), Z_OK);
    out[outn] = '\0';
    free(z);
    return out;
}

START_TEST(test_exc)
{
    struct buf t, s;
    char *back;
    const char *want =
        "Traceback (most recent call last):\n"
        "  File \"celeriac\", line 1, in tasks.f\n"
        "celeriac.UnsupportedJob: no task mapped for 'tasks.f' two lines\n";
    buf_init(&t);
    buf_init(&s);
    ck_assert_int_eq(rq_exc_text(&t, "tasks.f", "celeriac.UnsupportedJob",
                                 "no task mapped for 'tasks.f'\ntwo\rlines"),
                     0);
    ck_assert_str_eq(t.data, want);
    ck_assert_int_eq(rq_exc_string(&s, t.data, t.len), 0);
    back = inflate_b64(s.data, s.len);
    ck_assert_str_eq(back, want);
    free(back);
    buf_reset(&t);
    ck_assert_int_eq(rq_exc_text(&t, NULL, "E", NULL), 0);
    ck_assert_ptr_nonnull(strstr(t.data, "in <job>\nE: \n"));
    buf_release(&t);
    buf_release(&s);
}
END_TEST

START_TEST(test_exc_oom_sweep)
{
    long k;
    for (k = 1; k < 1000; k++) {
        struct buf t, s;
        long failed;
        int rc;
        buf_init(&t);
        buf_init(&s);
        cr_alloc_fail_after(k);
        rc = rq_exc_text(&t, "f", "ValueError", "bad");
        if (!rc)
            rc = rq_exc_string(&s, t.data, t.len);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            char *back;
            ck_assert_int_eq(rc, 0);
            back = inflate_b64(s.data, s.len);
            ck_assert_str_eq(back, t.data);
            free(back);
            buf_release(&t);
            buf_release(&s);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        buf_release(&t);
        buf_release(&s);
    }
    ck_assert_int_lt(k, 1000);
}
END_TEST

static const struct {
    const char *in;
    int rc;
    int kind;
    const char *id;
} commands[] = {
    {"{\"command\": \"shutdown\"}", 0, RQ_CMD_SHUTDOWN, ""},
    {"{\"command\": \"kill-horse\"}", 0, RQ_CMD_KILL_HORSE, ""},
    {"{\"command\": \"stop-job\", \"job_id\": \"abc-1\"}", 0, RQ_CMD_STOP_JOB, "abc-1"},
    {"{\"command\": \"stop-job\"}", CR_EDECODE, 0, NULL},
    {"{\"command\": \"stop-job\", \"job_id\": \"\"}", CR_EDECODE, 0, NULL},
    {"{\"command\": \"stop-job\", \"job_id\": 7}", CR_EDECODE, 0, NULL},
    {"{\"command\": \"reboot\"}", CR_EDECODE, 0, NULL},
    {"{\"command\": 1}", CR_EDECODE, 0, NULL},
    {"[\"shutdown\"]", CR_EDECODE, 0, NULL},
    {"{\"command\": \"shutdown\"", CR_EDECODE, 0, NULL},
    {"", CR_EDECODE, 0, NULL},
};

START_TEST(test_command)
{
    struct rq_command c;
    struct cr_err err = {0};
    const char *in = commands[_i].in;
    int rc = rq_command_parse(in, strlen(in), &c, &err);
    ck_assert_int_eq(rc, commands[_i].rc);
    if (rc == 0) {
        ck_assert_int_eq(c.kind, commands[_i].kind);
        ck_assert_str_eq(c.job_id, commands[_i].id);
    }
    /* every proper prefix of a good command is refused */
    for (size_t n = 0; rc == 0 && n < strlen(in); n++)
        ck_assert_int_eq(rq_command_parse(in, n, &c, &err), CR_EDECODE);
}
END_TEST

START_TEST(test_command_long_id)
{
    char in[RQ_MAX_ID + 64], id[RQ_MAX_ID + 2];
    struct rq_command c;
    struct cr_err err = {0};
    memset(id, 'x', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    snprintf(in, sizeof(in), "{\"command\": \"stop-job\", \"job_id\": \"%s\"}", id);
    ck_assert_int_eq(rq_command_parse(in, strlen(in), &c, &err), CR_EDECODE);
    id[RQ_MAX_ID] = '\0';
    snprintf(in, sizeof(in), "{\"command\": \"stop-job\", \"job_id\": \"%s\"}", id);
    ck_assert_int_eq(rq_command_parse(in, strlen(in), &c, &err), 0);
    ck_assert_str_eq(c.job_id, id);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rq_job");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_keys);
    tcase_add_test(tc, test_ts);
    tcase_add_test(tc, test_parse_captured);
    tcase_add_test(tc, test_parse_prefixes);
    tcase_add_test(tc, test_parse_defaults);
    tcase_add_loop_test(tc, test_parse_malformed, 0,
                        (int)(sizeof(malformed) / sizeof(malformed[0])));
    tcase_add_test(tc, test_parse_intervals_forms);
    tcase_add_test(tc, test_parse_callbacks);
    tcase_add_test(tc, test_heartbeat_ttl);
    tcase_add_test(tc, test_retry_interval);
    tcase_add_test(tc, test_expiry_score);
    tcase_add_test(tc, test_exc);
    tcase_add_test(tc, test_exc_oom_sweep);
    tcase_add_loop_test(tc, test_command, 0,
                        (int)(sizeof(commands) / sizeof(commands[0])));
    tcase_add_test(tc, test_command_long_id);
    suite_add_tcase(s, tc);
    return s;
}
