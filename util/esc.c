/* esc.c -- escapes control characters for logs and terminals (no I/O). */
#include "esc.h"

#include <stdio.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (1-4) and its code point, or 0
 * if s does not start one (overlong forms and surrogates are invalid). */
static size_t utf8_len(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0], v;
    size_t len;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        v = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        v = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && (v < 0x800 || (v >= 0xd800 && v <= 0xdfff))) ||
        (len == 4 && (v < 0x10000 || v > 0x10ffff)))
        return 0;
    *cp = v;
    return len;
}

/* The escape for the character at s, in rep (NUL-terminated), or "" to keep
 * it; *adv is how many input bytes it covers. */
static void one(const unsigned char *s, size_t n, unsigned flags, char rep[8],
                size_t *adv)
{
    unsigned cp;
    size_t len = utf8_len(s, n, &cp);

    rep[0] = '\0';
    if (len == 0) {
        snprintf(rep, 8, "\\x%02x", s[0]);
        *adv = 1;
        return;
    }
    *adv = len;
    if (cp == '\n' || cp == '\t') {
        if (!(flags & ESC_KEEP_LAYOUT))
            snprintf(rep, 8, "\\%c", cp == '\n' ? 'n' : 't');
    } else if (cp == '\r') {
        snprintf(rep, 8, "\\r");
    } else if (cp < 0x20 || cp == 0x7f) {
        snprintf(rep, 8, "\\x%02x", cp);
    } else if (cp >= 0x80 && cp <= 0x9f) {
        snprintf(rep, 8, "\\u%04x", cp);
    }
}

size_t esc_ctl(char *out, size_t size, const char *s, size_t n, unsigned flags)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;

    if (!size)
        return 0;
    while (i < n) {
        char rep[8];
        size_t adv, rl;
        one(u + i, n - i, flags, rep, &adv);
        if (rep[0]) {
            rl = strlen(rep);
            if (o + rl >= size)
                break;
            memcpy(out + o, rep, rl);
        } else {
            rl = adv;
            if (o + rl >= size)
                break;
            memcpy(out + o, s + i, rl);
        }
        o += rl;
        i += adv;
    }
    out[o] = '\0';
    return o;
}

int esc_ctl_needed(const char *s, size_t n, unsigned flags)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;

    while (i < n) {
        char rep[8];
        size_t adv;
        /* Plain printable ASCII is the common case: skip it fast. */
        if (u[i] >= 0x20 && u[i] < 0x7f) {
            i++;
            continue;
        }
        one(u + i, n - i, flags, rep, &adv);
        if (rep[0])
            return 1;
        i += adv;
    }
    return 0;
}
