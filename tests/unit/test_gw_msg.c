/* test_gw_msg.c -- gateway routing, auth, submission validation, the Celery
 * message built from it, replies; malformed input and an OOM sweep. */
#include <check.h>
#include <string.h>

#include "gateway/gw_msg.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/uuid.h"

/* ---------------------------------------------------------------- routes */

struct route_vec {
    const char *method, *path, *query;
    int status; /* 0: routed */
    const char *code;
    enum gw_route_kind kind;
    const char *id;
    long long from;
};

static const struct route_vec routes[] = {
    {"GET", "/", NULL, 0, NULL, GW_ROUTE_PAGE, "", 0},
    {"GET", "/index.html", NULL, 0, NULL, GW_ROUTE_PAGE, "", 0},
    {"GET", "/healthz", NULL, 0, NULL, GW_ROUTE_HEALTH, "", 0},
    {"POST", "/", NULL, 405, "method_not_allowed", 0, NULL, 0},
    {"POST", "/v1/tasks", NULL, 0, NULL, GW_ROUTE_SUBMIT, "", 0},
    {"POST", "/v1/tasks/", NULL, 0, NULL, GW_ROUTE_SUBMIT, "", 0},
    {"GET", "/v1/tasks", NULL, 405, "method_not_allowed", 0, NULL, 0},
    {"OPTIONS", "/v1/tasks", NULL, 0, NULL, GW_ROUTE_PREFLIGHT, "", 0},
    {"GET", "/v1/tasks/abc-123", NULL, 0, NULL, GW_ROUTE_STATUS, "abc-123", 0},
    {"DELETE", "/v1/tasks/abc", NULL, 405, "method_not_allowed", 0, NULL, 0},
    {"GET", "/v1/tasks/a.b:c_d/stream", NULL, 0, NULL, GW_ROUTE_STREAM, "a.b:c_d", 0},
    {"GET", "/v1/tasks/x/stream", "from=42", 0, NULL, GW_ROUTE_STREAM, "x", 42},
    {"GET", "/v1/tasks/x/stream", "token=t&from=7", 0, NULL, GW_ROUTE_STREAM, "x", 7},
    {"GET", "/v1/tasks/x/stream", "from=", 400, "bad_from", 0, NULL, 0},
    {"GET", "/v1/tasks/x/stream", "from=-1", 400, "bad_from", 0, NULL, 0},
    {"GET", "/v1/tasks/x/stream", "from=1e3", 400, "bad_from", 0, NULL, 0},
    {"GET", "/v1/tasks/x/stream", "from=99999999999999999999", 400, "bad_from", 0, NULL,
     0},
    {"GET", "/v1/tasks/bad id", NULL, 400, "bad_task_id", 0, NULL, 0},
    {"GET", "/v1/tasks/a*b/stream", NULL, 400, "bad_task_id", 0, NULL, 0},
    {"GET", "/v1/tasks//stream", NULL, 404, "not_found", 0, NULL, 0},
    {"GET", "/v1/tasks/a/b", NULL, 404, "not_found", 0, NULL, 0},
    {"GET", "/v2/tasks", NULL, 404, "not_found", 0, NULL, 0},
    {"GET", "/favicon.ico", NULL, 404, "not_found", 0, NULL, 0},
    {"GET", "", NULL, 404, "not_found", 0, NULL, 0},
};

START_TEST(test_routes)
{
    const struct route_vec *v = &routes[_i];
    struct gw_route r;
    struct gw_error e;
    int rc = gw_route_parse(v->method, v->path, v->query, &r, &e);
    if (v->status) {
        ck_assert_msg(rc == CR_EINVAL, "%s %s routed", v->method, v->path);
        ck_assert_int_eq(e.status, v->status);
        ck_assert_str_eq(e.code, v->code);
        ck_assert(e.message[0]);
        return;
    }
    ck_assert_msg(rc == 0, "%s %s: %s", v->method, v->path, e.message);
    ck_assert_int_eq(r.kind, v->kind);
    ck_assert_str_eq(r.task_id, v->id);
    ck_assert_int_eq(r.from_seq, v->from);
}
END_TEST

START_TEST(test_long_task_id)
{
    char path[400];
    struct gw_route r;
    struct gw_error e;
    memset(path, 'a', sizeof(path));
    memcpy(path, "/v1/tasks/", 10);
    path[10 + GW_TASK_ID_MAX] = '\0';
    ck_assert_int_eq(gw_route_parse("GET", path, NULL, &r, &e), 0);
    ck_assert_int_eq(strlen(r.task_id), GW_TASK_ID_MAX);
    path[10 + GW_TASK_ID_MAX] = 'a';
    path[11 + GW_TASK_ID_MAX] = '\0';
    ck_assert_int_eq(gw_route_parse("GET", path, NULL, &r, &e), CR_EINVAL);
    ck_assert_str_eq(e.code, "bad_task_id");
}
END_TEST

START_TEST(test_query)
{
    char out[16];
    ck_assert_int_eq(gw_query_get("a=1&token=x%20y+z", "token", out, sizeof(out)), 1);
    ck_assert_str_eq(out, "x y z");
    ck_assert_int_eq(gw_query_get("tokens=1", "token", out, sizeof(out)), 0);
    ck_assert_int_eq(gw_query_get("token", "token", out, sizeof(out)), 1);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(gw_query_get(NULL, "token", out, sizeof(out)), 0);
    ck_assert_int_eq(gw_query_get("a=%zz%4", "a", out, sizeof(out)), 1);
    ck_assert_str_eq(out, "%zz%4");
    ck_assert_int_eq(gw_query_get("a=0123456789abcdefXYZ", "a", out, sizeof(out)),
                     CR_ERANGE);
}
END_TEST

START_TEST(test_auth)
{
    ck_assert(gw_auth_ok(NULL, NULL, NULL));
    ck_assert(gw_auth_ok("", "Bearer x", NULL));
    ck_assert(gw_auth_ok("s3", "Bearer s3", NULL));
    ck_assert(gw_auth_ok("s3", "bearer  s3", NULL));
    ck_assert(gw_auth_ok("s3", NULL, "s3"));
    ck_assert(gw_auth_ok("s3", "Bearer no", "s3"));
    ck_assert(!gw_auth_ok("s3", NULL, NULL));
    ck_assert(!gw_auth_ok("s3", "Bearer s", NULL));
    ck_assert(!gw_auth_ok("s3", "Bearer s33", NULL));
    ck_assert(!gw_auth_ok("s3", "Basic s3", NULL));
    ck_assert(!gw_auth_ok("s3", "s3", NULL));
    ck_assert(!gw_auth_ok("s3", "Bearer ", ""));
}
END_TEST

/* ----------------------------------------------------------- submissions */

static const char *const known_tasks[] = {"llm.generate", "llm.chat"};
static const char *const known_queues[] = {"celery", "hipri"};
static const struct gw_rules rules = {known_tasks, 2, known_queues, 2, "celery"};

struct submit_vec {
    const char *body;
    int status; /* 0: accepted */
    const char *code;
};

static const struct submit_vec submits[] = {
    {"{\"task\": \"llm.generate\"}", 0, NULL},
    {"{\"task\": \"llm.generate\", \"args\": [\"hi\"], \"kwargs\": {\"model\": \"m\"}, "
     "\"queue\": \"hipri\", \"priority\": 9, \"countdown\": 1.5, \"expires\": 60, "
     "\"task_id\": \"my-id-1\"}",
     0, NULL},
    {"{\"task\": \"llm.chat\", \"args\": null, \"kwargs\": null, \"queue\": null, "
     "\"priority\": null, \"countdown\": null, \"expires\": null, \"task_id\": null}",
     0, NULL},
    {"{\"task\": \"llm.generate\", \"expires\": \"2030-01-01T00:00:00+00:00\"}", 0, NULL},
    {"", 400, "bad_json"},
    {"{", 400, "bad_json"},
    {"{\"task\": \"llm.generate\",}", 400, "bad_json"},
    {"{'task': 'x'}", 400, "bad_json"},
    {"\xff", 400, "bad_json"},
    {"[]", 400, "bad_request"},
    {"\"task\"", 400, "bad_request"},
    {"{}", 400, "bad_request"},
    {"{\"task\": \"\"}", 400, "bad_request"},
    {"{\"task\": 5}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"args\": {}}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"kwargs\": []}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"queue\": 1}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"priority\": 256}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"priority\": 1.5}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"priority\": -1}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"countdown\": -1}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"countdown\": \"1\"}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"expires\": \"tomorrow\"}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"expires\": true}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"task_id\": \"has space\"}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"task_id\": 7}", 400, "bad_request"},
    {"{\"task\": \"llm.generate\", \"extra\": 1}", 400, "bad_request"},
    {"{\"task\": \"os.system\"}", 422, "unknown_task"},
    {"{\"task\": \"llm.generate\", \"queue\": \"other\"}", 422, "unknown_queue"},
};

START_TEST(test_submit_vectors)
{
    const struct submit_vec *v = &submits[_i];
    struct gw_submit s;
    struct gw_error e;
    int rc;
    gw_submit_init(&s);
    rc = gw_submit_parse(v->body, strlen(v->body), &rules, &s, &e);
    if (v->status) {
        ck_assert_msg(rc == CR_EINVAL, "accepted: %s", v->body);
        ck_assert_int_eq(e.status, v->status);
        ck_assert_msg(!strcmp(e.code, v->code), "%s: %s, want %s", v->body, e.code,
                      v->code);
    } else {
        ck_assert_msg(rc == 0, "%s: %s", v->body, e.message);
        ck_assert(cJSON_IsArray(s.args) && cJSON_IsObject(s.kwargs) && s.queue && s.task);
    }
    gw_submit_release(&s);
}
END_TEST

/* Every strict prefix of a valid body is malformed JSON. */
START_TEST(test_submit_prefixes)
{
    const char *body = submits[1].body;
    size_t n = strlen(body);
    for (size_t i = 0; i < n; i++) {
        struct gw_submit s;
        struct gw_error e;
        gw_submit_init(&s);
        ck_assert_int_eq(gw_submit_parse(body, i, &rules, &s, &e), CR_EINVAL);
        ck_assert_int_eq(e.status, 400);
        gw_submit_release(&s);
    }
}
END_TEST

START_TEST(test_any_task_when_no_list)
{
    struct gw_submit s;
    struct gw_error e;
    const char *body = "{\"task\": \"anything.goes\"}";
    gw_submit_init(&s);
    ck_assert_int_eq(gw_submit_parse(body, strlen(body), NULL, &s, &e), 0);
    ck_assert_str_eq(s.queue, "celery");
    gw_submit_release(&s);
}
END_TEST

/* The message is the one Python's send_task would publish. */
static int build(const char *body, struct buf *out, cJSON **headers, struct gw_props *p)
{
    struct gw_submit s;
    struct gw_error e;
    struct task_msg tm;
    int rc;
    gw_submit_init(&s);
    task_msg_init(&tm);
    rc = gw_submit_parse(body, strlen(body), &rules, &s, &e);
    if (rc == 0)
        rc = gw_submit_to_task(&s, "id-1", "gen1@host", 1700000000000000LL, &tm, p);
    if (rc == 0)
        rc = celery_msg_encode_v2(&tm, out, headers);
    task_msg_release(&tm);
    gw_submit_release(&s);
    return rc;
}

START_TEST(test_celery_message)
{
    struct buf out;
    cJSON *h = NULL;
    struct gw_props p;
    char *txt;
    buf_init(&out);
    ck_assert_int_eq(
        build("{\"task\": \"llm.generate\", \"args\": [\"hi\", 2], \"kwargs\": "
              "{\"t\": 0.5}, \"countdown\": 10, \"expires\": 60, "
              "\"priority\": 4}",
              &out, &h, &p),
        0);
    ck_assert_str_eq(out.data, "[[\"hi\", 2], {\"t\": 0.5}, {\"callbacks\": null, "
                               "\"errbacks\": null, \"chain\": null, \"chord\": null}]");
    txt = cJSON_PrintUnformatted(h);
    ck_assert_str_eq(txt, "{\"lang\":\"py\",\"task\":\"llm.generate\",\"id\":\"id-1\","
                          "\"shadow\":null,\"eta\":\"2023-11-14T22:13:30+00:00\","
                          "\"expires\":\"2023-11-14T22:14:20+00:00\",\"group\":null,"
                          "\"group_index\":null,\"retries\":0,\"timelimit\":[null,null],"
                          "\"root_id\":\"id-1\",\"parent_id\":null,"
                          "\"argsrepr\":\"('hi', 2)\",\"kwargsrepr\":\"{'t': 0.5}\","
                          "\"origin\":\"gen1@host\",\"ignore_result\":false}");
    ck_assert_str_eq(p.expiration, "60000");
    ck_assert_int_eq(p.priority, 4);
    cr_free(txt);
    cJSON_Delete(h);
    buf_release(&out);

    /* an expiry already past: TTL 0, as kombu clamps it */
    buf_init(&out);
    ck_assert_int_eq(
        build("{\"task\": \"llm.chat\", \"expires\": \"2000-01-01T00:00:00Z\"}", &out, &h,
              &p),
        0);
    ck_assert_str_eq(p.expiration, "0");
    cJSON_Delete(h);
    buf_release(&out);
    buf_init(&out);
    ck_assert_int_eq(build("{\"task\": \"llm.chat\"}", &out, &h, &p), 0);
    ck_assert_str_eq(p.expiration, "");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(h, "eta")));
    cJSON_Delete(h);
    buf_release(&out);
}
END_TEST

START_TEST(test_uuid4)
{
    unsigned char r[16];
    char out[37];
    memset(r, 0xff, sizeof(r));
    cr_uuid4(r, out);
    ck_assert_str_eq(out, "ffffffff-ffff-4fff-bfff-ffffffffffff");
    memset(r, 0, sizeof(r));
    cr_uuid4(r, out);
    ck_assert_str_eq(out, "00000000-0000-4000-8000-000000000000");
    ck_assert(gw_task_id_ok(out, strlen(out)));
}
END_TEST

/* ---------------------------------------------------------------- replies */

START_TEST(test_meta_summary)
{
    static const char ok[] =
        "{\"status\": \"SUCCESS\", \"result\": \"hi\", \"traceback\": "
        "null, \"children\": [], \"date_done\": \"d\", \"task_id\": "
        "\"t\"}";
    static const char fail[] =
        "{\"status\": \"FAILURE\", \"result\": {\"exc_type\": \"ValueError\", "
        "\"exc_message\": [\"bad\"], \"exc_module\": \"builtins\"}, \"traceback\": "
        "\"tb\"}";
    static const char prog[] =
        "{\"status\": \"PROGRESS\", \"result\": {\"text\": \"ab\", \"tokens\": 2}}";
    struct buf b;
    cJSON *s;

    s = gw_meta_summary("t", ok, strlen(ok));
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(s, &b), 0);
    ck_assert_str_eq(b.data, "{\"task_id\": \"t\", \"state\": \"SUCCESS\", \"result\": "
                             "\"hi\", \"traceback\": null, \"date_done\": \"d\", "
                             "\"ready\": true}");
    buf_release(&b);
    cJSON_Delete(s);

    s = gw_meta_summary("t", fail, strlen(fail));
    ck_assert_str_eq(cJSON_GetObjectItem(s, "error")->valuestring, "ValueError: bad");
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(s, "ready")));
    cJSON_Delete(s);

    s = gw_meta_summary("t", prog, strlen(prog));
    ck_assert_str_eq(cJSON_GetObjectItem(s, "state")->valuestring, "PROGRESS");
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(s, "ready")));
    cJSON_Delete(s);

    /* missing or garbage: PENDING */
    s = gw_meta_summary("t", NULL, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(s, "state")->valuestring, "PENDING");
    cJSON_Delete(s);
    s = gw_meta_summary("t", "{nope", 5);
    ck_assert_str_eq(cJSON_GetObjectItem(s, "state")->valuestring, "PENDING");
    cJSON_Delete(s);

    ck_assert(gw_meta_ready(ok, strlen(ok)));
    ck_assert(gw_meta_ready(fail, strlen(fail)));
    ck_assert(!gw_meta_ready(prog, strlen(prog)));
    ck_assert(!gw_meta_ready(NULL, 0));
}
END_TEST

START_TEST(test_json_str)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(gw_json_str(&b, "a\"\\\n\t\x01\x7f\xc3\xa9\xff\xe2\x82", 12), 0);
    ck_assert_str_eq(b.data,
                     "\"a\\\"\\\\\\n\\t\\u0001\\u007f\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd"
                     "\xef\xbf\xbd\"");
    buf_release(&b);
}
END_TEST

START_TEST(test_error_json)
{
    struct gw_error e;
    struct buf b;
    buf_init(&b);
    gw_error_set(&e, 413, "body_too_large", "over %d \"bytes\"", 10);
    ck_assert_int_eq(gw_error_json(&e, &b), 0);
    ck_assert_str_eq(b.data,
                     "{\"error\": {\"status\": 413, \"code\": \"body_too_large\", "
                     "\"message\": \"over 10 \\\"bytes\\\"\"}}");
    buf_release(&b);
}
END_TEST

/* Fails allocation 1, 2, ... until a run succeeds; every failed run reports
 * CR_ENOMEM and leaks nothing (run under valgrind). */
START_TEST(test_oom_sweep)
{
    const char *body = submits[1].body;
    long n;
    for (n = 1; n < 5000; n++) {
        struct buf out;
        cJSON *h = NULL, *sum;
        struct gw_props p;
        struct gw_error e;
        long failed;
        int rc;
        buf_init(&out);
        cr_alloc_fail_after(n);
        rc = build(body, &out, &h, &p);
        sum = gw_meta_summary("t",
                              "{\"status\": \"FAILURE\", \"result\": {\"exc_type\": "
                              "\"E\", \"exc_message\": [\"m\"]}}",
                              60);
        gw_error_set(&e, 400, "c", "m");
        if (gw_error_json(&e, &out) && rc == 0)
            rc = CR_ENOMEM;
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        cJSON_Delete(h);
        cJSON_Delete(sum);
        buf_release(&out);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            break;
        }
        ck_assert(rc == 0 || rc == CR_ENOMEM);
    }
    ck_assert_int_lt(n, 5000);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("gw_msg");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_routes, 0, (int)(sizeof(routes) / sizeof(routes[0])));
    tcase_add_test(tc, test_long_task_id);
    tcase_add_test(tc, test_query);
    tcase_add_test(tc, test_auth);
    tcase_add_loop_test(tc, test_submit_vectors, 0,
                        (int)(sizeof(submits) / sizeof(submits[0])));
    tcase_add_test(tc, test_submit_prefixes);
    tcase_add_test(tc, test_any_task_when_no_list);
    tcase_add_test(tc, test_celery_message);
    tcase_add_test(tc, test_uuid4);
    tcase_add_test(tc, test_meta_summary);
    tcase_add_test(tc, test_json_str);
    tcase_add_test(tc, test_error_json);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
