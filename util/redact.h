/* redact.h -- a small set of secrets, cut out of any text before it leaves the
 * process (logs, stored results, dead-letter headers, events). Pure: no I/O.
 *
 * Rules, chosen so that a secret a peer quotes back never survives whole or as
 * its head:
 * - A secret shorter than REDACT_MIN_BYTES is ignored: "pw" or "1" would hit
 *   ordinary text everywhere and say nothing about the secret when it did.
 * - Every occurrence of a secret is replaced by REDACT_MARK.
 * - So is every occurrence of its first REDACT_HEAD_BYTES bytes (the whole
 *   secret when shorter), as far as the text goes on matching the secret: a
 *   proxy or a provider that quotes a key cut short or masked in the middle
 *   ("sk-test-se...", "sk-abc123****wxyz") gives its head away otherwise, and a
 *   length limit may cut a quoted key anywhere. A trailing few bytes that
 *   follow a mask are left alone (OpenAI quotes the last 4; they are not
 *   enough to be worth the false hits).
 * - Occurrences that overlap, of one secret or of several, are one span and
 *   become one mark, so no fragment of any of them is left between marks.
 * The mark is shorter than any secret, so redaction never lengthens a text
 * and can work in place. Cost: O(secrets x length), by memmem. */
#ifndef CR_REDACT_H
#define CR_REDACT_H

#include <stddef.h>

#define REDACT_MAX 16       /* secrets in one set */
#define REDACT_MIN_BYTES 4  /* shorter secrets are not redacted */
#define REDACT_HEAD_BYTES 8 /* a secret's head that is redacted on its own */
#define REDACT_MARK "***"

struct redact {
    /* private */
    int n;
    char *secrets[REDACT_MAX];
    size_t lens[REDACT_MAX];
};

/* Embedded by its owner; redact_release() frees the copies. */
void redact_init(struct redact *r);
void redact_release(struct redact *r);

/* Copies s[0..n) into the set. A NULL, short (< REDACT_MIN_BYTES) or repeated
 * secret is ignored and returns 0. Returns 0, CR_ENOMEM or CR_ERANGE (the set
 * is full); the set is unchanged on error. */
int redact_add(struct redact *r, const char *s, size_t n);
/* As redact_add() for a NUL-terminated string. */
int redact_add_str(struct redact *r, const char *s);

/* Redacts s[0..len) in place and returns its new length (<= len). r NULL or
 * empty: nothing changes. */
size_t redact_mem(const struct redact *r, char *s, size_t len);
/* Redacts a NUL-terminated string in place; returns its new strlen(). */
size_t redact_str(const struct redact *r, char *s);

/* Writes url into out (size bytes, truncated and NUL-terminated) with the
 * password of its credentials, the text between the user's ':' and the '@',
 * replaced by "**": "amqp://guest:**@host//". A URL without ':' in its
 * credentials is written as it is; each URL of a ';' list is redacted. */
void redact_url(const char *url, char *out, size_t size);

#endif
