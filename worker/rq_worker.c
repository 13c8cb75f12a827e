/* rq_worker.c -- RQ's jobs on the loop: pop, start, run the LLM task, end.
 *
 * One slot per concurrent job, each registered as an RQ worker of its own
 * (rq-protocol.md 11: RQ expects one current job per worker, and stop-job
 * and `rq info` address a worker). One connection pops with BLPOP over the
 * queues in the order given (strict priority, as RQ's workers pop), one job
 * per free slot; the other carries every other command, each step of a job
 * one script (net/rq_redis.h). One cron timer keeps the heartbeats, the job
 * timeouts, the suspension check and the resends of commands a lost
 * connection left unanswered.
 *
 * Why not net/vsession: that session keeps kombu's bookkeeping (a prefetch
 * window of unacked records, acks, restores of dead consumers' records). RQ
 * has none of it: a pop hands the job over for good, the started registry
 * (kept fresh by heartbeats) is the only claim, and RQ's own readers clean up
 * after a dead worker. What is left is the pop loop here. */
#include "rq_worker.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/tasks.h"
#include "llm/llm_client.h"
#include "llm_stack.h"
#include "progress.h"
#include "net/redis.h"
#include "net/rq_redis.h"
#include "protocol/celery_msg.h"
#include "protocol/progress.h"
#include "protocol/pyjson.h"
#include "protocol/rq_data.h"
#include "protocol/rq_job.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/version.h"

#define CRON_MS 250
#define POP_BLOCK_S 1      /* so a shutdown is seen within a second */
#define POP_BATCH_MAX 256  /* ids taken by one non-blocking pop */
#define IDLE_BEAT_MS 30000 /* RQ beats before each pop, at most every 405 s */
#define SUSPEND_CHECK_MS 1000
#define DEATH_WAIT_MS 3000
#define FUNC_MAX 256
#define PROGRESS_TTL_S                                                                   \
    86400 /* a stream's TTL when the result is kept for ever or not at all */
#define PROGRESS_TTL_MIN_S 60

enum slot_state {
    SLOT_IDLE,     /* no job: may take the next pop */
    SLOT_STARTING, /* popped: the start script is out */
    SLOT_RUNNING,  /* the LLM call runs */
    SLOT_ENDING,   /* the end script is out */
};

struct rq_worker;

struct slot {
    struct rq_worker *w;
    char name[RQ_MAX_NAME + 1];
    struct rq_worker_info info;
    enum slot_state state;

    /* the job; valid from STARTING to the end's reply */
    char id[RQ_MAX_ID + 1];
    char queue[RQ_MAX_NAME + 1];
    char func[FUNC_MAX];
    enum task_kind kind;
    enum rq_serializer ser;
    long timeout_s, result_ttl_s, failure_ttl_s, retries_left, interval_s;
    struct llm_req *call;
    uint64_t started_ms;
    char eid[33];         /* layout 2: this run's execution id (uuid4 hex) */
    double started_epoch; /* layout 2: when it started (epoch seconds) */
    uint64_t deadline_ms; /* 0: no timeout */
    uint64_t next_beat_ms;
    int timed_out;
    int stopped; /* stop-job: ends as stopped, never retried */
    /* progress in job.meta: the job's own meta (a dict), NULL when off or
     * when its meta is not plain data (then nothing is written) */
    cJSON *meta;
    unsigned long deltas;
    size_t meta_text_len; /* text length the last write carried */
    uint64_t next_meta_ms;
    struct redis_req meta_req;
    int meta_inflight;
    int killed; /* kill-horse: ends as RQ ends a killed work-horse */
    /* The progress stream (protocol/progress.h) of a streaming job: each
     * write is built from the text not yet written and sent once the one
     * before it is answered; a write whose reply was lost goes again as it
     * was (the script drops it if it ran), so no text is skipped or doubled. */
    int pstream;    /* this job writes one */
    char prun[300]; /* this run's name in the stream: host:pid:number */
    long pn;        /* entries in the writes built so far */
    size_t psent;   /* text length those writes carry */
    int popened;    /* STARTED is in them */
    long pttl_s;    /* the stream's TTL */
    uint64_t next_pstream_ms;
    struct redis_args pcmd; /* the write out, kept until answered */
    struct redis_req preq;
    int pinflight, ppending;
    /* The end, waiting for the write before it: its state, the text after
     * psent, the error and the result (owned). */
    int pend_wanted;
    const char *pend_state;
    long pend_tokens;
    struct buf pend_text;
    char *pend_error, *pend_result;
    int idle_wait; /* the end is stored: idle once the stream's end is */
    /* the call's whole text and tokens while its end is handled, or NULL */
    const char *done_text;
    size_t done_len;
    long done_tokens;

    /* The slot's one command in flight (start or end), kept to be sent again
     * when the connection lost it unanswered. */
    struct redis_req req;
    struct redis_args cmd;
    redis_reply_fn *cmd_cb;
    int cmd_inflight, cmd_pending;
    struct redis_req beat_req;
    int beat_inflight;
    struct redis_req death_req; /* apart: a heartbeat may still be out */
    uint64_t next_idle_beat_ms;
    int born; /* its birth was registered: its death is ours to register */
};

struct rq_worker {
    const struct rq_config *cfg;
    uv_loop_t *loop;
    struct llm_stack ls;
    struct redis_url url;
    struct redis_conn *conn; /* commands */
    struct redis_conn *popc; /* BLPOP alone: it holds its connection while it waits */
    struct redis_conn *subc; /* SUBSCRIBE rq:pubsub:<each slot's name> */
    struct redis_req sub_req;
    struct redis_req pop_req;
    int pop_inflight;
    /* The last pop found jobs: the next takes as many as slots are free,
     * without blocking; once one finds the queues dry, BLPOP waits for one. */
    int pop_warm;
    struct redis_req susp_req;
    int susp_inflight, suspended;
    uint64_t next_susp_ms;
    /* The last check sent, and the last pop or start that found the
     * suspension (atomically, in its script). */
    uint64_t susp_sent_ms, susp_seen_ms;

    /* the scheduler: one request per queue */
    struct redis_req *sched_reqs;
    int *sched_inflight;
    uint64_t next_sched_ms;

    struct slot *slots;
    int nslots;
    char *queues_csv;
    char hostname[256];
    long pid;

    uv_timer_t cron;
    unsigned long pruns; /* runs with a progress stream, for their names */
    uv_signal_t sigterm, sigint;
    int births_left, birth_failed;
    int registered;
    int stopping;        /* warm: no more pops, running jobs finish */
    int deaths_left;     /* death scripts not answered yet */
    uint64_t stop_at_ms; /* warm shutdown gives up on running jobs then */
    uint64_t death_sent_ms;
    int exit_code;
    int done;
};

static void kick(struct rq_worker *w);
static void set_suspended(struct rq_worker *w, int on);

static int64_t now_s(void)
{
    return clock_epoch_us() / 1000000;
}

static void ts_now(char ts[RQ_TS_SIZE])
{
    rq_ts_format(ts, clock_epoch_us());
}

/* ------------------------------------------------------------ commands */

static void slot_send(struct slot *s)
{
    const char **argv = redis_args_argv(&s->cmd);
    if (!argv) {
        /* Out of memory gathering it: try again at the next cron. */
        s->cmd_pending = 1;
        return;
    }
    if (redis_conn_send(s->w->conn, &s->req, s->cmd_cb, s->cmd.n, argv, s->cmd.len)) {
        s->cmd_pending = 1;
        return;
    }
    s->cmd_pending = 0;
    s->cmd_inflight = 1;
}

/* Sends the command gathered in s->cmd, now or once the connection is up. */
static void slot_command(struct slot *s, redis_reply_fn *cb)
{
    s->cmd_cb = cb;
    s->req.data = s;
    slot_send(s);
}

static void slot_reset_cmd(struct slot *s)
{
    redis_args_release(&s->cmd);
    redis_args_init(&s->cmd);
}

/* A reply lost with the connection: the command goes again when it is back.
 * An end script that ran before the loss then runs twice; it is idempotent
 * but for the worker's counters and a second stream entry. */
static int lost(struct slot *s, int status)
{
    s->cmd_inflight = 0;
    if (status == CR_ECANCELED)
        return 1;
    if (status) {
        s->cmd_pending = 1;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ progress stream */

static void slot_idle(struct slot *s);

static void pstream_send(struct slot *s);

/* A job's stream lives as long as its result, at least a minute (a day when
 * the result is kept for ever or not at all): a client that reads it late
 * still finds the end. */
static long pstream_ttl(long result_ttl_s)
{
    if (result_ttl_s <= 0)
        return PROGRESS_TTL_S;
    return result_ttl_s > PROGRESS_TTL_MIN_S ? result_ttl_s : PROGRESS_TTL_MIN_S;
}

/* Only the tasks that stream text have progress, as for Celery's. */
static void pstream_begin(struct slot *s)
{
    struct rq_worker *w = s->w;
    s->pstream =
        w->cfg->progress_stream && (s->kind == TASK_GENERATE || s->kind == TASK_CHAT);
    if (!s->pstream)
        return;
    snprintf(s->prun, sizeof(s->prun), "%.200s:%ld:%lu", w->hostname, w->pid, ++w->pruns);
    s->pn = 0;
    s->psent = 0;
    s->popened = 0;
    s->pttl_s = pstream_ttl(s->result_ttl_s);
    s->next_pstream_ms = uv_now(w->loop) + (uint64_t)w->cfg->progress_interval_ms;
}

/* Gathers the next write into s->pcmd: STARTED first in a run, the text
 * after what was written (tail), then end if given. Returns 0 when there is
 * nothing to write yet (no text: STARTED goes with the first), else 1. */
static int pstream_gather(struct slot *s, const char *tail, size_t tail_len, long tokens,
                          const struct rq_progress_entry *end)
{
    struct rq_progress_entry e[RQ_PROGRESS_ENTRIES_MAX];
    int k = 0;
    if (!tail_len && !end)
        return 0;
    if (!s->popened)
        e[k++] = (struct rq_progress_entry){"STARTED", "", 0, 0, NULL, NULL};
    if (tail_len)
        e[k++] =
            (struct rq_progress_entry){"PROGRESS", tail, tail_len, tokens, NULL, NULL};
    if (end)
        e[k++] = *end;
    redis_args_release(&s->pcmd);
    redis_args_init(&s->pcmd);
    rq_redis_progress(&s->pcmd, s->id, s->prun, s->pn + k, s->pttl_s, e, k);
    /* Counted now: this command goes again as it is until answered. */
    s->pn += k;
    s->psent += tail_len;
    s->popened = 1;
    return 1;
}

static void pstream_clear_end(struct slot *s)
{
    s->pend_wanted = 0;
    buf_reset(&s->pend_text);
    cr_free(s->pend_error);
    cr_free(s->pend_result);
    s->pend_error = s->pend_result = NULL;
}

static void pstream_send_end(struct slot *s)
{
    struct rq_progress_entry end = {s->pend_state, "", 0, s->pend_tokens, s->pend_error,
                                    s->pend_result};
    pstream_gather(s, s->pend_text.data, s->pend_text.len, s->pend_tokens, &end);
    pstream_clear_end(s);
    pstream_send(s);
}

/* The write out is done with: the end, if it waits, goes next; a slot whose
 * job's end is stored goes idle. */
static void pstream_done(struct slot *s)
{
    redis_args_release(&s->pcmd);
    redis_args_init(&s->pcmd);
    if (s->pend_wanted) {
        pstream_send_end(s);
    } else if (s->idle_wait) {
        s->idle_wait = 0;
        slot_idle(s);
    }
}

static void on_pstream_written(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    s->pinflight = 0;
    if (status == CR_ECANCELED)
        return;
    if (status) {
        s->ppending = 1; /* the same command again, from the cron */
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_WARNING, "rq job %s: progress not written: %s", s->id, reply->str);
    pstream_done(s);
}

static void pstream_send(struct slot *s)
{
    const char **argv = redis_args_argv(&s->pcmd);
    s->preq.data = s;
    if (!argv) {
        /* Out of memory gathering it: it would never be whole; dropped. */
        LOG(LOG_ERROR, "rq job %s: out of memory; some progress was not written", s->id);
        s->ppending = 0;
        pstream_done(s);
        return;
    }
    if (redis_conn_send(s->w->conn, &s->preq, on_pstream_written, s->pcmd.n, argv,
                        s->pcmd.len)) {
        s->ppending = 1;
        return;
    }
    s->ppending = 0;
    s->pinflight = 1;
}

/* The text so far, when the interval has passed and no write is out. */
static void pstream_tick(struct slot *s, uint64_t now_ms, uint64_t interval_ms)
{
    const char *text;
    size_t len = 0;
    if (!s->pstream || !s->call || s->pinflight || s->ppending ||
        now_ms < s->next_pstream_ms)
        return;
    s->next_pstream_ms = now_ms + interval_ms;
    text = llm_req_text(s->call, &len);
    if (len > s->psent &&
        pstream_gather(s, text + s->psent, len - s->psent, (long)s->deltas, NULL))
        pstream_send(s);
}

/* "ExcType: message" with the type's last dotted part, as Celery names it. */
static const char *short_type(const char *exc_type)
{
    const char *dot = exc_type ? strrchr(exc_type, '.') : NULL;
    return dot ? dot + 1 : exc_type;
}

/* The end of this run: state, error and result as the gateway reads them
 * (the result, a failure's as Celery stores one, ends its sessions), after
 * the text not written yet (the job's whole text when it ran to its end).
 * Sent now, or when the write out is answered. */
static void pstream_end(struct slot *s, const char *state, const char *exc_type,
                        const char *message, const cJSON *value)
{
    struct buf b;
    cJSON *r = NULL;
    int oom = 0;
    if (!s->pstream)
        return;
    pstream_clear_end(s);
    s->pend_wanted = 1;
    s->pend_state = state;
    s->pend_tokens = s->done_tokens > 0 ? s->done_tokens : (long)s->deltas;
    if (s->done_text && s->done_len > s->psent)
        oom |= buf_append(&s->pend_text, s->done_text + s->psent, s->done_len - s->psent);
    buf_init(&b);
    if (message) {
        const char *t = short_type(exc_type);
        oom |= buf_printf(&b, "%s%s%s", t ? t : "", t ? ": " : "", message);
        s->pend_error = buf_detach(&b);
        r = cJSON_CreateObject();
        if (!r || !cJSON_AddStringToObject(r, "exc_type", t ? t : "Exception") ||
            !cJSON_AddItemToObject(r, "exc_message",
                                   cJSON_CreateStringArray(&message, 1)))
            oom = 1;
        if (exc_type && t != exc_type) {
            char mod[FUNC_MAX];
            snprintf(mod, sizeof(mod), "%.*s", (int)(t - 1 - exc_type), exc_type);
            oom |= !cJSON_AddStringToObject(r, "exc_module", mod);
        }
        value = r;
    }
    if (value && strcmp(state, "RETRY")) {
        buf_reset(&b);
        if (py_json_dumps(value, &b) == 0)
            s->pend_result = buf_detach(&b);
        else
            oom = 1;
    }
    buf_release(&b);
    cJSON_Delete(r);
    if (oom)
        LOG(LOG_ERROR, "rq job %s: out of memory; some progress was not written", s->id);
    if (!s->pinflight && !s->ppending)
        pstream_send_end(s);
}

/* ------------------------------------------------------------ ending */

static void idle_beat(struct slot *s, uint64_t now_ms);

static void slot_idle(struct slot *s)
{
    cJSON_Delete(s->meta);
    s->meta = NULL;
    s->pstream = 0;
    pstream_clear_end(s);
    s->state = SLOT_IDLE;
    s->call = NULL;
    s->id[0] = '\0';
    slot_reset_cmd(s);
    /* The end script marks it idle; a suspended worker says so again. */
    if (s->w->suspended)
        idle_beat(s, uv_now(s->w->loop));
    kick(s->w);
}

static void on_ended(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    if (lost(s, status))
        return;
    if (reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_ERROR, "rq job %s: cannot store its end: %s", s->id, reply->str);
    else if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
        LOG(LOG_WARNING, "rq job %s: deleted while it ran; its end is not stored", s->id);
    if (s->pinflight || s->ppending || s->pend_wanted) {
        s->idle_wait = 1; /* the stream's end is still on its way */
        return;
    }
    slot_idle(s);
}

static double working_s(const struct slot *s)
{
    return (double)(uv_now(s->w->loop) - s->started_ms) / 1000.0;
}

/* The slot's execution in RQ 2.x's layout, or NULL in 1.13's. */
static const struct rq_exec *exec_of(struct slot *s, struct rq_exec *x)
{
    if (s->w->cfg->protocol != 2)
        return NULL;
    x->eid = s->eid;
    x->started_s = s->started_epoch;
    x->now_s = (double)clock_epoch_us() / 1e6;
    return x;
}

static void new_eid(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[16];
    if (uv_random(NULL, NULL, b, sizeof(b), 0, NULL) != 0) {
        /* no entropy source: mixed from the clock */
        uint64_t x = uv_hrtime() ^ ((uint64_t)clock_epoch_us() << 20);
        for (int i = 0; i < 16; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i] = (unsigned char)(x >> 24);
        }
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* uuid4, as uuid4().hex */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[32] = '\0';
}

static void end_job(struct slot *s, struct rq_end_info *e)
{
    char ts[RQ_TS_SIZE];
    struct rq_exec x;
    ts_now(ts);
    e->exec = exec_of(s, &x);
    e->worker = s->name;
    e->id = s->id;
    e->queue = s->queue;
    e->ts = ts;
    e->now_s = now_s();
    e->working_s = working_s(s);
    e->result_ttl_s = s->result_ttl_s;
    e->failure_ttl_s = s->failure_ttl_s;
    s->state = SLOT_ENDING;
    slot_reset_cmd(s);
    rq_redis_end(&s->cmd, e);
    slot_command(s, on_ended);
}

/* Fails the job: retried (as its Retry says) when may_retry and retries are
 * left, else into the failed registry with the traceback text. */
static void fail_job(struct slot *s, const char *exc_type, const char *message,
                     int may_retry)
{
    struct rq_end_info e;
    struct buf text, b64;
    int rc;
    memset(&e, 0, sizeof(e));
    if (may_retry && s->retries_left > 0 && !s->stopped) {
        LOG(LOG_WARNING, "rq job %s (%s) failed, %ld retries left: %s%s%s", s->id,
            s->func, s->retries_left, exc_type ? exc_type : "", exc_type ? ": " : "",
            message);
        pstream_end(s, "RETRY", exc_type, message, NULL);
        e.how = RQ_END_RETRY;
        e.retries_left = s->retries_left - 1;
        e.interval_s = s->interval_s;
        end_job(s, &e);
        return;
    }
    LOG(LOG_ERROR, "rq job %s (%s) %s: %s%s%s", s->id, s->func[0] ? s->func : "?",
        s->stopped ? "stopped" : "failed", exc_type ? exc_type : "", exc_type ? ": " : "",
        message);
    buf_init(&text);
    buf_init(&b64);
    /* A stopped or killed job's text is RQ's own line, no traceback. */
    rc = exc_type ? rq_exc_text(&text, s->func, exc_type, message)
                  : buf_puts(&text, message);
    if (rc || rq_exc_string(&b64, text.data, text.len)) {
        buf_reset(&b64);
        buf_puts(&b64, "");
    }
    pstream_end(s, s->stopped ? "REVOKED" : "FAILURE", exc_type, message, NULL);
    e.how = s->stopped ? RQ_END_STOPPED : RQ_END_FAILED;
    e.exc_b64 = b64.data ? b64.data : "";
    end_job(s, &e);
    buf_release(&text);
    buf_release(&b64);
}

/* A job celeriac will not run: one line, never retried (the refusal would
 * be the same each time). */
static void refuse_job(struct slot *s, const char *why)
{
    fail_job(s, "celeriac.UnsupportedJob", why, 0);
}

static void finish_job(struct slot *s, const cJSON *value)
{
    struct rq_end_info e;
    struct buf b64;
    memset(&e, 0, sizeof(e));
    buf_init(&b64);
    if (value && !cJSON_IsNull(value) && rq_value_dumps_b64(value, s->ser, &b64)) {
        buf_release(&b64);
        fail_job(s, "MemoryError", "cannot encode the result", 1);
        return;
    }
    LOG(LOG_INFO, "rq job %s (%s) finished in %.3fs", s->id, s->func, working_s(s));
    pstream_end(s, "SUCCESS", NULL, NULL, value);
    e.how = RQ_END_FINISHED;
    e.return_b64 = b64.len ? b64.data : NULL;
    end_job(s, &e);
    buf_release(&b64);
}

/* ------------------------------------------------------------ running */

/* How the call's end ends the job. */
static void llm_done(struct slot *s, const struct llm_result *res)
{
    if (s->stopped) {
        fail_job(s, NULL, "Job stopped by user, work-horse terminated.", 0);
        return;
    }
    if (s->killed) {
        fail_job(s, NULL,
                 "Work-horse terminated unexpectedly; waitpid returned 9 (signal 9); ",
                 1);
        return;
    }
    if (s->timed_out) {
        char msg[96];
        snprintf(msg, sizeof(msg), "Task exceeded maximum timeout value (%ld seconds)",
                 s->timeout_s);
        fail_job(s, "rq.timeouts.JobTimeoutException", msg, 1);
        return;
    }
    if (res->code == 0 && res->verdict == LLM_OK) {
        cJSON *v = tasks_result(s->kind, (struct llm_result *)res);
        if (!v) {
            fail_job(s, "MemoryError", "out of memory", 1);
            return;
        }
        finish_job(s, v);
        cJSON_Delete(v);
        return;
    }
    fail_job(s, res->exc_type && res->exc_type[0] ? res->exc_type : "Exception",
             res->message ? res->message : "", res->verdict != LLM_PERMANENT);
}

static void on_llm_done(struct llm_req *r, const struct llm_result *res, void *privdata)
{
    struct slot *s = privdata;
    struct rq_worker *w = s->w;
    (void)r;
    s->call = NULL;
    if (w->done)
        return; /* a cold stop: the job stays started, RQ's cleanup fails it */
    llm_stack_note(&w->ls, res, uv_now(w->loop));
    s->done_text = res->text;
    s->done_len = res->text ? res->text_len : 0;
    s->done_tokens = res->completion_tokens;
    llm_done(s, res);
    s->done_text = NULL;
    s->done_len = 0;
    s->done_tokens = 0;
}

static void on_llm_delta(struct llm_req *r, const char *text, size_t len, void *privdata)
{
    struct slot *s = privdata;
    (void)r;
    (void)text;
    (void)len;
    s->deltas++;
}

/* Keeps the job's own meta to write progress into; a meta that is not
 * plain data is left alone (no progress for that job). */
static void progress_setup(struct slot *s, const struct rq_job *job)
{
    struct rq_limits lim;
    struct cr_err err = {0};
    cJSON *v = NULL;
    s->meta = NULL;
    s->deltas = 0;
    s->meta_text_len = 0;
    if (!s->w->cfg->progress_meta || (s->kind != TASK_GENERATE && s->kind != TASK_CHAT))
        return;
    rq_limits_init(&lim);
    if (!job->meta)
        v = cJSON_CreateObject();
    else if (rq_value_loads(job->meta, job->meta_len, s->ser, &lim, &v, &err) ||
             !cJSON_IsObject(v)) {
        LOG(LOG_DEBUG, "rq job %s: its meta is not plain data; no progress written",
            s->id);
        cJSON_Delete(v);
        v = NULL;
    }
    s->meta = v;
    s->next_meta_ms = uv_now(s->w->loop) + (uint64_t)s->w->cfg->progress_interval_ms;
}

static void on_meta_written(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    (void)status;
    (void)reply;
    s->meta_inflight = 0;
}

/* job.meta["progress"] = {"text": all so far, "tokens": deltas}, as the
 * Celery worker's PROGRESS meta carries it. */
static void progress_write(struct slot *s, uint64_t now_ms, uint64_t interval_ms)
{
    struct rq_worker *w = s->w;
    cJSON *p;
    struct buf out;
    struct redis_args a;
    const char **argv;
    size_t len = 0;
    const char *text;

    s->next_meta_ms = now_ms + interval_ms;
    if (!s->meta || !s->call || s->meta_inflight)
        return;
    text = llm_req_text(s->call, &len);
    if (len == s->meta_text_len)
        return;
    p = cJSON_CreateObject();
    if (!p || !cJSON_AddStringToObject(p, "text", text) ||
        !cJSON_AddNumberToObject(p, "tokens", (double)s->deltas)) {
        cJSON_Delete(p);
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(s->meta, "progress"))
        cJSON_ReplaceItemInObjectCaseSensitive(s->meta, "progress", p);
    else
        cJSON_AddItemToObject(s->meta, "progress", p);
    buf_init(&out);
    redis_args_init(&a);
    if (!rq_value_dumps(s->meta, s->ser, &out)) {
        rq_redis_meta(&a, s->id, out.data, out.len);
        argv = redis_args_argv(&a);
        s->meta_req.data = s;
        if (argv &&
            !redis_conn_send(w->conn, &s->meta_req, on_meta_written, a.n, argv, a.len)) {
            s->meta_inflight = 1;
            s->meta_text_len = len;
        }
    }
    redis_args_release(&a);
    buf_release(&out);
}

static void run_job(struct slot *s, const struct rq_job *job)
{
    struct rq_worker *w = s->w;
    const struct rq_config *cfg = w->cfg;
    struct rq_limits lim;
    struct rq_call call;
    struct cr_err err = {0};
    struct task_msg m;
    struct task_call tc;
    struct task_error te;
    char why[320];
    int rc;

    s->timeout_s = job->timeout_s;
    s->result_ttl_s = job->result_ttl_s == -2 ? cfg->result_ttl : job->result_ttl_s;
    s->failure_ttl_s = job->failure_ttl_s;
    s->retries_left = job->retries_left;
    s->interval_s = rq_retry_interval(job);
    s->deadline_ms =
        job->timeout_s > 0 ? s->started_ms + (uint64_t)job->timeout_s * 1000 : 0;
    s->ser = RQ_SERIALIZER_PICKLE;
    s->func[0] = '\0';

    if (s->stopped) {
        fail_job(s, NULL, "Job stopped by user, work-horse terminated.", 0);
        return;
    }
    if (job->callback) {
        snprintf(why, sizeof(why),
                 "%s callback '%.*s' is Python code celeriac does not run",
                 job->callback_field,
                 (int)(job->callback_len > 120 ? 120 : job->callback_len), job->callback);
        refuse_job(s, why);
        return;
    }
    rq_limits_init(&lim);
    memset(&call, 0, sizeof(call));
    if ((rc = rq_data_decode(job->data, job->data_len, &lim, &call, &err))) {
        snprintf(why, sizeof(why), "job data refused: %s", err.msg);
        refuse_job(s, why);
        return;
    }
    s->ser = call.serializer;
    snprintf(s->func, sizeof(s->func), "%s", call.func_name);
    s->kind = tasks_lookup(call.func_name, cfg->aliases.items, cfg->aliases.n);
    if (s->kind != TASK_GENERATE && s->kind != TASK_CHAT && s->kind != TASK_EMBED) {
        snprintf(why, sizeof(why),
                 s->kind == TASK_UNKNOWN
                     ? "no task mapped for '%.200s' (see --task-alias)"
                     : "'%.200s' is not an LLM task",
                 call.func_name);
        rq_call_release(&call);
        refuse_job(s, why);
        return;
    }
    /* The built-in's binder reads only the name, args and kwargs; the rest
     * of the message stays as task_msg_init() leaves it. */
    task_msg_init(&m);
    m.id = s->id;
    m.task = call.func_name;
    m.args = call.args;
    m.kwargs = call.kwargs;
    memset(&tc, 0, sizeof(tc));
    memset(&te, 0, sizeof(te));
    rc = tasks_build_call(s->kind, &m, cfg->base.llm_model, cfg->base.llm_embed_model,
                          &tc, &te);
    rq_call_release(&call);
    if (rc) {
        if (rc == CR_ENOMEM)
            fail_job(s, "MemoryError", "out of memory", 1);
        else
            fail_job(s, te.exc_type, te.message, 0);
        return;
    }
    {
        struct llm_call lc = {tc.op,    tc.body,       tc.body_len, tc.embed_list,
                              tc.model, tc.route_step, tc.tools};
        progress_setup(s, job);
        pstream_begin(s);
        s->call = llm_router_call(&w->ls.router, &lc, on_llm_delta, on_llm_done, s, &err);
    }
    task_call_release(&tc);
    if (!s->call) {
        fail_job(s, "ValueError", err.msg[0] ? err.msg : "cannot start the LLM call", 0);
        return;
    }
    s->state = SLOT_RUNNING;
    s->next_beat_ms = s->started_ms + (uint64_t)cfg->monitoring_interval * 1000 / 2;
    LOG(LOG_INFO, "rq job %s (%s) started on %s", s->id, s->func, s->name);
}

static void on_started(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    const char **f;
    size_t *len;
    struct rq_job job;
    struct cr_err err = {0};

    if (lost(s, status))
        return;
    if (reply->type == REDIS_REPLY_NIL) {
        LOG(LOG_DEBUG, "rq job %s is gone (expired or deleted): skipped", s->id);
        slot_idle(s);
        return;
    }
    if (reply->type == REDIS_REPLY_INTEGER && reply->integer == -1) {
        /* Popped by a BLPOP that waited across `rq suspend`: back at the
         * head of its queue, untouched. */
        LOG(LOG_DEBUG, "rq job %s put back: suspended", s->id);
        set_suspended(s->w, 1);
        slot_idle(s);
        return;
    }
    if (reply->type != REDIS_REPLY_ARRAY) {
        LOG(LOG_ERROR, "rq job %s: cannot start it: %s", s->id,
            reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply");
        slot_idle(s);
        return;
    }
    slot_reset_cmd(s);
    s->started_ms = uv_now(s->w->loop);
    f = cr_calloc(reply->elements + 1, sizeof(*f));
    len = cr_calloc(reply->elements + 1, sizeof(*len));
    if (!f || !len) {
        cr_free(f);
        cr_free(len);
        fail_job(s, "MemoryError", "out of memory", 1);
        return;
    }
    for (size_t i = 0; i < reply->elements; i++) {
        f[i] = reply->element[i]->str ? reply->element[i]->str : "";
        len[i] = reply->element[i]->str ? reply->element[i]->len : 0;
    }
    if (rq_job_parse(&job, f, len, reply->elements, &err)) {
        refuse_job(s, err.msg);
    } else {
        run_job(s, &job);
    }
    cr_free(f);
    cr_free(len);
}

/* ------------------------------------------------------------ popping */

static struct slot *free_slot(struct rq_worker *w)
{
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].state == SLOT_IDLE)
            return &w->slots[i];
    return NULL;
}

/* bounce: the pop was a BLPOP, which may have waited across a suspension:
 * the start puts the job back if one holds. */
static void start_popped(struct rq_worker *w, const char *key, size_t klen,
                         const char *id, size_t idlen, int bounce)
{
    struct slot *s = free_slot(w);
    const size_t pfx = strlen("rq:queue:");
    char ts[RQ_TS_SIZE];
    int64_t score;
    struct rq_exec x;

    if (!s) {
        /* Only popped with a slot free, so never; the id must not be lost. */
        LOG(LOG_ERROR, "rq job %.*s popped with no slot free", (int)idlen, id);
        return;
    }
    if (idlen == 0 || idlen > RQ_MAX_ID || klen <= pfx || klen - pfx > RQ_MAX_NAME ||
        memchr(id, '\0', idlen)) {
        LOG(LOG_ERROR, "rq: a job id of %zu bytes in %.*s ignored", idlen, (int)klen,
            key);
        return;
    }
    memcpy(s->id, id, idlen);
    s->id[idlen] = '\0';
    memcpy(s->queue, key + pfx, klen - pfx);
    s->queue[klen - pfx] = '\0';
    s->state = SLOT_STARTING;
    s->func[0] = '\0';
    s->timeout_s = RQ_DEFAULT_TIMEOUT_S;
    s->result_ttl_s = w->cfg->result_ttl;
    s->failure_ttl_s = -2;
    s->retries_left = s->interval_s = 0;
    s->ser = RQ_SERIALIZER_PICKLE;
    s->timed_out = s->stopped = s->killed = 0;
    s->pstream = 0;
    s->call = NULL;
    s->started_ms = uv_now(w->loop);
    ts_now(ts);
    /* The score before the job's own timeout is known: the default's. */
    score =
        now_s() + rq_heartbeat_ttl(RQ_DEFAULT_TIMEOUT_S, 0, w->cfg->monitoring_interval);
    slot_reset_cmd(s);
    new_eid(s->eid);
    s->started_epoch = (double)clock_epoch_us() / 1e6;
    rq_redis_start(&s->cmd, s->name, s->id, s->queue, ts, score,
                   rq_heartbeat_ttl(RQ_DEFAULT_TIMEOUT_S, 0, w->cfg->monitoring_interval),
                   exec_of(s, &x), bounce);
    slot_command(s, on_started);
}

static int is_str(const redisReply *r)
{
    return r->type == REDIS_REPLY_STRING;
}

/* BLPOP's reply: nil, or [queue key, id]. */
static void on_popped(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    w->pop_inflight = 0;
    if (status == CR_ECANCELED)
        return;
    if (!status && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        is_str(reply->element[0]) && is_str(reply->element[1])) {
        start_popped(w, reply->element[0]->str, reply->element[0]->len,
                     reply->element[1]->str, reply->element[1]->len, 1);
        w->pop_warm = 1;
    } else if (!status && reply->type == REDIS_REPLY_ERROR) {
        LOG(LOG_ERROR, "rq: BLPOP refused: %s", reply->str);
    }
    kick(w);
}

/* The batch pop's reply: [queue key, id, ...]. */
static void on_popped_many(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    w->pop_inflight = 0;
    if (status == CR_ECANCELED)
        return;
    if (!status && reply->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i + 1 < reply->elements; i += 2)
            if (is_str(reply->element[i]) && is_str(reply->element[i + 1]))
                start_popped(w, reply->element[i]->str, reply->element[i]->len,
                             reply->element[i + 1]->str, reply->element[i + 1]->len, 0);
        w->pop_warm = reply->elements > 0;
    } else if (!status && reply->type == REDIS_REPLY_INTEGER && reply->integer == -1) {
        set_suspended(w, 1);
        w->pop_warm = 0;
    } else if (!status && reply->type == REDIS_REPLY_ERROR) {
        LOG(LOG_ERROR, "rq: pop refused: %s", reply->str);
        w->pop_warm = 0;
    }
    kick(w);
}

static int free_slots(const struct rq_worker *w, int max)
{
    int n = 0;
    for (int i = 0; i < w->nslots && n < max; i++)
        n += w->slots[i].state == SLOT_IDLE;
    return n;
}

/* Pops once more if a slot is free and nothing holds the pops back: as many
 * as are free while jobs keep coming, else one blocking pop. */
static void kick(struct rq_worker *w)
{
    struct redis_args a;
    const char **argv;
    int n;
    if (w->done || w->stopping || w->suspended || !w->registered || w->pop_inflight ||
        !redis_conn_up(w->popc))
        return;
    n = free_slots(w, POP_BATCH_MAX);
    if (n == 0)
        return;
    redis_args_init(&a);
    if (w->pop_warm)
        rq_redis_pop_many(&a, w->cfg->queues, w->cfg->nqueues, n);
    else
        rq_redis_pop(&a, w->cfg->queues, w->cfg->nqueues, POP_BLOCK_S);
    argv = redis_args_argv(&a);
    w->pop_req.data = w;
    if (argv &&
        !redis_conn_send(w->popc, &w->pop_req, w->pop_warm ? on_popped_many : on_popped,
                         a.n, argv, a.len))
        w->pop_inflight = 1;
    redis_args_release(&a);
}

/* ------------------------------------------------------------ heartbeats */

static void on_beat(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    s->beat_inflight = 0;
    if (!status && reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_WARNING, "rq worker %s: heartbeat refused: %s", s->name, reply->str);
}

static void send_beat(struct slot *s, struct redis_args *a)
{
    const char **argv = redis_args_argv(a);
    s->beat_req.data = s;
    if (argv && !redis_conn_send(s->w->conn, &s->beat_req, on_beat, a->n, argv, a->len))
        s->beat_inflight = 1;
}

static void idle_beat(struct slot *s, uint64_t now_ms)
{
    struct redis_args a;
    char ts[RQ_TS_SIZE];
    if (s->beat_inflight)
        return;
    ts_now(ts);
    s->info.ts = ts;
    redis_args_init(&a);
    rq_redis_idle_beat(&a, &s->info, s->w->suspended ? "suspended" : "idle");
    send_beat(s, &a);
    redis_args_release(&a);
    s->next_idle_beat_ms = now_ms + IDLE_BEAT_MS;
}

static void busy_beat(struct slot *s, uint64_t now_ms)
{
    struct rq_worker *w = s->w;
    struct redis_args a;
    char ts[RQ_TS_SIZE];
    int64_t elapsed = (int64_t)(now_ms - s->started_ms) / 1000;
    int64_t ttl = rq_heartbeat_ttl(s->timeout_s, elapsed, w->cfg->monitoring_interval);
    struct rq_exec x;
    if (s->beat_inflight)
        return;
    if (ttl < 60)
        ttl = 60; /* past its timeout, the job is being aborted: keep it claimed */
    ts_now(ts);
    redis_args_init(&a);
    rq_redis_busy_beat(&a, s->name, s->id, s->queue, ts, now_s() + ttl, (long)ttl,
                       working_s(s), exec_of(s, &x));
    send_beat(s, &a);
    redis_args_release(&a);
    s->next_beat_ms = now_ms + (uint64_t)w->cfg->monitoring_interval * 1000 / 2;
}

static void set_suspended(struct rq_worker *w, int on)
{
    uint64_t now = uv_now(w->loop);
    if (on)
        w->susp_seen_ms = now;
    if (w->suspended == on)
        return;
    w->suspended = on;
    LOG(LOG_WARNING, "rq: %s",
        on ? "suspended (rq suspend): no new jobs" : "resumed: taking jobs again");
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].state == SLOT_IDLE)
            idle_beat(&w->slots[i], now);
}

static void on_suspended(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    w->susp_inflight = 0;
    if (status || reply->type != REDIS_REPLY_INTEGER)
        return;
    /* A pop or a start found the suspension after this check was sent. */
    if (reply->integer == 0 && w->susp_sent_ms < w->susp_seen_ms)
        return;
    set_suspended(w, reply->integer != 0);
    kick(w);
}

static void check_suspended(struct rq_worker *w)
{
    struct redis_args a;
    const char **argv;
    if (w->susp_inflight)
        return;
    redis_args_init(&a);
    rq_redis_suspended(&a);
    argv = redis_args_argv(&a);
    w->susp_req.data = w;
    w->susp_sent_ms = uv_now(w->loop);
    if (argv && !redis_conn_send(w->conn, &w->susp_req, on_suspended, a.n, argv, a.len))
        w->susp_inflight = 1;
    redis_args_release(&a);
}

/* ------------------------------------------------------------ scheduler */

static int queue_index(const struct rq_worker *w, const struct redis_req *req)
{
    return (int)(req - w->sched_reqs);
}

static void on_scheduled(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    int i = queue_index(w, req);
    w->sched_inflight[i] = 0;
    if (status)
        return;
    if (reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_WARNING, "rq: scheduler of queue %s refused: %s", w->cfg->queues[i],
            reply->str);
    else if (reply->type == REDIS_REPLY_INTEGER && reply->integer > 0)
        LOG(LOG_INFO, "rq: scheduler moved %lld jobs to queue %s", reply->integer,
            w->cfg->queues[i]);
}

/* RQ's scheduler for our queues (--with-scheduler): retries with an
 * interval and enqueue_in/enqueue_at jobs run only if some process does it. */
static void schedule(struct rq_worker *w)
{
    char ts[RQ_TS_SIZE];
    ts_now(ts);
    for (int i = 0; i < w->cfg->nqueues; i++) {
        struct redis_args a;
        const char **argv;
        if (w->sched_inflight[i])
            continue;
        redis_args_init(&a);
        rq_redis_schedule(&a, w->cfg->queues[i], now_s(), ts, w->pid);
        argv = redis_args_argv(&a);
        w->sched_reqs[i].data = w;
        if (argv &&
            !redis_conn_send(w->conn, &w->sched_reqs[i], on_scheduled, a.n, argv, a.len))
            w->sched_inflight[i] = 1;
        redis_args_release(&a);
    }
}

/* ------------------------------------------------------------ shutdown */

static void on_death(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    (void)reply;
    if (status == CR_ECANCELED)
        return;
    if (--s->w->deaths_left == 0)
        uv_stop(s->w->loop);
}

static void on_unlocked(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    (void)reply;
    if (status == CR_ECANCELED)
        return;
    if (--w->deaths_left == 0)
        uv_stop(w->loop);
}

static void register_deaths(struct rq_worker *w)
{
    char ts[RQ_TS_SIZE];
    ts_now(ts);
    w->done = 1;
    w->death_sent_ms = uv_now(w->loop);
    for (int i = 0; i < w->nslots; i++) {
        struct slot *s = &w->slots[i];
        struct redis_args a;
        const char **argv;
        if (!s->born)
            continue;
        s->info.ts = ts;
        redis_args_init(&a);
        rq_redis_death(&a, &s->info);
        argv = redis_args_argv(&a);
        s->death_req.data = s;
        if (argv && !redis_conn_send(w->conn, &s->death_req, on_death, a.n, argv, a.len))
            w->deaths_left++;
        redis_args_release(&a);
    }
    LOG(LOG_INFO, "rq: %d workers registered their death", w->deaths_left);
    for (int i = 0; w->cfg->with_scheduler && i < w->cfg->nqueues; i++) {
        struct redis_args a;
        const char **argv;
        redis_args_init(&a);
        rq_redis_unlock_scheduler(&a, w->cfg->queues[i], w->pid);
        argv = redis_args_argv(&a);
        w->sched_reqs[w->cfg->nqueues + i].data = w;
        /* After a turn still in flight: replies come in the order sent. */
        if (argv && !redis_conn_send(w->conn, &w->sched_reqs[w->cfg->nqueues + i],
                                     on_unlocked, a.n, argv, a.len))
            w->deaths_left++;
        redis_args_release(&a);
    }
    if (w->deaths_left == 0)
        uv_stop(w->loop);
}

static int busy_slots(const struct rq_worker *w)
{
    int n = 0;
    for (int i = 0; i < w->nslots; i++)
        n += w->slots[i].state != SLOT_IDLE || w->slots[i].cmd_pending;
    return n;
}

static void shutdown_warm(struct rq_worker *w, const char *why)
{
    if (w->stopping || w->done)
        return;
    w->stopping = 1;
    w->stop_at_ms = uv_now(w->loop) + (uint64_t)(w->cfg->shutdown_timeout * 1000);
    LOG(LOG_WARNING, "rq: warm shutdown (%s): %d jobs finish first", why, busy_slots(w));
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct rq_worker *w = h->data;
    if (w->stopping || w->done) {
        LOG(LOG_WARNING, "rq: cold shutdown: running jobs stay started");
        w->exit_code = 1;
        w->done = 1;
        uv_stop(w->loop);
        return;
    }
    shutdown_warm(w, signum == SIGINT ? "SIGINT" : "SIGTERM");
}

/* ------------------------------------------------------------ commands */

/* Aborts the slot's call; on_llm_done then ends the job by the flag set. */
static void abort_job(struct slot *s, int *flag)
{
    *flag = 1;
    if (s->call)
        llm_req_abort(s->call, CR_ECANCELED, "JobStopped", "stopped");
}

static void on_command(struct rq_worker *w, const char *channel, size_t clen,
                       const char *msg, size_t mlen)
{
    const size_t pfx = strlen("rq:pubsub:");
    struct rq_command cmd;
    struct cr_err err = {0};
    struct slot *s = NULL;

    if (clen <= pfx)
        return;
    for (int i = 0; i < w->nslots && !s; i++)
        if (strlen(w->slots[i].name) == clen - pfx &&
            !memcmp(w->slots[i].name, channel + pfx, clen - pfx))
            s = &w->slots[i];
    if (!s)
        return;
    if (rq_command_parse(msg, mlen, &cmd, &err)) {
        LOG(LOG_WARNING, "rq worker %s: command ignored: %s", s->name, err.msg);
        return;
    }
    switch (cmd.kind) {
    case RQ_CMD_SHUTDOWN:
        /* One process holds every slot: a shutdown of one is a shutdown of all. */
        shutdown_warm(w, "shutdown command");
        break;
    case RQ_CMD_KILL_HORSE:
        if (s->state == SLOT_RUNNING) {
            LOG(LOG_WARNING, "rq worker %s: kill-horse: job %s ends", s->name, s->id);
            abort_job(s, &s->killed);
        }
        break;
    case RQ_CMD_STOP_JOB:
        /* RQ stops a job only where it is the worker's current job. */
        if (s->state == SLOT_RUNNING && !strcmp(s->id, cmd.job_id)) {
            LOG(LOG_WARNING, "rq worker %s: stop-job %s", s->name, s->id);
            abort_job(s, &s->stopped);
        } else if (s->state == SLOT_STARTING && !strcmp(s->id, cmd.job_id)) {
            s->stopped = 1; /* seen when the start's reply comes */
        }
        break;
    }
}

static void on_pubsub(struct redis_req *req, int status, redisReply *reply)
{
    struct rq_worker *w = req->data;
    if (status || reply->type != REDIS_REPLY_ARRAY || reply->elements != 3)
        return;
    if (reply->element[0]->type == REDIS_REPLY_STRING &&
        !strcmp(reply->element[0]->str, "message") &&
        reply->element[1]->type == REDIS_REPLY_STRING &&
        reply->element[2]->type == REDIS_REPLY_STRING)
        on_command(w, reply->element[1]->str, reply->element[1]->len,
                   reply->element[2]->str, reply->element[2]->len);
}

static void subscribe(struct rq_worker *w)
{
    struct redis_args a;
    const char **argv;
    redis_args_init(&a);
    redis_args_s(&a, "SUBSCRIBE");
    for (int i = 0; i < w->nslots; i++) {
        char k[RQ_KEY_SIZE];
        rq_key(k, RQ_KEY_PUBSUB, w->slots[i].name);
        redis_args_s(&a, k);
    }
    argv = redis_args_argv(&a);
    w->sub_req.data = w;
    if (!argv ||
        redis_conn_send_pubsub(w->subc, &w->sub_req, on_pubsub, a.n, argv, a.len))
        LOG(LOG_WARNING, "rq: cannot subscribe to the command channels");
    redis_args_release(&a);
}

/* ------------------------------------------------------------ cron */

static void on_cron(uv_timer_t *t)
{
    struct rq_worker *w = t->data;
    uint64_t now = uv_now(w->loop), interval_ms;
    long running = 0;

    if (w->done) {
        if (now - w->death_sent_ms > DEATH_WAIT_MS)
            uv_stop(w->loop);
        return;
    }
    if (!w->registered)
        return;
    /* Many jobs streaming at once write less often each (worker/progress.h). */
    for (int i = 0; i < w->nslots; i++)
        running += w->slots[i].state == SLOT_RUNNING &&
                   (w->slots[i].pstream || w->slots[i].meta);
    interval_ms =
        (uint64_t)progress_budget_interval_ms(w->cfg->progress_interval_ms, running);
    for (int i = 0; i < w->nslots; i++) {
        struct slot *s = &w->slots[i];
        if (s->cmd_pending && !s->cmd_inflight && redis_conn_up(w->conn))
            slot_send(s);
        if (s->ppending && !s->pinflight && redis_conn_up(w->conn))
            pstream_send(s);
        if (s->state == SLOT_RUNNING) {
            if (s->deadline_ms && now >= s->deadline_ms && !s->timed_out && s->call) {
                s->timed_out = 1;
                llm_req_abort(s->call, CR_ETIMEDOUT, "JobTimeoutException",
                              "job timeout");
            }
            if (now >= s->next_beat_ms && redis_conn_up(w->conn))
                busy_beat(s, now);
            if (s->meta && now >= s->next_meta_ms && redis_conn_up(w->conn))
                progress_write(s, now, interval_ms);
            if (redis_conn_up(w->conn))
                pstream_tick(s, now, interval_ms);
        } else if (s->state == SLOT_IDLE && now >= s->next_idle_beat_ms &&
                   redis_conn_up(w->conn)) {
            idle_beat(s, now);
        }
    }
    if (now >= w->next_susp_ms && redis_conn_up(w->conn)) {
        check_suspended(w);
        if (w->cfg->with_scheduler && !w->stopping)
            schedule(w);
        w->next_susp_ms = now + SUSPEND_CHECK_MS;
    }
    if (w->stopping && !w->pop_inflight && (busy_slots(w) == 0 || now >= w->stop_at_ms)) {
        if (busy_slots(w))
            LOG(LOG_WARNING, "rq: shutdown timeout: %d jobs left started", busy_slots(w));
        register_deaths(w);
        return;
    }
    kick(w);
}

/* ------------------------------------------------------------ start-up */

static void on_conn_event(struct redis_conn *c, enum redis_conn_event ev,
                          const struct redis_conn_news *news, void *privdata)
{
    struct rq_worker *w = privdata;
    if (ev == REDIS_CONN_UP) {
        if (c == w->subc)
            subscribe(w); /* again after every reconnect */
        kick(w);
        return;
    }
    if (ev == REDIS_CONN_FAILED && !news->loud)
        return;
    LOG(LOG_WARNING, "rq: Redis connection: %s",
        news && news->why ? news->why : "silent, dropped");
}

static void on_birth(struct redis_req *req, int status, redisReply *reply)
{
    struct slot *s = req->data;
    struct rq_worker *w = s->w;
    s->beat_inflight = 0;
    if (status == CR_ECANCELED)
        return;
    if (status || reply->type != REDIS_REPLY_INTEGER || reply->integer != 1) {
        if (!w->birth_failed)
            LOG(LOG_CRITICAL, "rq: cannot register worker '%s': %s", s->name,
                status ? "connection lost"
                : reply->type == REDIS_REPLY_ERROR
                    ? reply->str
                    : "there exists an active worker with that name already");
        w->birth_failed = 1;
    } else {
        s->born = 1;
    }
    if (--w->births_left == 0)
        uv_stop(w->loop);
}

/* The providers document's "limits" and "budget" bind the Celery worker's
 * calls (shared through its result backend); the RQ worker does not take part
 * yet. Said once at start, so that a fleet does not believe itself bound. */
static void warn_fleet_keys(const struct llm_registry *reg)
{
    int limits = reg->default_limits.n > 0, budget = reg->default_budget.usd_per_day > 0;
    for (int i = 0; i < reg->nproviders; i++) {
        limits |= reg->providers[i].limits.n > 0;
        budget |= reg->providers[i].budget.usd_per_day > 0;
    }
    if (limits || budget)
        LOG(LOG_WARNING,
            "rq worker: the providers document's %s not applied to RQ jobs yet (only the "
            "Celery worker takes part): their calls are neither paced by the fleet nor "
            "counted against a budget",
            limits && budget ? "limits and budgets are"
            : limits         ? "limits are"
                             : "budget is");
}

struct rq_worker *rq_worker_new(const struct rq_config *cfg, uv_loop_t *loop,
                                struct cr_err *err)
{
    struct rq_worker *w;
    struct buf csv;
    char base[RQ_MAX_NAME + 1];

    if (tasks_check_aliases(cfg->aliases.items, cfg->aliases.n, err))
        return NULL;
    for (int i = 0; i < cfg->nqueues; i++) {
        size_t n = strlen(cfg->queues[i]);
        if (n == 0 || n > RQ_MAX_NAME || strchr(cfg->queues[i], ','))
            return cr_err_set(err, CR_EINVAL, "invalid queue name '%.64s'",
                              cfg->queues[i]),
                   NULL;
    }
    w = cr_calloc(1, sizeof(*w));
    if (!w)
        return cr_err_set(err, CR_ENOMEM, "out of memory"), NULL;
    w->cfg = cfg;
    w->loop = loop;
    w->pid = (long)getpid();
    llm_stack_init(&w->ls);
    if (gethostname(w->hostname, sizeof(w->hostname) - 1))
        snprintf(w->hostname, sizeof(w->hostname), "localhost");
    if (redis_url_parse(&w->url, cfg->url, "rq", err))
        goto fail;
    buf_init(&csv);
    for (int i = 0; i < cfg->nqueues; i++)
        if ((i && buf_putc(&csv, ',')) || buf_puts(&csv, cfg->queues[i])) {
            buf_release(&csv);
            cr_err_set(err, CR_ENOMEM, "out of memory");
            goto fail;
        }
    w->queues_csv = buf_detach(&csv);
    if (!w->queues_csv) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        goto fail;
    }
    if (cfg->name && cfg->name[0])
        snprintf(base, sizeof(base), "%s", cfg->name);
    else
        snprintf(base, sizeof(base), "celeriac-%.100s-%ld", w->hostname, w->pid);
    /* each queue's turn, then each queue's unlock at the end */
    w->sched_reqs = cr_calloc((size_t)cfg->nqueues * 2, sizeof(*w->sched_reqs));
    w->sched_inflight = cr_calloc((size_t)cfg->nqueues, sizeof(*w->sched_inflight));
    if (!w->sched_reqs || !w->sched_inflight) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        goto fail;
    }
    w->nslots = cfg->concurrency;
    w->slots = cr_calloc((size_t)w->nslots, sizeof(*w->slots));
    if (!w->slots) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < w->nslots; i++) {
        struct slot *s = &w->slots[i];
        s->w = w;
        /* One job, one name: a single slot keeps the name as given. */
        if (w->nslots == 1)
            snprintf(s->name, sizeof(s->name), "%s", base);
        else
            snprintf(s->name, sizeof(s->name), "%.160s-%d", base, i + 1);
        redis_args_init(&s->cmd);
        redis_args_init(&s->pcmd);
        buf_init(&s->pend_text);
        s->info.name = s->name;
        s->info.queues = w->queues_csv;
        s->info.queue_names = cfg->queues;
        s->info.nqueues = cfg->nqueues;
        s->info.pid = w->pid;
        s->info.hostname = w->hostname;
        s->info.version = "celeriac " CELERIAC_VERSION;
        s->info.ttl_s = cfg->worker_ttl + 60;
    }
    if (llm_stack_open(&w->ls, loop, &cfg->base, err))
        goto fail;
    warn_fleet_keys(&w->ls.providers);
    {
        struct redis_conn_config rc;
        memset(&rc, 0, sizeof(rc));
        rc.url = &w->url;
        rc.timeout = 30;
        rc.health_check_interval = 25;
        rc.on_event = on_conn_event;
        rc.privdata = w;
        w->conn = redis_conn_new(loop, &rc, err);
        if (!w->conn)
            goto fail;
        /* BLPOP holds an answer back for its block time. */
        rc.timeout = POP_BLOCK_S + 30;
        rc.health_check_interval = 0;
        w->popc = redis_conn_new(loop, &rc, err);
        if (!w->popc)
            goto fail;
        /* Subscribed: replies come when a command is published, never
         * awaited; no PING probe on a subscribed connection. */
        rc.timeout = 0;
        w->subc = redis_conn_new(loop, &rc, err);
        if (!w->subc)
            goto fail;
    }
    uv_timer_init(loop, &w->cron);
    w->cron.data = w;
    uv_signal_init(loop, &w->sigterm);
    w->sigterm.data = w;
    uv_signal_init(loop, &w->sigint);
    w->sigint.data = w;
    return w;
fail:
    rq_worker_free(w);
    return NULL;
}

int rq_worker_start(struct rq_worker *w, struct cr_err *err)
{
    char ts[RQ_TS_SIZE], shown[512];
    redact_url(w->cfg->url, shown, sizeof(shown));
    if (redis_conn_wait(w->conn, 10000) || redis_conn_wait(w->popc, 10000))
        return cr_err_set(
            err, CR_EBACKEND, "cannot connect to Redis at %s: %s", shown,
            redis_conn_last_error(redis_conn_up(w->conn) ? w->popc : w->conn));
    ts_now(ts);
    for (int i = 0; i < w->nslots; i++) {
        struct slot *s = &w->slots[i];
        struct redis_args a;
        const char **argv;
        s->info.ts = ts;
        redis_args_init(&a);
        rq_redis_birth(&a, &s->info);
        argv = redis_args_argv(&a);
        s->beat_req.data = s;
        if (!argv || redis_conn_send(w->conn, &s->beat_req, on_birth, a.n, argv, a.len)) {
            redis_args_release(&a);
            return cr_err_set(err, CR_EBACKEND, "cannot register the workers");
        }
        s->beat_inflight = 1;
        w->births_left++;
        redis_args_release(&a);
    }
    uv_run(w->loop, UV_RUN_DEFAULT);
    if (w->births_left || w->birth_failed) {
        /* Those registered go again: a half-made set of workers would linger. */
        if (!w->births_left)
            register_deaths(w), uv_run(w->loop, UV_RUN_DEFAULT);
        return cr_err_set(err, CR_EINVAL, "cannot register the RQ workers (see above)");
    }
    w->registered = 1;
    w->pop_warm = 1;
    for (int i = 0; i < w->nslots; i++)
        w->slots[i].next_idle_beat_ms = uv_now(w->loop) + IDLE_BEAT_MS;
    {
        /* The cron writes progress too: it ticks at least as often. */
        uint64_t ms = (uint64_t)w->cfg->progress_interval_ms < CRON_MS
                          ? (uint64_t)w->cfg->progress_interval_ms
                          : CRON_MS;
        uv_timer_start(&w->cron, on_cron, ms, ms);
    }
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    LOG(LOG_INFO, "rq worker %s%s on %s: queues %s, %d at once", w->slots[0].name,
        w->nslots > 1 ? " (and the next slots)" : "", shown, w->queues_csv, w->nslots);
    LOG(LOG_INFO, "rq worker ready.");
    check_suspended(w);
    kick(w);
    return 0;
}

int rq_worker_run(struct rq_worker *w)
{
    uv_run(w->loop, UV_RUN_DEFAULT);
    return w->exit_code;
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

void rq_worker_free(struct rq_worker *w)
{
    if (!w)
        return;
    w->done = 1;
    llm_stack_close(&w->ls);
    redis_conn_free(w->subc);
    redis_conn_free(w->popc);
    redis_conn_free(w->conn);
    if (w->cron.data) {
        uv_close((uv_handle_t *)&w->cron, on_closed);
        uv_close((uv_handle_t *)&w->sigterm, on_closed);
        uv_close((uv_handle_t *)&w->sigint, on_closed);
    }
    uv_run(w->loop, UV_RUN_DEFAULT);
    llm_stack_release(&w->ls);
    for (int i = 0; w->slots && i < w->nslots; i++) {
        redis_args_release(&w->slots[i].cmd);
        redis_args_release(&w->slots[i].pcmd);
        pstream_clear_end(&w->slots[i]);
        buf_release(&w->slots[i].pend_text);
        cJSON_Delete(w->slots[i].meta);
    }
    cr_free(w->slots);
    cr_free(w->sched_reqs);
    cr_free(w->sched_inflight);
    cr_free(w->queues_csv);
    cr_free(w);
}
