/* startup_retry.c -- the start-up retry rule (see startup_retry.h). */
#include "startup_retry.h"

void startup_retry_init(struct startup_retry *r, int on, int max_retries)
{
    r->on = on;
    r->max_retries = max_retries > 0 ? max_retries : 0;
    r->retries = 0;
}

int64_t startup_retry_next(struct startup_retry *r)
{
    int64_t ms;
    if (!r->on || (r->max_retries && r->retries >= r->max_retries))
        return -1;
    /* Computed from the count, capped before it can grow: a retry-for-ever
     * worker left for months never overflows. */
    ms = r->retries >=
                 (STARTUP_RETRY_MAX_MS - STARTUP_RETRY_FIRST_MS) / STARTUP_RETRY_STEP_MS
             ? STARTUP_RETRY_MAX_MS
             : STARTUP_RETRY_FIRST_MS + (int64_t)r->retries * STARTUP_RETRY_STEP_MS;
    if (r->retries < INT32_MAX)
        r->retries++;
    return ms;
}
