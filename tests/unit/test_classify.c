/* test_classify.c -- one outcome per call (llm/classify.h), for every provider
 * and both readers, from captured error bodies and streams: whole, cut at
 * every byte, malformed, and under allocation failure. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/classify.h"
#include "provider_drive.h"
#include "unit.h"
#include "util/alloc.h"

#define OK LLM_OK
#define R LLM_RETRYABLE
#define P LLM_PERMANENT

/* One call's end, as the client would hand it over. */
struct end {
    struct llm_exchange x;
    struct llm_answer a;
    struct openai_stream fast;
    struct llm_stream ps;
    int has_ps;
    struct llm_result res;
    char msg[768];
};

/* p NULL: the fast path (the default provider's plain calls). */
static int end_init(struct end *e, const struct llm_provider *p, enum llm_op op)
{
    memset(e, 0, sizeof(*e));
    e->x.op = op;
    e->a.provider = p ? p : &llm_provider_openai;
    if (!p) {
        openai_stream_init(&e->fast);
        e->a.fast = op == LLM_OP_CHAT ? &e->fast : NULL;
        return 0;
    }
    if (llm_stream_init(&e->ps, p, op))
        return CR_ENOMEM;
    e->has_ps = 1;
    e->a.stream = &e->ps;
    return 0;
}

static void end_release(struct end *e)
{
    cJSON_Delete(e->res.embedding);
    e->res.embedding = NULL;
    if (e->has_ps)
        llm_stream_release(&e->ps);
    else
        openai_stream_release(&e->fast);
}

static void classify(struct end *e)
{
    llm_outcome(&e->x, &e->a, &e->res, e->msg, sizeof(e->msg));
}

/* The fast path's stream reading, as llm_client.c does it: SSE events into
 * openai_stream, then what is left at the end. Returns the first error. */
static int feed_fast(struct openai_stream *s, const char *wire, size_t len)
{
    struct sse_parser *sp = sse_parser_new(1 << 20);
    struct sse_event ev;
    struct cr_err err;
    int rc, got;

    if (!sp)
        return CR_ENOMEM;
    rc = sse_feed(sp, wire, len);
    while (!rc && (got = sse_next(sp, &ev)) != 0)
        rc =
            got < 0 ? got : openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err);
    if (!rc && sse_finish(sp, &ev) == 1)
        openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err);
    if (!rc)
        openai_stream_end(s, NULL, NULL);
    sse_parser_free(sp);
    return rc;
}

/* A 2xx chat answer that came as frames (framing SSE or NDJSON). */
static void run_stream(struct end *e, const struct llm_provider *p,
                       enum llm_framing framing, const char *wire, size_t len, long step)
{
    struct cr_err err;
    int rc;

    ck_assert_int_eq(end_init(e, p, LLM_OP_CHAT), 0);
    e->x.status = 200;
    e->x.framed = 1;
    rc = p ? drive(&e->ps, framing, wire, len, step, NULL, &err)
           : feed_fast(&e->fast, wire, len);
    if (rc) {
        /* A frame the reader refused ends the call as the client ends it. */
        e->x.proto_error = 1;
        e->x.fail_msg = "bad stream chunk";
    }
    classify(e);
}

/* A response whose body is kept whole: an error body, or a 2xx answer that
 * did not come as frames. */
static void run_body(struct end *e, const struct llm_provider *p, enum llm_op op,
                     long status, const char *body, size_t len)
{
    ck_assert_int_eq(end_init(e, p, op), 0);
    e->x.status = status;
    e->x.body = body;
    e->x.body_len = len;
    classify(e);
}

/* ------------------------------------------------------------ error bodies */

struct body_vec {
    const char *what;
    const struct llm_provider *p; /* NULL: the fast path */
    long status;
    const char *body;
    const char *retry_after, *retry_after_ms, *should_retry;
    enum llm_verdict want;
    const char *exc;
    int64_t retry_ms;
    const char *msg; /* the whole message, or NULL */
};

static const struct body_vec body_vecs[] = {
    /* OpenAI: a quota 429 is permanent, whatever the hints say. */
    {"openai quota", NULL, 429,
     "{\"error\":{\"message\":\"You exceeded your current quota, please check your plan "
     "and billing details.\",\"type\":\"insufficient_quota\",\"param\":null,\"code\":"
     "\"insufficient_quota\"}}",
     "20", NULL, "true", P, "RateLimitError", 20000,
     "Error code: 429 - You exceeded your current quota, please check your plan and "
     "billing details. (type: insufficient_quota, code: insufficient_quota)"},
    {"openai quota, provider path", &llm_provider_openai, 429,
     "{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":"
     "\"insufficient_quota\",\"param\":null,\"code\":\"insufficient_quota\"}}",
     NULL, NULL, NULL, P, "PermissionDeniedError", -1, NULL},
    {"openai rate limit", NULL, 429,
     "{\"error\":{\"message\":\"Rate limit reached for gpt-4o in organization org-x on "
     "requests per min (RPM): Limit 500, Used 500, Requested 1.\",\"type\":\"requests\","
     "\"param\":null,\"code\":\"rate_limit_exceeded\"}}",
     "2", NULL, NULL, R, "RateLimitError", 2000, NULL},
    {"openai rate limit, x-should-retry false", NULL, 429,
     "{\"error\":{\"message\":\"slow down\",\"type\":\"requests\",\"code\":"
     "\"rate_limit_exceeded\"}}",
     NULL, NULL, "false", P, "RateLimitError", -1, NULL},
    {"openai context length", NULL, 400,
     "{\"error\":{\"message\":\"This model's maximum context length is 8192 tokens.\","
     "\"type\":\"invalid_request_error\",\"param\":\"messages\",\"code\":"
     "\"context_length_exceeded\"}}",
     NULL, NULL, NULL, P, "BadRequestError", -1,
     "Error code: 400 - This model's maximum context length is 8192 tokens. (type: "
     "invalid_request_error, code: context_length_exceeded, param: messages)"},
    {"openai 400, x-should-retry true", NULL, 400,
     "{\"error\":{\"message\":\"try again\",\"type\":\"invalid_request_error\"}}", NULL,
     NULL, " True ", R, "BadRequestError", -1, NULL},
    {"openai bad key", NULL, 401,
     "{\"error\":{\"message\":\"Incorrect API key provided: sk-abc.\",\"type\":"
     "\"invalid_request_error\",\"param\":null,\"code\":\"invalid_api_key\"}}",
     NULL, NULL, NULL, P, "AuthenticationError", -1, NULL},
    {"openai 409", NULL, 409, "{\"error\":{\"message\":\"lock timeout\"}}", NULL, NULL,
     NULL, R, "ConflictError", -1, NULL},
    {"openai 422", NULL, 422, "{\"error\":{\"message\":\"bad\"}}", NULL, NULL, NULL, P,
     "UnprocessableEntityError", -1, NULL},
    {"openai 500", NULL, 500,
     "{\"error\":{\"message\":\"The server had an error while processing your "
     "request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
     NULL, NULL, NULL, R, "InternalServerError", -1, NULL},
    /* vLLM, both shapes: an integer code. */
    {"vllm", NULL, 400,
     "{\"error\":{\"message\":\"This model's maximum context length is 4096 tokens. "
     "However, you requested 5000 tokens.\",\"type\":\"BadRequestError\",\"param\":null,"
     "\"code\":400}}",
     NULL, NULL, NULL, P, "BadRequestError", -1, NULL},
    {"vllm flat", NULL, 400,
     "{\"object\":\"error\",\"message\":\"bad\",\"type\":\"BadRequestError\",\"param\":"
     "null,\"code\":400}",
     NULL, NULL, NULL, P, "BadRequestError", -1, NULL},
    /* llama.cpp while its model loads. */
    {"llama.cpp loading", NULL, 503,
     "{\"error\":{\"code\":503,\"message\":\"Loading model\",\"type\":"
     "\"unavailable_error\"}}",
     NULL, NULL, NULL, R, "InternalServerError", -1,
     "Error code: 503 - Loading model (type: unavailable_error, code: 503)"},
    /* Proxies: HTML and empty bodies. */
    {"html 502", NULL, 502,
     "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 "
     "Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n",
     NULL, NULL, NULL, R, "InternalServerError", -1, NULL},
    {"empty 504", NULL, 504, "", NULL, NULL, NULL, R, "InternalServerError", -1,
     "Error code: 504 - (no message)"},
    {"retry-after date", NULL, 503, "", "Sun, 06 Nov 1994 08:49:47 GMT", NULL, NULL, R,
     "InternalServerError", 10000, NULL},
    {"retry-after-ms wins", NULL, 429, "", "7", "1500.2", NULL, R, "RateLimitError", 1501,
     NULL},
    {"408", NULL, 408, "", NULL, NULL, NULL, R, "APIStatusError", -1, NULL},
    {"no response", NULL, 0, "", NULL, NULL, NULL, R, "APIStatusError", -1, NULL},
    /* Anthropic. */
    {"anthropic overloaded", &llm_provider_anthropic, 529,
     "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":"
     "\"Overloaded\"},\"request_id\":\"req_011CSHoEeqs5C35K2UUqR7Fy\"}",
     NULL, NULL, NULL, R, "OverloadedError", -1,
     "Error code: 529 - Overloaded (type: overloaded_error)"},
    {"anthropic rate limit", &llm_provider_anthropic, 429,
     "{\"type\":\"error\",\"error\":{\"type\":\"rate_limit_error\",\"message\":\"This "
     "request would exceed your organization's rate limit.\"},\"request_id\":\"req_1\"}",
     "12", NULL, NULL, R, "RateLimitError", 12000, NULL},
    {"anthropic bad request", &llm_provider_anthropic, 400,
     "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":"
     "\"max_tokens: Field required\"},\"request_id\":\"req_2\"}",
     NULL, NULL, NULL, P, "BadRequestError", -1, NULL},
    {"anthropic auth", &llm_provider_anthropic, 401,
     "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\",\"message\":"
     "\"invalid x-api-key\"},\"request_id\":\"req_3\"}",
     NULL, NULL, NULL, P, "AuthenticationError", -1, NULL},
    {"anthropic billing", &llm_provider_anthropic, 402,
     "{\"type\":\"error\",\"error\":{\"type\":\"billing_error\",\"message\":\"Your "
     "credit balance is too low.\"}}",
     NULL, NULL, NULL, P, "PermissionDeniedError", -1, NULL},
    {"anthropic too large from the CDN", &llm_provider_anthropic, 413,
     "<html><body>413 Request Entity Too Large</body></html>", NULL, NULL, NULL, P,
     "RequestTooLargeError", -1, NULL},
    {"anthropic api error", &llm_provider_anthropic, 500,
     "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"Internal "
     "server error\"}}",
     NULL, NULL, NULL, R, "InternalServerError", -1, NULL},
    /* Ollama's native errors are a string. */
    {"ollama not found", &llm_provider_ollama, 404,
     "{\"error\":\"model \\\"llama9\\\" not found, try pulling it first\"}", NULL, NULL,
     NULL, P, "NotFoundError", -1,
     "Error code: 404 - model \"llama9\" not found, try pulling it first"},
    {"ollama queue full", &llm_provider_ollama, 503,
     "{\"error\":\"server busy, please try again.  maximum pending requests exceeded\"}",
     NULL, NULL, NULL, R, "OverloadedError", -1, NULL},
    /* Azure: retry-after-ms, and its own codes. */
    {"azure rate limit", &llm_provider_azure, 429,
     "{\"error\":{\"code\":\"429\",\"message\":\"Requests to the ChatCompletions_Create "
     "Operation under Azure OpenAI API version 2024-02-01 have exceeded token rate "
     "limit of your current OpenAI S0 pricing tier.\"}}",
     "1", "1500", NULL, R, "RateLimitError", 1500, NULL},
    {"azure deployment", &llm_provider_azure, 404,
     "{\"error\":{\"code\":\"DeploymentNotFound\",\"message\":\"The API deployment for "
     "this resource does not exist.\"}}",
     NULL, NULL, NULL, P, "NotFoundError", -1, NULL},
};

#define NBODY ((int)(sizeof(body_vecs) / sizeof(body_vecs[0])))

static void set_headers(struct end *e, const struct body_vec *v)
{
    e->x.retry_after = v->retry_after;
    e->x.retry_after_ms = v->retry_after_ms;
    e->x.should_retry = v->should_retry;
    /* 10 s before the date in "retry-after date". */
    e->x.now_epoch_ms = 784111777000;
}

static void check_body(const struct body_vec *v, struct end *e)
{
    ck_assert_msg(e->res.verdict == v->want, "%s: verdict %d", v->what, e->res.verdict);
    ck_assert_int_eq(e->res.code, CR_ELLM);
    ck_assert_int_eq(e->res.http_status, v->status);
    ck_assert_str_eq(e->res.exc_type, v->exc);
    ck_assert_int_eq(e->res.retry_after_ms, v->retry_ms);
    ck_assert_ptr_eq(e->res.message, e->msg);
    if (v->msg)
        ck_assert_str_eq(e->msg, v->msg);
}

START_TEST(test_error_bodies)
{
    const struct body_vec *v = &body_vecs[_i];
    enum llm_op ops[2] = {LLM_OP_CHAT, LLM_OP_EMBED};
    struct end e;

    /* A chat's error and an embeddings call's are read alike. */
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(end_init(&e, v->p, ops[k]), 0);
        e.x.status = v->status;
        e.x.body = v->body;
        e.x.body_len = strlen(v->body);
        set_headers(&e, v);
        classify(&e);
        check_body(v, &e);
        end_release(&e);
    }
}
END_TEST

/* Every error body cut at every byte: the status still decides, the
 * message still names it. A quota 429 is read from the body, so it is left
 * out. */
START_TEST(test_error_bodies_cut)
{
    const struct body_vec *v = &body_vecs[_i];
    size_t n = strlen(v->body);
    char want[32];

    if (strstr(v->body, "insufficient_quota") || v->should_retry)
        return;
    snprintf(want, sizeof(want), "Error code: %ld - ", v->status);
    for (size_t k = 0; k <= n; k++) {
        struct end e;
        char *cut = malloc(k + 1);
        memcpy(cut, v->body, k);
        run_body(&e, v->p, LLM_OP_CHAT, v->status, cut, k);
        ck_assert_msg(e.res.verdict == v->want, "%s cut at %zu", v->what, k);
        ck_assert_int_eq(strncmp(e.msg, want, strlen(want)), 0);
        end_release(&e);
        free(cut);
    }
}
END_TEST

/* ----------------------------------------------------------------- streams */

static const char openai_sse[] =
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":"
    "\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
    "\"Hel\"},\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
    "\"lo\"},\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},"
    "\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":"
    "1700000000,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,"
    "\"completion_tokens\":2,\"total_tokens\":11}}\n\n"
    "data: [DONE]\n\n";

/* vLLM: an error payload, then [DONE] all the same. */
static const char vllm_error_sse[] =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"Par\"},\"finish_reason\":null}]}\n\n"
    "data: {\"error\":{\"message\":\"This model's maximum context length is 4096 "
    "tokens.\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\n"
    "data: [DONE]\n\n";

static const char server_error_sse[] =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"},"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"error\":{\"message\":\"The server had an error\",\"type\":\"server_error\","
    "\"param\":null,\"code\":null}}\n\n";

START_TEST(test_openai_stream)
{
    const struct llm_provider *ps[3] = {NULL, &llm_provider_openai, &llm_provider_azure};
    struct end e;

    for (int i = 0; i < 3; i++) {
        run_stream(&e, ps[i], LLM_FRAMING_SSE, openai_sse, strlen(openai_sse), 0);
        ck_assert_int_eq(e.res.verdict, OK);
        ck_assert_int_eq(e.res.code, 0);
        ck_assert_ptr_null(e.res.exc_type);
        ck_assert_str_eq(e.msg, "");
        ck_assert_int_eq(e.res.text_len, 5);
        ck_assert_int_eq(memcmp(e.res.text, "Hello", 5), 0);
        ck_assert_str_eq(e.res.finish_reason, "stop");
        ck_assert_str_eq(e.res.model, "m");
        ck_assert_int_eq(e.res.prompt_tokens, 9);
        ck_assert_int_eq(e.res.completion_tokens, 2);
        ck_assert_int_eq(e.res.total_tokens, 11);
        ck_assert_int_eq(e.res.retry_after_ms, -1);
        ck_assert(i == 0 ? e.res.reply == NULL : e.res.reply != NULL);
        end_release(&e);
    }
}
END_TEST

/* The stream cut at every byte, on both readers: never permanent, never a
 * success before the finish chunk, always one after it; the text so far
 * goes with the failure. */
START_TEST(test_openai_stream_cut)
{
    const struct llm_provider *p = _i ? &llm_provider_openai : NULL;
    size_t n = strlen(openai_sse);
    size_t finish =
        (size_t)(strstr(openai_sse, "\"finish_reason\":\"stop\"") - openai_sse);
    int was_ok = 0;

    for (size_t k = 0; k <= n; k++) {
        struct end e;
        run_stream(&e, p, LLM_FRAMING_SSE, openai_sse, k, 0);
        ck_assert_msg(e.res.verdict != P, "cut at %zu: permanent", k);
        if (k < finish)
            ck_assert_msg(e.res.verdict == R, "cut at %zu: not retried", k);
        if (was_ok)
            ck_assert_msg(e.res.verdict == OK, "cut at %zu: not ok after ok", k);
        if (e.res.verdict == R) {
            ck_assert_str_eq(e.res.exc_type, "APIError");
            ck_assert_int_le(e.res.text_len, 5);
        }
        was_ok = e.res.verdict == OK;
        end_release(&e);
    }
    ck_assert(was_ok);
}
END_TEST

struct stream_vec {
    const char *what;
    const struct llm_provider *p; /* NULL: the fast path */
    enum llm_framing framing;
    const char *wire; /* or NULL: the fixture */
    const char *fixture;
    enum llm_verdict want;
    const char *exc;
    const char *msg; /* prefix */
    const char *text;
};

static const struct stream_vec stream_vecs[] = {
    {"vllm error then done", NULL, LLM_FRAMING_SSE, vllm_error_sse, NULL, P,
     "BadRequestError",
     "error in stream: This model's maximum context length is 4096 tokens. (type: "
     "BadRequestError, code: 400)",
     "Par"},
    {"vllm error then done, provider path", &llm_provider_openai, LLM_FRAMING_SSE,
     vllm_error_sse, NULL, P, "BadRequestError", "error in stream: This model's", "Par"},
    {"server error in stream", NULL, LLM_FRAMING_SSE, server_error_sse, NULL, R,
     "InternalServerError",
     "error in stream: The server had an error (type: server_error)", "Par"},
    {"server error in stream, azure", &llm_provider_azure, LLM_FRAMING_SSE,
     server_error_sse, NULL, R, "InternalServerError", "error in stream: The server",
     "Par"},
    {"no done, no finish", NULL, LLM_FRAMING_SSE,
     "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n", NULL, R,
     "APIError", "stream ended without a finish reason or [DONE] after 2 bytes of text",
     "Hi"},
    {"no done, no finish, provider path", &llm_provider_openai, LLM_FRAMING_SSE,
     "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n", NULL, R,
     "APIError",
     "openai answer ended without its completion marker after 2 bytes of text", "Hi"},
    {"done without text", NULL, LLM_FRAMING_SSE, "data: [DONE]\n\n", NULL, R, "APIError",
     "stream ended without", ""},
    {"anthropic", &llm_provider_anthropic, LLM_FRAMING_SSE, NULL,
     "tests/fixtures/providers/anthropic_text.sse", OK, NULL, "",
     "Hello wörld \xf0\x9f\x98\x80!"},
    {"anthropic overloaded in stream", &llm_provider_anthropic, LLM_FRAMING_SSE, NULL,
     "tests/fixtures/providers/anthropic_error.sse", R, "OverloadedError",
     "error in stream: Overloaded (type: overloaded_error)", "Par"},
    {"anthropic stream that names no class", &llm_provider_anthropic, LLM_FRAMING_SSE,
     "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"new_error\","
     "\"message\":\"what\"}}\n\n",
     NULL, R, "APIError", "error in stream: what (type: new_error)", ""},
    {"ollama", &llm_provider_ollama, LLM_FRAMING_NDJSON, NULL,
     "tests/fixtures/providers/ollama_chat.ndjson", OK, NULL, "",
     "The sky \xc3\xa9 blue \xf0\x9f\x98\x80"},
    {"ollama error in stream", &llm_provider_ollama, LLM_FRAMING_NDJSON, NULL,
     "tests/fixtures/providers/ollama_error.ndjson", R, "InternalServerError",
     "error in stream: an error was encountered while running the model: unexpected EOF",
     "Hi"},
    {"ollama without done", &llm_provider_ollama, LLM_FRAMING_NDJSON,
     "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},"
     "\"done\":false}\n",
     NULL, R, "APIError",
     "ollama answer ended without its completion marker after 2 bytes of text", "Hi"},
};

#define NSTREAM ((int)(sizeof(stream_vecs) / sizeof(stream_vecs[0])))

static char *wire_of(const struct stream_vec *v, size_t *n)
{
    if (v->fixture)
        return unit_read_file(v->fixture, n);
    *n = strlen(v->wire);
    return strdup(v->wire);
}

START_TEST(test_streams)
{
    const struct stream_vec *v = &stream_vecs[_i];
    long steps[3] = {0, 1, -1}; /* whole, byte by byte, random pieces */
    size_t n;
    char *wire = wire_of(v, &n);

    for (int k = 0; k < (v->p ? 3 : 1); k++) {
        struct end e;
        run_stream(&e, v->p, v->framing, wire, n, steps[k]);
        ck_assert_msg(e.res.verdict == v->want, "%s: verdict %d (%s)", v->what,
                      e.res.verdict, e.msg);
        if (v->exc)
            ck_assert_str_eq(e.res.exc_type, v->exc);
        else
            ck_assert_ptr_null(e.res.exc_type);
        ck_assert_int_eq(e.res.code, v->want == OK ? 0 : CR_ELLM);
        ck_assert_msg(!strncmp(e.msg, v->msg, strlen(v->msg)), "%s: '%s'", v->what,
                      e.msg);
        ck_assert_int_eq(e.res.text_len, strlen(v->text));
        ck_assert_int_eq(memcmp(e.res.text, v->text, e.res.text_len), 0);
        end_release(&e);
    }
    free(wire);
}
END_TEST

/* Every provider stream cut at every byte: retried, never a permanent
 * failure, until its completion marker; an error in the stream once its
 * frame is whole. */
START_TEST(test_streams_cut)
{
    const struct stream_vec *v = &stream_vecs[_i];
    size_t n;
    char *wire = wire_of(v, &n);

    for (size_t k = 0; k < n; k++) {
        struct end e;
        run_stream(&e, v->p, v->framing, wire, k, 0);
        if (v->want != P)
            ck_assert_msg(e.res.verdict != P, "%s cut at %zu: permanent", v->what, k);
        if (v->want == OK && k + 40 < n)
            ck_assert_msg(e.res.verdict == R, "%s cut at %zu: %d", v->what, k,
                          e.res.verdict);
        end_release(&e);
    }
    free(wire);
}
END_TEST

/* -------------------------------------------------------- whole 2xx bodies */

static const char completion[] =
    "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,"
    "\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":\"Hi\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
    "\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}";

START_TEST(test_whole_bodies)
{
    const struct llm_provider *ps[2] = {NULL, &llm_provider_openai};
    static const char *const fast_bad = "response is neither an event stream nor a chat "
                                        "completion: ";
    static const char *const built_bad = "response is neither a openai stream nor a "
                                         "openai answer: ";
    const char *bad = _i ? built_bad : fast_bad;
    struct end e;

    run_body(&e, ps[_i], LLM_OP_CHAT, 200, completion, strlen(completion));
    ck_assert_int_eq(e.res.verdict, OK);
    ck_assert_int_eq(e.res.text_len, 2);
    ck_assert_str_eq(e.res.finish_reason, "stop");
    ck_assert_int_eq(e.res.total_tokens, 11);
    end_release(&e);

    /* Not JSON: the same request would buy the same body. */
    run_body(&e, ps[_i], LLM_OP_CHAT, 200, "<html>hello</html>", 18);
    ck_assert_int_eq(e.res.verdict, P);
    ck_assert_str_eq(e.res.exc_type, "APIResponseValidationError");
    ck_assert_int_eq(strncmp(e.msg, bad, strlen(bad)), 0);
    end_release(&e);

    /* Empty: a cut exchange, retried. */
    run_body(&e, ps[_i], LLM_OP_CHAT, 200, " \r\n", 3);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_str_eq(e.res.exc_type, "APIError");
    end_release(&e);

    /* An error payload with a 200. */
    run_body(
        &e, ps[_i], LLM_OP_CHAT, 200,
        "{\"error\":{\"message\":\"Incorrect API key\",\"code\":\"invalid_api_key\"}}",
        66);
    ck_assert_int_eq(e.res.verdict, P);
    ck_assert_str_eq(e.res.exc_type, "AuthenticationError");
    ck_assert_str_eq(e.msg, "error in stream: Incorrect API key (code: invalid_api_key)");
    end_release(&e);

    /* Cut at every byte: every prefix but the empty one is malformed. */
    for (size_t k = 0; k < sizeof(completion) - 1; k++) {
        run_body(&e, ps[_i], LLM_OP_CHAT, 200, completion, k);
        ck_assert_int_eq(e.res.verdict, k ? P : R);
        end_release(&e);
    }
}
END_TEST

START_TEST(test_embeddings)
{
    static const char body[] =
        "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
        "\"embedding\":[0.5,-1]}],\"model\":\"e\",\"usage\":{\"prompt_tokens\":3,"
        "\"total_tokens\":3}}";
    struct end e;

    run_body(&e, NULL, LLM_OP_EMBED, 200, body, strlen(body));
    ck_assert_int_eq(e.res.verdict, OK);
    ck_assert(cJSON_IsArray(e.res.embedding));
    ck_assert_int_eq(cJSON_GetArraySize(e.res.embedding), 2);
    ck_assert_int_eq(e.res.embed_tokens, 3);
    ck_assert_ptr_null(e.res.text);
    end_release(&e);

    run_body(&e, NULL, LLM_OP_EMBED, 200, body, 40);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_ptr_null(e.res.embedding);
    ck_assert_int_eq(strncmp(e.msg, "bad embeddings response: ", 25), 0);
    end_release(&e);

    /* Anthropic has none: a provider that cannot answer, not a retry. */
    run_body(&e, &llm_provider_anthropic, LLM_OP_EMBED, 200, body, strlen(body));
    ck_assert_int_eq(e.res.verdict, P);
    ck_assert_str_eq(e.msg, "bad embeddings response: the provider has no embeddings");
    end_release(&e);
}
END_TEST

/* ------------------------------------------------------ transport and aborts */

START_TEST(test_transport)
{
    struct end e;

    ck_assert_int_eq(end_init(&e, NULL, LLM_OP_CHAT), 0);
    e.x.curl_code = 7;
    e.x.curl_msg = "Couldn't connect to server: Connection refused (127.0.0.1:9)";
    classify(&e);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_int_eq(e.res.code, CR_ELLM);
    ck_assert_int_eq(e.res.curl_code, 7);
    ck_assert_str_eq(e.res.exc_type, "APIConnectionError");
    ck_assert_str_eq(e.msg, e.x.curl_msg);
    ck_assert_int_eq(e.res.text_len, 0);
    end_release(&e);

    /* curl's own timeout, after a 200 and some text. */
    ck_assert_int_eq(end_init(&e, &llm_provider_anthropic, LLM_OP_CHAT), 0);
    e.x.curl_code = LLM_CURL_TIMEDOUT;
    e.x.status = 200;
    classify(&e);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_int_eq(e.res.code, CR_ETIMEDOUT);
    ck_assert_str_eq(e.res.exc_type, "APITimeoutError");
    end_release(&e);

    /* A bad certificate will not get better. */
    ck_assert_int_eq(end_init(&e, NULL, LLM_OP_EMBED), 0);
    e.x.curl_code = 60;
    classify(&e);
    ck_assert_int_eq(e.res.verdict, P);
    end_release(&e);

    /* Our own ends: a cancel is final, a phase timeout is retried. */
    ck_assert_int_eq(end_init(&e, NULL, LLM_OP_CHAT), 0);
    e.x.aborted = 1;
    e.x.abort_code = CR_ECANCELED;
    e.x.abort_exc = "TaskRevokedError";
    e.x.fail_msg = "revoked";
    e.x.curl_code = 42;
    classify(&e);
    ck_assert_int_eq(e.res.verdict, P);
    ck_assert_int_eq(e.res.code, CR_ECANCELED);
    ck_assert_str_eq(e.res.exc_type, "TaskRevokedError");
    ck_assert_str_eq(e.msg, "revoked");
    end_release(&e);

    ck_assert_int_eq(end_init(&e, &llm_provider_ollama, LLM_OP_CHAT), 0);
    e.x.aborted = 1;
    e.x.abort_code = CR_ETIMEDOUT;
    classify(&e);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_str_eq(e.res.exc_type, "APIError");
    ck_assert_str_eq(e.msg, "aborted");
    end_release(&e);

    /* A frame the reader refused: the exchange broke. */
    ck_assert_int_eq(end_init(&e, NULL, LLM_OP_CHAT), 0);
    e.x.status = 200;
    e.x.proto_error = 1;
    classify(&e);
    ck_assert_int_eq(e.res.verdict, R);
    ck_assert_str_eq(e.msg, "protocol error");
    end_release(&e);
}
END_TEST

/* A message longer than the buffer is cut, never overrun. */
START_TEST(test_message_cap)
{
    char body[2048], msg[64];
    struct end e;

    memset(body, 'x', sizeof(body));
    memcpy(body, "{\"error\":{\"message\":\"", 21);
    memcpy(body + sizeof(body) - 4, "\"}}", 3);
    body[sizeof(body) - 1] = '\0';
    ck_assert_int_eq(end_init(&e, NULL, LLM_OP_CHAT), 0);
    e.x.status = 400;
    e.x.body = body;
    e.x.body_len = strlen(body);
    llm_outcome(&e.x, &e.a, &e.res, msg, sizeof(msg));
    ck_assert_int_eq(strlen(msg), sizeof(msg) - 1);
    ck_assert_int_eq(e.res.verdict, P);
    end_release(&e);
}
END_TEST

/* Allocation failure anywhere while reading a body: never a crash, never a
 * success with part of the answer; the clean pass gives the exact outcome.
 * NEEDSWORK: cJSON cannot tell out of memory from bad syntax, so a whole 2xx
 * body that fails to parse for want of memory reads as malformed, which is
 * permanent; only the readers' own allocations read as retryable. */
START_TEST(test_oom_sweep)
{
    static const struct {
        const struct llm_provider *p;
        long status;
        const char *body;
        enum llm_verdict want;
    } cases[] = {
        {NULL, 200, completion, OK},
        {&llm_provider_openai, 200, completion, OK},
        {&llm_provider_anthropic, 529,
         "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":"
         "\"Overloaded\"}}",
         R},
        {&llm_provider_ollama, 404, "{\"error\":\"model not found\"}", P},
    };
    long n;

    for (n = 1; n < 1000; n++) {
        struct end e;
        long failed;

        cr_alloc_fail_after(n);
        if (end_init(&e, cases[_i].p, LLM_OP_CHAT)) {
            cr_alloc_fail_after(0);
            continue;
        }
        e.x.status = cases[_i].status;
        e.x.body = cases[_i].body;
        e.x.body_len = strlen(cases[_i].body);
        classify(&e);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            ck_assert_int_eq(e.res.verdict, cases[_i].want);
            end_release(&e);
            break;
        }
        if (e.res.verdict == OK) {
            ck_assert_int_eq(e.res.text_len, 2);
            ck_assert_int_eq(memcmp(e.res.text, "Hi", 2), 0);
        } else {
            ck_assert_ptr_nonnull(e.res.exc_type);
            ck_assert_int_eq(e.res.code, CR_ELLM);
        }
        end_release(&e);
    }
    ck_assert_int_lt(n, 1000);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("classify");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_error_bodies, 0, NBODY);
    tcase_add_loop_test(tc, test_error_bodies_cut, 0, NBODY);
    tcase_add_test(tc, test_openai_stream);
    tcase_add_loop_test(tc, test_openai_stream_cut, 0, 2);
    tcase_add_loop_test(tc, test_streams, 0, NSTREAM);
    tcase_add_loop_test(tc, test_streams_cut, 0, NSTREAM);
    tcase_add_loop_test(tc, test_whole_bodies, 0, 2);
    tcase_add_test(tc, test_embeddings);
    tcase_add_test(tc, test_transport);
    tcase_add_test(tc, test_message_cap);
    tcase_add_loop_test(tc, test_oom_sweep, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
