/* llm_stack.h -- the LLM side of a worker, made once from the configuration:
 * the client on the loop, the named providers with their gates and health
 * counters, the router, and the secrets cut out of what is shown. Shared by
 * the Celery worker (worker.c) and the RQ worker (rq_worker.c), so both run
 * the built-in tasks through the same path. Loop thread only. */
#ifndef CR_LLM_STACK_H
#define CR_LLM_STACK_H

#include <stdint.h>
#include <uv.h>

#include "config.h"
#include "llm/health.h"
#include "llm/llm_client.h"
#include "llm/registry.h"
#include "llm/router.h"
#include "util/err.h"
#include "util/redact.h"

/* Embedded by its owner. */
struct llm_stack {
    /* read-only after llm_stack_open() */
    struct llm_client *client;
    struct redact secrets;         /* config_secrets() and the providers' keys */
    struct llm_registry providers; /* named providers and model routes */
    /* One per named provider (parallel to providers.providers), its
     * max_connections as the cap; freed after the client. */
    struct llm_gate *gates;
    /* One per named provider, then the default provider's last: whether its
     * calls are failing, for the WARNING lines of an outage. */
    struct llm_health *health;
    struct llm_router router; /* which provider answers a task's call */
};

/* Zeroes s so that llm_stack_release() is always safe. */
void llm_stack_init(struct llm_stack *s);

/* Loads the secrets and providers of cfg (borrowed; must outlive s; reading
 * --llm-providers from a file blocks: start-up only), makes the client on
 * loop and the router. Returns 0, or an error with one line in err; s then
 * holds what was made, for llm_stack_close() and llm_stack_release(). */
int llm_stack_open(struct llm_stack *s, uv_loop_t *loop, const struct config *cfg,
                   struct cr_err *err);

/* Notes a finished call's outcome in its provider's health, and logs the
 * WARNING lines of an outage (its start, every minute while it lasts, its
 * end). */
void llm_stack_note(struct llm_stack *s, const struct llm_result *res, uint64_t now_ms);

/* Frees the client: every call in flight gets its on_done (CR_ECANCELED).
 * The handles close on the loop, which must run before llm_stack_release(). */
void llm_stack_close(struct llm_stack *s);

/* Frees the rest, after llm_stack_close() and a loop run. */
void llm_stack_release(struct llm_stack *s);

#endif
