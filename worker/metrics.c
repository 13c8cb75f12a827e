/* metrics.c -- Prometheus metrics. NEEDSWORK: stub until issue 4 lands. */
#include "metrics.h"

#include <stddef.h>

struct metrics *metrics_new(struct worker *w, struct cr_err *err)
{
    (void)w;
    (void)err;
    return NULL;
}

void metrics_on_task(struct metrics *m, struct job *j, const struct task_event_info *info)
{
    (void)m;
    (void)j;
    (void)info;
}

void metrics_on_dead_letter(struct metrics *m, struct job *j)
{
    (void)m;
    (void)j;
}

void metrics_free(struct metrics *m)
{
    (void)m;
}
