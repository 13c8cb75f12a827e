/* fleet_limits.h -- the worker's side of the shared provider limits: it
 * answers the LLM client's questions (llm_limit_ops) with one Lua script in
 * the result backend's Redis (or --limits-redis's), so that every worker of a fleet
 * counts in the same state, or, while Redis is away, with llm/limiter.c on its own.
 *
 * Keys, under the backend's key prefix, per (provider, model):
 * celeriac:limit:<provider>/<model>:req and :tok (the GCRA theoretical
 * arrival times, ms), :cool (no call before this time, ms) and :permits (a
 * sorted set of holder -> lease expiry). The script reads the time from
 * Redis (TIME), so the workers' clocks do not matter. Under an rpm-only
 * limit of GRANTS_MIN_RPM or more, a call let through may bring a few more
 * request slots charged at once, which this worker's next calls use without
 * asking (llm/grants.h); a cooling drops them.
 *
 * Each worker that has met a limit also says, once a second, that it is one
 * of the fleet (celeriac:limit-workers, a sorted set of workers by when
 * their word ends, 15 s on), and learns how many are.
 *
 * While Redis is away (not connected, or a question unanswered for
 * FLEET_LIMITS_ASK_MS) each worker applies its share of each limit by
 * itself: 1/N of it, N the fleet last seen in Redis (lim_share()), so the
 * fleet as a whole stays within the limit as long as it keeps its size; a
 * worker that never saw another applies the whole. A provider's 429s (which
 * cool each worker alone then) do the rest. One warning says so; the shared
 * state is used again as soon as Redis answers. Not thread-safe: the loop
 * thread only. */
#ifndef CR_WORKER_FLEET_LIMITS_H
#define CR_WORKER_FLEET_LIMITS_H

#include <uv.h>

#include "llm/llm_client.h"
#include "net/backend.h"
#include "util/err.h"

/* A question Redis has not answered in this time is answered locally. */
#define FLEET_LIMITS_ASK_MS 1000

struct fleet_limits;

/* Returns a new fleet_limits for the backend (borrowed, may be NULL: always
 * local) naming its permits after hostname (copied), or NULL with err set.
 * Its ops go to llm_client_set_limits() with it as data. Free with
 * fleet_limits_free() after llm_client_free() and backend_free(). */
struct fleet_limits *fleet_limits_new(uv_loop_t *loop, struct backend *bk,
                                      const char *hostname, struct cr_err *err);
void fleet_limits_free(struct fleet_limits *f);

/* Answers locally the questions Redis has sat on for FLEET_LIMITS_ASK_MS
 * (the worker's cron calls it; a late answer is then dropped, a permit it
 * granted handed back). */
void fleet_limits_tick(struct fleet_limits *f);

extern const struct llm_limit_ops fleet_limits_ops;

/* One limit's use across the fleet, as last read from Redis (every
 * second, while Redis answers). */
struct fleet_limit_stats {
    const char *key;              /* "provider/model" */
    const struct lim_config *cfg; /* its limits */
    int shared;                   /* 1: counted in Redis now; 0: alone */
    int known;                    /* 0: not read from Redis yet (figures 0) */
    double granted;               /* calls let through, ever */
    double waited, wait_s;        /* of them, those held back, and their wait */
    double coolings;              /* 429s (and 503/529 with a delay) */
    double holds; /* holds by the provider's headers (remaining 0 until a reset) */
    int64_t cooled_until_ms; /* Unix ms (Redis's clock); 0: not cooled */
    double in_flight;        /* permits held now */
    double requests_last_min, tokens_last_min;
    double from_grants; /* this worker's calls served by slots charged ahead */
};

/* The i-th (0, 1, ...) limit the worker has met: 1 with *out filled (its
 * strings borrowed until fleet_limits_free()), or 0 past the last. NULL f
 * has none. */
int fleet_limits_stats(const struct fleet_limits *f, int i,
                       struct fleet_limit_stats *out);

#endif
