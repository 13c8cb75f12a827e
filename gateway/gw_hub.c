/* gw_hub.c -- progress sessions and per-task watches (no I/O, no clock). */
#include "gw_hub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gw_msg.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"
#include "util/strmap.h"

struct watch;

struct gw_session {
    struct gw_session *prev, *next; /* the watch's sessions */
    struct watch *w;
    void *data;
    int64_t cursor;   /* last seq sent */
    uint64_t min_gen; /* the first read that included this session */
    int done;         /* result sent (or failed), close asked */
    int in_read;      /* the read being handled started at or before cursor */
    int dropped;      /* over a memory limit: nothing more is sent */
    size_t queued;    /* bytes handed to send() and not yet written */
    char state[16];   /* last "state" message sent */
};

enum sub_state {
    SUB_NONE,   /* not asked (or lost): gw_hub_tick asks */
    SUB_ASKED,  /* waiting for the confirmation */
    SUB_ACTIVE, /* confirmed: notifications flow */
};

struct watch {
    struct watch *prev, *next;
    char *id;
    struct gw_session *sessions;
    size_t nsessions;
    enum sub_state sub;
    int fetching;          /* a read is in flight */
    int again;             /* read once more when it returns */
    int fetch_failed;      /* retry from the tick */
    uint64_t fetch_ticket; /* the read in flight */
    int64_t fetch_after;   /* where it started (exclusive) */
    uint64_t gen;          /* reads issued so far (the in-flight one included) */
    uint64_t final_gen;    /* reads from this one on drain the stream */
    char *final;           /* the "result" message, once the state is ready */
    int meta_pending;
    int meta_failed;
    int meta_again; /* ask once more when the pending answer comes */
    int read_once;  /* a read has been answered */
    int64_t top;    /* the highest seq any read has seen */
    uint64_t meta_ticket;
    int64_t meta_at; /* when the meta was last asked for */
    int64_t fail_at; /* when a read last failed */
};

struct gw_hub {
    const struct gw_hub_ops *ops;
    void *privdata;
    struct strmap watches; /* id -> struct watch */
    struct watch *head;
    size_t nwatches, nsessions;
    uint64_t tickets;
    int64_t now_ms;
    size_t max_session, max_total; /* 0: no limit */
    size_t queued;                 /* the sum of the sessions' queued */
    size_t drops;
};

/* ------------------------------------------------------------ entries */

static int parse_long(const char *s, size_t n, int64_t *out)
{
    int64_t v = 0;
    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int gw_entry_parse(const char *id, size_t id_len, size_t nfields,
                   const char *const *names, const size_t *name_lens,
                   const char *const *values, const size_t *value_lens,
                   struct gw_entry *e)
{
    const char *dash = id ? memchr(id, '-', id_len) : NULL;
    int64_t v;
    memset(e, 0, sizeof(*e));
    if (!dash || parse_long(dash + 1, id_len - (size_t)(dash + 1 - id), &e->seq) ||
        e->seq <= 0)
        return CR_EPROTO;
    e->attempt = 1;
    for (size_t i = 0; i < nfields; i++) {
        const char *n = names[i];
        size_t nl = name_lens[i];
#define IS(lit) (nl == sizeof(lit) - 1 && !memcmp(n, lit, nl))
        if (IS("state")) {
            e->state = values[i];
        } else if (IS("text")) {
            e->text = values[i];
            e->text_len = value_lens[i];
        } else if (IS("attempt")) {
            if (parse_long(values[i], value_lens[i], &v) == 0)
                e->attempt = (long)v;
        } else if (IS("tokens")) {
            if (parse_long(values[i], value_lens[i], &v) == 0)
                e->tokens = (long)v;
        } else if (IS("error")) {
            e->error = values[i];
        } else if (IS("result")) {
            e->result = values[i];
            e->result_len = value_lens[i];
        }
#undef IS
    }
    if (!e->state || !e->state[0] || !e->text)
        return CR_EPROTO;
    return 0;
}

/* ------------------------------------------------------------ messages */

static char *progress_msg(const struct gw_entry *e, size_t *len)
{
    struct buf b;
    buf_init(&b);
    if (buf_printf(
            &b, "{\"type\": \"progress\", \"seq\": %lld, \"attempt\": %ld, \"state\": ",
            (long long)e->seq, e->attempt) ||
        gw_json_str(&b, e->state, strlen(e->state)) || buf_puts(&b, ", \"text\": ") ||
        gw_json_str(&b, e->text, e->text_len) ||
        buf_printf(&b, ", \"tokens\": %ld", e->tokens))
        goto oom;
    if (e->error &&
        (buf_puts(&b, ", \"error\": ") || gw_json_str(&b, e->error, strlen(e->error))))
        goto oom;
    if (buf_putc(&b, '}'))
        goto oom;
    *len = b.len;
    return buf_detach(&b);
oom:
    buf_release(&b);
    return NULL;
}

/* {"type": "result", ...summary} as a new string, or NULL on OOM. */
static char *result_msg(cJSON *summary)
{
    cJSON *msg = cJSON_CreateObject();
    struct buf b;
    char *out = NULL;
    if (!msg || !summary || !cJSON_AddStringToObject(msg, "type", "result")) {
        cJSON_Delete(msg);
        cJSON_Delete(summary);
        return NULL;
    }
    while (summary->child) {
        cJSON *it = summary->child;
        cJSON_DetachItemViaPointer(summary, it);
        if (!cJSON_AddItemToObject(msg, it->string, it)) {
            cJSON_Delete(it);
            cJSON_Delete(summary);
            cJSON_Delete(msg);
            return NULL;
        }
    }
    cJSON_Delete(summary);
    buf_init(&b);
    if (py_json_dumps(msg, &b) == 0)
        out = buf_detach(&b);
    buf_release(&b);
    cJSON_Delete(msg);
    return out;
}

/* The result from a final stream entry that carries it: a Celery task that
 * ignores its result (SUCCESS), or an RQ job (any end; its results are not
 * Celery's metas). It is summed up as a stored meta of that state would be,
 * "error" included. */
static char *stream_result_msg(const char *task_id, const struct gw_entry *e)
{
    struct buf meta;
    char *out;
    buf_init(&meta);
    if (buf_printf(&meta, "{\"status\": \"%s\", \"result\": ", e->state) ||
        buf_append(&meta, e->result, e->result_len) || buf_putc(&meta, '}')) {
        buf_release(&meta);
        return NULL;
    }
    out = result_msg(gw_meta_summary(task_id, meta.data, meta.len));
    buf_release(&meta);
    return out;
}

static int is_end(const char *state)
{
    return !strcmp(state, "SUCCESS") || !strcmp(state, "FAILURE") ||
           !strcmp(state, "REVOKED");
}

/* ------------------------------------------------------------- memory */

static void drop_session(struct gw_hub *h, struct gw_session *s, int reason)
{
    s->dropped = 1;
    s->done = 1;
    h->queued -= s->queued;
    s->queued = 0;
    h->drops++;
    h->ops->drop(s, reason, h->privdata);
}

/* The session furthest behind, counting len more for s; on a tie another
 * than s, which has been slower to read what it already had. */
static struct gw_session *furthest_behind(struct gw_hub *h, struct gw_session *s,
                                          size_t len)
{
    struct gw_session *best = NULL;
    for (struct watch *w = h->head; w; w = w->next)
        for (struct gw_session *o = w->sessions; o; o = o->next)
            if (o != s && !o->dropped && (!best || o->queued > best->queued))
                best = o;
    return best && best->queued >= s->queued + len ? best : s;
}

/* Hands text to the glue within the limits. Returns 0, or -1 when s itself
 * was dropped (or had been) and nothing was sent. Sessions further behind
 * than s are dropped first, so the ones that keep up keep their stream. */
static int session_send(struct gw_hub *h, struct gw_session *s, const char *text,
                        size_t len)
{
    if (s->dropped)
        return -1;
    if (h->max_session && s->queued && s->queued + len > h->max_session) {
        drop_session(h, s, GW_DROP_SLOW);
        return -1;
    }
    while (h->max_total && h->queued + len > h->max_total) {
        struct gw_session *v = furthest_behind(h, s, len);
        if (v == s) {
            if (!s->queued)
                break; /* nothing of its own queued: it is not the slow one */
            drop_session(h, s, GW_DROP_BUDGET);
            return -1;
        }
        drop_session(h, v, GW_DROP_BUDGET);
    }
    h->ops->send(s, text, len, h->privdata);
    s->queued += len;
    h->queued += len;
    return 0;
}

/* ------------------------------------------------------------ watches */

static void fail_session(struct gw_hub *h, struct gw_session *s)
{
    static const char msg[] = "{\"type\": \"error\", \"error\": \"out of memory\"}";
    if (s->done)
        return;
    s->done = 1;
    if (session_send(h, s, msg, sizeof(msg) - 1) == 0)
        h->ops->close(s, h->privdata);
}

static void ask_subscribe(struct gw_hub *h, struct watch *w)
{
    w->sub = SUB_ASKED;
    if (h->ops->subscribe(h, w->id, h->privdata))
        w->sub = SUB_NONE;
}

static void ask_meta(struct gw_hub *h, struct watch *w)
{
    if (w->meta_pending)
        return;
    w->meta_at = h->now_ms;
    w->meta_ticket = ++h->tickets;
    w->meta_failed = 0;
    if (h->ops->get_meta(h, w->id, w->meta_ticket, h->privdata))
        w->meta_failed = 1;
    else
        w->meta_pending = 1;
}

/* The stored state may have changed: ask now, or right after the answer
 * awaited (which may have been read before the change). */
static void ask_meta_again(struct gw_hub *h, struct watch *w)
{
    if (w->meta_pending)
        w->meta_again = 1;
    else
        ask_meta(h, w);
}

static void request_fetch(struct gw_hub *h, struct watch *w)
{
    int64_t after = -1;
    if (w->sub != SUB_ACTIVE)
        return; /* the read follows the subscription */
    if (w->fetching) {
        w->again = 1;
        return;
    }
    for (struct gw_session *s = w->sessions; s; s = s->next)
        if (!s->done && (after < 0 || s->cursor < after))
            after = s->cursor;
    if (after < 0)
        return;
    w->again = 0;
    w->fetch_failed = 0;
    w->gen++;
    w->fetch_ticket = ++h->tickets;
    w->fetching = 1;
    w->fetch_after = after;
    if (h->ops->fetch(h, w->id, after, w->fetch_ticket, h->privdata)) {
        w->fetching = 0;
        w->fetch_failed = 1;
        w->fail_at = h->now_ms;
    }
}

static void maybe_complete(struct gw_hub *h, struct watch *w, uint64_t gen)
{
    if (!w->final || gen < w->final_gen)
        return;
    for (struct gw_session *s = w->sessions; s; s = s->next) {
        if (s->done || gen < s->min_gen || !s->in_read)
            continue;
        s->done = 1;
        if (session_send(h, s, w->final, strlen(w->final)) == 0)
            h->ops->close(s, h->privdata);
    }
}

static struct watch *find(struct gw_hub *h, const char *id)
{
    return strmap_get(&h->watches, id);
}

static void watch_free(struct gw_hub *h, struct watch *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        h->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    if (strmap_get(&h->watches, w->id) == w)
        strmap_del(&h->watches, w->id);
    while (w->sessions) {
        struct gw_session *s = w->sessions;
        w->sessions = s->next;
        cr_free(s);
        h->nsessions--;
    }
    cr_free(w->final);
    cr_free(w->id);
    cr_free(w);
    h->nwatches--;
}

static struct watch *watch_new(struct gw_hub *h, const char *id)
{
    struct watch *w = cr_calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    w->id = cr_strdup(id);
    if (!w->id || strmap_put(&h->watches, w->id, w)) {
        cr_free(w->id);
        cr_free(w);
        return NULL;
    }
    w->next = h->head;
    if (h->head)
        h->head->prev = w;
    h->head = w;
    h->nwatches++;
    return w;
}

/* ------------------------------------------------------------- public */

struct gw_hub *gw_hub_new(const struct gw_hub_ops *ops, void *privdata)
{
    struct gw_hub *h = cr_calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->ops = ops;
    h->privdata = privdata;
    strmap_init(&h->watches);
    return h;
}

void gw_hub_free(struct gw_hub *h)
{
    if (!h)
        return;
    while (h->head)
        watch_free(h, h->head);
    strmap_release(&h->watches);
    cr_free(h);
}

struct gw_session *gw_hub_join(struct gw_hub *h, const char *task_id, int64_t from_seq,
                               void *data, int64_t now_ms)
{
    struct watch *w = find(h, task_id);
    struct gw_session *s;
    int fresh = 0;

    h->now_ms = now_ms;
    if (!w) {
        w = watch_new(h, task_id);
        if (!w)
            return NULL;
        fresh = 1;
    }
    s = cr_calloc(1, sizeof(*s));
    if (!s) {
        if (fresh)
            watch_free(h, w);
        return NULL;
    }
    s->w = w;
    s->data = data;
    s->cursor = from_seq > 0 ? from_seq : 0;
    /* The next read issued is the first one that can include this session. */
    s->min_gen = w->gen + 1;
    s->next = w->sessions;
    if (w->sessions)
        w->sessions->prev = s;
    w->sessions = s;
    w->nsessions++;
    h->nsessions++;
    if (fresh) {
        ask_subscribe(h, w);
    } else if (w->sub == SUB_ACTIVE) {
        request_fetch(h, w);
        ask_meta(h, w); /* so the newcomer learns the current state */
    }
    return s;
}

void gw_hub_leave(struct gw_hub *h, struct gw_session *s)
{
    struct watch *w;
    if (!s)
        return;
    w = s->w;
    if (s->prev)
        s->prev->next = s->next;
    else
        w->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    h->queued -= s->queued;
    cr_free(s);
    w->nsessions--;
    h->nsessions--;
    if (!w->sessions) {
        if (w->sub != SUB_NONE)
            h->ops->unsubscribe(h, w->id, h->privdata);
        watch_free(h, w);
    }
}

void *gw_session_data(const struct gw_session *s)
{
    return s->data;
}

const char *gw_session_task(const struct gw_session *s)
{
    return s->w->id;
}

void gw_hub_on_subscribed(struct gw_hub *h, const char *task_id)
{
    struct watch *w = find(h, task_id);
    if (!w || w->sub == SUB_ACTIVE)
        return;
    w->sub = SUB_ACTIVE;
    request_fetch(h, w);
    w->meta_pending = 0; /* an answer to an older ask is dropped by its ticket */
    w->meta_again = 0;
    ask_meta(h, w);
}

static void deliver(struct gw_hub *h, struct watch *w, const struct gw_entry *e,
                    const char *msg, size_t len)
{
    for (struct gw_session *s = w->sessions; s; s = s->next) {
        if (s->done || !s->in_read || e->seq <= s->cursor)
            continue;
        if (!msg) {
            fail_session(h, s);
            continue;
        }
        if (e->seq > s->cursor + 1) { /* trimmed away before it was read */
            char gap[96];
            int n = snprintf(gap, sizeof(gap),
                             "{\"type\": \"gap\", \"from\": %lld, \"to\": %lld}",
                             (long long)(s->cursor + 1), (long long)(e->seq - 1));
            if (session_send(h, s, gap, (size_t)n))
                continue;
        }
        if (session_send(h, s, msg, len) == 0)
            s->cursor = e->seq;
    }
}

void gw_hub_on_entries(struct gw_hub *h, const char *task_id, uint64_t ticket,
                       const struct gw_entry *e, size_t n, int complete)
{
    struct watch *w = find(h, task_id);
    uint64_t gen;
    int64_t top;
    int restate = 0;
    if (!w || !w->fetching || ticket != w->fetch_ticket)
        return;
    w->fetching = 0;
    gen = w->gen;
    top = w->top;
    /* Only sessions whose cursor the read covers may take from it: one that
     * joined behind it (further back) would otherwise skip entries. */
    for (struct gw_session *s = w->sessions; s; s = s->next) {
        s->in_read = !s->done && s->cursor >= w->fetch_after;
        if (!s->done && !s->in_read)
            w->again = 1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        char *msg;
        if (i && e[i].seq <= e[i - 1].seq)
            continue; /* never out of order, but never trust a peer */
        msg = progress_msg(&e[i], &len);
        deliver(h, w, &e[i], msg, len);
        cr_free(msg);
        /* A task that ignores its result, and an RQ job, have it in the
         * final entry only. */
        if (e[i].result && !w->final && is_end(e[i].state)) {
            w->final = stream_result_msg(task_id, &e[i]);
            w->final_gen = gen;
        }
        /* An attempt begins or ends: the stored state follows (an RQ job's
         * is read on each ask, nothing announces it), so the sessions'
         * "state" comes now rather than at the next poll. Not for what the
         * first read replays: the meta is asked with it. */
        if (w->read_once && e[i].seq > top &&
            (!strcmp(e[i].state, "STARTED") || !strcmp(e[i].state, "RETRY")))
            restate = 1;
        if (e[i].seq > w->top)
            w->top = e[i].seq;
    }
    w->read_once = 1;
    if (restate && !w->final)
        ask_meta_again(h, w);
    if (!complete)
        w->again = 1;
    if (w->again) {
        request_fetch(h, w);
        return;
    }
    maybe_complete(h, w, gen);
}

void gw_hub_on_fetch_failed(struct gw_hub *h, const char *task_id, uint64_t ticket)
{
    struct watch *w = find(h, task_id);
    if (!w || !w->fetching || ticket != w->fetch_ticket)
        return;
    w->fetching = 0;
    w->fetch_failed = 1;
    w->fail_at = h->now_ms;
}

void gw_hub_on_notify(struct gw_hub *h, const char *task_id)
{
    struct watch *w = find(h, task_id);
    if (w)
        request_fetch(h, w);
}

static void handle_meta(struct gw_hub *h, struct watch *w, const char *meta, size_t len)
{
    char st[16] = "PENDING";
    if (w->final)
        return;
    if (gw_meta_ready(meta, len)) {
        w->final = result_msg(gw_meta_summary(w->id, meta, len));
        if (!w->final) {
            for (struct gw_session *s = w->sessions; s; s = s->next)
                fail_session(h, s);
            return;
        }
        /* The worker wrote the final entry before this meta: a read that
         * starts from now on sees it. */
        w->final_gen = w->gen + 1;
        if (w->fetching)
            w->again = 1;
        else
            request_fetch(h, w);
        return;
    }
    if (meta)
        result_meta_status(meta, len, st, sizeof(st));
    for (struct gw_session *s = w->sessions; s; s = s->next) {
        char msg[80];
        int n;
        if (s->done || !strcmp(s->state, st))
            continue;
        snprintf(s->state, sizeof(s->state), "%s", st);
        n = snprintf(msg, sizeof(msg), "{\"type\": \"state\", \"state\": ");
        if (n > 0) {
            struct buf b;
            buf_init(&b);
            if (buf_append(&b, msg, (size_t)n) || gw_json_str(&b, st, strlen(st)) ||
                buf_putc(&b, '}'))
                fail_session(h, s);
            else
                session_send(h, s, b.data, b.len);
            buf_release(&b);
        }
    }
}

void gw_hub_on_meta(struct gw_hub *h, const char *task_id, uint64_t ticket,
                    const char *meta, size_t len)
{
    struct watch *w = find(h, task_id);
    if (!w || !w->meta_pending || ticket != w->meta_ticket)
        return;
    w->meta_pending = 0;
    handle_meta(h, w, meta, len);
    if (w->meta_again && !w->final) {
        w->meta_again = 0;
        ask_meta(h, w);
    }
}

void gw_hub_on_meta_failed(struct gw_hub *h, const char *task_id, uint64_t ticket)
{
    struct watch *w = find(h, task_id);
    if (!w || !w->meta_pending || ticket != w->meta_ticket)
        return;
    w->meta_pending = 0;
    w->meta_failed = 1;
    w->meta_again = 0; /* the tick asks again */
}

void gw_hub_on_meta_published(struct gw_hub *h, const char *task_id, const char *meta,
                              size_t len)
{
    struct watch *w = find(h, task_id);
    if (w && w->sub == SUB_ACTIVE)
        handle_meta(h, w, meta, len);
}

void gw_hub_on_sub_lost(struct gw_hub *h)
{
    for (struct watch *w = h->head; w; w = w->next)
        w->sub = SUB_NONE;
}

void gw_hub_resubscribe(struct gw_hub *h)
{
    for (struct watch *w = h->head; w; w = w->next)
        if (w->sub == SUB_NONE)
            ask_subscribe(h, w);
}

void gw_hub_tick(struct gw_hub *h, int64_t now_ms)
{
    h->now_ms = now_ms;
    for (struct watch *w = h->head; w; w = w->next) {
        if (w->sub == SUB_NONE) {
            ask_subscribe(h, w);
            continue;
        }
        if (w->sub != SUB_ACTIVE)
            continue;
        if (w->fetch_failed && !w->fetching && now_ms - w->fail_at >= GW_RETRY_MS)
            request_fetch(h, w);
        if (!w->meta_pending &&
            (w->meta_failed || (!w->final && now_ms - w->meta_at >= GW_META_POLL_MS)))
            ask_meta(h, w);
    }
}

void gw_hub_set_limits(struct gw_hub *h, size_t max_session_bytes, size_t max_total_bytes)
{
    h->max_session = max_session_bytes;
    h->max_total = max_total_bytes;
}

void gw_hub_on_written(struct gw_hub *h, struct gw_session *s, size_t len)
{
    if (len > s->queued)
        len = s->queued; /* a dropped session's late frames count no more */
    s->queued -= len;
    h->queued -= len;
}

size_t gw_hub_queued(const struct gw_hub *h)
{
    return h->queued;
}

size_t gw_hub_drops(const struct gw_hub *h)
{
    return h->drops;
}

size_t gw_hub_sessions(const struct gw_hub *h)
{
    return h->nsessions;
}

size_t gw_hub_watches(const struct gw_hub *h)
{
    return h->nwatches;
}
