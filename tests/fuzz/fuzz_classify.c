/* fuzz_classify.c -- libFuzzer target: bytes -> one call's outcome
 * (llm/classify.h). The first byte picks the reader (the fast path or a
 * provider), the second the status, the third the operation, whether the
 * answer came as frames (then read through the provider's framing, cut
 * where the fourth byte says) and which retry headers came; the rest is the
 * body. Checks that every outcome is one of the three with a matching code,
 * a named exception for each failure, a bounded message, and a retry hint
 * that is -1 or a delay. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llm/classify.h"
#include "tests/unit/provider_drive.h"
#include "util/alloc.h"

static void check(int ok)
{
    if (!ok)
        __builtin_trap();
}

static const struct llm_provider *const readers[5] = {
    NULL, &llm_provider_openai, &llm_provider_anthropic, &llm_provider_ollama,
    &llm_provider_azure};
static const long statuses[8] = {200, 200, 400, 401, 429, 500, 529, 0};

static void feed_fast(struct openai_stream *s, const char *wire, size_t len, size_t cut)
{
    struct sse_parser *sp = sse_parser_new(1 << 20);
    struct sse_event ev;
    struct cr_err err;
    size_t piece[2] = {cut, len - cut};
    int got;

    if (!sp)
        return;
    for (int k = 0; k < 2; k++) {
        if (sse_feed(sp, wire + (k ? cut : 0), piece[k]) < 0)
            break;
        while ((got = sse_next(sp, &ev)) == 1)
            openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err);
    }
    if (sse_finish(sp, &ev) == 1)
        openai_stream_feed(s, ev.data, ev.data_len, NULL, NULL, &err);
    openai_stream_end(s, NULL, NULL);
    sse_parser_free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct llm_provider *p;
    struct llm_exchange x;
    struct llm_answer a;
    struct openai_stream fast;
    struct llm_stream ps;
    struct llm_result res;
    struct cr_err err;
    const char *body;
    char msg[256];
    size_t len;

    if (size < 4)
        return 0;
    p = readers[data[0] % 5];
    body = (const char *)data + 4;
    len = size - 4;
    memset(&x, 0, sizeof(x));
    memset(&a, 0, sizeof(a));
    memset(&res, 0, sizeof(res));
    x.status = statuses[data[1] % 8];
    x.op = data[2] & 1 ? LLM_OP_EMBED : LLM_OP_CHAT;
    x.embed_list = !!(data[2] & 2);
    x.framed = x.op == LLM_OP_CHAT && x.status == 200 && (data[2] & 4);
    x.retry_after = data[2] & 8 ? "Sun, 06 Nov 1994 08:49:37 GMT" : NULL;
    x.retry_after_ms = data[2] & 16 ? "250.5" : NULL;
    x.should_retry = data[2] & 32 ? "false" : NULL;
    x.now_epoch_ms = 784111777000;
    a.provider = p ? p : &llm_provider_openai;
    openai_stream_init(&fast);
    memset(&ps, 0, sizeof(ps));
    if (p) {
        if (llm_stream_init(&ps, p, x.op))
            return 0;
        ps.reply.max_content_bytes = 1 << 16;
        a.stream = &ps;
    } else {
        a.fast = &fast;
    }
    if (x.framed) {
        size_t cut = len ? data[3] % (len + 1) : 0;
        if (p &&
            drive(&ps, p == &llm_provider_ollama ? LLM_FRAMING_NDJSON : LLM_FRAMING_SSE,
                  body, len, cut ? (long)cut : 0, NULL, &err))
            x.proto_error = 1;
        else if (!p)
            feed_fast(&fast, body, len, cut);
    } else {
        x.body = body;
        x.body_len = len;
    }
    llm_outcome(&x, &a, &res, msg, sizeof(msg));

    check(res.message == msg);
    check(strlen(msg) < sizeof(msg));
    check(res.http_status == x.status);
    check(res.retry_after_ms >= -1);
    if (res.verdict == LLM_OK) {
        check(res.code == 0 && res.exc_type == NULL && msg[0] == '\0');
        check(x.status >= 200 && x.status < 300);
    } else {
        check(res.verdict == LLM_RETRYABLE || res.verdict == LLM_PERMANENT);
        check(res.code != 0 && res.exc_type && res.exc_type[0]);
        check(res.embedding == NULL);
    }
    if (x.op == LLM_OP_CHAT)
        check(res.text != NULL && strlen(res.model) < 4096);
    cJSON_Delete(res.embedding);
    if (p)
        llm_stream_release(&ps);
    openai_stream_release(&fast);
    return 0;
}
