/* tasks.h -- the built-in tasks: names, argument binding, LLM request bodies and
 * results. Pure: no I/O, no clock.
 *
 *   llm.generate(prompt, model=None, system=None, template=None, **params) -> str
 *   llm.chat(messages, model=None, **params) -> {content, model, finish_reason, usage}
 *   llm.embed(input, model=None) -> [float] or [[float]]
 *   celery.accumulate(*args, index=None) -> args[index] or list(args)
 *   celery.map(task, it) -> [task(item) for item in it]
 *   celery.starmap(task, it) -> [task(*item) for item in it]
 *   celery.chunks(task, it, n) -> [[task(*item) for item in part] for part
 *                                 in parts of n]
 * (the last three are run by engine/fanout.c: tasks.c only binds them)
 */
#ifndef CR_TASKS_H
#define CR_TASKS_H

#include <cjson/cJSON.h>

#include "llm/llm_types.h"
#include "protocol/celery_msg.h"
#include "util/buf.h"
#include "util/err.h"

enum task_kind {
    TASK_UNKNOWN = 0,
    TASK_GENERATE,
    TASK_CHAT,
    TASK_EMBED,
    TASK_ACCUMULATE,
    TASK_MAP,     /* celery.map */
    TASK_STARMAP, /* celery.starmap */
    TASK_CHUNKS,  /* celery.chunks */
};

/* Whether kind is one of the built-ins whose items are calls of another task. */
static inline int tasks_is_fanout(enum task_kind kind)
{
    return kind == TASK_MAP || kind == TASK_STARMAP || kind == TASK_CHUNKS;
}

/* Names of the built-in tasks, NULL-terminated, sorted. */
extern const char *const tasks_builtin_names[];

/* Looks name up among the built-ins, then among aliases ("NAME=TASK" strings,
 * naliases of them). Returns TASK_UNKNOWN when neither knows it. */
enum task_kind tasks_lookup(const char *name, char *const *aliases, int naliases);

/* Checks that every alias ("NAME=TASK") names a built-in TASK. Returns 0, or
 * CR_EINVAL with one line in err naming the first alias that does not and
 * its unknown target, with the built-ins a letter or two away (or with the
 * same name after the dot) as suggestions. Aliases run only on built-ins:
 * one naming another alias, or a typo, would make every task it maps fail
 * NotRegistered. */
int tasks_check_aliases(char *const *aliases, int naliases, struct cr_err *err);

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
    /* Which of the model's providers to ask: 0 the first, 1 its first
     * fallback, ... (the switchboard resolves it; see llm_result.fallback_left). */
    int route_step;
    /* 1: the answer must parse as JSON (response_format json_schema or
     * json_object), else a permanent failure; 2: the same, retried. */
    int json_answer;
    /* 1: a chat that passes tools, so its answer may hold tool calls. */
    int tools;
};

/* The llm.chat keyword argument that makes an answer that is not the JSON
 * its response_format asked for a retried failure (it is not sent). */
#define TASKS_RETRY_INVALID_JSON "retry_invalid_json"

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

/* ----------------------------------------------- celery.map, starmap, chunks */

/* The most items a map takes: each one costs a result kept until the map ends. */
#define TASKS_FANOUT_MAX_ITEMS 100000

/* What a celery.map / celery.starmap / celery.chunks message asks. Borrowed
 * from the task_msg it was bound from (valid while its args and kwargs are). */
struct task_fanout {
    const char *task; /* the inner task's name (a signature's "task", or a name) */
    const cJSON *it;  /* a JSON array of at most TASKS_FANOUT_MAX_ITEMS */
    int nitems;
    long n; /* celery.chunks: items per part (>= 1); 1 otherwise */
};

/* Binds m's arguments as Python's xmap(task, it), xstarmap(task, it) or
 * chunks(task, it, n) do. The signature's own args, kwargs and options are not
 * read: Python's built-ins call signature(task).type, the bare task. Returns 0,
 * or CR_EINVAL with *te filled: TypeError for a bad call or an `it` that is
 * not a list ("'int' object is not iterable" as Python says; a str or a dict,
 * which Python would iterate, is refused here too), ValueError for a chunk
 * size that is not an integer >= 1 or more than TASKS_FANOUT_MAX_ITEMS items. */
int tasks_bind_fanout(enum task_kind kind, const struct task_msg *m,
                      struct task_fanout *out, struct task_error *te);

/* The positional arguments the inner task `inner` gets for one item: [item]
 * for celery.map; for celery.starmap and celery.chunks the item unpacked as
 * Python's *item does (a list as it is, a str as its characters, a dict as
 * its keys). New array; NULL with *te filled (TypeError: not iterable), or
 * NULL with te->exc_type empty on OOM. */
cJSON *tasks_item_args(enum task_kind kind, const char *inner, const cJSON *item,
                       struct task_error *te);

/* Python's type name of a JSON value ("int", "str", "NoneType", ...). */
const char *tasks_py_type(const cJSON *v);

#endif
