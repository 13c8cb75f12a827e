/* startup_retry.h -- when to try a connection again at start-up, and when to
 * give up: Celery's broker_connection_retry_on_startup and
 * broker_connection_max_retries, with kombu's schedule. Pure: no I/O, no
 * clock; the caller waits.
 *
 * kombu's Connection.ensure_connection() waits 2 s after the first failure,
 * then 2 s more after each one, at most 30 s (interval_start 2, interval_step 2,
 * interval_max 30), and gives up once max_retries retries have failed too:
 * with max_retries 2 that is three attempts and two waits. Celery documents 0
 * as "retry for ever", and so is it here. */
#ifndef CR_STARTUP_RETRY_H
#define CR_STARTUP_RETRY_H

#include <stdint.h>

#define STARTUP_RETRY_FIRST_MS 2000
#define STARTUP_RETRY_STEP_MS 2000
#define STARTUP_RETRY_MAX_MS 30000

struct startup_retry {
    /* public */
    int on;          /* 0: one attempt only (retry_on_startup off) */
    int max_retries; /* 0: no bound */
    /* read-only */
    int retries; /* retries announced so far */
};

void startup_retry_init(struct startup_retry *r, int on, int max_retries);

/* After a failed attempt: returns the wait before the next one in ms and
 * counts it as a retry (r->retries is then its number, from 1), or -1 when
 * there is to be no next one (retry off, or max_retries retries used up). */
int64_t startup_retry_next(struct startup_retry *r);

#endif
