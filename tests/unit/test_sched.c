/* test_sched.c -- the ready queue's order, driven through the engine with the
 * recording fake engine_ops of fake_engine.c: message priority (higher first,
 * FIFO within one priority, clamped), queue tiers under strict order and none
 * under fair, unlinking from anywhere (revoke), eta jobs that come due, the
 * order engine_each_job(ENGINE_JOBS_READY) shows, and a random sweep against a
 * reference sort. Every test holds the one slot with a first job, queues the
 * others behind it, then raises the concurrency: the calls that follow are the
 * start order. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/fake_engine.h"
#include "engine/engine.h"
#include "util/buf.h"
#include "util/log.h"

#define MAXJOBS 512

/* ------------------------------------------------------------ the fake */

/* Two queues, -Q premium,free; one slot. No call ever ends before
 * fake_release(), and nothing here publishes or reads a stored state. */
static void fake_init(struct fake *f, enum engine_queue_order order)
{
    fake_base_init(f);
    f->no_reads = 1;
    f->fail_publish = CR_EBROKER;
    f->queues[0] = (char *)"premium";
    f->queues[1] = (char *)"free";
    f->cfg.concurrency = 1;
    f->cfg.nqueues = 2;
    f->cfg.queue_order = order;
    fake_start(f);
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
    struct fake_msg *m;
    cJSON *h = cJSON_CreateObject();
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
    m = fake_msg_new(f, body, queue, h);
    m->d.priority = m->d.wire_priority = prio;
    m->d.caps = caps;
    engine_on_delivery(f->e, f->now, &m->d);
}

#define CAPS_ALL (MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY | MSG_CAP_PREFETCH)

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
 * ready order, which must be want (a map's items have no id: "item"). */
static void start_all_is(struct fake *f, const char *want)
{
    struct engine_stats st;
    struct buf calls;
    char full[4096];
    engine_set_concurrency(f->e, f->now, 1000);
    snprintf(full, sizeof(full), "hold%s%s", want[0] ? " " : "", want);
    buf_init(&calls);
    for (int i = 0; i < f->ncalls; i++)
        buf_printf(&calls, "%s%s", i ? " " : "",
                   f->call_ids[i] ? f->call_ids[i] : "item");
    ck_assert_str_eq(calls.data, full);
    buf_release(&calls);
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
    deliver_full(&f, "a9", "premium", 9, MSG_CAP_CONFIRMS, -1);
    deliver_full(&f, "b0", "premium", 0, MSG_CAP_CONFIRMS, -1);
    deliver_full(&f, "c200", "premium", 200, MSG_CAP_CONFIRMS, -1);
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
