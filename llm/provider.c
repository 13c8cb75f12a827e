/* provider.c -- what every provider module shares: the request holder, the
 * stream dispatch, routing by model prefix, and error classification input. */
#include "provider.h"

#include <string.h>

#include "util/alloc.h"
#include "util/buf.h"

void llm_http_request_init(struct llm_http_request *hr)
{
    memset(hr, 0, sizeof(*hr));
    hr->auth_header = -1;
}

void llm_http_request_release(struct llm_http_request *hr)
{
    size_t i;

    cr_free(hr->url);
    for (i = 0; i < hr->nheaders; i++)
        cr_free(hr->headers[i]);
    cr_free(hr->body);
    llm_http_request_init(hr);
}

int llm_http_request_header(struct llm_http_request *hr, const char *name,
                            const char *value)
{
    struct buf b;

    if (hr->nheaders >= LLM_PROVIDER_MAX_HEADERS)
        return CR_ETOOBIG;
    buf_init(&b);
    if (value ? buf_printf(&b, "%s: %s", name, value) : buf_puts(&b, name)) {
        buf_release(&b);
        return CR_ENOMEM;
    }
    hr->headers[hr->nheaders++] = buf_detach(&b);
    return hr->headers[hr->nheaders - 1] ? 0 : CR_ENOMEM;
}

/* ---------------------------------------------------------------- routing */

static const struct llm_provider *const builtin[] = {
    &llm_provider_openai,
    &llm_provider_anthropic,
    &llm_provider_ollama,
    &llm_provider_azure,
};

const struct llm_provider *llm_provider_find(const char *name)
{
    size_t i;

    if (!name)
        return NULL;
    for (i = 0; i < sizeof(builtin) / sizeof(builtin[0]); i++)
        if (strcmp(builtin[i]->name, name) == 0)
            return builtin[i];
    return NULL;
}

const struct llm_provider *llm_provider_route(const char *model, const char **bare)
{
    size_t i, n;

    *bare = model;
    if (!model)
        return NULL;
    /* Not "openai/": gateways name models that way ("openai/gpt-4o"), and
     * the default provider is OpenAI-compatible already. */
    for (i = 1; i < sizeof(builtin) / sizeof(builtin[0]); i++) {
        n = strlen(builtin[i]->name);
        /* "ollama/" alone names no model: left to the default provider,
         * which will say the model does not exist. */
        if (strncmp(model, builtin[i]->name, n) == 0 && model[n] == '/' && model[n + 1]) {
            *bare = model + n + 1;
            return builtin[i];
        }
    }
    return NULL;
}

/* ----------------------------------------------------------------- stream */

int llm_stream_init(struct llm_stream *s, const struct llm_provider *p, enum llm_op op)
{
    memset(s, 0, sizeof(*s));
    chat_reply_init(&s->reply);
    s->provider = p;
    s->op = op;
    if (p->stream_init && p->stream_init(s)) {
        chat_reply_release(&s->reply);
        return CR_ENOMEM;
    }
    return 0;
}

void llm_stream_release(struct llm_stream *s)
{
    if (s->provider && s->provider->stream_release)
        s->provider->stream_release(s);
    s->state = NULL;
    chat_reply_release(&s->reply);
}

int llm_stream_feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                    size_t *delta_len, struct cr_err *err)
{
    return s->provider->feed(s, f, delta, delta_len, err);
}

int llm_stream_parse(struct llm_stream *s, const char *body, size_t len,
                     struct cr_err *err)
{
    return s->provider->parse(s, body, len, err);
}

int llm_stream_complete(const struct llm_stream *s)
{
    return s->provider->complete(s);
}

/* ----------------------------------------------------------------- errors */

static const struct {
    enum chat_error_kind kind;
    long status;
    const char *exc;
} kinds[] = {
    {CHAT_ERROR_BAD_REQUEST, 400, "BadRequestError"},
    {CHAT_ERROR_AUTH, 401, "AuthenticationError"},
    {CHAT_ERROR_BILLING, 402, "PermissionDeniedError"},
    {CHAT_ERROR_PERMISSION, 403, "PermissionDeniedError"},
    {CHAT_ERROR_NOT_FOUND, 404, "NotFoundError"},
    {CHAT_ERROR_TOO_LARGE, 413, "RequestTooLargeError"},
    {CHAT_ERROR_RATE_LIMIT, 429, "RateLimitError"},
    {CHAT_ERROR_OVERLOADED, 529, "OverloadedError"},
    {CHAT_ERROR_SERVER, 500, "InternalServerError"},
    {CHAT_ERROR_TIMEOUT, 504, "APITimeoutError"},
};

long llm_error_status(const struct chat_error *e, long fallback)
{
    size_t i;

    if (!e)
        return fallback;
    if (e->status)
        return e->status;
    for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (kinds[i].kind == e->kind)
            return kinds[i].status;
    return fallback;
}

const char *llm_error_exc_type(const struct chat_error *e)
{
    size_t i;
    long st;

    if (!e)
        return "APIError";
    for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (kinds[i].kind == e->kind)
            return kinds[i].exc;
    st = e->status;
    if (st >= 500)
        return "InternalServerError";
    return st >= 400 ? "APIStatusError" : "APIError";
}

/* ------------------------------------------------------------------- URLs */

char *llm__join_url(const char *base, const char *path, const char *query)
{
    size_t bn = strlen(base), seg;
    const char *slash;
    struct buf b;

    while (bn > 0 && base[bn - 1] == '/')
        bn--;
    while (*path == '/')
        path++;
    /* "http://h/v1" + "v1/messages": the base already ends in the segment. */
    slash = strchr(path, '/');
    seg = slash ? (size_t)(slash - path) : strlen(path);
    if (seg > 0 && bn > seg && base[bn - seg - 1] == '/' &&
        memcmp(base + bn - seg, path, seg) == 0)
        bn -= seg + 1;
    buf_init(&b);
    if (buf_append(&b, base, bn) || buf_putc(&b, '/') || buf_puts(&b, path) ||
        (query && query[0] && (buf_putc(&b, '?') || buf_puts(&b, query)))) {
        buf_release(&b);
        return NULL;
    }
    return buf_detach(&b);
}
