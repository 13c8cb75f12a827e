/* control.c -- the engine's control and query API: revokes, concurrency,
 * rate and time limits, and read-only walks over the jobs for remote control,
 * events and metrics. No I/O. */
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/log.h"

/* ---------------------------------------------------------------- control */

void engine_remember_revoked(struct engine *e, const char *id, int64_t expires_epoch_s,
                             struct engine_now now)
{
    revoked_set_add(&e->revoked, id, expires_epoch_s, now.epoch_us / 1000000);
}

int engine_is_revoked(struct engine *e, const char *id, struct engine_now now)
{
    return revoked_set_has(&e->revoked, id, now.epoch_us / 1000000);
}

void engine_each_revoked(struct engine *e, struct engine_now now,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg)
{
    revoked_set_each(&e->revoked, now.epoch_us / 1000000, fn, arg);
}

char *engine_revoked_meta(const struct engine *e, const char *id, struct engine_now now)
{
    struct result_meta rm;
    cJSON *exc = result_exc_new("TaskRevokedError", "celery.exceptions", "revoked");
    char *meta;
    (void)e;
    if (!exc)
        return NULL;
    memset(&rm, 0, sizeof(rm));
    rm.task_id = id;
    rm.status = "REVOKED";
    rm.result = exc;
    rm.date_done_us = now.epoch_us;
    meta = result_meta_encode(&rm);
    cJSON_Delete(exc);
    return meta;
}

/* Ends a running job's call; it is then settled as REVOKED with its partial
 * text. 1 when there was something to end. */
static int terminate_running(struct engine *e, struct job *j)
{
    if (engine__fanout_terminate(j))
        return 1;
    if (!j->call)
        return 0;
    LOG(LOG_INFO, "Terminating %s[%s]", job_name(j), j->tm.id);
    j->revoked = 1;
    /* engine_on_llm_done() follows from the loop and sees j->revoked. */
    e->ops->abort_llm(e->ctx, j, "TaskRevokedError", "terminated");
    j->call = NULL;
    return 1;
}

int engine_revoke_stamps(struct engine *e, struct engine_now now, const cJSON *headers,
                         int terminate, cJSON *terminated)
{
    struct revoked_stamps only;
    int rc;

    engine__enter(e, now);
    rc = revoked_stamps_add(&e->revoked_stamps, headers);
    if (rc == CR_EINVAL || rc == CR_ENOMEM || !terminate)
        goto out;
    /* Celery terminates the running requests that carry one of these very
     * values; the ones not started yet are found when they would start. */
    revoked_stamps_init(&only);
    if (revoked_stamps_add(&only, headers) != CR_ENOMEM) {
        struct job *j, *next;
        for (j = e->run_head; j; j = next) {
            const char *name = NULL;
            const cJSON *v = NULL;
            next = j->rnext;
            if (j->state != JOB_RUNNING || !j->nmsgs ||
                !revoked_stamps_match(&only, engine__headers_of(j, j->msgs[0]), &name,
                                      &v))
                continue;
            if (!terminate_running(e, j))
                continue;
            if (terminated && v) {
                cJSON *list = cJSON_GetObjectItemCaseSensitive(terminated, name);
                if (!list && (list = cJSON_CreateArray()) &&
                    !cJSON_AddItemToObject(terminated, name, list)) {
                    cJSON_Delete(list);
                    list = NULL;
                }
                if (list && !revoked_value_in(list, v)) {
                    cJSON *copy = cJSON_Duplicate(v, 1);
                    if (copy && !cJSON_AddItemToArray(list, copy))
                        cJSON_Delete(copy);
                }
            }
        }
    }
    revoked_stamps_release(&only);
out:
    engine__leave(e);
    return rc;
}

int engine_revoke(struct engine *e, struct engine_now now, const char *id, int terminate)
{
    struct job *j;
    int rc = 0;

    engine__enter(e, now);
    revoked_set_add(&e->revoked, id, now.epoch_us / 1000000 + ENGINE_REVOKE_EXPIRES_S,
                    now.epoch_us / 1000000);
    j = strmap_get(&e->jobs, id);
    switch (j ? j->state : JOB_DONE) {
    case JOB_READY:
        engine__ready_unlink(e, j);
        engine__revoke_job(j, "revoked", NULL);
        break;
    case JOB_ETA:
        engine__eta_unlink(e, j);
        engine__revoke_job(j, "revoked", NULL);
        break;
    case JOB_RUNNING:
        if (terminate)
            rc = terminate_running(e, j);
        break;
    default:
        /* CHECKING: engine_on_state() sees the revoked id; SETTLING/DONE: too late. */
        break;
    }
    engine__leave(e);
    return rc;
}

void engine_set_concurrency(struct engine *e, struct engine_now now, int n)
{
    engine__enter(e, now);
    if (n < 1)
        n = 1;
    if (n > ENGINE_MAX_CONCURRENCY)
        n = ENGINE_MAX_CONCURRENCY;
    e->concurrency = n;
    engine__sync_prefetch(e);
    engine__leave(e);
}

int engine_knows_task(const struct engine *e, const char *name)
{
    return tasks_lookup(name, e->cfg->aliases, e->cfg->naliases) != TASK_UNKNOWN;
}

int engine_set_rate_limit(struct engine *e, struct engine_now now, const char *task,
                          const char *rate)
{
    struct task_limits *tl;
    double r;
    if (!engine_knows_task(e, task))
        return CR_ENOTFOUND;
    r = ratelimit_parse(rate);
    if (r < 0)
        return CR_EINVAL;
    tl = engine__limits(e, task, 1);
    if (!tl)
        return CR_ENOMEM;
    engine__enter(e, now);
    tl->has_rate = r > 0;
    snprintf(tl->rate_text, sizeof(tl->rate_text), "%s", r > 0 ? rate : "");
    ratelimit_init(&tl->bucket, r, (int64_t)now.loop_ms);
    engine__leave(e);
    return 0;
}

const char *engine_rate_limit(struct engine *e, const char *task)
{
    const struct task_limits *tl = engine__limits(e, task, 0);
    return tl && tl->has_rate ? tl->rate_text : NULL;
}

int engine_set_time_limit(struct engine *e, const char *task, double soft, double hard)
{
    struct task_limits *tl;
    if (!engine_knows_task(e, task))
        return CR_ENOTFOUND;
    tl = engine__limits(e, task, 1);
    if (!tl)
        return CR_ENOMEM;
    tl->soft = soft > 0 ? soft : 0;
    tl->hard = hard > 0 ? hard : 0;
    return 0;
}

/* --------------------------------------------------------------- queries */

struct count_arg {
    size_t n;
};

static void count_checking(const char *key, void *value, void *arg)
{
    const struct job *j = value;
    (void)key;
    if (j->state == JOB_CHECKING)
        ((struct count_arg *)arg)->n++;
}

void engine_stats(const struct engine *e, struct engine_stats *st)
{
    struct count_arg c = {0};
    memset(st, 0, sizeof(*st));
    strmap_each((struct strmap *)&e->jobs, count_checking, &c);
    st->concurrency = e->concurrency;
    st->active = e->active;
    st->nready = e->nready;
    st->neta = e->neta;
    st->nchecking = c.n;
    st->live = e->live;
    st->processed = e->processed;
    st->prefetch_count =
        engine_prefetch_count(e->concurrency, e->cfg->prefetch_multiplier, e->neta);
}

struct each_arg {
    void (*fn)(struct job *j, void *arg);
    void *arg;
};

static void each_checking(const char *key, void *value, void *arg)
{
    struct each_arg *a = arg;
    struct job *j = value;
    (void)key;
    if (j->state == JOB_CHECKING)
        a->fn(j, a->arg);
}

void engine_each_job(struct engine *e, enum engine_job_set set,
                     void (*fn)(struct job *j, void *arg), void *arg)
{
    struct each_arg a = {fn, arg};
    switch (set) {
    /* A map's items are not tasks of their own: the map shows for them. */
    case ENGINE_JOBS_RUNNING:
        for (struct job *j = e->run_head; j; j = j->rnext)
            if (!engine__fanout_is_item(j))
                fn(j, arg);
        break;
    case ENGINE_JOBS_READY:
        for (struct job *j = e->ready_head; j; j = j->next)
            if (!engine__fanout_is_item(j))
                fn(j, arg);
        break;
    case ENGINE_JOBS_ETA:
        for (struct job *j = e->eta_head; j; j = j->next)
            fn(j, arg);
        break;
    case ENGINE_JOBS_CHECKING:
        strmap_each(&e->jobs, each_checking, &a);
        break;
    }
}

struct job *engine_find_job(struct engine *e, const char *id)
{
    return id ? strmap_get(&e->jobs, id) : NULL;
}

struct total_arg {
    void (*fn)(const char *name, unsigned long n, void *arg);
    void *arg;
};

static void total_one(const char *key, void *value, void *arg)
{
    struct total_arg *a = arg;
    a->fn(key, *(unsigned long *)value, a->arg);
}

void engine_each_total(struct engine *e,
                       void (*fn)(const char *name, unsigned long n, void *arg),
                       void *arg)
{
    struct total_arg a = {fn, arg};
    strmap_each(&e->totals, total_one, &a);
}
