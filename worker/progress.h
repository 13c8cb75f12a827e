/* progress.h -- live progress of streaming tasks: a batched Redis Stream per task
 * and a throttled PROGRESS state in the result backend.
 *
 * Only the tasks that stream text (llm.generate, llm.chat) have progress; for
 * the others the result meta is the whole story.
 *
 * The wire format (stream key, entry ids, fields, channel, meta) is in
 * protocol/progress.h, shared with the gateway.
 *
 * Not thread-safe: loop thread only. */
#ifndef CR_PROGRESS_H
#define CR_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/progress.h"
#include "util/buf.h"

#define PROGRESS_BATCH_BYTES 4096
#define PROGRESS_META_MIN_MS 500

struct worker_ctx;
struct job;
struct task_event_info;
struct progress;

/* Returns a new progress writer for w (--progress), or NULL when off or on OOM
 * (progress is then simply not written). Free with progress_free(). */
struct progress *progress_new(const struct worker_ctx *w);
/* A text delta of a running job (borrowed for the call). */
void progress_on_delta(struct progress *p, struct job *j, const char *text, size_t len);
/* Lifecycle: SUCCEEDED/FAILED/RETRIED/REVOKED close an attempt (writing any
 * buffered text first, and STARTED if nothing was written yet: a job that has
 * t_started set started here); other events are ignored. The job is borrowed
 * from its first delta until the closing event (j->ptask points to its state
 * meanwhile); a job freed without one must go through progress_forget() or be
 * preceded by progress_free(). */
void progress_on_task(struct progress *p, struct job *j,
                      const struct task_event_info *info);
/* Drops j's buffered text unwritten: for a job freed without a closing event.
 * No-op when j has no progress state. */
void progress_forget(struct progress *p, struct job *j);
/* Drops buffered text and frees. NULL is a no-op. */
void progress_free(struct progress *p);

/* ------------------------------------------------ batching (pure, no clock) */

/* When buffered progress must be written. */
struct progress_policy {
    int stream;          /* write stream entries */
    int meta;            /* write PROGRESS metas */
    int64_t interval_ms; /* longest a delta waits in the buffer */
    size_t max_bytes;    /* buffered text that forces a write at once */
    int64_t meta_gap_ms; /* shortest gap between two PROGRESS metas */
};

/* One attempt's buffer. Embedded: progress_batch_init() / _release(). */
struct progress_batch {
    /* read-only */
    struct buf text;  /* text not yet written to the stream */
    long tokens;      /* deltas seen in this attempt */
    int64_t first_ms; /* arrival of the oldest unwritten delta; -1: none */
    int64_t meta_ms;  /* last PROGRESS meta write; -1: never */
    int64_t start_ms; /* first delta of the attempt; -1: none yet */
    int meta_dirty;   /* text arrived since the last meta write */
};

#define PROGRESS_DUE_STREAM 1
#define PROGRESS_DUE_META 2

void progress_batch_init(struct progress_batch *b);
void progress_batch_release(struct progress_batch *b);
/* Buffers a delta that arrived at now_ms. Returns 0, or CR_ENOMEM (the batch is
 * unchanged; the delta is lost for the stream only). */
int progress_batch_add(struct progress_batch *b, const char *text, size_t len,
                       int64_t now_ms);
/* Which writes are due at now_ms: a mask of PROGRESS_DUE_*. The stream is due
 * when text is buffered and it is max_bytes long or interval_ms old; the meta
 * when text arrived since the last meta and meta_gap_ms passed since then (the
 * first meta after interval_ms of text). */
int progress_batch_due(const struct progress_batch *b, const struct progress_policy *pol,
                       int64_t now_ms);
/* Milliseconds until something falls due (0 if now), or -1 when nothing is
 * pending. */
int64_t progress_batch_wait_ms(const struct progress_batch *b,
                               const struct progress_policy *pol, int64_t now_ms);
/* Writes per second the writer aims at across all streaming tasks. */
#define PROGRESS_WRITES_PER_S 5000
/* The batch interval for ntasks streaming tasks: base_ms, or longer when
 * writing each task every base_ms would exceed PROGRESS_WRITES_PER_S. */
int64_t progress_budget_interval_ms(int64_t base_ms, long ntasks);
/* Marks the buffered text written (empties the buffer, keeps its memory). */
void progress_batch_took_stream(struct progress_batch *b);
/* Marks a PROGRESS meta written at now_ms. */
void progress_batch_took_meta(struct progress_batch *b, int64_t now_ms);

#endif
