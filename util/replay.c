/* replay.c -- the ring of recent confirmed writes (replay.h). */
#include "replay.h"

#include <string.h>

#include "alloc.h"

void replay_init(struct replay *r, int max, size_t max_bytes, uint64_t keep_ms)
{
    memset(r, 0, sizeof(*r));
    r->cap = max > 0 ? max : 1;
    r->max_bytes = max_bytes;
    r->keep_ms = keep_ms;
}

static size_t weight(const struct replay_entry *x)
{
    return (x->key ? strlen(x->key) : 0) + x->value_len;
}

static void drop_oldest(struct replay *r)
{
    struct replay_entry *x = &r->e[r->head];
    r->bytes -= weight(x);
    cr_free(x->key);
    cr_free(x->value);
    memset(x, 0, sizeof(*x));
    r->head = (r->head + 1) % r->cap;
    r->n--;
}

void replay_release(struct replay *r)
{
    while (r->n)
        drop_oldest(r);
    cr_free(r->e);
    r->e = NULL;
    r->head = 0;
    r->bytes = 0;
}

/* now - at, as 0 when at is in the future (never older than keep_ms). */
static uint64_t age(uint64_t at, uint64_t now)
{
    return now > at ? now - at : 0;
}

void replay_put(struct replay *r, char *key, char *value, size_t value_len, int aux,
                uint64_t at, uint64_t now)
{
    struct replay_entry *x;
    size_t bytes = (key ? strlen(key) : 0) + value_len;

    if (!r->e)
        r->e = cr_calloc((size_t)r->cap, sizeof(*r->e));
    while (r->n && age(r->e[r->head].at, now) > r->keep_ms)
        drop_oldest(r);
    if (!r->e || !key || age(at, now) > r->keep_ms ||
        (r->max_bytes && bytes > r->max_bytes)) {
        cr_free(key);
        cr_free(value);
        return;
    }
    while (r->n && (r->n == r->cap || (r->max_bytes && r->bytes + bytes > r->max_bytes)))
        drop_oldest(r);
    x = &r->e[(r->head + r->n) % r->cap];
    x->key = key;
    x->value = value;
    x->value_len = value_len;
    x->aux = aux;
    x->at = at;
    r->n++;
    r->bytes += bytes;
}

int replay_take(struct replay *r, uint64_t now, struct replay_entry *out)
{
    while (r->n) {
        struct replay_entry *x = &r->e[r->head];
        if (age(x->at, now) > r->keep_ms) {
            drop_oldest(r);
            continue;
        }
        *out = *x;
        r->bytes -= weight(x);
        memset(x, 0, sizeof(*x));
        r->head = (r->head + 1) % r->cap;
        r->n--;
        return 1;
    }
    return 0;
}

int replay_count(const struct replay *r)
{
    return r->n;
}
