/* otlp.h -- spans sent to an OpenTelemetry collector over OTLP/HTTP, from the
 * worker's loop (libcurl multi; see util/curl_epoll.h), never blocking it.
 *
 * Spans queue in a bounded list; a batch of up to batch_max spans goes out
 * every interval_ms, or as soon as batch_max are waiting, with at most
 * max_inflight requests in flight. When the queue is full a new span is
 * dropped; when a request fails (no answer within the timeout, connection
 * refused, a non-2xx status) its spans are dropped. Both are counted, never
 * retried: tracing must not hold the worker's memory or time hostage to a
 * slow collector. Loop thread only. */
#ifndef CR_OTLP_H
#define CR_OTLP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "protocol/otel_conf.h"
#include "protocol/span.h"
#include "util/err.h"

struct otlp_exporter_config {
    const struct otel_conf *conf; /* borrowed: must outlive the exporter */
    const char *scope_version;    /* borrowed, as conf */
    size_t queue_max;             /* 0: 2048 */
    size_t batch_max;             /* 0: 512 */
    uint64_t interval_ms;         /* 0: 1000 */
    int max_inflight;             /* 0: 2 */
    /* borrowed, as conf: where sent and dropped spans go back (NULL: freed) */
    struct span_pool *pool;
};

struct otlp_stats {
    uint64_t exported; /* spans a collector took (2xx) */
    uint64_t dropped;  /* queue full, or their request failed */
    size_t queued;
    int inflight;
};

struct otlp_exporter;

/* The start every tracer shares (the worker's, the gateway's): loads the
 * OTEL_* configuration of env (NULL-terminated "NAME=value") into conf,
 * logging a wrong value once as a warning, and, when it asks for tracing,
 * seeds rng from the system's entropy and says where spans go. Returns 1
 * (on: the caller releases conf), 0 (off: conf released), or -1 with err
 * set (OOM). */
int otlp_setup(const char *const *env, struct otel_conf *conf, struct trace_rng *rng,
               struct cr_err *err);

/* Returns a new exporter sending to cfg->conf->traces_url, or NULL with err
 * set (OOM, no curl multi). Free with otlp_exporter_free(). */
struct otlp_exporter *otlp_exporter_new(uv_loop_t *loop,
                                        const struct otlp_exporter_config *cfg,
                                        struct cr_err *err);

/* Takes s (finished: its end time set) in every case: queued, or freed and
 * counted as dropped when the queue is full. Never sends from inside the
 * call. */
void otlp_exporter_add(struct otlp_exporter *x, struct span *s);

/* The counters. NULL x reads as all zeros. */
void otlp_exporter_stats(const struct otlp_exporter *x, struct otlp_stats *st);

/* Called once when a drain ends: everything sent and answered, or the
 * time ran out. */
typedef void otlp_drained_fn(struct otlp_exporter *x, void *privdata);

/* Sends what is queued now (in batches, max_inflight at a time) and calls
 * done once nothing is queued or in flight, or after timeout_ms, whichever
 * comes first; never from inside this call. For a warm shutdown: the last
 * tasks' spans go out before the loop stops. A second drain before the
 * first ended replaces its callback. */
void otlp_exporter_drain(struct otlp_exporter *x, uint64_t timeout_ms,
                         otlp_drained_fn *done, void *privdata);

/* Aborts requests in flight and drops what is queued (neither counted),
 * then frees once the loop has closed its handles. NULL is a no-op. */
void otlp_exporter_free(struct otlp_exporter *x);

#endif
