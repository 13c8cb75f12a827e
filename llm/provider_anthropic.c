/* provider_anthropic.c -- the Anthropic Messages API behind the provider face
 * (the codec is protocol/anthropic.c). */
#include "provider.h"

#include <string.h>

#include "protocol/anthropic.h"
#include "util/alloc.h"

#define DEFAULT_BASE "https://api.anthropic.com"

static int add_headers(const struct llm_provider_config *cfg, unsigned flags, int stream,
                       struct llm_http_request *hr)
{
    const char *const *h;
    int rc;

    rc = llm_http_request_header(hr, "Content-Type", "application/json");
    if (!rc && cfg->api_key && cfg->api_key[0]) {
        hr->auth_header = (int)hr->nheaders;
        rc = llm_http_request_header(hr, "x-api-key", cfg->api_key);
    }
    if (!rc)
        rc = llm_http_request_header(hr, "anthropic-version",
                                     cfg->api_version ? cfg->api_version
                                                      : ANTHROPIC_VERSION);
    if (!rc && (flags & ANTHROPIC_USES_STRUCTURED))
        rc = llm_http_request_header(hr, "anthropic-beta", ANTHROPIC_BETA_STRUCTURED);
    if (!rc && stream)
        rc = llm_http_request_header(hr, "Accept", "text/event-stream");
    for (h = cfg->headers; !rc && h && *h; h++)
        rc = llm_http_request_header(hr, *h, NULL);
    return rc;
}

static int build(const struct llm_provider_config *cfg, enum llm_op op, const cJSON *req,
                 const char *model, struct llm_http_request *out, struct cr_err *err)
{
    int stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "stream"));
    unsigned flags = 0;
    int rc;

    if (op != LLM_OP_CHAT)
        return cr_err_set(err, CR_EINVAL, "provider 'anthropic' has no embeddings");
    rc = anthropic_build_request(req, model, cfg->default_max_tokens, stream, &out->body,
                                 &out->body_len, &flags, err);
    if (rc)
        return rc;
    out->stream = stream;
    out->framing = stream ? LLM_FRAMING_SSE : LLM_FRAMING_JSON;
    out->url =
        llm__join_url(cfg->base_url ? cfg->base_url : DEFAULT_BASE, "/v1/messages", NULL);
    if (!out->url)
        return cr_err_set(err, CR_ENOMEM, "cannot build url");
    rc = add_headers(cfg, flags, stream, out);
    if (rc)
        return cr_err_set(err, rc, "cannot build request headers: %s", cr_strerror(rc));
    return 0;
}

static int feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                size_t *delta_len, struct cr_err *err)
{
    return anthropic_stream_feed(&s->reply, f->event, f->event ? f->event_len : 0,
                                 f->data, f->len, delta, delta_len, err);
}

static int parse(struct llm_stream *s, const char *body, size_t len, struct cr_err *err)
{
    return anthropic_message_parse(&s->reply, body, len, err);
}

static int complete(const struct llm_stream *s)
{
    return anthropic_stream_complete(&s->reply);
}

const struct llm_provider llm_provider_anthropic = {
    .name = "anthropic",
    .build = build,
    .feed = feed,
    .parse = parse,
    .embed_parse = NULL,
    .error_parse = anthropic_error_parse,
    .complete = complete,
};
