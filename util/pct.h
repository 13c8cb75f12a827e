/* pct.h -- %XX percent-decoding (RFC 3986 section 2.1) of URL parts and query
 * values. Pure: no I/O, no allocation.
 *
 * A '%' followed by two hex digits (either case) becomes that byte, %00
 * included (the returned length says where the value ends). Every other byte
 * is copied as it is, and so is a '%' that does not start a whole escape
 * ("%zz", a trailing "%4"), as Python's urllib.parse.unquote() keeps it: no
 * caller here treats it as an error. */
#ifndef CR_PCT_H
#define CR_PCT_H

#include <stddef.h>

/* '+' decodes to a space too, as in a query string (form encoding). */
#define PCT_PLUS 1u

/* Decodes s[0..n) into out (size bytes), NUL-terminated when size > 0.
 * Returns 0 with *outlen (when not NULL) set to the decoded length, or
 * CR_ERANGE when the decoded bytes and their NUL do not fit: out then holds
 * the longest decoded prefix that fits, NUL-terminated when size > 0, and
 * *outlen its length. An escape is never cut: it decodes to one byte. With
 * size 0 nothing is written, and only an empty s returns 0. */
int pct_decode(char *out, size_t size, const char *s, size_t n, unsigned flags,
               size_t *outlen);

#endif
