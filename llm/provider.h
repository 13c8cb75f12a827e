/* provider.h -- the face every LLM provider module implements, so the client
 * (llm_client.c, which does the I/O) can drive any provider without knowing
 * which: build the HTTP request from the task's OpenAI-shaped request, say how
 * the response body is framed, map each frame (or the whole body) into one
 * chat_reply, and map error bodies into one chat_error that the classifier
 * reads. Pure: no I/O, no clock. Design notes: docs/internals/providers.md.
 *
 * Driving one call:
 *
 *   struct llm_http_request hr;            // url, headers, body, framing
 *   p->build(&cfg, op, req, model, &hr, &err);
 *   ... POST hr.body to hr.url with hr.headers ...
 *   struct llm_stream s;  llm_stream_init(&s, p, op);
 *   status >= 400:      p->error_parse(status, body, n, &e)     -> classify e
 *   hr.framing SSE:     each sse event   -> llm_stream_feed(&s, &frame, ...)
 *   hr.framing NDJSON:  each ndjson line -> llm_stream_feed(&s, &frame, ...)
 *   hr.framing JSON:    the whole body   -> llm_stream_parse(&s, body, n, ...)
 *   end:  llm_stream_complete(&s)? s.reply has text, finish, usage, tools;
 *         s.reply.error? llm_error_status(s.reply.err) is the status to
 *         classify it with, whether it came in a body or inside the stream.
 *   llm_stream_release(&s); llm_http_request_release(&hr);
 */
#ifndef CR_LLM_PROVIDER_H
#define CR_LLM_PROVIDER_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "llm_types.h"
#include "protocol/chat_reply.h"
#include "util/err.h"

/* How a response body is framed. */
enum llm_framing {
    LLM_FRAMING_JSON,   /* one JSON document (not streamed, embeddings, errors) */
    LLM_FRAMING_SSE,    /* text/event-stream (sse.h); each event is a frame */
    LLM_FRAMING_NDJSON, /* newline-delimited JSON (ndjson.h); each line is a frame */
};

#define LLM_PROVIDER_MAX_HEADERS 24

/* One configured provider endpoint. Everything is borrowed: it must outlive
 * every build() that uses it. */
struct llm_provider_config {
    const char *base_url;       /* e.g. "https://api.anthropic.com", "http://h:11434",
                                 * "https://res.openai.azure.com"; a trailing "/" or
                                 * the API's own "/v1" (or "/api", "/openai") may be
                                 * included or not */
    const char *api_key;        /* NULL or "": no auth header is sent */
    const char *api_version;    /* Azure api-version, Anthropic anthropic-version;
                                 * NULL: the provider's default */
    const char *deployment;     /* Azure: the deployment; NULL: the model name */
    const char *const *headers; /* extra "Name: value" lines, NULL-terminated,
                                 * sent after the provider's own; may be NULL */
    long default_max_tokens;    /* Anthropic requires max_tokens: used when the
                                 * request has none (<= 0: 4096) */
};

/* What build() produces. Every pointer is new and owned by the struct:
 * release with llm_http_request_release(). */
struct llm_http_request {
    char *url;
    char *headers[LLM_PROVIDER_MAX_HEADERS]; /* "Name: value" */
    size_t nheaders;
    /* Index of the header carrying the key, or -1: a caller that logs
     * headers must skip it (the value is a secret). */
    int auth_header;
    char *body;
    size_t body_len;
    int stream;               /* the request asked for a streamed answer */
    enum llm_framing framing; /* what a 2xx body will be (errors are JSON or text) */
};

void llm_http_request_init(struct llm_http_request *hr);
void llm_http_request_release(struct llm_http_request *hr);
/* Appends a header line "name: value" (value NULL: name is the whole line).
 * Returns 0, CR_ENOMEM, or CR_ETOOBIG past LLM_PROVIDER_MAX_HEADERS. */
int llm_http_request_header(struct llm_http_request *hr, const char *name,
                            const char *value);

/* One frame of a response body. All borrowed for the call. */
struct llm_frame {
    const char *event; /* SSE "event:" name; NULL or "" when none (NDJSON) */
    size_t event_len;
    const char *data; /* SSE data or one NDJSON line */
    size_t len;
};

struct llm_provider;

/* The state of one call's answer. Embedded by the caller. */
struct llm_stream {
    /* read-only */
    struct chat_reply reply;             /* what the answer was so far */
    const struct llm_provider *provider; /* who is answering */
    enum llm_op op;
    /* private */
    void *state; /* the provider's own, from stream_init */
};

/* The table a provider module exports. Only the optional members may be NULL. */
struct llm_provider {
    const char *name; /* "openai", "anthropic", "ollama", "azure" */

    /* Fills out (initialized by the caller) for op from req, the task's
     * OpenAI-shaped request (borrowed: messages, model, max_tokens,
     * temperature, stop, tools, tool_choice, response_format, stream, ...).
     * model, when not NULL, is the name to send (the routing prefix
     * stripped). req's "stream" decides out->stream for a chat. Returns 0;
     * CR_EINVAL with detail (a request the provider cannot express, an op it
     * does not offer); CR_ENOMEM. On failure out holds nothing to send (the
     * caller still releases it). */
    int (*build)(const struct llm_provider_config *cfg, enum llm_op op, const cJSON *req,
                 const char *model, struct llm_http_request *out, struct cr_err *err);

    /* Optional per-call state (s->state). init returns 0 or CR_ENOMEM. */
    int (*stream_init)(struct llm_stream *s);
    void (*stream_release)(struct llm_stream *s);

    /* Maps one frame into s->reply. *delta / *delta_len get the text this
     * frame appended (borrowed from s->reply.content until the next call).
     * An error the provider reports is not a return error: it sets
     * s->reply.error. Returns 0, or CR_EPROTO / CR_ENOMEM / CR_ETOOBIG with
     * detail: the stream is then unusable. */
    int (*feed)(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                size_t *delta_len, struct cr_err *err);

    /* Maps a whole non-streamed chat body (2xx) into s->reply. Same returns. */
    int (*parse)(struct llm_stream *s, const char *body, size_t len, struct cr_err *err);

    /* Parses an embeddings body: a new array (of arrays when list_input), and
     * *prompt_tokens (or -1). NULL with err set on failure. NULL member: the
     * provider has no embeddings (build() refuses LLM_OP_EMBED). */
    cJSON *(*embed_parse)(const char *body, size_t len, int list_input,
                          long *prompt_tokens, struct cr_err *err);

    /* Fills out from a non-2xx response body (any shape, HTML included). */
    void (*error_parse)(long status, const char *body, size_t len,
                        struct chat_error *out);

    /* 1 when the answer ended as the provider's protocol says a complete one
     * ends ([DONE]/finish, message_stop, done:true) with no error, else 0. */
    int (*complete)(const struct llm_stream *s);
};

extern const struct llm_provider llm_provider_openai;
extern const struct llm_provider llm_provider_anthropic;
extern const struct llm_provider llm_provider_ollama;
extern const struct llm_provider llm_provider_azure;

/* The built-in provider of this name, or NULL. */
const struct llm_provider *llm_provider_find(const char *name);

/* Routes a model name by its prefix: "anthropic/claude-x" -> the Anthropic
 * provider with *bare = "claude-x" (borrowed from model). Without a known
 * prefix returns NULL with *bare = model (the default, OpenAI-compatible
 * provider's: "gpt-4o", or "org/model" on a gateway, stay whole). */
const struct llm_provider *llm_provider_route(const char *model, const char **bare);

/* Initializes s for one call to p. Returns 0 or CR_ENOMEM (then nothing to
 * release). Set s->reply.max_content_bytes after init to bound the text. */
int llm_stream_init(struct llm_stream *s, const struct llm_provider *p, enum llm_op op);
void llm_stream_release(struct llm_stream *s);
/* p->feed / p->parse / p->complete on s. */
int llm_stream_feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                    size_t *delta_len, struct cr_err *err);
int llm_stream_parse(struct llm_stream *s, const char *body, size_t len,
                     struct cr_err *err);
int llm_stream_complete(const struct llm_stream *s);

/* The HTTP status an error is to be classified as (llm_classify()'s
 * http_status): its own when it has one, else the status its kind means
 * (rate_limit 429, overloaded 529, auth 401, bad_request 400, server 500,
 * ...), else fallback (the response's status; 0 when none). So an error
 * inside a 200 stream is judged as the same error in a body would be. */
long llm_error_status(const struct chat_error *e, long fallback);

/* A Python-style exception name for an error, as the OpenAI and Anthropic
 * SDKs name them (RateLimitError, AuthenticationError, OverloadedError...). */
const char *llm_error_exc_type(const struct chat_error *e);

/* For provider modules: joins base and path, dropping a duplicate "/" and a
 * base's trailing copy of the path's first segment ("http://h/v1" + "/v1/x"
 * -> "http://h/v1/x"). query (may be NULL) is appended after "?". Returns a
 * new string, or NULL on OOM. */
char *llm__join_url(const char *base, const char *path, const char *query);

/* For provider modules whose bodies and streams are OpenAI's (openai,
 * azure): the mapping into a chat_reply, tool calls included
 * (provider_openai.c). Members of struct llm_provider. */
int llm__openai_stream_init(struct llm_stream *s);
/* The rest of an OpenAI-shaped request once its URL is set: body (taken,
 * freed here, NULL meaning out of memory) printed as out's body, streamed
 * when it asks to be (chats), and the headers: JSON, the key as
 * key_header (key_prefix before it, "" for none) when cfg has one, SSE's
 * Accept for a stream, then cfg's own. */
int llm__openai_finish(const struct llm_provider_config *cfg, enum llm_op op, cJSON *body,
                       const char *key_header, const char *key_prefix,
                       struct llm_http_request *out, struct cr_err *err);
void llm__openai_stream_release(struct llm_stream *s);
int llm__openai_feed(struct llm_stream *s, const struct llm_frame *f, const char **delta,
                     size_t *delta_len, struct cr_err *err);
int llm__openai_parse(struct llm_stream *s, const char *body, size_t len,
                      struct cr_err *err);
int llm__openai_complete(const struct llm_stream *s);
void llm__openai_error_parse(long status, const char *body, size_t len,
                             struct chat_error *out);

#endif
