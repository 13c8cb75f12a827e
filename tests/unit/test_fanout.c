/* test_fanout.c -- celery.map, celery.starmap and celery.chunks through the
 * engine (engine/fanout.c), driven by the recording fake engine_ops of
 * fake_engine.c: the items start up to the concurrency, the results come in
 * item order whatever order the calls end in, the first failure in item order
 * wins, an unknown inner task or a bad `it` fails the map, revoke and the time
 * limit abort the running items, a retryable item retries alone, and nothing
 * leaks (run under `make asan`). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "tests/unit/fake_engine.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "protocol/result.h"
#include "util/buf.h"

#define TASK_ID "0f0b8c1e-0001-4000-8000-000000000001"

/* ------------------------------------------------------------ the fake */

/* Only the map has events: its items have no id. */
static void map_only_events(struct fake *f, struct job *j,
                            const struct task_event_info *info)
{
    (void)f;
    (void)info;
    ck_assert_ptr_nonnull(j->tm.id);
}

/* The log names no delivery and no release ("call call done ack"), and of
 * the answers only "done": a map is one delivery, its items are calls. */
static void fake_init(struct fake *f, int concurrency)
{
    fake_base_init(f);
    f->log_numbers = 0;
    f->log_releases = 0;
    f->no_reads = 1;
    f->fail_publish = CR_EBROKER; /* nothing here waits for a confirm */
    f->on_notify = map_only_events;
    f->aliases[0] = (char *)"my.gen=llm.generate";
    f->cfg.naliases = 1;
    f->cfg.concurrency = concurrency;
    f->cfg.max_message_size = 1 << 22;
    f->cfg.dead_letter_exchange = "";
}

/* A delivery of task `task` (id) with the v2 body [args, kwargs, embed]. */
static struct delivery *message_id(struct fake *f, const char *task, const char *id,
                                   const char *args, const char *kwargs)
{
    struct fake_msg *m;
    struct buf b;
    cJSON *h =
        cJSON_Parse("{\"lang\": \"py\", \"retries\": 0, \"ignore_result\": false}");
    ck_assert_ptr_nonnull(h);
    cJSON_AddStringToObject(h, "task", task);
    cJSON_AddStringToObject(h, "id", id);
    cJSON_AddStringToObject(h, "root_id", id);
    buf_init(&b);
    buf_printf(&b,
               "[%s, %s, {\"callbacks\": null, \"errbacks\": null, \"chain\": null, "
               "\"chord\": null}]",
               args, kwargs);
    m = fake_msg_new(f, b.data, "celery", h);
    buf_release(&b);
    return &m->d;
}

static struct delivery *message(struct fake *f, const char *task, const char *args,
                                const char *kwargs)
{
    return message_id(f, task, TASK_ID, args, kwargs);
}

#define OTHER_ID "0f0b8c1e-0002-4000-8000-000000000002"

#define SIG(name)                                                                        \
    "{\"task\": \"" name "\", \"args\": [], \"kwargs\": {\"model\": \"sig-model\"}, "    \
    "\"options\": {}, \"subtask_type\": null, \"immutable\": false, \"chord_size\": "    \
    "null}"

/* celery.map / starmap of `it` over the inner task, as Python's
 * xmap.apply_async() sends it: no args, kwargs {task, it}. */
static void deliver_map(struct fake *f, const char *builtin, const char *inner,
                        const char *it)
{
    struct buf kw;
    buf_init(&kw);
    buf_printf(&kw,
               "{\"task\": {\"task\": \"%s\", \"args\": [], \"kwargs\": {\"model\": "
               "\"sig-model\"}, \"options\": {}, \"subtask_type\": null, "
               "\"immutable\": false, \"chord_size\": null}, \"it\": %s}",
               inner, it);
    engine_on_delivery(f->e, f->now, message(f, builtin, "[]", kw.data));
    buf_release(&kw);
}

static void llm_done(struct fake *f, int i, enum llm_verdict v, const char *exc,
                     int64_t retry_after_ms, const char *text)
{
    fake_note(f, "done", 0);
    fake_llm_done(f, i, v, exc, retry_after_ms, text);
}

static void ok(struct fake *f, int i, const char *text)
{
    llm_done(f, i, LLM_OK, NULL, -1, text);
}

static void stored(struct fake *f, int i)
{
    fake_stored(f, i, 0);
}

/* The meta's "result" as compact JSON (new). */
static char *meta_result(struct fake *f, int i)
{
    cJSON *m = cJSON_Parse(f->metas[i]);
    char *s;
    ck_assert_ptr_nonnull(m);
    s = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(m, "result"));
    cJSON_Delete(m);
    return s;
}

static void result_is(struct fake *f, int i, const char *want)
{
    char *s = meta_result(f, i);
    ck_assert_str_eq(s, want);
    free(s);
}

static int active(struct fake *f)
{
    struct engine_stats st;
    engine_stats(f->e, &st);
    return st.active;
}

static size_t live(struct fake *f)
{
    struct engine_stats st;
    engine_stats(f->e, &st);
    return st.live;
}

static void tick(struct fake *f, uint64_t ms)
{
    f->now.loop_ms += ms;
    f->now.epoch_us += (int64_t)ms * 1000;
    engine_on_tick(f->e, f->now);
}

/* Asserts the map j is (or whose item j is) is in state want, reached from
 * *at by a move engine__fan_state_legal() allows (or still there), and notes
 * it in *at. */
static void state_is(const struct job *j, enum fan_state want, enum fan_state *at)
{
    enum fan_state s = engine__fanout_state(j);
    ck_assert_msg(s == want, "state %s, want %s", engine__fan_state_names[s],
                  engine__fan_state_names[want]);
    ck_assert_msg(s == *at || engine__fan_state_legal(*at, s), "%s -> %s is not a move",
                  engine__fan_state_names[*at], engine__fan_state_names[s]);
    *at = s;
}

/* ---------------------------------------------------------------- tests */

START_TEST(test_map_in_order_up_to_concurrency)
{
    struct fake f;
    enum fan_state at = FAN_RUNNING;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\", \"e\"]");
    log_is(&f, "call call");
    state_is(engine_find_job(f.e, TASK_ID), FAN_RUNNING, &at);
    ck_assert_int_eq(active(&f), 2); /* the map itself holds no slot */
    ck_assert_int_eq(f.notes[TEV_STARTED], 1);
    /* Each item is the bare task with the item: the signature's kwargs
     * (model) are not used, as in Python. */
    ck_assert_ptr_nonnull(strstr(f.bodies[0], "\"content\":\"a\""));
    ck_assert_ptr_nonnull(strstr(f.bodies[1], "\"content\":\"b\""));
    ck_assert_ptr_null(strstr(f.bodies[0], "sig-model"));
    ok(&f, 1, "B");
    log_is(&f, "done call");
    ck_assert_ptr_nonnull(strstr(f.bodies[2], "\"content\":\"c\""));
    ok(&f, 2, "C");
    log_is(&f, "done call");
    ok(&f, 3, "D");
    log_is(&f, "done call");
    ck_assert_int_eq(active(&f), 2);
    ok(&f, 4, "E");
    log_is(&f, "done");
    state_is(f.calls[0], FAN_RUNNING, &at);
    ok(&f, 0, "A");
    log_is(&f, "done store-SUCCESS");
    state_is(f.stores[0], FAN_SETTLING, &at);
    result_is(&f, 0, "[\"A\",\"B\",\"C\",\"D\",\"E\"]");
    ck_assert_int_eq(f.ncalls, 5);
    ck_assert_int_eq(f.notes[TEV_SUCCEEDED], 1);
    ck_assert_int_eq(f.notes[TEV_FAILED], 0);
    stored(&f, 0);
    log_is(&f, "ack");
    ck_assert_int_eq(active(&f), 0);
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);
    ck_assert_int_eq(f.released, 1);
}
END_TEST

START_TEST(test_map_hundred_items_ten_at_a_time)
{
    struct fake f;
    struct buf it;
    char want[16];
    fake_init(&f, 10);
    fake_start(&f);
    buf_init(&it);
    buf_putc(&it, '[');
    for (int i = 0; i < 100; i++)
        buf_printf(&it, "%s\"p%d\"", i ? ", " : "", i);
    buf_putc(&it, ']');
    deliver_map(&f, "celery.map", "my.gen", it.data);
    buf_release(&it);
    ck_assert_int_eq(f.ncalls, 10);
    /* Finish them newest first: the order of the results does not follow. */
    for (int done = 0; done < 100; done++) {
        int i = f.ncalls - 1;
        while (!f.calls[i])
            i--;
        ck_assert_int_le(active(&f), 10);
        snprintf(want, sizeof(want), "r%d", i);
        ok(&f, i, want);
    }
    ck_assert_int_eq(f.ncalls, 100);
    ck_assert_int_eq(f.nstores, 1);
    {
        char *s = meta_result(&f, 0);
        cJSON *a = cJSON_Parse(s);
        ck_assert_int_eq(cJSON_GetArraySize(a), 100);
        for (int i = 0; i < 100; i++) {
            /* call i was item i: calls are made in item order */
            snprintf(want, sizeof(want), "r%d", i);
            ck_assert_str_eq(cJSON_GetArrayItem(a, i)->valuestring, want);
            snprintf(want, sizeof(want), "\"p%d\"", i);
            ck_assert_ptr_nonnull(strstr(f.bodies[i], want));
        }
        cJSON_Delete(a);
        free(s);
    }
    stored(&f, 0);
    ck_assert_int_eq(f.acked, 1);
    fake_release(&f);
}
END_TEST

START_TEST(test_starmap_and_chunks)
{
    struct fake f;
    fake_init(&f, 4);
    fake_start(&f);
    deliver_map(&f, "celery.starmap", "llm.generate",
                "[[\"x\"], [\"y\", null, \"be brief\"]]");
    log_is(&f, "call call");
    ck_assert_ptr_nonnull(strstr(f.bodies[0], "\"content\":\"x\""));
    /* *item: prompt, model, system */
    ck_assert_ptr_nonnull(strstr(f.bodies[1], "\"content\":\"be brief\""));
    ok(&f, 0, "X");
    ok(&f, 1, "Y");
    log_is(&f, "done done store-SUCCESS");
    result_is(&f, 0, "[\"X\",\"Y\"]");
    stored(&f, 0);
    fake_release(&f);

    /* celery.chunks run here: the parts of n, each a starmap. */
    fake_init(&f, 8);
    fake_start(&f);
    engine_on_delivery(
        f.e, f.now,
        message(&f, "celery.chunks", "[]",
                "{\"task\": " SIG("llm.generate") ", \"it\": [[\"1\"], "
                                                  "[\"2\"], [\"3\"]], \"n\": "
                                                  "2}"));
    log_is(&f, "call call call");
    ok(&f, 2, "c");
    ok(&f, 0, "a");
    ok(&f, 1, "b");
    result_is(&f, 0, "[[\"a\",\"b\"],[\"c\"]]");
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_accumulate_inner_runs_inline)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "celery.accumulate", "[1, \"two\"]");
    log_is(&f, "store-SUCCESS");
    /* accumulate(*args) returns args: [item] per item */
    result_is(&f, 0, "[[1],[\"two\"]]");
    stored(&f, 0);
    fake_release(&f);

    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.starmap", "celery.accumulate", "[[1, 2], [], \"ab\"]");
    result_is(&f, 0, "[[1,2],[],[\"a\",\"b\"]]");
    stored(&f, 0);
    fake_release(&f);

    /* An empty map succeeds with [] at once. */
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[]");
    log_is(&f, "store-SUCCESS");
    result_is(&f, 0, "[]");
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

static void failure_is(struct fake *f, int i, const char *exc_type, const char *message)
{
    cJSON *m = cJSON_Parse(f->metas[i]);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "result");
    char st[32];
    result_meta_status(f->metas[i], strlen(f->metas[i]), st, sizeof(st));
    ck_assert_str_eq(st, "FAILURE");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(r, "exc_type")->valuestring,
                     exc_type);
    if (message) {
        char *s =
            cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(r, "exc_message"));
        ck_assert_msg(strstr(s, message), "%s has no %s", s, message);
        free(s);
    }
    cJSON_Delete(m);
}

START_TEST(test_first_failure_in_order_wins)
{
    struct fake f;
    fake_init(&f, 3);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\"]");
    log_is(&f, "call call call");
    /* item 2 fails first: items 0 and 1 still run (either may fail first in
     * order), item 3 is never started */
    llm_done(&f, 2, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "done");
    llm_done(&f, 1, LLM_PERMANENT, "NotFoundError", -1, NULL);
    log_is(&f, "done");
    ok(&f, 0, "A");
    log_is(&f, "done store-FAILURE");
    failure_is(&f, 0, "NotFoundError", NULL);
    ck_assert_int_eq(f.ncalls, 3);
    ck_assert_int_eq(f.notes[TEV_FAILED], 1);
    stored(&f, 0);
    log_is(&f, "ack");
    fake_release(&f);

    /* item 0 fails: the later running items are aborted, none started */
    fake_init(&f, 3);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\"]");
    log_is(&f, "call call call");
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "done abort abort");
    ok(&f, 1, "late");
    llm_done(&f, 2, LLM_PERMANENT, "TaskRevokedError", -1, NULL);
    log_is(&f, "done done store-FAILURE");
    failure_is(&f, 0, "BadRequestError", NULL);
    ck_assert_int_eq(f.ncalls, 3);
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_bad_item_fails_in_its_place)
{
    struct fake f;
    fake_init(&f, 4);
    fake_start(&f);
    /* starmap of a number: TypeError at item 1, item 0 runs, item 2 not */
    deliver_map(&f, "celery.starmap", "llm.generate", "[[\"ok\"], 5, [\"no\"]]");
    log_is(&f, "call");
    ok(&f, 0, "fine");
    log_is(&f, "done store-FAILURE");
    failure_is(&f, 0, "TypeError", "argument after * must be an iterable, not int");
    stored(&f, 0);
    fake_release(&f);

    /* a bad call of the inner task (chat wants messages) */
    fake_init(&f, 4);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.chat", "[\"not a list\"]");
    log_is(&f, "store-FAILURE");
    failure_is(&f, 0, "TypeError", "messages");
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_unknown_inner_task)
{
    struct fake f;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "proj.nope", "[1, 2]");
    log_is(&f, "store-FAILURE");
    failure_is(&f, 0, "NotRegistered", "proj.nope");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "celery.exceptions"));
    ck_assert_int_eq(f.ncalls, 0);
    stored(&f, 0);
    ck_assert_int_eq(active(&f), 0);
    fake_release(&f);

    /* a map of maps is not something celeriac runs either */
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "celery.map", "[1]");
    failure_is(&f, 0, "NotRegistered", "celery.map");
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

static void bad_call(const char *task, const char *args, const char *kwargs,
                     const char *exc, const char *message_part)
{
    struct fake f;
    fake_init(&f, 2);
    fake_start(&f);
    engine_on_delivery(f.e, f.now, message(&f, task, args, kwargs));
    log_is(&f, "store-FAILURE");
    failure_is(&f, 0, exc, message_part);
    ck_assert_int_eq(f.ncalls, 0);
    stored(&f, 0);
    ck_assert_int_eq(active(&f), 0);
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);
}

START_TEST(test_bad_it)
{
    struct buf big;
    bad_call("celery.map", "[]", "{\"task\": " SIG("llm.generate") ", \"it\": 5}",
             "TypeError", "'int' object is not iterable");
    bad_call("celery.map", "[]", "{\"task\": " SIG("llm.generate") ", \"it\": null}",
             "TypeError", "'NoneType' object is not iterable");
    bad_call("celery.starmap", "[]",
             "{\"task\": " SIG("llm.generate") ", \"it\": \"abc\"}", "TypeError",
             "must be a list, not str");
    bad_call("celery.map", "[]", "{\"task\": " SIG("llm.generate") "}", "TypeError",
             "xmap() missing 1 required positional argument: 'it'");
    bad_call("celery.map", "[]",
             "{\"task\": " SIG("llm.generate") ", \"it\": [], \"extra\": 1}", "TypeError",
             "unexpected keyword argument 'extra'");
    bad_call("celery.map", "[]", "{\"task\": 7, \"it\": []}", "TypeError",
             "must be a signature or a task name");
    bad_call("celery.chunks", "[]",
             "{\"task\": " SIG("llm.generate") ", \"it\": [[1]], \"n\": 0}", "ValueError",
             "islice");
    /* positional binding works as in Python: xmap(task, it) */
    bad_call("celery.map", "[\"llm.generate\", 3]", "{}", "TypeError",
             "'int' object is not iterable");
    /* more items than the bound */
    buf_init(&big);
    buf_puts(&big, "{\"task\": \"llm.generate\", \"it\": [");
    for (int i = 0; i <= TASKS_FANOUT_MAX_ITEMS; i++)
        buf_puts(&big, i ? ",1" : "1");
    buf_puts(&big, "]}");
    bad_call("celery.map", "[]", big.data, "ValueError", "over the limit of 100000");
    buf_release(&big);
}
END_TEST

START_TEST(test_revoke_terminate_aborts_items)
{
    struct fake f;
    enum fan_state at = FAN_RUNNING;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\"]");
    log_is(&f, "call call");
    ok(&f, 0, "A");
    log_is(&f, "done call");
    ck_assert_int_eq(engine_revoke(f.e, f.now, TASK_ID, 1), 1);
    log_is(&f, "abort abort");
    state_is(f.calls[1], FAN_REVOKED, &at);
    /* a second terminate finds it stopped */
    ck_assert_int_eq(engine_revoke(f.e, f.now, TASK_ID, 1), 1);
    log_is(&f, "");
    llm_done(&f, 1, LLM_PERMANENT, "TaskRevokedError", -1, NULL);
    log_is(&f, "done");
    state_is(f.calls[2], FAN_REVOKED, &at);
    llm_done(&f, 2, LLM_PERMANENT, "TaskRevokedError", -1, NULL);
    log_is(&f, "done store-REVOKED");
    state_is(f.stores[0], FAN_SETTLING, &at);
    ck_assert_int_eq(f.ncalls, 3); /* item 3 never started */
    ck_assert_int_eq(f.notes[TEV_REVOKED], 1);
    stored(&f, 0);
    log_is(&f, "ack");
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);

    /* a revoke without terminate lets a running map finish, as in Python */
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\"]");
    ck_assert_int_eq(engine_revoke(f.e, f.now, TASK_ID, 0), 0);
    ok(&f, 0, "A");
    log_is(&f, "call done store-SUCCESS");
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_time_limit_aborts_items)
{
    struct fake f;
    enum fan_state at = FAN_RUNNING;
    fake_init(&f, 2);
    f.cfg.time_limit = 10;
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call call");
    tick(&f, 5000);
    log_is(&f, "");
    ok(&f, 0, "A");
    log_is(&f, "done call");
    tick(&f, 5001);
    log_is(&f, "abort abort");
    state_is(f.calls[1], FAN_TIMED_OUT, &at);
    llm_done(&f, 1, LLM_PERMANENT, "TimeLimitExceeded", -1, NULL);
    llm_done(&f, 2, LLM_PERMANENT, "TimeLimitExceeded", -1, NULL);
    log_is(&f, "done done store-FAILURE");
    state_is(f.stores[0], FAN_SETTLING, &at);
    failure_is(&f, 0, "TimeLimitExceeded", "10");
    stored(&f, 0);
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);

    /* the soft limit fails it with SoftTimeLimitExceeded, queued items dropped */
    fake_init(&f, 1);
    f.cfg.soft_time_limit = 2;
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call");
    tick(&f, 2500);
    log_is(&f, "abort");
    llm_done(&f, 0, LLM_PERMANENT, "SoftTimeLimitExceeded", -1, NULL);
    log_is(&f, "done store-FAILURE");
    failure_is(&f, 0, "SoftTimeLimitExceeded", NULL);
    stored(&f, 0);
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_retryable_item_retries_alone)
{
    struct fake f;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\"]");
    log_is(&f, "call call");
    ok(&f, 0, "A");
    llm_done(&f, 1, LLM_RETRYABLE, "RateLimitError", 1500, NULL);
    log_is(&f, "done done");
    tick(&f, 1000);
    log_is(&f, ""); /* Retry-After not yet over */
    tick(&f, 600);
    log_is(&f, "call"); /* only item 1 again: item 0 is not paid twice */
    ck_assert_ptr_nonnull(strstr(f.bodies[2], "\"content\":\"b\""));
    ok(&f, 2, "B");
    log_is(&f, "done store-SUCCESS");
    result_is(&f, 0, "[\"A\",\"B\"]");
    ck_assert_int_eq(f.notes[TEV_RETRIED], 0);
    stored(&f, 0);
    fake_release(&f);

    /* out of retries: the item's error fails the map */
    fake_init(&f, 1);
    f.cfg.max_retries = 1;
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\"]");
    llm_done(&f, 0, LLM_RETRYABLE, "APIConnectionError", -1, NULL);
    tick(&f, 1100);
    log_is(&f, "call done call");
    llm_done(&f, 1, LLM_RETRYABLE, "APIConnectionError", -1, NULL);
    log_is(&f, "done store-FAILURE");
    failure_is(&f, 0, "APIConnectionError", NULL);
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_item_falls_back_to_the_next_provider)
{
    struct fake f;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\"]");
    log_is(&f, "call call");
    ok(&f, 0, "A");
    /* item 1's provider is overloaded, another follows: asked at once, no
     * backoff, no retry counted */
    f.fallback_left = 1;
    llm_done(&f, 1, LLM_RETRYABLE, "OverloadedError", -1, NULL);
    log_is(&f, "done done call");
    ck_assert_int_eq(f.steps[2], 1);
    ck_assert_ptr_nonnull(strstr(f.bodies[2], "\"content\":\"b\""));
    /* the last target fails too: the item retries in place, from the first */
    f.fallback_left = 0;
    llm_done(&f, 2, LLM_RETRYABLE, "APIConnectionError", -1, NULL);
    log_is(&f, "done");
    tick(&f, 1100);
    log_is(&f, "call");
    ck_assert_int_eq(f.steps[3], 0);
    ok(&f, 3, "B");
    log_is(&f, "done store-SUCCESS");
    result_is(&f, 0, "[\"A\",\"B\"]");
    ck_assert_int_eq(f.notes[TEV_FALLBACK], 0); /* an item has no progress run */
    stored(&f, 0);
    fake_release(&f);

    /* a permanent failure does not fall back: it fails the map */
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\"]");
    f.fallback_left = 1;
    llm_done(&f, 0, LLM_PERMANENT, "AuthenticationError", -1, NULL);
    log_is(&f, "call done store-FAILURE");
    failure_is(&f, 0, "AuthenticationError", NULL);
    stored(&f, 0);
    fake_release(&f);
}
END_TEST

static void count_job(struct job *j, void *arg)
{
    ck_assert_ptr_nonnull(j->tm.id);
    (*(int *)arg)++;
}

START_TEST(test_inspect_shows_the_map_only)
{
    struct fake f;
    int running = 0, ready = 0;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    engine_each_job(f.e, ENGINE_JOBS_RUNNING, count_job, &running);
    engine_each_job(f.e, ENGINE_JOBS_READY, count_job, &ready);
    ck_assert_int_eq(running, 1);
    ck_assert_int_eq(ready, 0);
    ck_assert_ptr_nonnull(engine_find_job(f.e, TASK_ID));
    fake_release(&f);
}
END_TEST

START_TEST(test_warm_shutdown_finishes_the_map)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\"]");
    log_is(&f, "call");
    engine_shutdown(f.e, f.now, 0);
    log_is(&f, ""); /* the queued item is not dropped: its map runs */
    ok(&f, 0, "A");
    log_is(&f, "done call");
    ok(&f, 1, "B");
    log_is(&f, "done store-SUCCESS");
    stored(&f, 0);
    log_is(&f, "ack stop-warm");
    fake_release(&f);
}
END_TEST

START_TEST(test_cold_stop_mid_map_leaves_it_unacked)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call");
    /* halt, the call cancelled, the engine freed: nothing settled, nothing
     * leaked (asan) */
    fake_release(&f);
    ck_assert_int_eq(f.acked + f.rejected, 0);
    ck_assert_int_eq(f.released, 1);

    /* halted with an item running and one queued */
    fake_init(&f, 2);
    fake_start(&f);
    engine_on_delivery(f.e, f.now,
                       message_id(&f, "llm.generate", OTHER_ID, "[\"x\"]", "{}"));
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call call");
    fake_release(&f);
    ck_assert_int_eq(f.acked + f.rejected, 0);
    ck_assert_int_eq(f.released, 2);

    /* freed with an item waiting for its retry */
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\"]");
    ok(&f, 0, "A");
    llm_done(&f, 1, LLM_RETRYABLE, "RateLimitError", 5000, NULL);
    log_is(&f, "call call done done");
    fake_release(&f);
    ck_assert_int_eq(f.acked + f.rejected, 0);
    ck_assert_int_eq(f.released, 1);
}
END_TEST

START_TEST(test_lost_delivery_stops_the_map)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call");
    /* the connection goes: the next item is not paid for, nothing is settled,
     * and a redelivery starts a new map */
    f.connected = 0;
    ok(&f, 0, "A");
    log_is(&f, "done");
    ck_assert_int_eq(f.ncalls, 1);
    ck_assert_ptr_null(engine_find_job(f.e, TASK_ID));
    ck_assert_uint_eq(live(&f), 0);
    ck_assert_int_eq(active(&f), 0);
    ck_assert_int_eq(f.acked + f.rejected, 0);
    ck_assert_int_eq(f.released, 1);
    fake_release(&f);
}
END_TEST

/* The connection goes while two items run: the next item to start finds the
 * map's delivery gone, the map is LOST and aborts the other; it lets go once
 * that call is back, unsettled. */
START_TEST(test_lost_map_waits_for_its_running_items)
{
    struct fake f;
    enum fan_state at = FAN_RUNNING;
    struct job *b;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call call");
    b = f.calls[1];
    state_is(b, FAN_RUNNING, &at);
    f.connected = 0;
    ok(&f, 0, "A");
    log_is(&f, "done abort"); /* b, as the map is lost */
    state_is(b, FAN_LOST, &at);
    ck_assert_ptr_null(engine_find_job(f.e, TASK_ID));
    ck_assert_uint_eq(live(&f), 2); /* the map and b */
    llm_done(&f, 1, LLM_PERMANENT, "WorkerLostError", -1, NULL);
    log_is(&f, "done");
    ck_assert_int_eq(f.ncalls, 2);
    ck_assert_uint_eq(live(&f), 0);
    ck_assert_int_eq(f.acked + f.rejected, 0);
    ck_assert_int_eq(f.released, 1);
    fake_release(&f);
}
END_TEST

/* Every state has its own name, and the moves are exactly these. */
START_TEST(test_map_state_names_and_moves)
{
    static const struct {
        enum fan_state a, b;
    } moves[] = {
        {FAN_RUNNING, FAN_TIMED_OUT}, {FAN_RUNNING, FAN_REVOKED},
        {FAN_RUNNING, FAN_LOST},      {FAN_RUNNING, FAN_SETTLING},
        {FAN_TIMED_OUT, FAN_LOST},    {FAN_TIMED_OUT, FAN_SETTLING},
        {FAN_REVOKED, FAN_LOST},      {FAN_REVOKED, FAN_SETTLING},
        {FAN_LOST, FAN_SETTLING},
    };
    for (int a = 0; a < FAN_NSTATES; a++) {
        ck_assert_ptr_nonnull(engine__fan_state_names[a]);
        ck_assert_int_gt(strlen(engine__fan_state_names[a]), 0);
        for (int b = 0; b < a; b++)
            ck_assert_str_ne(engine__fan_state_names[a], engine__fan_state_names[b]);
        for (int b = 0; b < FAN_NSTATES; b++) {
            int want = 0;
            for (size_t k = 0; k < sizeof(moves) / sizeof(moves[0]); k++)
                want |=
                    moves[k].a == (enum fan_state)a && moves[k].b == (enum fan_state)b;
            ck_assert_msg(engine__fan_state_legal(a, b) == want, "%s -> %s",
                          engine__fan_state_names[a], engine__fan_state_names[b]);
        }
    }
    ck_assert_str_eq(engine__fan_state_names[FAN_SETTLING], "SETTLING");
    ck_assert_int_eq(engine__fan_state_legal(FAN_NSTATES, FAN_RUNNING), 0);
    ck_assert_int_eq(engine__fan_state_legal(FAN_RUNNING, FAN_NSTATES), 0);
}
END_TEST

START_TEST(test_map_waits_for_a_slot_like_a_task)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    /* a busy worker: the map's items queue behind the running task */
    engine_on_delivery(f.e, f.now,
                       message_id(&f, "llm.generate", OTHER_ID, "[\"x\"]", "{}"));
    log_is(&f, "call");
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\"]");
    log_is(&f, "");
    ok(&f, 0, "X");
    /* the slot is free once the call is done: the map starts, its item
     * takes the slot */
    log_is(&f, "done store-SUCCESS call");
    stored(&f, 0);
    log_is(&f, "ack");
    ok(&f, 1, "A");
    log_is(&f, "done store-SUCCESS");
    result_is(&f, 1, "[\"A\"]");
    stored(&f, 1);
    fake_release(&f);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("fanout");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_map_in_order_up_to_concurrency);
    tcase_add_test(tc, test_map_hundred_items_ten_at_a_time);
    tcase_add_test(tc, test_starmap_and_chunks);
    tcase_add_test(tc, test_accumulate_inner_runs_inline);
    tcase_add_test(tc, test_first_failure_in_order_wins);
    tcase_add_test(tc, test_bad_item_fails_in_its_place);
    tcase_add_test(tc, test_unknown_inner_task);
    tcase_add_test(tc, test_bad_it);
    tcase_add_test(tc, test_revoke_terminate_aborts_items);
    tcase_add_test(tc, test_time_limit_aborts_items);
    tcase_add_test(tc, test_retryable_item_retries_alone);
    tcase_add_test(tc, test_item_falls_back_to_the_next_provider);
    tcase_add_test(tc, test_inspect_shows_the_map_only);
    tcase_add_test(tc, test_warm_shutdown_finishes_the_map);
    tcase_add_test(tc, test_cold_stop_mid_map_leaves_it_unacked);
    tcase_add_test(tc, test_lost_delivery_stops_the_map);
    tcase_add_test(tc, test_map_waits_for_a_slot_like_a_task);
    tcase_add_test(tc, test_lost_map_waits_for_its_running_items);
    tcase_add_test(tc, test_map_state_names_and_moves);
    suite_add_tcase(s, tc);
    return s;
}
