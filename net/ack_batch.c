/* ack_batch.c -- which basic.ack frames to send for the acks of one loop turn. */
#include "ack_batch.h"

#include <string.h>

#include "util/alloc.h"
#include "util/err.h"

#define MIN_CAP 64 /* tags; a power of two, a multiple of 64 */

void ack_batch_init(struct ack_batch *a)
{
    memset(a, 0, sizeof(*a));
    a->window_max = ACK_BATCH_WINDOW_MAX;
}

void ack_batch_release(struct ack_batch *a)
{
    size_t window_max = a->window_max;
    cr_free(a->bits);
    cr_free(a->late);
    cr_free(a->pending);
    ack_batch_init(a);
    a->window_max = window_max;
}

void ack_batch_clear(struct ack_batch *a)
{
    a->base = a->next = 0;
    a->nlate = a->npending = 0;
    a->off = 0;
}

static int bit_get(const struct ack_batch *a, uint64_t tag)
{
    size_t i = (size_t)(tag & (a->cap - 1));
    return (int)((a->bits[i >> 6] >> (i & 63)) & 1);
}

static void bit_put(struct ack_batch *a, uint64_t tag, int on)
{
    size_t i = (size_t)(tag & (a->cap - 1));
    uint64_t mask = (uint64_t)1 << (i & 63);
    if (on)
        a->bits[i >> 6] |= mask;
    else
        a->bits[i >> 6] &= ~mask;
}

/* Moves base past settled tags: each tag is passed once, so this is O(1)
 * amortized per delivery. */
static void advance(struct ack_batch *a)
{
    while (a->base < a->next && bit_get(a, a->base))
        a->base++;
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    size_t c;
    void *np;
    if (n < *cap)
        return 0;
    c = *cap ? *cap * 2 : 16;
    np = cr_realloc(*p, c * size);
    if (!np)
        return CR_ENOMEM;
    *p = np;
    *cap = c;
    return 0;
}

/* Doubles the ring, keeping the bits of [base, next) at their new slots. */
static int grow_ring(struct ack_batch *a)
{
    size_t cap = a->cap ? a->cap * 2 : MIN_CAP;
    uint64_t *bits = cr_calloc(cap / 64, sizeof(*bits));
    struct ack_batch old = *a;
    if (!bits)
        return CR_ENOMEM;
    a->bits = bits;
    a->cap = cap;
    for (uint64_t t = a->base; t < a->next; t++)
        bit_put(a, t, bit_get(&old, t));
    cr_free(old.bits);
    return 0;
}

/* Makes room for one more tag: a bigger ring, or, at the cap, the oldest tag
 * (unsettled, since base was advanced) moves to late[]. A tag held that long
 * would otherwise keep the ring growing by one bit per delivery for as long as
 * it is held. */
static int make_room(struct ack_batch *a)
{
    advance(a);
    if (a->next - a->base < a->cap)
        return 0;
    if (a->cap < a->window_max)
        return grow_ring(a);
    if (grow((void **)&a->late, &a->caplate, a->nlate, sizeof(*a->late)))
        return CR_ENOMEM;
    a->late[a->nlate++] = a->base++; /* ascending: bases only grow */
    advance(a);
    return 0;
}

int ack_batch_received(struct ack_batch *a, uint64_t tag)
{
    if (a->off)
        return 1;
    if (a->next == 0)
        a->base = a->next = tag;
    if (tag == 0 || tag != a->next) {
        a->off = 1;
        return CR_EPROTO;
    }
    if (make_room(a)) {
        a->off = 1;
        return CR_ENOMEM;
    }
    bit_put(a, tag, 0);
    a->next++;
    return 0;
}

/* Index of tag in late[], or -1. */
static long find_late(const struct ack_batch *a, uint64_t tag)
{
    size_t lo = 0, hi = a->nlate;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->late[mid] < tag)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < a->nlate && a->late[lo] == tag ? (long)lo : -1;
}

/* Marks tag settled. Returns 0, 1 when it is not tracked (at or past next), or
 * CR_EINVAL when it is settled already. */
static int settle(struct ack_batch *a, uint64_t tag)
{
    if (tag >= a->next)
        return 1;
    if (tag >= a->base) {
        if (bit_get(a, tag))
            return CR_EINVAL;
        bit_put(a, tag, 1);
        return 0;
    }
    {
        long i = find_late(a, tag);
        if (i < 0)
            return CR_EINVAL;
        /* O(number of late tags), which are few: each is a delivery held for
         * ACK_BATCH_WINDOW_MAX later ones. */
        memmove(a->late + i, a->late + i + 1,
                (a->nlate - (size_t)i - 1) * sizeof(*a->late));
        a->nlate--;
    }
    return 0;
}

int ack_batch_ack(struct ack_batch *a, uint64_t tag)
{
    int rc = settle(a, tag);
    if (rc)
        return rc;
    if (grow((void **)&a->pending, &a->cappending, a->npending, sizeof(*a->pending)))
        return 1; /* settled, and the caller sends it at once */
    a->pending[a->npending++] = tag;
    return 0;
}

int ack_batch_reject(struct ack_batch *a, uint64_t tag)
{
    return settle(a, tag);
}

size_t ack_batch_npending(const struct ack_batch *a)
{
    return a->npending;
}

size_t ack_batch_flush(struct ack_batch *a, uint64_t *upto, const uint64_t **singles)
{
    uint64_t floor;
    size_t n = 0;

    *upto = 0;
    *singles = a->pending;
    if (a->npending == 0)
        return 0;
    advance(a);
    /* Every tag below floor is settled: acked (pending now, or sent before) or
     * rejected. A multiple ack up to the highest pending one below it is then
     * exactly those pending acks, since the broker skips what it no longer
     * holds. Above the floor there is a gap, so those go one by one. */
    floor = a->nlate ? a->late[0] : a->base; /* late tags are all below base */
    for (size_t i = 0; i < a->npending; i++) {
        uint64_t t = a->pending[i];
        if (t < floor) {
            if (t > *upto)
                *upto = t;
        } else {
            a->pending[n++] = t; /* compacted in place: n <= i */
        }
    }
    a->npending = 0;
    return n;
}
