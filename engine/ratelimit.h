/* ratelimit.h -- Celery rate limits ("10/s", "100/m", "5/h"), each a token
 * bucket. Pure: the time is an argument. */
#ifndef CR_RATELIMIT_H
#define CR_RATELIMIT_H

#include <stdint.h>

/* One task name's limit, embedded by its owner (no allocation). */
struct ratelimit {
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
void ratelimit_init(struct ratelimit *rl, double rate, int64_t now_ms);

/* Takes one token if there is one: returns 0. Otherwise returns the number of
 * milliseconds until one is there (>= 1). An unlimited bucket always gives. */
int64_t ratelimit_take(struct ratelimit *rl, int64_t now_ms);

#endif
