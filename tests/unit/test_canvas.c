/* test_canvas.c -- the canvas plan builder against what Celery 5.2.6's worker
 * published for captured messages (tests/fixtures/capture.py canvas), plus
 * malformed signatures, limits and an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/canvas.h"
#include "protocol/celery_msg.h"
#include "protocol/pyjson.h"
#include "unit.h"
#include "util/alloc.h"

#define FIXTURES "tests/fixtures/messages/canvas/"

/* ---- fixtures ------------------------------------------------------------ */

struct uuid_seq {
    const char *prefix;
    int n;
};

static void seq_uuid(char out[37], void *arg)
{
    struct uuid_seq *s = arg;
    snprintf(out, 37, "%s%012d", s->prefix, ++s->n);
}

struct fx {
    cJSON *root;
    struct task_msg m;
    struct uuid_seq seq;
    struct canvas_opts o;
};

static const char *str_of(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *item(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* Decodes a recorded message {"properties", "headers", "body", ...}. */
static void decode_rec(const cJSON *rec, struct task_msg *m)
{
    const cJSON *props = item(rec, "properties"), *body = item(rec, "body");
    struct celery_raw_msg raw;
    struct cr_err err = {0, ""};
    memset(&raw, 0, sizeof raw);
    raw.content_type = str_of(rec, "content_type");
    raw.content_encoding = str_of(rec, "content_encoding");
    raw.headers = item(rec, "headers");
    raw.correlation_id = str_of(props, "correlation_id");
    raw.reply_to = str_of(props, "reply_to");
    raw.delivery_mode = 2;
    raw.priority =
        cJSON_IsNumber(item(props, "priority")) ? item(props, "priority")->valueint : 0;
    raw.body = body->valuestring;
    raw.body_len = strlen(body->valuestring);
    task_msg_init(m);
    ck_assert_msg(celery_msg_decode(&raw, m, &err) == 0, "decode: %s", err.msg);
}

static void fx_load(const char *name, struct fx *f)
{
    char path[256];
    size_t len;
    char *text;
    memset(f, 0, sizeof *f);
    snprintf(path, sizeof path, FIXTURES "%s.json", name);
    text = unit_read_file(path, &len);
    ck_assert_int_eq(py_json_parse(text, len, &f->root, NULL), 0);
    free(text);
    decode_rec(item(f->root, "input"), &f->m);
    f->seq.prefix = str_of(f->root, "uuid_prefix");
    f->o.hostname = str_of(f->root, "hostname");
    f->o.default_queue = "celery";
    f->o.now_us = (int64_t)item(f->root, "now_us")->valuedouble;
    f->o.new_uuid = seq_uuid;
    f->o.uuid_arg = &f->seq;
    f->o.reply_to = "reply-oid";
}

static void fx_release(struct fx *f)
{
    task_msg_release(&f->m);
    cJSON_Delete(f->root);
}

/* Runs the fixture's outcome through the builder. */
static int fx_plan(struct fx *f, struct canvas_plan *p, struct cr_err *err)
{
    const char *outcome = str_of(f->root, "outcome");
    if (!strcmp(outcome, "success"))
        return canvas_on_success(&f->m, item(f->root, "result"), &f->o, p, err);
    if (!strcmp(outcome, "failure"))
        return canvas_on_failure(&f->m, &f->o, p, err);
    {
        const cJSON *members = item(f->root, "members");
        int n = cJSON_GetArraySize(members), failed = 0, rc;
        const char *texts[16];
        size_t lens[16];
        struct canvas_chord ch;
        char *body_id = NULL;
        cJSON *exc = NULL;
        ck_assert_int_le(n, 16);
        for (int i = 0; i < n; i++) {
            texts[i] = cJSON_GetArrayItem(members, i)->valuestring;
            lens[i] = strlen(texts[i]);
        }
        ck_assert_int_eq(canvas_chord_of(&f->m, &ch), 1);
        rc = canvas_chord_join(&f->m, &ch, texts, lens, (size_t)n, &f->o, p, &failed,
                               &body_id, &exc, err);
        if (rc == 0) {
            const cJSON *want = item(f->root, "exc");
            ck_assert_int_eq(failed, !cJSON_IsNull(want));
            if (failed) {
                const cJSON *fails = item(f->root, "fails");
                ck_assert_msg(cJSON_Compare(exc, want, 1), "ChordError dict differs");
                ck_assert_str_eq(body_id, cJSON_GetArrayItem(fails, 0)->valuestring);
            }
        }
        free(body_id);
        cJSON_Delete(exc);
        return rc;
    }
}

static char *dump(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return b.data;
}

/* One follow-up, field by field, against what Python published. */
static void check_msg(const char *name, size_t i, const struct canvas_msg *got,
                      const cJSON *want)
{
    const cJSON *props = item(want, "properties"), *h = item(want, "headers");
    const cJSON *di = item(props, "delivery_info");
    cJSON *wh = cJSON_Duplicate(h, 1);
    char *a, *b;

    ck_assert_msg(!strcmp(got->id, str_of(h, "id")), "%s[%zu]: id %s, want %s", name, i,
                  got->id, str_of(h, "id"));
    ck_assert_str_eq(got->task, str_of(h, "task"));
    ck_assert_str_eq(got->exchange, str_of(di, "exchange"));
    ck_assert_str_eq(got->routing_key, str_of(di, "routing_key"));
    ck_assert_int_eq(got->priority, item(props, "priority")->valueint);
    ck_assert_str_eq(got->reply_to ? got->reply_to : "", str_of(props, "reply_to"));
    if (str_of(props, "expiration"))
        ck_assert_str_eq(got->expiration, str_of(props, "expiration"));
    else
        ck_assert_ptr_null(got->expiration);
    a = dump(got->headers);
    b = dump(wh);
    ck_assert_msg(!strcmp(a, b), "%s[%zu]: headers\n got  %s\n want %s", name, i, a, b);
    free(a);
    free(b);
    cJSON_Delete(wh);
    ck_assert_msg(!strcmp(got->body.data, str_of(want, "body")),
                  "%s[%zu]: body\n got  %s\n want %s", name, i, got->body.data,
                  str_of(want, "body"));
}

static const char *const cases[] = {
    "link_one",
    "link_several",
    "link_options",
    "link_error",
    "chain3",
    "chain3_1",
    "chain_immutable",
    "chain_immutable_1",
    "chain_fail",
    "chain_group_last",
    "chain_chord",
    "chain_chord_explicit",
    "chord_header_chain",
    "link_group3",
    "chain_map",
    "chain_starmap",
    "chain_chunks",
    "chord_join",
    "chord_join_fail",
    "v1_link",
    "v1_chord_join",
};
#define N_CASES ((int)(sizeof cases / sizeof *cases))

/* Every follow-up byte for byte (headers, body, routing, properties), the
 * chord sizes and the failed ids, as Celery 5.2.6 made them. */
START_TEST(test_fixture)
{
    const char *name = cases[_i];
    struct fx f;
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    const cJSON *fol, *sizes, *fails;
    size_t k = 0;

    fx_load(name, &f);
    ck_assert_msg(fx_plan(&f, &p, &err) == 0, "%s: %s", name, err.msg);
    fol = item(f.root, "followups");
    ck_assert_msg(p.nmsgs == (size_t)cJSON_GetArraySize(fol), "%s: %zu messages, want %d",
                  name, p.nmsgs, cJSON_GetArraySize(fol));
    for (const cJSON *w = fol->child; w; w = w->next, k++)
        check_msg(name, k, &p.msgs[k], w);
    sizes = item(f.root, "sizes");
    ck_assert_int_eq(p.nsizes, cJSON_GetArraySize(sizes));
    k = 0;
    for (const cJSON *s = sizes->child; s; s = s->next, k++) {
        ck_assert_str_eq(p.sizes[k].group_id, cJSON_GetArrayItem(s, 0)->valuestring);
        ck_assert_int_eq(p.sizes[k].size, cJSON_GetArrayItem(s, 1)->valueint);
    }
    if (strcmp(str_of(f.root, "outcome"), "join") != 0) {
        fails = item(f.root, "fails");
        ck_assert_int_eq(p.nfails, cJSON_GetArraySize(fails));
        k = 0;
        for (const cJSON *s = fails->child; s; s = s->next, k++)
            ck_assert_str_eq(p.fails[k], s->valuestring);
    }
    canvas_plan_release(&p);
    fx_release(&f);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("canvas");
    TCase *tc = tcase_create("fixtures");
    tcase_add_loop_test(tc, test_fixture, 0, N_CASES);
    suite_add_tcase(s, tc);
    return s;
}
