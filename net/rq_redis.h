/* rq_redis.h -- the Redis commands of an RQ worker: each step of a job's life
 * and of a worker's registration as one EVAL, so that what RQ's readers see
 * changes atomically (rq-protocol.md section 8 merges each end-of-job path
 * into one transaction this way) and a job deleted meanwhile is never
 * re-created by a partial write (the EXISTS guard of section 13).
 *
 * Each function gathers one command into a (caller-embedded, reset first)
 * struct redis_args, to be sent with redis_conn_send(); the replies are
 * described beside each. Pure but for the script texts: no I/O. */
#ifndef CR_RQ_REDIS_H
#define CR_RQ_REDIS_H

#include <stdint.h>

#include "net/redis.h"

/* BLPOP over the queues in priority order, for timeout_s seconds: the reply
 * is nil, or [queue key, job id]. */
void rq_redis_pop(struct redis_args *a, const char *const *queues, int nqueues,
                  int timeout_s);

/* Takes up to max job ids at once without blocking, the first queue drained
 * first (what a run of LPOPs in RQ's burst mode takes): the reply is an
 * array [queue key, id, queue key, id...], empty when all were empty, or -1
 * (nothing taken) while `rq suspend` holds. */
void rq_redis_pop_many(struct redis_args *a, const char *const *queues, int nqueues,
                       int max);

/* What a worker identity writes about itself. */
struct rq_worker_info {
    const char *name;   /* the worker name */
    const char *queues; /* the queue names joined with ',' */
    const char *const *queue_names;
    int nqueues;
    const char *ts; /* now, RQ's timestamp text */
    long pid;
    const char *hostname;
    const char *version;
    long ttl_s; /* EXPIRE of the worker hash */
};

/* Registers a worker (birth): refused with the reply 0 when a live worker
 * (its hash without `death`) has the name, else 1. */
void rq_redis_birth(struct redis_args *a, const struct rq_worker_info *w);

/* The idle heartbeat: last_heartbeat, state (idle or suspended), the TTL.
 * Reply 1, or 0 when the hash had expired (it is re-created as a birth
 * would, so `rq info` lists the worker again). */
void rq_redis_idle_beat(struct redis_args *a, const struct rq_worker_info *w,
                        const char *state);

/* Death: out of the worker sets, `death` set, the hash kept 60 s. */
void rq_redis_death(struct redis_args *a, const struct rq_worker_info *w);

/* RQ 2.x's layout (rq-protocol.md 12): each run of a job is an execution,
 * with a hash rq:execution:<id>:<eid> and a member of rq:executions:<id>, and
 * the started registry holds "<id>:<eid>". NULL where a function takes one:
 * RQ 1.13's layout (bare ids, no execution keys). */
struct rq_exec {
    const char *eid;  /* uuid4 hex */
    double started_s; /* when this execution started (epoch seconds) */
    double now_s;     /* now (epoch seconds) */
};

/* Starts a job popped from queue: the worker busy on it, the job in the
 * started registry with score wip_score, its status started. Reply: nil when
 * the job hash is gone (an expired ttl, a deleted job: skipped); with bounce,
 * -1 when `rq suspend` holds (the id is back at the head of its queue,
 * nothing else written: a blocking pop may have waited across the
 * suspension); else the job's HGETALL taken after the start. */
void rq_redis_start(struct redis_args *a, const char *worker, const char *id,
                    const char *queue, const char *ts, int64_t wip_score,
                    long worker_ttl_s, const struct rq_exec *x, int bounce);

/* A running job's heartbeat: the worker's TTL and working time, the job's
 * last_heartbeat (only if the hash still exists) and its started score. */
void rq_redis_busy_beat(struct redis_args *a, const char *worker, const char *id,
                        const char *queue, const char *ts, int64_t wip_score,
                        long worker_ttl_s, double working_s, const struct rq_exec *x);

/* How a job ended, for rq_redis_end(). */
enum rq_end {
    RQ_END_FINISHED, /* status finished, result in the stream, finished registry */
    RQ_END_FAILED,   /* status failed, exc in the stream, failed registry */
    RQ_END_STOPPED,  /* as failed, status stopped */
    RQ_END_RETRY,    /* retries_left - 1, back to the queue or to the scheduled one */
};

struct rq_end_info {
    enum rq_end how;
    const char *worker;
    const char *id;
    const char *queue; /* the job's origin */
    const char *ts;    /* ended_at */
    int64_t now_s;
    double working_s;
    /* FINISHED: base64 return_value, or NULL for None; result_ttl -1 keeps
     * for ever, 0 deletes the job at once. */
    const char *return_b64;
    long result_ttl_s;
    /* FAILED, STOPPED: base64 exc_string; failure_ttl as the job has it
     * (-2: not set: one year for the job, no TTL on the stream). */
    const char *exc_b64;
    long failure_ttl_s;
    /* RETRY: the retries left after this one, and the wait (0: at once). */
    long retries_left;
    long interval_s;
    /* Layout 2: the execution ended (its stream entry names it and the
     * worker); NULL: layout 1. */
    const struct rq_exec *exec;
};

/* Ends a job: one script that takes it out of the started registry, clears
 * the worker's current job and counts it, then (only if the job hash still
 * exists) writes the outcome. A finished job releases its dependents whose
 * other dependencies have all finished; a failed or stopped one those that
 * allow failures (Dependency(allow_failure=True)), in the same script.
 * Reply 1, or 0 when the job was gone. */
void rq_redis_end(struct redis_args *a, const struct rq_end_info *e);

/* The scheduler's turn for one queue: under rq:scheduler-lock:<queue>
 * (taken, or kept, with our pid; another holder's lock is left alone), the
 * jobs of the scheduled registry due by now_s go to the queue's tail (its
 * head with enqueue_at_front), status queued. Reply: -1 when another
 * scheduler holds the lock, else how many were due. */
void rq_redis_schedule(struct redis_args *a, const char *queue, int64_t now_s,
                       const char *ts, long pid);

/* Drops the scheduler lock of queue if pid holds it. Reply 1. */
void rq_redis_unlock_scheduler(struct redis_args *a, const char *queue, long pid);

/* Writes a running job's meta (n bytes, the serializer's form) if the job
 * hash still exists. Reply 1, or 0 when it was gone. */
void rq_redis_meta(struct redis_args *a, const char *id, const char *meta, size_t n);

/* One entry of a job's progress stream (protocol/progress.h has the
 * format); every pointer borrowed for the call. */
struct rq_progress_entry {
    const char *state; /* STARTED, PROGRESS, SUCCESS, FAILURE, RETRY, REVOKED */
    const char *text;  /* text since the previous entry ("" for the others) */
    size_t text_len;
    long tokens;        /* deltas so far this attempt */
    const char *error;  /* "ExcType: message", or NULL */
    const char *result; /* the end as JSON (gateway/gw_hub.h), or NULL */
};

#define RQ_PROGRESS_ENTRIES_MAX 3

/* Appends k entries (1..RQ_PROGRESS_ENTRIES_MAX) to job id's progress stream
 * with the Celery worker's script (PROGRESS_WRITE_LUA), no meta: run names
 * this run of the job (a new run is a new attempt), n counts the entries the
 * run has written, these included (the same command sent again after a lost
 * reply is then a no-op), and ttl_s (> 0) is the stream's TTL. Reply: the
 * last entry's seq, or -1 for a command done already. */
void rq_redis_progress(struct redis_args *a, const char *id, const char *run, long n,
                       long ttl_s, const struct rq_progress_entry *e, int k);

/* EXISTS rq:suspended: reply 1 while `rq suspend` holds. */
void rq_redis_suspended(struct redis_args *a);

#endif
