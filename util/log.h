/* log.h -- leveled logging to stderr, Celery-like lines with a timestamp.
 *
 * LOG() checks the level before evaluating its arguments. Only loop-level code
 * logs; pure modules return errors instead.
 *
 * Lines are written at once (one write(2) each) until log_batch_start(); from
 * then on INFO and DEBUG lines are collected in one buffer and written together
 * by log_flush(), which the command calls once per loop turn, before the loop
 * sleeps (cmd/main.c and cmd/gateway.c: a uv_prepare handle; this file knows
 * no loop). A WARNING or worse line flushes the buffer and itself at once, as
 * does a full buffer (LOG_BATCH_BYTES) and the process's exit(). Lines are
 * never split or reordered. A crash by signal loses at most the INFO lines of
 * the current turn. Single-threaded: call from the loop thread only.
 *
 * Two formats (log_format, set once from config before the loop starts):
 * Celery's text lines, the default, or one JSON object per line for log
 * pipelines: {"time", "level", "logger", "message"} and, where known,
 * "worker", "task_id", "task_name", "trace_id", "span_id". The logger is "celeriac." and
 * the source file the LOG() came from ("celeriac.engine.engine"). A task's id and name
 * are read from the message when it starts as every task line does, with
 * Celery's "Task NAME[ID]" (bounded scan; an id that itself holds "] "
 * is cut there in the field, the message keeps it whole). In both formats every control
 * character and invalid UTF-8 byte of the message is escaped (util/esc.h);
 * JSON also escapes '"' and '\', so each line parses whatever a publisher
 * put in a task id. */
#ifndef CR_LOG_H
#define CR_LOG_H

#include <stddef.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARNING, LOG_ERROR, LOG_CRITICAL };

enum log_format { LOG_FORMAT_TEXT = 0, LOG_FORMAT_JSON };

/* The size of the batch buffer: a line that would not fit flushes it first. */
#define LOG_BATCH_BYTES (64 * 1024)

/* The process-wide log threshold (the one global besides the loop root, set once
 * from config before the loop starts). */
extern int log_threshold;

/* The process-wide line format (enum log_format; set once, as log_threshold). */
extern int log_format;

/* One line from file (a source path such as "net/redis.c", which names the
 * JSON logger; NULL: "celeriac"). */
void log_at(int level, const char *file, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* One line from no particular file (logger "celeriac"). */
void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses "text" or "json" (any case). Returns the format or -1. */
int log_format_parse(const char *s);
/* The worker's name for JSON lines (copied; at most 255 bytes kept; NULL or
 * "" clears it). */
void log_set_worker(const char *name);
/* Says which trace a task's JSON lines belong to: given the task id a line
 * names (id_len bytes, not NUL-terminated), fills trace_id (32 lowercase hex
 * and a NUL) and span_id (16 and a NUL) and returns 1, or returns 0 when the
 * task is not traced. */
typedef int log_trace_fn(const char *id, size_t id_len, char trace_id[33],
                         char span_id[17], void *arg);
/* With fn set, a JSON line that has a "task_id" also gets "trace_id" and
 * "span_id" when fn knows them (the worker's tracing: the task's run span).
 * Set it once the lookup can answer and clear it (NULL) before that stops;
 * the text format never calls it. */
void log_set_trace_lookup(log_trace_fn *fn, void *arg);
/* Parses "debug", "info", "warning"/"warn", "error", "critical"/"fatal"
 * (any case). Returns the level or -1. */
int log_level_parse(const char *s);

/* From now on INFO and DEBUG lines wait in the buffer for log_flush(). The
 * first call also registers log_flush() with atexit(). */
void log_batch_start(void);
/* Flushes, then writes each line at once again (after the loop has ended). */
void log_batch_stop(void);
/* Writes every buffered line to stderr with as few write(2) calls as the pipe
 * takes (retrying short writes and EINTR, waiting out EAGAIN). A no-op when
 * nothing is buffered. */
void log_flush(void);

#define LOG(level, ...)                                                                  \
    do {                                                                                 \
        if ((level) >= log_threshold)                                                    \
            log_at((level), __FILE__, __VA_ARGS__);                                      \
    } while (0)

#endif
