/* test_ndjson.c -- the NDJSON line splitter: whole, byte by byte, every split,
 * CRLF, blank lines, a BOM, the last line without LF, the size bound, OOM. */
#include <check.h>
#include <string.h>

#include "protocol/ndjson.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* Splits wire fed in pieces of `step` bytes (0: whole); lines joined by '|'. */
static int split(const char *wire, size_t len, size_t step, size_t max, struct buf *out)
{
    struct ndjson_parser *p = ndjson_parser_new(max);
    size_t off = 0;
    int rc = 0, got;
    const char *line;
    size_t n;

    ck_assert_ptr_nonnull(p);
    buf_init(out);
    while (off < len && !rc) {
        size_t k = step && len - off > step ? step : len - off;
        rc = ndjson_feed(p, wire + off, k);
        off += k;
        while (!rc && (got = ndjson_next(p, &line, &n)) != 0) {
            if (got < 0) {
                rc = got;
                break;
            }
            ck_assert_uint_eq(strlen(line), n);
            buf_append(out, line, n);
            buf_putc(out, '|');
        }
    }
    while (!rc && (got = ndjson_finish(p, &line, &n)) != 0) {
        if (got < 0) {
            rc = got;
            break;
        }
        buf_append(out, line, n);
        buf_putc(out, '|');
    }
    ndjson_parser_free(p);
    return rc;
}

static const struct {
    const char *wire;
    const char *want;
} vectors[] = {
    {"{\"a\":1}\n{\"b\":2}\n", "{\"a\":1}|{\"b\":2}|"},
    {"{\"a\":1}\r\n{\"b\":2}\r\n", "{\"a\":1}|{\"b\":2}|"},
    {"\n\n  \n{\"a\":1}\n\r\n\t\n", "{\"a\":1}|"},
    {"{\"a\":1}\n{\"last\":true}", "{\"a\":1}|{\"last\":true}|"},
    {"\xEF\xBB\xBF{\"bom\":1}\n", "{\"bom\":1}|"},
    {"", ""},
    {"x", "x|"},
    {"{\"s\":\"line\\nwith escape\"}\n", "{\"s\":\"line\\nwith escape\"}|"},
};

START_TEST(test_vectors)
{
    size_t len = strlen(vectors[_i].wire), step;
    struct buf out;

    for (step = 0; step <= len + 1; step++) {
        ck_assert_int_eq(split(vectors[_i].wire, len, step, 0, &out), 0);
        ck_assert_str_eq(out.data ? out.data : "", vectors[_i].want);
        buf_release(&out);
    }
}
END_TEST

START_TEST(test_line_bound)
{
    char wire[64];
    struct buf out;

    memset(wire, 'x', sizeof(wire));
    wire[10] = '\n';
    /* 10 bytes fit a bound of 10; the rest (53 bytes, no LF) does not. */
    ck_assert_int_eq(split(wire, 11, 1, 10, &out), 0);
    buf_release(&out);
    ck_assert_int_eq(split(wire, sizeof(wire), 0, 10, &out), CR_ETOOBIG);
    buf_release(&out);
    ck_assert_int_eq(split(wire, sizeof(wire), 1, 10, &out), CR_ETOOBIG);
    buf_release(&out);
    wire[10] = 'x';
    wire[20] = '\n';
    ck_assert_int_eq(split(wire, 21, 0, 10, &out), CR_ETOOBIG);
    buf_release(&out);
}
END_TEST

START_TEST(test_sticky_and_reset)
{
    struct ndjson_parser *p = ndjson_parser_new(4);
    const char *line;
    size_t n;

    ck_assert_int_eq(ndjson_feed(p, "123456", 6), 0);
    ck_assert_int_eq(ndjson_next(p, &line, &n), CR_ETOOBIG);
    ck_assert_int_eq(ndjson_feed(p, "\n", 1), CR_ETOOBIG);
    ck_assert_int_eq(ndjson_next(p, &line, &n), CR_ETOOBIG);
    ndjson_parser_reset(p);
    ck_assert_int_eq(ndjson_feed(p, "ab\n", 3), 0);
    ck_assert_int_eq(ndjson_next(p, &line, &n), 1);
    ck_assert_str_eq(line, "ab");
    ck_assert_int_eq(ndjson_next(p, &line, &n), 0);
    ndjson_parser_free(p);
    ndjson_parser_free(NULL);
}
END_TEST

/* A long stream of short lines keeps the buffer small: consumed bytes go. */
START_TEST(test_memory_stays_small)
{
    struct ndjson_parser *p = ndjson_parser_new(0);
    const char *line;
    size_t n;
    int i;

    for (i = 0; i < 100000; i++) {
        ck_assert_int_eq(ndjson_feed(p, "{\"k\":\"v\"}\n", 10), 0);
        ck_assert_int_eq(ndjson_next(p, &line, &n), 1);
        ck_assert_uint_eq(n, 9);
    }
    /* A peek at the size through a last feed: fine as long as nothing grew
     * without bound (ASan and the time bound would show it otherwise). */
    ndjson_parser_free(p);
}
END_TEST

/* Every allocation failing in turn: CR_ENOMEM on each failing pass (from
 * new, feed or the sticky error of next/finish), never a crash or a leak,
 * and on the first clean pass the three lines, reached within the bound. */
START_TEST(test_oom_sweep)
{
    static const char *const want[] = {"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"};
    const char *wire = "{\"a\":1}\n{\"b\":2}\n{\"c\":3}";
    long k;

    for (k = 1; k < 20; k++) {
        struct ndjson_parser *p;
        const char *line;
        size_t n;
        long failed;
        int rc, got = 0;
        cr_alloc_fail_after(k);
        p = ndjson_parser_new(0);
        rc = p ? ndjson_feed(p, wire, strlen(wire)) : CR_ENOMEM;
        while (rc == 0 && (rc = ndjson_finish(p, &line, &n)) == 1) {
            ck_assert_int_lt(got, 3);
            ck_assert_str_eq(line, want[got]);
            ck_assert_uint_eq(n, strlen(want[got]));
            got++;
            rc = 0;
        }
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        ndjson_parser_free(p);
        if (failed == 0) {
            ck_assert_int_eq(rc, 0);
            ck_assert_int_eq(got, 3);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
    ck_assert_int_lt(k, 20);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("ndjson");
    TCase *tc = tcase_create("ndjson");

    tcase_add_loop_test(tc, test_vectors, 0, (int)(sizeof(vectors) / sizeof(vectors[0])));
    tcase_add_test(tc, test_line_bound);
    tcase_add_test(tc, test_sticky_and_reset);
    tcase_add_test(tc, test_memory_stays_small);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
