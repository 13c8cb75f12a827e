/* test_openai.c -- OpenAI-compatible chunk, body, embedding and error mapping. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "protocol/openai.h"
#include "protocol/sse.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* ------------------------------------------------------------ wire samples */

#define OPENAI_WIRE                                                                      \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"     \
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"          \
    "\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n"       \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"     \
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"       \
    "\"Hel\"},\"finish_reason\":null}],\"usage\":null}\n\n"                              \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"     \
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"       \
    "\"lo\"},\"finish_reason\":null}],\"usage\":null}\n\n"                               \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"     \
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},"                 \
    "\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"                                   \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"     \
    "1700000000,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,"          \
    "\"completion_tokens\":2,\"total_tokens\":11}}\n\n"                                  \
    "data: [DONE]\n\n"

/* vLLM: finish merged with the last text, stop_reason, usage chunk. */
#define VLLM_WIRE                                                                        \
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"Qwen/Qwen2.5-7B-Instruct\",\"choices\":[{\"index\":0,\"delta\":"        \
    "{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":"     \
    "null}]}\n\n"                                                                        \
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"Qwen/Qwen2.5-7B-Instruct\",\"choices\":[{\"index\":0,\"delta\":"        \
    "{\"content\":\"Bonjour\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n"          \
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"Qwen/Qwen2.5-7B-Instruct\",\"choices\":[{\"index\":0,\"delta\":"        \
    "{\"content\":\" \\u00e0 vous\"},\"logprobs\":null,\"finish_reason\":\"stop\","      \
    "\"stop_reason\":null}]}\n\n"                                                        \
    "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"Qwen/Qwen2.5-7B-Instruct\",\"choices\":[],\"usage\":{"                  \
    "\"prompt_tokens\":5,\"total_tokens\":9,\"completion_tokens\":4},"                   \
    "\"system_fingerprint\":\"fp_x\"}\n\n"                                               \
    "data: [DONE]\n\n"

/* llama.cpp: content null first, ": ping" keepalives, CRLF, timings. */
#define LLAMACPP_WIRE                                                                    \
    ": ping\r\n\r\n"                                                                     \
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":"       \
    "\"assistant\",\"content\":null}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":"   \
    "\"gpt-3.5-turbo\",\"object\":\"chat.completion.chunk\"}\r\n\r\n"                    \
    ": ping\r\n\r\n"                                                                     \
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":"    \
    "\"\\ud83d\\ude00 ok\"}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":"            \
    "\"gpt-3.5-turbo\",\"object\":\"chat.completion.chunk\"}\r\n\r\n"                    \
    "data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],"      \
    "\"created\":1,\"id\":\"chatcmpl-x\",\"model\":\"gpt-3.5-turbo\",\"object\":"        \
    "\"chat.completion.chunk\",\"timings\":{\"prompt_n\":3,\"predicted_n\":2}}\r\n\r\n"  \
    "data: {\"choices\":[],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":"               \
    "\"gpt-3.5-turbo\",\"object\":\"chat.completion.chunk\",\"usage\":{"                 \
    "\"completion_tokens\":2,\"prompt_tokens\":3,\"total_tokens\":5}}\r\n\r\n"           \
    "data: [DONE]\r\n\r\n"

/* Ollama /v1: role chunk, finish in its own chunk, no usage, [DONE] with no
 * trailing blank line. */
#define OLLAMA_WIRE                                                                      \
    "data: {\"id\":\"chatcmpl-7\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"llama3.2:1b\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{"      \
    "\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"},"                 \
    "\"finish_reason\":null}]}\n\n"                                                      \
    "data: {\"id\":\"chatcmpl-7\",\"object\":\"chat.completion.chunk\",\"created\":1,"   \
    "\"model\":\"llama3.2:1b\",\"system_fingerprint\":\"fp_ollama\",\"choices\":[{"      \
    "\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"                   \
    "\"finish_reason\":\"stop\"}]}\n\n"                                                  \
    "data: [DONE]"

/* vLLM mid-stream error, then [DONE] all the same. */
#define VLLM_ERROR_WIRE                                                                  \
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"q\","          \
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"},\"finish_reason\":"       \
    "null}]}\n\n"                                                                        \
    "data: {\"error\":{\"object\":\"error\",\"message\":\"This model's maximum "         \
    "context length is 4096 tokens.\",\"type\":\"BadRequestError\",\"param\":null,"      \
    "\"code\":400}}\n\n"                                                                 \
    "data: [DONE]\n\n"

/* Feeds wire through the SSE parser (in pieces of `chunk` bytes) into s,
 * checking that the deltas add up to the content. Returns the first error. */
static int play(struct openai_stream *s, const char *wire, size_t chunk)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    struct buf deltas;
    size_t len = strlen(wire), off = 0;
    int rc = 0;

    ck_assert_ptr_nonnull(p);
    buf_init(&deltas);
    while (off < len && rc >= 0) {
        size_t n = len - off < chunk ? len - off : chunk;
        rc = sse_feed(p, wire + off, n);
        off += n;
        while (rc >= 0 && (rc = sse_next(p, &ev)) == 1) {
            const char *d;
            size_t dn;
            rc = openai_stream_feed(s, ev.data, ev.data_len, &d, &dn, NULL);
            if (rc == 0)
                rc = buf_append(&deltas, d, dn);
        }
    }
    while (rc >= 0 && (rc = sse_finish(p, &ev)) == 1)
        rc = openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, NULL);
    if (rc == 0)
        ck_assert_mem_eq(deltas.data ? deltas.data : "",
                         s->content.data ? s->content.data : "", s->content.len);
    buf_release(&deltas);
    sse_parser_free(p);
    return rc;
}

static const char *content(const struct openai_stream *s)
{
    return s->content.data ? s->content.data : "";
}

static int feed_str(struct openai_stream *s, const char *payload, struct cr_err *err)
{
    return openai_stream_feed(s, payload, strlen(payload), NULL, NULL, err);
}

/* ----------------------------------------------------------------- streams */

START_TEST(test_openai_stream)
{
    static const size_t chunks[] = {100000, 1, 7};
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, OPENAI_WIRE, chunks[_i]), 0);
    ck_assert_str_eq(content(&s), "Hello");
    ck_assert_str_eq(s.finish_reason, "stop");
    ck_assert_str_eq(s.model, "m");
    ck_assert_int_eq(s.prompt_tokens, 9);
    ck_assert_int_eq(s.completion_tokens, 2);
    ck_assert_int_eq(s.total_tokens, 11);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(s.error, 0);
    ck_assert_uint_eq(s.chunks, 6);
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);
}
END_TEST

/* OpenAI's usage details: the cached and reasoning parts, fed whole and byte
 * by byte; missing or malformed details stay unknown (-1). */
START_TEST(test_usage_details)
{
    static const char *const wire =
        "data: "
        "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":"
        "\"stop\"}],\"usage\":null}\n\n"
        "data: "
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":2006,\"completion_tokens\":300,"
        "\"total_tokens\":2306,\"prompt_tokens_details\":{\"cached_tokens\":1920,"
        "\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":256}}}"
        "\n\n"
        "data: [DONE]\n\n";
    static const char *const odd =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
        "\"prompt_tokens_details\":{\"cached_tokens\":\"many\"},"
        "\"completion_tokens_details\":null}}\n\ndata: [DONE]\n\n";
    struct openai_stream s;

    for (size_t chunk = 1; chunk <= strlen(wire); chunk += chunk < 8 ? 1 : 97) {
        openai_stream_init(&s);
        ck_assert_int_eq(play(&s, wire, chunk), 0);
        ck_assert_int_eq(s.prompt_tokens, 2006);
        ck_assert_int_eq(s.cached_tokens, 1920);
        ck_assert_int_eq(s.reasoning_tokens, 256);
        openai_stream_release(&s);
    }
    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, odd, 3), 0);
    ck_assert_int_eq(s.prompt_tokens, 5);
    ck_assert_int_eq(s.cached_tokens, -1);
    ck_assert_int_eq(s.reasoning_tokens, -1);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_vllm_merged_finish)
{
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, VLLM_WIRE, 13), 0);
    ck_assert_str_eq(content(&s), "Bonjour \xc3\xa0 vous");
    ck_assert_str_eq(s.finish_reason, "stop");
    ck_assert_str_eq(s.model, "Qwen/Qwen2.5-7B-Instruct");
    ck_assert_int_eq(s.prompt_tokens, 5);
    ck_assert_int_eq(s.completion_tokens, 4);
    ck_assert_int_eq(s.total_tokens, 9);
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_llamacpp_null_content)
{
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, LLAMACPP_WIRE, 5), 0);
    ck_assert_str_eq(content(&s), "\xf0\x9f\x98\x80 ok");
    ck_assert_str_eq(s.finish_reason, "length");
    ck_assert_int_eq(s.total_tokens, 5);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_ollama_no_usage)
{
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, OLLAMA_WIRE, 1), 0);
    ck_assert_str_eq(content(&s), "Hi");
    ck_assert_str_eq(s.finish_reason, "stop");
    ck_assert_str_eq(s.model, "llama3.2:1b");
    ck_assert_int_eq(s.prompt_tokens, -1);
    ck_assert_int_eq(s.completion_tokens, -1);
    ck_assert_int_eq(s.total_tokens, -1);
    ck_assert_int_eq(s.done, 1); /* [DONE] without blank line, via sse_finish */
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_vllm_error_then_done)
{
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(play(&s, VLLM_ERROR_WIRE, 100000), 0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_int_eq(s.done, 1);
    ck_assert_str_eq(s.error_type, "BadRequestError");
    ck_assert_str_eq(s.error_code, "400");
    ck_assert_str_eq(s.error_message,
                     "This model's maximum context length is 4096 tokens.");
    ck_assert_str_eq(content(&s), "par");
    ck_assert_int_eq(openai_stream_complete(&s), 0);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_error_shapes_in_stream)
{
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(feed_str(&s, "{\"error\":\"model 'x' not found\"}", NULL), 0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_str_eq(s.error_message, "model 'x' not found");
    ck_assert_str_eq(s.error_code, "");
    openai_stream_release(&s);

    openai_stream_init(&s);
    ck_assert_int_eq(feed_str(&s,
                              "{\"error\":{\"message\":\"too long\",\"type\":"
                              "\"invalid_request_error\",\"param\":null,\"code\":"
                              "\"context_length_exceeded\"}}",
                              NULL),
                     0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_str_eq(s.error_code, "context_length_exceeded");
    ck_assert_str_eq(s.error_type, "invalid_request_error");
    openai_stream_release(&s);

    /* A flat vLLM (< 0.10.1) error and an Anthropic-style one. */
    openai_stream_init(&s);
    ck_assert_int_eq(feed_str(&s,
                              "{\"object\":\"error\",\"message\":\"flat\",\"type\":"
                              "\"BadRequestError\",\"param\":null,\"code\":400}",
                              NULL),
                     0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_str_eq(s.error_message, "flat");
    ck_assert_str_eq(s.error_code, "400");
    openai_stream_release(&s);

    openai_stream_init(&s);
    ck_assert_int_eq(feed_str(&s,
                              "{\"type\":\"error\",\"error\":{\"type\":"
                              "\"overloaded_error\",\"message\":\"Overloaded\"}}",
                              NULL),
                     0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_str_eq(s.error_type, "overloaded_error");
    openai_stream_release(&s);

    /* "error": null or {} is not an error. */
    openai_stream_init(&s);
    ck_assert_int_eq(feed_str(&s, "{\"error\":null,\"choices\":[]}", NULL), 0);
    ck_assert_int_eq(feed_str(&s, "{\"error\":{},\"choices\":[]}", NULL), 0);
    ck_assert_int_eq(s.error, 0);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_usage_only_and_last_wins)
{
    struct openai_stream s;

    openai_stream_init(&s);
    /* vLLM continuous_usage_stats: cumulative usage on every chunk. */
    ck_assert_int_eq(
        feed_str(&s,
                 "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],"
                 "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
                 "\"total_tokens\":6}}",
                 NULL),
        0);
    ck_assert_int_eq(
        feed_str(&s,
                 "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}],"
                 "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,"
                 "\"total_tokens\":7}}",
                 NULL),
        0);
    ck_assert_int_eq(feed_str(&s,
                              "{\"choices\":[],\"usage\":{\"prompt_tokens\":5,"
                              "\"completion_tokens\":3}}",
                              NULL),
                     0);
    ck_assert_int_eq(s.prompt_tokens, 5);
    ck_assert_int_eq(s.completion_tokens, 3);
    ck_assert_int_eq(s.total_tokens, 8); /* derived when absent */
    /* usage:null changes nothing; absurd counts are clamped, not overflowed. */
    ck_assert_int_eq(feed_str(&s, "{\"choices\":[],\"usage\":null}", NULL), 0);
    ck_assert_int_eq(s.total_tokens, 8);
    ck_assert_int_eq(feed_str(&s,
                              "{\"choices\":[],\"usage\":{\"prompt_tokens\":1e300,"
                              "\"completion_tokens\":-4,\"total_tokens\":\"x\"}}",
                              NULL),
                     0);
    ck_assert_int_eq(s.prompt_tokens, 1000000000000000L);
    ck_assert_int_eq(s.completion_tokens, -1);
    ck_assert_int_eq(s.total_tokens, -1);
    ck_assert_str_eq(content(&s), "ab");
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_completion_predicate)
{
    struct openai_stream s;

    /* Content then [DONE] with no finish_reason: complete. */
    openai_stream_init(&s);
    feed_str(&s, "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}", NULL);
    ck_assert_int_eq(openai_stream_complete(&s), 0);
    feed_str(&s, "[DONE]", NULL);
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);

    /* [DONE] alone: failed. */
    openai_stream_init(&s);
    feed_str(&s, "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}",
             NULL);
    feed_str(&s, "[DONE]", NULL);
    ck_assert_int_eq(s.done, 1);
    ck_assert_int_eq(openai_stream_complete(&s), 0);
    openai_stream_release(&s);

    /* finish_reason without [DONE] (a proxy dropped it): complete. */
    openai_stream_init(&s);
    feed_str(&s,
             "{\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"tool_calls\":"
             "[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":"
             "{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}",
             NULL);
    feed_str(
        &s, "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}",
        NULL);
    ck_assert_str_eq(content(&s), "");
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);

    /* Ollama /v1 after a native error: a role chunk, then EOF. */
    openai_stream_init(&s);
    ck_assert_int_eq(play(&s,
                          "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":"
                          "\"assistant\",\"content\":\"\"}}]}\n\n",
                          3),
                     0);
    ck_assert_int_eq(openai_stream_complete(&s), 0);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_done_variants)
{
    static const char *const yes[] = {"[DONE]", "[DONE] ", " [DONE]", "[DONE]\n",
                                      "[DONE]]"};
    static const char *const no[] = {"[DONE", "DONE", "[done]"};
    struct cr_err err;
    size_t i;

    for (i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        struct openai_stream s;
        openai_stream_init(&s);
        ck_assert_int_eq(feed_str(&s, yes[i], NULL), 0);
        ck_assert_int_eq(s.done, 1);
        openai_stream_release(&s);
    }
    for (i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        struct openai_stream s;
        openai_stream_init(&s);
        ck_assert_int_eq(feed_str(&s, no[i], &err), CR_EPROTO);
        ck_assert_int_eq(s.done, 0);
        openai_stream_release(&s);
    }
}
END_TEST

START_TEST(test_choice_zero_only_and_legacy)
{
    struct openai_stream s;
    const char *d;
    size_t dn;
    const char *c1 = "{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"B\"}},"
                     "{\"index\":0,\"delta\":{\"content\":\"A\"}}]}";
    const char *c2 =
        "{\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":\"stop\"}]}";
    const char *t1 = "{\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1,"
                     "\"choices\":[{\"text\":\" world\",\"index\":0,\"logprobs\":null,"
                     "\"finish_reason\":null}],\"model\":\"gpt-3.5-turbo-instruct\"}";
    const char *t2 =
        "{\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1,"
        "\"choices\":[{\"text\":\"\",\"index\":0,\"logprobs\":null,"
        "\"finish_reason\":\"length\"}],\"model\":\"gpt-3.5-turbo-instruct\"}";

    openai_stream_init(&s);
    ck_assert_int_eq(openai_stream_feed(&s, c1, strlen(c1), &d, &dn, NULL), 0);
    ck_assert_uint_eq(dn, 1);
    ck_assert_mem_eq(d, "A", 1);
    ck_assert_int_eq(feed_str(&s, c2, NULL), 0);
    ck_assert_str_eq(s.finish_reason, ""); /* choice 1 finished, not ours */
    openai_stream_release(&s);

    openai_stream_init(&s);
    ck_assert_int_eq(openai_stream_feed(&s, t1, strlen(t1), &d, &dn, NULL), 0);
    ck_assert_uint_eq(dn, 6);
    ck_assert_mem_eq(d, " world", 6);
    ck_assert_int_eq(openai_stream_feed(&s, t2, strlen(t2), &d, &dn, NULL), 0);
    ck_assert_uint_eq(dn, 0);
    ck_assert_str_eq(s.finish_reason, "length");
    ck_assert_str_eq(s.model, "gpt-3.5-turbo-instruct");
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_odd_chunks)
{
    struct openai_stream s;
    const char *d = NULL;
    size_t dn = 99;

    openai_stream_init(&s);
    /* Azure filter chunk: no choices, empty model. */
    ck_assert_int_eq(feed_str(&s,
                              "{\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\","
                              "\"object\":\"\",\"prompt_filter_results\":[{"
                              "\"prompt_index\":0,\"content_filter_results\":{}}]}",
                              NULL),
                     0);
    ck_assert_int_eq(feed_str(&s,
                              "{\"model\":\"gpt\",\"choices\":[{\"index\":0,"
                              "\"delta\":{\"reasoning\":\"hmm\"}}]}",
                              NULL),
                     0);
    ck_assert_int_eq(feed_str(&s,
                              "{\"model\":\"\",\"choices\":[{\"delta\":{\"content\":"
                              "\"no index\"}}]}",
                              NULL),
                     0);
    ck_assert_str_eq(s.model, "gpt");
    ck_assert_str_eq(content(&s), "no index");
    /* A keepalive with no data: ignored, still counted. */
    ck_assert_int_eq(openai_stream_feed(&s, "", 0, &d, &dn, NULL), 0);
    ck_assert_uint_eq(dn, 0);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(s.chunks, 4);
    /* Choices that are not an array or contain junk. */
    ck_assert_int_eq(feed_str(&s, "{\"choices\":{\"index\":0}}", NULL), 0);
    ck_assert_int_eq(feed_str(&s, "{\"choices\":[1,null,{\"delta\":7}]}", NULL), 0);
    ck_assert_int_eq(feed_str(&s,
                              "{\"choices\":[{\"index\":0,\"delta\":{\"content\":5},"
                              "\"finish_reason\":3}]}",
                              NULL),
                     0);
    ck_assert_str_eq(content(&s), "no index");
    ck_assert_str_eq(s.finish_reason, "");
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_malformed_chunks)
{
    static const char *const bad[] = {"{\"choices\":[", "[1,2]",      "null",    "\"x\"",
                                      "{} junk",        "{\"a\":1}}", "data: {}"};
    struct cr_err err;
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct openai_stream s;
        openai_stream_init(&s);
        err.code = 0;
        err.msg[0] = '\0';
        ck_assert_int_eq(feed_str(&s, bad[i], &err), CR_EPROTO);
        ck_assert_int_eq(err.code, CR_EPROTO);
        ck_assert_msg(strstr(err.msg, "stream chunk") != NULL, "msg '%s'", err.msg);
        ck_assert_int_eq(s.error, 0);
        openai_stream_release(&s);
    }
}
END_TEST

START_TEST(test_content_cap)
{
    struct openai_stream s;
    struct cr_err err;

    openai_stream_init(&s);
    s.content.max_bytes = 4;
    ck_assert_int_eq(
        feed_str(&s, "{\"choices\":[{\"delta\":{\"content\":\"abc\"}}]}", &err), 0);
    ck_assert_int_eq(
        feed_str(&s, "{\"choices\":[{\"delta\":{\"content\":\"de\"}}]}", &err),
        CR_ETOOBIG);
    ck_assert_str_eq(content(&s), "abc");
    openai_stream_release(&s);
}
END_TEST

/* ------------------------------------------------------------- non-stream */

START_TEST(test_chat_parse)
{
    const char *body =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
        "\"model\":\"gpt-4o\",\"system_fingerprint\":\"fp_1\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":\"Hi\",\"refusal\":null,"
        "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
        "\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}}]},\"logprobs\":null,"
        "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,"
        "\"completion_tokens\":2,\"total_tokens\":11,\"prompt_tokens_details\":{"
        "\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}";
    const char *tools =
        "{\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
        "\"finish_reason\":\"tool_calls\"}]}";
    const char *legacy =
        "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":1,\"model\":\"i\","
        "\"choices\":[{\"text\":\" world\",\"index\":0,\"logprobs\":null,"
        "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":1,"
        "\"completion_tokens\":16,\"total_tokens\":17}}";
    struct openai_stream s;

    openai_stream_init(&s);
    ck_assert_int_eq(openai_chat_parse(&s, body, strlen(body), NULL), 0);
    ck_assert_str_eq(content(&s), "Hi");
    ck_assert_str_eq(s.finish_reason, "stop");
    ck_assert_str_eq(s.model, "gpt-4o");
    ck_assert_int_eq(s.prompt_tokens, 9);
    ck_assert_int_eq(s.total_tokens, 11);
    ck_assert_int_eq(openai_stream_complete(&s), 1);
    openai_stream_release(&s);

    openai_stream_init(&s);
    ck_assert_int_eq(openai_chat_parse(&s, tools, strlen(tools), NULL), 0);
    ck_assert_str_eq(content(&s), "");
    ck_assert_str_eq(s.finish_reason, "tool_calls");
    ck_assert_int_eq(s.prompt_tokens, -1);
    openai_stream_release(&s);

    openai_stream_init(&s);
    ck_assert_int_eq(openai_chat_parse(&s, legacy, strlen(legacy), NULL), 0);
    ck_assert_str_eq(content(&s), " world");
    ck_assert_str_eq(s.finish_reason, "length");
    ck_assert_int_eq(s.completion_tokens, 16);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_chat_parse_bad)
{
    static const char *const bad[] = {
        "", "{", "[]", "{\"choices\":3}", "{\"id\":\"x\"}", "<html>502</html>"};
    const char *err_body = "{\"error\":{\"message\":\"nope\",\"type\":\"server_error\","
                           "\"code\":null}}";
    struct openai_stream s;
    struct cr_err err;
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        openai_stream_init(&s);
        ck_assert_int_eq(openai_chat_parse(&s, bad[i], strlen(bad[i]), &err), CR_EPROTO);
        ck_assert_int_eq(err.code, CR_EPROTO);
        openai_stream_release(&s);
    }
    openai_stream_init(&s);
    ck_assert_int_eq(openai_chat_parse(&s, err_body, strlen(err_body), &err), 0);
    ck_assert_int_eq(s.error, 1);
    ck_assert_str_eq(s.error_message, "nope");
    ck_assert_str_eq(s.error_type, "server_error");
    ck_assert_str_eq(s.error_code, "");
    ck_assert_int_eq(openai_stream_complete(&s), 0);
    openai_stream_release(&s);
}
END_TEST

/* ------------------------------------------------------------- embeddings */

static void assert_vec(const cJSON *v, const double *want, int n)
{
    int i;
    ck_assert(cJSON_IsArray(v));
    ck_assert_int_eq(cJSON_GetArraySize(v), n);
    for (i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        ck_assert(cJSON_IsNumber(x));
        ck_assert_msg(fabs(x->valuedouble - want[i]) < 1e-6, "item %d: %g vs %g", i,
                      x->valuedouble, want[i]);
    }
}

START_TEST(test_embed_float)
{
    const char *one =
        "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
        "\"embedding\":[0.1,-0.2,0.3]}],\"model\":\"text-embedding-3-small\","
        "\"usage\":{\"prompt_tokens\":3,\"total_tokens\":3}}";
    const char *two =
        "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":1,"
        "\"embedding\":[2,2.5]},{\"object\":\"embedding\",\"index\":0,"
        "\"embedding\":[1,1.5]}],\"model\":\"m\"}";
    const double w1[] = {0.1, -0.2, 0.3}, a[] = {1, 1.5}, b[] = {2, 2.5};
    long pt = 0;
    cJSON *v;

    v = openai_embed_parse(one, strlen(one), 0, &pt, NULL);
    assert_vec(v, w1, 3);
    ck_assert_int_eq(pt, 3);
    cJSON_Delete(v);

    v = openai_embed_parse(one, strlen(one), 1, NULL, NULL);
    ck_assert_int_eq(cJSON_GetArraySize(v), 1);
    assert_vec(cJSON_GetArrayItem(v, 0), w1, 3);
    cJSON_Delete(v);

    v = openai_embed_parse(two, strlen(two), 1, &pt, NULL);
    ck_assert_int_eq(pt, -1);
    ck_assert_int_eq(cJSON_GetArraySize(v), 2);
    assert_vec(cJSON_GetArrayItem(v, 0), a, 2);
    assert_vec(cJSON_GetArrayItem(v, 1), b, 2);
    cJSON_Delete(v);

    /* A single input answered with two items: index 0 is the answer. */
    v = openai_embed_parse(two, strlen(two), 0, NULL, NULL);
    assert_vec(v, a, 2);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_embed_base64)
{
    /* <3f 1.0 -2.5 0.5 and <2f 0.25 3.0, little-endian float32. */
    const char *one =
        "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
        "\"embedding\":\"AACAPwAAIMAAAAA/\"}],\"model\":\"m\",\"usage\":{"
        "\"prompt_tokens\":2,\"total_tokens\":2}}";
    const char *two = "{\"data\":[{\"index\":1,\"embedding\":\"AACAPgAAQEA=\"},"
                      "{\"index\":0,\"embedding\":\"AACAPgAAQEA\"},"
                      "{\"index\":2,\"embedding\":\"\"}]}";
    const double w1[] = {1.0, -2.5, 0.5}, w2[] = {0.25, 3.0};
    long pt = 0;
    cJSON *v;

    v = openai_embed_parse(one, strlen(one), 0, &pt, NULL);
    assert_vec(v, w1, 3);
    ck_assert_int_eq(pt, 2);
    cJSON_Delete(v);

    v = openai_embed_parse(two, strlen(two), 1, NULL, NULL);
    ck_assert_int_eq(cJSON_GetArraySize(v), 3);
    assert_vec(cJSON_GetArrayItem(v, 0), w2, 2);
    assert_vec(cJSON_GetArrayItem(v, 1), w2, 2);
    assert_vec(cJSON_GetArrayItem(v, 2), w2, 0);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_embed_bad)
{
    static const char *const bad[] = {
        "",
        "[]",
        "{\"object\":\"list\"}",
        "{\"data\":{}}",
        "{\"data\":[]}", /* single input, no vector */
        "{\"data\":[{\"index\":0,\"embedding\":\"AAA*\"}]}",
        "{\"data\":[{\"index\":0,\"embedding\":\"YWJj\"}]}", /* 3 bytes */
        "{\"data\":[{\"index\":0,\"embedding\":\"A\"}]}",
        "{\"data\":[{\"index\":0,\"embedding\":[1,\"2\"]}]}",
        "{\"data\":[{\"index\":0,\"embedding\":null}]}",
        "{\"data\":[{\"index\":0}]}",
        "{\"data\":[{\"index\":1,\"embedding\":[1]}]}",
        "{\"data\":[{\"index\":0,\"embedding\":[1]},{\"index\":0,\"embedding\":[2]}]}",
        "{\"data\":[{\"index\":-1,\"embedding\":[1]}]}",
        "{\"data\":[{\"index\":0.5,\"embedding\":[1]}]}",
        "{\"data\":[{\"index\":\"0\",\"embedding\":[1]}]}",
        "{\"data\":[7]}",
        "{\"error\":{\"message\":\"input too long\",\"type\":\"invalid_request_error\"}}",
    };
    struct cr_err err;
    long pt = 5;
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err.code = 0;
        ck_assert_msg(openai_embed_parse(bad[i], strlen(bad[i]), 0, &pt, &err) == NULL,
                      "accepted '%s'", bad[i]);
        ck_assert_int_eq(err.code, CR_EPROTO);
        ck_assert_int_eq(pt, -1);
    }
    ck_assert_ptr_nonnull(strstr(err.msg, "input too long"));

    /* A list request with an empty list is an empty answer, not an error. */
    {
        cJSON *v = openai_embed_parse("{\"data\":[]}", 11, 1, NULL, &err);
        ck_assert(cJSON_IsArray(v));
        ck_assert_int_eq(cJSON_GetArraySize(v), 0);
        cJSON_Delete(v);
    }
}
END_TEST

/* ------------------------------------------------------------ error bodies */

struct error_vec {
    const char *body;
    const char *message, *type, *code;
};

static const struct error_vec error_vecs[] = {
    {"{\"error\":{\"message\":\"This model's maximum context length is 8192 tokens\","
     "\"type\":\"invalid_request_error\",\"param\":\"messages\","
     "\"code\":\"context_length_exceeded\"}}",
     "This model's maximum context length is 8192 tokens", "invalid_request_error",
     "context_length_exceeded"},
    {"{\"error\":{\"message\":\"Incorrect API key\",\"type\":\"invalid_request_error\","
     "\"param\":null,\"code\":null}}",
     "Incorrect API key", "invalid_request_error", ""},
    {"{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":"
     "\"insufficient_quota\",\"param\":null,\"code\":\"insufficient_quota\"}}",
     "You exceeded your current quota", "insufficient_quota", "insufficient_quota"},
    {"{\"error\":{\"message\":\"bad\",\"type\":\"BadRequestError\",\"param\":null,"
     "\"code\":400}}",
     "bad", "BadRequestError", "400"},
    {"{\"object\":\"error\",\"message\":\"flat msg\",\"type\":\"BadRequestError\","
     "\"param\":null,\"code\":400}",
     "flat msg", "BadRequestError", "400"},
    {"{\"error\":\"model \\\"llama9\\\" not found, try pulling it first\"}",
     "model \"llama9\" not found, try pulling it first", "", ""},
    {"{\"error\":{\"code\":503,\"message\":\"Loading "
     "model\",\"type\":\"unavailable_error\"}}",
     "Loading model", "unavailable_error", "503"},
    {"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":"
     "\"Overloaded\"}}",
     "Overloaded", "overloaded_error", ""},
    {"{\"error\":{\"code\":500}}", "{\"error\":{\"code\":500}}", "", "500"},
    {"{\"error\":{\"message\":\"m\",\"code\":1.5}}", "m", "", "1.5"},
    {"{\"detail\":\"Not Found\"}", "{\"detail\":\"Not Found\"}", "", ""},
    {"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n</html>\r\n",
     "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n</html>", "", ""},
    {"upstream connect error or disconnect/reset before headers",
     "upstream connect error or disconnect/reset before headers", "", ""},
    {"", "", "", ""},
    {" \n", "", "", ""},
};

START_TEST(test_error_parse)
{
    const struct error_vec *v = &error_vecs[_i];
    struct openai_error e;

    memset(&e, 'z', sizeof(e));
    openai_error_parse(v->body, strlen(v->body), &e);
    ck_assert_str_eq(e.message, v->message);
    ck_assert_str_eq(e.type, v->type);
    ck_assert_str_eq(e.code, v->code);
}
END_TEST

START_TEST(test_error_parse_truncation)
{
    struct openai_error e;
    struct buf b;
    int i;

    /* 600 two-byte characters: cut at 510 bytes, never inside a character. */
    buf_init(&b);
    buf_puts(&b, "{\"error\":{\"message\":\"");
    for (i = 0; i < 600; i++)
        buf_puts(&b, "\xc3\xa9");
    buf_puts(&b, "\",\"code\":\"a_very_long_code_that_goes_on_and_on_and_on_well_past_"
                 "sixty_four_bytes\"}}");
    openai_error_parse(b.data, b.len, &e);
    ck_assert_uint_eq(strlen(e.message), 510);
    ck_assert_uint_eq(strlen(e.code), 63);
    buf_release(&b);

    buf_init(&b);
    for (i = 0; i < 2000; i++)
        buf_putc(&b, 'a');
    openai_error_parse(b.data, b.len, &e);
    ck_assert_uint_eq(strlen(e.message), 511);
    buf_release(&b);

    openai_error_parse(NULL, 0, &e);
    ck_assert_str_eq(e.message, "");
}
END_TEST

/* -------------------------------------------------------------------- OOM */

static const char *const sweep_payloads[] = {
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{"
    "\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
    "\"finish_reason\":null}],\"usage\":null}",
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{"
    "\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}",
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{"
    "\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}",
    "{\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,"
    "\"total_tokens\":11}}",
    "{\"error\":{\"message\":\"late\",\"type\":\"t\",\"code\":7}}",
    "[DONE]",
};

START_TEST(test_oom_stream)
{
    long n;

    for (n = 1; n < 10000; n++) {
        struct openai_stream s;
        size_t i;
        long failed;
        int rc = 0;

        openai_stream_init(&s);
        cr_alloc_fail_after(n);
        for (i = 0; i < sizeof(sweep_payloads) / sizeof(sweep_payloads[0]); i++) {
            rc = feed_str(&s, sweep_payloads[i], NULL);
            if (rc)
                break;
        }
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_str_eq(content(&s), "Hello");
            ck_assert_int_eq(s.total_tokens, 11);
            ck_assert_str_eq(s.error_code, "7");
            ck_assert_int_eq(s.done, 1);
            openai_stream_release(&s);
            break;
        }
        /* cJSON reports its own OOM as a parse failure. */
        ck_assert(rc == CR_ENOMEM || rc == CR_EPROTO);
        openai_stream_release(&s);
    }
    ck_assert_int_lt(n, 10000);
}
END_TEST

START_TEST(test_oom_bodies)
{
    const char *chat = "{\"object\":\"chat.completion\",\"model\":\"m\",\"choices\":[{"
                       "\"index\":0,\"message\":{\"content\":\"Hi\"},\"finish_reason\":"
                       "\"stop\"}],\"usage\":{\"prompt_tokens\":1,\"total_tokens\":2}}";
    const char *emb =
        "{\"data\":[{\"index\":1,\"embedding\":\"AACAPgAAQEA=\"},"
        "{\"index\":0,\"embedding\":[1,2,3]}],\"usage\":{\"prompt_tokens\":4}}";
    const char *ebody = "{\"error\":{\"message\":\"x\",\"type\":\"y\",\"code\":\"z\"}}";
    long n;
    int done = 0;

    for (n = 1; n < 10000 && done != 7; n++) {
        struct openai_stream s;
        struct openai_error e;
        struct cr_err err;
        cJSON *v;
        int rc;

        openai_stream_init(&s);
        cr_alloc_fail_after(n);
        rc = openai_chat_parse(&s, chat, strlen(chat), &err);
        if (cr_alloc_failed() == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_str_eq(content(&s), "Hi");
            done |= 1;
        }
        openai_stream_release(&s);

        cr_alloc_fail_after(n);
        err.code = 0;
        v = openai_embed_parse(emb, strlen(emb), 1, NULL, &err);
        if (cr_alloc_failed() == 0) {
            ck_assert_int_eq(cJSON_GetArraySize(v), 2);
            done |= 2;
        } else {
            ck_assert_ptr_null(v);
            ck_assert(err.code == CR_ENOMEM || err.code == CR_EPROTO);
        }
        cJSON_Delete(v);

        cr_alloc_fail_after(n);
        openai_error_parse(ebody, strlen(ebody), &e);
        if (cr_alloc_failed() == 0) {
            ck_assert_str_eq(e.message, "x");
            done |= 4;
        }
        cr_alloc_fail_after(0);
    }
    ck_assert_int_eq(done, 7);
}
END_TEST

/* ------------------------------------------------ fast path against cJSON */

/* A payload with an explicit length, so it may hold NUL bytes. */
struct payload {
    const char *p;
    size_t n; /* 0: strlen(p) */
};

#define P(s)                                                                             \
    {                                                                                    \
        s, sizeof(s) - 1                                                                 \
    }

/* Shapes each path has to agree on, beyond the wire samples and the payloads
 * of the tests above: escapes, unicode, spacing, key order, duplicates, odd
 * numbers, nesting, and the near misses of each rule of the fast path. */
static const struct payload diff_payloads[] = {
    P("{\"choices\":[{\"delta\":{\"content\":\"a\\nb\\t\\\"q\\\"\\\\ \\/ "
      "\\b\\f\\r\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"\\u00e9\\u4e2d\\ud83d\\ude00\\u007f\"}}]"
      "}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"\\uD83D\\uDE00 upper \\u00C9\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"lone \\ud83d\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"lone \\ud83d.\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"low \\ude00\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"pair? \\ud83d\\u0041\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"pair? \\ud83d\\\\ude00\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"nul \\u0000 cut\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"bad hex \\u00zz.\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"short \\u12\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"bad \\x escape\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"raw \x01 \x1f \x7f \xff \xc3\xa9\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"raw nul \0 byte\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"nul after\"}}]}\0"),
    P(" {  \"choices\" : [ { \"index\" : 0 , \"delta\" : { \"content\" : \"spaced\" } , "
      "\"finish_reason\" : null } ] } \r\n"),
    P("\t\r\n{\"choices\":[{\"delta\":{\"content\":\"lead\"}}]}\n"),
    P("\f{\"choices\":[{\"delta\":{\"content\":\"form feed\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"vt\"}}]}\v"),
    P("{\"choices\":[{\"delta\":{\"content\":\"ctl\"}}\x01]}"),
    P("\xef\xbb\xbf{\"choices\":[{\"delta\":{\"content\":\"bom\"}}]}"),
    P("{\"choices\":[{\"finish_reason\":\"stop\",\"delta\":{\"content\":\"order\"},"
      "\"index\":0}],\"model\":\"m2\",\"id\":\"x\"}"),
    P("{\"model\":\"a\",\"model\":\"b\",\"choices\":[]}"),
    P("{\"choices\":[],\"choices\":[{\"delta\":{\"content\":\"dup\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"a\",\"content\":\"b\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"a\"},\"delta\":{\"content\":\"b\"}}]}"),
    P("{\"choices\":[{\"text\":\"a\",\"text\":\"b\"}]}"),
    P("{\"choices\":[{\"delta\":{},\"finish_reason\":\"a\",\"finish_reason\":\"b\"}]}"),
    P("{\"choices\":[{\"index\":0,\"index\":1,\"delta\":{\"content\":\"dup index\"}}]}"),
    P("{\"choices\":[{\"index\":0.0,\"delta\":{\"content\":\"zero float\"}}]}"),
    P("{\"choices\":[{\"index\":-0,\"delta\":{\"content\":\"minus zero\"}}]}"),
    P("{\"choices\":[{\"index\":0e3,\"delta\":{\"content\":\"zero exp\"}}]}"),
    P("{\"choices\":[{\"index\":00,\"delta\":{\"content\":\"double zero\"}}]}"),
    P("{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"one\"}}]}"),
    P("{\"choices\":[{\"index\":\"0\",\"delta\":{\"content\":\"string index\"}}]}"),
    P("{\"choices\":[{\"index\":null,\"delta\":{\"content\":\"null index\"}}]}"),
    P("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}},{\"index\":1,"
      "\"delta\":{\"content\":\"y\"}}]}"),
    P("{\"choices\":[7,{\"delta\":{\"content\":\"second\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"n\"},\"logprobs\":{\"content\":[{"
      "\"token\":\"a\",\"logprob\":-0.1}]}}]}"),
    P("{\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}"),
    P("{\"choices\":[{\"delta\":{\"reasoning_content\":\"think\",\"content\":null}}]}"),
    P("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":"
      "null}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":null},\"text\":\"legacy\"}]}"),
    P("{\"choices\":[{\"delta\":null,\"text\":\"legacy null delta\"}]}"),
    P("{\"choices\":[{\"delta\":\"s\",\"text\":\"legacy string delta\"}]}"),
    P("{\"choices\":[{\"delta\":[],\"text\":\"legacy array delta\"}]}"),
    P("{\"choices\":[{\"text\":\"t\",\"delta\":{\"content\":\"c wins\"}}]}"),
    P("{\"choices\":[{\"text\":\"t wins\",\"delta\":{\"content\":7}}]}"),
    P("{\"choices\":[{\"text\":\"esc \\u00e9\\n\",\"index\":0,\"logprobs\":null,"
      "\"finish_reason\":\"length\"}],\"model\":\"i\"}"),
    P("{\"choices\":[{\"delta\":{\"content\":5},\"finish_reason\":3}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"\"},\"finish_reason\":\"\"}]}"),
    P("{\"choices\":[{\"delta\":{},\"finish_reason\":\"a finish reason that does not "
      "fit in thirty-two bytes\"}]}"),
    P("{\"choices\":[{\"delta\":{},\"finish_reason\":\"thirty-one bytes and then a \xc3"
      "\xa9\xc3\xa9\"}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"st\\u006fp\"}]}"),
    P("{\"model\":\"a model name of more than one hundred and twenty-seven bytes, which "
      "is "
      "cut at that many bytes and never in the middle of a character: \xc3\xa9\xc3\xa9"
      "\xc3\xa9\xc3\xa9\",\"choices\":[]}"),
    P("{\"model\":\"m\\u00e9\",\"choices\":[]}"),
    P("{\"model\":\"\",\"choices\":[{\"delta\":{\"content\":\"empty model\"}}]}"),
    P("{\"model\":null,\"choices\":[]}"),
    P("{\"model\":[\"m\"],\"choices\":[]}"),
    P("{\"object\":\"error\",\"message\":\"flat\"}"),
    P("{\"object\":\"err\\u006fr\",\"message\":\"escaped\"}"),
    P("{\"object\":\"errors\",\"choices\":[{\"delta\":{\"content\":\"not error\"}}]}"),
    P("{\"object\":1,\"choices\":[]}"),
    P("{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"o\"}}"),
    P("{\"type\":\"chunk\",\"choices\":[{\"delta\":{\"content\":\"typed\"}}]}"),
    P("{\"error\":null,\"choices\":[{\"delta\":{\"content\":\"error null\"}}]}"),
    P("{\"error\":{\"message\":\"m\",\"code\":429,\"type\":\"t\"}}"),
    P("{\"usage\":null,\"choices\":[{\"delta\":{\"content\":\"usage null\"}}]}"),
    P("{\"usage\":{\"prompt_tokens\":1},\"choices\":[{\"delta\":{\"content\":\"u\"}}]}"),
    P("{\"usage\":7,\"choices\":[]}"),
    P("{\"created\":1e5,\"a\":-0.5E-3,\"b\":true,\"c\":false,\"d\":null,\"e\":1E+2,"
      "\"choices\":[]}"),
    P("{\"created\":01,\"choices\":[]}"),
    P("{\"created\":1.,\"choices\":[]}"),
    P("{\"created\":.5,\"choices\":[]}"),
    P("{\"created\":+1,\"choices\":[]}"),
    P("{\"created\":-,\"choices\":[]}"),
    P("{\"created\":1e,\"choices\":[]}"),
    P("{\"created\":0x10,\"choices\":[]}"),
    P("{\"created\":12345678901234567890123456789012,\"choices\":[]}"),
    P("{\"created\":123456789012345678901234567890123,\"choices\":[]}"),
    P("{\"created\":"
      "1234567890123456789012345678901234567890123456789012345678901234567890,"
      "\"choices\":[]}"),
    P("{\"created\":tru,\"choices\":[]}"),
    P("{\"created\":nullx,\"choices\":[]}"),
    P("{\"a\":[1,{\"b\":[]}],\"choices\":[{\"delta\":{\"content\":\"nested "
      "unknown\"}}]}"),
    P("{\"\\u0063hoices\":[{\"delta\":{\"content\":\"escaped key\"}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"}}]},"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"}}],}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"}},]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"},}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\",}}]}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}}"),
    P("{\"choices\":[{\"delta\":{\"content\":\"x\"}}]} junk"),
    P("{\"choices\" [{\"delta\":{\"content\":\"no colon\"}}]}"),
    P("{choices:[]}"),
    P("{'choices':[]}"),
    P("{}"),
    P("{\"choices\":[]}"),
    P("{\"choices\":[ ]}"),
    P("{\"choices\":{}}"),
    P("{\"choices\":null,\"model\":\"mm\"}"),
    P("{\"choices\":[{}]}"),
    P("[1]"),
    P("\"x\""),
    P("null"),
    P("123"),
    P("  [DONE]"),
    P("[DONE"),
    P(" \r\n\t"),
};

/* Payloads the fast path must take: the shapes that make up nearly every
 * stream. Guards the comparison against passing only because nothing took
 * the fast path. */
static const char *const fast_payloads[] = {
    "{\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,"
    "\"model\":\"fake\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello\"},"
    "\"finish_reason\":null}]}",
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-"
    "4o\","
    "\"service_tier\":\"default\",\"system_fingerprint\":\"fp_1\",\"choices\":[{"
    "\"index\":0,"
    "\"delta\":{\"content\":\" it\\u2019s \\\"\\n\"},\"logprobs\":null,"
    "\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"x\"}",
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
    "\"finish_reason\":null}]}",
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}",
    "{\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":"
    "\"\\ud83d\\ude00 ok\"}}],\"created\":1,\"id\":\"chatcmpl-x\",\"model\":"
    "\"gpt-3.5-turbo\",\"object\":\"chat.completion.chunk\"}",
    "{\"id\":\"cmpl-2\",\"object\":\"text_completion\",\"created\":1,"
    "\"choices\":[{\"text\":\" world\",\"index\":0,\"logprobs\":null,"
    "\"finish_reason\":null}],\"model\":\"gpt-3.5-turbo-instruct\"}",
    " { \"choices\" : [ { \"delta\" : { \"content\" : \"spaced\" } } ] } ",
};

/* Checks that two streams read the same. */
static void same_state(const struct openai_stream *a, const struct openai_stream *b,
                       const char *what, size_t n)
{
    int w = (int)(n < 200 ? n : 200);

    ck_assert_msg(a->content.len == b->content.len &&
                      (a->content.len == 0 ||
                       memcmp(a->content.data, b->content.data, a->content.len) == 0),
                  "content '%s' vs '%s' after '%.*s'", content(a), content(b), w, what);
    ck_assert_msg(strcmp(a->finish_reason, b->finish_reason) == 0,
                  "finish '%s' vs '%s' after '%.*s'", a->finish_reason, b->finish_reason,
                  w, what);
    ck_assert_msg(strcmp(a->model, b->model) == 0, "model '%s' vs '%s' after '%.*s'",
                  a->model, b->model, w, what);
    ck_assert_int_eq(a->prompt_tokens, b->prompt_tokens);
    ck_assert_int_eq(a->completion_tokens, b->completion_tokens);
    ck_assert_int_eq(a->total_tokens, b->total_tokens);
    ck_assert_int_eq(a->done, b->done);
    ck_assert_int_eq(a->error, b->error);
    ck_assert_str_eq(a->error_type, b->error_type);
    ck_assert_str_eq(a->error_code, b->error_code);
    ck_assert_str_eq(a->error_message, b->error_message);
    ck_assert_uint_eq(a->chunks, b->chunks);
}

/* Feeds one payload to both paths and checks the return, the error, the
 * delta and the state all match. Returns the return code. */
static int feed_both(struct openai_stream *fast, struct openai_stream *json,
                     const char *p, size_t n)
{
    struct cr_err e1, e2;
    const char *d1, *d2;
    size_t n1, n2;
    int r1, r2, w = (int)(n < 200 ? n : 200);

    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    r1 = openai_stream_feed(fast, p, n, &d1, &n1, &e1);
    r2 = openai__stream_feed_json(json, p, n, &d2, &n2, &e2);
    ck_assert_msg(r1 == r2, "rc %d vs %d for '%.*s'", r1, r2, w, p);
    ck_assert_int_eq(e1.code, e2.code);
    ck_assert_str_eq(e1.msg, e2.msg);
    ck_assert_msg(n1 == n2 && memcmp(d1, d2, n1) == 0,
                  "delta '%.*s' vs '%.*s' for '%.*s'", (int)n1, d1, (int)n2, d2, w, p);
    same_state(fast, json, p, n);
    return r1;
}

/* One payload on a pair of streams that already hold a model and some text,
 * optionally with a small content cap. */
static void diff_one(const char *p, size_t n, size_t max_bytes)
{
    static const char pre[] =
        "{\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"pre\"}}]}";
    struct openai_stream a, b;

    openai_stream_init(&a);
    openai_stream_init(&b);
    feed_both(&a, &b, pre, sizeof(pre) - 1);
    a.content.max_bytes = b.content.max_bytes = max_bytes;
    feed_both(&a, &b, p, n);
    openai_stream_release(&a);
    openai_stream_release(&b);
}

/* A wire sample through the SSE parser, each event to both paths. */
static void diff_wire(const char *wire)
{
    struct sse_parser *p = sse_parser_new(0);
    struct openai_stream a, b;
    struct sse_event ev;

    ck_assert_ptr_nonnull(p);
    openai_stream_init(&a);
    openai_stream_init(&b);
    ck_assert_int_eq(sse_feed(p, wire, strlen(wire)), 0);
    while (sse_next(p, &ev) == 1)
        feed_both(&a, &b, ev.data, ev.data_len);
    while (sse_finish(p, &ev) == 1)
        feed_both(&a, &b, ev.data, ev.data_len);
    ck_assert_int_eq(openai_stream_complete(&a), openai_stream_complete(&b));
    openai_stream_release(&a);
    openai_stream_release(&b);
    sse_parser_free(p);
}

/* Every payload whole, cut short at every length, and with each byte in turn
 * replaced by each of a few bytes that matter to a JSON scanner. */
static void diff_sweep(const char *p, size_t n)
{
    static const char subst[] = {'"', '\\', '}', ']', ',', ':', '0', ' ', 'u', '\0'};
    char *m = cr_malloc(n + 1);
    size_t i, k;

    ck_assert_ptr_nonnull(m);
    diff_one(p, n, 0);
    diff_one(p, n, 6);
    for (i = 0; i < n; i++)
        diff_one(p, i, 0);
    for (i = 0; i < n; i++) {
        for (k = 0; k < sizeof(subst); k++) {
            memcpy(m, p, n);
            m[i] = subst[k];
            diff_one(m, n, 0);
        }
    }
    cr_free(m);
}

START_TEST(test_fast_path_same_as_json)
{
    static const char *const wires[] = {OPENAI_WIRE, VLLM_WIRE, LLAMACPP_WIRE,
                                        OLLAMA_WIRE, VLLM_ERROR_WIRE};
    size_t i;

    for (i = 0; i < sizeof(wires) / sizeof(wires[0]); i++)
        diff_wire(wires[i]);
    for (i = 0; i < sizeof(diff_payloads) / sizeof(diff_payloads[0]); i++)
        diff_sweep(diff_payloads[i].p, diff_payloads[i].n);
    for (i = 0; i < sizeof(sweep_payloads) / sizeof(sweep_payloads[0]); i++)
        diff_sweep(sweep_payloads[i], strlen(sweep_payloads[i]));
    for (i = 0; i < sizeof(fast_payloads) / sizeof(fast_payloads[0]); i++)
        diff_sweep(fast_payloads[i], strlen(fast_payloads[i]));
}
END_TEST

START_TEST(test_fast_path_taken)
{
    static const char *const slow[] = {
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":1}}",
        "{\"error\":{\"message\":\"x\"}}",
        "{\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}",
        "{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"}}]}",
        "{\"model\":\"m\\u00e9\",\"choices\":[]}",
        "{\"choices\":[{\"delta\":{\"content\":\"\\u0000\"}}]}",
        "[DONE]",
    };
    size_t i;

    for (i = 0; i < sizeof(fast_payloads) / sizeof(fast_payloads[0]); i++)
        ck_assert_msg(openai__fast_path(fast_payloads[i], strlen(fast_payloads[i])),
                      "slow: %s", fast_payloads[i]);
    for (i = 0; i < sizeof(slow) / sizeof(slow[0]); i++)
        ck_assert_msg(!openai__fast_path(slow[i], strlen(slow[i])), "fast: %s", slow[i]);
}
END_TEST

/* The fast path reads with pyjson's strict scanner: what strict JSON refuses
 * and cJSON takes (raw control characters, invalid UTF-8) goes the cJSON way,
 * and reads the same; numbers up to cJSON's 63 bytes stay on the fast path. */
START_TEST(test_fast_path_strict)
{
    static const struct payload slow[] = {
        P("{\"choices\":[{\"delta\":{\"content\":\"tab\there\"}}]}"),
        P("{\"choices\":[{\"delta\":{\"content\":\"bad \xff utf8\"}}]}"),
        P("{\"choices\":[{\"delta\":{\"content\":\"overlong \xc0\xaf\"}}]}"),
        P("{\"choices\":[{\"delta\":{\"content\":\"surrogate \xed\xa0\x80\"}}]}"),
        P("{\"x\":\"\x01\",\"choices\":[{\"delta\":{\"content\":\"k\"}}]}"),
        P("{\"created\":1234567890123456789012345678901234567890123456789012345678901234,"
          "\"choices\":[{\"delta\":{\"content\":\"64\"}}]}"),
        P("{\"created\":NaN,\"choices\":[{\"delta\":{\"content\":\"nan\"}}]}"),
    };
    static const struct payload fast[] = {
        P("{\"choices\":[{\"delta\":{\"content\":"
          "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\x7f\"}}]}"),
        P("{\"created\":123456789012345678901234567890123456789012345678901234567890123,"
          "\"choices\":[{\"delta\":{\"content\":\"63\"}}]}"),
        P("{\"created\":-1.5e+300,\"choices\":[{\"delta\":{\"content\":\"e\"}}]}"),
    };
    size_t i;

    for (i = 0; i < sizeof(slow) / sizeof(slow[0]); i++) {
        ck_assert_msg(!openai__fast_path(slow[i].p, slow[i].n), "fast: %s", slow[i].p);
        diff_sweep(slow[i].p, slow[i].n);
    }
    for (i = 0; i < sizeof(fast) / sizeof(fast[0]); i++) {
        ck_assert_msg(openai__fast_path(fast[i].p, fast[i].n), "slow: %s", fast[i].p);
        diff_sweep(fast[i].p, fast[i].n);
    }
}
END_TEST

/* The fast path allocates nothing for a token chunk beyond the text itself,
 * and only a change of model costs a copy. */
START_TEST(test_fast_path_no_alloc)
{
    struct openai_stream s;

    openai_stream_init(&s);
    s.content.max_bytes = 0;
    ck_assert_int_eq(buf_reserve(&s.content, 64), 0);
    ck_assert_int_eq(feed_str(&s, fast_payloads[0], NULL), 0);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(feed_str(&s, fast_payloads[0], NULL), 0);
    ck_assert_int_eq(cr_alloc_failed(), 0);
    cr_alloc_fail_after(0);
    ck_assert_str_eq(content(&s), "hellohello");
    ck_assert_str_eq(s.model, "fake");
    openai_stream_release(&s);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("openai");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_openai_stream, 0, 3);
    tcase_add_test(tc, test_vllm_merged_finish);
    tcase_add_test(tc, test_usage_details);
    tcase_add_test(tc, test_llamacpp_null_content);
    tcase_add_test(tc, test_ollama_no_usage);
    tcase_add_test(tc, test_vllm_error_then_done);
    tcase_add_test(tc, test_error_shapes_in_stream);
    tcase_add_test(tc, test_usage_only_and_last_wins);
    tcase_add_test(tc, test_completion_predicate);
    tcase_add_test(tc, test_done_variants);
    tcase_add_test(tc, test_choice_zero_only_and_legacy);
    tcase_add_test(tc, test_odd_chunks);
    tcase_add_test(tc, test_malformed_chunks);
    tcase_add_test(tc, test_content_cap);
    tcase_add_test(tc, test_chat_parse);
    tcase_add_test(tc, test_chat_parse_bad);
    tcase_add_test(tc, test_embed_float);
    tcase_add_test(tc, test_embed_base64);
    tcase_add_test(tc, test_embed_bad);
    tcase_add_loop_test(tc, test_error_parse, 0,
                        (int)(sizeof(error_vecs) / sizeof(error_vecs[0])));
    tcase_add_test(tc, test_error_parse_truncation);
    tcase_add_test(tc, test_oom_stream);
    tcase_add_test(tc, test_oom_bodies);
    suite_add_tcase(s, tc);
    /* The comparison runs both paths over tens of thousands of payloads. */
    tc = tcase_create("fastpath");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fast_path_same_as_json);
    tcase_add_test(tc, test_fast_path_taken);
    tcase_add_test(tc, test_fast_path_strict);
    tcase_add_test(tc, test_fast_path_no_alloc);
    suite_add_tcase(s, tc);
    return s;
}
