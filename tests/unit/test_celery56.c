/* test_celery56.c -- messages captured from a Celery 5.6.3 producer
 * (tests/fixtures/capture56.py): decoded by the same decoder as the 5.2.6
 * ones, stamps kept and matched, the chord callback's group_id, and the
 * native delayed-delivery routing key read back and rebuilt. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/revoked.h"
#include "protocol/celery_msg.h"
#include "protocol/delayed.h"
#include "protocol/pyjson.h"
#include "tests/unit/unit.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

#define V56 "tests/fixtures/messages/v56/"

struct fixture {
    cJSON *root;
    struct celery_raw_msg raw;
    struct task_msg m;
};

static char *dumps(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return buf_detach(&b);
}

static void load(const char *name, struct fixture *fx)
{
    char path[256];
    struct cr_err err = {0, ""};

    snprintf(path, sizeof(path), V56 "%s.json", name);
    unit_load_message(path, &fx->root, &fx->raw);
    task_msg_init(&fx->m);
    ck_assert_msg(celery_msg_decode(&fx->raw, &fx->m, &err) == 0, "%s: %s", name,
                  err.msg);
    ck_assert_int_eq(fx->m.proto, 2);
}

static void unload(struct fixture *fx)
{
    task_msg_release(&fx->m);
    cJSON_Delete(fx->root);
}

static void expect_json(const cJSON *v, const char *want)
{
    char *got;
    ck_assert_ptr_nonnull(v);
    got = dumps(v);
    ck_assert_msg(strcmp(got, want) == 0, "got <%s> want <%s>", got, want);
    cr_free(got);
}

START_TEST(plain)
{
    struct fixture fx;
    cJSON *h;
    load("v56_plain", &fx);
    ck_assert_str_eq(fx.m.id, "0f0b8c1e-5601-4000-8000-000000005601");
    ck_assert_str_eq(fx.m.task, "proj.add");
    expect_json(fx.m.args, "[2, 3]");
    expect_json(fx.m.kwargs, "{}");
    ck_assert_int_eq(fx.m.eta_us, -1);
    ck_assert_ptr_null(fx.m.group);
    /* the 5.3+ headers come back when the message is sent again */
    h = celery_msg_headers(&fx.m);
    ck_assert_ptr_nonnull(h);
    expect_json(cJSON_GetObjectItemCaseSensitive(h, "replaced_task_nesting"), "0");
    expect_json(cJSON_GetObjectItemCaseSensitive(h, "stamped_headers"), "null");
    expect_json(cJSON_GetObjectItemCaseSensitive(h, "stamps"), "{}");
    cJSON_Delete(h);
    unload(&fx);
}
END_TEST

START_TEST(stamped)
{
    struct fixture fx;
    struct revoked_stamps rs;
    const char *name = NULL;
    const cJSON *value = NULL;
    cJSON *h, *by;
    load("v56_stamped", &fx);
    ck_assert_str_eq(fx.m.id, "0f0b8c1e-5602-4000-8000-000000005602");
    ck_assert_str_eq(fx.m.task, "proj.add");
    expect_json(fx.m.args, "[4, 5]");
    h = celery_msg_headers(&fx.m);
    ck_assert_ptr_nonnull(h);
    expect_json(cJSON_GetObjectItemCaseSensitive(h, "stamped_headers"),
                "[\"batch\", \"tenant\"]");
    expect_json(cJSON_GetObjectItemCaseSensitive(h, "stamps"),
                "{\"batch\": 7, \"tenant\": \"acme\"}");
    /* revoke_by_stamped_headers matches it by a stamp, not by another value */
    revoked_stamps_init(&rs);
    by = cJSON_Parse("{\"tenant\": \"other\"}");
    ck_assert_int_eq(revoked_stamps_add(&rs, by), 0);
    cJSON_Delete(by);
    ck_assert(!revoked_stamps_match(&rs, h, &name, &value));
    by = cJSON_Parse("{\"tenant\": [\"acme\"]}");
    ck_assert_int_eq(revoked_stamps_add(&rs, by), 0);
    cJSON_Delete(by);
    ck_assert(revoked_stamps_match(&rs, h, &name, &value));
    ck_assert_str_eq(name, "tenant");
    expect_json(value, "\"acme\"");
    revoked_stamps_release(&rs);
    cJSON_Delete(h);
    unload(&fx);
}
END_TEST

START_TEST(chord_group_id)
{
    struct fixture fx;
    const cJSON *chord, *opts;
    load("v56_chord_header", &fx);
    ck_assert_str_eq(fx.m.id, "0f0b8c1e-5603-4000-8000-000000005603");
    expect_json(fx.m.args, "[1, 1]");
    ck_assert_ptr_nonnull(fx.m.group);
    ck_assert(fx.m.has_group_index && fx.m.group_index == 0);
    ck_assert_ptr_nonnull(fx.m.embed);
    chord = cJSON_GetObjectItemCaseSensitive(fx.m.embed, "chord");
    ck_assert(cJSON_IsObject(chord));
    ck_assert_str_eq(unit_str(chord, "task"), "proj.tsum");
    opts = cJSON_GetObjectItemCaseSensitive(chord, "options");
    ck_assert_str_eq(unit_str(opts, "task_id"), "0f0b8c1e-5623-4000-8000-000000005623");
    /* 5.6 names the header's group in the callback's options */
    ck_assert_str_eq(unit_str(opts, "group_id"), fx.m.group);
    unload(&fx);
}
END_TEST

START_TEST(delayed_key)
{
    struct fixture fx;
    const cJSON *pub;
    const char *key;
    uint64_t delay = 0;
    size_t off = 0;
    char mine[128];
    load("v56_delayed", &fx);
    ck_assert_str_eq(fx.m.id, "0f0b8c1e-5604-4000-8000-000000005604");
    expect_json(fx.m.args, "[1, 6]");
    ck_assert(fx.m.eta_us > 0); /* the eta stays in the headers */
    pub = cJSON_GetObjectItemCaseSensitive(fx.root, "published");
    ck_assert_str_eq(unit_str(pub, "exchange"), DELAYED_ENTRY_EXCHANGE);
    key = unit_str(pub, "routing_key");
    ck_assert_ptr_nonnull(key);
    ck_assert_int_eq(delayed_parse_routing_key(key, strlen(key), &delay, &off), 0);
    ck_assert_uint_eq(delay, 5); /* countdown=5 */
    ck_assert_str_eq(key + off, "celery");
    ck_assert_int_eq(delayed_routing_key(delay, key + off, mine, sizeof(mine)),
                     (int)strlen(key));
    ck_assert_str_eq(mine, key);
    unload(&fx);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("celery56");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, plain);
    tcase_add_test(tc, stamped);
    tcase_add_test(tc, chord_group_id);
    tcase_add_test(tc, delayed_key);
    suite_add_tcase(s, tc);
    return s;
}
