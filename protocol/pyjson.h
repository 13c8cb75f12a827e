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

/* ---- Python-flavoured JSON (shared by celery_msg and amqp_json) ----
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

#endif
