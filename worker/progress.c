/* progress.c -- live progress. NEEDSWORK: stub until issue 5 lands. */
#include "progress.h"

struct progress *progress_new(struct worker *w)
{
    (void)w;
    return NULL;
}

void progress_on_delta(struct progress *p, struct job *j, const char *text, size_t len)
{
    (void)p;
    (void)j;
    (void)text;
    (void)len;
}

void progress_on_task(struct progress *p, struct job *j,
                      const struct task_event_info *info)
{
    (void)p;
    (void)j;
    (void)info;
}

void progress_free(struct progress *p)
{
    (void)p;
}
