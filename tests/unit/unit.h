/* unit.h -- helpers every Check suite may use, defined in tests/unit/main.c. */
#ifndef CR_TESTS_UNIT_H
#define CR_TESTS_UNIT_H

#include <stddef.h>

#include "protocol/celery_msg.h"

/* Reads a whole file (a fixture, relative to the repo root) into a new
 * NUL-terminated malloc'd string; *len gets its length when len is not NULL.
 * Fails the running test when the file cannot be read. */
char *unit_read_file(const char *path, size_t *len);

/* obj[key] when it is a string, else NULL. */
const char *unit_str(const cJSON *obj, const char *key);

/* Loads a captured message (tests/fixtures/messages/ form: content_type,
 * content_encoding, headers, properties, body) into *root (the caller
 * cJSON_Delete()s it) and raw, whose strings borrow from *root. */
void unit_load_message(const char *path, cJSON **root, struct celery_raw_msg *raw);

#endif
