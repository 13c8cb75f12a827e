/* tracing.c -- task and LLM call spans, their context on the wire. */
#include "tracing.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine/tasks.h"
#include "net/otlp.h"
#include "protocol/otel_conf.h"
#include "protocol/span.h"
#include "protocol/tracectx.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/version.h"

#define TP_PREFIX "traceparent: "
#define TS_PREFIX "tracestate: "

struct tracing {
    struct otel_conf conf;
    struct trace_rng rng;
    struct otlp_exporter *x;
    const char *hostname;
    /* Records of ended spans and of finished jobs' traces, for the next
     * tasks: a busy worker then traces without calling malloc for them. */
    struct span_pool spans;
    struct jtrace *spare; /* linked through their run field */
    size_t nspare;
};

/* The pools' bounds: a batch's worth of spans (they come back 512 at a time
 * from the exporter), and as many job traces as a worker commonly runs at
 * once. At most about 1 MB and 300 KB kept. */
#define SPAN_POOL_MAX 512
#define JTRACE_SPARE_MAX 256

/* What a sampled job holds (job->trace). */
struct jtrace {
    struct trace_ctx ctx; /* the run span's: what this job's messages carry */
    struct span *run;     /* open run span, NULL once ended */
    struct span *llm;     /* open LLM call span, or NULL */
    int llm_embed;        /* that call is LLM_OP_EMBED */
    char tp_line[sizeof(TP_PREFIX) + TRACEPARENT_LEN];
    char ts_line[sizeof(TS_PREFIX) + TRACESTATE_MAX];
};

/* a, b and c one after the other in out (cap bytes, NUL included), cut as
 * snprintf would cut them; per task, where a format string costs more than
 * the copies. */
static void cat3(char *out, size_t cap, const char *a, const char *b, const char *c)
{
    const char *part[3] = {a, b, c};
    size_t o = 0;
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(part[i]);
        if (n > cap - 1 - o)
            n = cap - 1 - o;
        memcpy(out + o, part[i], n);
        o += n;
    }
    out[o] = '\0';
}

static uint64_t now_ns(void)
{
    return (uint64_t)clock_epoch_us() * 1000u;
}

struct tracing *tracing_new(uv_loop_t *loop, const char *const *env, const char *hostname,
                            struct cr_err *err)
{
    struct tracing *t;
    struct otlp_exporter_config xc;

    err->code = 0;
    t = cr_calloc(1, sizeof(*t));
    if (!t) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    if (otlp_setup(env, &t->conf, &t->rng, err) != 1) {
        cr_free(t);
        return NULL;
    }
    t->hostname = hostname;
    span_pool_init(&t->spans, SPAN_POOL_MAX);
    memset(&xc, 0, sizeof(xc));
    xc.conf = &t->conf;
    xc.pool = &t->spans;
    xc.scope_version = CELERIAC_VERSION;
    t->x = otlp_exporter_new(loop, &xc, err);
    if (!t->x) {
        otel_conf_release(&t->conf);
        cr_free(t);
        return NULL;
    }
    return t;
}

struct otlp_exporter *tracing_exporter(const struct tracing *t)
{
    return t ? t->x : NULL;
}

static void submit(struct tracing *t, struct span *s)
{
    s->end_ns = now_ns();
    if (s->end_ns < s->start_ns)
        s->end_ns = s->start_ns;
    if (t->x)
        otlp_exporter_add(t->x, s);
    else
        span_pool_put(&t->spans, s);
}

static struct jtrace *jtrace_new(struct tracing *t)
{
    struct jtrace *jt = t->spare;
    if (!jt)
        return cr_calloc(1, sizeof(*jt));
    t->spare = (struct jtrace *)jt->run;
    t->nspare--;
    memset(jt, 0,
           offsetof(struct jtrace, tp_line)); /* the lines are written before use */
    return jt;
}

static void jtrace_free(struct tracing *t, struct jtrace *jt)
{
    if (t->nspare >= JTRACE_SPARE_MAX) {
        cr_free(jt);
        return;
    }
    jt->run = (struct span *)t->spare;
    t->spare = jt;
    t->nspare++;
}

/* ------------------------------------------------------------ run spans */

static void start_run(struct tracing *t, struct job *j)
{
    struct trace_ctx parent, ctx;
    int has_parent = celery_msg_trace_ctx(&j->tm, &parent);
    struct jtrace *jt;
    char name[256];

    memset(&ctx, 0, sizeof(ctx));
    if (has_parent) {
        memcpy(ctx.trace_id, parent.trace_id, TRACE_ID_BYTES);
        memcpy(ctx.state, parent.state, sizeof(ctx.state));
    } else {
        trace_rng_trace_id(&t->rng, ctx.trace_id);
    }
    if (!otel_sample(&t->conf.sampler, has_parent ? &parent : NULL, ctx.trace_id))
        return;
    trace_rng_span_id(&t->rng, ctx.span_id);
    ctx.flags = TRACE_FLAG_SAMPLED;
    jt = jtrace_new(t);
    if (!jt)
        return; /* untraced: tracing never fails a task */
    jt->ctx = ctx;
    /* Python's instrumentation: f"run/{task.name}", the registered name */
    cat3(name, sizeof(name), "run/", j->tm.task ? j->tm.task : "unknown", "");
    jt->run = span_pool_new(&t->spans, name, SPAN_KIND_CONSUMER, &ctx);
    if (!jt->run) {
        jtrace_free(t, jt);
        return;
    }
    if (has_parent) {
        memcpy(jt->run->parent_id, parent.span_id, SPAN_ID_BYTES);
        jt->run->has_parent = 1;
        jt->run->parent_remote = 1;
    }
    jt->run->start_ns = now_ns();
    j->trace = jt;
}

static const char *state_of(enum task_event_type type)
{
    switch (type) {
    case TEV_SUCCEEDED:
        return "SUCCESS";
    case TEV_FAILED:
        return "FAILURE";
    case TEV_RETRIED:
        return "RETRY";
    case TEV_REVOKED:
        return "REVOKED";
    case TEV_REJECTED:
        return "REJECTED";
    default:
        return NULL;
    }
}

/* The attributes the Python instrumentation sets at task_postrun, from the
 * request and the signal's arguments, where celeriac knows them. */
static void end_run(struct tracing *t, struct job *j, const struct task_event_info *info)
{
    struct jtrace *jt = j->trace;
    struct span *s = jt->run;
    const struct delivery *d = j->nmsgs ? j->msgs[0] : NULL;
    char why[600];

    jt->run = NULL;
    /* Attributes are best effort: on OOM the span goes with fewer. */
    span_attr_str(s, "celery.action", "run");
    span_attr_str(s, "celery.task_name", j->tm.task);
    span_attr_str(s, "messaging.message.id", j->tm.id);
    span_attr_str(s, "celery.state", state_of(info->type));
    span_attr_str(s, "celery.hostname", j->tm.origin ? j->tm.origin : t->hostname);
    if (j->tm.retries)
        span_attr_int(s, "celery.retries", j->tm.retries);
    span_attr_str(s, "messaging.conversation_id", j->tm.correlation_id);
    if (d && d->routing_key && *d->routing_key)
        span_attr_str(s, "messaging.destination", d->routing_key);
    span_attr_str(s, "celery.reply_to", j->tm.reply_to);
    span_attr_str(s, "celery.eta", j->tm.eta);
    span_attr_str(s, "celery.expires", j->tm.expires);
    if (info->type == TEV_FAILED) {
        snprintf(why, sizeof(why), "%s: %s",
                 info->exc_type ? info->exc_type : "Exception",
                 info->exc_message ? info->exc_message : "");
        span_set_status(s, SPAN_STATUS_ERROR, why);
    } else if (info->type == TEV_RETRIED) {
        snprintf(why, sizeof(why), "%s('%s')", info->exc_type ? info->exc_type : "Retry",
                 info->exc_message ? info->exc_message : "");
        span_attr_str(s, "celery.retry.reason", why);
    } else if (info->type == TEV_REVOKED) {
        span_attr_str(s, "celery.revoked.reason",
                      info->expired      ? "expired"
                      : info->terminated ? "terminated"
                                         : "revoked");
    }
    submit(t, s);
}

void tracing_on_task(struct tracing *t, struct job *j, const struct task_event_info *info)
{
    if (!t)
        return;
    if (info->type == TEV_STARTED) {
        if (!j->trace)
            start_run(t, j);
        return;
    }
    if (!j->trace || !j->trace->run || !state_of(info->type))
        return;
    end_run(t, j, info);
}

/* ------------------------------------------------------------ LLM spans */

size_t tracing_llm_start(struct tracing *t, struct job *j, const struct task_call *c,
                         const char *lines[2])
{
    struct jtrace *jt = t ? j->trace : NULL;
    struct trace_ctx ctx;
    const char *op = c->op == LLM_OP_EMBED ? "embeddings" : "chat";
    char name[200];
    struct span *s;
    size_t n = 0;

    if (!jt || !jt->run)
        return 0;
    if (jt->llm) { /* not ended: should not happen; do not leak it */
        span_pool_put(&t->spans, jt->llm);
        jt->llm = NULL;
    }
    ctx = jt->ctx;
    trace_rng_span_id(&t->rng, ctx.span_id);
    /* GenAI conventions: "{gen_ai.operation.name} {gen_ai.request.model}" */
    cat3(name, sizeof(name), op, " ", c->model);
    s = span_pool_new(&t->spans, name, SPAN_KIND_CLIENT, &ctx);
    if (!s)
        return 0;
    memcpy(s->parent_id, jt->ctx.span_id, SPAN_ID_BYTES);
    s->has_parent = 1;
    s->start_ns = now_ns();
    span_attr_str(s, "gen_ai.operation.name", op);
    span_attr_str(s, "gen_ai.request.model", c->model);
    if (j->attempt > 0)
        span_attr_int(s, "celeriac.llm.attempt", j->attempt);
    if (c->route_step > 0)
        span_attr_int(s, "celeriac.llm.route_step", c->route_step);
    jt->llm = s;
    jt->llm_embed = c->op == LLM_OP_EMBED;
    memcpy(jt->tp_line, TP_PREFIX, strlen(TP_PREFIX));
    tracectx_format_traceparent(&ctx, jt->tp_line + strlen(TP_PREFIX));
    lines[n++] = jt->tp_line;
    if (ctx.state[0]) {
        cat3(jt->ts_line, sizeof(jt->ts_line), TS_PREFIX, ctx.state, "");
        lines[n++] = jt->ts_line;
    }
    return n;
}

/* The semantic conventions' gen_ai.provider.name for a provider kind. */
static const char *genai_provider(const char *type)
{
    if (!type || !*type)
        return "openai";
    if (strcmp(type, "azure") == 0)
        return "azure.ai.openai";
    return type;
}

void tracing_llm_done(struct tracing *t, struct job *j, const struct llm_result *res,
                      const char *provider_type)
{
    struct jtrace *jt = t ? j->trace : NULL;
    struct span *s;
    const char *prov = genai_provider(provider_type);

    if (!jt || !jt->llm)
        return;
    s = jt->llm;
    jt->llm = NULL;
    span_attr_str(s, "gen_ai.provider.name", prov);
    span_attr_str(s, "gen_ai.system", prov); /* the name before semconv 1.37 */
    if (res->provider && *res->provider)
        span_attr_str(s, "celeriac.llm.provider", res->provider);
    if (res->model && *res->model)
        span_attr_str(s, "gen_ai.response.model", res->model);
    if (jt->llm_embed) {
        if (res->embed_tokens >= 0)
            span_attr_int(s, "gen_ai.usage.input_tokens", res->embed_tokens);
    } else {
        if (res->prompt_tokens >= 0)
            span_attr_int(s, "gen_ai.usage.input_tokens", res->prompt_tokens);
        if (res->completion_tokens >= 0)
            span_attr_int(s, "gen_ai.usage.output_tokens", res->completion_tokens);
    }
    if (res->finish_reason && *res->finish_reason)
        span_attr_str_list(s, "gen_ai.response.finish_reasons", res->finish_reason);
    if (res->http_status > 0)
        span_attr_int(s, "http.response.status_code", res->http_status);
    if (res->verdict != LLM_OK || res->code) {
        const char *type = res->exc_type && *res->exc_type ? res->exc_type : "_OTHER";
        span_attr_str(s, "error.type", type);
        span_set_status(s, SPAN_STATUS_ERROR, res->message);
    }
    submit(t, s);
}

/* ------------------------------------------------------------ propagation */

static void put(cJSON *headers, const char *key, const char *value)
{
    cJSON *v = cJSON_CreateString(value);
    if (!v)
        return;
    cJSON_DeleteItemFromObjectCaseSensitive(headers, key);
    if (!cJSON_AddItemToObject(headers, key, v))
        cJSON_Delete(v);
}

void tracing_outbound_headers(struct tracing *t, const struct job *j, cJSON *headers)
{
    char tp[TRACEPARENT_LEN + 1];
    struct trace_ctx in;
    const struct trace_ctx *c;

    if (!t || !headers)
        return;
    if (j->trace) {
        c = &j->trace->ctx;
    } else if (celery_msg_trace_ctx(&j->tm, &in)) {
        c = &in;
    } else {
        return;
    }
    tracectx_format_traceparent(c, tp);
    put(headers, "traceparent", tp);
    if (c->state[0])
        put(headers, "tracestate", c->state);
    else
        cJSON_DeleteItemFromObjectCaseSensitive(headers, "tracestate");
}

int tracing_job_ids(const struct job *j, char trace_id[33], char span_id[17])
{
    if (!j || !j->trace)
        return 0;
    tracectx_hex(j->trace->ctx.trace_id, TRACE_ID_BYTES, trace_id);
    tracectx_hex(j->trace->ctx.span_id, SPAN_ID_BYTES, span_id);
    return 1;
}

void tracing_forget(struct tracing *t, struct job *j)
{
    struct jtrace *jt = j->trace;
    if (!jt)
        return;
    j->trace = NULL;
    if (!t) { /* not reached: a job has a trace only while tracing is on */
        span_free(jt->run);
        span_free(jt->llm);
        cr_free(jt);
        return;
    }
    span_pool_put(&t->spans, jt->run);
    span_pool_put(&t->spans, jt->llm);
    jtrace_free(t, jt);
}

void tracing_stop(struct tracing *t)
{
    if (!t)
        return;
    otlp_exporter_free(t->x);
    t->x = NULL;
}

void tracing_free(struct tracing *t)
{
    if (!t)
        return;
    tracing_stop(t);
    span_pool_release(&t->spans);
    while (t->spare) {
        struct jtrace *jt = t->spare;
        t->spare = (struct jtrace *)jt->run;
        cr_free(jt);
    }
    otel_conf_release(&t->conf);
    cr_free(t);
}
