/* redis_restore.c -- kombu's restore transaction for the Redis transport:
 * a message put back (a requeue, our stop, a dead worker's record in a
 * restore round, the records of a pop call whose reply was lost) goes back
 * to its list in one Lua script that removes its record only if it is still
 * the value read (restore_lua in net/redis_broker.c). When a message is put
 * back, whether a round runs, which lost pop calls are looked up and when
 * refused steps go again, is net/vsession.c's to say; this file sends the
 * commands, classifies the replies, reads the record, finds the target lists
 * through the bindings and pushes.
 * The facts are in docs/internals/redis-broker.md. */
#include "redis_broker_int.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"

/* The tags recorded under a lost pop call's score, for the session. */
static void on_lost_scan(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    char *score = arg;
    const char **tags = NULL;
    int n = 0;
    enum vsession_reply rep = VSESSION_OK;
    if (status)
        rep = status == CR_EBACKEND ? VSESSION_LOST : VSESSION_CANCELED;
    else if (redis_broker__refused_for_now(r))
        rep = VSESSION_REFUSED;
    else if (r->type != REDIS_REPLY_ARRAY)
        rep = VSESSION_MALFORMED;
    else if (r->elements) {
        tags = cr_calloc(r->elements, sizeof(*tags));
        if (!tags)
            rep = VSESSION_CANCELED; /* left to the visibility timeout */
        for (size_t i = 0; tags && i < r->elements; i++)
            if (r->element[i]->type == REDIS_REPLY_STRING)
                tags[n++] = r->element[i]->str;
    }
    if (b->vs)
        vsession_on_lost_scan(b->vs, score, tags, n, rep, redis_broker__now_ms(b));
    cr_free(tags);
    cr_free(score);
}

/* struct vsession_ops's scan_lost: the records of a lost pop call. */
int redis_broker__op_scan_lost(void *ctx, const char *score)
{
    struct redis_broker *b = ctx;
    char *arg = cr_strdup(score);
    struct redis_args a;
    int rc;
    if (!arg)
        return CR_ENOMEM;
    redis_args_init(&a);
    redis_args_s(&a, "ZRANGEBYSCORE");
    redis_args_s(&a, b->k_index);
    redis_args_s(&a, score);
    redis_args_s(&a, score);
    rc = redis_broker__send_op(b, b->cmd, on_lost_scan, arg, &a);
    if (rc)
        cr_free(arg);
    redis_args_release(&a);
    return rc;
}

static struct rjob *job_new(struct redis_broker *b, const char *tag, char side)
{
    struct rjob *j = cr_calloc(1, sizeof(*j));
    if (!j)
        return NULL;
    j->b = b;
    j->side = side;
    j->priority = -1;
    j->tag = cr_strdup(tag);
    if (!j->tag) {
        cr_free(j);
        return NULL;
    }
    return j;
}

void redis_broker__job_free(struct rjob *j)
{
    cr_free(j->tag);
    cr_free(j->queue);
    cr_free(j->env);
    cr_free(j->value);
    cr_free(j->renv);
    cr_free(j->exchange);
    cr_free(j->routing_key);
    for (int i = 0; i < j->ntargets; i++)
        cr_free(j->targets[i]);
    cr_free(j->targets);
    cr_free(j);
}

/* The job is over (done, or given up): ours wait for the connection when it
 * was the connection that failed. */
static void job_end(struct rjob *j, int status)
{
    struct redis_broker *b = j->b;
    int round = j->round;
    b->njobs--;
    if ((status == CR_EBACKEND || status == JOB_AGAIN) && !round &&
        !redis_broker__closed(b)) {
        j->next = b->waiting;
        b->waiting = j;
        if (status == JOB_AGAIN)
            vsession_on_restore_refused(b->vs, redis_broker__now_ms(b));
        return;
    }
    redis_broker__job_free(j);
    if (round && b->vs)
        vsession_on_round_job(b->vs);
}

static void on_job_pushed(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct rjob *j = arg;
    if (!status && redis_broker__refused_for_now(r)) {
        job_end(j, JOB_AGAIN);
        return;
    }
    if (!status && redis_broker__is_error(r))
        LOG(LOG_ERROR, "broker: cannot put message %s back: %s", j->tag, r->str);
    else if (!status && r->type == REDIS_REPLY_INTEGER && r->integer == 0 && !j->env)
        LOG(LOG_DEBUG, "broker: message %s settled elsewhere meanwhile", j->tag);
    (void)b;
    job_end(j, status);
}

static int add_target(struct rjob *j, const char *q, size_t n)
{
    char **t = cr_realloc(j->targets, (size_t)(j->ntargets + 1) * sizeof(*t));
    if (!t)
        return CR_ENOMEM;
    j->targets = t;
    t[j->ntargets] = cr_strndup(q, n);
    if (!t[j->ntargets])
        return CR_ENOMEM;
    j->ntargets++;
    return 0;
}

/* The envelope's properties.priority (kombu's scale), 0 when absent. */
static int env_priority(const char *env, size_t len)
{
    cJSON *doc = cJSON_ParseWithLength(env, len);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(doc, "properties");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(p, "priority");
    int v = cJSON_IsNumber(pr) ? (int)pr->valuedouble : 0;
    cJSON_Delete(doc);
    return v < 0 ? 0 : v > KOMBU_PRIORITY_MAX ? KOMBU_PRIORITY_MAX : v;
}

/* The push: with the record (the Lua script, only if the record is still
 * the value read), or without one (never recorded). */
static void job_push(struct rjob *j)
{
    struct redis_broker *b = j->b;
    const char *env = j->env ? j->env : j->renv;
    size_t env_len = j->env ? j->env_len : strlen(j->renv);
    struct buf marked;
    struct redis_args a;
    struct cr_err err;
    int bucket, rc;

    if (j->priority < 0)
        j->priority = env_priority(env, env_len);
    bucket = kombu_bucket(&b->o, j->priority);
    buf_init(&marked);
    redis_args_init(&a);
    rc = kombu_mark_redelivered(env, env_len, &marked, &err);
    if (rc == CR_EDECODE) {
        LOG(LOG_ERROR,
            "broker: the record of message %s is not an envelope; left as "
            "it is",
            j->tag);
        goto out;
    }
    if (rc)
        goto out;
    if (j->env) {
        redis_args_s(&a, j->side == 'R' ? "RPUSH" : "LPUSH");
        redis_broker__args_key(b, &a, j->targets[0], bucket);
        redis_args_add(&a, marked.data, marked.len);
    } else {
        char nkeys[16];
        snprintf(nkeys, sizeof(nkeys), "%d", j->ntargets + 2);
        redis_args_s(&a, "EVAL");
        redis_args_s(&a, redis_broker__restore_lua);
        redis_args_s(&a, nkeys);
        redis_args_s(&a, b->k_unacked);
        redis_args_s(&a, b->k_index);
        for (int i = 0; i < j->ntargets; i++)
            redis_broker__args_key(b, &a, j->targets[i], bucket);
        redis_args_s(&a, j->tag);
        redis_args_add(&a, j->value, j->value_len);
        redis_args_add(&a, marked.data, marked.len);
        redis_args_s(&a, j->side == 'R' ? "R" : "L");
    }
    rc = redis_broker__send_op(b, b->cmd, on_job_pushed, j, &a);
out:
    buf_release(&marked);
    redis_args_release(&a);
    if (rc)
        job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
}

static void on_job_members(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct rjob *j = arg;
    const char *type;
    int topic;
    (void)b;
    if (status || r->type != REDIS_REPLY_ARRAY) {
        job_end(j, status                             ? status
                   : redis_broker__refused_for_now(r) ? JOB_AGAIN
                                                      : CR_EBROKER);
        return;
    }
    type = redis_broker__exchange_type(b, j->exchange);
    topic = type && !strcmp(type, "topic");
    for (size_t i = 0; i < r->elements && i < MEMBERS_MAX; i++) {
        const redisReply *e = r->element[i];
        size_t ql;
        const char *q;
        if (e->type != REDIS_REPLY_STRING ||
            !redis_broker__member_matches(&b->o, e->str, e->len, j->routing_key, topic))
            continue;
        q = redis_broker__member_queue(&b->o, e->str, e->len, &ql);
        if (q && add_target(j, q, ql)) {
            job_end(j, CR_ENOMEM);
            return;
        }
    }
    if (!j->ntargets) {
        /* kombu would delete the record and lose the message: it stays,
         * for whoever binds the queue again. */
        LOG(LOG_WARNING,
            "broker: message %s cannot be restored: no queue bound to "
            "exchange '%s' with key '%s'",
            j->tag, j->exchange, j->routing_key);
        job_end(j, 0);
        return;
    }
    job_push(j);
}

static void on_job_value(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct rjob *j = arg;
    struct cr_err err;
    if (status) {
        job_end(j, status);
        return;
    }
    if (redis_broker__refused_for_now(r)) {
        job_end(j, JOB_AGAIN);
        return;
    }
    if (r->type != REDIS_REPLY_STRING) {
        job_end(j, 0); /* acked or restored meanwhile: nothing to do */
        return;
    }
    j->value = cr_malloc(r->len + 1);
    if (!j->value) {
        job_end(j, CR_ENOMEM);
        return;
    }
    memcpy(j->value, r->str, r->len);
    j->value[r->len] = '\0';
    j->value_len = r->len;
    if (kombu_unacked_decode(j->value, j->value_len, &j->renv, &j->exchange,
                             &j->routing_key, &err)) {
        LOG(LOG_ERROR, "broker: the record of message %s is not kombu's; left as it is",
            j->tag);
        job_end(j, 0);
        return;
    }
    if (j->queue) {
        if (add_target(j, j->queue, strlen(j->queue))) {
            job_end(j, CR_ENOMEM);
            return;
        }
    } else if (!j->exchange[0]) {
        if (add_target(j, j->routing_key, strlen(j->routing_key))) {
            job_end(j, CR_ENOMEM);
            return;
        }
    } else {
        struct redis_args a;
        int rc;
        redis_args_init(&a);
        redis_args_s(&a, "SMEMBERS");
        {
            struct buf k;
            buf_init(&k);
            if (kombu_binding_key(&b->o, j->exchange, &k))
                a.oom = 1;
            else
                redis_args_add(&a, k.data, k.len);
            buf_release(&k);
        }
        rc = redis_broker__send_op(b, b->cmd, on_job_members, j, &a);
        redis_args_release(&a);
        if (rc)
            job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
        return;
    }
    job_push(j);
}

static void job_start(struct rjob *j)
{
    struct redis_broker *b = j->b;
    struct redis_args a;
    int rc;
    b->njobs++;
    if (j->env) {
        if (!j->ntargets && add_target(j, j->queue, strlen(j->queue))) {
            job_end(j, CR_ENOMEM);
            return;
        }
        job_push(j);
        return;
    }
    redis_args_init(&a);
    redis_args_s(&a, "HGET");
    redis_args_s(&a, b->k_unacked);
    redis_args_s(&a, j->tag);
    rc = redis_broker__send_op(b, b->cmd, on_job_value, j, &a);
    redis_args_release(&a);
    if (rc)
        job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
}

/* Puts a held message of ours back: side 'L' for a requeue, 'R' for a
 * restore. Takes h (already unlinked). */
void redis_broker__op_restore(void *ctx, const char *tag, void *data,
                              enum vsession_rec_state st, char side, int round)
{
    struct redis_broker *b = ctx;
    struct held *h = data;
    struct rjob *j = job_new(b, tag, side);
    if (!j) {
        if (h)
            redis_broker__held_free(h);
        if (round)
            vsession_on_round_job(b->vs);
        return;
    }
    j->round = round;
    if (h) {
        j->queue = h->queue;
        h->queue = NULL;
        j->priority = h->priority;
        if (st == VSESSION_REC_POPPED || st == VSESSION_REC_UNTRACKED) {
            /* never recorded: this is pushed as it is */
            j->env = h->env;
            j->env_len = h->env_len;
            h->env = NULL;
        }
        redis_broker__held_free(h);
        if (!j->queue) {
            redis_broker__job_free(j);
            return;
        }
    }
    if (round || redis_conn_up(b->cmd)) {
        job_start(j);
    } else {
        j->next = b->waiting;
        b->waiting = j;
    }
}

void redis_broker__op_restores_again(void *ctx)
{
    struct redis_broker *b = ctx;
    struct rjob *j = b->waiting;
    b->waiting = NULL;
    while (j) {
        struct rjob *next = j->next;
        j->next = NULL;
        job_start(j);
        j = next;
    }
}

static void on_stale(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    const char *tags[RESTORE_ROUND_MAX];
    int n = 0;
    (void)arg;
    if (status || r->type != REDIS_REPLY_ARRAY) {
        vsession_on_round_stale(b->vs, NULL, 0,
                                status == CR_ECANCELED ? VSESSION_CANCELED
                                : status               ? VSESSION_LOST
                                                       : VSESSION_MALFORMED);
        return;
    }
    for (size_t i = 0; i + 1 < r->elements && n < RESTORE_ROUND_MAX; i += 2)
        if (r->element[i]->type == REDIS_REPLY_STRING)
            tags[n++] = r->element[i]->str;
    vsession_on_round_stale(b->vs, tags, n, VSESSION_OK);
}

static void on_locked(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    (void)arg;
    /* nil: held by another restorer */
    vsession_on_round_locked(b->vs, !status && r->type == REDIS_REPLY_STATUS);
}

/* The records older than the visibility timeout, newest first. */
int redis_broker__op_round_scan(void *ctx)
{
    struct redis_broker *b = ctx;
    struct redis_args a;
    char max[64], limit[32];
    long n = RESTORE_ROUND_MAX;
    int rc;
    if (b->o.unacked_restore_limit > 0 && b->o.unacked_restore_limit < n)
        n = b->o.unacked_restore_limit;
    snprintf(max, sizeof(max), "%.7f",
             redis_broker__epoch_s() - b->o.visibility_timeout_s);
    snprintf(limit, sizeof(limit), "%ld", n);
    redis_args_init(&a);
    redis_args_s(&a, "ZREVRANGEBYSCORE");
    redis_args_s(&a, b->k_index);
    redis_args_s(&a, max);
    redis_args_s(&a, "0");
    redis_args_s(&a, "WITHSCORES");
    redis_args_s(&a, "LIMIT");
    redis_args_s(&a, "0");
    redis_args_s(&a, limit);
    rc = redis_broker__send_op(b, b->cmd, on_stale, NULL, &a);
    redis_args_release(&a);
    return rc;
}

void redis_broker__op_round_unlock(void *ctx)
{
    struct redis_broker *b = ctx;
    struct redis_args a;
    redis_args_init(&a);
    redis_args_s(&a, "EVAL");
    redis_args_s(&a, redis_broker__unlock_lua);
    redis_args_s(&a, "1");
    redis_args_s(&a, b->k_mutex);
    redis_args_s(&a, b->token);
    redis_broker__send_op(b, b->cmd, NULL, NULL, &a);
    redis_args_release(&a);
}

/* kombu's restore_visible(): under the mutex, the records older than the
 * visibility timeout go back to their queues. */
int redis_broker__op_round_lock(void *ctx)
{
    struct redis_broker *b = ctx;
    unsigned char rnd[16];
    char px[32];
    struct redis_args a;
    int consumes = 0, rc;
    for (int i = 0; i < b->ncycle; i++) {
        const struct rcons *c = redis_broker__find_cons(b, b->cycle[i]);
        consumes |= c && !c->q.no_ack;
    }
    /* Only a consumer restores (the gateway, which publishes only, does
     * not): it knows its own visibility timeout, and refreshes its leases. */
    if (!consumes || !redis_conn_up(b->cmd))
        return CR_ENOTFOUND;
    redis_broker__random_bytes(rnd, sizeof(rnd));
    for (int i = 0; i < 16; i++)
        snprintf(b->token + 2 * i, 3, "%02x", rnd[i]);
    snprintf(px, sizeof(px), "%ld", (long)(b->o.unacked_mutex_expire_s * 1000));
    redis_args_init(&a);
    redis_args_s(&a, "SET");
    redis_args_s(&a, b->k_mutex);
    redis_args_s(&a, b->token);
    redis_args_s(&a, "PX");
    redis_args_s(&a, px);
    redis_args_s(&a, "NX");
    rc = redis_broker__send_op(b, b->cmd, on_locked, NULL, &a);
    redis_args_release(&a);
    return rc;
}

/* ------------------------------------------------ popped, never delivered */

/* Pushes a raw value back onto the key it was popped from, at the head of
 * the line: it was never delivered. */
void redis_broker__push_back(struct redis_broker *b, const char *key, size_t klen,
                             const char *v, size_t vlen)
{
    struct redis_args a;
    redis_args_init(&a);
    redis_args_s(&a, "RPUSH");
    redis_args_add(&a, key, klen);
    redis_args_add(&a, v, vlen);
    if (redis_broker__send_op(b, b->cmd, NULL, NULL, &a))
        LOG(LOG_ERROR, "broker: cannot push a message back to '%.*s'; it is lost",
            (int)klen, key);
    redis_args_release(&a);
}

/* A popped value that is no envelope we can deliver: it goes whole to the
 * dead-letter queue when there is one (where `celeriac dlq` can show it), and
 * is otherwise dropped with its start in the log. Either way once, never
 * back where it came from (it would come back at once, for ever). */
void redis_broker__set_aside(struct redis_broker *b, const char *key, size_t klen,
                             const char *v, size_t vlen, const char *why)
{
    struct redis_args a;
    if (b->bad_pops++ < 10 || b->bad_pops % 1000 == 0)
        LOG(LOG_ERROR, "broker: bad message on '%.*s' (%s)%s: %.120s", (int)klen, key,
            why, b->cfg.dlq ? "; moved to the dead-letter queue" : "; dropped", v);
    if (!b->cfg.dlq)
        return;
    redis_args_init(&a);
    redis_args_s(&a, "LPUSH");
    redis_broker__args_key(b, &a, b->cfg.dlq, 0);
    redis_args_add(&a, v, vlen);
    if (redis_broker__send_op(b, b->cmd, NULL, NULL, &a))
        LOG(LOG_ERROR, "broker: cannot move a bad message to '%s'; it is lost",
            b->cfg.dlq);
    redis_args_release(&a);
}

/* redis_broker__push_back() of a message the pop script recorded: the push and the
 * removal of its record in one MULTI, so that it is in exactly one of the
 * two places at every instant. A copy of one we hold keeps its record (ours). */
void redis_broker__push_back_rec(struct redis_broker *b, const char *key, size_t klen,
                                 const char *v, size_t vlen, const char *tag)
{
    struct redis_args c[3];
    int rc;
    if (!tag || vsession_held(b->vs, tag)) {
        redis_broker__push_back(b, key, klen, v, vlen);
        return;
    }
    for (int i = 0; i < 3; i++)
        redis_args_init(&c[i]);
    redis_args_s(&c[0], "RPUSH");
    redis_args_add(&c[0], key, klen);
    redis_args_add(&c[0], v, vlen);
    redis_args_s(&c[1], "ZREM");
    redis_args_s(&c[1], b->k_index);
    redis_args_s(&c[1], tag);
    redis_args_s(&c[2], "HDEL");
    redis_args_s(&c[2], b->k_unacked);
    redis_args_s(&c[2], tag);
    rc = redis_broker__send_multi(b, NULL, NULL, c, 3);
    if (rc)
        LOG(LOG_WARNING,
            "broker: cannot push %s back to '%.*s'; it comes back after the "
            "visibility timeout",
            tag, (int)klen, key);
    for (int i = 0; i < 3; i++)
        redis_args_release(&c[i]);
}
