/* revoked.c -- the set of revoked task ids (no I/O, no clock). */
#include "revoked.h"

#include <string.h>

#include "util/alloc.h"

struct revoked_id {
    struct revoked_id *next;
    int64_t expires_epoch_s;
    char id[];
};

void revoked_set_init(struct revoked_set *s, size_t max)
{
    memset(s, 0, sizeof(*s));
    strmap_init(&s->ids);
    s->max = max;
}

void revoked_set_release(struct revoked_set *s)
{
    while (s->head) {
        struct revoked_id *r = s->head;
        s->head = r->next;
        cr_free(r);
    }
    s->tail = NULL;
    strmap_release(&s->ids);
}

static void drop_expired(struct revoked_set *s, int64_t now_s)
{
    while (s->head && (s->head->expires_epoch_s <= now_s || s->ids.count > s->max)) {
        struct revoked_id *r = s->head;
        s->head = r->next;
        if (!s->head)
            s->tail = NULL;
        if (strmap_get(&s->ids, r->id) == r)
            strmap_del(&s->ids, r->id);
        cr_free(r);
    }
}

void revoked_set_add(struct revoked_set *s, const char *id, int64_t expires_epoch_s,
                     int64_t now_s)
{
    size_t n = strlen(id);
    struct revoked_id *r, *old = strmap_get(&s->ids, id);
    if (old) {
        if (expires_epoch_s > old->expires_epoch_s)
            old->expires_epoch_s = expires_epoch_s;
        return;
    }
    r = cr_malloc(sizeof(*r) + n + 1);
    if (!r)
        return;
    memcpy(r->id, id, n + 1);
    r->expires_epoch_s = expires_epoch_s;
    r->next = NULL;
    if (strmap_put(&s->ids, r->id, r)) {
        cr_free(r);
        return;
    }
    /* Oldest first; an id given a later expiry keeps its place, which only
     * makes it leave a little early under the size bound. */
    if (s->tail)
        s->tail->next = r;
    else
        s->head = r;
    s->tail = r;
    drop_expired(s, now_s);
}

int revoked_set_has(const struct revoked_set *s, const char *id, int64_t now_s)
{
    struct revoked_id *r;
    if (!s->ids.count || !id)
        return 0;
    r = strmap_get(&s->ids, id);
    return r && r->expires_epoch_s > now_s;
}

void revoked_set_each(struct revoked_set *s, int64_t now_s,
                      void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                      void *arg)
{
    drop_expired(s, now_s);
    for (struct revoked_id *r = s->head; r; r = r->next)
        if (strmap_get(&s->ids, r->id) == r)
            fn(r->id, r->expires_epoch_s, arg);
}
