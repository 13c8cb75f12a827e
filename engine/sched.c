/* sched.c -- where jobs wait and run: the ready queue, the eta list, the
 * running list and its slots, the per-task limits and the prefetch window.
 * Only data structures: what to start and when is decided in engine.c
 * (engine__schedule(), engine__tick()), so nothing here calls back up.
 *
 * The ready queue is one doubly linked list kept in start order: by tier (the
 * place of the job's queue in -Q under ENGINE_QUEUE_STRICT, a single tier
 * under ENGINE_QUEUE_FAIR), then by message priority, most urgent first, then
 * by arrival. Every (tier, priority) pair is a level; the engine keeps the
 * last job of each level and a bitmap of the levels in use, so a push finds
 * its place in O(levels / 64) and an unlink from anywhere is O(1). Walking
 * from the head is the order schedule() starts jobs in and the order inspect
 * reserved shows. */
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "util/alloc.h"
#include "util/log.h"

static void list_unlink(struct job **head, struct job **tail, struct job *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        *head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else if (tail)
        *tail = j->prev;
    j->prev = j->next = NULL;
}

/* ------------------------------------------------------- the ready queue */

/* Levels per tier: one per priority. */
#define PRIO_LEVELS (ENGINE_PRIORITY_MAX + 1)

/* Strict order gives each -Q queue a tier, plus one after them for queues
 * consumed only from run time on; fair order has a single tier. */
static unsigned tiers_of(const struct engine_config *cfg)
{
    return cfg->queue_order == ENGINE_QUEUE_STRICT && cfg->nqueues > 0
               ? (unsigned)cfg->nqueues + 1
               : 1;
}

int engine__sched_init(struct engine *e)
{
    e->nlevels = tiers_of(e->cfg) * PRIO_LEVELS;
    e->level_tail = cr_calloc(e->nlevels, sizeof(*e->level_tail));
    e->level_bits = cr_calloc((e->nlevels + 63) / 64, sizeof(*e->level_bits));
    return e->level_tail && e->level_bits ? 0 : CR_ENOMEM;
}

void engine__sched_release(struct engine *e)
{
    cr_free(e->level_tail);
    cr_free(e->level_bits);
    e->level_tail = NULL;
    e->level_bits = NULL;
    e->nlevels = 0;
}

/* The tier of a queue: its place in -Q under strict order, else 0. A linear
 * look-up over at most OPTS_MAX_LIST names, done once per push. */
static unsigned tier_of(const struct engine *e, const char *queue)
{
    const struct engine_config *cfg = e->cfg;
    if (cfg->queue_order != ENGINE_QUEUE_STRICT || cfg->nqueues <= 0)
        return 0;
    for (int i = 0; queue && i < cfg->nqueues; i++)
        if (!strcmp(cfg->queues[i], queue))
            return (unsigned)i;
    return (unsigned)cfg->nqueues;
}

/* d's priority on the engine's scale: 0 without MSG_CAP_PRIORITY (or
 * without a delivery: a job made inside the engine), clamped otherwise. */
static int priority_of(const struct delivery *d)
{
    if (!d || !(d->caps & MSG_CAP_PRIORITY) || d->priority < 0)
        return 0;
    return d->priority > ENGINE_PRIORITY_MAX ? ENGINE_PRIORITY_MAX : d->priority;
}

/* Level 0 starts first: the tier, then the priority from most urgent down.
 * The first delivery decides (a redelivery of the same id joins the job); a
 * map's item has none and takes its map's, so a premium map's items stay in
 * the premium tier. */
static unsigned level_of(const struct engine *e, const struct job *j)
{
    const struct job *owner = j->placed_by ? j->placed_by : j;
    const struct delivery *d = owner->nmsgs ? owner->msgs[0] : NULL;
    unsigned level = tier_of(e, d ? d->queue : NULL) * PRIO_LEVELS +
                     (unsigned)(ENGINE_PRIORITY_MAX - priority_of(d));
    return level < e->nlevels ? level : e->nlevels - 1;
}

/* The nearest non-empty level more urgent than level, or -1: a scan of the
 * bitmap, one word per 64 levels. */
static long urgent_before(const struct engine *e, unsigned level)
{
    long w;
    uint64_t bits;
    if (level == 0)
        return -1;
    level--;
    w = (long)(level / 64);
    bits = e->level_bits[w] & (~(uint64_t)0 >> (63 - level % 64));
    for (;;) {
        if (bits)
            return w * 64 + 63 - __builtin_clzll(bits);
        if (--w < 0)
            return -1;
        bits = e->level_bits[w];
    }
}

static void insert_after(struct engine *e, struct job *at, struct job *j)
{
    j->prev = at;
    j->next = at ? at->next : e->ready_head;
    if (j->next)
        j->next->prev = j;
    else
        e->ready_tail = j;
    if (at)
        at->next = j;
    else
        e->ready_head = j;
}

void engine__ready_push(struct engine *e, struct job *j)
{
    unsigned level = level_of(e, j);
    struct job *at = e->level_tail[level];

    job_set_state(j, JOB_READY);
    j->level = level;
    if (!at) {
        long before = urgent_before(e, level);
        at = before < 0 ? NULL : e->level_tail[before];
        e->level_bits[level / 64] |= (uint64_t)1 << (level % 64);
    }
    insert_after(e, at, j);
    e->level_tail[level] = j;
    e->nready++;
}

void engine__ready_unlink(struct engine *e, struct job *j)
{
    unsigned level = j->level;
    if (e->level_tail[level] == j) {
        struct job *p = j->prev && j->prev->level == level ? j->prev : NULL;
        e->level_tail[level] = p;
        if (!p)
            e->level_bits[level / 64] &= ~((uint64_t)1 << (level % 64));
    }
    list_unlink(&e->ready_head, &e->ready_tail, j);
    e->nready--;
}

/* ---------------------------------------------------------- the eta list */

/* Held eta tasks are unacked deliveries: raise the prefetch window by one for
 * each, as Celery does, so ready tasks behind them still arrive. */
int engine_prefetch_count(int concurrency, int multiplier, size_t neta)
{
    /* Each factor fits in 32 bits, so the product fits in 64. */
    uint64_t n = (uint64_t)(concurrency > 0 ? concurrency : 0) *
                     (uint64_t)(multiplier > 0 ? multiplier : 0) +
                 (neta < 65535 ? (uint64_t)neta : 65535);
    return n < 1 ? 1 : n > 65535 ? 65535 : (int)n;
}

void engine__sync_prefetch(struct engine *e)
{
    e->ops->set_prefetch(
        e->ctx,
        engine_prefetch_count(e->concurrency, e->cfg->prefetch_multiplier, e->neta));
}

void engine__eta_push(struct engine *e, struct job *j)
{
    job_set_state(j, JOB_ETA);
    j->prev = NULL;
    j->next = e->eta_head;
    if (e->eta_head)
        e->eta_head->prev = j;
    e->eta_head = j;
    e->neta++;
    engine__sync_prefetch(e);
}

void engine__eta_unlink(struct engine *e, struct job *j)
{
    list_unlink(&e->eta_head, NULL, j);
    e->neta--;
}

void engine__run_push(struct engine *e, struct job *j)
{
    job_set_state(j, JOB_RUNNING);
    e->active++;
    j->rnext = e->run_head;
    if (e->run_head)
        e->run_head->rprev = j;
    e->run_head = j;
}

/* Gives back j's slot. Not RUNNING any more afterwards, so a second call is a
 * no-op. */
void engine__release_slot(struct job *j)
{
    struct engine *e = j->e;
    if (j->state != JOB_RUNNING)
        return;
    e->active--;
    j->call = NULL;
    if (j->rprev)
        j->rprev->rnext = j->rnext;
    else
        e->run_head = j->rnext;
    if (j->rnext)
        j->rnext->rprev = j->rprev;
    j->rprev = j->rnext = NULL;
    job_set_state(j, JOB_SETTLING);
}

struct task_limits *engine__limits(struct engine *e, const char *task, int create)
{
    struct task_limits *tl =
        e->task_limits.count || create ? strmap_get(&e->task_limits, task) : NULL;
    if (tl || !create)
        return tl;
    tl = cr_calloc(1, sizeof(*tl));
    if (!tl)
        return NULL;
    if (strmap_put(&e->task_limits, task, tl)) {
        cr_free(tl);
        return NULL;
    }
    return tl;
}
