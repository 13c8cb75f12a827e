/* events.h -- Celery events (worker-online/heartbeat/offline, task-*) published
 * to the celeryev topic exchange, as Flower and `celery events` expect.
 *
 * Worker events always go out (the heartbeat timer runs on the worker loop, so
 * it keeps beating whatever the tasks do); task events only while enabled (-E,
 * or the enable_events control command). Events are fire-and-forget: while the
 * broker is down they are dropped, as Celery drops them. Loop thread only. */
#ifndef CR_EVENTS_H
#define CR_EVENTS_H

struct worker_ctx;
struct job;
struct task_event_info;
struct events;

/* Returns a new publisher for w (declares celeryev, sends worker-online and
 * starts the heartbeat timer), or NULL on OOM. w must outlive it. */
struct events *events_new(const struct worker_ctx *w);
/* Sends worker-offline (while the broker is still connected), stops the timer
 * and frees; the timer's memory goes in its close callback, so the loop must
 * run once more. NULL is a no-op. */
void events_free(struct events *ev);
/* Publishes the task event for info (borrowed for the call). Task events are
 * sent only while enabled. NULL ev is a no-op. */
void events_on_task(struct events *ev, struct job *j, const struct task_event_info *info);
/* Returns 1 when the state changed. */
int events_set_enabled(struct events *ev, int on);
int events_enabled(const struct events *ev);
/* A worker-heartbeat now (the heartbeat control command: freq 5 and the
 * software fields only, as Celery sends it). */
void events_heartbeat_now(struct events *ev);
/* The Lamport clock shared by events and remote control: tick advances it by
 * one and returns the new value; adjust sets it to max(own, seen) + 1. NULL ev
 * returns 0 (tick) or seen (adjust). */
unsigned long events_clock_tick(struct events *ev);
unsigned long events_clock_adjust(struct events *ev, unsigned long seen);
unsigned long events_clock_value(const struct events *ev);

/* The model a job asks for: its "model" keyword argument, else the configured
 * default for its kind. Borrowed from the job or the config. Used as the model
 * label of events and metrics, so that both name a model the same way. */
const char *events_job_model(const struct job *j);

/* The software identity sent in worker events and reports. */
#define EVENTS_SW_IDENT "celeriac"

#endif
