/* sched.c -- where jobs wait and run: the ready queue, the eta list, the
 * running list and its slots, rate limits, time limits and the prefetch
 * window. No I/O; the time is the engine's. */
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

void engine__ready_push(struct engine *e, struct job *j)
{
    engine__set_state(j, JOB_READY);
    j->prev = e->ready_tail;
    j->next = NULL;
    if (e->ready_tail)
        e->ready_tail->next = j;
    else
        e->ready_head = j;
    e->ready_tail = j;
    e->nready++;
}

void engine__ready_unlink(struct engine *e, struct job *j)
{
    list_unlink(&e->ready_head, &e->ready_tail, j);
    e->nready--;
}

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
    engine__set_state(j, JOB_ETA);
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
    engine__set_state(j, JOB_RUNNING);
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
    engine__set_state(j, JOB_SETTLING);
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

/* Whether j holds a delivery that can still be settled. A delivery of a
 * connection since lost is back in its queue already; its redelivery joins j
 * while j exists (see engine_on_delivery()). */
static int job_live(const struct job *j)
{
    struct engine *e = j->e;
    for (int i = 0; i < j->nmsgs; i++)
        if (!j->msgs[i]->settled && e->ops->delivery_live(e->ctx, j->msgs[i]))
            return 1;
    return 0;
}

/* Starts ready jobs while slots are free. */
void engine__schedule(struct engine *e)
{
    struct job *j = e->ready_head, *next;
    int64_t now = (int64_t)e->now.loop_ms;
    while (j && e->active < e->concurrency && e->shutdown != 2) {
        struct task_limits *tl = engine__limits(e, j->tm.task, 0);
        next = j->next;
        /* A rate-limited task waits in the queue (the tick tries again) and
         * does not hold up the tasks behind it. */
        if (tl && tl->has_rate && token_bucket_take(&tl->bucket, now) > 0) {
            j = next;
            continue;
        }
        engine__ready_unlink(e, j);
        if (!job_live(j)) {
            /* Its connection was lost: the broker has its delivery back and
             * redelivers it once the worker is connected again (a redelivery
             * that came already made it live). A call started now would be
             * paid for an outcome that cannot be acked, and a retry or dead
             * letter that cannot be published. */
            LOG(LOG_DEBUG,
                "Task %s[%s] not started: its delivery went with the broker "
                "connection",
                job_name(j), j->tm.id);
            engine__abandon(j);
            j = next;
            continue;
        }
        engine__start(j);
        j = next;
    }
}

/* Parks deliveries of running jobs held too long (see engine__park()). */
static void park_running(struct engine *e)
{
    uint64_t now = e->now.loop_ms;
    uint64_t limit = (uint64_t)(e->cfg->park_after * 1000);
    for (struct job *j = e->run_head; j; j = j->rnext) {
        for (int i = 0; i < j->nmsgs; i++) {
            struct delivery *d = j->msgs[i];
            if (d->settled || (d->flags & DELIVERY_F_PARKING) ||
                now - d->received_ms < limit)
                continue;
            if (engine__park(j, d, 0, 1) == 0) {
                if (e->ops->lease(e->ctx, j, ENGINE_LEASE_SET,
                                  (long)(e->cfg->park_after * 3 + 1)) == 0)
                    j->leased = 1;
                LOG(LOG_INFO,
                    "Task %s[%s] still running after %.0fs: delivery parked, lease "
                    "kept",
                    job_name(j), j->tm.id, (double)(now - d->received_ms) / 1000.0);
            }
        }
    }
}

/* Time limits: the transfer is aborted at once; the switchboard defers
 * engine_on_llm_done(), so the list is not changed under us. */
static void time_limits(struct engine *e)
{
    int64_t now = (int64_t)e->now.loop_ms;
    char msg[128];
    for (struct job *j = e->run_head; j; j = j->rnext) {
        if (!j->call)
            continue;
        if (j->hard_deadline && now >= j->hard_deadline) {
            snprintf(msg, sizeof(msg), "%g", j->hard_limit_s);
            LOG(LOG_ERROR, "Hard time limit (%gs) exceeded for %s[%s]", j->hard_limit_s,
                job_name(j), j->tm.id);
            e->ops->abort_llm(e->ctx, j, "TimeLimitExceeded", msg);
            j->call = NULL;
        } else if (j->soft_deadline && now >= j->soft_deadline) {
            snprintf(msg, sizeof(msg), "soft time limit (%gs) exceeded", j->soft_limit_s);
            LOG(LOG_WARNING, "Soft time limit (%gs) exceeded for %s[%s]", j->soft_limit_s,
                job_name(j), j->tm.id);
            e->ops->abort_llm(e->ctx, j, "SoftTimeLimitExceeded", msg);
            j->call = NULL;
        }
    }
}

void engine__tick(struct engine *e)
{
    struct job *j, *next;

    /* eta jobs whose time has come */
    for (j = e->eta_head; j; j = next) {
        next = j->next;
        if (j->tm.eta_us <= e->now.epoch_us) {
            engine__eta_unlink(e, j);
            engine__sync_prefetch(e);
            engine__ready_push(e, j);
        }
    }
    engine__schedule(e);
    if (e->cfg->park_after > 0 && e->run_head)
        park_running(e);
    time_limits(e);
}

/* A warm shutdown gives back what has not started, so other workers can take
 * it now. */
void engine__drop_waiting(struct engine *e)
{
    while (e->ready_head || e->eta_head) {
        struct job *j = e->ready_head ? e->ready_head : e->eta_head;
        if (j == e->ready_head)
            engine__ready_unlink(e, j);
        else
            engine__eta_unlink(e, j);
        for (int i = 0; i < j->nmsgs; i++) {
            if (!j->msgs[i]->settled)
                e->ops->reject(e->ctx, j->msgs[i], 1);
        }
        engine__abandon(j);
    }
}
