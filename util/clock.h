/* clock.h -- the process's two clocks: wall-clock time since the epoch, and a
 * monotonic time for measuring intervals.
 *
 * Only the I/O layers (worker/, gateway/, llm/, net/, cmd/) read the clock;
 * pure code takes the time as an argument. Inside the loop, uv_now() is the
 * monotonic time of the current turn and is preferred over clock_mono_ms(). */
#ifndef CR_CLOCK_H
#define CR_CLOCK_H

#include <stdint.h>

/* Microseconds since 1970-01-01 UTC (CLOCK_REALTIME): the dates Celery writes
 * in messages, results and events. Can jump when the system time is set. */
int64_t clock_epoch_us(void);

/* Milliseconds since an arbitrary start (CLOCK_MONOTONIC): only differences
 * mean anything, and they never go backwards. */
int64_t clock_mono_ms(void);

#endif
