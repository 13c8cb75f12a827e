/* chat_reply.h -- one chat answer as every provider codec accumulates it: text,
 * finish reason in OpenAI's names, usage, model, tool calls and an error, the
 * shape the OpenAI SDK gives a caller. Pure: no I/O, no clock.
 *
 * Each provider codec (anthropic.h, ollama.h, and the OpenAI adapter in
 * llm/provider_azure.c) feeds frames into a chat_reply; the client and the
 * task result read it. Memory is bounded: content.max_bytes caps the text (the
 * caller sets it), and tool calls are capped by CHAT_REPLY_MAX_TOOLS and
 * CHAT_REPLY_MAX_ARGS_BYTES each. */
#ifndef CR_CHAT_REPLY_H
#define CR_CHAT_REPLY_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

#define CHAT_REPLY_MAX_TOOLS 128
#define CHAT_REPLY_MAX_ARGS_BYTES (1u << 20)

/* Error kinds, provider-neutral: what a classifier needs. */
#define CHAT_ERROR_KIND_MAP(X)                                                           \
    X(UNKNOWN, "unknown")                                                                \
    X(BAD_REQUEST, "bad_request")                                                        \
    X(AUTH, "authentication")                                                            \
    X(PERMISSION, "permission")                                                          \
    X(NOT_FOUND, "not_found")                                                            \
    X(TOO_LARGE, "request_too_large")                                                    \
    X(BILLING, "billing")                                                                \
    X(RATE_LIMIT, "rate_limit")                                                          \
    X(OVERLOADED, "overloaded")                                                          \
    X(SERVER, "server_error")                                                            \
    X(TIMEOUT, "timeout")

enum chat_error_kind {
#define CHAT__X(name, text) CHAT_ERROR_##name,
    CHAT_ERROR_KIND_MAP(CHAT__X)
#undef CHAT__X
};

/* Static name of a kind ("rate_limit"); never NULL. */
const char *chat_error_kind_name(enum chat_error_kind k);
/* The kind an HTTP error status means (400 bad request, 401 auth, 429 rate
 * limit, 503/529 overloaded, other 5xx server...); CHAT_ERROR_UNKNOWN for 0
 * or anything else. */
enum chat_error_kind chat_error_kind_of_status(long status);

/* An error the provider reported, in a body or inside a stream. */
struct chat_error {
    char type[64]; /* provider's type, e.g. "overloaded_error" ("" if none) */
    char code[64]; /* provider's code as text, e.g. "insufficient_quota" */
    char message[512];
    /* The HTTP status this error stands for: the response's own status for an
     * error body; for an error inside a 200 stream, the status the provider
     * documents for the same type (Anthropic overloaded_error -> 529,
     * rate_limit_error -> 429...), else 0. Fed to llm_classify() as the
     * status, so an in-stream error is classified as the same error outside a
     * stream would be. */
    long status;
    enum chat_error_kind kind;
    int in_stream;          /* 1: it arrived after the 200 */
    int64_t retry_after_ms; /* provider-given hint in the body, or -1 */
};

/* One tool call, assembled from fragments. */
struct chat_tool_call {
    /* read-only */
    int key;              /* provider's position: OpenAI tool_calls[].index, Anthropic
                           * content block index, Ollama order */
    char *id;             /* never NULL ("" until known); owned */
    char *name;           /* never NULL; owned */
    struct buf arguments; /* JSON text, as streamed (may be invalid JSON) */
};

struct chat_reply {
    /* public: set before feeding (0: no limit) */
    size_t max_content_bytes;
    /* read-only */
    struct buf content;     /* text deltas, concatenated */
    char finish_reason[32]; /* OpenAI's name (stop, length, tool_calls,
                             * content_filter), or the provider's own when it
                             * has no equivalent; "" until known */
    char native_finish[48]; /* as the provider said it ("end_turn") */
    const char *model;      /* never NULL; "" until known; owned */
    long prompt_tokens;     /* -1 until known */
    long completion_tokens;
    long total_tokens;
    /* Parts of the counts above, as the provider said them (-1: not said):
     * prompt tokens read from its cache, written to it (Anthropic's
     * cache_creation_input_tokens), and completion tokens spent reasoning. */
    long cached_tokens, cache_write_tokens, reasoning_tokens;
    struct chat_tool_call *tools; /* ntools of them; owned */
    size_t ntools;
    int done;               /* the provider's completion marker was seen */
    int error;              /* an error was reported; details in *err */
    struct chat_error *err; /* NULL until error (heap: most replies never need it) */
    unsigned long frames;   /* frames fed */
    /* private */
    size_t tools_cap;
};

void chat_reply_init(struct chat_reply *r);
void chat_reply_release(struct chat_reply *r);

/* Records an error (the first one wins: later ones are usually fallout).
 * NULL strings read as "". Returns 0, or CR_ENOMEM (r->error is set all the
 * same, with r->err NULL). */
int chat_reply_set_error(struct chat_reply *r, const struct chat_error *e);

/* Sets the model name (first 127 bytes); "" or NULL is ignored. Returns 0 or
 * CR_ENOMEM. */
int chat_reply_set_model(struct chat_reply *r, const char *m, size_t n);

/* Appends text. Returns 0, CR_ENOMEM, or CR_ETOOBIG past max_content_bytes. */
int chat_reply_add_text(struct chat_reply *r, const char *s, size_t n);

/* Returns the tool call with this key, creating it (id and name "") when
 * create is set; NULL when absent, on OOM, or past CHAT_REPLY_MAX_TOOLS (*rc
 * says which: 0, CR_ENOMEM or CR_ETOOBIG). */
struct chat_tool_call *chat_reply_tool(struct chat_reply *r, int key, int create,
                                       int *rc);

/* Sets a tool call's id or name (NULL/"": unchanged). Returns 0 or CR_ENOMEM. */
int chat_tool_set(char **field, const char *s);

/* Appends to a tool call's arguments. Returns 0, CR_ENOMEM or CR_ETOOBIG. */
int chat_tool_add_args(struct chat_tool_call *t, const char *s, size_t n);

/* Recomputes total_tokens from the parts when both are known. */
void chat_reply_sum_usage(struct chat_reply *r);

/* Clamps a JSON count: a number >= 0 (at most 1e15), else -1. */
long chat_json_count(const cJSON *item);

/* Returns a new OpenAI-shaped tool_calls array
 * ([{"id","type":"function","function":{"name","arguments"}}]), or an empty
 * array when there are none; NULL on OOM. */
cJSON *chat_reply_tool_calls_json(const struct chat_reply *r);

/* Copies at most cap-1 bytes of s (n bytes) into dst, cut before a UTF-8
 * continuation byte, and NUL-terminates. */
void chat_copy_text(char *dst, size_t cap, const char *s, size_t n);

/* 1 when the n bytes are only JSON whitespace (or n is 0), else 0. */
int chat_json_blank(const char *s, size_t n);

/* Sets err for a failure to store part of a reply: "<what> is too large" for
 * CR_ETOOBIG, else "cannot store <what>". Returns rc. */
int chat_store_error(int rc, struct cr_err *err, const char *what);

/* Hands out the text appended since content held start bytes: *delta borrowed
 * from r until its next change ("" when none). Either pointer may be NULL. */
void chat_reply_delta(const struct chat_reply *r, size_t start, const char **delta,
                      size_t *delta_len);

/* A stream is complete once its end marker was seen and no error came. */
int chat_reply_complete(const struct chat_reply *r);

/* Parses a whole JSON value of len bytes; trailing non-space bytes are an
 * error. Returns a new tree (cJSON_Delete) or NULL with err set (CR_EPROTO;
 * "what" names the thing in the message). When object is set a non-object is
 * an error too. */
cJSON *chat_json_parse(const char *s, size_t len, int object, const char *what,
                       struct cr_err *err);

#endif
