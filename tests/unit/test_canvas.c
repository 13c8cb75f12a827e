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

/* Whether fx_plan() checks a join's outcome against the fixture (not for
 * mutated fixtures). */
static int fx_check = 1;

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
        if (!canvas_chord_of(&f->m, &ch)) {
            ck_assert(!fx_check);
            canvas_plan_init(p);
            return 0;
        }
        rc = canvas_chord_join(&f->m, &ch, texts, lens, (size_t)n, &f->o, p, &failed,
                               &body_id, &exc, err);
        if (rc == 0 && fx_check) {
            const cJSON *want = item(f->root, "exc");
            ck_assert_int_eq(failed, !cJSON_IsNull(want));
            if (failed) {
                const cJSON *fails = item(f->root, "fails");
                ck_assert_msg(cJSON_Compare(exc, want, 1), "ChordError dict differs");
                ck_assert_str_eq(body_id, cJSON_GetArrayItem(fails, 0)->valuestring);
            }
        }
        cr_free(body_id);
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
    cr_free(a);
    cr_free(b);
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
    "chord_header_chain_fail",
    "link_group3",
    "chain_map",
    "chain_starmap",
    "chain_chunks",
    "chain_step_options",
    "chord_in_chord_join",
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
        const cJSON *parts = item(f.root, "parts");
        fails = item(f.root, "fails");
        ck_assert_int_eq(p.nfails, cJSON_GetArraySize(fails));
        k = 0;
        for (const cJSON *s = fails->child; s; s = s->next, k++)
            ck_assert_str_eq(p.fails[k], s->valuestring);
        /* the chord part-returns Celery ran for later steps */
        ck_assert_int_eq(p.nparts, parts ? cJSON_GetArraySize(parts) : 0);
        k = 0;
        for (const cJSON *s = parts ? parts->child : NULL; s; s = s->next, k++) {
            const cJSON *gi = cJSON_GetArrayItem(s, 2);
            ck_assert_str_eq(p.parts[k].task_id, cJSON_GetArrayItem(s, 0)->valuestring);
            ck_assert_str_eq(p.parts[k].group_id, cJSON_GetArrayItem(s, 1)->valuestring);
            ck_assert_int_eq(p.parts[k].group_index,
                             cJSON_IsNumber(gi) ? gi->valueint : -1);
            ck_assert(cJSON_IsObject(p.parts[k].body));
        }
    }
    canvas_plan_release(&p);
    fx_release(&f);
}
END_TEST

/* ---- hand-made messages --------------------------------------------------- */

static struct uuid_seq plain_seq;

static void opts_init(struct canvas_opts *o, char *const *routes, int nroutes)
{
    memset(o, 0, sizeof *o);
    plain_seq.prefix = "00000000-0000-4000-8000-";
    plain_seq.n = 0;
    o->hostname = "w1@host";
    o->default_queue = "celery";
    o->routes = routes;
    o->nroutes = nroutes;
    o->now_us = 1893456000000000LL; /* 2030-01-01T00:00:00+00:00 */
    o->new_uuid = seq_uuid;
    o->uuid_arg = &plain_seq;
}

/* A v2 message "t1" (id "id1", root "root1") with the given embed text. */
static void make_msg(struct task_msg *m, const char *embed, const char *group, int gidx)
{
    char headers[512], body[8192];
    struct celery_raw_msg raw;
    struct cr_err err = {0, ""};
    cJSON *h;
    snprintf(
        headers, sizeof headers,
        "{\"task\": \"t1\", \"id\": \"id1\", \"root_id\": \"root1\", \"group\": %s%s%s,"
        " \"group_index\": %d}",
        group ? "\"" : "", group ? group : "null", group ? "\"" : "", gidx);
    if (gidx < 0)
        snprintf(strstr(headers, "\"group_index\""), 32, "\"group_index\": null}");
    ck_assert_int_eq(py_json_parse(headers, strlen(headers), &h, NULL), 0);
    snprintf(body, sizeof body, "[[], {}, %s]", embed);
    memset(&raw, 0, sizeof raw);
    raw.headers = h;
    raw.body = body;
    raw.body_len = strlen(body);
    task_msg_init(m);
    ck_assert_msg(celery_msg_decode(&raw, m, &err) == 0, "%s", err.msg);
    cJSON_Delete(h);
}

/* on_success of "t1" returning 4; the embed is parsed by cJSON itself so that
 * tests may nest deeper than the decoder's JSON limit. */
static int success_of(const char *embed, struct canvas_plan *p, struct cr_err *err,
                      char *const *routes, int nroutes)
{
    struct task_msg m;
    struct canvas_opts o;
    cJSON *result = cJSON_CreateNumber(4);
    int rc;
    opts_init(&o, routes, nroutes);
    make_msg(&m, "null", NULL, -1);
    m.embed = cJSON_Parse(embed);
    ck_assert_ptr_nonnull(m.embed);
    rc = canvas_on_success(&m, result, &o, p, err);
    cJSON_Delete(result);
    task_msg_release(&m);
    return rc;
}

static const char *hdr(const struct canvas_msg *m, const char *key)
{
    return str_of(m->headers, key);
}

/* Signatures Celery could not apply either: CR_EPROTO, an empty plan. */
static const char *const bad_embeds[] = {
    "{\"callbacks\": [1]}",
    "{\"callbacks\": [{\"args\": []}]}",
    "{\"callbacks\": [{\"task\": \"\"}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"args\": 5}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"kwargs\": []}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"options\": 3}]}",
    "{\"callbacks\": \"x\"}",
    "{\"callbacks\": [{\"task\": \"a\"}, 7]}",
    "{\"chain\": {\"a\": 1}}",
    "{\"chain\": [5]}",
    "{\"chain\": [{\"task\": \"a\", \"subtask_type\": \"bogus\"}]}",
    "{\"chain\": [{\"task\": \"a\", \"subtask_type\": 7}]}",
    "{\"chain\": [{\"task\": \"celery.group\", \"subtask_type\": \"group\", "
    "\"kwargs\": {\"tasks\": 5}}]}",
    "{\"chain\": [{\"task\": \"celery.group\", \"subtask_type\": \"group\", "
    "\"kwargs\": {\"tasks\": [{\"task\": \"a\"}, 3]}}]}",
    "{\"chain\": [{\"task\": \"celery.chain\", \"subtask_type\": \"chain\", "
    "\"kwargs\": {\"tasks\": [[]]}}]}",
    "{\"chain\": [{\"task\": \"celery.chord\", \"subtask_type\": \"chord\", "
    "\"kwargs\": {\"header\": [{\"task\": \"a\"}]}}]}",
    "{\"chain\": [{\"task\": \"celery.chord\", \"subtask_type\": \"chord\", "
    "\"kwargs\": {\"header\": 3, \"body\": {\"task\": \"b\"}}}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"countdown\": \"x\"}}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"eta\": 5}}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"time_limit\": \"x\"}}]}",
    "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"expires\": 1e300}}]}",
};

START_TEST(test_malformed)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(success_of(bad_embeds[_i], &p, &err, NULL, 0), CR_EPROTO);
    ck_assert_msg(err.msg[0] != 0, "no detail for %s", bad_embeds[_i]);
    ck_assert_uint_eq(p.nmsgs, 0);
    ck_assert_ptr_null(p.msgs);
    ck_assert_uint_eq(p.nsizes, 0);
    canvas_plan_release(&p);
}
END_TEST

/* A signature nested deeper than the limit is refused, never recursed into. */
static char *nested(const char *open, const char *close, const char *leaf, int depth)
{
    struct buf b;
    buf_init(&b);
    for (int i = 0; i < depth; i++)
        ck_assert_int_eq(buf_puts(&b, open), 0);
    ck_assert_int_eq(buf_puts(&b, leaf), 0);
    for (int i = 0; i < depth; i++)
        ck_assert_int_eq(buf_puts(&b, close), 0);
    return b.data;
}

START_TEST(test_deep_nesting)
{
    static const char g_open[] = "{\"task\": \"celery.group\", \"subtask_type\": "
                                 "\"group\", \"kwargs\": {\"tasks\": [";
    static const char c_open[] = "{\"task\": \"celery.chain\", \"subtask_type\": "
                                 "\"chain\", \"kwargs\": {\"tasks\": [";
    /* chords nested in chord headers (a body is only embedded, not applied) */
    static const char b_open[] =
        "{\"task\": \"celery.chord\", \"subtask_type\": \"chord\", "
        "\"kwargs\": {\"body\": {\"task\": \"b\"}, \"header\": [";
    const char *opens[] = {g_open, c_open, b_open};
    const char *closes[] = {"]}}", "]}}", "]}}"};
    for (int k = 0; k < 3; k++) {
        for (int depth = 10; depth <= 50; depth += 40) {
            char *sig = nested(opens[k], closes[k], "{\"task\": \"leaf\"}", depth);
            size_t len = strlen(sig) + 32;
            char *embed = cr_malloc(len);
            struct canvas_plan p;
            struct cr_err err = {0, ""};
            int rc;
            snprintf(embed, len, "{\"callbacks\": [%s]}", sig);
            rc = success_of(embed, &p, &err, NULL, 0);
            if (depth == 10) {
                ck_assert_msg(rc == 0, "kind %d depth %d: %s", k, depth, err.msg);
                ck_assert_uint_ge(p.nmsgs, 1);
            } else {
                ck_assert_int_eq(rc, CR_EPROTO);
                ck_assert_uint_eq(p.nmsgs, 0);
            }
            canvas_plan_release(&p);
            cr_free(embed);
            buf_release(&(struct buf){.data = sig});
        }
    }
}
END_TEST

/* A group that would make more messages than a plan may hold is refused
 * before anything is built. */
START_TEST(test_plan_limit)
{
    struct buf b;
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    buf_init(&b);
    ck_assert_int_eq(buf_puts(&b,
                              "{\"callbacks\": [{\"task\": \"celery.group\", "
                              "\"subtask_type\": \"group\", \"kwargs\": {\"tasks\": ["),
                     0);
    for (int i = 0; i < 100001; i++)
        ck_assert_int_eq(buf_puts(&b, i ? ", {\"task\": \"a\"}" : "{\"task\": \"a\"}"),
                         0);
    ck_assert_int_eq(buf_puts(&b, "]}}]}"), 0);
    ck_assert_int_eq(success_of(b.data, &p, &err, NULL, 0), CR_EPROTO);
    ck_assert_uint_eq(p.nmsgs, 0);
    canvas_plan_release(&p);
    buf_release(&b);
}
END_TEST

START_TEST(test_routing)
{
    static char r1[] = "proj.*=hipri", r2[] = "t?=q2", r3[] = "bad";
    char *const routes[] = {r3, r1, r2};
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(
        success_of(
            "{\"callbacks\": [{\"task\": \"proj.a\"}, {\"task\": \"tx\"}, "
            "{\"task\": \"other\"}, {\"task\": \"proj.b\", \"options\": {\"queue\": "
            "\"mine\"}}, {\"task\": \"x\", \"options\": {\"exchange\": \"ex\", "
            "\"routing_key\": \"rk\"}}, {\"task\": \"y\", \"options\": {\"exchange\": "
            "\"ex\"}}, {\"task\": \"z\", \"options\": {\"routing_key\": \"rk\"}}]}",
            &p, &err, routes, 3),
        0);
    ck_assert_uint_eq(p.nmsgs, 7);
    ck_assert_str_eq(p.msgs[0].routing_key, "hipri");
    ck_assert_str_eq(p.msgs[1].routing_key, "q2");
    ck_assert_str_eq(p.msgs[2].routing_key, "celery");
    ck_assert_str_eq(p.msgs[3].routing_key, "mine");
    ck_assert_str_eq(p.msgs[4].exchange, "ex");
    ck_assert_str_eq(p.msgs[4].routing_key, "rk");
    /* one of exchange / routing_key alone: the default queue, as Celery */
    ck_assert_str_eq(p.msgs[5].exchange, "");
    ck_assert_str_eq(p.msgs[5].routing_key, "celery");
    ck_assert_str_eq(p.msgs[6].routing_key, "celery");
    for (size_t i = 0; i < 7; i++) {
        if (i != 4)
            ck_assert_str_eq(p.msgs[i].exchange, "");
        /* several plain callbacks: one new group */
        ck_assert_str_eq(hdr(&p.msgs[i], "group"),
                         "00000000-0000-4000-8000-000000000001");
        ck_assert_str_eq(hdr(&p.msgs[i], "parent_id"), "id1");
        ck_assert_str_eq(hdr(&p.msgs[i], "root_id"), "root1");
    }
    canvas_plan_release(&p);
}
END_TEST

/* countdown, eta, expires, limits, priority, headers, ignore_result, shadow. */
START_TEST(test_options)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    const cJSON *tl;
    ck_assert_int_eq(
        success_of(
            "{\"chain\": [{\"task\": \"a\", \"args\": [1], \"options\": {\"task_id\": "
            "\"fixed\", \"countdown\": 1.5, \"expires\": \"2030-01-01T00:01:00+00:00\", "
            "\"time_limit\": 30, \"soft_time_limit\": 20.5, \"priority\": 9, "
            "\"shadow\": \"sh\", \"ignore_result\": true, \"reply_to\": \"r\", "
            "\"headers\": {\"x-a\": 1, \"retries\": 3}, \"stamp\": \"kept?\"}, "
            "\"immutable\": true}]}",
            &p, &err, NULL, 0),
        0);
    ck_assert_uint_eq(p.nmsgs, 1);
    ck_assert_str_eq(p.msgs[0].id, "fixed");
    ck_assert_str_eq(hdr(&p.msgs[0], "eta"), "2030-01-01T00:00:01.500000+00:00");
    ck_assert_str_eq(hdr(&p.msgs[0], "expires"), "2030-01-01T00:01:00+00:00");
    ck_assert_str_eq(p.msgs[0].expiration, "60000");
    tl = item(p.msgs[0].headers, "timelimit");
    ck_assert_double_eq(cJSON_GetArrayItem(tl, 0)->valuedouble, 30);
    ck_assert_double_eq(cJSON_GetArrayItem(tl, 1)->valuedouble, 20.5);
    ck_assert_int_eq(p.msgs[0].priority, 9);
    ck_assert_str_eq(hdr(&p.msgs[0], "shadow"), "sh");
    ck_assert(cJSON_IsTrue(item(p.msgs[0].headers, "ignore_result")));
    ck_assert_str_eq(p.msgs[0].reply_to, "r");
    /* headers= is merged over Celery's (dict.update) */
    ck_assert_int_eq(item(p.msgs[0].headers, "x-a")->valueint, 1);
    ck_assert_int_eq(item(p.msgs[0].headers, "retries")->valueint, 3);
    /* immutable: the result is not prepended; a direct list keeps "[1]" */
    ck_assert_str_eq(hdr(&p.msgs[0], "argsrepr"), "[1]");
    ck_assert_str_eq(p.msgs[0].body.data,
                     "[[1], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": [], "
                     "\"chord\": null}]");
    canvas_plan_release(&p);
}
END_TEST

/* A stamped follow-up carries its stamps as Celery 5.3+ sends them. */
START_TEST(test_stamps)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    const cJSON *st;
    ck_assert_int_eq(
        success_of(
            "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"stamped_headers\": "
            "[\"tenant\", \"batch\", \"missing\"], \"tenant\": \"acme\", "
            "\"batch\": [1, 2], \"replaced_task_nesting\": 2}}, "
            "{\"task\": \"b\"}]}",
            &p, &err, NULL, 0),
        0);
    ck_assert_uint_eq(p.nmsgs, 2);
    st = item(p.msgs[0].headers, "stamped_headers");
    ck_assert_int_eq(cJSON_GetArraySize(st), 3);
    ck_assert_str_eq(cJSON_GetArrayItem(st, 0)->valuestring, "tenant");
    st = item(p.msgs[0].headers, "stamps");
    ck_assert_str_eq(item(st, "tenant")->valuestring, "acme");
    ck_assert_int_eq(cJSON_GetArraySize(item(st, "batch")), 2);
    ck_assert_ptr_null(item(st, "missing"));
    ck_assert_int_eq(item(p.msgs[0].headers, "replaced_task_nesting")->valueint, 2);
    /* an unstamped one has neither */
    ck_assert_ptr_null(item(p.msgs[1].headers, "stamped_headers"));
    ck_assert_ptr_null(item(p.msgs[1].headers, "stamps"));
    canvas_plan_release(&p);
}
END_TEST

/* timelimit as the options give it: a float stays a float, 0 stays 0. */
START_TEST(test_timelimit_as_given)
{
    struct task_msg m;
    struct canvas_opts o;
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    cJSON *r = cJSON_CreateNumber(1);
    struct buf b;
    opts_init(&o, NULL, 0);
    make_msg(&m,
             "{\"callbacks\": [{\"task\": \"a\", \"options\": {\"time_limit\": 30.0, "
             "\"soft_time_limit\": 0}}]}",
             NULL, -1);
    ck_assert_int_eq(canvas_on_success(&m, r, &o, &p, &err), 0);
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(item(p.msgs[0].headers, "timelimit"), &b), 0);
    ck_assert_str_eq(b.data, "[30.0, 0]");
    buf_release(&b);
    canvas_plan_release(&p);
    task_msg_release(&m);
    cJSON_Delete(r);
}
END_TEST

/* Numeric expires: now + seconds, TTL in ms (0 when already past). */
START_TEST(test_expires_seconds)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(
        success_of("{\"callbacks\": [{\"task\": \"a\", \"options\": {\"expires\": "
                   "-5}}, {\"task\": \"b\", \"options\": {\"expires\": 2.5}}]}",
                   &p, &err, NULL, 0),
        0);
    ck_assert_str_eq(p.msgs[0].expiration, "0");
    ck_assert_str_eq(hdr(&p.msgs[0], "expires"), "2029-12-31T23:59:55+00:00");
    ck_assert_str_eq(p.msgs[1].expiration, "2500");
    canvas_plan_release(&p);
}
END_TEST

START_TEST(test_has_followups)
{
    static const struct {
        const char *embed;
        int want;
    } v[] = {
        {"null", 0},
        {"{\"callbacks\": null, \"errbacks\": null, \"chain\": null, \"chord\": null}",
         0},
        {"{\"callbacks\": [], \"chain\": []}", 0},
        {"{\"errbacks\": [{\"task\": \"e\"}]}", 1},
        {"{\"chain\": [{\"task\": \"n\"}]}", 1},
        {"{\"chord\": {\"task\": \"b\"}}", 1},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        struct task_msg m;
        make_msg(&m, v[i].embed, NULL, -1);
        ck_assert_msg(canvas_has_followups(&m) == v[i].want, "%s", v[i].embed);
        task_msg_release(&m);
    }
}
END_TEST

/* An empty chord header applies the body at once with []. */
START_TEST(test_empty_chord_header)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(
        success_of("{\"chain\": [{\"task\": \"celery.chord\", \"subtask_type\": "
                   "\"chord\", \"kwargs\": {\"kwargs\": {}, \"header\": [], "
                   "\"body\": {\"task\": \"b\", \"options\": {\"task_id\": "
                   "\"bid\"}}}}]}",
                   &p, &err, NULL, 0),
        0);
    ck_assert_uint_eq(p.nmsgs, 1);
    ck_assert_uint_eq(p.nsizes, 0);
    ck_assert_str_eq(p.msgs[0].id, "bid");
    ck_assert(!strncmp(p.msgs[0].body.data, "[[[]], {}, ", 11));
    canvas_plan_release(&p);
}
END_TEST

/* A group with partial args: prepended to each member unless immutable; nested
 * groups flattened; no group_index (5.2.6 sets it only for chord headers). */
START_TEST(test_group_partial)
{
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    ck_assert_int_eq(
        success_of(
            "{\"callbacks\": [{\"task\": \"celery.group\", \"subtask_type\": \"group\", "
            "\"options\": {\"task_id\": \"gid\"}, \"kwargs\": {\"tasks\": [{\"task\": "
            "\"a\", \"args\": [1]}, {\"task\": \"celery.group\", \"subtask_type\": "
            "\"group\", \"kwargs\": {\"tasks\": [{\"task\": \"b\", \"immutable\": true}, "
            "{\"task\": \"c\"}]}}]}}]}",
            &p, &err, NULL, 0),
        0);
    ck_assert_uint_eq(p.nmsgs, 3);
    ck_assert_str_eq(p.msgs[0].task, "a");
    ck_assert_str_eq(p.msgs[1].task, "b");
    ck_assert_str_eq(p.msgs[2].task, "c");
    ck_assert(!strncmp(p.msgs[0].body.data, "[[4, 1], ", 9));
    ck_assert(!strncmp(p.msgs[1].body.data, "[[], ", 5));
    ck_assert(!strncmp(p.msgs[2].body.data, "[[4], ", 6));
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(hdr(&p.msgs[i], "group"), "gid");
        ck_assert(cJSON_IsNull(item(p.msgs[i].headers, "group_index")));
    }
    canvas_plan_release(&p);
}
END_TEST

/* A failure with a single errback dict and a chord step without a task_id. */
START_TEST(test_failure_forms)
{
    struct task_msg m;
    struct canvas_opts o;
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    opts_init(&o, NULL, 0);
    make_msg(
        &m,
        "{\"errbacks\": {\"task\": \"e\", \"args\": [7]}, \"chain\": [{\"task\": "
        "\"celery.chord\", \"subtask_type\": \"chord\", \"kwargs\": {\"header\": [], "
        "\"body\": {\"task\": \"b\", \"options\": {\"task_id\": \"body1\"}}}}, "
        "{\"task\": "
        "\"n\"}, {\"task\": \"k\", \"options\": {\"task_id\": \"k1\"}}]}",
        NULL, -1);
    ck_assert_int_eq(canvas_on_failure(&m, &o, &p, &err), 0);
    ck_assert_uint_eq(p.nfails, 2);
    ck_assert_str_eq(p.fails[0], "body1");
    ck_assert_str_eq(p.fails[1], "k1");
    ck_assert_uint_eq(p.nmsgs, 1);
    ck_assert_str_eq(p.msgs[0].task, "e");
    ck_assert_str_eq(hdr(&p.msgs[0], "parent_id"), "id1");
    ck_assert_str_eq(hdr(&p.msgs[0], "root_id"), "root1");
    ck_assert(!strncmp(p.msgs[0].body.data, "[[\"id1\", 7], ", 12));
    canvas_plan_release(&p);
    /* nothing to do */
    task_msg_release(&m);
    make_msg(&m, "null", NULL, -1);
    ck_assert_int_eq(canvas_on_failure(&m, &o, &p, &err), 0);
    ck_assert_uint_eq(p.nmsgs + p.nfails + p.nsizes, 0);
    canvas_plan_release(&p);
    task_msg_release(&m);
}
END_TEST

START_TEST(test_chord_member)
{
    static const struct {
        const char *state, *result, *want;
    } v[] = {
        {"SUCCESS", "2", "[1, \"tid\", \"SUCCESS\", 2]"},
        {"SUCCESS", "1.0", "[1, \"tid\", \"SUCCESS\", 1.0]"},
        {"SUCCESS", "\"h\\u00e9\"", "[1, \"tid\", \"SUCCESS\", \"h\\u00e9\"]"},
        {"SUCCESS", "{\"a\": [1, null]}",
         "[1, \"tid\", \"SUCCESS\", {\"a\": [1, null]}]"},
        {"FAILURE", "{\"exc_type\": \"ValueError\", \"exc_message\": [\"x\"]}",
         "[1, \"tid\", \"FAILURE\", {\"exc_type\": \"ValueError\", \"exc_message\": "
         "[\"x\"]}]"},
        {"SUCCESS", NULL, "[1, \"tid\", \"SUCCESS\", null]"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        struct buf b;
        cJSON *r = NULL;
        buf_init(&b);
        ck_assert_int_eq(buf_puts(&b, "x"), 0); /* appends */
        if (v[i].result)
            ck_assert_int_eq(py_json_parse(v[i].result, strlen(v[i].result), &r, NULL),
                             0);
        ck_assert_int_eq(canvas_chord_member("tid", v[i].state, r, &b), 0);
        ck_assert_str_eq(b.data + 1, v[i].want);
        buf_release(&b);
        cJSON_Delete(r);
    }
}
END_TEST

START_TEST(test_chord_of)
{
    struct task_msg m;
    struct canvas_chord ch;
    make_msg(&m, "{\"chord\": {\"task\": \"b\"}}", "g1", 3);
    ck_assert_int_eq(canvas_chord_of(&m, &ch), 1);
    ck_assert_str_eq(ch.group_id, "g1");
    ck_assert_int_eq(ch.group_index, 3);
    ck_assert_str_eq(str_of(ch.body, "task"), "b");
    task_msg_release(&m);
    make_msg(&m, "{\"chord\": {\"task\": \"b\"}}", "g1", -1);
    ck_assert_int_eq(canvas_chord_of(&m, &ch), 1);
    ck_assert_int_eq(ch.group_index, -1);
    task_msg_release(&m);
    make_msg(&m, "{\"chord\": {\"task\": \"b\"}}", NULL, -1);
    ck_assert_int_eq(canvas_chord_of(&m, &ch), 0);
    task_msg_release(&m);
    make_msg(&m, "{\"chord\": null}", "g1", 0);
    ck_assert_int_eq(canvas_chord_of(&m, &ch), 0);
    task_msg_release(&m);
}
END_TEST

static int join_of(const char *const *members, size_t n, struct canvas_plan *p,
                   int *failed, char **body_id, cJSON **exc, struct cr_err *err)
{
    struct task_msg m;
    struct canvas_opts o;
    struct canvas_chord ch;
    size_t lens[8];
    int rc;
    opts_init(&o, NULL, 0);
    make_msg(&m,
             "{\"chord\": {\"task\": \"b\", \"args\": [9], \"options\": {\"task_id\": "
             "\"bid\", "
             "\"link_error\": [{\"task\": \"e\"}]}}}",
             "g1", 1);
    ck_assert_int_eq(canvas_chord_of(&m, &ch), 1);
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(members[i]);
    rc = canvas_chord_join(&m, &ch, members, lens, n, &o, p, failed, body_id, exc, err);
    task_msg_release(&m);
    return rc;
}

/* The repr Celery puts in a ChordError for the exception a member stored. */
START_TEST(test_join_repr)
{
    static const struct {
        const char *member, *want;
    } v[] = {
        {"[1, \"m2\", \"FAILURE\", {\"exc_type\": \"KeyError\", \"exc_message\": [\"a\", "
         "1], "
         "\"exc_module\": \"builtins\"}]",
         "Dependency m2 raised KeyError('a', 1)"},
        {"[1, \"m2\", \"FAILURE\", {\"exc_type\": \"RuntimeError\", \"exc_message\": [], "
         "\"exc_module\": \"builtins\"}]",
         "Dependency m2 raised RuntimeError()"},
        {"[1, \"m2\", \"REVOKED\", {\"exc_type\": \"TaskRevokedError\", \"exc_message\": "
         "[\"revoked\"], \"exc_module\": \"celery.exceptions\"}]",
         "Dependency m2 raised TaskRevokedError('revoked')"},
        {"[1, \"m2\", \"FAILURE\", {\"exc_type\": \"E\", \"exc_message\": \"it's\"}]",
         "Dependency m2 raised E(\"it's\")"},
        {"[1, \"m2\", \"FAILURE\", null]", "Dependency m2 raised None"},
    };
    const char *members[2] = {"[1, \"m1\", \"SUCCESS\", 1]", v[_i].member};
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    char *body_id = NULL;
    cJSON *exc = NULL;
    int failed = 0;
    ck_assert_int_eq(join_of(members, 2, &p, &failed, &body_id, &exc, &err), 0);
    ck_assert_int_eq(failed, 1);
    ck_assert_str_eq(body_id, "bid");
    ck_assert_str_eq(str_of(exc, "exc_type"), "ChordError");
    ck_assert_str_eq(str_of(exc, "exc_module"), "celery.exceptions");
    ck_assert_str_eq(cJSON_GetArrayItem(item(exc, "exc_message"), 0)->valuestring,
                     v[_i].want);
    /* the body's errbacks, with the body id */
    ck_assert_uint_eq(p.nmsgs, 1);
    ck_assert_str_eq(p.msgs[0].task, "e");
    ck_assert(!strncmp(p.msgs[0].body.data, "[[\"bid\"], ", 10));
    ck_assert_str_eq(hdr(&p.msgs[0], "parent_id"), "bid");
    canvas_plan_release(&p);
    cr_free(body_id);
    cJSON_Delete(exc);
}
END_TEST

START_TEST(test_join_success)
{
    const char *members[3] = {"[1, \"m1\", \"SUCCESS\", 1]",
                              "[1, \"m2\", \"SUCCESS\", null]",
                              "[1, \"m3\", \"RETRY\", \"odd\"]"};
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    char *body_id = NULL;
    cJSON *exc = NULL;
    int failed = 1;
    ck_assert_int_eq(join_of(members, 3, &p, &failed, &body_id, &exc, &err), 0);
    ck_assert_int_eq(failed, 0);
    ck_assert_ptr_null(body_id);
    ck_assert_ptr_null(exc);
    ck_assert_uint_eq(p.nmsgs, 1);
    ck_assert_str_eq(p.msgs[0].id, "bid");
    ck_assert_str_eq(hdr(&p.msgs[0], "parent_id"), "id1");
    ck_assert_str_eq(hdr(&p.msgs[0], "root_id"), "root1");
    ck_assert(!strncmp(p.msgs[0].body.data, "[[[1, null, \"odd\"], 9], {}, ", 28));
    canvas_plan_release(&p);
}
END_TEST

/* Members that are not [1, id, state, result]: CR_EPROTO, nothing left over. */
START_TEST(test_join_bad)
{
    static const char *const bad[] = {
        "[1, \"m1\", \"SUCCESS\"]", "{\"a\": 1}", "[1, 2, \"SUCCESS\", 1]",
        "[1, \"m1\", null, 1]",     "not json",   "",
    };
    const char *members[2] = {"[1, \"m0\", \"SUCCESS\", 1]", bad[_i]};
    struct canvas_plan p;
    struct cr_err err = {0, ""};
    char *body_id = NULL;
    cJSON *exc = NULL;
    int failed = 1;
    ck_assert_int_eq(join_of(members, 2, &p, &failed, &body_id, &exc, &err), CR_EPROTO);
    ck_assert_int_eq(failed, 0);
    ck_assert_ptr_null(body_id);
    ck_assert_ptr_null(exc);
    ck_assert_uint_eq(p.nmsgs, 0);
    canvas_plan_release(&p);
}
END_TEST

/* Every allocation failing in turn: CR_ENOMEM and an empty plan, or the same
 * plan as without faults; never a crash or a leak (make asan). */
static const char *const oom_cases[] = {"chain_chord",     "chord_header_chain",
                                        "link_several",    "chain_fail",
                                        "chord_join_fail", "chain3"};

START_TEST(test_oom)
{
    struct fx f;
    size_t want = 0;
    fx_load(oom_cases[_i], &f);
    {
        struct canvas_plan p;
        struct cr_err err = {0, ""};
        ck_assert_int_eq(fx_plan(&f, &p, &err), 0);
        want = p.nmsgs;
        canvas_plan_release(&p);
    }
    for (long k = 1;; k++) {
        struct canvas_plan p;
        struct cr_err err = {0, ""};
        int rc, failed;
        f.seq.n = 0;
        cr_alloc_fail_after(k);
        rc = fx_plan(&f, &p, &err);
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        if (rc == 0) {
            ck_assert_uint_eq(p.nmsgs, want);
        } else {
            ck_assert_int_eq(rc, CR_ENOMEM);
            ck_assert_uint_eq(p.nmsgs, 0);
        }
        canvas_plan_release(&p);
        if (!failed)
            break;
        ck_assert_int_lt(k, 100000);
    }
    fx_release(&f);
}
END_TEST

/* Every node of every captured embed replaced in turn by a value of each
 * other kind: the builders return 0 or CR_EPROTO (or CR_ENOMEM), never crash
 * (make asan checks leaks and overflows). */
static cJSON *nth_node(cJSON *v, int *k, cJSON **parent)
{
    for (cJSON *c = (cJSON_IsArray(v) || cJSON_IsObject(v)) ? v->child : NULL; c;
         c = c->next) {
        cJSON *hit;
        if ((*k)-- == 0) {
            *parent = v;
            return c;
        }
        hit = nth_node(c, k, parent);
        if (hit)
            return hit;
    }
    return NULL;
}

START_TEST(test_mutations)
{
    static const char *const kinds[] = {"null", "1", "\"x\"", "[]", "{}", "[{}]", "true"};
    struct fx f;
    cJSON *orig;
    fx_load(cases[_i], &f);
    orig = f.m.embed;
    if (!orig) {
        fx_release(&f);
        return;
    }
    fx_check = 0;
    for (int node = 0;; node++) {
        int done = 0;
        for (size_t kind = 0; kind < sizeof kinds / sizeof *kinds; kind++) {
            cJSON *copy = cJSON_Duplicate(orig, 1), *hit, *rep, *parent = NULL;
            struct canvas_plan p;
            struct cr_err err = {0, ""};
            int k = node, rc;
            hit = nth_node(copy, &k, &parent);
            if (!hit) {
                cJSON_Delete(copy);
                done = 1;
                break;
            }
            rep = cJSON_Parse(kinds[kind]);
            ck_assert_ptr_nonnull(rep);
            if (cJSON_IsObject(parent))
                ck_assert(
                    cJSON_ReplaceItemInObjectCaseSensitive(parent, hit->string, rep));
            else
                ck_assert(cJSON_ReplaceItemViaPointer(parent, hit, rep));
            f.m.embed = copy;
            f.seq.n = 0;
            rc = fx_plan(&f, &p, &err);
            ck_assert_msg(rc == 0 || rc == CR_EPROTO, "%s node %d kind %zu: %d",
                          cases[_i], node, kind, rc);
            canvas_plan_release(&p);
            f.m.embed = orig;
            cJSON_Delete(copy);
        }
        if (done)
            break;
    }
    fx_check = 1;
    fx_release(&f);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("canvas");
    TCase *tc = tcase_create("fixtures");
    TCase *hand = tcase_create("hand");
    TCase *oom = tcase_create("oom");
    tcase_add_loop_test(tc, test_fixture, 0, N_CASES);
    suite_add_tcase(s, tc);
    tcase_add_loop_test(hand, test_malformed, 0,
                        (int)(sizeof bad_embeds / sizeof *bad_embeds));
    tcase_add_test(hand, test_deep_nesting);
    tcase_add_test(hand, test_plan_limit);
    tcase_add_test(hand, test_routing);
    tcase_add_test(hand, test_options);
    tcase_add_test(hand, test_stamps);
    tcase_add_test(hand, test_expires_seconds);
    tcase_add_test(hand, test_timelimit_as_given);
    tcase_add_test(hand, test_has_followups);
    tcase_add_test(hand, test_empty_chord_header);
    tcase_add_test(hand, test_group_partial);
    tcase_add_test(hand, test_failure_forms);
    tcase_add_test(hand, test_chord_member);
    tcase_add_test(hand, test_chord_of);
    tcase_add_loop_test(hand, test_join_repr, 0, 5);
    tcase_add_test(hand, test_join_success);
    tcase_add_loop_test(hand, test_join_bad, 0, 6);
    tcase_set_timeout(hand, 30);
    suite_add_tcase(s, hand);
    tcase_add_loop_test(oom, test_mutations, 0, N_CASES);
    tcase_add_loop_test(oom, test_oom, 0, (int)(sizeof oom_cases / sizeof *oom_cases));
    tcase_set_timeout(oom, 120);
    suite_add_tcase(s, oom);
    return s;
}
