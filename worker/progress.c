/* progress.c -- live progress: batched Redis Stream entries and throttled
 * PROGRESS metas for running tasks (see progress.h for the wire format). */
#include "progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"
#include "worker_ctx.h"
#include "protocol/result.h"
#include "util/alloc.h"

/* ================================================================ batching */

void progress_batch_init(struct progress_batch *b)
{
    buf_init(&b->text);
    b->tokens = 0;
    b->first_ms = -1;
    b->meta_ms = -1;
    b->start_ms = -1;
    b->meta_dirty = 0;
}

void progress_batch_release(struct progress_batch *b)
{
    buf_release(&b->text);
    progress_batch_init(b);
}

int progress_batch_add(struct progress_batch *b, const char *text, size_t len,
                       int64_t now_ms)
{
    if (len && buf_append(&b->text, text, len))
        return CR_ENOMEM;
    if (b->first_ms < 0 && b->text.len)
        b->first_ms = now_ms;
    if (b->start_ms < 0)
        b->start_ms = now_ms;
    b->tokens++;
    b->meta_dirty = 1;
    return 0;
}

static int64_t meta_due_at(const struct progress_batch *b,
                           const struct progress_policy *pol)
{
    if (b->meta_ms < 0)
        return b->start_ms + pol->interval_ms;
    return b->meta_ms +
           (pol->meta_gap_ms > pol->interval_ms ? pol->meta_gap_ms : pol->interval_ms);
}

int progress_batch_due(const struct progress_batch *b, const struct progress_policy *pol,
                       int64_t now_ms)
{
    int due = 0;
    if (pol->stream && b->text.len &&
        (b->text.len >= pol->max_bytes || now_ms - b->first_ms >= pol->interval_ms))
        due |= PROGRESS_DUE_STREAM;
    if (pol->meta && b->meta_dirty && now_ms >= meta_due_at(b, pol))
        due |= PROGRESS_DUE_META;
    return due;
}

int64_t progress_batch_wait_ms(const struct progress_batch *b,
                               const struct progress_policy *pol, int64_t now_ms)
{
    int64_t at = -1;
    if (pol->stream && b->text.len)
        at = b->text.len >= pol->max_bytes ? now_ms : b->first_ms + pol->interval_ms;
    if (pol->meta && b->meta_dirty) {
        int64_t m = meta_due_at(b, pol);
        if (at < 0 || m < at)
            at = m;
    }
    if (at < 0)
        return -1;
    return at > now_ms ? at - now_ms : 0;
}

/* With more tasks streaming than fit in the interval, it grows with their
 * number. Each write is a script run in Redis and a command built here; at
 * 10,000 one-second streams a fixed 100 ms interval made four writes per
 * task over the Redis broker (whose intake is spread out, so batches rarely
 * merged under backpressure as they do after AMQP's burst), and the writer
 * was the largest cost beyond the calls themselves (docs/benchmarks.md). */
int64_t progress_budget_interval_ms(int64_t base_ms, long ntasks)
{
    int64_t need = ntasks > 0 ? (int64_t)ntasks * 1000 / PROGRESS_WRITES_PER_S : 0;
    return need > base_ms ? need : base_ms;
}

void progress_batch_took_stream(struct progress_batch *b)
{
    buf_reset(&b->text);
    b->first_ms = -1;
}

void progress_batch_took_meta(struct progress_batch *b, int64_t now_ms)
{
    b->meta_ms = now_ms;
    b->meta_dirty = 0;
}

/* ============================================================ the writer */

/* The script of protocol/progress.h does each write. Celery's own store
 * only protects SUCCESS, but PROGRESS must never hide a FAILURE, hence its
 * check of the meta. Several entries go in one call: a task that answers
 * within one batch interval has its STARTED, text and final entries written
 * by one script instead of three (Redis 48 -> 25 us per task in the dispatch
 * bench). */
static struct backend_script write_script = BACKEND_SCRIPT(PROGRESS_WRITE_LUA);

/* Writes are not sent while this many backend operations are unanswered
 * (Redis slow or away): text keeps collecting in the batch instead, so memory
 * stays bounded by the text itself. */
#define BACKLOG_MAX 5000

struct ptask {
    struct ptask *prev, *next;
    struct job *j;     /* borrowed from the first text to the closing event */
    unsigned long run; /* this writer's run number: see run_name() */
    long n;            /* entries written by this run */
    int opened;        /* STARTED written (it goes with the first other entry) */
    int attempt;       /* hint: the task's retries + 1 when it started (a retry
                        * counts the next one before this attempt's end is written) */
    struct progress_batch b;
};

struct progress {
    const struct worker_ctx *w;
    struct progress_policy pol;
    struct ptask *head;
    uv_timer_t *timer; /* heap: freed in its close callback */
    unsigned long runs;
    long ntasks;     /* tasks with progress state (ptask) */
    int64_t base_ms; /* --progress-interval */
    long pid;        /* getpid() is a system call each time, and every write names it */
    int oom_logged;
    char ttl[24];
    char maxlen[24];
};

static int64_t now_ms(struct progress *p)
{
    return (int64_t)uv_now(p->w->loop);
}

/* One stream entry to write. */
struct entry {
    const char *state;
    const char *text;
    size_t text_len;
    long tokens;
    const char *const *extra; /* NULL-terminated field/value pairs, or NULL */
};

#define ENTRIES_MAX 3 /* STARTED, text, final */
#define EXTRA_MAX 2   /* pairs per entry */

/* Sends one write of k entries (0: the meta alone) and the meta (or NULL). A
 * STARTED entry goes first when the attempt has none yet. */
static void write_entries(struct progress *p, struct ptask *t, const struct entry *in,
                          int k, const char *meta)
{
    const char *argv[10 + (ENTRIES_MAX + 1) * (4 + 2 * EXTRA_MAX)];
    size_t lens[sizeof(argv) / sizeof(argv[0])];
    char nbuf[24], atbuf[24], kbuf[8], tokbuf[ENTRIES_MAX + 1][24], run[300];
    struct entry e[ENTRIES_MAX + 1];
    struct buf key, mkey;
    int argc = 0, rc, ne = 0;

    if (k > 0 && !t->opened) {
        e[ne++] = (struct entry){"STARTED", "", 0, 0, NULL};
        t->opened = 1;
    }
    for (int i = 0; i < k && i < ENTRIES_MAX; i++)
        e[ne++] = in[i];
    buf_init(&key);
    buf_init(&mkey);
    /* Under the result backend's global_keyprefix, as the metas it stores. */
    if (buf_printf(&key, "%s%s%s", backend_key_prefix(p->w->backend), PROGRESS_KEY_PREFIX,
                   t->j->tm.id) ||
        buf_printf(&mkey, "%s%s%s", backend_key_prefix(p->w->backend),
                   BACKEND_META_PREFIX, t->j->tm.id))
        goto oom;
    t->n += ne;
    /* The writer's identity in the stream: host, process and run number. */
    snprintf(run, sizeof(run), "%s:%ld:%lu", p->w->cfg->hostname, p->pid, t->run);
    snprintf(nbuf, sizeof(nbuf), "%ld", t->n);
    snprintf(atbuf, sizeof(atbuf), "%d", t->attempt);
    snprintf(kbuf, sizeof(kbuf), "%d", ne);
#define ARG(s, l)                                                                        \
    do {                                                                                 \
        argv[argc] = (s);                                                                \
        lens[argc++] = (l);                                                              \
    } while (0)
    ARG("2", 1);
    ARG(key.data, key.len);
    ARG(mkey.data, mkey.len);
    ARG(run, strlen(run));
    ARG(nbuf, strlen(nbuf));
    ARG(atbuf, strlen(atbuf));
    ARG(p->maxlen, strlen(p->maxlen));
    ARG(p->ttl, strlen(p->ttl));
    ARG(meta ? meta : "", meta ? strlen(meta) : 0);
    ARG(kbuf, strlen(kbuf));
    for (int i = 0; i < ne; i++) {
        static const char *const npairs[] = {"0", "1", "2"};
        int x = 0;
        while (e[i].extra && x < EXTRA_MAX && e[i].extra[2 * x])
            x++;
        snprintf(tokbuf[i], sizeof(tokbuf[i]), "%ld", e[i].tokens);
        ARG(e[i].state, strlen(e[i].state));
        ARG(e[i].text ? e[i].text : "", e[i].text ? e[i].text_len : 0);
        ARG(tokbuf[i], strlen(tokbuf[i]));
        ARG(npairs[x], 1);
        for (int q = 0; q < 2 * x; q++)
            ARG(e[i].extra[q], strlen(e[i].extra[q]));
    }
#undef ARG
    /* No callback: the result is not needed, and a callback would have to
     * outlive this writer (the backend is freed after it). */
    rc = backend_eval(p->w->backend, &write_script, argc, argv, lens, NULL, NULL);
    buf_release(&key);
    buf_release(&mkey);
    if (rc == 0)
        return;
oom:
    buf_release(&key);
    buf_release(&mkey);
    if (!p->oom_logged++)
        LOG(LOG_ERROR, "progress: out of memory; some progress was not written");
}

/* The PROGRESS meta as Celery's update_state(state="PROGRESS", meta=...)
 * would store it, with the job's usual extra fields. New string or NULL. */
static char *progress_meta(struct progress *p, struct ptask *t)
{
    struct job *j = t->j;
    cJSON *res = cJSON_CreateObject();
    char *out = NULL;

    if (!res || !cJSON_AddStringToObject(res, "text", p->w->job_text(j)) ||
        !cJSON_AddNumberToObject(res, "tokens", (double)t->b.tokens))
        goto done;
    out = engine_job_meta(j, "PROGRESS", res, NULL, 0);
done:
    cJSON_Delete(res);
    return out;
}

/* Writes what is due. final (the end of the attempt) forces out everything
 * buffered and goes in the same write. */
static void flush(struct progress *p, struct ptask *t, const struct entry *final)
{
    int64_t now = now_ms(p);
    int due = progress_batch_due(&t->b, &p->pol, now), k = 0;
    struct entry e[2] = {{NULL}};
    char *meta = NULL;

    if (final && p->pol.stream && t->b.text.len)
        due |= PROGRESS_DUE_STREAM;
    if (final)
        due &= ~PROGRESS_DUE_META; /* the final state follows at once */
    if (!due && !final)
        return;
    if (!final && backend_pending(p->w->backend) > BACKLOG_MAX)
        return;
    if ((due & PROGRESS_DUE_META) && t->j && t->j->tm.ignore_result != 1)
        meta = progress_meta(p, t);
    if (due & PROGRESS_DUE_STREAM)
        e[k++] =
            (struct entry){"PROGRESS", t->b.text.data, t->b.text.len, t->b.tokens, NULL};
    if (final)
        e[k++] = *final;
    if (k || meta)
        write_entries(p, t, e, k, meta);
    if (due & PROGRESS_DUE_STREAM)
        progress_batch_took_stream(&t->b);
    if (due & PROGRESS_DUE_META)
        progress_batch_took_meta(&t->b, now);
    cr_free(meta);
}

static void arm(struct progress *p);
static void arm_one(struct progress *p, struct ptask *t);

static void on_timer(uv_timer_t *timer)
{
    struct progress *p = timer->data;
    if (engine_shutting_down(p->w->engine) == 2)
        return;
    for (struct ptask *t = p->head; t; t = t->next)
        flush(p, t, NULL);
    arm(p);
}

/* Starts the one timer to fire in wait ms, unless it fires sooner already.
 * Under backpressure a due time stays in the past (wait 0): poll gently. */
static void arm_at(struct progress *p, int64_t wait)
{
    if (wait == 0)
        wait = p->pol.interval_ms;
    if (uv_is_active((uv_handle_t *)p->timer) &&
        uv_timer_get_due_in(p->timer) <= (uint64_t)wait)
        return;
    uv_timer_start(p->timer, on_timer, (uint64_t)wait, 0);
}

/* Per delta only this task's due time can have moved earlier, so it is the
 * only one looked at: O(1) per token. (Scanning every task here cost 75% of
 * the worker's CPU with 5,000 streams; measured in docs/benchmarks.md.) The
 * timer's own firing rescans all tasks once, which is O(n) per interval. */
static void arm_one(struct progress *p, struct ptask *t)
{
    int64_t wait = progress_batch_wait_ms(&t->b, &p->pol, now_ms(p));
    if (wait >= 0)
        arm_at(p, wait);
}

/* One timer for every task: it fires at the earliest due time. */
static void arm(struct progress *p)
{
    int64_t now = now_ms(p), best = -1;
    for (struct ptask *t = p->head; t; t = t->next) {
        int64_t wait = progress_batch_wait_ms(&t->b, &p->pol, now);
        if (wait >= 0 && (best < 0 || wait < best))
            best = wait;
    }
    if (best < 0)
        uv_timer_stop(p->timer);
    else
        arm_at(p, best);
}

static void retune(struct progress *p)
{
    p->pol.interval_ms = progress_budget_interval_ms(p->base_ms, p->ntasks);
}

static void ptask_free(struct progress *p, struct ptask *t)
{
    if (t->prev)
        t->prev->next = t->next;
    else
        p->head = t->next;
    if (t->next)
        t->next->prev = t->prev;
    if (t->j->ptask == t)
        t->j->ptask = NULL;
    progress_batch_release(&t->b);
    cr_free(t);
    p->ntasks--;
    retune(p);
}

static struct ptask *ptask_new(struct progress *p, struct job *j)
{
    struct ptask *t = cr_calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->j = j;
    j->ptask = t;
    t->attempt = j->tm.retries + 1;
    progress_batch_init(&t->b);
    t->run = ++p->runs;
    t->next = p->head;
    if (p->head)
        p->head->prev = t;
    p->head = t;
    p->ntasks++;
    retune(p);
    return t;
}

struct progress *progress_new(const struct worker_ctx *w)
{
    struct progress *p;
    const char *mode = w->cfg->progress;
    if (!mode || !strcmp(mode, "off"))
        return NULL;
    p = cr_calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->timer = cr_malloc(sizeof(*p->timer));
    if (!p->timer) {
        cr_free(p);
        return NULL;
    }
    p->w = w;
    p->pid = (long)getpid();
    p->pol.stream = !strcmp(mode, "stream");
    p->pol.meta = 1;
    p->base_ms = w->cfg->progress_interval_ms > 0 ? w->cfg->progress_interval_ms : 100;
    p->pol.interval_ms = p->base_ms;
    p->pol.max_bytes = PROGRESS_BATCH_BYTES;
    p->pol.meta_gap_ms = PROGRESS_META_MIN_MS;
    snprintf(p->ttl, sizeof(p->ttl), "%d", w->cfg->result_expires);
    snprintf(p->maxlen, sizeof(p->maxlen), "%d", PROGRESS_STREAM_MAXLEN);
    uv_timer_init(w->loop, p->timer);
    p->timer->data = p;
    return p;
}

void progress_on_delta(struct progress *p, struct job *j, const char *text, size_t len)
{
    struct ptask *t;
    if (!p || !j->tm.id)
        return;
    t = j->ptask;
    if (!t) {
        /* The first text of this run: its state starts here, not when the
         * task started, so a call waiting for its first token costs nothing
         * (the memory bench holds 10,000 such). */
        t = ptask_new(p, j);
        if (!t) {
            if (!p->oom_logged++)
                LOG(LOG_ERROR, "progress: out of memory; some progress was not written");
            return;
        }
    }
    if (progress_batch_add(&t->b, text, len, now_ms(p)) && !p->oom_logged++)
        LOG(LOG_ERROR, "progress: out of memory; some progress was not written");
    if (progress_batch_due(&t->b, &p->pol, now_ms(p)))
        flush(p, t, NULL);
    arm_one(p, t);
}

static const char *final_state(enum task_event_type type)
{
    switch (type) {
    case TEV_SUCCEEDED:
        return "SUCCESS";
    case TEV_FAILED:
        return "FAILURE";
    case TEV_RETRIED:
        return "RETRY";
    case TEV_REVOKED:
        return "REVOKED";
    default:
        return NULL;
    }
}

/* Closes the attempt: any buffered text and the final entry, in one write. */
static void close_attempt(struct progress *p, struct ptask *t, const char *state,
                          const struct task_event_info *info)
{
    const char *extra[5] = {NULL};
    char err[700];
    struct buf res;
    long tokens = t->b.tokens;
    int k = 0;

    buf_init(&res);
    if (info->llm && info->llm->text && info->llm->completion_tokens > 0)
        tokens = info->llm->completion_tokens;
    if (info->type == TEV_REVOKED) {
        snprintf(err, sizeof(err), "TaskRevokedError: %s",
                 info->terminated ? "terminated"
                 : info->expired  ? "expired"
                                  : "revoked");
        extra[k++] = "error";
        extra[k++] = err;
    } else if (info->exc_type) {
        snprintf(err, sizeof(err), "%s: %s", info->exc_type,
                 info->exc_message ? info->exc_message : "");
        extra[k++] = "error";
        extra[k++] = err;
    }
    if (info->type == TEV_SUCCEEDED && t->j && t->j->tm.ignore_result == 1 &&
        info->result && py_json_dumps(info->result, &res) == 0 && res.data) {
        extra[k++] = "result";
        extra[k++] = res.data;
    }
    flush(p, t, &(struct entry){state, "", 0, tokens, extra});
    buf_release(&res);
}

/* Only tasks that produce text as they go have progress. The others
 * (celery.accumulate, llm.embed, unregistered names) would get a stream of just
 * STARTED and the final state, which the result meta already says: writing it
 * cost Redis 36 us of its 46 us per task in the dispatch benchmark. */
static int has_progress(const struct job *j)
{
    return j->kind == TASK_GENERATE || j->kind == TASK_CHAT;
}

void progress_on_task(struct progress *p, struct job *j,
                      const struct task_event_info *info)
{
    struct ptask *t;
    const char *state;

    if (!p || !j->tm.id || !has_progress(j))
        return;
    t = j->ptask;
    /* A fallback after text closes this run as a retry would: the next
     * provider's text is a new run, so readers see a new attempt. */
    state = info->type == TEV_FALLBACK ? (t ? "RETRY" : NULL) : final_state(info->type);
    if (!state)
        return;
    if (!p->pol.stream) {
        if (t)
            ptask_free(p, t);
        return;
    }
    if (!t) {
        /* No text: either it started and ended before its first token (STARTED
         * and the end are written), or it ended without starting here
         * (revoked, expired, rejected: only the end, as a run of its own). */
        struct ptask tmp;
        int started = j->t_started != 0;
        memset(&tmp, 0, sizeof(tmp));
        tmp.j = j;
        tmp.opened = !started;
        /* A retry has counted the next attempt in retries already. */
        tmp.attempt = j->tm.retries + 1 - (started && info->type == TEV_RETRIED);
        progress_batch_init(&tmp.b);
        tmp.run = ++p->runs;
        close_attempt(p, &tmp, state, info);
        progress_batch_release(&tmp.b);
        return;
    }
    close_attempt(p, t, state, info);
    ptask_free(p, t);
    /* No re-arm (O(tasks) per completion): at worst the timer fires early
     * once, rescans and re-arms itself. */
}

void progress_forget(struct progress *p, struct job *j)
{
    if (p && j->ptask)
        ptask_free(p, j->ptask);
}

static void on_timer_closed(uv_handle_t *h)
{
    cr_free(h);
}

void progress_free(struct progress *p)
{
    if (!p)
        return;
    while (p->head)
        ptask_free(p, p->head);
    uv_timer_stop(p->timer);
    uv_close((uv_handle_t *)p->timer, on_timer_closed);
    cr_free(p);
}
