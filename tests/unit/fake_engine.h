/* fake_engine.h -- the one recording fake of struct engine_ops that the engine's
 * unit tests (test_engine.c, test_sched.c, test_fanout.c) drive the engine with.
 *
 * The fake does what a switchboard would, without I/O: it settles and frees
 * deliveries, keeps every request that waits for a completion (stores,
 * publishes, calls, reads, leases, chord commands) in a numbered slot, and
 * writes each effect to one log line ("call1 store-SUCCESS ack1 release1").
 * A test answers a slot with fake_stored(), fake_confirm(), fake_llm_done()
 * or fake_chord_done(); the answers are the test's, so they are not logged:
 * a test file that wants them in its log notes them itself (fake_note()).
 *
 * A new op of struct engine_ops is added here once: its recording in
 * struct fake, its function in fake_ops, and its answer in fake_release().
 *
 * What differs between the test files is set in struct fake after
 * fake_base_init(): the configuration, the flags (how the log reads, which
 * ops fail) and the hooks. Each test file keeps its own fake_init() that
 * does so. Not thread-safe; a struct fake is one test's, on its stack. */
#ifndef CR_TESTS_FAKE_ENGINE_H
#define CR_TESTS_FAKE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "util/buf.h"

#define FAKE_T0_US 1700000000000000LL /* 2023-11-14T22:13:20Z */
/* Slots of each kind of request, and deliveries, one fake may see. */
#define FAKE_MAXOPS 512

/* A delivery made by fake_msg_new(): d first, so that release frees the
 * whole with delivery_free(), as the worker does; every string of d is its own
 * (malloc'd: replace one with free() and strdup()). */
struct fake_msg {
    struct delivery d;
    int n; /* 1, 2, ... in the order fake_msg_new() made them */
};

/* A publish waiting for its confirm (p NULL once answered). */
struct fake_pub {
    struct engine_publish *p;
    char exchange[64], routing_key[128];
    cJSON *headers; /* a copy, or NULL */
    char *body;
};

/* A chord command waiting for its completion (j NULL once answered). */
struct fake_chord {
    struct job *j;
    enum engine_chord_op op;
    char group_id[64];
    long size, group_index;
    char *member; /* a copy, or NULL */
};

struct fake;

/* Called after the fake recorded the event (NULL: nothing more). */
typedef void fake_notify_fn(struct fake *f, struct job *j,
                            const struct task_event_info *info);

struct fake {
    /* set up by fake_base_init(); the test file changes them before fake_start() */
    struct engine_config cfg;
    char *aliases[4];
    char *queues[3];
    struct engine_now now;
    struct engine *e; /* fake_start() */

    /* flags */
    int connected;     /* delivery_live() answers it (1) */
    int log_numbers;   /* "ack1" (1) or "ack" (0): the delivery's number in the log */
    int log_releases;  /* "release1" in the log (1) */
    int no_reads;      /* read_state() fails the test: every delivery is a first one */
    int fail_store;    /* store() and store_for() refuse with CR_ENOMEM */
    int fail_publish;  /* publish() refuses with this code (0: takes it) */
    int fail_call;     /* call_llm() refuses with CR_ENOMEM */
    int fail_chord;    /* chord() refuses with this code (0: takes it) */
    int fallback_left; /* fake_llm_done() results say another provider follows */
    int mark_outbound; /* outbound_headers() adds "x-from": the job's task id */
    /* hooks */
    fake_notify_fn *on_notify;

    /* what happened */
    struct buf log; /* the effects, space-separated */
    int ndeliveries;
    int acks[FAKE_MAXOPS], rejects[FAKE_MAXOPS], releases[FAKE_MAXOPS]; /* by n */
    int acked, rejected, released;                                      /* in all */
    int notes[TEV_FALLBACK + 1];                                        /* by type */
    int prefetch;
    int stopped, cold;
    char last_abort[64]; /* exc_type of the last abort_llm() */

    /* requests; a slot is NULL once answered */
    struct job *stores[FAKE_MAXOPS];
    enum engine_store_kind store_kind[FAKE_MAXOPS];
    char *metas[FAKE_MAXOPS];        /* kept until fake_release() */
    char store_ids[FAKE_MAXOPS][64]; /* store_for(): whose meta; "" for store() */
    int store_attempt[FAKE_MAXOPS];  /* store(): the attempt it gave */
    int nstores;
    struct fake_pub pubs[FAKE_MAXOPS];
    int npubs;
    struct job *calls[FAKE_MAXOPS];
    char *bodies[FAKE_MAXOPS];   /* each call's request body */
    char *call_ids[FAKE_MAXOPS]; /* each call's task id (NULL: a map's item) */
    int aborted[FAKE_MAXOPS];    /* abort_llm() came for the call */
    int steps[FAKE_MAXOPS];      /* each call's route_step */
    int ncalls;
    struct job *reads[FAKE_MAXOPS];
    int nreads;
    struct job *leases[FAKE_MAXOPS]; /* ENGINE_LEASE_GET only */
    int nleases;
    struct fake_chord chords[FAKE_MAXOPS];
    int nchords;
};

/* Every op records into the struct fake given as ctx. */
extern const struct engine_ops fake_ops;

/* Zeroes f and sets what every test starts from: one queue "celery", no
 * aliases, concurrency 4, prefetch multiplier 4, 3 retries, no dead-letter
 * exchange, loop time 1000 ms at FAKE_T0_US, connected, the full log. */
void fake_base_init(struct fake *f);
/* Starts f->e on f->cfg; fails the test on OOM. */
void fake_start(struct fake *f);
/* Halts the engine, answers every request still waiting with an error (as
 * worker_free() does), frees the engine and what the fake kept. The counters
 * stay readable. */
void fake_release(struct fake *f);

/* Appends what (and n, unless 0) to the log. */
void fake_note(struct fake *f, const char *what, int n);
/* Asserts the log since the last log_is() is want, then empties it. */
void log_is(struct fake *f, const char *want);
/* Asserts each delivery was released exactly once and settled at most once. */
void check_once(const struct fake *f);

/* Returns a new delivery numbered f->ndeliveries + 1 from queue (its routing
 * key, exchange ""): a copy of body, JSON in utf-8, persistent, priority 0,
 * confirms and prefetch, received now. Takes headers. Fields may be changed
 * before it is handed to the engine, which hands it back to release(). */
struct fake_msg *fake_msg_new(struct fake *f, const char *body, const char *queue,
                              cJSON *headers);

/* The answers: each asserts slot i still waits and empties it. */
void fake_stored(struct fake *f, int i, int status);
void fake_confirm(struct fake *f, int i, int ok);
/* A chord command done; members (NULL: not complete) for a part-return. */
void fake_chord_done(struct fake *f, int i, int status, const char *const *members,
                     size_t n);
/* Call i ended: v, with exc as the error (NULL: none) or text as the answer. */
void fake_llm_done(struct fake *f, int i, enum llm_verdict v, const char *exc,
                   int64_t retry_after_ms, const char *text);

#endif
