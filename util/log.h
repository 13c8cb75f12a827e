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
 * the current turn. Single-threaded: call from the loop thread only. */
#ifndef CR_LOG_H
#define CR_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARNING, LOG_ERROR, LOG_CRITICAL };

/* The size of the batch buffer: a line that would not fit flushes it first. */
#define LOG_BATCH_BYTES (64 * 1024)

/* The process-wide log threshold (the one global besides the loop root, set once
 * from config before the loop starts). */
extern int log_threshold;

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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
            log_write((level), __VA_ARGS__);                                             \
    } while (0)

#endif
