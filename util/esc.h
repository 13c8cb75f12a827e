/* esc.h -- makes untrusted text safe to put in a log line or on a terminal.
 * Pure: no I/O.
 *
 * Task ids, task names and headers come from whoever can publish to a queue.
 * Written raw, a newline forges a whole log line and an escape sequence drives
 * the operator's terminal. esc_ctl() turns every control character into
 * visible text:
 * - C0 controls (0x00-0x1f) and DEL: "\n", "\r", "\t", else "\xNN";
 * - C1 controls (U+0080-U+009F, written as UTF-8): "\u00NN" (some terminals
 *   act on them as on ESC [);
 * - a byte that is not part of valid UTF-8: "\xNN".
 * Everything else, valid UTF-8 included, is kept. A backslash is not doubled:
 * the aim is that no text can forge a line or drive a terminal, not an encoding
 * that can be reversed. */
#ifndef CR_ESC_H
#define CR_ESC_H

#include <stddef.h>

/* Keeps '\n' and '\t' (text whose layout is ours, such as cJSON_Print()'s). */
#define ESC_KEEP_LAYOUT 1u

/* Writes s[0..n) escaped into out (size bytes, size > 0), NUL-terminated. Stops
 * before an escape or a character that does not fit whole. Returns the bytes
 * written (without the NUL). */
size_t esc_ctl(char *out, size_t size, const char *s, size_t n, unsigned flags);

/* 1 if esc_ctl() would change s[0..n), else 0. */
int esc_ctl_needed(const char *s, size_t n, unsigned flags);

#endif
