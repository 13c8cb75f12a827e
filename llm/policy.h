/* policy.h -- LLM failure classification, Retry-After parsing and backoff.
 * Pure: time and randomness are arguments. */
#ifndef CR_LLM_POLICY_H
#define CR_LLM_POLICY_H

#include <stdint.h>

enum llm_verdict {
    LLM_OK = 0,        /* not a failure */
    LLM_RETRYABLE = 1, /* try again later */
    LLM_PERMANENT = 2, /* never retry: store FAILURE */
};

/* Classifies the end of one HTTP attempt.
 * curl_code: the CURLcode (0 for a transfer that completed at the HTTP level).
 * http_status: 0 when no response arrived.
 * error_code / error_type: from the error body or a stream error payload (may be
 * NULL or ""); "insufficient_quota" in either makes a 429 permanent (even with
 * x-should-retry: true, since waiting cannot add credit).
 * x_should_retry: the header value or NULL; "true"/"false" override the status.
 * stream_incomplete: 1 when the body ended without its completion marker or an
 * error payload arrived in the stream (retryable). */
enum llm_verdict llm_classify(int curl_code, long http_status, const char *error_code,
                              const char *error_type, const char *x_should_retry,
                              int stream_incomplete);

/* Server-given delay in milliseconds, or -1 when none usable. retry_after_ms
 * wins (float ms), then retry_after as float seconds or an HTTP-date (IMF-fixdate,
 * delay = date - now_epoch_ms, floored at 0). Either argument may be NULL. */
int64_t llm_retry_after_ms(const char *retry_after_ms, const char *retry_after,
                           int64_t now_epoch_ms);

struct llm_backoff {
    int64_t base_ms; /* default 1000 */
    double factor;   /* default 2 */
    int64_t cap_ms;  /* default 60000 */
    int jitter;      /* 1: full jitter U(0, d]; 0: exact d */
};

/* Delay before retry number `retries` (0 for the first retry):
 * d = min(cap, base * factor^retries), then full jitter drawn from *seed
 * (a xorshift state the caller keeps; never 0, though 0 is repaired). With a
 * NULL seed there is no jitter. */
int64_t llm_backoff_ms(const struct llm_backoff *b, int retries, uint64_t *seed);

#endif
