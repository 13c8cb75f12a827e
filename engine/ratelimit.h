/* ratelimit.h -- token buckets for Celery rate limits ("10/s", "100/m", "5/h").
 * Pure: the time is an argument. */
#ifndef CR_RATELIMIT_H
#define CR_RATELIMIT_H

#include <stdint.h>

struct token_bucket {
    double rate;     /* tokens per second; 0 = unlimited */
    double capacity; /* burst size */
    double tokens;
    int64_t last_ms;
};

/* Parses Celery's rate-limit text: "N", "N/s", "N/m" or "N/h" (N may be a
 * float). Returns tokens per second (0 for "0" or "", meaning no limit), or -1
 * when the text is not a rate. */
double ratelimit_parse(const char *s);

/* Starts a bucket holding `rate` tokens per second, full (Celery's bucket
 * capacity is one second's worth, at least 1). */
void token_bucket_init(struct token_bucket *tb, double rate, int64_t now_ms);

/* Takes one token if there is one: returns 0. Otherwise returns the number of
 * milliseconds until one is there (>= 1). An unlimited bucket always gives. */
int64_t token_bucket_take(struct token_bucket *tb, int64_t now_ms);

#endif
