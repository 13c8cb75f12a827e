/* ndjson.c -- newline-delimited JSON line splitter (no I/O). */
#include "ndjson.h"

#include <string.h>

#include "../util/alloc.h"
#include "../util/buf.h"
#include "../util/err.h"

#define DEFAULT_MAX_LINE (8u << 20)

struct ndjson_parser {
    struct buf in; /* unconsumed bytes start at `pos` */
    size_t pos;    /* start of the next line in `in` */
    size_t scan;   /* bytes from pos already known to hold no LF */
    size_t max_line;
    int err;
    int bom_checked;
};

struct ndjson_parser *ndjson_parser_new(size_t max_line_bytes)
{
    struct ndjson_parser *p = cr_calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    buf_init(&p->in);
    p->max_line = max_line_bytes ? max_line_bytes : DEFAULT_MAX_LINE;
    return p;
}

void ndjson_parser_free(struct ndjson_parser *p)
{
    if (!p)
        return;
    buf_release(&p->in);
    cr_free(p);
}

void ndjson_parser_reset(struct ndjson_parser *p)
{
    buf_reset(&p->in);
    p->pos = p->scan = 0;
    p->err = 0;
    p->bom_checked = 0;
}

/* Drops consumed bytes once they are most of the buffer, so a long stream
 * does not grow it: each byte is moved at most a few times. */
static void compact(struct ndjson_parser *p)
{
    if (p->pos > 0 && p->pos >= p->in.len / 2) {
        buf_consume(&p->in, p->pos);
        p->pos = 0;
    }
}

int ndjson_feed(struct ndjson_parser *p, const char *buf, size_t len)
{
    int rc;

    if (p->err)
        return p->err;
    compact(p);
    rc = buf_append(&p->in, buf, len);
    if (rc)
        return p->err = rc;
    return 0;
}

static int blank(const char *s, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    return 1;
}

/* Takes [pos, pos+n) as a line (n excludes the LF, eat says how many bytes to
 * consume). Returns 1 with the line, or 0 for a blank line. */
static int take(struct ndjson_parser *p, size_t n, size_t eat, const char **line,
                size_t *len)
{
    char *s = p->in.data + p->pos;

    p->pos += eat;
    p->scan = 0;
    if (!p->bom_checked) {
        p->bom_checked = 1;
        if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            n -= 3;
        }
    }
    if (n > 0 && s[n - 1] == '\r')
        n--;
    if (blank(s, n))
        return 0;
    s[n] = '\0'; /* the LF (or the buffer's own NUL) */
    *line = s;
    *len = n;
    return 1;
}

int ndjson_next(struct ndjson_parser *p, const char **line, size_t *len)
{
    for (;;) {
        const char *start, *lf;
        size_t avail;

        if (p->err)
            return p->err;
        avail = p->in.len - p->pos;
        start = p->in.data ? p->in.data + p->pos : NULL;
        lf = avail > p->scan ? memchr(start + p->scan, '\n', avail - p->scan) : NULL;
        if (!lf) {
            p->scan = avail;
            if (avail > p->max_line)
                return p->err = CR_ETOOBIG;
            return 0;
        }
        if ((size_t)(lf - start) > p->max_line)
            return p->err = CR_ETOOBIG;
        if (take(p, (size_t)(lf - start), (size_t)(lf - start) + 1, line, len))
            return 1;
    }
}

int ndjson_finish(struct ndjson_parser *p, const char **line, size_t *len)
{
    int rc = ndjson_next(p, line, len);
    size_t avail;

    if (rc != 0)
        return rc;
    avail = p->in.len - p->pos;
    if (avail == 0)
        return 0;
    return take(p, avail, avail, line, len);
}
