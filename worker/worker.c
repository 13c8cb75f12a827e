/* worker.c -- from delivery to settled outcome, on one libuv loop.
 *
 * The way of one task (see ARCHITECTURE.md):
 *   delivery -> decode -> registry -> [expired?] -> backend GET (already done?)
 *   -> [eta: held on the cron, no slot] -> ready queue -> slot -> LLM call
 *   -> outcome: SUCCESS stored | retry republished (confirmed) + RETRY stored |
 *      dead-lettered (confirmed) + FAILURE stored -> ack.
 * A job holds every delivery of its task id (a redelivery after a broker
 * reconnect attaches to the running job) and acks them all once its outcome is
 * durable: one settle per delivery, never before. */
#include "worker.h"

#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "net/results.h"
#include "events.h"
#include "metrics.h"
#include "pidbox.h"
#include "progress.h"
#include "worker_int.h"
#include "net/amqp.h"
#include "util/log.h"
#include "engine/tasks.h"
#include "llm/llm_client.h"
#include "llm/policy.h"
#include "protocol/celery_msg.h"
#include "protocol/isotime.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/strmap.h"

#define CRON_MS 100
#define CELERIAC_VERSION "0.1.0"
#define EXC_MODULE "celeriac.exceptions"
#define REPR_MAX 1024

static void schedule(struct worker *w);
static void settle(struct job *j);
static void store_then_ack(struct job *j);
static void revoke_terminated(struct job *j, const char *partial);
static void queue_job(struct job *j);
static void lease_drop(struct job *j);
static void eta_push(struct worker *w, struct job *j);
static void job_release_ref(struct job *j);
static void start_shutdown(struct worker *w, int cold);

static int64_t now_epoch_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---------------------------------------------------------------- jobs */

static void job_set_state(struct job *j, enum job_state s)
{
    LOG(LOG_DEBUG, "task %s: %s -> [%s]", j->tm.id ? j->tm.id : "?",
        job_state_names[j->state], job_state_names[s]);
    j->state = s;
}

/* A failed job's reasons when even their few hundred bytes cannot be had. */
static struct job_failure oom_failure = {"MemoryError", "out of memory", "out of memory"};

static const struct job_failure *failure_of(const struct job *j)
{
    return j->failure ? j->failure : &oom_failure;
}

static void job_free(struct job *j)
{
    struct worker *w = j->w;
    progress_forget(w->progress, j);
    if (j->in_map && j->tm.id && strmap_get(&w->jobs, j->tm.id) == j)
        strmap_del(&w->jobs, j->tm.id);
    for (int i = 0; i < j->nmsgs; i++)
        broker_msg_free(j->msgs[i]);
    cr_free(j->msgs);
    task_msg_release(&j->tm);
    cr_free(j->model);
    cr_free(j->meta);
    if (j->failure != &oom_failure)
        cr_free(j->failure);
    cr_free(j);
    w->live--;
    if (w->shutdown == 1 && w->live == 0)
        uv_stop(w->loop);
}

static void job_release_ref(struct job *j)
{
    if (--j->pending == 0 && j->state == JOB_DONE)
        job_free(j);
}

/* Lets a job go without settling its deliveries: they stay unacked and come
 * back from the broker (requeued on close, redelivered elsewhere), so nothing
 * is lost. Freed now, or by the last pending callback. */
static void abandon_job(struct job *j)
{
    job_set_state(j, JOB_DONE);
    if (j->in_map) {
        strmap_del(&j->w->jobs, j->tm.id);
        j->in_map = 0;
    }
    if (j->pending == 0)
        job_free(j);
}

/* Whether j's message comes back to be run again if j lets go of it without
 * settling it: a delivery still unacked (requeued by RabbitMQ when its
 * connection closes), or a parked copy whose lease names this worker. Not so
 * with --acks-early, whose deliveries were acked when the task started. */
static int job_comes_back(const struct job *j)
{
    if (j->leased)
        return 1;
    for (int i = 0; i < j->nmsgs; i++)
        if (!j->msgs[i]->settled)
            return 1;
    return 0;
}

/* Whether j holds an unacked delivery of the broker connection now up. A
 * delivery of a connection since lost is back in its queue already; its
 * redelivery joins j while j exists (see on_msg()). */
static int job_live(const struct job *j)
{
    struct broker *b = j->w->broker;
    if (!broker_connected(b))
        return 0;
    for (int i = 0; i < j->nmsgs; i++)
        if (!j->msgs[i]->settled && j->msgs[i]->generation == broker_generation(b))
            return 1;
    return 0;
}

static struct job *job_new(struct worker *w, struct broker_msg *m)
{
    struct job *j = cr_calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->w = w;
    j->msgs = cr_malloc(sizeof(*j->msgs));
    if (!j->msgs) {
        cr_free(j);
        return NULL;
    }
    j->msgs[0] = m;
    j->nmsgs = 1;
    task_msg_init(&j->tm);
    j->t_received = uv_now(w->loop);
    j->received_epoch_us = now_epoch_us();
    j->state = JOB_CHECKING;
    w->live++;
    return j;
}

static int job_attach(struct job *j, struct broker_msg *m)
{
    struct broker_msg **p = cr_realloc(j->msgs, (size_t)(j->nmsgs + 1) * sizeof(*p));
    if (!p)
        return CR_ENOMEM;
    j->msgs = p;
    j->msgs[j->nmsgs++] = m;
    return 0;
}

static const char *job_name(const struct job *j)
{
    if (j->tm.shadow)
        return j->tm.shadow;
    return j->tm.task ? j->tm.task : "unknown";
}

/* The AMQP headers of one of j's deliveries, for looking up the headers Celery
 * does not define (x-death, x-celeriac-parked). Once the first delivery is
 * decoded the broker's tree is dropped and the task keeps only those (see
 * celery_msg_decode()): holding Celery's own headers as a tree cost about 2 KB
 * per task in flight, and they are rebuilt exactly by headers_copy(). */
static const cJSON *headers_of(const struct job *j, const struct broker_msg *m)
{
    if (m->headers || j->nmsgs == 0 || m != j->msgs[0])
        return m->headers;
    return j->tm.headers;
}

/* A new copy of all the headers of one of j's deliveries, to send it again as
 * it came. NULL on OOM. */
static cJSON *headers_copy(struct job *j, const struct broker_msg *m)
{
    /* argsrepr and kwargsrepr a producer left out are rebuilt from the args */
    if (!m->headers && j->nmsgs && m == j->msgs[0] && j->tm.headers)
        return worker_job_args(j) ? NULL : celery_msg_headers(&j->tm);
    return m->headers ? cJSON_Duplicate(m->headers, 1) : cJSON_CreateObject();
}

static void list_unlink(struct job **head, struct job **tail, struct job *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        *head = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else if (tail)
        *tail = j->prev;
    j->prev = j->next = NULL;
}

static void ready_push(struct worker *w, struct job *j)
{
    job_set_state(j, JOB_READY);
    j->prev = w->ready_tail;
    j->next = NULL;
    if (w->ready_tail)
        w->ready_tail->next = j;
    else
        w->ready_head = j;
    w->ready_tail = j;
    w->nready++;
}

/* Held eta tasks are unacked deliveries: raise the prefetch window by one for
 * each, as Celery does, so ready tasks behind them still arrive. */
int worker_prefetch_count(int concurrency, int multiplier, size_t neta)
{
    /* Each factor fits in 32 bits, so the product fits in 64. */
    uint64_t n = (uint64_t)(concurrency > 0 ? concurrency : 0) *
                     (uint64_t)(multiplier > 0 ? multiplier : 0) +
                 (neta < 65535 ? (uint64_t)neta : 65535);
    return n < 1 ? 1 : n > 65535 ? 65535 : (int)n;
}

static void sync_prefetch(struct worker *w)
{
    broker_set_prefetch(
        w->broker,
        worker_prefetch_count(w->concurrency, w->cfg->prefetch_multiplier, w->neta));
}

static void eta_push(struct worker *w, struct job *j)
{
    job_set_state(j, JOB_ETA);
    j->prev = NULL;
    j->next = w->eta_head;
    if (w->eta_head)
        w->eta_head->prev = j;
    w->eta_head = j;
    w->neta++;
    sync_prefetch(w);
}

/* -------------------------------------------------------- notifications */

void worker_notify(struct worker *w, struct job *j, const struct task_event_info *info)
{
    events_on_task(w->events, j, info);
    metrics_on_task(w->metrics, j, info);
    progress_on_task(w->progress, j, info);
}

static void notify_simple(struct job *j, enum task_event_type type)
{
    struct task_event_info info;
    memset(&info, 0, sizeof(info));
    info.type = type;
    worker_notify(j->w, j, &info);
}

/* ------------------------------------------------- args while running */

/* What the decoder is given for delivery m, with these headers (borrowed). */
static void raw_of(struct celery_raw_msg *raw, const struct broker_msg *m,
                   const cJSON *headers)
{
    memset(raw, 0, sizeof(*raw));
    raw->content_type = m->content_type;
    raw->content_encoding = m->content_encoding;
    raw->headers = headers;
    raw->correlation_id = m->correlation_id;
    raw->reply_to = m->reply_to;
    raw->delivery_mode = m->delivery_mode;
    raw->priority = m->priority;
    raw->body = m->body;
    raw->body_len = m->body_len;
}

/* The args and kwargs trees are only read to build the call (and again for a
 * retry, --result-extended metas and `celery inspect`), yet a running call
 * held them for its whole life: about 400 bytes per stream of the memory
 * bench. The message they came in is kept anyway (to dead-letter or park it
 * as it came), so a job that has sent its call drops them and
 * worker_job_args() parses them again when needed. */
static void drop_args(struct job *j)
{
    const cJSON *model;

    if (j->args_dropped || j->nmsgs == 0 || !j->msgs[0]->body)
        return;
    model = j->tm.kwargs ? cJSON_GetObjectItemCaseSensitive(j->tm.kwargs, "model") : NULL;
    if (cJSON_IsString(model) && !(j->model = cr_strdup(model->valuestring)))
        return;
    cJSON_Delete(j->tm.args);
    cJSON_Delete(j->tm.kwargs);
    j->tm.args = j->tm.kwargs = NULL;
    j->args_dropped = 1;
}

int worker_job_args(struct job *j)
{
    const struct broker_msg *m;
    struct celery_raw_msg raw;
    struct task_msg again;
    struct cr_err err;
    cJSON *headers;
    int rc;

    if (!j->args_dropped)
        return 0;
    /* The decoder wants the headers the message came with: Celery's are
     * rebuilt from the decoded fields, the others were kept. */
    m = j->msgs[0];
    headers = celery_msg_headers(&j->tm);
    if (!headers)
        return CR_ENOMEM;
    raw_of(&raw, m, headers);
    memset(&again, 0, sizeof(again));
    memset(&err, 0, sizeof(err));
    rc = celery_msg_decode(&raw, &again, &err);
    cJSON_Delete(headers);
    if (rc == 0) {
        j->tm.args = again.args;
        j->tm.kwargs = again.kwargs;
        again.args = again.kwargs = NULL;
        j->args_dropped = 0;
        cr_free(j->model);
        j->model = NULL;
    } else if (rc != CR_ENOMEM) {
        /* It decoded when it came: only memory can fail it now. */
        LOG(LOG_ERROR, "Task %s[%s]: cannot decode its message again: %s", job_name(j),
            j->tm.id, err.msg);
    }
    task_msg_release(&again);
    return rc;
}

/* ------------------------------------------------------------- outcomes */

char *worker_job_meta(struct job *j, const char *status, const cJSON *result,
                      const char *traceback, int ready)
{
    struct worker *w = j->w;
    struct result_meta rm;
    memset(&rm, 0, sizeof(rm));
    rm.task_id = j->tm.id;
    rm.status = status;
    rm.result = result;
    rm.traceback = traceback;
    rm.date_done_us = ready ? now_epoch_us() : -1;
    rm.group_id = j->tm.group;
    rm.parent_id = j->tm.parent_id;
    if (w->cfg->result_extended) {
        worker_job_args(j);
        rm.extended = 1;
        rm.name = j->tm.task;
        rm.args = j->tm.args;
        rm.kwargs = j->tm.kwargs;
        rm.worker = w->cfg->hostname;
        rm.retries = j->tm.retries;
        rm.queue = j->nmsgs ? j->msgs[0]->routing_key : NULL;
    }
    return result_meta_encode(&rm);
}

static char *exc_meta(struct job *j, const char *status, const char *exc_type,
                      const char *exc_module, const char *message, int ready)
{
    cJSON *exc = result_exc_new(exc_type, exc_module, message);
    struct buf tb;
    char *meta;
    buf_init(&tb);
    /* A Python-looking traceback, so tools that print it show something
     * familiar; the frames are ours, not Python's. */
    buf_printf(
        &tb,
        "Traceback (most recent call last):\n  File \"celeriac\", in %s\n%s%s%s: %s\n",
        j->tm.task ? j->tm.task : "unknown",
        strcmp(exc_module, "builtins") ? exc_module : "",
        strcmp(exc_module, "builtins") ? "." : "", exc_type, message);
    meta = exc ? worker_job_meta(j, status, exc, tb.data, ready) : NULL;
    cJSON_Delete(exc);
    buf_release(&tb);
    return meta;
}

/* Acks every delivery of the job and lets it go. */
static void finish_job(struct job *j)
{
    struct worker *w = j->w;
    for (int i = 0; i < j->nmsgs; i++)
        broker_ack(w->broker, j->msgs[i]);
    if (j->leased)
        lease_drop(j);
    abandon_job(j);
    if (w->shutdown)
        schedule(w);
}

/* The properties of a copy of m (dead letter, parked copy): m's own, made
 * persistent, with the given headers (borrowed). */
static void props_of(struct broker_props *p, const struct broker_msg *m,
                     const cJSON *headers)
{
    memset(p, 0, sizeof(*p));
    p->content_type = m->content_type;
    p->content_encoding = m->content_encoding;
    p->correlation_id = m->correlation_id;
    p->reply_to = m->reply_to;
    p->delivery_mode = 2;
    p->priority = m->priority;
    p->headers = headers;
}

/* Builds the dead-letter headers on top of the original ones. */
static cJSON *dead_letter_headers(struct worker *w, struct job *j)
{
    struct broker_msg *m = j->msgs[0];
    const struct job_failure *f = failure_of(j);
    cJSON *h = headers_copy(j, m);
    char when[40];
    if (!h)
        return NULL;
#define SET(key, item)                                                                   \
    do {                                                                                 \
        cJSON_DeleteItemFromObjectCaseSensitive(h, key);                                 \
        cJSON_AddItemToObject(h, key, item);                                             \
    } while (0)
    SET("x-celeriac-reason", cJSON_CreateString(f->reason));
    SET("x-celeriac-exception-type", cJSON_CreateString(f->exc_type));
    SET("x-celeriac-exception-message", cJSON_CreateString(f->exc_message));
    SET("x-celeriac-http-status", cJSON_CreateNumber((double)j->http_status));
    SET("x-celeriac-retries", cJSON_CreateNumber(j->tm.retries));
    SET("x-celeriac-original-exchange",
        cJSON_CreateString(m->exchange ? m->exchange : ""));
    SET("x-celeriac-original-routing-key",
        cJSON_CreateString(m->routing_key ? m->routing_key : ""));
    SET("x-celeriac-original-queue", cJSON_CreateString(m->queue ? m->queue : ""));
    iso8601_format(j->received_epoch_us, when);
    SET("x-celeriac-first-received", cJSON_CreateString(when));
    iso8601_format(now_epoch_us(), when);
    SET("x-celeriac-failed-at", cJSON_CreateString(when));
    SET("x-celeriac-worker", cJSON_CreateString(w->cfg->hostname));
#undef SET
    return h;
}

/* A dead letter the broker did not take. While the delivery comes back (see
 * job_comes_back()) the job ends as a retry whose confirm failed does (see
 * on_retry_confirm()): unacked, nothing stored, so the redelivery runs the
 * task again and dead-letters it then. A delivery acked early does not come
 * back: its FAILURE is stored all the same, without the dead letter. */
static void dead_letter_failed(struct job *j)
{
    if (job_comes_back(j)) {
        abandon_job(j);
        return;
    }
    LOG(LOG_ERROR,
        "Task %s[%s] was acked early: storing its FAILURE without a dead letter",
        job_name(j), j->tm.id ? j->tm.id : "?");
    store_then_ack(j);
}

static void on_dead_letter_confirm(struct broker *b, int ok, void *privdata)
{
    struct job *j = privdata;
    (void)b;
    j->pending--;
    if (!ok) {
        LOG(LOG_ERROR,
            "Task %s[%s] dead-letter publish not confirmed; leaving the message "
            "unacked",
            job_name(j), j->tm.id ? j->tm.id : "?");
        dead_letter_failed(j);
        return;
    }
    store_then_ack(j);
}

static void dead_letter(struct job *j)
{
    struct worker *w = j->w;
    struct broker_msg *m = j->msgs[0];
    struct broker_props p;
    cJSON *h;
    int rc;

    h = dead_letter_headers(w, j);
    props_of(&p, m, h);
    rc = broker_publish(w->broker, w->cfg->dead_letter_exchange, m->queue ? m->queue : "",
                        &p, m->body, m->body_len, on_dead_letter_confirm, j);
    cJSON_Delete(h);
    if (rc) {
        LOG(LOG_ERROR, "Task %s[%s] cannot be dead-lettered now (%s); leaving it unacked",
            job_name(j), j->tm.id ? j->tm.id : "?", cr_strerror(rc));
        dead_letter_failed(j);
        return;
    }
    j->pending++;
    LOG(LOG_WARNING, "Task %s[%s] dead-lettered to %s: %s: %s", job_name(j),
        j->tm.id ? j->tm.id : "?", w->cfg->dead_letter_exchange, failure_of(j)->exc_type,
        failure_of(j)->exc_message);
}

static void on_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    struct job *j = privdata;
    (void)bk;
    if (status) { /* backend freed (cold shutdown): the delivery goes back */
        job_set_state(j, JOB_DONE);
        job_release_ref(j);
        return;
    }
    j->pending--;
    if (skipped)
        LOG(LOG_INFO, "Task %s[%s] already has SUCCESS stored; not overwriting it",
            job_name(j), j->tm.id);
    finish_job(j);
}

/* Hands j->meta to the backend to store (it is the backend's from here). */
static int store_meta(struct job *j, backend_store_fn *cb)
{
    char *meta = j->meta;
    j->meta = NULL;
    return backend_store(j->w->backend, j->tm.id, meta, strlen(meta), cb, j);
}

/* Stores j's outcome, if it has one to store, then acks. */
static void store_then_ack(struct job *j)
{
    if (!j->meta || !j->tm.id) {
        finish_job(j);
        return;
    }
    if (store_meta(j, on_stored)) {
        LOG(LOG_ERROR, "Task %s[%s] cannot queue its result: out of memory", job_name(j),
            j->tm.id);
        abandon_job(j);
        return;
    }
    j->pending++;
}

/* Makes the outcome durable, then acks. A failure's dead letter goes first and
 * its FAILURE is stored only once the broker confirmed it, because a stored
 * FAILURE is what makes a redelivery ack without running (check_job()): were
 * it stored first, a connection lost before the confirm would leave a
 * redelivery that finds FAILURE, is acked, and loses the dead letter. Sending
 * the dead letter again on such a redelivery instead would duplicate it every
 * time only the ack was lost. In this order a stored FAILURE means the dead
 * letter is in, and only a crash between the confirm and the store sends a
 * second one (at least once, as every publish here). */
static void settle(struct job *j)
{
    job_set_state(j, JOB_SETTLING);
    if (j->dead_letter && j->w->cfg->dead_letter_exchange[0])
        dead_letter(j);
    else
        store_then_ack(j);
}

/* A final failure: the message dead-lettered and FAILURE stored (unless ignored). */
static void fail_job_llm(struct job *j, const char *exc_type, const char *exc_module,
                         const char *message, const char *reason, int dead_letter,
                         const struct llm_result *llm)
{
    struct worker *w = j->w;
    struct task_event_info info;
    memset(&info, 0, sizeof(info));
    info.type = TEV_FAILED;
    info.exc_type = exc_type;
    info.exc_message = message;
    info.llm = llm;
    info.runtime_s = j->t_started ? (double)(uv_now(w->loop) - j->t_started) / 1000.0 : 0;
    if (j->tm.id)
        worker_notify(w, j, &info);
    if (dead_letter)
        metrics_on_dead_letter(w->metrics, j);
    if (!j->failure)
        j->failure = cr_malloc(sizeof(*j->failure));
    if (!j->failure) {
        j->failure = &oom_failure;
    } else if (j->failure != &oom_failure) {
        snprintf(j->failure->exc_type, sizeof(j->failure->exc_type), "%s", exc_type);
        snprintf(j->failure->exc_message, sizeof(j->failure->exc_message), "%s", message);
        snprintf(j->failure->reason, sizeof(j->failure->reason), "%s", reason);
    }
    j->dead_letter = dead_letter;
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.id && j->tm.ignore_result != 1) {
        j->meta = exc_meta(j, "FAILURE", exc_type, exc_module, message, 1);
        if (!j->meta)
            LOG(LOG_ERROR, "Task %s[%s]: out of memory for its FAILURE", job_name(j),
                j->tm.id);
    }
    settle(j);
}

static void fail_job(struct job *j, const char *exc_type, const char *exc_module,
                     const char *message, const char *reason, int dead_letter)
{
    fail_job_llm(j, exc_type, exc_module, message, reason, dead_letter, NULL);
}

/* ------------------------------------------------------------- retries */

static void on_retry_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    on_stored(bk, status, skipped, privdata);
}

static void on_retry_confirm(struct broker *b, int ok, void *privdata)
{
    struct job *j = privdata;
    (void)b;
    j->pending--;
    if (!ok) {
        /* The retry message may not exist: leave the original unacked so
         * it comes back, rather than lose the task. */
        LOG(LOG_ERROR,
            "Task %s[%s] retry publish not confirmed; the message will be "
            "redelivered",
            job_name(j), j->tm.id);
        abandon_job(j);
        return;
    }
    if (!j->meta || store_meta(j, on_retry_stored)) {
        finish_job(j);
        return;
    }
    j->pending++;
}

/* Republishes the task with retries + 1 and an eta, as Task.retry does. */
static int retry_job(struct job *j, int64_t delay_ms)
{
    struct worker *w = j->w;
    struct broker_msg *m = j->msgs[0];
    struct task_msg *t = &j->tm;
    struct broker_props p;
    struct buf body;
    cJSON *headers = NULL;
    char eta[40];
    int rc;

    if ((rc = worker_job_args(j)) != 0)
        return rc;
    t->retries++;
    cr_free(t->eta);
    iso8601_format(now_epoch_us() + delay_ms * 1000, eta);
    t->eta = cr_strdup(eta);
    t->eta_us = now_epoch_us() + delay_ms * 1000;
    if (!t->parent_id)
        t->parent_id = cr_strdup(t->id);
    buf_init(&body);
    rc = celery_msg_encode_v2(t, &body, &headers);
    if (rc) {
        buf_release(&body);
        t->retries--;
        return rc;
    }
    memset(&p, 0, sizeof(p));
    p.content_type = "application/json";
    p.content_encoding = "utf-8";
    p.correlation_id = t->id;
    p.reply_to = m->reply_to;
    p.delivery_mode = m->delivery_mode ? m->delivery_mode : 2;
    p.priority = m->priority;
    p.headers = headers;
    /* Same routing as the original: through "" the routing key is the queue. */
    rc = broker_publish(w->broker, m->exchange ? m->exchange : "",
                        m->routing_key ? m->routing_key : "", &p, body.data, body.len,
                        on_retry_confirm, j);
    buf_release(&body);
    cJSON_Delete(headers);
    if (rc) {
        t->retries--;
        return rc;
    }
    j->pending++;
    /* The republished message is the task's next attempt: it often arrives
     * before RETRY is stored, and must not join this settling job. */
    if (j->in_map) {
        strmap_del(&w->jobs, t->id);
        j->in_map = 0;
    }
    return 0;
}

/* ---------------------------------------------------------- LLM results */

static void log_success(struct job *j, const cJSON *result, double runtime)
{
    struct buf r;
    if (LOG_INFO < log_threshold)
        return;
    buf_init(&r);
    py_repr(result, &r, 200);
    LOG(LOG_INFO, "Task %s[%s] succeeded in %.3fs: %s", job_name(j), j->tm.id, runtime,
        r.data ? r.data : "None");
    buf_release(&r);
}

static void succeed(struct job *j, cJSON *result, const struct llm_result *llm)
{
    struct worker *w = j->w;
    double runtime = (double)(uv_now(w->loop) - j->t_started) / 1000.0;
    struct task_event_info info;
    log_success(j, result, runtime);
    memset(&info, 0, sizeof(info));
    info.type = TEV_SUCCEEDED;
    info.result = result;
    info.runtime_s = runtime;
    info.llm = llm;
    worker_notify(w, j, &info);
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.ignore_result != 1) {
        j->meta = worker_job_meta(j, "SUCCESS", result, NULL, 1);
        if (!j->meta) {
            cJSON_Delete(result);
            fail_job(j, "MemoryError", "builtins", "out of memory encoding the result",
                     "internal", 0);
            return;
        }
    }
    cJSON_Delete(result);
    settle(j);
}

static void release_slot(struct job *j)
{
    struct worker *w = j->w;
    if (j->state == JOB_RUNNING) {
        w->active--;
        j->req = NULL;
        if (j->rprev)
            j->rprev->rnext = j->rnext;
        else
            w->run_head = j->rnext;
        if (j->rnext)
            j->rnext->rprev = j->rprev;
        j->rprev = j->rnext = NULL;
        /* Not RUNNING any more, so a second call is a no-op. */
        j->state = JOB_SETTLING;
    }
}

static void on_llm_done(struct llm_req *r, const struct llm_result *res, void *privdata)
{
    struct job *j = privdata;
    struct worker *w = j->w;
    int rc;
    (void)r;

    release_slot(j);
    j->pending--;
    if (w->shutdown == 2) {
        /* Cold shutdown: the delivery goes back to the queue untouched. */
        abandon_job(j);
        return;
    }
    if (j->revoked) {
        revoke_terminated(
            j, res->chat && res->chat->content.data ? res->chat->content.data : NULL);
        schedule(w);
        return;
    }
    if (res->verdict == LLM_OK) {
        cJSON *result = tasks_result(j->kind, (struct llm_result *)res);
        if (!result)
            fail_job(j, "MemoryError", "builtins", "out of memory building the result",
                     "internal", 0);
        else
            succeed(j, result, res);
        schedule(w);
        return;
    }
    j->http_status = res->http_status;
    if (res->verdict == LLM_RETRYABLE &&
        (w->cfg->max_retries < 0 || j->tm.retries < w->cfg->max_retries)) {
        struct llm_backoff bo = {
            (int64_t)(w->cfg->retry_backoff * 1000), w->cfg->retry_backoff_factor,
            (int64_t)(w->cfg->retry_backoff_max * 1000), w->cfg->retry_jitter};
        int64_t delay = res->retry_after_ms >= 0
                            ? res->retry_after_ms
                            : llm_backoff_ms(&bo, j->tm.retries, &w->seed);
        char msg[700];
        snprintf(msg, sizeof(msg), "Retry in %.3fs: %s('%s')", (double)delay / 1000.0,
                 res->exc_type, res->message);
        cr_free(j->meta);
        j->meta = NULL;
        if (j->tm.ignore_result != 1)
            j->meta = exc_meta(j, "RETRY", res->exc_type, EXC_MODULE, res->message, 0);
        job_set_state(j, JOB_SETTLING);
        rc = retry_job(j, delay);
        if (rc == 0) {
            struct task_event_info info;
            LOG(LOG_INFO, "Task %s[%s] retry: %s", job_name(j), j->tm.id, msg);
            memset(&info, 0, sizeof(info));
            info.type = TEV_RETRIED;
            info.exc_type = res->exc_type;
            info.exc_message = res->message;
            info.llm = res;
            info.retry_delay_ms = delay;
            worker_notify(w, j, &info);
            schedule(w);
            return;
        }
        if (rc == CR_EBROKER && job_comes_back(j)) {
            /* The broker is away: a failure now would be for its sake, not
             * the task's. As when the confirm fails (on_retry_confirm()),
             * nothing is stored and the delivery stays unacked: RabbitMQ
             * requeues it with the lost connection, and the redelivery runs
             * the task again, which is the attempt the retry was for. */
            LOG(LOG_ERROR,
                "Task %s[%s] cannot publish its retry now (broker away); the message "
                "will be redelivered",
                job_name(j), j->tm.id);
            abandon_job(j);
            schedule(w);
            return;
        }
        LOG(LOG_ERROR, "Task %s[%s] cannot publish its retry; failing it", job_name(j),
            j->tm.id);
    }
    LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
        res->exc_type, res->message);
    fail_job_llm(j, res->exc_type,
                 !strncmp(res->exc_type, "SoftTimeLimit", 13) ||
                         !strncmp(res->exc_type, "TimeLimit", 9)
                     ? "billiard.exceptions"
                     : EXC_MODULE,
                 res->message,
                 res->verdict == LLM_RETRYABLE ? "retries exhausted"
                                               : "permanent failure",
                 1, res);
    schedule(w);
}

/* --------------------------------------------------------------- parking */

/* RabbitMQ closes a channel whose delivery stays unacked longer than its
 * consumer_timeout (30 min by default), which a long eta or a long generation
 * can exceed. Such a delivery is "parked" instead: a copy goes to
 * celeriac.park.<queue>, a durable queue whose fixed message TTL dead-letters
 * it back to <queue>, and once the broker confirms the copy the original is
 * acked. An eta task simply comes back later (held again or parked again). A
 * running task keeps running; its copy carries x-celeriac-parked and a lease
 * key in Redis names the worker running it, so the copy is parked again while
 * that worker lives, joins the job if it comes back here, and runs elsewhere
 * only if the lease lapsed (the worker died): nothing is lost, nothing runs
 * twice while its runner is alive. */

#define PARK_PREFIX "celeriac.park."
#define LEASE_PREFIX "celeriac-lease-"
#define MSG_PARKING 1u

struct park {
    struct job *j;
    struct broker_msg *m;
    int release_job; /* eta park: the job ends once the copy is confirmed */
};

static int park_queue_name(struct worker *w, const char *queue, char *out, size_t size)
{
    for (int i = 0; i < w->cfg->queues.n; i++)
        if (queue && !strcmp(w->cfg->queues.items[i], queue))
            return snprintf(out, size, PARK_PREFIX "%s", queue) < (int)size;
    return 0; /* a queue added at run time has no park queue: never park it */
}

/* The Redis key naming the worker that runs a parked task. */
static void lease_key(const struct job *j, char *key, size_t size)
{
    snprintf(key, size, LEASE_PREFIX "%s", j->tm.id);
}

static void lease_set(struct job *j)
{
    struct worker *w = j->w;
    char key[300], ttl[32];
    const char *argv[5];
    lease_key(j, key, sizeof(key));
    /* Three park periods: a live runner renews it every period. */
    snprintf(ttl, sizeof(ttl), "%lld", (long long)(w->cfg->park_after * 3 + 1));
    argv[0] = "SET";
    argv[1] = key;
    argv[2] = w->cfg->hostname;
    argv[3] = "EX";
    argv[4] = ttl;
    if (backend_command(w->backend, 5, argv, NULL, NULL, NULL) == 0)
        j->leased = 1;
}

static void lease_drop(struct job *j)
{
    char key[300];
    const char *argv[2] = {"DEL", key};
    lease_key(j, key, sizeof(key));
    backend_command(j->w->backend, 2, argv, NULL, NULL, NULL);
    j->leased = 0;
}

static void on_park_confirm(struct broker *b, int ok, void *privdata)
{
    struct park *p = privdata;
    struct job *j = p->j;
    p->m->owner_flags &= ~MSG_PARKING;
    j->pending--;
    if (ok) {
        broker_ack(b, p->m);
        LOG(LOG_DEBUG, "Task %s[%s] parked", job_name(j), j->tm.id);
    }
    if (p->release_job) {
        /* The job ends with its delivery parked; on a nack the delivery stays
         * unacked and is simply held here. */
        if (ok)
            abandon_job(j);
        else
            eta_push(j->w, j);
    } else if (j->state == JOB_DONE && j->pending == 0) {
        job_free(j);
    }
    cr_free(p);
}

/* Publishes a copy of m to its park queue. Returns 0 when the copy is on its way. */
static int park_msg(struct job *j, struct broker_msg *m, int release_job,
                    int mark_running)
{
    struct worker *w = j->w;
    struct broker_props props;
    struct park *p;
    char queue[300];
    cJSON *h;
    int rc;

    if (!park_queue_name(w, m->queue, queue, sizeof(queue)) ||
        (m->owner_flags & MSG_PARKING))
        return CR_EINVAL;
    p = cr_calloc(1, sizeof(*p));
    h = headers_copy(j, m);
    if (!p || !h) {
        cr_free(p);
        cJSON_Delete(h);
        return CR_ENOMEM;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(h, "x-celeriac-parked");
    if (mark_running)
        cJSON_AddStringToObject(h, "x-celeriac-parked", w->cfg->hostname);
    props_of(&props, m, h);
    p->j = j;
    p->m = m;
    p->release_job = release_job;
    rc = broker_publish(w->broker, "", queue, &props, m->body, m->body_len,
                        on_park_confirm, p);
    cJSON_Delete(h);
    if (rc) {
        cr_free(p);
        return rc;
    }
    m->owner_flags |= MSG_PARKING;
    j->pending++;
    return 0;
}

/* An eta too far away to hold: park every delivery of the job, then let it go. */
static int park_eta_job(struct job *j)
{
    if (j->nmsgs != 1 || park_msg(j, j->msgs[0], 1, 0))
        return -1;
    LOG(LOG_INFO, "Task %s[%s] parked until closer to its eta (%s)", job_name(j),
        j->tm.id, j->tm.eta ? j->tm.eta : "?");
    job_set_state(j, JOB_SETTLING);
    return 0;
}

/* Called from the cron: parks deliveries of running jobs held too long. */
static void park_running(struct worker *w, uint64_t now)
{
    uint64_t limit = (uint64_t)(w->cfg->park_after * 1000);
    for (struct job *j = w->run_head; j; j = j->rnext) {
        for (int i = 0; i < j->nmsgs; i++) {
            struct broker_msg *m = j->msgs[i];
            if (m->settled || (m->owner_flags & MSG_PARKING) ||
                now - m->received_ms < limit)
                continue;
            if (park_msg(j, m, 0, 1) == 0) {
                lease_set(j);
                LOG(LOG_INFO,
                    "Task %s[%s] still running after %.0fs: delivery parked, lease "
                    "kept",
                    job_name(j), j->tm.id, (double)(now - m->received_ms) / 1000.0);
            }
        }
    }
}

static void on_lease(struct backend *bk, int status, const struct redisReply *reply,
                     void *privdata);

/* --------------------------------------------------------------- running */

static void on_llm_delta(struct llm_req *r, const char *text, size_t len, void *privdata)
{
    struct job *j = privdata;
    (void)r;
    progress_on_delta(j->w->progress, j, text, len);
}

static void on_started_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    (void)bk;
    (void)status;
    (void)skipped;
    job_release_ref(privdata);
}

static double effective_limit(double header, double dflt)
{
    return header > 0 ? header : dflt;
}

/* Settles a job as REVOKED: reason "expired", "revoked" or "terminated". */
static void revoke_job(struct job *j, const char *reason, const char *partial)
{
    struct worker *w = j->w;
    struct task_event_info info;
    LOG(LOG_INFO, "Discarding revoked task: %s[%s] (%s)", job_name(j), j->tm.id, reason);
    memset(&info, 0, sizeof(info));
    info.type = TEV_REVOKED;
    info.expired = !strcmp(reason, "expired");
    info.terminated = !strcmp(reason, "terminated");
    info.partial_text = partial;
    worker_notify(w, j, &info);
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.ignore_result != 1) {
        cJSON *exc = result_exc_new("TaskRevokedError", "celery.exceptions", reason);
        /* Extra keys are ignored by Celery's exception decoding, so the text
         * produced before a terminate can travel with the REVOKED state. */
        if (exc && partial)
            cJSON_AddStringToObject(exc, "partial", partial);
        j->meta = exc ? worker_job_meta(j, "REVOKED", exc, NULL, 1) : NULL;
        cJSON_Delete(exc);
    }
    settle(j);
}

static void revoke_expired(struct job *j)
{
    revoke_job(j, "expired", NULL);
}

static void revoke_terminated(struct job *j, const char *partial)
{
    revoke_job(j, "terminated", partial);
}

static int expired(const struct job *j)
{
    return j->tm.expires_us >= 0 && now_epoch_us() > j->tm.expires_us;
}

static void start_job(struct job *j)
{
    struct worker *w = j->w;
    struct task_call call;
    struct task_error te;
    struct llm_request rq;
    struct cr_err err;
    int rc;

    if (expired(j)) {
        revoke_expired(j);
        return;
    }
    if (worker_is_revoked(w, j->tm.id)) {
        revoke_job(j, "revoked", NULL);
        return;
    }
    job_set_state(j, JOB_RUNNING);
    w->active++;
    j->rnext = w->run_head;
    if (w->run_head)
        w->run_head->rprev = j;
    w->run_head = j;
    w->processed++;
    j->t_started = uv_now(w->loop);
    {
        /* header, else the time_limit control command, else the options */
        struct task_limits *tl = strmap_get(&w->task_limits, j->tm.task);
        double hard = tl && tl->hard > 0 ? tl->hard : w->cfg->time_limit;
        double soft = tl && tl->soft > 0 ? tl->soft : w->cfg->soft_time_limit;
        j->hard_limit_s = effective_limit(j->tm.time_limit_hard, hard);
        j->soft_limit_s = effective_limit(j->tm.time_limit_soft, soft);
    }
    {
        struct task_total *tt = strmap_get(&w->totals, j->tm.task);
        if (!tt && (tt = cr_calloc(1, sizeof(*tt))) &&
            strmap_put(&w->totals, j->tm.task, tt)) {
            cr_free(tt);
            tt = NULL;
        }
        if (tt)
            tt->n++;
    }
    j->hard_deadline = j->hard_limit_s > 0
                           ? (int64_t)j->t_started + (int64_t)(j->hard_limit_s * 1000)
                           : 0;
    j->soft_deadline = j->soft_limit_s > 0
                           ? (int64_t)j->t_started + (int64_t)(j->soft_limit_s * 1000)
                           : 0;
    if (w->cfg->acks_early) {
        for (int i = 0; i < j->nmsgs; i++)
            broker_ack(w->broker, j->msgs[i]);
    }
    notify_simple(j, TEV_STARTED);
    if (w->cfg->track_started && j->tm.ignore_result != 1) {
        cJSON *info = cJSON_CreateObject();
        char *meta;
        cJSON_AddNumberToObject(info, "pid", (double)getpid());
        cJSON_AddStringToObject(info, "hostname", w->cfg->hostname);
        meta = worker_job_meta(j, "STARTED", info, NULL, 0);
        cJSON_Delete(info);
        /* Redis answers in order on one connection, so STARTED always lands
         * before the final state; the ack does not wait for it. */
        if (meta && backend_store(w->backend, j->tm.id, meta, strlen(meta),
                                  on_started_stored, j) == 0)
            j->pending++;
    }
    if (j->kind == TASK_ACCUMULATE) {
        cJSON *res;
        memset(&te, 0, sizeof(te));
        res = tasks_accumulate(&j->tm, &te);
        release_slot(j);
        if (res) {
            succeed(j, res, NULL);
        } else {
            LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j),
                j->tm.id, te.exc_type[0] ? te.exc_type : "MemoryError", te.message);
            fail_job(j, te.exc_type[0] ? te.exc_type : "MemoryError", "builtins",
                     te.message, "task raised", 1);
        }
        return;
    }
    memset(&te, 0, sizeof(te));
    rc = worker_job_args(j);
    if (rc == 0)
        rc = tasks_build_call(j->kind, &j->tm, w->cfg->llm_model, w->cfg->llm_embed_model,
                              &call, &te);
    if (rc) {
        release_slot(j);
        if (rc == CR_ENOMEM)
            snprintf(te.exc_type, sizeof(te.exc_type), "MemoryError");
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
            te.exc_type, te.message);
        fail_job(j, te.exc_type, "builtins", te.message, "bad arguments", 1);
        return;
    }
    memset(&rq, 0, sizeof(rq));
    rq.op = call.op;
    rq.url = call.op == LLM_OP_EMBED ? w->embed_url : w->chat_url;
    rq.api_key = w->cfg->llm_api_key;
    rq.body = call.body;
    rq.body_len = call.body_len;
    rq.embed_list = call.embed_list;
    j->attempt++;
    j->req = llm_client_submit(w->llm, &rq, on_llm_delta, on_llm_done, j, &err);
    task_call_release(&call);
    if (!j->req) {
        release_slot(j);
        fail_job(j, "MemoryError", "builtins", err.msg, "internal", 0);
        return;
    }
    drop_args(j);
    j->pending++;
}

/* Starts ready jobs while slots are free. */
static void schedule(struct worker *w)
{
    struct job *j = w->ready_head, *next;
    int64_t now = (int64_t)uv_now(w->loop);
    while (j && w->active < w->concurrency && w->shutdown != 2) {
        struct task_limits *tl =
            w->task_limits.count ? strmap_get(&w->task_limits, j->tm.task) : NULL;
        next = j->next;
        /* A rate-limited task waits in the queue (the cron tries again) and
         * does not hold up the tasks behind it. */
        if (tl && tl->has_rate && token_bucket_take(&tl->bucket, now) > 0) {
            j = next;
            continue;
        }
        list_unlink(&w->ready_head, &w->ready_tail, j);
        w->nready--;
        if (!job_live(j)) {
            /* Its connection was lost: RabbitMQ has its delivery back and
             * redelivers it once the worker is connected again (a redelivery
             * that came already made it live). A call started now would be
             * paid for an outcome that cannot be acked, and a retry or dead
             * letter that cannot be published. */
            LOG(LOG_DEBUG,
                "Task %s[%s] not started: its delivery went with the broker "
                "connection",
                job_name(j), j->tm.id);
            abandon_job(j);
            j = next;
            continue;
        }
        start_job(j);
        j = next;
    }
    if (w->shutdown == 1 && w->live == 0)
        uv_stop(w->loop);
}

/* ----------------------------------------------------------- receiving */

/* Whether this delivery may be a task whose outcome was already stored: the
 * broker delivered it before (a crash between the store and the ack), or it
 * came back through a dead-letter path (parked, or the broker's own x-death).
 * A producer publishing the same id again is not covered: like Celery, that
 * runs again, and the store still never overwrites a SUCCESS. */
static int seen_before(const struct job *j, const struct broker_msg *m)
{
    const cJSON *h = headers_of(j, m);
    return m->redelivered ||
           (h && (cJSON_GetObjectItemCaseSensitive(h, "x-death") ||
                  cJSON_GetObjectItemCaseSensitive(h, "x-celeriac-parked")));
}

static void check_job(struct job *j, const char *st);

/* The stored state of a delivery seen before (see seen_before()). */
static void on_meta(struct backend *bk, int status, const char *value, size_t len,
                    void *privdata)
{
    struct job *j = privdata;
    char st[32] = "";
    (void)bk;

    j->pending--;
    if (status) {
        abandon_job(j);
        return;
    }
    if (value && result_meta_status(value, len, st, sizeof(st)) != 0)
        st[0] = '\0';
    check_job(j, st);
}

/* Decides what a received job does, given its stored state st ("" when none
 * was stored or read): settle it, give it back, revoke, ask its lease, hold,
 * park or queue it. */
static void check_job(struct job *j, const char *st)
{
    struct worker *w = j->w;

    if (st[0]) {
        int redelivered = 0;
        for (int i = 0; i < j->nmsgs; i++)
            redelivered |= j->msgs[i]->redelivered;
        /* A crash after storing but before acking brings the message back:
         * its outcome is durable, so settle it without paying again. */
        if (!strcmp(st, "SUCCESS") ||
            (redelivered && (!strcmp(st, "FAILURE") || !strcmp(st, "REVOKED")))) {
            LOG(LOG_INFO,
                "Task %s[%s] already has %s stored; acknowledging without running it",
                job_name(j), j->tm.id, st);
            finish_job(j);
            return;
        }
    }
    if (w->shutdown) {
        /* Not started: give it back. */
        for (int i = 0; i < j->nmsgs; i++)
            broker_reject(w->broker, j->msgs[i], 1);
        abandon_job(j);
        schedule(w);
        return;
    }
    if (worker_is_revoked(w, j->tm.id)) {
        revoke_job(j, "revoked", NULL);
        return;
    }
    if (w->cfg->park_after > 0 && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(
                                      headers_of(j, j->msgs[0]), "x-celeriac-parked"))) {
        /* A parked copy of a task that was running somewhere: ask the lease. */
        char key[300];
        const char *argv[2] = {"GET", key};
        lease_key(j, key, sizeof(key));
        if (backend_command(w->backend, 2, argv, NULL, on_lease, j) == 0) {
            j->pending++;
            return;
        }
    }
    queue_job(j);
}

/* Holds, parks or queues a checked job. */
static void queue_job(struct job *j)
{
    struct worker *w = j->w;
    if (j->tm.eta_us >= 0 && j->tm.eta_us > now_epoch_us()) {
        if (w->cfg->park_after > 0 &&
            j->tm.eta_us - now_epoch_us() > (int64_t)(w->cfg->park_after * 1e6) &&
            park_eta_job(j) == 0)
            return;
        eta_push(w, j);
    } else {
        ready_push(w, j);
    }
    schedule(w);
}

static void on_lease(struct backend *bk, int status, const struct redisReply *reply,
                     void *privdata)
{
    struct job *j = privdata;
    struct worker *w = j->w;
    (void)bk;
    j->pending--;
    if (status || w->shutdown) {
        if (!status)
            for (int i = 0; i < j->nmsgs; i++)
                broker_reject(w->broker, j->msgs[i], 1);
        abandon_job(j);
        return;
    }
    if (reply && reply->type == REDIS_REPLY_STRING &&
        strcmp(reply->str, w->cfg->hostname) != 0) {
        /* Its runner is alive elsewhere: back to the park queue. */
        if (j->nmsgs == 1 && park_msg(j, j->msgs[0], 1, 1) == 0) {
            job_set_state(j, JOB_SETTLING);
            return;
        }
    }
    queue_job(j);
}

/* A message that cannot be run: log once, store FAILURE when the id is known,
 * dead-letter it, then ack. */
static void reject_bad(struct worker *w, struct job *j, const char *exc_type,
                       const char *exc_module, const char *message, const char *reason)
{
    (void)w;
    LOG(LOG_ERROR, "Rejecting message %s[%s]: %s: %s", j->tm.task ? j->tm.task : "?",
        j->tm.id ? j->tm.id : "?", exc_type, message);
    fail_job(j, exc_type, exc_module, message, reason, 1);
}

static void on_msg(struct broker *b, struct broker_msg *m, void *privdata)
{
    struct worker *w = privdata;
    struct celery_raw_msg raw;
    struct cr_err err;
    struct job *j, *running;
    char buf[300];
    int rc;
    (void)b;

    if (m->no_ack) {
        pidbox_on_message(w->pidbox, m);
        return;
    }
    if (w->shutdown) {
        broker_reject(w->broker, m, 1);
        broker_msg_free(m);
        return;
    }
    j = job_new(w, m);
    if (!j) {
        LOG(LOG_ERROR, "out of memory receiving a message; requeueing it");
        broker_reject(w->broker, m, 1);
        broker_msg_free(m);
        return;
    }
    raw_of(&raw, m, m->headers);
    memset(&err, 0, sizeof(err));

    if (m->headers_bad) {
        /* The entries that did convert still name the task, so it gets its
         * FAILURE; the message is refused all the same. */
        celery_msg_decode(&raw, &j->tm, &err);
        rc = CR_EDECODE;
        cr_err_set(&err, rc, "bad AMQP headers: %s",
                   m->headers_err ? m->headers_err : "unknown error");
    } else {
        rc = celery_msg_decode(&raw, &j->tm, &err);
    }
    if (rc == 0 && m->body_len > (size_t)w->cfg->max_message_size) {
        rc = CR_ETOOBIG;
        cr_err_set(&err, rc, "message body of %zu bytes is over --max-message-size %d",
                   m->body_len, w->cfg->max_message_size);
    }
    if (rc) {
        const char *type = rc == CR_ECONTENT  ? "ContentDisallowed"
                           : rc == CR_ETOOBIG ? "MessageTooLarge"
                           : rc == CR_EPROTO  ? "InvalidTaskError"
                                              : "DecodeError";
        const char *module = rc == CR_ECONTENT  ? "kombu.exceptions"
                             : rc == CR_EDECODE ? "kombu.exceptions"
                             : rc == CR_EPROTO  ? "celery.exceptions"
                                                : EXC_MODULE;
        /* An id shared with a running job must not get a FAILURE over it. */
        if (j->tm.id && strmap_get(&w->jobs, j->tm.id)) {
            cr_free(j->tm.id);
            j->tm.id = NULL;
        }
        reject_bad(w, j, type, module, err.msg, "cannot decode");
        return;
    }
    j->kind = tasks_lookup(j->tm.task, w->cfg->aliases.items, w->cfg->aliases.n);
    running = strmap_get(&w->jobs, j->tm.id);
    if (running) {
        /* The same task again (a redelivery after a reconnect, or a duplicate
         * publish): ride on the job already under way. */
        LOG(LOG_INFO, "Task %s[%s] received again; joining the copy already under way",
            job_name(j), j->tm.id);
        j->msgs[0] = NULL;
        j->nmsgs = 0;
        if (job_attach(running, m)) {
            broker_reject(w->broker, m, 1);
            broker_msg_free(m);
        }
        job_free(j);
        return;
    }
    /* From here m belongs to j, whose decoded fields and kept headers say
     * everything the tree did (see headers_of()). */
    cJSON_Delete(m->headers);
    m->headers = NULL;
    /* The decoded copies of the message properties are never read here (m
     * has them, and republishing takes them from m): 4 allocations less per
     * task in flight. */
    cr_free(j->tm.content_type);
    cr_free(j->tm.content_encoding);
    cr_free(j->tm.correlation_id);
    cr_free(j->tm.reply_to);
    j->tm.content_type = j->tm.content_encoding = j->tm.correlation_id = j->tm.reply_to =
        NULL;
    if (j->kind == TASK_UNKNOWN) {
        LOG(LOG_ERROR, "Received unregistered task of type '%s'.", j->tm.task);
        snprintf(buf, sizeof(buf), "%s", j->tm.task);
        fail_job(j, "NotRegistered", "celery.exceptions", buf, "unregistered task", 1);
        return;
    }
    if (strmap_put(&w->jobs, j->tm.id, j)) {
        broker_reject(w->broker, m, 1);
        j->msgs[0] = NULL;
        j->nmsgs = 0;
        broker_msg_free(m);
        job_free(j);
        return;
    }
    j->in_map = 1;
    if (expired(j)) {
        revoke_expired(j);
        return;
    }
    if (worker_is_revoked(w, j->tm.id)) {
        revoke_job(j, "revoked", NULL);
        return;
    }
    LOG(LOG_INFO, "Task %s[%s] received", job_name(j), j->tm.id);
    notify_simple(j, TEV_RECEIVED);
    if (!seen_before(j, m)) {
        /* A first delivery has no outcome of ours stored: skip the read (a
         * Redis round trip and ~10% of the worker's CPU per trivial task). */
        check_job(j, "");
        return;
    }
    if (backend_get(w->backend, j->tm.id, on_meta, j)) {
        broker_reject(w->broker, m, 1);
        job_set_state(j, JOB_DONE);
        job_free(j);
        return;
    }
    j->pending++;
}

static void on_broker_conn(struct broker *b, int up, void *privdata)
{
    struct worker *w = privdata;
    (void)b;
    if (up)
        w->prefetch_sent = 0;
}

/* ------------------------------------------------------------------ cron */

static void on_cron(uv_timer_t *t)
{
    struct worker *w = t->data;
    int64_t now_us = now_epoch_us();
    int64_t now = (int64_t)uv_now(w->loop);
    struct job *j, *next;
    char msg[128];

    /* eta jobs whose time has come */
    for (j = w->eta_head; j; j = next) {
        next = j->next;
        if (j->tm.eta_us <= now_us) {
            list_unlink(&w->eta_head, NULL, j);
            w->neta--;
            sync_prefetch(w);
            ready_push(w, j);
        }
    }
    schedule(w);
    if (w->cfg->park_after > 0 && w->run_head)
        park_running(w, uv_now(w->loop));
    /* Time limits: the transfer is aborted at once; llm_req_abort defers
     * on_done, so the list is not changed under us. */
    for (j = w->run_head; j; j = j->rnext) {
        if (!j->req)
            continue;
        if (j->hard_deadline && now >= j->hard_deadline) {
            snprintf(msg, sizeof(msg), "%g", j->hard_limit_s);
            LOG(LOG_ERROR, "Hard time limit (%gs) exceeded for %s[%s]", j->hard_limit_s,
                job_name(j), j->tm.id);
            llm_req_abort(j->req, CR_ECANCELED, "TimeLimitExceeded", msg);
            j->req = NULL;
        } else if (j->soft_deadline && now >= j->soft_deadline) {
            snprintf(msg, sizeof(msg), "soft time limit (%gs) exceeded", j->soft_limit_s);
            LOG(LOG_WARNING, "Soft time limit (%gs) exceeded for %s[%s]", j->soft_limit_s,
                job_name(j), j->tm.id);
            llm_req_abort(j->req, CR_ECANCELED, "SoftTimeLimitExceeded", msg);
            j->req = NULL;
        }
    }
    if (w->shutdown == 1 && w->cfg->shutdown_timeout > 0 &&
        uv_now(w->loop) - w->shutdown_started >
            (uint64_t)(w->cfg->shutdown_timeout * 1000)) {
        LOG(LOG_WARNING, "worker: warm shutdown timed out after %.0fs; going cold",
            w->cfg->shutdown_timeout);
        start_shutdown(w, 1);
    }
}

/* --------------------------------------------------------------- control */

static void revoked_drop_expired(struct worker *w, int64_t now_s)
{
    while (w->revoked_head && (w->revoked_head->expires_epoch_s <= now_s ||
                               w->revoked.count > WORKER_REVOKES_MAX)) {
        struct revoked_id *r = w->revoked_head;
        w->revoked_head = r->next;
        if (!w->revoked_head)
            w->revoked_tail = NULL;
        if (strmap_get(&w->revoked, r->id) == r)
            strmap_del(&w->revoked, r->id);
        cr_free(r);
    }
}

void worker_remember_revoked(struct worker *w, const char *id, int64_t expires_epoch_s)
{
    size_t n = strlen(id);
    struct revoked_id *r, *old = strmap_get(&w->revoked, id);
    if (old) {
        if (expires_epoch_s > old->expires_epoch_s)
            old->expires_epoch_s = expires_epoch_s;
        return;
    }
    r = cr_malloc(sizeof(*r) + n + 1);
    if (!r)
        return;
    memcpy(r->id, id, n + 1);
    r->expires_epoch_s = expires_epoch_s;
    r->next = NULL;
    if (strmap_put(&w->revoked, r->id, r)) {
        cr_free(r);
        return;
    }
    /* Oldest first; an id given a later expiry keeps its place, which only
     * makes it leave a little early under the size bound. */
    if (w->revoked_tail)
        w->revoked_tail->next = r;
    else
        w->revoked_head = r;
    w->revoked_tail = r;
    revoked_drop_expired(w, now_epoch_us() / 1000000);
}

int worker_is_revoked(struct worker *w, const char *id)
{
    struct revoked_id *r;
    if (!w->revoked.count || !id)
        return 0;
    r = strmap_get(&w->revoked, id);
    return r && r->expires_epoch_s > now_epoch_us() / 1000000;
}

void worker_each_revoked(struct worker *w,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg)
{
    revoked_drop_expired(w, now_epoch_us() / 1000000);
    for (struct revoked_id *r = w->revoked_head; r; r = r->next)
        if (strmap_get(&w->revoked, r->id) == r)
            fn(r->id, r->expires_epoch_s, arg);
}

int worker_revoke(struct worker *w, const char *id, int terminate)
{
    struct job *j;
    worker_remember_revoked(w, id, now_epoch_us() / 1000000 + WORKER_REVOKE_EXPIRES_S);
    j = strmap_get(&w->jobs, id);
    if (!j)
        return 0;
    switch (j->state) {
    case JOB_READY:
        list_unlink(&w->ready_head, &w->ready_tail, j);
        w->nready--;
        revoke_job(j, "revoked", NULL);
        return 0;
    case JOB_ETA:
        list_unlink(&w->eta_head, NULL, j);
        w->neta--;
        revoke_job(j, "revoked", NULL);
        return 0;
    case JOB_RUNNING:
        if (!terminate || !j->req)
            return 0;
        LOG(LOG_INFO, "Terminating %s[%s]", job_name(j), j->tm.id);
        j->revoked = 1;
        /* on_done follows from the loop: see on_llm_done's revoked path. */
        llm_req_abort(j->req, CR_ECANCELED, "TaskRevokedError", "terminated");
        j->req = NULL;
        return 1;
    default:
        /* CHECKING: on_meta sees the revoked id; SETTLING/DONE: too late. */
        return 0;
    }
}

void worker_set_concurrency(struct worker *w, int n)
{
    if (n < 1)
        n = 1;
    if (n > CONFIG_MAX_CONCURRENCY)
        n = CONFIG_MAX_CONCURRENCY;
    w->concurrency = n;
    sync_prefetch(w);
    schedule(w);
}

int worker_knows_task(struct worker *w, const char *name)
{
    return tasks_lookup(name, w->cfg->aliases.items, w->cfg->aliases.n) != TASK_UNKNOWN;
}

static struct task_limits *limits_for(struct worker *w, const char *task)
{
    struct task_limits *tl = strmap_get(&w->task_limits, task);
    if (tl)
        return tl;
    tl = cr_calloc(1, sizeof(*tl));
    if (!tl)
        return NULL;
    if (strmap_put(&w->task_limits, task, tl)) {
        cr_free(tl);
        return NULL;
    }
    return tl;
}

int worker_set_rate_limit(struct worker *w, const char *task, const char *rate)
{
    struct task_limits *tl;
    double r;
    if (!worker_knows_task(w, task))
        return CR_ENOTFOUND;
    r = ratelimit_parse(rate);
    if (r < 0)
        return CR_EINVAL;
    tl = limits_for(w, task);
    if (!tl)
        return CR_ENOMEM;
    tl->has_rate = r > 0;
    snprintf(tl->rate_text, sizeof(tl->rate_text), "%s", r > 0 ? rate : "");
    token_bucket_init(&tl->bucket, r, (int64_t)uv_now(w->loop));
    schedule(w);
    return 0;
}

int worker_set_time_limit(struct worker *w, const char *task, double soft, double hard)
{
    struct task_limits *tl;
    if (!worker_knows_task(w, task))
        return CR_ENOTFOUND;
    tl = limits_for(w, task);
    if (!tl)
        return CR_ENOMEM;
    tl->soft = soft > 0 ? soft : 0;
    tl->hard = hard > 0 ? hard : 0;
    return 0;
}

void worker_request_shutdown(struct worker *w)
{
    start_shutdown(w, 0);
}

const char *worker_job_text(const struct job *j)
{
    return j->req ? llm_req_text(j->req, NULL) : "";
}

/* -------------------------------------------------------------- shutdown */

static void drop_list(struct worker *w, struct job **head, struct job **tail, size_t *n)
{
    while (*head) {
        struct job *j = *head;
        list_unlink(head, tail, j);
        (*n)--;
        for (int i = 0; i < j->nmsgs; i++)
            broker_reject(w->broker, j->msgs[i], 1);
        abandon_job(j);
    }
}

static void start_shutdown(struct worker *w, int cold)
{
    if (cold) {
        if (w->shutdown == 2)
            return;
        LOG(LOG_WARNING, "worker: Cold shutdown (MainProcess)");
        w->shutdown = 2;
        w->exit_code = 1;
        uv_stop(w->loop);
        return;
    }
    if (w->shutdown)
        return;
    LOG(LOG_WARNING, "worker: Warm shutdown (MainProcess)");
    w->shutdown = 1;
    w->shutdown_started = uv_now(w->loop);
    broker_stop_consuming(w->broker);
    /* Not started yet: back to the queue now, so other workers can take them. */
    drop_list(w, &w->ready_head, &w->ready_tail, &w->nready);
    drop_list(w, &w->eta_head, NULL, &w->neta);
    schedule(w);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct worker *w = s->data;
    (void)signum;
    start_shutdown(w, w->shutdown != 0);
}

/* ------------------------------------------------------------ lifecycle */

static char *join_url(const char *base, const char *path)
{
    struct buf b;
    size_t n = strlen(base);
    buf_init(&b);
    while (n && base[n - 1] == '/')
        n--;
    if (buf_append(&b, base, n) || buf_puts(&b, path)) {
        buf_release(&b);
        return NULL;
    }
    return buf_detach(&b);
}

/* One park queue per task queue: a fixed TTL (so expiry is in order) that
 * dead-letters back to the task queue through the default exchange. */
static int declare_park_queues(struct worker *w)
{
    for (int i = 0; i < w->cfg->queues.n; i++) {
        const char *q = w->cfg->queues.items[i];
        char name[300];
        cJSON *args = cJSON_CreateObject();
        struct broker_queue bq;
        int rc;
        snprintf(name, sizeof(name), PARK_PREFIX "%s", q);
        if (!args ||
            !cJSON_AddNumberToObject(args, "x-message-ttl",
                                     (double)(int64_t)(w->cfg->park_after * 1000)) ||
            !cJSON_AddStringToObject(args, "x-dead-letter-exchange", "") ||
            !cJSON_AddStringToObject(args, "x-dead-letter-routing-key", q)) {
            cJSON_Delete(args);
            return CR_ENOMEM;
        }
        memset(&bq, 0, sizeof(bq));
        bq.name = name;
        bq.durable = 1;
        bq.arguments = args;
        bq.no_consume = 1;
        rc = broker_add_consumer(w->broker, &bq);
        cJSON_Delete(args);
        if (rc)
            return rc;
    }
    return 0;
}

struct worker *worker_new(const struct config *cfg, uv_loop_t *loop, struct cr_err *err)
{
    struct worker *w = cr_calloc(1, sizeof(*w));
    struct llm_client_config lc;
    struct backend_config bc;
    struct rlimit rl;
    int rc;

    if (!w) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    w->cfg = cfg;
    w->loop = loop;
    w->concurrency = cfg->concurrency;
    w->seed = ((uint64_t)getpid() << 32) ^ (uint64_t)now_epoch_us();
    if (!w->seed)
        w->seed = 1;
    strmap_init(&w->jobs);
    strmap_init(&w->revoked);
    strmap_init(&w->task_limits);
    strmap_init(&w->totals);
    /* Thousands of provider connections need thousands of descriptors. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    w->chat_url = join_url(cfg->llm_base_url, "/chat/completions");
    w->embed_url = join_url(cfg->llm_base_url, "/embeddings");
    if (!w->chat_url || !w->embed_url)
        goto oom;

    memset(&lc, 0, sizeof(lc));
    lc.connect_timeout_s = cfg->llm_connect_timeout;
    lc.first_byte_timeout_s = cfg->llm_first_byte_timeout;
    lc.first_token_timeout_s = cfg->llm_first_token_timeout;
    lc.idle_timeout_s = cfg->llm_idle_timeout;
    lc.max_connections = cfg->llm_max_connections;
    lc.keep_connections = cfg->llm_keep_connections;
    redact_init(&w->secrets);
    if ((rc = config_secrets(cfg, &w->secrets)) != 0) {
        cr_err_set(err, rc, "cannot keep the configured secrets: %s", cr_strerror(rc));
        goto fail;
    }
    lc.secrets = &w->secrets;
    w->llm = llm_client_new(loop, &lc, err);
    if (!w->llm)
        goto fail;
    bc.url = cfg->result_backend;
    bc.result_expires = cfg->result_expires;
    bc.timeout = cfg->redis_timeout;
    bc.health_check_interval = cfg->redis_health_check_interval;
    w->backend = backend_new(loop, &bc, err);
    if (!w->backend)
        goto fail;
    w->bcfg.url = cfg->broker;
    w->bcfg.queues = cfg->queues.items;
    w->bcfg.nqueues = cfg->queues.n;
    w->bcfg.prefetch_count =
        worker_prefetch_count(cfg->concurrency, cfg->prefetch_multiplier, 0);
    w->bcfg.heartbeat = cfg->heartbeat;
    w->bcfg.connect_timeout = 5;
    w->bcfg.dlx = cfg->dead_letter_exchange[0] ? cfg->dead_letter_exchange : NULL;
    w->bcfg.dlq = cfg->dead_letter_queue[0] ? cfg->dead_letter_queue : NULL;
    w->bcfg.connection_name = cfg->hostname;
    w->broker = broker_new(loop, &w->bcfg, on_msg, on_broker_conn, w);
    if (!w->broker)
        goto oom;
    if (cfg->park_after > 0 && declare_park_queues(w))
        goto oom;
    uv_timer_init(loop, &w->cron);
    w->cron.data = w;
    uv_signal_init(loop, &w->sigterm);
    w->sigterm.data = w;
    uv_signal_init(loop, &w->sigint);
    w->sigint.data = w;
    return w;
oom:
    cr_err_set(err, CR_ENOMEM, "out of memory");
fail:
    llm_client_free(w->llm);
    backend_free(w->backend);
    cr_free(w->chat_url);
    cr_free(w->embed_url);
    redact_release(&w->secrets);
    cr_free(w);
    return NULL;
}

const char *worker_shown_url(const struct worker *w, const char *url, char *out,
                             size_t size)
{
    snprintf(out, size, "%s", url);
    redact_str(&w->secrets, out);
    return out;
}

static void banner(struct worker *w)
{
    const struct config *c = w->cfg;
    char broker[512], backend[512], llm[512];
    config_redact_url(c->broker, broker, sizeof(broker));
    config_redact_url(c->result_backend, backend, sizeof(backend));
    fprintf(stderr,
            "\n -------------- %s v%s (celeriac)\n"
            "--- ***** -----\n"
            "-- ******* ---- .> transport:   %s\n"
            "- *** --- * --- .> results:     %s\n"
            "- ** ---------- .> concurrency: %d (libuv, one thread)\n"
            "- ** ---------- .> llm:         %s (model %s)\n"
            "--- ***** ----- \n"
            " -------------- [queues]\n",
            c->hostname, CELERIAC_VERSION, broker, backend, c->concurrency,
            worker_shown_url(w, c->llm_base_url, llm, sizeof(llm)), c->llm_model);
    for (int i = 0; i < c->queues.n; i++)
        fprintf(stderr, "                .> %-16s exchange=%s(direct) key=%s\n",
                c->queues.items[i], c->queues.items[i], c->queues.items[i]);
    fprintf(stderr, "\n[tasks]\n");
    for (int i = 0; tasks_builtin_names[i]; i++)
        fprintf(stderr, "  . %s\n", tasks_builtin_names[i]);
    for (int i = 0; i < c->aliases.n; i++)
        fprintf(stderr, "  . %s\n", c->aliases.items[i]);
    fprintf(stderr, "\n");
}

int worker_start(struct worker *w, struct cr_err *err)
{
    banner(w);
    if (backend_wait_connected(w->backend, w->loop, 10000, err))
        return err->code;
    if (broker_connect(w->broker, err))
        return err->code;
    w->started_ms = uv_now(w->loop);
    w->started_epoch_us = now_epoch_us();
    w->events = events_new(w);
    w->pidbox = pidbox_new(w);
    w->progress = progress_new(w);
    w->metrics = metrics_new(w, err);
    if (!w->metrics && err->code)
        return err->code;
    uv_timer_start(&w->cron, on_cron, CRON_MS, CRON_MS);
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);
    /* Always printed, whatever the level: scripts wait for this line. */
    log_write(LOG_INFO, "%s ready.", w->cfg->hostname);
    return 0;
}

int worker_run(struct worker *w)
{
    uv_run(w->loop, UV_RUN_DEFAULT);
    return w->exit_code;
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

static void free_value_cb(const char *key, void *value, void *arg)
{
    (void)key;
    (void)arg;
    cr_free(value);
}

static void free_job_cb(const char *key, void *value, void *arg)
{
    struct job *j = value;
    (void)key;
    (void)arg;
    j->in_map = 0;
}

void worker_free(struct worker *w)
{
    if (!w)
        return;
    /* Order matters for a cold stop: the broker connection closes first, so
     * every unacked delivery is back in its queue before anything else. */
    w->shutdown = 2;
    /* worker-offline goes out while the connection is still up */
    events_free(w->events);
    pidbox_free(w->pidbox);
    metrics_free(w->metrics);
    progress_free(w->progress);
    broker_free(w->broker);
    llm_client_free(w->llm);
    backend_free(w->backend);
    strmap_each(&w->jobs, free_job_cb, NULL);
    strmap_release(&w->jobs);
    while (w->revoked_head) {
        struct revoked_id *r = w->revoked_head;
        w->revoked_head = r->next;
        cr_free(r);
    }
    strmap_release(&w->revoked);
    strmap_each(&w->task_limits, free_value_cb, NULL);
    strmap_release(&w->task_limits);
    strmap_each(&w->totals, free_value_cb, NULL);
    strmap_release(&w->totals);
    while (w->ready_head) {
        struct job *j = w->ready_head;
        list_unlink(&w->ready_head, &w->ready_tail, j);
        job_free(j);
    }
    while (w->eta_head) {
        struct job *j = w->eta_head;
        list_unlink(&w->eta_head, NULL, j);
        job_free(j);
    }
    uv_close((uv_handle_t *)&w->cron, on_closed);
    uv_close((uv_handle_t *)&w->sigterm, on_closed);
    uv_close((uv_handle_t *)&w->sigint, on_closed);
    /* Let every closed handle run its close callback. */
    uv_run(w->loop, UV_RUN_DEFAULT);
    cr_free(w->chat_url);
    cr_free(w->embed_url);
    redact_release(&w->secrets);
    cr_free(w);
}
