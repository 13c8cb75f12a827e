/* unit.h -- helpers every Check suite may use, defined in tests/unit/main.c. */
#ifndef CR_TESTS_UNIT_H
#define CR_TESTS_UNIT_H

#include <stddef.h>

/* Reads a whole file (a fixture, relative to the repo root) into a new
 * NUL-terminated malloc'd string; *len gets its length when len is not NULL.
 * Fails the running test when the file cannot be read. */
char *unit_read_file(const char *path, size_t *len);

#endif
