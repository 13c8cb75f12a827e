/* revoked.c -- the set of revoked task ids (no I/O, no clock). */
#include "revoked.h"

#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

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

/* ------------------------------------------------------- revoked stamps */

void revoked_stamps_init(struct revoked_stamps *s)
{
    memset(s, 0, sizeof(*s));
}

void revoked_stamps_release(struct revoked_stamps *s)
{
    cJSON_Delete(s->names);
    memset(s, 0, sizeof(*s));
}

int revoked_value_in(const cJSON *list, const cJSON *v)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, list)
    {
        if (cJSON_Compare(x, v, 1))
            return 1;
    }
    return 0;
}

static int add_value(struct revoked_stamps *s, cJSON *list, const cJSON *v)
{
    cJSON *copy;
    if (revoked_value_in(list, v))
        return 0;
    if (s->nvalues >= REVOKED_STAMPS_MAX)
        return CR_ETOOBIG;
    copy = cJSON_Duplicate(v, 1);
    if (!copy || !cJSON_AddItemToArray(list, copy)) {
        cJSON_Delete(copy);
        return CR_ENOMEM;
    }
    s->nvalues++;
    return 0;
}

int revoked_stamps_add(struct revoked_stamps *s, const cJSON *headers)
{
    const cJSON *h;
    int rc = 0;

    if (!cJSON_IsObject(headers))
        return CR_EINVAL;
    if (!s->names && !(s->names = cJSON_CreateObject()))
        return CR_ENOMEM;
    cJSON_ArrayForEach(h, headers)
    {
        cJSON *list = cJSON_GetObjectItemCaseSensitive(s->names, h->string);
        if (!list) {
            list = cJSON_CreateArray();
            if (!list || !cJSON_AddItemToObject(s->names, h->string, list)) {
                cJSON_Delete(list);
                return CR_ENOMEM;
            }
        }
        if (cJSON_IsArray(h)) {
            const cJSON *v;
            cJSON_ArrayForEach(v, h)
            {
                int r = add_value(s, list, v);
                if (r == CR_ENOMEM)
                    return r;
                if (r)
                    rc = r;
            }
        } else {
            int r = add_value(s, list, h);
            if (r == CR_ENOMEM)
                return r;
            if (r)
                rc = r;
        }
    }
    return rc;
}

int revoked_stamps_match(const struct revoked_stamps *s, const cJSON *headers,
                         const char **name, const cJSON **value)
{
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(headers, "stamped_headers");
    const cJSON *stamps = cJSON_GetObjectItemCaseSensitive(headers, "stamps");
    const cJSON *n;

    if (!s->nvalues || !cJSON_IsArray(names))
        return 0;
    cJSON_ArrayForEach(n, names)
    {
        const cJSON *list, *v;
        if (!cJSON_IsString(n))
            continue;
        list = cJSON_GetObjectItemCaseSensitive(s->names, n->valuestring);
        if (!list)
            continue;
        /* The first stamped header with revoked values decides, match or
         * not, as in Celery. */
        v = cJSON_GetObjectItemCaseSensitive(stamps, n->valuestring);
        if (cJSON_IsArray(v)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, v)
            {
                if (revoked_value_in(list, x)) {
                    v = x;
                    goto matched;
                }
            }
            return 0;
        }
        if (v && revoked_value_in(list, v))
            goto matched;
        return 0;
    matched:
        if (name)
            *name = n->valuestring;
        if (value)
            *value = v;
        return 1;
    }
    return 0;
}
