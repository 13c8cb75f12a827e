/* worker_int.h -- the worker's internal structs, shared by the worker's own
 * modules (events, remote control, metrics, progress). Read these freely on the
 * loop thread; change job and worker state only through the functions declared
 * at the end (they keep the one-settle-per-delivery invariant). */
#ifndef CR_WORKER_INT_H
#define CR_WORKER_INT_H

#include <stdint.h>
#include <uv.h>

#include "net/results.h"
#include "net/amqp.h"
#include "config.h"
#include "engine/tasks.h"
#include "llm/llm_client.h"
#include "protocol/celery_msg.h"
#include "util/strmap.h"
#include "engine/ratelimit.h"

struct events;
struct pidbox;
struct metrics;
struct progress;

enum job_state {
    JOB_CHECKING, /* waiting for the backend GET */
    JOB_ETA,      /* held until its eta, no slot */
    JOB_READY,    /* waiting for a slot */
    JOB_RUNNING,  /* LLM call in flight (holds a slot) */
    JOB_SETTLING, /* outcome being made durable, then acked */
    JOB_DONE,     /* freed when nothing async refers to it */
};

/* kept in sync with enum job_state */
static const char *const job_state_names[]
    __attribute__((unused)) = {"CHECKING", "ETA", "READY", "RUNNING", "SETTLING", "DONE"};

/* Why a job failed, for its dead letter. On the heap, allocated when the job
 * fails: inline it cost 640 bytes of every job in flight. */
struct job_failure {
    char exc_type[64];
    char exc_message[512];
    char reason[64];
};

struct job {
    struct worker *w;
    struct job *prev, *next;   /* ready queue or eta list */
    struct job *rprev, *rnext; /* running list */
    enum job_state state;
    struct task_msg tm;
    enum task_kind kind;
    struct broker_msg **msgs; /* every delivery of this task id; [0] the first */
    int nmsgs;
    int pending; /* async operations that will call back with this job */
    int in_map;
    struct llm_req *req;
    uint64_t t_received; /* loop ms */
    uint64_t t_started;
    int64_t received_epoch_us;
    int64_t soft_deadline; /* loop ms, 0 none */
    int64_t hard_deadline;
    double hard_limit_s;
    double soft_limit_s;
    /* outcome */
    char *meta;                  /* JSON to store, or NULL */
    struct job_failure *failure; /* what a dead letter says; NULL until failed */
    long http_status;
    int dead_letter;     /* publish to the DLX before acking */
    int revoked;         /* terminated by revoke: settle as REVOKED */
    int attempt;         /* LLM attempts made by this worker for this delivery */
    int leased;          /* a parked copy exists: the lease key names us as its runner */
    struct ptask *ptask; /* progress.c's state of the running attempt, or NULL */
    /* While its LLM call runs, the job drops the args and kwargs trees (see
     * drop_args() in worker.c) and keeps the model they named. */
    int args_dropped;
    char *model; /* "model" of the kwargs when dropped, or NULL */
};

struct worker {
    const struct config *cfg;
    uv_loop_t *loop;
    struct broker *broker;
    struct backend *backend;
    struct llm_client *llm;
    struct redact secrets; /* config_secrets(): cut out of provider messages */
    char *chat_url;
    char *embed_url;
    struct broker_config bcfg;

    struct strmap jobs; /* task id -> job, for jobs not yet settled */
    struct job *ready_head, *ready_tail;
    struct job *eta_head;
    size_t nready, neta;
    int active;           /* jobs holding a slot */
    size_t live;          /* jobs allocated, whatever their state */
    struct job *run_head; /* jobs holding a slot, for the time-limit sweep */
    int concurrency;
    unsigned long processed;
    int prefetch_sent;

    uv_timer_t cron;
    uv_signal_t sigterm, sigint;
    int shutdown; /* 0 running, 1 warm, 2 cold */
    uint64_t shutdown_started;
    int exit_code;
    uint64_t seed;

    /* remote control state */
    struct strmap revoked;                          /* task id -> struct revoked_id */
    struct revoked_id *revoked_head, *revoked_tail; /* oldest first */
    struct strmap task_limits;                      /* task name -> struct task_limits */
    struct strmap totals; /* task name -> struct task_total (stats "total") */
    uint64_t started_ms;  /* loop time at start */
    int64_t started_epoch_us;

    /* observers; each may be NULL */
    struct events *events;
    struct pidbox *pidbox;
    struct metrics *metrics;
    struct progress *progress;
};

struct revoked_id {
    struct revoked_id *next;
    int64_t expires_epoch_s;
    char id[];
};

struct task_limits {
    double soft, hard; /* 0: not set */
    int has_rate;
    char rate_text[32];
    struct token_bucket bucket;
};

struct task_total {
    unsigned long n;
};

/* ---------------------------------------------------------- notifications */

enum task_event_type {
    TEV_RECEIVED,
    TEV_STARTED,
    TEV_SUCCEEDED,
    TEV_FAILED,
    TEV_RETRIED,
    TEV_REVOKED,
    TEV_REJECTED,
};

/* What happened to a job, for events, metrics and progress. Borrowed for the
 * call. */
struct task_event_info {
    enum task_event_type type;
    const cJSON *result;  /* SUCCEEDED */
    double runtime_s;     /* SUCCEEDED, FAILED */
    const char *exc_type; /* FAILED, RETRIED */
    const char *exc_message;
    const char *traceback;
    const struct llm_result *llm; /* the LLM call that ended it, or NULL */
    int requeue;                  /* REJECTED */
    int terminated, expired;      /* REVOKED */
    const char *partial_text;     /* REVOKED by terminate: text so far, or NULL */
    int64_t retry_delay_ms;       /* RETRIED */
};

/* Called by worker.c at each step; fans out to events, metrics and progress. */
void worker_notify(struct worker *w, struct job *j, const struct task_event_info *info);

/* ------------------------------------------------- control (remote or local) */

#define WORKER_REVOKES_MAX 50000
#define WORKER_REVOKE_EXPIRES_S 10800

/* Remembers id as revoked (bounded, with expiry). A job of that id not yet
 * started is settled as REVOKED now; a running one is aborted when terminate
 * is set (its transfer stops within one cron tick) and settled as REVOKED with
 * its partial text. Returns 1 when a running task was terminated, else 0. */
int worker_revoke(struct worker *w, const char *id, int terminate);
int worker_is_revoked(struct worker *w, const char *id);
/* Adds an id with a given expiry (statedb, mingle) without touching jobs. */
void worker_remember_revoked(struct worker *w, const char *id, int64_t expires_epoch_s);
/* Calls fn for each remembered revoked id (expired ones are dropped first). */
void worker_each_revoked(struct worker *w,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg);
/* Copies url into out (size bytes) with every configured secret cut out, to
 * be shown (banner, inspect conf and report); returns out. */
const char *worker_shown_url(const struct worker *w, const char *url, char *out,
                             size_t size);
/* Live concurrency change (pool_grow/pool_shrink); prefetch follows. n is
 * clamped to 1..CONFIG_MAX_CONCURRENCY. */
void worker_set_concurrency(struct worker *w, int n);
/* The basic.qos prefetch_count for this many slots, multiplier and held eta
 * tasks, computed without overflow and clamped to 1..65535: the field has 16
 * bits, and 0 would mean no limit at all. */
int worker_prefetch_count(int concurrency, int multiplier, size_t neta);
/* Celery rate_limit: NULL, "" or "0" removes the limit. Returns 0, CR_EINVAL for
 * a bad rate, CR_ENOTFOUND for an unknown task name. */
int worker_set_rate_limit(struct worker *w, const char *task, const char *rate);
/* Celery time_limit for a task name (seconds, 0 = none). 0 or CR_ENOTFOUND. */
int worker_set_time_limit(struct worker *w, const char *task, double soft, double hard);
/* Whether name runs here (built-in or alias). */
int worker_knows_task(struct worker *w, const char *name);
/* Warm shutdown, as SIGTERM. */
void worker_request_shutdown(struct worker *w);
/* j's result meta as Celery's Redis backend stores it (with the extended
 * fields under --result-extended), for status and result (borrowed); ready
 * sets date_done to now. New string, or NULL on OOM. */
char *worker_job_meta(struct job *j, const char *status, const cJSON *result,
                      const char *traceback, int ready);
/* Makes j->tm.args and j->tm.kwargs whole again if the job dropped them while
 * its call runs: parsed again from the message it came in. 0, or CR_ENOMEM
 * (then they stay NULL and the caller goes without). */
int worker_job_args(struct job *j);
/* Text generated so far by a running job (progress), or "" . Borrowed. */
const char *worker_job_text(const struct job *j);

#endif
