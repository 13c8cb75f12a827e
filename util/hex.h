/* hex.h -- one hexadecimal digit's value, for the decoders of \uXXXX escapes
 * and %XX percent-encoding. */
#ifndef CR_HEX_H
#define CR_HEX_H

/* The value of hex digit c (either case), or -1 when c is not one. */
static inline int cr_hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
