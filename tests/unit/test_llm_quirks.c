/* test_llm_quirks.c -- what real servers do to a stream: the SSE sniff,
 * in-stream error classification, surrogate pairs split across deltas, extra
 * request headers (--llm-header) and error detail. */
#include <check.h>
#include <stddef.h>
#include <string.h>

#include "llm/llm_client.h"
#include "llm/policy.h"
#include "llm/provider.h"
#include "protocol/openai.h"
#include "protocol/sse.h"
#include "util/alloc.h"
#include "util/err.h"
#include "util/opts.h"
#include "worker/config.h"

/* ------------------------------------------------------------------ sniff */

static const struct {
    const char *in;
    int more; /* without at_end */
    int end;  /* with at_end */
} sniff_vec[] = {
    {"", -1, 0},
    {"data: {\"x\":1}\n\n", 1, 1},
    {"data:{}\n", 1, 1},
    {"data\n", 1, 1},
    {"data", -1, 1},
    {"dat", -1, 0},
    {"d", -1, 0},
    {"event: message\n", 1, 1},
    {"id: 7\n", 1, 1},
    {"retry: 3000\r\n", 1, 1},
    {": ping\n\n", 1, 1},
    {":", 1, 1},
    {"\xEF\xBB\xBF"
     "data: x\n",
     1, 1},
    {"\xEF\xBB", -1, 0},
    {"\r\n\n\ndata: x\n", 1, 1},
    {"\n\n", -1, 0},
    {"{\"choices\":[]}", 0, 0},
    {" {\"x\":1}", 0, 0},
    {"<html>", 0, 0},
    {"database error", 0, 0},
    {"datum: 1\n", 0, 0},
    {"Data: x\n", 0, 0},
    {" data: x\n", 0, 0},
    {"error: {}\n", 0, 0},
    {"identity\n", 0, 0},
};

START_TEST(test_sniff_vectors)
{
    const char *in = sniff_vec[_i].in;
    size_t n = strlen(in);

    ck_assert_msg(sse_sniff(in, n, 0) == sniff_vec[_i].more, "'%s' more", in);
    ck_assert_msg(sse_sniff(in, n, 1) == sniff_vec[_i].end, "'%s' end", in);
}
END_TEST

/* Byte by byte, a prefix never contradicts the whole: it is undecided or it
 * already says what the whole says. */
START_TEST(test_sniff_prefixes)
{
    const char *in = sniff_vec[_i].in;
    size_t n = strlen(in), k;
    int whole = sse_sniff(in, n, 1);

    for (k = 0; k <= n; k++) {
        int v = sse_sniff(in, k, 0);
        ck_assert_msg(v == -1 || v == whole, "'%s' prefix %zu: %d vs %d", in, k, v,
                      whole);
    }
}
END_TEST

START_TEST(test_sniff_bounded)
{
    static char blank[SSE_SNIFF_BYTES * 4];

    memset(blank, '\n', sizeof(blank));
    /* Blank lines alone for longer than the window: not a stream. */
    ck_assert_int_eq(sse_sniff(blank, sizeof(blank), 0), 0);
    ck_assert_int_eq(sse_sniff(blank, SSE_SNIFF_BYTES / 2, 0), -1);
    ck_assert_int_eq(sse_sniff(NULL, 0, 1), 0);
}
END_TEST

/* ---------------------------------------------------- in-stream errors */

#define CHUNK(text)                                                                      \
    "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":"    \
    "[{\"index\":0,\"delta\":{\"content\":\"" text "\"},\"finish_reason\":null}]}"

static const struct {
    const char *error; /* the payload */
    enum llm_verdict verdict;
    long status;
} err_vec[] = {
    {"{\"error\":{\"message\":\"bad key\",\"type\":\"invalid_request_error\","
     "\"code\":\"invalid_api_key\",\"param\":null}}",
     LLM_PERMANENT, 401},
    {"{\"error\":{\"message\":\"no credit\",\"type\":\"insufficient_quota\","
     "\"code\":\"insufficient_quota\"}}",
     LLM_PERMANENT, 429},
    {"{\"error\":{\"message\":\"too long\",\"type\":\"invalid_request_error\","
     "\"code\":\"context_length_exceeded\"}}",
     LLM_PERMANENT, 400},
    {"{\"error\":{\"message\":\"x\",\"type\":\"BadRequestError\",\"code\":400}}",
     LLM_PERMANENT, 400},
    {"{\"error\":{\"message\":\"x\",\"type\":\"authentication_error\"}}", LLM_PERMANENT,
     401},
    {"{\"error\":{\"message\":\"x\",\"type\":\"permission_error\"}}", LLM_PERMANENT, 403},
    {"{\"error\":{\"message\":\"busy\",\"type\":\"overloaded_error\"}}", LLM_RETRYABLE,
     529},
    {"{\"error\":{\"message\":\"slow\",\"type\":\"requests\","
     "\"code\":\"rate_limit_exceeded\"}}",
     LLM_RETRYABLE, 429},
    {"{\"error\":{\"message\":\"oops\",\"type\":\"server_error\"}}", LLM_RETRYABLE, 500},
    {"{\"error\":{\"message\":\"x\",\"type\":\"InternalServerError\",\"code\":500}}",
     LLM_RETRYABLE, 500},
    {"{\"error\":{\"message\":\"x\",\"code\":503,\"type\":\"unavailable_error\"}}",
     LLM_RETRYABLE, 503},
    {"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"o\"}}",
     LLM_RETRYABLE, 529},
    {"{\"object\":\"error\",\"message\":\"m\",\"type\":\"BadRequestError\",\"code\":400}",
     LLM_PERMANENT, 400},
    /* Names no class: a broken stream, retried. */
    {"{\"error\":{\"message\":\"huh\",\"type\":\"weird\"}}", LLM_RETRYABLE, 0},
    {"{\"error\":\"runner died\"}", LLM_RETRYABLE, 0},
};

/* What llm_client.c decides for an error seen in a 200 stream. */
static enum llm_verdict verdict_of(const struct openai_stream *s, long *status)
{
    *status = openai_error_status(s->error_type, s->error_code);
    if (*status)
        return llm_classify(0, *status, s->error_code, s->error_type, NULL, 0);
    return llm_classify(0, 200, s->error_code, s->error_type, NULL, 1);
}

static void feed_wire(struct openai_stream *s, const char *wire, size_t step)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    struct cr_err err;
    size_t i, n = strlen(wire);
    int rc;

    ck_assert_ptr_nonnull(p);
    for (i = 0; i < n; i += step) {
        size_t k = n - i < step ? n - i : step;
        ck_assert_int_eq(sse_feed(p, wire + i, k), 0);
        while ((rc = sse_next(p, &ev)) == 1)
            ck_assert_int_eq(
                openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err), 0);
        ck_assert_int_eq(rc, 0);
    }
    if (sse_finish(p, &ev) == 1)
        openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err);
    sse_parser_free(p);
}

START_TEST(test_stream_error_classes)
{
    /* Each error after some text, with and without [DONE], whole and byte by byte. */
    for (int done = 0; done < 2; done++) {
        for (size_t step = 1; step <= 4096; step *= 4096) {
            char wire[2048];
            struct openai_stream s;
            long status;

            snprintf(wire, sizeof(wire), "data: " CHUNK("Hi") "\n\ndata: %s\n\n%s",
                     err_vec[_i].error, done ? "data: [DONE]\n\n" : "");
            openai_stream_init(&s);
            feed_wire(&s, wire, step);
            ck_assert_int_eq(s.error, 1);
            ck_assert_int_eq(s.done, done);
            ck_assert(!openai_stream_complete(&s));
            ck_assert_int_eq(verdict_of(&s, &status), err_vec[_i].verdict);
            ck_assert_int_eq(status, err_vec[_i].status);
            openai_stream_release(&s);
        }
    }
}
END_TEST

START_TEST(test_error_status_names)
{
    ck_assert_int_eq(openai_error_status(NULL, NULL), 0);
    ck_assert_int_eq(openai_error_status("", ""), 0);
    /* The code is the more precise of the two. */
    ck_assert_int_eq(openai_error_status("invalid_request_error", "invalid_api_key"),
                     401);
    ck_assert_int_eq(openai_error_status("requests", "insufficient_quota"), 429);
    ck_assert_int_eq(openai_error_status("x", "404"), 404);
    ck_assert_int_eq(openai_error_status("x", "4040"), 0);
    ck_assert_int_eq(openai_error_status("x", "200"), 0);
    ck_assert_int_eq(openai_error_status("x", "40x"), 0);
    ck_assert_int_eq(openai_error_status("timeout", NULL), 504);
    /* A quota 429 is never retried, whatever else says so. */
    ck_assert_int_eq(
        llm_classify(0, 429, "insufficient_quota", "insufficient_quota", NULL, 0),
        LLM_PERMANENT);
}
END_TEST

/* ------------------------------------------------------------ surrogates */

#define ROLE                                                                             \
    "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"    \
    "\"finish_reason\":null}]}"
#define EMPTY "{\"id\":\"x\",\"choices\":[]}"
#define FINISH "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}"
#define FIN_TEXT(text)                                                                   \
    "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" text "\"},"                   \
    "\"finish_reason\":\"stop\"}]}"

static const struct {
    const char *name;
    const char *payloads[6]; /* NULL-terminated */
    const char *text;        /* content at the end */
    const char *deltas[6];   /* each payload's delta */
} sur_vec[] = {
    {"pair split",
     {CHUNK("a\\ud83d"), CHUNK("\\ude00b"), "[DONE]"},
     "a\xF0\x9F\x98\x80"
     "b",
     {"a",
      "\xF0\x9F\x98\x80"
      "b",
      ""}},
    {"pair split, upper case hex",
     {CHUNK("\\uD83D"), CHUNK("\\uDE80"), FINISH},
     "\xF0\x9F\x9A\x80",
     {"", "\xF0\x9F\x9A\x80", ""}},
    {"empty deltas between the halves",
     {CHUNK("\\ud83d"), EMPTY, ROLE, CHUNK("\\ude00"), "[DONE]"},
     "\xF0\x9F\x98\x80",
     {"", "", "", "\xF0\x9F\x98\x80", ""}},
    {"pair whole in one chunk",
     {CHUNK("x\\ud83d\\ude00y"), FINISH},
     "x\xF0\x9F\x98\x80y",
     {"x\xF0\x9F\x98\x80y", ""}},
    {"two pairs split, one joined inside",
     {CHUNK("\\ud83d"), CHUNK("\\ude00\\ud83d"), CHUNK("\\ude80!"), FINISH},
     "\xF0\x9F\x98\x80\xF0\x9F\x9A\x80!",
     {"", "\xF0\x9F\x98\x80", "\xF0\x9F\x9A\x80!", ""}},
    {"held high, then plain text",
     {CHUNK("a\\ud83d"), CHUNK("b"), "[DONE]"},
     "a\xEF\xBF\xBD"
     "b",
     {"a",
      "\xEF\xBF\xBD"
      "b",
      ""}},
    {"held high, then [DONE]",
     {CHUNK("a\\ud83d"), "[DONE]"},
     "a\xEF\xBF\xBD",
     {"a", "\xEF\xBF\xBD"}},
    {"held high, then the finish chunk",
     {CHUNK("a\\ud83d"), FINISH},
     "a\xEF\xBF\xBD",
     {"a", "\xEF\xBF\xBD"}},
    {"high in the finishing chunk",
     {FIN_TEXT("a\\ud83d")},
     "a\xEF\xBF\xBD",
     {"a\xEF\xBF\xBD"}},
    {"lone low",
     {CHUNK("a\\ude00b"), FINISH},
     "a\xEF\xBF\xBD"
     "b",
     {"a\xEF\xBF\xBD"
      "b",
      ""}},
    {"high inside text",
     {CHUNK("a\\ud83db"), FINISH},
     "a\xEF\xBF\xBD"
     "b",
     {"a\xEF\xBF\xBD"
      "b",
      ""}},
    {"two highs in a row",
     {CHUNK("\\ud83d\\ud83d"), CHUNK("\\ude00"), FINISH},
     "\xEF\xBF\xBD\xF0\x9F\x98\x80",
     {"\xEF\xBF\xBD", "\xF0\x9F\x98\x80", ""}},
    {"escaped backslash is not an escape",
     {CHUNK("\\\\ud83d"), FINISH},
     "\\ud83d",
     {"\\ud83d", ""}},
    {"hangul keeps its ED lead byte",
     {CHUNK("\xED\x95\x9C\\ud83d"), CHUNK("\\ude00"), FINISH},
     "\xED\x95\x9C\xF0\x9F\x98\x80",
     {"\xED\x95\x9C", "\xF0\x9F\x98\x80", ""}},
};

static void check_surrogates(int i, int fast, int azure)
{
    struct openai_stream s;
    struct cr_err err;
    char all[256] = "";
    int k;

    openai_stream_init(&s);
    for (k = 0; sur_vec[i].payloads[k]; k++) {
        const char *p = sur_vec[i].payloads[k];
        const char *d;
        size_t n;
        int rc = fast ? openai_stream_feed(&s, p, strlen(p), &d, &n, &err)
                      : openai__stream_feed_json(&s, p, strlen(p), &d, &n, &err);
        ck_assert_msg(rc == 0, "%s: payload %d: %s", sur_vec[i].name, k, err.msg);
        ck_assert_msg(n == strlen(sur_vec[i].deltas[k]) &&
                          memcmp(d, sur_vec[i].deltas[k], n) == 0,
                      "%s: delta %d is '%.*s'", sur_vec[i].name, k, (int)n, d);
        strncat(all, d, n);
        /* The Azure adapter moves the text out after every feed. */
        if (azure)
            buf_reset(&s.content);
    }
    if (!azure)
        ck_assert_str_eq(s.content.data ? s.content.data : "", sur_vec[i].text);
    ck_assert_str_eq(all, sur_vec[i].text);
    ck_assert_uint_eq(s.held_surrogate, 0);
    openai_stream_release(&s);
}

START_TEST(test_surrogates)
{
    check_surrogates(_i, 1, 0);
    check_surrogates(_i, 0, 0);
    check_surrogates(_i, 1, 1);
}
END_TEST

/* The same streams on the wire, fed byte by byte through the SSE parser. */
START_TEST(test_surrogates_byte_by_byte)
{
    char wire[2048] = "";
    struct openai_stream s;

    for (int k = 0; sur_vec[_i].payloads[k]; k++) {
        strcat(wire, "data: ");
        strcat(wire, sur_vec[_i].payloads[k]);
        strcat(wire, "\r\n\r\n");
    }
    openai_stream_init(&s);
    feed_wire(&s, wire, 1);
    openai_stream_end(&s, NULL, NULL);
    ck_assert_str_eq(s.content.data ? s.content.data : "", sur_vec[_i].text);
    openai_stream_release(&s);
}
END_TEST

START_TEST(test_surrogate_end_and_body)
{
    struct openai_stream s;
    struct cr_err err;
    const char *d;
    size_t n;
    static const char body[] = "{\"choices\":[{\"index\":0,\"message\":{\"role\":"
                               "\"assistant\",\"content\":\"a\\ud83d\"},"
                               "\"finish_reason\":\"stop\"}]}";

    /* A stream cut after a high surrogate: openai_stream_end() flushes it. */
    openai_stream_init(&s);
    ck_assert_int_eq(
        openai_stream_feed(&s, CHUNK("\\ud83d"), strlen(CHUNK("\\ud83d")), &d, &n, &err),
        0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(openai_stream_end(&s, &d, &n), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(memcmp(d, "\xEF\xBF\xBD", 3), 0);
    ck_assert_int_eq(openai_stream_end(&s, &d, &n), 0);
    ck_assert_uint_eq(n, 0);
    openai_stream_release(&s);

    /* A whole body with a lone surrogate parses, with U+FFFD. */
    openai_stream_init(&s);
    ck_assert_int_eq(openai_chat_parse(&s, body, strlen(body), &err), 0);
    ck_assert_str_eq(s.content.data, "a\xEF\xBF\xBD");
    openai_stream_release(&s);

    /* A malformed escape still fails as before. */
    openai_stream_init(&s);
    ck_assert_int_eq(
        openai_stream_feed(&s, CHUNK("\\ud8"), strlen(CHUNK("\\ud8")), &d, &n, &err),
        CR_EPROTO);
    openai_stream_release(&s);
}
END_TEST

/* Out of room for the content: the joined or replaced text fails cleanly. */
START_TEST(test_surrogate_cap)
{
    struct openai_stream s;
    struct cr_err err;
    int rc;

    openai_stream_init(&s);
    s.content.max_bytes = 4; /* "a" and the 3 bytes held, not "a" and U+FFFD */
    ck_assert_int_eq(openai_stream_feed(&s, CHUNK("a\\ud83d"), strlen(CHUNK("a\\ud83d")),
                                        NULL, NULL, &err),
                     0);
    rc = openai_stream_feed(&s, CHUNK("b"), strlen(CHUNK("b")), NULL, NULL, &err);
    ck_assert_int_eq(rc, CR_ETOOBIG);
    openai_stream_release(&s);
}
END_TEST

/* Through the Azure adapter, which moves the text out of the openai_stream
 * after every frame: the held half must survive that. */
START_TEST(test_surrogates_azure)
{
    struct llm_stream s;
    struct cr_err err;
    char all[256] = "";

    ck_assert_int_eq(llm_stream_init(&s, &llm_provider_azure, LLM_OP_CHAT), 0);
    for (int k = 0; sur_vec[_i].payloads[k]; k++) {
        const char *p = sur_vec[_i].payloads[k];
        struct llm_frame f = {NULL, 0, p, strlen(p)};
        const char *d;
        size_t n;
        ck_assert_int_eq(llm_stream_feed(&s, &f, &d, &n, &err), 0);
        ck_assert_msg(n == strlen(sur_vec[_i].deltas[k]) &&
                          memcmp(d, sur_vec[_i].deltas[k], n) == 0,
                      "%s: delta %d is '%.*s'", sur_vec[_i].name, k, (int)n, d);
        strncat(all, d, n);
    }
    ck_assert_str_eq(all, sur_vec[_i].text);
    ck_assert_str_eq(s.reply.content.data ? s.reply.content.data : "", sur_vec[_i].text);
    llm_stream_release(&s);
}
END_TEST

/* --------------------------------------------------------------- headers */

static const struct {
    const char *line;
    int ok;
} hdr_vec[] = {
    {"X-Gateway-Key: abc", 1},
    {"X-Tags: a, b, c", 1},
    {"x:y", 1},
    {"X-Empty:", 1},
    {"Helicone-Auth: Bearer sk-1: with colon", 1},
    {"NoColon", 0},
    {": value", 0},
    {"Bad Name: v", 0},
    {"Bad\tName: v", 0},
    {"X-A: one\r\nX-B: two", 0},
    {"X-A: one\ntwo", 0},
    {"X-A: one\r", 0},
    {"X(A): v", 0},
    {"", 0},
};

START_TEST(test_header_check)
{
    struct cr_err err;
    int rc;

    memset(&err, 0, sizeof(err));
    rc = llm_header_check(hdr_vec[_i].line, &err);
    ck_assert_msg((rc == 0) == hdr_vec[_i].ok, "'%s': %d %s", hdr_vec[_i].line, rc,
                  err.msg);
    if (!hdr_vec[_i].ok) {
        ck_assert_int_eq(rc, CR_EINVAL);
        /* The value is never quoted: it may be a secret. */
        const char *colon = strchr(hdr_vec[_i].line, ':');
        if (colon && colon[1] && strlen(colon + 1) > 2)
            ck_assert_ptr_null(strstr(err.msg, colon + 1));
    }
}
END_TEST

struct lines {
    struct opts_list h;
};

static const struct opt lopts[] = {
    {"llm-header", 0, "T_HEADERS", OPTS_LINES, offsetof(struct lines, h), NULL, 0, 0,
     "header"},
};
static const struct opts_spec lspec = {.opts = lopts, .n = 1, .head = "", .width = 10};

START_TEST(test_lines_option)
{
    char env1[] = "T_HEADERS=X-A: 1, 2\r\n\nX-B: b\n";
    char *envp[] = {env1, NULL};
    char a0[] = "t", a1[] = "--llm-header", a2[] = "X-C: c, d",
         a3[] = "--llm-header=X-D: e";
    char *argv[] = {a0, a1, a2, a3, NULL};
    struct lines l;
    struct cr_err err;

    /* The environment: one per line, CR before LF dropped, blank lines skipped. */
    memset(&l, 0, sizeof(l));
    ck_assert_int_eq(opts_parse(&lspec, &l, 1, argv, envp, NULL, NULL, &err), 0);
    ck_assert_int_eq(l.h.n, 2);
    ck_assert_str_eq(l.h.items[0], "X-A: 1, 2");
    ck_assert_str_eq(l.h.items[1], "X-B: b");
    ck_assert_ptr_null(l.h.items[2]);
    opts_release(&lspec, &l);

    /* The command line: each value whole (commas kept), replacing the env. */
    memset(&l, 0, sizeof(l));
    ck_assert_int_eq(opts_parse(&lspec, &l, 4, argv, envp, NULL, NULL, &err), 0);
    ck_assert_int_eq(l.h.n, 2);
    ck_assert_str_eq(l.h.items[0], "X-C: c, d");
    ck_assert_str_eq(l.h.items[1], "X-D: e");
    opts_release(&lspec, &l);
}
END_TEST

/* The worker's own table: a malformed header stops start-up with a reason. */
START_TEST(test_worker_refuses_bad_header)
{
    static const struct {
        const char *value;
        const char *why;
    } bad[] = {
        {"NoColon", "want 'Name: value'"},
        {"X-A: 1\nX-B: 2", "CR or LF"},
        {"X A: 1", "invalid --llm-header name"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char a0[] = "celeriac", a1[] = "--llm-header";
        char *argv[] = {a0, a1, (char *)bad[i].value, NULL};
        struct config cfg;
        struct cr_err err;

        memset(&cfg, 0, sizeof(cfg));
        memset(&err, 0, sizeof(err));
        ck_assert_int_eq(config_load(&cfg, 3, argv, &err), CR_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].why), "'%s': %s", bad[i].value, err.msg);
        config_release(&cfg);
    }
}
END_TEST

/* ---------------------------------------------------------- error detail */

START_TEST(test_error_detail)
{
    struct openai_error e;
    static const char both[] = "{\"error\":\"Unauthorized\",\"message\":\"key revoked\"}";
    static const char same[] =
        "{\"error\":\"Unauthorized\",\"message\":\"Unauthorized\"}";
    static const char oai[] = "{\"error\":{\"message\":\"Incorrect key\",\"type\":"
                              "\"invalid_request_error\",\"param\":\"model\",\"code\":"
                              "\"invalid_api_key\"}}";

    openai_error_parse(both, strlen(both), &e);
    ck_assert_str_eq(e.message, "Unauthorized: key revoked");
    openai_error_parse(same, strlen(same), &e);
    ck_assert_str_eq(e.message, "Unauthorized");
    openai_error_parse(oai, strlen(oai), &e);
    ck_assert_str_eq(e.message, "Incorrect key");
    ck_assert_str_eq(e.type, "invalid_request_error");
    ck_assert_str_eq(e.code, "invalid_api_key");
    ck_assert_str_eq(e.param, "model");
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("llm_quirks");
    TCase *tc = tcase_create("core");
    int nsniff = (int)(sizeof(sniff_vec) / sizeof(sniff_vec[0]));

    tcase_add_loop_test(tc, test_sniff_vectors, 0, nsniff);
    tcase_add_loop_test(tc, test_sniff_prefixes, 0, nsniff);
    tcase_add_test(tc, test_sniff_bounded);
    tcase_add_loop_test(tc, test_stream_error_classes, 0,
                        (int)(sizeof(err_vec) / sizeof(err_vec[0])));
    tcase_add_test(tc, test_error_status_names);
    tcase_add_loop_test(tc, test_surrogates, 0,
                        (int)(sizeof(sur_vec) / sizeof(sur_vec[0])));
    tcase_add_loop_test(tc, test_surrogates_byte_by_byte, 0,
                        (int)(sizeof(sur_vec) / sizeof(sur_vec[0])));
    tcase_add_loop_test(tc, test_surrogates_azure, 0,
                        (int)(sizeof(sur_vec) / sizeof(sur_vec[0])));
    tcase_add_test(tc, test_surrogate_end_and_body);
    tcase_add_test(tc, test_surrogate_cap);
    tcase_add_loop_test(tc, test_header_check, 0,
                        (int)(sizeof(hdr_vec) / sizeof(hdr_vec[0])));
    tcase_add_test(tc, test_lines_option);
    tcase_add_test(tc, test_worker_refuses_bad_header);
    tcase_add_test(tc, test_error_detail);
    suite_add_tcase(s, tc);
    return s;
}
