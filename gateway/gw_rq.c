/* gw_rq.c -- an RQ job's state read on a Celery meta miss (see gw_rq.h). */
#include "gw_rq.h"

#include <hiredis/hiredis.h>
#include <string.h>

#include "gw_msg.h"
#include "net/backend.h"
#include "protocol/progress.h"
#include "protocol/rq_job.h"
#include "protocol/rq_state.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/log.h"

/* A short field's copy; a longer value than fits is kept as "?", which is
 * no status, type or state anyone writes. */
struct field {
    char s[64];
    size_t len;
    int set;
};

struct rq_read {
    struct backend *bk;
    gw_rq_fn *cb;
    void *privdata;
    int watch;
    int pending; /* commands not answered yet */
    int failed;  /* CR_ENOMEM or CR_ECANCELED, once one is */
    struct rq_limits lim;
    char id[GW_TASK_ID_MAX + 1];
    struct field status, ended_at, type, stream_state;
    char *exc_info, *value; /* heap copies, NULL when absent */
    size_t exc_info_len, value_len;
};

static void keep(struct field *f, const redisReply *r)
{
    f->set = 0;
    if (!r || r->type != REDIS_REPLY_STRING)
        return;
    f->set = 1;
    if ((size_t)r->len < sizeof(f->s)) {
        memcpy(f->s, r->str, (size_t)r->len);
        f->len = (size_t)r->len;
    } else {
        memcpy(f->s, "?", 2);
        f->len = 1;
    }
}

/* A copy of a long value within the decoder's stored size (base64 of it at
 * most); a longer one is left out, read as absent. 0 or CR_ENOMEM. */
static int keep_long(struct rq_read *rd, const redisReply *r, char **p, size_t *n)
{
    if (!r || r->type != REDIS_REPLY_STRING ||
        (size_t)r->len / 4 * 3 > rd->lim.max_data_bytes)
        return 0;
    cr_free(*p);
    *p = cr_malloc((size_t)r->len + 1);
    if (!*p)
        return CR_ENOMEM;
    memcpy(*p, r->str, (size_t)r->len);
    (*p)[r->len] = '\0';
    *n = (size_t)r->len;
    return 0;
}

static void rq_read_free(struct rq_read *rd)
{
    cr_free(rd->exc_info);
    cr_free(rd->value);
    cr_free(rd);
}

static const char *field_ptr(const struct field *f, size_t *len)
{
    *len = f->set ? f->len : 0;
    return f->set ? f->s : NULL;
}

/* Every answer is in: the meta, then the caller's callback. */
static void finish(struct rq_read *rd)
{
    struct rq_state_in in;
    const char *st;
    size_t st_len;
    char *meta = NULL;
    size_t len = 0;
    int rc = rd->failed;

    memset(&in, 0, sizeof(in));
    in.task_id = rd->id;
    in.status = field_ptr(&rd->status, &in.status_len);
    in.ended_at = field_ptr(&rd->ended_at, &in.ended_at_len);
    in.exc_info = rd->exc_info;
    in.exc_info_len = rd->exc_info_len;
    in.type = field_ptr(&rd->type, &in.type_len);
    in.value = rd->value;
    in.value_len = rd->value_len;
    st = field_ptr(&rd->stream_state, &st_len);
    if (rc == 0 && rd->watch && rq_state_hold(&in, st, st_len, clock_epoch_us())) {
        /* The stream's end, with its last text, comes next: the watch ends
         * on it, not on this answer. */
        in.status = "started";
        in.status_len = 7;
    }
    if (rc == 0)
        rc = rq_state_meta(&in, &rd->lim, &meta, &len);
    rd->cb(rc, rc ? NULL : meta, rc ? 0 : len, rd->privdata);
    cr_free(meta);
    rq_read_free(rd);
}

static void answered(struct rq_read *rd)
{
    if (--rd->pending == 0)
        finish(rd);
}

/* The fields of a stream's newest entry (XREVRANGE ... COUNT 1), or NULL. */
static const redisReply *newest_fields(const redisReply *r)
{
    const redisReply *e;
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        return NULL;
    e = r->element[0];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[1]->type != REDIS_REPLY_ARRAY)
        return NULL;
    return e->element[1];
}

static int bad_reply(struct rq_read *rd, int status, const redisReply *r,
                     const char *what)
{
    if (status) {
        rd->failed = status;
        return 1;
    }
    if (r && r->type == REDIS_REPLY_ERROR) {
        LOG(LOG_ERROR, "gateway: reading %s of rq job %s: %s", what, rd->id, r->str);
        return 1;
    }
    return 0;
}

static void on_result(struct backend *bk, int status, const struct redisReply *reply,
                      void *privdata)
{
    struct rq_read *rd = privdata;
    const redisReply *f = newest_fields((const redisReply *)reply);
    (void)bk;
    if (!bad_reply(rd, status, (const redisReply *)reply, "the result") && f) {
        for (size_t i = 0; i + 1 < f->elements; i += 2) {
            const redisReply *k = f->element[i];
            if (k->type != REDIS_REPLY_STRING)
                continue;
            if (!strcmp(k->str, "type"))
                keep(&rd->type, f->element[i + 1]);
            else if ((!strcmp(k->str, "return_value") || !strcmp(k->str, "exc_string")) &&
                     keep_long(rd, f->element[i + 1], &rd->value, &rd->value_len))
                rd->failed = CR_ENOMEM;
        }
    }
    answered(rd);
}

static void on_stream(struct backend *bk, int status, const struct redisReply *reply,
                      void *privdata)
{
    struct rq_read *rd = privdata;
    const redisReply *f = newest_fields((const redisReply *)reply);
    (void)bk;
    if (!bad_reply(rd, status, (const redisReply *)reply, "the progress") && f) {
        for (size_t i = 0; i + 1 < f->elements; i += 2)
            if (f->element[i]->type == REDIS_REPLY_STRING &&
                !strcmp(f->element[i]->str, "state"))
                keep(&rd->stream_state, f->element[i + 1]);
    }
    answered(rd);
}

static int ended(const struct field *st)
{
    return st->set && ((st->len == 8 && !memcmp(st->s, "finished", 8)) ||
                       (st->len == 6 && !memcmp(st->s, "failed", 6)) ||
                       (st->len == 7 && !memcmp(st->s, "stopped", 7)));
}

static int newest(struct rq_read *rd, const char *key, backend_reply_fn *cb)
{
    const char *argv[] = {"XREVRANGE", key, "+", "-", "COUNT", "1"};
    int rc = backend_command(rd->bk, 6, argv, NULL, cb, rd);
    if (rc == 0)
        rd->pending++;
    return rc;
}

static void on_hash(struct backend *bk, int status, const struct redisReply *reply,
                    void *privdata)
{
    struct rq_read *rd = privdata;
    const redisReply *r = (const redisReply *)reply;
    char key[RQ_KEY_SIZE];
    (void)bk;
    if (bad_reply(rd, status, r, "the job") || r->type != REDIS_REPLY_ARRAY ||
        r->elements != 3) {
        answered(rd);
        return;
    }
    keep(&rd->status, r->element[0]);
    keep(&rd->ended_at, r->element[1]);
    if (keep_long(rd, r->element[2], &rd->exc_info, &rd->exc_info_len))
        rd->failed = CR_ENOMEM;
    /* Only an ended job has a result to read; a running one's stream is read
     * by the watch itself. */
    if (!rd->failed && ended(&rd->status)) {
        struct buf pk;
        buf_init(&pk);
        if (rq_key(key, RQ_KEY_RESULTS, rd->id) == 0 && newest(rd, key, on_result))
            rd->failed = CR_ENOMEM;
        if (!rd->failed && rd->watch &&
            (progress_key(&pk, rd->id) || newest(rd, pk.data, on_stream)))
            rd->failed = CR_ENOMEM;
        buf_release(&pk);
    }
    answered(rd);
}

int gw_rq_read(struct backend *bk, const char *task_id, int watch, gw_rq_fn *cb,
               void *privdata)
{
    struct rq_read *rd;
    char key[RQ_KEY_SIZE];
    const char *argv[5];
    int rc;

    if (strlen(task_id) > GW_TASK_ID_MAX)
        return CR_EINVAL;
    rd = cr_calloc(1, sizeof(*rd));
    if (!rd)
        return CR_ENOMEM;
    rd->bk = bk;
    rd->cb = cb;
    rd->privdata = privdata;
    rd->watch = watch;
    rq_limits_init(&rd->lim);
    memcpy(rd->id, task_id, strlen(task_id) + 1);
    if (rq_key(key, RQ_KEY_JOB, task_id)) {
        cr_free(rd);
        return CR_EINVAL;
    }
    argv[0] = "HMGET";
    argv[1] = key;
    argv[2] = "status";
    argv[3] = "ended_at";
    argv[4] = "exc_info";
    rd->pending = 1;
    rc = backend_command(bk, 5, argv, NULL, on_hash, rd);
    if (rc)
        cr_free(rd);
    return rc;
}
