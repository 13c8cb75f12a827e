/* ollama.c -- Ollama native request building, NDJSON object and error mapping. */
#include "ollama.h"

#include <stdio.h>
#include <string.h>

#include "../util/alloc.h"

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static const char *get_str(const cJSON *o, const char *k)
{
    const cJSON *it = get(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

static int fail(struct cr_err *err, int code, const char *what)
{
    return cr_err_set(err, code, "%s", what);
}

static int add_dup(cJSON *obj, const char *key, const cJSON *item)
{
    cJSON *d = cJSON_Duplicate(item, 1);
    if (!d)
        return CR_ENOMEM;
    if (!(key ? cJSON_AddItemToObject(obj, key, d) : cJSON_AddItemToArray(obj, d))) {
        cJSON_Delete(d);
        return CR_ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- options */

/* The sampling options, in Ollama's names, from the OpenAI request. */
static int add_options(cJSON *body, const cJSON *req)
{
    static const char *const same[] = {
        "temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty"};
    const cJSON *v, *opt = get(req, "options"), *it;
    cJSON *o = cJSON_CreateObject();
    size_t i;

    if (!o)
        return CR_ENOMEM;
    for (i = 0; i < sizeof(same) / sizeof(same[0]); i++) {
        v = get(req, same[i]);
        if (cJSON_IsNumber(v) && add_dup(o, same[i], v))
            goto oom;
    }
    v = get(req, "max_tokens");
    if (!cJSON_IsNumber(v))
        v = get(req, "max_completion_tokens");
    if (cJSON_IsNumber(v) && add_dup(o, "num_predict", v))
        goto oom;
    v = get(req, "stop");
    if (cJSON_IsString(v)) {
        cJSON *a = cJSON_AddArrayToObject(o, "stop");
        if (!a || add_dup(a, NULL, v))
            goto oom;
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 && add_dup(o, "stop", v)) {
        goto oom;
    }
    /* Native options given by the caller win over the mapped ones. */
    cJSON_ArrayForEach(it, opt)
    {
        cJSON_DeleteItemFromObjectCaseSensitive(o, it->string);
        if (add_dup(o, it->string, it))
            goto oom;
    }
    if (!o->child) {
        cJSON_Delete(o);
        return 0;
    }
    if (!cJSON_AddItemToObject(body, "options", o))
        goto oom;
    return 0;
oom:
    cJSON_Delete(o);
    return CR_ENOMEM;
}

/* response_format -> format: "json" for json_object, the schema itself for
 * json_schema. A native "format" in the request wins. */
static int add_format(cJSON *body, const cJSON *req)
{
    const cJSON *rf = get(req, "response_format"), *schema;
    const char *type = get_str(rf, "type");

    if (get(req, "format"))
        return add_dup(body, "format", get(req, "format"));
    if (!type)
        return 0;
    if (strcmp(type, "json_object") == 0)
        return cJSON_AddStringToObject(body, "format", "json") ? 0 : CR_ENOMEM;
    schema = get(get(rf, "json_schema"), "schema");
    if (strcmp(type, "json_schema") == 0 && cJSON_IsObject(schema))
        return add_dup(body, "format", schema);
    return 0;
}

static int add_common(cJSON *body, const cJSON *req, int stream)
{
    static const char *const pass[] = {"keep_alive", "think"};
    size_t i;

    if (add_format(body, req) || add_options(body, req))
        return CR_ENOMEM;
    for (i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
        if (get(req, pass[i]) && add_dup(body, pass[i], get(req, pass[i])))
            return CR_ENOMEM;
    return cJSON_AddBoolToObject(body, "stream", stream ? 1 : 0) ? 0 : CR_ENOMEM;
}

static int finish(cJSON *o, int rc, char **body, size_t *len, struct cr_err *err)
{
    if (!rc) {
        *body = cJSON_PrintUnformatted(o);
        if (!*body)
            rc = fail(err, CR_ENOMEM, "cannot print request");
        else
            *len = strlen(*body);
    }
    cJSON_Delete(o);
    return rc;
}

static int start(const cJSON *req, const char *model, cJSON **o, char **body, size_t *len,
                 struct cr_err *err)
{
    *body = NULL;
    *len = 0;
    *o = NULL;
    if (!cJSON_IsObject(req))
        return fail(err, CR_EINVAL, "request is not a json object");
    if (!model)
        model = get_str(req, "model");
    if (!model)
        return fail(err, CR_EINVAL, "request has no 'model'");
    *o = cJSON_CreateObject();
    if (!*o || !cJSON_AddStringToObject(*o, "model", model)) {
        cJSON_Delete(*o);
        *o = NULL;
        return fail(err, CR_ENOMEM, "cannot build request");
    }
    return 0;
}

/* --------------------------------------------------------------- messages */

/* OpenAI content parts -> text (joined) and base64 images (data: URLs). */
static int split_parts(const cJSON *content, cJSON *msg)
{
    const cJSON *part;
    struct buf text;
    cJSON *images = NULL;
    int rc = 0;

    buf_init(&text);
    cJSON_ArrayForEach(part, content)
    {
        const char *type = get_str(part, "type");
        if (type && strcmp(type, "text") == 0 && get_str(part, "text")) {
            rc = buf_puts(&text, get_str(part, "text"));
        } else if (type && strcmp(type, "image_url") == 0) {
            const cJSON *iu = get(part, "image_url");
            const char *url = cJSON_IsString(iu) ? iu->valuestring : get_str(iu, "url");
            const char *b64 = url ? strstr(url, ";base64,") : NULL;
            if (b64) {
                if (!images && !(images = cJSON_AddArrayToObject(msg, "images")))
                    rc = CR_ENOMEM;
                else if (!cJSON_AddItemToArray(images, cJSON_CreateString(b64 + 8)))
                    rc = CR_ENOMEM;
            }
        }
        if (rc)
            break;
    }
    if (!rc && !cJSON_AddStringToObject(msg, "content", text.data ? text.data : ""))
        rc = CR_ENOMEM;
    buf_release(&text);
    return rc;
}

/* Assistant tool_calls: arguments go as an object, as Ollama sends them. */
static int add_tool_calls(cJSON *msg, const cJSON *calls)
{
    const cJSON *call;
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");

    if (!arr)
        return CR_ENOMEM;
    cJSON_ArrayForEach(call, calls)
    {
        const cJSON *fn = get(call, "function");
        const char *args = get_str(fn, "arguments");
        cJSON *c = cJSON_CreateObject(), *f, *a;

        if (!c || !cJSON_AddItemToArray(arr, c)) {
            cJSON_Delete(c);
            return CR_ENOMEM;
        }
        f = cJSON_AddObjectToObject(c, "function");
        if (!f || (get_str(fn, "name") &&
                   !cJSON_AddStringToObject(f, "name", get_str(fn, "name"))))
            return CR_ENOMEM;
        if (args) {
            a = cJSON_Parse(args);
            if (!cJSON_IsObject(a)) {
                cJSON_Delete(a);
                a = cJSON_CreateObject();
            }
        } else if (cJSON_IsObject(get(fn, "arguments"))) {
            a = cJSON_Duplicate(get(fn, "arguments"), 1);
        } else {
            a = cJSON_CreateObject();
        }
        if (!a || !cJSON_AddItemToObject(f, "arguments", a)) {
            cJSON_Delete(a);
            return CR_ENOMEM;
        }
    }
    return 0;
}

/* The function name of the call with this id, in the messages before `upto`. */
static const char *tool_name_for(const cJSON *msgs, const cJSON *upto, const char *id)
{
    const cJSON *m, *call;

    cJSON_ArrayForEach(m, msgs)
    {
        if (m == upto)
            break;
        cJSON_ArrayForEach(call, get(m, "tool_calls"))
        {
            const char *cid = get_str(call, "id");
            if (cid && strcmp(cid, id) == 0)
                return get_str(get(call, "function"), "name");
        }
    }
    return NULL;
}

static int add_message(cJSON *out, const cJSON *msgs, const cJSON *m)
{
    const char *role = get_str(m, "role");
    const cJSON *content = get(m, "content"), *calls = get(m, "tool_calls");
    cJSON *msg = cJSON_CreateObject();

    if (!msg || !cJSON_AddItemToArray(out, msg)) {
        cJSON_Delete(msg);
        return CR_ENOMEM;
    }
    /* developer is OpenAI's newer name for system. */
    if (!cJSON_AddStringToObject(msg, "role",
                                 strcmp(role, "developer") == 0 ? "system" : role))
        return CR_ENOMEM;
    if (cJSON_IsArray(content)) {
        if (split_parts(content, msg))
            return CR_ENOMEM;
    } else if (!cJSON_AddStringToObject(
                   msg, "content", cJSON_IsString(content) ? content->valuestring : "")) {
        return CR_ENOMEM;
    }
    if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0 &&
        add_tool_calls(msg, calls))
        return CR_ENOMEM;
    if (strcmp(role, "tool") == 0 && get_str(m, "tool_call_id")) {
        const char *name = tool_name_for(msgs, m, get_str(m, "tool_call_id"));
        if (name && !cJSON_AddStringToObject(msg, "tool_name", name))
            return CR_ENOMEM;
    }
    if (get(m, "images") && add_dup(msg, "images", get(m, "images")))
        return CR_ENOMEM;
    return 0;
}

int ollama_build_chat(const cJSON *req, const char *model, int stream, char **body,
                      size_t *len, struct cr_err *err)
{
    const cJSON *msgs = get(req, "messages"), *m, *tools;
    cJSON *o, *out;
    int rc;

    if ((rc = start(req, model, &o, body, len, err)))
        return rc;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return finish(o, fail(err, CR_EINVAL, "request has no 'messages'"), body, len,
                      err);
    out = cJSON_AddArrayToObject(o, "messages");
    if (!out)
        return finish(o, fail(err, CR_ENOMEM, "cannot build messages"), body, len, err);
    cJSON_ArrayForEach(m, msgs)
    {
        if (!get_str(m, "role"))
            return finish(o, fail(err, CR_EINVAL, "each message needs a string 'role'"),
                          body, len, err);
        if (add_message(out, msgs, m))
            return finish(o, fail(err, CR_ENOMEM, "cannot build messages"), body, len,
                          err);
    }
    tools = get(req, "tools");
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0 &&
        add_dup(o, "tools", tools))
        return finish(o, fail(err, CR_ENOMEM, "cannot build tools"), body, len, err);
    if (add_common(o, req, stream))
        return finish(o, fail(err, CR_ENOMEM, "cannot build request"), body, len, err);
    return finish(o, 0, body, len, err);
}

int ollama_build_generate(const cJSON *req, const char *model, int stream, char **body,
                          size_t *len, struct cr_err *err)
{
    static const char *const pass[] = {"suffix", "system", "template", "raw", "images"};
    const cJSON *prompt = get(req, "prompt");
    cJSON *o;
    size_t i;
    int rc;

    if ((rc = start(req, model, &o, body, len, err)))
        return rc;
    if (cJSON_IsArray(prompt))
        prompt = cJSON_GetArrayItem(prompt, 0);
    if (!cJSON_IsString(prompt))
        return finish(o, fail(err, CR_EINVAL, "request has no string 'prompt'"), body,
                      len, err);
    if (!cJSON_AddStringToObject(o, "prompt", prompt->valuestring))
        return finish(o, fail(err, CR_ENOMEM, "cannot build request"), body, len, err);
    for (i = 0; i < sizeof(pass) / sizeof(pass[0]); i++)
        if (get(req, pass[i]) && add_dup(o, pass[i], get(req, pass[i])))
            return finish(o, fail(err, CR_ENOMEM, "cannot build request"), body, len,
                          err);
    if (add_common(o, req, stream))
        return finish(o, fail(err, CR_ENOMEM, "cannot build request"), body, len, err);
    return finish(o, 0, body, len, err);
}

int ollama_build_embed(const cJSON *req, const char *model, char **body, size_t *len,
                       struct cr_err *err)
{
    const cJSON *input = get(req, "input"), *it;
    cJSON *o;
    int rc;

    if ((rc = start(req, model, &o, body, len, err)))
        return rc;
    if (cJSON_IsArray(input)) {
        cJSON_ArrayForEach(it, input)
        {
            if (!cJSON_IsString(it))
                return finish(
                    o,
                    fail(err, CR_EINVAL,
                         "ollama embeddings take a string or a list of strings"),
                    body, len, err);
        }
    } else if (!cJSON_IsString(input)) {
        return finish(
            o,
            fail(err, CR_EINVAL, "ollama embeddings take a string or a list of strings"),
            body, len, err);
    }
    if (add_dup(o, "input", input) ||
        (cJSON_IsNumber(get(req, "dimensions")) &&
         add_dup(o, "dimensions", get(req, "dimensions"))) ||
        (get(req, "truncate") && add_dup(o, "truncate", get(req, "truncate"))) ||
        (get(req, "keep_alive") && add_dup(o, "keep_alive", get(req, "keep_alive"))))
        return finish(o, fail(err, CR_ENOMEM, "cannot build request"), body, len, err);
    return finish(o, 0, body, len, err);
}

/* ----------------------------------------------------------------- errors */

static void error_init(struct chat_error *out, long status)
{
    memset(out, 0, sizeof(*out));
    out->status = status;
    out->kind = chat_error_kind_of_status(status);
    out->retry_after_ms = -1;
}

/* {"error":"text"} (native), {"error":{message,type,code}} (the /v1 layer). */
static int json_error(const cJSON *root, struct chat_error *out)
{
    const cJSON *e = get(root, "error");
    const char *msg = NULL;

    if (cJSON_IsString(e)) {
        msg = e->valuestring;
    } else if (cJSON_IsObject(e)) {
        const char *t = get_str(e, "type"), *c = get_str(e, "code");
        msg = get_str(e, "message");
        if (t)
            chat_copy_text(out->type, sizeof(out->type), t, strlen(t));
        if (c)
            chat_copy_text(out->code, sizeof(out->code), c, strlen(c));
    }
    if (!msg)
        return 0;
    chat_copy_text(out->message, sizeof(out->message), msg, strlen(msg));
    return 1;
}

void ollama_error_parse(long status, const char *body, size_t len, struct chat_error *out)
{
    cJSON *root;
    int found = 0;

    error_init(out, status);
    if (!body)
        return;
    root = chat_json_parse(body, len, 1, "error body", NULL);
    if (root) {
        found = json_error(root, out);
        cJSON_Delete(root);
    }
    if (found)
        return;
    while (len > 0 && (*body == ' ' || *body == '\n' || *body == '\r' || *body == '\t')) {
        body++;
        len--;
    }
    chat_copy_text(out->message, sizeof(out->message), body, len);
}

/* ----------------------------------------------------------------- stream */

const char *ollama_finish_reason(const char *done_reason)
{
    if (!done_reason)
        return NULL;
    if (strcmp(done_reason, "stop") == 0 || strcmp(done_reason, "load") == 0 ||
        strcmp(done_reason, "unload") == 0)
        return "stop";
    if (strcmp(done_reason, "length") == 0)
        return "length";
    return NULL;
}

/* Tool calls arrive whole, one or more per object; each becomes the next call. */
static int apply_tool_calls(struct chat_reply *r, const cJSON *calls, struct cr_err *err)
{
    const cJSON *call;
    int rc;

    cJSON_ArrayForEach(call, calls)
    {
        const cJSON *fn = get(call, "function"), *args = get(fn, "arguments");
        int key = (int)r->ntools;
        struct chat_tool_call *t = chat_reply_tool(r, key, 1, &rc);
        char idbuf[32];
        char *s;

        if (!t)
            return chat_store_error(rc, err, "tool call");
        snprintf(idbuf, sizeof(idbuf), "call_%d", key);
        if (chat_tool_set(&t->id, get_str(call, "id") ? get_str(call, "id") : idbuf) ||
            chat_tool_set(&t->name, get_str(fn, "name")))
            return chat_store_error(CR_ENOMEM, err, "tool call");
        if (cJSON_IsString(args))
            s = cr_strdup(args->valuestring);
        else if (args)
            s = cJSON_PrintUnformatted(args);
        else
            s = cr_strdup("{}");
        rc = s ? chat_tool_add_args(t, s, strlen(s)) : CR_ENOMEM;
        cr_free(s);
        if (rc)
            return chat_store_error(rc, err, "tool arguments");
    }
    return 0;
}

static int apply(struct chat_reply *r, const cJSON *root, int in_stream,
                 struct cr_err *err)
{
    const cJSON *msg = get(root, "message"), *e = get(root, "error");
    const char *text = NULL, *model = get_str(root, "model");
    int rc;

    if ((cJSON_IsString(e) && e->valuestring[0]) || (cJSON_IsObject(e) && e->child)) {
        struct chat_error ce;
        error_init(&ce, 0);
        json_error(root, &ce);
        ce.in_stream = in_stream;
        /* The native API gives no type: a failure after the 200 is the
         * server's (a runner that died, a model that failed to load). */
        ce.kind = CHAT_ERROR_SERVER;
        if (chat_reply_set_error(r, &ce))
            return cr_err_set(err, CR_ENOMEM, "cannot store error details");
        return 0;
    }
    if (model && chat_reply_set_model(r, model, strlen(model)))
        return chat_store_error(CR_ENOMEM, err, "model name");
    if (cJSON_IsObject(msg))
        text = get_str(msg, "content");
    if (!text)
        text = get_str(root, "response");
    if (text && (rc = chat_reply_add_text(r, text, strlen(text))))
        return chat_store_error(rc, err, "text");
    if (cJSON_IsArray(get(msg, "tool_calls")) &&
        (rc = apply_tool_calls(r, get(msg, "tool_calls"), err)))
        return rc;
    if (cJSON_IsTrue(get(root, "done"))) {
        const char *why = get_str(root, "done_reason"), *mapped;
        long p = chat_json_count(get(root, "prompt_eval_count"));
        long c = chat_json_count(get(root, "eval_count"));
        r->done = 1;
        if (!why)
            why = "stop";
        chat_copy_text(r->native_finish, sizeof(r->native_finish), why, strlen(why));
        mapped = ollama_finish_reason(why);
        mapped = mapped ? mapped : why;
        /* Ollama says stop after a tool call; OpenAI says tool_calls. */
        if (r->ntools > 0 && strcmp(mapped, "stop") == 0)
            mapped = "tool_calls";
        chat_copy_text(r->finish_reason, sizeof(r->finish_reason), mapped,
                       strlen(mapped));
        if (p >= 0)
            r->prompt_tokens = p;
        if (c >= 0)
            r->completion_tokens = c;
        chat_reply_sum_usage(r);
    }
    return 0;
}

int ollama_stream_feed(struct chat_reply *r, const char *line, size_t len,
                       const char **delta, size_t *delta_len, struct cr_err *err)
{
    size_t start = r->content.len;
    cJSON *root;
    int rc;

    if (delta)
        *delta = "";
    if (delta_len)
        *delta_len = 0;
    r->frames++;
    if (!line || chat_json_blank(line, len))
        return 0;
    root = chat_json_parse(line, len, 1, "stream object", err);
    if (!root)
        return CR_EPROTO;
    rc = apply(r, root, 1, err);
    cJSON_Delete(root);
    if (rc)
        return rc;
    chat_reply_delta(r, start, delta, delta_len);
    return 0;
}

int ollama_stream_complete(const struct chat_reply *r)
{
    return chat_reply_complete(r);
}

int ollama_chat_parse(struct chat_reply *r, const char *body, size_t len,
                      struct cr_err *err)
{
    cJSON *root = chat_json_parse(body, len, 1, "chat response", err);
    int rc;

    if (!root)
        return CR_EPROTO;
    r->frames++;
    rc = apply(r, root, 0, err);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------- embeddings */

cJSON *ollama_embed_parse(const char *body, size_t len, int list_input,
                          long *prompt_tokens, struct cr_err *err)
{
    cJSON *root, *embs, *v, *out = NULL;
    const cJSON *x;

    if (prompt_tokens)
        *prompt_tokens = -1;
    root = chat_json_parse(body, len, 1, "embeddings response", err);
    if (!root)
        return NULL;
    if (get(root, "error")) {
        struct chat_error e;
        error_init(&e, 0);
        if (!json_error(root, &e))
            chat_copy_text(e.message, sizeof(e.message), "unknown error", 13);
        cr_err_set(err, CR_EPROTO, "embeddings error: %s", e.message);
        goto done;
    }
    embs = cJSON_GetObjectItemCaseSensitive(root, "embeddings");
    if (!cJSON_IsArray(embs)) {
        cr_err_set(err, CR_EPROTO, "embeddings response has no 'embeddings' array");
        goto done;
    }
    cJSON_ArrayForEach(v, embs)
    {
        if (!cJSON_IsArray(v)) {
            cr_err_set(err, CR_EPROTO, "embedding is not an array of numbers");
            goto done;
        }
        cJSON_ArrayForEach(x, v)
        {
            if (!cJSON_IsNumber(x)) {
                cr_err_set(err, CR_EPROTO, "embedding is not an array of numbers");
                goto done;
            }
        }
    }
    if (!list_input && cJSON_GetArraySize(embs) < 1) {
        cr_err_set(err, CR_EPROTO, "embeddings response has no vector");
        goto done;
    }
    /* Detached, not copied: the vectors can be large. */
    out = list_input ? cJSON_DetachItemViaPointer(root, embs)
                     : cJSON_DetachItemFromArray(embs, 0);
    if (prompt_tokens)
        *prompt_tokens = chat_json_count(get(root, "prompt_eval_count"));
done:
    cJSON_Delete(root);
    return out;
}
