/* tracing.h -- the worker's OpenTelemetry spans: one CONSUMER span per task
 * run, named and dressed as opentelemetry-instrumentation-celery names its
 * own ("run/<task>"), the child of the context its producer put in the
 * message; one CLIENT span per LLM call under it (GenAI semantic
 * conventions), whose context goes out in the call's traceparent header;
 * and that run's context written into the follow-ups and retries it
 * publishes. Configured by the OTEL_* environment only (protocol/otel_conf.h);
 * spans go to net/otlp.h's exporter.
 *
 * With tracing off the worker holds no struct tracing (NULL), and every
 * function here is a no-op on NULL: nothing is allocated per task. A job
 * whose trace is not sampled gets nothing either. Loop thread only. */
#ifndef CR_TRACING_H
#define CR_TRACING_H

#include <stddef.h>
#include <cjson/cJSON.h>
#include <uv.h>

#include "engine/job.h"
#include "util/err.h"

struct tracing;
struct otlp_exporter;
struct task_call;

/* Reads the OTEL_* variables of env (NULL-terminated "NAME=value") and,
 * when they ask for tracing, returns a new tracer with its exporter on
 * loop. NULL with err->code 0 when tracing is off; NULL with err set when
 * it cannot start (OOM). A wrong value is logged once as a warning and its
 * default used. hostname (borrowed, must outlive it) is the worker's. */
struct tracing *tracing_new(uv_loop_t *loop, const char *const *env, const char *hostname,
                            struct cr_err *err);

/* The exporter, for /metrics' counters; NULL when off or stopped. */
struct otlp_exporter *tracing_exporter(const struct tracing *t);

/* A step of j's life (info borrowed): STARTED opens its run span, the end
 * of the run (succeeded, failed, retried, revoked, rejected) closes it and
 * queues it for export. */
void tracing_on_task(struct tracing *t, struct job *j,
                     const struct task_event_info *info);

/* j's LLM call c is about to start: opens its CLIENT span and points
 * lines[0..n) (n returned, at most 2) at the "traceparent: ..." and
 * "tracestate: ..." header lines to send with it, borrowed until the call's
 * tracing_llm_done(). 0 when j is not traced. */
size_t tracing_llm_start(struct tracing *t, struct job *j, const struct task_call *c,
                         const char *lines[2]);

/* j's LLM call ended (res borrowed); provider_type is the answering
 * provider's kind ("openai", "anthropic", "azure", "ollama"). */
void tracing_llm_done(struct tracing *t, struct job *j, const struct llm_result *res,
                      const char *provider_type);

/* Writes the context a message j publishes carries on ("traceparent",
 * "tracestate" in headers): j's run span when traced, else the context j
 * came with, so a chain keeps its trace even where this worker samples
 * nothing. */
void tracing_outbound_headers(struct tracing *t, const struct job *j, cJSON *headers);

/* The trace id and the run span's id of j as hex (32 and 16 characters and
 * a NUL), for its log lines. 1, or 0 when j is not traced. */
int tracing_job_ids(const struct job *j, char trace_id[33], char span_id[17]);

/* j is about to be freed: spans still open are dropped with it. */
void tracing_forget(struct tracing *t, struct job *j);

/* Frees the exporter (its requests aborted, its queue dropped) so the loop
 * can finish; spans ended after this are freed unsent. NULL is a no-op. */
void tracing_stop(struct tracing *t);
/* Frees t (stopping it first if needed). NULL is a no-op. */
void tracing_free(struct tracing *t);

#endif
