/* test_sched.c -- the ready queue's order, driven through the engine with a
 * small fake engine_ops: message priority (higher first, FIFO within one
 * priority, clamped), queue tiers under strict order and none under fair,
 * unlinking from anywhere (revoke), eta jobs that come due, the order
 * engine_each_job(ENGINE_JOBS_READY) shows, and a random sweep against a
 * reference sort. Every test holds the one slot with a first job, queues the
 * others behind it, then raises the concurrency: the calls that follow are the
 * start order. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

#define T0_US 1700000000000000LL /* 2023-11-14T22:13:20Z */
#define MAXJOBS 512

/* ------------------------------------------------------------ the fake */

struct fmsg {
    struct delivery d;
    char *body, *queue;
};

struct fake {
    struct engine *e;
    struct engine_config cfg;
    char *queues[3];
    struct engine_now now;
    struct buf calls; /* task ids in start order, space-separated */
    int ncalls;
    struct job *calls_of[MAXJOBS];
    struct job *stores[MAXJOBS]; /* waiting for engine_on_stored */
    enum engine_store_kind kinds[MAXJOBS];
    int nstores;
    int released;
};

static void f_ack(void *ctx, struct delivery *d)
{
    (void)ctx;
    d->settled = 1;
}

static void f_reject(void *ctx, struct delivery *d, int requeue)
{
    (void)ctx;
    (void)requeue;
    d->settled = 1;
}

static int f_live(void *ctx, const struct delivery *d)
{
    (void)ctx;
    (void)d;
    return 1;
}

static void f_release(void *ctx, struct delivery *d)
{
    struct fmsg *m = (struct fmsg *)d;
    ((struct fake *)ctx)->released++;
    cJSON_Delete(d->headers);
    free(m->body);
    free(m->queue);
    free(m);
}

static int f_read_state(void *ctx, struct job *j)
{
    (void)ctx;
    (void)j;
    ck_abort_msg("a first delivery needs no read");
    return 0;
}

static int f_store(void *ctx, struct job *j, char *meta, size_t n,
                   enum engine_store_kind kind)
{
    struct fake *f = ctx;
    (void)n;
    cr_free(meta);
    ck_assert_int_lt(f->nstores, MAXJOBS);
    f->stores[f->nstores] = j;
    f->kinds[f->nstores++] = kind;
    return 0;
}

static int f_publish(void *ctx, const struct outbound *o, struct engine_publish *p)
{
    (void)ctx;
    (void)o;
    (void)p;
    return CR_EBROKER;
}

static int f_call(void *ctx, struct job *j, const struct task_call *c, struct cr_err *err)
{
    struct fake *f = ctx;
    (void)c;
    (void)err;
    j->call = j;
    ck_assert_int_lt(f->ncalls, MAXJOBS);
    f->calls_of[f->ncalls] = j;
    /* a map's items have no id of their own */
    buf_printf(&f->calls, "%s%s", f->ncalls++ ? " " : "", j->tm.id ? j->tm.id : "item");
    return 0;
}

static void f_abort(void *ctx, struct job *j, const char *exc_type, const char *msg)
{
    (void)ctx;
    (void)j;
    (void)exc_type;
    (void)msg;
}

static int f_lease(void *ctx, struct job *j, enum engine_lease_op op, long ttl_s)
{
    (void)ctx;
    (void)j;
    (void)op;
    (void)ttl_s;
    return CR_EBROKER;
}

static void f_prefetch(void *ctx, int n)
{
    (void)ctx;
    (void)n;
}

static void f_notify(void *ctx, struct job *j, const struct task_event_info *info)
{
    (void)ctx;
    (void)j;
    (void)info;
}

static void f_forget(void *ctx, struct job *j)
{
    (void)ctx;
    (void)j;
}

static void f_stop(void *ctx, int cold)
{
    (void)ctx;
    (void)cold;
}

static const struct engine_ops fake_ops = {
    f_ack,  f_reject, f_live,  f_release,  f_read_state, f_store,  f_publish,
    f_call, f_abort,  f_lease, f_prefetch, f_notify,     f_forget, f_stop,
};

static void fake_init(struct fake *f, enum engine_queue_order order)
{
    memset(f, 0, sizeof(*f));
    buf_init(&f->calls);
    f->now.loop_ms = 1000;
    f->now.epoch_us = T0_US;
    f->queues[0] = (char *)"premium";
    f->queues[1] = (char *)"free";
    f->cfg.hostname = "celery@test";
    f->cfg.pid = 42;
    f->cfg.concurrency = 1;
    f->cfg.prefetch_multiplier = 4;
    f->cfg.queues = f->queues;
    f->cfg.nqueues = 2;
    f->cfg.max_message_size = 1 << 20;
    f->cfg.max_retries = 3;
    f->cfg.retry_backoff = 1;
    f->cfg.retry_backoff_factor = 2;
    f->cfg.retry_backoff_max = 60;
    f->cfg.seed = 7;
    f->cfg.llm_model = "m";
    f->cfg.llm_embed_model = "e";
    f->cfg.queue_order = order;
    f->e = engine_new(&f->cfg, &fake_ops, f, f->now);
    ck_assert_ptr_nonnull(f->e);
}

/* What the clients owe comes back with errors, as on worker_free(). */
static void fake_release(struct fake *f)
{
    struct llm_result r;
    struct openai_stream os;
    engine_halt(f->e);
    openai_stream_init(&os);
    memset(&r, 0, sizeof(r));
    r.chat = &os;
    r.verdict = LLM_PERMANENT;
    r.exc_type = "APIConnectionError";
    r.message = "gone";
    r.retry_after_ms = -1;
    for (int i = 0; i < f->ncalls; i++)
        engine_on_llm_done(f->e, f->now, f->calls_of[i], &r);
    for (int i = 0; i < f->nstores; i++)
        engine_on_stored(f->e, f->now, f->stores[i], f->kinds[i], CR_ECANCELED, 0);
    engine_free(f->e);
    openai_stream_release(&os);
    buf_release(&f->calls);
}

/* Delivers an llm.generate task with this id from queue, with priority prio
 * (caps: whether the transport says it carries one) and an eta in eta_s
 * seconds from T0 (< 0: none). */
static void deliver_task(struct fake *f, const char *id, const char *queue, int prio,
                         unsigned caps, int eta_s, const char *task, const char *body);

static void deliver_full(struct fake *f, const char *id, const char *queue, int prio,
                         unsigned caps, int eta_s)
{
    deliver_task(f, id, queue, prio, caps, eta_s, "llm.generate",
                 "[[\"hello\"], {}, {\"callbacks\": null, \"errbacks\": null}]");
}

/* Delivers task (with body) as deliver_full() does. */
static void deliver_task(struct fake *f, const char *id, const char *queue, int prio,
                         unsigned caps, int eta_s, const char *task, const char *body)
{
    struct fmsg *m = calloc(1, sizeof(*m));
    cJSON *h = cJSON_CreateObject();
    ck_assert_ptr_nonnull(m);
    cJSON_AddStringToObject(h, "lang", "py");
    cJSON_AddStringToObject(h, "task", task);
    cJSON_AddStringToObject(h, "id", id);
    cJSON_AddStringToObject(h, "root_id", id);
    if (eta_s >= 0) {
        char eta[64];
        /* T0 is 22:13:20 */
        snprintf(eta, sizeof(eta), "2023-11-14T22:%02d:%02d+00:00",
                 13 + (20 + eta_s) / 60, (20 + eta_s) % 60);
        cJSON_AddStringToObject(h, "eta", eta);
    }
    m->body = strdup(body);
    m->queue = strdup(queue);
    m->d.body = m->body;
    m->d.body_len = strlen(m->body);
    m->d.content_type = "application/json";
    m->d.content_encoding = "utf-8";
    m->d.delivery_mode = 2;
    m->d.priority = prio;
    m->d.exchange = "";
    m->d.routing_key = m->queue;
    m->d.queue = m->queue;
    m->d.received_ms = f->now.loop_ms;
    m->d.caps = caps;
    m->d.headers = h;
    engine_on_delivery(f->e, f->now, &m->d);
}

#define CAPS_ALL (DELIVERY_CAP_CONFIRMS | DELIVERY_CAP_PRIORITY | DELIVERY_CAP_PREFETCH)

static void deliver(struct fake *f, const char *id, const char *queue, int prio)
{
    deliver_full(f, id, queue, prio, CAPS_ALL, -1);
}

static void add_id(struct job *j, void *arg)
{
    struct buf *b = arg;
    buf_printf(b, "%s%s", b->len ? " " : "", j->tm.id);
}

/* What inspect reserved would list, in its order. */
static void ready_is(struct fake *f, const char *want)
{
    struct buf b;
    buf_init(&b);
    engine_each_job(f->e, ENGINE_JOBS_READY, add_id, &b);
    ck_assert_str_eq(b.data ? b.data : "", want);
    buf_release(&b);
}

/* The held job "hold" started first; raising the slots starts the rest in
 * ready order, which must be want. */
static void start_all_is(struct fake *f, const char *want)
{
    struct engine_stats st;
    char full[4096];
    engine_set_concurrency(f->e, f->now, 1000);
    snprintf(full, sizeof(full), "hold%s%s", want[0] ? " " : "", want);
    ck_assert_str_eq(f->calls.data, full);
    engine_stats(f->e, &st);
    ck_assert_uint_eq(st.nready, 0);
}

/* ----------------------------------------------------------- priorities */

START_TEST(priority_orders_fifo_within)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    deliver(&f, "a0", "premium", 0);
    deliver(&f, "b5", "premium", 5);
    deliver(&f, "c5", "premium", 5);
    deliver(&f, "d9", "premium", 9);
    deliver(&f, "e0", "premium", 0);
    deliver(&f, "f5", "premium", 5);
    ready_is(&f, "d9 b5 c5 f5 a0 e0");
    start_all_is(&f, "d9 b5 c5 f5 a0 e0");
    fake_release(&f);
}
END_TEST

START_TEST(priority_needs_the_cap)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    deliver_full(&f, "a9", "premium", 9, DELIVERY_CAP_CONFIRMS, -1);
    deliver_full(&f, "b0", "premium", 0, DELIVERY_CAP_CONFIRMS, -1);
    deliver_full(&f, "c200", "premium", 200, DELIVERY_CAP_CONFIRMS, -1);
    deliver(&f, "d1", "premium", 1); /* one that counts */
    ready_is(&f, "d1 a9 b0 c200");
    start_all_is(&f, "d1 a9 b0 c200");
    fake_release(&f);
}
END_TEST

START_TEST(priority_clamped)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    deliver(&f, "big", "premium", 100000);
    deliver(&f, "neg", "premium", -7);
    deliver(&f, "max", "premium", ENGINE_PRIORITY_MAX);
    deliver(&f, "zero", "premium", 0);
    deliver(&f, "one", "premium", 1);
    /* 100000 counts as 255 (before the 255 that came later), -7 as 0 */
    ready_is(&f, "big max one neg zero");
    start_all_is(&f, "big max one neg zero");
    fake_release(&f);
}
END_TEST

/* ---------------------------------------------------------------- tiers */

START_TEST(strict_tiers)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_STRICT);
    deliver(&f, "hold", "free", 0);
    deliver(&f, "f9", "free", 9);
    deliver(&f, "x255", "added", 255); /* consumed from run time on: last tier */
    deliver(&f, "f0", "free", 0);
    deliver(&f, "p0", "premium", 0);
    deliver(&f, "f9b", "free", 9);
    deliver(&f, "p3", "premium", 3);
    deliver(&f, "x0", "added", 0);
    deliver(&f, "p0b", "premium", 0);
    ready_is(&f, "p3 p0 p0b f9 f9b f0 x255 x0");
    start_all_is(&f, "p3 p0 p0b f9 f9b f0 x255 x0");
    fake_release(&f);
}
END_TEST

/* A map's items have no delivery: they take their map's tier and priority,
 * so a premium map is not served after the free tasks. */
START_TEST(strict_map_items_keep_the_tier)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_STRICT);
    deliver(&f, "hold", "free", 0);
    deliver(&f, "f0", "free", 0);
    deliver_task(&f, "pmap", "premium", 0, CAPS_ALL, -1, "celery.map",
                 "[[], {\"task\": \"llm.generate\", \"it\": [\"a\", \"b\"]}, null]");
    ready_is(&f, "pmap f0");
    start_all_is(&f, "item item f0");
    fake_release(&f);
}
END_TEST

START_TEST(fair_no_tiers)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "free", 0);
    deliver(&f, "f0", "free", 0);
    deliver(&f, "p0", "premium", 0);
    deliver(&f, "x0", "added", 0);
    deliver(&f, "f0b", "free", 0);
    deliver(&f, "p0b", "premium", 0);
    deliver(&f, "x2", "added", 2); /* priority still counts, across queues */
    ready_is(&f, "x2 f0 p0 x0 f0b p0b");
    start_all_is(&f, "x2 f0 p0 x0 f0b p0b");
    fake_release(&f);
}
END_TEST

/* A strict worker that consumes no -Q queue (an engine configured without
 * queues) has one tier. */
START_TEST(strict_without_queues)
{
    struct fake f;
    memset(&f, 0, sizeof(f));
    fake_init(&f, ENGINE_QUEUE_STRICT);
    engine_free(f.e);
    f.cfg.nqueues = 0;
    f.e = engine_new(&f.cfg, &fake_ops, &f, f.now);
    ck_assert_ptr_nonnull(f.e);
    deliver(&f, "hold", "free", 0);
    deliver(&f, "a", "free", 0);
    deliver(&f, "b", "premium", 1);
    deliver(&f, "c", "other", 0);
    ready_is(&f, "b a c");
    start_all_is(&f, "b a c");
    fake_release(&f);
}
END_TEST

/* --------------------------------------------------------------- unlink */

START_TEST(unlink_middle)
{
    struct fake f;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    deliver(&f, "a5", "premium", 5);
    deliver(&f, "b5", "premium", 5);
    deliver(&f, "c5", "premium", 5);
    deliver(&f, "d1", "premium", 1);
    deliver(&f, "e9", "premium", 9);
    /* the middle of a level, its tail, then a level's only job */
    engine_revoke(f.e, f.now, "b5", 0);
    ready_is(&f, "e9 a5 c5 d1");
    engine_revoke(f.e, f.now, "c5", 0);
    ready_is(&f, "e9 a5 d1");
    deliver(&f, "g5", "premium", 5); /* after a5, the level's new tail */
    ready_is(&f, "e9 a5 g5 d1");
    engine_revoke(f.e, f.now, "e9", 0);
    deliver(&f, "h9", "premium", 9); /* the emptied level, at the head again */
    deliver(&f, "i1", "premium", 1);
    ready_is(&f, "h9 a5 g5 d1 i1");
    engine_revoke(f.e, f.now, "i1", 0); /* the queue's tail */
    engine_revoke(f.e, f.now, "d1", 0);
    deliver(&f, "j0", "premium", 0);
    ready_is(&f, "h9 a5 g5 j0");
    start_all_is(&f, "h9 a5 g5 j0");
    fake_release(&f);
}
END_TEST

/* ------------------------------------------------------------------ eta */

START_TEST(eta_keeps_priority)
{
    struct fake f;
    struct engine_stats st;
    fake_init(&f, ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    deliver_full(&f, "eta9", "premium", 9, CAPS_ALL, 5);
    deliver_full(&f, "eta0", "premium", 0, CAPS_ALL, 5);
    deliver(&f, "a0", "premium", 0);
    deliver(&f, "b5", "premium", 5);
    engine_stats(f.e, &st);
    ck_assert_uint_eq(st.neta, 2);
    ready_is(&f, "b5 a0");
    f.now.loop_ms += 6000;
    f.now.epoch_us += 6000000;
    engine_on_tick(f.e, f.now);
    /* a job that came due joins its level's tail: after the ones there */
    ready_is(&f, "eta9 b5 a0 eta0");
    start_all_is(&f, "eta9 b5 a0 eta0");
    fake_release(&f);
}
END_TEST

/* ---------------------------------------------------------------- sweep */

/* Random pushes and revokes (priorities 0..3, two queues, strict) against a
 * reference: the ids kept in arrival order, stably sorted by level. */
struct ref {
    char id[16];
    int level, seq, live;
};

static int ref_cmp(const void *a, const void *b)
{
    const struct ref *x = a, *y = b;
    return x->level != y->level ? x->level - y->level : x->seq - y->seq;
}

START_TEST(random_sweep)
{
    struct fake f;
    static struct ref refs[MAXJOBS], sorted[MAXJOBS];
    int n = 0;
    uint64_t s = 0x9e3779b97f4a7c15ull + (uint64_t)_i;
    struct buf want;

    fake_init(&f, _i % 2 ? ENGINE_QUEUE_STRICT : ENGINE_QUEUE_FAIR);
    deliver(&f, "hold", "premium", 0);
    buf_init(&want);
    for (int step = 0; step < 400; step++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if (n > 0 && s % 3 == 0) {
            struct ref *r = &refs[(s >> 8) % (uint64_t)n];
            if (r->live) {
                engine_revoke(f.e, f.now, r->id, 0);
                r->live = 0;
            }
            continue;
        }
        {
            struct ref *r = &refs[n];
            int prio = (int)((s >> 16) % 4);
            int q = (int)((s >> 24) % 2);
            snprintf(r->id, sizeof(r->id), "t%d", n);
            r->seq = n;
            r->live = 1;
            r->level = (_i % 2 ? q * 1000 : 0) + (3 - prio);
            deliver(&f, r->id, q ? "free" : "premium", prio);
            n++;
        }
    }
    memcpy(sorted, refs, sizeof(refs[0]) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(sorted[0]), ref_cmp);
    for (int i = 0; i < n; i++)
        if (sorted[i].live)
            buf_printf(&want, "%s%s", want.len ? " " : "", sorted[i].id);
    ready_is(&f, want.data ? want.data : "");
    start_all_is(&f, want.data ? want.data : "");
    buf_release(&want);
    fake_release(&f);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sched");
    log_threshold = LOG_CRITICAL + 1; /* quiet: every job logs "received" */
    TCase *tc = tcase_create("ready");
    tcase_add_test(tc, priority_orders_fifo_within);
    tcase_add_test(tc, priority_needs_the_cap);
    tcase_add_test(tc, priority_clamped);
    tcase_add_test(tc, strict_tiers);
    tcase_add_test(tc, strict_map_items_keep_the_tier);
    tcase_add_test(tc, fair_no_tiers);
    tcase_add_test(tc, strict_without_queues);
    tcase_add_test(tc, unlink_middle);
    tcase_add_test(tc, eta_keeps_priority);
    tcase_add_loop_test(tc, random_sweep, 0, 8);
    suite_add_tcase(s, tc);
    return s;
}
