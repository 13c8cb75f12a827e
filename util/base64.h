/* base64.h -- RFC 4648 base64, the one codec for kombu's message bodies
 * (protocol/kombu.c) and OpenAI's base64 embeddings (protocol/openai.c).
 * Pure: no I/O. */
#ifndef CR_BASE64_H
#define CR_BASE64_H

#include <stddef.h>

#include "buf.h"

/* Appends the standard, padded encoding of n bytes. Returns 0 or CR_ENOMEM
 * (out is then as it was up to the last whole group). */
int base64_encode(const void *p, size_t n, struct buf *out);

/* Strict: the standard alphabet, padded to a multiple of four, '=' only at
 * the end (what Python's b64encode writes). Without it: the standard or the
 * URL-safe alphabet, padding optional (what providers send). */
#define BASE64_STRICT 1u

/* Decodes n characters into out, which must hold n / 4 * 3 + 2 bytes.
 * Returns the decoded length, or -1 on a character outside the alphabet, a
 * misplaced '=' or an impossible length. */
long base64_decode(const char *s, size_t n, unsigned char *out, unsigned flags);

#endif
