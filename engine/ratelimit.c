/* ratelimit.c -- rate limits as token buckets (no I/O, no clock). */
#include "ratelimit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ratelimit_parse(const char *s)
{
    char *end;
    double n;
    if (!s || !*s)
        return 0;
    n = strtod(s, &end);
    if (end == s || n < 0 || !isfinite(n))
        return -1;
    if (!*end || !strcmp(end, "/s"))
        return n;
    if (!strcmp(end, "/m"))
        return n / 60.0;
    if (!strcmp(end, "/h"))
        return n / 3600.0;
    return -1;
}

void ratelimit_init(struct ratelimit *rl, double rate, int64_t now_ms)
{
    rl->rate = rate;
    rl->capacity = rate > 1 ? rate : 1;
    rl->tokens = rl->capacity;
    rl->last_ms = now_ms;
}

int64_t ratelimit_take(struct ratelimit *rl, int64_t now_ms)
{
    double wait;
    if (rl->rate <= 0)
        return 0;
    if (now_ms > rl->last_ms) {
        rl->tokens += (double)(now_ms - rl->last_ms) * rl->rate / 1000.0;
        if (rl->tokens > rl->capacity)
            rl->tokens = rl->capacity;
        rl->last_ms = now_ms;
    }
    if (rl->tokens >= 1) {
        rl->tokens -= 1;
        return 0;
    }
    /* The epsilon keeps float error from adding a whole extra millisecond. */
    wait = ceil((1 - rl->tokens) * 1000.0 / rl->rate - 1e-6);
    return wait < 1 ? 1 : (int64_t)wait;
}
