/* rq_worker.h -- `celeriac rq worker`: RQ's job queues on Redis, worked as RQ
 * 1.13's own worker leaves them for its readers (job.result, the registries,
 * `rq info`), with the built-in LLM tasks run through the same path as the
 * Celery worker's (worker/llm_stack.h), up to `concurrency` jobs at once on
 * one loop. Jobs are mapped by function name (--task-alias); their data is
 * read by the restricted decoder (protocol/rq_data.h): nothing pickled is
 * ever run. Not thread-safe: the loop thread only. */
#ifndef CR_RQ_WORKER_H
#define CR_RQ_WORKER_H

#include <uv.h>

#include "config.h"
#include "util/err.h"
#include "util/opts.h"

struct rq_config {
    /* The LLM options (config_llm_opts()) and the log level; first, so the
     * shared table rows' offsets hold. */
    struct config base;
    char *url;                 /* redis:// URL of RQ's database */
    char *name;                /* "" : celeriac-<host>-<pid> */
    int concurrency;           /* jobs at once, one RQ worker identity each */
    struct opts_list aliases;  /* MODULE.FUNC=TASK */
    int result_ttl;            /* seconds, when a job sets none (RQ's --results-ttl) */
    int worker_ttl;            /* seconds (RQ's --worker-ttl) */
    int monitoring_interval;   /* seconds between a running job's heartbeats */
    double shutdown_timeout;   /* seconds a warm shutdown waits for running jobs */
    int with_scheduler;        /* move due scheduled jobs of our queues (RQScheduler) */
    int progress_meta;         /* streamed text so far in job.meta["progress"] */
    int progress_stream;       /* the progress stream (protocol/progress.h) */
    int progress_interval_ms;  /* between two progress writes of a job */
    int protocol;              /* 1: RQ 1.13's layout; 2: 2.x's (executions) */
    const char *const *queues; /* borrowed from argv, in priority order */
    int nqueues;
};

struct rq_worker;

/* Returns a new worker for cfg (borrowed; must outlive it), or NULL with err
 * (an alias naming no built-in, a bad URL, the LLM client). */
struct rq_worker *rq_worker_new(const struct rq_config *cfg, uv_loop_t *loop,
                                struct cr_err *err);

/* Connects (blocking, bounded), registers every slot as an RQ worker and
 * starts popping. Returns 0, or an error with one line in err (Redis
 * unreachable, a live worker already holds the name). */
int rq_worker_start(struct rq_worker *w, struct cr_err *err);

/* Runs the loop until shutdown (SIGTERM or SIGINT: warm, running jobs
 * finish; a second one: cold). Returns the exit code: 0 warm, 1 cold. */
int rq_worker_run(struct rq_worker *w);

/* Frees everything; NULL is a no-op. */
void rq_worker_free(struct rq_worker *w);

#endif
