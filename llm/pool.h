/* pool.h -- which target of a pool answers the next call. Pure: no I/O, no
 * clock, no randomness; the time and each target's state are arguments.
 *
 * A pool shares one model's calls between several targets (keys, deployments,
 * providers). Two strategies:
 *   weighted    each target gets its weight's share of the calls, in smooth
 *               weighted round-robin: with weights 3 and 1 the order is
 *               a a b a, a a b a..., so any run of sum(weights) calls holds
 *               the exact shares and no target gets a burst.
 *   least-busy  the target with the fewest calls in flight (across the
 *               fleet: the caller counts them); ties go round in turn.
 * A target cooled at now (a provider's 429) is skipped. A target of weight 0
 * is a standby, chosen only when every weighted one is cooled. */
#ifndef CR_LLM_POOL_H
#define CR_LLM_POOL_H

#include <stdint.h>

#define LLM_POOL_MAX 8              /* targets in one pool */
#define LLM_POOL_MAX_WEIGHT 1000000 /* one target's weight at most */

enum llm_pool_strategy {
    LLM_POOL_WEIGHTED = 1,
    LLM_POOL_LEAST_BUSY = 2,
};

/* One target as the caller sees it now. */
struct llm_pool_member {
    long weight;           /* weighted: its share, 0 .. LLM_POOL_MAX_WEIGHT */
    long busy;             /* least-busy: its calls in flight */
    int64_t cool_until_ms; /* cooled while now < this (now's clock) */
};

/* What a pool remembers between picks (zeroed to start). */
struct llm_pool_state {
    long credit[LLM_POOL_MAX]; /* weighted: each target's running credit */
    unsigned next;             /* least-busy: where a tie starts looking */
};

/* Picks one of the n (1 .. LLM_POOL_MAX) members at now_ms and updates st.
 * Returns its index, or -1 when every member is cooled: then *wait_ms (may
 * be NULL) is the time until the first of them is cooled no more, and st is
 * unchanged. */
int llm_pool_pick(struct llm_pool_state *st, enum llm_pool_strategy strategy,
                  const struct llm_pool_member *m, int n, int64_t now_ms,
                  int64_t *wait_ms);

/* The strategy named s ("weighted", "least-busy"), or 0. */
enum llm_pool_strategy llm_pool_strategy_of(const char *s);

#endif
