/* grants.c -- a local stock of prepaid request grants (see grants.h). */
#include "grants.h"

#include <math.h>
#include <string.h>

int grants_apply(double rpm, double tpm, long concurrency)
{
    return rpm >= GRANTS_MIN_RPM && tpm <= 0 && concurrency <= 0;
}

static void lapse(struct grants *g, int64_t now)
{
    int i = 0;
    while (i < g->n && g->exp[i] <= now)
        i++;
    if (i) {
        memmove(g->exp, g->exp + i, (size_t)(g->n - i) * sizeof(g->exp[0]));
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
               int64_t life_ms, int k)
{
    double room, t;
    if (k <= 0 || rpm <= 0)
        return 0;
    t = 60000.0 / rpm;
    room = (double)now_ms + (double)(burst_ms - life_ms) - tat_after;
    if (room < t)
        return 0;
    return room / t >= k ? k : (int)floor(room / t);
}

void grants_put(struct grants *g, int n, int64_t now_ms)
{
    lapse(g, now_ms);
    /* the new ones lapse last: appending keeps exp ascending */
    while (n-- > 0 && g->n < GRANTS_MAX)
        g->exp[g->n++] = now_ms + GRANTS_LIFE_MS;
}

int grants_take(struct grants *g, int64_t now_ms)
{
    lapse(g, now_ms);
    if (!g->n)
        return 0;
    memmove(g->exp, g->exp + 1, (size_t)(g->n - 1) * sizeof(g->exp[0]));
    g->n--;
    return 1;
}

int grants_held(const struct grants *g, int64_t now_ms)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += g->exp[i] > now_ms;
    return n;
}

void grants_drop(struct grants *g)
{
    g->n = 0;
}
