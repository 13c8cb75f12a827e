/* test_sse.c -- SSE parser: framing vectors under every split, limits, OOM. */
#include <check.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/sse.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* Events are rendered as "<type>data;" with \n \r \0 ; \ escaped, and a
 * leading F for events returned by sse_finish(), so one string comparison
 * checks count, order, types and exact bytes. */
struct vec {
    const char *name;
    const char *in;
    size_t len; /* 0: strlen(in) */
    const char *want;
};

#define BOM "\xEF\xBB\xBF"
#define HALF_BOM "\xEF\xBB"

#define OPENAI_WIRE                                                                      \
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":"     \
    "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"                 \
    "\"finish_reason\":null}],\"usage\":null}\n\n"                                       \
    "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":"                  \
    "{\"content\":\"Hel\"}}]}\n\n"                                                       \
    "data: [DONE]\n\n"

static const struct vec vecs[] = {
    {"lf", "data: hello\n\n", 0, "<>hello;"},
    {"crlf", "data: hello\r\n\r\n", 0, "<>hello;"},
    {"cr", "data: hello\r\r", 0, "<>hello;"},
    {"mixed", "data: a\r\ndata: b\rdata: c\n\r\n", 0, "<>a\\nb\\nc;"},
    {"two events", "data: 1\n\ndata: 2\n\n", 0, "<>1;<>2;"},
    {"no space", "data:x\n\n", 0, "<>x;"},
    {"two spaces", "data:  x\n\n", 0, "<> x;"},
    {"multi-line", "data: a\ndata: b\n\n", 0, "<>a\\nb;"},
    {"empty value", "data:\n\n", 0, "<>;"},
    {"space value", "data: \n\n", 0, "<>;"},
    {"no colon", "data\n\n", 0, "<>;"},
    {"no colon then value", "data\ndata: x\n\n", 0, "<>\\nx;"},
    {"event type", "event: delta\ndata: x\n\ndata: y\n\n", 0, "<delta>x;<>y;"},
    {"event without data", "event: ping\n\ndata: y\n\n", 0, "<>y;"},
    {"event last wins", "event: a\nevent: b\ndata: x\n\n", 0, "<b>x;"},
    {"comments", ": ping\n\n: x\ndata: x\n: mid\n\n", 0, "<>x;"},
    {"bom", BOM "data: x\n\n", 0, "<>x;"},
    {"bom only once", BOM "data: a\n\n" BOM "data: b\n\n", 0, "<>a;"},
    {"partial bom", HALF_BOM "data: a\n\ndata: b\n\n", 0, "<>b;"},
    {"id and retry", "id: 7\nretry: 1000\ndata: x\nid\n\n", 0, "<>x;"},
    {"unknown fields", "foo: bar\nerror: {\"e\":1}\nDATA: z\ndata: x\n\n", 0, "<>x;"},
    {"colon in value", "data: a: b\n\n", 0, "<>a: b;"},
    {"leading blanks", "\r\n\n\rdata: x\n\n", 0, "<>x;"},
    {"cr cr lf", "data: a\r\r\n", 0, "<>a;"},
    {"lf cr", "data: a\n\rdata: b\n\n", 0, "<>a;<>b;"},
    {"type reset", "event: x\n\nevent: y\ndata: 1\n\ndata: 2\n\n", 0, "<y>1;<>2;"},
    {"done no blank line", "data: a\n\ndata: [DONE]", 0, "<>a;F<>[DONE];"},
    {"done lf no blank", "data: a\n\ndata: [DONE]\n", 0, "<>a;F<>[DONE];"},
    {"done crlf no blank", "data: [DONE]\r\n", 0, "F<>[DONE];"},
    {"done cr no blank", "data: [DONE]\r", 0, "F<>[DONE];"},
    {"done no space", "data:[DONE]", 0, "F<>[DONE];"},
    {"done terminated", "data: [DONE]\n\n", 0, "<>[DONE];"},
    {"unterminated dropped", "data: a\n\ndata: b\n", 0, "<>a;"},
    {"almost done", "data: [DONE]x", 0, ""},
    {"done plus line", "data: [DONE]\ndata: x", 0, ""},
    {"utf8", "data: h\xc3\xa9llo \xf0\x9f\x98\x80 \xe2\x82\xac\n\n", 0,
     "<>h\xc3\xa9llo \xf0\x9f\x98\x80 \xe2\x82\xac;"},
    {"nul byte", "data: a\0b\n\n", 11, "<>a\\0b;"},
    {"escapes kept", "data: a;b\\c\n\n", 0, "<>a\\;b\\\\c;"},
    {"empty input", "", 0, ""},
    {"only comments", ": ping\n: ping\n", 0, ""},
    {"openai", OPENAI_WIRE, 0,
     "<>{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{"
     "\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":"
     "null}],\"usage\":null};<>{\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,"
     "\"delta\":{\"content\":\"Hel\"}}]};<>[DONE];"},
};

static int render_bytes(struct buf *out, const char *s, size_t n)
{
    size_t i;
    int rc = 0;
    for (i = 0; i < n && rc == 0; i++) {
        switch (s[i]) {
        case '\n':
            rc = buf_puts(out, "\\n");
            break;
        case '\r':
            rc = buf_puts(out, "\\r");
            break;
        case '\0':
            rc = buf_puts(out, "\\0");
            break;
        case ';':
            rc = buf_puts(out, "\\;");
            break;
        case '\\':
            rc = buf_puts(out, "\\\\");
            break;
        default:
            rc = buf_putc(out, s[i]);
        }
    }
    return rc;
}

static int render(struct buf *out, const struct sse_event *ev, int fin)
{
    int rc = 0;
    ck_assert_uint_eq(strlen(ev->type), ev->type_len);
    ck_assert(ev->data[ev->data_len] == '\0');
    if (fin)
        rc = buf_putc(out, 'F');
    if (!rc)
        rc = buf_putc(out, '<');
    if (!rc)
        rc = render_bytes(out, ev->type, ev->type_len);
    if (!rc)
        rc = buf_putc(out, '>');
    if (!rc)
        rc = render_bytes(out, ev->data, ev->data_len);
    if (!rc)
        rc = buf_putc(out, ';');
    return rc;
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

enum { MODE_WHOLE = 0, MODE_BYTES = 1 };

/* run() calls sse_parser_trim() after draining each feed, as llm_client does. */
static int trim_after_drain;

/* Feeds in pieces chosen by mode (0 whole, 1 bytewise, >=2 random chunks of
 * up to `mode` bytes from seed), draining events after each feed. Returns 0 or
 * the first error. */
static int run(const char *in, size_t len, size_t max, int mode, uint64_t seed,
               struct buf *out)
{
    struct sse_parser *p = sse_parser_new(max);
    struct sse_event ev;
    size_t off = 0;
    int rc = 0;

    if (!p)
        return CR_ENOMEM;
    while (off < len && rc >= 0) {
        size_t n = len - off;
        if (mode == MODE_BYTES)
            n = 1;
        else if (mode >= 2 && n > 1)
            n = 1 + xorshift(&seed) % (size_t)mode;
        if (n > len - off)
            n = len - off;
        rc = sse_feed(p, in + off, n);
        off += n;
        while (rc >= 0 && (rc = sse_next(p, &ev)) == 1)
            rc = render(out, &ev, 0);
        if (trim_after_drain)
            sse_parser_trim(p);
    }
    while (rc >= 0 && (rc = sse_finish(p, &ev)) == 1)
        rc = render(out, &ev, 1);
    sse_parser_free(p);
    return rc < 0 ? rc : 0;
}

static const struct vec *find_vec(const char *name)
{
    size_t i;
    for (i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
        if (strcmp(vecs[i].name, name) == 0)
            return &vecs[i];
    ck_abort_msg("no vector '%s'", name);
    return NULL;
}

static size_t vec_len(const struct vec *v)
{
    return v->len ? v->len : strlen(v->in);
}

static void check_vector(const struct vec *v);

START_TEST(test_vectors)
{
    check_vector(&vecs[_i]);
}
END_TEST

/* The same with every drained parser trimmed: freeing consumed input and the
 * returned event must not change what is parsed, whatever the chunking. */
START_TEST(test_vectors_trimmed)
{
    trim_after_drain = 1;
    check_vector(&vecs[_i]);
    trim_after_drain = 0;
}
END_TEST

static void check_vector(const struct vec *v)
{
    static const int chunk_max[] = {2, 3, 7, 16, 64};
    struct buf out;
    int mode, seed;

    buf_init(&out);
    for (mode = 0; mode < 2; mode++) {
        buf_reset(&out);
        ck_assert_int_eq(run(v->in, vec_len(v), 0, mode, 1, &out), 0);
        ck_assert_msg(strcmp(out.data ? out.data : "", v->want) == 0,
                      "%s mode %d: got '%s' want '%s'", v->name, mode,
                      out.data ? out.data : "", v->want);
    }
    for (mode = 0; mode < 5; mode++) {
        for (seed = 1; seed <= 20; seed++) {
            buf_reset(&out);
            ck_assert_int_eq(
                run(v->in, vec_len(v), 0, chunk_max[mode], (uint64_t)seed * 7919, &out),
                0);
            ck_assert_msg(strcmp(out.data ? out.data : "", v->want) == 0,
                          "%s chunks<=%d seed %d: got '%s' want '%s'", v->name,
                          chunk_max[mode], seed, out.data ? out.data : "", v->want);
        }
    }
    buf_release(&out);
}

/* Every two-way split of every vector, which hits every CR/LF and UTF-8
 * boundary exactly once. */
START_TEST(test_every_split)
{
    const struct vec *v = &vecs[_i];
    size_t len = vec_len(v), cut;
    struct buf out;

    buf_init(&out);
    for (cut = 0; cut <= len; cut++) {
        struct sse_parser *p = sse_parser_new(0);
        struct sse_event ev;
        int rc;
        buf_reset(&out);
        ck_assert_int_eq(sse_feed(p, v->in, cut), 0);
        while ((rc = sse_next(p, &ev)) == 1)
            render(&out, &ev, 0);
        ck_assert_int_eq(rc, 0);
        ck_assert_int_eq(sse_feed(p, v->in + cut, len - cut), 0);
        while ((rc = sse_next(p, &ev)) == 1)
            render(&out, &ev, 0);
        ck_assert_int_eq(rc, 0);
        while ((rc = sse_finish(p, &ev)) == 1)
            render(&out, &ev, 1);
        ck_assert_int_eq(rc, 0);
        ck_assert_msg(strcmp(out.data ? out.data : "", v->want) == 0,
                      "%s cut %zu: got '%s'", v->name, cut, out.data ? out.data : "");
        sse_parser_free(p);
    }
    buf_release(&out);
}
END_TEST

START_TEST(test_cr_split_across_feeds)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;

    /* If the LF after the CR counted as a second line end, "a" would be
     * dispatched alone. */
    ck_assert_int_eq(sse_feed(p, "data: a\r", 8), 0);
    ck_assert_int_eq(sse_next(p, &ev), 0);
    ck_assert_int_eq(sse_feed(p, "\n", 1), 0);
    ck_assert_int_eq(sse_next(p, &ev), 0);
    ck_assert_int_eq(sse_feed(p, "data: b\r", 8), 0);
    ck_assert_int_eq(sse_next(p, &ev), 0);
    ck_assert_int_eq(sse_feed(p, "\n\r", 2), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_str_eq(ev.data, "a\nb");
    ck_assert_str_eq(ev.type, "");
    ck_assert_int_eq(sse_feed(p, "\ndata: c\n\n", 10), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_str_eq(ev.data, "c");
    ck_assert_int_eq(sse_next(p, &ev), 0);
    sse_parser_free(p);
}
END_TEST

START_TEST(test_utf8_split)
{
    const char *wire = "data: \xf0\x9f\x98\x80\xe2\x82\xac\n\n";
    size_t len = strlen(wire), cut;

    for (cut = 6; cut < 13; cut++) {
        struct sse_parser *p = sse_parser_new(0);
        struct sse_event ev;
        ck_assert_int_eq(sse_feed(p, wire, cut), 0);
        ck_assert_int_eq(sse_next(p, &ev), 0);
        ck_assert_int_eq(sse_feed(p, wire + cut, len - cut), 0);
        ck_assert_int_eq(sse_next(p, &ev), 1);
        ck_assert_str_eq(ev.data, "\xf0\x9f\x98\x80\xe2\x82\xac");
        ck_assert_uint_eq(ev.data_len, 7);
        sse_parser_free(p);
    }
}
END_TEST

START_TEST(test_comments_and_reset)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    const char *wire = ": ping\n\n:\r\n: OPENROUTER PROCESSING\rdata: x";
    const char *again = BOM "data: y\n\n";

    ck_assert_uint_eq(sse_comments_seen(p), 0);
    ck_assert_int_eq(sse_feed(p, wire, strlen(wire)), 0);
    ck_assert_int_eq(sse_next(p, &ev), 0);
    ck_assert_uint_eq(sse_comments_seen(p), 3);
    sse_parser_reset(p);
    ck_assert_uint_eq(sse_comments_seen(p), 0);
    /* The pending "data: x" is gone; a BOM is honoured again after reset. */
    ck_assert_int_eq(sse_feed(p, again, strlen(again)), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_str_eq(ev.data, "y");
    sse_parser_free(p);
    sse_parser_free(NULL);
}
END_TEST

START_TEST(test_finish_drains_buffered)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    const char *wire = "data: a\n\ndata: b\n\ndata: [DONE]";

    ck_assert_int_eq(sse_feed(p, wire, strlen(wire)), 0);
    ck_assert_int_eq(sse_finish(p, &ev), 1);
    ck_assert_str_eq(ev.data, "a");
    ck_assert_int_eq(sse_finish(p, &ev), 1);
    ck_assert_str_eq(ev.data, "b");
    ck_assert_int_eq(sse_finish(p, &ev), 1);
    ck_assert_str_eq(ev.data, "[DONE]");
    ck_assert_int_eq(sse_finish(p, &ev), 0);
    sse_parser_free(p);
}
END_TEST

/* The event stays readable until the next call, even while the parser holds
 * the following event half-built. */
START_TEST(test_event_survives_until_next_call)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    const char *wire = "event: e\ndata: first\n\ndata: sec";

    ck_assert_int_eq(sse_feed(p, wire, strlen(wire)), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_int_eq(sse_next(p, &(struct sse_event){0}), 0);
    ck_assert_str_eq(ev.data, "first");
    ck_assert_str_eq(ev.type, "e");
    sse_parser_free(p);
}
END_TEST

/* Asserts stay out of the per-byte loop: each Check assertion records its
 * location with a syscall, which would dominate the run time. */
static void long_line(size_t chunk)
{
    size_t n = 1024 * 1024, off, got_len = 0;
    struct buf wire;
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    int got = 0, rc = 0;

    buf_init(&wire);
    ck_assert_int_eq(buf_puts(&wire, "data: "), 0);
    ck_assert_int_eq(buf_reserve(&wire, n + 2), 0);
    memset(wire.data + wire.len, 'x', n);
    wire.len += n;
    ck_assert_int_eq(buf_puts(&wire, "\n\n"), 0);
    for (off = 0; off < wire.len && rc == 0; off += chunk) {
        size_t k = wire.len - off < chunk ? wire.len - off : chunk;
        rc = sse_feed(p, wire.data + off, k);
        while (rc == 0 && (rc = sse_next(p, &ev)) == 1) {
            got++;
            got_len = ev.data_len;
            ck_assert(ev.data[0] == 'x' && ev.data[n - 1] == 'x');
            rc = 0;
        }
    }
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(got, 1);
    ck_assert_uint_eq(got_len, n);
    sse_parser_free(p);
    buf_release(&wire);
}

START_TEST(test_long_line)
{
    long_line(4096);
    long_line(1); /* would be quadratic if each sse_next() rescanned the line */
}
END_TEST

static void fill(char *s, size_t n, const char *prefix)
{
    size_t k = strlen(prefix);
    memcpy(s, prefix, k);
    memset(s + k, 'x', n - k);
}

START_TEST(test_line_cap)
{
    char line[1030];
    struct sse_parser *p = sse_parser_new(1024);
    struct sse_event ev;

    /* A line of exactly the cap is fine. */
    fill(line, 1024, "data: ");
    ck_assert_int_eq(sse_feed(p, line, 1024), 0);
    ck_assert_int_eq(sse_feed(p, "\n\n", 2), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_uint_eq(ev.data_len, 1018);
    /* One more byte without a line end is not, and the error sticks. */
    fill(line, 1025, "data: ");
    ck_assert_int_eq(sse_feed(p, line, 1025), CR_ETOOBIG);
    ck_assert_int_eq(sse_feed(p, "\n\n", 2), CR_ETOOBIG);
    ck_assert_int_eq(sse_next(p, &ev), CR_ETOOBIG);
    ck_assert_int_eq(sse_finish(p, &ev), CR_ETOOBIG);
    sse_parser_reset(p);
    ck_assert_int_eq(sse_feed(p, "data: ok\n\n", 10), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    sse_parser_free(p);
}
END_TEST

START_TEST(test_line_cap_bytewise)
{
    char line[2000];
    struct sse_parser *p = sse_parser_new(1024);
    struct sse_event ev;
    size_t i;
    int rc = 0;

    fill(line, sizeof(line), ": comment ");
    for (i = 0; i < sizeof(line) && rc == 0; i++) {
        rc = sse_feed(p, line + i, 1);
        if (rc == 0)
            ck_assert_int_eq(sse_next(p, &ev), 0);
    }
    ck_assert_int_eq(rc, CR_ETOOBIG);
    ck_assert_uint_eq(i, 1025);
    sse_parser_free(p);
}
END_TEST

START_TEST(test_event_cap)
{
    char line[512];
    struct sse_parser *p = sse_parser_new(1024);
    struct sse_event ev;

    /* Lines under the cap that add up to more than it. */
    fill(line, 506, "data: ");
    line[506] = '\n';
    ck_assert_int_eq(sse_feed(p, line, 507), 0);
    ck_assert_int_eq(sse_feed(p, line, 507), 0);
    ck_assert_int_eq(sse_feed(p, "\n", 1), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_uint_eq(ev.data_len, 1001);
    ck_assert_int_eq(sse_feed(p, line, 507), 0);
    ck_assert_int_eq(sse_feed(p, line, 507), 0);
    ck_assert_int_eq(sse_feed(p, line, 507), 0);
    ck_assert_int_eq(sse_next(p, &ev), CR_ETOOBIG);
    ck_assert_int_eq(sse_next(p, &ev), CR_ETOOBIG);
    ck_assert_int_eq(sse_feed(p, "\n", 1), CR_ETOOBIG);
    sse_parser_free(p);
}
END_TEST

START_TEST(test_default_cap)
{
    size_t cap = (size_t)16 * 1024 * 1024, chunk = 1 << 20, off;
    char *block = cr_malloc(chunk);
    struct sse_parser *p = sse_parser_new(0);

    memset(block, 'x', chunk);
    for (off = 0; off < cap; off += chunk)
        ck_assert_int_eq(sse_feed(p, block, chunk), 0);
    ck_assert_int_eq(sse_feed(p, block, 1), CR_ETOOBIG);
    sse_parser_free(p);
    cr_free(block);
}
END_TEST

/* Once the buffers have grown, parsing more events of the same size must not
 * allocate at all. */
START_TEST(test_steady_state_no_alloc)
{
    const char *ev1 = "data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n";
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    int i, got = 0;

    for (i = 0; i < 4; i++) {
        ck_assert_int_eq(sse_feed(p, ev1, strlen(ev1)), 0);
        while (sse_next(p, &ev) == 1)
            got++;
    }
    cr_alloc_fail_after(1);
    for (i = 0; i < 1000; i++) {
        ck_assert_int_eq(sse_feed(p, ev1, 20), 0);
        while (sse_next(p, &ev) == 1)
            got++;
        ck_assert_int_eq(sse_feed(p, ev1 + 20, strlen(ev1) - 20), 0);
        while (sse_next(p, &ev) == 1)
            got++;
    }
    ck_assert_int_eq(cr_alloc_failed(), 0);
    cr_alloc_fail_after(0);
    ck_assert_int_eq(got, 1004);
    sse_parser_free(p);
}
END_TEST

/* Fails allocation 1, 2, ... until a run succeeds; every failed run must
 * report CR_ENOMEM (no crash, no leak: run under valgrind). */
/* A trimmed parser holds no buffer for what it has parsed (the next feed
 * allocates again), and keeps a partial line and a partial event. */
START_TEST(test_trim_frees_parsed_keeps_partial)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    const char *a = "data: one\n\ndata: tw", *b = "o\ndata: three\n\n";

    ck_assert_int_eq(sse_feed(p, a, strlen(a)), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_str_eq(ev.data, "one");
    ck_assert_int_eq(sse_next(p, &ev), 0);
    sse_parser_trim(p); /* "data: tw" is not parsed yet: kept */
    ck_assert_int_eq(sse_feed(p, b, strlen(b)), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_str_eq(ev.data, "two\nthree");
    ck_assert_int_eq(sse_next(p, &ev), 0);
    sse_parser_trim(p);
    /* Nothing is held now, so the next feed must allocate: with allocation
     * failing it cannot succeed. */
    cr_alloc_fail_after(1);
    ck_assert_int_eq(sse_feed(p, "data: x\n\n", 10), CR_ENOMEM);
    cr_alloc_fail_after(0);
    sse_parser_free(p);
}
END_TEST

/* Bytes the C library's malloc has handed out now, or 0 when an interposed
 * allocator (ASan, valgrind) keeps them out of glibc's figures. */
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks;
}

/* Trim gives back both the input buffer and the returned event's buffer. */
START_TEST(test_trim_returns_memory)
{
    struct sse_parser *p = sse_parser_new(0);
    struct sse_event ev;
    struct buf in;
    size_t before, after, probe_before;
    void *probe;

    buf_init(&in);
    ck_assert_int_eq(buf_puts(&in, "data: "), 0);
    for (int i = 0; i < 3000; i++)
        ck_assert_int_eq(buf_putc(&in, 'x'), 0);
    ck_assert_int_eq(buf_puts(&in, "\n\n"), 0);
    ck_assert_int_eq(sse_feed(p, in.data, in.len), 0);
    ck_assert_int_eq(sse_next(p, &ev), 1);
    ck_assert_uint_eq(ev.data_len, 3000);
    ck_assert_int_eq(sse_next(p, &ev), 0);
    probe_before = heap_in_use();
    probe = malloc(10000);
    ck_assert_ptr_nonnull(probe);
    if (heap_in_use() >= probe_before + 10000) {
        free(probe);
        before = heap_in_use();
        sse_parser_trim(p);
        after = heap_in_use();
        /* The input (3,008 bytes) and the event (3,000) each sat in a 4 KB
         * buffer. */
        ck_assert_msg(before - after >= 7000, "trim gave back %zu bytes", before - after);
    } else {
        free(probe);
    }
    buf_release(&in);
    sse_parser_free(p);
}
END_TEST

START_TEST(test_oom_sweep)
{
    static const char *const picks[] = {"mixed", "event type", "done no blank line",
                                        "openai"};
    const struct vec *v = find_vec(picks[_i]);
    int mode;

    for (mode = 0; mode < 3; mode++) {
        long n;
        for (n = 1; n < 1000; n++) {
            struct buf out;
            long failed;
            int rc;
            buf_init(&out);
            cr_alloc_fail_after(n);
            rc = run(v->in, vec_len(v), 0, mode == 2 ? 5 : mode, 3, &out);
            failed = cr_alloc_failed();
            cr_alloc_fail_after(0);
            if (failed == 0) {
                ck_assert_int_eq(rc, 0);
                ck_assert_str_eq(out.data ? out.data : "", v->want);
                buf_release(&out);
                break;
            }
            ck_assert_int_eq(rc, CR_ENOMEM);
            buf_release(&out);
        }
        ck_assert_int_lt(n, 1000);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sse");
    TCase *tc = tcase_create("core");
    int nvec = (int)(sizeof(vecs) / sizeof(vecs[0]));

    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_vectors, 0, nvec);
    tcase_add_loop_test(tc, test_vectors_trimmed, 0, nvec);
    tcase_add_loop_test(tc, test_every_split, 0, nvec);
    tcase_add_test(tc, test_cr_split_across_feeds);
    tcase_add_test(tc, test_utf8_split);
    tcase_add_test(tc, test_comments_and_reset);
    tcase_add_test(tc, test_finish_drains_buffered);
    tcase_add_test(tc, test_event_survives_until_next_call);
    tcase_add_test(tc, test_long_line);
    tcase_add_test(tc, test_line_cap);
    tcase_add_test(tc, test_line_cap_bytewise);
    tcase_add_test(tc, test_event_cap);
    tcase_add_test(tc, test_default_cap);
    tcase_add_test(tc, test_steady_state_no_alloc);
    tcase_add_test(tc, test_trim_frees_parsed_keeps_partial);
    tcase_add_test(tc, test_trim_returns_memory);
    tcase_add_loop_test(tc, test_oom_sweep, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
