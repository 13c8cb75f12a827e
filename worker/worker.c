/* worker.c -- the switchboard: the loop, its handles and the clients, wired to
 * the engine.
 *
 * Every decision about a delivery and its job is the engine's (engine/); this
 * file owns the libuv loop's timer and signals, implements struct engine_ops
 * with the broker (net/rmq_broker.h), the result store (net/backend.h) and the LLM
 * client, feeds every completion back into the engine with the time, and fans
 * the engine's notifications out to events, metrics and progress. See
 * docs/internals/worker.md for the way of one task. */
#include "worker.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "events.h"
#include "fleet_limits.h"
#include "fleet_pools.h"
#include "llm/llm_client.h"
#include "llm_stack.h"
#include "metrics.h"
#include "net/broker.h"
#include "net/backend.h"
#include "net/otlp.h"
#include "pidbox.h"
#include "progress.h"
#include "sdnotify.h"
#include "tracing.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/startup_retry.h"
#include "util/uuid.h"
#include "util/version.h"
#include "worker_ctx.h"

#define CRON_MS 100
#define LEASE_PREFIX "celeriac-lease-"
#define TRACE_DRAIN_MS 3000

/* pool_grow clamps to the configured bound, the engine to its own. */
_Static_assert(ENGINE_MAX_CONCURRENCY == CONFIG_MAX_CONCURRENCY, "concurrency bounds");

struct worker {
    const struct config *cfg;
    uv_loop_t *loop;
    struct broker *broker;
    struct backend *backend;
    struct llm_stack ls; /* the LLM client, providers and router */
    /* The providers' "limits", shared by the fleet in the backend's Redis;
     * freed after the LLM client and the backend. */
    struct fleet_limits *limits;
    struct backend *limits_bk; /* --limits-redis; NULL: the limits use backend */
    struct fleet_pools *pools; /* cooling and calls in flight of the fleet */
    /* Budgeted providers (router order): a spend count command out, and
     * when the counts were last synced (loop ms). */
    unsigned char budget_out[LLM_REGISTRY_MAX_PROVIDERS + 1];
    unsigned char budget_failing[LLM_REGISTRY_MAX_PROVIDERS + 1]; /* said once */
    uint64_t budget_synced_ms;
    struct broker_config bcfg;
    struct engine_config ecfg;
    struct engine *engine;
    struct worker_ctx ctx; /* what pidbox, events, metrics and progress see */

    uv_timer_t cron;
    uv_signal_t sigterm, sigint, sighup;
    int exit_code;
    struct sdnotify notify; /* systemd's Type=notify and watchdog */
    int restart;            /* SIGHUP: re-execute once the warm shutdown ends */

    /* observers; each may be NULL */
    struct events *events;
    struct pidbox *pidbox;
    struct metrics *metrics;
    struct progress *progress;
    struct tracing *tracing; /* NULL unless OTEL_* ask for it */
};

static struct engine_now now_of(struct worker *w)
{
    return worker_ctx_now(&w->ctx);
}

static struct worker *worker_of(const struct job *j)
{
    return engine_ctx(j->e);
}

/* ---------------------------------------------------- deliveries */

static void op_ack(void *ctx, struct delivery *d)
{
    struct worker *w = ctx;
    if (w->broker)
        broker_ack(w->broker, d);
}

static void op_reject(void *ctx, struct delivery *d, int requeue)
{
    struct worker *w = ctx;
    if (w->broker)
        broker_reject(w->broker, d, requeue);
}

static int op_delivery_live(void *ctx, const struct delivery *d)
{
    struct worker *w = ctx;
    return w->broker && broker_live(w->broker, d);
}

static void op_release(void *ctx, struct delivery *d)
{
    (void)ctx;
    delivery_free(d);
}

static void on_delivery(struct broker *b, struct delivery *d, void *privdata)
{
    struct worker *w = privdata;
    (void)b;
    if (d->no_ack) {
        pidbox_on_message(w->pidbox, d);
        return;
    }
    engine_on_delivery(w->engine, now_of(w), d);
}

static void on_confirm(struct broker *b, int ok, void *privdata)
{
    struct engine *e = engine_of_publish(privdata);
    (void)b;
    engine_on_confirm(e, now_of(engine_ctx(e)), privdata, ok);
}

static int op_publish(void *ctx, const struct outbound *o, struct engine_publish *p)
{
    struct worker *w = ctx;
    if (!w->broker)
        return CR_EBROKER;
    return broker_publish(w->broker, o, on_confirm, p);
}

static void op_set_prefetch(void *ctx, int n)
{
    struct worker *w = ctx;
    if (w->broker)
        broker_set_prefetch(w->broker, n);
}

/* ------------------------------------------------------ result store */

static void on_meta(struct backend *bk, int status, const char *value, size_t len,
                    void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_state(j->e, now_of(worker_of(j)), j, status, value, len);
}

static int op_read_state(void *ctx, struct job *j)
{
    struct worker *w = ctx;
    return backend_get(w->backend, j->tm.id, on_meta, j);
}

static void on_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_stored(j->e, now_of(worker_of(j)), j, ENGINE_STORE_FINAL, status, skipped);
}

static void on_started_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_stored(j->e, now_of(worker_of(j)), j, ENGINE_STORE_STARTED, status,
                     skipped);
}

static int op_store(void *ctx, struct job *j, char *meta, size_t n,
                    enum engine_store_kind kind, int attempt)
{
    struct worker *w = ctx;
    return backend_store(w->backend, j->tm.id, attempt, meta, n,
                         kind == ENGINE_STORE_FINAL ? on_stored : on_started_stored, j);
}

static void on_stored_for(struct backend *bk, int status, int skipped, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_stored(j->e, now_of(worker_of(j)), j, ENGINE_STORE_FOLLOWUP, status,
                     skipped);
}

static int op_store_for(void *ctx, struct job *j, const char *task_id, char *meta,
                        size_t n)
{
    struct worker *w = ctx;
    return backend_store(w->backend, task_id, -1, meta, n, on_stored_for, j);
}

static void on_chord_size(struct backend *bk, int status, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_chord(j->e, now_of(worker_of(j)), j, ENGINE_CHORD_SIZE, status, NULL, NULL,
                    0);
}

static void on_chord_clear(struct backend *bk, int status, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_chord(j->e, now_of(worker_of(j)), j, ENGINE_CHORD_CLEAR, status, NULL, NULL,
                    0);
}

static void on_chord_part(struct backend *bk, int status, const char *const *members,
                          const size_t *lens, size_t n, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_chord(j->e, now_of(worker_of(j)), j, ENGINE_CHORD_PART, status, members,
                    lens, n);
}

static int op_chord(void *ctx, struct job *j, const struct engine_chord_cmd *c)
{
    struct worker *w = ctx;
    switch (c->op) {
    case ENGINE_CHORD_SIZE:
        return backend_chord_size(w->backend, c->group_id, c->size, on_chord_size, j);
    case ENGINE_CHORD_PART:
        return backend_chord_part(w->backend, c->group_id, c->group_index, c->member,
                                  c->member_len, c->task_id, on_chord_part, j);
    case ENGINE_CHORD_CLEAR:
        return backend_chord_clear(w->backend, c->group_id, on_chord_clear, j);
    }
    return CR_EINVAL;
}

static void on_lease(struct backend *bk, int status, const struct redisReply *reply,
                     void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    engine_on_lease(j->e, now_of(worker_of(j)), j, status,
                    reply && reply->type == REDIS_REPLY_STRING ? reply->str : NULL);
}

/* The lease of a parked task is a Redis key naming the worker that runs it. */
static int op_lease(void *ctx, struct job *j, enum engine_lease_op op, long ttl_s)
{
    struct worker *w = ctx;
    char key[300], ttl[32];
    const char *argv[5] = {NULL, key, w->cfg->hostname, "EX", ttl};
    snprintf(key, sizeof(key), LEASE_PREFIX "%s", j->tm.id);
    switch (op) {
    case ENGINE_LEASE_GET:
        argv[0] = "GET";
        return backend_command(w->backend, 2, argv, NULL, on_lease, j);
    case ENGINE_LEASE_SET:
        argv[0] = "SET";
        snprintf(ttl, sizeof(ttl), "%ld", ttl_s);
        return backend_command(w->backend, 5, argv, NULL, NULL, NULL);
    case ENGINE_LEASE_DEL:
        argv[0] = "DEL";
        return backend_command(w->backend, 2, argv, NULL, NULL, NULL);
    }
    return CR_EINVAL;
}

/* ------------------------------------------------------------ LLM calls */

static void on_llm_delta(struct llm_req *r, const char *text, size_t len, void *privdata)
{
    struct job *j = privdata;
    (void)r;
    progress_on_delta(worker_of(j)->progress, j, text, len);
}

/* --------------------------------------------------- fleet budgets */

/* How often the spend of budgeted providers is read back from Redis when
 * this worker has spent nothing new (a fleet's other workers may have). */
#define BUDGET_SYNC_MS 2000
/* A day's count lives two days: long enough for any clock's view of "today". */
#define BUDGET_KEY_TTL "172800"

struct budget_cmd {
    struct worker *w;
    int i;
    long day;
    double amount; /* > 0: an increment; 0: a read */
};

static void budget_key(struct worker *w, const char *name, long day, char *out, size_t n)
{
    time_t t = (time_t)day * 86400;
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(out, n, "%sceleriac:spend:%s:%04d-%02d-%02d", backend_key_prefix(w->backend),
             name, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
}

static void on_budget_reply(struct backend *bk, int status,
                            const struct redisReply *reply, void *privdata)
{
    struct budget_cmd *c = privdata;
    struct llm_budget *b;
    const char *name;
    int ok;
    double total = 0;
    (void)bk;
    if (status == CR_ECANCELED) { /* backend_free(): the worker is going */
        cr_free(c);
        return;
    }
    c->w->budget_out[c->i] = 0;
    b = llm_router_budget(&c->w->ls.router, c->i, &name);
    ok = status == 0 && reply &&
         (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_NIL);
    if (ok && reply->type == REDIS_REPLY_STRING)
        total = strtod(reply->str, NULL);
    if (!ok && !c->w->budget_failing[c->i])
        LOG(LOG_WARNING,
            "budget of %s: cannot count the spend in Redis (%s); counting alone", name,
            reply && reply->type == REDIS_REPLY_ERROR ? reply->str : "no reply");
    else if (ok && c->w->budget_failing[c->i])
        LOG(LOG_WARNING, "budget of %s: counting the spend in Redis again", name);
    c->w->budget_failing[c->i] = !ok;
    if (b && c->amount > 0)
        llm_budget_sent(b, c->day, c->amount, ok, total);
    else if (b && ok)
        llm_budget_read(b, c->day, total);
    cr_free(c);
}

/* Hands each budgeted provider's new spend to the shared count (or, every
 * BUDGET_SYNC_MS when there is none, reads the count back), one command
 * per provider out at a time. */
static void budget_sync(struct worker *w, int reads)
{
    long day = llm_budget_day(clock_epoch_us() / 1000);
    const char *name;
    struct llm_budget *b;

    if (!w->backend)
        return;
    for (int i = 0; (b = llm_router_budget(&w->ls.router, i, &name)); i++) {
        struct budget_cmd *c;
        char key[192], amount[48];
        double a;
        if (b->usd_per_day <= 0 || w->budget_out[i])
            continue;
        a = llm_budget_take(b, day);
        if (a <= 0 && !reads)
            continue;
        if (!(c = cr_calloc(1, sizeof(*c)))) {
            if (a > 0)
                llm_budget_sent(b, day, a, 0, 0);
            continue;
        }
        *c = (struct budget_cmd){w, i, day, a > 0 ? a : 0};
        budget_key(w, name, day, key, sizeof(key));
        snprintf(amount, sizeof(amount), "%.10f", a);
        if (a > 0) {
            const char *incr[] = {"INCRBYFLOAT", key, amount};
            const char *exp[] = {"EXPIRE", key, BUDGET_KEY_TTL};
            if (backend_command(w->backend, 3, incr, NULL, on_budget_reply, c)) {
                llm_budget_sent(b, day, a, 0, 0);
                cr_free(c);
                continue;
            }
            backend_command(w->backend, 3, exp, NULL, NULL, NULL);
        } else {
            const char *get[] = {"GET", key};
            if (backend_command(w->backend, 2, get, NULL, on_budget_reply, c)) {
                cr_free(c);
                continue;
            }
        }
        w->budget_out[i] = 1;
    }
}

/* The kind of provider that answered ("openai" for the default one). */
static const char *provider_type(struct worker *w, const struct llm_result *res)
{
    int i;
    if (!res->provider || !*res->provider)
        return "openai";
    i = llm_registry_find(&w->ls.providers, res->provider, strlen(res->provider));
    return i >= 0 ? w->ls.providers.providers[i].impl->name : "openai";
}

static void on_llm_done(struct llm_req *r, const struct llm_result *res, void *privdata)
{
    struct job *j = privdata;
    struct worker *w = worker_of(j);
    struct engine_now now = now_of(w);
    (void)r;
    llm_stack_note(&w->ls, res, now.loop_ms);
    if (res->cost_usd > 0) {
        llm_router_spent(&w->ls.router, res->provider,
                         llm_budget_day(clock_epoch_us() / 1000), res->cost_usd);
        budget_sync(w, 0);
    }
    if (w->tracing)
        tracing_llm_done(w->tracing, j, res, provider_type(w, res));
    engine_on_llm_done(j->e, now, j, res);
}

/* The router picks the provider and builds its request; the outcome comes
 * back through on_llm_done, whoever answered. */
static int op_call_llm(void *ctx, struct job *j, const struct task_call *c,
                       struct cr_err *err)
{
    struct worker *w = ctx;
    struct llm_call call = {c->op,    c->body,       c->body_len, c->embed_list,
                            c->model, c->route_step, c->tools};
    const char *trace_lines[2];

    call.ntrace_headers = tracing_llm_start(w->tracing, j, c, trace_lines);
    call.trace_headers = trace_lines;
    j->call = llm_router_call(&w->ls.router, &call, on_llm_delta, on_llm_done, j, err);
    if (!j->call) {
        struct llm_result none;
        memset(&none, 0, sizeof(none));
        none.verdict = LLM_PERMANENT;
        none.code = err->code ? err->code : CR_ENOMEM;
        none.exc_type = "APIError";
        none.message = err->msg;
        tracing_llm_done(w->tracing, j, &none, NULL);
    }
    return j->call ? 0 : err->code ? err->code : CR_ENOMEM;
}

/* llm_req_abort defers on_done to the loop, so the engine's lists are not
 * changed under it. */
static void op_abort_llm(void *ctx, struct job *j, const char *exc_type,
                         const char *message)
{
    (void)ctx;
    llm_req_abort(j->call, CR_ECANCELED, exc_type, message);
}

static const char *job_text(const struct job *j)
{
    return j->call ? llm_req_text(j->call, NULL) : "";
}

/* ---------------------------------------------------------- observers */

static void op_notify(void *ctx, struct job *j, const struct task_event_info *info)
{
    struct worker *w = ctx;
    if (info->type == TEV_DEAD_LETTERED) {
        metrics_on_dead_letter(w->metrics, j);
        return;
    }
    tracing_on_task(w->tracing, j, info);
    events_on_task(w->events, j, info);
    metrics_on_task(w->metrics, j, info);
    progress_on_task(w->progress, j, info);
}

static void op_forget(void *ctx, struct job *j)
{
    struct worker *w = ctx;
    progress_forget(w->progress, j);
    tracing_forget(w->tracing, j);
}

/* log_trace_fn: the trace of the task a JSON log line names. */
static int log_trace_ids(const char *id, size_t id_len, char trace_id[33],
                         char span_id[17], void *arg)
{
    struct worker *w = arg;
    char key[256];
    if (id_len >= sizeof(key))
        return 0;
    memcpy(key, id, id_len);
    key[id_len] = '\0';
    return tracing_job_ids(engine_find_job(w->engine, key), trace_id, span_id);
}

static void op_outbound_headers(void *ctx, const struct job *j, cJSON *headers)
{
    struct worker *w = ctx;
    tracing_outbound_headers(w->tracing, j, headers);
}

static void on_spans_drained(struct otlp_exporter *x, void *privdata)
{
    struct worker *w = privdata;
    (void)x;
    uv_stop(w->loop);
}

/* A warm stop first sends the spans still queued (the last tasks'), for at
 * most TRACE_DRAIN_MS; a cold one loses them. */
static void op_stop(void *ctx, int cold)
{
    struct worker *w = ctx;
    struct otlp_exporter *x = tracing_exporter(w->tracing);
    if (cold)
        w->exit_code = 1;
    if (!cold && x) {
        otlp_exporter_drain(x, TRACE_DRAIN_MS, on_spans_drained, w);
        return;
    }
    uv_stop(w->loop);
}

static const struct engine_ops worker_ops = {
    .ack = op_ack,
    .reject = op_reject,
    .delivery_live = op_delivery_live,
    .release = op_release,
    .read_state = op_read_state,
    .store = op_store,
    .publish = op_publish,
    .call_llm = op_call_llm,
    .abort_llm = op_abort_llm,
    .lease = op_lease,
    .set_prefetch = op_set_prefetch,
    .notify = op_notify,
    .forget = op_forget,
    .stop = op_stop,
    .store_for = op_store_for,
    .chord = op_chord,
    .outbound_headers = op_outbound_headers,
};

/* The ids given to canvas follow-ups (a new group, a chord header member without
 * one): uuid4, as Python's uuid.uuid4(). */
static void new_uuid(char out[37], void *arg)
{
    unsigned char b[16];
    (void)arg;
    if (uv_random(NULL, NULL, b, sizeof(b), 0, NULL) != 0) {
        /* no entropy source: mixed from the clock and the pid */
        uint64_t t = uv_hrtime(), x = t ^ ((uint64_t)getpid() << 40);
        for (int i = 0; i < 16; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i] = (unsigned char)(x >> 24);
        }
    }
    cr_uuid4(b, out);
}

/* ------------------------------------------------- cron and signals */

static void on_cron(uv_timer_t *t)
{
    struct worker *w = t->data;
    struct engine_now now = now_of(w);
    if (now.loop_ms - w->budget_synced_ms >= BUDGET_SYNC_MS) {
        w->budget_synced_ms = now.loop_ms;
        budget_sync(w, 1);
    }
    fleet_limits_tick(w->limits);
    fleet_pools_tick(w->pools);
    engine_on_tick(w->engine, now);
}

static void shutdown_warm(void *owner)
{
    struct worker *w = owner;
    if (engine_shutting_down(w->engine))
        return;
    if (w->restart)
        sdnotify_reloading(&w->notify);
    else
        sdnotify_stopping(&w->notify);
    broker_stop_consuming(w->broker);
    engine_shutdown(w->engine, now_of(w), 0);
}

/* SIGHUP is Celery's restart: a warm shutdown, then the same binary with the
 * same arguments in the same process (cmd/main.c re-executes it), which says
 * READY=1 again once it is up, so that systemd's ExecReload sees the reload
 * end. A stop asked for during the restart's shutdown wins over it and stays
 * warm; only a second stop goes cold. */
static void on_signal(uv_signal_t *s, int signum)
{
    struct worker *w = s->data;
    if (signum == SIGHUP) {
        if (engine_shutting_down(w->engine))
            return; /* restarting or stopping already */
        LOG(LOG_WARNING, "Restarting celeriac (SIGHUP): warm shutdown, then exec");
        w->restart = 1;
        shutdown_warm(w);
        return;
    }
    if (w->restart) {
        w->restart = 0;
        sdnotify_stopping(&w->notify);
        return;
    }
    if (engine_shutting_down(w->engine))
        engine_shutdown(w->engine, now_of(w), 1);
    else
        shutdown_warm(w);
}

/* ------------------------------------------------------------ lifecycle */

/* One park queue per task queue: a fixed TTL (so expiry is in order) that
 * dead-letters back to the task queue through the default exchange. */
static int declare_park_queues(struct worker *w)
{
    for (int i = 0; i < w->cfg->queues.n; i++) {
        const char *q = w->cfg->queues.items[i];
        char name[300];
        cJSON *args = cJSON_CreateObject();
        struct broker_queue bq;
        int rc;
        snprintf(name, sizeof(name), ENGINE_PARK_PREFIX "%s", q);
        if (!args ||
            !cJSON_AddNumberToObject(args, "x-message-ttl",
                                     (double)(int64_t)(w->cfg->park_after * 1000)) ||
            !cJSON_AddStringToObject(args, "x-dead-letter-exchange", "") ||
            !cJSON_AddStringToObject(args, "x-dead-letter-routing-key", q)) {
            cJSON_Delete(args);
            return CR_ENOMEM;
        }
        memset(&bq, 0, sizeof(bq));
        bq.name = name;
        bq.durable = 1;
        bq.arguments = args;
        bq.no_consume = 1;
        /* Quorum like the task queues: a classic park queue would live on one
         * node, and a cluster that lost it would refuse the worker everywhere. */
        bq.follow_quorum = 1;
        rc = broker_add_consumer(w->broker, &bq);
        cJSON_Delete(args);
        if (rc)
            return rc;
    }
    return 0;
}

static void engine_config_of(struct engine_config *ec, const struct config *cfg,
                             uint64_t seed)
{
    memset(ec, 0, sizeof(*ec));
    ec->hostname = cfg->hostname;
    ec->pid = (long)getpid();
    ec->concurrency = cfg->concurrency;
    ec->prefetch_multiplier = cfg->prefetch_multiplier;
    ec->aliases = cfg->aliases.items;
    ec->naliases = cfg->aliases.n;
    ec->queues = cfg->queues.items;
    ec->nqueues = cfg->queues.n;
    ec->queue_order =
        !strcmp(cfg->queue_order, "strict") ? ENGINE_QUEUE_STRICT : ENGINE_QUEUE_FAIR;
    ec->acks_early = cfg->acks_early;
    ec->result_extended = cfg->result_extended;
    ec->track_started = cfg->track_started;
    ec->max_message_size = cfg->max_message_size;
    ec->max_retries = cfg->max_retries;
    ec->retry_backoff = cfg->retry_backoff;
    ec->retry_backoff_factor = cfg->retry_backoff_factor;
    ec->retry_backoff_max = cfg->retry_backoff_max;
    ec->retry_jitter = cfg->retry_jitter;
    ec->seed = seed ? seed : 1;
    ec->time_limit = cfg->time_limit;
    ec->soft_time_limit = cfg->soft_time_limit;
    ec->dead_letter_exchange = cfg->dead_letter_exchange;
    ec->park_after = cfg->park_after;
    ec->delayed_horizon_s = cfg->delayed_delivery_horizon;
    ec->delivery_limit = cfg->delivery_limit;
    ec->shutdown_timeout = cfg->shutdown_timeout;
    ec->llm_model = cfg->llm_model;
    ec->llm_embed_model = cfg->llm_embed_model;
    ec->default_queue = cfg->default_queue;
    ec->routes = cfg->task_routes.items;
    ec->nroutes = cfg->task_routes.n;
    ec->new_uuid = new_uuid;
}

static int clients_new(struct worker *w, struct cr_err *err)
{
    const struct config *cfg = w->cfg;
    struct backend_config bc;
    int rc;

    if ((rc = llm_stack_open(&w->ls, w->loop, cfg, err)) != 0)
        return rc;
    memset(&bc, 0, sizeof(bc));
    bc.url = cfg->result_backend;
    bc.result_expires = cfg->result_expires;
    bc.timeout = cfg->redis_timeout;
    bc.health_check_interval = cfg->redis_health_check_interval;
    bc.transport_options = cfg->result_backend_transport_options;
    w->backend = backend_new(w->loop, &bc, err);
    if (!w->backend)
        return err->code ? err->code : CR_ENOMEM;
    if (cfg->limits_redis && cfg->limits_redis[0]) {
        /* The limits' own Redis: no result is stored there, so no expiry,
         * and its absence at start-up is only the limits' Redis being away. */
        char shown[512];
        memset(&bc, 0, sizeof(bc));
        bc.url = cfg->limits_redis;
        bc.timeout = cfg->redis_timeout;
        bc.health_check_interval = cfg->redis_health_check_interval;
        w->limits_bk = backend_new(w->loop, &bc, err);
        if (!w->limits_bk)
            return err->code ? err->code : CR_ENOMEM;
        config_redact_url(cfg->limits_redis, shown, sizeof(shown));
        LOG(LOG_INFO, "limits: shared by the fleet in %s", shown);
    }
    w->limits = fleet_limits_new(w->loop, w->limits_bk ? w->limits_bk : w->backend,
                                 cfg->hostname, err);
    if (!w->limits)
        return err->code ? err->code : CR_ENOMEM;
    llm_client_set_limits(w->ls.client, &fleet_limits_ops, w->limits);
    /* The pools read the limits' coolings: from the same Redis. */
    w->pools = fleet_pools_new(w->loop, w->limits_bk ? w->limits_bk : w->backend,
                               &w->ls.router, w->ls.client, cfg->hostname, err);
    if (!w->pools)
        return err->code ? err->code : CR_ENOMEM;
    w->bcfg.url = cfg->broker;
    w->bcfg.failover_strategy = cfg->broker_failover_strategy;
    w->bcfg.queues = cfg->queues.items;
    w->bcfg.nqueues = cfg->queues.n;
    /* strict tiers need a window per queue, or free's prefetch holds premium back */
    w->bcfg.per_consumer_qos = !strcmp(cfg->queue_order, "strict");
    w->bcfg.quorum = !strcmp(cfg->queue_type, "quorum");
    w->bcfg.delayed_delivery = !strcmp(cfg->delayed_delivery, "on") ? BROKER_DELAYED_ON
                               : !strcmp(cfg->delayed_delivery, "off")
                                   ? BROKER_DELAYED_OFF
                                   : BROKER_DELAYED_AUTO;
    w->bcfg.prefetch_count =
        engine_prefetch_count(cfg->concurrency, cfg->prefetch_multiplier, 0);
    w->bcfg.heartbeat = cfg->heartbeat;
    w->bcfg.connect_timeout = 5;
    w->bcfg.dlx = cfg->dead_letter_exchange[0] ? cfg->dead_letter_exchange : NULL;
    w->bcfg.dlq = cfg->dead_letter_queue[0] ? cfg->dead_letter_queue : NULL;
    w->bcfg.connection_name = cfg->hostname;
    w->bcfg.transport_options =
        cfg->broker_transport_options[0] ? cfg->broker_transport_options : NULL;
    w->bcfg.max_message_bytes = (size_t)cfg->max_message_size;
    /* A delivery is parked (and acked) after --park-after so that the
     * broker's consumer timeout never fires; a node whose consumer_timeout is
     * shorter than that (managed brokers set 15 min and less) would close the
     * channel first. Our own per-consumer timeout, a minute past the park,
     * makes the park always come first, whatever the node's setting. */
    if (cfg->park_after > 0)
        w->bcfg.consumer_timeout_ms = (int64_t)((cfg->park_after + 60) * 1000);
    w->broker = broker_new(w->loop, &w->bcfg, on_delivery, NULL, w, err);
    if (!w->broker)
        return err->code;
    if (cfg->park_after > 0 && (broker_delivery_caps(w->broker) & MSG_CAP_PARK) &&
        declare_park_queues(w))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    return 0;
}

struct worker *worker_new(const struct config *cfg, uv_loop_t *loop, struct cr_err *err)
{
    struct worker *w = cr_calloc(1, sizeof(*w));
    struct engine_now now;
    struct rlimit rl;

    if (!w) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    /* Before anything connects: a typo in an alias's target would otherwise
     * show only as every task it maps failing NotRegistered. */
    if (tasks_check_aliases(cfg->aliases.items, cfg->aliases.n, err)) {
        cr_free(w);
        return NULL;
    }
    w->cfg = cfg;
    w->loop = loop;
    w->ctx.loop = loop;
    llm_stack_init(&w->ls);
    now = now_of(w);
    engine_config_of(&w->ecfg, cfg, ((uint64_t)getpid() << 32) ^ (uint64_t)now.epoch_us);
    /* Thousands of provider connections need thousands of descriptors. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    w->engine = engine_new(&w->ecfg, &worker_ops, w, now);
    if (!w->engine) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        goto fail;
    }
    if (clients_new(w, err))
        goto fail;
    w->tracing = tracing_new(loop, (const char *const *)environ, cfg->hostname, err);
    if (!w->tracing && err->code)
        goto fail;
    w->ctx.otlp = tracing_exporter(w->tracing);
    if (w->tracing && log_format == LOG_FORMAT_JSON)
        log_set_trace_lookup(log_trace_ids, w);
    uv_timer_init(loop, &w->cron);
    w->cron.data = w;
    uv_signal_init(loop, &w->sigterm);
    w->sigterm.data = w;
    uv_signal_init(loop, &w->sigint);
    w->sigint.data = w;
    uv_signal_init(loop, &w->sighup);
    w->sighup.data = w;
    /* Now, not at ready: the watchdog is fed while start-up retries wait. */
    sdnotify_init(&w->notify, loop);
    return w;
fail:
    /* tracing_new() failed or was not reached: nothing of it to close */
    broker_free(w->broker);
    llm_stack_close(&w->ls);
    backend_free(w->backend);
    backend_free(w->limits_bk);
    fleet_limits_free(w->limits);
    fleet_pools_free(w->pools);
    engine_free(w->engine);
    llm_stack_release(&w->ls);
    cr_free(w);
    return NULL;
}

static void banner(struct worker *w)
{
    const struct config *c = w->cfg;
    char broker[512], backend[512], llm[512];
    config_redact_url(c->broker, broker, sizeof(broker));
    config_redact_url(c->result_backend, backend, sizeof(backend));
    if (log_format == LOG_FORMAT_JSON) {
        /* A log pipeline wants objects, not art: the banner's facts in one line. */
        char queues[512] = "";
        size_t n = 0;
        for (int i = 0; i < c->queues.n && n < sizeof(queues); i++)
            n += (size_t)snprintf(queues + n, sizeof(queues) - n, "%s%s", i ? "," : "",
                                  c->queues.items[i]);
        log_write(LOG_INFO,
                  "%s v%s (celeriac): transport %s, results %s, concurrency %d, llm %s "
                  "(model %s), queues %s",
                  c->hostname, CELERIAC_VERSION, broker, backend, c->concurrency,
                  worker_ctx_shown_url(&w->ctx, c->llm_base_url, llm, sizeof(llm)),
                  c->llm_model, queues);
        return;
    }
    fprintf(stderr,
            "\n -------------- %s v%s (celeriac)\n"
            "--- ***** -----\n"
            "-- ******* ---- .> transport:   %s\n"
            "- *** --- * --- .> results:     %s\n"
            "- ** ---------- .> concurrency: %d (libuv, one thread)\n"
            "- ** ---------- .> llm:         %s (model %s)\n"
            "--- ***** ----- \n"
            " -------------- [queues]\n",
            c->hostname, CELERIAC_VERSION, broker, backend, c->concurrency,
            worker_ctx_shown_url(&w->ctx, c->llm_base_url, llm, sizeof(llm)),
            c->llm_model);
    for (int i = 0; i < c->queues.n; i++)
        fprintf(stderr, "                .> %-16s exchange=%s(direct) key=%s\n",
                c->queues.items[i], c->queues.items[i], c->queues.items[i]);
    fprintf(stderr, "\n[tasks]\n");
    for (int i = 0; tasks_builtin_names[i]; i++)
        fprintf(stderr, "  . %s\n", tasks_builtin_names[i]);
    for (int i = 0; i < c->aliases.n; i++)
        fprintf(stderr, "  . %s\n", c->aliases.items[i]);
    fprintf(stderr, "\n");
}

/* ------------------------------------------------------------ start-up */

typedef int attempt_fn(struct worker *w, struct cr_err *err);

static int attempt_backend(struct worker *w, struct cr_err *err)
{
    /* Long enough for a connect's own timeout (5 s) and the backoff the
     * connection waits before its next attempt: an attempt that ends is
     * said, this bound only catches one that never does. */
    return backend_connect_attempt(w->backend, 15000, err);
}

static int attempt_broker(struct worker *w, struct cr_err *err)
{
    return broker_connect(w->broker, err);
}

static void on_pause(uv_timer_t *t)
{
    (void)t;
}

/* Start-up only: waits ms with the loop running, so that the connections
 * already made keep up their heartbeats and health checks meanwhile. The
 * cron timer, not started before the worker is ready, does the waiting. */
static void pause_ms(struct worker *w, int64_t ms)
{
    uv_timer_start(&w->cron, on_pause, (uint64_t)ms, 0);
    while (uv_is_active((uv_handle_t *)&w->cron))
        uv_run(w->loop, UV_RUN_ONCE);
}

/* Celery's start-up: a failed connection is tried again after kombu's wait
 * (util/startup_retry.h), with a WARNING line per failure saying why and
 * when the next try is, until --broker-connection-max-retries retries have
 * failed; then one line, the last reason and the bound. What retrying cannot
 * mend (a refused password on Redis, a queue the broker refuses, a bad URL,
 * out of memory) ends it at once. */
static int connect_at_startup(struct worker *w, attempt_fn *attempt, struct cr_err *err)
{
    const struct config *c = w->cfg;
    struct startup_retry r;
    char why[sizeof(err->msg)];

    startup_retry_init(&r, c->broker_connection_retry_on_startup,
                       c->broker_connection_max_retries);
    for (;;) {
        int rc = attempt(w, err);
        int64_t ms;
        if (rc == 0)
            return 0;
        if (rc == CR_EINVAL || rc == CR_ENOMEM || rc == CR_EPEER)
            return rc;
        snprintf(why, sizeof(why), "%s", err->msg);
        ms = startup_retry_next(&r);
        if (ms < 0) {
            if (r.retries)
                cr_err_set(err, rc,
                           "%.180s; giving up after %d %s "
                           "(--broker-connection-max-retries)",
                           why, r.retries, r.retries == 1 ? "retry" : "retries");
            return rc;
        }
        if (r.max_retries)
            LOG(LOG_WARNING, "%s; trying again in %g s (retry %d of %d)", why,
                (double)ms / 1000.0, r.retries, r.max_retries);
        else
            LOG(LOG_WARNING, "%s; trying again in %g s (retry %d)", why,
                (double)ms / 1000.0, r.retries);
        pause_ms(w, ms);
    }
}

int worker_start(struct worker *w, struct cr_err *err)
{
    struct engine_now now;
    int no_fanout;
    w->ctx.cfg = w->cfg;
    w->ctx.broker = w->broker;
    w->ctx.backend = w->backend;
    w->ctx.limits = w->limits;
    w->ctx.engine = w->engine;
    w->ctx.bcfg = &w->bcfg;
    w->ctx.secrets = &w->ls.secrets;
    w->ctx.request_shutdown = shutdown_warm;
    w->ctx.job_text = job_text;
    w->ctx.owner = w;
    banner(w);
    if (connect_at_startup(w, attempt_backend, err))
        return err->code;
    /* The mailbox before the connection, so that it is declared at set-up
     * with the task queues, where an exclusive queue still held by our own
     * earlier connection (405) is answered (see net/rmq_broker.c). */
    /* SQS has no fanout (kombu's supports_fanout is false): Celery runs
     * neither remote control nor events there, so neither do we. */
    no_fanout = !strcmp(broker_transport(w->broker), "sqs");
    if (no_fanout)
        LOG(LOG_INFO,
            "broker: sqs has no fanout exchanges: remote control and events are "
            "off, as for Celery's workers on SQS");
    else
        w->pidbox = pidbox_new(&w->ctx);
    if (connect_at_startup(w, attempt_broker, err))
        return err->code;
    now = now_of(w);
    w->ctx.started_ms = now.loop_ms;
    w->ctx.started_epoch_us = now.epoch_us;
    if (!no_fanout)
        w->events = w->ctx.events = events_new(&w->ctx);
    w->progress = progress_new(&w->ctx);
    w->metrics = metrics_new(&w->ctx, err);
    if (!w->metrics && err->code)
        return err->code;
    if (broker_wait_subscribed(w->broker, 5000))
        LOG(LOG_WARNING, "broker: remote control not subscribed yet after 5 s");
    uv_timer_start(&w->cron, on_cron, CRON_MS, CRON_MS);
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    uv_signal_start(&w->sighup, on_signal, SIGHUP);
    /* Always printed, whatever the level: scripts wait for this line. */
    log_write(LOG_INFO, "%s ready.", w->cfg->hostname);
    {
        char status[256];
        snprintf(status, sizeof(status), "%.120s: consuming %d queue%s, concurrency %d",
                 w->cfg->hostname, w->cfg->queues.n, w->cfg->queues.n == 1 ? "" : "s",
                 w->cfg->concurrency);
        sdnotify_ready(&w->notify, status);
    }
    return 0;
}

int worker_run(struct worker *w)
{
    uv_run(w->loop, UV_RUN_DEFAULT);
    return w->exit_code;
}

int worker_restart_asked(const struct worker *w)
{
    return w->restart && w->exit_code == 0;
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

void worker_free(struct worker *w)
{
    if (!w)
        return;
    /* Order matters for a cold stop: the broker connection closes first, so
     * every unacked delivery is back in its queue before anything else; the
     * completions the clients still owe come back into a halted engine. */
    engine_halt(w->engine);
    log_set_trace_lookup(NULL, NULL);
    /* worker-offline goes out while the connection is still up */
    events_free(w->events);
    w->events = w->ctx.events = NULL;
    pidbox_free(w->pidbox);
    w->pidbox = NULL;
    metrics_free(w->metrics);
    w->metrics = NULL;
    progress_free(w->progress);
    w->progress = NULL;
    broker_free(w->broker);
    w->broker = w->ctx.broker = NULL;
    llm_stack_close(&w->ls);
    backend_free(w->backend);
    backend_free(w->limits_bk);
    fleet_limits_free(w->limits);
    fleet_pools_free(w->pools);
    /* its handles close with the others; the spans of calls that come back
     * cancelled below are freed unsent */
    tracing_stop(w->tracing);
    w->ctx.otlp = NULL;
    uv_close((uv_handle_t *)&w->cron, on_closed);
    uv_close((uv_handle_t *)&w->sigterm, on_closed);
    uv_close((uv_handle_t *)&w->sigint, on_closed);
    uv_close((uv_handle_t *)&w->sighup, on_closed);
    sdnotify_release(&w->notify);
    /* Let every closed handle run its close callback. */
    uv_run(w->loop, UV_RUN_DEFAULT);
    engine_free(w->engine);
    /* after engine_free(): every job's forget has run */
    tracing_free(w->tracing);
    llm_stack_release(&w->ls);
    cr_free(w);
}
