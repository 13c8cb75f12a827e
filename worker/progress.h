/* progress.h -- live progress of streaming tasks: a batched Redis Stream per task
 * and a throttled PROGRESS state in the result backend. */
#ifndef CR_PROGRESS_H
#define CR_PROGRESS_H

#include <stddef.h>

struct worker;
struct job;
struct task_event_info;

/* Returns a new progress writer for w (--progress), or NULL when off. */
struct progress *progress_new(struct worker *w);
/* A text delta of a running job (borrowed). */
void progress_on_delta(struct progress *p, struct job *j, const char *text, size_t len);
/* Lifecycle: STARTED opens an attempt, SUCCEEDED/FAILED/RETRIED/REVOKED close it. */
void progress_on_task(struct progress *p, struct job *j,
                      const struct task_event_info *info);
void progress_free(struct progress *p);

#endif
