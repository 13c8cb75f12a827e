/* redis_broker_int.h -- the Redis transport's insides, shared by its files:
 * net/redis_broker.c (the connections, the replies, the Lua text, the face),
 * net/redis_consumers.c (queues, bindings, exchanges, pub/sub),
 * net/redis_restore.c (kombu's restore transaction, the records of lost pop
 * calls, restore rounds) and net/redis_publish.c (routing what is sent out,
 * depth polls). Nothing else includes it. */
#ifndef CR_REDIS_BROKER_INT_H
#define CR_REDIS_BROKER_INT_H

#include <hiredis/hiredis.h>
#include <stdint.h>
#include <uv.h>

#include "broker_int.h"
#include "protocol/kombu.h"
#include "redis.h"
#include "util/buf.h"
#include "util/sha1.h"
#include "vsession.h"

#define MAX_CONSUMERS 64
#define MAX_EXCHANGES 32
#define TICK_MS 250
/* Records looked at per restore round, at most (unacked_restore_limit, if
 * set, is used when smaller): a backlog is worked through over rounds. */
#define RESTORE_ROUND_MAX 1000
/* Binding members read per named-exchange publish or restore, at most. */
#define MEMBERS_MAX 4096

struct redis_broker;

/* A job_end() status: Redis refused a step for now (LOADING after a
 * restart, READONLY, NOREPLICAS...: redis_refusal_passes()); the job waits
 * and starts over a tick later, with the connection still up. */
#define JOB_AGAIN 1

/* One command's registration; freed after its reply. fn gets CR_ECANCELED
 * (and no reply) from inside broker_free(). */
typedef void op_fn(struct redis_broker *b, int status, redisReply *r, void *arg);
struct op {
    struct redis_req req; /* first: the reply callback casts back */
    struct redis_broker *b;
    op_fn *fn;
    void *arg;
};

struct rcons {
    struct broker_queue q; /* owned copies */
    int fanout;            /* consumed through PSUBSCRIBE */
    char *pattern;         /* its PSUBSCRIBE pattern (fanout only) */
    /* Sentinel: kombu < 5.4 never formats the fanout prefix there, so its
     * peers use "/{db}." literally: that spelling too, or NULL. */
    char *pattern2;
};

/* What a popped delivery with acks needs beside its session record (net/
 * vsession.h keeps its tag, state and copies). */
struct held {
    char *queue;  /* the queue it was popped from */
    int priority; /* kombu's scale: the bucket of its restore */
    /* What the record needs, kept until it is in Redis (and for good
     * without ack_emulation, for a requeue). */
    char *env;
    size_t env_len;
    char *exchange, *routing_key;
};

/* One requeue or restore, ours or a dead worker's. */
struct rjob {
    struct redis_broker *b;
    char *tag;
    char *queue;  /* NULL: routed by the record's exchange and routing key */
    int priority; /* kombu's; -1: read from the envelope */
    char side;    /* 'L' requeue (tail), 'R' restore (head of the line) */
    int round;    /* part of a restore_visible() round */
    char *env;    /* never recorded: this is pushed as it is */
    size_t env_len;
    char *value; /* the record read */
    size_t value_len;
    char *renv; /* its envelope */
    char *exchange, *routing_key;
    char **targets;
    int ntargets;
    struct rjob *next; /* waiting for the command connection */
};

struct pubop {
    broker_confirm_fn *cb;
    void *privdata;
    char *env;
    size_t env_len;
    int priority; /* kombu's */
    char *routing_key;
    int topic; /* the exchange was declared topic */
    int pending, failed;
};

struct statop {
    struct redis_broker *b;
    broker_queue_stats_fn *cb; /* NULL once cancelled */
    void *privdata;
    int nkeys;
    struct statop *prev, *next;
};

struct exch {
    char *name;
    char *type;
};

struct redis_broker {
    struct broker base; /* first: the face */
    uv_loop_t *loop;
    struct broker_config cfg;
    broker_delivery_fn *on_delivery;
    broker_conn_fn *on_conn;
    void *privdata;
    struct kombu_opts o;
    struct redis_url url;
    char shown_url[512];
    struct redis_conn *cmd, *pop, *sub;
    struct redis_req psub_req; /* every PSUBSCRIBE's: replies name the pattern */
    /* Patterns PSUBSCRIBEd on this pub/sub connection and not yet confirmed:
     * start-up waits for them, so that a control request sent right after
     * "ready." is heard. */
    int psub_unconfirmed;
    char probe_channel[KOMBU_NAME_MAX + 32];
    const char *probe_argv[2];
    int up_said; /* what on_conn heard last */
    int ever_up;
    /* what to pop and when, the records held, acks, leases, restore rounds
     * (NULL only while it is made or once it is freed) */
    struct vsession *vs;
    char *k_unacked, *k_index, *k_mutex;

    struct rcons cons[MAX_CONSUMERS];
    int ncons;
    const char *cycle[MAX_CONSUMERS]; /* BRPOP order (names borrowed from cons) */
    int ncycle;
    struct exch ex[MAX_EXCHANGES];
    int nex;

    /* BRPOP */
    struct buf pop_store;
    int client_id_state; /* 0 unknown, 1 asked, 2 known (on this connection) */
    long long client_id;
    unsigned long bad_pops;
    /* the pop script (pop_lua), on the same connection as the BRPOP, never
     * both at once */
    char pop_sha[SHA1_HEX_LEN + 1];
    int script_loaded; /* SCRIPT LOAD sent on this connection */
    /* our restores waiting for the command connection */
    struct rjob *waiting;
    int njobs; /* restore jobs in flight */

    struct statop *stats;

    uv_prepare_t prepare;
    uv_timer_t tick;
    int nclosed;
    char token[33]; /* the restore round's mutex token */
};

/* The session's life, as the glue asks it. */
static inline int redis_broker__closed(const struct redis_broker *b)
{
    return !b->vs || vsession_state(b->vs) == VSESSION_CLOSED;
}

/* draining or closed: nothing more reaches the owner */
static inline int redis_broker__stopping(const struct redis_broker *b)
{
    return !b->vs || vsession_state(b->vs) >= VSESSION_DRAINING;
}

static inline int redis_broker__consuming(const struct redis_broker *b)
{
    return b->vs && vsession_state(b->vs) == VSESSION_CONSUMING;
}

/* ------------------------------------------------ redis_broker.c */

extern const char redis_broker__unlock_lua[];
extern const char redis_broker__restore_lua[];
uint64_t redis_broker__now_ms(const struct redis_broker *b);
double redis_broker__epoch_s(void);
/* Sends one command on c. Returns 0 (fn, if any, is called exactly once,
 * later) or CR_EBROKER / CR_ENOMEM (never called). */
int redis_broker__send_op(struct redis_broker *b, struct redis_conn *c, op_fn *fn,
                          void *arg, struct redis_args *a);
/* MULTI, the commands, EXEC: fn gets EXEC's reply. Same return as send_op(). */
int redis_broker__send_multi(struct redis_broker *b, op_fn *fn, void *arg,
                             struct redis_args *cmds, int n);
int redis_broker__is_error(const redisReply *r);
/* Redis refused for now (LOADING, READONLY, ...): try again later. */
int redis_broker__refused_for_now(const redisReply *r);
int redis_broker__exec_ok(int status, const redisReply *r);
/* Adds the key of queue's bucket (prefixed) to a. */
void redis_broker__args_key(struct redis_broker *b, struct redis_args *a,
                            const char *queue, int bucket);
void redis_broker__random_bytes(unsigned char *p, size_t n);

void redis_broker__held_free(struct held *h);
/* What a popped value may weigh (0: no bound). */
size_t redis_broker__body_bound(const struct redis_broker *b);
/* Hands a decoded message to the owner (km's parts taken). */
void redis_broker__deliver(struct redis_broker *b, struct kombu_msg *km,
                           const char *queue, int no_ack);

/* ------------------------------------------------ redis_consumers.c */

/* SADD or SREM of q's binding set member. */
void redis_broker__send_binding(struct redis_broker *b, const struct broker_queue *q,
                                const char *verb);
void redis_broker__send_dlq_binding(struct redis_broker *b);
/* PSUBSCRIBE or PUNSUBSCRIBE of c's patterns. */
void redis_broker__psubscribe(struct redis_broker *b, const struct rcons *c,
                              const char *verb);
void redis_broker__cons_release(struct rcons *c);
/* A declared exchange's type, or NULL. */
const char *redis_broker__exchange_type(const struct redis_broker *b, const char *name);
struct rcons *redis_broker__find_cons(struct redis_broker *b, const char *queue);
void redis_broker__dlq_binding(const struct redis_broker *b, struct broker_queue *q);
/* The binding set member of q (and its key). */
int redis_broker__binding_of(struct redis_broker *b, const struct broker_queue *q,
                             struct buf *key, struct buf *member);
/* Fanout channels spelt kombu < 5.4's way on Sentinel too. */
int redis_broker__sentinel_compat(const struct redis_broker *b);
/* broker_add_consumer(), broker_cancel_consumer(), broker_each_consumer(),
 * broker_declare_exchange(). */
int redis_broker__add_consumer(struct broker *base, const struct broker_queue *q);
int redis_broker__cancel_consumer(struct broker *base, const char *queue);
void redis_broker__each_consumer(const struct broker *base,
                                 void (*fn)(const struct broker_queue *q, void *arg),
                                 void *arg);
int redis_broker__declare_exchange(struct broker *base, const char *name,
                                   const char *type, int durable);

/* ------------------------------------------------ redis_publish.c */

/* Whether binding member m (n bytes) routes routing key rk. */
int redis_broker__member_matches(const struct kombu_opts *o, const char *m, size_t n,
                                 const char *rk, int topic);
const char *redis_broker__member_queue(const struct kombu_opts *o, const char *m,
                                       size_t n, size_t *len);
/* broker_publish(), broker_queue_stats(), broker_queue_stats_cancel(). */
int redis_broker__publish(struct broker *base, const struct outbound *o,
                          broker_confirm_fn *cb, void *privdata);
int redis_broker__queue_stats(struct broker *base, const char *queue,
                              broker_queue_stats_fn *cb, void *privdata);
void redis_broker__queue_stats_cancel(struct broker *base, void *privdata);

/* ------------------------------------------------ redis_restore.c */

void redis_broker__job_free(struct rjob *j);
/* A popped value never delivered goes back to the head of key's list; with
 * its record removed in the same MULTI when the pop script wrote one under
 * tag (and we hold no copy). */
void redis_broker__push_back(struct redis_broker *b, const char *key, size_t klen,
                             const char *v, size_t vlen);
void redis_broker__push_back_rec(struct redis_broker *b, const char *key, size_t klen,
                                 const char *v, size_t vlen, const char *tag);
/* A popped value that is no envelope: to the dead-letter queue, or dropped. */
void redis_broker__set_aside(struct redis_broker *b, const char *key, size_t klen,
                             const char *v, size_t vlen, const char *why);
/* struct vsession_ops's restores_again: starts the restores that waited for
 * the commands connection or were refused for now. */
void redis_broker__op_restores_again(void *ctx);
/* struct vsession_ops's scan_lost: asks for the records of a lost pop call. */
int redis_broker__op_scan_lost(void *ctx, const char *score);
/* struct vsession_ops's restore and round_*. */
void redis_broker__op_restore(void *ctx, const char *tag, void *data,
                              enum vsession_rec_state st, char side, int round);
int redis_broker__op_round_lock(void *ctx);
int redis_broker__op_round_scan(void *ctx);
void redis_broker__op_round_unlock(void *ctx);

#endif
