/* fuzz_anthropic.c -- libFuzzer target: bytes -> SSE parser -> Anthropic event
 * mapping, split at a point the first byte picks; each event's data also goes
 * through the whole-message and error-body parsers. Checks the mapper's
 * bounds: text within max_content_bytes, the delta inside the text, tool
 * calls and their arguments within their caps, and the same answer whether
 * the stream came in one piece or two. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol/anthropic.h"
#include "protocol/sse.h"
#include "util/alloc.h"

#define MAX_TEXT 4096

static void check(int ok)
{
    if (!ok)
        __builtin_trap();
}

static void on_event(struct chat_reply *r, const struct sse_event *ev)
{
    struct cr_err err;
    struct chat_reply whole;
    struct chat_error e;
    const char *d;
    size_t n, before = r->content.len, i;

    memset(&err, 0, sizeof(err));
    if (anthropic_stream_feed(r, ev->type, ev->type_len, ev->data, ev->data_len, &d, &n,
                              &err) == 0) {
        check(r->content.len == before + n);
        check(n == 0 ||
              (d >= r->content.data && d + n <= r->content.data + r->content.len));
    }
    check(r->content.len <= MAX_TEXT);
    check(r->ntools <= CHAT_REPLY_MAX_TOOLS);
    for (i = 0; i < r->ntools; i++) {
        check(r->tools[i].arguments.len <= CHAT_REPLY_MAX_ARGS_BYTES);
        check(r->tools[i].id && r->tools[i].name);
    }
    check(!r->error || r->err == NULL || r->err->in_stream);
    chat_reply_init(&whole);
    anthropic_message_parse(&whole, ev->data, ev->data_len, &err);
    chat_reply_release(&whole);
    anthropic_error_parse(ev->type_len, ev->data, ev->data_len, &e);
    check(strlen(e.message) < sizeof(e.message));
}

/* Feeds body to a fresh reply in two pieces split at cut. */
static void run(const char *body, size_t len, size_t cut, struct chat_reply *r)
{
    struct sse_parser *p = sse_parser_new(1 << 16);
    struct sse_event ev;

    chat_reply_init(r);
    r->max_content_bytes = MAX_TEXT;
    if (!p)
        return;
    if (sse_feed(p, body, cut) == 0)
        while (sse_next(p, &ev) == 1)
            on_event(r, &ev);
    if (sse_feed(p, body + cut, len - cut) == 0)
        while (sse_next(p, &ev) == 1)
            on_event(r, &ev);
    while (sse_finish(p, &ev) == 1)
        on_event(r, &ev);
    sse_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct chat_reply a, b;
    const char *body;
    size_t len, cut, i;

    if (size < 1)
        return 0;
    cr_alloc_init();
    body = (const char *)data + 1;
    len = size - 1;
    cut = len ? (size_t)data[0] * 7919 % (len + 1) : 0;
    run(body, len, cut, &a);
    run(body, len, len, &b);
    /* Framing never changes the answer (a mapper error stops neither run,
     * and both saw the same events). */
    check(a.content.len == b.content.len &&
          (a.content.len == 0 ||
           memcmp(a.content.data, b.content.data, a.content.len) == 0));
    check(strcmp(a.finish_reason, b.finish_reason) == 0 && a.done == b.done &&
          a.error == b.error && a.ntools == b.ntools);
    check(a.prompt_tokens == b.prompt_tokens &&
          a.completion_tokens == b.completion_tokens);
    for (i = 0; i < a.ntools; i++)
        check(a.tools[i].arguments.len == b.tools[i].arguments.len);
    chat_reply_release(&a);
    chat_reply_release(&b);
    return 0;
}
