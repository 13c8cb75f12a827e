/* isotime.h -- ISO-8601 dates as Celery writes and reads them. Pure. */
#ifndef CR_ISOTIME_H
#define CR_ISOTIME_H

#include <stdint.h>

/* Parses "YYYY-MM-DD[T| ]HH:MM[:SS[.frac]][Z|+HH:MM|-HH:MM|+HHMM]" (fraction of
 * any length) into epoch microseconds. Naive times are UTC. Returns 0 or
 * CR_EINVAL. */
int iso8601_parse(const char *s, int64_t *epoch_us);

/* Writes epoch microseconds as "YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00" (the fraction
 * is omitted when it is zero, as Python's isoformat does). out needs 40 bytes. */
void iso8601_format(int64_t epoch_us, char out[40]);

#endif
