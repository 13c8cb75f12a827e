/* metrics.c -- Prometheus metrics and /healthz, served by libwebsockets on the
 * worker's libuv loop (a foreign loop to lws).
 *
 * Counters and histograms are updated from worker.c's notify op; gauges (in-flight,
 * prefetched, queue depths, connection state) are read when /metrics is
 * scraped, from the worker and from the last queue-depth poll. The text comes
 * from protocol/prom (pure). lws does all HTTP parsing; this file only routes
 * a path to a body and writes it out in chunks from the writeable callback. */
#include "metrics.h"

#include <libwebsockets.h>
#include <string.h>

#include "events.h"
#include "fleet_limits.h"
#include "llm/limiter.h"
#include "net/listener.h"
#include "net/otlp.h"
#include "util/log.h"
#include "util/version.h"
#include "worker_ctx.h"
#include "protocol/prom.h"
#include "util/alloc.h"
#include "util/buf.h"

#define WRITE_CHUNK 16384
#define MIN_POLL_MS 500

struct queue_depth {
    char *name;
    uint32_t messages, consumers;
    int known; /* 0 until a poll answered, or when the queue is missing */
};

struct metrics {
    const struct worker_ctx *w;
    struct prom_registry *reg;
    /* counted as things happen */
    struct prom_family *received, *tasks, *runtime, *wait, *retries, *dead_letters;
    struct prom_family *llm_duration, *llm_ttft, *tokens_in, *tokens_out, *llm_errors;
    struct prom_family *tokens_kind, *cost;
    /* set at scrape time */
    struct prom_family *info, *in_flight, *prefetched, *scheduled, *concurrency;
    struct prom_family *queue_messages, *queue_consumers, *broker_up, *backend_up;
    struct prom_family *broker_blocked;
    struct prom_family *broker_reconnects, *backend_reconnects, *uptime, *events_on;
    struct prom_family *otel_exported, *otel_dropped;
    /* the providers' shared limits, fleet-wide (read from Redis) */
    struct prom_family *lim_max, *lim_shared, *lim_granted, *lim_waited, *lim_wait_s;
    struct prom_family *lim_from_grants;
    struct prom_family *lim_coolings, *lim_cooled, *lim_cooled_until, *lim_in_flight;
    struct prom_family *lim_req_min, *lim_tok_min, *lim_holds;

    uv_timer_t *timer; /* queue polls and loop liveness; heap, freed on close */
    uint64_t poll_ms;
    uint64_t last_tick_ms;
    struct queue_depth *depths;
    int ndepths;
    int polling; /* index of the queue being polled, or -1 */

    struct lws_context *lws;
    struct lws_vhost *vh;
    struct listener *listener; /* ours, not lws's: see net/listener.h */
};

/* ---------------------------------------------------------------- setup */

static const double runtime_buckets[] = {0.1, 0.25, 0.5, 1,   2.5, 5,
                                         10,  30,   60,  120, 300, 600};
static const double wait_buckets[] = {0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300};
static const double ttft_buckets[] = {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30};

#define NB(a) ((int)(sizeof(a) / sizeof(a[0])))

static int add_families(struct metrics *m)
{
    static const char *const task[] = {"task"};
    static const char *const task_state[] = {"task", "state"};
    static const char *const model[] = {"model"};
    static const char *const status_type[] = {"model", "status", "type"};
    static const char *const queue[] = {"queue"};
    static const char *const info[] = {"hostname", "version"};
    static const char *const provider_model[] = {"provider", "model"};
    static const char *const provider_model_kind[] = {"provider", "model", "kind"};
    struct prom_registry *r = m->reg;
#define F(field, name, help, type, labels, nl, b, nb)                                    \
    do {                                                                                 \
        m->field = prom_family_add(r, name, help, type, labels, nl, b, nb);              \
        if (!m->field)                                                                   \
            return CR_ENOMEM;                                                            \
    } while (0)
    F(info, "celeriac_worker_info", "The worker's node name and version.", PROM_GAUGE,
      info, 2, NULL, 0);
    F(uptime, "celeriac_uptime_seconds", "Seconds since the worker started.", PROM_GAUGE,
      NULL, 0, NULL, 0);
    F(received, "celeriac_tasks_received_total", "Task messages received, by task name.",
      PROM_COUNTER, task, 1, NULL, 0);
    F(tasks, "celeriac_tasks_total",
      "Tasks finished, by task name and final state (SUCCESS, FAILURE, REVOKED, "
      "REJECTED).",
      PROM_COUNTER, task_state, 2, NULL, 0);
    F(retries, "celeriac_task_retries_total", "Task retries published, by task name.",
      PROM_COUNTER, task, 1, NULL, 0);
    F(dead_letters, "celeriac_dead_letters_total",
      "Messages dead-lettered, by task name.", PROM_COUNTER, task, 1, NULL, 0);
    F(runtime, "celeriac_task_runtime_seconds",
      "Time from task start to its outcome, by task name.", PROM_HISTOGRAM, task, 1,
      runtime_buckets, NB(runtime_buckets));
    F(wait, "celeriac_task_queue_wait_seconds",
      "Time from receipt to start (prefetch and eta wait included), by task name.",
      PROM_HISTOGRAM, task, 1, wait_buckets, NB(wait_buckets));
    F(in_flight, "celeriac_tasks_in_flight", "Tasks running now (holding a slot).",
      PROM_GAUGE, NULL, 0, NULL, 0);
    F(prefetched, "celeriac_tasks_prefetched",
      "Tasks received and not started yet (eta-held ones included).", PROM_GAUGE, NULL, 0,
      NULL, 0);
    F(scheduled, "celeriac_tasks_scheduled", "Tasks held until their eta.", PROM_GAUGE,
      NULL, 0, NULL, 0);
    F(concurrency, "celeriac_concurrency", "Task slots (changed by pool_grow/shrink).",
      PROM_GAUGE, NULL, 0, NULL, 0);
    F(queue_messages, "celeriac_queue_messages",
      "Messages ready in each consumed queue (polled).", PROM_GAUGE, queue, 1, NULL, 0);
    F(queue_consumers, "celeriac_queue_consumers",
      "Consumers of each consumed queue (polled).", PROM_GAUGE, queue, 1, NULL, 0);
    F(llm_duration, "celeriac_llm_request_duration_seconds",
      "LLM request duration, by model.", PROM_HISTOGRAM, model, 1, runtime_buckets,
      NB(runtime_buckets));
    F(llm_ttft, "celeriac_llm_time_to_first_token_seconds",
      "LLM time to first token, by model.", PROM_HISTOGRAM, model, 1, ttft_buckets,
      NB(ttft_buckets));
    F(tokens_in, "celeriac_llm_prompt_tokens_total", "Prompt tokens sent, by model.",
      PROM_COUNTER, model, 1, NULL, 0);
    F(tokens_out, "celeriac_llm_completion_tokens_total",
      "Completion tokens received, by model.", PROM_COUNTER, model, 1, NULL, 0);
    F(tokens_kind, "celeriac_llm_tokens_total",
      "Tokens by provider, model and kind (prompt, completion, and the parts providers "
      "report: cached, cache_creation, reasoning).",
      PROM_COUNTER, provider_model_kind, 3, NULL, 0);
    F(cost, "celeriac_llm_cost_usd_total",
      "What LLM answers cost in USD, by provider and model, from the providers' prices.",
      PROM_COUNTER, provider_model, 2, NULL, 0);
    F(llm_errors, "celeriac_llm_errors_total",
      "Failed LLM requests, by model, HTTP status (0: no response) and error type.",
      PROM_COUNTER, status_type, 3, NULL, 0);
    F(broker_up, "celeriac_broker_connected", "1 while connected to the broker.",
      PROM_GAUGE, NULL, 0, NULL, 0);
    F(broker_blocked, "celeriac_broker_blocked",
      "1 while the broker blocks publishing (memory or disk alarm).", PROM_GAUGE, NULL, 0,
      NULL, 0);
    F(backend_up, "celeriac_backend_connected",
      "1 while connected to the result backend.", PROM_GAUGE, NULL, 0, NULL, 0);
    F(broker_reconnects, "celeriac_broker_reconnects_total",
      "Broker reconnections since start.", PROM_COUNTER, NULL, 0, NULL, 0);
    F(backend_reconnects, "celeriac_backend_reconnects_total",
      "Result backend reconnections since start.", PROM_COUNTER, NULL, 0, NULL, 0);
    F(events_on, "celeriac_task_events_enabled", "1 while task events are sent.",
      PROM_GAUGE, NULL, 0, NULL, 0);
    F(otel_exported, "celeriac_otel_spans_exported_total",
      "Trace spans an OTLP collector accepted.", PROM_COUNTER, NULL, 0, NULL, 0);
    F(otel_dropped, "celeriac_otel_spans_dropped_total",
      "Trace spans dropped: the export queue was full or the collector did not take "
      "them.",
      PROM_COUNTER, NULL, 0, NULL, 0);
    F(lim_max, "celeriac_limit_max",
      "A provider's limit per (provider, model) and kind (rpm, tpm, concurrency), as "
      "configured.",
      PROM_GAUGE, provider_model_kind, 3, NULL, 0);
    F(lim_shared, "celeriac_limit_shared",
      "1 while the limit is counted with the fleet in Redis, 0 while this worker counts "
      "alone (Redis away).",
      PROM_GAUGE, provider_model, 2, NULL, 0);
    F(lim_granted, "celeriac_limit_calls_granted_total",
      "Calls the limit let through, fleet-wide (every worker shows the same figure).",
      PROM_COUNTER, provider_model, 2, NULL, 0);
    F(lim_from_grants, "celeriac_limit_calls_from_grants_total",
      "Calls this worker let through on request slots Redis charged ahead, without "
      "a round trip (rpm-only limits of 600 rpm or more).",
      PROM_COUNTER, provider_model, 2, NULL, 0);
    F(lim_waited, "celeriac_limit_calls_waited_total",
      "Calls the limit held back before letting them through, fleet-wide.", PROM_COUNTER,
      provider_model, 2, NULL, 0);
    F(lim_wait_s, "celeriac_limit_wait_seconds_total",
      "Time the held-back calls waited for the limit, fleet-wide.", PROM_COUNTER,
      provider_model, 2, NULL, 0);
    F(lim_coolings, "celeriac_limit_coolings_total",
      "429s (and 503/529 naming a delay) that cooled the limit, fleet-wide.",
      PROM_COUNTER, provider_model, 2, NULL, 0);
    F(lim_holds, "celeriac_limit_holds_total",
      "Responses whose rate-limit headers said a provider's limit was spent "
      "(remaining 0) and held the limit until their reset, fleet-wide.",
      PROM_COUNTER, provider_model, 2, NULL, 0);
    F(lim_cooled, "celeriac_limit_cooled",
      "1 while the limit is cooled (no call goes before the provider's delay ends).",
      PROM_GAUGE, provider_model, 2, NULL, 0);
    F(lim_cooled_until, "celeriac_limit_cooled_until_seconds",
      "Unix time the cooling ends (Redis's clock), 0 when not cooled.", PROM_GAUGE,
      provider_model, 2, NULL, 0);
    F(lim_in_flight, "celeriac_limit_in_flight",
      "Concurrency permits held now across the fleet.", PROM_GAUGE, provider_model, 2,
      NULL, 0);
    F(lim_req_min, "celeriac_limit_requests_last_minute",
      "Calls let through in the last 60 s across the fleet (a sliding estimate).",
      PROM_GAUGE, provider_model, 2, NULL, 0);
    F(lim_tok_min, "celeriac_limit_tokens_last_minute",
      "Tokens charged in the last 60 s across the fleet (estimates corrected by usage).",
      PROM_GAUGE, provider_model, 2, NULL, 0);
#undef F
    return 0;
}

/* --------------------------------------------------------- task counters */

static const char *job_task(const struct job *j)
{
    return job_name(j);
}

/* Tokens by kind and cost, by provider and model. */
static void count_kinds(struct metrics *m, const char *model,
                        const struct llm_result *llm)
{
    const char *provider = llm->provider && llm->provider[0] ? llm->provider : "default";
    const char *kinds[5] = {"prompt", "completion", "cached", "cache_creation",
                            "reasoning"};
    long n[5] = {llm->text ? llm->prompt_tokens : llm->embed_tokens,
                 llm->text ? llm->completion_tokens : -1, llm->cached_tokens,
                 llm->cache_write_tokens, llm->reasoning_tokens};
    const char *pm[2] = {provider, model};
    for (int i = 0; i < 5; i++) {
        const char *labels[3] = {provider, model, kinds[i]};
        if (n[i] > 0)
            prom_add(m->tokens_kind, labels, (double)n[i]);
    }
    if (llm->cost_usd > 0)
        prom_add(m->cost, pm, llm->cost_usd);
}

static void count_llm(struct metrics *m, struct job *j, const struct llm_result *llm)
{
    const char *model[] = {events_job_model(j)};
    if (llm->elapsed_s >= 0)
        prom_observe(m->llm_duration, model, llm->elapsed_s);
    if (llm->ttft_s >= 0)
        prom_observe(m->llm_ttft, model, llm->ttft_s);
    if (llm->text) {
        if (llm->prompt_tokens > 0)
            prom_add(m->tokens_in, model, (double)llm->prompt_tokens);
        if (llm->completion_tokens > 0)
            prom_add(m->tokens_out, model, (double)llm->completion_tokens);
    } else if (llm->embed_tokens > 0) {
        prom_add(m->tokens_in, model, (double)llm->embed_tokens);
    }
    count_kinds(m, model[0], llm);
    if (llm->verdict != LLM_OK) {
        char status[16];
        const char *labels[] = {model[0], status, llm->exc_type ? llm->exc_type : ""};
        snprintf(status, sizeof(status), "%ld", llm->http_status);
        prom_add(m->llm_errors, labels, 1);
    }
}

static void count_final(struct metrics *m, struct job *j, const char *state)
{
    const char *labels[] = {job_task(j), state};
    prom_add(m->tasks, labels, 1);
}

void metrics_on_task(struct metrics *m, struct job *j, const struct task_event_info *info)
{
    const char *task[1];
    if (!m)
        return;
    task[0] = job_task(j);
    switch (info->type) {
    case TEV_RECEIVED:
        prom_add(m->received, task, 1);
        break;
    case TEV_STARTED:
        prom_observe(m->wait, task, (double)(j->t_started - j->t_received) / 1000.0);
        break;
    case TEV_SUCCEEDED:
        count_final(m, j, "SUCCESS");
        prom_observe(m->runtime, task, info->runtime_s);
        break;
    case TEV_FAILED:
        count_final(m, j, "FAILURE");
        if (j->t_started)
            prom_observe(m->runtime, task, info->runtime_s);
        break;
    case TEV_RETRIED:
        prom_add(m->retries, task, 1);
        break;
    case TEV_REVOKED:
        count_final(m, j, "REVOKED");
        break;
    case TEV_REJECTED:
        count_final(m, j, "REJECTED");
        break;
    case TEV_DEAD_LETTERED: /* metrics_on_dead_letter() counts it */
        break;
    case TEV_FALLBACK: /* the call is counted below, the task at its end */
        break;
    }
    if (info->llm)
        count_llm(m, j, info->llm);
}

void metrics_on_dead_letter(struct metrics *m, struct job *j)
{
    const char *task[1];
    if (!m)
        return;
    task[0] = job_task(j);
    prom_add(m->dead_letters, task, 1);
}

/* ---------------------------------------------------------- queue polls */

static void poll_next(struct metrics *m);

static void on_queue_stats(struct broker *b, int ok, uint32_t messages,
                           uint32_t consumers, void *privdata)
{
    struct metrics *m = privdata;
    struct queue_depth *d;
    (void)b;
    if (m->polling < 0 || m->polling >= m->ndepths)
        return;
    d = &m->depths[m->polling];
    d->known = ok;
    d->messages = ok ? messages : 0;
    d->consumers = ok ? consumers : 0;
    m->polling++;
    poll_next(m);
}

/* One poll at a time, chained from each answer: a round costs one round trip
 * per queue and never floods the channel. */
static void poll_next(struct metrics *m)
{
    while (m->polling >= 0 && m->polling < m->ndepths) {
        if (broker_queue_stats(m->w->broker, m->depths[m->polling].name, on_queue_stats,
                               m) == 0)
            return;
        m->polling++; /* not connected: keep the last value, try next round */
    }
    m->polling = -1;
}

struct names_arg {
    struct metrics *m;
    struct queue_depth *next;
    int n, cap, oom;
};

static void add_name(const struct broker_queue *q, void *arg)
{
    struct names_arg *a = arg;
    struct queue_depth *d;
    if (a->oom || q->no_ack) /* the mailbox is not a task queue */
        return;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        struct queue_depth *p = cr_realloc(a->next, (size_t)cap * sizeof(*p));
        if (!p) {
            a->oom = 1;
            return;
        }
        a->next = p;
        a->cap = cap;
    }
    d = &a->next[a->n];
    memset(d, 0, sizeof(*d));
    d->name = cr_strdup(q->name);
    if (!d->name) {
        a->oom = 1;
        return;
    }
    /* keep the last known depth of a queue still consumed */
    for (int i = 0; i < a->m->ndepths; i++)
        if (!strcmp(a->m->depths[i].name, q->name)) {
            d->messages = a->m->depths[i].messages;
            d->consumers = a->m->depths[i].consumers;
            d->known = a->m->depths[i].known;
        }
    a->n++;
}

static void free_depths(struct queue_depth *d, int n)
{
    for (int i = 0; i < n; i++)
        cr_free(d[i].name);
    cr_free(d);
}

static void start_round(struct metrics *m)
{
    struct names_arg a = {m, NULL, 0, 0, 0};
    if (m->polling >= 0)
        return; /* the last round is still waiting for an answer */
    broker_each_consumer(m->w->broker, add_name, &a);
    if (a.oom) {
        free_depths(a.next, a.n);
        return;
    }
    free_depths(m->depths, m->ndepths);
    m->depths = a.next;
    m->ndepths = a.n;
    m->polling = 0;
    poll_next(m);
}

static void on_tick(uv_timer_t *t)
{
    struct metrics *m = t->data;
    if (!m)
        return;
    m->last_tick_ms = uv_now(m->w->loop);
    start_round(m);
}

/* ------------------------------------------------------------ rendering */

static void set_gauges(struct metrics *m)
{
    const struct worker_ctx *w = m->w;
    const char *info[] = {w->cfg->hostname, CELERIAC_VERSION};
    struct engine_stats st;
    struct otlp_stats ot;

    engine_stats(w->engine, &st);
    prom_set(m->info, info, 1);
    prom_set(m->uptime, NULL, (double)(uv_now(w->loop) - w->started_ms) / 1000.0);
    prom_set(m->in_flight, NULL, st.active);
    /* received and not started: ready, eta-held, or still asking the backend
     * whether a result is stored already */
    prom_set(m->prefetched, NULL, (double)(st.nready + st.neta + st.nchecking));
    prom_set(m->scheduled, NULL, (double)st.neta);
    prom_set(m->concurrency, NULL, st.concurrency);
    prom_set(m->broker_up, NULL, broker_connected(w->broker));
    prom_set(m->broker_blocked, NULL, broker_blocked(w->broker, NULL));
    prom_set(m->backend_up, NULL, backend_connected(w->backend));
    prom_set(m->broker_reconnects, NULL, (double)broker_reconnects(w->broker));
    prom_set(m->backend_reconnects, NULL, (double)backend_reconnects(w->backend));
    prom_set(m->events_on, NULL, events_enabled(w->events));
    otlp_exporter_stats(w->otlp, &ot);
    prom_set(m->otel_exported, NULL, (double)ot.exported);
    prom_set(m->otel_dropped, NULL, (double)ot.dropped);
    prom_family_clear(m->queue_messages);
    prom_family_clear(m->queue_consumers);
    for (int i = 0; i < m->ndepths; i++) {
        const char *q[] = {m->depths[i].name};
        if (!m->depths[i].known)
            continue;
        prom_set(m->queue_messages, q, m->depths[i].messages);
        prom_set(m->queue_consumers, q, m->depths[i].consumers);
    }
}

/* The shared limits' figures, as their owner last read them from Redis. */
static void set_limits(struct metrics *m)
{
    struct fleet_limit_stats st;
    int64_t now_ms = clock_epoch_us() / 1000;
    for (int i = 0; fleet_limits_stats(m->w->limits, i, &st); i++) {
        char provider[192];
        const char *slash = strchr(st.key, '/');
        size_t n = slash ? (size_t)(slash - st.key) : strlen(st.key);
        const char *pm[2] = {provider, slash ? slash + 1 : ""};
        int cooled = st.cooled_until_ms > now_ms;
        if (n >= sizeof(provider))
            n = sizeof(provider) - 1;
        memcpy(provider, st.key, n);
        provider[n] = 0;
        if (st.cfg->rpm > 0)
            prom_set(m->lim_max, (const char *[]){provider, pm[1], "rpm"}, st.cfg->rpm);
        if (st.cfg->tpm > 0)
            prom_set(m->lim_max, (const char *[]){provider, pm[1], "tpm"}, st.cfg->tpm);
        if (st.cfg->concurrency > 0)
            prom_set(m->lim_max, (const char *[]){provider, pm[1], "concurrency"},
                     (double)st.cfg->concurrency);
        prom_set(m->lim_shared, pm, st.shared);
        prom_set(m->lim_from_grants, pm, st.from_grants);
        if (!st.known)
            continue;
        prom_set(m->lim_granted, pm, st.granted);
        prom_set(m->lim_waited, pm, st.waited);
        prom_set(m->lim_wait_s, pm, st.wait_s);
        prom_set(m->lim_coolings, pm, st.coolings);
        prom_set(m->lim_holds, pm, st.holds);
        prom_set(m->lim_cooled, pm, cooled);
        prom_set(m->lim_cooled_until, pm,
                 cooled ? (double)st.cooled_until_ms / 1000.0 : 0);
        prom_set(m->lim_in_flight, pm, st.in_flight);
        prom_set(m->lim_req_min, pm, st.requests_last_min);
        prom_set(m->lim_tok_min, pm, st.tokens_last_min);
    }
}

int metrics_render(struct metrics *m, struct buf *out)
{
    set_gauges(m);
    set_limits(m);
    return prom_render(m->reg, out);
}

/* ----------------------------------------------------------------- HTTP */

/* Per connection: the response body being written, with LWS_PRE bytes of
 * room before it as lws_write() requires. */
struct http_pss {
    unsigned char *buf;
    size_t len, off;
};

static int loop_alive(struct metrics *m)
{
    uint64_t now = uv_now(m->w->loop);
    /* the timer fires every poll_ms; a loop stuck for two periods is not alive */
    return now - m->last_tick_ms <= 2 * m->poll_ms + 1000;
}

static int make_health(struct metrics *m, struct buf *body)
{
    const struct worker_ctx *w = m->w;
    int broker = broker_connected(w->broker), backend = backend_connected(w->backend);
    int blocked = broker_blocked(w->broker, NULL);
    int loop = loop_alive(m);
    int ok = broker && backend && loop;
    /* Blocked publishing is degraded, not failed: tasks still run and are
     * acked, and restarting the worker would not lift a broker alarm. */
    if (buf_printf(body,
                   "{\"status\": \"%s\", \"broker\": %s, \"broker_blocked\": %s, "
                   "\"backend\": %s, \"loop\": %s}\n",
                   !ok       ? "fail"
                   : blocked ? "degraded"
                             : "ok",
                   broker ? "true" : "false", blocked ? "true" : "false",
                   backend ? "true" : "false", loop ? "true" : "false"))
        return -1;
    return ok ? HTTP_STATUS_OK : HTTP_STATUS_SERVICE_UNAVAILABLE;
}

static int respond(struct lws *wsi, struct http_pss *pss, unsigned status,
                   const char *ctype, struct buf *body)
{
    unsigned char hdr[LWS_PRE + 512], *start = hdr + LWS_PRE, *p = start;
    unsigned char *end = hdr + sizeof(hdr) - 1;

    pss->buf = cr_malloc(LWS_PRE + body->len + 1);
    if (!pss->buf)
        return -1;
    if (body->len)
        memcpy(pss->buf + LWS_PRE, body->data, body->len);
    pss->len = body->len;
    pss->off = 0;
    if (lws_add_http_common_headers(wsi, status, ctype, (lws_filepos_t)body->len, &p,
                                    end) ||
        lws_add_http_header_by_name(wsi, (const unsigned char *)"cache-control:",
                                    (const unsigned char *)"no-store", 8, &p, end) ||
        lws_finalize_write_http_header(wsi, start, &p, end))
        return -1;
    lws_callback_on_writable(wsi);
    return 0;
}

static int on_request(struct metrics *m, struct lws *wsi, struct http_pss *pss,
                      const char *path)
{
    struct buf body;
    int status, rc;
    const char *ctype = "text/plain; charset=utf-8";

    buf_init(&body);
    if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) <= 0) {
        status = HTTP_STATUS_METHOD_NOT_ALLOWED;
        rc = buf_puts(&body, "method not allowed\n");
    } else if (!strcmp(path, "/metrics")) {
        status = HTTP_STATUS_OK;
        ctype = "text/plain; version=0.0.4; charset=utf-8";
        rc = metrics_render(m, &body);
    } else if (!strcmp(path, "/healthz")) {
        ctype = "application/json";
        status = make_health(m, &body);
        rc = status < 0 ? CR_ENOMEM : 0;
    } else if (!strcmp(path, "/")) {
        status = HTTP_STATUS_OK;
        rc = buf_puts(&body, "celeriac worker: /metrics /healthz\n");
    } else {
        status = HTTP_STATUS_NOT_FOUND;
        rc = buf_puts(&body, "not found\n");
    }
    if (!rc)
        rc = respond(wsi, pss, (unsigned)status, ctype, &body);
    buf_release(&body);
    return rc ? -1 : 0;
}

static int on_writable(struct lws *wsi, struct http_pss *pss)
{
    size_t n;
    int final;
    if (!pss->buf)
        return 0;
    n = pss->len - pss->off;
    if (n > WRITE_CHUNK)
        n = WRITE_CHUNK;
    final = pss->off + n == pss->len;
    /* lws_write() may use the LWS_PRE bytes before the pointer; before a later
     * chunk those are body bytes already sent. */
    if (lws_write(wsi, pss->buf + LWS_PRE + pss->off, n,
                  final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < 0)
        return -1;
    pss->off += n;
    if (!final) {
        lws_callback_on_writable(wsi);
        return 0;
    }
    cr_free(pss->buf);
    pss->buf = NULL;
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

static int on_http(struct lws *wsi, enum lws_callback_reasons reason, void *user,
                   void *in, size_t len)
{
    struct http_pss *pss = user;
    struct metrics *m = lws_context_user(lws_get_context(wsi));

    switch (reason) {
    case LWS_CALLBACK_HTTP:
        return on_request(m, wsi, pss, in ? (const char *)in : "/");
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return on_writable(wsi, pss);
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        if (pss) {
            cr_free(pss->buf);
            pss->buf = NULL;
        }
        break;
    default:
        break;
    }
    return lws_callback_http_dummy(wsi, reason, user, in, len);
}

static const struct lws_protocols protocols[] = {
    {"http", on_http, sizeof(struct http_pss), 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* lws reports through its own logger; its warnings and errors join ours. */
static void lws_log(int level, const char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    LOG(level == LLL_ERR ? LOG_ERROR : LOG_WARNING, "metrics: lws: %.*s", (int)n, line);
}

/* An accepted connection goes to lws as if its own listener had taken it
 * (lws closes fd if it cannot adopt it). */
static void on_accept(struct listener *l, int fd, void *privdata)
{
    struct metrics *m = privdata;
    (void)l;
    lws_adopt_socket_vhost(m->vh, fd);
}

static int start_server(struct metrics *m, struct cr_err *err)
{
    const struct config *c = m->w->cfg;
    struct lws_context_creation_info info;
    void *loops[1];
    const char *where = c->metrics_host ? c->metrics_host : "";
    struct cr_err e = {0};
    char host[300];

    /* The sockets first: a port in use fails here, before lws exists. */
    m->listener = listener_new(m->w->loop, where, c->metrics_port, on_accept, m, &e);
    if (!m->listener)
        return cr_err_set(err, e.code, "metrics: %s", e.msg);
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log);
    memset(&info, 0, sizeof(info));
    loops[0] = m->w->loop;
    info.foreign_loops = loops;
    /* An explicit vhost that listens nowhere: the listener hands it
     * connections. */
    info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_UV_NO_SIGSEGV_SIGFPE_SPIN |
                   LWS_SERVER_OPTION_EXPLICIT_VHOSTS;
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;
    info.protocols = protocols;
    info.user = m;
    info.vhost_name = "metrics";
    info.timeout_secs = 10;
    m->lws = lws_create_context(&info);
    m->vh = m->lws ? lws_create_vhost(m->lws, &info) : NULL;
    if (!m->vh)
        return cr_err_set(err, CR_EIO,
                          "metrics: cannot start the HTTP server (libwebsockets)");
    listener_url_host(where[0] ? where : "0.0.0.0", host, sizeof(host));
    if (!strcmp(host, listener_addresses(m->listener)))
        LOG(LOG_INFO, "metrics: serving /metrics and /healthz on http://%s:%d", host,
            listener_port(m->listener));
    else
        LOG(LOG_INFO, "metrics: serving /metrics and /healthz on http://%s:%d (%s)", host,
            listener_port(m->listener), listener_addresses(m->listener));
    return 0;
}

/* ------------------------------------------------------------- lifecycle */

/* lws 4.1 on a foreign loop destroys a context in phases: the first
 * lws_context_destroy() closes its handles, and a second call, once their
 * close callbacks have run, frees the context. That happens during the
 * worker's last loop run, after metrics_free(); this timer waits for it.
 * lws marks its static handles with handle->data == context: when no such
 * handle is left, the second call is safe. If that never shows, or the
 * convention is not seen at all, the context is left to the process exit
 * rather than freed under a live handle. */
#define REAP_TICK_MS 1
#define REAP_MAX_TICKS 2000

struct lws_reaper {
    uv_timer_t timer;
    struct lws_context *ctx;
    int ticks;
};

struct ctx_walk {
    const void *ctx;
    int n;
};

static void count_ctx_handles(uv_handle_t *h, void *arg)
{
    struct ctx_walk *cw = arg;
    if (h->data == cw->ctx)
        cw->n++;
}

static int lws_handles(uv_loop_t *loop, const void *ctx)
{
    struct ctx_walk cw = {ctx, 0};
    uv_walk(loop, count_ctx_handles, &cw);
    return cw.n;
}

static void on_reaper_closed(uv_handle_t *h)
{
    cr_free(h->data);
}

static void on_reap(uv_timer_t *t)
{
    struct lws_reaper *r = t->data;
    int left = lws_handles(t->loop, r->ctx);
    if (left && ++r->ticks < REAP_MAX_TICKS)
        return;
    if (!left)
        lws_context_destroy(r->ctx);
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, on_reaper_closed);
}

static void destroy_lws(uv_loop_t *loop, struct lws_context *ctx)
{
    struct lws_reaper *r = lws_handles(loop, ctx) ? cr_calloc(1, sizeof(*r)) : NULL;
    lws_context_destroy(ctx);
    if (!r)
        return;
    r->ctx = ctx;
    uv_timer_init(loop, &r->timer);
    r->timer.data = r;
    uv_timer_start(&r->timer, on_reap, REAP_TICK_MS, REAP_TICK_MS);
}

static void on_timer_closed(uv_handle_t *h)
{
    cr_free(h);
}

struct metrics *metrics_new(const struct worker_ctx *w, struct cr_err *err)
{
    struct metrics *m = cr_calloc(1, sizeof(*m));
    double poll_s = w->cfg->event_heartbeat;

    if (!m || !(m->reg = prom_registry_new()) || add_families(m) ||
        !(m->timer = cr_malloc(sizeof(*m->timer)))) {
        if (m)
            prom_registry_free(m->reg);
        cr_free(m);
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    m->w = w;
    m->polling = -1;
    /* Queues are polled as often as heartbeats go out (2 s by default). */
    m->poll_ms = (uint64_t)(poll_s * 1000.0);
    if (m->poll_ms < MIN_POLL_MS)
        m->poll_ms = MIN_POLL_MS;
    uv_timer_init(w->loop, m->timer);
    m->timer->data = m;
    m->last_tick_ms = uv_now(w->loop);
    uv_timer_start(m->timer, on_tick, 0, m->poll_ms);
    if (w->cfg->metrics_port > 0 && start_server(m, err)) {
        metrics_free(m);
        return NULL;
    }
    return m;
}

void metrics_free(struct metrics *m)
{
    if (!m)
        return;
    broker_queue_stats_cancel(m->w->broker, m);
    listener_free(m->listener);
    if (m->lws)
        destroy_lws(m->w->loop, m->lws);
    m->timer->data = NULL;
    uv_timer_stop(m->timer);
    uv_close((uv_handle_t *)m->timer, on_timer_closed);
    free_depths(m->depths, m->ndepths);
    prom_registry_free(m->reg);
    cr_free(m);
}
