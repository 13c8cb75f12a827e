/* sha1.h -- SHA-1 hex digest of a byte string.
 *
 * Only for naming Lua scripts the way Redis does (EVALSHA takes the SHA-1 of
 * the script text), never for security. Pure: no allocation, no I/O. */
#ifndef CR_SHA1_H
#define CR_SHA1_H

#include <stddef.h>

#define SHA1_HEX_LEN 40

/* Writes the lowercase hex digest of data[0..len) and a NUL into hex. */
void sha1_hex(const void *data, size_t len, char hex[SHA1_HEX_LEN + 1]);

#endif
