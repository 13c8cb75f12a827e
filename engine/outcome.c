/* outcome.c -- what a job's outcome is made of: result metas, exception
 * metas with their traceback, the retry message, dead-letter headers and the
 * copies of a delivery sent back out. No I/O; the time is the engine's. */
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "protocol/isotime.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

/* A failed job's reasons when even their few hundred bytes cannot be had. */
static struct job_failure oom_failure = {"MemoryError", "out of memory", "out of memory"};

const struct job_failure *engine__failure_of(const struct job *j)
{
    return j->failure ? j->failure : &oom_failure;
}

void engine__set_failure(struct job *j, const char *exc_type, const char *message,
                         const char *reason)
{
    if (!j->failure)
        j->failure = cr_malloc(sizeof(*j->failure));
    if (!j->failure) {
        j->failure = &oom_failure;
    } else if (j->failure != &oom_failure) {
        snprintf(j->failure->exc_type, sizeof(j->failure->exc_type), "%s", exc_type);
        snprintf(j->failure->exc_message, sizeof(j->failure->exc_message), "%s", message);
        snprintf(j->failure->reason, sizeof(j->failure->reason), "%s", reason);
    }
}

void engine__free_failure(struct job *j)
{
    if (j->failure != &oom_failure)
        cr_free(j->failure);
    j->failure = NULL;
}

const char *job_name(const struct job *j)
{
    return task_msg_display_name(&j->tm);
}

const char *job_model(const struct job *j)
{
    const cJSON *m =
        j->tm.kwargs ? cJSON_GetObjectItemCaseSensitive(j->tm.kwargs, "model") : NULL;
    if (cJSON_IsString(m) && *m->valuestring)
        return m->valuestring;
    if (j->model && *j->model) /* kwargs dropped while the call runs */
        return j->model;
    return j->kind == TASK_EMBED ? j->e->cfg->llm_embed_model : j->e->cfg->llm_model;
}

/* ------------------------------------------------------ args while running */

/* What the decoder is given for delivery d, with these headers (borrowed). */
void engine__raw_of(struct celery_raw_msg *raw, const struct delivery *d,
                    const cJSON *headers)
{
    memset(raw, 0, sizeof(*raw));
    raw->content_type = d->content_type;
    raw->content_encoding = d->content_encoding;
    raw->headers = headers;
    raw->correlation_id = d->correlation_id;
    raw->reply_to = d->reply_to;
    raw->delivery_mode = d->delivery_mode;
    raw->priority = d->wire_priority;
    raw->body = d->body;
    raw->body_len = d->body_len;
}

/* The args and kwargs trees are only read to build the call (and again for a
 * retry, --result-extended metas and `celery inspect`), yet a running call
 * held them for its whole life: about 400 bytes per stream of the memory
 * bench. The message they came in is kept anyway (to dead-letter or park it
 * as it came), so a job that has sent its call drops them and
 * engine_job_args() parses them again when needed. */
void engine__drop_args(struct job *j)
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

int engine_job_args(struct job *j)
{
    struct celery_raw_msg raw;
    struct task_msg again;
    struct cr_err err;
    cJSON *headers;
    int rc;

    if (!j->args_dropped)
        return 0;
    /* The decoder wants the headers the message came with: Celery's are
     * rebuilt from the decoded fields, the others were kept. */
    headers = celery_msg_headers(&j->tm);
    if (!headers)
        return CR_ENOMEM;
    engine__raw_of(&raw, j->msgs[0], headers);
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

/* ------------------------------------------------------------------ metas */

char *engine_job_meta(struct job *j, const char *status, const cJSON *result,
                      const char *traceback, int ready)
{
    const struct engine_config *cfg = j->e->cfg;
    struct result_meta rm;
    memset(&rm, 0, sizeof(rm));
    rm.task_id = j->tm.id;
    rm.status = status;
    rm.result = result;
    rm.traceback = traceback;
    rm.date_done_us = ready ? j->e->now.epoch_us : -1;
    rm.group_id = j->tm.group;
    rm.parent_id = j->tm.parent_id;
    if (cfg->result_extended) {
        engine_job_args(j);
        rm.extended = 1;
        rm.name = j->tm.task;
        rm.args = j->tm.args;
        rm.kwargs = j->tm.kwargs;
        rm.worker = cfg->hostname;
        rm.retries = j->tm.retries;
        rm.queue = j->nmsgs ? j->msgs[0]->routing_key : NULL;
        if (j->nmsgs) {
            const cJSON *h = engine__headers_of(j, j->msgs[0]);
            rm.stamped_headers = cJSON_GetObjectItemCaseSensitive(h, "stamped_headers");
            rm.stamps = cJSON_GetObjectItemCaseSensitive(h, "stamps");
        }
    }
    return result_meta_encode(&rm);
}

char *engine__exc_meta(struct job *j, const char *status, const char *exc_type,
                       const char *exc_module, const char *message, int ready)
{
    cJSON *exc = result_exc_new(exc_type, exc_module, message);
    struct buf tb;
    char *meta;
    buf_init(&tb);
    /* A Python-looking traceback, so tools that print it show something
     * familiar; the frames are ours, not Python's. */
    result_traceback(&tb, j->tm.task, exc_module, exc_type, message);
    meta = exc ? engine_job_meta(j, status, exc, tb.data, ready) : NULL;
    cJSON_Delete(exc);
    buf_release(&tb);
    return meta;
}

/* ------------------------------------------------------------- headers */

/* The headers of one of j's deliveries, for looking up the headers Celery
 * does not define (x-death, x-celeriac-parked). Once the first delivery is
 * decoded its tree is dropped and the task keeps only those (see
 * celery_msg_decode()): holding Celery's own headers as a tree cost about 2 KB
 * per task in flight, and they are rebuilt exactly by engine__headers_copy(). */
const cJSON *engine__headers_of(const struct job *j, const struct delivery *d)
{
    if (d->headers || j->nmsgs == 0 || d != j->msgs[0])
        return d->headers;
    return j->tm.headers;
}

/* A new copy of all the headers of one of j's deliveries, to send it again as
 * it came. NULL on OOM. */
cJSON *engine__headers_copy(struct job *j, const struct delivery *d)
{
    /* argsrepr and kwargsrepr a producer left out are rebuilt from the args */
    if (!d->headers && j->nmsgs && d == j->msgs[0] && j->tm.headers)
        return engine_job_args(j) ? NULL : celery_msg_headers(&j->tm);
    return d->headers ? cJSON_Duplicate(d->headers, 1) : cJSON_CreateObject();
}

/* The properties of a copy of d (dead letter, parked copy): d's own, made
 * persistent, with the given headers (borrowed). */
void engine__outbound_of(struct outbound *o, const struct delivery *d,
                         const cJSON *headers)
{
    memset(o, 0, sizeof(*o));
    o->content_type = d->content_type;
    o->content_encoding = d->content_encoding;
    o->correlation_id = d->correlation_id;
    o->reply_to = d->reply_to;
    o->delivery_mode = 2;
    o->priority = d->wire_priority;
    o->headers = headers;
    o->body = d->body;
    o->body_len = d->body_len;
}

/* x-celeriac-first-received: the time the task was first received, across
 * its retries and redeliveries. An earlier attempt stamped it on the copy it
 * sent (a retry, a parked or delayed copy), and that time is kept; else it is
 * this attempt's. Without it a dead letter's would be the last attempt's. */
int engine__stamp_first_received(const struct job *j, cJSON *h)
{
    const cJSON *had = cJSON_GetObjectItemCaseSensitive(h, ENGINE_FIRST_RECEIVED);
    char when[40];
    if (cJSON_IsString(had) && had->valuestring[0])
        return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(h, ENGINE_FIRST_RECEIVED);
    iso8601_format(j->received_epoch_us, when);
    return cJSON_AddStringToObject(h, ENGINE_FIRST_RECEIVED, when) ? 0 : CR_ENOMEM;
}

/* Builds the dead-letter headers on top of the original ones. */
cJSON *engine__dead_letter_headers(struct job *j)
{
    struct delivery *d = j->msgs[0];
    const struct job_failure *f = engine__failure_of(j);
    cJSON *h = engine__headers_copy(j, d);
    char when[40];
    if (!h)
        return NULL;
/* (an item whose key cannot be copied is not added: freed here) */
#define SET(key, item)                                                                   \
    do {                                                                                 \
        cJSON *it_ = (item);                                                             \
        cJSON_DeleteItemFromObjectCaseSensitive(h, key);                                 \
        if (!cJSON_AddItemToObject(h, key, it_))                                         \
            cJSON_Delete(it_);                                                           \
    } while (0)
    SET("x-celeriac-reason", cJSON_CreateString(f->reason));
    SET("x-celeriac-exception-type", cJSON_CreateString(f->exc_type));
    SET("x-celeriac-exception-message", cJSON_CreateString(f->exc_message));
    SET("x-celeriac-http-status", cJSON_CreateNumber((double)j->http_status));
    SET("x-celeriac-retries", cJSON_CreateNumber(j->tm.retries));
    SET("x-celeriac-original-exchange",
        cJSON_CreateString(d->exchange ? d->exchange : ""));
    SET("x-celeriac-original-routing-key",
        cJSON_CreateString(d->routing_key ? d->routing_key : ""));
    SET("x-celeriac-original-queue", cJSON_CreateString(d->queue ? d->queue : ""));
    engine__stamp_first_received(j, h);
    iso8601_format(j->e->now.epoch_us, when);
    SET("x-celeriac-failed-at", cJSON_CreateString(when));
    SET("x-celeriac-worker", cJSON_CreateString(j->e->cfg->hostname));
#undef SET
    return h;
}

/* The task again with retries + 1 and an eta delay_ms away, as Task.retry
 * sends it: into body and *headers (new; the caller frees both), described by
 * o (borrowing them). On failure j->tm is as it was. 0, or CR_ENOMEM. */
int engine__retry_message(struct job *j, int64_t delay_ms, struct outbound *o,
                          struct buf *body, cJSON **headers)
{
    struct delivery *d = j->msgs[0];
    struct task_msg *t = &j->tm;
    int64_t eta_us = j->e->now.epoch_us + delay_ms * 1000;
    char eta[40];
    int rc;

    if ((rc = engine_job_args(j)) != 0)
        return rc;
    t->retries++;
    cr_free(t->eta);
    iso8601_format(eta_us, eta);
    t->eta = cr_strdup(eta);
    t->eta_us = eta_us;
    if (!t->parent_id)
        t->parent_id = cr_strdup(t->id);
    *headers = NULL;
    rc = celery_msg_encode_v2(t, body, headers);
    if (rc) {
        t->retries--;
        return rc;
    }
    /* A quorum queue's count of the original's deliveries is not the retry's. */
    cJSON_DeleteItemFromObjectCaseSensitive(*headers, "x-delivery-count");
    if (j->e->ops->outbound_headers)
        j->e->ops->outbound_headers(j->e->ctx, j, *headers);
    if (engine__stamp_first_received(j, *headers)) {
        cJSON_Delete(*headers);
        *headers = NULL;
        t->retries--;
        return CR_ENOMEM;
    }
    memset(o, 0, sizeof(*o));
    o->content_type = "application/json";
    o->content_encoding = "utf-8";
    o->correlation_id = t->id;
    o->reply_to = d->reply_to;
    o->delivery_mode = d->delivery_mode ? d->delivery_mode : 2;
    o->priority = d->wire_priority;
    o->headers = *headers;
    /* Same routing as the original: through "" the routing key is the queue. */
    o->exchange = d->exchange ? d->exchange : "";
    o->routing_key = d->routing_key ? d->routing_key : "";
    o->body = body->data;
    o->body_len = body->len;
    return 0;
}
