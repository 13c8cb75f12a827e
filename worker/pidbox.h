/* pidbox.h -- Celery remote control (inspect and control commands) over the
 * celery.pidbox fanout exchange, and the revoked-ids state file (--statedb).
 *
 * The mailbox is the queue "<nodename>.celery.pidbox" (auto-delete, x-expires
 * 10 s, x-message-ttl 300 s, non-exclusive as Celery 5.2 declares it), consumed
 * without acks; replies go to the exchange named in each request's reply_to
 * with headers {ticket, clock} and the body {nodename: reply}. Loop thread
 * only. */
#ifndef CR_PIDBOX_H
#define CR_PIDBOX_H

struct worker_ctx;
struct delivery;
struct pidbox;

/* Returns a new mailbox for w: loads --statedb (blocking; call at start-up)
 * and adds the mailbox consumer. NULL on OOM. w must outlive it. */
struct pidbox *pidbox_new(const struct worker_ctx *w);
/* Handles one control message. Takes m (frees it), also when pb is NULL. */
void pidbox_on_message(struct pidbox *pb, struct delivery *m);
/* Whether m came from the mailbox queue (a delivery without acks). */
int pidbox_owns(const struct pidbox *pb, const struct delivery *m);
/* Writes the state file one last time and frees. A state-file write still
 * running in the thread pool finishes (and frees its memory) when the loop runs
 * again. NULL is a no-op. */
void pidbox_free(struct pidbox *pb);

/* Notes that the revoked set changed, so the state file is written soon
 * (debounced; the write runs in libuv's thread pool). */
void pidbox_revoked_changed(struct pidbox *pb);

#endif
