/* alloc.h -- the one allocator every module uses, with a fault-injection hook.
 *
 * Tests call cr_alloc_fail_after(n) so that the n-th next allocation fails (curl
 * torture style) and check that nothing leaks or crashes. cJSON is pointed at these
 * functions by cr_alloc_init(). */
#ifndef CR_ALLOC_H
#define CR_ALLOC_H

#include <stddef.h>

void *cr_malloc(size_t n);
void *cr_calloc(size_t nmemb, size_t n);
void *cr_realloc(void *p, size_t n);
void cr_free(void *p);
/* Returns a new copy of s (NULL if s is NULL or on OOM); caller frees with cr_free. */
char *cr_strdup(const char *s);
/* Returns a new NUL-terminated copy of the first n bytes of s. */
char *cr_strndup(const char *s, size_t n);

/* Installs the hooks into cJSON. Call once at start-up (tests too). */
void cr_alloc_init(void);

/* Test hook: the n-th allocation from now fails (n >= 1); 0 disables. */
void cr_alloc_fail_after(long n);
/* Number of allocations that failed on purpose since the last cr_alloc_fail_after. */
long cr_alloc_failed(void);

#endif
