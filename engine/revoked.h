/* revoked.h -- the set of revoked task ids: bounded, each with an expiry, oldest
 * first. Pure: the time is an argument. */
#ifndef CR_ENGINE_REVOKED_H
#define CR_ENGINE_REVOKED_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "util/strmap.h"

struct revoked_id;

/* Embedded: revoked_set_init() / revoked_set_release(). */
struct revoked_set {
    /* private */
    struct strmap ids;              /* id -> struct revoked_id */
    struct revoked_id *head, *tail; /* oldest first */
    size_t max;                     /* bound on the ids kept */
};

void revoked_set_init(struct revoked_set *s, size_t max);
void revoked_set_release(struct revoked_set *s);
/* Remembers id until expires_epoch_s (a later expiry of a known id wins), then
 * drops what expired by now_s and the oldest past the bound. An id that
 * cannot be kept (OOM) is not kept. */
void revoked_set_add(struct revoked_set *s, const char *id, int64_t expires_epoch_s,
                     int64_t now_s);
/* Whether id is revoked and not expired at now_s. NULL id: 0. */
int revoked_set_has(const struct revoked_set *s, const char *id, int64_t now_s);
/* Drops what expired by now_s, then calls fn for each id kept, oldest first. */
void revoked_set_each(struct revoked_set *s, int64_t now_s,
                      void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                      void *arg);

/* Celery's revoked_stamps (revoke_by_stamped_headers, Celery 5.3+): per stamp
 * name, the values revoked. Values are any JSON and compare as JSON. At most
 * REVOKED_STAMPS_MAX values in all (Celery's own set has no bound): past it,
 * the oldest names' values are kept and a new value is refused. Embedded:
 * revoked_stamps_init() / revoked_stamps_release(). Not persisted (Celery keeps
 * them in memory only too). */
#define REVOKED_STAMPS_MAX 10000
struct revoked_stamps {
    /* private */
    cJSON *names; /* object: name -> array of values */
    size_t nvalues;
};

void revoked_stamps_init(struct revoked_stamps *s);
void revoked_stamps_release(struct revoked_stamps *s);
/* Adds the values of headers, an object name -> value or array of values
 * (what revoke_by_stamped_headers sends; a list of "name=value" strings is
 * the caller's to turn into one). Values already there are not added twice.
 * Returns 0; CR_EINVAL when headers is not an object (nothing added);
 * CR_ETOOBIG when the bound stopped some values; CR_ENOMEM. */
int revoked_stamps_add(struct revoked_stamps *s, const cJSON *headers);
/* Whether a message with these headers (its "stamped_headers" list and
 * "stamps" object) is revoked by stamp, as Celery's Request.revoked decides:
 * the first of its stamped headers that has revoked values decides, by any of
 * the message's values for it (a list) or its one value. On a match, *name
 * and *value (may be NULL) point to the stamp name and the message's value
 * that matched, borrowed from headers. */
int revoked_stamps_match(const struct revoked_stamps *s, const cJSON *headers,
                         const char **name, const cJSON **value);
/* Whether the JSON array list holds a value equal to v. */
int revoked_value_in(const cJSON *list, const cJSON *v);

#endif
