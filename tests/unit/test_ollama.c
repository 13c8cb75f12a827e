/* test_ollama.c -- Ollama native: request building for chat, generate and
 * embed, NDJSON streams fed whole / byte by byte / in random pieces, tool
 * calls, errors, embeddings, bounds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/provider.h"
#include "protocol/ollama.h"
#include "unit.h"
#include "util/alloc.h"

#include "provider_drive.h"

#define FX "tests/fixtures/providers/"
/* A string literal and its length. */
#define LIT(s) s, sizeof(s) - 1

static cJSON *json(const char *s)
{
    cJSON *j = cJSON_Parse(s);
    ck_assert_msg(j != NULL, "bad test json: %s", s);
    return j;
}

/* ---------------------------------------------------------------- request */

START_TEST(test_build_chat_golden)
{
    cJSON *req = json(
        "{\"model\":\"llama3\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"What is \"},"
        "{\"type\":\"text\",\"text\":\"this?\"},{\"type\":\"image_url\",\"image_url\":"
        "{\"url\":\"data:image/png;base64,QUJD\"}}]},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\","
        "\"type\":"
        "\"function\",\"function\":{\"name\":\"look\",\"arguments\":\"{\\\"x\\\":1}\"}}]}"
        ","
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"a cat\"}],"
        "\"max_tokens\":50,\"temperature\":0.2,\"stop\":\"###\",\"seed\":7,"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"look\"}}],"
        "\"tool_choice\":\"auto\",\"n\":1,\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true},\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\"}}},"
        "\"options\":{\"num_ctx\":8192,\"seed\":9}}");
    const char *want =
        "{\"model\":\"llama3\",\"messages\":[{\"role\":\"system\",\"content\":\"Be "
        "brief.\"},"
        "{\"role\":\"user\",\"images\":[\"QUJD\"],\"content\":\"What is "
        "this?\"},{\"role\":"
        "\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"look\","
        "\"arguments\":{\"x\":1}}}]},{\"role\":\"tool\",\"content\":\"a "
        "cat\",\"tool_name\":"
        "\"look\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"look\"}}],"
        "\"format\":{\"type\":\"object\"},\"options\":{\"temperature\":0.2,"
        "\"num_predict\":50,\"stop\":[\"###\"],\"num_ctx\":8192,\"seed\":9},"
        "\"stream\":true}";
    struct cr_err err = {0};
    char *body;
    size_t len;

    ck_assert_int_eq(ollama_build_chat(req, NULL, 1, &body, &len, &err), 0);
    ck_assert_str_eq(body, want);
    ck_assert_uint_eq(len, strlen(want));
    cr_free(body);
    cJSON_Delete(req);
}
END_TEST

START_TEST(test_build_generate_and_embed)
{
    cJSON *req = json("{\"model\":\"ollama/llama3\",\"prompt\":[\"Once\",\"x\"],"
                      "\"max_completion_tokens\":8,\"response_format\":{\"type\":"
                      "\"json_object\"},\"suffix\":\"end\"}");
    struct cr_err err = {0};
    char *body;
    size_t len;

    ck_assert_int_eq(ollama_build_generate(req, "llama3", 0, &body, &len, &err), 0);
    ck_assert_str_eq(body, "{\"model\":\"llama3\",\"prompt\":\"Once\",\"suffix\":\"end\","
                           "\"format\":\"json\",\"options\":{\"num_predict\":8},"
                           "\"stream\":false}");
    cr_free(body);
    cJSON_Delete(req);

    req =
        json("{\"model\":\"nomic\",\"input\":[\"a\",\"b\"],\"encoding_format\":\"float\","
             "\"dimensions\":4}");
    ck_assert_int_eq(ollama_build_embed(req, NULL, &body, &len, &err), 0);
    ck_assert_str_eq(body,
                     "{\"model\":\"nomic\",\"input\":[\"a\",\"b\"],\"dimensions\":4}");
    cr_free(body);
    cJSON_Delete(req);

    req = json("{\"model\":\"nomic\",\"input\":[[1,2]]}");
    ck_assert_int_eq(ollama_build_embed(req, NULL, &body, &len, &err), CR_EINVAL);
    ck_assert_ptr_null(body);
    cJSON_Delete(req);
    req = json("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    ck_assert_int_eq(ollama_build_chat(req, NULL, 0, &body, &len, &err), CR_EINVAL);
    cJSON_Delete(req);
    req = json("{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}");
    ck_assert_int_eq(ollama_build_chat(req, NULL, 0, &body, &len, &err), CR_EINVAL);
    cJSON_Delete(req);
    req = json("{\"model\":\"m\",\"prompt\":3}");
    ck_assert_int_eq(ollama_build_generate(req, NULL, 0, &body, &len, &err), CR_EINVAL);
    cJSON_Delete(req);
}
END_TEST

START_TEST(test_provider_build)
{
    struct llm_provider_config cfg = {.base_url = "http://127.0.0.1:11434/api"};
    cJSON *chat =
        json("{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}]}");
    cJSON *gen = json("{\"model\":\"x\",\"prompt\":\"hi\"}");
    cJSON *emb = json("{\"model\":\"x\",\"input\":\"hi\"}");
    struct llm_http_request hr;
    struct cr_err err = {0};

    llm_http_request_init(&hr);
    ck_assert_int_eq(llm_provider_ollama.build(&cfg, LLM_OP_CHAT, chat, NULL, &hr, &err),
                     0);
    ck_assert_str_eq(hr.url, "http://127.0.0.1:11434/api/chat");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_NDJSON);
    ck_assert_uint_eq(hr.nheaders, 2);
    ck_assert_str_eq(hr.headers[1], "Accept: application/x-ndjson");
    ck_assert_int_eq(hr.auth_header, -1);
    llm_http_request_release(&hr);

    cfg.api_key = "ok-key";
    cfg.base_url = NULL;
    ck_assert_int_eq(llm_provider_ollama.build(&cfg, LLM_OP_CHAT, gen, NULL, &hr, &err),
                     0);
    ck_assert_str_eq(hr.url, "http://localhost:11434/api/generate");
    ck_assert_int_eq(hr.framing, LLM_FRAMING_JSON);
    ck_assert_str_eq(hr.headers[hr.auth_header], "Authorization: Bearer ok-key");
    ck_assert_ptr_nonnull(strstr(hr.body, "\"stream\":false"));
    llm_http_request_release(&hr);

    ck_assert_int_eq(llm_provider_ollama.build(&cfg, LLM_OP_EMBED, emb, NULL, &hr, &err),
                     0);
    ck_assert_str_eq(hr.url, "http://localhost:11434/api/embed");
    llm_http_request_release(&hr);
    cJSON_Delete(chat);
    cJSON_Delete(gen);
    cJSON_Delete(emb);
}
END_TEST

/* ----------------------------------------------------------------- stream */

static const long steps[] = {0, 1, 2, 3, 5, 11, 64, -1};
#define NSTEPS ((int)(sizeof(steps) / sizeof(steps[0])))

static void run_fixture(const char *name, long step, struct llm_stream *s, struct buf *d)
{
    struct cr_err err = {0};
    size_t len;
    char *wire = unit_read_file(name, &len);

    ck_assert_int_eq(llm_stream_init(s, &llm_provider_ollama, LLM_OP_CHAT), 0);
    buf_init(d);
    ck_assert_int_eq(drive(s, LLM_FRAMING_NDJSON, wire, len, step, d, &err), 0);
    free(wire);
}

START_TEST(test_stream_chat)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "ollama_chat.ndjson", steps[_i], &s, &d);
    ck_assert_str_eq(s.reply.content.data, "The sky \xc3\xa9 blue \xf0\x9f\x98\x80");
    ck_assert_str_eq(d.data, s.reply.content.data);
    ck_assert_str_eq(s.reply.finish_reason, "stop");
    ck_assert_str_eq(s.reply.model, "llama3.2");
    ck_assert_int_eq(s.reply.prompt_tokens, 26);
    ck_assert_int_eq(s.reply.completion_tokens, 298);
    ck_assert_int_eq(s.reply.total_tokens, 324);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_generate)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "ollama_generate.ndjson", steps[_i], &s, &d);
    ck_assert_str_eq(s.reply.content.data, "Once upon");
    ck_assert_str_eq(s.reply.finish_reason, "length");
    ck_assert_int_eq(s.reply.total_tokens, 7);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_tools)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "ollama_tool.ndjson", steps[_i], &s, &d);
    ck_assert_uint_eq(s.reply.content.len, 0);
    ck_assert_uint_eq(s.reply.ntools, 1);
    ck_assert_str_eq(s.reply.tools[0].id, "call_0");
    ck_assert_str_eq(s.reply.tools[0].name, "get_weather");
    ck_assert_str_eq(s.reply.tools[0].arguments.data, "{\"city\":\"Oslo\",\"days\":2}");
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_str_eq(s.reply.native_finish, "stop");
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_stream_error)
{
    struct llm_stream s;
    struct buf d;

    run_fixture(FX "ollama_error.ndjson", steps[_i], &s, &d);
    ck_assert_str_eq(s.reply.content.data, "Hi");
    ck_assert_int_eq(s.reply.error, 1);
    ck_assert_int_eq(s.reply.err->in_stream, 1);
    ck_assert_int_eq(s.reply.err->kind, CHAT_ERROR_SERVER);
    ck_assert_ptr_nonnull(strstr(s.reply.err->message, "unexpected EOF"));
    ck_assert_int_eq(llm_error_status(s.reply.err, 200), 500);
    ck_assert_int_eq(llm_stream_complete(&s), 0);
    buf_release(&d);
    llm_stream_release(&s);
}
END_TEST

static int feed1(struct chat_reply *r, const char *line, struct cr_err *err)
{
    return ollama_stream_feed(r, line, strlen(line), NULL, NULL, err);
}

START_TEST(test_stream_malformed)
{
    struct chat_reply r;
    struct cr_err err = {0};

    chat_reply_init(&r);
    ck_assert_int_eq(feed1(&r, "{\"message\":", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "\"done\"", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "{}{}", &err), CR_EPROTO);
    ck_assert_int_eq(feed1(&r, "   ", &err), 0);
    /* Wrong types are ignored. */
    ck_assert_int_eq(feed1(&r, "{\"message\":{\"content\":5},\"done\":\"yes\"}", &err),
                     0);
    ck_assert_int_eq(feed1(&r, "{\"message\":\"x\",\"response\":[1]}", &err), 0);
    ck_assert_int_eq(feed1(&r, "{\"message\":{\"tool_calls\":{\"a\":1}}}", &err), 0);
    ck_assert_uint_eq(r.content.len, 0);
    ck_assert_int_eq(r.done, 0);
    ck_assert_int_eq(ollama_stream_complete(&r), 0);
    /* Huge counts are clamped; negative ones unknown. */
    ck_assert_int_eq(
        feed1(&r,
              "{\"done\":true,\"done_reason\":\"unload\",\"prompt_eval_count\":"
              "1e300,\"eval_count\":-3}",
              &err),
        0);
    ck_assert_int_eq(r.prompt_tokens, 1000000000000000L);
    ck_assert_int_eq(r.completion_tokens, -1);
    ck_assert_int_eq(r.total_tokens, -1);
    ck_assert_str_eq(r.finish_reason, "stop");
    ck_assert_str_eq(r.native_finish, "unload");
    chat_reply_release(&r);

    chat_reply_init(&r);
    ck_assert_int_eq(feed1(&r, "{\"done\":true,\"done_reason\":\"weird\"}", &err), 0);
    ck_assert_str_eq(r.finish_reason, "weird");
    chat_reply_release(&r);

    chat_reply_init(&r);
    r.max_content_bytes = 3;
    ck_assert_int_eq(feed1(&r, "{\"response\":\"abcd\"}", &err), CR_ETOOBIG);
    chat_reply_release(&r);
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
    char *wire = unit_read_file(FX "fake_ollama_tools.ndjson", &len);
    int i;

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_ollama, LLM_OP_CHAT), 0);
    buf_init(&d);
    ck_assert_int_eq(drive(&s, LLM_FRAMING_NDJSON, wire, len, steps[_i], &d, &err), 0);
    ck_assert_str_eq(s.reply.content.data, FAKE_TEXT);
    ck_assert_str_eq(d.data, FAKE_TEXT);
    ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
    ck_assert_int_eq(s.reply.completion_tokens, 12);
    ck_assert_uint_eq(s.reply.ntools, 1);
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

START_TEST(test_whole_body)
{
    struct llm_stream s;
    struct cr_err err = {0};
    const char *body =
        "{\"model\":\"llama3\",\"created_at\":\"t\",\"message\":{\"role\":"
        "\"assistant\",\"content\":\"Hello!\"},\"done\":true,"
        "\"done_reason\":\"stop\",\"prompt_eval_count\":3,\"eval_count\":2}";

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_ollama, LLM_OP_CHAT), 0);
    ck_assert_int_eq(llm_stream_parse(&s, body, strlen(body), &err), 0);
    ck_assert_str_eq(s.reply.content.data, "Hello!");
    ck_assert_int_eq(s.reply.total_tokens, 5);
    ck_assert_int_eq(llm_stream_complete(&s), 1);
    llm_stream_release(&s);

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_ollama, LLM_OP_CHAT), 0);
    ck_assert_int_eq(
        llm_stream_parse(&s, LIT("{\"error\":\"model 'x' not found\"}"), &err), 0);
    ck_assert_int_eq(s.reply.error, 1);
    ck_assert_int_eq(s.reply.err->in_stream, 0);
    ck_assert_int_eq(llm_stream_parse(&s, "not json", 8, &err), CR_EPROTO);
    llm_stream_release(&s);
}
END_TEST

START_TEST(test_error_body)
{
    struct chat_error e;

    llm_provider_ollama.error_parse(
        404, LIT("{\"error\":\"model \\\"x\\\" not found, try pulling it first\"}"), &e);
    ck_assert_str_eq(e.message, "model \"x\" not found, try pulling it first");
    ck_assert_int_eq(e.kind, CHAT_ERROR_NOT_FOUND);
    ck_assert_int_eq(e.status, 404);
    llm_provider_ollama.error_parse(
        503, LIT("server busy, please try again.  maximum pending requests exceeded\n"),
        &e);
    ck_assert_int_eq(e.kind, CHAT_ERROR_OVERLOADED);
    ck_assert_ptr_nonnull(strstr(e.message, "maximum pending"));
    llm_provider_ollama.error_parse(
        400, LIT("{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\"}}"),
        &e);
    ck_assert_str_eq(e.message, "bad");
    ck_assert_str_eq(e.type, "invalid_request_error");
    ck_assert_int_eq(e.kind, CHAT_ERROR_BAD_REQUEST);
}
END_TEST

START_TEST(test_embed_parse)
{
    const char *body = "{\"model\":\"nomic\",\"embeddings\":[[0.5,-1],[2,3]],"
                       "\"total_duration\":1,\"prompt_eval_count\":4}";
    struct cr_err err = {0};
    long pt;
    cJSON *v;
    char *txt;

    v = llm_provider_ollama.embed_parse(body, strlen(body), 1, &pt, &err);
    ck_assert_ptr_nonnull(v);
    txt = cJSON_PrintUnformatted(v);
    ck_assert_str_eq(txt, "[[0.5,-1],[2,3]]");
    ck_assert_int_eq(pt, 4);
    cr_free(txt);
    cJSON_Delete(v);
    v = llm_provider_ollama.embed_parse(body, strlen(body), 0, &pt, &err);
    txt = cJSON_PrintUnformatted(v);
    ck_assert_str_eq(txt, "[0.5,-1]");
    cr_free(txt);
    cJSON_Delete(v);
    ck_assert_ptr_null(
        ollama_embed_parse(LIT("{\"embeddings\":[[\"a\"]]}"), 1, &pt, &err));
    ck_assert_ptr_null(ollama_embed_parse(LIT("{\"embeddings\":[]}"), 0, &pt, &err));
    ck_assert_ptr_null(ollama_embed_parse(LIT("{\"error\":\"no model\"}"), 0, &pt, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "no model"));
    ck_assert_ptr_null(ollama_embed_parse("{", 1, 0, &pt, &err));
}
END_TEST

/* Every allocation failing in turn: an error on each failing pass, never a
 * crash or a leak (ASan checks the leaks), and on the first pass where
 * nothing failed the whole reply, reached well within the bound. */
START_TEST(test_oom_sweep)
{
    size_t len;
    char *wire = unit_read_file(FX "ollama_tool.ndjson", &len);
    long n;

    for (n = 1; n < 300; n++) {
        struct llm_stream s;
        struct cr_err err = {0};
        long failed;
        int init, rc;
        cr_alloc_fail_after(n);
        rc = init = llm_stream_init(&s, &llm_provider_ollama, LLM_OP_CHAT);
        if (init == 0)
            rc = drive(&s, LLM_FRAMING_NDJSON, wire, len, 0, NULL, &err);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_uint_eq(s.reply.ntools, 1);
            ck_assert_str_eq(s.reply.tools[0].name, "get_weather");
            ck_assert_str_eq(s.reply.tools[0].arguments.data,
                             "{\"city\":\"Oslo\",\"days\":2}");
            ck_assert_str_eq(s.reply.finish_reason, "tool_calls");
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
    ck_assert_int_lt(n, 300);
    free(wire);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("ollama");
    TCase *tc = tcase_create("ollama");

    tcase_add_test(tc, test_build_chat_golden);
    tcase_add_test(tc, test_build_generate_and_embed);
    tcase_add_test(tc, test_provider_build);
    tcase_add_loop_test(tc, test_stream_chat, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_generate, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_tools, 0, NSTEPS);
    tcase_add_loop_test(tc, test_stream_error, 0, NSTEPS);
    tcase_add_test(tc, test_stream_malformed);
    tcase_add_loop_test(tc, test_fake_capture, 0, NSTEPS);
    tcase_add_test(tc, test_whole_body);
    tcase_add_test(tc, test_error_body);
    tcase_add_test(tc, test_embed_parse);
    tcase_add_test(tc, test_oom_sweep);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}
