/* vsession.h -- a virtual transport's bookkeeping: what kombu's virtual
 * transport (kombu/transport/virtual) keeps for Redis, and SQS and RQ's job
 * queues keep too, decided apart from any I/O.
 *
 * Redis (net/redis_broker.c) and SQS (net/sqs_broker.c) sit on it.
 *
 * It answers, for one consumer on a store of lists plus an unacked table:
 *   - when to pop and how: batched pop calls while messages keep coming
 *     (narrow or wide by the free room), one blocking pop once a call found
 *     the queues dry, the blocking pop alone while the store refuses the batch
 *     call, a pause after a refused blocking pop; or, for a store whose pop
 *     calls wait for messages themselves (SQS's long polls, long_polls), only
 *     batch calls, as many as the owner can send; never more popped than the
 *     prefetch window allows;
 *   - the records it holds (popped, recording, held, untracked) and their
 *     copies (a peer's restore of a message we hold has the same tag);
 *   - when a record is acked (batched, refused acks held a tick and sent
 *     again, acks confirmed lately replayed after a reconnect), restored (a
 *     requeue, our stop) or its lease refreshed (every lease_ms);
 *   - when a restore round of dead consumers' records runs, and when it ends;
 *   - the pop calls whose reply was lost (their records may be in the store,
 *     held by nobody): which are kept, and when their records are looked up
 *     to be put back;
 *   - when restores or look-ups the store refused for now go again.
 *
 * On SQS a record is a message received and not deleted: it is "recorded"
 * by the receive itself (held at once), its lease is its visibility timeout,
 * an ack is a delete and a restore a visibility change; there is no restore
 * round, no lost pop call and no replay (a delete SQS answered stays done).
 *
 * No I/O, no clock, no loop: the owner feeds it events with the time (any
 * monotonic ms) and it asks for commands through struct vsession_ops. None
 * of the ops may call back into the session from inside the call (but for
 * the one named in ops->restore; the queries below may be read); each answer
 * comes later through the vsession_on_*() named beside it.
 * Not thread-safe. */
#ifndef CR_VSESSION_H
#define CR_VSESSION_H

#include <stddef.h>
#include <stdint.h>

/* The session's life. */
enum vsession_state {
    VSESSION_CONSUMING, /* task queues are popped while the window has room */
    VSESSION_STOPPED,   /* stop_consuming: only no-ack queues are popped */
    VSESSION_DRAINING,  /* the owner is closing: records go back, nothing pops */
    VSESSION_CLOSED,    /* freeing: replies are dropped */
    VSESSION_NSTATES
};

/* How the next pop goes. */
enum vsession_pop {
    VSESSION_POP_WARM, /* batch calls: messages kept coming */
    VSESSION_POP_COLD, /* the last call found the queues dry: a blocking pop next */
    VSESSION_POP_NSTATES
};

/* The batch call (a script on Redis). */
enum vsession_script {
    VSESSION_SCRIPT_ON,      /* used while warm */
    VSESSION_SCRIPT_FAILING, /* refused lately, still tried */
    VSESSION_SCRIPT_OFF,     /* refused script_tries times: blocking pop alone
                              * until script_retry_ms have passed */
    VSESSION_SCRIPT_NSTATES
};

/* The blocking pop (BRPOP on Redis); never in flight with a batch call. */
enum vsession_block {
    VSESSION_BLOCK_IDLE,   /* none out */
    VSESSION_BLOCK_OUT,    /* sent, not answered */
    VSESSION_BLOCK_PAUSED, /* refused: nothing pops until pause_ms pass */
    VSESSION_BLOCK_NSTATES
};

/* The ack queue. */
enum vsession_acks {
    VSESSION_ACKS_OPEN,    /* sent as soon as flushed */
    VSESSION_ACKS_REFUSED, /* the store refused the last batch: held a tick */
    VSESSION_ACKS_NSTATES
};

/* A restore round of dead consumers' records (kombu's restore_visible). */
enum vsession_round {
    VSESSION_ROUND_IDLE,      /* next one at the restore period */
    VSESSION_ROUND_LOCKING,   /* the mutex asked for */
    VSESSION_ROUND_SCANNING,  /* locked, the stale records asked for */
    VSESSION_ROUND_RESTORING, /* their restores in flight */
    VSESSION_ROUND_NSTATES
};

/* Restores and lost calls' look-ups the store refused for now (a server
 * still loading, a read-only replica). */
enum vsession_again {
    VSESSION_AGAIN_NONE, /* nothing refused waits */
    VSESSION_AGAIN_DUE,  /* they go again at the first tick from retry_ms on */
    VSESSION_AGAIN_NSTATES
};

/* Lost pop calls kept, at most: the newest (wide_calls are in flight at a
 * time; older ones are left to the visibility timeout). */
#define VSESSION_LOST_MAX 8
/* A lost call's score, as the owner wrote it (longer ones are cut). */
#define VSESSION_SCORE_MAX 32

/* A record we hold. After it leaves this table it is acking (its tag in the
 * ack queue, then in a batch sent), acked (confirmed, in the replay ring),
 * restoring (handed to ops->restore) or dropped (never recorded). */
enum vsession_rec_state {
    VSESSION_REC_POPPED,    /* delivered, its record not written yet (the store
                             * was away, or refused it): sent again on a tick */
    VSESSION_REC_RECORDING, /* its record write sent, not answered */
    VSESSION_REC_HELD,      /* recorded in the store: leased until settled */
    VSESSION_REC_UNTRACKED, /* held without a record (ack emulation off) */
    VSESSION_REC_NSTATES
};

/* Replies, as the owner classifies them. */
enum vsession_reply {
    VSESSION_OK,       /* answered as asked */
    VSESSION_REFUSED,  /* the store said no (an error reply) */
    VSESSION_NOSCRIPT, /* the batch call's script is not loaded there */
    VSESSION_LOST,     /* the connection went: unknown whether it ran */
    VSESSION_CANCELED, /* the owner is freeing, or gave up after retries of
                        * its own */
    VSESSION_MALFORMED /* answered, but not in a shape we know */
};

/* The two links the session cares about. */
enum vsession_link {
    VSESSION_LINK_STORE, /* commands: records, acks, leases, restores */
    VSESSION_LINK_POP    /* pops */
};

struct vsession_rec {
    /* read-only */
    char *tag;
    enum vsession_rec_state state;
    int copies;
    void *data; /* the owner's (what a record write or a restore needs) */
    /* private */
    struct vsession_rec *prev, *next;
};

struct vsession;

/* An op that the configuration never asks for may be NULL: pop_wide and
 * pop_block with long_polls; record without ack_emulation when every hold is
 * recorded; round_* without ack_emulation; scan_lost when the owner never
 * calls vsession_on_pop_lost(); restores_again always. */
struct vsession_ops {
    /* Whether a link can take commands now (a query, not a command). */
    int (*link_up)(void *ctx, enum vsession_link l);
    /* One batch pop of at most max messages. wide: the window is wide (the
     * owner may read whole replies; never with long_polls). 0: sent, answered
     * by vsession_on_batch() and vsession_on_batch_end(); else nothing was
     * sent (with long_polls: no queue can be polled now, say all have a poll
     * out or are paused, and no more are asked for until the next pop). */
    int (*pop_batch)(void *ctx, long max, int wide);
    /* Called each time batch calls are considered, before any is sent. */
    void (*pop_wide)(void *ctx, int wide);
    /* One blocking pop; tasks: task queues may be popped too (else only
     * no-ack ones). 0: sent, answered by vsession_on_block(); else nothing to
     * pop or not sent. */
    int (*pop_block)(void *ctx, int tasks);
    /* Writes the record of r. 0: sent, answered by vsession_on_recorded(). */
    int (*record)(void *ctx, struct vsession_rec *r);
    /* Removes the records of n tags (borrowed for the call). 0: sent,
     * answered by vsession_on_acked() with the same tags, or in parts (each
     * tag once) when the owner splits the batch. */
    int (*ack)(void *ctx, const char *const *tags, int n);
    /* Refreshes the lease of n records (tags borrowed for the call); no answer. */
    void (*refresh)(void *ctx, const char *const *tags, int n);
    /* Puts tag back: side 'L' the tail of its queue (requeue), 'R' the head
     * (restore). Takes data (the record's, or NULL for a dead consumer's) and
     * state (what the record was: a POPPED or UNTRACKED one has none in the
     * store). round: part of a restore round; vsession_on_round_job() is
     * then owed exactly once, whatever happens, and may come from inside
     * this call (the session holds the round open while it starts them). */
    void (*restore)(void *ctx, const char *tag, void *data, enum vsession_rec_state state,
                    char side, int round);
    /* Frees data of a record that needs it no more. */
    void (*release)(void *ctx, void *data);
    /* Round: takes the mutex (0: sent, answered by vsession_on_round_locked());
     * else no round now. */
    int (*round_lock)(void *ctx);
    /* Round: asks for the stale records (0: sent, answered by
     * vsession_on_round_stale()). */
    int (*round_scan)(void *ctx);
    /* Round: gives the mutex back; no answer. */
    void (*round_unlock)(void *ctx);
    /* Asks for the tags of the records written under score (borrowed for the
     * call), a lost pop call's. 0: sent, answered by vsession_on_lost_scan()
     * with the same score; else the score is kept for later. */
    int (*scan_lost)(void *ctx, const char *score);
    /* Starts again the restores (not a round's) that waited for the store
     * link or were refused (vsession_on_restore_refused()); no answer. */
    void (*restores_again)(void *ctx);
};

struct vsession_config {
    long prefetch;       /* 0: no bound */
    int ack_emulation;   /* 0: nothing is recorded, only held */
    uint64_t lease_ms;   /* refresh period */
    uint64_t restore_ms; /* restore round period (the first at once) */
    uint64_t retry_ms;   /* a refused ack batch waits this long */
    /* 1: every pop is a batch call that waits for messages itself (SQS's
     * long poll), so batch calls go whatever the last ones brought, never a
     * blocking pop, and a refused call is the owner's to pause (the script
     * state stays ON); batch and calls bound them, the wide_* and script_*
     * values are not used. */
    int long_polls;
    long batch, calls; /* narrow: messages per call, calls in flight */
    long wide_room;    /* room from which the window is wide */
    long wide_batch, wide_calls;
    int script_tries; /* refusals in a row before SCRIPT_OFF */
    uint64_t script_retry_ms;
    uint64_t pause_ms;  /* after a refused blocking pop */
    int ack_batch_max;  /* tags per ack or lease command */
    int replay_max;     /* acks kept for a replay, at most */
    uint64_t replay_ms; /* ... for this long */
};

/* Redis's values (net/vsession.c says why each). */
void vsession_config_default(struct vsession_config *c);

/* Returns a new session, or NULL on OOM. ctx is passed to every op. */
struct vsession *vsession_new(const struct vsession_config *cfg,
                              const struct vsession_ops *ops, void *ctx);
/* Releases every record's data (ops->release) and frees. NULL is a no-op. */
void vsession_free(struct vsession *s);

/* ---------------------------------------------------------------- events */

/* A link came up (at now) or went down. The store link coming up writes the
 * records not written yet, replays the acks confirmed in the last replay_ms
 * (but not of records held again), flushes the acks, refreshes every lease,
 * restarts the lease period, starts the waiting restores again
 * (ops->restores_again) and looks up the lost pop calls' records. The pop link coming up
 * makes the pop warm. */
void vsession_on_link(struct vsession *s, enum vsession_link l, int up, uint64_t now);
/* Every loop turn: flushes the acks, then pops while there is room. */
void vsession_pump(struct vsession *s, uint64_t now);
/* Pops while there is room (no flush). */
void vsession_pop(struct vsession *s, uint64_t now);
/* The periodic tick (while the store is up): leases, restore rounds, records
 * to write again, and what was refused for now once retry_ms have passed
 * (restores again, lost calls looked up). The owner pops after it (vsession_pop()). */
void vsession_tick(struct vsession *s, uint64_t now);

/* A batch call's answer, before its messages are fed: asked is what it was
 * sent with. */
void vsession_on_batch(struct vsession *s, long asked, enum vsession_reply rep,
                       uint64_t now);
/* After its messages: got of asked, cut: it stopped on its byte bound. */
void vsession_on_batch_end(struct vsession *s, long asked, long got, int cut);
/* A blocking pop's answer, before its message (popped: it brought one). */
void vsession_on_block(struct vsession *s, enum vsession_reply rep, int popped,
                       uint64_t now);

/* A popped message to hold under tag. recorded: the pop wrote its record
 * already; otherwise ops->record() is asked now (or it is UNTRACKED without
 * ack emulation). Returns 0 (a new record: data taken), 1 (a copy of one we
 * hold: data not taken, the caller frees it) or CR_ENOMEM (not held, data not
 * taken). */
int vsession_hold(struct vsession *s, const char *tag, void *data, int recorded);
/* The record write's answer: OK makes it HELD, anything else POPPED (written
 * again at the next tick or link up). Returns the record, or NULL when it
 * was not RECORDING (settled meanwhile). */
struct vsession_rec *vsession_on_recorded(struct vsession *s, const char *tag,
                                          enum vsession_reply rep);

/* Settles one copy of tag (borrowed; not the record's own r->tag): the
 * record's removal is queued, unless it was the last copy and never written.
 * Returns 0, or CR_ENOMEM (the ack is lost: the record comes back after the
 * visibility timeout). Unknown tags: 0. */
int vsession_ack(struct vsession *s, const char *tag);
/* Settles one copy of tag by putting it back (ops->restore, on the last
 * copy): to the tail while consuming, else to the head. */
void vsession_requeue(struct vsession *s, const char *tag);
/* Queues the removal of a record we do not hold (a message set aside, or a
 * record written otherwise than ours). Returns 0 or CR_ENOMEM. */
int vsession_ack_tag(struct vsession *s, const char *tag);
/* An ack batch's answer, with the tags it was sent with (or a part): OK
 * keeps them for a replay; REFUSED and LOST queue them again (REFUSED holds
 * the queue a tick); CANCELED drops them (their records come back after the
 * visibility timeout). */
void vsession_on_acked(struct vsession *s, const char *const *tags, int n,
                       enum vsession_reply rep, uint64_t now);

/* Restore rounds: the mutex (ok: taken; else held by another or lost). */
void vsession_on_round_locked(struct vsession *s, int ok);
/* The stale records found (tags borrowed); rep not OK ends the round. */
void vsession_on_round_stale(struct vsession *s, const char *const *tags, int n,
                             enum vsession_reply rep);
/* One restore of the round is over. */
void vsession_on_round_job(struct vsession *s);

/* A batch call's reply was lost (the pop link went; not when cancelled): if
 * it ran, its messages are recorded under score and held by nobody. The
 * score is kept (the oldest dropped past VSESSION_LOST_MAX) and looked up at
 * once while the store link is up (ops->scan_lost, newest first), else when
 * it comes up. */
void vsession_on_pop_lost(struct vsession *s, const char *score);
/* A look-up's answer: the tags recorded under score (borrowed). OK: those
 * not held go back to the head of their queues (ops->restore 'R', no data);
 * LOST keeps the score for the store link's return; REFUSED keeps it for
 * retry_ms (VSESSION_AGAIN_DUE); anything else drops it (the records come
 * back after the visibility timeout). */
void vsession_on_lost_scan(struct vsession *s, const char *score, const char *const *tags,
                           int n, enum vsession_reply rep, uint64_t now);
/* A restore (not a round's) was refused for now: the waiting restores go
 * again retry_ms later (VSESSION_AGAIN_DUE). */
void vsession_on_restore_refused(struct vsession *s, uint64_t now);

/* Stops popping task queues. */
void vsession_stop_consuming(struct vsession *s);
/* Closing: when the store is up, every record goes back to the head of its queue
 * (ops->restore 'R'), the acks are flushed, nothing pops any more. */
void vsession_drain(struct vsession *s, uint64_t now);
/* Freeing: nothing more is asked of ops->pop_* or acted on. */
void vsession_close(struct vsession *s);

void vsession_set_prefetch(struct vsession *s, long n);
/* The lease refresh period from the next refresh on (the one due keeps its
 * time). */
void vsession_set_lease_ms(struct vsession *s, uint64_t ms);

/* ---------------------------------------------------------------- queries */

/* The record held under tag, or NULL. */
struct vsession_rec *vsession_held(const struct vsession *s, const char *tag);
/* Messages that may still be popped (LONG_MAX: no bound). */
long vsession_room(const struct vsession *s);
/* Copies held, counted against the window. */
long vsession_nheld(const struct vsession *s);
/* Acks queued and not sent. */
size_t vsession_nacks(const struct vsession *s);
/* A pop (batch or blocking) is in flight. */
int vsession_popping(const struct vsession *s);
enum vsession_state vsession_state(const struct vsession *s);
enum vsession_pop vsession_pop_state(const struct vsession *s);
enum vsession_script vsession_script_state(const struct vsession *s);
enum vsession_block vsession_block_state(const struct vsession *s);
enum vsession_acks vsession_acks_state(const struct vsession *s);
enum vsession_round vsession_round_state(const struct vsession *s);
enum vsession_again vsession_again_state(const struct vsession *s);
/* Lost pop calls kept, not yet looked up. */
int vsession_nlost(const struct vsession *s);
/* Batch call refusals in a row. */
int vsession_script_fails(const struct vsession *s);
/* Ack batches refused in a row. */
int vsession_ack_refusals(const struct vsession *s);
/* The first record held (newest first), for walking with ->next. */
struct vsession_rec *vsession_first(const struct vsession *s);

/* The names of the states, for logs and tests. */
const char *vsession_state_name(enum vsession_state st);
const char *vsession_pop_name(enum vsession_pop st);
const char *vsession_script_name(enum vsession_script st);
const char *vsession_block_name(enum vsession_block st);
const char *vsession_acks_name(enum vsession_acks st);
const char *vsession_round_name(enum vsession_round st);
const char *vsession_rec_name(enum vsession_rec_state st);
const char *vsession_again_name(enum vsession_again st);

#endif
