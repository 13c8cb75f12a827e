/* gw_hub.h -- WebSocket progress sessions: replay, live updates and the
 * final result, with no text lost or repeated. Pure: no sockets, no loop, no
 * clock (time is an argument); Redis and the sockets are reached through a
 * vtable the glue provides, so tests drive it with fakes.
 *
 * A hub holds one watch per task id that has sessions. A watch subscribes (the
 * glue SUBSCRIBEs the progress channel and the result channel), and only once
 * the subscription is confirmed reads the stream (XRANGE after the lowest
 * sequence number its sessions have) and the result meta (GET). Every later
 * notification reads the stream again from there. Each session keeps its own
 * cursor and is sent only entries past it, so an entry seen by two reads (the
 * replay and a live read) goes out once, and an entry written between the
 * replay and the subscription cannot be missed, because the subscription came
 * first. Reads never overlap: a notification during a read asks for one more.
 * When the meta reaches a ready state (SUCCESS, FAILURE, REVOKED), one more
 * read that started after it drains the stream (the worker writes the final
 * entry before the meta), then each session gets the result and is closed.
 * A final entry that carries the result itself (a Celery task that ignores
 * its result, or any end of an RQ job, whose state the glue reads from RQ's
 * job hash, gateway/gw_rq.h) does the same without the meta.
 * The meta is read again every GW_META_POLL_MS while waiting, and at once
 * when a read brings a new STARTED or RETRY entry (an attempt begins or
 * ends), since an RQ job's state is announced by no PUBLISH.
 *
 * Messages sent to a session (JSON text frames):
 *   {"type": "progress", "seq": N, "attempt": A, "state": S, "text": T,
 *    "tokens": K[, "error": E]}                       one per stream entry
 *   {"type": "gap", "from": N, "to": M}             entries N..M were trimmed
 *   {"type": "state", "state": S}                   the stored state changed
 *   {"type": "result", "task_id", "state", "result", "traceback",
 *    "date_done", "ready": true[, "error"]}         then the session closes
 * A client resumes with ?from=<last seq it saw>.
 *
 * Memory: the hub counts the bytes it has handed to send() and not yet seen
 * written (gw_hub_on_written()), per session and in total. A session more
 * than max_session_bytes behind, or the sessions furthest behind when the
 * total would pass max_total_bytes, are dropped: nothing more is sent to
 * them and the glue discards their queue and closes them at once (the client
 * may resume with ?from=). */
#ifndef CR_GW_SESSION_H
#define CR_GW_SESSION_H

#include <stddef.h>
#include <stdint.h>

#define GW_FETCH_COUNT 256   /* entries per stream read */
#define GW_META_POLL_MS 5000 /* re-read the meta this often while waiting */
#define GW_RETRY_MS 1000     /* a failed read is tried again after this */

struct gw_hub;
struct gw_session;

/* One stream entry; every pointer borrowed for the call. */
struct gw_entry {
    int64_t seq;
    long attempt;
    const char *state;
    const char *text;
    size_t text_len;
    long tokens;
    const char *error;  /* or NULL */
    const char *result; /* JSON text, or NULL */
    size_t result_len;
};

/* Reads an entry from its Redis id ("0-<seq>") and field/value pairs (borrowed
 * until the caller is done with e). Returns 0, or CR_EPROTO when the id or a
 * required field (state, text) is missing or malformed. */
int gw_entry_parse(const char *id, size_t id_len, size_t nfields,
                   const char *const *names, const size_t *name_lens,
                   const char *const *values, const size_t *value_lens,
                   struct gw_entry *e);

/* What the hub asks of the glue. None may call back into the hub from inside
 * the call; each completion comes later through gw_hub_on_*(). A non-zero
 * return means "could not even ask": the hub tries again from gw_hub_tick(). */
struct gw_hub_ops {
    int (*subscribe)(struct gw_hub *h, const char *task_id, void *privdata);
    void (*unsubscribe)(struct gw_hub *h, const char *task_id, void *privdata);
    /* Read up to GW_FETCH_COUNT entries with seq > after_seq; the answer
     * comes back with the same ticket (an answer with another ticket than
     * the one awaited is dropped, so a late answer to a freed watch of the
     * same id does no harm). */
    int (*fetch)(struct gw_hub *h, const char *task_id, int64_t after_seq,
                 uint64_t ticket, void *privdata);
    int (*get_meta)(struct gw_hub *h, const char *task_id, uint64_t ticket,
                    void *privdata);
    /* Queue a text frame (text borrowed for the call). */
    void (*send)(struct gw_session *s, const char *text, size_t len, void *privdata);
    /* Close the connection once queued frames are out; the glue calls
     * gw_hub_leave() when it is closed. */
    void (*close)(struct gw_session *s, void *privdata);
    /* Discard what is queued to s and close it now, telling the client why
     * (enum gw_drop_reason); the glue calls gw_hub_leave() when it is closed
     * and need not report the discarded bytes as written. */
    void (*drop)(struct gw_session *s, int reason, void *privdata);
};

enum gw_drop_reason {
    GW_DROP_SLOW = 1, /* this session alone is over max_session_bytes */
    GW_DROP_BUDGET,   /* all sessions together are over max_total_bytes */
};

/* Returns a new hub or NULL on OOM. ops and privdata are borrowed for its life. */
struct gw_hub *gw_hub_new(const struct gw_hub_ops *ops, void *privdata);
/* Frees every watch and session without calling any op. NULL is a no-op. */
void gw_hub_free(struct gw_hub *h);

/* A new session watching task_id from after from_seq; data is the glue's
 * back-pointer. Returns it, or NULL on OOM (nothing was sent). The session
 * lives until gw_hub_leave(). */
struct gw_session *gw_hub_join(struct gw_hub *h, const char *task_id, int64_t from_seq,
                               void *data, int64_t now_ms);
/* Limits on the bytes queued and not yet written (0: none). A message to a
 * session with nothing queued is always sent, so one message larger than a
 * limit still reaches a client that keeps up. */
void gw_hub_set_limits(struct gw_hub *h, size_t max_session_bytes,
                       size_t max_total_bytes);
/* len bytes queued to s have been written (or discarded by the glue). */
void gw_hub_on_written(struct gw_hub *h, struct gw_session *s, size_t len);
size_t gw_hub_queued(const struct gw_hub *h); /* bytes queued over all sessions */
size_t gw_hub_drops(const struct gw_hub *h);  /* sessions dropped so far */

/* The connection is gone: frees the session (and the watch with its last one,
 * unsubscribing). Never calls send or close. */
void gw_hub_leave(struct gw_hub *h, struct gw_session *s);
void *gw_session_data(const struct gw_session *s);
const char *gw_session_task(const struct gw_session *s);

/* Completions and notifications, by task id (ignored for unknown ids). */
void gw_hub_on_subscribed(struct gw_hub *h, const char *task_id);
/* entries in seq order; complete = the read returned fewer than it asked. */
void gw_hub_on_entries(struct gw_hub *h, const char *task_id, uint64_t ticket,
                       const struct gw_entry *e, size_t n, int complete);
void gw_hub_on_fetch_failed(struct gw_hub *h, const char *task_id, uint64_t ticket);
/* A stream notification (PUBLISH on the progress channel). */
void gw_hub_on_notify(struct gw_hub *h, const char *task_id);
/* The answer to get_meta: the stored meta, or NULL when there is none. */
void gw_hub_on_meta(struct gw_hub *h, const char *task_id, uint64_t ticket,
                    const char *meta, size_t len);
void gw_hub_on_meta_failed(struct gw_hub *h, const char *task_id, uint64_t ticket);
/* A meta PUBLISHed on the result channel. */
void gw_hub_on_meta_published(struct gw_hub *h, const char *task_id, const char *meta,
                              size_t len);
/* The subscriber connection dropped: every watch must subscribe again, which
 * gw_hub_tick() asks for (or at once via gw_hub_resubscribe()). */
void gw_hub_on_sub_lost(struct gw_hub *h);
void gw_hub_resubscribe(struct gw_hub *h);
/* The periodic job: retries failed asks and re-reads metas while waiting. */
void gw_hub_tick(struct gw_hub *h, int64_t now_ms);

size_t gw_hub_sessions(const struct gw_hub *h);
size_t gw_hub_watches(const struct gw_hub *h);

#endif
