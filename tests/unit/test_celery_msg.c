/* test_celery_msg.c -- task message decode/encode against messages captured from
 * Celery 5.2.6 (tests/fixtures/capture.py), plus malformed input and OOM. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "protocol/celery_msg.h"
#include "protocol/isotime.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

#define FIXTURES "tests/fixtures/messages/"

/* ---- helpers ---- */

static cJSON *json(const char *text)
{
    cJSON *v = NULL;
    struct cr_err err;
    ck_assert_msg(py_json_parse(text, strlen(text), &v, &err) == 0, "%s: %s", text,
                  err.msg);
    return v;
}

static char *dumps(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return buf_detach(&b);
}

/* Compares by Python-style text, so float-ness and key order count too. */
static void expect_json(const cJSON *v, const char *want)
{
    char *got;
    ck_assert_ptr_nonnull(v);
    got = dumps(v);
    ck_assert_msg(strcmp(got, want) == 0, "got <%s> want <%s>", got, want);
    cr_free(got);
}

static void expect_str(const char *got, const char *want)
{
    if (!want)
        ck_assert_msg(got == NULL, "got '%s' want NULL", got);
    else
        ck_assert_msg(got && strcmp(got, want) == 0, "got '%s' want '%s'",
                      got ? got : "(null)", want);
}

struct fixture {
    cJSON *root;
    struct celery_raw_msg raw;
};

static void fixture_load(const char *name, struct fixture *fx)
{
    char path[256];
    snprintf(path, sizeof(path), FIXTURES "%s.json", name);
    unit_load_message(path, &fx->root, &fx->raw);
}

static int decode(const struct celery_raw_msg *raw, struct task_msg *m)
{
    struct cr_err err = {0, ""};
    int rc;
    task_msg_init(m);
    rc = celery_msg_decode(raw, m, &err);
    if (rc)
        ck_assert_msg(err.code == rc && err.msg[0], "rc %d without detail", rc);
    return rc;
}

/* ---- what each captured message must decode to ---- */

#define NO_TIME (-1)
#define ANY_TIME (-2)

static const struct expect {
    const char *name;
    int proto;
    const char *task, *id;
    const char *args, *kwargs; /* Python-style JSON */
    const char *shadow;
    int64_t eta_us, expires_us; /* NO_TIME, ANY_TIME (relative) or the value */
    double hard, soft;
    int ignore_result, priority;
    int group, group_index; /* group: 1 when set; group_index -1 when null */
    const char *embed;      /* exact Python-style JSON of embed, NULL for none */
} expects[] = {
    {"send_task_args", 2, "proj.add", "0f0b8c1e-0001-4000-8000-000000000001", "[2, 3]",
     "{}", NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1,
     NULL /* Celery's default embed is not kept */},
    {"delay_kwargs", 2, "proj.add", "0f0b8c1e-0002-4000-8000-000000000002", "[]",
     "{\"x\": 1, \"y\": 2.5}", NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"countdown", 2, "proj.add", "0f0b8c1e-0003-4000-8000-000000000003", "[1, 1]", "{}",
     NULL, ANY_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"eta", 2, "proj.add", "0f0b8c1e-0004-4000-8000-000000000004", "[1, 2]", "{}", NULL,
     INT64_C(1893553445678901), NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"eta_naive", 2, "proj.add", "0f0b8c1e-0014-4000-8000-000000000014", "[1, 3]", "{}",
     NULL, INT64_C(1907050150000000), NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"expires", 2, "proj.add", "0f0b8c1e-0005-4000-8000-000000000005", "[1, 4]", "{}",
     NULL, NO_TIME, INT64_C(1927857906000000), 0, 0, 0, 0, 0, -1, NULL},
    {"expires_seconds", 2, "proj.add", "0f0b8c1e-0015-4000-8000-000000000015", "[1, 5]",
     "{}", NULL, NO_TIME, ANY_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"priority", 2, "proj.add", "0f0b8c1e-0006-4000-8000-000000000006", "[1, 6]", "{}",
     NULL, NO_TIME, NO_TIME, 0, 0, 0, 7, 0, -1, NULL},
    {"time_limits", 2, "proj.add", "0f0b8c1e-0007-4000-8000-000000000007", "[1, 7]", "{}",
     NULL, NO_TIME, NO_TIME, 30, 20.5, 0, 0, 0, -1, NULL},
    {"soft_time_limit_only", 2, "proj.add", "0f0b8c1e-0017-4000-8000-000000000017",
     "[1, 8]", "{}", NULL, NO_TIME, NO_TIME, 0, 15, 0, 0, 0, -1, NULL},
    {"shadow", 2, "proj.add", "0f0b8c1e-0008-4000-8000-000000000008", "[1, 9]", "{}",
     "myname", NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"ignore_result", 2, "proj.add", "0f0b8c1e-0009-4000-8000-000000000009", "[1, 10]",
     "{}", NULL, NO_TIME, NO_TIME, 0, 0, 1, 0, 0, -1, NULL},
    {"link", 2, "proj.add", "0f0b8c1e-0010-4000-8000-000000000010", "[2, 2]", "{}",
     "myname", NO_TIME, NO_TIME, 30, 20, 1, 3, 0, -1,
     "{\"callbacks\": [{\"task\": \"proj.add\", \"args\": [10], \"kwargs\": {}, "
     "\"options\": "
     "{}, \"subtask_type\": null, \"immutable\": false}], \"errbacks\": [{\"task\": "
     "\"proj.onerr\", \"args\": [], \"kwargs\": {}, \"options\": {}, \"subtask_type\": "
     "null, "
     "\"immutable\": false}], \"chain\": null, \"chord\": null}"},
    {"chain", 2, "proj.add", "0f0b8c1e-0011-4000-8000-000000000011", "[1, 2]", "{}", NULL,
     NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"group_member", 2, "proj.add", "0f0b8c1e-0112-4000-8000-000000000112", "[2, 2]",
     "{}", NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 1, -1, NULL},
    {"chord_header", 2, "proj.add", "0f0b8c1e-0013-4000-8000-000000000013", "[1, 1]",
     "{}", NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 1, 0, NULL},
    {"custom_headers", 2, "proj.add", "0f0b8c1e-0016-4000-8000-000000000016", "[1, 11]",
     "{}", NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"unicode_args", 2, "proj.echo", "0f0b8c1e-0018-4000-8000-000000000018",
     "[\"h\\u00e9llo w\\u00f6rld\", \"\\u65e5\\u672c\\u8a9e\", \"\\ud83d\\ude00\", "
     "\"tab\\tnl\\n\\\"q'\", \"\\u007f\\u0001\"]",
     "{\"\\u043a\\u043b\\u044e\\u0447\": "
     "\"\\u0437\\u043d\\u0430\\u0447\\u0435\\u043d\\u0438\\u0435\"}",
     NULL, NO_TIME, NO_TIME, 0, 0, 0, 0, 0, -1, NULL},
    {"protocol1", 1, "proj.add", "0f0b8c1e-0019-4000-8000-000000000019", "[4, 5]", "{}",
     NULL, ANY_TIME, INT64_C(1927857906000000), 60, 50, -1, 0, 0, -1,
     "{\"callbacks\": [{\"task\": \"proj.add\", \"args\": [1], \"kwargs\": {}, "
     "\"options\": {}, "
     "\"subtask_type\": null, \"immutable\": false}], \"errbacks\": null, \"chain\": "
     "null, "
     "\"chord\": null}"},
};

#define N_EXPECTS ((int)(sizeof(expects) / sizeof(expects[0])))

static void check_time(const char *name, const char *text, int64_t us, int64_t want)
{
    if (want == NO_TIME) {
        ck_assert_msg(text == NULL && us == -1, "%s: unexpected time", name);
        return;
    }
    ck_assert_msg(text != NULL, "%s: time missing", name);
    if (want == ANY_TIME) {
        int64_t parsed;
        ck_assert_int_eq(iso8601_parse(text, &parsed), 0);
        ck_assert(parsed == us && us > INT64_C(1700000000000000));
    } else {
        ck_assert_msg(us == want, "%s: %lld != %lld", name, (long long)us,
                      (long long)want);
    }
}

/* Fields every decoded message must agree with its own headers/properties on. */
static void check_common(const struct fixture *fx, const struct task_msg *m)
{
    const cJSON *h = fx->raw.headers;
    const char *root = unit_str(h, "root_id");
    ck_assert_ptr_nonnull(m->id);
    ck_assert_ptr_nonnull(m->task);
    ck_assert(cJSON_IsArray(m->args));
    ck_assert(cJSON_IsObject(m->kwargs));
    expect_str(m->root_id, root ? root : m->id);
    expect_str(m->parent_id, unit_str(h, "parent_id"));
    expect_str(m->argsrepr, unit_str(h, "argsrepr"));
    expect_str(m->kwargsrepr, unit_str(h, "kwargsrepr"));
    expect_str(m->origin, unit_str(h, "origin"));
    expect_str(m->correlation_id, fx->raw.correlation_id);
    expect_str(m->reply_to, fx->raw.reply_to);
    expect_str(m->content_type, "application/json");
    expect_str(m->content_encoding, "utf-8");
    ck_assert_int_eq(m->delivery_mode, 2);
    ck_assert_int_eq(m->priority, fx->raw.priority);
    ck_assert_int_eq(m->retries, 0);
    if (m->proto == 2) {
        /* only what Celery does not define is kept, and all of it */
        cJSON *all = celery_msg_headers(m);
        ck_assert_ptr_nonnull(all);
        ck_assert(cJSON_Compare(all, h, 1));
        for (const cJSON *c = m->headers->child; c; c = c->next)
            ck_assert_msg(strncmp(c->string, "x-", 2) == 0, "kept %s", c->string);
        cJSON_Delete(all);
    } else {
        ck_assert(cJSON_Compare(m->headers, h, 1));
    }
}

static void check_expect(const struct expect *e, const struct task_msg *m)
{
    ck_assert_int_eq(m->proto, e->proto);
    expect_str(m->task, e->task);
    expect_str(m->id, e->id);
    expect_json(m->args, e->args);
    expect_json(m->kwargs, e->kwargs);
    expect_str(m->shadow, e->shadow);
    check_time(e->name, m->eta, m->eta_us, e->eta_us);
    check_time(e->name, m->expires, m->expires_us, e->expires_us);
    ck_assert(m->time_limit_hard == e->hard);
    ck_assert(m->time_limit_soft == e->soft);
    ck_assert_int_eq(m->ignore_result, e->ignore_result);
    ck_assert_int_eq(m->priority, e->priority);
    ck_assert_int_eq(m->group != NULL, e->group);
    ck_assert_int_eq(m->has_group_index, e->group_index >= 0);
    if (e->group_index >= 0)
        ck_assert_int_eq(m->group_index, e->group_index);
    if (e->embed)
        expect_json(m->embed, e->embed);
}

START_TEST(test_fixture_decode)
{
    const struct expect *e = &expects[_i];
    struct fixture fx;
    struct task_msg m;

    fixture_load(e->name, &fx);
    ck_assert_int_eq(decode(&fx.raw, &m), 0);
    check_common(&fx, &m);
    check_expect(e, &m);

    if (strcmp(e->name, "chain") == 0) {
        const cJSON *chain = cJSON_GetObjectItem(m.embed, "chain");
        const cJSON *next = cJSON_GetArrayItem(chain, cJSON_GetArraySize(chain) - 1);
        ck_assert_int_eq(cJSON_GetArraySize(chain), 2);
        expect_str(cJSON_GetObjectItem(cJSON_GetObjectItem(next, "options"), "task_id")
                       ->valuestring,
                   "0f0b8c1e-0111-4000-8000-000000000111");
    } else if (strcmp(e->name, "chord_header") == 0) {
        const cJSON *chord = cJSON_GetObjectItem(m.embed, "chord");
        expect_str(cJSON_GetObjectItem(cJSON_GetObjectItem(chord, "options"), "task_id")
                       ->valuestring,
                   "0f0b8c1e-0813-4000-8000-000000000813");
    } else if (strcmp(e->name, "group_member") == 0) {
        expect_str(m.group, "0f0b8c1e-0912-4000-8000-000000000912");
    } else if (strcmp(e->name, "custom_headers") == 0) {
        expect_json(cJSON_GetObjectItem(m.headers, "x-nested"),
                    "{\"a\": [1, null, true]}");
        expect_str(cJSON_GetObjectItem(m.headers, "x-tenant")->valuestring, "acme");
    } else if (strcmp(e->name, "eta_naive") == 0) {
        expect_str(m.eta, "2030-06-07T08:09:10");
    }
    task_msg_release(&m);
    cJSON_Delete(fx.root);
}
END_TEST

/* Re-encoding a v2 message gives back Celery's exact headers and body bytes. */
START_TEST(test_fixture_reencode)
{
    const struct expect *e = &expects[_i];
    struct fixture fx;
    struct task_msg m, m2;
    struct celery_raw_msg raw2;
    struct buf body;
    cJSON *headers = NULL;

    fixture_load(e->name, &fx);
    ck_assert_int_eq(decode(&fx.raw, &m), 0);
    buf_init(&body);
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &headers), 0);
    if (m.proto == 2) {
        char *got = dumps(headers), *want = dumps(fx.raw.headers);
        ck_assert_msg(strcmp(got, want) == 0, "%s:\n got %s\nwant %s", e->name, got,
                      want);
        ck_assert_msg(strcmp(body.data, fx.raw.body) == 0, "%s:\n got %s\nwant %s",
                      e->name, body.data, fx.raw.body);
        cr_free(got);
        cr_free(want);
    } else {
        /* v1: the same task as a v2 message, with Celery's header layout (eta
         * came from a countdown, so it is whatever the capture run produced) */
        struct buf want;
        buf_init(&want);
        buf_printf(
            &want,
            "{\"lang\": \"py\", \"task\": \"proj.add\", \"id\": "
            "\"0f0b8c1e-0019-4000-8000-000000000019\", \"shadow\": null, \"eta\": "
            "\"%s\", \"expires\": \"2031-02-03T04:05:06+00:00\", \"group\": null, "
            "\"group_index\": null, \"retries\": 0, \"timelimit\": [60, 50], "
            "\"root_id\": \"0f0b8c1e-0019-4000-8000-000000000019\", \"parent_id\": "
            "null, \"argsrepr\": \"(4, 5)\", \"kwargsrepr\": \"{}\", \"origin\": "
            "null, \"ignore_result\": false}",
            m.eta);
        expect_json(headers, want.data);
        buf_release(&want);
        ck_assert_str_eq(
            body.data,
            "[[4, 5], {}, {\"callbacks\": [{\"task\": \"proj.add\", \"args\": [1], "
            "\"kwargs\": {}, \"options\": {}, \"subtask_type\": null, "
            "\"immutable\": false}], \"errbacks\": null, \"chain\": null, "
            "\"chord\": null}]");
    }

    /* ... and decodes to the same task */
    raw2 = fx.raw;
    raw2.headers = headers;
    raw2.body = body.data;
    raw2.body_len = body.len;
    ck_assert_int_eq(decode(&raw2, &m2), 0);
    ck_assert_int_eq(m2.proto, 2);
    expect_str(m2.id, m.id);
    expect_str(m2.task, m.task);
    expect_str(m2.shadow, m.shadow);
    expect_str(m2.root_id, m.root_id);
    expect_str(m2.parent_id, m.parent_id);
    expect_str(m2.group, m.group);
    expect_str(m2.eta, m.eta);
    expect_str(m2.expires, m.expires);
    ck_assert(m2.eta_us == m.eta_us && m2.expires_us == m.expires_us);
    ck_assert(m2.time_limit_hard == m.time_limit_hard);
    ck_assert(m2.time_limit_soft == m.time_limit_soft);
    ck_assert_int_eq(m2.retries, m.retries);
    ck_assert_int_eq(m2.has_group_index, m.has_group_index);
    ck_assert_int_eq(m2.group_index, m.group_index);
    ck_assert_int_eq(m2.ignore_result, m.ignore_result == 1);
    ck_assert(cJSON_Compare(m2.args, m.args, 1));
    ck_assert(cJSON_Compare(m2.kwargs, m.kwargs, 1));
    if (m.embed)
        ck_assert(cJSON_Compare(m2.embed, m.embed, 1));
    task_msg_release(&m2);
    task_msg_release(&m);
    cJSON_Delete(headers);
    buf_release(&body);
    cJSON_Delete(fx.root);
}
END_TEST

/* Every strict prefix of every captured body fails cleanly. */
START_TEST(test_fixture_prefixes)
{
    struct fixture fx;
    struct celery_raw_msg raw;
    fixture_load(expects[_i].name, &fx);
    raw = fx.raw;
    for (size_t n = 0; n < fx.raw.body_len; n++) {
        struct task_msg m;
        int rc;
        /* a private copy of exactly n bytes, so reading past it would be caught */
        char *cut = malloc(n ? n : 1);
        memcpy(cut, fx.raw.body, n);
        raw.body = cut;
        raw.body_len = n;
        rc = decode(&raw, &m);
        ck_assert_msg(rc == CR_EDECODE || rc == CR_EPROTO, "%s: prefix %zu gave %d",
                      expects[_i].name, n, rc);
        /* the id survives for v2, where it is in the headers */
        if (expects[_i].proto == 2)
            expect_str(m.id, expects[_i].id);
        task_msg_release(&m);
        free(cut);
    }
    cJSON_Delete(fx.root);
}
END_TEST

/* The expectation table covers exactly the fixtures on disk. */
START_TEST(test_fixture_files)
{
    DIR *d = opendir(FIXTURES);
    struct dirent *de;
    int found = 0;
    ck_assert_msg(d != NULL, "cannot open " FIXTURES " (run from the repo root)");
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        int known = 0;
        if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        for (int i = 0; i < N_EXPECTS; i++)
            if (strlen(expects[i].name) == len - 5 &&
                strncmp(expects[i].name, de->d_name, len - 5) == 0)
                known = 1;
        ck_assert_msg(known, "fixture %s has no expectations", de->d_name);
        found++;
    }
    closedir(d);
    ck_assert_int_eq(found, N_EXPECTS);
}
END_TEST

/* ---- synthetic messages ---- */

struct msg {
    cJSON *headers;
    struct celery_raw_msg raw;
};

static void msg_make(struct msg *x, const char *headers, const char *body)
{
    memset(x, 0, sizeof(*x));
    x->headers = headers ? json(headers) : NULL;
    x->raw.content_type = "application/json";
    x->raw.content_encoding = "utf-8";
    x->raw.headers = x->headers;
    x->raw.body = body;
    x->raw.body_len = strlen(body);
}

#define V2H "{\"task\": \"t.x\", \"id\": \"id-1\"}"
#define V2B "[[1], {\"a\": 1}, null]"

static const struct bad_case {
    const char *what, *headers, *body, *content_type;
    int rc;
    const char *id, *task; /* filled even on error */
} bad_cases[] = {
    {"bad json", V2H, "[[1], {]", NULL, CR_EDECODE, "id-1", "t.x"},
    {"empty body", V2H, "", NULL, CR_EDECODE, "id-1", "t.x"},
    {"trailing garbage", V2H, V2B " x", NULL, CR_EDECODE, "id-1", "t.x"},
    {"kwargs not a dict", V2H, "[[1], [], null]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"kwargs null", V2H, "[[1], null, null]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"args not a list", V2H, "[{}, {}, null]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"args string", V2H, "[\"1, 2\", {}, null]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"body 1 item", V2H, "[[]]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"body 4 items", V2H, "[[], {}, null, 1]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"embed a list", V2H, "[[], {}, []]", NULL, CR_EPROTO, "id-1", "t.x"},
    {"body a string", V2H, "\"x\"", NULL, CR_EPROTO, "id-1", "t.x"},
    {"body a number", V2H, "42", NULL, CR_EPROTO, "id-1", "t.x"},
    {"missing id", "{\"task\": \"t.x\"}", V2B, NULL, CR_EPROTO, NULL, "t.x"},
    {"empty id", "{\"task\": \"t.x\", \"id\": \"\"}", V2B, NULL, CR_EPROTO, "", "t.x"},
    {"id a number", "{\"task\": \"t.x\", \"id\": 5}", V2B, NULL, CR_EPROTO, NULL, "t.x"},
    {"missing task", "{\"id\": \"id-1\"}", V2B, NULL, CR_EPROTO, "id-1", NULL},
    {"task null", "{\"task\": null, \"id\": \"id-1\"}", V2B, NULL, CR_EPROTO, "id-1",
     NULL},
    {"no headers, list body", NULL, V2B, NULL, CR_EPROTO, NULL, NULL},
    {"v1 missing task", "{}", "{\"id\": \"id-2\", \"args\": []}", NULL, CR_EPROTO, "id-2",
     NULL},
    {"v1 missing id", "{}", "{\"task\": \"t.y\"}", NULL, CR_EPROTO, NULL, "t.y"},
    {"v1 kwargs not a dict", NULL,
     "{\"task\": \"t.y\", \"id\": \"id-2\", \"kwargs\": []}", NULL, CR_EPROTO, "id-2",
     "t.y"},
    {"v1 args not a list", NULL, "{\"task\": \"t.y\", \"id\": \"id-2\", \"args\": {}}",
     NULL, CR_EPROTO, "id-2", "t.y"},
    {"v1 args null", NULL, "{\"task\": \"t.y\", \"id\": \"id-2\", \"args\": null}", NULL,
     CR_EPROTO, "id-2", "t.y"},
    {"invalid utf-8", V2H, "[[\"\xc3\x28\"], {}, null]", NULL, CR_EDECODE, "id-1", "t.x"},
    {"overlong utf-8", V2H, "[[\"\xc0\xaf\"], {}, null]", NULL, CR_EDECODE, "id-1",
     "t.x"},
    {"utf-16 surrogate in utf-8", V2H, "[[\"\xed\xa0\x80\"], {}, null]", NULL, CR_EDECODE,
     "id-1", "t.x"},
    {"lone surrogate escape", V2H, "[[\"\\ud800\"], {}, null]", NULL, CR_EDECODE, "id-1",
     "t.x"},
    {"pickle", V2H, V2B, "application/x-python-serialize", CR_ECONTENT, "id-1", "t.x"},
    {"yaml", V2H, V2B, "application/x-yaml", CR_ECONTENT, "id-1", "t.x"},
    {"msgpack", V2H, V2B, "application/x-msgpack", CR_ECONTENT, "id-1", "t.x"},
    {"text", V2H, V2B, "text/plain", CR_ECONTENT, "id-1", "t.x"},
    {"json lookalike", V2H, V2B, "application/jsonx", CR_ECONTENT, "id-1", "t.x"},
    {"compression",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"compression\": "
     "\"application/x-gzip\"}",
     "\x1f\x8b\x08\x00", NULL, CR_ECONTENT, "id-1", "t.x"},
    {"headers a list", "[1]", V2B, NULL, CR_EPROTO, NULL, NULL},
    {"bad eta", "{\"task\": \"t.x\", \"id\": \"id-1\", \"eta\": \"tomorrow\"}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"eta a number", "{\"task\": \"t.x\", \"id\": \"id-1\", \"eta\": 1700000000}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"bad expires",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"expires\": \"2030-02-30T00:00\"}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"timelimit 1 item", "{\"task\": \"t.x\", \"id\": \"id-1\", \"timelimit\": [1]}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"timelimit negative",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"timelimit\": [-1, null]}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"timelimit string",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"timelimit\": [\"1\", 2]}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"timelimit object", "{\"task\": \"t.x\", \"id\": \"id-1\", \"timelimit\": {}}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"retries negative", "{\"task\": \"t.x\", \"id\": \"id-1\", \"retries\": -1}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"retries fraction", "{\"task\": \"t.x\", \"id\": \"id-1\", \"retries\": 1.5}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"retries huge", "{\"task\": \"t.x\", \"id\": \"id-1\", \"retries\": 1e12}", V2B,
     NULL, CR_EPROTO, "id-1", "t.x"},
    {"group_index fraction",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"group_index\": 0.5}", V2B, NULL, CR_EPROTO,
     "id-1", "t.x"},
    {"ignore_result string",
     "{\"task\": \"t.x\", \"id\": \"id-1\", \"ignore_result\": \"y\"}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"shadow a number", "{\"task\": \"t.x\", \"id\": \"id-1\", \"shadow\": 5}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"group a list", "{\"task\": \"t.x\", \"id\": \"id-1\", \"group\": []}", V2B, NULL,
     CR_EPROTO, "id-1", "t.x"},
    {"parent_id a bool", "{\"task\": \"t.x\", \"id\": \"id-1\", \"parent_id\": true}",
     V2B, NULL, CR_EPROTO, "id-1", "t.x"},
};

START_TEST(test_bad_cases)
{
    const struct bad_case *c = &bad_cases[_i];
    struct msg x;
    struct task_msg m;
    msg_make(&x, c->headers, c->body);
    if (c->content_type)
        x.raw.content_type = c->content_type;
    ck_assert_msg(decode(&x.raw, &m) == c->rc, "%s", c->what);
    expect_str(m.id, c->id);
    expect_str(m.task, c->task);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
}
END_TEST

START_TEST(test_content_types_accepted)
{
    const char *ok[] = {"application/json",
                        "application/json; charset=utf-8",
                        "APPLICATION/JSON",
                        " application/json ;charset=UTF-8",
                        "",
                        NULL};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        struct msg x;
        struct task_msg m;
        msg_make(&x, V2H, V2B);
        x.raw.content_type = ok[i];
        x.raw.content_encoding = i % 2 ? "binary" : NULL;
        ck_assert_msg(decode(&x.raw, &m) == 0, "%s", ok[i] ? ok[i] : "(null)");
        expect_str(m.content_type, ok[i]);
        task_msg_release(&m);
        cJSON_Delete(x.headers);
    }
}
END_TEST

/* The body must never be looked at for a refused content type. */
START_TEST(test_content_refused_unparsed)
{
    struct msg x;
    struct task_msg m;
    msg_make(&x, V2H, "x");
    x.raw.body = NULL; /* would crash if touched */
    x.raw.body_len = 1000;
    x.raw.content_type = "application/x-python-serialize";
    ck_assert_int_eq(decode(&x.raw, &m), CR_ECONTENT);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
}
END_TEST

START_TEST(test_compression_null_ok)
{
    struct msg x;
    struct task_msg m;
    msg_make(&x, "{\"task\": \"t.x\", \"id\": \"id-1\", \"compression\": null}", V2B);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
}
END_TEST

static char *nested_body(int depth)
{
    /* [[[...]]], {}, null] with `depth` levels in total, the body list included */
    size_t n = (size_t)depth * 2 + 16;
    char *s = malloc(n);
    size_t p = 0;
    s[p++] = '[';
    for (int i = 1; i < depth; i++)
        s[p++] = '[';
    for (int i = 1; i < depth; i++)
        s[p++] = ']';
    memcpy(s + p, ", {}, null]", 12);
    return s;
}

START_TEST(test_nesting)
{
    struct msg x;
    struct task_msg m;
    char *ok = nested_body(64), *deep = nested_body(65), *huge = nested_body(1000);
    msg_make(&x, V2H, ok);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    task_msg_release(&m);
    x.raw.body = deep;
    x.raw.body_len = strlen(deep);
    ck_assert_int_eq(decode(&x.raw, &m), CR_EDECODE);
    expect_str(m.id, "id-1");
    task_msg_release(&m);
    x.raw.body = huge;
    x.raw.body_len = strlen(huge);
    ck_assert_int_eq(decode(&x.raw, &m), CR_EDECODE);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
    free(ok);
    free(deep);
    free(huge);
}
END_TEST

START_TEST(test_huge_body)
{
    size_t n = 10 * 1024 * 1024;
    char *body = malloc(n + 1);
    struct msg x;
    struct task_msg m;

    /* a valid 10 MB message: one big string argument */
    memcpy(body, "[[\"", 3);
    memset(body + 3, 'a', n - 3 - 14);
    memcpy(body + n - 14, "\"], {}, null]", 14);
    msg_make(&x, V2H, body);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    ck_assert_uint_eq(strlen(cJSON_GetArrayItem(m.args, 0)->valuestring), n - 17);
    task_msg_release(&m);

    /* 10 MB of '[' is refused at depth 65, not after 10 MB of recursion */
    memset(body, '[', n);
    body[n] = '\0';
    x.raw.body_len = n;
    ck_assert_int_eq(decode(&x.raw, &m), CR_EDECODE);
    task_msg_release(&m);

    /* 10 MB that turns bad only at the last byte */
    memcpy(body, "[[\"", 3);
    memset(body + 3, 'a', n - 3);
    body[n - 1] = '\xff';
    ck_assert_int_eq(decode(&x.raw, &m), CR_EDECODE);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
    free(body);
}
END_TEST

START_TEST(test_embed_null_and_absent)
{
    struct msg x;
    struct task_msg m;
    msg_make(&x, V2H, "[[1], {\"a\": 1}, null]");
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    ck_assert_ptr_null(m.embed);
    task_msg_release(&m);
    x.raw.body = "[[1], {\"a\": 1}]";
    x.raw.body_len = strlen(x.raw.body);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    ck_assert_ptr_null(m.embed);
    expect_json(m.args, "[1]");
    task_msg_release(&m);
    x.raw.body = "[[], {}, {\"chord\": {\"task\": \"b\"}}]";
    x.raw.body_len = strlen(x.raw.body);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_json(m.embed, "{\"chord\": {\"task\": \"b\"}}");
    task_msg_release(&m);
    /* Celery's default is not kept (encode_v2 writes it back), any other
     * object is, even with the same keys in another order or one non-null */
    {
        static const struct {
            const char *body;
            int kept;
        } cases[] = {
            {"[[], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": null, "
             "\"chord\": null}]",
             0},
            {"[[], {}, {\"errbacks\": null, \"callbacks\": null, \"chain\": null, "
             "\"chord\": null}]",
             1},
            {"[[], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": null}]", 1},
            {"[[], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": null, "
             "\"chord\": null, \"x\": null}]",
             1},
            {"[[], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": [], "
             "\"chord\": null}]",
             1},
            {"[[], {}, {}]", 1},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            struct buf body;
            cJSON *h = NULL;
            x.raw.body = cases[i].body;
            x.raw.body_len = strlen(x.raw.body);
            ck_assert_int_eq(decode(&x.raw, &m), 0);
            ck_assert_msg((m.embed != NULL) == cases[i].kept, "case %zu", i);
            buf_init(&body);
            ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
            if (!cases[i].kept)
                ck_assert_str_eq(body.data, cases[i].body);
            buf_release(&body);
            cJSON_Delete(h);
            task_msg_release(&m);
        }
    }
    cJSON_Delete(x.headers);
}
END_TEST

/* Headers that Celery sends as null (and some clients leave out). */
START_TEST(test_null_headers)
{
    struct msg x;
    struct task_msg m;
    msg_make(
        &x,
        "{\"lang\": null, \"task\": \"t.x\", \"id\": \"id-1\", \"shadow\": null, "
        "\"eta\": "
        "null, \"expires\": null, \"group\": null, \"group_index\": null, \"retries\": "
        "null, \"timelimit\": null, \"root_id\": null, \"parent_id\": null, "
        "\"argsrepr\": null, \"kwargsrepr\": null, \"origin\": null, \"ignore_result\": "
        "null, \"x-custom\": null}",
        V2B);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_str(m.root_id, "id-1");
    ck_assert_ptr_null(m.shadow);
    ck_assert_ptr_null(m.group);
    ck_assert_ptr_null(m.argsrepr);
    ck_assert_int_eq(m.retries, 0);
    ck_assert_int_eq(m.has_group_index, 0);
    ck_assert_int_eq(m.ignore_result, -1);
    ck_assert(m.eta_us == -1 && m.expires_us == -1);
    ck_assert(m.time_limit_hard == 0 && m.time_limit_soft == 0);
    task_msg_release(&m);
    cJSON_Delete(x.headers);

    /* display-only fields of the wrong type are ignored; root_id "" means id */
    msg_make(
        &x,
        "{\"task\": \"t.x\", \"id\": \"id-1\", \"root_id\": \"\", \"argsrepr\": 5, "
        "\"origin\": [], \"ignore_result\": 1, \"group_index\": 3, \"retries\": 2.0}",
        V2B);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_str(m.root_id, "id-1");
    ck_assert_ptr_null(m.argsrepr);
    ck_assert_ptr_null(m.origin);
    ck_assert_int_eq(m.ignore_result, 1);
    ck_assert_int_eq(m.group_index, 3);
    ck_assert_int_eq(m.retries, 2);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
}
END_TEST

/* Body dict fields, then overridden by any headers (Celery's hybrid_to_proto2). */
START_TEST(test_hybrid)
{
    struct msg x;
    struct task_msg m;
    const char *body =
        "{\"task\": \"t.body\", \"id\": \"body-id\", \"args\": [1, 2], \"kwargs\": "
        "{\"k\": 1}, \"retries\": 1, \"eta\": \"2030-01-02T03:04:05\", "
        "\"taskset\": \"ts-1\", \"timelimit\": [10, 5], \"utc\": false, "
        "\"errbacks\": [{\"task\": \"e\"}]}";
    msg_make(&x,
             "{\"id\": \"hdr-id\", \"retries\": 3, \"eta\": null, \"shadow\": \"sh\", "
             "\"args\": [9]}",
             body);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    ck_assert_int_eq(m.proto, 1);
    expect_str(m.task, "t.body");
    expect_str(m.id, "hdr-id");
    expect_str(m.root_id, "hdr-id");
    expect_str(m.shadow, "sh");
    ck_assert_int_eq(m.retries, 3);
    ck_assert_ptr_null(m.eta);
    ck_assert(m.eta_us == -1);
    expect_str(m.group, "ts-1");
    ck_assert(m.time_limit_hard == 10 && m.time_limit_soft == 5);
    expect_json(m.args, "[1, 2]"); /* args only ever come from the body */
    expect_json(m.kwargs, "{\"k\": 1}");
    expect_json(m.embed, "{\"callbacks\": null, \"errbacks\": [{\"task\": \"e\"}], "
                         "\"chain\": null, \"chord\": null}");
    task_msg_release(&m);
    cJSON_Delete(x.headers);

    /* a "task" header does not turn a dict body into v2 */
    msg_make(&x, "{\"task\": \"t.hdr\"}", body);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    ck_assert_int_eq(m.proto, 1);
    expect_str(m.task, "t.hdr");
    expect_str(m.id, "body-id");
    ck_assert(m.eta_us == INT64_C(1893553445000000));
    task_msg_release(&m);
    cJSON_Delete(x.headers);

    /* minimal v1: no headers at all, defaults for everything */
    msg_make(&x, NULL,
             "{\"task\": \"t\", \"id\": \"i\", \"group\": \"g\", \"taskset\": \"ts\"}");
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_json(m.args, "[]");
    expect_json(m.kwargs, "{}");
    expect_json(m.headers, "{}");
    expect_str(m.group, "g");
    ck_assert_ptr_null(m.embed);
    task_msg_release(&m);
}
END_TEST

/* A repeated key counts with its last value, as in Python. */
START_TEST(test_duplicate_keys)
{
    struct msg x;
    struct task_msg m;
    msg_make(&x, "{\"task\": \"t.x\", \"id\": \"first\", \"id\": \"last\"}", V2B);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_str(m.id, "last");
    task_msg_release(&m);
    cJSON_Delete(x.headers);
    msg_make(&x, NULL, "{\"task\": \"t\", \"id\": \"a\", \"args\": [1], \"args\": [2]}");
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    expect_json(m.args, "[2]");
    task_msg_release(&m);
}
END_TEST

/* Encoding from fields alone (a new message built by the worker). */
START_TEST(test_encode_from_fields)
{
    struct task_msg m;
    struct buf body;
    cJSON *h = NULL;

    task_msg_init(&m);
    m.id = cr_strdup("new-id");
    m.task = cr_strdup("t.next");
    m.parent_id = cr_strdup("parent");
    m.origin = cr_strdup("celeriac@host");
    m.eta_us = INT64_C(1893553445678901);
    m.time_limit_soft = 2.5;
    m.retries = 4;
    m.group_index = 2;
    m.has_group_index = 1;
    m.args = json("[1, \"it's\", 2.0, null]");
    buf_init(&body);
    buf_puts(&body, "prefix:");
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
    expect_json(
        h, "{\"lang\": \"py\", \"task\": \"t.next\", \"id\": \"new-id\", \"shadow\": "
           "null, \"eta\": \"2030-01-02T03:04:05.678901+00:00\", \"expires\": null, "
           "\"group\": null, \"group_index\": 2, \"retries\": 4, \"timelimit\": [null, "
           "2.5], \"root_id\": \"new-id\", \"parent_id\": \"parent\", \"argsrepr\": "
           "\"(1, \\\"it's\\\", 2.0, None)\", \"kwargsrepr\": \"{}\", \"origin\": "
           "\"celeriac@host\", \"ignore_result\": false}");
    ck_assert_str_eq(body.data,
                     "prefix:[[1, \"it's\", 2.0, null], {}, {\"callbacks\": null, "
                     "\"errbacks\": null, \"chain\": null, \"chord\": null}]");
    cJSON_Delete(h);

    /* one argument: a 1-tuple; no args at all: () */
    cJSON_Delete(m.args);
    m.args = json("[\"x\"]");
    buf_reset(&body);
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
    expect_str(cJSON_GetObjectItem(h, "argsrepr")->valuestring, "('x',)");
    cJSON_Delete(h);
    cJSON_Delete(m.args);
    m.args = NULL;
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
    expect_str(cJSON_GetObjectItem(h, "argsrepr")->valuestring, "()");
    cJSON_Delete(h);
    buf_release(&body);
    task_msg_release(&m);
}
END_TEST

START_TEST(test_encode_long_argsrepr)
{
    struct task_msg m;
    struct buf body, big;
    cJSON *h = NULL;
    const char *r;

    buf_init(&big);
    buf_puts(&big, "[\"");
    for (int i = 0; i < 3000; i++)
        buf_putc(&big, 'a' + i % 26);
    buf_puts(&big, "\"]");
    task_msg_init(&m);
    m.id = cr_strdup("i");
    m.task = cr_strdup("t");
    m.args = json(big.data);
    buf_init(&body);
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
    r = cJSON_GetObjectItem(h, "argsrepr")->valuestring;
    ck_assert_uint_eq(strlen(r), 1024 + 3);
    ck_assert(strncmp(r, "('abc", 5) == 0);
    ck_assert_str_eq(r + 1024, "...");
    cJSON_Delete(h);
    buf_release(&body);
    buf_release(&big);
    task_msg_release(&m);
}
END_TEST

/* Custom headers keep their order after Celery's own, whatever order came in. */
START_TEST(test_encode_header_order)
{
    struct msg x;
    struct task_msg m;
    struct buf body;
    cJSON *h = NULL;
    char *got;
    msg_make(&x,
             "{\"x-first\": 1, \"id\": \"id-1\", \"stamps\": {\"a\": [1.5]}, \"task\": "
             "\"t.x\", "
             "\"lang\": \"go\", \"x-last\": \"z\"}",
             V2B);
    ck_assert_int_eq(decode(&x.raw, &m), 0);
    buf_init(&body);
    ck_assert_int_eq(celery_msg_encode_v2(&m, &body, &h), 0);
    got = dumps(h);
    ck_assert_str_eq(
        got, "{\"lang\": \"py\", \"task\": \"t.x\", \"id\": \"id-1\", \"shadow\": "
             "null, \"eta\": null, \"expires\": null, \"group\": null, "
             "\"group_index\": null, \"retries\": 0, \"timelimit\": [null, null], "
             "\"root_id\": \"id-1\", \"parent_id\": null, \"argsrepr\": \"(1,)\", "
             "\"kwargsrepr\": \"{'a': 1}\", \"origin\": null, \"ignore_result\": "
             "false, \"x-first\": 1, \"stamps\": {\"a\": [1.5]}, \"x-last\": "
             "\"z\"}");
    cr_free(got);
    cJSON_Delete(h);
    buf_release(&body);
    task_msg_release(&m);
    cJSON_Delete(x.headers);
}
END_TEST

/* ---- OOM: fail allocation n = 1, 2, ... until the call succeeds ---- */

START_TEST(test_oom_decode_encode)
{
    struct fixture fx;
    long n;
    fixture_load(expects[_i].name, &fx);
    for (n = 1;; n++) {
        struct task_msg m;
        struct cr_err err;
        int rc;
        long failed;
        task_msg_init(&m);
        cr_alloc_fail_after(n);
        rc = celery_msg_decode(&fx.raw, &m, &err);
        failed = cr_alloc_failed(); /* cr_alloc_fail_after() resets the count */
        cr_alloc_fail_after(0);
        if (rc == 0) {
            /* Either nothing failed (the sweep is over) or the failure was
             * absorbed (the early, best-effort id copy): the result is whole. */
            check_common(&fx, &m);
            check_expect(&expects[_i], &m);
            task_msg_release(&m);
            if (failed == 0)
                break;
            continue;
        }
        ck_assert_msg(rc == CR_ENOMEM, "%s: n=%ld rc=%d (%s)", expects[_i].name, n, rc,
                      err.msg);
        ck_assert_int_eq(failed, 1);
        task_msg_release(&m);
    }
    ck_assert(n > 10);
    {
        struct task_msg m;
        ck_assert_int_eq(decode(&fx.raw, &m), 0);
        for (n = 1;; n++) {
            struct buf body;
            cJSON *h = (cJSON *)1;
            int rc;
            buf_init(&body);
            buf_puts(&body, "keep");
            cr_alloc_fail_after(n);
            rc = celery_msg_encode_v2(&m, &body, &h);
            cr_alloc_fail_after(0);
            if (rc == 0) {
                cJSON_Delete(h);
                buf_release(&body);
                break;
            }
            ck_assert_int_eq(rc, CR_ENOMEM);
            ck_assert_ptr_null(h);
            ck_assert_str_eq(body.data, "keep");
            buf_release(&body);
        }
        task_msg_release(&m);
    }
    cJSON_Delete(fx.root);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("celery_msg");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_fixture_files);
    tcase_add_loop_test(tc, test_fixture_decode, 0, N_EXPECTS);
    tcase_add_loop_test(tc, test_fixture_reencode, 0, N_EXPECTS);
    tcase_add_loop_test(tc, test_fixture_prefixes, 0, N_EXPECTS);
    tcase_add_loop_test(tc, test_bad_cases, 0, sizeof(bad_cases) / sizeof(bad_cases[0]));
    tcase_add_test(tc, test_content_types_accepted);
    tcase_add_test(tc, test_content_refused_unparsed);
    tcase_add_test(tc, test_compression_null_ok);
    tcase_add_test(tc, test_nesting);
    tcase_add_test(tc, test_huge_body);
    tcase_add_test(tc, test_embed_null_and_absent);
    tcase_add_test(tc, test_null_headers);
    tcase_add_test(tc, test_hybrid);
    tcase_add_test(tc, test_duplicate_keys);
    tcase_add_test(tc, test_encode_from_fields);
    tcase_add_test(tc, test_encode_long_argsrepr);
    tcase_add_test(tc, test_encode_header_order);
    tcase_add_loop_test(tc, test_oom_decode_encode, 0, N_EXPECTS);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    return s;
}
