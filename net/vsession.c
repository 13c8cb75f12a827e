/* vsession.c -- a virtual transport's bookkeeping (vsession.h).
 *
 * Every mode is one enum with one setter (set_*()), which traces the change
 * at debug level; the names tables below are kept in the enums' order. */
#include "vsession.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"
#include "util/log.h"
#include "util/replay.h"
#include "util/strmap.h"

struct vsession {
    struct vsession_config cfg;
    const struct vsession_ops *ops;
    void *ctx;

    enum vsession_state state;
    enum vsession_pop pop;
    enum vsession_script script;
    enum vsession_block block;
    enum vsession_acks acks_state;
    enum vsession_round round;
    enum vsession_again again;

    /* the window */
    long prefetch;
    long nheld;    /* copies held */
    long reserved; /* room given to batch calls in flight */
    int calls_out; /* batch calls in flight */
    int script_fails;
    uint64_t script_retry_at;
    uint64_t pause_until;

    /* records, by tag, and newest first */
    struct strmap recs;
    struct vsession_rec *head;
    int records_pending; /* a POPPED record waits to be written again */

    /* acks not yet sent (tags owned) */
    char **acks;
    size_t nacks, capacks;
    uint64_t acks_hold_until;
    int ack_refusals;
    struct replay acked; /* acks confirmed lately: see util/replay.h */

    uint64_t lease_due, restore_due;
    int round_jobs; /* the round's restores in flight (+1 while they start) */

    /* lost pop calls' scores, oldest first */
    char lost[VSESSION_LOST_MAX][VSESSION_SCORE_MAX];
    int nlost;
    uint64_t again_at;
};

/* ------------------------------------------------------------ names */

static const char *const state_names[VSESSION_NSTATES] = {"CONSUMING", "STOPPED",
                                                          "DRAINING", "CLOSED"};
static const char *const pop_names[VSESSION_POP_NSTATES] = {"WARM", "COLD"};
static const char *const script_names[VSESSION_SCRIPT_NSTATES] = {"ON", "FAILING", "OFF"};
static const char *const block_names[VSESSION_BLOCK_NSTATES] = {"IDLE", "OUT", "PAUSED"};
static const char *const acks_names[VSESSION_ACKS_NSTATES] = {"OPEN", "REFUSED"};
static const char *const round_names[VSESSION_ROUND_NSTATES] = {"IDLE", "LOCKING",
                                                                "SCANNING", "RESTORING"};
static const char *const rec_names[VSESSION_REC_NSTATES] = {"POPPED", "RECORDING", "HELD",
                                                            "UNTRACKED"};
static const char *const again_names[VSESSION_AGAIN_NSTATES] = {"NONE", "DUE"};

#define NAME(table, n, v) ((unsigned)(v) < (n) ? (table)[v] : "?")

const char *vsession_state_name(enum vsession_state st)
{
    return NAME(state_names, VSESSION_NSTATES, st);
}

const char *vsession_pop_name(enum vsession_pop st)
{
    return NAME(pop_names, VSESSION_POP_NSTATES, st);
}

const char *vsession_script_name(enum vsession_script st)
{
    return NAME(script_names, VSESSION_SCRIPT_NSTATES, st);
}

const char *vsession_block_name(enum vsession_block st)
{
    return NAME(block_names, VSESSION_BLOCK_NSTATES, st);
}

const char *vsession_acks_name(enum vsession_acks st)
{
    return NAME(acks_names, VSESSION_ACKS_NSTATES, st);
}

const char *vsession_round_name(enum vsession_round st)
{
    return NAME(round_names, VSESSION_ROUND_NSTATES, st);
}

const char *vsession_rec_name(enum vsession_rec_state st)
{
    return NAME(rec_names, VSESSION_REC_NSTATES, st);
}

const char *vsession_again_name(enum vsession_again st)
{
    return NAME(again_names, VSESSION_AGAIN_NSTATES, st);
}

/* ------------------------------------------------------------ setters */

static void set_state(struct vsession *s, enum vsession_state st)
{
    if (s->state != st)
        LOG(LOG_DEBUG, "session: -> [%s]", vsession_state_name(st));
    s->state = st;
}

static void set_pop(struct vsession *s, enum vsession_pop st)
{
    if (s->pop != st)
        LOG(LOG_DEBUG, "session: pop -> [%s]", vsession_pop_name(st));
    s->pop = st;
}

/* The script state follows the refusals in a row; OFF sets its retry time. */
static void set_script(struct vsession *s, int fails, uint64_t now)
{
    enum vsession_script st = fails == 0                    ? VSESSION_SCRIPT_ON
                              : fails < s->cfg.script_tries ? VSESSION_SCRIPT_FAILING
                                                            : VSESSION_SCRIPT_OFF;
    if (s->script != st)
        LOG(LOG_DEBUG, "session: script -> [%s]", vsession_script_name(st));
    s->script = st;
    s->script_fails = fails;
    if (st == VSESSION_SCRIPT_OFF)
        s->script_retry_at = now + s->cfg.script_retry_ms;
}

static void set_block(struct vsession *s, enum vsession_block st, uint64_t now)
{
    if (s->block != st)
        LOG(LOG_DEBUG, "session: blocking pop -> [%s]", vsession_block_name(st));
    s->block = st;
    if (st == VSESSION_BLOCK_PAUSED)
        s->pause_until = now + s->cfg.pause_ms;
}

static void set_acks(struct vsession *s, enum vsession_acks st, uint64_t now)
{
    if (s->acks_state != st)
        LOG(LOG_DEBUG, "session: acks -> [%s]", vsession_acks_name(st));
    s->acks_state = st;
    if (st == VSESSION_ACKS_REFUSED)
        s->acks_hold_until = now + s->cfg.retry_ms;
}

static void set_round(struct vsession *s, enum vsession_round st)
{
    if (s->round != st)
        LOG(LOG_DEBUG, "session: restore round -> [%s]", vsession_round_name(st));
    s->round = st;
}

/* DUE sets the time; a later refusal moves it on. */
static void set_again(struct vsession *s, enum vsession_again st, uint64_t now)
{
    if (s->again != st)
        LOG(LOG_DEBUG, "session: refused for now -> [%s]", vsession_again_name(st));
    s->again = st;
    if (st == VSESSION_AGAIN_DUE)
        s->again_at = now + s->cfg.retry_ms;
}

static void set_rec(struct vsession_rec *r, enum vsession_rec_state st)
{
    if (r->state != st)
        LOG(LOG_DEBUG, "session: record %s -> [%s]", r->tag, vsession_rec_name(st));
    r->state = st;
}

/* ------------------------------------------------------------ lifecycle */

/* Redis's values, measured there.
 *
 * Messages per batch call, at most (within the prefetch room), and calls in
 * flight at once, so that Redis pops the next batches while we take in the
 * last; more of both, and each reply read whole (ops->pop_wide), while the
 * window has wide_room free or more. A wide window then fills in a few loop
 * turns, as RabbitMQ fills it: with 64, two calls and 16 KB read per turn, a
 * turn long with finished calls took in a few dozen messages, and 10,000
 * one-second calls took 1.2x AMQP's time. A narrow window turns over
 * quickly, and there small calls whose replies come in a piece a turn,
 * interleaved with the result writes on the same Redis, keep Redis and the
 * worker busy at once: the wide settings cost it a third of its dispatch
 * rate (docs/benchmarks.md).
 *
 * script_tries: batch call refusals in a row after which the blocking pop
 * goes alone for script_retry_ms (a server without scripting, or one that
 * refuses it). pause_ms: a refused blocking pop waits this long before the
 * next. restore_ms: restore rounds of dead workers' records, at start and
 * then this often (a Python worker scans every ~100 s). ack_batch_max: tags
 * per ack or lease command. The replay keeps the acks of the last 10 s, at
 * most 4096 of them. */
void vsession_config_default(struct vsession_config *c)
{
    memset(c, 0, sizeof(*c));
    c->ack_emulation = 1;
    c->lease_ms = 60000;
    c->restore_ms = 60000;
    c->retry_ms = 250;
    c->batch = 64;
    c->calls = 2;
    c->wide_room = 1024;
    c->wide_batch = 256;
    c->wide_calls = 4;
    c->script_tries = 10;
    c->script_retry_ms = 60000;
    c->pause_ms = 1000;
    c->ack_batch_max = 512;
    c->replay_max = 4096;
    c->replay_ms = 10000;
}

struct vsession *vsession_new(const struct vsession_config *cfg,
                              const struct vsession_ops *ops, void *ctx)
{
    struct vsession *s = cr_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->cfg = *cfg;
    if (s->cfg.ack_batch_max < 1)
        s->cfg.ack_batch_max = 1;
    s->ops = ops;
    s->ctx = ctx;
    s->prefetch = cfg->prefetch < 0 ? 0 : cfg->prefetch;
    strmap_init(&s->recs);
    replay_init(&s->acked, cfg->replay_max, 0, cfg->replay_ms);
    return s;
}

static void rec_free(struct vsession_rec *r)
{
    cr_free(r->tag);
    cr_free(r);
}

static void rec_unlink(struct vsession *s, struct vsession_rec *r)
{
    strmap_del(&s->recs, r->tag);
    if (r->prev)
        r->prev->next = r->next;
    else
        s->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

void vsession_free(struct vsession *s)
{
    if (!s)
        return;
    set_state(s, VSESSION_CLOSED);
    while (s->head) {
        struct vsession_rec *r = s->head;
        rec_unlink(s, r);
        if (r->data)
            s->ops->release(s->ctx, r->data);
        rec_free(r);
    }
    strmap_release(&s->recs);
    for (size_t i = 0; i < s->nacks; i++)
        cr_free(s->acks[i]);
    cr_free(s->acks);
    replay_release(&s->acked);
    cr_free(s);
}

/* ------------------------------------------------------------ the window */

long vsession_room(const struct vsession *s)
{
    long r;
    if (s->prefetch <= 0)
        return LONG_MAX;
    r = s->prefetch - s->nheld - s->reserved;
    return r > 0 ? r : 0;
}

static int up(const struct vsession *s, enum vsession_link l)
{
    return s->ops->link_up(s->ctx, l);
}

/* Batch calls of at most cap messages, within the room, until calls are in
 * flight or the owner sends none. */
static void send_batches(struct vsession *s, long cap, long calls, int wide)
{
    while (s->calls_out < calls && vsession_room(s) > 0) {
        long room = vsession_room(s);
        long max = room < cap ? room : cap;
        if (s->ops->pop_batch(s->ctx, max, wide))
            break;
        s->calls_out++;
        s->reserved += max;
    }
}

/* Pops while there is room: batch calls while messages keep coming, one
 * blocking pop (alone on its link) once a call found the queues dry, and
 * batch calls again as soon as the blocking pop brings one. */
static void maybe_pop(struct vsession *s, uint64_t now)
{
    int consuming = s->state == VSESSION_CONSUMING;
    if (s->block == VSESSION_BLOCK_PAUSED && now >= s->pause_until)
        set_block(s, VSESSION_BLOCK_IDLE, now);
    if (s->state == VSESSION_CLOSED || s->block != VSESSION_BLOCK_IDLE ||
        !up(s, VSESSION_LINK_POP) || !up(s, VSESSION_LINK_STORE))
        return;
    if (s->cfg.long_polls) {
        /* each call waits for messages itself: no blocking pop, ever */
        if (consuming)
            send_batches(s, s->cfg.batch, s->cfg.calls, 0);
        return;
    }
    if (s->pop == VSESSION_POP_WARM && consuming &&
        (s->script != VSESSION_SCRIPT_OFF || now >= s->script_retry_at)) {
        int wide = vsession_room(s) >= s->cfg.wide_room;
        s->ops->pop_wide(s->ctx, wide);
        send_batches(s, wide ? s->cfg.wide_batch : s->cfg.batch,
                     wide ? s->cfg.wide_calls : s->cfg.calls, wide);
    }
    if (s->calls_out)
        return; /* their replies decide what comes next */
    if (s->ops->pop_block(s->ctx, consuming && vsession_room(s) > 0) == 0)
        set_block(s, VSESSION_BLOCK_OUT, now);
}

void vsession_on_batch(struct vsession *s, long asked, enum vsession_reply rep,
                       uint64_t now)
{
    s->calls_out--;
    s->reserved -= asked;
    if (s->cfg.long_polls)
        return; /* a refused long poll is the owner's to pause */
    switch (rep) {
    case VSESSION_OK:
        set_script(s, 0, now);
        break;
    case VSESSION_NOSCRIPT:
        /* loaded again by the next call (and counted: a server that refuses
         * SCRIPT LOAD says NOSCRIPT for ever) */
        set_script(s, s->script_fails + 1, now);
        break;
    case VSESSION_REFUSED:
        set_pop(s, VSESSION_POP_COLD);
        set_script(s, s->script_fails + 1, now);
        break;
    default:
        break; /* lost, cancelled or unreadable: the owner's */
    }
}

void vsession_on_batch_end(struct vsession *s, long asked, long got, int cut)
{
    if (got < asked && !cut && !s->cfg.long_polls)
        set_pop(s, VSESSION_POP_COLD); /* the queues ran dry: a blocking pop next */
}

void vsession_on_block(struct vsession *s, enum vsession_reply rep, int popped,
                       uint64_t now)
{
    if (s->block == VSESSION_BLOCK_OUT)
        set_block(s, VSESSION_BLOCK_IDLE, now);
    if (rep == VSESSION_REFUSED)
        set_block(s, VSESSION_BLOCK_PAUSED, now);
    else if (rep == VSESSION_OK && popped)
        set_pop(s, VSESSION_POP_WARM); /* messages again: batches take the rest */
}

/* ------------------------------------------------------------ records */

static void send_record(struct vsession *s, struct vsession_rec *r)
{
    set_rec(r, s->ops->record(s->ctx, r) ? VSESSION_REC_POPPED : VSESSION_REC_RECORDING);
}

static void send_pending_records(struct vsession *s)
{
    s->records_pending = 0;
    for (struct vsession_rec *r = s->head; r; r = r->next)
        if (r->state == VSESSION_REC_POPPED)
            send_record(s, r);
}

int vsession_hold(struct vsession *s, const char *tag, void *data, int recorded)
{
    struct vsession_rec *r = strmap_get(&s->recs, tag);
    if (r) {
        /* A copy of a message we hold (a peer restored it): one record. */
        r->copies++;
        s->nheld++;
        return 1;
    }
    r = cr_calloc(1, sizeof(*r));
    if (!r)
        return CR_ENOMEM;
    r->tag = cr_strdup(tag);
    if (!r->tag || strmap_put(&s->recs, r->tag, r)) {
        rec_free(r);
        return CR_ENOMEM;
    }
    r->data = data;
    r->copies = 1;
    r->next = s->head;
    if (r->next)
        r->next->prev = r;
    s->head = r;
    s->nheld++;
    if (recorded)
        r->state = VSESSION_REC_HELD;
    else if (!s->cfg.ack_emulation)
        r->state = VSESSION_REC_UNTRACKED;
    else
        send_record(s, r);
    return 0;
}

struct vsession_rec *vsession_on_recorded(struct vsession *s, const char *tag,
                                          enum vsession_reply rep)
{
    struct vsession_rec *r = strmap_get(&s->recs, tag);
    if (!r || r->state != VSESSION_REC_RECORDING || rep == VSESSION_CANCELED)
        return NULL;
    if (rep == VSESSION_OK) {
        set_rec(r, VSESSION_REC_HELD);
    } else {
        /* written again on the next tick, or once the store is back */
        set_rec(r, VSESSION_REC_POPPED);
        s->records_pending = 1;
    }
    return r;
}

/* Settles one copy: returns the record when it was the last (unlinked; the
 * caller disposes of it), else NULL. */
static struct vsession_rec *settle(struct vsession *s, const char *tag)
{
    struct vsession_rec *r = strmap_get(&s->recs, tag);
    if (!r)
        return NULL;
    s->nheld--;
    if (--r->copies > 0)
        return NULL;
    rec_unlink(s, r);
    return r;
}

int vsession_ack_tag(struct vsession *s, const char *tag)
{
    char *t;
    if (s->nacks == s->capacks) {
        size_t cap = s->capacks ? s->capacks * 2 : 64;
        char **p = cr_realloc(s->acks, cap * sizeof(*p));
        if (!p)
            return CR_ENOMEM;
        s->acks = p;
        s->capacks = cap;
    }
    t = cr_strdup(tag);
    if (!t)
        return CR_ENOMEM;
    s->acks[s->nacks++] = t;
    return 0;
}

int vsession_ack(struct vsession *s, const char *tag)
{
    struct vsession_rec *r;
    if (!strmap_get(&s->recs, tag))
        return 0;
    r = settle(s, tag);
    if (r) {
        enum vsession_rec_state st = r->state;
        if (r->data)
            s->ops->release(s->ctx, r->data);
        rec_free(r);
        /* A record never written needs no removal. */
        if (st == VSESSION_REC_POPPED || st == VSESSION_REC_UNTRACKED)
            return 0;
    }
    /* The last copy, or one of several: the one record goes either way (a
     * copy still held finds no record to refresh; XX keeps it gone). */
    return vsession_ack_tag(s, tag);
}

static void restore(struct vsession *s, struct vsession_rec *r, char side)
{
    void *data = r->data;
    r->data = NULL;
    s->ops->restore(s->ctx, r->tag, data, r->state, side, 0);
    rec_free(r);
}

void vsession_requeue(struct vsession *s, const char *tag)
{
    struct vsession_rec *r = settle(s, tag);
    if (!r)
        return; /* another copy still holds it: its settle decides */
    /* kombu's requeue goes to the tail; once the consumer stops, what it
     * gives back goes to the head, so that the other consumers take it at
     * once. */
    restore(s, r, s->state == VSESSION_CONSUMING ? 'L' : 'R');
}

/* One removal per batch of at most ack_batch_max tags, the newest first. */
static void flush_acks(struct vsession *s, uint64_t now)
{
    if (s->nacks && s->acks_hold_until && now < s->acks_hold_until)
        return;
    while (s->nacks && up(s, VSESSION_LINK_STORE)) {
        size_t n = s->nacks < (size_t)s->cfg.ack_batch_max ? s->nacks
                                                           : (size_t)s->cfg.ack_batch_max;
        char **batch = s->acks + s->nacks - n;
        if (s->ops->ack(s->ctx, (const char *const *)batch, (int)n))
            return;
        for (size_t i = 0; i < n; i++)
            cr_free(batch[i]);
        s->nacks -= n;
    }
}

void vsession_on_acked(struct vsession *s, const char *const *tags, int n,
                       enum vsession_reply rep, uint64_t now)
{
    if (rep == VSESSION_OK) {
        if (s->ack_refusals > 1)
            LOG(LOG_INFO, "broker: acks taken again after %d refusals", s->ack_refusals);
        s->ack_refusals = 0;
        if (s->acks_state == VSESSION_ACKS_REFUSED)
            set_acks(s, VSESSION_ACKS_OPEN, now);
        for (int i = 0; i < n; i++)
            replay_put(&s->acked, cr_strdup(tags[i]), NULL, 0, 0, now, now);
        return;
    }
    if (rep == VSESSION_CANCELED)
        return;
    if (rep == VSESSION_LOST) {
        /* unknown whether the store had them; removing twice is harmless */
    } else {
        /* A dropped ack leaves its record behind for good (restored and run
         * again one visibility timeout later), so it is kept and sent again
         * a tick later, to the new master when this one was demoted. */
        s->ack_refusals++;
        set_acks(s, VSESSION_ACKS_REFUSED, now);
    }
    for (int i = 0; i < n; i++)
        if (vsession_ack_tag(s, tags[i]))
            LOG(LOG_ERROR,
                "broker: out of memory keeping an ack of %s; it comes back after "
                "the visibility timeout",
                tags[i]);
}

/* After a reconnect: the acks confirmed in the last replay_ms go again to
 * whichever server now answers. */
static void replay_acks(struct vsession *s, uint64_t now)
{
    struct replay_entry e;
    int n = 0;
    while (replay_take(&s->acked, now, &e)) {
        if (!strmap_get(&s->recs, e.key) && vsession_ack_tag(s, e.key) == 0)
            n++;
        cr_free(e.key);
        cr_free(e.value);
    }
    if (n)
        LOG(LOG_INFO,
            "broker: sending again %d ack(s) of the last %d s, which the server lost "
            "may not have passed on",
            n, (int)(s->cfg.replay_ms / 1000));
}

/* ------------------------------------------------------------ leases, rounds */

/* Every record in the store (or on its way there) we hold, in batches. */
static void refresh_leases(struct vsession *s)
{
    const char *tags[512];
    int max = s->cfg.ack_batch_max < 512 ? s->cfg.ack_batch_max : 512;
    struct vsession_rec *r = s->head;
    while (r && up(s, VSESSION_LINK_STORE)) {
        int n = 0;
        for (; r && n < max; r = r->next)
            if (r->state == VSESSION_REC_HELD || r->state == VSESSION_REC_RECORDING)
                tags[n++] = r->tag;
        if (n)
            s->ops->refresh(s->ctx, tags, n);
    }
}

static void round_end(struct vsession *s)
{
    set_round(s, VSESSION_ROUND_IDLE);
    if (s->state != VSESSION_CLOSED)
        s->ops->round_unlock(s->ctx);
}

void vsession_on_round_locked(struct vsession *s, int ok)
{
    if (s->round != VSESSION_ROUND_LOCKING)
        return;
    if (!ok) {
        set_round(s, VSESSION_ROUND_IDLE); /* held by another restorer, or lost */
        return;
    }
    set_round(s, VSESSION_ROUND_SCANNING);
    if (s->ops->round_scan(s->ctx))
        round_end(s);
}

void vsession_on_round_stale(struct vsession *s, const char *const *tags, int n,
                             enum vsession_reply rep)
{
    int started = 0;
    if (s->round != VSESSION_ROUND_SCANNING)
        return;
    if (rep != VSESSION_OK) {
        if (rep == VSESSION_LOST || rep == VSESSION_CANCELED)
            set_round(s, VSESSION_ROUND_IDLE); /* the mutex expires by itself */
        else
            round_end(s);
        return;
    }
    set_round(s, VSESSION_ROUND_RESTORING);
    s->round_jobs = 1; /* held while the jobs start */
    for (int i = 0; i < n; i++) {
        if (strmap_get(&s->recs, tags[i]))
            continue; /* ours: alive, whatever a slow refresh made it look */
        s->round_jobs++;
        started++;
        s->ops->restore(s->ctx, tags[i], NULL, VSESSION_REC_HELD, 'R', 1);
    }
    if (started)
        LOG(LOG_INFO, "Restoring %d unacknowledged message(s)", started);
    vsession_on_round_job(s);
}

void vsession_on_round_job(struct vsession *s)
{
    if (s->round_jobs > 0 && --s->round_jobs == 0 && s->round == VSESSION_ROUND_RESTORING)
        round_end(s);
}

/* ------------------------------------------------------------ lost pop calls */

/* Keeps score; past the bound the oldest goes (left to the visibility
 * timeout). */
static void remember_lost(struct vsession *s, const char *score)
{
    if (s->nlost == VSESSION_LOST_MAX) {
        memmove(s->lost[0], s->lost[1], sizeof(s->lost[0]) * (VSESSION_LOST_MAX - 1));
        s->nlost--;
    }
    snprintf(s->lost[s->nlost++], sizeof(s->lost[0]), "%s", score);
}

/* The records of lost pop calls (their exact score; a peer's records have
 * scores of their own clock), newest call first, while the store takes
 * commands; a look-up not sent keeps its score for the next chance. */
static void recover_lost(struct vsession *s)
{
    while (s->nlost > 0 && s->state != VSESSION_CLOSED && up(s, VSESSION_LINK_STORE)) {
        if (s->ops->scan_lost(s->ctx, s->lost[s->nlost - 1]))
            return;
        s->nlost--;
    }
}

void vsession_on_pop_lost(struct vsession *s, const char *score)
{
    if (s->state == VSESSION_CLOSED)
        return;
    remember_lost(s, score);
    recover_lost(s);
}

void vsession_on_lost_scan(struct vsession *s, const char *score, const char *const *tags,
                           int n, enum vsession_reply rep, uint64_t now)
{
    int given = 0;
    if (s->state == VSESSION_CLOSED)
        return;
    if (rep == VSESSION_LOST || rep == VSESSION_REFUSED) {
        /* not looked at (the link went, or the store is still loading after
         * a restart): looked at again, or the messages stay for the
         * visibility timeout */
        remember_lost(s, score);
        if (rep == VSESSION_REFUSED)
            set_again(s, VSESSION_AGAIN_DUE, now);
        return;
    }
    if (rep != VSESSION_OK)
        return;
    /* those we hold were delivered after all; the others go back to the
     * head of their lists, as a restore does */
    for (int i = 0; i < n; i++) {
        if (strmap_get(&s->recs, tags[i]))
            continue;
        given++;
        s->ops->restore(s->ctx, tags[i], NULL, VSESSION_REC_HELD, 'R', 0);
    }
    if (given)
        LOG(LOG_INFO,
            "broker: giving back %d message(s) popped by a call whose reply was "
            "lost",
            given);
}

void vsession_on_restore_refused(struct vsession *s, uint64_t now)
{
    if (s->state != VSESSION_CLOSED)
        set_again(s, VSESSION_AGAIN_DUE, now);
}

/* ------------------------------------------------------------ events */

void vsession_on_link(struct vsession *s, enum vsession_link l, int is_up, uint64_t now)
{
    if (s->state == VSESSION_CLOSED || !is_up)
        return;
    if (l == VSESSION_LINK_POP) {
        set_pop(s, VSESSION_POP_WARM);
        return;
    }
    /* Records not written yet go before the acks that may remove them. */
    send_pending_records(s);
    /* perhaps a new master: no need to wait */
    set_acks(s, VSESSION_ACKS_OPEN, now);
    s->acks_hold_until = 0;
    replay_acks(s, now);
    flush_acks(s, now);
    refresh_leases(s);
    s->lease_due = now + s->cfg.lease_ms;
    if (s->ops->restores_again)
        s->ops->restores_again(s->ctx);
    recover_lost(s);
}

void vsession_pump(struct vsession *s, uint64_t now)
{
    flush_acks(s, now);
    maybe_pop(s, now);
}

void vsession_pop(struct vsession *s, uint64_t now)
{
    maybe_pop(s, now);
}

void vsession_tick(struct vsession *s, uint64_t now)
{
    if (s->state == VSESSION_CLOSED || !up(s, VSESSION_LINK_STORE))
        return;
    if (now >= s->lease_due) {
        s->lease_due = now + s->cfg.lease_ms;
        refresh_leases(s);
    }
    if (now >= s->restore_due) {
        s->restore_due = now + s->cfg.restore_ms;
        if (s->round == VSESSION_ROUND_IDLE && s->cfg.ack_emulation &&
            s->ops->round_lock(s->ctx) == 0)
            set_round(s, VSESSION_ROUND_LOCKING);
    }
    if (s->records_pending)
        send_pending_records(s);
    if (s->again == VSESSION_AGAIN_DUE && now >= s->again_at) {
        set_again(s, VSESSION_AGAIN_NONE, now);
        if (s->ops->restores_again)
            s->ops->restores_again(s->ctx);
        recover_lost(s);
    }
}

void vsession_stop_consuming(struct vsession *s)
{
    if (s->state == VSESSION_CONSUMING)
        set_state(s, VSESSION_STOPPED);
}

void vsession_drain(struct vsession *s, uint64_t now)
{
    struct vsession_rec *r;
    if (s->state == VSESSION_CLOSED)
        return;
    set_state(s, VSESSION_DRAINING);
    if (!up(s, VSESSION_LINK_STORE))
        return; /* left to the visibility timeout */
    while ((r = s->head) != NULL) {
        s->nheld -= r->copies;
        rec_unlink(s, r);
        restore(s, r, 'R');
    }
    flush_acks(s, now);
}

void vsession_close(struct vsession *s)
{
    set_state(s, VSESSION_CLOSED);
}

void vsession_set_prefetch(struct vsession *s, long n)
{
    s->prefetch = n < 0 ? 0 : n;
}

void vsession_set_lease_ms(struct vsession *s, uint64_t ms)
{
    s->cfg.lease_ms = ms;
}

/* ------------------------------------------------------------ queries */

struct vsession_rec *vsession_held(const struct vsession *s, const char *tag)
{
    return strmap_get(&s->recs, tag);
}

long vsession_nheld(const struct vsession *s)
{
    return s->nheld;
}

size_t vsession_nacks(const struct vsession *s)
{
    return s->nacks;
}

int vsession_popping(const struct vsession *s)
{
    return s->calls_out > 0 || s->block == VSESSION_BLOCK_OUT;
}

enum vsession_state vsession_state(const struct vsession *s)
{
    return s->state;
}

enum vsession_pop vsession_pop_state(const struct vsession *s)
{
    return s->pop;
}

enum vsession_script vsession_script_state(const struct vsession *s)
{
    return s->script;
}

enum vsession_block vsession_block_state(const struct vsession *s)
{
    return s->block;
}

enum vsession_acks vsession_acks_state(const struct vsession *s)
{
    return s->acks_state;
}

enum vsession_round vsession_round_state(const struct vsession *s)
{
    return s->round;
}

enum vsession_again vsession_again_state(const struct vsession *s)
{
    return s->again;
}

int vsession_nlost(const struct vsession *s)
{
    return s->nlost;
}

int vsession_script_fails(const struct vsession *s)
{
    return s->script_fails;
}

int vsession_ack_refusals(const struct vsession *s)
{
    return s->ack_refusals;
}

struct vsession_rec *vsession_first(const struct vsession *s)
{
    return s->head;
}
