/* metrics.h -- Prometheus metrics and health endpoint of the worker. */
#ifndef CR_METRICS_H
#define CR_METRICS_H

#include "util/err.h"

struct worker;
struct job;
struct task_event_info;

/* Returns a new metrics registry for w and, with --metrics-port, starts the
 * HTTP endpoint on the worker loop. NULL with err on failure (port in use). */
struct metrics *metrics_new(struct worker *w, struct cr_err *err);
void metrics_on_task(struct metrics *m, struct job *j,
                     const struct task_event_info *info);
/* Counted by the worker itself. */
void metrics_on_dead_letter(struct metrics *m, struct job *j);
void metrics_free(struct metrics *m);

#endif
