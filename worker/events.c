/* events.c -- Celery events. NEEDSWORK: stub until issue 4 lands. */
#include "events.h"

#include <stddef.h>

struct events *events_new(struct worker *w)
{
    (void)w;
    return NULL;
}

void events_free(struct events *ev)
{
    (void)ev;
}

void events_on_task(struct events *ev, struct job *j, const struct task_event_info *info)
{
    (void)ev;
    (void)j;
    (void)info;
}

int events_set_enabled(struct events *ev, int on)
{
    (void)ev;
    (void)on;
    return 0;
}

int events_enabled(const struct events *ev)
{
    (void)ev;
    return 0;
}

void events_heartbeat_now(struct events *ev)
{
    (void)ev;
}

unsigned long events_clock_tick(struct events *ev)
{
    (void)ev;
    return 0;
}

unsigned long events_clock_adjust(struct events *ev, unsigned long seen)
{
    (void)ev;
    return seen;
}
