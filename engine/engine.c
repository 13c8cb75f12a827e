/* engine.c -- a job's life, from a delivery to its one settle.
 *
 * The way of one task (see docs/internals/worker.md):
 *   delivery -> decode -> registry -> [expired?] -> read_state (already done?)
 *   -> [eta: held on the tick, no slot] -> ready queue -> slot -> call_llm
 *   -> outcome: SUCCESS stored | retry published (confirmed) + RETRY stored |
 *      dead-lettered (confirmed) + FAILURE stored -> ack.
 * A job holds every delivery of its task id (a redelivery after a reconnect
 * attaches to the running job) and acks them all once its outcome is durable:
 * one settle per delivery, never before. No I/O: every effect goes out through
 * engine_ops, every completion comes back through an engine_on_*(). */
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "llm/policy.h"
#include "protocol/delayed.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/log.h"

const char *const job_state_names[] = {"CHECKING", "ETA",      "READY",
                                       "RUNNING",  "SETTLING", "DONE"};

static void store_then_ack(struct job *j);
static void queue_job(struct job *j);

/* ------------------------------------------------------------ entry, exit */

/* Every entry point starts with engine__enter() and ends with engine__leave(): the
 * outermost one schedules once and checks whether a warm shutdown is complete. */
void engine__enter(struct engine *e, struct engine_now now)
{
    if (e->depth++ == 0)
        e->now = now;
}

void engine__leave(struct engine *e)
{
    if (--e->depth > 0)
        return;
    e->depth++;
    /* A map started by this schedule queues its items behind the walk. */
    do {
        e->rescan = 0;
        engine__schedule(e);
    } while (e->rescan);
    e->depth--;
    if (e->shutdown == 1 && e->live == 0 && !e->stopped) {
        e->stopped = 1;
        e->ops->stop(e->ctx, 0);
    }
}

/* ------------------------------------------------------------------ jobs */

/* The one place a job's state changes. */
static void job_free(struct job *j)
{
    struct engine *e = j->e;
    if (j->fan)
        engine__fanout_forget(j);
    e->ops->forget(e->ctx, j);
    if (j->in_map && j->tm.id && strmap_get(&e->jobs, j->tm.id) == j)
        strmap_del(&e->jobs, j->tm.id);
    for (int i = 0; i < j->nmsgs; i++)
        e->ops->release(e->ctx, j->msgs[i]);
    cr_free(j->msgs);
    task_msg_release(&j->tm);
    cr_free(j->model);
    cr_free(j->meta);
    engine__free_failure(j);
    engine__followup_free(j);
    cr_free(j);
    e->live--;
}

/* One completion came back: the job is freed with the last one once done. */
static void job_release_ref(struct job *j)
{
    if (--j->pending == 0 && j->state == JOB_DONE)
        job_free(j);
}

/* Lets a job go without settling its deliveries: they stay unacked and come
 * back from the broker (requeued on close, redelivered elsewhere), so nothing
 * is lost. Freed now, or by the last pending completion. */
void engine__abandon(struct job *j)
{
    job_set_state(j, JOB_DONE);
    if (j->in_map) {
        strmap_del(&j->e->jobs, j->tm.id);
        j->in_map = 0;
    }
    if (j->pending == 0)
        job_free(j);
}

/* Whether j's message comes back to be run again if j lets go of it without
 * settling it: a delivery still unsettled (requeued when its connection
 * closes), or a parked copy whose lease names this worker. Not so with
 * --acks-early, whose deliveries were acked when the task started. */
static int job_comes_back(const struct job *j)
{
    if (j->leased)
        return 1;
    for (int i = 0; i < j->nmsgs; i++)
        if (!j->msgs[i]->settled)
            return 1;
    return 0;
}

static void settle_all(struct job *j, int ack, int requeue)
{
    struct engine *e = j->e;
    for (int i = 0; i < j->nmsgs; i++) {
        if (j->msgs[i]->settled)
            continue;
        if (ack)
            e->ops->ack(e->ctx, j->msgs[i]);
        else
            e->ops->reject(e->ctx, j->msgs[i], requeue);
    }
}

static struct job *job_new(struct engine *e, struct delivery *d)
{
    struct job *j = cr_calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->e = e;
    j->msgs = cr_malloc(sizeof(*j->msgs));
    if (!j->msgs) {
        cr_free(j);
        return NULL;
    }
    j->msgs[0] = d;
    j->nmsgs = 1;
    task_msg_init(&j->tm);
    j->t_received = e->now.loop_ms;
    j->received_epoch_us = e->now.epoch_us;
    j->state = JOB_CHECKING;
    e->live++;
    return j;
}

static int job_attach(struct job *j, struct delivery *d)
{
    struct delivery **p = cr_realloc(j->msgs, (size_t)(j->nmsgs + 1) * sizeof(*p));
    if (!p)
        return CR_ENOMEM;
    j->msgs = p;
    j->msgs[j->nmsgs++] = d;
    return 0;
}

static void notify(struct job *j, const struct task_event_info *info)
{
    j->e->ops->notify(j->e->ctx, j, info);
}

static void notify_simple(struct job *j, enum task_event_type type)
{
    struct task_event_info info;
    memset(&info, 0, sizeof(info));
    info.type = type;
    notify(j, &info);
}

static int revoked_now(struct engine *e, const char *id)
{
    return revoked_set_has(&e->revoked, id, e->now.epoch_us / 1000000);
}

int engine__job_revoked(struct job *j)
{
    const char *name = NULL;
    const cJSON *v = NULL;
    if (revoked_now(j->e, j->tm.id))
        return 1;
    if (!j->nmsgs || !revoked_stamps_match(&j->e->revoked_stamps,
                                           engine__headers_of(j, j->msgs[0]), &name, &v))
        return 0;
    if (cJSON_IsString(v))
        LOG(LOG_INFO, "%s[%s] revoked by header: %s=%s", job_name(j), j->tm.id, name,
            v->valuestring);
    else
        LOG(LOG_INFO, "%s[%s] revoked by header: %s", job_name(j), j->tm.id, name);
    return 1;
}

/* -------------------------------------------------------------- settling */

/* Acks every delivery of the job and lets it go. */
static void finish_job(struct job *j)
{
    struct engine *e = j->e;
    settle_all(j, 1, 0);
    if (j->leased) {
        e->ops->lease(e->ctx, j, ENGINE_LEASE_DEL, 0);
        j->leased = 0;
    }
    engine__abandon(j);
}

/* j's FAILURE meta with what its dead letter says added as the last key,
 * ENGINE_DEAD_LETTER_PENDING: a new string, or NULL on OOM. */
static char *pending_meta(struct job *j)
{
    const struct job_failure *f = engine__failure_of(j);
    size_t n = strlen(j->meta);
    cJSON *dl = cJSON_CreateObject();
    char *out = NULL;
    struct buf b;

    buf_init(&b);
    if (n >= 2 && j->meta[n - 1] == '}' && dl &&
        cJSON_AddStringToObject(dl, "reason", f->reason) &&
        cJSON_AddStringToObject(dl, "exc_type", f->exc_type) &&
        cJSON_AddStringToObject(dl, "exc_message", f->exc_message) &&
        cJSON_AddNumberToObject(dl, "http_status", (double)j->http_status) &&
        buf_append(&b, j->meta, n - 1) == 0 &&
        buf_puts(&b, ", \"" ENGINE_DEAD_LETTER_PENDING "\": ") == 0 &&
        py_json_dumps(dl, &b) == 0 && buf_putc(&b, '}') == 0)
        out = buf_detach(&b);
    buf_release(&b);
    cJSON_Delete(dl);
    return out;
}

/* The broker did not take a final failure's dead letter, and the message
 * comes back: the outcome is known, and calling the provider again for it
 * could pay for a second answer to fail the same way. So the FAILURE is
 * stored now, marked with the dead letter still to send, and the redelivery
 * that finds it sends the dead letter and acks without running the task
 * (resume_dead_letter()). Not for a job with a canvas plan (its errbacks,
 * chain failures and part-returns follow the dead letter) nor one without a
 * meta to store (ignore_result): those run again, as before. 0 when the
 * store is under way; j stays in the jobs map meanwhile, so a redelivery that
 * comes before the store is answered joins j (see on_pending_stored()). */
static int store_pending_failure(struct job *j)
{
    struct engine *e = j->e;
    char *meta;

    if (j->dl_pending || j->fu || !j->meta || !j->tm.id || !j->in_map)
        return -1;
    if (!(meta = pending_meta(j)) ||
        e->ops->store(e->ctx, j, meta, strlen(meta), ENGINE_STORE_FINAL,
                      j->tm.retries - j->retried))
        return -1;
    j->pending++;
    j->dl_pending = 1;
    LOG(LOG_WARNING,
        "Task %s[%s] stores its FAILURE with the dead letter pending: its redelivery "
        "dead-letters it without running it",
        job_name(j), j->tm.id);
    return 0;
}

/* The FAILURE with its dead letter pending is stored. A redelivery that came
 * meanwhile joined j on the live connection: the dead letter goes again now,
 * for it. Else j lets go, and the redelivery will find the FAILURE. */
static void on_pending_stored(struct job *j)
{
    j->dl_pending = 2;
    if (engine__job_live(j))
        engine__settle_resume(j);
    else
        engine__abandon(j);
}

/* A dead letter the broker did not take. While the delivery comes back (see
 * job_comes_back()) the job ends unacked, and stores its FAILURE with the
 * dead letter pending where it can (store_pending_failure()); where it cannot,
 * nothing is stored, and the redelivery runs the task again and dead-letters
 * it then. A delivery acked early does not come back: its FAILURE is stored
 * all the same, without the dead letter. */
static void dead_letter_failed(struct job *j)
{
    if (job_comes_back(j)) {
        if (store_pending_failure(j) != 0)
            engine__abandon(j);
        return;
    }
    LOG(LOG_ERROR,
        "Task %s[%s] was acked early: storing its FAILURE without a dead letter",
        job_name(j), j->tm.id ? j->tm.id : "?");
    store_then_ack(j);
}

/* Asks the switchboard to publish o, confirmed; the confirm comes back to
 * engine_on_confirm() with p. 0, or the error (nothing will come back). */
static int publish(struct job *j, const struct outbound *o, enum publish_kind kind,
                   struct delivery *d, int release_job)
{
    struct engine *e = j->e;
    struct engine_publish *p = cr_calloc(1, sizeof(*p));
    int rc;
    if (!p)
        return CR_ENOMEM;
    p->j = j;
    p->kind = kind;
    p->d = d;
    p->release_job = release_job;
    rc = e->ops->publish(e->ctx, o, p);
    if (rc) {
        cr_free(p);
        return rc;
    }
    j->pending++;
    return 0;
}

static void dead_letter(struct job *j)
{
    struct engine *e = j->e;
    struct delivery *d = j->msgs[0];
    struct outbound o;
    cJSON *h;
    int rc;

    h = engine__dead_letter_headers(j);
    engine__outbound_of(&o, d, h);
    o.exchange = e->cfg->dead_letter_exchange;
    o.routing_key = d->queue ? d->queue : "";
    rc = publish(j, &o, PUBLISH_DEAD_LETTER, NULL, 0);
    cJSON_Delete(h);
    if (rc) {
        LOG(LOG_ERROR, "Task %s[%s] cannot be dead-lettered now (%s); leaving it unacked",
            job_name(j), j->tm.id ? j->tm.id : "?", cr_strerror(rc));
        dead_letter_failed(j);
        return;
    }
    LOG(LOG_WARNING, "Task %s[%s] dead-lettered to %s: %s: %s", job_name(j),
        j->tm.id ? j->tm.id : "?", e->cfg->dead_letter_exchange,
        engine__failure_of(j)->exc_type, engine__failure_of(j)->exc_message);
}

/* Hands j->meta to the switchboard to store (it is the store's from here). */
static int store_meta(struct job *j)
{
    char *meta = j->meta;
    j->meta = NULL;
    /* A RETRY's attempt is the one before its published retry's. */
    return j->e->ops->store(j->e->ctx, j, meta, strlen(meta), ENGINE_STORE_FINAL,
                            j->tm.retries - j->retried);
}

/* Stores j's outcome, if it has one to store, then acks. */
static void store_then_ack(struct job *j)
{
    if (j->fu) {
        engine__followup_store(j);
        return;
    }
    if (!j->meta || !j->tm.id) {
        finish_job(j);
        return;
    }
    if (store_meta(j)) {
        LOG(LOG_ERROR, "Task %s[%s] cannot queue its result: out of memory", job_name(j),
            j->tm.id);
        engine__abandon(j);
        return;
    }
    j->pending++;
}

/* For followup.c (see engine_int.h). */
void engine__finish(struct job *j)
{
    finish_job(j);
}

void engine__unref(struct job *j)
{
    if (j->state == JOB_DONE && j->pending == 0)
        job_free(j);
}

int engine__publish(struct job *j, const struct outbound *o, enum publish_kind kind)
{
    return publish(j, o, kind, NULL, 0);
}

int engine__store_final(struct job *j)
{
    int rc = store_meta(j);
    if (rc == 0)
        j->pending++;
    return rc;
}

int engine__comes_back(const struct job *j)
{
    return job_comes_back(j);
}

/* Makes the outcome durable, then acks. A failure's dead letter goes first and
 * its FAILURE is stored only once the broker confirmed it, because a stored
 * FAILURE is what makes a redelivery ack without running (check_job()): were
 * it stored first, a connection lost before the confirm would leave a
 * redelivery that finds FAILURE, is acked, and loses the dead letter. Sending
 * the dead letter again on every redelivery that finds FAILURE instead would
 * duplicate it every time only the ack was lost. In this order a stored
 * FAILURE means the dead letter is in, unless it carries the pending mark of
 * a dead letter the broker did not take (dead_letter_failed()), which its
 * redelivery sends; only a crash between the confirm and the store sends a
 * second one (at least once, as every publish here). */
void engine__settle(struct job *j)
{
    job_set_state(j, JOB_SETTLING);
    /* A canvas plan's messages (callbacks, chain, errbacks) go first, for the
     * same reason: a stored outcome means they are in (engine/followup.c). */
    if (engine__followup_publish(j))
        return;
    engine__settle_resume(j);
}

void engine__settle_resume(struct job *j)
{
    const char *dlx = j->e->cfg->dead_letter_exchange;
    if (j->dead_letter && dlx && dlx[0])
        dead_letter(j);
    else
        store_then_ack(j);
}

/* A final failure: the message dead-lettered and FAILURE stored (unless ignored). */
void engine__fail(struct job *j, const char *exc_type, const char *exc_module,
                  const char *message, const char *reason, int dead_letter,
                  const struct llm_result *llm)
{
    struct engine *e = j->e;
    struct task_event_info info;
    memset(&info, 0, sizeof(info));
    info.type = TEV_FAILED;
    info.exc_type = exc_type;
    info.exc_message = message;
    info.llm = llm;
    info.runtime_s = j->t_started ? (double)(e->now.loop_ms - j->t_started) / 1000.0 : 0;
    if (j->tm.id)
        notify(j, &info);
    if (dead_letter)
        notify_simple(j, TEV_DEAD_LETTERED);
    engine__set_failure(j, exc_type, message, reason);
    j->dead_letter = dead_letter;
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.id && j->tm.ignore_result != 1) {
        j->meta = engine__exc_meta(j, "FAILURE", exc_type, exc_module, message, 1);
        if (!j->meta)
            LOG(LOG_ERROR, "Task %s[%s]: out of memory for its FAILURE", job_name(j),
                j->tm.id);
    }
    /* A message that never ran as a task (undecodable, unregistered) gets no
     * errbacks and no chord part-return, as in Celery. */
    if (j->tm.id && j->kind != TASK_UNKNOWN)
        engine__followup_failure(j, exc_type, exc_module, message);
    engine__settle(j);
}

static void fail_job(struct job *j, const char *exc_type, const char *exc_module,
                     const char *message, const char *reason, int dead_letter)
{
    engine__fail(j, exc_type, exc_module, message, reason, dead_letter, NULL);
}

/* Settles a job as REVOKED: reason "expired", "revoked" or "terminated". */
void engine__revoke_job(struct job *j, const char *reason, const char *partial)
{
    struct task_event_info info;
    cJSON *exc;
    LOG(LOG_INFO, "Discarding revoked task: %s[%s] (%s)", job_name(j), j->tm.id, reason);
    memset(&info, 0, sizeof(info));
    info.type = TEV_REVOKED;
    info.expired = !strcmp(reason, "expired");
    info.terminated = !strcmp(reason, "terminated");
    info.partial_text = partial;
    notify(j, &info);
    cr_free(j->meta);
    j->meta = NULL;
    exc = result_exc_new("TaskRevokedError", "celery.exceptions", reason);
    /* Extra keys are ignored by Celery's exception decoding, so the text
     * produced before a terminate can travel with the REVOKED state. */
    if (exc && partial)
        cJSON_AddStringToObject(exc, "partial", partial);
    if (j->tm.ignore_result != 1)
        j->meta = exc ? engine_job_meta(j, "REVOKED", exc, NULL, 1) : NULL;
    engine__followup_revoked(j, exc);
    cJSON_Delete(exc);
    engine__settle(j);
}

static int expired(const struct job *j)
{
    return j->tm.expires_us >= 0 && j->e->now.epoch_us > j->tm.expires_us;
}

/* Settles j as REVOKED when it expired or was revoked meanwhile; checked on
 * receipt and again right before its call starts. 1 when it did. */
static int revoke_if_due(struct job *j)
{
    if (expired(j)) {
        engine__revoke_job(j, "expired", NULL);
        return 1;
    }
    if (engine__job_revoked(j)) {
        engine__revoke_job(j, "revoked", NULL);
        return 1;
    }
    return 0;
}

/* --------------------------------------------------------------- success */

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

static void succeed(struct job *j, cJSON *result, const struct llm_result *llm);

void engine__succeed(struct job *j, cJSON *result)
{
    succeed(j, result, NULL);
}

static void succeed(struct job *j, cJSON *result, const struct llm_result *llm)
{
    double runtime = (double)(j->e->now.loop_ms - j->t_started) / 1000.0;
    struct task_event_info info;
    log_success(j, result, runtime);
    memset(&info, 0, sizeof(info));
    info.type = TEV_SUCCEEDED;
    info.result = result;
    info.runtime_s = runtime;
    info.llm = llm;
    notify(j, &info);
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.ignore_result != 1) {
        j->meta = engine_job_meta(j, "SUCCESS", result, NULL, 1);
        if (!j->meta) {
            cJSON_Delete(result);
            fail_job(j, "MemoryError", "builtins", "out of memory encoding the result",
                     "internal", 0);
            return;
        }
    }
    /* Callbacks and the chain's next step, even for an ignore_result task. */
    if (engine__followup_success(j, result)) {
        cJSON_Delete(result);
        return;
    }
    cJSON_Delete(result);
    engine__settle(j);
}

/* --------------------------------------------------------------- retries */

/* Publishes the task again with retries + 1 and an eta, as Task.retry does. */
static int retry_job(struct job *j, int64_t delay_ms)
{
    struct engine *e = j->e;
    struct outbound o;
    struct buf body;
    cJSON *headers = NULL;
    int rc;

    buf_init(&body);
    rc = engine__retry_message(j, delay_ms, &o, &body, &headers);
    if (rc) {
        buf_release(&body);
        return rc;
    }
    rc = publish(j, &o, PUBLISH_RETRY, NULL, 0);
    buf_release(&body);
    cJSON_Delete(headers);
    if (rc) {
        j->tm.retries--;
        return rc;
    }
    j->retried = 1;
    /* The republished message is the task's next attempt: it often arrives
     * before RETRY is stored, and must not join this settling job. */
    if (j->in_map) {
        strmap_del(&e->jobs, j->tm.id);
        j->in_map = 0;
    }
    return 0;
}

/* A retryable failure within the retry budget: 0 when the retry is under way
 * or the job was let go, -1 when it must fail instead. */
static int try_retry(struct job *j, const struct llm_result *res)
{
    const struct engine_config *cfg = j->e->cfg;
    struct llm_backoff bo = {(int64_t)(cfg->retry_backoff * 1000),
                             cfg->retry_backoff_factor,
                             (int64_t)(cfg->retry_backoff_max * 1000), cfg->retry_jitter};
    int64_t delay = res->retry_after_ms >= 0
                        ? res->retry_after_ms
                        : llm_backoff_ms(&bo, j->tm.retries, &j->e->seed);
    struct task_event_info info;
    char msg[700];
    int rc;

    snprintf(msg, sizeof(msg), "Retry in %.3fs: %s('%s')", (double)delay / 1000.0,
             res->exc_type, res->message);
    cr_free(j->meta);
    j->meta = NULL;
    if (j->tm.ignore_result != 1)
        j->meta = engine__exc_meta(j, "RETRY", res->exc_type, ENGINE_EXC_MODULE,
                                   res->message, 0);
    job_set_state(j, JOB_SETTLING);
    rc = retry_job(j, delay);
    if (rc == 0) {
        LOG(LOG_INFO, "Task %s[%s] retry: %s", job_name(j), j->tm.id, msg);
        memset(&info, 0, sizeof(info));
        info.type = TEV_RETRIED;
        info.exc_type = res->exc_type;
        info.exc_message = res->message;
        info.llm = res;
        info.retry_delay_ms = delay;
        notify(j, &info);
        return 0;
    }
    if (rc == CR_EBROKER && job_comes_back(j)) {
        /* The broker is away: a failure now would be for its sake, not the
         * task's. As when the confirm fails, nothing is stored and the
         * delivery stays unacked: the broker requeues it with the lost
         * connection, and the redelivery runs the task again, which is the
         * attempt the retry was for. */
        LOG(LOG_ERROR,
            "Task %s[%s] cannot publish its retry now (broker away); the message "
            "will be redelivered",
            job_name(j), j->tm.id);
        engine__abandon(j);
        return 0;
    }
    LOG(LOG_ERROR, "Task %s[%s] cannot publish its retry; failing it", job_name(j),
        j->tm.id);
    return -1;
}

static int start_call(struct job *j);

/* A failed call of a job (not a map item): retried when it may be, else
 * failed. */
static void handle_llm_failure(struct engine *e, struct job *j,
                               const struct llm_result *res)
{
    j->http_status = res->http_status;
    if (res->verdict != LLM_RETRYABLE ||
        (e->cfg->max_retries >= 0 && j->tm.retries >= e->cfg->max_retries) ||
        try_retry(j, res) != 0) {
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
            res->exc_type, res->message);
        engine__fail(j, res->exc_type,
                     !strncmp(res->exc_type, "SoftTimeLimit", 13) ||
                             !strncmp(res->exc_type, "TimeLimit", 9)
                         ? "billiard.exceptions"
                         : ENGINE_EXC_MODULE,
                     res->message,
                     res->verdict == LLM_RETRYABLE ? "retries exhausted"
                                                   : "permanent failure",
                     1, res);
    }
}

/* Whether a chat answer's text is one JSON value (what response_format
 * json_schema / json_object promise). */
static int answer_is_json(const struct llm_result *res)
{
    cJSON *v =
        res->text ? chat_json_parse(res->text, res->text_len, 0, "answer", NULL) : NULL;
    int ok = v != NULL;
    cJSON_Delete(v);
    return ok;
}

/* A retryable failure of a call whose model has another provider: the same
 * attempt goes on there at once, with the slot, the time limits and the
 * retry count it had. Text already streamed is void; the progress stream
 * closes that run (a new attempt epoch follows). Returns 0 when the call
 * went on (or j was failed starting it), -1 when it is not a case for it. */
static int fall_back(struct job *j, const struct llm_result *res)
{
    struct engine *e = j->e;

    if (res->verdict != LLM_RETRYABLE || !res->fallback_left || j->revoked ||
        e->shutdown || j->state != JOB_RUNNING)
        return -1;
    if (engine__fanout_is_item(j))
        return engine__fanout_fall_back(j, res);
    j->call = NULL;
    j->pending--;
    LOG(LOG_WARNING, "Task %s[%s] %s failed: %s('%s'); trying the next provider",
        job_name(j), j->tm.id,
        res->provider && res->provider[0] ? res->provider : "default", res->exc_type,
        res->message);
    if (res->text_len) {
        struct task_event_info info;
        memset(&info, 0, sizeof(info));
        info.type = TEV_FALLBACK;
        info.exc_type = res->exc_type;
        info.exc_message = res->message;
        info.llm = res;
        notify(j, &info);
    }
    j->route_step++;
    start_call(j);
    return 0;
}

void engine_on_llm_done(struct engine *e, struct engine_now now, struct job *j,
                        const struct llm_result *res)
{
    engine__enter(e, now);
    if (fall_back(j, res) == 0) {
        engine__leave(e);
        return;
    }
    engine__release_slot(j);
    j->call = NULL;
    j->pending--;
    if (res->verdict == LLM_OK && j->json_answer && !j->revoked && !e->shutdown &&
        !engine__fanout_is_item(j) && !answer_is_json(res)) {
        /* Asked for JSON (response_format), the answer is not: the same
         * request is likely to give the same answer, so it is not retried
         * unless the task says so. */
        struct llm_result bad = *res;
        bad.verdict = j->json_answer == 2 ? LLM_RETRYABLE : LLM_PERMANENT;
        bad.code = CR_ELLM;
        bad.exc_type = "ValueError";
        bad.message = "the answer is not the JSON its response_format asked for";
        res = &bad;
        handle_llm_failure(e, j, res);
        engine__leave(e);
        return;
    }
    if (engine__fanout_is_item(j)) {
        engine__fanout_item_done(j, res);
    } else if (e->shutdown == 2) {
        /* Cold shutdown: the delivery goes back to the queue untouched. */
        engine__abandon(j);
    } else if (j->revoked) {
        engine__revoke_job(j, "terminated",
                           res->text && res->text_len ? res->text : NULL);
    } else if (res->verdict == LLM_OK) {
        cJSON *result = tasks_result(j->kind, (struct llm_result *)res);
        if (!result)
            fail_job(j, "MemoryError", "builtins", "out of memory building the result",
                     "internal", 0);
        else
            succeed(j, result, res);
    } else {
        handle_llm_failure(e, j, res);
    }
    engine__leave(e);
}

/* ------------------------------------------------------------- completions */

void engine_on_stored(struct engine *e, struct engine_now now, struct job *j,
                      enum engine_store_kind kind, int status, int skipped)
{
    engine__enter(e, now);
    if (kind == ENGINE_STORE_STARTED || j->state == JOB_DONE) {
        /* (a job let go while several of its stores were out) */
        job_release_ref(j);
    } else if (status) {
        /* The store went away (cold shutdown): the delivery goes back. */
        job_set_state(j, JOB_DONE);
        job_release_ref(j);
    } else if (kind == ENGINE_STORE_FINAL && j->dl_pending == 1) {
        j->pending--;
        on_pending_stored(j);
    } else {
        j->pending--;
        if (skipped && kind == ENGINE_STORE_FINAL)
            LOG(LOG_INFO,
                "Task %s[%s] already has a final state or a later attempt's stored; "
                "not overwriting it",
                job_name(j), j->tm.id);
        if (j->fu)
            engine__followup_stored(j);
        else
            finish_job(j);
    }
    engine__leave(e);
}

static void on_retry_confirm(struct job *j, int ok)
{
    if (!ok) {
        /* The retry message may not exist: leave the original unacked so it
         * comes back, rather than lose the task. */
        LOG(LOG_ERROR,
            "Task %s[%s] retry publish not confirmed; the message will be "
            "redelivered",
            job_name(j), j->tm.id);
        engine__abandon(j);
        return;
    }
    if (!j->meta || store_meta(j)) {
        finish_job(j);
        return;
    }
    j->pending++;
}

static void on_dead_letter_confirm(struct job *j, int ok)
{
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

static void on_park_confirm(struct engine_publish *p, int ok)
{
    struct job *j = p->j;
    struct engine *e = j->e;
    p->d->flags &= ~DELIVERY_F_PARKING;
    if (ok) {
        if (!p->d->settled)
            e->ops->ack(e->ctx, p->d);
        LOG(LOG_DEBUG, "Task %s[%s] parked", job_name(j), j->tm.id);
    }
    if (p->release_job) {
        /* The job ends with its delivery parked; on a nack the delivery stays
         * unacked and is simply held here. */
        if (ok)
            engine__abandon(j);
        else
            engine__eta_push(e, j);
    } else if (j->state == JOB_DONE && j->pending == 0) {
        job_free(j);
    }
}

void engine_on_confirm(struct engine *e, struct engine_now now, struct engine_publish *p,
                       int ok)
{
    engine__enter(e, now);
    p->j->pending--;
    switch (p->kind) {
    case PUBLISH_RETRY:
        on_retry_confirm(p->j, ok);
        break;
    case PUBLISH_DEAD_LETTER:
        on_dead_letter_confirm(p->j, ok);
        break;
    case PUBLISH_PARK:
        on_park_confirm(p, ok);
        break;
    case PUBLISH_FOLLOWUP:
        engine__followup_confirmed(p->j, ok);
        break;
    }
    cr_free(p);
    engine__leave(e);
}

/* --------------------------------------------------------------- parking */

/* The broker closes a channel whose delivery stays unacked longer than its
 * consumer_timeout (30 min by default on RabbitMQ), which a long eta or a long
 * generation can exceed. Such a delivery is "parked" instead: a copy goes to
 * celeriac.park.<queue>, a durable queue whose fixed message TTL dead-letters
 * it back to <queue>, and once the broker confirms the copy the original is
 * acked. An eta task simply comes back later (held again or parked again). A
 * running task keeps running; its copy carries x-celeriac-parked and a lease
 * names the worker running it, so the copy is parked again while that worker
 * lives, joins the job if it comes back here, and runs elsewhere only if the
 * lease lapsed (the worker died): nothing is lost, nothing runs twice while
 * its runner is alive. */

static int park_queue_name(const struct engine *e, const char *queue, char *out,
                           size_t size)
{
    for (int i = 0; i < e->cfg->nqueues; i++)
        if (queue && !strcmp(e->cfg->queues[i], queue))
            return snprintf(out, size, ENGINE_PARK_PREFIX "%s", queue) < (int)size;
    return 0; /* a queue added at run time has no park queue: never park it */
}

/* Publishes a copy of d to its park queue. Returns 0 when the copy is on its way. */
int engine__park(struct job *j, struct delivery *d, int release_job, int mark_running)
{
    struct engine *e = j->e;
    struct outbound o;
    char queue[300];
    cJSON *h;
    int rc;

    if (!(d->caps & MSG_CAP_PARK) ||
        !park_queue_name(e, d->queue, queue, sizeof(queue)) ||
        (d->flags & DELIVERY_F_PARKING))
        return CR_EINVAL;
    h = engine__headers_copy(j, d);
    if (!h)
        return CR_ENOMEM;
    cJSON_DeleteItemFromObjectCaseSensitive(h, "x-celeriac-parked");
    cJSON_DeleteItemFromObjectCaseSensitive(h, "x-delivery-count");
    engine__stamp_first_received(j, h);
    if (mark_running)
        cJSON_AddStringToObject(h, "x-celeriac-parked", e->cfg->hostname);
    engine__outbound_of(&o, d, h);
    o.exchange = "";
    o.routing_key = queue;
    rc = publish(j, &o, PUBLISH_PARK, d, release_job);
    cJSON_Delete(h);
    if (rc)
        return rc;
    d->flags |= DELIVERY_F_PARKING;
    return 0;
}

/* ------------------------------------------------------- delayed delivery */

/* An eta past the horizon on a transport with native delayed delivery: a copy
 * goes to celery_delayed_27 with the routing key that spells the delay and the
 * queue it came from, exactly as a Celery 5.5+ producer sends a countdown; the
 * original is acked once the broker confirms the copy (the PUBLISH_PARK path),
 * and the job lets go. On a nack the delivery is held here instead. The copy
 * comes back through celery_delayed_delivery, bound to the queue by
 * "#.<queue>" (the fraction of a second cut from the delay is held then). */
static int delay_eta_job(struct job *j)
{
    struct engine *e = j->e;
    struct delivery *d = j->nmsgs == 1 ? j->msgs[0] : NULL;
    char key[400];
    struct outbound o;
    uint64_t s;
    double horizon;
    cJSON *h;
    int known = 0, rc;

    if (!d || !(d->caps & MSG_CAP_DELAYED) || !d->queue ||
        (d->flags & DELIVERY_F_PARKING))
        return -1;
    /* Only the start-up queues are bound to celery_delayed_delivery. */
    for (int i = 0; i < e->cfg->nqueues; i++)
        known |= !strcmp(e->cfg->queues[i], d->queue);
    /* A held eta task takes a slot of the window. Where the window grows for
     * each (global QoS) a near eta is held; where it cannot (per-consumer
     * QoS: quorum queues, RabbitMQ 4.3) every eta a second or more away goes
     * through the broker, or a few held tasks would starve ready ones until
     * their eta (a -c 1 worker holding one task for 3 s serves nothing). */
    horizon = (d->caps & MSG_CAP_PREFETCH) ? e->cfg->delayed_horizon_s : 0;
    s = known ? delayed_delay_s(j->tm.eta_us, e->now.epoch_us, horizon) : 0;
    if (s == 0 || delayed_routing_key(s, d->queue, key, sizeof(key)) < 0)
        return -1;
    h = engine__headers_copy(j, d);
    if (!h)
        return -1;
    /* A count of this delivery's queue, not of the copy's. */
    cJSON_DeleteItemFromObjectCaseSensitive(h, "x-delivery-count");
    engine__stamp_first_received(j, h);
    engine__outbound_of(&o, d, h);
    o.exchange = DELAYED_ENTRY_EXCHANGE;
    o.routing_key = key;
    rc = publish(j, &o, PUBLISH_PARK, d, 1);
    cJSON_Delete(h);
    if (rc)
        return -1;
    d->flags |= DELIVERY_F_PARKING;
    LOG(LOG_INFO, "Task %s[%s] sent through delayed delivery for %llu s (eta %s)",
        job_name(j), j->tm.id, (unsigned long long)s, j->tm.eta ? j->tm.eta : "?");
    job_set_state(j, JOB_SETTLING);
    return 0;
}

int engine_delivery_limit_reached(long delivery_count, int limit)
{
    return limit > 0 && delivery_count >= 0 && delivery_count >= (long)limit - 1;
}

/* x-delivery-count of j's first delivery, or -1. */
static long delivery_count(const struct job *j)
{
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(engine__headers_of(j, j->msgs[0]),
                                                      "x-delivery-count");
    if (!cJSON_IsNumber(c) || c->valuedouble < 0)
        return -1;
    return c->valuedouble > 1e9 ? 1000000000L : (long)c->valuedouble;
}

/* An eta too far away to hold: park the delivery, then let the job go. */
static int park_eta_job(struct job *j)
{
    if (j->nmsgs != 1 || engine__park(j, j->msgs[0], 1, 0))
        return -1;
    LOG(LOG_INFO, "Task %s[%s] parked until closer to its eta (%s)", job_name(j),
        j->tm.id, j->tm.eta ? j->tm.eta : "?");
    job_set_state(j, JOB_SETTLING);
    return 0;
}

void engine_on_lease(struct engine *e, struct engine_now now, struct job *j, int status,
                     const char *holder)
{
    engine__enter(e, now);
    j->pending--;
    if (status || e->shutdown) {
        if (!status)
            settle_all(j, 0, 1);
        engine__abandon(j);
    } else if (holder && strcmp(holder, e->cfg->hostname) != 0 && j->nmsgs == 1 &&
               engine__park(j, j->msgs[0], 1, 1) == 0) {
        /* Its runner is alive elsewhere: back to the park queue. */
        job_set_state(j, JOB_SETTLING);
    } else {
        queue_job(j);
    }
    engine__leave(e);
}

/* --------------------------------------------------------------- running */

static double effective_limit(double header, double dflt)
{
    return header > 0 ? header : dflt;
}

/* Takes a slot and sets the job's limits, counts and deadlines. */
static void take_slot(struct job *j)
{
    struct engine *e = j->e;
    /* header, else the time_limit control command, else the options */
    struct task_limits *tl = engine__limits(e, j->tm.task, 0);
    double hard = tl && tl->hard > 0 ? tl->hard : e->cfg->time_limit;
    double soft = tl && tl->soft > 0 ? tl->soft : e->cfg->soft_time_limit;
    unsigned long *total = strmap_get(&e->totals, j->tm.task);

    engine__run_push(e, j);
    e->processed++;
    j->t_started = e->now.loop_ms;
    j->hard_limit_s = effective_limit(j->tm.time_limit_hard, hard);
    j->soft_limit_s = effective_limit(j->tm.time_limit_soft, soft);
    if (!total && (total = cr_calloc(1, sizeof(*total))) &&
        strmap_put(&e->totals, j->tm.task, total)) {
        cr_free(total);
        total = NULL;
    }
    if (total)
        (*total)++;
    j->hard_deadline = j->hard_limit_s > 0
                           ? (int64_t)j->t_started + (int64_t)(j->hard_limit_s * 1000)
                           : 0;
    j->soft_deadline = j->soft_limit_s > 0
                           ? (int64_t)j->t_started + (int64_t)(j->soft_limit_s * 1000)
                           : 0;
}

static void store_started(struct job *j)
{
    struct engine *e = j->e;
    cJSON *info = cJSON_CreateObject();
    char *meta;
    cJSON_AddNumberToObject(info, "pid", (double)e->cfg->pid);
    cJSON_AddStringToObject(info, "hostname", e->cfg->hostname);
    meta = engine_job_meta(j, "STARTED", info, NULL, 0);
    cJSON_Delete(info);
    /* The store answers in order, so STARTED always lands before the final
     * state; the ack does not wait for it. */
    if (meta && e->ops->store(e->ctx, j, meta, strlen(meta), ENGINE_STORE_STARTED,
                              j->tm.retries) == 0)
        j->pending++;
}

static void run_accumulate(struct job *j)
{
    struct task_error te;
    cJSON *res;
    memset(&te, 0, sizeof(te));
    res = tasks_accumulate(&j->tm, &te);
    engine__release_slot(j);
    if (res) {
        succeed(j, res, NULL);
        return;
    }
    LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
        te.exc_type[0] ? te.exc_type : "MemoryError", te.message);
    fail_job(j, te.exc_type[0] ? te.exc_type : "MemoryError", "builtins", te.message,
             "task raised", 1);
}

/* Builds j's LLM call for its current route step and starts it (j holds a
 * slot). Returns 0: the call is in flight, counted in pending; else j was
 * failed here, its slot given back (arguments that make no call, a provider
 * that cannot express the request, out of memory). */
static int start_call(struct job *j)
{
    struct engine *e = j->e;
    struct task_call call;
    struct task_error te;
    struct cr_err err;
    int rc;

    memset(&te, 0, sizeof(te));
    rc = engine_job_args(j);
    if (rc == 0)
        rc = tasks_build_call(j->kind, &j->tm, e->cfg->llm_model, e->cfg->llm_embed_model,
                              &call, &te);
    if (rc) {
        engine__release_slot(j);
        if (rc == CR_ENOMEM)
            snprintf(te.exc_type, sizeof(te.exc_type), "MemoryError");
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
            te.exc_type, te.message);
        fail_job(j, te.exc_type, "builtins", te.message, "bad arguments", 1);
        return rc;
    }
    call.route_step = j->route_step;
    j->json_answer = call.json_answer;
    j->attempt++;
    memset(&err, 0, sizeof(err));
    rc = e->ops->call_llm(e->ctx, j, &call, &err);
    task_call_release(&call);
    if (rc == CR_EBUDGET) {
        /* The provider's daily budget is spent (llm/budget.h): nothing was
         * sent. Permanent today, so dead-lettered with the reason, to be
         * replayed (celeriac dlq replay) once a new day opens it again. */
        engine__release_slot(j);
        LOG(LOG_WARNING, "Task %s[%s] not sent: %s", job_name(j), j->tm.id, err.msg);
        fail_job(j, "BudgetExceeded", "celeriac.exceptions", err.msg, "budget exceeded",
                 1);
        return rc;
    }
    if (rc) {
        /* CR_EINVAL: the provider cannot express this request (a bad
         * deployment name, an operation it lacks); retrying cannot help. */
        const char *exc = rc == CR_EINVAL ? "ValueError" : "MemoryError";
        engine__release_slot(j);
        LOG(LOG_ERROR, "Task %s[%s] raised unexpected: %s('%s')", job_name(j), j->tm.id,
            exc, err.msg);
        fail_job(j, exc, "builtins", err.msg,
                 rc == CR_EINVAL ? "bad arguments" : "internal", rc == CR_EINVAL);
        return rc;
    }
    engine__drop_args(j);
    j->pending++;
    return 0;
}

void engine__start(struct job *j)
{
    struct engine *e = j->e;

    if (engine__fanout_is_item(j)) {
        engine__fanout_run_item(j);
        return;
    }
    if (revoke_if_due(j))
        return;
    take_slot(j);
    if (e->cfg->acks_early)
        settle_all(j, 1, 0);
    notify_simple(j, TEV_STARTED);
    if (e->cfg->track_started && j->tm.ignore_result != 1)
        store_started(j);
    if (j->kind == TASK_ACCUMULATE) {
        run_accumulate(j);
        return;
    }
    if (tasks_is_fanout(j->kind)) {
        engine__fanout_start(j);
        return;
    }
    start_call(j);
}

/* ------------------------------------------------------------- receiving */

/* Whether this delivery may be a task whose outcome was already stored: the
 * broker delivered it before (a crash between the store and the ack), or it
 * came back through a dead-letter path (parked, or the broker's own x-death).
 * A producer publishing the same id again is not covered: like Celery, that
 * runs again, and the store still never overwrites a SUCCESS. */
static int seen_before(const struct job *j, const struct delivery *d)
{
    const cJSON *h = engine__headers_of(j, d);
    return d->redelivered ||
           (h && (cJSON_GetObjectItemCaseSensitive(h, "x-death") ||
                  cJSON_GetObjectItemCaseSensitive(h, "x-celeriac-parked")));
}

/* Holds, parks or queues a checked job. */
static void queue_job(struct job *j)
{
    struct engine *e = j->e;
    int64_t now_us = e->now.epoch_us;
    if (j->tm.eta_us >= 0 && j->tm.eta_us > now_us) {
        if (delay_eta_job(j) == 0)
            return;
        if (e->cfg->park_after > 0 &&
            j->tm.eta_us - now_us > (int64_t)(e->cfg->park_after * 1e6) &&
            park_eta_job(j) == 0)
            return;
        engine__eta_push(e, j);
    } else {
        engine__ready_push(e, j);
    }
}

/* A delivery that came back found its FAILURE stored with the dead letter
 * pending (store_pending_failure()): the provider is not called again. The
 * dead letter goes with the reason, exception and HTTP status the failure
 * had, then the FAILURE is stored without the mark, then the message is
 * acked, as the first run would have done. 0 when under way (or, out of
 * memory, the delivery was given back: acked as a plain FAILURE it would
 * lose the dead letter); -1 when the meta carries no such mark, or is not
 * JSON, and the job goes on as any other. */
static int resume_dead_letter(struct job *j, const char *value, size_t len)
{
    static const char key[] = ENGINE_DEAD_LETTER_PENDING;
    const cJSON *dl, *status;
    cJSON *meta = NULL;
    struct cr_err err;
    struct buf b;
    char *clean;
    int rc;

    if (!value || !memmem(value, len, key, sizeof(key) - 1))
        return -1;
    memset(&err, 0, sizeof(err));
    rc = py_json_parse(value, len, &meta, &err);
    if (rc == CR_ENOMEM)
        goto oom;
    if (rc)
        return -1;
    dl = cJSON_GetObjectItemCaseSensitive(meta, key);
    if (!cJSON_IsObject(dl)) {
        cJSON_Delete(meta);
        return -1;
    }
#define STR(name)                                                                        \
    (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(dl, name))                          \
         ? cJSON_GetObjectItemCaseSensitive(dl, name)->valuestring                       \
         : "")
    engine__set_failure(j, STR("exc_type"), STR("exc_message"), STR("reason"));
#undef STR
    status = cJSON_GetObjectItemCaseSensitive(dl, "http_status");
    j->http_status = cJSON_IsNumber(status) ? (long)status->valuedouble : 0;
    cJSON_DeleteItemFromObjectCaseSensitive(meta, key);
    buf_init(&b);
    clean = py_json_dumps(meta, &b) == 0 ? buf_detach(&b) : NULL;
    buf_release(&b);
    cJSON_Delete(meta);
    if (!clean)
        goto oom;
    cr_free(j->meta);
    j->meta = clean;
    j->dead_letter = 1;
    j->dl_pending = 2;
    LOG(LOG_WARNING,
        "Task %s[%s] already has FAILURE stored with its dead letter pending; "
        "dead-lettering it without running it",
        job_name(j), j->tm.id);
    job_set_state(j, JOB_SETTLING);
    engine__settle_resume(j);
    return 0;
oom:
    LOG(LOG_ERROR,
        "Task %s[%s]: out of memory reading its pending dead letter; requeueing it",
        job_name(j), j->tm.id);
    settle_all(j, 0, 1);
    engine__abandon(j);
    return 0;
}

/* Decides what a received job does, given its stored state st ("" when none
 * was stored or read) and meta (value, len; NULL when none): settle it, give
 * it back, revoke, ask its lease, hold, park or queue it. */
static void check_job(struct job *j, const char *st, const char *value, size_t len)
{
    struct engine *e = j->e;

    if (!strcmp(st, "FAILURE") && resume_dead_letter(j, value, len) == 0)
        return;
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
            /* A chord member may have crashed between its store and its
             * part-return: that is done again first (never its callbacks or
             * chain, confirmed before the store). */
            if (!engine__followup_redo(j, st, value, len))
                finish_job(j);
            return;
        }
    }
    if (j->nmsgs &&
        engine_delivery_limit_reached(delivery_count(j), e->cfg->delivery_limit)) {
        char msg[160];
        snprintf(msg, sizeof(msg), "delivered %ld times before; --delivery-limit is %d",
                 delivery_count(j), e->cfg->delivery_limit);
        LOG(LOG_ERROR, "Task %s[%s] reached its delivery limit (%s); dead-lettering it",
            job_name(j), j->tm.id, msg);
        fail_job(j, "DeliveryLimitExceeded", ENGINE_EXC_MODULE, msg, "delivery limit", 1);
        return;
    }
    if (e->shutdown) {
        /* Not started: give it back. */
        settle_all(j, 0, 1);
        engine__abandon(j);
        return;
    }
    if (engine__job_revoked(j)) {
        engine__revoke_job(j, "revoked", NULL);
        return;
    }
    if (e->cfg->park_after > 0 &&
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(engine__headers_of(j, j->msgs[0]),
                                                        "x-celeriac-parked"))) {
        /* A parked copy of a task that was running somewhere: ask the lease. */
        if (e->ops->lease(e->ctx, j, ENGINE_LEASE_GET, 0) == 0) {
            j->pending++;
            return;
        }
    }
    queue_job(j);
}

void engine_on_state(struct engine *e, struct engine_now now, struct job *j, int status,
                     const char *value, size_t len)
{
    char st[32] = "";
    engine__enter(e, now);
    j->pending--;
    if (status) {
        engine__abandon(j);
    } else {
        if (value && result_meta_status(value, len, st, sizeof(st)) != 0)
            st[0] = '\0';
        check_job(j, st, value, len);
    }
    engine__leave(e);
}

/* Decodes d into j. 0, or the decoder's error with err filled. */
static int decode(struct engine *e, struct job *j, struct delivery *d, struct cr_err *err)
{
    struct celery_raw_msg raw;
    int rc;

    engine__raw_of(&raw, d, d->headers);
    if (d->headers_bad) {
        /* The entries that did convert still name the task, so it gets its
         * FAILURE; the message is refused all the same. */
        celery_msg_decode(&raw, &j->tm, err);
        rc = CR_EDECODE;
        cr_err_set(err, rc, "bad AMQP headers: %s",
                   d->headers_err ? d->headers_err : "unknown error");
    } else {
        rc = celery_msg_decode(&raw, &j->tm, err);
    }
    if (rc == 0 && d->body_len > (size_t)e->cfg->max_message_size) {
        rc = CR_ETOOBIG;
        cr_err_set(err, rc, "message body of %zu bytes is over --max-message-size %d",
                   d->body_len, e->cfg->max_message_size);
    }
    return rc;
}

/* A message that cannot be run: log once, store FAILURE when the id is known,
 * dead-letter it, then ack. */
static void reject_bad(struct job *j, int rc, const char *message)
{
    const char *type = rc == CR_ECONTENT  ? "ContentDisallowed"
                       : rc == CR_ETOOBIG ? "MessageTooLarge"
                       : rc == CR_EPROTO  ? "InvalidTaskError"
                                          : "DecodeError";
    const char *module = rc == CR_ECONTENT  ? "kombu.exceptions"
                         : rc == CR_EDECODE ? "kombu.exceptions"
                         : rc == CR_EPROTO  ? "celery.exceptions"
                                            : ENGINE_EXC_MODULE;
    /* An id shared with a running job must not get a FAILURE over it. */
    if (j->tm.id && strmap_get(&j->e->jobs, j->tm.id)) {
        cr_free(j->tm.id);
        j->tm.id = NULL;
    }
    LOG(LOG_ERROR, "Rejecting message %s[%s]: %s: %s", j->tm.task ? j->tm.task : "?",
        j->tm.id ? j->tm.id : "?", type, message);
    fail_job(j, type, module, message, "cannot decode", 1);
}

/* Gives d back (requeued) and frees the job that had taken it. */
static void give_back(struct job *j, struct delivery *d)
{
    struct engine *e = j->e;
    e->ops->reject(e->ctx, d, 1);
    if (j->nmsgs && j->msgs[0] == d) {
        j->msgs[0] = NULL;
        j->nmsgs = 0;
    }
    e->ops->release(e->ctx, d);
    job_free(j);
}

/* The decoded delivery is a task this engine runs: register and check it. */
static void accept_job(struct engine *e, struct job *j, struct delivery *d)
{
    char buf[300];

    /* From here d belongs to j, whose decoded fields and kept headers say
     * everything the tree did (see engine__headers_of()). */
    cJSON_Delete(d->headers);
    d->headers = NULL;
    /* The decoded copies of the message properties are never read here (d
     * has them, and republishing takes them from d): 4 allocations less per
     * task in flight. */
    cr_free(j->tm.content_type);
    cr_free(j->tm.content_encoding);
    cr_free(j->tm.correlation_id);
    cr_free(j->tm.reply_to);
    j->tm.content_type = j->tm.content_encoding = j->tm.correlation_id = j->tm.reply_to =
        NULL;
    if (j->kind == TASK_UNKNOWN) {
        LOG(LOG_ERROR,
            "Received unregistered task of type '%s'. To run it on a built-in task, "
            "start the worker with --task-alias %s=llm.generate (or llm.chat, "
            "llm.embed)",
            j->tm.task, j->tm.task);
        snprintf(buf, sizeof(buf), "%s", j->tm.task);
        fail_job(j, "NotRegistered", "celery.exceptions", buf, "unregistered task", 1);
        return;
    }
    if (strmap_put(&e->jobs, j->tm.id, j)) {
        give_back(j, d);
        return;
    }
    j->in_map = 1;
    if (revoke_if_due(j))
        return;
    LOG(LOG_INFO, "Task %s[%s] received", job_name(j), j->tm.id);
    notify_simple(j, TEV_RECEIVED);
    if (!seen_before(j, d)) {
        /* A first delivery has no outcome of ours stored: skip the read (a
         * Redis round trip and a tenth of the worker's CPU per trivial task). */
        check_job(j, "", NULL, 0);
        return;
    }
    if (e->ops->read_state(e->ctx, j)) {
        job_set_state(j, JOB_DONE);
        give_back(j, d);
        return;
    }
    j->pending++;
}

void engine_on_delivery(struct engine *e, struct engine_now now, struct delivery *d)
{
    struct cr_err err;
    struct job *j, *running;
    int rc;

    engine__enter(e, now);
    if (e->shutdown) {
        e->ops->reject(e->ctx, d, 1);
        e->ops->release(e->ctx, d);
        goto out;
    }
    j = job_new(e, d);
    if (!j) {
        LOG(LOG_ERROR, "out of memory receiving a message; requeueing it");
        e->ops->reject(e->ctx, d, 1);
        e->ops->release(e->ctx, d);
        goto out;
    }
    memset(&err, 0, sizeof(err));
    rc = decode(e, j, d, &err);
    if (rc) {
        reject_bad(j, rc, err.msg);
        goto out;
    }
    j->kind = tasks_lookup(j->tm.task, e->cfg->aliases, e->cfg->naliases);
    running = strmap_get(&e->jobs, j->tm.id);
    if (running) {
        /* The same task again (a redelivery after a reconnect, or a duplicate
         * publish): ride on the job already under way. */
        LOG(LOG_INFO, "Task %s[%s] received again; joining the copy already under way",
            job_name(j), j->tm.id);
        j->msgs[0] = NULL;
        j->nmsgs = 0;
        if (job_attach(running, d)) {
            e->ops->reject(e->ctx, d, 1);
            e->ops->release(e->ctx, d);
        }
        job_free(j);
        goto out;
    }
    accept_job(e, j, d);
out:
    engine__leave(e);
}

/* --------------------------------------------------------------- the tick */

void engine_on_tick(struct engine *e, struct engine_now now)
{
    engine__enter(e, now);
    engine__tick(e);
    if (e->shutdown == 1 && e->cfg->shutdown_timeout > 0 &&
        e->now.loop_ms - e->shutdown_started >
            (uint64_t)(e->cfg->shutdown_timeout * 1000)) {
        LOG(LOG_WARNING, "worker: warm shutdown timed out after %.0fs; going cold",
            e->cfg->shutdown_timeout);
        engine_shutdown(e, now, 1);
    }
    engine__leave(e);
}

struct engine *engine_of_publish(const struct engine_publish *p)
{
    return p->j->e;
}

void *engine_ctx(const struct engine *e)
{
    return e->ctx;
}

/* --------------------------------------------------------------- control */

void engine_shutdown(struct engine *e, struct engine_now now, int cold)
{
    engine__enter(e, now);
    if (cold) {
        if (e->shutdown != 2) {
            LOG(LOG_WARNING, "worker: Cold shutdown (MainProcess)");
            e->shutdown = 2;
            e->stopped = 1;
            e->ops->stop(e->ctx, 1);
        }
    } else if (!e->shutdown) {
        LOG(LOG_WARNING, "worker: Warm shutdown (MainProcess)");
        e->shutdown = 1;
        e->shutdown_started = e->now.loop_ms;
        /* Not started yet: back to the queue now, so other workers can take them. */
        engine__drop_waiting(e);
    }
    engine__leave(e);
}

void engine_halt(struct engine *e)
{
    e->shutdown = 2;
    e->stopped = 1;
}

int engine_shutting_down(const struct engine *e)
{
    return e->shutdown;
}

/* ------------------------------------------------------------- lifecycle */

struct engine *engine_new(const struct engine_config *cfg, const struct engine_ops *ops,
                          void *ctx, struct engine_now now)
{
    struct engine *e = cr_calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->cfg = cfg;
    e->ops = ops;
    e->ctx = ctx;
    e->now = now;
    e->concurrency = cfg->concurrency;
    e->seed = cfg->seed ? cfg->seed : 1;
    strmap_init(&e->jobs);
    strmap_init(&e->task_limits);
    strmap_init(&e->totals);
    revoked_set_init(&e->revoked, ENGINE_REVOKES_MAX);
    revoked_stamps_init(&e->revoked_stamps);
    if (engine__sched_init(e)) {
        engine_free(e);
        return NULL;
    }
    return e;
}

static void free_value_cb(const char *key, void *value, void *arg)
{
    (void)key;
    (void)arg;
    cr_free(value);
}

static void unmap_job_cb(const char *key, void *value, void *arg)
{
    struct job *j = value;
    (void)key;
    (void)arg;
    j->in_map = 0;
}

void engine_free(struct engine *e)
{
    if (!e)
        return;
    e->shutdown = 2;
    strmap_each(&e->jobs, unmap_job_cb, NULL);
    strmap_release(&e->jobs);
    revoked_set_release(&e->revoked);
    revoked_stamps_release(&e->revoked_stamps);
    strmap_each(&e->task_limits, free_value_cb, NULL);
    strmap_release(&e->task_limits);
    strmap_each(&e->totals, free_value_cb, NULL);
    strmap_release(&e->totals);
    engine__fanout_release(e);
    while (e->ready_head) {
        struct job *j = e->ready_head;
        engine__ready_unlink(e, j);
        job_free(j);
    }
    while (e->eta_head) {
        struct job *j = e->eta_head;
        engine__eta_unlink(e, j);
        job_free(j);
    }
    engine__sched_release(e);
    cr_free(e);
}

/* ------------------------------------------------- the turn: start, tick */

/* Whether j holds a delivery that can still be settled. A delivery of a
 * connection since lost is back in its queue already; its redelivery joins j
 * while j exists (see engine_on_delivery()). */
static int job_live(const struct job *j)
{
    struct engine *e = j->e;
    /* A map's item has no delivery: fanout.c checks its map's. */
    if (engine__fanout_is_item(j))
        return 1;
    for (int i = 0; i < j->nmsgs; i++)
        if (!j->msgs[i]->settled && e->ops->delivery_live(e->ctx, j->msgs[i]))
            return 1;
    return 0;
}

int engine__job_live(const struct job *j)
{
    return job_live(j);
}

/* Starts ready jobs while slots are free. */
void engine__schedule(struct engine *e)
{
    struct job *j = e->ready_head, *next;
    int64_t now = (int64_t)e->now.loop_ms;
    while (j && e->active < e->concurrency && e->shutdown != 2) {
        struct task_limits *tl = engine__limits(e, j->tm.task, 0);
        next = j->next;
        /* A rate-limited task waits in the queue (the tick tries again) and
         * does not hold up the tasks behind it. */
        if (tl && tl->has_rate && ratelimit_take(&tl->bucket, now) > 0) {
            j = next;
            continue;
        }
        engine__ready_unlink(e, j);
        if (!job_live(j)) {
            /* Its connection was lost: the broker has its delivery back and
             * redelivers it once the worker is connected again (a redelivery
             * that came already made it live). A call started now would be
             * paid for an outcome that cannot be acked, and a retry or dead
             * letter that cannot be published. */
            LOG(LOG_DEBUG,
                "Task %s[%s] not started: its delivery went with the broker "
                "connection",
                job_name(j), j->tm.id);
            engine__abandon(j);
            j = next;
            continue;
        }
        engine__start(j);
        /* A map that started has queued its items, which may be more urgent
         * than next (a premium map before free tasks): start from the head. */
        if (e->rescan) {
            e->rescan = 0;
            next = e->ready_head;
        }
        j = next;
    }
}

/* Parks deliveries of running jobs held too long (see engine__park()). */
static void park_running(struct engine *e)
{
    uint64_t now = e->now.loop_ms;
    uint64_t limit = (uint64_t)(e->cfg->park_after * 1000);
    for (struct job *j = e->run_head; j; j = j->rnext) {
        for (int i = 0; i < j->nmsgs; i++) {
            struct delivery *d = j->msgs[i];
            if (d->settled || (d->flags & DELIVERY_F_PARKING) ||
                now - d->received_ms < limit)
                continue;
            if (engine__park(j, d, 0, 1) == 0) {
                if (e->ops->lease(e->ctx, j, ENGINE_LEASE_SET,
                                  (long)(e->cfg->park_after * 3 + 1)) == 0)
                    j->leased = 1;
                LOG(LOG_INFO,
                    "Task %s[%s] still running after %.0fs: delivery parked, lease "
                    "kept",
                    job_name(j), j->tm.id, (double)(now - d->received_ms) / 1000.0);
            }
        }
    }
}

/* Time limits: the transfer is aborted at once; the switchboard defers
 * engine_on_llm_done(), so the list is not changed under us. */
static void time_limits(struct engine *e)
{
    int64_t now = (int64_t)e->now.loop_ms;
    char msg[128];
    for (struct job *j = e->run_head; j; j = j->rnext) {
        if (!j->call)
            continue;
        if (j->hard_deadline && now >= j->hard_deadline) {
            snprintf(msg, sizeof(msg), "%g", j->hard_limit_s);
            LOG(LOG_ERROR, "Hard time limit (%gs) exceeded for %s[%s]", j->hard_limit_s,
                job_name(j), j->tm.id);
            e->ops->abort_llm(e->ctx, j, "TimeLimitExceeded", msg);
            j->call = NULL;
        } else if (j->soft_deadline && now >= j->soft_deadline) {
            snprintf(msg, sizeof(msg), "soft time limit (%gs) exceeded", j->soft_limit_s);
            LOG(LOG_WARNING, "Soft time limit (%gs) exceeded for %s[%s]", j->soft_limit_s,
                job_name(j), j->tm.id);
            e->ops->abort_llm(e->ctx, j, "SoftTimeLimitExceeded", msg);
            j->call = NULL;
        }
    }
}

void engine__tick(struct engine *e)
{
    struct job *j, *next;

    /* eta jobs whose time has come */
    for (j = e->eta_head; j; j = next) {
        next = j->next;
        if (j->tm.eta_us <= e->now.epoch_us) {
            engine__eta_unlink(e, j);
            engine__sync_prefetch(e);
            engine__ready_push(e, j);
        }
    }
    engine__schedule(e);
    if (e->cfg->park_after > 0 && e->run_head)
        park_running(e);
    time_limits(e);
    engine__fanout_tick(e);
}

/* A warm shutdown gives back what has not started, so other workers can take
 * it now. */
void engine__drop_waiting(struct engine *e)
{
    struct job *skip = NULL; /* the last of the leading map items kept */
    for (;;) {
        struct job *j = skip ? skip->next : e->ready_head;
        if (j && engine__fanout_is_item(j)) {
            /* Its map is running, and a running task finishes. */
            skip = j;
            continue;
        }
        if (!j && !(j = e->eta_head))
            break;
        if (j->state == JOB_READY)
            engine__ready_unlink(e, j);
        else
            engine__eta_unlink(e, j);
        for (int i = 0; i < j->nmsgs; i++) {
            if (!j->msgs[i]->settled)
                e->ops->reject(e->ctx, j->msgs[i], 1);
        }
        engine__abandon(j);
    }
}
