/* ack_batch.h -- which basic.ack frames to send for the acks of one loop turn.
 *
 * Pure bookkeeping for one channel's delivery tags (no I/O, no clock). The
 * broker tells it every delivery it receives and every delivery the worker
 * settles; once per loop iteration ack_batch_flush() says which frames to send:
 * at most one basic.ack with multiple = 1, covering every pending ack below the
 * lowest delivery still unsettled, plus one basic.ack with multiple = 0 for each
 * pending ack above that gap.
 *
 * Delivery tags on a channel start at 1 and grow by one per delivery, so the
 * settled state is a ring of bits over [lowest unsettled, highest received],
 * amortized O(1) per delivery. The ring is capped (ACK_BATCH_WINDOW_MAX tags): a
 * delivery held longer than that many later deliveries (an eta task) moves to
 * a small sorted side list instead of holding the ring open, so memory stays
 * proportional to the deliveries actually outstanding.
 *
 * Not thread-safe. Embed it; init/release/clear as usual. */
#ifndef CR_ACK_BATCH_H
#define CR_ACK_BATCH_H

#include <stddef.h>
#include <stdint.h>

#define ACK_BATCH_WINDOW_MAX 65536 /* tags tracked in the ring (8 KiB of bits) */

struct ack_batch {
    /* public */
    size_t window_max; /* ring cap in tags, a power of two >= 64; init sets
                        * ACK_BATCH_WINDOW_MAX, tests lower it */
    /* private */
    uint64_t base;  /* every tag below base is settled, except those in late[] */
    uint64_t next;  /* one past the highest tag received; 0 before the first */
    uint64_t *bits; /* ring over [base, next): bit set = settled */
    size_t cap;     /* ring size in tags: a power of two, or 0 */
    uint64_t *late; /* unsettled tags pushed out of the ring, ascending */
    size_t nlate, caplate;
    uint64_t *pending; /* acked, no frame sent yet, in ack order */
    size_t npending, cappending;
    int off; /* could not track a delivery (OOM, tag out of sequence): later
              * deliveries are untracked and their acks go out one by one */
};

void ack_batch_init(struct ack_batch *a);
void ack_batch_release(struct ack_batch *a);
/* Forgets every tag and pending ack (a new channel: tags start again), but
 * keeps the memory. */
void ack_batch_clear(struct ack_batch *a);

/* Records a delivery received. Tags must come in order, one apart. Returns 0
 * when tracked; CR_EPROTO (out of sequence) or CR_ENOMEM when this delivery
 * could not be, and then it and every later one until ack_batch_clear() are
 * untracked (see ack_batch_ack), while those tracked so far keep batching; or 1
 * for a delivery untracked because of such an earlier error. */
int ack_batch_received(struct ack_batch *a, uint64_t tag);

/* Settles a tracked delivery by ack, to be sent by the next flush. Returns 0
 * when queued; 1 when the caller must send basic.ack(tag, multiple = 0) itself
 * now (the delivery is untracked, or queueing it ran out of memory; either way
 * it is then counted as settled); or CR_EINVAL when the tag is already settled
 * (nothing must be sent). */
int ack_batch_ack(struct ack_batch *a, uint64_t tag);

/* Settles a delivery whose basic.reject (or nack) the caller sends at once.
 * It needs no ordering against the pending acks: a multiple ack only covers
 * deliveries the broker still holds, and a rejected one no longer is; nor is a
 * rejected tag ever a multiple ack's own tag. Returns 0, 1 when the delivery is
 * untracked (the reject is still to be sent), or CR_EINVAL when it is already
 * settled (nothing must be sent). */
int ack_batch_reject(struct ack_batch *a, uint64_t tag);

/* Number of acks waiting for a flush. */
size_t ack_batch_npending(const struct ack_batch *a);

/* Takes the pending acks. *upto is the tag to send as basic.ack(*upto,
 * multiple = 1), or 0 for none; it is itself a pending ack, so the broker still
 * holds it. The return value is the number of tags in *singles, each to be sent
 * as basic.ack(tag, multiple = 0). *singles is borrowed until the next call on
 * a (it may point into a's storage). Never fails. */
size_t ack_batch_flush(struct ack_batch *a, uint64_t *upto, const uint64_t **singles);

#endif
