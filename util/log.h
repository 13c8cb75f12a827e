/* log.h -- leveled logging to stderr, Celery-like lines with a timestamp.
 *
 * LOG() checks the level before evaluating its arguments. Only loop-level code
 * logs; pure modules return errors instead. */
#ifndef CR_LOG_H
#define CR_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARNING, LOG_ERROR, LOG_CRITICAL };

/* The process-wide log threshold (the one global besides the loop root, set once
 * from config before the loop starts). */
extern int log_threshold;

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses "debug", "info", "warning"/"warn", "error", "critical"/"fatal"
 * (any case). Returns the level or -1. */
int log_level_parse(const char *s);

#define LOG(level, ...)                                                                  \
    do {                                                                                 \
        if ((level) >= log_threshold)                                                    \
            log_write((level), __VA_ARGS__);                                             \
    } while (0)

#endif
