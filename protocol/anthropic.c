/* anthropic.c -- Anthropic Messages request building, stream and error mapping. */
#include "anthropic.h"

#include <limits.h>
#include <string.h>

#include "../util/alloc.h"

/* Content block indexes above this are refused: a hostile stream could
 * otherwise make a tool call per huge index (they are bounded in number by
 * CHAT_REPLY_MAX_TOOLS anyway; this keeps the key an honest small int). */
#define MAX_BLOCK_INDEX 100000

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static const char *get_str(const cJSON *o, const char *k)
{
    const cJSON *it = get(o, k);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* ------------------------------------------------------------ error types */

static const struct {
    const char *type;
    long status;
    enum chat_error_kind kind;
} error_types[] = {
    {"invalid_request_error", 400, CHAT_ERROR_BAD_REQUEST},
    {"authentication_error", 401, CHAT_ERROR_AUTH},
    {"billing_error", 402, CHAT_ERROR_BILLING},
    {"permission_error", 403, CHAT_ERROR_PERMISSION},
    {"not_found_error", 404, CHAT_ERROR_NOT_FOUND},
    {"request_too_large", 413, CHAT_ERROR_TOO_LARGE},
    {"rate_limit_error", 429, CHAT_ERROR_RATE_LIMIT},
    {"api_error", 500, CHAT_ERROR_SERVER},
    {"timeout_error", 504, CHAT_ERROR_TIMEOUT},
    {"overloaded_error", 529, CHAT_ERROR_OVERLOADED},
};

long anthropic_error_status(const char *type, enum chat_error_kind *kind)
{
    size_t i;

    if (kind)
        *kind = CHAT_ERROR_UNKNOWN;
    if (!type)
        return 0;
    for (i = 0; i < sizeof(error_types) / sizeof(error_types[0]); i++) {
        if (strcmp(type, error_types[i].type) == 0) {
            if (kind)
                *kind = error_types[i].kind;
            return error_types[i].status;
        }
    }
    return 0;
}

const char *anthropic_finish_reason(const char *stop_reason)
{
    static const char *const map[][2] = {
        {"end_turn", "stop"},
        {"stop_sequence", "stop"},
        {"pause_turn", "stop"},
        {"max_tokens", "length"},
        {"model_context_window_exceeded", "length"},
        {"tool_use", "tool_calls"},
        {"refusal", "content_filter"},
    };
    size_t i;

    if (!stop_reason)
        return NULL;
    for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(stop_reason, map[i][0]) == 0)
            return map[i][1];
    return NULL;
}

static void fill_error(struct chat_error *out, const cJSON *root, long status)
{
    const cJSON *e = get(root, "error");
    const char *type = NULL, *msg = NULL;
    enum chat_error_kind kind;
    long doc;

    if (cJSON_IsObject(e)) {
        type = get_str(e, "type");
        msg = get_str(e, "message");
        if (get_str(e, "code"))
            chat_copy_text(out->code, sizeof(out->code), get_str(e, "code"),
                           strlen(get_str(e, "code")));
    } else if (cJSON_IsString(e)) {
        msg = e->valuestring;
    }
    if (!msg)
        msg = get_str(root, "message");
    if (!type && !cJSON_IsObject(e))
        type = get_str(root, "type");
    if (type)
        chat_copy_text(out->type, sizeof(out->type), type, strlen(type));
    if (msg)
        chat_copy_text(out->message, sizeof(out->message), msg, strlen(msg));
    doc = anthropic_error_status(type, &kind);
    out->status = status ? status : doc;
    out->kind =
        kind != CHAT_ERROR_UNKNOWN ? kind : chat_error_kind_of_status(out->status);
}

static void error_init(struct chat_error *out, long status)
{
    memset(out, 0, sizeof(*out));
    out->status = status;
    out->kind = chat_error_kind_of_status(status);
    out->retry_after_ms = -1;
}

void anthropic_error_parse(long status, const char *body, size_t len,
                           struct chat_error *out)
{
    cJSON *root;

    error_init(out, status);
    if (!body)
        return;
    root = chat_json_parse(body, len, 1, "error body", NULL);
    if (root) {
        fill_error(out, root, status);
        cJSON_Delete(root);
        if (out->message[0])
            return;
    }
    while (len > 0 && (*body == ' ' || *body == '\n' || *body == '\r' || *body == '\t')) {
        body++;
        len--;
    }
    chat_copy_text(out->message, sizeof(out->message), body, len);
}

/* ------------------------------------------------------------ the request */

static int fail(struct cr_err *err, int code, const char *what)
{
    return cr_err_set(err, code, "%s", what);
}

/* Appends a copy of item to arr under key (object) or as an element. */
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

/* The text of an OpenAI content value (string, or the text parts joined). */
static int content_text(const cJSON *c, struct buf *out)
{
    const cJSON *part;

    if (cJSON_IsString(c))
        return buf_puts(out, c->valuestring);
    cJSON_ArrayForEach(part, c)
    {
        const char *t = get_str(part, "text");
        if (t && buf_puts(out, t))
            return CR_ENOMEM;
    }
    return 0;
}

/* image_url part -> image block: a data: URL becomes a base64 source. */
static cJSON *image_block(const cJSON *part)
{
    const cJSON *iu = get(part, "image_url");
    const char *url = cJSON_IsString(iu) ? iu->valuestring : get_str(iu, "url");
    cJSON *b = cJSON_CreateObject(), *src;
    const char *semi, *comma;

    if (!b || !url || !cJSON_AddStringToObject(b, "type", "image") ||
        !(src = cJSON_AddObjectToObject(b, "source")))
        goto fail;
    if (strncmp(url, "data:", 5) == 0 && (semi = strstr(url, ";base64,")) &&
        (comma = semi + 7) && semi > url + 5) {
        char mt[128];
        chat_copy_text(mt, sizeof(mt), url + 5, (size_t)(semi - url - 5));
        if (!cJSON_AddStringToObject(src, "type", "base64") ||
            !cJSON_AddStringToObject(src, "media_type", mt) ||
            !cJSON_AddStringToObject(src, "data", comma + 1))
            goto fail;
    } else if (!cJSON_AddStringToObject(src, "type", "url") ||
               !cJSON_AddStringToObject(src, "url", url)) {
        goto fail;
    }
    return b;
fail:
    cJSON_Delete(b);
    return NULL;
}

/* OpenAI content (string or parts) -> Anthropic content (string or blocks). */
static cJSON *convert_content(const cJSON *c)
{
    const cJSON *part;
    cJSON *arr;

    if (cJSON_IsString(c))
        return cJSON_CreateString(c->valuestring);
    if (!cJSON_IsArray(c))
        return cJSON_CreateString("");
    arr = cJSON_CreateArray();
    if (!arr)
        return NULL;
    cJSON_ArrayForEach(part, c)
    {
        const char *type = get_str(part, "type");
        cJSON *b = NULL;
        if (type && strcmp(type, "text") == 0 && get_str(part, "text")) {
            b = cJSON_CreateObject();
            if (b && (!cJSON_AddStringToObject(b, "type", "text") ||
                      !cJSON_AddStringToObject(b, "text", get_str(part, "text")))) {
                cJSON_Delete(b);
                b = NULL;
            }
        } else if (type && strcmp(type, "image_url") == 0) {
            b = image_block(part);
        } else {
            b = cJSON_Duplicate(part, 1);
        }
        if (!b || !cJSON_AddItemToArray(arr, b)) {
            cJSON_Delete(b);
            cJSON_Delete(arr);
            return NULL;
        }
    }
    return arr;
}

/* Makes sure content is an array of blocks (a string becomes one text block;
 * an empty string none). */
static cJSON *as_blocks(cJSON *content)
{
    cJSON *arr, *b;

    if (cJSON_IsArray(content))
        return content;
    arr = cJSON_CreateArray();
    if (!arr) {
        cJSON_Delete(content);
        return NULL;
    }
    if (cJSON_IsString(content) && content->valuestring[0]) {
        b = cJSON_CreateObject();
        if (!b || !cJSON_AddItemToArray(arr, b) ||
            !cJSON_AddStringToObject(b, "type", "text") ||
            !cJSON_AddStringToObject(b, "text", content->valuestring)) {
            cJSON_Delete(arr);
            arr = NULL;
        }
    }
    cJSON_Delete(content);
    return arr;
}

static int add_tool_uses(cJSON *blocks, const cJSON *calls, struct cr_err *err)
{
    const cJSON *call;

    cJSON_ArrayForEach(call, calls)
    {
        const cJSON *fn = get(call, "function");
        const char *id = get_str(call, "id"), *name = get_str(fn, "name");
        const char *args = get_str(fn, "arguments");
        cJSON *b, *input = NULL;

        if (!id || !name)
            return fail(err, CR_EINVAL, "assistant tool call needs an id and a name");
        if (args)
            input = cJSON_Parse(args);
        if (!cJSON_IsObject(input)) {
            cJSON_Delete(input);
            input = cJSON_CreateObject();
        }
        b = cJSON_CreateObject();
        if (!input || !b || !cJSON_AddItemToArray(blocks, b)) {
            cJSON_Delete(input);
            cJSON_Delete(b);
            return fail(err, CR_ENOMEM, "cannot build tool_use block");
        }
        if (!cJSON_AddStringToObject(b, "type", "tool_use") ||
            !cJSON_AddStringToObject(b, "id", id) ||
            !cJSON_AddStringToObject(b, "name", name) ||
            !cJSON_AddItemToObject(b, "input", input)) {
            cJSON_Delete(input);
            return fail(err, CR_ENOMEM, "cannot build tool_use block");
        }
    }
    return 0;
}

/* Appends a user/assistant message (or a tool result) to msgs. *tool_turn
 * is the user turn that holds the current run of tool results, if any. */
static int add_message(cJSON *msgs, const cJSON *m, const char *role, cJSON **tool_turn,
                       struct cr_err *err)
{
    cJSON *out, *content, *b;
    const cJSON *calls = get(m, "tool_calls");

    if (strcmp(role, "tool") == 0) {
        const char *id = get_str(m, "tool_call_id");
        cJSON *blocks;
        if (!id)
            return fail(err, CR_EINVAL, "tool message needs a 'tool_call_id'");
        if (!*tool_turn) {
            out = cJSON_CreateObject();
            if (!out || !cJSON_AddItemToArray(msgs, out)) {
                cJSON_Delete(out);
                return fail(err, CR_ENOMEM, "cannot build tool_result");
            }
            if (!cJSON_AddStringToObject(out, "role", "user") ||
                !cJSON_AddArrayToObject(out, "content"))
                return fail(err, CR_ENOMEM, "cannot build tool_result");
            *tool_turn = out;
        }
        blocks = cJSON_GetObjectItemCaseSensitive(*tool_turn, "content");
        b = cJSON_CreateObject();
        content = convert_content(get(m, "content"));
        if (!b || !content || !cJSON_AddItemToArray(blocks, b)) {
            cJSON_Delete(b);
            cJSON_Delete(content);
            return fail(err, CR_ENOMEM, "cannot build tool_result");
        }
        if (!cJSON_AddStringToObject(b, "type", "tool_result") ||
            !cJSON_AddStringToObject(b, "tool_use_id", id) ||
            !cJSON_AddItemToObject(b, "content", content)) {
            cJSON_Delete(content);
            return fail(err, CR_ENOMEM, "cannot build tool_result");
        }
        return 0;
    }
    *tool_turn = NULL;
    content = convert_content(get(m, "content"));
    if (content && strcmp(role, "assistant") == 0 && cJSON_IsArray(calls) &&
        cJSON_GetArraySize(calls) > 0) {
        int rc;
        content = as_blocks(content);
        if (content && (rc = add_tool_uses(content, calls, err))) {
            cJSON_Delete(content);
            return rc;
        }
    }
    out = cJSON_CreateObject();
    if (!content || !out || !cJSON_AddItemToArray(msgs, out)) {
        cJSON_Delete(content);
        cJSON_Delete(out);
        return fail(err, CR_ENOMEM, "cannot build message");
    }
    if (!cJSON_AddStringToObject(out, "role", role) ||
        !cJSON_AddItemToObject(out, "content", content)) {
        cJSON_Delete(content);
        return fail(err, CR_ENOMEM, "cannot build message");
    }
    return 0;
}

static int convert_tools(cJSON *body, const cJSON *tools, struct cr_err *err)
{
    const cJSON *t;
    cJSON *arr = cJSON_AddArrayToObject(body, "tools");

    if (!arr)
        return fail(err, CR_ENOMEM, "cannot build tools");
    cJSON_ArrayForEach(t, tools)
    {
        const cJSON *fn = get(t, "function");
        const char *name = get_str(fn, "name");
        const cJSON *params = get(fn, "parameters");
        cJSON *o;

        if (!cJSON_IsObject(fn)) {
            /* Not OpenAI-shaped: a native Anthropic tool, passed as it is. */
            if (add_dup(arr, NULL, t))
                return fail(err, CR_ENOMEM, "cannot build tools");
            continue;
        }
        if (!name)
            return fail(err, CR_EINVAL, "tool function needs a 'name'");
        o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(arr, o)) {
            cJSON_Delete(o);
            return fail(err, CR_ENOMEM, "cannot build tools");
        }
        if (!cJSON_AddStringToObject(o, "name", name) ||
            (get_str(fn, "description") &&
             !cJSON_AddStringToObject(o, "description", get_str(fn, "description"))))
            return fail(err, CR_ENOMEM, "cannot build tools");
        if (cJSON_IsObject(params)) {
            if (add_dup(o, "input_schema", params))
                return fail(err, CR_ENOMEM, "cannot build tools");
        } else {
            /* The API requires a schema; a function with no parameters takes
             * an empty object. */
            cJSON *sch = cJSON_AddObjectToObject(o, "input_schema");
            if (!sch || !cJSON_AddStringToObject(sch, "type", "object"))
                return fail(err, CR_ENOMEM, "cannot build tools");
        }
        if (cJSON_IsTrue(get(fn, "strict")) && !cJSON_AddTrueToObject(o, "strict"))
            return fail(err, CR_ENOMEM, "cannot build tools");
    }
    return 0;
}

static int convert_tool_choice(cJSON *body, const cJSON *tc, const cJSON *parallel,
                               struct cr_err *err)
{
    cJSON *o;
    const char *type = "auto", *name = NULL;

    if (!tc && !cJSON_IsFalse(parallel))
        return 0;
    if (cJSON_IsString(tc)) {
        if (strcmp(tc->valuestring, "none") == 0)
            type = "none";
        else if (strcmp(tc->valuestring, "required") == 0 ||
                 strcmp(tc->valuestring, "any") == 0)
            type = "any";
        else if (strcmp(tc->valuestring, "auto") != 0)
            return cr_err_set(err, CR_EINVAL, "unknown tool_choice '%.40s'",
                              tc->valuestring);
    } else if (cJSON_IsObject(tc)) {
        name = get_str(get(tc, "function"), "name");
        if (!name && get_str(tc, "type") && strcmp(get_str(tc, "type"), "tool") == 0)
            name = get_str(tc, "name");
        if (!name)
            /* Already Anthropic-shaped ({"type":"any"}): passed as it is. */
            return add_dup(body, "tool_choice", tc)
                       ? fail(err, CR_ENOMEM, "cannot build tool_choice")
                       : 0;
        type = "tool";
    }
    o = cJSON_AddObjectToObject(body, "tool_choice");
    if (!o || !cJSON_AddStringToObject(o, "type", type) ||
        (name && !cJSON_AddStringToObject(o, "name", name)) ||
        (cJSON_IsFalse(parallel) && strcmp(type, "none") != 0 &&
         !cJSON_AddTrueToObject(o, "disable_parallel_tool_use")))
        return fail(err, CR_ENOMEM, "cannot build tool_choice");
    return 0;
}

static int convert_response_format(cJSON *body, const cJSON *rf, unsigned *flags,
                                   struct cr_err *err)
{
    const char *type = get_str(rf, "type");
    const cJSON *schema;
    cJSON *o;

    if (!type || strcmp(type, "json_schema") != 0)
        return 0;
    schema = get(get(rf, "json_schema"), "schema");
    if (!cJSON_IsObject(schema))
        return fail(err, CR_EINVAL,
                    "response_format json_schema needs a 'schema' object");
    o = cJSON_AddObjectToObject(body, "output_format");
    if (!o || !cJSON_AddStringToObject(o, "type", "json_schema") ||
        add_dup(o, "schema", schema))
        return fail(err, CR_ENOMEM, "cannot build output_format");
    *flags |= ANTHROPIC_USES_STRUCTURED;
    return 0;
}

static int build(cJSON *body, const cJSON *req, const char *model, long max_tokens,
                 int stream, unsigned *flags, struct cr_err *err)
{
    const cJSON *msgs = get(req, "messages"), *m, *v;
    const char *keep[] = {"temperature", "top_p", "top_k"};
    struct buf system;
    cJSON *out, *tool_turn = NULL;
    int rc = 0;
    size_t i;

    if (!model)
        model = get_str(req, "model");
    if (!model)
        return fail(err, CR_EINVAL, "request has no 'model'");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(err, CR_EINVAL, "request has no 'messages'");
    v = get(req, "max_tokens");
    if (!cJSON_IsNumber(v))
        v = get(req, "max_completion_tokens");
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e9)
        max_tokens = (long)v->valuedouble;
    else if (max_tokens <= 0)
        max_tokens = ANTHROPIC_DEFAULT_MAX_TOKENS;
    if (!cJSON_AddStringToObject(body, "model", model) ||
        !cJSON_AddNumberToObject(body, "max_tokens", (double)max_tokens))
        return fail(err, CR_ENOMEM, "cannot build request");

    buf_init(&system);
    if (get_str(req, "system"))
        rc = buf_puts(&system, get_str(req, "system"));
    cJSON_ArrayForEach(m, msgs)
    {
        const char *role = get_str(m, "role");
        if (!role)
            continue;
        if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
            if (!rc && system.len > 0)
                rc = buf_puts(&system, "\n\n");
            if (!rc)
                rc = content_text(get(m, "content"), &system);
        }
    }
    if (rc) {
        buf_release(&system);
        return fail(err, CR_ENOMEM, "cannot build system prompt");
    }
    if (system.len > 0 && !cJSON_AddStringToObject(body, "system", system.data)) {
        buf_release(&system);
        return fail(err, CR_ENOMEM, "cannot build system prompt");
    }
    buf_release(&system);

    out = cJSON_AddArrayToObject(body, "messages");
    if (!out)
        return fail(err, CR_ENOMEM, "cannot build messages");
    cJSON_ArrayForEach(m, msgs)
    {
        const char *role = get_str(m, "role");
        if (!role)
            return fail(err, CR_EINVAL, "each message needs a string 'role'");
        if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)
            continue;
        if (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0 &&
            strcmp(role, "tool") != 0)
            return cr_err_set(err, CR_EINVAL, "message role '%.40s' is not supported",
                              role);
        rc = add_message(out, m, role, &tool_turn, err);
        if (rc)
            return rc;
    }
    if (cJSON_GetArraySize(out) == 0)
        return fail(err, CR_EINVAL, "request has no user or assistant message");

    for (i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        v = get(req, keep[i]);
        if (cJSON_IsNumber(v) && add_dup(body, keep[i], v))
            return fail(err, CR_ENOMEM, "cannot build request");
    }
    v = get(req, "stop");
    if (cJSON_IsString(v)) {
        cJSON *a = cJSON_AddArrayToObject(body, "stop_sequences");
        if (!a || add_dup(a, NULL, v))
            return fail(err, CR_ENOMEM, "cannot build stop_sequences");
    } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
        if (add_dup(body, "stop_sequences", v))
            return fail(err, CR_ENOMEM, "cannot build stop_sequences");
    }
    v = get(req, "tools");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0 &&
        (rc = convert_tools(body, v, err)))
        return rc;
    if ((rc = convert_tool_choice(body, get(req, "tool_choice"),
                                  get(req, "parallel_tool_calls"), err)))
        return rc;
    if ((rc = convert_response_format(body, get(req, "response_format"), flags, err)))
        return rc;
    v = get(req, "metadata");
    if (cJSON_IsObject(v)) {
        if (add_dup(body, "metadata", v))
            return fail(err, CR_ENOMEM, "cannot build metadata");
    } else if (get_str(req, "user")) {
        cJSON *md = cJSON_AddObjectToObject(body, "metadata");
        if (!md || !cJSON_AddStringToObject(md, "user_id", get_str(req, "user")))
            return fail(err, CR_ENOMEM, "cannot build metadata");
    }
    v = get(req, "thinking");
    if (cJSON_IsObject(v) && add_dup(body, "thinking", v))
        return fail(err, CR_ENOMEM, "cannot build request");
    if (!cJSON_AddBoolToObject(body, "stream", stream ? 1 : 0))
        return fail(err, CR_ENOMEM, "cannot build request");
    return 0;
}

int anthropic_build_request(const cJSON *req, const char *model, long default_max_tokens,
                            int stream, char **body, size_t *len, unsigned *flags,
                            struct cr_err *err)
{
    cJSON *o;
    int rc;

    *body = NULL;
    *len = 0;
    *flags = 0;
    if (!cJSON_IsObject(req))
        return fail(err, CR_EINVAL, "request is not a json object");
    o = cJSON_CreateObject();
    if (!o)
        return fail(err, CR_ENOMEM, "cannot build request");
    rc = build(o, req, model, default_max_tokens, stream, flags, err);
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

/* ------------------------------------------------------------- the stream */

/* Input tokens: the uncached ones plus both cache counts, when given. */
static void apply_usage(struct chat_reply *r, const cJSON *u)
{
    long in, cc, cr, out;

    if (!cJSON_IsObject(u))
        return;
    in = chat_json_count(get(u, "input_tokens"));
    cc = chat_json_count(get(u, "cache_creation_input_tokens"));
    cr = chat_json_count(get(u, "cache_read_input_tokens"));
    out = chat_json_count(get(u, "output_tokens"));
    if (in >= 0)
        r->prompt_tokens = in + (cc > 0 ? cc : 0) + (cr > 0 ? cr : 0);
    if (cr >= 0)
        r->cached_tokens = cr;
    if (cc >= 0)
        r->cache_write_tokens = cc;
    if (out >= 0)
        r->completion_tokens = out;
    chat_reply_sum_usage(r);
}

static void set_finish(struct chat_reply *r, const char *stop)
{
    const char *mapped;

    if (!stop || !stop[0])
        return;
    chat_copy_text(r->native_finish, sizeof(r->native_finish), stop, strlen(stop));
    mapped = anthropic_finish_reason(stop);
    mapped = mapped ? mapped : stop;
    chat_copy_text(r->finish_reason, sizeof(r->finish_reason), mapped, strlen(mapped));
}

static int block_index(const cJSON *root, int *index, struct cr_err *err)
{
    const cJSON *i = get(root, "index");

    if (!cJSON_IsNumber(i) ||
        !(i->valuedouble >= 0 && i->valuedouble <= MAX_BLOCK_INDEX) ||
        i->valuedouble != (double)(int)i->valuedouble)
        return cr_err_set(err, CR_EPROTO, "content block event has a bad 'index'");
    *index = (int)i->valuedouble;
    return 0;
}

static int on_error(struct chat_reply *r, const cJSON *root, int in_stream,
                    struct cr_err *err)
{
    struct chat_error e;

    error_init(&e, 0);
    fill_error(&e, root, 0);
    e.in_stream = in_stream;
    if (chat_reply_set_error(r, &e))
        return cr_err_set(err, CR_ENOMEM, "cannot store error details");
    return 0;
}

static int block_start(struct chat_reply *r, const cJSON *root, struct cr_err *err)
{
    const cJSON *b = get(root, "content_block");
    const char *type = get_str(b, "type");
    struct chat_tool_call *t;
    int index, rc;

    if ((rc = block_index(root, &index, err)))
        return rc;
    if (!type)
        return 0;
    if (strcmp(type, "text") == 0) {
        const char *text = get_str(b, "text");
        rc = text ? chat_reply_add_text(r, text, strlen(text)) : 0;
        return rc ? chat_store_error(rc, err, "text") : 0;
    }
    if (strcmp(type, "tool_use") != 0)
        return 0; /* thinking, server tools...: not part of the answer */
    t = chat_reply_tool(r, index, 1, &rc);
    if (!t)
        return chat_store_error(rc, err, "tool call");
    if (chat_tool_set(&t->id, get_str(b, "id")) ||
        chat_tool_set(&t->name, get_str(b, "name")))
        return chat_store_error(CR_ENOMEM, err, "tool call");
    /* A non-empty input here (some proxies send the whole input at once) is
     * the arguments; an empty {} is the usual placeholder for the deltas. */
    if (cJSON_IsObject(get(b, "input")) && get(b, "input")->child) {
        char *s = cJSON_PrintUnformatted(get(b, "input"));
        rc = s ? chat_tool_add_args(t, s, strlen(s)) : CR_ENOMEM;
        cr_free(s);
        if (rc)
            return chat_store_error(rc, err, "tool arguments");
    }
    return 0;
}

static int block_delta(struct chat_reply *r, const cJSON *root, struct cr_err *err)
{
    const cJSON *d = get(root, "delta");
    const char *type = get_str(d, "type"), *s;
    struct chat_tool_call *t;
    int index, rc;

    if ((rc = block_index(root, &index, err)))
        return rc;
    if (!type)
        return 0;
    if (strcmp(type, "text_delta") == 0) {
        s = get_str(d, "text");
        rc = s ? chat_reply_add_text(r, s, strlen(s)) : 0;
        return rc ? chat_store_error(rc, err, "text") : 0;
    }
    if (strcmp(type, "input_json_delta") != 0)
        return 0;
    s = get_str(d, "partial_json");
    if (!s)
        return 0;
    /* Lenient: a delta for a block whose start was lost still makes a call. */
    t = chat_reply_tool(r, index, 1, &rc);
    if (!t)
        return chat_store_error(rc, err, "tool call");
    rc = chat_tool_add_args(t, s, strlen(s));
    return rc ? chat_store_error(rc, err, "tool arguments") : 0;
}

static int block_stop(struct chat_reply *r, const cJSON *root, struct cr_err *err)
{
    struct chat_tool_call *t;
    int index, rc;

    if ((rc = block_index(root, &index, err)))
        return rc;
    t = chat_reply_tool(r, index, 0, &rc);
    if (t && t->arguments.len == 0 && chat_tool_add_args(t, "{}", 2))
        return chat_store_error(CR_ENOMEM, err, "tool arguments");
    return 0;
}

static int name_is(const char *name, size_t n, const char *what)
{
    return n == strlen(what) && memcmp(name, what, n) == 0;
}

int anthropic_stream_feed(struct chat_reply *r, const char *event, size_t event_len,
                          const char *data, size_t len, const char **delta,
                          size_t *delta_len, struct cr_err *err)
{
    size_t start = r->content.len;
    const char *name;
    size_t nlen;
    cJSON *root;
    int rc = 0;

    if (delta)
        *delta = "";
    if (delta_len)
        *delta_len = 0;
    r->frames++;
    if (!data || chat_json_blank(data, len))
        return 0;
    root = chat_json_parse(data, len, 1, "stream event", err);
    if (!root)
        return CR_EPROTO;
    name = event;
    nlen = event ? event_len : 0;
    if (nlen == 0 || name_is(name, nlen, "message")) {
        /* No event line (or the SSE default): the data says what it is. */
        name = get_str(root, "type");
        nlen = name ? strlen(name) : 0;
    }
    if (nlen == 0) {
        rc = 0;
    } else if (name_is(name, nlen, "error")) {
        rc = on_error(r, root, 1, err);
    } else if (name_is(name, nlen, "message_start")) {
        const cJSON *m = get(root, "message");
        const char *model = get_str(m, "model");
        apply_usage(r, get(m, "usage"));
        if (model && chat_reply_set_model(r, model, strlen(model)))
            rc = chat_store_error(CR_ENOMEM, err, "model name");
    } else if (name_is(name, nlen, "content_block_start")) {
        rc = block_start(r, root, err);
    } else if (name_is(name, nlen, "content_block_delta")) {
        rc = block_delta(r, root, err);
    } else if (name_is(name, nlen, "content_block_stop")) {
        rc = block_stop(r, root, err);
    } else if (name_is(name, nlen, "message_delta")) {
        set_finish(r, get_str(get(root, "delta"), "stop_reason"));
        apply_usage(r, get(root, "usage"));
    } else if (name_is(name, nlen, "message_stop")) {
        r->done = 1;
    }
    /* ping and event types added after this was written: ignored, as the
     * SDK ignores them. */
    cJSON_Delete(root);
    if (rc)
        return rc;
    chat_reply_delta(r, start, delta, delta_len);
    return 0;
}

int anthropic_stream_complete(const struct chat_reply *r)
{
    return chat_reply_complete(r);
}

/* -------------------------------------------------------- the whole body */

int anthropic_message_parse(struct chat_reply *r, const char *body, size_t len,
                            struct cr_err *err)
{
    const cJSON *blocks, *b;
    const char *type, *model;
    cJSON *root;
    int rc = 0, pos = 0;

    root = chat_json_parse(body, len, 1, "message response", err);
    if (!root)
        return CR_EPROTO;
    r->frames++;
    type = get_str(root, "type");
    if ((type && strcmp(type, "error") == 0) || cJSON_IsObject(get(root, "error"))) {
        rc = on_error(r, root, 0, err);
        cJSON_Delete(root);
        return rc;
    }
    blocks = get(root, "content");
    if (!cJSON_IsArray(blocks)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EPROTO, "message response has no 'content' array");
    }
    model = get_str(root, "model");
    if (model && chat_reply_set_model(r, model, strlen(model)))
        rc = chat_store_error(CR_ENOMEM, err, "model name");
    cJSON_ArrayForEach(b, blocks)
    {
        const char *bt = get_str(b, "type");
        if (rc || !bt) {
            pos++;
            continue;
        }
        if (strcmp(bt, "text") == 0 && get_str(b, "text")) {
            const char *t = get_str(b, "text");
            rc = chat_reply_add_text(r, t, strlen(t));
            if (rc)
                rc = chat_store_error(rc, err, "text");
        } else if (strcmp(bt, "tool_use") == 0) {
            struct chat_tool_call *t = chat_reply_tool(r, pos, 1, &rc);
            char *args = NULL;
            if (!t) {
                rc = chat_store_error(rc, err, "tool call");
            } else if (chat_tool_set(&t->id, get_str(b, "id")) ||
                       chat_tool_set(&t->name, get_str(b, "name")) ||
                       !(args = cJSON_IsObject(get(b, "input"))
                                    ? cJSON_PrintUnformatted(get(b, "input"))
                                    : cr_strdup("{}"))) {
                rc = chat_store_error(CR_ENOMEM, err, "tool call");
            } else if ((rc = chat_tool_add_args(t, args, strlen(args)))) {
                rc = chat_store_error(rc, err, "tool arguments");
            }
            cr_free(args);
        }
        pos++;
    }
    set_finish(r, get_str(root, "stop_reason"));
    apply_usage(r, get(root, "usage"));
    r->done = 1;
    cJSON_Delete(root);
    return rc;
}
