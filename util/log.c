/* log.c -- leveled logging to stderr, batched per loop turn once asked. */
#include "log.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "esc.h"

int log_threshold = LOG_INFO;

static const char *const level_names[] = {"DEBUG", "INFO", "WARNING", "ERROR",
                                          "CRITICAL"};

/* The one output state of the process: lines wait here between two flushes.
 * A static buffer, so that logging never allocates (an out-of-memory line
 * must still get out) and the exit path has nothing to free. */
static struct {
    int batched;
    int atexit_done;
    size_t len;
    time_t stamp_sec; /* the second stamp[] was formatted for */
    char stamp[72];   /* "2026-12-01 23:45:06" (room for any int, to please -Wformat) */
    char buf[LOG_BATCH_BYTES];
} out = {.stamp_sec = -1};

static void write_all(const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(STDERR_FILENO, p, n);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Someone made stderr non-blocking: wait as a blocking write would. */
            struct pollfd pfd = {.fd = STDERR_FILENO, .events = POLLOUT};
            if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
                return;
        } else {
            return; /* nowhere to report that stderr is gone */
        }
    }
}

void log_flush(void)
{
    size_t n = out.len;
    /* Emptied first: were the write to be interrupted by exit(), the atexit
     * flush must not write the same lines twice. */
    out.len = 0;
    if (n)
        write_all(out.buf, n);
}

void log_batch_start(void)
{
    if (!out.atexit_done && atexit(log_flush) == 0)
        out.atexit_done = 1;
    out.batched = 1;
}

void log_batch_stop(void)
{
    log_flush();
    out.batched = 0;
}

/* Queues or writes one whole line (n bytes, newline included). */
static void emit(int level, const char *line, size_t n)
{
    if (!out.batched) {
        write_all(line, n);
        return;
    }
    if (out.len + n > sizeof(out.buf))
        log_flush();
    memcpy(out.buf + out.len, line, n);
    out.len += n;
    /* What an operator must see, and what comes before a likely exit, does
     * not wait for the end of the turn (the turn may block: a reconnect
     * attempt runs inside a timer). */
    if (level >= LOG_WARNING)
        log_flush();
}

void log_write(int level, const char *fmt, ...)
{
    /* Room for the prefix, a message of 2 KB, and that message with every
     * byte escaped (4 KB, esc_ctl truncates past it). */
    char line[64 + 2048 + 4096 + 2];
    char safe[4096];
    struct timeval tv;
    va_list ap;
    size_t max_msg = 2048;
    int n, m;

    if (level < LOG_DEBUG || level > LOG_CRITICAL)
        level = LOG_ERROR;
    gettimeofday(&tv, NULL);
    /* gmtime_r and the date format cost more than the rest of an INFO line:
     * do them once a second. */
    if (tv.tv_sec != out.stamp_sec) {
        struct tm tm;
        gmtime_r(&tv.tv_sec, &tm);
        snprintf(out.stamp, sizeof(out.stamp), "%04d-%02d-%02d %02d:%02d:%02d",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec);
        out.stamp_sec = tv.tv_sec;
    }
    n = snprintf(line, 64, "[%s,%03ld: %s/MainProcess] ", out.stamp,
                 (long)(tv.tv_usec / 1000), level_names[level]);
    if (n < 0 || n >= 64)
        return;
    va_start(ap, fmt);
    m = vsnprintf(line + n, max_msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    if ((size_t)m >= max_msg - (size_t)n)
        m = (int)(max_msg - (size_t)n - 1); /* truncated, as before */
    /* Messages quote task ids, names and headers that anyone who can publish
     * chose: a newline in one would forge a whole line, an escape sequence would
     * drive the terminal. No message is multi-line on purpose, so every control
     * character of the message (not of the prefix, which is ours) is escaped. */
    if (esc_ctl_needed(line + n, (size_t)m, 0)) {
        size_t k = esc_ctl(safe, sizeof(safe), line + n, (size_t)m, 0);
        memcpy(line + n, safe, k);
        m = (int)k;
    }
    line[n + m] = '\n';
    emit(level, line, (size_t)(n + m + 1));
}

int log_level_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcasecmp(s, "debug"))
        return LOG_DEBUG;
    if (!strcasecmp(s, "info"))
        return LOG_INFO;
    if (!strcasecmp(s, "warning") || !strcasecmp(s, "warn"))
        return LOG_WARNING;
    if (!strcasecmp(s, "error"))
        return LOG_ERROR;
    if (!strcasecmp(s, "critical") || !strcasecmp(s, "fatal"))
        return LOG_CRITICAL;
    return -1;
}
