/* test_provider_azure.c -- Azure OpenAI: deployment URLs, api-version, the
 * api-key header, OpenAI streams with Azure's content-filter chunks, tool-call
 * fragments, errors. The OpenAI-compatible table shares the mapping; its
 * request building is tested here too. */
#include <check.h>
#include <string.h>

#include "llm/provider.h"
#include "util/alloc.h"

#include "provider_drive.h"

#define LIT(s) s, sizeof(s) - 1

static cJSON *json(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    ck_assert_msg(j != NULL, "bad test json: %s", s);
    return j;
}

START_TEST(test_build)
{
    static const char *const extra[] = {"x-ms-client-request-id: 1", NULL};
    struct llm_provider_config cfg = {.base_url = "https://res.openai.azure.com/",
                                      .api_key = "az-key-1234",
                                      .headers = extra};
    cJSON *req = json("{\"model\":\"azure/gpt4o-prod\",\"stream\":true,\"messages\":[{"
                      "\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":5}");
    struct llm_http_request hr;
    struct cr_err err = {0};

    llm_http_request_init(&hr);
    ck_assert_int_eq(
        llm_provider_azure.build(&cfg, LLM_OP_CHAT, req, "gpt4o-prod", &hr, &err), 0);
    ck_assert_str_eq(hr.url, "https://res.openai.azure.com/openai/deployments/gpt4o-prod/"
                             "chat/completions?api-version=2024-10-21");
    ck_assert_str_eq(hr.body,
                     "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"hi\"}],\"max_tokens\":5}");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_SSE);
    ck_assert_uint_eq(hr.nheaders, 4);
    ck_assert_str_eq(hr.headers[hr.auth_header], "api-key: az-key-1234");
    ck_assert_str_eq(hr.headers[2], "Accept: text/event-stream");
    ck_assert_str_eq(hr.headers[3], "x-ms-client-request-id: 1");
    llm_http_request_release(&hr);

    /* A configured deployment and version win; embeddings; base with /openai. */
    cfg.base_url = "https://res.openai.azure.com/openai";
    cfg.deployment = "emb-small";
    cfg.api_version = "2025-01-01-preview";
    ck_assert_int_eq(llm_provider_azure.build(&cfg, LLM_OP_EMBED, req, NULL, &hr, &err),
                     0);
    ck_assert_str_eq(hr.url, "https://res.openai.azure.com/openai/deployments/emb-small/"
                             "embeddings?api-version=2025-01-01-preview");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_JSON);
    llm_http_request_release(&hr);

    /* Names that would change the URL are refused. */
    cfg.deployment = "a/../b";
    ck_assert_int_eq(llm_provider_azure.build(&cfg, LLM_OP_CHAT, req, NULL, &hr, &err),
                     CR_EINVAL);
    llm_http_request_release(&hr);
    cfg.deployment = "ok";
    cfg.api_version = "1&x=2";
    ck_assert_int_eq(llm_provider_azure.build(&cfg, LLM_OP_CHAT, req, NULL, &hr, &err),
                     CR_EINVAL);
    llm_http_request_release(&hr);
    cfg.api_version = NULL;
    cfg.base_url = NULL;
    ck_assert_int_eq(llm_provider_azure.build(&cfg, LLM_OP_CHAT, req, NULL, &hr, &err),
                     CR_EINVAL);
    llm_http_request_release(&hr);
    cJSON_Delete(req);
}
END_TEST

/* Azure's stream: a first chunk with no choices and prompt_filter_results
 * (model ""), content chunks carrying content_filter_results, the finish,
 * then a usage chunk and [DONE]. */
#define AZURE_WIRE                                                                       \
    "data: {\"choices\":[],\"created\":0,\"id\":\"\",\"model\":\"\",\"object\":\"\","    \
    "\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{"        \
    "\"hate\":{\"filtered\":false,\"severity\":\"safe\"}}}]}\n\n"                        \
    "data: {\"choices\":[{\"content_filter_results\":{},\"delta\":{\"content\":\"\","    \
    "\"role\":\"assistant\"},\"finish_reason\":null,\"index\":0}],\"created\":1,\"id\":" \
    "\"chatcmpl-a\",\"model\":\"gpt-4o-2024-11-20\",\"object\":"                         \
    "\"chat.completion.chunk\"}\n\n"                                                     \
    "data: {\"choices\":[{\"content_filter_results\":{\"hate\":{\"filtered\":false,"     \
    "\"severity\":\"safe\"}},\"delta\":{\"content\":\"Hej\"},\"finish_reason\":null,"    \
    "\"index\":0}],\"created\":1,\"id\":\"chatcmpl-a\",\"model\":\"gpt-4o-2024-11-20\"," \
    "\"object\":\"chat.completion.chunk\"}\n\n"                                          \
    "data: {\"choices\":[{\"delta\":{\"content\":\" d\\u00e5\"},\"finish_reason\":null," \
    "\"index\":0}],\"model\":\"gpt-4o-2024-11-20\"}\n\n"                                 \
    "data: {\"choices\":[{\"content_filter_results\":{},\"delta\":{},\"finish_reason\":" \
    "\"stop\",\"index\":0}],\"model\":\"gpt-4o-2024-11-20\"}\n\n"                        \
    "data: {\"choices\":[],\"model\":\"gpt-4o-2024-11-20\",\"usage\":{"                  \
    "\"prompt_tokens\":8,\"completion_tokens\":2,\"total_tokens\":10}}\n\n"              \
    "data: [DONE]\n\n"

#define AZURE_TOOLS_WIRE                                                                 \
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":"    \
    "null,\"tool_calls\":[{\"index\":0,\"id\":\"call_x\",\"type\":\"function\","         \
    "\"function\":{\"name\":\"wx\",\"arguments\":\"\"}}]},\"finish_reason\":null}],"     \
    "\"model\":\"m\"}\n\n"                                                               \
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"          \
    "\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]},\"finish_reason\":null}]}\n\n"   \
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"          \
    "\"function\":{\"arguments\":\"\\\"Oslo\\\"}\"}}]},\"finish_reason\":null}]}\n\n"    \
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}"  \
    "\n\ndata: [DONE]\n\n"

static const long steps[] = {0, 1, 3, 17, -1};
#define NSTEPS ((int)(sizeof(steps) / sizeof(steps[0])))

START_TEST(test_build_openai)
{
    static const char *const extra[] = {"X-Gateway: g", NULL};
    struct llm_provider_config cfg = {
        .base_url = "http://gw:8080/v1", .api_key = "sk-1", .headers = extra};
    cJSON *req = json("{\"model\":\"smart\",\"stream\":true,\"messages\":[]}");
    struct llm_http_request hr;
    struct cr_err err = {0};

    llm_http_request_init(&hr);
    ck_assert_int_eq(
        llm_provider_openai.build(&cfg, LLM_OP_CHAT, req, "gpt-4o", &hr, &err), 0);
    ck_assert_str_eq(hr.url, "http://gw:8080/v1/chat/completions");
    /* the routed model replaces the task's name, in place */
    ck_assert_str_eq(hr.body, "{\"model\":\"gpt-4o\",\"stream\":true,\"messages\":[]}");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_SSE);
    ck_assert_str_eq(hr.headers[hr.auth_header], "Authorization: Bearer sk-1");
    ck_assert_str_eq(hr.headers[hr.nheaders - 1], "X-Gateway: g");
    llm_http_request_release(&hr);
    cfg.api_key = NULL;
    ck_assert_int_eq(llm_provider_openai.build(&cfg, LLM_OP_EMBED, req, NULL, &hr, &err),
                     0);
    ck_assert_str_eq(hr.url, "http://gw:8080/v1/embeddings");
    ck_assert_int_eq(hr.auth_header, -1);
    ck_assert_int_eq(hr.framing, LLM_FRAMING_JSON);
    llm_http_request_release(&hr);
    cfg.base_url = NULL;
    ck_assert_int_eq(llm_provider_openai.build(&cfg, LLM_OP_CHAT, req, NULL, &hr, &err),
                     CR_EINVAL);
    llm_http_request_release(&hr);
    cJSON_Delete(req);
    /* the default provider's prefix is never routed: gateways use it */
    {
        const char *bare;
        ck_assert_ptr_null(llm_provider_route("openai/gpt-4o", &bare));
        ck_assert_str_eq(bare, "openai/gpt-4o");
        ck_assert_ptr_eq(llm_provider_find("openai"), &llm_provider_openai);
    }
}
END_TEST

START_TEST(test_stream)
{
    struct llm_stream s;
    struct cr_err err = {0};
    struct buf d;

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    buf_init(&d);
    ck_assert_int_eq(drive(&s, LLM_FRAMING_SSE, LIT(AZURE_WIRE), steps[_i], &d, &err), 0);
    ck_assert_str_eq(s.reply.content.data, "Hej d\xc3\xa5");
    ck_assert_str_eq(d.data, "Hej d\xc3\xa5");
    ck_assert_str_eq(s.reply.model, "gpt-4o-2024-11-20");
    ck_assert_str_eq(s.reply.finish_reason, "stop");
    ck_assert_int_eq(s.reply.total_tokens, 10);
    ck_assert_int_eq(s.reply.done, 1);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    /* The OpenAI mapper keeps no copy of the text. */
    ck_assert_uint_eq(((struct openai_stream *)s.state)->content.len, 0);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_tools)
{
    struct llm_stream s;
    struct cr_err err = {0};

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    ck_assert_int_eq(
        drive(&s, LLM_FRAMING_SSE, LIT(AZURE_TOOLS_WIRE), steps[_i], NULL, &err), 0);
    ck_assert_uint_eq(s.reply.ntools, 1);
    ck_assert_str_eq(s.reply.tools[0].id, "call_x");
    ck_assert_str_eq(s.reply.tools[0].name, "wx");
    ck_assert_str_eq(s.reply.tools[0].arguments.data, "{\"city\":\"Oslo\"}");
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_errors)
{
    struct llm_stream s;
    struct cr_err err = {0};

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    ck_assert_int_eq(drive(&s, LLM_FRAMING_SSE,
                           LIT("data: {\"error\":{\"message\":\"Incorrect API key\","
                               "\"type\":\"invalid_request_error\",\"code\":"
                               "\"invalid_api_key\"}}\n\ndata: [DONE]\n\n"),
                           0, NULL, &err),
                     0);
    ck_assert_int_eq(s.reply.error, 1);
    ck_assert_int_eq(s.reply.err->kind, CHAT_ERROR_AUTH);
    ck_assert_int_eq(s.reply.err->in_stream, 1);
    ck_assert_int_eq(llm_error_status(s.reply.err, 200), 401);
    ck_assert_int_eq(llm_stream_complete(&s), 0);
    llm_stream_release(&s);

    /* vLLM-style integer code: the HTTP status it names. */
    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    ck_assert_int_eq(
        drive(
            &s, LLM_FRAMING_SSE,
            LIT("data: {\"error\":{\"message\":\"busy\",\"type\":\"ServiceUnavailable\","
                "\"code\":503}}\n\n"),
            1, NULL, &err),
        0);
    ck_assert_int_eq(llm_error_status(s.reply.err, 200), 503);
    ck_assert_int_eq(s.reply.err->kind, CHAT_ERROR_OVERLOADED);
    llm_stream_release(&s);

    /* Garbage is a mapper error. */
    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    ck_assert_int_eq(drive(&s, LLM_FRAMING_SSE, LIT("data: {nope\n\n"), 0, NULL, &err),
                     CR_EPROTO);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_whole_body_and_errors)
{
    const char *body =
        "{\"choices\":[{\"finish_reason\":\"content_filter\",\"index\":0,\"message\":{"
        "\"content\":\"partial\",\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c9\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}],"
        "\"model\":\"gpt-4o\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,"
        "\"total_tokens\":4},\"prompt_filter_results\":[]}";
    const char *filt =
        "{\"error\":{\"message\":\"The response was filtered\",\"type\":null,"
        "\"param\":\"prompt\",\"code\":\"content_filter\",\"status\":400,"
        "\"innererror\":{\"code\":\"ResponsibleAIPolicyViolation\"}}}";
    const char *quota =
        "{\"error\":{\"code\":\"insufficient_quota\",\"message\":\"no credit\","
        "\"type\":\"insufficient_quota\"}}";
    struct llm_stream s;
    struct cr_err err = {0};
    struct chat_error e;

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    ck_assert_int_eq(llm_stream_parse(&s, body, strlen(body), &err), 0);
    ck_assert_str_eq(s.reply.content.data, "partial");
    ck_assert_str_eq(s.reply.finish_reason, "content_filter");
    ck_assert_uint_eq(s.reply.ntools, 1);
    ck_assert_str_eq(s.reply.tools[0].id, "c9");
    ck_assert_int_eq(s.reply.total_tokens, 4);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    llm_stream_release(&s);

    llm_provider_azure.error_parse(400, filt, strlen(filt), &e);
    ck_assert_str_eq(e.code, "content_filter");
    ck_assert_int_eq(e.kind, CHAT_ERROR_BAD_REQUEST);
    ck_assert_int_eq(e.status, 400);
    llm_provider_azure.error_parse(429, quota, strlen(quota), &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_BILLING);
    ck_assert_int_eq(e.status, 429);
    llm_provider_azure.error_parse(429,
                                   LIT("{\"error\":{\"code\":\"429\",\"message\":"
                                       "\"Requests exceeded\"}}"),
                                   &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_RATE_LIMIT);
    llm_provider_azure.error_parse(401,
                                   LIT("{\"error\":{\"code\":\"401\",\"message\":"
                                       "\"Access denied due to invalid subscription "
                                       "key\"}}"),
                                   &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_AUTH);
    ck_assert_str_eq(llm_error_exc_type(&e), "AuthenticationError");
}
END_TEST

START_TEST(test_join_url)
{
    static const char *const v[][3] = {
        {"http://h", "/v1/messages", "http://h/v1/messages"},
        {"http://h/", "/v1/messages", "http://h/v1/messages"},
        {"http://h/v1", "/v1/messages", "http://h/v1/messages"},
        {"http://h/v1/", "v1/messages", "http://h/v1/messages"},
        {"http://h/proxy/v1", "/v1/messages", "http://h/proxy/v1/messages"},
        {"http://h/xv1", "/v1/messages", "http://h/xv1/v1/messages"},
        {"http://h/api", "/api/chat", "http://h/api/chat"},
        {"http://h:11434", "/api/embed", "http://h:11434/api/embed"},
    };
    size_t i;

    for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char *u = llm__join_url(v[i][0], v[i][1], NULL);
        ck_assert_str_eq(u, v[i][2]);
        cr_free(u);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("provider_azure");
    TCase *tc = tcase_create("azure");

    tcase_add_test(tc, test_build);
    tcase_add_test(tc, test_build_openai);
    tcase_add_loop_test(tc, test_stream, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_tools, 0, NSTEPS);
    tcase_add_test(tc, test_stream_errors);
    tcase_add_test(tc, test_whole_body_and_errors);
    tcase_add_test(tc, test_join_url);
    suite_add_tcase(s, tc);
    return s;
}
