/* classify.h -- what one LLM call ended with, as one outcome (pure).
 *
 * Every call ends here, whichever provider answered and whichever reader read
 * its answer: the client (llm_client.c) gathers what the transfer left (the
 * transport's error, the status, the retry headers, the body kept whole and
 * the reader's end state) into a struct llm_exchange, and llm_outcome() turns
 * it into the llm_result its caller gets: success with the text, usage and
 * finish reason; retryable, with the server's delay hint; or permanent. Each
 * failure has a Python-style exception name and a one-line message. The
 * verdict rules themselves are llm_classify()'s (policy.h); this file decides
 * what they are given. No I/O and no clock: the time an HTTP-date
 * Retry-After counts from is an argument. Design notes:
 * docs/internals/providers.md. */
#ifndef CR_LLM_CLASSIFY_H
#define CR_LLM_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "llm_types.h"
#include "provider.h"
#include "protocol/openai.h"

/* Who reads a chat answer; exactly one of fast and stream is set for a chat
 * (an embeddings call may set neither). Borrowed. */
struct llm_answer {
    /* Whose mapping reads error and embeddings bodies; never NULL (the
     * default provider's is &llm_provider_openai). */
    const struct llm_provider *provider;
    /* The fast path: the default provider's plain chats, read by
     * openai_stream, which keeps text and usage but no tool calls. */
    struct openai_stream *fast;
    /* Every other chat: the provider's own mapping into a chat_reply. */
    struct llm_stream *stream;
    unsigned long text_frames; /* stream: the frames that carried text */
};

/* What a transfer ended with. Strings are borrowed for the call. */
struct llm_exchange {
    enum llm_op op;
    int embed_list; /* LLM_OP_EMBED: the input was a list */
    /* Ended by the client itself: cancelled, timed out, shut down. */
    int aborted;
    int abort_code;        /* CR_ECANCELED, CR_ETIMEDOUT, CR_ENOMEM, CR_ECOOLED */
    const char *abort_exc; /* NULL: "APIError" */
    /* The body could not be read as it came (a broken frame, over a cap). */
    int proto_error;
    const char *fail_msg; /* why aborted or proto_error; NULL: a default */
    int curl_code;        /* the CURLcode; 0: the exchange ended at the HTTP level */
    const char *curl_msg; /* the transport's own words for curl_code */
    long status;          /* 0: no response */
    /* Header values, trimmed, or NULL when the header did not come. */
    const char *retry_after;
    const char *retry_after_ms;
    const char *should_retry; /* x-should-retry */
    int64_t now_epoch_ms;     /* read only for an HTTP-date retry-after */
    /* The body kept whole: an error body, an embeddings body, or a chat
     * answer that did not come as frames (NULL: none). */
    const char *body;
    size_t body_len;
    /* The chat answer came as frames (SSE events or NDJSON lines), each read
     * as it came, the last one too: the reader holds the end state. */
    int framed;
};

/* curl's CURLE_OPERATION_TIMEDOUT, which this file may not include. */
#define LLM_CURL_TIMEDOUT 28

/* Classifies one exchange and its answer into res and msg (cap bytes, the
 * one-line message, which res->message then points to). Sets res's verdict,
 * code (0, CR_ELLM, or the abort's code), exc_type (static strings),
 * http_status, curl_code, retry_after_ms (-1: no hint), and for a chat the
 * answer so far (text, usage, finish reason: borrowed from the reader), for
 * a successful embeddings call embedding (new: the caller frees it with
 * cJSON_Delete()) and embed_tokens. Leaves the rest of res as it was
 * (provider, fallback_left, times). A whole chat body is parsed into the
 * reader here, which is why the answer is not const. Never fails: out of
 * memory while parsing reads as a retryable failure. */
void llm_outcome(const struct llm_exchange *x, struct llm_answer *a,
                 struct llm_result *res, char *msg, size_t cap);

/* The exception name the OpenAI SDK gives an HTTP status (400
 * BadRequestError, 409 ConflictError, 429 RateLimitError, 5xx
 * InternalServerError, other APIStatusError). */
const char *llm_exc_for_status(long status);

#endif
