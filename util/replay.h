/* replay.h -- what a store confirmed lately, kept to be written again.
 *
 * Redis answers before it replicates or fsyncs, so a failover (a replica
 * promoted before the last writes reached it) or a crash under appendfsync
 * everysec can lose writes it confirmed. Their writers keep what was
 * confirmed in the last keep_ms and write it again after a reconnect: the
 * broker its acks (a lost ack would leave a record to be restored and run
 * again), the result backend its results (an ack that reached the new master
 * without its result would lose the task). Writing either twice is harmless.
 *
 * A ring of entries, oldest first, bounded by count, bytes and age. Pure: no
 * I/O, no clock (times are arguments, any monotonic ms). Not thread-safe.
 * Embed it; replay_init() / replay_release(). */
#ifndef CR_REPLAY_H
#define CR_REPLAY_H

#include <stddef.h>
#include <stdint.h>

struct replay_entry {
    char *key;
    char *value; /* NULL when the writer keeps only keys */
    size_t value_len;
    int aux;     /* the writer's, kept as given */
    uint64_t at; /* when first confirmed */
};

struct replay {
    /* private */
    struct replay_entry *e; /* allocated at the first put */
    int cap, head, n;
    size_t bytes, max_bytes;
    uint64_t keep_ms;
};

/* max entries, max_bytes of keys and values in all (0: no byte bound),
 * kept for keep_ms after their time. */
void replay_init(struct replay *r, int max, size_t max_bytes, uint64_t keep_ms);
/* Frees every entry and the ring; r may be initialised again. */
void replay_release(struct replay *r);

/* Takes key and value (value may be NULL) whatever the outcome: kept when
 * younger than keep_ms at now and within the bounds (older entries go to make
 * room), else freed at once. A failed allocation of the ring frees them too:
 * only a second chance is lost. */
void replay_put(struct replay *r, char *key, char *value, size_t value_len, int aux,
                uint64_t at, uint64_t now);

/* The oldest entry still younger than keep_ms at now: 1 and *out (the caller
 * owns out->key and out->value), or 0 when none is left. Older ones are
 * dropped on the way. */
int replay_take(struct replay *r, uint64_t now, struct replay_entry *out);

/* Entries held (some may be too old already). */
int replay_count(const struct replay *r);

#endif
