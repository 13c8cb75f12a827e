/* gw_trace.c -- the submit's PRODUCER span and the context it passes on. */
#include "gw_trace.h"

#include <stdint.h>
#include <string.h>

#include "net/otlp.h"
#include "protocol/otel_conf.h"
#include "protocol/span.h"
#include "protocol/tracectx.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/version.h"

struct gw_trace {
    struct otel_conf conf;
    struct otlp_exporter *x;
    struct trace_rng rng;
};

struct gw_trace *gw_trace_new(uv_loop_t *loop, const char *const *env, struct cr_err *err)
{
    struct gw_trace *t;
    struct otlp_exporter_config xc;

    err->code = 0;
    if (!(t = cr_calloc(1, sizeof(*t)))) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    if (otlp_setup(env, &t->conf, &t->rng, err) != 1) {
        cr_free(t);
        return NULL;
    }
    memset(&xc, 0, sizeof(xc));
    xc.conf = &t->conf;
    xc.scope_version = CELERIAC_VERSION;
    if (!(t->x = otlp_exporter_new(loop, &xc, err))) {
        otel_conf_release(&t->conf);
        cr_free(t);
        return NULL;
    }
    return t;
}

static void put_ctx(cJSON *headers, const struct trace_ctx *c)
{
    char tp[TRACEPARENT_LEN + 1];
    tracectx_format_traceparent(c, tp);
    cJSON_AddStringToObject(headers, "traceparent", tp);
    if (c->state[0])
        cJSON_AddStringToObject(headers, "tracestate", c->state);
}

void gw_trace_submit(struct gw_trace *t, const char *traceparent, const char *tracestate,
                     const char *task, const char *id, const char *queue, cJSON *headers)
{
    struct trace_ctx parent, ctx;
    int has_parent = traceparent && !tracectx_parse_traceparent(&parent, traceparent,
                                                                strlen(traceparent));
    struct span *s;
    char name[256];
    uint64_t now;

    if (has_parent && tracestate)
        tracectx_set_state(&parent, tracestate, strlen(tracestate));
    if (!t) {
        if (has_parent)
            put_ctx(headers, &parent);
        return;
    }
    memset(&ctx, 0, sizeof(ctx));
    if (has_parent) {
        memcpy(ctx.trace_id, parent.trace_id, TRACE_ID_BYTES);
        memcpy(ctx.state, parent.state, sizeof(ctx.state));
    } else {
        trace_rng_trace_id(&t->rng, ctx.trace_id);
    }
    trace_rng_span_id(&t->rng, ctx.span_id);
    if (!otel_sample(&t->conf.sampler, has_parent ? &parent : NULL, ctx.trace_id)) {
        /* Not sampled: the caller's context as it came, or a fresh one that
         * says so, for the worker's parent-based sampler. */
        ctx.flags = 0;
        put_ctx(headers, has_parent ? &parent : &ctx);
        return;
    }
    ctx.flags = TRACE_FLAG_SAMPLED;
    put_ctx(headers, &ctx);
    /* Python's instrumentation names a producer's span f"apply_async/{task}". */
    snprintf(name, sizeof(name), "apply_async/%s", task ? task : "unknown");
    if (!(s = span_new(name, SPAN_KIND_PRODUCER, &ctx)))
        return; /* the message keeps its context; the span is lost */
    if (has_parent) {
        memcpy(s->parent_id, parent.span_id, SPAN_ID_BYTES);
        s->has_parent = 1;
        s->parent_remote = 1;
    }
    span_attr_str(s, "celery.action", "apply_async");
    span_attr_str(s, "celery.task_name", task);
    span_attr_str(s, "messaging.message.id", id);
    span_attr_str(s, "messaging.destination", queue);
    span_attr_str(s, "celeriac.gateway", "POST /v1/tasks");
    now = (uint64_t)clock_epoch_us() * 1000u;
    s->start_ns = s->end_ns = now;
    otlp_exporter_add(t->x, s);
}

void gw_trace_free(struct gw_trace *t)
{
    if (!t)
        return;
    otlp_exporter_free(t->x);
    otel_conf_release(&t->conf);
    cr_free(t);
}
