/* test_celery_events.c -- Celery event JSON: exact bodies, reprs, offsets, OOM. */
#include <check.h>
#include <string.h>

#include "protocol/celery_events.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

static const struct cev_common common = {"celery@h", 0, 42, 7, 1700000000.25};

static struct cev_task task_of(enum cev_task_type type)
{
    struct cev_task t;
    memset(&t, 0, sizeof(t));
    t.type = type;
    t.uuid = "id1";
    return t;
}

/* ------------------------------------------------------------ task events */

static const struct task_vec {
    enum cev_task_type type;
    int llm;
    const char *want;
} task_vecs[] = {
    {CEV_TASK_RECEIVED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"name\": \"llm.generate\", \"args\": \"('hi',)\", "
     "\"kwargs\": \"{}\", \"root_id\": \"id1\", \"parent_id\": null, \"retries\": 2, "
     "\"eta\": \"2030-01-01T00:00:00+00:00\", \"expires\": null, "
     "\"timestamp\": 1700000000.25, \"type\": \"task-received\"}"},
    {CEV_TASK_STARTED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"timestamp\": 1700000000.25, \"type\": \"task-started\"}"},
    {CEV_TASK_SUCCEEDED, 1,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"result\": \"'text'\", \"runtime\": 1.5, \"model\": \"m1\", "
     "\"provider\": \"p1\", \"prompt_tokens\": 12, \"completion_tokens\": 16, \"ttft\": "
     "0.25, "
     "\"tokens_per_second\": 12.8, \"timestamp\": 1700000000.25, "
     "\"type\": \"task-succeeded\"}"},
    {CEV_TASK_SUCCEEDED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"result\": \"'text'\", \"runtime\": 1.5, "
     "\"timestamp\": 1700000000.25, \"type\": \"task-succeeded\"}"},
    {CEV_TASK_FAILED, 1,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"exception\": \"ValueError('bad')\", \"traceback\": \"tb\", "
     "\"model\": \"m1\", \"provider\": \"p1\", \"prompt_tokens\": 12, "
     "\"completion_tokens\": 16, \"ttft\": 0.25, \"tokens_per_second\": 12.8, "
     "\"timestamp\": 1700000000.25, "
     "\"type\": \"task-failed\"}"},
    {CEV_TASK_RETRIED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"exception\": \"ValueError('bad')\", \"traceback\": \"tb\", "
     "\"timestamp\": 1700000000.25, \"type\": \"task-retried\"}"},
    {CEV_TASK_REJECTED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"requeue\": false, \"timestamp\": 1700000000.25, "
     "\"type\": \"task-rejected\"}"},
    {CEV_TASK_REVOKED, 0,
     "{\"hostname\": \"celery@h\", \"utcoffset\": 0, \"pid\": 42, \"clock\": 7, "
     "\"uuid\": \"id1\", \"terminated\": true, \"signum\": 15, \"expired\": false, "
     "\"timestamp\": 1700000000.25, \"type\": \"task-revoked\"}"},
};

static void fill(struct cev_task *t, int llm)
{
    t->name = "llm.generate";
    t->args = "('hi',)";
    t->kwargs = "{}";
    t->root_id = "id1";
    t->retries = 2;
    t->eta = "2030-01-01T00:00:00+00:00";
    t->result = "'text'";
    t->runtime = 1.5;
    t->exception = "ValueError('bad')";
    t->traceback = "tb";
    t->terminated = 1;
    t->signum = 15;
    if (llm) {
        t->has_llm = 1;
        t->model = "m1";
        t->provider = "p1";
        t->prompt_tokens = 12;
        t->completion_tokens = 16;
        t->ttft = 0.25;
        t->tokens_per_second = cev_tokens_per_second(16, 1.5, 0.25);
    }
}

START_TEST(test_task_vectors)
{
    const struct task_vec *v = &task_vecs[_i];
    struct cev_task t = task_of(v->type);
    struct buf b;
    cJSON *parsed = NULL;
    fill(&t, v->llm);
    buf_init(&b);
    ck_assert_int_eq(cev_task_encode(&common, &t, &b), 0);
    ck_assert_str_eq(b.data, v->want);
    /* and it is strict JSON */
    ck_assert_int_eq(py_json_parse(b.data, b.len, &parsed, NULL), 0);
    cJSON_Delete(parsed);
    buf_release(&b);
}
END_TEST

START_TEST(test_llm_unknowns_are_null)
{
    struct cev_task t = task_of(CEV_TASK_SUCCEEDED);
    struct buf b;
    t.has_llm = 1;
    t.prompt_tokens = -1;
    t.completion_tokens = -1;
    t.ttft = -1;
    t.tokens_per_second = -1;
    buf_init(&b);
    ck_assert_int_eq(cev_task_encode(&common, &t, &b), 0);
    ck_assert_ptr_nonnull(strstr(b.data, "\"result\": \"None\""));
    ck_assert_ptr_nonnull(strstr(b.data,
                                 "\"prompt_tokens\": null, \"completion_tokens\": "
                                 "null, \"ttft\": null, \"tokens_per_second\": null"));
    ck_assert_ptr_null(strstr(b.data, "\"model\""));
    ck_assert_ptr_null(strstr(b.data, "\"provider\""));
    buf_release(&b);
}
END_TEST

START_TEST(test_task_malformed)
{
    struct cev_task t = task_of(CEV_TASK_STARTED);
    struct buf b;
    buf_init(&b);
    t.uuid = NULL;
    ck_assert_int_eq(cev_task_encode(&common, &t, &b), CR_EINVAL);
    t.uuid = "x";
    t.type = (enum cev_task_type)99;
    ck_assert_int_eq(cev_task_encode(&common, &t, &b), CR_EINVAL);
    ck_assert_str_eq(cev_task_type_name((enum cev_task_type)99), "task-unknown");
    ck_assert_uint_eq(b.len, 0);
    buf_release(&b);
}
END_TEST

/* ----------------------------------------------------------- worker events */

START_TEST(test_worker_events)
{
    struct cev_worker wk = {2.0,        3,       10,      {0.571, 0.325, 0.1449},
                            "celeriac", "0.1.0", "Linux", 0};
    struct cev_common c = common;
    struct buf b;
    buf_init(&b);
    c.utcoffset = -2;
    ck_assert_int_eq(cev_worker_encode(&c, "worker-heartbeat", &wk, &b), 0);
    ck_assert_str_eq(b.data,
                     "{\"hostname\": \"celery@h\", \"utcoffset\": -2, \"pid\": 42, "
                     "\"clock\": 7, \"freq\": 2.0, \"active\": 3, \"processed\": 10, "
                     "\"loadavg\": [0.57, 0.33, 0.14], \"sw_ident\": \"celeriac\", "
                     "\"sw_ver\": \"0.1.0\", \"sw_sys\": \"Linux\", "
                     "\"timestamp\": 1700000000.25, \"type\": \"worker-heartbeat\"}");
    buf_reset(&b);
    wk.sw_only = 1;
    wk.freq = 5;
    ck_assert_int_eq(cev_worker_encode(&c, "worker-heartbeat", &wk, &b), 0);
    ck_assert_str_eq(b.data,
                     "{\"hostname\": \"celery@h\", \"utcoffset\": -2, \"pid\": 42, "
                     "\"clock\": 7, \"freq\": 5.0, \"sw_ident\": \"celeriac\", "
                     "\"sw_ver\": \"0.1.0\", \"sw_sys\": \"Linux\", "
                     "\"timestamp\": 1700000000.25, \"type\": \"worker-heartbeat\"}");
    buf_reset(&b);
    ck_assert_int_eq(cev_worker_encode(&c, "worker-online", &wk, &b), 0);
    buf_reset(&b);
    ck_assert_int_eq(cev_worker_encode(&c, "worker-offline", &wk, &b), 0);
    buf_reset(&b);
    ck_assert_int_eq(cev_worker_encode(&c, "worker-bogus", &wk, &b), CR_EINVAL);
    ck_assert_int_eq(cev_worker_encode(&c, NULL, &wk, &b), CR_EINVAL);
    buf_release(&b);
}
END_TEST

/* ------------------------------------------------------------ small helpers */

static const struct {
    const char *type, *key;
} routing[] = {
    {"task-succeeded", "task.succeeded"},
    {"worker-heartbeat", "worker.heartbeat"},
    {"task-multi", "task.multi"},
    {"plain", "plain"},
    {"", ""},
};

START_TEST(test_routing_keys)
{
    char out[32];
    ck_assert_int_eq(cev_routing_key(routing[_i].type, out, sizeof(out)), 0);
    ck_assert_str_eq(out, routing[_i].key);
}
END_TEST

START_TEST(test_routing_key_too_long)
{
    char out[8];
    ck_assert_int_eq(cev_routing_key("task-succeeded", out, sizeof(out)), CR_ERANGE);
    ck_assert_int_eq(cev_routing_key("1234567", out, sizeof(out)), 0);
    ck_assert_int_eq(cev_routing_key("12345678", out, sizeof(out)), CR_ERANGE);
}
END_TEST

static const struct {
    long gmtoff;
    int want;
} offsets[] = {
    {0, 0},       {7200, -2},   {-18000, 5}, {19800, -6}, /* +5:30 floors */
    {-12600, 3},  {3600, -1},   {-3600, 1},  {20700, -6}, /* +5:45 */
    {46800, -13}, {-36000, 10}, {-34200, 9},              /* -9:30 */
};

START_TEST(test_utcoffset)
{
    ck_assert_int_eq(cev_utcoffset(offsets[_i].gmtoff), offsets[_i].want);
}
END_TEST

static const struct {
    const char *json;
    size_t max;
    const char *want;
    int rc;
} args_vecs[] = {
    {"[]", 0, "()", 0},
    {"[1]", 0, "(1,)", 0},
    {"[\"a\", 2]", 0, "('a', 2)", 0},
    {"[1.5, null, true, {\"k\": [1]}]", 0, "(1.5, None, True, {'k': [1]})", 0},
    {"[\"it's\"]", 0, "(\"it's\",)", 0},
    {"[\"abcdefghij\"]", 5, "('abc...", 0},
    {"{}", 0, "", CR_EINVAL},
    {"\"s\"", 0, "", CR_EINVAL},
};

START_TEST(test_args_repr)
{
    cJSON *v = NULL;
    struct buf b;
    ck_assert_int_eq(
        py_json_parse(args_vecs[_i].json, strlen(args_vecs[_i].json), &v, NULL), 0);
    buf_init(&b);
    buf_puts(&b, "x");
    ck_assert_int_eq(cev_args_repr(v, &b, args_vecs[_i].max), args_vecs[_i].rc);
    ck_assert_str_eq(b.data + 1, args_vecs[_i].want);
    buf_release(&b);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_exception_repr)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(cev_exception_repr("ValueError", "bad", &b), 0);
    ck_assert_str_eq(b.data, "ValueError('bad')");
    buf_reset(&b);
    ck_assert_int_eq(cev_exception_repr("KeyError", "it's", &b), 0);
    ck_assert_str_eq(b.data, "KeyError(\"it's\")");
    buf_reset(&b);
    ck_assert_int_eq(cev_exception_repr("RuntimeError", NULL, &b), 0);
    ck_assert_str_eq(b.data, "RuntimeError()");
    buf_reset(&b);
    ck_assert_int_eq(cev_exception_repr(NULL, "x\ny", &b), 0);
    ck_assert_str_eq(b.data, "Exception('x\\ny')");
    buf_release(&b);
}
END_TEST

START_TEST(test_tokens_per_second)
{
    ck_assert_double_eq_tol(cev_tokens_per_second(16, 1.5, 0.25), 12.8, 1e-9);
    ck_assert_double_eq_tol(cev_tokens_per_second(10, 2.0, -1), 5.0, 1e-9);
    /* ttft after elapsed (clock skew between phases): the whole time counts */
    ck_assert_double_eq_tol(cev_tokens_per_second(10, 2.0, 3.0), 5.0, 1e-9);
    ck_assert_double_eq_tol(cev_tokens_per_second(4, 0.5, 0.5), 4000.0, 1e-6);
    ck_assert(cev_tokens_per_second(0, 1.0, 0.1) < 0);
    ck_assert(cev_tokens_per_second(-1, 1.0, 0.1) < 0);
    ck_assert(cev_tokens_per_second(5, 0, 0) < 0);
}
END_TEST

/* --------------------------------------------------------------------- OOM */

START_TEST(test_oom_sweep)
{
    long n;
    for (int which = 0; which < 5; which++) {
        for (n = 1;; n++) {
            struct buf b;
            struct cev_task t = task_of(which == 0 ? CEV_TASK_RECEIVED : CEV_TASK_FAILED);
            struct cev_worker wk = {2.0, 1, 1, {0, 0, 0}, "a", "b", "c", 0};
            cJSON *args = NULL;
            int rc;
            fill(&t, 1);
            if (which == 3)
                ck_assert_int_eq(py_json_parse("[1, \"x\"]", 8, &args, NULL), 0);
            buf_init(&b);
            cr_alloc_fail_after(n);
            switch (which) {
            case 0:
            case 1:
                rc = cev_task_encode(&common, &t, &b);
                break;
            case 2:
                rc = cev_worker_encode(&common, "worker-online", &wk, &b);
                break;
            case 3:
                rc = cev_args_repr(args, &b, 0);
                break;
            default:
                rc = cev_exception_repr("ValueError", "message", &b);
                break;
            }
            cr_alloc_fail_after(0);
            buf_release(&b);
            cJSON_Delete(args);
            if (rc == 0)
                break;
            ck_assert_int_eq(rc, CR_ENOMEM);
        }
        ck_assert(n > 1);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("celery_events");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_task_vectors, 0,
                        sizeof(task_vecs) / sizeof(task_vecs[0]));
    tcase_add_test(tc, test_llm_unknowns_are_null);
    tcase_add_test(tc, test_task_malformed);
    tcase_add_test(tc, test_worker_events);
    tcase_add_loop_test(tc, test_routing_keys, 0, sizeof(routing) / sizeof(routing[0]));
    tcase_add_test(tc, test_routing_key_too_long);
    tcase_add_loop_test(tc, test_utcoffset, 0, sizeof(offsets) / sizeof(offsets[0]));
    tcase_add_loop_test(tc, test_args_repr, 0, sizeof(args_vecs) / sizeof(args_vecs[0]));
    tcase_add_test(tc, test_exception_repr);
    tcase_add_test(tc, test_tokens_per_second);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
