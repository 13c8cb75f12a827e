/* limits.h -- a provider's "limits" entry: which per-minute and in-flight
 * limits apply to each of its models. Pure: parsing and lookup only (the
 * arithmetic is limiter.h's).
 *
 * A provider's entry in the providers document (llm/registry.h) may hold
 *
 *   "limits": {"gpt-4o*": {"rpm": 500, "tpm": 30000, "concurrency": 20},
 *              "*":       {"rpm": 60}}
 *
 * A pattern is a model name, a prefix ending in '*', or '*' (the longest
 * match wins, llm_pattern_score()). Each limit counts per (provider, model)
 * across the fleet. "rpm" and "tpm" are per minute (> 0), "concurrency"
 * calls in flight (a whole number >= 1), "lease_s" how long a permit of a
 * worker that stopped answering lives (1 to 3600, 30 by default). At least
 * one of rpm, tpm and concurrency; unknown keys and impossible values are
 * errors. */
#ifndef CR_LLM_LIMITS_H
#define CR_LLM_LIMITS_H

#include <cjson/cJSON.h>

#include "limiter.h"
#include "util/err.h"

#define LLM_LIMITS_MAX 64         /* patterns per provider */
#define LLM_LIMIT_PATTERN_MAX 128 /* bytes of a pattern */
#define LLM_LIMIT_MAX_PER_MIN 1e9 /* rpm or tpm at most */
#define LLM_LIMIT_DEFAULT_LEASE_MS 30000

struct llm_limit_rule {
    char pattern[LLM_LIMIT_PATTERN_MAX];
    struct lim_config cfg;
};

struct llm_limits {
    struct llm_limit_rule *items; /* n of them; owned */
    int n;
};

/* Parses a "limits" object into l (replaced as a whole). provider names the
 * entry in messages. Returns 0, CR_EINVAL with a message naming the pattern
 * and key, or CR_ENOMEM; l is empty on failure. */
int llm_limits_parse(struct llm_limits *l, const cJSON *o, const char *provider,
                     struct cr_err *err);
void llm_limits_release(struct llm_limits *l);

/* The limits of model (the best matching pattern), or NULL when none
 * matches, or l or model is NULL. Borrowed from l. */
const struct lim_config *llm_limits_find(const struct llm_limits *l, const char *model);

/* Tokens a request is charged before its usage is known: its body's bytes
 * / 4 (about a token's worth of JSON text), plus for a chat its
 * "max_tokens" (or "max_completion_tokens", "num_predict") when the body
 * says it, else LLM_LIMIT_DEFAULT_ANSWER. A cheap scan, not a parse: a key
 * of that name inside a message's text can mislead it, and the correction
 * by the usage puts that right. */
#define LLM_LIMIT_DEFAULT_ANSWER 1000
long llm_limits_estimate(const char *body, size_t len, int chat);

#endif
