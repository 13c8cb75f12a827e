/* strmap.c -- string-keyed chained hash map. */
#include "strmap.h"

#include <stdint.h>
#include <string.h>

#include "alloc.h"
#include "err.h"

struct strmap_entry {
    struct strmap_entry *next;
    uint64_t hash;
    void *value;
    char key[]; /* NUL-terminated */
};

/* FNV-1a: short keys (task ids), no need for anything stronger. */
static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ULL;
    }
    return h;
}

void strmap_init(struct strmap *m)
{
    m->slots = NULL;
    m->nslots = 0;
    m->count = 0;
}

void strmap_release(struct strmap *m)
{
    for (size_t i = 0; i < m->nslots; i++) {
        struct strmap_entry *e = m->slots[i], *n;
        for (; e; e = n) {
            n = e->next;
            cr_free(e);
        }
    }
    cr_free(m->slots);
    strmap_init(m);
}

static struct strmap_entry **find(const struct strmap *m, const char *key, uint64_t h)
{
    struct strmap_entry **pp;
    if (!m->nslots)
        return NULL;
    for (pp = &m->slots[h & (m->nslots - 1)]; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && !strcmp((*pp)->key, key))
            return pp;
    return NULL;
}

void *strmap_get(const struct strmap *m, const char *key)
{
    struct strmap_entry **pp = find(m, key, hash_str(key));
    return pp ? (*pp)->value : NULL;
}

static int grow(struct strmap *m)
{
    size_t n = m->nslots ? m->nslots * 2 : 64;
    struct strmap_entry **slots = cr_calloc(n, sizeof(*slots));
    if (!slots)
        return CR_ENOMEM;
    for (size_t i = 0; i < m->nslots; i++) {
        struct strmap_entry *e = m->slots[i], *next;
        for (; e; e = next) {
            next = e->next;
            e->next = slots[e->hash & (n - 1)];
            slots[e->hash & (n - 1)] = e;
        }
    }
    cr_free(m->slots);
    m->slots = slots;
    m->nslots = n;
    return 0;
}

int strmap_put(struct strmap *m, const char *key, void *value)
{
    uint64_t h = hash_str(key);
    struct strmap_entry **pp = find(m, key, h), *e;
    size_t len;
    if (pp) {
        (*pp)->value = value;
        return 0;
    }
    if (m->count >= m->nslots && grow(m))
        return CR_ENOMEM;
    len = strlen(key);
    e = cr_malloc(sizeof(*e) + len + 1);
    if (!e)
        return CR_ENOMEM;
    memcpy(e->key, key, len + 1);
    e->hash = h;
    e->value = value;
    e->next = m->slots[h & (m->nslots - 1)];
    m->slots[h & (m->nslots - 1)] = e;
    m->count++;
    return 0;
}

void *strmap_del(struct strmap *m, const char *key)
{
    struct strmap_entry **pp = find(m, key, hash_str(key)), *e;
    void *v;
    if (!pp)
        return NULL;
    e = *pp;
    *pp = e->next;
    v = e->value;
    cr_free(e);
    m->count--;
    return v;
}

void strmap_each(const struct strmap *m,
                 void (*fn)(const char *key, void *value, void *arg), void *arg)
{
    for (size_t i = 0; i < m->nslots; i++)
        for (struct strmap_entry *e = m->slots[i]; e; e = e->next)
            fn(e->key, e->value, arg);
}
