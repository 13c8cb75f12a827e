/* openai.h -- OpenAI-compatible response mapping (chat stream chunks, chat and
 * embedding responses, error bodies). Pure: no I/O, no clock. */
#ifndef CR_OPENAI_H
#define CR_OPENAI_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

/* Accumulated state of one chat completion (streamed or not). Embedded by the
 * caller: openai_stream_init() / openai_stream_release(). */
struct openai_stream {
    /* read-only */
    struct buf content;     /* concatenated text deltas (choice 0) */
    char finish_reason[32]; /* "" until a finish_reason arrives */
    /* The strings below are never NULL ("" until set) and are owned by the
     * stream. They live on the heap, sized exactly, because one is embedded
     * in every request in flight and most never see an error: inline buffers
     * would be most of the struct. */
    const char *model;         /* model named by the server (first 127 bytes) */
    const char *error_type;    /* set with error (first 63 bytes) */
    const char *error_code;    /* string or integer code, as text (63 bytes) */
    const char *error_message; /* first 511 bytes */
    long prompt_tokens;        /* -1 until usage arrives (last usage wins) */
    long completion_tokens;
    long total_tokens;
    long cached_tokens;    /* of prompt_tokens, read from the cache (-1: not said) */
    long reasoning_tokens; /* of completion_tokens, spent reasoning (-1: not said) */
    int done;              /* "[DONE]" seen */
    int error;             /* an error payload was seen (even if [DONE] follows) */
    unsigned long chunks;  /* data payloads seen */
    unsigned long content_chunks; /* payloads that added text */
    /* private */
    /* A UTF-16 high surrogate that ended the last delta as a lone "\udXXX"
     * escape, held back (not in content) until the next delta says whether a
     * low one completes it; 0 when none. See openai_stream_feed(). */
    unsigned held_surrogate;
};

void openai_stream_init(struct openai_stream *s);
void openai_stream_release(struct openai_stream *s);

/* Feeds one SSE data payload (the text after "data:", "[DONE]" included).
 * On success *delta and *delta_len (if non-NULL) give the text appended by this
 * payload, borrowed from s->content until the next call. Returns 0; CR_EPROTO
 * with detail in err when the payload is not valid JSON or not an object;
 * CR_ENOMEM when the text, a new model name or error details cannot be stored
 * (cJSON cannot tell OOM from bad syntax, so an OOM while parsing reads as
 * CR_EPROTO); CR_ETOOBIG if the caller set s->content.max_bytes and it would
 * be exceeded. An error payload is not a return error: it sets s->error. An
 * empty or all-whitespace payload is ignored (keepalive). The common chunk
 * shape is read by a small scanner instead of cJSON, with the same result. */
int openai_stream_feed(struct openai_stream *s, const char *data, size_t len,
                       const char **delta, size_t *delta_len, struct cr_err *err);
/* Surrogates: a server that slices its text by UTF-16 code units may end one
 * delta with the "\ud83d" of a pair and start the next with its "\ude00".
 * Both halves are accepted: a trailing high surrogate is held back and joined
 * with a low one starting the next delta (one UTF-8 character, in the delta
 * where it completes); any other lone surrogate, and a held one when the next
 * delta does not complete it or the stream ends ([DONE], a finish_reason, or
 * openai_stream_end()), becomes U+FFFD. */

/* At the end of a stream: turns a held surrogate into U+FFFD, appended to
 * content; *delta / *delta_len (if non-NULL) give what was appended (borrowed
 * as in openai_stream_feed()). Returns 0 or CR_ENOMEM / CR_ETOOBIG. */
int openai_stream_end(struct openai_stream *s, const char **delta, size_t *delta_len);

/* The HTTP status an OpenAI-style error stands for, from its code and type
 * (the code is tried first): invalid_api_key and authentication errors 401,
 * permission 403, not found 404, bad request / invalid request / context
 * length / content filter 400, insufficient_quota and rate limits 429,
 * overloaded 529, server errors 500, timeouts 504; a code that is an HTTP
 * status (vLLM, llama.cpp) is that status. 0 when neither says. So an error
 * sent inside a 200 stream is classified as the same error in a body is. */
long openai_error_status(const char *type, const char *code);

/* Marks the stream failed (s->error) with these details, for a caller that
 * found the error itself. NULL reads as "". Returns 0, or CR_ENOMEM when the
 * details could not be stored (s->error is set all the same, details ""). */
int openai_stream_set_error(struct openai_stream *s, const char *type, const char *code,
                            const char *message);

/* For tests and the fuzz target only. openai__stream_feed_json() is
 * openai_stream_feed() without the fast path (every payload goes through
 * cJSON); openai__fast_path() returns 1 when openai_stream_feed() would take
 * the fast path for this payload, else 0. */
int openai__stream_feed_json(struct openai_stream *s, const char *data, size_t len,
                             const char **delta, size_t *delta_len, struct cr_err *err);
int openai__fast_path(const char *data, size_t len);

/* Completion predicate for a stream whose transfer ended cleanly: no error was
 * seen and either a finish_reason arrived, or [DONE] arrived after some content.
 * Returns 1 when complete, else 0. */
int openai_stream_complete(const struct openai_stream *s);

/* Parses a whole non-streamed chat.completion (or text_completion) body into s
 * (freshly initialized). Returns 0, or CR_EPROTO with detail (also when there
 * is no "choices" array), or CR_ENOMEM (see openai_stream_feed()). A 200 body that is an
 * error payload returns 0 with s->error and the error fields set, as in a stream. */
int openai_chat_parse(struct openai_stream *s, const char *body, size_t len,
                      struct cr_err *err);

/* Parses an embeddings response. With list_input the result is a new JSON array
 * of arrays of numbers (ordered by "index"), otherwise a new array of numbers.
 * Accepts float arrays and base64 little-endian float32 strings. Also fills
 * *prompt_tokens (or -1). Returns NULL with err set: CR_EPROTO on a malformed
 * body or an error body (its message in err->msg), CR_ENOMEM. */
cJSON *openai_embed_parse(const char *body, size_t len, int list_input,
                          long *prompt_tokens, struct cr_err *err);

/* Provider error details, from any known error-body shape: {"error":{message,
 * type, code}}, {"error":"text"}, flat {"message","type","code"}, or raw text
 * (first 512 bytes, for HTML or empty bodies). */
struct openai_error {
    char message[512]; /* {"error":"X","message":"why"} gives "X: why" */
    char type[64];
    char code[64];
    char param[64];
};
void openai_error_parse(const char *body, size_t len, struct openai_error *out);

#endif
