/* log.c -- leveled logging to stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include "esc.h"

int log_threshold = LOG_INFO;

static const char *const level_names[] = {"DEBUG", "INFO", "WARNING", "ERROR",
                                          "CRITICAL"};

void log_write(int level, const char *fmt, ...)
{
    char line[2048];
    char safe[4096];
    struct timeval tv;
    struct tm tm;
    va_list ap;
    int n;

    if (level < LOG_DEBUG || level > LOG_CRITICAL)
        level = LOG_ERROR;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = snprintf(line, sizeof(line),
                 "[%04d-%02d-%02d %02d:%02d:%02d,%03ld: %s/MainProcess] ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                 tm.tm_sec, (long)(tv.tv_usec / 1000), level_names[level]);
    if (n < 0)
        return;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* Messages quote task ids, names and headers that anyone who can publish
     * chose: a newline in one would forge a whole line, an escape sequence would
     * drive the terminal. No message is multi-line on purpose, so every control
     * character of the message (not of the prefix, which is ours) is escaped. */
    if (esc_ctl_needed(line + n, strlen(line + n), 0)) {
        esc_ctl(safe, sizeof(safe), line + n, strlen(line + n), 0);
        fprintf(stderr, "%.*s%s\n", n, line, safe);
        return;
    }
    /* One fputs per line so concurrent writers never interleave mid-line. */
    fprintf(stderr, "%s\n", line);
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
