/* redis_consumers.c -- the Redis transport's queues: the consumers and their
 * BRPOP cycle, the binding set members kombu reads to route and restore
 * (written at start, removed with a fanout or auto-delete queue), the
 * exchanges declared (kept in memory, as kombu keeps them), and the fanout
 * queues' PSUBSCRIBE patterns with the messages they bring. The facts are
 * in docs/internals/redis-broker.md. */
#include "redis_broker_int.h"

#include <cJSON.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/log.h"

/* Whether fanout channels are also spelt the way kombu < 5.4 spells them on
 * Sentinel ("/{db}." unformatted): subscribed both ways, published both
 * ways, so Python peers of either age hear us and we hear them. */
int redis_broker__sentinel_compat(const struct redis_broker *b)
{
    return b->url.kind == REDIS_URL_SENTINEL && b->o.fanout_prefix == 1;
}

struct rcons *redis_broker__find_cons(struct redis_broker *b, const char *queue)
{
    for (int i = 0; i < b->ncons; i++)
        if (!strcmp(b->cons[i].q.name, queue))
            return &b->cons[i];
    return NULL;
}

const char *redis_broker__exchange_type(const struct redis_broker *b, const char *name)
{
    for (int i = 0; i < b->nex; i++)
        if (!strcmp(b->ex[i].name, name))
            return b->ex[i].type;
    /* kombu's own fanouts, whoever declared them */
    if (!strcmp(name, "celery.pidbox") || !strcmp(name, "celeryev"))
        return "fanout";
    return NULL;
}

/* The binding a queue's declaration writes: exchange (the queue's name for
 * Celery's default direct exchange, as kombu names it) and member. */
int redis_broker__binding_of(struct redis_broker *b, const struct broker_queue *q,
                             struct buf *key, struct buf *member)
{
    const char *ex = q->exchange && *q->exchange ? q->exchange : q->name;
    const char *type = q->exchange_type ? q->exchange_type : "direct";
    const char *rk = q->routing_key ? q->routing_key : "";
    struct buf pat;
    int rc;
    buf_init(&pat);
    buf_reset(key);
    buf_reset(member);
    rc = kombu_binding_key(&b->o, ex, key);
    if (!rc && !strcmp(type, "topic"))
        rc = kombu_topic_pattern(rk, &pat);
    if (!rc)
        rc = kombu_binding_member(&b->o, rk, pat.data ? pat.data : "", q->name, member);
    buf_release(&pat);
    return rc;
}

void redis_broker__send_binding(struct redis_broker *b, const struct broker_queue *q,
                                const char *verb)
{
    struct buf key, member;
    struct redis_args a;
    buf_init(&key);
    buf_init(&member);
    redis_args_init(&a);
    if (redis_broker__binding_of(b, q, &key, &member) == 0) {
        redis_args_s(&a, verb);
        redis_args_add(&a, key.data, key.len);
        redis_args_add(&a, member.data, member.len);
        if (redis_broker__send_op(b, b->cmd, NULL, NULL, &a) == CR_ENOMEM)
            LOG(LOG_ERROR, "broker: out of memory binding queue '%s'", q->name);
    }
    redis_args_release(&a);
    buf_release(&key);
    buf_release(&member);
}

/* The dead-letter queue's binding: topic "#", so every dead letter and every
 * restore through the dead-letter exchange reaches it. */
void redis_broker__dlq_binding(const struct redis_broker *b, struct broker_queue *q)
{
    memset(q, 0, sizeof(*q));
    q->name = b->cfg.dlq;
    q->exchange = b->cfg.dlx;
    q->exchange_type = "topic";
    q->routing_key = "#";
}

void redis_broker__send_dlq_binding(struct redis_broker *b)
{
    struct broker_queue q;
    if (!b->cfg.dlx || !b->cfg.dlq)
        return;
    redis_broker__dlq_binding(b, &q);
    redis_broker__send_binding(b, &q, "SADD");
}

static void rebuild_cycle(struct redis_broker *b)
{
    const char *old[MAX_CONSUMERS];
    int nold = b->ncycle, n = 0;
    memcpy(old, b->cycle, sizeof(old));
    /* Keep the current order of the queues still consumed, then the new. */
    for (int i = 0; i < nold; i++) {
        struct rcons *c = redis_broker__find_cons(b, old[i]);
        if (c && !c->fanout && !c->q.no_consume)
            b->cycle[n++] = c->q.name;
    }
    for (int i = 0; i < b->ncons; i++) {
        struct rcons *c = &b->cons[i];
        int seen = 0;
        if (c->fanout || c->q.no_consume)
            continue;
        for (int k = 0; k < n; k++)
            if (b->cycle[k] == c->q.name)
                seen = 1;
        if (!seen)
            b->cycle[n++] = c->q.name;
    }
    b->ncycle = n;
    if (b->o.order == KOMBU_ORDER_SORTED)
        kombu_initial_order(&b->o, b->cycle, n);
}

void redis_broker__cons_release(struct rcons *c)
{
    broker_queue_release(&c->q);
    cr_free(c->pattern);
    cr_free(c->pattern2);
    memset(c, 0, sizeof(*c));
}

int redis_broker__add_consumer(struct broker *base, const struct broker_queue *q)
{
    struct redis_broker *b = (struct redis_broker *)base;
    struct rcons *c;
    if (redis_broker__find_cons(b, q->name))
        return 0;
    if (b->ncons == MAX_CONSUMERS)
        return CR_ERANGE;
    if (strlen(q->name) >= KOMBU_NAME_MAX)
        return CR_ERANGE;
    c = &b->cons[b->ncons];
    memset(c, 0, sizeof(*c));
    if (broker_queue_copy(&c->q, q))
        return CR_ENOMEM;
    c->fanout = q->exchange_type && !strcmp(q->exchange_type, "fanout");
    if (c->fanout) {
        struct buf p;
        const char *ex = c->q.exchange ? c->q.exchange : "";
        const char *rk = c->q.routing_key ? c->q.routing_key : "";
        buf_init(&p);
        if (kombu_channel_pattern(&b->o, b->url.db, ex, rk, &p) == 0)
            c->pattern = buf_detach(&p);
        buf_reset(&p);
        if (redis_broker__sentinel_compat(b) &&
            kombu_channel_pattern(&b->o, -1, ex, rk, &p) == 0)
            c->pattern2 = buf_detach(&p);
        buf_release(&p);
    }
    if (c->fanout &&
        (!c->pattern || (redis_broker__sentinel_compat(b) && !c->pattern2))) {
        redis_broker__cons_release(c);
        return CR_ENOMEM;
    }
    b->ncons++;
    rebuild_cycle(b);
    if (redis_conn_up(b->cmd))
        redis_broker__send_binding(b, &c->q, "SADD");
    if (c->fanout && redis_conn_up(b->sub))
        redis_broker__psubscribe(b, c, "PSUBSCRIBE");
    return 0;
}

static int pattern_used(const struct redis_broker *b, const char *pattern)
{
    for (int i = 0; i < b->ncons; i++)
        if (b->cons[i].fanout && !strcmp(b->cons[i].pattern, pattern))
            return 1;
    return 0;
}

/* A fanout or auto-delete queue goes with its binding, as kombu's queue
 * deletion removes it; a task queue's binding stays, since restores of its
 * messages through a named exchange need it whoever consumes. */
int redis_broker__cancel_consumer(struct broker *base, const char *queue)
{
    struct redis_broker *b = (struct redis_broker *)base;
    struct rcons *c = redis_broker__find_cons(b, queue), gone;
    int i;
    if (!c)
        return CR_ENOTFOUND;
    i = (int)(c - b->cons);
    gone = *c;
    memmove(c, c + 1, (size_t)(b->ncons - i - 1) * sizeof(*c));
    b->ncons--;
    if ((gone.fanout || gone.q.auto_delete) && redis_conn_up(b->cmd))
        redis_broker__send_binding(b, &gone.q, "SREM");
    if (gone.fanout && !pattern_used(b, gone.pattern) && redis_conn_up(b->sub))
        redis_broker__psubscribe(b, &gone, "PUNSUBSCRIBE");
    /* the cycle borrows the names: rebuilt before the strings go */
    rebuild_cycle(b);
    redis_broker__cons_release(&gone);
    return 0;
}

void redis_broker__each_consumer(const struct broker *base,
                                 void (*fn)(const struct broker_queue *q, void *arg),
                                 void *arg)
{
    const struct redis_broker *b = (const struct redis_broker *)base;
    for (int i = 0; i < b->ncons; i++)
        if (!b->cons[i].q.no_consume)
            fn(&b->cons[i].q, arg);
}

int redis_broker__declare_exchange(struct broker *base, const char *name,
                                   const char *type, int durable)
{
    struct redis_broker *b = (struct redis_broker *)base;
    (void)durable; /* kombu keeps exchanges in memory only: nothing is written */
    for (int i = 0; i < b->nex; i++)
        if (!strcmp(b->ex[i].name, name))
            return 0;
    if (b->nex == MAX_EXCHANGES)
        return CR_ERANGE;
    b->ex[b->nex].name = cr_strdup(name);
    b->ex[b->nex].type = cr_strdup(type);
    if (!b->ex[b->nex].name || !b->ex[b->nex].type) {
        cr_free(b->ex[b->nex].name);
        cr_free(b->ex[b->nex].type);
        return CR_ENOMEM;
    }
    b->nex++;
    return 0;
}

/* ------------------------------------------------------------ pub/sub */

static void on_pmessage(struct redis_req *req, int status, struct redisReply *rr)
{
    struct redis_broker *b = req->data;
    redisReply *r = (redisReply *)rr;
    const redisReply *pat, *data;
    if (!status && r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        !strcmp(r->element[0]->str, "psubscribe") && b->psub_unconfirmed > 0)
        b->psub_unconfirmed--;
    if (status || redis_broker__stopping(b) || r->type != REDIS_REPLY_ARRAY ||
        r->elements != 4 || r->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(r->element[0]->str, "pmessage"))
        return;
    pat = r->element[1];
    data = r->element[3];
    /* (the confirmations are 3-element arrays, counted below) */
    if (pat->type != REDIS_REPLY_STRING || data->type != REDIS_REPLY_STRING)
        return;
    for (int i = 0; i < b->ncons; i++) {
        struct rcons *c = &b->cons[i];
        struct kombu_msg km;
        struct cr_err err;
        int rc;
        if (!c->fanout || (strcmp(c->pattern, pat->str) &&
                           (!c->pattern2 || strcmp(c->pattern2, pat->str))))
            continue;
        memset(&err, 0, sizeof(err));
        rc = redis_broker__body_bound(b) && data->len > redis_broker__body_bound(b)
                 ? CR_ETOOBIG
                 : kombu_msg_decode(&km, data->str, data->len,
                                    redis_broker__body_bound(b), &err);
        if (rc) {
            if (b->bad_pops++ < 10)
                LOG(LOG_WARNING, "broker: bad message on channel '%s': %s",
                    r->element[2]->type == REDIS_REPLY_STRING ? r->element[2]->str : "?",
                    err.msg[0] ? err.msg : cr_strerror(rc));
            return;
        }
        /* on_delivery may cancel consumers: the loop checks the count again */
        redis_broker__deliver(b, &km, c->q.name, 1);
        kombu_msg_release(&km);
        if (redis_broker__closed(b))
            return;
    }
}

void redis_broker__psubscribe(struct redis_broker *b, const struct rcons *c,
                              const char *verb)
{
    const char *argv[3] = {verb, c->pattern, c->pattern2};
    b->psub_req.data = b;
    if (redis_conn_send_pubsub(b->sub, &b->psub_req, on_pmessage, c->pattern2 ? 3 : 2,
                               argv, NULL))
        LOG(LOG_WARNING, "broker: cannot %s '%s'", verb, c->pattern);
    else if (!strcmp(verb, "PSUBSCRIBE"))
        b->psub_unconfirmed += c->pattern2 ? 2 : 1;
}
