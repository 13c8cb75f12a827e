/* redis_publish.c -- what the Redis transport sends out, as kombu routes
 * it: a message to exchange "" is an LPUSH to the queue named by its routing
 * key; to a fanout exchange a PUBLISH on its channel (both spellings on
 * Sentinel); to any other, an LPUSH to each queue its binding set matches;
 * to the dead-letter exchange, an LPUSH to the dead-letter queue. And the
 * depth polls (LLEN of every priority list). The facts are in
 * docs/internals/redis-broker.md. */
#include "redis_broker_int.h"

#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"
#include "util/uuid.h"

int redis_broker__member_matches(const struct kombu_opts *o, const char *m, size_t n,
                                 const char *rk, int topic)
{
    const char *bk, *pat, *q;
    size_t bk_len, pat_len, q_len;
    if (kombu_binding_parse(o, m, n, &bk, &bk_len, &pat, &pat_len, &q, &q_len))
        return 0;
    if (topic || pat_len)
        return kombu_topic_match(bk, bk_len, rk, strlen(rk));
    return bk_len == strlen(rk) && !memcmp(bk, rk, bk_len);
}

const char *redis_broker__member_queue(const struct kombu_opts *o, const char *m,
                                       size_t n, size_t *len)
{
    const char *bk, *pat, *q;
    size_t bk_len, pat_len;
    if (kombu_binding_parse(o, m, n, &bk, &bk_len, &pat, &pat_len, &q, len))
        return NULL;
    return q;
}

static void confirm(struct redis_broker *b, struct pubop *p)
{
    if (p->cb)
        p->cb(&b->base, !p->failed, p->privdata);
    cr_free(p->env);
    cr_free(p->routing_key);
    cr_free(p);
}

static void on_pushed(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct pubop *p = arg;
    if (status || redis_broker__is_error(r)) {
        if (!status)
            LOG(LOG_WARNING, "broker: publish refused: %s", r->str);
        p->failed = 1;
    }
    if (--p->pending == 0)
        confirm(b, p);
}

static int push_env(struct redis_broker *b, struct pubop *p, const char *queue,
                    size_t qlen)
{
    struct redis_args a;
    char q[KOMBU_NAME_MAX];
    int rc;
    if (qlen >= sizeof(q))
        return CR_EINVAL;
    memcpy(q, queue, qlen);
    q[qlen] = '\0';
    redis_args_init(&a);
    redis_args_s(&a, "LPUSH");
    redis_broker__args_key(b, &a, q, kombu_bucket(&b->o, p->priority));
    redis_args_add(&a, p->env, p->env_len);
    rc = redis_broker__send_op(b, b->cmd, on_pushed, p, &a);
    redis_args_release(&a);
    if (!rc)
        p->pending++;
    return rc;
}

/* Pushes p to every queue of the binding members r (an SMEMBERS reply) that
 * its routing key matches, but skip (already pushed, or NULL); then confirms
 * once the pushes are answered. */
static void push_to_members(struct redis_broker *b, struct pubop *p, const redisReply *r,
                            const char *skip)
{
    int pushed = skip != NULL;
    p->pending = 1; /* held while the pushes go */
    for (size_t i = 0; i < r->elements && i < MEMBERS_MAX; i++) {
        const redisReply *e = r->element[i];
        const char *q;
        size_t ql;
        if (e->type != REDIS_REPLY_STRING ||
            !redis_broker__member_matches(&b->o, e->str, e->len, p->routing_key,
                                          p->topic))
            continue;
        q = redis_broker__member_queue(&b->o, e->str, e->len, &ql);
        if (!q || (skip && ql == strlen(skip) && !memcmp(q, skip, ql)))
            continue;
        if (push_env(b, p, q, ql))
            p->failed = 1;
        pushed = 1;
    }
    if (!pushed)
        LOG(LOG_DEBUG, "broker: no queue bound for key '%s'; message dropped",
            p->routing_key);
    if (--p->pending == 0)
        confirm(b, p);
}

static void on_pub_members(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct pubop *p = arg;
    if (status || r->type != REDIS_REPLY_ARRAY) {
        p->failed = 1;
        confirm(b, p);
        return;
    }
    push_to_members(b, p, r, NULL);
}

/* The EXEC of a publish to our dead-letter exchange (publish_dlx()): binding,
 * push and the exchange's members. */
static void on_dlx_pushed(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct pubop *p = arg;
    if (!redis_broker__exec_ok(status, r) || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_ARRAY) {
        const redisReply *err = r && r->type == REDIS_REPLY_ERROR ? r : NULL;
        for (size_t i = 0; !err && r && r->type == REDIS_REPLY_ARRAY && i < r->elements;
             i++)
            if (r->element[i]->type == REDIS_REPLY_ERROR)
                err = r->element[i];
        if (!status && err)
            LOG(LOG_WARNING, "broker: dead letter refused: %s", err->str);
        p->failed = 1;
        confirm(b, p);
        return;
    }
    push_to_members(b, p, r->element[2], b->cfg.dlq);
}

/* A publish to the dead-letter exchange this worker declared: the dead-letter
 * queue's binding (ours: we declare it at start) is written again in the same
 * MULTI as the push to that queue, so the message lands even when the binding
 * was lost since (a FLUSHDB, a Redis restarted without persistence), where a
 * routed publish would find no member and drop it as kombu does, and a
 * worker that logged "dead-lettered" would have lost it. Other queues bound
 * to the exchange get it as a routed publish would, from the members read in
 * the same step. */
static int publish_dlx(struct redis_broker *b, struct pubop *p)
{
    struct broker_queue q;
    struct buf key, member;
    struct redis_args cmds[3];
    int rc;
    buf_init(&key);
    buf_init(&member);
    for (int i = 0; i < 3; i++)
        redis_args_init(&cmds[i]);
    redis_broker__dlq_binding(b, &q);
    rc = redis_broker__binding_of(b, &q, &key, &member);
    if (!rc) {
        redis_args_s(&cmds[0], "SADD");
        redis_args_add(&cmds[0], key.data, key.len);
        redis_args_add(&cmds[0], member.data, member.len);
        redis_args_s(&cmds[1], "LPUSH");
        redis_broker__args_key(b, &cmds[1], b->cfg.dlq, kombu_bucket(&b->o, p->priority));
        redis_args_add(&cmds[1], p->env, p->env_len);
        redis_args_s(&cmds[2], "SMEMBERS");
        redis_args_add(&cmds[2], key.data, key.len);
        rc = redis_broker__send_multi(b, on_dlx_pushed, p, cmds, 3);
    }
    for (int i = 0; i < 3; i++)
        redis_args_release(&cmds[i]);
    buf_release(&key);
    buf_release(&member);
    return rc;
}

static void on_published(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct pubop *p = arg;
    p->failed = status || redis_broker__is_error(r);
    confirm(b, p);
}

int redis_broker__publish(struct broker *base, const struct outbound *o,
                          broker_confirm_fn *cb, void *privdata)
{
    struct redis_broker *b = (struct redis_broker *)base;
    const char *exchange = o->exchange ? o->exchange : "";
    const char *routing_key = o->routing_key ? o->routing_key : "";
    struct buf env, key;
    struct redis_args a;
    unsigned char rnd[16];
    char tag[CR_UUID_LEN + 1];
    const char *type;
    struct pubop *p;
    int rc;

    if (redis_broker__closed(b) || !redis_conn_up(b->cmd))
        return CR_EBROKER;
    redis_broker__random_bytes(rnd, sizeof(rnd));
    cr_uuid4(rnd, tag);
    buf_init(&env);
    buf_init(&key);
    redis_args_init(&a);
    p = cr_calloc(1, sizeof(*p));
    rc = p ? kombu_msg_encode(o, tag, &env) : CR_ENOMEM;
    if (rc)
        goto fail;
    p->cb = cb;
    p->privdata = privdata;
    /* already kombu's scale; none given is kombu's 0 */
    p->priority = o->priority < 0 ? 0 : o->priority;
    p->routing_key = cr_strdup(routing_key);
    if (!p->routing_key) {
        rc = CR_ENOMEM;
        goto fail;
    }
    type = *exchange ? redis_broker__exchange_type(b, exchange) : "direct";
    if (!*exchange) {
        p->env = buf_detach(&env);
        p->env_len = p->env ? strlen(p->env) : 0;
        if (!p->env) {
            rc = CR_ENOMEM;
            goto fail;
        }
        rc = push_env(b, p, routing_key, strlen(routing_key));
        if (rc)
            goto fail;
    } else if (type && !strcmp(type, "fanout")) {
        rc = kombu_channel(&b->o, b->url.db, exchange, routing_key, &key);
        if (rc)
            goto fail;
        redis_args_s(&a, "PUBLISH");
        redis_args_add(&a, key.data, key.len);
        redis_args_add(&a, env.data, env.len);
        if (redis_broker__sentinel_compat(b)) {
            struct redis_args a2;
            buf_reset(&key);
            rc = kombu_channel(&b->o, -1, exchange, routing_key, &key);
            if (rc)
                goto fail;
            redis_args_init(&a2);
            redis_args_s(&a2, "PUBLISH");
            redis_args_add(&a2, key.data, key.len);
            redis_args_add(&a2, env.data, env.len);
            /* both or neither: the connection is up, so both are taken */
            p->pending = 2;
            rc = redis_broker__send_op(b, b->cmd, on_pushed, p, &a);
            if (!rc && redis_broker__send_op(b, b->cmd, on_pushed, p, &a2))
                p->pending = 1;
            redis_args_release(&a2);
        } else {
            rc = redis_broker__send_op(b, b->cmd, on_published, p, &a);
        }
        if (rc)
            goto fail;
    } else {
        p->topic = type && !strcmp(type, "topic");
        p->env_len = env.len;
        p->env = buf_detach(&env);
        if (!p->env) {
            rc = CR_ENOMEM;
            goto fail;
        }
        if (b->cfg.dlx && b->cfg.dlq && !strcmp(exchange, b->cfg.dlx)) {
            rc = publish_dlx(b, p);
            if (rc)
                goto fail;
        } else {
            rc = kombu_binding_key(&b->o, exchange, &key);
            if (rc)
                goto fail;
            redis_args_s(&a, "SMEMBERS");
            redis_args_add(&a, key.data, key.len);
            rc = redis_broker__send_op(b, b->cmd, on_pub_members, p, &a);
            if (rc)
                goto fail;
        }
    }
    buf_release(&env);
    buf_release(&key);
    redis_args_release(&a);
    return 0;
fail:
    if (p) {
        cr_free(p->env);
        cr_free(p->routing_key);
        cr_free(p);
    }
    buf_release(&env);
    buf_release(&key);
    redis_args_release(&a);
    return rc == CR_EBROKER || rc == CR_ENOMEM ? rc : CR_EBROKER;
}

/* ------------------------------------------------------------ stats */

static void on_stats(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct statop *s = arg;
    uint64_t sum = 0;
    int ok = redis_broker__exec_ok(status, r) && (int)r->elements == s->nkeys;
    if (ok)
        for (size_t i = 0; i < r->elements; i++)
            sum +=
                r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer > 0
                    ? (uint64_t)r->element[i]->integer
                    : 0;
    if (s->prev)
        s->prev->next = s->next;
    else
        b->stats = s->next;
    if (s->next)
        s->next->prev = s->prev;
    /* Redis knows nothing of consumers: 0. */
    if (s->cb)
        s->cb(&b->base, ok, sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum, 0,
              s->privdata);
    cr_free(s);
}

/* The sum of LLEN over the queue's buckets (kombu's _size). */
int redis_broker__queue_stats(struct broker *base, const char *queue,
                              broker_queue_stats_fn *cb, void *privdata)
{
    struct redis_broker *b = (struct redis_broker *)base;
    struct redis_args c[KOMBU_MAX_STEPS];
    struct statop *s;
    int rc;
    if (redis_broker__closed(b) || !redis_conn_up(b->cmd))
        return CR_EBROKER;
    s = cr_calloc(1, sizeof(*s));
    if (!s)
        return CR_ENOMEM;
    s->b = b;
    s->cb = cb;
    s->privdata = privdata;
    s->nkeys = b->o.nsteps;
    for (int i = 0; i < b->o.nsteps; i++) {
        redis_args_init(&c[i]);
        redis_args_s(&c[i], "LLEN");
        redis_broker__args_key(b, &c[i], queue, b->o.steps[i]);
    }
    rc = redis_broker__send_multi(b, on_stats, s, c, b->o.nsteps);
    for (int i = 0; i < b->o.nsteps; i++)
        redis_args_release(&c[i]);
    if (rc) {
        cr_free(s);
        return rc;
    }
    s->next = b->stats;
    if (s->next)
        s->next->prev = s;
    b->stats = s;
    return 0;
}

void redis_broker__queue_stats_cancel(struct broker *base, void *privdata)
{
    struct redis_broker *b = (struct redis_broker *)base;
    for (struct statop *s = b->stats; s; s = s->next)
        if (s->privdata == privdata)
            s->cb = NULL;
}
