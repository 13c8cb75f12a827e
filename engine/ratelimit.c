/* ratelimit.c -- token buckets (no I/O, no clock). */
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

void token_bucket_init(struct token_bucket *tb, double rate, int64_t now_ms)
{
    tb->rate = rate;
    tb->capacity = rate > 1 ? rate : 1;
    tb->tokens = tb->capacity;
    tb->last_ms = now_ms;
}

int64_t token_bucket_take(struct token_bucket *tb, int64_t now_ms)
{
    double wait;
    if (tb->rate <= 0)
        return 0;
    if (now_ms > tb->last_ms) {
        tb->tokens += (double)(now_ms - tb->last_ms) * tb->rate / 1000.0;
        if (tb->tokens > tb->capacity)
            tb->tokens = tb->capacity;
        tb->last_ms = now_ms;
    }
    if (tb->tokens >= 1) {
        tb->tokens -= 1;
        return 0;
    }
    /* The epsilon keeps float error from adding a whole extra millisecond. */
    wait = ceil((1 - tb->tokens) * 1000.0 / tb->rate - 1e-6);
    return wait < 1 ? 1 : (int64_t)wait;
}
