/* prices.h -- what a provider's tokens cost, and what one answer cost. Pure.
 *
 * A provider's entry in the providers document (llm/registry.h) may hold
 *
 *   "prices": {"gpt-4o*": {"input": 2.5, "output": 10, "cached_input": 1.25},
 *              "*":       {"input": 0.15, "output": 0.6}}
 *
 * in USD per million tokens. A pattern is a model name, a prefix ending in
 * '*', or '*'; the exact name wins, else the longest prefix. "input" and
 * "output" are required; "cached_input" (prompt tokens read from the
 * provider's cache) and "cache_write" (Anthropic's cache_creation tokens)
 * default to "input". Unknown keys, negative or absurd values are errors. */
#ifndef CR_LLM_PRICES_H
#define CR_LLM_PRICES_H

#include <cjson/cJSON.h>

#include "util/err.h"

#define LLM_PRICES_MAX 64          /* patterns per provider */
#define LLM_PRICE_PATTERN_MAX 128  /* bytes of a pattern */
#define LLM_PRICE_MAX_USD 1000000. /* per million tokens */

struct llm_price {
    char pattern[LLM_PRICE_PATTERN_MAX];
    double input, output, cached_input, cache_write; /* USD per million tokens */
};

struct llm_prices {
    struct llm_price *items; /* n of them; owned */
    int n;
};

/* How well a model pattern (a name, or a prefix ending in '*') matches
 * model: -1 not at all, the prefix's length for a prefix, LONG_MAX for the
 * exact name. The best match of a list is its highest score (the registry's
 * "models" and "prices" alike). */
long llm_pattern_score(const char *pattern, const char *model);

/* Parses a "prices" object into p (zeroed; replaced as a whole). provider
 * names the entry in messages. Returns 0, CR_EINVAL with a message naming
 * the pattern and key, or CR_ENOMEM; p is empty on failure. */
int llm_prices_parse(struct llm_prices *p, const cJSON *o, const char *provider,
                     struct cr_err *err);
void llm_prices_release(struct llm_prices *p);

/* The price for model (exact name first, else the longest matching prefix
 * pattern, '*' last); NULL when none matches, or p or model is NULL. */
const struct llm_price *llm_prices_find(const struct llm_prices *p, const char *model);

/* The price of an answer: by the model sent, else by the one the server
 * named in its answer (a dated snapshot of the name sent, often). */
const struct llm_price *llm_prices_pick(const struct llm_prices *p, const char *sent,
                                        const char *served);

/* One answer's cost in USD. prompt counts every input token, cached and
 * cache-written ones included (as struct llm_result says them); cached and
 * cache_write are the parts (-1: not said, as 0). Returns -1 when prompt or
 * completion is unknown (< 0) or pr is NULL. */
double llm_price_cost(const struct llm_price *pr, long prompt, long completion,
                      long cached, long cache_write);

#endif
