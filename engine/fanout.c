/* fanout.c -- Celery's built-in celery.map, celery.starmap and celery.chunks:
 * one task whose items are calls of another task, run as concurrent child jobs.
 *
 * Python runs the items one after another inside the map task. Here each item
 * is a child job: a struct job without a delivery, id or events, whose task
 * message is synthesized (the item as its args, no kwargs: Python calls the
 * bare task, signature(task).type, so the signature's own args and kwargs are
 * not used either). A child waits in the ready queue and takes a slot like any
 * task, so `-c 10` runs a map of 100 items 10 at a time, and rate limits of the
 * inner task apply per item. Its LLM call goes through call_llm and comes back
 * through engine_on_llm_done(), which hands it here.
 *
 * The map (the parent) holds the delivery and stays on the running list (for
 * `inspect active`, parking and the time-limit sweep here), but gives back its
 * slot while its items run, so a map never holds a slot its items wait for. At
 * most `concurrency` items of one map are queued or running at once (the
 * window): a map of 100000 items costs 100000 result pointers, not 100000
 * jobs. Items are handed out in order.
 *
 * The map settles once every item it needs has ended: SUCCESS with the list
 * in item order, or FAILURE with the first failing item's exception, as
 * Python's list comprehension raises the first exception in order. When item
 * k fails, the items after k are no longer needed: the queued ones are
 * dropped, the running ones aborted, none is started; the items before k still
 * run, since one of them may fail first.
 *
 * A retryable item error on a model with another provider left moves that
 * item's call to the next one at once, as a task's call would (no retry
 * counted). Otherwise a retryable item error (429, 5xx, a lost connection)
 * retries that item in place, after the worker's backoff (or the server's Retry-After),
 * up to
 * --max-retries for that item. Retrying the whole map would pay again for
 * every item already done; in place, no successful item is paid for twice. Once
 * an item is out of retries its error fails the map, with no retry of the map.
 *
 * Revoke with terminate and the map's hard or soft time limit abort every
 * running item and drop the rest; the map settles as REVOKED, TimeLimitExceeded
 * or SoftTimeLimitExceeded once the aborted calls are back. A warm shutdown
 * lets a map finish, as it lets any running task finish (its queued items are
 * not given back: they have no delivery), within --shutdown-timeout. A cold
 * shutdown, or the map's delivery lost with its connection, lets the map go
 * unsettled: its delivery comes back and the map runs again.
 *
 * Reentrancy: run_item() is called from inside engine__schedule(), which walks
 * the ready queue; from there the queued siblings are never unlinked (the walk
 * holds a pointer to the next one): they are dropped when they come up, or by
 * the next tick's sweep. Everywhere else they are dropped at once.
 *
 * A map's state is enum fan_state (engine_int.h): RUNNING until it stops
 * (TIMED_OUT, REVOKED, LOST) or has nothing left under way (SETTLING);
 * fan_set_state() is the one place it changes, and asserts that fan_next[]
 * allows the move. */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "llm/policy.h"
#include "util/alloc.h"
#include "util/log.h"

struct fanout {
    struct job *parent;
    enum task_kind inner_kind;
    char *inner; /* the inner task's name */
    long n;      /* celery.chunks: items per part */
    int nitems;
    const cJSON *cursor; /* next item to hand out (borrowed from the parent's args) */
    int nspawned;        /* items handed out, in order */
    int live;            /* child jobs allocated */
    cJSON **results;     /* per item; NULL until it succeeded */
    int fail_index;      /* the first failed item, or nitems */
    char exc_type[64], exc_module[48], exc_message[512];
    enum fan_state state;             /* only fan_set_state() changes it */
    char stop_exc[32], stop_msg[128]; /* FAN_TIMED_OUT: its exception */
    struct job *waiting; /* items waiting for their retry, linked through next */
    int sweep;           /* queued items to drop at the next tick */
};

static void check(struct fanout *f);

/* ---------------------------------------------------------------- state */

const char *const engine__fan_state_names[FAN_NSTATES] = {
    [FAN_RUNNING] = "RUNNING", [FAN_TIMED_OUT] = "TIMED_OUT", [FAN_REVOKED] = "REVOKED",
    [FAN_LOST] = "LOST",       [FAN_SETTLING] = "SETTLING",
};

#define FAN_BIT(s) (1u << (s))

/* Where each state may go: a running map stops once, for the first of its
 * reasons, or settles; a stopped one may still be lost (its delivery gone, a
 * cold shutdown) before it settles; a settling one goes nowhere. */
static const unsigned fan_next[FAN_NSTATES] = {
    [FAN_RUNNING] = FAN_BIT(FAN_TIMED_OUT) | FAN_BIT(FAN_REVOKED) | FAN_BIT(FAN_LOST) |
                    FAN_BIT(FAN_SETTLING),
    [FAN_TIMED_OUT] = FAN_BIT(FAN_LOST) | FAN_BIT(FAN_SETTLING),
    [FAN_REVOKED] = FAN_BIT(FAN_LOST) | FAN_BIT(FAN_SETTLING),
    [FAN_LOST] = FAN_BIT(FAN_SETTLING),
    [FAN_SETTLING] = 0,
};

int engine__fan_state_legal(enum fan_state a, enum fan_state b)
{
    if ((unsigned)a >= FAN_NSTATES || (unsigned)b >= FAN_NSTATES)
        return 0;
    return (fan_next[a] & FAN_BIT(b)) != 0;
}

/* The one place a map's state changes. */
static void fan_set_state(struct fanout *f, enum fan_state s)
{
    assert(engine__fan_state_legal(f->state, s));
    f->state = s;
}

enum fan_state engine__fanout_state(const struct job *j)
{
    return j->fan->state;
}

int engine__fanout_is_item(const struct job *j)
{
    return j->fan && j->fan->parent != j;
}

static const char *parent_id(const struct fanout *f)
{
    return f->parent->tm.id ? f->parent->tm.id : "?";
}

/* ---------------------------------------------------------------- items */

/* A new child job for item idx with these args (taken, on failure too). */
static struct job *item_new(struct fanout *f, int idx, cJSON *args)
{
    struct job *p = f->parent;
    struct engine *e = p->e;
    struct job *c = cr_calloc(1, sizeof(*c));
    if (!c) {
        cJSON_Delete(args);
        return NULL;
    }
    c->e = e;
    task_msg_init(&c->tm);
    c->tm.args = args;
    c->tm.kwargs = cJSON_CreateObject();
    c->tm.task = cr_strdup(f->inner);
    if (!c->tm.kwargs || !c->tm.task) {
        task_msg_release(&c->tm);
        cr_free(c);
        return NULL;
    }
    /* No id: no progress stream, no events, no result of its own. */
    c->tm.priority = p->tm.priority;
    c->tm.ignore_result = 1;
    c->kind = f->inner_kind;
    c->fan = f;
    c->fan_index = idx;
    c->placed_by = p;
    c->t_received = e->now.loop_ms;
    c->received_epoch_us = e->now.epoch_us;
    c->state = JOB_CHECKING;
    e->live++;
    f->live++;
    return c;
}

/* Lets an item's job go (the engine frees it, and engine__fanout_forget()
 * counts it). fan_index -1 says it ended here, not lost on the way. */
static void item_end(struct job *c)
{
    c->fan_index = -1;
    engine__abandon(c);
}

static void unlink_waiting(struct fanout *f, struct job *c)
{
    for (struct job **pp = &f->waiting; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            c->next = NULL;
            return;
        }
    }
}

/* Drops the queued items after index `after`: collected first, then
 * unlinked, so the walk never follows a job it freed. */
static void drop_queued(struct fanout *f, int after)
{
    struct engine *e = f->parent->e;
    struct job **jobs;
    int n = 0;
    if (f->live <= 0)
        return;
    jobs = cr_malloc((size_t)f->live * sizeof(*jobs));
    if (!jobs) {
        f->sweep = 1; /* dropped as they come up, or at the next tick */
        return;
    }
    for (struct job *c = e->ready_head; c && n < f->live; c = c->next)
        if (c->fan == f && c->fan_index > after)
            jobs[n++] = c;
    for (int i = 0; i < n; i++) {
        engine__ready_unlink(e, jobs[i]);
        item_end(jobs[i]);
    }
    cr_free(jobs);
}

/* Ends every item after index `after` that has not ended: the waiting ones
 * and (when eager) the queued ones now, the running ones aborted (their
 * completion drops them). Lazy leaves the queued ones to run_item() and the
 * tick. */
static void cancel_after(struct fanout *f, int after, const char *exc, const char *msg,
                         int eager)
{
    struct engine *e = f->parent->e;
    struct job *c, *next;

    for (c = f->waiting; c; c = next) {
        next = c->next;
        if (c->fan_index > after) {
            unlink_waiting(f, c);
            item_end(c);
        }
    }
    /* A cold shutdown cancels every call itself (and engine_free() may not
     * call out at all). */
    if (e->shutdown != 2) {
        for (c = e->run_head; c; c = c->rnext) {
            if (c->fan == f && c != f->parent && c->call && c->fan_index > after) {
                e->ops->abort_llm(e->ctx, c, exc, msg);
                c->call = NULL;
            }
        }
    }
    if (eager)
        drop_queued(f, after);
    else
        f->sweep = 1;
}

/* Item idx failed: the first failure in item order is the map's. */
static void item_failed(struct fanout *f, int idx, const char *exc_type,
                        const char *exc_module, const char *message, int eager)
{
    if (idx >= f->fail_index)
        return;
    f->fail_index = idx;
    snprintf(f->exc_type, sizeof(f->exc_type), "%s", exc_type);
    snprintf(f->exc_module, sizeof(f->exc_module), "%s", exc_module);
    snprintf(f->exc_message, sizeof(f->exc_message), "%s", message);
    cancel_after(f, idx, "TaskRevokedError", "an earlier item of the map failed", eager);
}

/* The map cannot settle: its delivery comes back, and it runs again. */
static void lose(struct fanout *f, int eager)
{
    struct job *p = f->parent;
    struct engine *e = p->e;
    /* A settling map has no item left to stop: its parent settles already. */
    if (f->state == FAN_LOST || f->state == FAN_SETTLING)
        return;
    fan_set_state(f, FAN_LOST);
    /* A redelivery must start a new map, not join this one. */
    if (p->in_map && p->tm.id && strmap_get(&e->jobs, p->tm.id) == p) {
        strmap_del(&e->jobs, p->tm.id);
        p->in_map = 0;
    }
    cancel_after(f, -1, "WorkerLostError", "the map's delivery is gone", eager);
}

/* Hands out the next items while the window has room. */
static void spawn(struct fanout *f)
{
    struct job *p = f->parent;
    struct engine *e = p->e;
    int window = e->concurrency > 0 ? e->concurrency : 1;

    while (f->state == FAN_RUNNING && f->nspawned < f->fail_index &&
           f->nspawned < f->nitems &&
           (f->inner_kind == TASK_ACCUMULATE || f->live < window)) {
        int idx = f->nspawned++;
        const cJSON *item = f->cursor;
        struct task_error te;
        cJSON *args;
        struct job *c;

        f->cursor = item->next;
        memset(&te, 0, sizeof(te));
        args = tasks_item_args(p->kind, f->inner, item, &te);
        if (!args) {
            item_failed(f, idx, te.exc_type[0] ? te.exc_type : "MemoryError", "builtins",
                        te.exc_type[0] ? te.message : "out of memory", 1);
            continue;
        }
        if (f->inner_kind == TASK_ACCUMULATE) {
            /* No call to make: run it here, as Python would. */
            struct task_msg m;
            task_msg_init(&m);
            m.args = args;
            m.kwargs = cJSON_CreateObject();
            f->results[idx] = m.kwargs ? tasks_accumulate(&m, &te) : NULL;
            task_msg_release(&m);
            if (!f->results[idx])
                item_failed(f, idx, te.exc_type[0] ? te.exc_type : "MemoryError",
                            "builtins", te.exc_type[0] ? te.message : "out of memory", 1);
            continue;
        }
        c = item_new(f, idx, args);
        if (!c) {
            item_failed(f, idx, "MemoryError", "builtins", "out of memory", 1);
            continue;
        }
        engine__ready_push(e, c);
        /* A schedule under way may have passed the end of the queue already. */
        e->rescan = 1;
    }
}

/* ------------------------------------------------------------- settling */

static cJSON *result_list(struct fanout *f)
{
    cJSON *list = cJSON_CreateArray(), *part = NULL;
    if (!list)
        return NULL;
    for (int i = 0; i < f->nitems; i++) {
        cJSON *r = f->results[i];
        if (f->parent->kind == TASK_CHUNKS && i % f->n == 0) {
            part = cJSON_CreateArray();
            if (!part || !cJSON_AddItemToArray(list, part)) {
                cJSON_Delete(part);
                cJSON_Delete(list);
                return NULL;
            }
        }
        if (!cJSON_AddItemToArray(part ? part : list, r)) {
            cJSON_Delete(list);
            return NULL;
        }
        f->results[i] = NULL;
    }
    return list;
}

/* Settles the map once nothing of it is left under way. May free the parent
 * (and f): the caller touches neither afterwards. */
static void finish(struct fanout *f)
{
    struct job *p = f->parent;
    struct engine *e = p->e;
    int limit = f->fail_index < f->nitems ? f->fail_index : f->nitems;
    enum fan_state why = f->state;
    cJSON *list;

    if (why == FAN_SETTLING || f->live > 0 || (why == FAN_RUNNING && f->nspawned < limit))
        return;
    fan_set_state(f, FAN_SETTLING);
    /* Off the running list; the slot it gave back at the start is not given
     * back twice. */
    e->active++;
    engine__release_slot(p);
    switch (why) {
    case FAN_LOST:
        engine__abandon(p);
        return;
    case FAN_REVOKED:
        engine__revoke_job(p, "terminated", NULL);
        return;
    case FAN_TIMED_OUT:
        engine__fail(p, f->stop_exc, "billiard.exceptions", f->stop_msg, "time limit", 1,
                     NULL);
        return;
    case FAN_RUNNING:
        break;
    case FAN_SETTLING: /* returned above */
        return;
    }
    if (f->fail_index < f->nitems) {
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s') (item %d of %d)",
            job_name(p), parent_id(f), f->exc_type, f->exc_message, f->fail_index,
            f->nitems);
        engine__fail(p, f->exc_type, f->exc_module, f->exc_message, "task raised", 1,
                     NULL);
        return;
    }
    list = result_list(f);
    if (!list) {
        engine__fail(p, "MemoryError", "builtins", "out of memory building the result",
                     "internal", 0, NULL);
        return;
    }
    engine__succeed(p, list);
}

/* After any change: hand out more items, settle when done. */
static void check(struct fanout *f)
{
    spawn(f);
    finish(f);
}

/* --------------------------------------------------------------- entries */

void engine__fanout_start(struct job *j)
{
    struct engine *e = j->e;
    struct task_fanout spec;
    struct task_error te;
    enum task_kind inner = TASK_UNKNOWN;
    struct fanout *f;
    int rc;

    memset(&te, 0, sizeof(te));
    rc = engine_job_args(j);
    if (rc == 0)
        rc = tasks_bind_fanout(j->kind, &j->tm, &spec, &te);
    if (rc == 0) {
        inner = tasks_lookup(spec.task, e->cfg->aliases, e->cfg->naliases);
        /* Only what runs here as one call (or accumulate) can be an item. */
        if (inner == TASK_UNKNOWN || tasks_is_fanout(inner)) {
            snprintf(te.exc_type, sizeof(te.exc_type), "NotRegistered");
            snprintf(te.message, sizeof(te.message), "%s", spec.task);
            rc = CR_ENOTFOUND;
        }
    }
    if (rc == CR_ENOMEM)
        snprintf(te.exc_type, sizeof(te.exc_type), "MemoryError");
    if (rc) {
        engine__release_slot(j);
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
            te.exc_type, te.message);
        engine__fail(j, te.exc_type,
                     rc == CR_ENOTFOUND ? "celery.exceptions" : "builtins", te.message,
                     rc == CR_ENOTFOUND ? "unregistered task" : "bad arguments", 1, NULL);
        return;
    }
    f = cr_calloc(1, sizeof(*f));
    if (f) {
        f->results = cr_calloc(spec.nitems ? (size_t)spec.nitems : 1, sizeof(cJSON *));
        f->inner = cr_strdup(spec.task);
    }
    if (!f || !f->results || !f->inner) {
        if (f) {
            cr_free(f->results);
            cr_free(f->inner);
            cr_free(f);
        }
        engine__release_slot(j);
        engine__fail(j, "MemoryError", "builtins", "out of memory starting the map",
                     "internal", 0, NULL);
        return;
    }
    f->parent = j;
    f->inner_kind = inner;
    f->n = spec.n;
    f->nitems = spec.nitems;
    f->cursor = spec.it->child;
    f->fail_index = spec.nitems;
    j->fan = f;
    /* Waits on the running list without its slot: the items take slots. */
    e->active--;
    LOG(LOG_INFO, "Task %s[%s] runs %d items of %s, up to %d at a time", job_name(j),
        j->tm.id, f->nitems, f->inner, e->concurrency);
    check(f);
}

/* Whether the map's outcome can still be acked: a delivery settled already
 * (--acks-early, or parked with its lease) needs no live connection. */
static int parent_lost(const struct job *p)
{
    for (int i = 0; i < p->nmsgs; i++)
        if (!p->msgs[i]->settled)
            return !engine__job_live(p);
    return 0;
}

/* A queued item got a slot (called from engine__start(), inside a schedule). */
static void item_call(struct job *c);

void engine__fanout_run_item(struct job *c)
{
    struct fanout *f = c->fan;
    struct engine *e = c->e;

    if (f->state == FAN_RUNNING && parent_lost(f->parent)) {
        LOG(LOG_WARNING,
            "Task %s[%s] stops: its delivery went with the broker connection (it "
            "runs again once redelivered)",
            job_name(f->parent), parent_id(f));
        lose(f, 0);
    }
    if (f->state != FAN_RUNNING || c->fan_index > f->fail_index) {
        item_end(c);
        check(f);
        return;
    }
    engine__run_push(e, c);
    c->t_started = e->now.loop_ms;
    item_call(c);
}

int engine__fanout_fall_back(struct job *c, const struct llm_result *res)
{
    struct fanout *f = c->fan;
    if (f->state != FAN_RUNNING || c->fan_index > f->fail_index)
        return -1;
    /* An item has no id, events or progress stream of its own: the line
     * names its map. */
    LOG(LOG_WARNING, "Task %s[%s] item %d: %s failed: %s('%s'); trying the next provider",
        job_name(f->parent), parent_id(f), c->fan_index,
        res->provider && res->provider[0] ? res->provider : "default", res->exc_type,
        res->message);
    c->call = NULL;
    c->pending--;
    c->route_step++;
    item_call(c);
    return 0;
}

/* The item's LLM call, on the provider its route_step names. */
static void item_call(struct job *c)
{
    struct fanout *f = c->fan;
    struct engine *e = c->e;
    struct task_call call;
    struct task_error te;
    struct cr_err err;
    int rc;

    memset(&te, 0, sizeof(te));
    rc = tasks_build_call(c->kind, &c->tm, e->cfg->llm_model, e->cfg->llm_embed_model,
                          &call, &te);
    if (rc == 0) {
        call.route_step = c->route_step;
        memset(&err, 0, sizeof(err));
        rc = e->ops->call_llm(e->ctx, c, &call, &err);
        task_call_release(&call);
        if (rc) {
            snprintf(te.exc_type, sizeof(te.exc_type), "MemoryError");
            snprintf(te.message, sizeof(te.message), "%s", err.msg);
        }
    } else if (rc == CR_ENOMEM) {
        snprintf(te.exc_type, sizeof(te.exc_type), "MemoryError");
    }
    if (rc) {
        engine__release_slot(c);
        item_failed(f, c->fan_index, te.exc_type, "builtins", te.message, 0);
        item_end(c);
        check(f);
        return;
    }
    c->attempt++;
    c->pending++;
}

void engine__fanout_item_done(struct job *c, const struct llm_result *res)
{
    struct fanout *f = c->fan;
    struct engine *e = c->e;
    const struct engine_config *cfg = e->cfg;
    int idx = c->fan_index;

    if (e->shutdown == 2)
        lose(f, 1);
    if (f->state != FAN_RUNNING || idx > f->fail_index) {
        item_end(c);
        check(f);
        return;
    }
    if (res->verdict == LLM_OK) {
        cJSON *r = tasks_result(c->kind, (struct llm_result *)res);
        if (r)
            f->results[idx] = r;
        else
            item_failed(f, idx, "MemoryError", "builtins",
                        "out of memory building the result", 1);
    } else if (res->verdict == LLM_RETRYABLE &&
               (cfg->max_retries < 0 || c->tm.retries < cfg->max_retries)) {
        struct llm_backoff bo = {
            (int64_t)(cfg->retry_backoff * 1000), cfg->retry_backoff_factor,
            (int64_t)(cfg->retry_backoff_max * 1000), cfg->retry_jitter};
        int64_t delay = res->retry_after_ms >= 0
                            ? res->retry_after_ms
                            : llm_backoff_ms(&bo, c->tm.retries, &e->seed);
        LOG(LOG_INFO, "Task %s[%s] item %d retry in %.3fs: %s('%s')", job_name(f->parent),
            parent_id(f), idx, (double)delay / 1000.0, res->exc_type, res->message);
        c->tm.retries++;
        c->route_step = 0; /* a retry starts again from the model's first target */
        c->tm.eta_us = e->now.epoch_us + delay * 1000;
        job_set_state(c, JOB_ETA);
        c->prev = NULL;
        c->next = f->waiting;
        f->waiting = c;
        return;
    } else {
        item_failed(f, idx, res->exc_type, ENGINE_EXC_MODULE, res->message, 1);
    }
    item_end(c);
    check(f);
}

int engine__fanout_terminate(struct job *j)
{
    struct fanout *f = j->fan;
    if (!f || f->parent != j || f->state == FAN_SETTLING)
        return 0;
    if (f->state != FAN_RUNNING)
        return 1;
    LOG(LOG_INFO, "Terminating %s[%s] and its running items", job_name(j), j->tm.id);
    fan_set_state(f, FAN_REVOKED);
    cancel_after(f, -1, "TaskRevokedError", "terminated", 1);
    check(f);
    return 1;
}

/* The map's time limits, its items' retries coming due, the lazy drops. */
static void tick_one(struct fanout *f)
{
    struct job *p = f->parent, *c, *next;
    struct engine *e = p->e;
    int64_t now = (int64_t)e->now.loop_ms;

    for (c = f->waiting; c; c = next) {
        next = c->next;
        if (c->tm.eta_us <= e->now.epoch_us) {
            unlink_waiting(f, c);
            engine__ready_push(e, c);
        }
    }
    if (f->state == FAN_RUNNING && p->hard_deadline && now >= p->hard_deadline) {
        LOG(LOG_ERROR, "Hard time limit (%gs) exceeded for %s[%s]", p->hard_limit_s,
            job_name(p), parent_id(f));
        fan_set_state(f, FAN_TIMED_OUT);
        snprintf(f->stop_exc, sizeof(f->stop_exc), "TimeLimitExceeded");
        snprintf(f->stop_msg, sizeof(f->stop_msg), "%g", p->hard_limit_s);
        cancel_after(f, -1, f->stop_exc, f->stop_msg, 1);
    } else if (f->state == FAN_RUNNING && p->soft_deadline && now >= p->soft_deadline) {
        LOG(LOG_WARNING, "Soft time limit (%gs) exceeded for %s[%s]", p->soft_limit_s,
            job_name(p), parent_id(f));
        fan_set_state(f, FAN_TIMED_OUT);
        snprintf(f->stop_exc, sizeof(f->stop_exc), "SoftTimeLimitExceeded");
        snprintf(f->stop_msg, sizeof(f->stop_msg), "soft time limit (%gs) exceeded",
                 p->soft_limit_s);
        cancel_after(f, -1, f->stop_exc, f->stop_msg, 1);
    }
    if (f->sweep) {
        f->sweep = 0;
        drop_queued(f, f->state != FAN_RUNNING ? -1 : f->fail_index);
    }
    check(f);
}

void engine__fanout_tick(struct engine *e)
{
    struct job *j, *next;
    for (j = e->run_head; j; j = next) {
        next = j->rnext;
        if (j->fan && j->fan->parent == j && j->fan->state != FAN_SETTLING)
            tick_one(j->fan);
    }
}

void engine__fanout_release(struct engine *e)
{
    struct job *j, *next;
    for (j = e->run_head; j; j = next) {
        next = j->rnext;
        if (j->fan && j->fan->parent == j && j->fan->state != FAN_SETTLING) {
            /* Its waiting and queued items go; it follows once none is left. */
            lose(j->fan, 1);
            finish(j->fan);
        }
    }
}

/* Called by job_free() for every job with a fan. */
void engine__fanout_forget(struct job *j)
{
    struct fanout *f = j->fan;
    j->fan = NULL;
    if (f->parent == j) {
        /* Its items hold f: the map is let go only once they all ended. */
        if (f->live > 0)
            LOG(LOG_ERROR, "Task %s[%s] freed with %d items left", job_name(j),
                j->tm.id ? j->tm.id : "?", f->live);
        for (int i = 0; i < f->nitems; i++)
            cJSON_Delete(f->results[i]);
        cr_free(f->results);
        cr_free(f->inner);
        cr_free(f);
        return;
    }
    f->live--;
    if (j->fan_index >= 0) {
        /* Freed by the engine without ending here (engine_free()): the map
         * cannot finish any more. */
        lose(f, 1);
        finish(f);
    }
}
