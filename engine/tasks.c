/* tasks.c -- built-in task registry and argument binding (no I/O). */
#include "tasks.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "protocol/pyjson.h"
#include "util/alloc.h"
#include "util/err.h"

const char *const tasks_builtin_names[] = {
    "celery.accumulate", "celery.chunks", "celery.map",   "celery.starmap",
    "llm.chat",          "llm.embed",     "llm.generate", NULL};

static enum task_kind builtin(const char *name)
{
    if (!strcmp(name, "llm.generate"))
        return TASK_GENERATE;
    if (!strcmp(name, "llm.chat"))
        return TASK_CHAT;
    if (!strcmp(name, "llm.embed"))
        return TASK_EMBED;
    if (!strcmp(name, "celery.accumulate"))
        return TASK_ACCUMULATE;
    if (!strcmp(name, "celery.map"))
        return TASK_MAP;
    if (!strcmp(name, "celery.starmap"))
        return TASK_STARMAP;
    if (!strcmp(name, "celery.chunks"))
        return TASK_CHUNKS;
    return TASK_UNKNOWN;
}

enum task_kind tasks_lookup(const char *name, char *const *aliases, int naliases)
{
    enum task_kind k = builtin(name);
    size_t n = strlen(name);
    if (k != TASK_UNKNOWN)
        return k;
    for (int i = 0; i < naliases; i++) {
        const char *a = aliases[i];
        if (!strncmp(a, name, n) && a[n] == '=')
            return builtin(a + n + 1);
    }
    return TASK_UNKNOWN;
}

/* Levenshtein distance of a and b, cut off at 9 (enough to tell a typo from
 * another name). O(len(a) x len(b)); both are task names. */
static int distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[130];
    if (lb >= sizeof(row) / sizeof(row[0]) || la >= 128)
        return 9;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb] < 9 ? row[lb] : 9;
}

int tasks_check_aliases(char *const *aliases, int naliases, struct cr_err *err)
{
    for (int i = 0; i < naliases; i++) {
        const char *eq = strchr(aliases[i], '=');
        const char *target = eq ? eq + 1 : "";
        char near[200] = "";
        size_t n = 0;
        if (builtin(target) != TASK_UNKNOWN)
            continue;
        /* A typo is a name or two letters off, or one that differs only in
         * its module ("generate" for "llm.generate"). */
        for (int k = 0; tasks_builtin_names[k]; k++) {
            const char *b = tasks_builtin_names[k], *dot = strchr(b, '.');
            if (distance(target, b) > 2 && (!dot || strcmp(target, dot + 1)))
                continue;
            n += (size_t)snprintf(near + n, sizeof(near) - n, "%s%s", n ? ", " : "", b);
            if (n >= sizeof(near))
                break;
        }
        if (near[0])
            return cr_err_set(err, CR_EINVAL,
                              "--task-alias '%.80s': '%.60s' is not a built-in task "
                              "(did you mean %.100s?)",
                              aliases[i], target, near);
        return cr_err_set(err, CR_EINVAL,
                          "--task-alias '%.80s': '%.60s' is not a built-in task (one "
                          "of llm.generate, llm.chat, llm.embed, celery.accumulate, "
                          "celery.map, celery.starmap, celery.chunks)",
                          aliases[i], target);
    }
    return 0;
}

static int fail(struct task_error *te, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct task_error *te, const char *type, const char *fmt, ...)
{
    va_list ap;
    snprintf(te->exc_type, sizeof(te->exc_type), "%s", type);
    va_start(ap, fmt);
    vsnprintf(te->message, sizeof(te->message), fmt, ap);
    va_end(ap);
    return CR_EINVAL;
}

/* Python-style binding of positional and keyword arguments to named
 * parameters. Unnamed keywords are left for **params. */
struct binding {
    const char *task;
    const char *const *names;
    int nnames;
    int nrequired;
    const cJSON *values[4];
};

static int bind_args(struct binding *b, const struct task_msg *m, struct task_error *te)
{
    int npos = cJSON_GetArraySize(m->args);
    const cJSON *kw;
    memset(b->values, 0, sizeof(b->values));
    if (npos > b->nnames)
        return fail(te, "TypeError",
                    "%s() takes from %d to %d positional arguments but %d "
                    "were given",
                    b->task, b->nrequired, b->nnames, npos);
    for (int i = 0; i < npos; i++)
        b->values[i] = cJSON_GetArrayItem(m->args, i);
    cJSON_ArrayForEach(kw, m->kwargs)
    {
        for (int i = 0; i < b->nnames; i++) {
            if (!strcmp(kw->string, b->names[i])) {
                if (b->values[i])
                    return fail(te, "TypeError",
                                "%s() got multiple values for argument '%s'", b->task,
                                b->names[i]);
                b->values[i] = kw;
            }
        }
    }
    for (int i = 0; i < b->nrequired; i++)
        if (!b->values[i])
            return fail(te, "TypeError",
                        "%s() missing 1 required positional argument: '%s'", b->task,
                        b->names[i]);
    return 0;
}

static int is_named(const struct binding *b, const char *key)
{
    for (int i = 0; i < b->nnames; i++)
        if (!strcmp(key, b->names[i]))
            return 1;
    return 0;
}

/* Optional string parameter: absent or null -> NULL. */
static int opt_string(const struct binding *b, int i, const char **out,
                      struct task_error *te)
{
    const cJSON *v = b->values[i];
    *out = NULL;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return fail(te, "TypeError", "%s() argument '%s' must be a string", b->task,
                    b->names[i]);
    *out = v->valuestring;
    return 0;
}

/* Adds the pass-through keyword arguments (max_tokens, temperature, ...) to
 * the request, leaving out the ones that would break streaming. */
static int add_params(cJSON *req, const struct binding *b, const struct task_msg *m)
{
    const cJSON *kw;
    cJSON_ArrayForEach(kw, m->kwargs)
    {
        cJSON *dup;
        if (is_named(b, kw->string) || !strcmp(kw->string, "stream") ||
            !strcmp(kw->string, "stream_options") || !strcmp(kw->string, "messages") ||
            !strcmp(kw->string, TASKS_RETRY_INVALID_JSON))
            continue;
        dup = cJSON_Duplicate(kw, 1);
        if (!dup)
            return CR_ENOMEM;
        /* The key is copied: that allocation can fail too, and then the
         * item is ours to free. */
        if (!cJSON_AddItemToObject(req, kw->string, dup)) {
            cJSON_Delete(dup);
            return CR_ENOMEM;
        }
    }
    return 0;
}

/* Joins a list prompt (e.g. a chord's results) with newlines; strings are used
 * as they are, other values as their JSON text. */
static int prompt_text(const struct binding *b, struct buf *out, struct task_error *te)
{
    const cJSON *p = b->values[0], *it;
    int first = 1;
    if (cJSON_IsString(p))
        return buf_puts(out, p->valuestring);
    if (!cJSON_IsArray(p))
        return fail(te, "TypeError", "%s() argument 'prompt' must be a string or a list",
                    b->task);
    cJSON_ArrayForEach(it, p)
    {
        if (!first && buf_putc(out, '\n'))
            return CR_ENOMEM;
        first = 0;
        if (cJSON_IsString(it)) {
            if (buf_puts(out, it->valuestring))
                return CR_ENOMEM;
        } else {
            char *s = cJSON_PrintUnformatted(it);
            int rc = s ? buf_puts(out, s) : CR_ENOMEM;
            cr_free(s);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int apply_template(const char *tpl, const char *input, struct buf *out,
                          struct task_error *te)
{
    const char *p = tpl, *hit;
    if (!strstr(tpl, "{input}"))
        return fail(te, "ValueError", "template has no {input} placeholder");
    while ((hit = strstr(p, "{input}"))) {
        if (buf_append(out, p, (size_t)(hit - p)) || buf_puts(out, input))
            return CR_ENOMEM;
        p = hit + 7;
    }
    return buf_puts(out, p);
}

static cJSON *message(const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) ||
        !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static int finish_body(cJSON *req, struct task_call *out)
{
    out->tools = cJSON_GetObjectItemCaseSensitive(req, "tools") != NULL;
    out->body = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    if (!out->body)
        return CR_ENOMEM;
    out->body_len = strlen(out->body);
    return 0;
}

static int set_model(cJSON *req, const char *model, struct task_call *out)
{
    snprintf(out->model, sizeof(out->model), "%s", model);
    return cJSON_AddStringToObject(req, "model", model) ? 0 : CR_ENOMEM;
}

/* What the answer must be: JSON when response_format asks for it (a JSON
 * schema, or json_object), and whether a failure to parse is retried. */
static void answer_rule(const struct task_msg *m, struct task_call *out)
{
    const cJSON *rf = cJSON_GetObjectItemCaseSensitive(m->kwargs, "response_format");
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rf, "type"));
    if (type && (!strcmp(type, "json_schema") || !strcmp(type, "json_object")))
        out->json_answer = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
                               m->kwargs, TASKS_RETRY_INVALID_JSON))
                               ? 2
                               : 1;
}

/* Streams unless the task says stream=False: then one whole answer. */
static int stream_options(cJSON *req, const struct task_msg *m)
{
    cJSON *so;
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(m->kwargs, "stream")))
        return cJSON_AddFalseToObject(req, "stream") ? 0 : CR_ENOMEM;
    if (!cJSON_AddTrueToObject(req, "stream"))
        return CR_ENOMEM;
    so = cJSON_AddObjectToObject(req, "stream_options");
    return so && cJSON_AddTrueToObject(so, "include_usage") ? 0 : CR_ENOMEM;
}

static int build_generate(const struct task_msg *m, const char *default_model,
                          struct task_call *out, struct task_error *te)
{
    static const char *const names[] = {"prompt", "model", "system", "template"};
    struct binding b = {"llm.generate", names, 4, 1, {0}};
    const char *model, *system, *tpl;
    struct buf prompt, wrapped;
    cJSON *req = NULL, *msgs, *um;
    int rc;

    if ((rc = bind_args(&b, m, te)) || (rc = opt_string(&b, 1, &model, te)) ||
        (rc = opt_string(&b, 2, &system, te)) || (rc = opt_string(&b, 3, &tpl, te)))
        return rc;
    buf_init(&prompt);
    buf_init(&wrapped);
    if ((rc = prompt_text(&b, &prompt, te)))
        goto out;
    if (tpl && (rc = apply_template(tpl, prompt.data ? prompt.data : "", &wrapped, te)))
        goto out;
    rc = CR_ENOMEM;
    req = cJSON_CreateObject();
    if (!req || set_model(req, model ? model : default_model, out))
        goto out;
    msgs = cJSON_AddArrayToObject(req, "messages");
    if (!msgs)
        goto out;
    if (system) {
        cJSON *sm = message("system", system);
        if (!sm)
            goto out;
        cJSON_AddItemToArray(msgs, sm);
    }
    um = message("user", tpl ? (wrapped.data ? wrapped.data : "")
                             : (prompt.data ? prompt.data : ""));
    if (!um)
        goto out;
    cJSON_AddItemToArray(msgs, um);
    if (add_params(req, &b, m) || stream_options(req, m))
        goto out;
    out->op = LLM_OP_CHAT;
    rc = finish_body(req, out);
    req = NULL;
out:
    cJSON_Delete(req);
    buf_release(&prompt);
    buf_release(&wrapped);
    return rc;
}

static int build_chat(const struct task_msg *m, const char *default_model,
                      struct task_call *out, struct task_error *te)
{
    static const char *const names[] = {"messages", "model"};
    struct binding b = {"llm.chat", names, 2, 1, {0}};
    const char *model;
    const cJSON *msgs, *it;
    cJSON *req, *dup;
    int rc;

    if ((rc = bind_args(&b, m, te)) || (rc = opt_string(&b, 1, &model, te)))
        return rc;
    msgs = b.values[0];
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(te, "TypeError",
                    "llm.chat() argument 'messages' must be a non-empty "
                    "list of {'role', 'content'} dicts");
    cJSON_ArrayForEach(it, msgs)
    {
        if (!cJSON_IsObject(it) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(it, "role")))
            return fail(te, "ValueError",
                        "llm.chat() each message needs a string 'role'");
    }
    req = cJSON_CreateObject();
    if (!req || set_model(req, model ? model : default_model, out))
        goto oom;
    dup = cJSON_Duplicate(msgs, 1);
    if (!dup)
        goto oom;
    if (!cJSON_AddItemToObject(req, "messages", dup)) {
        cJSON_Delete(dup);
        goto oom;
    }
    if (add_params(req, &b, m) || stream_options(req, m))
        goto oom;
    out->op = LLM_OP_CHAT;
    answer_rule(m, out);
    return finish_body(req, out);
oom:
    cJSON_Delete(req);
    return CR_ENOMEM;
}

static int build_embed(const struct task_msg *m, const char *default_model,
                       struct task_call *out, struct task_error *te)
{
    static const char *const names[] = {"input", "model"};
    struct binding b = {"llm.embed", names, 2, 1, {0}};
    const char *model;
    const cJSON *input, *it;
    cJSON *req, *dup;
    int rc;

    if ((rc = bind_args(&b, m, te)) || (rc = opt_string(&b, 1, &model, te)))
        return rc;
    /* Like Python, llm.embed takes no other keyword arguments. */
    cJSON_ArrayForEach(it, m->kwargs)
    {
        if (!is_named(&b, it->string))
            return fail(te, "TypeError",
                        "llm.embed() got an unexpected keyword argument '%s'",
                        it->string);
    }
    input = b.values[0];
    if (cJSON_IsArray(input)) {
        cJSON_ArrayForEach(it, input)
        {
            if (!cJSON_IsString(it))
                return fail(te, "TypeError",
                            "llm.embed() argument 'input' must be a string or a list of "
                            "strings");
        }
        out->embed_list = 1;
    } else if (!cJSON_IsString(input)) {
        return fail(te, "TypeError",
                    "llm.embed() argument 'input' must be a string or a list of strings");
    }
    req = cJSON_CreateObject();
    if (!req || set_model(req, model ? model : default_model, out))
        goto oom;
    dup = cJSON_Duplicate(input, 1);
    if (!dup)
        goto oom;
    if (!cJSON_AddItemToObject(req, "input", dup)) {
        cJSON_Delete(dup);
        goto oom;
    }
    /* Ask for floats: they go straight into the result without decoding. */
    if (!cJSON_AddStringToObject(req, "encoding_format", "float"))
        goto oom;
    out->op = LLM_OP_EMBED;
    return finish_body(req, out);
oom:
    cJSON_Delete(req);
    return CR_ENOMEM;
}

int tasks_build_call(enum task_kind kind, const struct task_msg *m,
                     const char *default_model, const char *default_embed_model,
                     struct task_call *out, struct task_error *te)
{
    memset(out, 0, sizeof(*out));
    switch (kind) {
    case TASK_GENERATE:
        return build_generate(m, default_model, out, te);
    case TASK_CHAT:
        return build_chat(m, default_model, out, te);
    case TASK_EMBED:
        return build_embed(m, default_embed_model, out, te);
    default:
        return fail(te, "TypeError", "task does not call an LLM");
    }
}

void task_call_release(struct task_call *c)
{
    cr_free(c->body);
    c->body = NULL;
}

cJSON *tasks_result(enum task_kind kind, struct llm_result *res)
{
    const char *text = res->text ? res->text : "";
    const char *fin = res->finish_reason ? res->finish_reason : "";
    cJSON *o, *u;

    if (kind == TASK_EMBED) {
        o = res->embedding;
        res->embedding = NULL;
        return o;
    }
    if (kind == TASK_GENERATE)
        return cJSON_CreateString(text);
    o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (!cJSON_AddStringToObject(o, "content", text) ||
        !cJSON_AddStringToObject(o, "model", res->model ? res->model : "") ||
        !(fin[0] ? cJSON_AddStringToObject(o, "finish_reason", fin)
                 : cJSON_AddNullToObject(o, "finish_reason")))
        goto oom;
    /* As the OpenAI SDK's message.tool_calls: None when there are none. */
    if (res->reply && res->reply->ntools) {
        cJSON *calls = chat_reply_tool_calls_json(res->reply);
        if (!calls || !cJSON_AddItemToObject(o, "tool_calls", calls)) {
            cJSON_Delete(calls);
            goto oom;
        }
    } else if (!cJSON_AddNullToObject(o, "tool_calls")) {
        goto oom;
    }
    if (!cJSON_AddStringToObject(
            o, "provider", res->provider && res->provider[0] ? res->provider : "default"))
        goto oom;
    /* Always a dict with the three counts. The provider's own when it sent
     * a usage object ("source": "provider"; a count it left out is null);
     * otherwise the worker cannot count tokens without the model's tokenizer,
     * so the counts are null and it says what it did see ("source":
     * "worker", "completion_chunks": the deltas that carried text, often
     * but not always one token each). See the README, "Usage". */
    u = cJSON_AddObjectToObject(o, "usage");
    if (!u)
        goto oom;
    {
        int given = res->prompt_tokens >= 0 || res->completion_tokens >= 0 ||
                    res->total_tokens >= 0;
        const char *names[3] = {"prompt_tokens", "completion_tokens", "total_tokens"};
        long vals[3] = {res->prompt_tokens, res->completion_tokens, res->total_tokens};
        for (int i = 0; i < 3; i++)
            if (!(vals[i] >= 0 ? cJSON_AddNumberToObject(u, names[i], (double)vals[i])
                               : cJSON_AddNullToObject(u, names[i])))
                goto oom;
        if (!cJSON_AddStringToObject(u, "source", given ? "provider" : "worker"))
            goto oom;
        if (!given &&
            !cJSON_AddNumberToObject(u, "completion_chunks", (double)res->content_chunks))
            goto oom;
        /* The parts the provider said (OpenAI's *_tokens_details,
         * Anthropic's cache counts), only when it said them. */
        {
            const char *parts[3] = {"cached_tokens", "cache_creation_tokens",
                                    "reasoning_tokens"};
            long pv[3] = {res->cached_tokens, res->cache_write_tokens,
                          res->reasoning_tokens};
            for (int i = 0; i < 3; i++)
                if (pv[i] >= 0 && !cJSON_AddNumberToObject(u, parts[i], (double)pv[i]))
                    goto oom;
        }
        /* USD, from the provider's "prices"; null without a price. */
        if (!(res->cost_usd >= 0 ? cJSON_AddNumberToObject(u, "cost", res->cost_usd)
                                 : cJSON_AddNullToObject(u, "cost")))
            goto oom;
    }
    return o;
oom:
    cJSON_Delete(o);
    return NULL;
}

cJSON *tasks_accumulate(const struct task_msg *m, struct task_error *te)
{
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(m->kwargs, "index");
    const cJSON *kw;
    cJSON_ArrayForEach(kw, m->kwargs)
    {
        if (strcmp(kw->string, "index")) {
            fail(te, "TypeError", "accumulate() got an unexpected keyword argument '%s'",
                 kw->string);
            return NULL;
        }
    }
    if (index && !cJSON_IsNull(index)) {
        int n = cJSON_GetArraySize(m->args), i;
        if (!cJSON_IsNumber(index)) {
            fail(te, "TypeError", "tuple indices must be integers or slices, not %s",
                 cJSON_IsString(index) ? "str" : "object");
            return NULL;
        }
        i = (int)index->valuedouble;
        if (i < 0)
            i += n;
        if (i < 0 || i >= n) {
            snprintf(te->exc_type, sizeof(te->exc_type), "IndexError");
            snprintf(te->message, sizeof(te->message), "tuple index out of range");
            return NULL;
        }
        return cJSON_Duplicate(cJSON_GetArrayItem(m->args, i), 1);
    }
    return cJSON_Duplicate(m->args, 1);
}

/* ----------------------------------------------- celery.map, starmap, chunks */

const char *tasks_py_type(const cJSON *v)
{
    if (cJSON_IsBool(v))
        return "bool";
    if (cJSON_IsNumber(v))
        return v->type & PY_JSON_FLOAT ? "float" : "int";
    if (cJSON_IsString(v))
        return "str";
    if (cJSON_IsArray(v))
        return "list";
    if (cJSON_IsObject(v))
        return "dict";
    return "NoneType";
}

int tasks_bind_fanout(enum task_kind kind, const struct task_msg *m,
                      struct task_fanout *out, struct task_error *te)
{
    static const char *const names[] = {"task", "it", "n"};
    /* The names of Python's functions, which its TypeErrors show. */
    const char *fn = kind == TASK_MAP       ? "xmap"
                     : kind == TASK_STARMAP ? "xstarmap"
                                            : "chunks";
    struct binding b = {
        fn, names, kind == TASK_CHUNKS ? 3 : 2, kind == TASK_CHUNKS ? 3 : 2, {0}};
    const cJSON *task, *it, *kw;
    int rc;

    memset(out, 0, sizeof(*out));
    out->n = 1;
    if (!tasks_is_fanout(kind))
        return fail(te, "TypeError", "task is not celery.map, starmap or chunks");
    if ((rc = bind_args(&b, m, te)))
        return rc;
    cJSON_ArrayForEach(kw, m->kwargs)
    {
        if (!is_named(&b, kw->string))
            return fail(te, "TypeError", "%s() got an unexpected keyword argument '%s'",
                        fn, kw->string);
    }
    /* signature(task) takes a signature dict, or a task name. */
    task = b.values[0];
    if (cJSON_IsObject(task))
        task = cJSON_GetObjectItemCaseSensitive(task, "task");
    if (!cJSON_IsString(task) || !task->valuestring[0])
        return fail(te, "TypeError",
                    "%s() argument 'task' must be a signature or a task name", fn);
    out->task = task->valuestring;
    it = b.values[1];
    if (cJSON_IsString(it) || cJSON_IsObject(it))
        return fail(te, "TypeError", "%s() argument 'it' must be a list, not %s", fn,
                    tasks_py_type(it));
    if (!cJSON_IsArray(it))
        return fail(te, "TypeError", "'%s' object is not iterable", tasks_py_type(it));
    out->nitems = cJSON_GetArraySize(it);
    if (out->nitems > TASKS_FANOUT_MAX_ITEMS)
        return fail(te, "ValueError",
                    "%s() argument 'it' has %d items, over the limit of %d", fn,
                    out->nitems, TASKS_FANOUT_MAX_ITEMS);
    out->it = it;
    if (kind == TASK_CHUNKS) {
        const cJSON *n = b.values[2];
        /* Python's chunks() slices with islice(it, n - 1). */
        if (!cJSON_IsNumber(n) || (n->type & PY_JSON_FLOAT) || n->valuedouble < 1 ||
            n->valuedouble > 1e15)
            return fail(te, "ValueError",
                        "Stop argument for islice() must be None or an integer: 0 <= x "
                        "<= sys.maxsize.");
        out->n = (long)n->valuedouble;
    }
    return 0;
}

/* The characters of a UTF-8 string, one string each (Python's *"abc"). */
static cJSON *string_chars(const char *s)
{
    cJSON *a = cJSON_CreateArray();
    char ch[5];
    while (a && *s) {
        size_t n = 1;
        cJSON *c;
        while (s[n] && ((unsigned char)s[n] & 0xC0) == 0x80 && n < 4)
            n++;
        memcpy(ch, s, n);
        ch[n] = '\0';
        s += n;
        c = cJSON_CreateString(ch);
        if (!c || !cJSON_AddItemToArray(a, c)) {
            cJSON_Delete(c);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

static cJSON *dict_keys(const cJSON *o)
{
    cJSON *a = cJSON_CreateArray();
    const cJSON *kw;
    cJSON_ArrayForEach(kw, o)
    {
        cJSON *c;
        if (!a)
            return NULL;
        c = cJSON_CreateString(kw->string);
        if (!c || !cJSON_AddItemToArray(a, c)) {
            cJSON_Delete(c);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

cJSON *tasks_item_args(enum task_kind kind, const char *inner, const cJSON *item,
                       struct task_error *te)
{
    cJSON *a, *dup;
    te->exc_type[0] = '\0';
    if (kind == TASK_MAP) {
        a = cJSON_CreateArray();
        dup = cJSON_Duplicate(item, 1);
        if (!a || !dup || !cJSON_AddItemToArray(a, dup)) {
            cJSON_Delete(a);
            cJSON_Delete(dup);
            return NULL;
        }
        return a;
    }
    if (cJSON_IsArray(item))
        return cJSON_Duplicate(item, 1);
    if (cJSON_IsString(item))
        return string_chars(item->valuestring);
    if (cJSON_IsObject(item))
        return dict_keys(item);
    fail(te, "TypeError", "%s() argument after * must be an iterable, not %s", inner,
         tasks_py_type(item));
    return NULL;
}
