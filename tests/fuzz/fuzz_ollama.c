/* fuzz_ollama.c -- libFuzzer target: bytes -> NDJSON splitter -> Ollama object
 * mapping, split at a point the first byte picks (a small line cap when its
 * top bit is set); each line also goes through the whole-body, embeddings
 * and error-body parsers. Checks the same bounds as fuzz_anthropic.c, and
 * that one piece or two give the same answer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol/ndjson.h"
#include "protocol/ollama.h"
#include "util/alloc.h"

#define MAX_TEXT 4096

static void check(int ok)
{
    if (!ok)
        __builtin_trap();
}

static void on_line(struct chat_reply *r, const char *line, size_t n)
{
    struct cr_err err;
    struct chat_reply whole;
    struct chat_error e;
    const char *d;
    size_t dn, before = r->content.len, i;
    long pt;
    cJSON *v;

    check(line[n] == '\0'); /* NUL-terminated (a NUL inside is data) */
    memset(&err, 0, sizeof(err));
    if (ollama_stream_feed(r, line, n, &d, &dn, &err) == 0) {
        check(r->content.len == before + dn);
        check(dn == 0 ||
              (d >= r->content.data && d + dn <= r->content.data + r->content.len));
    }
    check(r->content.len <= MAX_TEXT);
    check(r->ntools <= CHAT_REPLY_MAX_TOOLS);
    for (i = 0; i < r->ntools; i++)
        check(r->tools[i].arguments.len <= CHAT_REPLY_MAX_ARGS_BYTES);
    chat_reply_init(&whole);
    ollama_chat_parse(&whole, line, n, &err);
    chat_reply_release(&whole);
    v = ollama_embed_parse(line, n, (int)(n & 1), &pt, &err);
    cJSON_Delete(v);
    ollama_error_parse(500, line, n, &e);
}

static void drain(struct ndjson_parser *p, struct chat_reply *r, int finish)
{
    const char *line;
    size_t n;

    while ((finish ? ndjson_finish(p, &line, &n) : ndjson_next(p, &line, &n)) == 1)
        on_line(r, line, n);
}

static void run(const char *body, size_t len, size_t cut, size_t cap,
                struct chat_reply *r)
{
    struct ndjson_parser *p = ndjson_parser_new(cap);

    chat_reply_init(r);
    r->max_content_bytes = MAX_TEXT;
    if (!p)
        return;
    if (ndjson_feed(p, body, cut) == 0)
        drain(p, r, 0);
    if (ndjson_feed(p, body + cut, len - cut) == 0)
        drain(p, r, 0);
    drain(p, r, 1);
    ndjson_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct chat_reply a, b;
    const char *body;
    size_t len, cut, cap;

    if (size < 1)
        return 0;
    cr_alloc_init();
    body = (const char *)data + 1;
    len = size - 1;
    cut = len ? (size_t)data[0] * 7919 % (len + 1) : 0;
    cap = data[0] & 0x80 ? 48 : 0;
    run(body, len, cut, cap, &a);
    run(body, len, len, cap, &b);
    /* With a line cap, where the cap trips can depend on the split (a line
     * is refused once the buffer holds more than the cap without an LF), so
     * only uncapped runs must agree. */
    if (!cap) {
        check(a.content.len == b.content.len &&
              (a.content.len == 0 ||
               memcmp(a.content.data, b.content.data, a.content.len) == 0));
        check(strcmp(a.finish_reason, b.finish_reason) == 0 && a.done == b.done &&
              a.error == b.error && a.ntools == b.ntools);
        check(a.prompt_tokens == b.prompt_tokens &&
              a.completion_tokens == b.completion_tokens);
    }
    chat_reply_release(&a);
    chat_reply_release(&b);
    return 0;
}
