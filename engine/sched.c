/* sched.c -- where jobs wait and run: the ready queue, the eta list, the
 * running list and its slots, the per-task limits and the prefetch window.
 * Only data structures: what to start and when is decided in engine.c
 * (engine__schedule(), engine__tick()), so nothing here calls back up. */
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
    job_set_state(j, JOB_READY);
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
