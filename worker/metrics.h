/* metrics.h -- Prometheus metrics and the health endpoint of the worker.
 *
 * The registry counts tasks, runtimes, queue waits, LLM durations, time to
 * first token and tokens per model, LLM errors, retries and dead letters; it
 * polls the depth and consumer count of every consumed queue on a timer. With
 * --metrics-port an HTTP server (libwebsockets on the worker's own libuv loop)
 * serves GET /metrics (Prometheus text format 0.0.4) and GET /healthz (200
 * when the broker and backend are connected and the loop keeps ticking, else
 * 503, with a JSON body saying which). Loop thread only. */
#ifndef CR_METRICS_H
#define CR_METRICS_H

#include "util/err.h"

struct worker_ctx;
struct job;
struct task_event_info;
struct metrics;
struct buf;

/* Returns a new metrics registry for w and, with --metrics-port, starts the
 * HTTP endpoint on the worker loop. NULL with err set on failure (port in
 * use, OOM). w must outlive it. */
struct metrics *metrics_new(const struct worker_ctx *w, struct cr_err *err);
/* Counts one step of a job (info borrowed for the call). NULL m is a no-op. */
void metrics_on_task(struct metrics *m, struct job *j,
                     const struct task_event_info *info);
/* Counted by the worker itself when it dead-letters a message. */
void metrics_on_dead_letter(struct metrics *m, struct job *j);
/* Appends the exposition text as /metrics serves it. 0 or CR_ENOMEM. */
int metrics_render(struct metrics *m, struct buf *out);
/* Stops the HTTP server (its handles close on the next loop run) and frees.
 * NULL is a no-op. */
void metrics_free(struct metrics *m);

#endif
