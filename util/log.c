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
int log_format = LOG_FORMAT_TEXT;

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

/* Keeps the second's stamp current: gmtime_r and the date format cost more
 * than the rest of an INFO line, so they run once a second. */
static void stamp(const struct timeval *tv)
{
    struct tm tm;
    if (tv->tv_sec == out.stamp_sec)
        return;
    gmtime_r(&tv->tv_sec, &tm);
    snprintf(out.stamp, sizeof(out.stamp), "%04d-%02d-%02d %02d:%02d:%02d",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
             tm.tm_sec);
    out.stamp_sec = tv->tv_sec;
}

/* Formats the message into at most max bytes (NUL included) and escapes it
 * into safe (LOG_SAFE_MAX bytes; util/esc.h: messages quote task ids, names
 * and headers that anyone who can publish chose; a newline in one would forge
 * a whole line, an escape sequence would drive the terminal; no message is
 * multi-line on purpose). Returns its length, or -1. */
#define LOG_MSG_MAX 2048
#define LOG_SAFE_MAX 4096
static int format_msg(char *safe, size_t max, const char *fmt, va_list ap)
{
    char msg[LOG_MSG_MAX];
    int m;
    if (max > sizeof(msg))
        max = sizeof(msg);
    m = vsnprintf(msg, max, fmt, ap);
    if (m < 0)
        return -1;
    if ((size_t)m >= max)
        m = (int)max - 1; /* truncated */
    if (esc_ctl_needed(msg, (size_t)m, 0))
        return (int)esc_ctl(safe, LOG_SAFE_MAX, msg, (size_t)m, 0);
    memcpy(safe, msg, (size_t)m);
    safe[m] = '\0';
    return m;
}

/* The text line's prefix ("[2026-12-01 23:45:06,123: INFO/MainProcess] "). */
static int text_prefix(char *line, int level, const struct timeval *tv)
{
    int n = snprintf(line, 64, "[%s,%03ld: %s/MainProcess] ", out.stamp,
                     (long)(tv->tv_usec / 1000), level_names[level]);
    return n < 0 || n >= 64 ? -1 : n;
}

static void text_line(int level, char *line, int n, const char *msg, size_t m)
{
    memcpy(line + n, msg, m);
    line[(size_t)n + m] = '\n';
    emit(level, line, (size_t)n + m + 1);
}

/* A bounded writer of one JSON line. */
struct jline {
    char *p;
    size_t len, cap;
};

static void j_raw(struct jline *j, const char *s)
{
    size_t n = strlen(s);
    if (j->len + n < j->cap) {
        memcpy(j->p + j->len, s, n);
        j->len += n;
    }
}

/* s[0..n) as a JSON string's contents. The text has been through esc_ctl()
 * (no control characters, valid UTF-8), so only '"' and '\\' need escaping.
 * Were room to run out (the buffer is sized so that it cannot), the cut falls
 * on a character boundary. */
static void j_str(struct jline *j, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int esc = s[i] == '"' || s[i] == '\\';
        if (j->len + 1 + (size_t)esc + 2 >= j->cap) {
            while (j->len && ((unsigned char)j->p[j->len - 1] & 0xC0) == 0x80)
                j->len--;
            if (j->len && ((unsigned char)j->p[j->len - 1] & 0x80))
                j->len--;
            break;
        }
        if (esc)
            j->p[j->len++] = '\\';
        j->p[j->len++] = s[i];
    }
}

static void j_field(struct jline *j, const char *key, const char *v, size_t n)
{
    j_raw(j, ",\"");
    j_raw(j, key);
    j_raw(j, "\":\"");
    j_str(j, v, n);
    j_raw(j, "\"");
}

/* The logger's name: "celeriac." and file without its extension, '/' as '.'
 * ("net/redis.c" -> "celeriac.net.redis"). */
static size_t logger_name(char *name, size_t size, const char *file)
{
    static const char base[] = "celeriac";
    size_t n = sizeof(base) - 1;
    memcpy(name, base, n);
    if (!file)
        return n;
    while (file[0] == '.' && file[1] == '/')
        file += 2;
    if (n + 1 < size)
        name[n++] = '.';
    for (const char *c = file; *c && *c != '.' && n + 1 < size; c++) {
        char ch = *c;
        if (ch == '/')
            ch = '.';
        else if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
            ch = '_';
        name[n++] = ch;
    }
    return n;
}

/* A task line starts "Task NAME[ID]" followed by ' ', ':' or its end.
 * Finds NAME and ID within the first LOG_TASK_SCAN bytes. */
#define LOG_TASK_SCAN 600
#define LOG_FIELD_MAX 255
static int task_of(const char *msg, size_t m, const char **name, size_t *nlen,
                   const char **id, size_t *ilen)
{
    size_t lim = m < LOG_TASK_SCAN ? m : LOG_TASK_SCAN, i = 5, open;
    if (m < 5 || memcmp(msg, "Task ", 5))
        return 0;
    while (i < lim && msg[i] != '[' && msg[i] != ' ')
        i++;
    if (i >= lim || msg[i] != '[' || i == 5 || i - 5 > LOG_FIELD_MAX)
        return 0;
    open = i;
    for (i = open + 1; i < lim; i++)
        if (msg[i] == ']' && (i + 1 == m || msg[i + 1] == ' ' || msg[i + 1] == ':'))
            break;
    if (i >= lim || i - open - 1 > LOG_FIELD_MAX)
        return 0;
    *name = msg + 5;
    *nlen = open - 5;
    *id = msg + open + 1;
    *ilen = i - open - 1;
    return 1;
}

static struct {
    size_t len;
    char name[LOG_FIELD_MAX + 1];
} worker_name;

void log_set_worker(const char *name)
{
    worker_name.len = 0;
    worker_name.name[0] = '\0';
    if (!name || !*name)
        return;
    worker_name.len =
        esc_ctl(worker_name.name, sizeof(worker_name.name), name, strlen(name), 0);
}

static struct {
    log_trace_fn *fn;
    void *arg;
} trace_lookup;

void log_set_trace_lookup(log_trace_fn *fn, void *arg)
{
    trace_lookup.fn = fn;
    trace_lookup.arg = arg;
}

static void json_line(int level, const struct timeval *tv, const char *file,
                      const char *msg, size_t m)
{
    /* Each escaped byte may double: the message, the logger, the worker and
     * the task's two fields, with room for the keys, the stamp and the two
     * trace ids (hex: never escaped). */
    char buf[256 + 2 * LOG_SAFE_MAX + 8 * (LOG_FIELD_MAX + 1) + 96];
    char logger[128], ms[8];
    struct jline j = {buf, 0, sizeof(buf) - 1};
    const char *name, *id;
    size_t nlen, ilen;

    j_raw(&j, "{\"time\":\"");
    /* out.stamp is "YYYY-MM-DD HH:MM:SS": ISO 8601 with a T and a Z. */
    j_str(&j, out.stamp, 10);
    j_raw(&j, "T");
    j_str(&j, out.stamp + 11, strlen(out.stamp + 11));
    snprintf(ms, sizeof(ms), ".%03ldZ", (long)(tv->tv_usec / 1000) % 1000);
    j_raw(&j, ms);
    j_raw(&j, "\",\"level\":\"");
    j_raw(&j, level_names[level]);
    j_raw(&j, "\"");
    j_field(&j, "logger", logger, logger_name(logger, sizeof(logger), file));
    j_field(&j, "message", msg, m);
    if (worker_name.len)
        j_field(&j, "worker", worker_name.name, worker_name.len);
    if (task_of(msg, m, &name, &nlen, &id, &ilen)) {
        char trace_id[33], span_id[17];
        j_field(&j, "task_id", id, ilen);
        j_field(&j, "task_name", name, nlen);
        if (trace_lookup.fn &&
            trace_lookup.fn(id, ilen, trace_id, span_id, trace_lookup.arg)) {
            j_field(&j, "trace_id", trace_id, strnlen(trace_id, 32));
            j_field(&j, "span_id", span_id, strnlen(span_id, 16));
        }
    }
    j_raw(&j, "}");
    buf[j.len++] = '\n';
    emit(level, buf, j.len);
}

static void vlog(int level, const char *file, const char *fmt, va_list ap)
{
    char safe[LOG_SAFE_MAX];
    char line[64 + LOG_SAFE_MAX + 1];
    struct timeval tv;
    int m, n = 0;

    if (level < LOG_DEBUG || level > LOG_CRITICAL)
        level = LOG_ERROR;
    gettimeofday(&tv, NULL);
    stamp(&tv);
    /* A text line's message and prefix share 2 KB before escaping, as ever. */
    if (log_format != LOG_FORMAT_JSON && (n = text_prefix(line, level, &tv)) < 0)
        return;
    m = format_msg(safe, LOG_MSG_MAX - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    if (log_format == LOG_FORMAT_JSON)
        json_line(level, &tv, file, safe, (size_t)m);
    else
        text_line(level, line, n, safe, (size_t)m);
}

void log_at(int level, const char *file, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, file, fmt, ap);
    va_end(ap);
}

void log_write(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, NULL, fmt, ap);
    va_end(ap);
}

int log_format_parse(const char *s)
{
    if (!s)
        return -1;
    if (!strcasecmp(s, "text"))
        return LOG_FORMAT_TEXT;
    if (!strcasecmp(s, "json"))
        return LOG_FORMAT_JSON;
    return -1;
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
