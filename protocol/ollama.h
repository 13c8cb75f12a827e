/* ollama.h -- Ollama native API codec (/api/chat, /api/generate, /api/embed):
 * OpenAI-shaped requests to native bodies, NDJSON stream objects and whole
 * bodies to a chat_reply, error bodies. Pure: no I/O, no clock. Lines are
 * framed by ndjson.h. */
#ifndef CR_OLLAMA_H
#define CR_OLLAMA_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "../util/err.h"
#include "chat_reply.h"

/* Builds an /api/chat body from an OpenAI chat request (borrowed): messages
 * (string content as is; content parts joined into text, data: URL images
 * into "images"; assistant tool_calls with arguments as objects; tool
 * messages keep their content and get "tool_name" from the call they answer),
 * tools as is, response_format -> format ("json" or the schema), and options:
 * temperature, top_p, top_k, seed, stop (always a list), max_tokens or
 * max_completion_tokens -> num_predict, frequency_penalty, presence_penalty;
 * an "options" object in the request is merged in, and "keep_alive" and
 * "think" pass through. tool_choice, n, logprobs and stream_options have no
 * native equivalent and are dropped. model replaces the request's model when
 * not NULL. "stream" is always sent (Ollama streams by default). Returns 0 with
 * *body a new string (cr_free) of *len bytes; CR_EINVAL (no model, no
 * messages) or CR_ENOMEM with detail; on failure *body is NULL. */
int ollama_build_chat(const cJSON *req, const char *model, int stream, char **body,
                      size_t *len, struct cr_err *err);

/* Builds an /api/generate body from an OpenAI legacy completion request
 * ({"model","prompt",...}; a list prompt uses its first element): prompt,
 * suffix, system, format and the options above. Same contract. */
int ollama_build_generate(const cJSON *req, const char *model, int stream, char **body,
                          size_t *len, struct cr_err *err);

/* Builds an /api/embed body from an OpenAI embeddings request: model, input
 * (string or list of strings), dimensions. Same contract. */
int ollama_build_embed(const cJSON *req, const char *model, char **body, size_t *len,
                       struct cr_err *err);

/* Feeds one NDJSON object of a /api/chat or /api/generate stream:
 * message.content or response -> text, message.tool_calls -> complete tool
 * calls (id "call_<n>" when the server gives none; arguments printed as JSON
 * text), done:true -> r->done with done_reason mapped (stop, length; a stop
 * with tool calls reads tool_calls), prompt_eval_count / eval_count -> usage,
 * model; {"error":"..."} -> r->error (in_stream, status 0, kind server: the
 * native API says nothing more). Blank lines are ignored. *delta /
 * *delta_len as in anthropic_stream_feed(). Returns 0; CR_EPROTO (not a JSON
 * object), CR_ENOMEM or CR_ETOOBIG. */
int ollama_stream_feed(struct chat_reply *r, const char *line, size_t len,
                       const char **delta, size_t *delta_len, struct cr_err *err);

/* Completion predicate: a done:true object seen and no error. */
int ollama_stream_complete(const struct chat_reply *r);

/* Parses a whole non-streamed /api/chat or /api/generate body: the same as
 * one final stream object (an error body sets r->error). */
int ollama_chat_parse(struct chat_reply *r, const char *body, size_t len,
                      struct cr_err *err);

/* Parses an /api/embed response ({"embeddings":[[...]],"prompt_eval_count"}).
 * With list_input a new array of arrays, else the first vector (a new array).
 * *prompt_tokens gets prompt_eval_count or -1. Returns NULL with err set:
 * CR_EPROTO (malformed or an error body, its message in err->msg), CR_ENOMEM. */
cJSON *ollama_embed_parse(const char *body, size_t len, int list_input,
                          long *prompt_tokens, struct cr_err *err);

/* Fills out from an error response ({"error":"text"}, OpenAI-style objects,
 * or raw text); kind from the status. */
void ollama_error_parse(long status, const char *body, size_t len,
                        struct chat_error *out);

/* OpenAI's name for a done_reason (stop, length; load and unload -> stop);
 * NULL for an unknown one. */
const char *ollama_finish_reason(const char *done_reason);

#endif
