/* pyjson.h -- Python-compatible JSON: what Python's json module writes and
 * accepts, ints and floats kept apart, and Python's repr() of JSON values.
 * Pure: no I/O, no clock, no globals. */
#ifndef CR_PYJSON_H
#define CR_PYJSON_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

/* Appends Python's repr() of a JSON value: strings in single quotes with Python
 * escaping, true/false/null as True/False/None, lists [..], dicts {'k': v},
 * integral numbers without a fraction. Stops after max_bytes (0 = no limit) and
 * then ends with "...". Returns 0 or CR_ENOMEM.
 *
 * Details: a string holding ' but no " is put in double quotes, as Python does.
 * \\, \t, \n, \r and the quote are escaped, other control characters and DEL
 * become \xNN, and non-ASCII characters that Python 3.11 (Unicode 14) does not
 * print (C1 controls, format characters, separators, private use, unassigned)
 * become \xNN, \uNNNN or \UNNNNNNNN. Numbers with PY_JSON_FLOAT, and
 * non-integral ones, use Python's float repr (1.0, 0.1, 1e-05, inf, nan).
 * Truncation: when the repr is longer than max_bytes, its first max_bytes bytes
 * (cut back to a character boundary) are appended followed by "...", so at most
 * max_bytes + 3 bytes are added. */
int py_repr(const cJSON *v, struct buf *out, size_t max_bytes);

/* ---- Python-flavoured JSON (shared by celery_msg and rmq_json) ----
 *
 * cJSON keeps every number as a double, so "1.0" and "1" would look the same and
 * a float argument would come back to Python as an int. The functions below keep
 * the difference with one bit in item->type. cJSON masks the type with 0xFF
 * everywhere (cJSON_IsNumber(), printing, cJSON_Compare()) and keeps the bit in
 * cJSON_Duplicate(), so code that tests types with cJSON_Is*() is unaffected. */

/* Set on numbers written as floats ("1.0", "2e3", an AMQP 'd' or 'f'). */
#define PY_JSON_FLOAT 0x1000
/* Deepest nesting of arrays/objects py_json_parse() accepts (the top level is 1). */
#define PY_JSON_MAX_DEPTH 64

/* Parses len bytes of JSON text (no NUL needed) into a new tree in *out (free with
 * cJSON_Delete()). Stricter than cJSON: the text must be valid UTF-8 (no
 * overlongs, no encoded surrogates), follow RFC 8259 exactly (no trailing
 * commas, leading zeros, single quotes; only the four JSON whitespace bytes)
 * and nest at most PY_JSON_MAX_DEPTH deep; these checks run before cJSON sees
 * the text. Like Python's json module, NaN, Infinity and -Infinity are accepted
 * (py_json_dumps() writes them), as are numbers too large for a double (inf). Also
 * rejected, because cJSON strings and numbers cannot carry them: "\u0000", lone surrogate
 * escapes, and numbers longer than 63 characters. Numbers written with a
 * fraction or exponent get PY_JSON_FLOAT. Returns 0, CR_EDECODE (detail in err)
 * or CR_ENOMEM; *out is NULL on error. */
int py_json_parse(const char *text, size_t len, cJSON **out, struct cr_err *err);

/* Appends v the way Python's json.dumps() (and so kombu) writes it: ", " and
 * ": " separators, ensure_ascii escapes (\u00e9, surrogate pairs above U+FFFF),
 * integral numbers without a fraction unless PY_JSON_FLOAT is set, other numbers
 * as Python's shortest float repr (0.1, 1e-05, 1e+16), NaN/Infinity as Python
 * spells them. cJSON_Raw items are copied verbatim. Invalid UTF-8 in a string is
 * written as \ufffd. Returns 0 or CR_ENOMEM (out may then hold a partial
 * value). */
int py_json_dumps(const cJSON *v, struct buf *out);

/* Appends the NUL-terminated s as a JSON string, escaped as py_json_dumps()
 * escapes strings (ensure_ascii). Returns 0 or CR_ENOMEM (out may then hold a
 * partial string). */
int py_json_string(struct buf *out, const char *s);

/* Returns a new number item with PY_JSON_FLOAT set, or NULL on OOM. */
cJSON *py_json_float(double v);

/* Decodes one strict UTF-8 sequence at s (len > 0 bytes available): returns its
 * length (1..4) and sets *cp, or returns 0 when the bytes are not valid UTF-8
 * (overlong forms, surrogates, values above U+10FFFF, truncation). */
size_t py_utf8_next(const char *s, size_t len, uint32_t *cp);

/* ---- Strict scanning, no tree ----
 *
 * The checks py_json_parse() makes, for callers that read JSON text in place
 * (the OpenAI chunk fast path). A scanner reads len bytes from text (no NUL
 * needed, borrowed for the scanner's life) and never allocates. Every
 * py_json_scan_*() function returns 0, having moved pos past what it read, or
 * -1 with why set to a static description of the first error and pos at (or
 * near) the offending byte; after an error the scanner is only good for
 * reading why and pos. What is accepted: RFC 8259 exactly, strict UTF-8 (no
 * overlongs, no encoded surrogates) in strings, no "\u0000" and no lone
 * surrogate escapes, numbers at most PY_JSON_MAX_NUMBER characters long,
 * nesting at most PY_JSON_MAX_DEPTH deep; py_json_scan_value() also takes NaN,
 * Infinity and -Infinity, and notes them in nonfinite. */

/* Longest number accepted: cJSON reads a number through a 64-byte buffer. */
#define PY_JSON_MAX_NUMBER 63

struct py_json_scan {
    /* read-only */
    const char *s;
    size_t len;
    size_t pos;      /* next byte to read */
    int depth;       /* containers open now */
    int nonfinite;   /* NaN or [-]Infinity was scanned */
    const char *why; /* NULL, or the first error */
};

/* A scanned string: its raw bytes between the quotes, borrowed from the text. */
struct py_json_str {
    const char *p;
    size_t raw; /* bytes in the text */
    size_t len; /* bytes once unescaped; == raw exactly when there is no escape */
};

void py_json_scan_init(struct py_json_scan *sc, const char *text, size_t len);
/* Skips the four JSON whitespace bytes. */
void py_json_skip_ws(struct py_json_scan *sc);
/* Scans one value of any kind (no whitespace skipped after it). */
int py_json_scan_value(struct py_json_scan *sc);
/* Scans a whole text: one value with only whitespace around it. */
int py_json_scan_text(struct py_json_scan *sc);
/* The string at pos (which must be '"') into *out. */
int py_json_scan_string(struct py_json_scan *sc, struct py_json_str *out);
/* The number at pos; NaN and Infinity are not numbers here. */
int py_json_scan_number(struct py_json_scan *sc);
/* The exact bytes of lit ("true", "null", ...) at pos. */
int py_json_scan_literal(struct py_json_scan *sc, const char *lit);

/* Called with pos at the start of a member's value (whitespace skipped); must
 * scan exactly that value and return 0, or return non-zero to stop the scan
 * (setting why is optional). key is borrowed for the call. */
typedef int py_json_member_fn(struct py_json_scan *sc, const struct py_json_str *key,
                              void *privdata);
/* Called with pos at the start of element number index (0, 1, ...). */
typedef int py_json_element_fn(struct py_json_scan *sc, size_t index, void *privdata);

/* The object (or array) at pos, handing each member (element) to the callback,
 * which scans its value. The container counts towards PY_JSON_MAX_DEPTH while
 * it is open. A callback's refusal fails the scan with why "value refused"
 * unless the callback set why itself. */
int py_json_scan_object(struct py_json_scan *sc, py_json_member_fn *member,
                        void *privdata);
int py_json_scan_array(struct py_json_scan *sc, py_json_element_fn *element,
                       void *privdata);

/* Writes the s->len bytes of a string py_json_scan_string() accepted, escapes
 * decoded (\uXXXX as UTF-8, surrogate pairs joined) exactly as cJSON decodes
 * them. No NUL is added; out must hold s->len bytes. */
void py_json_unescape(const struct py_json_str *s, char *out);

#endif
