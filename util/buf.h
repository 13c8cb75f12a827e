/* buf.h -- growable byte buffer, always NUL-terminated when data != NULL.
 *
 * Embedded by its owner: buf_init() / buf_release(). A failed append leaves the
 * buffer as it was and returns CR_ENOMEM (or CR_ETOOBIG past max_bytes). */
#ifndef CR_BUF_H
#define CR_BUF_H

#include <stddef.h>
#include <stdarg.h>

struct buf {
    /* read-only */
    char *data;
    size_t len;
    size_t cap;
    /* public: 0 means no limit */
    size_t max_bytes;
};

void buf_init(struct buf *b);
void buf_release(struct buf *b);
/* Empties the buffer but keeps its memory for reuse. */
void buf_reset(struct buf *b);
int buf_reserve(struct buf *b, size_t extra);
int buf_append(struct buf *b, const void *p, size_t n);
int buf_puts(struct buf *b, const char *s);
int buf_putc(struct buf *b, char c);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap);
/* Removes the first n bytes (n <= len). */
void buf_consume(struct buf *b, size_t n);
/* Hands the data to the caller (who frees it with cr_free) and re-inits the buffer.
 * Returns an empty string rather than NULL for an empty buffer, or NULL on OOM. */
char *buf_detach(struct buf *b);

#endif
