/* rl_headers.h -- what a provider's rate-limit headers say about its limits
 * now, as pure code: OpenAI's x-ratelimit-remaining-requests/-tokens with
 * x-ratelimit-reset-requests/-tokens (a duration such as "1s", "6m0s",
 * "20ms"), and Anthropic's anthropic-ratelimit-{requests,tokens,
 * input-tokens,output-tokens}-remaining with their -reset (an RFC 3339
 * time). No I/O, no clock: the time now is an argument. */
#ifndef CR_LLM_RL_HEADERS_H
#define CR_LLM_RL_HEADERS_H

#include <stddef.h>
#include <stdint.h>

/* Longest hold these headers may put on a limit: a bad or far-off reset
 * must not stop a fleet for long (providers reset within a minute). */
#define LLM_RL_MAX_HOLD_MS 60000

/* Parses a duration in Go's notation, as OpenAI writes its resets: one or
 * more of a number (digits, an optional fraction) followed by a unit (h, m,
 * s, ms, us or µs, ns), e.g. "1s", "6m0s", "20ms", "1h2m3.5s"; or a bare
 * number of seconds. Spaces around it are ignored. *ms is rounded up to a
 * whole millisecond. Returns 0, or CR_EINVAL for anything else (empty, a
 * number without a unit after a unit, an unknown unit, a sign, more than a
 * day) with *ms unchanged. */
int llm_rl_duration_ms(const char *s, size_t len, int64_t *ms);

/* The header values a response carried (each NULL when absent; borrowed). */
struct llm_rl_headers {
    const char *remaining[4]; /* requests, tokens, input-tokens, output-tokens */
    const char *reset[4];     /* the same order */
};

/* Indexes into llm_rl_headers for a header's name (len bytes, any case):
 * sets *which (0..3) and *is_reset, and returns 1 when it is one of the
 * headers above, else 0. */
int llm_rl_header_kind(const char *name, size_t len, int *which, int *is_reset);

/* How long nothing more should go to the provider by these headers: the
 * longest reset among the limits with 0 remaining (each reset a duration,
 * or a time counted from now_epoch_ms), at most LLM_RL_MAX_HOLD_MS; 0 when
 * every limit has some left, or says nothing usable. */
int64_t llm_rl_hold_ms(const struct llm_rl_headers *h, int64_t now_epoch_ms);

#endif
