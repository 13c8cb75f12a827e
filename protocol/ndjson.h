/* ndjson.h -- newline-delimited JSON framing (application/x-ndjson): splits a
 * byte stream into lines. No I/O, no clock; the lines are not parsed here.
 *
 * Same shape as sse.h: ndjson_feed() bytes as they arrive, then ndjson_next()
 * until it returns 0. A line ends at LF; a CR before the LF is dropped, and
 * blank (all-whitespace) lines are skipped. A leading UTF-8 BOM is skipped. */
#ifndef CR_NDJSON_H
#define CR_NDJSON_H

#include <stddef.h>

struct ndjson_parser;

/* Returns a new parser, or NULL on OOM. A line longer than max_line_bytes
 * (0 means 8 MiB, the bound Ollama's own client uses) makes the parser fail
 * with CR_ETOOBIG. */
struct ndjson_parser *ndjson_parser_new(size_t max_line_bytes);
/* NULL is a no-op. */
void ndjson_parser_free(struct ndjson_parser *p);
/* Forgets all state (for a new stream); keeps memory. */
void ndjson_parser_reset(struct ndjson_parser *p);

/* Copies len bytes in. Returns 0, or a sticky negative error (CR_ENOMEM,
 * CR_ETOOBIG); once failed every call returns the same error. Memory held is
 * at most about twice max_line_bytes plus one feed. */
int ndjson_feed(struct ndjson_parser *p, const char *buf, size_t len);
/* Returns 1 with *line / *len set to the next complete line (no line end,
 * NUL-terminated, borrowed until the next call on p), 0 when more input is
 * needed, or the sticky error. */
int ndjson_next(struct ndjson_parser *p, const char **line, size_t *len);
/* At end of stream: returns 1 with the last line when the stream did not end
 * in LF (lenient: a server may close right after its final object), else 0,
 * or the sticky error. Complete lines not yet taken with ndjson_next() come
 * first, one per call, so a caller loops until it returns 0. */
int ndjson_finish(struct ndjson_parser *p, const char **line, size_t *len);

#endif
