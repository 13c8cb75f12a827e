/* engine.h -- every decision about a delivery and its job, and no I/O.
 *
 * The engine is fed events (a delivery, a stored state read back, a store or
 * publish completed, an LLM call done, a lease read, a clock tick, a control
 * command) and answers with effects through struct engine_ops, which the
 * switchboard (worker/worker.c) implements with the broker, the result store
 * and the LLM client. Time comes in as an argument of every entry point
 * (struct engine_now); the engine never reads a clock, a socket or a loop.
 *
 * The rule the engine exists for: exactly one settle (ack or reject) per
 * delivery, and an ack only once the delivery's outcome is durable -- its
 * result stored, its retry, dead letter or canvas follow-ups confirmed by the
 * broker, its chord part-return done (engine/followup.c). A job that
 * cannot make its outcome durable lets its deliveries go unsettled (they come
 * back from the broker), and a redelivery that finds SUCCESS stored is acked
 * without running again.
 *
 * Every engine_on_*() and control call ends the same way: one schedule()
 * (start ready jobs while slots are free) and one idle check. Not thread-safe:
 * call from one thread only. */
#ifndef CR_ENGINE_H
#define CR_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "job.h"
#include "protocol/message.h"
#include "util/err.h"

/* struct delivery's flags, the engine's own. */
#define DELIVERY_F_PARKING 1u /* a parked copy is on its way (unconfirmed) */

/* The time, given by the caller: the loop's monotonic milliseconds and the
 * wall clock (for etas, expiry and dates in metas). */
struct engine_now {
    uint64_t loop_ms;
    int64_t epoch_us;
};

/* How the order of the consumed queues (-Q premium,free) weighs on the ready
 * queue. Either way a higher message priority starts first among the tasks of
 * one tier, and equal ones start in arrival order. */
enum engine_queue_order {
    /* One tier: tasks of every queue start in arrival order, as a Python worker
     * serves its queues over one channel (the default). */
    ENGINE_QUEUE_FAIR,
    /* One tier per queue, in -Q order: every ready task of an earlier queue
     * starts before any of a later one. Queues consumed only from run time on
     * (add_consumer) come last. */
    ENGINE_QUEUE_STRICT,
};

/* Message priorities are clamped to 0..ENGINE_PRIORITY_MAX (AMQP's octet), so
 * the ready queue has a bounded number of levels per tier. */
#define ENGINE_PRIORITY_MAX 255

/* What the engine needs of the configuration (strings borrowed: must outlive
 * the engine). */
struct engine_config {
    const char *hostname;
    long pid; /* shown in STARTED metas */
    int concurrency;
    int prefetch_multiplier;
    char *const *aliases; /* NAME=TASK */
    int naliases;
    char *const
        *queues; /* the queues consumed at start-up (park queues exist for them) */
    int nqueues;
    enum engine_queue_order queue_order; /* how -Q's order weighs (sched.c) */
    int acks_early;
    int result_extended;
    int track_started;
    int max_message_size; /* bytes */
    int max_retries;      /* -1: no limit */
    double retry_backoff; /* seconds */
    double retry_backoff_factor;
    double retry_backoff_max;
    int retry_jitter;
    uint64_t seed;                    /* jitter state; never 0 */
    double time_limit;                /* hard, seconds; 0 none */
    double soft_time_limit;           /* seconds; 0 none */
    const char *dead_letter_exchange; /* "" or NULL: no dead letters */
    double park_after;                /* seconds; 0: never park */
    /* Native delayed delivery (protocol/delayed.h): a delivery whose transport
     * has MSG_CAP_DELAYED and whose eta is further than this many seconds
     * away is republished through celery_delayed_27 (confirmed, then acked)
     * instead of held; a nearer one is held. */
    double delayed_horizon_s;
    /* A delivery whose x-delivery-count (a quorum queue's count of earlier
     * deliveries) is at least this minus one gets FAILURE
     * DeliveryLimitExceeded and is dead-lettered, before the broker's own
     * x-delivery-limit drops it. 0: no limit. */
    int delivery_limit;
    double shutdown_timeout; /* seconds a warm shutdown may take; 0: forever */
    const char *llm_model;
    const char *llm_embed_model;
    /* canvas follow-ups (see protocol/canvas.h, struct canvas_opts) */
    const char *default_queue; /* NULL or "": "celery" */
    char *const *routes;       /* PATTERN=QUEUE (--task-route) */
    int nroutes;
    /* Writes a fresh uuid4 (36 chars + NUL) for the ids a follow-up gets; NULL:
     * drawn from the engine's seed (tests). */
    void (*new_uuid)(char out[37], void *arg);
    void *uuid_arg;
};

/* Why a store or a publish was asked: echoed back in its completion. */
enum engine_store_kind {
    ENGINE_STORE_FINAL,    /* the outcome; the ack waits for it */
    ENGINE_STORE_STARTED,  /* track_started's STARTED; nothing waits */
    ENGINE_STORE_FOLLOWUP, /* store_for: another task's outcome; the ack waits */
};

/* The chord commands of the Redis result backend (Celery's set_chord_size and
 * on_chord_part_return): echoed back in engine_on_chord(). Keys are
 * celery-taskset-meta-<group_id>.j (the sorted set of finished members), .t
 * (members added at run time) and .s (the header size). */
enum engine_chord_op {
    ENGINE_CHORD_SIZE,  /* SETEX .s <result_expires> <size>, then PUBLISH */
    ENGINE_CHORD_PART,  /* one atomic part-return: see struct engine_chord_cmd */
    ENGINE_CHORD_CLEAR, /* DEL .j .t .s (and the join claim) of a chord joined */
};

/* One chord command; strings borrowed for the call. ENGINE_CHORD_PART adds
 * member (the JSON text of [1, id, state, result]) to .j with score
 * group_index (+inf when -1), sets the TTL of .j .t .s to result_expires, and
 * reads the count of .j, .t and .s in the same step; when .s exists and the
 * count is .s + .t, the chord is complete and the members come back in score
 * order -- to task_id only when its member completed the chord, or did so
 * before (a redelivery), or no celeriac task claimed the join: a redelivery of
 * another member of a complete chord does not join it a second time. */
struct engine_chord_cmd {
    enum engine_chord_op op;
    const char *group_id;
    long size;          /* SIZE */
    long group_index;   /* PART; -1: null */
    const char *member; /* PART */
    size_t member_len;
    const char *task_id; /* PART: the job's id, which joins */
};

enum engine_lease_op {
    ENGINE_LEASE_GET, /* who runs the task: engine_on_lease() */
    ENGINE_LEASE_SET, /* we do, for ttl_s seconds (fire and forget) */
    ENGINE_LEASE_DEL, /* nobody (fire and forget) */
};

struct engine_publish; /* engine-private: what a confirm completes */

/* The effects. None may call back into the engine from inside the call; each
 * completion comes later through the engine_on_*() named beside it. A non-zero
 * return (a CR_E* code) means the request was not taken and its completion
 * will never come. */
struct engine_ops {
    /* Settles d (never called for a d already settled). The transport sets
     * d->settled when the settle went out on the connection d came on. */
    void (*ack)(void *ctx, struct delivery *d);
    void (*reject)(void *ctx, struct delivery *d, int requeue);
    /* Whether d can still be settled on the transport's current connection
     * (a delivery of a lost connection is back in its queue already). */
    int (*delivery_live)(void *ctx, const struct delivery *d);
    /* Frees d (the engine is done with it, settled or not). */
    void (*release)(void *ctx, struct delivery *d);
    /* Reads the stored state of j->tm.id: engine_on_state(). */
    int (*read_state)(void *ctx, struct job *j);
    /* Stores meta (n bytes) as j's result: engine_on_stored(). attempt is
     * the message's retries the meta was made for (a RETRY is stored once the
     * next attempt is published): a store never replaces a final state with
     * one that is not, nor a later attempt's state with an earlier one's.
     * Takes meta, on failure too. */
    int (*store)(void *ctx, struct job *j, char *meta, size_t n,
                 enum engine_store_kind kind, int attempt);
    /* Publishes o and waits for its confirm: engine_on_confirm(p). o is
     * borrowed for the call; p is the engine's, to hand back. CR_EBROKER when
     * the transport is away. */
    int (*publish)(void *ctx, const struct outbound *o, struct engine_publish *p);
    /* Starts j's LLM call (c borrowed for the call) and sets j->call:
     * engine_on_llm_done(). On failure err says why. */
    int (*call_llm)(void *ctx, struct job *j, const struct task_call *c,
                    struct cr_err *err);
    /* Aborts j's call in flight (j->call set); engine_on_llm_done() still
     * follows, with exc_type and message as its error. */
    void (*abort_llm)(void *ctx, struct job *j, const char *exc_type,
                      const char *message);
    /* Asks or changes j's lease (see enum engine_lease_op). */
    int (*lease)(void *ctx, struct job *j, enum engine_lease_op op, long ttl_s);
    /* The prefetch window changed (deliveries the transport may hand over
     * unsettled). */
    void (*set_prefetch)(void *ctx, int n);
    /* Something happened to j, for the observers (info borrowed). */
    void (*notify)(void *ctx, struct job *j, const struct task_event_info *info);
    /* j is about to be freed (observers drop what they keep of it). */
    void (*forget)(void *ctx, struct job *j);
    /* Shutdown is complete: warm (nothing left under way) or cold (now). */
    void (*stop)(void *ctx, int cold);
    /* Stores meta (n bytes) as the result of task_id, a task other than j (a
     * later chain step, a chord body), never over a stored SUCCESS:
     * engine_on_stored() with ENGINE_STORE_FOLLOWUP. Takes meta, on failure
     * too. */
    int (*store_for)(void *ctx, struct job *j, const char *task_id, char *meta, size_t n);
    /* A chord command for j (c borrowed for the call): engine_on_chord(). */
    int (*chord)(void *ctx, struct job *j, const struct engine_chord_cmd *c);
    /* May be NULL. Adds to headers (a message j publishes: a canvas follow-up
     * or its retry, before it is encoded for the wire) what the switchboard
     * wants carried on: the trace context of j's run. A failure (OOM) leaves
     * the message without it and is not an error. */
    void (*outbound_headers)(void *ctx, const struct job *j, cJSON *headers);
};

struct engine;

/* Returns a new engine, or NULL on OOM. cfg and ops are borrowed (must outlive
 * it); ctx is passed to every op. */
struct engine *engine_new(const struct engine_config *cfg, const struct engine_ops *ops,
                          void *ctx, struct engine_now now);
/* Frees every job and delivery without settling anything (a cold stop: the
 * transport, closed first, has given them back already). No op but release
 * and forget is called. NULL is a no-op. */
void engine_free(struct engine *e);

/* ------------------------------------------------------------ completions */

/* A delivery for a task queue. Takes d (released through ops->release when the
 * engine is done with it, on every path). */
void engine_on_delivery(struct engine *e, struct engine_now now, struct delivery *d);
/* The answer to read_state: status 0 with the stored meta (value, len; NULL
 * when nothing is stored), or non-zero when it could not be read. */
void engine_on_state(struct engine *e, struct engine_now now, struct job *j, int status,
                     const char *value, size_t len);
/* The answer to store: status 0 when stored (skipped: a SUCCESS was there
 * already and was kept), non-zero when the store was dropped (the result store
 * is going away: the delivery is left to come back). */
void engine_on_stored(struct engine *e, struct engine_now now, struct job *j,
                      enum engine_store_kind kind, int status, int skipped);
/* The answer to a chord command: status 0 when done, non-zero when it could
 * not be (the result store refused it or is going away). For
 * ENGINE_CHORD_PART, members (n of them, each lens[i] bytes, borrowed for the
 * call) are the chord's in score order when this part completed it, else
 * NULL with n 0. */
void engine_on_chord(struct engine *e, struct engine_now now, struct job *j,
                     enum engine_chord_op op, int status, const char *const *members,
                     const size_t *lens, size_t n);
/* The broker's confirm of a publish: ok 1 when it took the message. */
void engine_on_confirm(struct engine *e, struct engine_now now, struct engine_publish *p,
                       int ok);
/* j's LLM call ended (res borrowed for the call). */
void engine_on_llm_done(struct engine *e, struct engine_now now, struct job *j,
                        const struct llm_result *res);
/* The answer to a lease GET: status 0 with the holder's name (NULL: none). */
void engine_on_lease(struct engine *e, struct engine_now now, struct job *j, int status,
                     const char *holder);
/* The periodic tick: etas that came due, rate limits, time limits, parking,
 * the warm shutdown's timeout. */
void engine_on_tick(struct engine *e, struct engine_now now);
/* The engine a publish belongs to, and the ctx an engine was made with: for
 * a switchboard whose completion callbacks carry only a publish or a job. */
struct engine *engine_of_publish(const struct engine_publish *p);
void *engine_ctx(const struct engine *e);

/* ---------------------------------------------------------------- control */

/* Starts a shutdown. Warm: jobs not started go back (rejected, requeued), the
 * running ones finish, then ops->stop(ctx, 0). Cold (or a second warm):
 * ops->stop(ctx, 1) now; nothing more is settled. */
void engine_shutdown(struct engine *e, struct engine_now now, int cold);
/* Halts silently before the switchboard frees its clients (whose pending
 * completions then come back with errors): from here no job starts and every
 * completion lets its job go unsettled. */
void engine_halt(struct engine *e);
/* 0 running, 1 warm shutdown, 2 cold. */
int engine_shutting_down(const struct engine *e);

/* The park queue of task queue Q is ENGINE_PARK_PREFIX Q: a durable queue
 * with a fixed message TTL that dead-letters back to Q (declared by the
 * switchboard for every queue consumed at start-up). */
#define ENGINE_PARK_PREFIX "celeriac.park."

/* The key a FAILURE meta carries while its dead letter is still to be sent
 * (the broker was away when it failed): an object with the dead letter's
 * reason, exc_type, exc_message and http_status. Celery's clients ignore a
 * key they do not know; a redelivery that finds it dead-letters the task
 * without running it, then stores the FAILURE without it. */
#define ENGINE_DEAD_LETTER_PENDING "celeriac_dead_letter_pending"

#define ENGINE_REVOKES_MAX 50000
#define ENGINE_REVOKE_EXPIRES_S 10800

/* Remembers id as revoked (bounded, with expiry). A job of that id not yet
 * started is settled as REVOKED now; a running one is aborted when terminate
 * is set and settled as REVOKED with its partial text. Returns 1 when a
 * running task was terminated, else 0. */
int engine_revoke(struct engine *e, struct engine_now now, const char *id, int terminate);
/* revoke_by_stamped_headers: remembers headers' values (an object name ->
 * value or list; see revoked_stamps_add()), so that a job carrying one of
 * them is settled as REVOKED when it arrives or would start. With terminate,
 * the running jobs that carry one are aborted now, and each stamp that
 * matched is added to terminated (an object name -> list; may be NULL).
 * Returns revoked_stamps_add()'s code. */
int engine_revoke_stamps(struct engine *e, struct engine_now now, const cJSON *headers,
                         int terminate, cJSON *terminated);
int engine_is_revoked(struct engine *e, const char *id, struct engine_now now);
/* The REVOKED meta (TaskRevokedError "revoked", done now) a revoke stores at
 * once for an id with no job here, as Celery 5.6 workers do for every revoked
 * id: a new JSON text (cr_free), or NULL on OOM. The caller stores it never
 * over a SUCCESS. */
char *engine_revoked_meta(const struct engine *e, const char *id, struct engine_now now);
/* Adds an id with a given expiry (statedb, mingle) without touching jobs. */
void engine_remember_revoked(struct engine *e, const char *id, int64_t expires_epoch_s,
                             struct engine_now now);
/* Calls fn for each remembered revoked id (expired ones are dropped first). */
void engine_each_revoked(struct engine *e, struct engine_now now,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg);

/* Live concurrency change; the prefetch window follows. n is clamped to
 * 1..ENGINE_MAX_CONCURRENCY. */
#define ENGINE_MAX_CONCURRENCY 100000
void engine_set_concurrency(struct engine *e, struct engine_now now, int n);
/* Celery rate_limit: NULL, "" or "0" removes the limit. Returns 0, CR_EINVAL for
 * a bad rate, CR_ENOTFOUND for an unknown task name, CR_ENOMEM. */
int engine_set_rate_limit(struct engine *e, struct engine_now now, const char *task,
                          const char *rate);
/* The rate limit text set for a task, or NULL. Borrowed. */
const char *engine_rate_limit(struct engine *e, const char *task);
/* Celery time_limit for a task name (seconds, 0 = none). 0, CR_ENOTFOUND or
 * CR_ENOMEM. */
int engine_set_time_limit(struct engine *e, const char *task, double soft, double hard);
/* Whether name runs here (built-in or alias). */
int engine_knows_task(const struct engine *e, const char *name);

/* Whether a delivery seen delivery_count times before (x-delivery-count;
 * negative: no such header) has reached the limit: count >= limit - 1, for a
 * limit above 0. */
int engine_delivery_limit_reached(long delivery_count, int limit);

/* The basic.qos prefetch_count for this many slots, multiplier and held eta
 * tasks, computed without overflow and clamped to 1..65535: the field has 16
 * bits, and 0 would mean no limit at all. */
int engine_prefetch_count(int concurrency, int multiplier, size_t neta);

/* ---------------------------------------------------------------- queries */

struct engine_stats {
    int concurrency;
    int active;          /* jobs holding a slot */
    size_t nready, neta; /* waiting for a slot; held for their eta */
    size_t nchecking;    /* waiting for their stored state or lease */
    size_t live;         /* jobs allocated, whatever their state */
    unsigned long processed;
    int prefetch_count;
};
void engine_stats(const struct engine *e, struct engine_stats *st);

enum engine_job_set {
    ENGINE_JOBS_RUNNING,  /* holding a slot, newest first */
    ENGINE_JOBS_READY,    /* waiting for a slot, in start order (tier, priority,
                             arrival) */
    ENGINE_JOBS_ETA,      /* held for their eta */
    ENGINE_JOBS_CHECKING, /* waiting for their stored state or lease */
};
/* Calls fn for each job of the set (borrowed for the call). fn must not call
 * into the engine. */
void engine_each_job(struct engine *e, enum engine_job_set set,
                     void (*fn)(struct job *j, void *arg), void *arg);
/* The unsettled job of a task id, or NULL. Borrowed until the engine next
 * runs. */
struct job *engine_find_job(struct engine *e, const char *id);
/* Calls fn with the number of tasks started per task name. */
void engine_each_total(struct engine *e,
                       void (*fn)(const char *name, unsigned long n, void *arg),
                       void *arg);

#endif
