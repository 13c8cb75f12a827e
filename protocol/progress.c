/* progress.c -- the progress stream's names and entry ids (no I/O). */
#include "progress.h"

#include <stdio.h>

#include "util/err.h"

int progress_key(struct buf *out, const char *task_id)
{
    return buf_printf(out, "%s%s", PROGRESS_KEY_PREFIX, task_id);
}

int progress_range_after(char *out, size_t size, int64_t seq)
{
    int n = snprintf(out, size, "(0-%lld", (long long)seq);
    return n < 0 || (size_t)n >= size ? CR_ERANGE : 0;
}
