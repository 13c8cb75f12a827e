/* llm_types.h -- what an LLM call is and what it ended with: the types shared by
 * the client (llm_client.h, which does the I/O) and the pure code that builds
 * requests and reads results (engine/tasks.c, the engine). No I/O here. */
#ifndef CR_LLM_TYPES_H
#define CR_LLM_TYPES_H

#include <stdint.h>
#include <cjson/cJSON.h>

#include "policy.h"
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
    int64_t retry_after_ms;           /* server-given delay, or -1 */
    const struct openai_stream *chat; /* LLM_OP_CHAT: text, finish, usage */
    cJSON *embedding;                 /* LLM_OP_EMBED on success; callee may detach it */
    long embed_tokens;
    double ttft_s; /* time to first token (or first byte), -1 if none */
    double elapsed_s;
};

#endif
