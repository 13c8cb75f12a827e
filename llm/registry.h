/* registry.h -- the worker's named LLM providers and which of them answers a
 * task's model, with its fallbacks. Pure: parses a providers document (JSON,
 * the --llm-providers file) and resolves model names; the environment is
 * read through a function the caller passes, so tests give their own.
 *
 * The document:
 *
 *   {"providers": {"claude": {"type": "anthropic", "api_key_env": "ANTHROPIC_API_KEY"},
 *                  "local":  {"type": "ollama", "base_url": "http://127.0.0.1:11434"}},
 *    "models": {"smart":    ["claude/claude-sonnet-4-5", "default/gpt-4o"],
 *               "llama*":   ["local"]}}
 *
 * A provider has a "type" (openai, anthropic, ollama, azure) and optionally
 * base_url, api_key_env (the name of the variable holding its key: keys are
 * never written in the file), api_version, deployment (azure), headers
 * ("Name: value" lines), max_tokens (anthropic's required default),
 * max_connections (its calls in flight at most, the rest waiting in order;
 * 0 or absent: only the worker's --llm-max-connections), prices, budget,
 * limits (llm/limits.h: shared by the fleet) and
 * timeouts {connect, first_byte, first_token, idle} in seconds. Unknown keys
 * are errors. "default" is the worker's own OpenAI-compatible provider
 * (--llm-base-url, --llm-api-key, --llm-header) and cannot be redefined.
 *
 * Resolving a task's model M gives an ordered list of targets, the first is
 * asked first and each next one is its fallback:
 *   1. "models" has M (exact), else the longest pattern "P*" with M starting
 *      with P: its list. A target is "name/model" or "name" (the model M
 *      itself, or the bare model when M is "name/...").
 *   2. M is "name/rest" with name a configured provider: [name, model rest].
 *   3. Otherwise the default provider with M whole (so a gateway's
 *      "org/model" names pass through unchanged).
 * A route may instead be a pool (llm/pool.h):
 *   {"targets": ["a/m", "b/m"], "strategy": "weighted", "weights": [3, 1],
 *    "fallbacks": ["default/gpt-4o-mini"]}
 * or "strategy": "least-busy" (no weights). Its first npool steps each pick
 * one of the targets afresh (the router does, skipping cooled ones), so a
 * failed call moves on to another of them; its fallbacks follow in order.
 * "weights" (whole numbers >= 0, one per target, a positive sum) defaults
 * to equal ones; unknown keys and impossible values are errors.
 * Without a document, the providers whose SDK variables are set exist too:
 * anthropic (ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL), ollama (OLLAMA_HOST),
 * azure (AZURE_OPENAI_ENDPOINT, key AZURE_OPENAI_API_KEY, OPENAI_API_VERSION);
 * a document may define those names itself instead. */
#ifndef CR_LLM_REGISTRY_H
#define CR_LLM_REGISTRY_H

#include <stddef.h>

#include "budget.h"
#include "limits.h"
#include "pool.h"
#include "prices.h"
#include "provider.h"
#include "util/err.h"

#define LLM_REGISTRY_MAX_PROVIDERS 32
#define LLM_REGISTRY_MAX_MODELS 256
#define LLM_REGISTRY_MAX_TARGETS 8 /* a model's provider and its fallbacks */
#define LLM_REGISTRY_MAX_HEADERS 16
#define LLM_REGISTRY_MAX_CONNECTIONS 100000 /* a provider's max_connections */

/* One named provider. Everything is owned by the registry. */
struct llm_named {
    char name[32];
    const struct llm_provider *impl; /* never NULL */
    struct llm_provider_config cfg;  /* its strings point into the fields below */
    char *base_url, *api_key, *api_version, *deployment;
    char *api_key_env;                           /* the variable's name, for messages */
    char *headers[LLM_REGISTRY_MAX_HEADERS + 1]; /* NULL-terminated */
    double connect_s, first_byte_s, first_token_s, idle_s; /* 0: the worker's */
    long max_connections;     /* calls in flight at once; 0: no cap of its own */
    struct llm_prices prices; /* its "prices" (llm/prices.h); empty: none */
    struct llm_budget budget; /* its "budget" (llm/budget.h); usd_per_day 0: none */
    struct llm_limits limits; /* its "limits" (llm/limits.h); empty: none */
};

struct llm_target {
    int provider; /* index in providers, or -1: the default provider */
    char *model;  /* NULL: the model the resolution gives (see above) */
};

struct llm_model_route {
    char *pattern; /* exact name, or a prefix ending in '*' */
    struct llm_target targets[LLM_REGISTRY_MAX_TARGETS];
    int ntargets;
    /* A pool: its npool targets come first, its fallbacks after them
     * (npool 0: an ordered list, strategy 0). */
    enum llm_pool_strategy strategy;
    int npool;
    long weights[LLM_POOL_MAX]; /* weighted: each pool target's */
};

struct llm_registry {
    struct llm_named providers[LLM_REGISTRY_MAX_PROVIDERS];
    int nproviders;
    struct llm_model_route models[LLM_REGISTRY_MAX_MODELS];
    int nmodels;
    /* The default provider's prices: "providers": {"default": {"prices":
     * {...}}}, the one key its entry may hold (it is configured by options). */
    struct llm_prices default_prices;
    struct llm_budget default_budget; /* "budget" in that entry too */
    struct llm_limits default_limits; /* and "limits" */
};

/* What resolve() gives for one step of a model's list. */
struct llm_resolved {
    const struct llm_named *named; /* NULL: the default provider */
    const char *name;              /* "default" or the provider's name */
    /* The model to send (borrowed from the registry or from the model
     * given: valid while both are). */
    const char *model;
    int more; /* another target follows this one */
    /* A pool's step: the route whose first npool targets the router picks
     * from (the fields above then name its first target); else NULL. */
    const struct llm_model_route *pool;
};

typedef const char *llm_getenv_fn(const char *name);

void llm_registry_init(struct llm_registry *r);
void llm_registry_release(struct llm_registry *r);

/* Parses a providers document (len bytes) into r (initialized, may already
 * hold providers from the environment: a document's provider of the same
 * name replaces it). Keys come from env(api_key_env). Returns 0, or
 * CR_EINVAL with a message naming the bad key (never a key's value), or
 * CR_ENOMEM. On failure r may hold part of the document: release it. */
int llm_registry_parse(struct llm_registry *r, const char *doc, size_t len,
                       llm_getenv_fn *env, struct cr_err *err);

/* Adds the providers the SDK environment variables describe (see above),
 * for names not defined yet. Returns 0 or CR_ENOMEM. */
int llm_registry_from_env(struct llm_registry *r, llm_getenv_fn *env, struct cr_err *err);

/* The index of the provider of this name (n bytes), or -1. */
int llm_registry_find(const struct llm_registry *r, const char *name, size_t n);

/* Resolves model (not NULL) at step (0: the first target). Returns 0, or
 * -1 when the list has no such step. */
int llm_registry_resolve(const struct llm_registry *r, const char *model, int step,
                         struct llm_resolved *out);

/* Fills out (named, name, model; more and pool untouched) with target i of
 * route mr (a route of r) for model, as resolve() would. */
void llm_registry_target(const struct llm_registry *r, const struct llm_model_route *mr,
                         int i, const char *model, struct llm_resolved *out);

#endif
