/* worker.h -- the worker: consumes Celery task messages, runs LLM tasks on the
 * loop, stores results and settles each delivery once its outcome is durable.
 *
 * The one root object of the process. Not thread-safe: everything runs on the
 * loop thread given to worker_new(). */
#ifndef CR_WORKER_H
#define CR_WORKER_H

#include <uv.h>

#include "config.h"
#include "util/err.h"

struct worker;

/* Returns a new worker for cfg (borrowed; must outlive it), or NULL with err. */
struct worker *worker_new(const struct config *cfg, uv_loop_t *loop, struct cr_err *err);

/* Connects the result backend and the broker (blocking, bounded timeouts) and
 * starts consuming. Returns 0 or an error with one clear line in err. */
int worker_start(struct worker *w, struct cr_err *err);

/* Runs the loop until shutdown. Returns the process exit code: 0 after a warm
 * shutdown, 1 after a cold one. */
int worker_run(struct worker *w);

/* After worker_run(): 1 if the shutdown was a SIGHUP restart that ended warm,
 * so the caller should execute the same command again (same process). */
int worker_restart_asked(const struct worker *w);

/* Frees everything (call after worker_run returned, or after a failed start).
 * NULL is a no-op. */
void worker_free(struct worker *w);

#endif
