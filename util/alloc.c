/* alloc.c -- allocator with a fault-injection countdown for tests. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

/* Process-wide test knob; only tests change it, the worker never does. */
static long fail_countdown;
static long failed_count;

static int should_fail(void)
{
    if (fail_countdown > 0 && --fail_countdown == 0) {
        failed_count++;
        fail_countdown = 0;
        return 1;
    }
    return 0;
}

void *cr_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *cr_calloc(size_t nmemb, size_t n)
{
    if (should_fail())
        return NULL;
    return calloc(nmemb ? nmemb : 1, n ? n : 1);
}

void *cr_realloc(void *p, size_t n)
{
    if (should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

void cr_free(void *p)
{
    free(p);
}

char *cr_strndup(const char *s, size_t n)
{
    char *d;
    if (!s)
        return NULL;
    d = cr_malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *cr_strdup(const char *s)
{
    return s ? cr_strndup(s, strlen(s)) : NULL;
}

static void *json_malloc(size_t n)
{
    return cr_malloc(n);
}

void cr_alloc_init(void)
{
    cJSON_Hooks h = {json_malloc, cr_free};
    cJSON_InitHooks(&h);
}

void cr_alloc_fail_after(long n)
{
    fail_countdown = n;
    failed_count = 0;
}

long cr_alloc_failed(void)
{
    return failed_count;
}
