/* provider_ollama.c -- Ollama's native API (/api/chat, /api/generate,
 * /api/embed) behind the provider face (the codec is protocol/ollama.c). */
#include "provider.h"

#include <string.h>

#include "protocol/ollama.h"
#include "util/buf.h"

#define DEFAULT_BASE "http://localhost:11434"

static int build(const struct llm_provider_config *cfg, enum llm_op op, const cJSON *req,
                 const char *model, struct llm_http_request *out, struct cr_err *err)
{
    const char *path;
    const char *const *h;
    int stream = 0, rc;

    if (op == LLM_OP_EMBED) {
        path = "/api/embed";
        rc = ollama_build_embed(req, model, &out->body, &out->body_len, err);
    } else {
        /* OpenAI semantics: no "stream" means a whole answer, though Ollama
         * itself streams by default (so "stream" is always sent). */
        stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "stream"));
        if (cJSON_GetObjectItemCaseSensitive(req, "messages") ||
            !cJSON_GetObjectItemCaseSensitive(req, "prompt")) {
            path = "/api/chat";
            rc = ollama_build_chat(req, model, stream, &out->body, &out->body_len, err);
        } else {
            path = "/api/generate";
            rc = ollama_build_generate(req, model, stream, &out->body, &out->body_len,
                                       err);
        }
    }
    if (rc)
        return rc;
    out->stream = stream;
    out->framing = stream ? LLM_FRAMING_NDJSON : LLM_FRAMING_JSON;
    out->url = llm__join_url(cfg->base_url ? cfg->base_url : DEFAULT_BASE, path, NULL);
    if (!out->url)
        return cr_err_set(err, CR_ENOMEM, "cannot build url");
    rc = llm_http_request_header(out, "Content-Type", "application/json");
    /* A local server needs no key; one behind a proxy (or Ollama's hosted
     * API) takes a bearer token. */
    if (!rc && cfg->api_key && cfg->api_key[0]) {
        struct buf v;
        buf_init(&v);
        rc = buf_printf(&v, "Bearer %s", cfg->api_key);
        if (!rc) {
            out->auth_header = (int)out->nheaders;
            rc = llm_http_request_header(out, "Authorization", v.data);
        }
        buf_release(&v);
    }
    if (!rc && stream)
        rc = llm_http_request_header(out, "Accept", "application/x-ndjson");
    for (h = cfg->headers; !rc && h && *h; h++)
        rc = llm_http_request_header(out, *h, NULL);
    if (rc)
        return cr_err_set(err, rc, "cannot build request headers: %s", cr_strerror(rc));
    return 0;
}

static int feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                size_t *delta_len, struct cr_err *err)
{
    return ollama_stream_feed(&s->reply, f->data, f->len, delta, delta_len, err);
}

static int parse(struct llm_stream *s, const char *body, size_t len, struct cr_err *err)
{
    return ollama_chat_parse(&s->reply, body, len, err);
}

static int complete(const struct llm_stream *s)
{
    return ollama_stream_complete(&s->reply);
}

const struct llm_provider llm_provider_ollama = {
    .name = "ollama",
    .build = build,
    .feed = feed,
    .parse = parse,
    .embed_parse = ollama_embed_parse,
    .error_parse = ollama_error_parse,
    .complete = complete,
};
