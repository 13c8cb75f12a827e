/* test_anthropic.c -- Anthropic Messages: request building, the event stream
 * fed whole / byte by byte / in random pieces, tool use, errors, bounds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/provider.h"
#include "protocol/anthropic.h"
#include "unit.h"
#include "util/alloc.h"

#include "provider_drive.h"

#define FX "tests/fixtures/providers/"

static cJSON *json(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    ck_assert_msg(j != NULL, "bad test json: %s", s);
    return j;
}

/* ---------------------------------------------------------------- request */

START_TEST(test_build_golden)
{
    cJSON *req = json(
        "{\"model\":\"claude-x\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"Be brief.\"},"
        "{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"Use "
        "tools.\"}]},"
        "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":\"function\",\"function\":{\"name\":\"wx\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Oslo\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
        "\"function\":{\"name\":\"now\",\"arguments\":\"not json\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"-3C\"},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"noon\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"and this?\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/"
        "png;base64,AAAA\"}}]}],"
        "\"temperature\":0.5,\"stop\":\"END\",\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"n\":1,\"seed\":4,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"wx\","
        "\"description\":\"weather\",\"parameters\":{\"type\":\"object\"}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}],"
        "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\","
        "\"schema\":{\"type\":\"object\"}}},\"user\":\"u-1\"}");
    const char *want =
        "{\"model\":\"claude-x\",\"max_tokens\":4096,\"system\":\"Be brief.\\n\\nUse "
        "tools.\",\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"c1\","
        "\"name\":\"wx\",\"input\":{\"city\":\"Oslo\"}},{\"type\":\"tool_use\",\"id\":"
        "\"c2\",\"name\":\"now\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{"
        "\"type\":"
        "\"tool_result\",\"tool_use_id\":\"c1\",\"content\":\"-3C\"},{\"type\":"
        "\"tool_result\",\"tool_use_id\":\"c2\",\"content\":\"noon\"}]},{\"role\":"
        "\"user\","
        "\"content\":[{\"type\":\"text\",\"text\":\"and this?\"},{\"type\":\"image\","
        "\"source\":{\"type\":\"base64\",\"media_type\":\"image/"
        "png\",\"data\":\"AAAA\"}}]}],"
        "\"temperature\":0.5,\"stop_sequences\":[\"END\"],\"tools\":[{\"name\":\"wx\","
        "\"description\":\"weather\",\"input_schema\":{\"type\":\"object\"}},{\"name\":"
        "\"now\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":"
        "\"any\","
        "\"disable_parallel_tool_use\":true},\"output_format\":{\"type\":\"json_schema\","
        "\"schema\":{\"type\":\"object\"}},\"metadata\":{\"user_id\":\"u-1\"},"
        "\"stream\":true}";
    struct cr_err err = {0};
    unsigned flags;
    char *body;
    size_t len;

    ck_assert_int_eq(anthropic_build_request(req, NULL, 0, 1, &body, &len, &flags, &err),
                     0);
    ck_assert_str_eq(body, want);
    ck_assert_uint_eq(len, strlen(want));
    ck_assert_uint_eq(flags, ANTHROPIC_USES_STRUCTURED);
    cr_free(body);
    cJSON_Delete(req);
}
END_TEST

START_TEST(test_build_minimal)
{
    cJSON *req =
        json("{\"model\":\"anthropic/claude-x\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],\"max_tokens\":64,\"stop\":[\"a\",\"b\"],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
             "\"response_format\":{\"type\":\"json_object\"}}");
    struct cr_err err = {0};
    unsigned flags;
    char *body;
    size_t len;

    ck_assert_int_eq(
        anthropic_build_request(req, "claude-x", 100, 0, &body, &len, &flags, &err), 0);
    ck_assert_str_eq(body,
                     "{\"model\":\"claude-x\",\"max_tokens\":64,\"messages\":[{"
                     "\"role\":\"user\",\"content\":\"hi\"}],\"stop_sequences\":["
                     "\"a\",\"b\"],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},"
                     "\"stream\":false}");
    ck_assert_uint_eq(flags, 0);
    cr_free(body);
    cJSON_Delete(req);
    /* The configured default applies when the request has none. */
    req = json("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    ck_assert_int_eq(
        anthropic_build_request(req, NULL, 100, 0, &body, &len, &flags, &err), 0);
    ck_assert_ptr_nonnull(strstr(body, "\"max_tokens\":100,"));
    cr_free(body);
    cJSON_Delete(req);
}
END_TEST

/* An assistant turn with text and tool calls becomes blocks; tool results
 * with content parts keep them; a top-level system comes first. */
START_TEST(test_build_mixed_turns)
{
    cJSON *req = json(
        "{\"model\":\"m\",\"system\":\"S0\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"S1\"},"
        "{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"Let me see.\",\"tool_calls\":[{\"id\":"
        "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":[{\"type\":\"text\","
        "\"text\":\"r\"}]},"
        "{\"role\":\"user\",\"content\":\"thanks\"}],\"max_tokens\":9,"
        "\"tools\":[{\"name\":\"native\",\"input_schema\":{\"type\":\"object\"}}],"
        "\"tool_choice\":{\"type\":\"any\"}}");
    struct cr_err err = {0};
    unsigned flags;
    char *body;
    size_t len;

    ck_assert_int_eq(anthropic_build_request(req, NULL, 0, 1, &body, &len, &flags, &err),
                     0);
    ck_assert_str_eq(
        body,
        "{\"model\":\"m\",\"max_tokens\":9,\"system\":\"S0\\n\\nS1\",\"messages\":[{"
        "\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":[{"
        "\"type\":\"text\",\"text\":\"Let me "
        "see.\"},{\"type\":\"tool_use\",\"id\":\"c1\","
        "\"name\":\"f\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{\"type\":"
        "\"tool_result\",\"tool_use_id\":\"c1\",\"content\":[{\"type\":\"text\",\"text\":"
        "\"r\"}]}]},{\"role\":\"user\",\"content\":\"thanks\"}],\"tools\":[{\"name\":"
        "\"native\",\"input_schema\":{\"type\":\"object\"}}],\"tool_choice\":{\"type\":"
        "\"any\"},\"stream\":true}");
    cr_free(body);
    cJSON_Delete(req);
}
END_TEST

static const char *const bad_requests[] = {
    "{\"model\":\"m\"}",
    "{\"model\":\"m\",\"messages\":[]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"function\",\"content\":\"x\"}]}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}",
    "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{}}]}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    "\"tool_choice\":\"sometimes\"}",
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}}",
    "[1]",
};

START_TEST(test_build_refused)
{
    cJSON *req = json(bad_requests[_i]);
    struct cr_err err = {0};
    unsigned flags;
    char *body = (char *)"x";
    size_t len;

    ck_assert_int_eq(anthropic_build_request(req, NULL, 0, 0, &body, &len, &flags, &err),
                     CR_EINVAL);
    ck_assert_ptr_null(body);
    ck_assert_str_ne(err.msg, "");
    cJSON_Delete(req);
}
END_TEST

START_TEST(test_provider_build)
{
    static const char *const extra[] = {"X-Gateway: g1", NULL};
    struct llm_provider_config cfg = {.base_url = "https://api.example.test/v1/",
                                      .api_key = "sk-ant-test",
                                      .headers = extra};
    cJSON *req = json("{\"model\":\"anthropic/claude-x\",\"stream\":true,\"messages\":[{"
                      "\"role\":\"user\",\"content\":\"hi\"}]}");
    const struct llm_provider *p;
    struct llm_http_request hr;
    struct cr_err err = {0};
    const char *bare;

    p = llm_provider_route("anthropic/claude-x", &bare);
    ck_assert_ptr_eq(p, &llm_provider_anthropic);
    ck_assert_str_eq(bare, "claude-x");
    llm_http_request_init(&hr);
    ck_assert_int_eq(p->build(&cfg, LLM_OP_CHAT, req, bare, &hr, &err), 0);
    ck_assert_str_eq(hr.url, "https://api.example.test/v1/messages");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_SSE);
    ck_assert_int_eq(hr.stream, 1);
    ck_assert_uint_eq(hr.nheaders, 5);
    ck_assert_str_eq(hr.headers[0], "Content-Type: application/json");
    ck_assert_str_eq(hr.headers[1], "x-api-key: sk-ant-test");
    ck_assert_int_eq(hr.auth_header, 1);
    ck_assert_str_eq(hr.headers[2], "anthropic-version: 2023-06-01");
    ck_assert_str_eq(hr.headers[3], "Accept: text/event-stream");
    ck_assert_str_eq(hr.headers[4], "X-Gateway: g1");
    ck_assert_ptr_nonnull(strstr(hr.body, "\"model\":\"claude-x\""));
    llm_http_request_release(&hr);

    /* No key, no stream, default base. */
    cfg.base_url = NULL;
    cfg.api_key = NULL;
    cfg.headers = NULL;
    cJSON_ReplaceItemInObject(req, "stream", cJSON_CreateFalse());
    llm_http_request_init(&hr);
    ck_assert_int_eq(p->build(&cfg, LLM_OP_CHAT, req, NULL, &hr, &err), 0);
    ck_assert_str_eq(hr.url, "https://api.anthropic.com/v1/messages");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_JSON);
    ck_assert_int_eq(hr.auth_header, -1);
    ck_assert_uint_eq(hr.nheaders, 2);
    llm_http_request_release(&hr);

    llm_http_request_init(&hr);
    ck_assert_int_eq(p->build(&cfg, LLM_OP_EMBED, req, NULL, &hr, &err), CR_EINVAL);
    llm_http_request_release(&hr);
    cJSON_Delete(req);
}
END_TEST

START_TEST(test_route)
{
    const char *bare;

    ck_assert_ptr_eq(llm_provider_route("ollama/llama3:8b", &bare), &llm_provider_ollama);
    ck_assert_str_eq(bare, "llama3:8b");
    ck_assert_ptr_eq(llm_provider_route("azure/gpt4o-dep", &bare), &llm_provider_azure);
    ck_assert_str_eq(bare, "gpt4o-dep");
    ck_assert_ptr_null(llm_provider_route("gpt-4o", &bare));
    ck_assert_str_eq(bare, "gpt-4o");
    ck_assert_ptr_null(llm_provider_route("meta-llama/Llama-3", &bare));
    ck_assert_ptr_null(llm_provider_route("anthropic/", &bare));
    ck_assert_ptr_null(llm_provider_route("anthropicx/y", &bare));
    ck_assert_ptr_null(llm_provider_route(NULL, &bare));
    ck_assert_ptr_eq(llm_provider_find("anthropic"), &llm_provider_anthropic);
    ck_assert_ptr_null(llm_provider_find("openai-ish"));
}
END_TEST

/* ----------------------------------------------------------------- stream */

static const long steps[] = {0, 1, 2, 3, 5, 7, 64, -1};
#define NSTEPS ((int)(sizeof(steps) / sizeof(steps[0])))

static void run_fixture(const char *name, long step, struct llm_stream *s, struct buf *d,
                        int want_rc)
{
    struct cr_err err = {0};
    size_t len;
    char *wire = unit_read_file(name, &len);

    ck_assert_int_eq(llm_stream_init(s, &llm_provider_anthropic, LLM_OP_CHAT), 0);
    buf_init(d);
    ck_assert_int_eq(drive(s, LLM_FRAMING_SSE, wire, len, step, d, &err), want_rc);
    free(wire);
}

START_TEST(test_stream_text)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "anthropic_text.sse", steps[_i], &s, &d, 0);
    ck_assert_str_eq(s.reply.content.data, "Hello w\xc3\xb6rld \xf0\x9f\x98\x80!");
    ck_assert_str_eq(d.data, s.reply.content.data);
    ck_assert_str_eq(s.reply.finish_reason, "stop");
    ck_assert_str_eq(s.reply.native_finish, "end_turn");
    ck_assert_str_eq(s.reply.model, "claude-test-1");
    ck_assert_int_eq(s.reply.prompt_tokens, 15);
    ck_assert_int_eq(s.reply.completion_tokens, 7);
    ck_assert_int_eq(s.reply.total_tokens, 22);
    ck_assert_int_eq(s.reply.done, 1);
    ck_assert_int_eq(s.reply.error, 0);
    ck_assert_uint_eq(s.reply.ntools, 0);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_tools)
{
    struct llm_stream s;
    struct buf d;
    cJSON *calls;
    char *txt;

    run_fixture(FX "anthropic_tool.sse", steps[_i], &s, &d, 0);
    ck_assert_str_eq(s.reply.content.data, "Checking.");
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_uint_eq(s.reply.ntools, 2);
    ck_assert_str_eq(s.reply.tools[0].id, "toolu_test_a");
    ck_assert_str_eq(s.reply.tools[0].name, "get_weather");
    ck_assert_str_eq(s.reply.tools[0].arguments.data, "{\"city\": \"Oslo\"}");
    ck_assert_str_eq(s.reply.tools[1].arguments.data, "{}");
    ck_assert_int_eq(s.reply.completion_tokens, 40);
    calls = chat_reply_tool_calls_json(&s.reply);
    txt = cJSON_PrintUnformatted(calls);
    ck_assert_str_eq(txt,
                     "[{\"id\":\"toolu_test_a\",\"type\":\"function\",\"function\":{"
                     "\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
                     "\\\"Oslo\\\"}\"}},{\"id\":\"toolu_test_b\",\"type\":\"function\","
                     "\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    cr_free(txt);
    cJSON_Delete(calls);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_error_event)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "anthropic_error.sse", steps[_i], &s, &d, 0);
    ck_assert_str_eq(s.reply.content.data, "Par");
    ck_assert_int_eq(s.reply.error, 1);
    ck_assert_ptr_nonnull(s.reply.err);
    ck_assert_str_eq(s.reply.err->type, "overloaded_error");
    ck_assert_str_eq(s.reply.err->message, "Overloaded");
    ck_assert_int_eq(s.reply.err->in_stream, 1);
    ck_assert_int_eq(s.reply.err->kind, CHAT_ERROR_OVERLOADED);
    ck_assert_int_eq(llm_error_status(s.reply.err, 200), 529);
    ck_assert_str_eq(llm_error_exc_type(s.reply.err), "OverloadedError");
    ck_assert_int_eq(llm_stream_complete(&s), 0);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

/* Each documented in-stream error type is classified as its HTTP twin. */
static const struct {
    const char *type;
    long status;
    enum chat_error_kind kind;
    const char *exc;
} error_vectors[] = {
    {"overloaded_error", 529, CHAT_ERROR_OVERLOADED, "OverloadedError"},
    {"rate_limit_error", 429, CHAT_ERROR_RATE_LIMIT, "RateLimitError"},
    {"api_error", 500, CHAT_ERROR_SERVER, "InternalServerError"},
    {"authentication_error", 401, CHAT_ERROR_AUTH, "AuthenticationError"},
    {"permission_error", 403, CHAT_ERROR_PERMISSION, "PermissionDeniedError"},
    {"invalid_request_error", 400, CHAT_ERROR_BAD_REQUEST, "BadRequestError"},
    {"not_found_error", 404, CHAT_ERROR_NOT_FOUND, "NotFoundError"},
    {"request_too_large", 413, CHAT_ERROR_TOO_LARGE, "RequestTooLargeError"},
    {"billing_error", 402, CHAT_ERROR_BILLING, "PermissionDeniedError"},
    {"timeout_error", 504, CHAT_ERROR_TIMEOUT, "APITimeoutError"},
    {"brand_new_error", 0, CHAT_ERROR_UNKNOWN, "APIError"},
};

START_TEST(test_error_types)
{
    struct chat_reply r;
    struct cr_err err = {0};
    char data[256];

    chat_reply_init(&r);
    snprintf(data, sizeof(data),
             "{\"type\":\"error\",\"error\":{\"type\":\"%s\",\"message\":\"m\"}}",
             error_vectors[_i].type);
    ck_assert_int_eq(
        anthropic_stream_feed(&r, "error", 5, data, strlen(data), NULL, NULL, &err), 0);
    ck_assert_int_eq(r.error, 1);
    ck_assert_int_eq(r.err->status, error_vectors[_i].status);
    ck_assert_int_eq(r.err->kind, error_vectors[_i].kind);
    ck_assert_int_eq(llm_error_status(r.err, 200),
                     error_vectors[_i].status ? error_vectors[_i].status : 200);
    ck_assert_str_eq(llm_error_exc_type(r.err), error_vectors[_i].exc);
    /* A second error does not replace the first. */
    ck_assert_int_eq(anthropic_stream_feed(&r, "error", 5,
                                           "{\"type\":\"error\",\"error\":{\"type\":"
                                           "\"api_error\",\"message\":\"later\"}}",
                                           63, NULL, NULL, &err),
                     0);
    ck_assert_str_eq(r.err->message, "m");
    chat_reply_release(&r);
}
END_TEST

static int feed1(struct chat_reply *r, const char *event, const char *data,
                 struct cr_err *err)
{
    return anthropic_stream_feed(r, event, event ? strlen(event) : 0, data, strlen(data),
                                 NULL, NULL, err);
}

START_TEST(test_stream_malformed)
{
    struct chat_reply r;
    struct cr_err err = {0};
    int i, rc = 0;

    chat_reply_init(&r);
    ck_assert_int_eq(feed1(&r, "content_block_delta", "{\"type\":", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_delta", "[1,2]", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_delta", "{} junk", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_delta",
                           "{\"index\":\"0\",\"delta\":{\"type\":\"text_delta\",\"text\":"
                           "\"x\"}}",
                           &err),
                     CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_delta",
                           "{\"index\":1e300,\"delta\":{\"type\":\"text_delta\"}}", &err),
                     CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_stop", "{\"index\":-1}", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "content_block_stop", "{\"index\":0.5}", &err), CR_EPROTO);
    /* Wrong types inside are ignored, not fatal. */
    ck_assert_int_eq(feed1(&r, "content_block_delta",
                           "{\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":7}}",
                           &err),
                     0);
    ck_assert_int_eq(
        feed1(&r, "content_block_delta", "{\"index\":0,\"delta\":\"x\"}", &err), 0);
    ck_assert_int_eq(feed1(&r, "message_start", "{\"message\":\"x\"}", &err), 0);
    ck_assert_int_eq(feed1(&r, "message_delta",
                           "{\"delta\":{\"stop_reason\":7},\"usage\":{\"output_tokens\":"
                           "1e300,\"input_tokens\":-5}}",
                           &err),
                     0);
    ck_assert_int_eq(r.completion_tokens, 1000000000000000L);
    ck_assert_int_eq(r.prompt_tokens, -1);
    ck_assert_str_eq(r.finish_reason, "");
    /* Blank data, ping, unknown events: nothing. */
    ck_assert_int_eq(feed1(&r, "ping", "{\"type\": \"ping\"}", &err), 0);
    ck_assert_int_eq(feed1(&r, "agent_thing", "{\"type\":\"agent_thing\"}", &err), 0);
    ck_assert_int_eq(feed1(&r, NULL, "  ", &err), 0);
    ck_assert_uint_eq(r.content.len, 0);
    /* Event name missing: the data's type decides. */
    ck_assert_int_eq(feed1(&r, NULL,
                           "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{"
                           "\"type\":\"text_delta\",\"text\":\"ok\"}}",
                           &err),
                     0);
    ck_assert_str_eq(r.content.data, "ok");
    /* A stream cut before message_stop is not complete. */
    ck_assert_int_eq(anthropic_stream_complete(&r), 0);
    /* Tool calls are bounded in number. */
    for (i = 0; i < CHAT_REPLY_MAX_TOOLS + 1 && !rc; i++) {
        char data[160];
        snprintf(data, sizeof(data),
                 "{\"index\":%d,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\","
                 "\"name\":\"n\",\"input\":{}}}",
                 i + 1);
        rc = feed1(&r, "content_block_start", data, &err);
    }
    ck_assert_int_eq(rc, CR_ETOOBIG);
    ck_assert_uint_eq(r.ntools, CHAT_REPLY_MAX_TOOLS);
    chat_reply_release(&r);

    /* And the text by max_content_bytes. */
    chat_reply_init(&r);
    r.max_content_bytes = 4;
    ck_assert_int_eq(feed1(&r, "content_block_delta",
                           "{\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"
                           "\"abc\"}}",
                           &err),
                     0);
    ck_assert_int_eq(feed1(&r, "content_block_delta",
                           "{\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"
                           "\"de\"}}",
                           &err),
                     CR_ETOOBIG);
    chat_reply_release(&r);
}
END_TEST

START_TEST(test_truncated_everywhere)
{
    /* The text fixture cut at every byte: never an error before message_stop
     * arrives, never complete without it, never a crash. */
    size_t len, cut;
    char *wire = unit_read_file(FX "anthropic_text.sse", &len);
    const char *stop = strstr(wire, "event: message_stop");

    for (cut = 0; cut < len; cut++) {
        struct llm_stream s;
        struct cr_err err = {0};
        ck_assert_int_eq(llm_stream_init(&s, &llm_provider_anthropic, LLM_OP_CHAT), 0);
        ck_assert_int_eq(drive(&s, LLM_FRAMING_SSE, wire, cut, 0, NULL, &err), 0);
        if (cut < (size_t)(stop - wire) + 20)
            ck_assert_int_eq(llm_stream_complete(&s), 0);
        llm_stream_release(&s);
    }
    free(wire);
}
END_TEST

/* Bytes captured from the project's fake (scripts/fake_providers.py, tokens=12,
 * unicode=1, tool calls): the fake and this codec agree. */
#define FAKE_TEXT                                                                        \
    "\xc7\x85 \xe6\x9d\xb1\xe4\xba\xac plain jalape\xc3\xb1o "                           \
    "\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "                      \
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xe2\x98\x85 "                                 \
    "\xce\x95\xce\xbb\xce\xbb\xce\xac\xce\xb4\xce\xb1 \xc3\xb1"                          \
    "and\xc3\xba \xc3\xa7"                                                               \
    "a \xc3\x9f "                                                                        \
    "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80 "

START_TEST(test_fake_capture)
{
    struct llm_stream s;
    struct cr_err err = {0};
    struct buf d;
    size_t len;
    char *wire = unit_read_file(FX "fake_anthropic_tools.sse", &len);
    int i;

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_anthropic, LLM_OP_CHAT), 0);
    buf_init(&d);
    ck_assert_int_eq(drive(&s, LLM_FRAMING_SSE, wire, len, steps[_i], &d, &err), 0);
    ck_assert_str_eq(s.reply.content.data, FAKE_TEXT);
    ck_assert_str_eq(d.data, FAKE_TEXT);
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_int_eq(s.reply.completion_tokens, 12);
    ck_assert_uint_eq(s.reply.ntools, 2);
    for (i = 0; i < (int)s.reply.ntools; i++) {
        char want[64];
        snprintf(want, sizeof(want), "{\"i\":%d,\"q\":\"unicode please\"}", i);
        ck_assert_str_eq(s.reply.tools[i].arguments.data, want);
        snprintf(want, sizeof(want), "fn_%d", i);
        ck_assert_str_eq(s.reply.tools[i].name, want);
    }
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
    free(wire);
}
END_TEST

/* ------------------------------------------------------------- whole body */

START_TEST(test_message_parse)
{
    size_t len;
    char *body = unit_read_file(FX "anthropic_message.json", &len);
    struct llm_stream s;
    struct cr_err err = {0};

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_anthropic, LLM_OP_CHAT), 0);
    ck_assert_int_eq(llm_stream_parse(&s, body, len, &err), 0);
    ck_assert_str_eq(s.reply.content.data, "Let me look.");
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_uint_eq(s.reply.ntools, 1);
    ck_assert_str_eq(s.reply.tools[0].id, "toolu_test_c");
    ck_assert_str_eq(s.reply.tools[0].arguments.data, "{\"q\":\"x\",\"n\":2}");
    ck_assert_int_eq(s.reply.prompt_tokens, 25);
    ck_assert_int_eq(s.reply.completion_tokens, 9);
    ck_assert_int_eq(s.reply.total_tokens, 34);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    llm_stream_release(&s);
    free(body);

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_anthropic, LLM_OP_CHAT), 0);
    ck_assert_int_eq(llm_stream_parse(&s, "{\"type\":\"message\"}", 18, &err), CR_EPROTO);
    ck_assert_int_eq(llm_stream_parse(&s, "event: message_start", 20, &err), CR_EPROTO);
    ck_assert_int_eq(llm_stream_parse(&s,
                                      "{\"type\":\"error\",\"error\":{\"type\":"
                                      "\"overloaded_error\",\"message\":\"busy\"}}",
                                      69, &err),
                     0);
    ck_assert_int_eq(s.reply.error, 1);
    ck_assert_int_eq(s.reply.err->in_stream, 0);
    ck_assert_int_eq(llm_stream_complete(&s), 0);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_error_body)
{
    struct chat_error e;
    const char *b429 = "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\","
                       "\"message\":\"Number of request tokens has exceeded your rate "
                       "limit\"},\"request_id\":\"req_1\"}";
    const char *html = "\n<html><body>502 Bad Gateway</body></html>\n";

    llm_provider_anthropic.error_parse(429, b429, strlen(b429), &e);
    ck_assert_str_eq(e.type, "rate_limit_error");
    ck_assert_int_eq(e.status, 429);
    ck_assert_int_eq(e.kind, CHAT_ERROR_RATE_LIMIT);
    ck_assert_ptr_nonnull(strstr(e.message, "rate limit"));
    ck_assert_int_eq(e.in_stream, 0);
    ck_assert_int_eq(e.retry_after_ms, -1);

    llm_provider_anthropic.error_parse(
        529,
        "{\"type\":\"error\",\"error\":{\"type\":"
        "\"overloaded_error\",\"message\":\"Overloaded\"}}",
        75, &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_OVERLOADED);
    ck_assert_int_eq(llm_error_status(&e, 0), 529);

    llm_provider_anthropic.error_parse(502, html, strlen(html), &e);
    ck_assert_str_eq(e.message, "<html><body>502 Bad Gateway</body></html>\n");
    ck_assert_int_eq(e.kind, CHAT_ERROR_SERVER);

    llm_provider_anthropic.error_parse(401, "", 0, &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_AUTH);
    ck_assert_str_eq(e.message, "");
    llm_provider_anthropic.error_parse(413, NULL, 0, &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_TOO_LARGE);
    /* An OpenAI-style body (a gateway in front) still reads. */
    llm_provider_anthropic.error_parse(400,
                                       "{\"error\":{\"message\":\"bad\",\"type\":"
                                       "\"invalid_request_error\",\"code\":\"x\"}}",
                                       69, &e);
    ck_assert_str_eq(e.message, "bad");
    ck_assert_str_eq(e.code, "x");
    ck_assert_int_eq(e.kind, CHAT_ERROR_BAD_REQUEST);
}
END_TEST

/* Every allocation failing in turn: an error on each failing pass, never a
 * crash or a leak (ASan checks the leaks), and on the first pass where
 * nothing failed the whole reply, reached well within the bound. */
START_TEST(test_oom_sweep)
{
    size_t len;
    char *wire = unit_read_file(FX "anthropic_tool.sse", &len);
    long n;

    for (n = 1; n < 400; n++) {
        struct llm_stream s;
        struct cr_err err = {0};
        long failed;
        int init, rc;
        cr_alloc_fail_after(n);
        rc = init = llm_stream_init(&s, &llm_provider_anthropic, LLM_OP_CHAT);
        if (init == 0)
            rc = drive(&s, LLM_FRAMING_SSE, wire, len, 0, NULL, &err);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_str_eq(s.reply.content.data, "Checking.");
            ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
            ck_assert_uint_eq(s.reply.ntools, 2);
            ck_assert_str_eq(s.reply.tools[0].arguments.data, "{\"city\": \"Oslo\"}");
            ck_assert_int_eq(llm_stream_complete(&s), 1);
            llm_stream_release(&s);
            break;
        }
        /* An error on every failing pass: CR_ENOMEM, or the protocol error
         * a failed cJSON parse reports. */
        ck_assert_int_ne(rc, 0);
        if (init == 0)
            llm_stream_release(&s);
    }
    ck_assert_int_lt(n, 400);
    free(wire);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("anthropic");
    TCase *tc = tcase_create("anthropic");

    tcase_add_test(tc, test_build_golden);
    tcase_add_test(tc, test_build_minimal);
    tcase_add_test(tc, test_build_mixed_turns);
    tcase_add_loop_test(tc, test_build_refused, 0,
                        (int)(sizeof(bad_requests) / sizeof(bad_requests[0])));
    tcase_add_test(tc, test_provider_build);
    tcase_add_test(tc, test_route);
    tcase_add_loop_test(tc, test_stream_text, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_tools, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_error_event, 0, NSTEPS);
    tcase_add_loop_test(tc, test_error_types, 0,
                        (int)(sizeof(error_vectors) / sizeof(error_vectors[0])));
    tcase_add_test(tc, test_stream_malformed);
    tcase_add_loop_test(tc, test_fake_capture, 0, NSTEPS);
    tcase_add_test(tc, test_truncated_everywhere);
    tcase_add_test(tc, test_message_parse);
    tcase_add_test(tc, test_error_body);
    tcase_add_test(tc, test_oom_sweep);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}
