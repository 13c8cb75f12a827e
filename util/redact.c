/* redact.c -- cuts configured secrets out of text (no I/O). */
#include "redact.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "err.h"

void redact_init(struct redact *r)
{
    memset(r, 0, sizeof(*r));
}

void redact_release(struct redact *r)
{
    for (int i = 0; i < r->n; i++)
        cr_free(r->secrets[i]);
    redact_init(r);
}

int redact_add(struct redact *r, const char *s, size_t n)
{
    char *copy;
    if (!s || n < REDACT_MIN_BYTES)
        return 0;
    for (int i = 0; i < r->n; i++)
        if (r->lens[i] == n && !memcmp(r->secrets[i], s, n))
            return 0;
    if (r->n == REDACT_MAX)
        return CR_ERANGE;
    copy = cr_malloc(n + 1);
    if (!copy)
        return CR_ENOMEM;
    memcpy(copy, s, n);
    copy[n] = '\0';
    r->secrets[r->n] = copy;
    r->lens[r->n] = n;
    r->n++;
    return 0;
}

int redact_add_str(struct redact *r, const char *s)
{
    return s ? redact_add(r, s, strlen(s)) : 0;
}

/* How many leading bytes of text (avail bytes) match the secret. */
static size_t match_len(const char *secret, size_t slen, const char *text, size_t avail)
{
    size_t m = 0;
    while (m < slen && m < avail && text[m] == secret[m])
        m++;
    return m;
}

/* Where secret k's head next occurs at or after from, or len if nowhere. */
static size_t next_at(const struct redact *r, int k, const char *s, size_t len,
                      size_t from)
{
    size_t head = r->lens[k] < REDACT_HEAD_BYTES ? r->lens[k] : REDACT_HEAD_BYTES;
    const char *p;
    if (from >= len || len - from < head)
        return len;
    p = memmem(s + from, len - from, r->secrets[k], head);
    return p ? (size_t)(p - s) : len;
}

/* One pass, left to right, over the occurrences of every secret at once (one
 * "next" position per secret, as in a merge): a span starts at the earliest
 * occurrence and takes in every occurrence that begins inside it or right at
 * its end. Every byte of the span is read before any byte is written, and a
 * span is at least REDACT_MIN_BYTES long, longer than the mark, so the write
 * position never passes the read position. */
size_t redact_mem(const struct redact *r, char *s, size_t len)
{
    size_t next[REDACT_MAX];
    size_t in = 0, out = 0;
    const size_t mark = sizeof(REDACT_MARK) - 1;

    if (!r || !r->n || !s || !len)
        return len;
    for (int k = 0; k < r->n; k++)
        next[k] = next_at(r, k, s, len, 0);
    for (;;) {
        size_t start = len, end;
        int grew;
        for (int k = 0; k < r->n; k++)
            if (next[k] < start)
                start = next[k];
        if (start == len)
            break;
        end = start;
        do {
            grew = 0;
            for (int k = 0; k < r->n; k++) {
                while (next[k] < len && next[k] <= end) {
                    size_t e = next[k] + match_len(r->secrets[k], r->lens[k], s + next[k],
                                                   len - next[k]);
                    if (e > end) {
                        end = e;
                        grew = 1;
                    }
                    next[k] = next_at(r, k, s, len, next[k] + 1);
                }
            }
        } while (grew);
        memmove(s + out, s + in, start - in);
        out += start - in;
        memcpy(s + out, REDACT_MARK, mark);
        out += mark;
        in = end;
    }
    memmove(s + out, s + in, len - in);
    return out + (len - in);
}

size_t redact_str(const struct redact *r, char *s)
{
    size_t n;
    if (!s)
        return 0;
    n = redact_mem(r, s, strlen(s));
    s[n] = '\0';
    return n;
}

/* One URL of [url, end): written at out + *o with its password hidden. */
static void redact_one(const char *url, const char *end, char *out, size_t size,
                       size_t *o)
{
    const char *scheme = memmem(url, (size_t)(end - url), "://", 3);
    const char *at = NULL, *colon = NULL;
    int w;

    if (scheme) {
        at = memchr(scheme + 3, '@', (size_t)(end - scheme - 3));
        colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3)) : NULL;
    }
    if (*o >= size)
        return;
    if (colon)
        w = snprintf(out + *o, size - *o, "%.*s:**%.*s", (int)(colon - url), url,
                     (int)(end - at), at);
    else
        w = snprintf(out + *o, size - *o, "%.*s", (int)(end - url), url);
    *o += w > 0 ? (size_t)w : 0;
}

/* A failover list "amqp://u:p@a;amqp://u:p@b" is redacted URL by URL. */
void redact_url(const char *url, char *out, size_t size)
{
    size_t o = 0;

    if (!size)
        return;
    out[0] = '\0';
    for (;;) {
        const char *end = url + strcspn(url, ";");
        redact_one(url, end, out, size, &o);
        if (!*end || o + 1 >= size)
            break;
        out[o++] = ';';
        out[o] = '\0';
        url = end + 1;
    }
    if (o >= size)
        out[size - 1] = '\0';
}
