/* sse.c -- text/event-stream parser (no I/O). */
#include "sse.h"

#include <string.h>

#include "../util/alloc.h"
#include "../util/buf.h"
#include "../util/err.h"

#define SSE_DEFAULT_MAX_BYTES ((size_t)16 * 1024 * 1024)

/* Input is copied into `in` and consumed line by line from `pos`. Data and type
 * accumulate in `data`/`type`; on dispatch they are swapped with `out_data`/
 * `out_type`, so the event the caller holds stays intact while the next one
 * accumulates, and no buffer is allocated per event once all four have grown. */
struct sse_parser {
    size_t max_bytes;
    int err;             /* sticky CR_E* code, 0 while healthy */
    struct buf in;       /* unconsumed input; bytes before pos are already parsed */
    size_t pos;          /* start of the next unparsed line */
    size_t scan;         /* bytes from pos already searched for a line end */
    size_t tail_len;     /* bytes after the last line end in `in` (cap check) */
    int bom_checked;     /* the first bytes were examined for a BOM */
    int skip_lf;         /* the last line ended with CR: an LF next is part of it */
    int has_data;        /* the pending event had at least one data line */
    struct buf data;     /* pending event data, lines joined by '\n' */
    struct buf type;     /* pending event type */
    struct buf out_data; /* dispatched event (what sse_event points into) */
    struct buf out_type;
    unsigned long comments;
};

static const char bom[3] = {'\xEF', '\xBB', '\xBF'};

struct sse_parser *sse_parser_new(size_t max_event_bytes)
{
    struct sse_parser *p = cr_calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->max_bytes = max_event_bytes ? max_event_bytes : SSE_DEFAULT_MAX_BYTES;
    buf_init(&p->in);
    buf_init(&p->data);
    buf_init(&p->type);
    buf_init(&p->out_data);
    buf_init(&p->out_type);
    p->data.max_bytes = p->max_bytes;
    p->type.max_bytes = p->max_bytes;
    p->out_data.max_bytes = p->max_bytes;
    p->out_type.max_bytes = p->max_bytes;
    return p;
}

void sse_parser_free(struct sse_parser *p)
{
    if (!p)
        return;
    buf_release(&p->in);
    buf_release(&p->data);
    buf_release(&p->type);
    buf_release(&p->out_data);
    buf_release(&p->out_type);
    cr_free(p);
}

void sse_parser_reset(struct sse_parser *p)
{
    buf_reset(&p->in);
    buf_reset(&p->data);
    buf_reset(&p->type);
    buf_reset(&p->out_data);
    buf_reset(&p->out_type);
    p->err = 0;
    p->pos = 0;
    p->scan = 0;
    p->tail_len = 0;
    p->bom_checked = 0;
    p->skip_lf = 0;
    p->has_data = 0;
    p->comments = 0;
}

void sse_parser_trim(struct sse_parser *p)
{
    if (p->pos >= p->in.len) {
        buf_release(&p->in);
        p->pos = 0;
        p->scan = 0;
    }
    if (!p->data.len)
        buf_release(&p->data);
    if (!p->type.len)
        buf_release(&p->type);
    buf_release(&p->out_data);
    buf_release(&p->out_type);
}

static int fail(struct sse_parser *p, int code)
{
    p->err = code;
    return code;
}

int sse_feed(struct sse_parser *p, const char *buf, size_t len)
{
    size_t i;
    int rc;

    if (p->err)
        return p->err;
    if (len == 0)
        return 0;
    /* Enforce the line cap here, before copying, so that a peer that never sends
     * a line end cannot make us buffer more than max_bytes of it. */
    for (i = len; i > 0; i--)
        if (buf[i - 1] == '\n' || buf[i - 1] == '\r')
            break;
    if (i > 0)
        p->tail_len = len - i;
    else
        p->tail_len += len;
    if (p->tail_len > p->max_bytes)
        return fail(p, CR_ETOOBIG);
    /* Drop parsed bytes only now: the previous event may point at out_data but
     * never into `in`, so compaction is always safe. */
    if (p->pos > 0) {
        buf_consume(&p->in, p->pos);
        p->pos = 0;
    }
    rc = buf_append(&p->in, buf, len);
    if (rc)
        return fail(p, rc);
    return 0;
}

static int field_is(const char *name, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    return n == m && memcmp(name, lit, m) == 0;
}

/* Applies one complete line (without its line end). Returns 1 when it
 * dispatched an event into out_data/out_type, 0 otherwise, or an error. */
static int process_line(struct sse_parser *p, const char *line, size_t n)
{
    const char *colon, *val;
    size_t name_len, val_len;
    int rc;

    if (n == 0) {
        struct buf tmp;
        if (!p->has_data) {
            buf_reset(&p->type);
            return 0;
        }
        tmp = p->out_data;
        p->out_data = p->data;
        p->data = tmp;
        tmp = p->out_type;
        p->out_type = p->type;
        p->type = tmp;
        buf_reset(&p->data);
        buf_reset(&p->type);
        p->has_data = 0;
        return 1;
    }
    if (line[0] == ':') {
        p->comments++;
        return 0;
    }
    colon = memchr(line, ':', n);
    if (colon) {
        name_len = (size_t)(colon - line);
        val = colon + 1;
        val_len = n - name_len - 1;
        if (val_len > 0 && val[0] == ' ') {
            val++;
            val_len--;
        }
    } else {
        name_len = n;
        val = line + n;
        val_len = 0;
    }
    if (field_is(line, name_len, "data")) {
        if (p->has_data) {
            rc = buf_putc(&p->data, '\n');
            if (rc)
                return rc;
        }
        rc = buf_append(&p->data, val, val_len);
        if (rc)
            return rc;
        p->has_data = 1;
    } else if (field_is(line, name_len, "event")) {
        buf_reset(&p->type);
        rc = buf_append(&p->type, val, val_len);
        if (rc)
            return rc;
    }
    /* "id", "retry" and unknown fields are ignored: we never reconnect with
     * Last-Event-ID, and the worker owns its own retry policy. */
    return 0;
}

static void fill_event(const struct sse_parser *p, struct sse_event *ev)
{
    ev->type = p->out_type.data ? p->out_type.data : "";
    ev->type_len = p->out_type.len;
    ev->data = p->out_data.data ? p->out_data.data : "";
    ev->data_len = p->out_data.len;
}

/* Returns 1 when the BOM question is settled, 0 when more bytes are needed. */
static int check_bom(struct sse_parser *p)
{
    size_t avail = p->in.len - p->pos;
    size_t n = avail < sizeof(bom) ? avail : sizeof(bom);

    if (memcmp(p->in.data + p->pos, bom, n) != 0) {
        p->bom_checked = 1;
        return 1;
    }
    if (n < sizeof(bom))
        return 0;
    p->pos += sizeof(bom);
    p->bom_checked = 1;
    return 1;
}

int sse_next(struct sse_parser *p, struct sse_event *ev)
{
    int rc;

    if (p->err)
        return p->err;
    for (;;) {
        const char *s;
        size_t i, end;

        if (p->pos >= p->in.len)
            return 0;
        if (!p->bom_checked && !check_bom(p))
            return 0;
        if (p->skip_lf) {
            if (p->pos >= p->in.len)
                return 0;
            if (p->in.data[p->pos] == '\n')
                p->pos++;
            p->skip_lf = 0;
            continue;
        }
        s = p->in.data;
        end = p->in.len;
        for (i = p->pos + p->scan; i < end; i++)
            if (s[i] == '\n' || s[i] == '\r')
                break;
        if (i == end) {
            p->scan = end - p->pos;
            return 0;
        }
        rc = process_line(p, s + p->pos, i - p->pos);
        p->scan = 0;
        p->pos = i + 1;
        if (s[i] == '\r')
            p->skip_lf = 1;
        if (rc < 0)
            return fail(p, rc);
        if (rc == 1) {
            fill_event(p, ev);
            return 1;
        }
    }
}

int sse_finish(struct sse_parser *p, struct sse_event *ev)
{
    int rc = sse_next(p, ev);

    if (rc != 0)
        return rc;
    /* Whatever is left has no line end: treat it as a last line. A lone BOM
     * prefix or a pending LF skip leaves nothing that could be "[DONE]". */
    if (p->pos < p->in.len) {
        rc = process_line(p, p->in.data + p->pos, p->in.len - p->pos);
        p->pos = p->in.len;
        p->scan = 0;
        p->tail_len = 0;
        if (rc < 0)
            return fail(p, rc);
    }
    if (p->has_data && p->data.len == 6 && memcmp(p->data.data, "[DONE]", 6) == 0) {
        rc = process_line(p, "", 0);
        fill_event(p, ev);
        return rc;
    }
    /* The spec discards an unterminated event. */
    buf_reset(&p->data);
    buf_reset(&p->type);
    p->has_data = 0;
    return 0;
}

unsigned long sse_comments_seen(const struct sse_parser *p)
{
    return p->comments;
}

/* ------------------------------------------------------------------ sniff */

int sse_sniff(const char *buf, size_t len, int at_end)
{
    static const char *const fields[] = {"data", "event", "id", "retry"};
    size_t i = 0, n, k, m;
    int maybe = 0;

    n = len < sizeof(bom) ? len : sizeof(bom);
    if (n > 0 && memcmp(buf, bom, n) == 0) {
        if (n < sizeof(bom))
            return at_end ? 0 : -1;
        i = sizeof(bom);
    }
    /* Blank lines before the first field are allowed by the framing; a body
     * of nothing else for this long is not worth waiting on. */
    for (k = 0; i < len && (buf[i] == '\r' || buf[i] == '\n'); i++, k++)
        if (k >= SSE_SNIFF_BYTES)
            return 0;
    if (i >= len)
        return at_end ? 0 : -1;
    if (buf[i] == ':')
        return 1;
    n = len - i;
    for (k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
        m = strlen(fields[k]);
        if (n > m) {
            char c = buf[i + m];
            if (memcmp(buf + i, fields[k], m) == 0 &&
                (c == ':' || c == '\r' || c == '\n'))
                return 1;
        } else if (memcmp(buf + i, fields[k], n) == 0) {
            /* "dat", or "data" with the byte after it still to come. */
            maybe = 1;
        }
    }
    if (maybe && !at_end)
        return -1;
    /* At the end, a body that is exactly a field name is one empty field. */
    if (maybe) {
        for (k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
            if (n == strlen(fields[k]) && memcmp(buf + i, fields[k], n) == 0)
                return 1;
    }
    return 0;
}
