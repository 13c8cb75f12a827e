/* llm_types.h -- what an LLM call is and what it ended with: the types shared by
 * the client (llm_client.h, which does the I/O) and the pure code that builds
 * requests and reads results (engine/tasks.c, the engine). No I/O here. */
#ifndef CR_LLM_TYPES_H
#define CR_LLM_TYPES_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "policy.h"
#include "protocol/chat_reply.h"
#include "protocol/openai.h"

enum llm_op {
    LLM_OP_CHAT,  /* POST /chat/completions, streamed */
    LLM_OP_EMBED, /* POST /embeddings */
};

/* The outcome of one call; everything is borrowed for the callback only. */
struct llm_result {
    enum llm_verdict verdict; /* LLM_OK, LLM_RETRYABLE or LLM_PERMANENT */
    int code;                 /* 0, or CR_ELLM, CR_ETIMEDOUT, CR_ECANCELED */
    const char *exc_type;     /* Python-style exception name, e.g. RateLimitError */
    const char *message;      /* one line, for FAILURE and logs; secrets cut out */
    long http_status;         /* 0 when no response */
    int curl_code;
    int64_t retry_after_ms; /* server-given delay, or -1 */
    /* LLM_OP_CHAT: the answer (so far, on a failure), whichever provider
     * gave it. Never NULL strings. Counts are -1 when unknown. */
    const char *text;
    size_t text_len;
    const char *model;         /* as the server named it; "" when unknown */
    const char *finish_reason; /* OpenAI's names; "" when none came */
    long prompt_tokens, completion_tokens, total_tokens;
    long cached_tokens, cache_write_tokens, reasoning_tokens; /* parts; -1: not said */
    double cost_usd; /* from the provider's prices (llm/prices.h); -1: no price */
    unsigned long content_chunks; /* frames that carried text */
    /* The provider path's whole reply (tool calls), or NULL: the default
     * provider's plain chats are read on a fast path that keeps none. */
    const struct chat_reply *reply;
    const char *provider; /* the configured name that answered; "" default */
    /* The worker has another provider to try for this call after this one
     * (a fallback), so a retryable failure can move on at once. */
    int fallback_left;
    cJSON *embedding; /* LLM_OP_EMBED on success; callee may detach it */
    long embed_tokens;
    double ttft_s; /* time to first token (or first byte), -1 if none */
    double elapsed_s;
};

/* Fills the answer fields of r from an OpenAI stream (the fast path). */
static inline void llm_result_set_openai(struct llm_result *r,
                                         const struct openai_stream *s)
{
    r->text = s->content.data ? s->content.data : "";
    r->text_len = s->content.len;
    r->model = s->model;
    r->finish_reason = s->finish_reason;
    r->prompt_tokens = s->prompt_tokens;
    r->completion_tokens = s->completion_tokens;
    r->total_tokens = s->total_tokens;
    r->cached_tokens = s->cached_tokens;
    r->cache_write_tokens = -1;
    r->reasoning_tokens = s->reasoning_tokens;
    r->content_chunks = s->content_chunks;
}

/* The same from a provider's reply. */
static inline void llm_result_set_reply(struct llm_result *r, const struct chat_reply *c)
{
    r->text = c->content.data ? c->content.data : "";
    r->text_len = c->content.len;
    r->model = c->model;
    r->finish_reason = c->finish_reason;
    r->prompt_tokens = c->prompt_tokens;
    r->completion_tokens = c->completion_tokens;
    r->total_tokens = c->total_tokens;
    r->cached_tokens = c->cached_tokens;
    r->cache_write_tokens = c->cache_write_tokens;
    r->reasoning_tokens = c->reasoning_tokens;
    r->content_chunks = c->frames;
    r->reply = c;
}

#endif
