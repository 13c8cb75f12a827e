/* isotime.h -- ISO-8601 dates as Celery writes and reads them. Pure. */
#ifndef CR_ISOTIME_H
#define CR_ISOTIME_H

#include <stdint.h>

/* Parses "YYYY-MM-DD[T| ]HH:MM[:SS[.frac]][Z|+HH:MM|-HH:MM|+HHMM]" (fraction of
 * any length) into epoch microseconds. Naive times are UTC. Returns 0 or
 * CR_EINVAL.
 * Also accepted: "+HH" offsets and ',' before the fraction (both ISO-8601).
 * Digits past microseconds are dropped (truncated, as Python does). Fields are
 * range-checked (month 1-12, the month's real day count with Gregorian leap
 * years, hour <= 23, minute and second <= 59, offset < 24:00); year 0001-9999.
 * Anything after the offset is an error. */
int iso8601_parse(const char *s, int64_t *epoch_us);

/* Writes epoch microseconds as "YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00" (the fraction
 * is omitted when it is zero, as Python's isoformat does). out needs 40 bytes. */
void iso8601_format(int64_t epoch_us, char out[40]);

#endif
