/* revoked.h -- the set of revoked task ids: bounded, each with an expiry, oldest
 * first. Pure: the time is an argument. */
#ifndef CR_ENGINE_REVOKED_H
#define CR_ENGINE_REVOKED_H

#include <stdint.h>

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

#endif
