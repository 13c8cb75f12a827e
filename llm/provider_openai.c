/* provider_openai.c -- an OpenAI-compatible server behind the provider face:
 * base URL + /chat/completions or /embeddings, a Bearer key. The mapping of
 * OpenAI's bodies and streams into a chat_reply (protocol/openai.c's parse,
 * plus tool calls read here) is shared with Azure, whose bodies are OpenAI's.
 *
 * The worker's plain chats do not come here: llm_client.c reads those with
 * openai_stream directly, which keeps no tool calls and costs less per
 * token. A chat that can get tool calls back (it passes tools) and every
 * fallback to a named OpenAI-compatible provider do. */
#include "provider.h"

#include <stdlib.h>
#include <string.h>

#include "protocol/openai.h"
#include "util/alloc.h"
#include "util/buf.h"

static int build(const struct llm_provider_config *cfg, enum llm_op op, const cJSON *req,
                 const char *model, struct llm_http_request *out, struct cr_err *err)
{
    cJSON *body;

    if (!cJSON_IsObject(req))
        return cr_err_set(err, CR_EINVAL, "request is not a json object");
    if (!cfg->base_url || !cfg->base_url[0])
        return cr_err_set(err, CR_EINVAL, "provider 'openai' needs a base url");
    out->url = llm__join_url(
        cfg->base_url, op == LLM_OP_EMBED ? "/embeddings" : "/chat/completions", NULL);
    if (!out->url)
        return cr_err_set(err, CR_ENOMEM, "cannot build url");
    /* The name to send: the routing prefix is not the server's. */
    body = cJSON_Duplicate(req, 1);
    if (body && model && !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(body, "model")) &&
        !cJSON_ReplaceItemInObjectCaseSensitive(body, "model",
                                                cJSON_CreateString(model))) {
        cJSON_Delete(body);
        body = NULL;
    }
    return llm__openai_finish(cfg, op, body, "Authorization", "Bearer ", out, err);
}

int llm__openai_finish(const struct llm_provider_config *cfg, enum llm_op op, cJSON *body,
                       const char *key_header, const char *key_prefix,
                       struct llm_http_request *out, struct cr_err *err)
{
    const char *const *h;
    int rc;

    out->body = body ? cJSON_PrintUnformatted(body) : NULL;
    out->stream = op == LLM_OP_CHAT &&
                  cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"));
    cJSON_Delete(body);
    if (!out->body)
        return cr_err_set(err, CR_ENOMEM, "cannot build request");
    out->body_len = strlen(out->body);
    out->framing = out->stream ? LLM_FRAMING_SSE : LLM_FRAMING_JSON;

    rc = llm_http_request_header(out, "Content-Type", "application/json");
    if (!rc && cfg->api_key && cfg->api_key[0]) {
        struct buf key;
        buf_init(&key);
        out->auth_header = (int)out->nheaders;
        rc = buf_printf(&key, "%s%s", key_prefix, cfg->api_key);
        if (!rc)
            rc = llm_http_request_header(out, key_header, key.data);
        buf_release(&key);
    }
    if (!rc && out->stream)
        rc = llm_http_request_header(out, "Accept", "text/event-stream");
    for (h = cfg->headers; !rc && h && *h; h++)
        rc = llm_http_request_header(out, *h, NULL);
    if (rc)
        return cr_err_set(err, rc, "cannot build request headers: %s", cr_strerror(rc));
    return 0;
}

/* ----------------------------------------------------- OpenAI -> chat_reply */

static const cJSON *get(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* The kind of an OpenAI-style error from its type and code (a vLLM-style
 * integer code is an HTTP status, kept in *status). */
static enum chat_error_kind openai_kind(const char *type, const char *code, long *status)
{
    static const struct {
        const char *name;
        enum chat_error_kind kind;
    } names[] = {
        {"invalid_api_key", CHAT_ERROR_AUTH},
        {"authentication_error", CHAT_ERROR_AUTH},
        {"insufficient_quota", CHAT_ERROR_BILLING},
        {"permission_error", CHAT_ERROR_PERMISSION},
        {"rate_limit_exceeded", CHAT_ERROR_RATE_LIMIT},
        {"rate_limit_error", CHAT_ERROR_RATE_LIMIT},
        {"429", CHAT_ERROR_RATE_LIMIT},
        {"content_filter", CHAT_ERROR_BAD_REQUEST},
        {"context_length_exceeded", CHAT_ERROR_BAD_REQUEST},
        {"invalid_request_error", CHAT_ERROR_BAD_REQUEST},
        {"not_found_error", CHAT_ERROR_NOT_FOUND},
        {"DeploymentNotFound", CHAT_ERROR_NOT_FOUND},
        {"server_error", CHAT_ERROR_SERVER},
        {"api_error", CHAT_ERROR_SERVER},
        {"overloaded_error", CHAT_ERROR_OVERLOADED},
        {"timeout", CHAT_ERROR_TIMEOUT},
    };
    const char *keys[2] = {code, type};
    size_t i, k;
    char *end;
    long n;

    /* The code is the more precise of the two: it is tried first. */
    for (k = 0; k < 2; k++) {
        if (!keys[k] || !keys[k][0])
            continue;
        for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (strcmp(keys[k], names[i].name) == 0)
                return names[i].kind;
    }
    if (code && code[0]) {
        n = strtol(code, &end, 10);
        if (*end == '\0' && n >= 400 && n <= 599) {
            *status = n;
            return chat_error_kind_of_status(n);
        }
    }
    return CHAT_ERROR_UNKNOWN;
}

void llm__openai_error_parse(long status, const char *body, size_t len,
                             struct chat_error *out)
{
    struct openai_error oe;
    long st = status;

    memset(out, 0, sizeof(*out));
    out->retry_after_ms = -1;
    openai_error_parse(body, len, &oe);
    chat_copy_text(out->type, sizeof(out->type), oe.type, strlen(oe.type));
    chat_copy_text(out->code, sizeof(out->code), oe.code, strlen(oe.code));
    chat_copy_text(out->message, sizeof(out->message), oe.message, strlen(oe.message));
    out->kind = openai_kind(oe.type, oe.code, &st);
    /* A quota 429 is billing; otherwise the response's status decides. */
    if (status && out->kind != CHAT_ERROR_BILLING)
        out->kind = chat_error_kind_of_status(status);
    out->status = status ? status : (st != status ? st : 0);
}

/* Tool-call fragments of choice 0, from a chunk's delta or a message:
 * [{"index","id","function":{"name","arguments"}}]. openai.c does not read
 * them; only payloads that mention tool_calls are parsed here.
 * NEEDSWORK: fold this into openai.c's mapping once it assembles tool calls. */
static int apply_tools(struct chat_reply *r, const cJSON *holder, struct cr_err *err)
{
    const cJSON *calls = get(holder, "tool_calls"), *c;
    int pos = 0, rc;

    cJSON_ArrayForEach(c, calls)
    {
        const cJSON *idx = get(c, "index"), *fn = get(c, "function");
        const char *args = cJSON_GetStringValue(get(fn, "arguments"));
        int key = pos++;
        struct chat_tool_call *t;

        if (cJSON_IsNumber(idx) && idx->valuedouble >= 0 && idx->valuedouble <= 100000)
            key = (int)idx->valuedouble;
        t = chat_reply_tool(r, key, 1, &rc);
        if (!t)
            return cr_err_set(err, rc, "cannot store tool call");
        if (chat_tool_set(&t->id, cJSON_GetStringValue(get(c, "id"))) ||
            chat_tool_set(&t->name, cJSON_GetStringValue(get(fn, "name"))))
            return cr_err_set(err, CR_ENOMEM, "cannot store tool call");
        if (args && (rc = chat_tool_add_args(t, args, strlen(args))))
            return cr_err_set(err, rc, "cannot store tool arguments");
    }
    return 0;
}

static const cJSON *choice0(const cJSON *root)
{
    const cJSON *c;

    cJSON_ArrayForEach(c, get(root, "choices"))
    {
        const cJSON *idx = get(c, "index");
        if (cJSON_IsObject(c) && (!cJSON_IsNumber(idx) || idx->valuedouble == 0))
            return c;
    }
    return NULL;
}

static int tools_from(struct chat_reply *r, const char *data, size_t len,
                      const char *holder, struct cr_err *err)
{
    cJSON *root;
    int rc;

    if (!memmem(data, len, "\"tool_calls\"", 12))
        return 0;
    root = chat_json_parse(data, len, 1, "chunk", NULL);
    if (!root)
        return 0; /* openai.c already judged the payload */
    rc = apply_tools(r, get(choice0(root), holder), err);
    cJSON_Delete(root);
    return rc;
}

/* Copies what an openai_stream learnt into the reply (text was moved as it
 * came; the rest is small). */
static int sync(struct chat_reply *r, const struct openai_stream *st, int in_stream)
{
    if (st->finish_reason[0]) {
        chat_copy_text(r->finish_reason, sizeof(r->finish_reason), st->finish_reason,
                       strlen(st->finish_reason));
        chat_copy_text(r->native_finish, sizeof(r->native_finish), st->finish_reason,
                       strlen(st->finish_reason));
    }
    if (st->model[0] && chat_reply_set_model(r, st->model, strlen(st->model)))
        return CR_ENOMEM;
    r->prompt_tokens = st->prompt_tokens;
    r->completion_tokens = st->completion_tokens;
    r->total_tokens = st->total_tokens;
    r->cached_tokens = st->cached_tokens;
    r->reasoning_tokens = st->reasoning_tokens;
    r->done = st->done;
    if (st->error && !r->error) {
        struct chat_error e;
        long status = 0;
        memset(&e, 0, sizeof(e));
        e.retry_after_ms = -1;
        e.in_stream = in_stream;
        chat_copy_text(e.type, sizeof(e.type), st->error_type, strlen(st->error_type));
        chat_copy_text(e.code, sizeof(e.code), st->error_code, strlen(st->error_code));
        chat_copy_text(e.message, sizeof(e.message), st->error_message,
                       strlen(st->error_message));
        e.kind = openai_kind(st->error_type, st->error_code, &status);
        e.status = status;
        if (chat_reply_set_error(r, &e))
            return CR_ENOMEM;
    }
    return 0;
}

int llm__openai_stream_init(struct llm_stream *s)
{
    struct openai_stream *st = cr_malloc(sizeof(*st));

    if (!st)
        return CR_ENOMEM;
    openai_stream_init(st);
    s->state = st;
    return 0;
}

void llm__openai_stream_release(struct llm_stream *s)
{
    if (!s->state)
        return;
    openai_stream_release(s->state);
    cr_free(s->state);
}

int llm__openai_feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                     size_t *delta_len, struct cr_err *err)
{
    struct openai_stream *st = s->state;
    size_t start = s->reply.content.len;
    const char *d;
    size_t n;
    int rc;

    if (delta)
        *delta = "";
    if (delta_len)
        *delta_len = 0;
    s->reply.frames++;
    rc = openai_stream_feed(st, f->data, f->len, &d, &n, err);
    if (rc)
        return rc;
    rc = chat_reply_add_text(&s->reply, d, n);
    /* The text lives in the reply: the OpenAI stream keeps none of it. */
    buf_reset(&st->content);
    if (rc)
        return cr_err_set(err, rc, "cannot append delta to content: %s", cr_strerror(rc));
    if ((rc = tools_from(&s->reply, f->data, f->len, "delta", err)))
        return rc;
    if (sync(&s->reply, st, 1))
        return cr_err_set(err, CR_ENOMEM, "cannot store stream details");
    if (delta)
        *delta = s->reply.content.data ? s->reply.content.data + start : "";
    if (delta_len)
        *delta_len = s->reply.content.len - start;
    return 0;
}

int llm__openai_parse(struct llm_stream *s, const char *body, size_t len,
                      struct cr_err *err)
{
    struct openai_stream *st = s->state;
    int rc;

    s->reply.frames++;
    rc = openai_chat_parse(st, body, len, err);
    if (rc)
        return rc;
    rc = chat_reply_add_text(&s->reply, st->content.data ? st->content.data : "",
                             st->content.len);
    buf_reset(&st->content);
    if (rc)
        return cr_err_set(err, rc, "cannot store chat response content");
    if ((rc = tools_from(&s->reply, body, len, "message", err)))
        return rc;
    if (sync(&s->reply, st, 0))
        return cr_err_set(err, CR_ENOMEM, "cannot store response details");
    /* A whole body is complete by being whole. */
    s->reply.done = !s->reply.error;
    return 0;
}

/* openai_stream_complete()'s rule, on the reply (the text moved there). */
int llm__openai_complete(const struct llm_stream *s)
{
    const struct chat_reply *r = &s->reply;

    if (r->error)
        return 0;
    return r->finish_reason[0] != '\0' || (r->done && (r->content.len > 0 || r->ntools));
}

const struct llm_provider llm_provider_openai = {
    .name = "openai",
    .build = build,
    .stream_init = llm__openai_stream_init,
    .stream_release = llm__openai_stream_release,
    .feed = llm__openai_feed,
    .parse = llm__openai_parse,
    .embed_parse = openai_embed_parse,
    .error_parse = llm__openai_error_parse,
    .complete = llm__openai_complete,
};
