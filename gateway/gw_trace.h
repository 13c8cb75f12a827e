/* gw_trace.h -- the gateway's part of a trace: each submit is a PRODUCER span
 * "apply_async/<task>", as opentelemetry-instrumentation-celery names a
 * Python producer's, under the caller's traceparent when one came (else the
 * root of a new trace), and the task message carries that span's context,
 * so the worker's run span is its child. Configured by the OTEL_* environment
 * only, as the worker is; spans go to net/otlp.h's exporter.
 *
 * With tracing off (no struct gw_trace: NULL), a submit still passes a valid
 * caller's context on into the message unchanged. A trace the sampler drops
 * gets a context all the same (flag not sampled), so that the worker's
 * parent-based sampler drops it too, as it would behind a Python producer.
 * Loop thread only. */
#ifndef CR_GW_TRACE_H
#define CR_GW_TRACE_H

#include <cjson/cJSON.h>
#include <uv.h>

#include "util/err.h"

struct gw_trace;

/* Reads the OTEL_* variables of env (NULL-terminated "NAME=value"): a tracer
 * with its exporter on loop, or NULL with err->code 0 when tracing is off,
 * or NULL with err set (OOM). A wrong value is logged once and its default
 * used. */
struct gw_trace *gw_trace_new(uv_loop_t *loop, const char *const *env,
                              struct cr_err *err);

/* A submit of task (its id) whose caller sent traceparent and tracestate
 * (either may be NULL; a malformed one is ignored): writes the message's
 * "traceparent"/"tracestate" into headers and, when sampled, exports the
 * submit's span. t may be NULL. On OOM the message goes without a context. */
void gw_trace_submit(struct gw_trace *t, const char *traceparent, const char *tracestate,
                     const char *task, const char *id, const char *queue, cJSON *headers);

/* Drops what is not sent yet and frees once the loop has closed the
 * exporter's handles. NULL is a no-op. */
void gw_trace_free(struct gw_trace *t);

#endif
