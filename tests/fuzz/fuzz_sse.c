/* fuzz_sse.c -- libFuzzer target: bytes -> SSE parser -> OpenAI chunk mapping. */
#include <stddef.h>
#include <stdint.h>

#include "protocol/openai.h"
#include "protocol/sse.h"
#include "util/alloc.h"

/* Each event's data also goes through the whole-body parsers, which see the
 * same kind of untrusted JSON. */
static void on_event(struct openai_stream *s, const struct sse_event *ev)
{
    struct openai_error e;
    struct cr_err err;
    const char *d;
    size_t dn;
    cJSON *v;

    openai_stream_feed(s, ev->data, ev->data_len, &d, &dn, &err);
    if (dn > 0 && (d < s->content.data || d + dn > s->content.data + s->content.len))
        __builtin_trap(); /* delta must point into content */
    v = openai_embed_parse(ev->data, ev->data_len, ev->type_len & 1, NULL, &err);
    cJSON_Delete(v);
    openai_error_parse(ev->data, ev->data_len, &e);
}

static void drain(struct sse_parser *p, struct openai_stream *s)
{
    struct sse_event ev;
    while (sse_next(p, &ev) == 1)
        on_event(s, &ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The first byte picks the split point and a small or default event cap; the
 * rest is the stream. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct openai_stream s, whole;
    struct sse_parser *p;
    struct sse_event ev;
    const char *body;
    size_t len, cut;

    if (size < 1)
        return 0;
    cr_alloc_init();
    body = (const char *)data + 1;
    len = size - 1;
    cut = len ? (size_t)data[0] * 7919 % (len + 1) : 0;
    p = sse_parser_new(data[0] & 0x80 ? 64 : 0);
    if (!p)
        return 0;
    openai_stream_init(&s);
    sse_feed(p, body, cut);
    drain(p, &s);
    sse_feed(p, body + cut, len - cut);
    drain(p, &s);
    while (sse_finish(p, &ev) == 1)
        on_event(&s, &ev);
    (void)openai_stream_complete(&s);
    sse_parser_free(p);
    openai_stream_release(&s);

    openai_stream_init(&whole);
    openai_chat_parse(&whole, body, len, NULL);
    openai_stream_release(&whole);
    return 0;
}
