/* md5.h -- MD5 (RFC 1321) hex digest of a byte string.
 *
 * Only for checking what SQS says it stored (MD5OfBody of a received message,
 * MD5OfMessageBody of a sent one), never for security. Pure: no allocation,
 * no I/O. */
#ifndef CR_MD5_H
#define CR_MD5_H

#include <stddef.h>

#define MD5_HEX_LEN 32

/* Writes the lowercase hex digest of data[0..len) and a NUL into hex. */
void md5_hex(const void *data, size_t len, char hex[MD5_HEX_LEN + 1]);

#endif
