/* sha1.c -- SHA-1 (FIPS 180-4), written from the specification. */
#include "sha1.h"

#include <stdint.h>
#include <string.h>

static uint32_t rol(uint32_t x, int n)
{
    return (x << n) | (x >> (32 - n));
}

/* Mixes one 64-byte block into h. */
static void block(uint32_t h[5], const unsigned char *p)
{
    uint32_t w[80], a, b, c, d, e;

    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 80; i++)
        w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    a = h[0];
    b = h[1];
    c = h[2];
    d = h[3];
    e = h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k, t;
        if (i < 20) {
            f = (b & c) | (~b & d);
            k = 0x5a827999;
        } else if (i < 40) {
            f = b ^ c ^ d;
            k = 0x6ed9eba1;
        } else if (i < 60) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8f1bbcdc;
        } else {
            f = b ^ c ^ d;
            k = 0xca62c1d6;
        }
        t = rol(a, 5) + f + e + k + w[i];
        e = d;
        d = c;
        c = rol(b, 30);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void sha1_hex(const void *data, size_t len, char hex[SHA1_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    uint32_t h[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476, 0xc3d2e1f0};
    const unsigned char *p = data;
    unsigned char tail[128];
    size_t rest = len % 64, ntail;
    uint64_t bits = (uint64_t)len * 8;

    for (size_t off = 0; off + 64 <= len; off += 64)
        block(h, p + off);
    /* The padding: 0x80, zeros, then the length in bits, big-endian, so that
     * the whole is a multiple of 64 bytes (one or two more blocks). */
    ntail = rest < 56 ? 64 : 128;
    memset(tail, 0, sizeof(tail));
    if (rest)
        memcpy(tail, p + len - rest, rest);
    tail[rest] = 0x80;
    for (int i = 0; i < 8; i++)
        tail[ntail - 1 - i] = (unsigned char)(bits >> (8 * i));
    block(h, tail);
    if (ntail == 128)
        block(h, tail + 64);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 8; j++)
            hex[8 * i + j] = digits[(h[i] >> (28 - 4 * j)) & 0xf];
    hex[SHA1_HEX_LEN] = '\0';
}
