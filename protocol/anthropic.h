/* anthropic.h -- Anthropic Messages API codec: an OpenAI-shaped chat request to
 * a /v1/messages body, the event stream and the whole message to a chat_reply,
 * and error bodies. Pure: no I/O, no clock. */
#ifndef CR_ANTHROPIC_H
#define CR_ANTHROPIC_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "../util/err.h"
#include "chat_reply.h"

#define ANTHROPIC_VERSION "2023-06-01"
#define ANTHROPIC_DEFAULT_MAX_TOKENS 4096
/* The beta that output_format (JSON schema answers) needs. */
#define ANTHROPIC_BETA_STRUCTURED "structured-outputs-2025-11-13"

/* anthropic_build_request() flags (out). */
#define ANTHROPIC_USES_STRUCTURED                                                        \
    0x1u /* send anthropic-beta: ANTHROPIC_BETA_STRUCTURED */

/* Builds a Messages body from an OpenAI chat request (borrowed):
 * - system and developer messages (and a top-level "system") become "system";
 * - content parts: text as is, image_url (data: URL or http) as image blocks,
 *   any other part passed through (native Anthropic blocks);
 * - assistant tool_calls become tool_use blocks (arguments parsed; {} when not
 *   JSON); tool messages become tool_result blocks in a user turn (consecutive
 *   ones share it);
 * - max_tokens (or max_completion_tokens; else default_max_tokens, or
 *   ANTHROPIC_DEFAULT_MAX_TOKENS when that is <= 0), temperature, top_p,
 *   top_k, stop -> stop_sequences, tools -> {name, description, input_schema},
 *   tool_choice (auto/none/required/named), parallel_tool_calls:false,
 *   response_format json_schema -> output_format, user -> metadata.user_id,
 *   metadata and thinking as is; other keys (n, seed, logprobs, penalties,
 *   stream_options, json_object response_format) are dropped.
 * model replaces the request's model when not NULL. stream sets "stream".
 * Returns 0 with *body a new string (cr_free) of *len bytes and *flags set;
 * CR_EINVAL with detail (no messages, an unknown role, a bad tool) or
 * CR_ENOMEM; on failure *body is NULL. */
int anthropic_build_request(const cJSON *req, const char *model, long default_max_tokens,
                            int stream, char **body, size_t *len, unsigned *flags,
                            struct cr_err *err);

/* Feeds one SSE event: its "event:" name (may be NULL/empty: the data's
 * "type" is used) and data. Text deltas go to r->content, tool_use blocks to
 * r->tools (input_json_delta fragments appended, "{}" when a block had none),
 * stop_reason to r->finish_reason (mapped) and r->native_finish, usage
 * (cumulative: replaced) to the counts, message_stop sets r->done, an error
 * event sets r->error with r->err->in_stream and the status its type stands
 * for. ping, blank data and unknown events are ignored. *delta / *delta_len
 * (if non-NULL) give the text this event appended, borrowed from r->content
 * until the next call. Returns 0; CR_EPROTO (data not a JSON object, a block
 * index that is not a small integer); CR_ENOMEM; CR_ETOOBIG (a bound). */
int anthropic_stream_feed(struct chat_reply *r, const char *event, size_t event_len,
                          const char *data, size_t len, const char **delta,
                          size_t *delta_len, struct cr_err *err);

/* Completion predicate: message_stop seen and no error. */
int anthropic_stream_complete(const struct chat_reply *r);

/* Parses a whole non-streamed message into r (freshly initialized). An error
 * body ({"type":"error"}) returns 0 with r->error set. Returns 0, CR_EPROTO
 * (not JSON, not a message), CR_ENOMEM or CR_ETOOBIG. */
int anthropic_message_parse(struct chat_reply *r, const char *body, size_t len,
                            struct cr_err *err);

/* Fills out from an error response: {"type":"error","error":{type,message}},
 * OpenAI-style shapes, or raw text (HTML from a CDN). status is the HTTP
 * status (kept in out->status); kind comes from the type, else the status. */
void anthropic_error_parse(long status, const char *body, size_t len,
                           struct chat_error *out);

/* OpenAI's name for a stop_reason: end_turn/stop_sequence/pause_turn -> stop,
 * max_tokens/model_context_window_exceeded -> length, tool_use -> tool_calls,
 * refusal -> content_filter; NULL for an unknown one. */
const char *anthropic_finish_reason(const char *stop_reason);

/* The documented HTTP status and kind of an error type (overloaded_error ->
 * 529, CHAT_ERROR_OVERLOADED); 0 and CHAT_ERROR_UNKNOWN when unknown. */
long anthropic_error_status(const char *type, enum chat_error_kind *kind);

#endif
