/* engine_int.h -- the engine's insides, shared by its own files (engine.c,
 * sched.c, outcome.c, control.c, followup.c) and nobody else. */
#ifndef CR_ENGINE_INT_H
#define CR_ENGINE_INT_H

#include "engine.h"
#include "ratelimit.h"
#include "revoked.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/strmap.h"

struct task_limits {
    double soft, hard; /* 0: not set */
    int has_rate;
    char rate_text[32];
    struct ratelimit bucket;
};

struct engine {
    const struct engine_config *cfg;
    const struct engine_ops *ops;
    void *ctx;
    struct engine_now now; /* of the call under way */
    int depth;             /* engine calls on the stack: the outermost schedules */

    struct strmap jobs; /* task id -> job, for jobs not yet settled */
    /* The ready queue: one list sorted by level (tier, then priority, most
     * urgent first), FIFO within a level; level_tail[] and level_bits (the
     * non-empty levels) make an insertion O(levels), not O(queue). */
    struct job *ready_head, *ready_tail;
    struct job **level_tail;
    uint64_t *level_bits;
    unsigned nlevels;
    struct job *eta_head;
    size_t nready, neta;
    int active;           /* jobs holding a slot */
    size_t live;          /* jobs allocated, whatever their state */
    struct job *run_head; /* jobs holding a slot, for the time-limit sweep */
    int concurrency;
    unsigned long processed;
    uint64_t seed;

    int shutdown; /* 0 running, 1 warm, 2 cold */
    uint64_t shutdown_started;
    int stopped; /* ops->stop called */

    struct revoked_set revoked;
    struct revoked_stamps revoked_stamps; /* revoke_by_stamped_headers */
    struct strmap task_limits;            /* task name -> struct task_limits */
    struct strmap totals; /* task name -> unsigned long * (stats "total") */
    int rescan;           /* fanout.c queued items while a schedule ran: schedule again */
};

/* A publish whose confirm the engine waits for. */
enum publish_kind {
    PUBLISH_RETRY,
    PUBLISH_DEAD_LETTER,
    PUBLISH_PARK,
    PUBLISH_FOLLOWUP, /* a message of a canvas plan (followup.c) */
};

struct engine_publish {
    struct job *j;
    enum publish_kind kind;
    struct delivery *d; /* PUBLISH_PARK: the delivery parked */
    int release_job;    /* PUBLISH_PARK of an eta job: the job ends once confirmed */
};

/* engine.c */
void engine__enter(struct engine *e, struct engine_now now);
void engine__leave(struct engine *e);
/* The one place a job's state changes. */
static inline void job_set_state(struct job *j, enum job_state s)
{
    LOG(LOG_DEBUG, "task %s: %s -> [%s]", j->tm.id ? j->tm.id : "?",
        job_state_names[j->state], job_state_names[s]);
    j->state = s;
}
void engine__settle(struct job *j);
void engine__abandon(struct job *j);
void engine__revoke_job(struct job *j, const char *reason, const char *partial);
void engine__fail(struct job *j, const char *exc_type, const char *exc_module,
                  const char *message, const char *reason, int dead_letter,
                  const struct llm_result *llm);
void engine__start(struct job *j);
int engine__park(struct job *j, struct delivery *d, int release_job, int mark_running);

void engine__succeed(struct job *j, cJSON *result);
int engine__job_live(const struct job *j);

/* fanout.c: celery.map, celery.starmap and celery.chunks */

/* A map's life (struct fanout). Only fanout.c's fan_set_state() changes it,
 * along engine__fan_state_legal(). */
enum fan_state {
    FAN_RUNNING,   /* handing out items, or waiting for them */
    FAN_TIMED_OUT, /* its time limit: fails with the limit's exception */
    FAN_REVOKED,   /* revoke with terminate: settles as REVOKED */
    FAN_LOST,      /* cold shutdown or its delivery lost: left unsettled */
    FAN_SETTLING,  /* nothing of it under way: the parent job settles */
};
#define FAN_NSTATES (FAN_SETTLING + 1)
/* kept in sync with enum fan_state */
extern const char *const engine__fan_state_names[FAN_NSTATES];
/* 1 when a map may go from state a to state b, else 0. */
int engine__fan_state_legal(enum fan_state a, enum fan_state b);
/* The state of the map j is, or whose item j is (j->fan is set). */
enum fan_state engine__fanout_state(const struct job *j);

void engine__fanout_start(struct job *j);
int engine__fanout_is_item(const struct job *j);
void engine__fanout_run_item(struct job *j);
/* The item's call once more, on the next provider of its model (a
 * fallback, res its retryable failure): same slot, same retry count.
 * Returns -1, touching nothing, when the item is no longer needed (its
 * failure is then handled as done), else 0. */
int engine__fanout_fall_back(struct job *j, const struct llm_result *res);
void engine__fanout_item_done(struct job *j, const struct llm_result *res);
int engine__fanout_terminate(struct job *j);
void engine__fanout_tick(struct engine *e);
void engine__fanout_forget(struct job *j);
/* engine_free(): lets every map go with its items not running. */
void engine__fanout_release(struct engine *e);

/* sched.c */
int engine__sched_init(struct engine *e);
void engine__sched_release(struct engine *e);
void engine__ready_push(struct engine *e, struct job *j);
void engine__eta_push(struct engine *e, struct job *j);
void engine__ready_unlink(struct engine *e, struct job *j);
void engine__eta_unlink(struct engine *e, struct job *j);
void engine__run_push(struct engine *e, struct job *j);
void engine__release_slot(struct job *j);
void engine__sync_prefetch(struct engine *e);
void engine__schedule(struct engine *e);
void engine__tick(struct engine *e);
void engine__drop_waiting(struct engine *e);
struct task_limits *engine__limits(struct engine *e, const char *task, int create);

/* outcome.c */
char *engine__exc_meta(struct job *j, const char *status, const char *exc_type,
                       const char *exc_module, const char *message, int ready);
cJSON *engine__dead_letter_headers(struct job *j);
#define ENGINE_FIRST_RECEIVED "x-celeriac-first-received"
/* Adds ENGINE_FIRST_RECEIVED to h (j's received time) unless h holds one. 0, or
 * CR_ENOMEM. */
int engine__stamp_first_received(const struct job *j, cJSON *h);
cJSON *engine__headers_copy(struct job *j, const struct delivery *d);
const cJSON *engine__headers_of(const struct job *j, const struct delivery *d);
/* Whether j is revoked by id or by one of its stamps; logs which stamp. */
int engine__job_revoked(struct job *j);
void engine__outbound_of(struct outbound *o, const struct delivery *d,
                         const cJSON *headers);
int engine__retry_message(struct job *j, int64_t delay_ms, struct outbound *o,
                          struct buf *body, cJSON **headers);
const struct job_failure *engine__failure_of(const struct job *j);
void engine__set_failure(struct job *j, const char *exc_type, const char *message,
                         const char *reason);
void engine__free_failure(struct job *j);
void engine__raw_of(struct celery_raw_msg *raw, const struct delivery *d,
                    const cJSON *headers);
void engine__drop_args(struct job *j);

/* engine.c, for followup.c: finish_job() (ack all, let go), the job freed
 * if it is done and nothing is pending, publish() with a kind, the FINAL store
 * of j->meta (0 when asked: its completion is pending), the settle that
 * follows the plan's publishes (dead letter, then store), and whether the
 * message comes back if j lets go of it. */
void engine__finish(struct job *j);
void engine__unref(struct job *j);
int engine__publish(struct job *j, const struct outbound *o, enum publish_kind kind);
int engine__store_final(struct job *j);
void engine__settle_resume(struct job *j);
int engine__comes_back(const struct job *j);

/* followup.c: a finished task's canvas plan (protocol/canvas.h), carried out
 * durably. Each engine__followup_*() hook is a no-op (0) for a job whose
 * message asks for nothing. The plan is built when the outcome is known
 * (success, failure, revoked), published before the outcome is stored
 * (engine__followup_publish() from engine__settle()), the chord part-returns
 * done after it is stored (engine__followup_store() in place of the plain
 * store), and the ack comes last (engine__finish()). */
struct followup;

/* The step of a plan under way, in the order of followup.c's opening comment.
 * Only followup.c's fu_set_step() changes it, along engine__fu_step_legal(). */
enum fu_step {
    FU_NONE,       /* nothing sent yet */
    FU_SIZES,      /* chord sizes of the plan */
    FU_MSGS,       /* messages of the plan, until all are confirmed */
    FU_STORES,     /* FAILURE of later chain steps, and the job's outcome */
    FU_PART,       /* parts[cur]'s part-return */
    FU_JOIN_SIZES, /* chord sizes of the plan of parts[cur]'s join */
    FU_JOIN_MSGS,  /* messages of that plan (the body or its errbacks) */
    FU_BODY,       /* a failed chord's ChordError, stored for its body */
    FU_CLEAR,      /* the joined chord's keys deleted */
};
#define FU_NSTEPS (FU_CLEAR + 1)
/* kept in sync with enum fu_step */
extern const char *const engine__fu_step_names[FU_NSTEPS];
/* 1 when a plan may go from step a to step b, else 0. */
int engine__fu_step_legal(enum fu_step a, enum fu_step b);
/* j's step: FU_NONE when j has no plan. */
enum fu_step engine__followup_step(const struct job *j);

/* j succeeded with result (borrowed). 0, or CR_ENOMEM: the job was let go. */
int engine__followup_success(struct job *j, const cJSON *result);
/* j failed for good (not a retry) with this exception. */
void engine__followup_failure(struct job *j, const char *exc_type, const char *exc_module,
                              const char *message);
/* j is settled as REVOKED with exc (borrowed, the stored result). */
void engine__followup_revoked(struct job *j, const cJSON *exc);
/* From engine__settle(): 1 when the plan's publishes are under way (then
 * engine__settle_resume() follows once all are confirmed), else 0. */
int engine__followup_publish(struct job *j);
/* From store_then_ack() for a job with a plan: stores its outcome and the
 * plan's, then does its part-returns, then acks. */
void engine__followup_store(struct job *j);
/* An ENGINE_STORE_FINAL or ENGINE_STORE_FOLLOWUP store of a job with a plan
 * completed with status 0. */
void engine__followup_stored(struct job *j);
void engine__followup_confirmed(struct job *j, int ok);
/* A redelivery found st stored (meta: value, len): 1 when j's part-returns
 * are under way again (j acks once they are done), 0 when there is none to
 * do (the caller acks). */
int engine__followup_redo(struct job *j, const char *st, const char *value, size_t len);
void engine__followup_free(struct job *j);

#define ENGINE_EXC_MODULE "celeriac.exceptions"

#endif
