/* pool.c -- the choice of a pool's target (see pool.h). */
#include "pool.h"

#include <string.h>

enum llm_pool_strategy llm_pool_strategy_of(const char *s)
{
    if (!s)
        return 0;
    if (!strcmp(s, "weighted"))
        return LLM_POOL_WEIGHTED;
    if (!strcmp(s, "least-busy"))
        return LLM_POOL_LEAST_BUSY;
    return 0;
}

/* Smooth weighted round-robin over the members open[]: each gains its
 * weight, the richest is picked and pays the sum. Deterministic, so a test
 * of the shares cannot fail by chance; a member that was cooled keeps the
 * credit it had and comes back without a burst, as the sum it did not gain
 * was not paid either. */
static int weighted(struct llm_pool_state *st, const struct llm_pool_member *m,
                    const int *open, int n)
{
    long sum = 0;
    int best = -1;
    int standby = 1;

    for (int i = 0; i < n; i++)
        if (open[i] && m[i].weight > 0)
            standby = 0;
    for (int i = 0; i < n; i++) {
        /* Only standbys are open: they share alike. */
        long w = standby ? 1 : m[i].weight;
        if (!open[i] || w <= 0)
            continue;
        st->credit[i] += w;
        sum += w;
        if (best < 0 || st->credit[i] > st->credit[best])
            best = i;
    }
    st->credit[best] -= sum;
    return best;
}

static int least_busy(struct llm_pool_state *st, const struct llm_pool_member *m,
                      const int *open, int n)
{
    int best = -1;
    for (int k = 0; k < n; k++) {
        int i = (int)((st->next + (unsigned)k) % (unsigned)n);
        if (open[i] && (best < 0 || m[i].busy < m[best].busy))
            best = i;
    }
    st->next = (unsigned)(best + 1) % (unsigned)n;
    return best;
}

int llm_pool_pick(struct llm_pool_state *st, enum llm_pool_strategy strategy,
                  const struct llm_pool_member *m, int n, int64_t now_ms,
                  int64_t *wait_ms)
{
    int open[LLM_POOL_MAX];
    int nopen = 0;
    int64_t soonest = INT64_MAX;

    if (n < 1 || n > LLM_POOL_MAX)
        return -1;
    for (int i = 0; i < n; i++) {
        open[i] = m[i].cool_until_ms <= now_ms;
        nopen += open[i];
        if (!open[i] && m[i].cool_until_ms < soonest)
            soonest = m[i].cool_until_ms;
    }
    if (!nopen) {
        if (wait_ms)
            *wait_ms = soonest - now_ms;
        return -1;
    }
    return strategy == LLM_POOL_LEAST_BUSY ? least_busy(st, m, open, n)
                                           : weighted(st, m, open, n);
}
