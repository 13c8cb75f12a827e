/* tasks.h -- the built-in tasks: names, argument binding, LLM request bodies and
 * results. Pure: no I/O, no clock.
 *
 *   llm.generate(prompt, model=None, system=None, template=None, **params) -> str
 *   llm.chat(messages, model=None, **params) -> {content, model, finish_reason, usage}
 *   llm.embed(input, model=None) -> [float] or [[float]]
 *   celery.accumulate(*args, index=None) -> args[index] or list(args)
 */
#ifndef CR_TASKS_H
#define CR_TASKS_H

#include <cjson/cJSON.h>

#include "llm/llm_types.h"
#include "protocol/celery_msg.h"
#include "util/buf.h"

enum task_kind {
    TASK_UNKNOWN = 0,
    TASK_GENERATE,
    TASK_CHAT,
    TASK_EMBED,
    TASK_ACCUMULATE,
};

/* Names of the built-in tasks, NULL-terminated, sorted. */
extern const char *const tasks_builtin_names[];

/* Looks name up among the built-ins, then among aliases ("NAME=TASK" strings,
 * naliases of them). Returns TASK_UNKNOWN when neither knows it. */
enum task_kind tasks_lookup(const char *name, char *const *aliases, int naliases);

/* A Python-style error for a bad call: exc_type is "TypeError" or "ValueError"
 * (module builtins), message as Python would word it. */
struct task_error {
    char exc_type[32];
    char message[256];
};

/* An LLM request for a task. body is new (cr_free). */
struct task_call {
    enum llm_op op;
    char *body;
    size_t body_len;
    int embed_list;
    char model[128];
};

/* Binds m's args/kwargs for kind and builds the request JSON. default_model is
 * used when the task gives none (default_embed_model for llm.embed). Returns 0,
 * CR_EINVAL with *te filled for a bad call, or CR_ENOMEM. */
int tasks_build_call(enum task_kind kind, const struct task_msg *m,
                     const char *default_model, const char *default_embed_model,
                     struct task_call *out, struct task_error *te);
void task_call_release(struct task_call *c);

/* Turns a successful LLM result into the task's return value (new JSON, NULL on
 * OOM). For llm.embed it takes res->embedding. */
cJSON *tasks_result(enum task_kind kind, struct llm_result *res);

/* Runs celery.accumulate. Returns a new JSON value, or NULL with *te filled. */
cJSON *tasks_accumulate(const struct task_msg *m, struct task_error *te);

#endif
