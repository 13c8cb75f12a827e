/* canvas.h -- Celery's canvas at the worker: what a finished task publishes
 * and stores for the signatures its message carries. Pure: no I/O, no clock,
 * no randomness of its own (time and fresh ids come in through struct
 * canvas_opts).
 *
 * A task message's embed holds callbacks (link=), errbacks (link_error=), the
 * rest of a chain (reversed: the next step is the last element) and a chord
 * body (for a chord header member). After the task ends, a Python worker
 * publishes some of them (celery/app/trace.py, celery/backends/base.py and
 * redis.py); this module builds exactly those messages, as a plan the engine
 * carries out:
 *
 *   1. sizes:  SETEX celery-taskset-meta-<gid>.s <ttl> <size> for every chord
 *              the plan launches (a chord in a chain, a chord callback), each
 *              done before any message of the plan is published;
 *   2. msgs:   the task messages to publish, each confirmed by the broker
 *              before the triggering delivery is acked;
 *   3. fails:  (failure plans only) the task ids that get the same FAILURE
 *              stored as the failed task: the later steps of its chain.
 *
 * Every message is Celery protocol v2 (headers + [args, kwargs, embed]) as
 * celery_msg_encode_v2() writes it, whatever protocol the parent came in.
 *
 * Routing of a published signature (Celery's send_task_message): options.exchange
 * and options.routing_key when both are non-empty strings (one alone is ignored,
 * as Celery ignores it for a direct exchange); else options.queue (default
 * exchange "", routing key = queue); else the first route in canvas_opts.routes
 * whose pattern matches the task name (fnmatch-style "*" and "?"); else
 * canvas_opts.default_queue.
 *
 * chunks / xmap / xstarmap signatures arrive as Celery 5.2.6 serializes them:
 * plain immutable celery.chunks / celery.map / celery.starmap tasks with kwargs
 * {"task", "it"[, "n"]}, published like any plain task.
 *
 * Fidelity: the captured fixtures (tests/fixtures/messages/canvas/, made by
 * Celery 5.2.6's own tracer) are reproduced byte for byte, headers and body,
 * including the order fresh uuids are drawn in. Where 5.2.6 would hang a chord
 * (a chain as the last header member never sets the chord size), the size is
 * set anyway.
 *
 * Bounds: a signature nested deeper than 32, or a plan of more than 100000
 * messages (a group, a chain), is CR_EPROTO before anything is built; costs
 * are linear in the size of the signatures (each message embeds its own copy
 * of a chord body or chain). */
#ifndef CR_CANVAS_H
#define CR_CANVAS_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "celery_msg.h"
#include "../util/buf.h"
#include "../util/err.h"

/* What the plan builder needs from the worker. Everything borrowed. */
struct canvas_opts {
    const char *hostname;      /* "origin" of the messages published */
    const char *default_queue; /* Celery's task_default_queue ("celery") */
    char *const *routes;       /* "PATTERN=QUEUE" strings (--task-route) */
    int nroutes;
    int64_t now_us; /* epoch microseconds: countdown -> eta */
    /* reply_to of messages whose options name none, and written into the
     * options of signatures frozen here, as Python's app.thread_oid (only the
     * rpc result backend reads it). NULL: none. */
    const char *reply_to;
    /* Writes a fresh uuid4 string (36 chars + NUL) to out. */
    void (*new_uuid)(char out[37], void *arg);
    void *uuid_arg;
};

/* One message to publish. Owned by its plan. */
struct canvas_msg {
    char *id;          /* its task id (header "id" and correlation_id) */
    char *task;        /* its task name */
    char *exchange;    /* "" for the default exchange */
    char *routing_key; /* the queue, for the default exchange */
    int priority;      /* the AMQP priority property; 0 when not given */
    char *reply_to;    /* the reply_to property; NULL when the signature has none */
    char *expiration;  /* the expiration property (ms, decimal) or NULL: set when
                        * options.expires is given, as kombu sets it */
    cJSON *headers;    /* Celery v2 headers */
    struct buf body;   /* [args, kwargs, embed], as json.dumps writes it */
};

/* A chord the plan launches: its header size goes to <group_id>.s first. */
struct canvas_chord_size {
    char *group_id;
    long size;
};

/* A later chain step that is itself a chord header member (a chain inside a
 * chord header): on failure Celery also runs the chord part-return for it, with
 * the same FAILURE, so the chord does not wait for it forever (base.py
 * mark_as_failure). The engine adds canvas_chord_member(task_id, "FAILURE",
 * exc) to group_id's sorted set like any member, and joins when complete. */
struct canvas_chord_part {
    char *task_id;
    char *group_id;
    long group_index; /* -1 when null */
    cJSON *body;      /* the chord body (options.chord of the step) */
};

struct canvas_plan {
    struct canvas_chord_size *sizes;
    size_t nsizes;
    struct canvas_msg *msgs;
    size_t nmsgs;
    char **fails; /* task ids to store the same FAILURE for */
    size_t nfails;
    struct canvas_chord_part *parts; /* failure plans only; see above */
    size_t nparts;
};

/* A plan owns every pointer in it (strings, headers, bodies, chord bodies).
 * canvas_plan_release() frees them all and re-inits the plan; it is safe on an
 * inited or already released plan. The builders below init *out themselves. */
void canvas_plan_init(struct canvas_plan *p);
void canvas_plan_release(struct canvas_plan *p);

/* Whether m's embed asks for anything at all after it ends (callbacks,
 * errbacks, a chain or a chord). A task without is settled as before. */
int canvas_has_followups(const struct task_msg *m);

/* What a Python worker publishes after m succeeded with result (borrowed):
 * the callbacks (one: published alone; several: group-type ones each on its
 * own, then all the others as one new group), then the next chain step with the
 * rest of the chain. The result is prepended to each signature's args unless
 * it is immutable. parent_id is m's id, root_id m's root_id. Composite
 * signatures (group, chain, chord, chunks/xmap/xstarmap as plain tasks) are
 * applied as canvas.py applies them. The chord part-return of m itself is not
 * part of this plan (see canvas_chord_member()).
 * Returns 0, CR_EPROTO with err set for a signature Celery could not apply
 * either (not a dict, no task name, a bad option), or CR_ENOMEM. On error the
 * plan is released. */
int canvas_on_success(const struct task_msg *m, const cJSON *result,
                      const struct canvas_opts *o, struct canvas_plan *out,
                      struct cr_err *err);

/* What a Python worker does after m failed (not for a retry): fails holds
 * every later chain step that has options.task_id (a chord step without one
 * gives its body's task_id), in embed.chain order (the last step first, as
 * Celery walks it); parts the steps among them that carry options.chord; msgs
 * the errbacks published as one group with args [m's id] + their own args
 * (parent_id m's id). Same returns as above. */
int canvas_on_failure(const struct task_msg *m, const struct canvas_opts *o,
                      struct canvas_plan *out, struct cr_err *err);

/* The chord of m: its group id (header "group"), its group_index (-1 when
 * null: the member then sorts last, score +inf) and its body signature
 * (embed.chord, borrowed from m). 1 when m is a chord header member, else 0. */
struct canvas_chord {
    const char *group_id;
    long group_index;
    const cJSON *body;
};
int canvas_chord_of(const struct task_msg *m, struct canvas_chord *out);

/* The member m adds to the chord's sorted set: the JSON text of
 * [1, task_id, state, result] as Celery writes it (json.dumps), where result
 * is the return value for SUCCESS and the exception dict for FAILURE and
 * REVOKED. Appended to out; 0 or CR_ENOMEM. The same arguments always give
 * the same bytes (ZADD of a redelivery is then a no-op). */
int canvas_chord_member(const char *task_id, const char *state, const cJSON *result,
                        struct buf *out);

/* What the last header member m does once the chord is complete, given the
 * members of the sorted set in score order (each the JSON text of
 * canvas_chord_member()). When every member is SUCCESS: *failed is 0 and the
 * plan publishes the body with the list of results prepended to its args
 * (unless immutable), id = body options.task_id, parent_id = m's id, root_id =
 * m's root_id unless the body's options name their own (a chord launched by a
 * worker puts the launcher's ids there; Celery's send_task keeps them). When
 * one is FAILURE or REVOKED (the first in order): *failed is 1, *body_id the
 * body's id (new string, cr_free(); NULL when the body has none), exc the
 * ChordError dict to store for it
 * ({"exc_type": "ChordError", "exc_message": ["Dependency <id> raised
 * <repr>"], "exc_module": "celery.exceptions"}, new), and the plan publishes
 * the body's errbacks with args [body id] (parent and root: the body id, as
 * chord_error_from_stack's request has no root). <repr> is how Python prints
 * the exception rebuilt from the member's dict: ValueError('x'), E('a', 1),
 * E(). Any other state counts as a result (Celery never adds a RETRY).
 * CR_EPROTO for a member that is not such a list, CR_ENOMEM; on error nothing
 * is returned (*failed 0, *body_id and *exc NULL, plan released). */
int canvas_chord_join(const struct task_msg *m, const struct canvas_chord *c,
                      const char *const *members, const size_t *lens, size_t n,
                      const struct canvas_opts *o, struct canvas_plan *out, int *failed,
                      char **body_id, cJSON **exc, struct cr_err *err);

#endif
