/* celery_events.h -- Celery event bodies (worker-*, task-*) as the Python worker
 * sends them to the celeryev exchange. Pure: the time, pid and Lamport clock are
 * arguments; no I/O, no clock.
 *
 * Every event carries hostname, utcoffset, pid, clock, timestamp and type; the
 * extra fields per type are those of Celery's dispatcher (see
 * shared/reference/celery-protocol.md, section 5). Task events may also carry
 * the LLM fields model, prompt_tokens, completion_tokens, ttft and
 * tokens_per_second; celery.events.state keeps unknown fields, so they reach
 * Flower's task pages unchanged. */
#ifndef CR_CELERY_EVENTS_H
#define CR_CELERY_EVENTS_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"

/* Longest repr kept for args, kwargs and result (Celery's resultrepr_maxsize). */
#define CEV_REPR_MAX 1024

/* Fields every event has. Strings borrowed for the call. */
struct cev_common {
    const char *hostname; /* the nodename, e.g. celery@host */
    int utcoffset;        /* hours west of UTC: cev_utcoffset() */
    long pid;
    unsigned long clock; /* Lamport clock value for this event */
    double timestamp;    /* epoch seconds */
};

/* worker-online, worker-heartbeat, worker-offline. */
struct cev_worker {
    double freq; /* heartbeat interval, seconds */
    int active;  /* tasks executing */
    unsigned long processed;
    double loadavg[3]; /* written rounded to 2 decimals */
    const char *sw_ident, *sw_ver, *sw_sys;
    /* The heartbeat control command's event: only freq and the sw_* fields. */
    int sw_only;
};

enum cev_task_type {
    CEV_TASK_RECEIVED,
    CEV_TASK_STARTED,
    CEV_TASK_SUCCEEDED,
    CEV_TASK_FAILED,
    CEV_TASK_RETRIED,
    CEV_TASK_REJECTED,
    CEV_TASK_REVOKED,
};

/* One task event. Strings are borrowed; NULL writes null (or omits, where the
 * comment says so). Which fields are written depends on type. */
struct cev_task {
    enum cev_task_type type;
    const char *uuid;
    /* RECEIVED */
    const char *name;
    const char *args;   /* repr text, e.g. "('hi',)" */
    const char *kwargs; /* repr text, e.g. "{}" */
    const char *root_id, *parent_id;
    const char *eta, *expires; /* ISO text or NULL */
    int retries;
    /* SUCCEEDED */
    const char *result; /* repr text */
    double runtime;     /* seconds */
    /* FAILED, RETRIED */
    const char *exception; /* repr text, e.g. "ValueError('bad')" */
    const char *traceback;
    /* REJECTED */
    int requeue;
    /* REVOKED */
    int terminated, expired;
    int signum; /* 0 writes null */
    /* SUCCEEDED, FAILED (and RETRIED) when an LLM call ended the task */
    int has_llm;
    const char *model;        /* omitted when NULL */
    const char *provider;     /* the one that answered; omitted when NULL */
    long prompt_tokens;       /* < 0 writes null */
    long completion_tokens;   /* < 0 writes null */
    double ttft;              /* seconds; < 0 writes null */
    double tokens_per_second; /* < 0 writes null */
    int has_cost;             /* 0: no "cost" (the provider has no price) */
    double cost;              /* USD, when has_cost */
};

/* "task-received", "task-started", ... (static). */
const char *cev_task_type_name(enum cev_task_type type);

/* Appends the JSON object of a task event to out. Returns 0, CR_EINVAL (no uuid,
 * unknown type) or CR_ENOMEM (out may then hold a partial value). */
int cev_task_encode(const struct cev_common *c, const struct cev_task *t,
                    struct buf *out);

/* Appends a worker event; type is "worker-online", "worker-heartbeat" or
 * "worker-offline". Returns 0, CR_EINVAL (another type) or CR_ENOMEM. */
int cev_worker_encode(const struct cev_common *c, const char *type,
                      const struct cev_worker *wk, struct buf *out);

/* Writes the routing key of an event type ('-' becomes '.') into out (size
 * bytes, NUL-terminated). Returns 0, or CR_ERANGE when it does not fit. */
int cev_routing_key(const char *type, char *out, size_t size);

/* Celery's utcoffset: hours *west* of UTC, floor-divided, from the local
 * offset east of UTC in seconds (struct tm's tm_gmtoff): +2h gives -2, -5h
 * gives 5, +5:30 gives -6. */
int cev_utcoffset(long gmtoff_east_s);

/* Appends Python's repr of a positional-argument tuple given as a JSON array:
 * "()", "(1,)", "('a', 2)". Cut at max_bytes (0: no limit) like py_repr().
 * Returns 0, CR_EINVAL (not an array) or CR_ENOMEM. */
int cev_args_repr(const cJSON *args, struct buf *out, size_t max_bytes);

/* Appends the repr of an exception with one message argument, as Python
 * prints it: "RateLimitError('slow down')", or "Type()" when message is NULL.
 * Returns 0 or CR_ENOMEM. */
int cev_exception_repr(const char *exc_type, const char *message, struct buf *out);

/* Generation speed: completion tokens per second after the first token
 * (elapsed - ttft; the whole elapsed time when ttft is unknown). Returns -1 when
 * it cannot be told (no tokens, no time). */
double cev_tokens_per_second(long completion_tokens, double elapsed_s, double ttft_s);

#endif
