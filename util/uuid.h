/* uuid.h -- version-4 UUID text, as Python's str(uuid.uuid4()) writes it: for
 * task ids the worker and the gateway make (canvas follow-ups, new groups,
 * submitted tasks, reply queues). Pure: the random bytes come from the caller. */
#ifndef CR_UUID_H
#define CR_UUID_H

#define CR_UUID_LEN 36 /* characters, without the NUL */

/* Writes the version-4 UUID made from 16 random bytes (the version and
 * variant bits are set over them) as "xxxxxxxx-xxxx-4xxx-[89ab]xxx-
 * xxxxxxxxxxxx", lower case, NUL-terminated: 37 bytes in all. */
void cr_uuid4(const unsigned char rnd[16], char out[CR_UUID_LEN + 1]);

#endif
