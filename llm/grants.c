/* grants.c -- a local stock of prepaid request grants (see grants.h). */
#include "grants.h"

#include <math.h>
#include <string.h>

int grants_apply(double rpm, double tpm, long concurrency)
{
    return rpm >= GRANTS_MIN_RPM && tpm <= 0 && concurrency <= 0;
}

/* Drops the slots lapsed at now (they are in order of time). */
static void lapse(struct grants *g, int64_t now)
{
    int i = 0;
    while (i < g->n && g->g[i].until_ms <= now)
        i++;
    if (i) {
        memmove(g->g, g->g + i, (size_t)(g->n - i) * sizeof(g->g[0]));
        g->n -= i;
    }
}

void grants_note_ask(struct grants *g, int64_t now_ms)
{
    if (now_ms - g->win_ms >= GRANTS_LIFE_MS) {
        /* a window skipped entirely leaves nothing of the one before */
        g->asks_prev = now_ms - g->win_ms >= 2 * GRANTS_LIFE_MS ? 0 : g->asks_now;
        g->asks_now = 0;
        g->win_ms = now_ms;
    }
    g->asks_now++;
}

int grants_batch(const struct grants *g, double rpm, int64_t now_ms)
{
    long demand = g->asks_now > g->asks_prev ? g->asks_now : g->asks_prev;
    double yield;
    long k;
    if (rpm < GRANTS_MIN_RPM || grants_held(g, now_ms) > 0)
        return 0;
    yield = floor(rpm * GRANTS_SPAN_MS / 60000.0);
    k = yield < GRANTS_MAX ? (long)yield : GRANTS_MAX;
    if (demand - 1 < k)
        k = demand - 1;
    return k > 0 ? (int)k : 0;
}

int grants_fit(double tat_after, int64_t now_ms, double rpm, int64_t burst_ms,
               int64_t life_ms, int k, int64_t *first_ms)
{
    double t, room, n;
    *first_ms = 0;
    if (k <= 0 || rpm <= 0)
        return 0;
    t = 60000.0 / rpm;
    /* the j-th is due at tat_after + j t - (burst - life) - now */
    *first_ms =
        (int64_t)ceil(tat_after + t - (double)(burst_ms - life_ms) - (double)now_ms);
    room = (double)now_ms + (double)(burst_ms + GRANTS_SPAN_MS) - tat_after;
    n = floor(room / t);
    if (n <= 0)
        return 0;
    return n >= k ? k : (int)n;
}

void grants_put(struct grants *g, int n, int64_t first_ms, double rpm, int64_t sent_ms,
                int64_t now_ms)
{
    double t = rpm > 0 ? 60000.0 / rpm : 0;
    lapse(g, now_ms);
    for (int j = 0; j < n && g->n < GRANTS_MAX; j++) {
        double due = (double)first_ms + j * t;
        int64_t d = due > 0 ? (int64_t)ceil(due) : 0;
        struct grant s = {now_ms + d, sent_ms + d + GRANTS_LIFE_MS};
        int i = g->n;
        if (s.until_ms <= now_ms)
            continue; /* the answer came too late for it */
        /* keep them by time: later answers' slots may come before */
        while (i > 0 && g->g[i - 1].until_ms > s.until_ms) {
            g->g[i] = g->g[i - 1];
            i--;
        }
        g->g[i] = s;
        g->n++;
    }
}

int grants_take(struct grants *g, int64_t now_ms, int64_t *wait_ms)
{
    int64_t soonest = 0;
    lapse(g, now_ms);
    for (int i = 0; i < g->n; i++) {
        if (g->g[i].from_ms <= now_ms) {
            memmove(g->g + i, g->g + i + 1, (size_t)(g->n - i - 1) * sizeof(g->g[0]));
            g->n--;
            *wait_ms = 0;
            return 1;
        }
        if (!soonest || g->g[i].from_ms - now_ms < soonest)
            soonest = g->g[i].from_ms - now_ms;
    }
    *wait_ms = soonest;
    return 0;
}

int grants_held(const struct grants *g, int64_t now_ms)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += g->g[i].until_ms > now_ms;
    return n;
}

void grants_drop(struct grants *g)
{
    g->n = 0;
}
