/* job.h -- one task under way: what the engine's observers (events, metrics,
 * progress, remote control) may read, and the notifications they get.
 *
 * A job is created by the engine for a delivery and freed by it; observers get
 * it borrowed, for the duration of a notification or an engine_each_job()
 * callback. Fields under "read-only" are the engine's: read them, never write
 * them. The fields under "private" belong to one outside module each and
 * the engine never reads them. */
#ifndef CR_ENGINE_JOB_H
#define CR_ENGINE_JOB_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "engine/tasks.h"
#include "llm/llm_types.h"
#include "protocol/celery_msg.h"
#include "protocol/message.h"

struct engine;
struct fanout;
struct ptask;
struct jtrace;

/* The job's life. Only job_set_state() (engine.c) changes it. */
enum job_state {
    JOB_CHECKING, /* waiting for its stored state (read_state) or its lease */
    JOB_ETA,      /* held until its eta, no slot */
    JOB_READY,    /* waiting for a slot */
    JOB_RUNNING,  /* LLM call in flight (holds a slot) */
    JOB_SETTLING, /* outcome being made durable, then acked */
    JOB_DONE,     /* freed when nothing async refers to it */
};

/* kept in sync with enum job_state */
extern const char *const job_state_names[];

/* Why a job failed, for its dead letter. On the heap, allocated when the job
 * fails: inline it cost 640 bytes of every job in flight. */
struct job_failure {
    char exc_type[64];
    char exc_message[512];
    char reason[64];
};

struct job {
    /* read-only */
    struct engine *e;
    enum job_state state;
    struct task_msg tm;
    enum task_kind kind;
    struct delivery **msgs; /* every delivery of this task id; [0] the first */
    int nmsgs;
    uint64_t t_received; /* loop ms */
    uint64_t t_started;  /* loop ms; 0 until it starts */
    int64_t received_epoch_us;
    int attempt;     /* LLM attempts made by this worker for this delivery */
    int route_step;  /* the provider of the model's list asked now (0: the first) */
    int json_answer; /* task_call.json_answer of the call in flight */
    /* While its LLM call runs, the job drops the args and kwargs trees (see
     * engine_job_args()) and keeps the model they named. */
    int args_dropped;
    char *model; /* "model" of the kwargs when dropped, or NULL */

    /* private to the switchboard: its handle of the call in flight, set by
     * engine_ops.call_llm; the engine clears it once the call is aborted or
     * done, and only tests it for NULL */
    void *call;
    /* private to the progress writer: its state of the running attempt */
    struct ptask *ptask;
    /* private to the switchboard's tracing (worker/tracing.c): its spans of
     * this job, NULL when tracing is off or the trace is not sampled */
    struct jtrace *trace;

    /* private to the engine */
    struct job *prev, *next;   /* ready queue or eta list */
    unsigned level;            /* ready queue level while READY (sched.c) */
    struct job *rprev, *rnext; /* running list */
    int pending;               /* completions still to come back with this job */
    int in_map;
    /* its canvas plan under way (followup.c), or NULL */
    struct followup *fu;
    int64_t soft_deadline; /* loop ms, 0 none */
    int64_t hard_deadline;
    double hard_limit_s;
    double soft_limit_s;
    char *meta;                  /* JSON to store, or NULL */
    struct job_failure *failure; /* what a dead letter says; NULL until failed */
    long http_status;
    int dead_letter; /* publish to the DLX before acking */
    int revoked;     /* terminated by revoke: settle as REVOKED */
    int retried;     /* its retry is published: tm.retries counts the next attempt */
    /* Its FAILURE stored with the dead letter still to send (see
     * dead_letter_failed() in engine.c): 0 no, 1 being stored, 2 stored. */
    int dl_pending;
    int leased; /* a parked copy exists: the lease names us as its runner */
    /* celery.map & co (engine/fanout.c): a map's own state, or for one of its
     * items (a child job without a delivery) the map it belongs to */
    struct fanout *fan;
    int fan_index; /* an item's index in the map's `it` */
    /* The job whose first delivery places this one in the ready queue (its
     * queue's tier, its priority): a map, for its items; NULL for itself. */
    const struct job *placed_by;
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
    TEV_DEAD_LETTERED, /* a final failure goes to the dead-letter exchange */
    /* A call that had streamed text failed and starts again on the model's
     * next provider: the text so far is void (exc_* say why, llm the call). */
    TEV_FALLBACK,
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

/* ------------------------------------------------------------ job queries */

/* The name shown for j: its shadow name, else its task name, else "unknown".
 * Borrowed from j. */
const char *job_name(const struct job *j);

/* The model j asks for: its "model" keyword argument, else the configured
 * default for its kind. Borrowed from j or the engine's config. */
const char *job_model(const struct job *j);

/* j's result meta as Celery's Redis backend stores it (with the extended
 * fields when the engine was configured so), for status and result
 * (borrowed); ready sets date_done to the engine's current time. New string,
 * or NULL on OOM. */
char *engine_job_meta(struct job *j, const char *status, const cJSON *result,
                      const char *traceback, int ready);

/* Makes j->tm.args and j->tm.kwargs whole again if the job dropped them while
 * its call runs: parsed again from the message it came in. 0, or CR_ENOMEM
 * (then they stay NULL and the caller goes without). */
int engine_job_args(struct job *j);

#endif
