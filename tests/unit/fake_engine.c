/* fake_engine.c -- the recording fake engine_ops of the engine's unit tests
 * (see fake_engine.h). */
#include "tests/unit/fake_engine.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/result.h"
#include "util/alloc.h"

/* ------------------------------------------------------------------ log */

void fake_note(struct fake *f, const char *what, int n)
{
    if (n)
        buf_printf(&f->log, "%s%s%d", f->log.len ? " " : "", what, n);
    else
        buf_printf(&f->log, "%s%s", f->log.len ? " " : "", what);
}

/* The number the log shows for d (0: none). */
static int num(const struct fake *f, const struct delivery *d)
{
    return f->log_numbers ? ((const struct fake_msg *)d)->n : 0;
}

/* j's first delivery's (a map's items have none). */
static int num_of(const struct fake *f, const struct job *j)
{
    return j->nmsgs ? num(f, j->msgs[0]) : 0;
}

/* The four digits that tell the fixtures' ids apart: 0f0b8c1e-NNNN-... */
static const char *short_id(const char *id)
{
    static char out[8];
    snprintf(out, sizeof(out), "%.4s", strlen(id) > 13 ? id + 9 : id);
    return out;
}

void log_is(struct fake *f, const char *want)
{
    ck_assert_str_eq(f->log.data ? f->log.data : "", want);
    buf_reset(&f->log);
}

void check_once(const struct fake *f)
{
    for (int i = 1; i <= f->ndeliveries; i++) {
        ck_assert_int_eq(f->releases[i], 1);
        ck_assert_int_le(f->acks[i] + f->rejects[i], 1);
    }
}

/* ------------------------------------------------------------------ ops */

static void f_ack(void *ctx, struct delivery *d)
{
    struct fake *f = ctx;
    ck_assert(!d->settled);
    d->settled = 1;
    f->acks[((struct fake_msg *)d)->n]++;
    f->acked++;
    fake_note(f, "ack", num(f, d));
}

static void f_reject(void *ctx, struct delivery *d, int requeue)
{
    struct fake *f = ctx;
    ck_assert(!d->settled);
    d->settled = 1;
    f->rejects[((struct fake_msg *)d)->n]++;
    f->rejected++;
    fake_note(f, requeue ? "requeue" : "reject", num(f, d));
}

static int f_live(void *ctx, const struct delivery *d)
{
    (void)d;
    return ((struct fake *)ctx)->connected;
}

static void f_release(void *ctx, struct delivery *d)
{
    struct fake *f = ctx;
    struct fake_msg *m = (struct fake_msg *)d;
    f->releases[m->n]++;
    f->released++;
    if (f->log_releases)
        fake_note(f, "release", num(f, d));
    delivery_free(d);
}

static int f_read_state(void *ctx, struct job *j)
{
    struct fake *f = ctx;
    if (f->no_reads)
        ck_abort_msg("no read expected: a first delivery needs none");
    ck_assert_int_lt(f->nreads, FAKE_MAXOPS);
    f->reads[f->nreads++] = j;
    fake_note(f, "read", num_of(f, j));
    return 0;
}

/* Keeps meta in the next store slot (task_id: store_for's) and writes its
 * status to st. Under fail_store, frees meta and returns CR_ENOMEM. */
static int keep_store(struct fake *f, struct job *j, char *meta,
                      enum engine_store_kind kind, const char *task_id, char st[32])
{
    st[0] = '\0';
    if (f->fail_store) {
        cr_free(meta);
        return CR_ENOMEM;
    }
    ck_assert_int_lt(f->nstores, FAKE_MAXOPS);
    result_meta_status(meta, strlen(meta), st, 32);
    if (task_id)
        snprintf(f->store_ids[f->nstores], sizeof(f->store_ids[0]), "%s", task_id);
    f->stores[f->nstores] = j;
    f->store_kind[f->nstores] = kind;
    f->metas[f->nstores++] = meta;
    return 0;
}

static int f_store(void *ctx, struct job *j, char *meta, size_t n,
                   enum engine_store_kind kind, int attempt)
{
    struct fake *f = ctx;
    char st[32];
    int rc = keep_store(f, j, meta, kind, NULL, st);
    (void)n;
    if (rc)
        return rc;
    f->store_attempt[f->nstores - 1] = attempt;
    fake_note(f, kind == ENGINE_STORE_STARTED ? "store-STARTED" : "store-", 0);
    if (kind == ENGINE_STORE_FINAL)
        buf_puts(&f->log, st);
    return 0;
}

static int f_publish(void *ctx, const struct outbound *o, struct engine_publish *p)
{
    struct fake *f = ctx;
    struct fake_pub *u;
    if (f->fail_publish)
        return f->fail_publish;
    ck_assert_int_lt(f->npubs, FAKE_MAXOPS);
    u = &f->pubs[f->npubs++];
    u->p = p;
    snprintf(u->exchange, sizeof(u->exchange), "%s", o->exchange);
    snprintf(u->routing_key, sizeof(u->routing_key), "%s", o->routing_key);
    u->headers = o->headers ? cJSON_Duplicate(o->headers, 1) : NULL;
    u->body = strndup(o->body, o->body_len);
    fake_note(f, "publish:", 0);
    buf_puts(&f->log, o->exchange[0] ? o->exchange : o->routing_key);
    return 0;
}

static int f_call(void *ctx, struct job *j, const struct task_call *c, struct cr_err *err)
{
    struct fake *f = ctx;
    ck_assert(c->body && c->body_len);
    if (f->fail_call)
        return cr_err_set(err, CR_ENOMEM, "no call today");
    ck_assert_int_lt(f->ncalls, FAKE_MAXOPS);
    j->call = j;
    f->bodies[f->ncalls] = strndup(c->body, c->body_len);
    f->call_ids[f->ncalls] = j->tm.id ? strdup(j->tm.id) : NULL;
    f->steps[f->ncalls] = c->route_step;
    f->calls[f->ncalls++] = j;
    fake_note(f, "call", num_of(f, j));
    return 0;
}

static void f_abort(void *ctx, struct job *j, const char *exc_type, const char *msg)
{
    struct fake *f = ctx;
    int i = f->ncalls - 1;
    (void)msg;
    ck_assert_ptr_nonnull(j->call);
    while (i >= 0 && f->calls[i] != j)
        i--;
    ck_assert_int_ge(i, 0);
    f->aborted[i] = 1;
    snprintf(f->last_abort, sizeof(f->last_abort), "%s", exc_type);
    fake_note(f, "abort", num_of(f, j));
}

static int f_lease(void *ctx, struct job *j, enum engine_lease_op op, long ttl_s)
{
    struct fake *f = ctx;
    (void)ttl_s;
    if (op == ENGINE_LEASE_GET) {
        ck_assert_int_lt(f->nleases, FAKE_MAXOPS);
        f->leases[f->nleases++] = j;
    }
    fake_note(f,
              op == ENGINE_LEASE_GET   ? "lease-get"
              : op == ENGINE_LEASE_SET ? "lease-set"
                                       : "lease-del",
              0);
    return 0;
}

static void f_prefetch(void *ctx, int n)
{
    ((struct fake *)ctx)->prefetch = n;
}

static void f_notify(void *ctx, struct job *j, const struct task_event_info *info)
{
    struct fake *f = ctx;
    f->notes[info->type]++;
    if (f->on_notify)
        f->on_notify(f, j, info);
}

static void f_forget(void *ctx, struct job *j)
{
    (void)ctx;
    (void)j;
}

static void f_stop(void *ctx, int cold)
{
    struct fake *f = ctx;
    f->stopped++;
    f->cold = cold;
    fake_note(f, cold ? "stop-cold" : "stop-warm", 0);
}

static int f_store_for(void *ctx, struct job *j, const char *task_id, char *meta,
                       size_t n)
{
    struct fake *f = ctx;
    char st[32];
    int rc = keep_store(f, j, meta, ENGINE_STORE_FOLLOWUP, task_id, st);
    (void)n;
    if (rc)
        return rc;
    fake_note(f, "store-for-", 0);
    buf_printf(&f->log, "%s:%s", st, short_id(task_id));
    return 0;
}

static int f_chord(void *ctx, struct job *j, const struct engine_chord_cmd *c)
{
    struct fake *f = ctx;
    struct fake_chord *k;
    if (f->fail_chord)
        return f->fail_chord;
    ck_assert_int_lt(f->nchords, FAKE_MAXOPS);
    k = &f->chords[f->nchords++];
    k->j = j;
    k->op = c->op;
    snprintf(k->group_id, sizeof(k->group_id), "%s", c->group_id);
    k->size = c->size;
    k->group_index = c->group_index;
    k->member = c->member ? strndup(c->member, c->member_len) : NULL;
    fake_note(f,
              c->op == ENGINE_CHORD_SIZE   ? "chord-size"
              : c->op == ENGINE_CHORD_PART ? "chord-part"
                                           : "chord-clear",
              0);
    return 0;
}

static void f_outbound_headers(void *ctx, const struct job *j, cJSON *headers)
{
    struct fake *f = ctx;
    if (f->mark_outbound)
        cJSON_AddStringToObject(headers, "x-from", j->tm.id);
}

const struct engine_ops fake_ops = {
    f_ack,     f_reject, f_live,      f_release, f_read_state,       f_store,
    f_publish, f_call,   f_abort,     f_lease,   f_prefetch,         f_notify,
    f_forget,  f_stop,   f_store_for, f_chord,   f_outbound_headers,
};

/* ------------------------------------------------------------ lifecycle */

void fake_base_init(struct fake *f)
{
    memset(f, 0, sizeof(*f));
    buf_init(&f->log);
    f->connected = 1;
    f->log_numbers = 1;
    f->log_releases = 1;
    f->now.loop_ms = 1000;
    f->now.epoch_us = FAKE_T0_US;
    f->queues[0] = (char *)"celery";
    f->cfg.hostname = "celery@test";
    f->cfg.pid = 42;
    f->cfg.concurrency = 4;
    f->cfg.prefetch_multiplier = 4;
    f->cfg.aliases = f->aliases;
    f->cfg.queues = f->queues;
    f->cfg.nqueues = 1;
    f->cfg.max_message_size = 1 << 20;
    f->cfg.max_retries = 3;
    f->cfg.retry_backoff = 1;
    f->cfg.retry_backoff_factor = 2;
    f->cfg.retry_backoff_max = 60;
    f->cfg.seed = 7;
    f->cfg.llm_model = "m";
    f->cfg.llm_embed_model = "e";
}

void fake_start(struct fake *f)
{
    f->e = engine_new(&f->cfg, &fake_ops, f, f->now);
    ck_assert_ptr_nonnull(f->e);
}

void fake_release(struct fake *f)
{
    engine_halt(f->e);
    /* what the clients owe comes back with errors, as on worker_free() */
    for (int i = 0; i < f->ncalls; i++)
        if (f->calls[i])
            fake_llm_done(f, i, LLM_PERMANENT, "APIConnectionError", -1, NULL);
    for (int i = 0; i < f->nstores; i++)
        if (f->stores[i])
            engine_on_stored(f->e, f->now, f->stores[i], f->store_kind[i], CR_ECANCELED,
                             0);
    for (int i = 0; i < f->npubs; i++)
        if (f->pubs[i].p)
            engine_on_confirm(f->e, f->now, f->pubs[i].p, 0);
    for (int i = 0; i < f->nreads; i++)
        if (f->reads[i])
            engine_on_state(f->e, f->now, f->reads[i], CR_ECANCELED, NULL, 0);
    for (int i = 0; i < f->nleases; i++)
        if (f->leases[i])
            engine_on_lease(f->e, f->now, f->leases[i], CR_ECANCELED, NULL);
    for (int i = 0; i < f->nchords; i++)
        if (f->chords[i].j)
            engine_on_chord(f->e, f->now, f->chords[i].j, f->chords[i].op, CR_ECANCELED,
                            NULL, NULL, 0);
    engine_free(f->e);
    f->e = NULL;
    for (int i = 0; i < f->nchords; i++)
        free(f->chords[i].member);
    for (int i = 0; i < f->nstores; i++)
        cr_free(f->metas[i]);
    for (int i = 0; i < f->npubs; i++) {
        cJSON_Delete(f->pubs[i].headers);
        free(f->pubs[i].body);
    }
    for (int i = 0; i < f->ncalls; i++) {
        free(f->bodies[i]);
        free(f->call_ids[i]);
    }
    buf_release(&f->log);
}

/* ------------------------------------------------------------- messages */

struct fake_msg *fake_msg_new(struct fake *f, const char *body, const char *queue,
                              cJSON *headers)
{
    struct fake_msg *m = calloc(1, sizeof(*m));
    ck_assert_ptr_nonnull(m);
    ck_assert_int_lt(f->ndeliveries + 1, FAKE_MAXOPS);
    m->n = ++f->ndeliveries;
    m->d.body = strdup(body);
    m->d.body_len = strlen(body);
    m->d.content_type = strdup("application/json");
    m->d.content_encoding = strdup("utf-8");
    m->d.delivery_mode = 2;
    m->d.exchange = strdup("");
    m->d.routing_key = strdup(queue);
    m->d.queue = strdup(queue);
    ck_assert(m->d.body && m->d.content_type && m->d.content_encoding && m->d.exchange &&
              m->d.routing_key && m->d.queue);
    m->d.received_ms = f->now.loop_ms;
    m->d.caps = MSG_CAP_CONFIRMS | MSG_CAP_PREFETCH;
    m->d.headers = headers;
    return m;
}

/* -------------------------------------------------------------- answers */

void fake_stored(struct fake *f, int i, int status)
{
    struct job *j = f->stores[i];
    ck_assert_ptr_nonnull(j);
    f->stores[i] = NULL;
    engine_on_stored(f->e, f->now, j, f->store_kind[i], status, 0);
}

void fake_confirm(struct fake *f, int i, int ok)
{
    struct engine_publish *p = f->pubs[i].p;
    ck_assert_ptr_nonnull(p);
    f->pubs[i].p = NULL;
    engine_on_confirm(f->e, f->now, p, ok);
}

void fake_chord_done(struct fake *f, int i, int status, const char *const *members,
                     size_t n)
{
    struct fake_chord *k = &f->chords[i];
    size_t lens[8];
    struct job *j = k->j;
    ck_assert_ptr_nonnull(j);
    ck_assert_uint_le(n, 8);
    for (size_t m = 0; m < n; m++)
        lens[m] = strlen(members[m]);
    k->j = NULL;
    engine_on_chord(f->e, f->now, j, k->op, status, members, members ? lens : NULL, n);
}

void fake_llm_done(struct fake *f, int i, enum llm_verdict v, const char *exc,
                   int64_t retry_after_ms, const char *text)
{
    struct openai_stream s;
    struct llm_result r;
    struct job *j = f->calls[i];
    ck_assert_ptr_nonnull(j);
    f->calls[i] = NULL;
    openai_stream_init(&s);
    if (text)
        buf_puts(&s.content, text);
    memset(&r, 0, sizeof(r));
    r.verdict = v;
    r.exc_type = exc ? exc : "";
    r.message = exc ? "it went wrong" : "";
    r.http_status = v == LLM_OK ? 200 : 429;
    r.retry_after_ms = retry_after_ms;
    r.fallback_left = f->fallback_left;
    r.provider = "p";
    llm_result_set_openai(&r, &s);
    engine_on_llm_done(f->e, f->now, j, &r);
    openai_stream_release(&s);
}
