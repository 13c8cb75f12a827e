/* base64.c -- see base64.h. */
#include "base64.h"

#include <stdint.h>

#include "err.h"

static const char alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_encode(const void *p, size_t n, struct buf *out)
{
    const unsigned char *s = p;
    char q[4];
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i += 3) {
        unsigned v = (unsigned)s[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        q[0] = alphabet[(v >> 18) & 63];
        q[1] = alphabet[(v >> 12) & 63];
        q[2] = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        q[3] = i + 2 < n ? alphabet[v & 63] : '=';
        rc = buf_append(out, q, 4);
    }
    return rc;
}

static int value(unsigned char c, int urlsafe)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || (urlsafe && c == '-'))
        return 62;
    if (c == '/' || (urlsafe && c == '_'))
        return 63;
    return -1;
}

long base64_decode(const char *s, size_t n, unsigned char *out, unsigned flags)
{
    int strict = (flags & BASE64_STRICT) != 0;
    size_t padded = n, bits = 0;
    uint32_t acc = 0;
    long o = 0;

    while (n > 0 && s[n - 1] == '=')
        n--;
    if (strict && (padded % 4 || padded - n > 2))
        return -1;
    if (n % 4 == 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = value((unsigned char)s[i], !strict);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    return o;
}
