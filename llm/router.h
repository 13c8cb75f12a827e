/* router.h -- one LLM call from a task's request: which provider answers it,
 * the request as that provider wants it, and its start on the client.
 *
 * The switchboard asks "call this" (a struct llm_call: the task's
 * OpenAI-shaped request, its model and which of the model's providers to
 * ask) and gets the outcome through the one llm_done_fn it passed, whoever
 * answered. Which provider that is comes from the registry (registry.h: the
 * model's routes and fallbacks); a provider with a cap on calls in flight
 * queues the call in its gate (gate.h). The default OpenAI-compatible
 * provider's plain calls keep the fast path: the task's own body goes out as
 * it is and the answer is read by openai_stream, without a provider request
 * built or a chat_reply kept. Every other call is built by its provider's
 * build() and read by its mapping (provider.h). Not thread-safe: the
 * client's loop thread only. */
#ifndef CR_LLM_ROUTER_H
#define CR_LLM_ROUTER_H

#include <stddef.h>

#include "gate.h"
#include "llm_client.h"
#include "provider.h"
#include "registry.h"
#include "util/err.h"

/* What a task asks for. Borrowed for the llm_router_call() only. */
struct llm_call {
    enum llm_op op;
    const char *body; /* the OpenAI-shaped JSON request */
    size_t body_len;
    int embed_list;    /* LLM_OP_EMBED: the input was a list */
    const char *model; /* the task's model: what the registry routes */
    int route_step;    /* 0: the model's first provider, 1: its first fallback... */
    int tools;         /* a chat that passes tools: its answer may hold tool calls */
    /* Header lines of this call's trace context, or NULL/0 (llm_request's
     * trace_headers): sent whichever provider answers. */
    const char *const *trace_headers;
    size_t ntrace_headers;
};

/* Who answers one call, and how (llm_router_plan()). Borrowed from the
 * router and the call. */
struct llm_route {
    const struct llm_named *named;   /* NULL: the default provider */
    const char *name;                /* "default" or the provider's name */
    const struct llm_provider *impl; /* whose build() and mapping */
    const struct llm_provider_config *cfg;
    const char *model; /* the name to send */
    int fast;          /* 1: the fast path (see the top) */
    int more;          /* another provider follows this one (a fallback) */
    /* A pool's step (llm_router_plan() gives its first target; the call
     * picks one, llm_router_pick()); else NULL. */
    const struct llm_model_route *pool;
    int pooled; /* the target was picked from a pool */
};

struct llm_router {
    /* private: set by llm_router_init() */
    struct llm_client *client;
    const struct llm_registry *providers;
    struct llm_gate *gates;           /* one per named provider, or NULL */
    struct llm_provider_config deflt; /* the default provider; strings borrowed */
    char *chat_url, *embed_url;       /* its endpoints, owned */
    /* Each provider's budget state (llm/budget.h): the named ones in the
     * registry's order, then the default provider's. */
    struct llm_budget budgets[LLM_REGISTRY_MAX_PROVIDERS + 1];
    /* The shared limits met so far, one per (provider, model) that has a
     * "limits" pattern matching it (owned; made on first use). */
    struct llm_limit *limits;
    /* Each pool route's choice state, by its index in the registry. */
    struct llm_pool_state pools[LLM_REGISTRY_MAX_MODELS];
};

/* Sets up rt for client, the named providers and their gates (one per
 * provider, in the registry's order; NULL when there are none) and the
 * default provider's configuration (base_url, api_key, headers: the
 * client's). All are borrowed and must outlive rt. Returns 0 or CR_ENOMEM
 * (then rt holds nothing). Release with llm_router_release(), also after
 * a failure; a zeroed router releases as a no-op. */
int llm_router_init(struct llm_router *rt, struct llm_client *client,
                    const struct llm_registry *providers, struct llm_gate *gates,
                    const struct llm_provider_config *deflt, struct cr_err *err);
void llm_router_release(struct llm_router *rt);

/* Who answers c (pure). Returns 0, or CR_EINVAL when the model has no
 * provider at c->route_step. */
int llm_router_plan(const struct llm_router *rt, const struct llm_call *c,
                    struct llm_route *out, struct cr_err *err);

/* When to is a pool's step: picks its target for c at now_ms (loop ms, the
 * clock of llm_limit.cool_until) with the pool's strategy, skipping cooled
 * targets (all cooled: the one cooled the shortest, where the call waits or
 * leaves for its fallback), and makes to name it. Each target's limit is made
 * on first use (a pool's target has one even without "limits": it keeps its
 * cooling and its calls in flight). Returns 0 or CR_ENOMEM. */
int llm_router_pick(struct llm_router *rt, const struct llm_call *c, int64_t now_ms,
                    struct llm_route *to, struct cr_err *err);

/* The limits made so far (a list through llm_limit.next; borrowed, owned by
 * rt; a limit, once made, lives as long as rt). */
struct llm_limit *llm_router_limits(struct llm_router *rt);

/* Plans c, builds its request and starts it on the client. Returns the
 * call, or NULL with err set: CR_EINVAL when no provider can take it (no
 * provider at that step, or a request the provider cannot express), else
 * CR_ENOMEM; on_done is then never called. Otherwise on_done is called
 * exactly once, as llm_client_submit() says; on_delta (may be NULL) gets
 * each streamed text delta. */
/* The budget state of provider i (0 .. nproviders: the last is the default
 * provider's) and its name; NULL past the end. The worker keeps the shared
 * counts with it (llm/budget.h). */
struct llm_budget *llm_router_budget(struct llm_router *rt, int i, const char **name);

/* An answer of the provider named name ("" or "default": the default) cost
 * usd on day (llm_budget_day()). */
void llm_router_spent(struct llm_router *rt, const char *name, long day, double usd);

/* The limit of a (provider, model), made on first use; NULL when no
 * "limits" pattern of the provider (NULL: the default one) matches the model,
 * or *oom set when out of memory. Owned by rt. */
struct llm_limit *llm_router_limit(struct llm_router *rt, const struct llm_named *named,
                                   const char *name, const char *model, int *oom);

/* As described above (a pool's step picked by llm_router_pick()); a call
 * whose provider has reached its budget today is refused too: NULL with CR_EBUDGET and a
 * message naming it. */
struct llm_req *llm_router_call(struct llm_router *rt, const struct llm_call *c,
                                llm_delta_fn *on_delta, llm_done_fn *on_done,
                                void *privdata, struct cr_err *err);

#endif
