/* followup.c -- a finished task's canvas plan, carried out durably.
 *
 * What a Python worker does after a task ends (celery/app/trace.py,
 * backends/base.py and redis.py), in an order that survives a crash at any
 * point, as a chain of steps each waiting for all of its completions:
 *
 *   SIZES   the .s key of every chord the plan launches (set_chord_size)
 *   MSGS    the plan's messages (callbacks, the chain's next step, errbacks),
 *           every one confirmed by the broker
 *           -> engine__settle_resume(): the dead letter, if any, then
 *   STORES  the FAILURE of later chain steps, then the job's own outcome
 *   PART    each chord part-return (the job's own chord; on failure also a
 *           later chain step's), one atomic script; when it completes the
 *           chord, the join's plan runs as JOIN_SIZES and JOIN_MSGS, the
 *           same work as SIZES and MSGS (the body, or the body's errbacks),
 *           then
 *   BODY    a failed chord's ChordError stored for the body id, then
 *   CLEAR   the chord's keys deleted
 *           -> engine__finish(): the ack.
 *
 * A failure of SIZES or MSGS (a nack, the broker away) lets the job go
 * unacked: nothing of the outcome is stored yet, so the redelivery runs the
 * task again and publishes again. Once the outcome is stored, a redelivery is
 * acked without running (check_job()); engine__followup_redo() first does its
 * part-returns again from the stored meta, where ZADD of the same member is a
 * no-op, so a crash between the store and the ack still completes the chord
 * and never publishes callbacks or the chain twice. No I/O: every effect goes
 * through engine_ops.
 *
 * The steps are enum fu_step (engine_int.h); fu_set_step() is the one place a
 * plan's step changes, and asserts that fu_next[] allows the move. */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "protocol/canvas.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/rand.h"
#include "util/uuid.h"

/* One part-return to do: member added to group_id's sorted set. */
struct fu_part {
    char *group_id;
    long group_index; /* -1: null */
    cJSON *body;      /* the chord's body signature (a copy) */
    struct buf member;
};

struct followup {
    struct canvas_plan plan; /* under way: its sizes, then its messages */
    enum fu_step step;       /* only fu_set_step() changes it */
    size_t waiting;          /* completions of the step still to come */
    /* a failure's exception and traceback, stored for plan.fails too */
    cJSON *exc;
    char *traceback;
    struct fu_part *parts;
    size_t nparts, cur;
    /* a failed join: the body's id and its ChordError */
    char *body_id;
    cJSON *body_exc;
};

static void step_done(struct job *j);
static void run_plan(struct job *j, int join);
static void next_part(struct job *j);

/* ------------------------------------------------------------- the steps */

const char *const engine__fu_step_names[FU_NSTEPS] = {
    [FU_NONE] = "NONE",           [FU_SIZES] = "SIZES", [FU_MSGS] = "MSGS",
    [FU_STORES] = "STORES",       [FU_PART] = "PART",   [FU_JOIN_SIZES] = "JOIN_SIZES",
    [FU_JOIN_MSGS] = "JOIN_MSGS", [FU_BODY] = "BODY",   [FU_CLEAR] = "CLEAR",
};

#define FU_BIT(s) (1u << (s))

/* Where each step may go. The own plan's steps come first, the outcome's
 * stores after them (NONE: the plan had nothing to send), then the
 * part-returns one after another (NONE: a redelivery's), each either done or
 * completing its chord, whose join's plan, ChordError and clear follow it. A
 * part-return refused goes on to the next part (PART to PART). */
static const unsigned fu_next[FU_NSTEPS] = {
    [FU_NONE] = FU_BIT(FU_SIZES) | FU_BIT(FU_MSGS) | FU_BIT(FU_STORES) | FU_BIT(FU_PART),
    [FU_SIZES] = FU_BIT(FU_MSGS) | FU_BIT(FU_STORES),
    [FU_MSGS] = FU_BIT(FU_STORES),
    [FU_STORES] = FU_BIT(FU_PART),
    [FU_PART] = FU_BIT(FU_PART) | FU_BIT(FU_JOIN_SIZES) | FU_BIT(FU_JOIN_MSGS) |
                FU_BIT(FU_BODY) | FU_BIT(FU_CLEAR),
    [FU_JOIN_SIZES] = FU_BIT(FU_JOIN_MSGS) | FU_BIT(FU_BODY) | FU_BIT(FU_CLEAR),
    [FU_JOIN_MSGS] = FU_BIT(FU_BODY) | FU_BIT(FU_CLEAR),
    [FU_BODY] = FU_BIT(FU_CLEAR),
    [FU_CLEAR] = FU_BIT(FU_PART),
};

int engine__fu_step_legal(enum fu_step a, enum fu_step b)
{
    if ((unsigned)a >= FU_NSTEPS || (unsigned)b >= FU_NSTEPS)
        return 0;
    return (fu_next[a] & FU_BIT(b)) != 0;
}

/* The one place a plan's step changes. */
static void fu_set_step(struct followup *fu, enum fu_step s)
{
    assert(engine__fu_step_legal(fu->step, s));
    fu->step = s;
}

enum fu_step engine__followup_step(const struct job *j)
{
    return j->fu ? j->fu->step : FU_NONE;
}

/* ------------------------------------------------------------- the plan */

static void seeded_uuid(char out[37], void *arg)
{
    struct engine *e = arg;
    unsigned char b[16];
    for (int i = 0; i < 16; i += 8) {
        /* the engine's jitter state, which retries draw from too */
        uint64_t x = cr_xorshift64(&e->seed);
        for (int k = 0; k < 8; k++)
            b[i + k] = (unsigned char)(x >> (8 * k));
    }
    cr_uuid4(b, out);
}

static void opts_of(struct engine *e, struct canvas_opts *o)
{
    const struct engine_config *cfg = e->cfg;
    memset(o, 0, sizeof(*o));
    o->hostname = cfg->hostname;
    o->default_queue =
        cfg->default_queue && cfg->default_queue[0] ? cfg->default_queue : "celery";
    o->routes = cfg->routes;
    o->nroutes = cfg->nroutes;
    o->now_us = e->now.epoch_us;
    o->new_uuid = cfg->new_uuid ? cfg->new_uuid : seeded_uuid;
    o->uuid_arg = cfg->new_uuid ? cfg->uuid_arg : e;
}

static struct followup *fu_of(struct job *j)
{
    if (!j->fu && (j->fu = cr_calloc(1, sizeof(*j->fu))) != NULL)
        canvas_plan_init(&j->fu->plan);
    return j->fu;
}

static void release_parts(struct followup *fu)
{
    for (size_t i = 0; i < fu->nparts; i++) {
        cr_free(fu->parts[i].group_id);
        cJSON_Delete(fu->parts[i].body);
        buf_release(&fu->parts[i].member);
    }
    cr_free(fu->parts);
    fu->parts = NULL;
    fu->nparts = fu->cur = 0;
}

void engine__followup_free(struct job *j)
{
    struct followup *fu = j->fu;
    if (!fu)
        return;
    canvas_plan_release(&fu->plan);
    release_parts(fu);
    cJSON_Delete(fu->exc);
    cr_free(fu->traceback);
    cr_free(fu->body_id);
    cJSON_Delete(fu->body_exc);
    cr_free(fu);
    j->fu = NULL;
}

/* A job whose message asked for follow-ups that come to nothing (an errback
 * after a success, a plan dropped) goes the plain way. */
static void drop_if_empty(struct job *j)
{
    struct followup *fu = j->fu;
    if (fu && !fu->plan.nsizes && !fu->plan.nmsgs && !fu->plan.nfails && !fu->nparts)
        engine__followup_free(j);
}

/* Adds the part-return of task_id (state, result borrowed) to the chord
 * (group_id, group_index, body). 0 or CR_ENOMEM. */
static int add_part(struct followup *fu, const char *task_id, const char *group_id,
                    long group_index, const cJSON *body, const char *state,
                    const cJSON *result)
{
    struct fu_part *p = cr_realloc(fu->parts, (fu->nparts + 1) * sizeof(*p));
    if (!p)
        return CR_ENOMEM;
    fu->parts = p;
    p += fu->nparts;
    memset(p, 0, sizeof(*p));
    buf_init(&p->member);
    p->group_index = group_index;
    p->group_id = cr_strdup(group_id);
    p->body = body ? cJSON_Duplicate(body, 1) : cJSON_CreateNull();
    fu->nparts++; /* released with the others from here */
    if (!p->group_id || !p->body ||
        canvas_chord_member(task_id, state, result, &p->member))
        return CR_ENOMEM;
    return 0;
}

/* The job's own chord, if it is a header member. 0 or CR_ENOMEM. */
static int add_own_part(struct job *j, const char *state, const cJSON *result)
{
    struct canvas_chord ch;
    if (!canvas_chord_of(&j->tm, &ch))
        return 0;
    return add_part(j->fu, j->tm.id, ch.group_id, ch.group_index, ch.body, state, result);
}

static void plan_error(struct job *j, const struct cr_err *err)
{
    LOG(LOG_ERROR,
        "Task %s[%s]: cannot apply its canvas follow-ups: %s; they are dropped (its "
        "own result is stored all the same)",
        job_name(j), j->tm.id, err->msg[0] ? err->msg : "bad signature");
}

static void out_of_memory(struct job *j)
{
    LOG(LOG_ERROR,
        "Task %s[%s]: out of memory for its canvas follow-ups; leaving the message "
        "unacked",
        job_name(j), j->tm.id);
    engine__abandon(j);
}

int engine__followup_success(struct job *j, const cJSON *result)
{
    struct canvas_opts o;
    struct cr_err err;
    int rc;

    if (!j->tm.id || !canvas_has_followups(&j->tm))
        return 0;
    if (!fu_of(j)) {
        out_of_memory(j);
        return CR_ENOMEM;
    }
    opts_of(j->e, &o);
    memset(&err, 0, sizeof(err));
    rc = canvas_on_success(&j->tm, result, &o, &j->fu->plan, &err);
    if (rc && rc != CR_ENOMEM)
        plan_error(j, &err);
    if (rc == CR_ENOMEM || add_own_part(j, "SUCCESS", result)) {
        out_of_memory(j);
        return CR_ENOMEM;
    }
    drop_if_empty(j);
    return 0;
}

void engine__followup_failure(struct job *j, const char *exc_type, const char *exc_module,
                              const char *message)
{
    struct followup *fu;
    struct canvas_opts o;
    struct cr_err err;
    struct buf tb;
    int rc;

    if (!canvas_has_followups(&j->tm))
        return;
    if (!(fu = fu_of(j)))
        goto oom;
    fu->exc = result_exc_new(exc_type, exc_module, message);
    buf_init(&tb);
    rc = result_traceback(&tb, j->tm.task, exc_module, exc_type, message);
    fu->traceback = buf_detach(&tb);
    if (!fu->exc || rc || !fu->traceback)
        goto oom;
    opts_of(j->e, &o);
    memset(&err, 0, sizeof(err));
    rc = canvas_on_failure(&j->tm, &o, &fu->plan, &err);
    if (rc == CR_ENOMEM)
        goto oom;
    if (rc)
        plan_error(j, &err);
    /* Celery's order: the task's own chord, then the chain's. */
    if (add_own_part(j, "FAILURE", fu->exc))
        goto oom;
    for (size_t i = 0; i < fu->plan.nparts; i++) {
        const struct canvas_chord_part *cp = &fu->plan.parts[i];
        if (add_part(fu, cp->task_id, cp->group_id, cp->group_index, cp->body, "FAILURE",
                     fu->exc))
            goto oom;
    }
    drop_if_empty(j);
    return;
oom:
    /* The failure is stored all the same; what follows it is lost. */
    LOG(LOG_ERROR, "Task %s[%s]: out of memory for its canvas follow-ups; dropping them",
        job_name(j), j->tm.id);
    engine__followup_free(j);
}

void engine__followup_revoked(struct job *j, const cJSON *exc)
{
    struct canvas_chord ch;
    /* As Celery's mark_as_revoked: the chord part-return, nothing else. */
    if (!j->tm.id || !canvas_chord_of(&j->tm, &ch))
        return;
    if (!exc || !fu_of(j) || add_own_part(j, "REVOKED", exc)) {
        LOG(LOG_ERROR, "Task %s[%s]: out of memory for its chord part-return",
            job_name(j), j->tm.id);
        engine__followup_free(j);
    }
}

/* --------------------------------------------------------------- steps */

/* A step's completion failed (or could not be asked for): what the outcome
 * still lacks would be lost by an ack, so the job lets its message go to come
 * back -- unless it does not come back (acked early), and then the job goes
 * on without it. 1 when it goes on. */
static int go_on_without(struct job *j, const char *what)
{
    if (j->e->shutdown == 2 || engine__comes_back(j)) {
        LOG(LOG_ERROR, "Task %s[%s]: %s; leaving the message unacked to run again",
            job_name(j), j->tm.id, what);
        engine__abandon(j);
        return 0;
    }
    LOG(LOG_ERROR, "Task %s[%s]: %s, and its message was acked early: going on without",
        job_name(j), j->tm.id, what);
    return 1;
}

/* One completion of the step is back. */
static void one_back(struct job *j)
{
    struct followup *fu = j->fu;
    if (fu->waiting && --fu->waiting == 0)
        step_done(j);
}

static void send_sizes(struct job *j, int join)
{
    struct followup *fu = j->fu;
    struct engine *e = j->e;
    fu_set_step(fu, join ? FU_JOIN_SIZES : FU_SIZES);
    fu->waiting = 0;
    for (size_t i = 0; i < fu->plan.nsizes; i++) {
        struct engine_chord_cmd c;
        memset(&c, 0, sizeof(c));
        c.op = ENGINE_CHORD_SIZE;
        c.group_id = fu->plan.sizes[i].group_id;
        c.size = fu->plan.sizes[i].size;
        if (e->ops->chord(e->ctx, j, &c) == 0) {
            j->pending++;
            fu->waiting++;
        } else if (!go_on_without(j, "cannot set the size of a chord it launches")) {
            return;
        }
    }
    if (fu->waiting == 0)
        step_done(j);
}

static int publish_msg(struct job *j, const struct canvas_msg *m)
{
    struct outbound o;
    memset(&o, 0, sizeof(o));
    o.exchange = m->exchange ? m->exchange : "";
    o.routing_key = m->routing_key ? m->routing_key : "";
    o.content_type = "application/json";
    o.content_encoding = "utf-8";
    o.correlation_id = m->id;
    o.reply_to = m->reply_to;
    o.delivery_mode = 2;
    o.priority = m->priority;
    if (j->e->ops->outbound_headers && m->headers)
        j->e->ops->outbound_headers(j->e->ctx, j, m->headers);
    o.headers = m->headers;
    o.body = m->body.data ? m->body.data : "";
    o.body_len = m->body.len;
    o.expiration = m->expiration;
    LOG(LOG_DEBUG, "Task %s[%s]: publishing %s[%s] to '%s' key '%s'", job_name(j),
        j->tm.id, m->task ? m->task : "?", m->id ? m->id : "?", o.exchange,
        o.routing_key);
    return engine__publish(j, &o, PUBLISH_FOLLOWUP);
}

static void send_msgs(struct job *j, int join)
{
    struct followup *fu = j->fu;
    fu_set_step(fu, join ? FU_JOIN_MSGS : FU_MSGS);
    fu->waiting = 0;
    for (size_t i = 0; i < fu->plan.nmsgs; i++) {
        int rc = publish_msg(j, &fu->plan.msgs[i]);
        if (rc == 0)
            fu->waiting++;
        else if (!go_on_without(j, rc == CR_EBROKER ? "cannot publish a follow-up now "
                                                      "(broker away)"
                                                    : "cannot publish a follow-up"))
            return;
    }
    if (fu->waiting == 0)
        step_done(j);
}

/* The plan in j->fu: the job's own (join 0), or a join's. */
static void run_plan(struct job *j, int join)
{
    if (j->fu->plan.nsizes)
        send_sizes(j, join);
    else
        send_msgs(j, join);
}

int engine__followup_publish(struct job *j)
{
    struct followup *fu = j->fu;
    if (!fu || (!fu->plan.nsizes && !fu->plan.nmsgs))
        return 0;
    run_plan(j, 0);
    return 1;
}

/* A meta for task_id, not the job's own (a later chain step, a chord body). */
static char *other_meta(struct job *j, const char *task_id, const cJSON *exc,
                        const char *traceback)
{
    struct result_meta rm;
    memset(&rm, 0, sizeof(rm));
    rm.task_id = task_id;
    rm.status = "FAILURE";
    rm.result = exc;
    rm.traceback = traceback;
    rm.date_done_us = j->e->now.epoch_us;
    return result_meta_encode(&rm);
}

/* Stores meta for task_id; 0 when its completion is pending. */
static int store_for(struct job *j, const char *task_id, char *meta)
{
    struct engine *e = j->e;
    if (!meta || e->ops->store_for(e->ctx, j, task_id, meta, strlen(meta)))
        return CR_ENOMEM;
    j->pending++;
    j->fu->waiting++;
    return 0;
}

void engine__followup_store(struct job *j)
{
    struct followup *fu = j->fu;
    fu_set_step(fu, FU_STORES);
    fu->waiting = 0;
    /* The later steps first: Redis runs one connection's commands in order,
     * so once the job's own FAILURE is in (what a redelivery trusts), theirs
     * are too. Not for ignore_result, as in Celery. */
    for (size_t i = 0; j->tm.ignore_result != 1 && i < fu->plan.nfails; i++) {
        if (store_for(j, fu->plan.fails[i],
                      other_meta(j, fu->plan.fails[i], fu->exc, fu->traceback))) {
            out_of_memory(j);
            return;
        }
    }
    /* Sent and built once: the messages and ids are not needed any more. */
    canvas_plan_release(&fu->plan);
    canvas_plan_init(&fu->plan);
    if (j->meta && j->tm.id) {
        if (engine__store_final(j)) {
            out_of_memory(j);
            return;
        }
        fu->waiting++;
    }
    if (fu->waiting == 0)
        step_done(j);
}

void engine__followup_stored(struct job *j)
{
    one_back(j);
}

void engine__followup_confirmed(struct job *j, int ok)
{
    if (j->state == JOB_DONE || !j->fu) {
        engine__unref(j);
        return;
    }
    if (!ok && !go_on_without(j, "a follow-up publish was not confirmed"))
        return;
    one_back(j);
}

/* ------------------------------------------------------------- chords */

static void send_part(struct job *j)
{
    struct followup *fu = j->fu;
    struct fu_part *p = &fu->parts[fu->cur];
    struct engine *e = j->e;
    struct engine_chord_cmd c;

    memset(&c, 0, sizeof(c));
    c.op = ENGINE_CHORD_PART;
    c.group_id = p->group_id;
    c.group_index = p->group_index;
    c.member = p->member.data;
    c.member_len = p->member.len;
    c.task_id = j->tm.id;
    fu_set_step(fu, FU_PART);
    fu->waiting = 1;
    if (e->ops->chord(e->ctx, j, &c) == 0) {
        j->pending++;
        return;
    }
    fu->waiting = 0;
    if (go_on_without(j, "cannot do its chord part-return")) {
        fu->cur++;
        next_part(j);
    }
}

static void send_clear(struct job *j)
{
    struct followup *fu = j->fu;
    struct engine *e = j->e;
    struct engine_chord_cmd c;

    memset(&c, 0, sizeof(c));
    c.op = ENGINE_CHORD_CLEAR;
    c.group_id = fu->parts[fu->cur].group_id;
    fu_set_step(fu, FU_CLEAR);
    fu->waiting = 1;
    if (e->ops->chord(e->ctx, j, &c) == 0) {
        j->pending++;
        return;
    }
    /* The body is out: acking is right; the keys expire. */
    LOG(LOG_ERROR, "Task %s[%s]: cannot delete the keys of chord %s; they will expire",
        job_name(j), j->tm.id, c.group_id);
    fu->waiting = 0;
    step_done(j);
}

/* A failed join: its errbacks are out, now the body's ChordError. */
static void send_body_failure(struct job *j)
{
    struct followup *fu = j->fu;
    const cJSON *msg = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(fu->body_exc, "exc_message"), 0);
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(fu->parts[fu->cur].body, "task");
    struct buf tb;
    char *meta;

    fu_set_step(fu, FU_BODY);
    fu->waiting = 0;
    buf_init(&tb);
    if (result_traceback(&tb, cJSON_IsString(task) ? task->valuestring : NULL,
                         "celery.exceptions", "ChordError",
                         cJSON_IsString(msg) ? msg->valuestring : NULL) == 0) {
        meta = other_meta(j, fu->body_id, fu->body_exc, tb.data);
        if (store_for(j, fu->body_id, meta) == 0) {
            buf_release(&tb);
            return;
        }
    }
    buf_release(&tb);
    out_of_memory(j);
}

/* The join's plan is carried out. */
static void joined(struct job *j)
{
    struct followup *fu = j->fu;
    canvas_plan_release(&fu->plan);
    canvas_plan_init(&fu->plan);
    if (fu->body_id && fu->body_exc)
        send_body_failure(j);
    else
        send_clear(j);
}

/* The body's id, from its options, for a join that cannot even be read. */
static char *body_id_of(const cJSON *body)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(body, "options"), "task_id");
    return cJSON_IsString(id) ? cr_strdup(id->valuestring) : NULL;
}

/* parts[cur] completed its chord: members are its results in order. */
static void join(struct job *j, const char *const *members, const size_t *lens, size_t n)
{
    struct followup *fu = j->fu;
    struct fu_part *p = &fu->parts[fu->cur];
    struct canvas_chord c = {p->group_id, p->group_index, p->body};
    struct canvas_opts o;
    struct cr_err err;
    int failed = 0, rc;

    opts_of(j->e, &o);
    memset(&err, 0, sizeof(err));
    cr_free(fu->body_id);
    cJSON_Delete(fu->body_exc);
    fu->body_id = NULL;
    fu->body_exc = NULL;
    rc = canvas_chord_join(&j->tm, &c, members, lens, n, &o, &fu->plan, &failed,
                           &fu->body_id, &fu->body_exc, &err);
    if (rc == CR_ENOMEM) {
        out_of_memory(j);
        return;
    }
    if (rc) {
        /* Celery's "Join error": the body fails, the keys go. */
        char msg[300];
        LOG(LOG_ERROR, "Chord %s cannot be joined: %s", p->group_id, err.msg);
        snprintf(msg, sizeof(msg), "Join error: %s", err.msg);
        fu->body_id = body_id_of(p->body);
        fu->body_exc = result_exc_new("ChordError", "celery.exceptions", msg);
        if (!fu->body_exc) {
            out_of_memory(j);
            return;
        }
    } else if (failed) {
        const cJSON *m = cJSON_GetArrayItem(
            cJSON_GetObjectItemCaseSensitive(fu->body_exc, "exc_message"), 0);
        LOG(LOG_ERROR, "Chord %s raised: ChordError('%s')", p->group_id,
            cJSON_IsString(m) ? m->valuestring : "?");
    } else {
        LOG(LOG_INFO, "Chord %s complete (%zu results): publishing its body", p->group_id,
            n);
    }
    if (fu->plan.nsizes || fu->plan.nmsgs)
        run_plan(j, 1);
    else
        joined(j);
}

/* The part-returns, one after another, then the ack. */
static void next_part(struct job *j)
{
    struct followup *fu = j->fu;
    if (fu->cur < fu->nparts)
        send_part(j);
    else
        engine__finish(j);
}

static void step_done(struct job *j)
{
    struct followup *fu = j->fu;
    switch (fu->step) {
    case FU_SIZES:
        if (fu->plan.nmsgs) {
            send_msgs(j, 0);
            break;
        }
        /* fall through */
    case FU_MSGS:
        engine__settle_resume(j);
        break;
    case FU_JOIN_SIZES:
        if (fu->plan.nmsgs) {
            send_msgs(j, 1);
            break;
        }
        /* fall through */
    case FU_JOIN_MSGS:
        joined(j);
        break;
    case FU_STORES:
        fu->cur = 0;
        next_part(j);
        break;
    case FU_BODY:
        send_clear(j);
        break;
    case FU_CLEAR:
        fu->cur++;
        next_part(j);
        break;
    case FU_PART: /* answered through engine_on_chord() */
    case FU_NONE:
        break;
    }
}

void engine_on_chord(struct engine *e, struct engine_now now, struct job *j,
                     enum engine_chord_op op, int status, const char *const *members,
                     const size_t *lens, size_t n)
{
    engine__enter(e, now);
    j->pending--;
    if (j->state == JOB_DONE || !j->fu) {
        engine__unref(j);
    } else if (op == ENGINE_CHORD_SIZE) {
        if (status == 0 || go_on_without(j, "cannot set the size of a chord it launches"))
            one_back(j);
    } else if (op == ENGINE_CHORD_PART) {
        j->fu->waiting = 0;
        if (status) {
            if (go_on_without(j, "chord part-return failed")) {
                j->fu->cur++;
                next_part(j);
            }
        } else if (members) {
            join(j, members, lens, n);
        } else {
            j->fu->cur++;
            next_part(j);
        }
    } else {
        if (status)
            LOG(LOG_ERROR,
                "Task %s[%s]: cannot delete the keys of a joined chord; "
                "they will expire",
                job_name(j), j->tm.id);
        one_back(j);
    }
    engine__leave(e);
}

/* ---------------------------------------------------------- redelivery */

int engine__followup_redo(struct job *j, const char *st, const char *value, size_t len)
{
    struct canvas_chord ch;
    struct canvas_plan plan;
    struct canvas_opts o;
    struct cr_err err;
    const cJSON *result;
    cJSON *meta = NULL;
    int failure = !strcmp(st, "FAILURE"), own;

    own = j->tm.id && canvas_chord_of(&j->tm, &ch);
    if (!value || !j->tm.id || (!own && !(failure && canvas_has_followups(&j->tm))))
        return 0;
    memset(&err, 0, sizeof(err));
    if (py_json_parse(value, len, &meta, &err) == CR_ENOMEM)
        goto oom;
    if (!meta) {
        LOG(LOG_ERROR, "Task %s[%s]: cannot read its stored meta again: %s", job_name(j),
            j->tm.id, err.msg);
        return 0;
    }
    /* The member as first added: the stored result is the one it was made of. */
    result = cJSON_GetObjectItemCaseSensitive(meta, "result");
    if (!fu_of(j) || (own && add_part(j->fu, j->tm.id, ch.group_id, ch.group_index,
                                      ch.body, st, result)))
        goto oom;
    if (failure) {
        /* Only the chain steps' part-returns: their FAILURE went in before
         * ours, the errbacks were confirmed before that. */
        opts_of(j->e, &o);
        canvas_plan_init(&plan);
        if (canvas_on_failure(&j->tm, &o, &plan, &err) == CR_ENOMEM)
            goto oom;
        for (size_t i = 0; i < plan.nparts; i++) {
            const struct canvas_chord_part *cp = &plan.parts[i];
            if (add_part(j->fu, cp->task_id, cp->group_id, cp->group_index, cp->body,
                         "FAILURE", result)) {
                canvas_plan_release(&plan);
                goto oom;
            }
        }
        canvas_plan_release(&plan);
    }
    cJSON_Delete(meta);
    if (!j->fu->nparts) {
        engine__followup_free(j);
        return 0;
    }
    LOG(LOG_INFO, "Task %s[%s]: doing its chord part-return again", job_name(j),
        j->tm.id);
    job_set_state(j, JOB_SETTLING);
    j->fu->cur = 0;
    next_part(j);
    return 1;
oom:
    cJSON_Delete(meta);
    out_of_memory(j);
    return 1;
}
