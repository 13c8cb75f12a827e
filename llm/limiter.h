/* limiter.h -- one (provider, model)'s limits as a provider enforces them,
 * decided as pure code: requests and tokens per minute, calls in flight, and
 * cooling after a 429. No I/O, no clock: the time (any monotonic ms) is an
 * argument. The shared limits of a fleet (issue 38) keep this state in Redis
 * and run the same arithmetic there; a worker cut off from Redis runs it
 * locally on its share of each limit.
 *
 * Per-minute limits are a generic cell rate (GCRA): each limit has a
 * theoretical arrival time (tat); a call costing n units moves it n
 * emission intervals (60000 / limit ms) on, and is let through when the tat
 * it leaves is at most one second (burst_ms) ahead of now. So calls go out
 * paced, about limit / 60 per second as providers quantize a per-minute limit,
 * never a minute's worth at once, and a quiet spell banks no more than a
 * second of them. Tokens are charged the call's estimate when it is let
 * through and corrected by the usage the provider reports (lim_correct()).
 *
 * Calls in flight are leases: a permit names its holder and expires unless
 * renewed, so a holder that died gives its permits back by itself. */
#ifndef CR_LLM_LIMITER_H
#define CR_LLM_LIMITER_H

#include <stdint.h>

#define LIM_BURST_MS 1000      /* how far ahead of now a tat may run */
#define LIM_MAX_PERMITS 100000 /* concurrency at most */

struct lim_config {
    double rpm;       /* requests per minute; 0: none */
    double tpm;       /* tokens per minute; 0: none */
    long concurrency; /* calls in flight; 0: none */
    int64_t lease_ms; /* a permit's life without renewal (30000) */
};

struct lim_permit {
    uint64_t holder; /* 0: free */
    int64_t expires_ms;
};

struct lim_state {
    double req_tat, tok_tat; /* ms; 0: never used */
    int64_t cool_until_ms;   /* no call before this */
    /* concurrency permits (owned; concurrency of them) */
    struct lim_permit *permits;
    long npermits;
};

/* Sets up s for cfg (permits allocated when cfg->concurrency > 0).
 * Returns 0 or CR_ENOMEM. */
int lim_init(struct lim_state *s, const struct lim_config *cfg);
void lim_release(struct lim_state *s);

/* Asks to send one call of an estimated tokens for holder (nonzero) now.
 * Returns 1 and charges it (request, tokens, a permit) when every limit
 * lets it through; else 0, charges nothing, and sets *wait_ms to the time
 * after which asking again can succeed (a permit freed earlier may come
 * sooner: ask again then too). */
int lim_try(struct lim_state *s, const struct lim_config *cfg, int64_t now_ms,
            long tokens, uint64_t holder, int64_t *wait_ms);

/* The call's usage came: its tokens were estimated, they were actual. */
void lim_correct(struct lim_state *s, const struct lim_config *cfg, long estimated,
                 long actual);

/* The call ended: holder's permit is free again (one of them, if several). */
void lim_done(struct lim_state *s, int64_t now_ms, uint64_t holder);

/* holder is alive: its permits live lease_ms more. */
void lim_renew(struct lim_state *s, const struct lim_config *cfg, int64_t now_ms,
               uint64_t holder);

/* The provider said 429 (or 503/529 with a delay): nothing goes out
 * before until_ms (a later cooling wins). */
void lim_cool(struct lim_state *s, int64_t until_ms);

/* One worker's share of cfg among n (a fleet cut off from the shared
 * state): rpm and tpm / n, concurrency / n rounded down but at least 1
 * (so n shares never add up to more than the limit unless n exceeds it),
 * the lease as it is. n < 1 counts as 1: out is cfg. */
void lim_share(const struct lim_config *cfg, long n, struct lim_config *out);

/* Permits held and not expired at now_ms. */
long lim_in_flight(const struct lim_state *s, int64_t now_ms);

#endif
