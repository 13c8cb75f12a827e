/* sse.h -- text/event-stream parser (WHATWG framing). No I/O, no clock.
 *
 * Usage: sse_feed() bytes as they arrive, then call sse_next() until it returns 0.
 * Lines end at CRLF, LF or a lone CR (a CR at the end of one feed followed by LF
 * at the start of the next is one line end). A leading UTF-8 BOM is skipped.
 * Comment lines (":...") are ignored but counted in comments_seen. "data" lines
 * accumulate joined by '\n'; "event" sets the type; "id" and "retry" are ignored;
 * a blank line dispatches the event if it had any data line. */
#ifndef CR_SSE_H
#define CR_SSE_H

#include <stddef.h>

struct sse_event {
    /* Both point into the parser and stay valid until the next sse_feed(),
     * sse_next(), sse_finish() or sse_parser_free() on the same parser. */
    const char *type; /* "" when the event had no "event:" line */
    size_t type_len;
    const char *data; /* NUL-terminated; data lines joined with '\n' */
    size_t data_len;
};

struct sse_parser;

/* Returns a new parser, or NULL on OOM. A single event (or line) longer than
 * max_event_bytes makes the parser fail with CR_ETOOBIG (0 means 16 MiB). */
struct sse_parser *sse_parser_new(size_t max_event_bytes);
/* NULL is a no-op. */
void sse_parser_free(struct sse_parser *p);
/* Forgets all state (for reuse on a new stream); keeps memory. */
void sse_parser_reset(struct sse_parser *p);
/* Frees the memory of what is already parsed: consumed input, and the last
 * event returned (its sse_event pointers become invalid). Parsing state,
 * including a partial line or event, is kept. For a caller holding many idle
 * streams: a parser waiting for input then holds no buffers, at the cost of
 * allocating them again on the next feed. */
void sse_parser_trim(struct sse_parser *p);

/* Copies len bytes in. Returns 0, or a sticky negative error (CR_ENOMEM,
 * CR_ETOOBIG); once failed every call returns the same error. */
int sse_feed(struct sse_parser *p, const char *buf, size_t len);
/* Returns 1 and fills *ev with the next complete event, 0 when more input is
 * needed, or the sticky negative error. */
int sse_next(struct sse_parser *p, struct sse_event *ev);
/* At end of stream. Lenient: returns 1 with *ev when an unterminated pending
 * event's data (including a last line with no line end) is exactly "[DONE]";
 * otherwise 0 (the spec discards unterminated events). Complete events still
 * buffered (sse_next() not drained) are returned first, one per call, so a
 * caller may loop until it returns 0. The pending event is gone afterwards. */
int sse_finish(struct sse_parser *p, struct sse_event *ev);
/* Bytes sse_sniff() looks at, at most (after a BOM and leading blank lines). */
#define SSE_SNIFF_BYTES 256

/* Tells from its first bytes whether a body is an event stream, whatever its
 * Content-Type said (a gateway may drop or relabel it). It is one when, after
 * an optional UTF-8 BOM and blank lines, the first line is a comment (":...")
 * or a "data", "event", "id" or "retry" field (the name followed by ':' or the
 * line end). Returns 1 (a stream), 0 (not one), or -1 when the len bytes seen
 * so far cannot tell yet; with at_end (the body is complete) never -1. Reads at
 * most SSE_SNIFF_BYTES plus the BOM and blank lines it skips, and decides 0
 * once that many blank bytes came. Pure; buf may be NULL when len is 0. */
int sse_sniff(const char *buf, size_t len, int at_end);

/* Number of comment lines seen since creation or reset (keepalive pings). */
unsigned long sse_comments_seen(const struct sse_parser *p);

#endif
