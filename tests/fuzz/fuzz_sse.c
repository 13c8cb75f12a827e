/* fuzz_sse.c -- libFuzzer target: bytes -> SSE parser -> OpenAI chunk mapping. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol/openai.h"
#include "protocol/sse.h"
#include "util/alloc.h"

static void check(int ok)
{
    if (!ok)
        __builtin_trap();
}

static int same_str(const char *a, const char *b)
{
    return strcmp(a, b) == 0;
}

/* Feeds one payload to s (fast path, then cJSON if it gives up) and to json
 * (cJSON only): everything the caller can see must match. */
static void feed_both(struct openai_stream *s, struct openai_stream *json,
                      const char *data, size_t len)
{
    struct cr_err e1, e2;
    const char *d1, *d2;
    size_t n1, n2;
    int r1, r2;

    memset(&e1, 0, sizeof(e1));
    memset(&e2, 0, sizeof(e2));
    r1 = openai_stream_feed(s, data, len, &d1, &n1, &e1);
    r2 = openai__stream_feed_json(json, data, len, &d2, &n2, &e2);
    /* delta must point into content */
    check(n1 == 0 ||
          (d1 >= s->content.data && d1 + n1 <= s->content.data + s->content.len));
    check(r1 == r2 && e1.code == e2.code && same_str(e1.msg, e2.msg));
    check(n1 == n2 && memcmp(d1, d2, n1) == 0);
    check(s->content.len == json->content.len &&
          (s->content.len == 0 ||
           memcmp(s->content.data, json->content.data, s->content.len) == 0));
    check(same_str(s->finish_reason, json->finish_reason) &&
          same_str(s->model, json->model));
    check(s->prompt_tokens == json->prompt_tokens &&
          s->completion_tokens == json->completion_tokens &&
          s->total_tokens == json->total_tokens);
    check(s->done == json->done && s->error == json->error && s->chunks == json->chunks);
    check(s->held_surrogate == json->held_surrogate &&
          s->content_chunks == json->content_chunks);
    check(same_str(s->error_type, json->error_type) &&
          same_str(s->error_code, json->error_code) &&
          same_str(s->error_message, json->error_message));
}

/* Each event's data also goes through the whole-body parsers, which see the
 * same kind of untrusted JSON. */
static void on_event(struct openai_stream *s, struct openai_stream *json,
                     const struct sse_event *ev)
{
    struct openai_error e;
    struct cr_err err;
    cJSON *v;

    feed_both(s, json, ev->data, ev->data_len);
    v = openai_embed_parse(ev->data, ev->data_len, ev->type_len & 1, NULL, &err);
    cJSON_Delete(v);
    openai_error_parse(ev->data, ev->data_len, &e);
}

static void drain(struct sse_parser *p, struct openai_stream *s,
                  struct openai_stream *json)
{
    struct sse_event ev;
    while (sse_next(p, &ev) == 1)
        on_event(s, json, &ev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The first byte picks the split point and a small or default event cap; the
 * rest is the stream, and also one payload as it is (so that the fast path
 * sees bytes the SSE parser would have split at line ends). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct openai_stream s, json, whole;
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
    openai_stream_init(&json);
    sse_feed(p, body, cut);
    drain(p, &s, &json);
    sse_feed(p, body + cut, len - cut);
    drain(p, &s, &json);
    while (sse_finish(p, &ev) == 1)
        on_event(&s, &json, &ev);
    check(openai_stream_complete(&s) == openai_stream_complete(&json));
    {
        const char *d1, *d2;
        size_t n1, n2;
        openai_stream_end(&s, &d1, &n1);
        openai_stream_end(&json, &d2, &n2);
        check(n1 == n2 && memcmp(d1, d2, n1) == 0 && s.held_surrogate == 0);
    }
    /* The sniff of a prefix never contradicts the sniff of the whole. */
    {
        int whole_v = sse_sniff(body, len, 1), part = sse_sniff(body, cut, 0);
        check(whole_v == 0 || whole_v == 1);
        check(part == -1 || part == whole_v);
    }
    sse_parser_free(p);
    openai_stream_release(&s);
    openai_stream_release(&json);

    openai_stream_init(&s);
    openai_stream_init(&json);
    s.content.max_bytes = json.content.max_bytes = data[0] & 0x40 ? 16 : 0;
    feed_both(&s, &json, body, len);
    openai_stream_release(&s);
    openai_stream_release(&json);

    openai_stream_init(&whole);
    openai_chat_parse(&whole, body, len, NULL);
    openai_stream_release(&whole);
    return 0;
}
