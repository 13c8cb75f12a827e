/* strmap.h -- string-keyed hash map of borrowed values (chained, power-of-two).
 *
 * Keys are copied; values are borrowed pointers the caller owns. O(1) average
 * for get/put/del; grows when the load passes 1. Embedded by the owner. */
#ifndef CR_STRMAP_H
#define CR_STRMAP_H

#include <stddef.h>

struct strmap_entry;

struct strmap {
    /* private */
    struct strmap_entry **slots;
    size_t nslots;
    /* read-only */
    size_t count;
};

void strmap_init(struct strmap *m);
/* Frees the entries (not the values). */
void strmap_release(struct strmap *m);
void *strmap_get(const struct strmap *m, const char *key);
/* Inserts or replaces. Returns 0 or CR_ENOMEM (map unchanged). */
int strmap_put(struct strmap *m, const char *key, void *value);
/* Removes key; returns its value or NULL. */
void *strmap_del(struct strmap *m, const char *key);
/* Calls fn for every entry; fn must not change the map. */
void strmap_each(const struct strmap *m,
                 void (*fn)(const char *key, void *value, void *arg), void *arg);

#endif
