/* limiter.c -- GCRA per-minute limits, leased permits and cooling. */
#include "limiter.h"

#include "util/alloc.h"
#include "util/err.h"

int lim_init(struct lim_state *s, const struct lim_config *cfg)
{
    long n = cfg->concurrency > 0 ? cfg->concurrency : 0;
    *s = (struct lim_state){0};
    if (n > LIM_MAX_PERMITS)
        n = LIM_MAX_PERMITS;
    if (n && !(s->permits = cr_calloc((size_t)n, sizeof(*s->permits))))
        return CR_ENOMEM;
    s->npermits = n;
    return 0;
}

void lim_release(struct lim_state *s)
{
    cr_free(s->permits);
    *s = (struct lim_state){0};
}

/* The wait before cost units fit under a rate limit per minute, or 0. */
static double gcra_wait(double tat, double limit, double cost, int64_t now)
{
    double t = tat > (double)now ? tat : (double)now;
    double after = t + cost * 60000.0 / limit;
    double over = after - (double)now - LIM_BURST_MS;
    /* A cost bigger than a second's worth can never fit the burst: it goes
     * once the tat has caught up with now, as a provider takes one large
     * call and then makes the next ones wait. */
    if (over > 0 && tat > (double)now)
        return over < tat - (double)now ? over : tat - (double)now;
    return 0;
}

static double gcra_take(double tat, double limit, double cost, int64_t now)
{
    double t = tat > (double)now ? tat : (double)now;
    return t + cost * 60000.0 / limit;
}

static long free_permit(const struct lim_state *s, int64_t now, int64_t *soonest)
{
    *soonest = INT64_MAX;
    for (long i = 0; i < s->npermits; i++) {
        const struct lim_permit *p = &s->permits[i];
        if (!p->holder || p->expires_ms <= now)
            return i;
        if (p->expires_ms < *soonest)
            *soonest = p->expires_ms;
    }
    return -1;
}

int lim_try(struct lim_state *s, const struct lim_config *cfg, int64_t now_ms,
            long tokens, uint64_t holder, int64_t *wait_ms)
{
    double w = 0, x;
    long slot = -1;
    int64_t soonest = INT64_MAX;

    if (tokens < 0)
        tokens = 0;
    if (s->cool_until_ms > now_ms)
        w = (double)(s->cool_until_ms - now_ms);
    if (cfg->rpm > 0 && (x = gcra_wait(s->req_tat, cfg->rpm, 1, now_ms)) > w)
        w = x;
    if (cfg->tpm > 0 && tokens &&
        (x = gcra_wait(s->tok_tat, cfg->tpm, (double)tokens, now_ms)) > w)
        w = x;
    if (s->npermits && (slot = free_permit(s, now_ms, &soonest)) < 0 &&
        (double)(soonest - now_ms) > w)
        w = (double)(soonest - now_ms);
    if (w > 0 || (s->npermits && slot < 0)) {
        int64_t ms = (int64_t)w;
        *wait_ms = ms < (double)w ? ms + 1 : ms;
        if (*wait_ms < 1)
            *wait_ms = 1;
        return 0;
    }
    if (cfg->rpm > 0)
        s->req_tat = gcra_take(s->req_tat, cfg->rpm, 1, now_ms);
    if (cfg->tpm > 0 && tokens)
        s->tok_tat = gcra_take(s->tok_tat, cfg->tpm, (double)tokens, now_ms);
    if (slot >= 0) {
        s->permits[slot].holder = holder ? holder : 1;
        s->permits[slot].expires_ms =
            now_ms + (cfg->lease_ms > 0 ? cfg->lease_ms : 30000);
    }
    *wait_ms = 0;
    return 1;
}

void lim_correct(struct lim_state *s, const struct lim_config *cfg, long estimated,
                 long actual)
{
    if (cfg->tpm <= 0 || estimated < 0 || actual < 0 || s->tok_tat == 0)
        return;
    /* More used than charged moves the tat on; less gives the rest back,
     * never to before it was charged from. */
    s->tok_tat += (double)(actual - estimated) * 60000.0 / cfg->tpm;
}

void lim_done(struct lim_state *s, int64_t now_ms, uint64_t holder)
{
    (void)now_ms;
    for (long i = 0; i < s->npermits; i++)
        if (s->permits[i].holder == (holder ? holder : 1)) {
            s->permits[i].holder = 0;
            return;
        }
}

void lim_renew(struct lim_state *s, const struct lim_config *cfg, int64_t now_ms,
               uint64_t holder)
{
    for (long i = 0; i < s->npermits; i++)
        if (s->permits[i].holder == holder && s->permits[i].expires_ms > now_ms)
            s->permits[i].expires_ms =
                now_ms + (cfg->lease_ms > 0 ? cfg->lease_ms : 30000);
}

void lim_cool(struct lim_state *s, int64_t until_ms)
{
    if (until_ms > s->cool_until_ms)
        s->cool_until_ms = until_ms;
}

long lim_in_flight(const struct lim_state *s, int64_t now_ms)
{
    long n = 0;
    for (long i = 0; i < s->npermits; i++)
        n += s->permits[i].holder && s->permits[i].expires_ms > now_ms;
    return n;
}

void lim_share(const struct lim_config *cfg, long n, struct lim_config *out)
{
    *out = *cfg;
    if (n <= 1)
        return;
    out->rpm = cfg->rpm / (double)n;
    out->tpm = cfg->tpm / (double)n;
    if (cfg->concurrency > 0)
        out->concurrency = cfg->concurrency / n > 0 ? cfg->concurrency / n : 1;
}
