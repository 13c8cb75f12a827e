/* test_fanout.c -- celery.map, celery.starmap and celery.chunks through the
 * engine (engine/fanout.c), driven by a small recording fake engine_ops: the
 * items start up to the concurrency, the results come in item order whatever
 * order the calls end in, the first failure in item order wins, an unknown
 * inner task or a bad `it` fails the map, revoke and the time limit abort
 * the running items, a retryable item retries alone, and nothing leaks
 * (run under `make asan`). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "engine/engine.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"

#define T0_US 1700000000000000LL
#define MAXOPS 256
#define TASK_ID "0f0b8c1e-0001-4000-8000-000000000001"

/* ------------------------------------------------------------ the fake */

struct fmsg {
    struct delivery d;
    char *body;
};

struct fake {
    struct buf log;
    struct engine *e;
    struct engine_config cfg;
    char *aliases[2];
    char *queues[1];
    struct engine_now now;
    int acks, rejects, releases;
    int disconnected;
    struct job *stores[MAXOPS];
    enum engine_store_kind store_kind[MAXOPS];
    char *metas[MAXOPS];
    int nstores;
    struct job *calls[MAXOPS];
    char *bodies[MAXOPS];
    int ncalls;
    int aborted[MAXOPS];
    int notes[TEV_DEAD_LETTERED + 1];
    int stopped;
};

static void note(struct fake *f, const char *what)
{
    buf_printf(&f->log, "%s%s", f->log.len ? " " : "", what);
}

static int call_index(struct fake *f, const struct job *j)
{
    for (int i = f->ncalls - 1; i >= 0; i--)
        if (f->calls[i] == j)
            return i;
    return -1;
}

static void f_ack(void *ctx, struct delivery *d)
{
    struct fake *f = ctx;
    ck_assert(!d->settled);
    d->settled = 1;
    f->acks++;
    note(f, "ack");
}

static void f_reject(void *ctx, struct delivery *d, int requeue)
{
    struct fake *f = ctx;
    ck_assert(!d->settled);
    d->settled = 1;
    f->rejects++;
    note(f, requeue ? "requeue" : "reject");
}

static int f_live(void *ctx, const struct delivery *d)
{
    (void)d;
    return !((struct fake *)ctx)->disconnected;
}

static void f_release(void *ctx, struct delivery *d)
{
    struct fake *f = ctx;
    struct fmsg *m = (struct fmsg *)d;
    f->releases++;
    cJSON_Delete(d->headers);
    free(m->body);
    free(m);
}

static int f_read_state(void *ctx, struct job *j)
{
    (void)ctx;
    (void)j;
    ck_abort_msg("no read expected");
    return 0;
}

static int f_store(void *ctx, struct job *j, char *meta, size_t n,
                   enum engine_store_kind kind)
{
    struct fake *f = ctx;
    char st[32] = "";
    (void)n;
    result_meta_status(meta, strlen(meta), st, sizeof(st));
    buf_printf(&f->log, "%sstore-%s", f->log.len ? " " : "", st);
    f->stores[f->nstores] = j;
    f->store_kind[f->nstores] = kind;
    f->metas[f->nstores++] = meta;
    return 0;
}

static int f_publish(void *ctx, const struct outbound *o, struct engine_publish *p)
{
    struct fake *f = ctx;
    (void)p;
    buf_printf(&f->log, "%spublish:%s", f->log.len ? " " : "", o->exchange);
    /* Dead letters are confirmed at once by confirm_all(). */
    return CR_EBROKER;
}

static int f_call(void *ctx, struct job *j, const struct task_call *c, struct cr_err *err)
{
    struct fake *f = ctx;
    (void)err;
    ck_assert_int_lt(f->ncalls, MAXOPS);
    j->call = j;
    f->bodies[f->ncalls] = strndup(c->body, c->body_len);
    f->calls[f->ncalls++] = j;
    note(f, "call");
    return 0;
}

static void f_abort(void *ctx, struct job *j, const char *exc_type, const char *msg)
{
    struct fake *f = ctx;
    int i = call_index(f, j);
    (void)exc_type;
    (void)msg;
    ck_assert_ptr_nonnull(j->call);
    ck_assert_int_ge(i, 0);
    f->aborted[i] = 1;
    note(f, "abort");
}

static int f_lease(void *ctx, struct job *j, enum engine_lease_op op, long ttl_s)
{
    (void)ctx;
    (void)j;
    (void)op;
    (void)ttl_s;
    return 0;
}

static void f_prefetch(void *ctx, int n)
{
    (void)ctx;
    (void)n;
}

static void f_notify(void *ctx, struct job *j, const struct task_event_info *info)
{
    struct fake *f = ctx;
    /* Only the map has events: its items have no id. */
    ck_assert_ptr_nonnull(j->tm.id);
    f->notes[info->type]++;
}

static void f_forget(void *ctx, struct job *j)
{
    (void)ctx;
    (void)j;
}

static void f_stop(void *ctx, int cold)
{
    struct fake *f = ctx;
    f->stopped++;
    note(f, cold ? "stop-cold" : "stop-warm");
}

static const struct engine_ops fake_ops = {
    f_ack,  f_reject, f_live,  f_release,  f_read_state, f_store,  f_publish,
    f_call, f_abort,  f_lease, f_prefetch, f_notify,     f_forget, f_stop,
};

static void fake_init(struct fake *f, int concurrency)
{
    memset(f, 0, sizeof(*f));
    buf_init(&f->log);
    f->now.loop_ms = 1000;
    f->now.epoch_us = T0_US;
    f->aliases[0] = (char *)"my.gen=llm.generate";
    f->queues[0] = (char *)"celery";
    f->cfg.hostname = "celery@test";
    f->cfg.pid = 42;
    f->cfg.concurrency = concurrency;
    f->cfg.prefetch_multiplier = 4;
    f->cfg.aliases = f->aliases;
    f->cfg.naliases = 1;
    f->cfg.queues = f->queues;
    f->cfg.nqueues = 1;
    f->cfg.max_message_size = 1 << 22;
    f->cfg.max_retries = 3;
    f->cfg.retry_backoff = 1;
    f->cfg.retry_backoff_factor = 2;
    f->cfg.retry_backoff_max = 60;
    f->cfg.seed = 7;
    f->cfg.dead_letter_exchange = "";
    f->cfg.llm_model = "m";
    f->cfg.llm_embed_model = "e";
}

static void fake_start(struct fake *f)
{
    f->e = engine_new(&f->cfg, &fake_ops, f, f->now);
    ck_assert_ptr_nonnull(f->e);
}

static void log_is(struct fake *f, const char *want)
{
    ck_assert_str_eq(f->log.data ? f->log.data : "", want);
    buf_reset(&f->log);
}

/* A delivery of task `task` (id) with the v2 body [args, kwargs, embed]. */
static struct delivery *message_id(const char *task, const char *id, const char *args,
                                   const char *kwargs)
{
    struct fmsg *m = calloc(1, sizeof(*m));
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
    m->body = strdup(b.data);
    buf_release(&b);
    m->d.body = m->body;
    m->d.body_len = strlen(m->body);
    m->d.content_type = "application/json";
    m->d.content_encoding = "utf-8";
    m->d.delivery_mode = 2;
    m->d.exchange = "";
    m->d.routing_key = "celery";
    m->d.queue = "celery";
    m->d.caps = DELIVERY_CAP_CONFIRMS | DELIVERY_CAP_PREFETCH;
    m->d.headers = h;
    return &m->d;
}

static struct delivery *message(const char *task, const char *args, const char *kwargs)
{
    return message_id(task, TASK_ID, args, kwargs);
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
    engine_on_delivery(f->e, f->now, message(builtin, "[]", kw.data));
    buf_release(&kw);
}

static void llm_done(struct fake *f, int i, enum llm_verdict v, const char *exc,
                     int64_t retry_after_ms, const char *text)
{
    struct openai_stream s;
    struct llm_result r;
    struct job *j = f->calls[i];
    ck_assert_ptr_nonnull(j);
    f->calls[i] = NULL;
    openai_stream_init(&s);
    if (text)
        buf_puts(&s.content, text);
    memset(&r, 0, sizeof(r));
    r.verdict = v;
    r.exc_type = exc ? exc : "";
    r.message = exc ? exc : "";
    r.http_status = v == LLM_OK ? 200 : 429;
    r.retry_after_ms = retry_after_ms;
    r.chat = &s;
    note(f, "done");
    engine_on_llm_done(f->e, f->now, j, &r);
    openai_stream_release(&s);
}

static void ok(struct fake *f, int i, const char *text)
{
    llm_done(f, i, LLM_OK, NULL, -1, text);
}

static void stored(struct fake *f, int i)
{
    struct job *j = f->stores[i];
    ck_assert_ptr_nonnull(j);
    f->stores[i] = NULL;
    engine_on_stored(f->e, f->now, j, f->store_kind[i], 0, 0);
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

static void fake_release(struct fake *f)
{
    engine_halt(f->e);
    for (int i = 0; i < f->ncalls; i++)
        if (f->calls[i])
            llm_done(f, i, LLM_PERMANENT, "APIConnectionError", -1, NULL);
    for (int i = 0; i < f->nstores; i++)
        if (f->stores[i])
            engine_on_stored(f->e, f->now, f->stores[i], f->store_kind[i], CR_ECANCELED,
                             0);
    engine_free(f->e);
    for (int i = 0; i < f->nstores; i++)
        cr_free(f->metas[i]);
    for (int i = 0; i < f->ncalls; i++)
        free(f->bodies[i]);
    buf_release(&f->log);
}

static void tick(struct fake *f, uint64_t ms)
{
    f->now.loop_ms += ms;
    f->now.epoch_us += (int64_t)ms * 1000;
    engine_on_tick(f->e, f->now);
}

/* ---------------------------------------------------------------- tests */

START_TEST(test_map_in_order_up_to_concurrency)
{
    struct fake f;
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\", \"e\"]");
    log_is(&f, "call call");
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
    ok(&f, 0, "A");
    log_is(&f, "done store-SUCCESS");
    result_is(&f, 0, "[\"A\",\"B\",\"C\",\"D\",\"E\"]");
    ck_assert_int_eq(f.ncalls, 5);
    ck_assert_int_eq(f.notes[TEV_SUCCEEDED], 1);
    ck_assert_int_eq(f.notes[TEV_FAILED], 0);
    stored(&f, 0);
    log_is(&f, "ack");
    ck_assert_int_eq(active(&f), 0);
    ck_assert_uint_eq(live(&f), 0);
    fake_release(&f);
    ck_assert_int_eq(f.releases, 1);
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
    ck_assert_int_eq(f.acks, 1);
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
        message("celery.chunks", "[]",
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
    engine_on_delivery(f.e, f.now, message(task, args, kwargs));
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
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\", \"d\"]");
    log_is(&f, "call call");
    ok(&f, 0, "A");
    log_is(&f, "done call");
    ck_assert_int_eq(engine_revoke(f.e, f.now, TASK_ID, 1), 1);
    log_is(&f, "abort abort");
    llm_done(&f, 1, LLM_PERMANENT, "TaskRevokedError", -1, NULL);
    log_is(&f, "done");
    llm_done(&f, 2, LLM_PERMANENT, "TaskRevokedError", -1, NULL);
    log_is(&f, "done store-REVOKED");
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
    llm_done(&f, 1, LLM_PERMANENT, "TimeLimitExceeded", -1, NULL);
    llm_done(&f, 2, LLM_PERMANENT, "TimeLimitExceeded", -1, NULL);
    log_is(&f, "done done store-FAILURE");
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
    ck_assert_int_eq(f.acks + f.rejects, 0);
    ck_assert_int_eq(f.releases, 1);

    /* halted with an item running and one queued */
    fake_init(&f, 2);
    fake_start(&f);
    engine_on_delivery(f.e, f.now, message_id("llm.generate", OTHER_ID, "[\"x\"]", "{}"));
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\", \"c\"]");
    log_is(&f, "call call");
    fake_release(&f);
    ck_assert_int_eq(f.acks + f.rejects, 0);
    ck_assert_int_eq(f.releases, 2);

    /* freed with an item waiting for its retry */
    fake_init(&f, 2);
    fake_start(&f);
    deliver_map(&f, "celery.map", "llm.generate", "[\"a\", \"b\"]");
    ok(&f, 0, "A");
    llm_done(&f, 1, LLM_RETRYABLE, "RateLimitError", 5000, NULL);
    log_is(&f, "call call done done");
    fake_release(&f);
    ck_assert_int_eq(f.acks + f.rejects, 0);
    ck_assert_int_eq(f.releases, 1);
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
    f.disconnected = 1;
    ok(&f, 0, "A");
    log_is(&f, "done");
    ck_assert_int_eq(f.ncalls, 1);
    ck_assert_ptr_null(engine_find_job(f.e, TASK_ID));
    ck_assert_uint_eq(live(&f), 0);
    ck_assert_int_eq(active(&f), 0);
    ck_assert_int_eq(f.acks + f.rejects, 0);
    ck_assert_int_eq(f.releases, 1);
    fake_release(&f);
}
END_TEST

START_TEST(test_map_waits_for_a_slot_like_a_task)
{
    struct fake f;
    fake_init(&f, 1);
    fake_start(&f);
    /* a busy worker: the map's items queue behind the running task */
    engine_on_delivery(f.e, f.now, message_id("llm.generate", OTHER_ID, "[\"x\"]", "{}"));
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
    tcase_add_test(tc, test_inspect_shows_the_map_only);
    tcase_add_test(tc, test_warm_shutdown_finishes_the_map);
    tcase_add_test(tc, test_cold_stop_mid_map_leaves_it_unacked);
    tcase_add_test(tc, test_lost_delivery_stops_the_map);
    tcase_add_test(tc, test_map_waits_for_a_slot_like_a_task);
    suite_add_tcase(s, tc);
    return s;
}
