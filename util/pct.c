/* pct.c -- %XX percent-decoding (no I/O). */
#include "pct.h"

#include "err.h"
#include "hex.h"

int pct_decode(char *out, size_t size, const char *s, size_t n, unsigned flags,
               size_t *outlen)
{
    size_t o = 0;
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%' && n - i >= 3) {
            int hi = cr_hexval(s[i + 1]);
            int lo = hi >= 0 ? cr_hexval(s[i + 2]) : -1;
            if (lo >= 0) {
                c = (char)(hi * 16 + lo);
                i += 2;
            }
        } else if (c == '+' && (flags & PCT_PLUS)) {
            c = ' ';
        }
        if (o + 1 >= size) {
            rc = CR_ERANGE;
            break;
        }
        out[o++] = c;
    }
    if (size)
        out[o] = '\0';
    if (outlen)
        *outlen = o;
    return rc;
}
