/* events.h -- Celery events (worker-online/heartbeat/offline, task-*) published
 * to the celeryev topic exchange, as Flower and `celery events` expect. */
#ifndef CR_EVENTS_H
#define CR_EVENTS_H

struct worker;
struct job;
struct task_event_info;

/* Returns a new publisher for w (declares celeryev, sends worker-online and
 * starts the heartbeat timer), or NULL on OOM. */
struct events *events_new(struct worker *w);
/* Sends worker-offline and frees. NULL is a no-op. */
void events_free(struct events *ev);
/* Task events are sent only while enabled (-E or enable_events). */
void events_on_task(struct events *ev, struct job *j, const struct task_event_info *info);
/* Returns 1 when the state changed. */
int events_set_enabled(struct events *ev, int on);
int events_enabled(const struct events *ev);
/* A worker-heartbeat now (the heartbeat control command). */
void events_heartbeat_now(struct events *ev);
/* The Lamport clock shared by events and remote control. */
unsigned long events_clock_tick(struct events *ev);
unsigned long events_clock_adjust(struct events *ev, unsigned long seen);

#endif
