/* redis_broker.c -- kombu's Redis transport behind net/broker.h.
 *
 * Three connections (net/redis.h), as kombu keeps them: one blocked in BRPOP,
 * one for every other command (records, acks, restores, publishes, bindings,
 * depth polls), one subscribed (PSUBSCRIBE) for fanout queues. The wire format
 * is protocol/kombu.h's; the facts are in docs/internals/redis-broker.md.
 *
 * The life of a task message: a Lua script (pop_lua) pops it and records it
 * (ZADD unacked_index, HSET unacked) in one atomic step, a batch at a time,
 * then it is handed to the owner. When the script finds the queues empty a
 * BRPOP waits for the next message; what the BRPOP pops is recorded before
 * anything else (MULTI ZADD unacked_index / HSET unacked / EXEC), as kombu
 * does, and the script takes over again at once. While it is held its score
 * in unacked_index is refreshed, so no restorer anywhere (a Python worker,
 * `celery inspect`) takes it back. An ack removes the record; a requeue or a
 * restore moves the record back onto its list in one Lua script that checks
 * the record is still the one read. Dead workers' records are moved back by
 * restore_visible() under kombu's mutex.
 *
 * Deliveries stay settleable across reconnects: a record lives in Redis, not
 * in a connection, so broker_generation() never changes and acks made while
 * a connection is down are sent when it is back. */
#include "broker_int.h"

#include <hiredis/hiredis.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "protocol/kombu.h"
#include "redis.h"
#include "vsession.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/redact.h"
#include "util/sha1.h"
#include "util/strmap.h"
#include "util/uuid.h"

#define MAX_CONSUMERS 64
#define MAX_EXCHANGES 32
#define TICK_MS 250
/* The lease refresh runs every visibility_timeout / 3, but at least once a
 * minute: a peer with a shorter visibility timeout than ours (Python workers
 * and every `celery inspect` client restore with their own) then still sees
 * fresh scores as long as its timeout is above a minute; and at most once a
 * second, for the short timeouts tests use. Its cost is one ZADD per held
 * message per period, pipelined. */
#define LEASE_MIN_MS 1000
#define LEASE_MAX_MS 60000
/* restore_visible() of dead workers' records: at start and then this often
 * (a Python worker scans every ~100 s). */
#define RESTORE_EVERY_MS 60000
/* Records looked at per restore round, at most (unacked_restore_limit, if
 * set, is used when smaller): a backlog is worked through over rounds. */
#define RESTORE_ROUND_MAX 1000
/* Binding members read per named-exchange publish or restore, at most. */
#define MEMBERS_MAX 4096
/* Tags per ack or lease command. */
#define BATCH_MAX 512
/* broker_free() waits this long, at most, for its restores and last acks. */
#define FREE_WAIT_MS 3000
/* A BRPOP answered with an error waits this long before the next one. */
#define POP_PAUSE_MS 1000
/* Messages per pop script call, at most (within the prefetch room), and
 * calls in flight at once, so that Redis pops the next batches while we take
 * in the last; more of both, and each reply read whole (redis_conn_read_on()),
 * while the window has POP_WIDE_ROOM free or more. A wide window then fills
 * in a few loop turns, as RabbitMQ fills it: with 64, two calls and 16 KB read
 * per turn, a turn long with finished calls took in a few dozen messages, and
 * 10,000 one-second calls took 1.2x AMQP's time. A narrow window turns over
 * quickly, and there small calls whose replies come in a piece a turn,
 * interleaved with the result writes on the same Redis, keep Redis and the
 * worker busy at once: the wide settings cost it a third of its dispatch rate
 * (docs/benchmarks.md). The byte bound of a call's envelopes (past its first)
 * keeps what is in flight near 4 MB whatever they weigh. */
#define POP_BATCH 64
#define POP_CALLS 2
#define POP_WIDE_ROOM 1024
#define POP_WIDE_BATCH 256
#define POP_WIDE_CALLS 4
#define POP_BATCH_BYTES (1024 * 1024)
/* Script failures in a row after which we keep to BRPOP alone for a while:
 * a server without scripting, or one that refuses it. */
#define POP_SCRIPT_TRIES 10
#define POP_SCRIPT_RETRY_MS 60000

/* Deletes the lock only while it still holds our token. */
static const char unlock_lua[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                 "return redis.call('DEL', KEYS[1]) end return 0";
/* kombu's restore as one script: the record is removed and the message pushed
 * only if the record is still the value we read (nobody acked, restored or
 * re-recorded it meanwhile). KEYS: unacked, unacked_index, target lists.
 * ARGV: tag, value read, envelope to push, "R" (RPUSH: head of the line) or
 * "L" (LPUSH: the tail). */
static const char restore_lua[] =
    "if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end "
    "redis.call('ZREM', KEYS[2], ARGV[1]) redis.call('HDEL', KEYS[1], ARGV[1]) "
    "for i = 3, #KEYS do if ARGV[4] == 'R' then redis.call('RPUSH', KEYS[i], ARGV[3]) "
    "else redis.call('LPUSH', KEYS[i], ARGV[3]) end end return 1";

/* Pops up to ARGV[1] messages from KEYS[3..] in that order (BRPOP's:
 * priority-major, then the cycle; from the right end, as BRPOP), and records
 * each one (KEYS[1] unacked, KEYS[2] unacked_index) in the same atomic step,
 * so no message is ever out of its list without its record, even if we die
 * between the pop and its reply. ARGV[2] is the score (our clock, as the
 * MULTI record writes it: no TIME, so that any Redis with scripting, 2.6 on,
 * runs it), ARGV[3] the largest value recorded (0: any), ARGV[4] the bytes of
 * values one call returns (it stops before a value that would pass them,
 * never before the first), ARGV[4 + i] "1" when KEYS[2 + i]'s messages are
 * recorded ("0": a no_ack queue). The value is
 * kombu's [envelope, exchange, routing_key], the envelope embedded as it lay
 * in the list; a string with nothing JSON escapes is quoted as is, the same
 * bytes as kombu_unacked_encode() writes; any other goes through
 * cjson.encode, valid JSON that kombu reads the same (it writes '/' as
 * "\/" and leaves UTF-8 unescaped). A value it cannot decode, or without a
 * delivery tag, is popped unrecorded (the C side then records it, or sets it
 * aside). Each message is read (LINDEX) and recorded before it is popped,
 * with pcall: a refused write (maxmemory) ends the batch with the message
 * still in its list, never popped without a record. The tag, exchange and
 * routing key are found with plain substring searches when the properties are
 * laid out as kombu writes them and their values hold no escape: a
 * cjson.decode of the whole envelope cost Redis about 20 us of the script's
 * 45-70 us per message (a Lua pattern match costs as much). An unescaped
 * JSON string is its own bytes, so a value read that way is what a decoder
 * reads; a layout that fools the search (a header key named "properties")
 * is caught by the C side, which checks all three against its own decode and
 * writes the record again when one differs. Returns key, value, tag (empty:
 * not recorded), exchange, routing key quintuples, and a last "+" when the
 * byte bound ended the call (the queues are not dry). */
static const char pop_lua[] =
    "local function q(s) if s:find('[%c\"\\\\\\128-\\255]') then "
    "return cjson.encode(s) end return '\"' .. s .. '\"' end "
    "local P, X, R, T = '\"properties\": {', '\"delivery_info\": {\"exchange\": \"', "
    "'\", \"routing_key\": \"', '\"delivery_tag\": \"' "
    "local function rec(v) "
    "local i = v:find(P, 1, true) "
    "local a = i and v:find(X, i, true) local t = i and v:find(T, i, true) "
    "if a and t then "
    "a = a + #X t = t + #T "
    "local ae = v:find('\"', a, true) local te = v:find('\"', t, true) "
    "if ae and te and te > t and v:sub(ae, ae + #R - 1) == R then "
    "local r = ae + #R local re = v:find('\"', r, true) "
    "if re and v:sub(re, re + 1) == '\"}' then "
    "local e, k, g = v:sub(a, ae - 1), v:sub(r, re - 1), v:sub(t, te - 1) "
    "if not (e .. k .. g):find('\\\\', 1, true) then return g, e, k end end end end "
    "local ok, m = pcall(cjson.decode, v) "
    "local pp = ok and type(m) == 'table' and m.properties "
    "local d = type(pp) == 'table' and pp.delivery_info "
    "if type(d) == 'table' and type(pp.delivery_tag) == 'string' and "
    "#pp.delivery_tag > 0 and type(d.exchange) == 'string' and "
    "type(d.routing_key) == 'string' then "
    "return pp.delivery_tag, d.exchange, d.routing_key end end "
    "local n = tonumber(ARGV[1]) local lim = tonumber(ARGV[3]) "
    "local budget = tonumber(ARGV[4]) "
    "local out = {} local got = 0 local k = 3 local bytes = 0 local cut = false "
    "while got < n and k <= #KEYS do "
    "local v = redis.call('LINDEX', KEYS[k], -1) "
    "if not v then k = k + 1 "
    "elseif got > 0 and bytes + #v > budget then cut = true break else "
    "bytes = bytes + #v "
    "local tag, ex, rk = '', '', '' "
    "if ARGV[k + 2] == '1' and (lim == 0 or #v <= lim) then "
    "local t, e, r = rec(v) "
    "if t then "
    "local x = redis.pcall('ZADD', KEYS[2], ARGV[2], t) "
    "if type(x) == 'table' and x.err then break end "
    "x = redis.pcall('HSET', KEYS[1], t, '[' .. v .. ', ' .. q(e) .. ', ' .. q(r) .. "
    "']') "
    "if type(x) == 'table' and x.err then "
    "redis.call('ZREM', KEYS[2], t) break end "
    "tag, ex, rk = t, e, r end end "
    "redis.call('RPOP', KEYS[k]) got = got + 1 "
    "out[#out + 1] = KEYS[k] out[#out + 1] = v out[#out + 1] = tag "
    "out[#out + 1] = ex out[#out + 1] = rk end end "
    "if cut then out[#out + 1] = '+' end "
    "return out";

struct redis_broker;

/* Pop script calls whose lost replies are remembered, at most (POP_WIDE_CALLS
 * are in flight at a time; older ones are left to the visibility timeout). */
#define LOST_MAX 8

/* A job_end() status: Redis refused a step for now (LOADING after a
 * restart, READONLY, NOREPLICAS...: redis_refusal_passes()); the job waits
 * and starts over a tick later, with the connection still up. */
#define JOB_AGAIN 1

/* ------------------------------------------------------------ commands */

/* One command's registration; freed after its reply. fn gets CR_ECANCELED
 * (and no reply) from inside broker_free(). */
typedef void op_fn(struct redis_broker *b, int status, redisReply *r, void *arg);
struct op {
    struct redis_req req; /* first: the reply callback casts back */
    struct redis_broker *b;
    op_fn *fn;
    void *arg;
};

/* Arguments of one command, gathered in one buffer. */
struct args {
    struct buf store;
    size_t *off, *len;
    const char **argv;
    int n, cap;
    int oom;
};

static void args_init(struct args *a)
{
    memset(a, 0, sizeof(*a));
    buf_init(&a->store);
}

static void args_release(struct args *a)
{
    buf_release(&a->store);
    cr_free(a->off);
    cr_free(a->len);
    cr_free(a->argv);
}

static void args_add(struct args *a, const void *p, size_t n)
{
    if (a->oom)
        return;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        size_t *off = cr_realloc(a->off, (size_t)cap * sizeof(*off));
        size_t *len = off ? cr_realloc(a->len, (size_t)cap * sizeof(*len)) : NULL;
        if (off)
            a->off = off;
        if (!off || !len) {
            a->oom = 1;
            return;
        }
        a->len = len;
        a->cap = cap;
    }
    a->off[a->n] = a->store.len;
    a->len[a->n] = n;
    /* A NUL after each, so that an empty argument still has a byte. */
    if (buf_append(&a->store, p, n) || buf_putc(&a->store, '\0')) {
        a->oom = 1;
        return;
    }
    a->n++;
}

static void args_s(struct args *a, const char *s)
{
    args_add(a, s, strlen(s));
}

/* The argv of the arguments gathered, or NULL on OOM. Valid until the next
 * args_add(). */
static const char **args_argv(struct args *a)
{
    if (a->oom)
        return NULL;
    cr_free(a->argv);
    a->argv = cr_malloc((size_t)(a->n ? a->n : 1) * sizeof(*a->argv));
    if (!a->argv)
        return NULL;
    for (int i = 0; i < a->n; i++)
        a->argv[i] = a->store.data + a->off[i];
    return a->argv;
}

/* ------------------------------------------------------------ state */

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
    broker_msg_fn *on_msg;
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
    /* The scores of pop script calls whose reply was lost (the connection
     * went): if the script ran, its messages are recorded under that exact
     * score and held by nobody. recover_lost() gives them back at once
     * rather than after the visibility timeout. */
    char lost_scores[LOST_MAX][32];
    int nlost;
    uint64_t again_due; /* refused jobs or scans go again then (0: none) */

    /* our restores waiting for the command connection */
    struct rjob *waiting;
    int njobs; /* restore jobs in flight */

    struct statop *stats;

    uv_prepare_t prepare;
    uv_timer_t tick;
    int nclosed;
    char token[33]; /* the restore round's mutex token */
};

static void job_start(struct rjob *j);
static struct rjob *job_new(struct redis_broker *b, const char *tag, char side);
static void job_free(struct rjob *j);

/* The session's life, as the glue asks it. */
static int closed(const struct redis_broker *b)
{
    return !b->vs || vsession_state(b->vs) == VSESSION_CLOSED;
}

/* draining or closed: nothing more reaches the owner */
static int stopping(const struct redis_broker *b)
{
    return !b->vs || vsession_state(b->vs) >= VSESSION_DRAINING;
}

static int consuming(const struct redis_broker *b)
{
    return b->vs && vsession_state(b->vs) == VSESSION_CONSUMING;
}

static uint64_t now_ms(const struct redis_broker *b)
{
    return uv_now(b->loop);
}

static double epoch_s(void)
{
    return (double)clock_epoch_us() / 1e6;
}

static void on_op(struct redis_req *req, int status, struct redisReply *r)
{
    struct op *o = (struct op *)req;
    if (o->fn)
        o->fn(o->b, status, (redisReply *)r, o->arg);
    cr_free(o);
}

/* Sends one command on c. Returns 0 (fn, if any, is called exactly once,
 * later) or CR_EBROKER / CR_ENOMEM (never called). */
static int send_op(struct redis_broker *b, struct redis_conn *c, op_fn *fn, void *arg,
                   struct args *a)
{
    const char **argv = args_argv(a);
    struct op *o;
    if (!argv)
        return CR_ENOMEM;
    o = cr_calloc(1, sizeof(*o));
    if (!o)
        return CR_ENOMEM;
    o->b = b;
    o->fn = fn;
    o->arg = arg;
    if (redis_conn_send(c, &o->req, on_op, a->n, argv, a->len)) {
        cr_free(o);
        return CR_EBROKER;
    }
    return 0;
}

/* MULTI, the commands, EXEC: fn gets EXEC's reply. Same return as send_op().
 * The commands are queued in hiredis in one go, so either all or none go. */
static int send_multi(struct redis_broker *b, op_fn *fn, void *arg, struct args *cmds,
                      int n)
{
    struct args m;
    int rc;
    for (int i = 0; i < n; i++)
        if (!args_argv(&cmds[i]))
            return CR_ENOMEM;
    if (!redis_conn_up(b->cmd))
        return CR_EBROKER;
    args_init(&m);
    args_s(&m, "MULTI");
    rc = send_op(b, b->cmd, NULL, NULL, &m);
    args_release(&m);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++)
        send_op(b, b->cmd, NULL, NULL, &cmds[i]);
    args_init(&m);
    args_s(&m, "EXEC");
    rc = send_op(b, b->cmd, fn, arg, &m);
    args_release(&m);
    return rc;
}

static int is_error(const redisReply *r)
{
    return !r || r->type == REDIS_REPLY_ERROR;
}

/* An error reply that says "not now" rather than "never". */
static int refused_for_now(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && redis_refusal_passes(r->str);
}

/* An EXEC reply whose every command succeeded. */
static int exec_ok(int status, const redisReply *r)
{
    if (status || !r || r->type != REDIS_REPLY_ARRAY)
        return 0;
    for (size_t i = 0; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_ERROR)
            return 0;
    return 1;
}

static int key_of(struct redis_broker *b, struct buf *out, const char *queue, int bucket)
{
    buf_reset(out);
    return kombu_queue_key(&b->o, queue, bucket, out);
}

static void args_key(struct redis_broker *b, struct args *a, const char *queue,
                     int bucket)
{
    struct buf k;
    buf_init(&k);
    if (key_of(b, &k, queue, bucket))
        a->oom = 1;
    else
        args_add(a, k.data, k.len);
    buf_release(&k);
}

static void random_bytes(unsigned char *p, size_t n)
{
    if (uv_random(NULL, NULL, p, n, 0, NULL) != 0) {
        uint64_t x = uv_hrtime() ^ ((uint64_t)(uintptr_t)p << 16);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            p[i] = (unsigned char)(x >> 24);
        }
    }
}

/* ------------------------------------------------------------ consumers */

/* Whether fanout channels are also spelt the way kombu < 5.4 spells them on
 * Sentinel ("/{db}." unformatted): subscribed both ways, published both
 * ways, so Python peers of either age hear us and we hear them. */
static int sentinel_compat(const struct redis_broker *b)
{
    return b->url.kind == REDIS_URL_SENTINEL && b->o.fanout_prefix == 1;
}

static struct rcons *find_cons(struct redis_broker *b, const char *queue)
{
    for (int i = 0; i < b->ncons; i++)
        if (!strcmp(b->cons[i].q.name, queue))
            return &b->cons[i];
    return NULL;
}

static const char *exchange_type(const struct redis_broker *b, const char *name)
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
static int binding_of(struct redis_broker *b, const struct broker_queue *q,
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

static void send_binding(struct redis_broker *b, const struct broker_queue *q,
                         const char *verb)
{
    struct buf key, member;
    struct args a;
    buf_init(&key);
    buf_init(&member);
    args_init(&a);
    if (binding_of(b, q, &key, &member) == 0) {
        args_s(&a, verb);
        args_add(&a, key.data, key.len);
        args_add(&a, member.data, member.len);
        if (send_op(b, b->cmd, NULL, NULL, &a) == CR_ENOMEM)
            LOG(LOG_ERROR, "broker: out of memory binding queue '%s'", q->name);
    }
    args_release(&a);
    buf_release(&key);
    buf_release(&member);
}

/* The dead-letter queue's binding: topic "#", so every dead letter and every
 * restore through the dead-letter exchange reaches it. */
static void dlq_binding(const struct redis_broker *b, struct broker_queue *q)
{
    memset(q, 0, sizeof(*q));
    q->name = b->cfg.dlq;
    q->exchange = b->cfg.dlx;
    q->exchange_type = "topic";
    q->routing_key = "#";
}

static void send_dlq_binding(struct redis_broker *b)
{
    struct broker_queue q;
    if (!b->cfg.dlx || !b->cfg.dlq)
        return;
    dlq_binding(b, &q);
    send_binding(b, &q, "SADD");
}

static void psubscribe(struct redis_broker *b, const struct rcons *c, const char *verb);

static void rebuild_cycle(struct redis_broker *b)
{
    const char *old[MAX_CONSUMERS];
    int nold = b->ncycle, n = 0;
    memcpy(old, b->cycle, sizeof(old));
    /* Keep the current order of the queues still consumed, then the new. */
    for (int i = 0; i < nold; i++) {
        struct rcons *c = find_cons(b, old[i]);
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

static void cons_release(struct rcons *c)
{
    cr_free((char *)c->q.name);
    cr_free((char *)c->q.exchange);
    cr_free((char *)c->q.exchange_type);
    cr_free((char *)c->q.routing_key);
    cJSON_Delete((cJSON *)c->q.arguments);
    cr_free(c->pattern);
    cr_free(c->pattern2);
    memset(c, 0, sizeof(*c));
}

static int rb_add_consumer(struct redis_broker *b, const struct broker_queue *q)
{
    struct rcons *c;
    if (find_cons(b, q->name))
        return 0;
    if (b->ncons == MAX_CONSUMERS)
        return CR_ERANGE;
    if (strlen(q->name) >= KOMBU_NAME_MAX)
        return CR_ERANGE;
    c = &b->cons[b->ncons];
    memset(c, 0, sizeof(*c));
    c->q = *q;
    c->q.name = cr_strdup(q->name);
    c->q.exchange = q->exchange ? cr_strdup(q->exchange) : NULL;
    c->q.exchange_type = q->exchange_type ? cr_strdup(q->exchange_type) : NULL;
    c->q.routing_key = q->routing_key ? cr_strdup(q->routing_key) : NULL;
    c->q.arguments = q->arguments ? cJSON_Duplicate(q->arguments, 1) : NULL;
    c->fanout = q->exchange_type && !strcmp(q->exchange_type, "fanout");
    if (c->fanout) {
        struct buf p;
        const char *ex = c->q.exchange ? c->q.exchange : "";
        const char *rk = c->q.routing_key ? c->q.routing_key : "";
        buf_init(&p);
        if (kombu_channel_pattern(&b->o, b->url.db, ex, rk, &p) == 0)
            c->pattern = buf_detach(&p);
        buf_reset(&p);
        if (sentinel_compat(b) && kombu_channel_pattern(&b->o, -1, ex, rk, &p) == 0)
            c->pattern2 = buf_detach(&p);
        buf_release(&p);
    }
    if (!c->q.name || (q->exchange && !c->q.exchange) ||
        (q->exchange_type && !c->q.exchange_type) ||
        (q->routing_key && !c->q.routing_key) || (q->arguments && !c->q.arguments) ||
        (c->fanout && (!c->pattern || (sentinel_compat(b) && !c->pattern2)))) {
        cons_release(c);
        return CR_ENOMEM;
    }
    b->ncons++;
    rebuild_cycle(b);
    if (redis_conn_up(b->cmd))
        send_binding(b, &c->q, "SADD");
    if (c->fanout && redis_conn_up(b->sub))
        psubscribe(b, c, "PSUBSCRIBE");
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
static int rb_cancel_consumer(struct redis_broker *b, const char *queue)
{
    struct rcons *c = find_cons(b, queue), gone;
    int i;
    if (!c)
        return CR_ENOTFOUND;
    i = (int)(c - b->cons);
    gone = *c;
    memmove(c, c + 1, (size_t)(b->ncons - i - 1) * sizeof(*c));
    b->ncons--;
    if ((gone.fanout || gone.q.auto_delete) && redis_conn_up(b->cmd))
        send_binding(b, &gone.q, "SREM");
    if (gone.fanout && !pattern_used(b, gone.pattern) && redis_conn_up(b->sub))
        psubscribe(b, &gone, "PUNSUBSCRIBE");
    /* the cycle borrows the names: rebuilt before the strings go */
    rebuild_cycle(b);
    cons_release(&gone);
    return 0;
}

static void rb_each_consumer(const struct redis_broker *b,
                             void (*fn)(const struct broker_queue *q, void *arg),
                             void *arg)
{
    for (int i = 0; i < b->ncons; i++)
        if (!b->cons[i].q.no_consume)
            fn(&b->cons[i].q, arg);
}

static int rb_declare_exchange(struct redis_broker *b, const char *name, const char *type,
                               int durable)
{
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

/* ------------------------------------------------------------ deliveries */

/* An empty kombu string is an absent property. */
static char *opt_take(char **s)
{
    char *v = *s;
    *s = NULL;
    if (v && !*v) {
        cr_free(v);
        return NULL;
    }
    return v;
}

static void deliver(struct redis_broker *b, struct kombu_msg *km, const char *queue,
                    int no_ack)
{
    struct broker_msg *m = cr_calloc(1, sizeof(*m));
    if (!m) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message");
        return;
    }
    m->generation = 1;
    m->redelivered = km->redelivered;
    m->exchange = km->exchange;
    km->exchange = NULL;
    m->routing_key = km->routing_key;
    km->routing_key = NULL;
    m->queue = cr_strdup(queue);
    m->no_ack = no_ack;
    m->received_ms = now_ms(b);
    m->content_type = opt_take(&km->content_type);
    m->content_encoding = opt_take(&km->content_encoding);
    m->correlation_id = opt_take(&km->correlation_id);
    m->reply_to = opt_take(&km->reply_to);
    m->expiration = opt_take(&km->expiration);
    m->delivery_mode = km->delivery_mode;
    m->priority = kombu_to_engine_priority(km->priority);
    m->wire_priority = km->priority;
    m->headers = km->headers;
    km->headers = NULL;
    m->body = km->body;
    m->body_len = km->body_len;
    km->body = NULL;
    m->tag = km->delivery_tag;
    km->delivery_tag = NULL;
    if (!m->queue) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message");
        broker_msg_free(m);
        return;
    }
    b->on_msg(&b->base, m, b->privdata);
}

/* What a popped value may weigh. Twice the body limit and some: a body
 * just over the limit still reaches the engine, which refuses it the way it
 * refuses one from RabbitMQ (a stored FAILURE, a dead letter); only what is far
 * beyond is set aside here, unread. */
static size_t body_bound(const struct redis_broker *b)
{
    size_t m = b->cfg.max_message_bytes;
    return m ? 2 * m + 65536 : 0;
}

static void held_free(struct held *h)
{
    cr_free(h->queue);
    cr_free(h->env);
    cr_free(h->exchange);
    cr_free(h->routing_key);
    cr_free(h);
}

static void on_recorded(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    char *tag = arg;
    if (status != CR_ECANCELED && b->vs) {
        int ok = exec_ok(status, r);
        struct vsession_rec *h = vsession_on_recorded(b->vs, tag,
                                                      ok       ? VSESSION_OK
                                                      : status ? VSESSION_LOST
                                                               : VSESSION_REFUSED);
        if (h && ok) {
            struct held *d = h->data;
            cr_free(d->env);
            d->env = NULL;
        } else if (h && !status) {
            /* sent again on the next tick, or once the connection is back */
            LOG(LOG_WARNING, "broker: cannot record delivery %s: %s", tag,
                r && r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
        }
    }
    cr_free(tag);
}

/* MULTI ZADD unacked_index <now> <tag> / HSET unacked <tag> [env, ex, rk] /
 * EXEC, as kombu writes it right after the pop. */
static int op_record(void *ctx, struct vsession_rec *rec)
{
    struct redis_broker *b = ctx;
    struct held *h = rec->data;
    struct args c[2];
    struct buf v;
    char score[64];
    char *tag = cr_strdup(rec->tag);
    struct cr_err err;
    int rc;

    buf_init(&v);
    args_init(&c[0]);
    args_init(&c[1]);
    snprintf(score, sizeof(score), "%.7f", epoch_s());
    rc = tag ? kombu_unacked_encode(h->env, h->env_len, h->exchange, h->routing_key, &v,
                                    &err)
             : CR_ENOMEM;
    if (!rc) {
        args_s(&c[0], "ZADD");
        args_s(&c[0], b->k_index);
        args_s(&c[0], score);
        args_s(&c[0], rec->tag);
        args_s(&c[1], "HSET");
        args_s(&c[1], b->k_unacked);
        args_s(&c[1], rec->tag);
        args_add(&c[1], v.data, v.len);
        rc = send_multi(b, on_recorded, tag, c, 2);
    }
    if (rc)
        cr_free(tag);
    buf_release(&v);
    args_release(&c[0]);
    args_release(&c[1]);
    return rc;
}

/* Pushes a raw value back onto the key it was popped from, at the head of
 * the line: it was never delivered. */
static void push_back(struct redis_broker *b, const char *key, size_t klen, const char *v,
                      size_t vlen)
{
    struct args a;
    args_init(&a);
    args_s(&a, "RPUSH");
    args_add(&a, key, klen);
    args_add(&a, v, vlen);
    if (send_op(b, b->cmd, NULL, NULL, &a))
        LOG(LOG_ERROR, "broker: cannot push a message back to '%.*s'; it is lost",
            (int)klen, key);
    args_release(&a);
}

/* A popped value that is no envelope we can deliver: it goes whole to the
 * dead-letter queue when there is one (where `celeriac dlq` can show it), and
 * is otherwise dropped with its start in the log. Either way once, never
 * back where it came from (it would come back at once, for ever). */
static void set_aside(struct redis_broker *b, const char *key, size_t klen, const char *v,
                      size_t vlen, const char *why)
{
    struct args a;
    if (b->bad_pops++ < 10 || b->bad_pops % 1000 == 0)
        LOG(LOG_ERROR, "broker: bad message on '%.*s' (%s)%s: %.120s", (int)klen, key,
            why, b->cfg.dlq ? "; moved to the dead-letter queue" : "; dropped", v);
    if (!b->cfg.dlq)
        return;
    args_init(&a);
    args_s(&a, "LPUSH");
    args_key(b, &a, b->cfg.dlq, 0);
    args_add(&a, v, vlen);
    if (send_op(b, b->cmd, NULL, NULL, &a))
        LOG(LOG_ERROR, "broker: cannot move a bad message to '%s'; it is lost",
            b->cfg.dlq);
    args_release(&a);
}

/* recorded: the pop script wrote the record already (nothing to keep for
 * it); otherwise it is sent now. */
static int held_add(struct redis_broker *b, const struct kombu_msg *km, const char *queue,
                    const char *env, size_t len, int recorded)
{
    struct held *h;
    if (vsession_held(b->vs, km->delivery_tag)) /* a copy: one record */
        return vsession_hold(b->vs, km->delivery_tag, NULL, recorded) < 0 ? CR_ENOMEM : 0;
    h = cr_calloc(1, sizeof(*h));
    if (!h)
        return CR_ENOMEM;
    h->queue = cr_strdup(queue);
    h->priority = km->priority;
    if (!recorded) {
        h->env = cr_malloc(len + 1);
        h->exchange = cr_strdup(km->exchange);
        h->routing_key = cr_strdup(km->routing_key);
    }
    if (!h->queue || (!recorded && (!h->env || !h->exchange || !h->routing_key))) {
        held_free(h);
        return CR_ENOMEM;
    }
    if (!recorded) {
        memcpy(h->env, env, len);
        h->env[len] = '\0';
        h->env_len = len;
    }
    if (vsession_hold(b->vs, km->delivery_tag, h, recorded) < 0) {
        held_free(h);
        return CR_ENOMEM;
    }
    return 0;
}

/* push_back() of a message the pop script recorded: the push and the
 * removal of its record in one MULTI, so that it is in exactly one of the
 * two places at every instant. A copy of one we hold keeps its record (ours). */
static void push_back_rec(struct redis_broker *b, const char *key, size_t klen,
                          const char *v, size_t vlen, const char *tag)
{
    struct args c[3];
    int rc;
    if (!tag || vsession_held(b->vs, tag)) {
        push_back(b, key, klen, v, vlen);
        return;
    }
    for (int i = 0; i < 3; i++)
        args_init(&c[i]);
    args_s(&c[0], "RPUSH");
    args_add(&c[0], key, klen);
    args_add(&c[0], v, vlen);
    args_s(&c[1], "ZREM");
    args_s(&c[1], b->k_index);
    args_s(&c[1], tag);
    args_s(&c[2], "HDEL");
    args_s(&c[2], b->k_unacked);
    args_s(&c[2], tag);
    rc = send_multi(b, NULL, NULL, c, 3);
    if (rc)
        LOG(LOG_WARNING,
            "broker: cannot push %s back to '%.*s'; it comes back after the "
            "visibility timeout",
            tag, (int)klen, key);
    for (int i = 0; i < 3; i++)
        args_release(&c[i]);
}

/* What the pop script recorded for a message: its tag (NULL: not recorded,
 * a BRPOP's or one the script could not read), the exchange and routing key. */
struct pop_rec {
    const char *tag;
    const char *exchange;
    size_t exchange_len;
    const char *routing_key;
    size_t routing_key_len;
};

static int same_str(const char *s, const char *p, size_t len)
{
    return s && strlen(s) == len && !memcmp(s, p, len);
}

/* One popped message (see struct pop_rec; NULL: not recorded). rotate: the
 * cycle turns past its queue (a BRPOP's; a batch turns once, at its end). */
static void on_popped(struct redis_broker *b, const char *key, size_t klen,
                      const char *env, size_t len, const struct pop_rec *pr, int rotate)
{
    const char *tag = pr ? pr->tag : NULL;
    char queue[KOMBU_NAME_MAX];
    struct kombu_msg km;
    struct cr_err err;
    struct rcons *c;
    int rc;

    if (kombu_queue_of_key(&b->o, key, klen, queue, sizeof(queue))) {
        push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    c = find_cons(b, queue);
    /* Cancelled meanwhile, or stopped: back to the head of its list, as
     * kombu requeues a message that finds no consumer. */
    if (stopping(b) || !c || c->fanout || (!consuming(b) && !c->q.no_ack)) {
        push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    if (rotate)
        kombu_rotate(&b->o, b->cycle, b->ncycle, queue);
    memset(&err, 0, sizeof(err));
    rc = body_bound(b) && len > body_bound(b)
             ? CR_ETOOBIG
             : kombu_msg_decode(&km, env, len, body_bound(b), &err);
    if (rc == CR_ENOMEM) {
        LOG(LOG_ERROR, "broker: out of memory decoding a message; pushing it back");
        push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    if (rc) {
        set_aside(b, key, klen, env, len, err.msg[0] ? err.msg : cr_strerror(rc));
        if (tag && !vsession_held(b->vs, tag))
            vsession_ack_tag(b->vs, tag);
        return;
    }
    if (tag && (c->q.no_ack || !km.delivery_tag || strcmp(tag, km.delivery_tag) ||
                !same_str(km.exchange, pr->exchange, pr->exchange_len) ||
                !same_str(km.routing_key, pr->routing_key, pr->routing_key_len))) {
        /* Not the record we would write (cannot happen with the script's
         * flags and kombu's decoder agreeing): removed, written our way. */
        if (!vsession_held(b->vs, tag))
            vsession_ack_tag(b->vs, tag);
        tag = NULL;
    }
    if (!c->q.no_ack && held_add(b, &km, queue, env, len, tag != NULL)) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message; pushing it back");
        kombu_msg_release(&km);
        push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    deliver(b, &km, queue, c->q.no_ack);
    kombu_msg_release(&km);
}

static void on_pop(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    int popped;
    (void)arg;
    if (status) {
        /* lost or cancelled: popped again once it is back */
        vsession_on_block(b->vs,
                          status == CR_ECANCELED ? VSESSION_CANCELED : VSESSION_LOST, 0,
                          now_ms(b));
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (b->bad_pops++ < 10)
            LOG(LOG_ERROR, "broker: BRPOP refused: %s", r->str);
        vsession_on_block(b->vs, VSESSION_REFUSED, 0, now_ms(b));
        return;
    }
    /* nil: the timeout or CLIENT UNBLOCK; the next BRPOP goes from prepare */
    popped = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[1]->type == REDIS_REPLY_STRING;
    vsession_on_block(b->vs, VSESSION_OK, popped, now_ms(b));
    if (popped)
        on_popped(b, r->element[0]->str, r->element[0]->len, r->element[1]->str,
                  r->element[1]->len, NULL, 1);
}

static void on_client_id(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    (void)arg;
    if (status)
        return;
    if (r->type == REDIS_REPLY_INTEGER) {
        b->client_id = r->integer;
        b->client_id_state = 2;
    }
}

/* A pop script call's: how many it asked for, and the score it records
 * under (which finds its records again if its reply is lost). */
struct batch_arg {
    long asked;
    char score[32];
};

static void remember_lost(struct redis_broker *b, const char *score)
{
    if (b->nlost == LOST_MAX) {
        memmove(b->lost_scores[0], b->lost_scores[1],
                sizeof(b->lost_scores[0]) * (LOST_MAX - 1));
        b->nlost--;
    }
    snprintf(b->lost_scores[b->nlost++], sizeof(b->lost_scores[0]), "%s", score);
}

static void on_lost_scan(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    char *score = arg;
    int n = 0;
    if (status == CR_EBACKEND || (!status && refused_for_now(r))) {
        /* Not looked at (the connection went, or Redis is still loading
         * after a restart): looked at again, or the messages stay for the
         * visibility timeout. */
        if (!closed(b)) {
            remember_lost(b, score);
            if (!status)
                b->again_due = now_ms(b) + TICK_MS;
        }
        cr_free(score);
        return;
    }
    cr_free(score);
    if (status || r->type != REDIS_REPLY_ARRAY)
        return;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *t = r->element[i];
        struct rjob *j;
        if (t->type != REDIS_REPLY_STRING || vsession_held(b->vs, t->str))
            continue;
        j = job_new(b, t->str, 'R');
        if (!j)
            break;
        n++;
        job_start(j);
    }
    if (n)
        LOG(LOG_INFO,
            "broker: giving back %d message(s) popped by a call whose reply was "
            "lost",
            n);
}

/* The records of lost pop calls (their exact score; a peer's records have
 * scores of their own clock) that we do not hold go back to the head of
 * their lists, as a restore does (the CAS script: a record changed meanwhile
 * is left alone). */
static void recover_lost(struct redis_broker *b)
{
    while (b->nlost > 0 && redis_conn_up(b->cmd) && !closed(b)) {
        const char *s = b->lost_scores[b->nlost - 1];
        char *arg = cr_strdup(s);
        struct args a;
        if (!arg)
            return;
        args_init(&a);
        args_s(&a, "ZRANGEBYSCORE");
        args_s(&a, b->k_index);
        args_s(&a, s);
        args_s(&a, s);
        if (send_op(b, b->cmd, on_lost_scan, arg, &a)) {
            cr_free(arg);
            args_release(&a);
            return;
        }
        args_release(&a);
        b->nlost--;
    }
}

static void on_batch(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct batch_arg *ba = arg;
    long asked = ba->asked;
    const char *last = NULL;
    size_t lastlen = 0, got;
    int cut;
    char queue[KOMBU_NAME_MAX];

    /* Lost: what it popped, if it ran, is recorded under its score and held
     * by nobody; recover_lost() gives it back as soon as the commands
     * connection is up (a BRPOP's reply lost is lost, as in kombu).
     * Cancelled (broker_free): left to the visibility timeout. */
    if (status) {
        vsession_on_batch(b->vs, asked,
                          status == CR_ECANCELED ? VSESSION_CANCELED : VSESSION_LOST,
                          now_ms(b));
        if (status != CR_ECANCELED && !closed(b)) {
            remember_lost(b, ba->score);
            recover_lost(b);
        }
        cr_free(ba);
        return;
    }
    cr_free(ba);
    if (r->type == REDIS_REPLY_ERROR) {
        /* NOSCRIPT: flushed meanwhile, loaded again by the next call */
        int noscript = !strncmp(r->str, "NOSCRIPT", 8), fails;
        if (noscript)
            b->script_loaded = 0;
        vsession_on_batch(b->vs, asked, noscript ? VSESSION_NOSCRIPT : VSESSION_REFUSED,
                          now_ms(b));
        fails = vsession_script_fails(b->vs);
        if (fails <= 3 || fails == POP_SCRIPT_TRIES)
            LOG(LOG_WARNING, "broker: pop script refused: %s%s", r->str,
                fails >= POP_SCRIPT_TRIES ? "; popping with BRPOP alone for a minute"
                                          : "");
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        vsession_on_batch(b->vs, asked, VSESSION_MALFORMED, now_ms(b));
        return;
    }
    vsession_on_batch(b->vs, asked, VSESSION_OK, now_ms(b));
    got = r->elements / 5;
    cut = r->elements % 5 == 1; /* the trailing "+" */
    for (size_t i = 0; i < got; i++) {
        redisReply **e = r->element + 5 * i;
        struct pop_rec pr;
        int k;
        for (k = 0; k < 5 && e[k]->type == REDIS_REPLY_STRING; k++)
            ;
        if (k < 5)
            continue;
        pr = (struct pop_rec){e[2]->str, e[3]->str, e[3]->len, e[4]->str, e[4]->len};
        on_popped(b, e[0]->str, e[0]->len, e[1]->str, e[1]->len, e[2]->len ? &pr : NULL,
                  0);
        last = e[0]->str;
        lastlen = e[0]->len;
    }
    /* round_robin turns once per batch, past the last queue popped. kombu
     * turns after every message, so that with queues A and B both full it
     * takes A, B, A, B; we take up to a batch of A, then of B. Every queue
     * still gets its turn within a batch of the others, and a batch is a
     * few milliseconds of work: the fairness kombu's rotation exists for
     * (no queue starved by a busy one) is kept, only its grain is coarser. */
    if (last && !kombu_queue_of_key(&b->o, last, lastlen, queue, sizeof(queue)))
        kombu_rotate(&b->o, b->cycle, b->ncycle, queue);
    vsession_on_batch_end(b->vs, asked, (long)got, cut);
}

/* One pop script call for queues qs (n, cycle order), at most max messages. */
static int send_batch(struct redis_broker *b, const char **qs, int n, long max)
{
    const char *argv[2 * MAX_CONSUMERS * KOMBU_MAX_STEPS + 16];
    size_t lens[2 * MAX_CONSUMERS * KOMBU_MAX_STEPS + 16];
    const char *kv[MAX_CONSUMERS * KOMBU_MAX_STEPS + 2];
    size_t kl[MAX_CONSUMERS * KOMBU_MAX_STEPS + 2];
    char nkeys_s[16], max_s[24], score[32], lim[24], bytes[24];
    struct batch_arg *ba;
    struct op *o;
    int argc = 0, nk;

    if (!b->script_loaded) {
        /* Pipelined ahead of the calls: Redis answers in order. */
        struct args a;
        args_init(&a);
        args_s(&a, "SCRIPT");
        args_s(&a, "LOAD");
        args_s(&a, pop_lua);
        if (send_op(b, b->pop, NULL, NULL, &a) == 0)
            b->script_loaded = 1;
        args_release(&a);
        if (!b->script_loaded)
            return CR_EBROKER;
    }
    buf_reset(&b->pop_store);
    nk = kombu_brpop_args(&b->o, qs, n, 1, &b->pop_store, kv, kl,
                          (int)(sizeof(kv) / sizeof(kv[0])));
    if (nk < 3)
        return CR_ENOMEM;
    nk -= 2; /* BRPOP and the timeout */
    snprintf(nkeys_s, sizeof(nkeys_s), "%d", nk + 2);
    snprintf(max_s, sizeof(max_s), "%ld", max);
    snprintf(score, sizeof(score), "%.7f", epoch_s());
    snprintf(lim, sizeof(lim), "%zu", body_bound(b));
    snprintf(bytes, sizeof(bytes), "%d", POP_BATCH_BYTES);
#define ARG(p, l) (argv[argc] = (p), lens[argc] = (l), argc++)
    ARG("EVALSHA", 7);
    ARG(b->pop_sha, SHA1_HEX_LEN);
    ARG(nkeys_s, strlen(nkeys_s));
    ARG(b->k_unacked, strlen(b->k_unacked));
    ARG(b->k_index, strlen(b->k_index));
    for (int i = 0; i < nk; i++)
        ARG(kv[1 + i], kl[1 + i]);
    ARG(max_s, strlen(max_s));
    ARG(score, strlen(score));
    ARG(lim, strlen(lim));
    ARG(bytes, strlen(bytes));
    /* kombu_brpop_args(): key i is queue qs[i % n]'s, step i / n. */
    for (int i = 0; i < nk; i++) {
        const struct rcons *c = find_cons(b, qs[i % n]);
        ARG(c && !c->q.no_ack && b->o.ack_emulation ? "1" : "0", 1);
    }
#undef ARG
    o = cr_calloc(1, sizeof(*o));
    ba = cr_calloc(1, sizeof(*ba));
    if (!o || !ba) {
        cr_free(o);
        cr_free(ba);
        return CR_ENOMEM;
    }
    ba->asked = max;
    snprintf(ba->score, sizeof(ba->score), "%s", score);
    o->b = b;
    o->fn = on_batch;
    o->arg = ba;
    if (redis_conn_send(b->pop, &o->req, on_op, argc, argv, lens)) {
        cr_free(o);
        cr_free(ba);
        return CR_EBROKER;
    }
    return 0;
}

static int op_link_up(void *ctx, enum vsession_link l)
{
    struct redis_broker *b = ctx;
    return redis_conn_up(l == VSESSION_LINK_STORE ? b->cmd : b->pop);
}

static int op_pop_batch(void *ctx, long max, int wide)
{
    struct redis_broker *b = ctx;
    const char *qs[MAX_CONSUMERS];
    int n = 0;
    (void)wide;
    for (int i = 0; i < b->ncycle; i++)
        if (find_cons(b, b->cycle[i]))
            qs[n++] = b->cycle[i];
    return n ? send_batch(b, qs, n, max) : CR_ENOTFOUND;
}

/* A wide window reads each reply whole; a narrow one a piece a turn. */
static void op_pop_wide(void *ctx, int wide)
{
    struct redis_broker *b = ctx;
    redis_conn_read_on(b->pop, wide);
}

/* One BRPOP, alone on its connection: a no_ack queue goes on while stopped,
 * task queues only when the session says there is room (tasks). */
static int op_pop_block(void *ctx, int tasks)
{
    struct redis_broker *b = ctx;
    const char *qs[MAX_CONSUMERS];
    const char *argv[MAX_CONSUMERS * KOMBU_MAX_STEPS + 2];
    size_t lens[MAX_CONSUMERS * KOMBU_MAX_STEPS + 2];
    struct op *o;
    int n = 0, argc;
    double timeout = b->o.polling_interval_s > 0 ? b->o.polling_interval_s : 1;

    for (int i = 0; i < b->ncycle; i++) {
        struct rcons *c = find_cons(b, b->cycle[i]);
        if (c && (c->q.no_ack || tasks))
            qs[n++] = b->cycle[i];
    }
    if (!n)
        return CR_ENOTFOUND;
    if (b->client_id_state == 0) {
        struct args a;
        args_init(&a);
        args_s(&a, "CLIENT");
        args_s(&a, "ID");
        if (send_op(b, b->pop, on_client_id, NULL, &a) == 0)
            b->client_id_state = 1;
        args_release(&a);
    }
    buf_reset(&b->pop_store);
    argc = kombu_brpop_args(&b->o, qs, n, timeout, &b->pop_store, argv, lens,
                            (int)(sizeof(argv) / sizeof(argv[0])));
    if (argc < 0)
        return CR_ENOMEM;
    o = cr_calloc(1, sizeof(*o));
    if (!o)
        return CR_ENOMEM;
    o->b = b;
    o->fn = on_pop;
    if (redis_conn_send(b->pop, &o->req, on_op, argc, argv, lens)) {
        cr_free(o);
        return CR_EBROKER;
    }
    return 0;
}

/* ------------------------------------------------------------ acks */

/* An ack batch's tags, in one block (op_ack()). */
struct ack_arg {
    int n;
    const char **tags;
};

static struct ack_arg *ack_arg_new(const char *const *tags, int n)
{
    size_t bytes = 0;
    struct ack_arg *a;
    char *p;
    for (int i = 0; i < n; i++)
        bytes += strlen(tags[i]) + 1;
    a = cr_malloc(sizeof(*a) + (size_t)n * sizeof(*a->tags) + bytes);
    if (!a)
        return NULL;
    a->n = n;
    a->tags = (const char **)(a + 1);
    p = (char *)(a->tags + n);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(tags[i]) + 1;
        memcpy(p, tags[i], len);
        a->tags[i] = p;
        p += len;
    }
    return a;
}

static void on_acked(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct ack_arg *a = arg;
    /* CR_EBACKEND: unknown whether Redis had them; removing twice is
     * harmless. (CR_ECANCELED: the broker is being freed.) */
    enum vsession_reply rep = status == CR_EBACKEND ? VSESSION_LOST : VSESSION_CANCELED;
    if (status == 0 && !exec_ok(status, r)) {
        if (vsession_ack_refusals(b->vs) == 0)
            LOG(LOG_WARNING, "broker: ack refused: %s; sent again until it is taken",
                r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
        rep = VSESSION_REFUSED;
    } else if (status == 0) {
        rep = VSESSION_OK;
    }
    if (b->vs)
        vsession_on_acked(b->vs, a->tags, a->n, rep, now_ms(b));
    cr_free(a);
}

/* One MULTI ZREM unacked_index T... / HDEL unacked T... / EXEC per batch. */
static int op_ack(void *ctx, const char *const *tags, int n)
{
    struct redis_broker *b = ctx;
    struct ack_arg *a = ack_arg_new(tags, n);
    struct args c[2];
    int rc;
    if (!a)
        return CR_ENOMEM;
    args_init(&c[0]);
    args_init(&c[1]);
    args_s(&c[0], "ZREM");
    args_s(&c[0], b->k_index);
    args_s(&c[1], "HDEL");
    args_s(&c[1], b->k_unacked);
    for (int i = 0; i < n; i++) {
        args_s(&c[0], tags[i]);
        args_s(&c[1], tags[i]);
    }
    rc = send_multi(b, on_acked, a, c, 2);
    args_release(&c[0]);
    args_release(&c[1]);
    if (rc)
        cr_free(a);
    return rc;
}

static int rb_ack(struct redis_broker *b, struct broker_msg *m)
{
    if (m->no_ack || m->settled || !m->tag)
        return 0;
    m->settled = 1;
    if (vsession_ack(b->vs, m->tag)) {
        LOG(LOG_ERROR,
            "broker: out of memory acking %s; it comes back after the "
            "visibility timeout",
            m->tag);
        return CR_ENOMEM;
    }
    return 0;
}

/* ------------------------------------------------------------ restores */

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

static void job_free(struct rjob *j)
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
    if ((status == CR_EBACKEND || status == JOB_AGAIN) && !round && !closed(b)) {
        j->next = b->waiting;
        b->waiting = j;
        if (status == JOB_AGAIN)
            b->again_due = now_ms(b) + TICK_MS;
        return;
    }
    job_free(j);
    if (round && b->vs)
        vsession_on_round_job(b->vs);
}

static void on_job_pushed(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct rjob *j = arg;
    if (!status && refused_for_now(r)) {
        job_end(j, JOB_AGAIN);
        return;
    }
    if (!status && is_error(r))
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
    struct args a;
    struct cr_err err;
    int bucket, rc;

    if (j->priority < 0)
        j->priority = env_priority(env, env_len);
    bucket = kombu_bucket(&b->o, j->priority);
    buf_init(&marked);
    args_init(&a);
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
        args_s(&a, j->side == 'R' ? "RPUSH" : "LPUSH");
        args_key(b, &a, j->targets[0], bucket);
        args_add(&a, marked.data, marked.len);
    } else {
        char nkeys[16];
        snprintf(nkeys, sizeof(nkeys), "%d", j->ntargets + 2);
        args_s(&a, "EVAL");
        args_s(&a, restore_lua);
        args_s(&a, nkeys);
        args_s(&a, b->k_unacked);
        args_s(&a, b->k_index);
        for (int i = 0; i < j->ntargets; i++)
            args_key(b, &a, j->targets[i], bucket);
        args_s(&a, j->tag);
        args_add(&a, j->value, j->value_len);
        args_add(&a, marked.data, marked.len);
        args_s(&a, j->side == 'R' ? "R" : "L");
    }
    rc = send_op(b, b->cmd, on_job_pushed, j, &a);
out:
    buf_release(&marked);
    args_release(&a);
    if (rc)
        job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
}

static int member_matches(const struct kombu_opts *o, const char *m, size_t n,
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

static const char *member_queue(const struct kombu_opts *o, const char *m, size_t n,
                                size_t *len)
{
    const char *bk, *pat, *q;
    size_t bk_len, pat_len;
    if (kombu_binding_parse(o, m, n, &bk, &bk_len, &pat, &pat_len, &q, len))
        return NULL;
    return q;
}

static void on_job_members(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct rjob *j = arg;
    const char *type;
    int topic;
    (void)b;
    if (status || r->type != REDIS_REPLY_ARRAY) {
        job_end(j, status ? status : refused_for_now(r) ? JOB_AGAIN : CR_EBROKER);
        return;
    }
    type = exchange_type(b, j->exchange);
    topic = type && !strcmp(type, "topic");
    for (size_t i = 0; i < r->elements && i < MEMBERS_MAX; i++) {
        const redisReply *e = r->element[i];
        size_t ql;
        const char *q;
        if (e->type != REDIS_REPLY_STRING ||
            !member_matches(&b->o, e->str, e->len, j->routing_key, topic))
            continue;
        q = member_queue(&b->o, e->str, e->len, &ql);
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
    if (refused_for_now(r)) {
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
        struct args a;
        int rc;
        args_init(&a);
        args_s(&a, "SMEMBERS");
        {
            struct buf k;
            buf_init(&k);
            if (kombu_binding_key(&b->o, j->exchange, &k))
                a.oom = 1;
            else
                args_add(&a, k.data, k.len);
            buf_release(&k);
        }
        rc = send_op(b, b->cmd, on_job_members, j, &a);
        args_release(&a);
        if (rc)
            job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
        return;
    }
    job_push(j);
}

static void job_start(struct rjob *j)
{
    struct redis_broker *b = j->b;
    struct args a;
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
    args_init(&a);
    args_s(&a, "HGET");
    args_s(&a, b->k_unacked);
    args_s(&a, j->tag);
    rc = send_op(b, b->cmd, on_job_value, j, &a);
    args_release(&a);
    if (rc)
        job_end(j, rc == CR_EBROKER ? CR_EBACKEND : rc);
}

/* Puts a held message of ours back: side 'L' for a requeue, 'R' for a
 * restore. Takes h (already unlinked). */
static void op_restore(void *ctx, const char *tag, void *data, enum vsession_rec_state st,
                       char side, int round)
{
    struct redis_broker *b = ctx;
    struct held *h = data;
    struct rjob *j = job_new(b, tag, side);
    if (!j) {
        if (h)
            held_free(h);
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
        held_free(h);
        if (!j->queue) {
            job_free(j);
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

static int rb_reject(struct redis_broker *b, struct broker_msg *m, int requeue)
{
    if (!requeue)
        return rb_ack(b, m);
    if (m->no_ack || m->settled || !m->tag)
        return 0;
    m->settled = 1;
    vsession_requeue(b->vs, m->tag);
    return 0;
}

static void start_waiting(struct redis_broker *b)
{
    struct rjob *j = b->waiting;
    b->waiting = NULL;
    while (j) {
        struct rjob *next = j->next;
        j->next = NULL;
        job_start(j);
        j = next;
    }
}

/* ------------------------------------------------ restore_visible, leases */

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
static int op_round_scan(void *ctx)
{
    struct redis_broker *b = ctx;
    struct args a;
    char max[64], limit[32];
    long n = RESTORE_ROUND_MAX;
    int rc;
    if (b->o.unacked_restore_limit > 0 && b->o.unacked_restore_limit < n)
        n = b->o.unacked_restore_limit;
    snprintf(max, sizeof(max), "%.7f", epoch_s() - b->o.visibility_timeout_s);
    snprintf(limit, sizeof(limit), "%ld", n);
    args_init(&a);
    args_s(&a, "ZREVRANGEBYSCORE");
    args_s(&a, b->k_index);
    args_s(&a, max);
    args_s(&a, "0");
    args_s(&a, "WITHSCORES");
    args_s(&a, "LIMIT");
    args_s(&a, "0");
    args_s(&a, limit);
    rc = send_op(b, b->cmd, on_stale, NULL, &a);
    args_release(&a);
    return rc;
}

static void op_round_unlock(void *ctx)
{
    struct redis_broker *b = ctx;
    struct args a;
    args_init(&a);
    args_s(&a, "EVAL");
    args_s(&a, unlock_lua);
    args_s(&a, "1");
    args_s(&a, b->k_mutex);
    args_s(&a, b->token);
    send_op(b, b->cmd, NULL, NULL, &a);
    args_release(&a);
}

/* kombu's restore_visible(): under the mutex, the records older than the
 * visibility timeout go back to their queues. */
static int op_round_lock(void *ctx)
{
    struct redis_broker *b = ctx;
    unsigned char rnd[16];
    char px[32];
    struct args a;
    int consumes = 0, rc;
    for (int i = 0; i < b->ncycle; i++) {
        const struct rcons *c = find_cons(b, b->cycle[i]);
        consumes |= c && !c->q.no_ack;
    }
    /* Only a consumer restores (the gateway, which publishes only, does
     * not): it knows its own visibility timeout, and refreshes its leases. */
    if (!consumes || !redis_conn_up(b->cmd))
        return CR_ENOTFOUND;
    random_bytes(rnd, sizeof(rnd));
    for (int i = 0; i < 16; i++)
        snprintf(b->token + 2 * i, 3, "%02x", rnd[i]);
    snprintf(px, sizeof(px), "%ld", (long)(b->o.unacked_mutex_expire_s * 1000));
    args_init(&a);
    args_s(&a, "SET");
    args_s(&a, b->k_mutex);
    args_s(&a, b->token);
    args_s(&a, "PX");
    args_s(&a, px);
    args_s(&a, "NX");
    rc = send_op(b, b->cmd, on_locked, NULL, &a);
    args_release(&a);
    return rc;
}

/* ZADD unacked_index XX <now> <tag>... for every record we hold: XX, so an
 * entry removed meanwhile is not made again. */
static void op_refresh(void *ctx, const char *const *tags, int n)
{
    struct redis_broker *b = ctx;
    char score[64];
    struct args a;
    snprintf(score, sizeof(score), "%.7f", epoch_s());
    args_init(&a);
    args_s(&a, "ZADD");
    args_s(&a, b->k_index);
    args_s(&a, "XX");
    for (int i = 0; i < n; i++) {
        args_s(&a, score);
        args_s(&a, tags[i]);
    }
    send_op(b, b->cmd, NULL, NULL, &a);
    args_release(&a);
}

static void op_release(void *ctx, void *data)
{
    (void)ctx;
    held_free(data);
}

static const struct vsession_ops session_ops = {
    .link_up = op_link_up,
    .pop_batch = op_pop_batch,
    .pop_wide = op_pop_wide,
    .pop_block = op_pop_block,
    .record = op_record,
    .ack = op_ack,
    .refresh = op_refresh,
    .restore = op_restore,
    .release = op_release,
    .round_lock = op_round_lock,
    .round_scan = op_round_scan,
    .round_unlock = op_round_unlock,
};

static void on_tick(uv_timer_t *t)
{
    struct redis_broker *b = t->data;
    uint64_t now = now_ms(b);
    if (closed(b) || !redis_conn_up(b->cmd))
        return;
    vsession_tick(b->vs, now);
    if (b->again_due && now >= b->again_due) {
        b->again_due = 0;
        start_waiting(b);
        recover_lost(b);
    }
    vsession_pop(b->vs, now);
}

static void on_prepare(uv_prepare_t *p)
{
    struct redis_broker *b = p->data;
    if (b->vs)
        vsession_pump(b->vs, now_ms(b));
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
    if (status || stopping(b) || r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
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
        rc = body_bound(b) && data->len > body_bound(b)
                 ? CR_ETOOBIG
                 : kombu_msg_decode(&km, data->str, data->len, body_bound(b), &err);
        if (rc) {
            if (b->bad_pops++ < 10)
                LOG(LOG_WARNING, "broker: bad message on channel '%s': %s",
                    r->element[2]->type == REDIS_REPLY_STRING ? r->element[2]->str : "?",
                    err.msg[0] ? err.msg : cr_strerror(rc));
            return;
        }
        /* on_msg may cancel consumers: the loop checks the count again */
        deliver(b, &km, c->q.name, 1);
        kombu_msg_release(&km);
        if (closed(b))
            return;
    }
}

static void psubscribe(struct redis_broker *b, const struct rcons *c, const char *verb)
{
    const char *argv[3] = {verb, c->pattern, c->pattern2};
    b->psub_req.data = b;
    if (redis_conn_send_pubsub(b->sub, &b->psub_req, on_pmessage, c->pattern2 ? 3 : 2,
                               argv, NULL))
        LOG(LOG_WARNING, "broker: cannot %s '%s'", verb, c->pattern);
    else if (!strcmp(verb, "PSUBSCRIBE"))
        b->psub_unconfirmed += c->pattern2 ? 2 : 1;
}

/* ------------------------------------------------------------ publish */

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
    if (status || is_error(r)) {
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
    struct args a;
    char q[KOMBU_NAME_MAX];
    int rc;
    if (qlen >= sizeof(q))
        return CR_EINVAL;
    memcpy(q, queue, qlen);
    q[qlen] = '\0';
    args_init(&a);
    args_s(&a, "LPUSH");
    args_key(b, &a, q, kombu_bucket(&b->o, p->priority));
    args_add(&a, p->env, p->env_len);
    rc = send_op(b, b->cmd, on_pushed, p, &a);
    args_release(&a);
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
            !member_matches(&b->o, e->str, e->len, p->routing_key, p->topic))
            continue;
        q = member_queue(&b->o, e->str, e->len, &ql);
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
    if (!exec_ok(status, r) || r->elements != 3 ||
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
    struct args cmds[3];
    int rc;
    buf_init(&key);
    buf_init(&member);
    for (int i = 0; i < 3; i++)
        args_init(&cmds[i]);
    dlq_binding(b, &q);
    rc = binding_of(b, &q, &key, &member);
    if (!rc) {
        args_s(&cmds[0], "SADD");
        args_add(&cmds[0], key.data, key.len);
        args_add(&cmds[0], member.data, member.len);
        args_s(&cmds[1], "LPUSH");
        args_key(b, &cmds[1], b->cfg.dlq, kombu_bucket(&b->o, p->priority));
        args_add(&cmds[1], p->env, p->env_len);
        args_s(&cmds[2], "SMEMBERS");
        args_add(&cmds[2], key.data, key.len);
        rc = send_multi(b, on_dlx_pushed, p, cmds, 3);
    }
    for (int i = 0; i < 3; i++)
        args_release(&cmds[i]);
    buf_release(&key);
    buf_release(&member);
    return rc;
}

static void on_published(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct pubop *p = arg;
    p->failed = status || is_error(r);
    confirm(b, p);
}

static int rb_publish(struct redis_broker *b, const char *exchange,
                      const char *routing_key, const struct broker_props *props,
                      const char *body, size_t len, broker_confirm_fn *cb, void *privdata)
{
    struct kombu_out ko;
    struct buf env, key;
    struct args a;
    unsigned char rnd[16];
    char tag[CR_UUID_LEN + 1];
    const char *type;
    struct pubop *p;
    int rc;

    if (closed(b) || !redis_conn_up(b->cmd))
        return CR_EBROKER;
    if (!exchange)
        exchange = "";
    if (!routing_key)
        routing_key = "";
    random_bytes(rnd, sizeof(rnd));
    cr_uuid4(rnd, tag);
    memset(&ko, 0, sizeof(ko));
    ko.body = body;
    ko.body_len = len;
    ko.content_type = props->content_type;
    ko.content_encoding = props->content_encoding;
    ko.headers = props->headers;
    ko.correlation_id = props->correlation_id;
    ko.reply_to = props->reply_to;
    ko.expiration = props->expiration;
    ko.delivery_mode = props->delivery_mode;
    /* already kombu's scale (broker_props); none given is kombu's 0 */
    ko.priority = props->priority < 0 ? 0 : props->priority;
    ko.exchange = exchange;
    ko.routing_key = routing_key;
    ko.delivery_tag = tag;
    buf_init(&env);
    buf_init(&key);
    args_init(&a);
    p = cr_calloc(1, sizeof(*p));
    rc = p ? kombu_msg_encode(&ko, &env) : CR_ENOMEM;
    if (rc)
        goto fail;
    p->cb = cb;
    p->privdata = privdata;
    p->priority = ko.priority;
    p->routing_key = cr_strdup(routing_key);
    if (!p->routing_key) {
        rc = CR_ENOMEM;
        goto fail;
    }
    type = *exchange ? exchange_type(b, exchange) : "direct";
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
        args_s(&a, "PUBLISH");
        args_add(&a, key.data, key.len);
        args_add(&a, env.data, env.len);
        if (sentinel_compat(b)) {
            struct args a2;
            buf_reset(&key);
            rc = kombu_channel(&b->o, -1, exchange, routing_key, &key);
            if (rc)
                goto fail;
            args_init(&a2);
            args_s(&a2, "PUBLISH");
            args_add(&a2, key.data, key.len);
            args_add(&a2, env.data, env.len);
            /* both or neither: the connection is up, so both are taken */
            p->pending = 2;
            rc = send_op(b, b->cmd, on_pushed, p, &a);
            if (!rc && send_op(b, b->cmd, on_pushed, p, &a2))
                p->pending = 1;
            args_release(&a2);
        } else {
            rc = send_op(b, b->cmd, on_published, p, &a);
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
            args_s(&a, "SMEMBERS");
            args_add(&a, key.data, key.len);
            rc = send_op(b, b->cmd, on_pub_members, p, &a);
            if (rc)
                goto fail;
        }
    }
    buf_release(&env);
    buf_release(&key);
    args_release(&a);
    return 0;
fail:
    if (p) {
        cr_free(p->env);
        cr_free(p->routing_key);
        cr_free(p);
    }
    buf_release(&env);
    buf_release(&key);
    args_release(&a);
    return rc == CR_EBROKER || rc == CR_ENOMEM ? rc : CR_EBROKER;
}

/* ------------------------------------------------------------ stats */

static void on_stats(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct statop *s = arg;
    uint64_t sum = 0;
    int ok = exec_ok(status, r) && (int)r->elements == s->nkeys;
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
static int rb_queue_stats(struct redis_broker *b, const char *queue,
                          broker_queue_stats_fn *cb, void *privdata)
{
    struct args c[KOMBU_MAX_STEPS];
    struct statop *s;
    int rc;
    if (closed(b) || !redis_conn_up(b->cmd))
        return CR_EBROKER;
    s = cr_calloc(1, sizeof(*s));
    if (!s)
        return CR_ENOMEM;
    s->b = b;
    s->cb = cb;
    s->privdata = privdata;
    s->nkeys = b->o.nsteps;
    for (int i = 0; i < b->o.nsteps; i++) {
        args_init(&c[i]);
        args_s(&c[i], "LLEN");
        args_key(b, &c[i], queue, b->o.steps[i]);
    }
    rc = send_multi(b, on_stats, s, c, b->o.nsteps);
    for (int i = 0; i < b->o.nsteps; i++)
        args_release(&c[i]);
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

static void rb_queue_stats_cancel(struct redis_broker *b, void *privdata)
{
    for (struct statop *s = b->stats; s; s = s->next)
        if (s->privdata == privdata)
            s->cb = NULL;
}

/* ------------------------------------------------------------ connections */

static int all_up(const struct redis_broker *b)
{
    return redis_conn_up(b->cmd) && redis_conn_up(b->pop) && redis_conn_up(b->sub);
}

static void tell_owner(struct redis_broker *b)
{
    int up = all_up(b);
    if (closed(b) || up == b->up_said)
        return;
    b->up_said = up;
    if (up && b->ever_up)
        LOG(LOG_WARNING, "broker: connection to %s is back", b->shown_url);
    if (up)
        b->ever_up = 1;
    if (b->on_conn)
        b->on_conn(&b->base, up, b->privdata);
}

static void on_cmd_up(struct redis_broker *b)
{
    for (int i = 0; i < b->ncons; i++)
        send_binding(b, &b->cons[i].q, "SADD");
    send_dlq_binding(b);
    /* records not written yet, the acks of the last seconds again, leases */
    vsession_on_link(b->vs, VSESSION_LINK_STORE, 1, now_ms(b));
    start_waiting(b);
    recover_lost(b);
}

static void on_sub_up(struct redis_broker *b)
{
    /* Before anything else: a fanout message sent meanwhile is lost. */
    for (int i = 0; i < b->ncons; i++) {
        int dup = 0;
        if (!b->cons[i].fanout)
            continue;
        for (int k = 0; k < i; k++)
            if (b->cons[k].fanout && !strcmp(b->cons[k].pattern, b->cons[i].pattern))
                dup = 1;
        if (!dup)
            psubscribe(b, &b->cons[i], "PSUBSCRIBE");
    }
}

static void on_event(struct redis_conn *c, enum redis_conn_event ev,
                     const struct redis_conn_news *news, void *privdata)
{
    struct redis_broker *b = privdata;
    const char *role = c == b->cmd ? "commands" : c == b->pop ? "consumer" : "pub/sub";
    if (closed(b))
        return;
    switch (ev) {
    case REDIS_CONN_UP:
        if (c == b->cmd)
            on_cmd_up(b);
        else if (c == b->sub)
            on_sub_up(b);
        else {
            b->client_id_state = 0;
            b->script_loaded = 0;
            vsession_on_link(b->vs, VSESSION_LINK_POP, 1, now_ms(b));
        }
        break;
    case REDIS_CONN_FAILED:
        if (news->loud)
            LOG(LOG_ERROR, "broker: cannot connect to %s (%s connection): %s",
                b->shown_url, role, news->why ? news->why : "?");
        break;
    case REDIS_CONN_LOST:
    case REDIS_CONN_SILENT:
        /* Once per outage at WARNING: the first of the three connections to
         * go (the others mostly go with it, for the same reason). */
        LOG(b->up_said ? LOG_WARNING : LOG_INFO,
            "broker: %s connection to %s lost: %s; reconnecting", role, b->shown_url,
            ev == REDIS_CONN_SILENT ? "no reply within the timeout"
                                    : (news->why ? news->why : "closed"));
        if (c == b->pop) {
            b->client_id_state = 0;
        }
        if (c == b->sub)
            b->psub_unconfirmed = 0;
        break;
    }
    tell_owner(b);
}

static struct redis_conn *conn_new(struct redis_broker *b, double timeout, double health,
                                   int probe, struct cr_err *err)
{
    struct redis_conn_config rc;
    memset(&rc, 0, sizeof(rc));
    rc.url = &b->url;
    rc.timeout = timeout;
    rc.health_check_interval = health;
    if (probe) {
        rc.probe_argc = 2;
        rc.probe_argv = b->probe_argv;
    }
    rc.master_name = b->o.master_name;
    rc.connect_timeout =
        b->o.socket_connect_timeout_s > 0 ? b->o.socket_connect_timeout_s : 0;
    rc.sentinel_user = b->o.sentinel_username;
    rc.sentinel_password = b->o.sentinel_password;
    rc.on_event = on_event;
    rc.privdata = b;
    return redis_conn_new(b->loop, &rc, err);
}

static int rb_connect(struct redis_broker *b, struct cr_err *err)
{
    int ms = (int)((b->cfg.connect_timeout > 0 ? b->cfg.connect_timeout : 5) * 1000);
    struct redis_conn *cs[3] = {b->cmd, b->pop, b->sub};
    for (int i = 0; i < 3; i++) {
        int rc = redis_conn_wait(cs[i], ms);
        if (rc)
            return cr_err_set(
                err, CR_EBROKER, "cannot connect to broker '%s': %s", b->shown_url,
                redis_conn_last_error(cs[i])[0] ? redis_conn_last_error(cs[i])
                                                : cr_strerror(rc));
    }
    LOG(LOG_INFO, "Connected to %s", b->shown_url);
    tell_owner(b);
    return 0;
}

/* Runs the loop (start-up only) until every PSUBSCRIBE sent so far is
 * confirmed, the pub/sub connection goes, or timeout_ms passes: a broadcast
 * published before Redis registers a pattern never reaches us, so the worker
 * says "ready." only after this. */
static int rb_wait_subscribed(struct redis_broker *b, int timeout_ms)
{
    uv_update_time(b->loop);
    for (uint64_t until = now_ms(b) + (uint64_t)timeout_ms;
         b->psub_unconfirmed > 0 && redis_conn_up(b->sub) && now_ms(b) < until;) {
        struct timespec pause = {0, 1000000};
        uv_run(b->loop, UV_RUN_NOWAIT);
        if (b->psub_unconfirmed > 0)
            nanosleep(&pause, NULL);
        uv_update_time(b->loop);
    }
    return b->psub_unconfirmed > 0 ? CR_ETIMEDOUT : 0;
}

static int rb_connected(const struct redis_broker *b)
{
    return all_up(b);
}

static unsigned long rb_reconnects(const struct redis_broker *b)
{
    return redis_conn_reconnects(b->cmd) + redis_conn_reconnects(b->pop) +
           redis_conn_reconnects(b->sub);
}

static void rb_set_prefetch(struct redis_broker *b, int n)
{
    vsession_set_prefetch(b->vs, n);
}

/* Ends the BRPOP at once rather than at its timeout (Redis >= 5; older ones
 * refuse and the BRPOP ends by itself within its timeout). What it still
 * returns goes back to the head of its list (on_popped()). */
static void unblock_pop(struct redis_broker *b)
{
    struct args a;
    char id[32];
    if (vsession_block_state(b->vs) != VSESSION_BLOCK_OUT || b->client_id_state != 2 ||
        !redis_conn_up(b->cmd))
        return;
    snprintf(id, sizeof(id), "%lld", b->client_id);
    args_init(&a);
    args_s(&a, "CLIENT");
    args_s(&a, "UNBLOCK");
    args_s(&a, id);
    send_op(b, b->cmd, NULL, NULL, &a);
    args_release(&a);
}

static void rb_stop_consuming(struct redis_broker *b)
{
    if (!consuming(b))
        return;
    vsession_stop_consuming(b->vs);
    unblock_pop(b);
}

/* ------------------------------------------------------------ lifecycle */

static void on_closed(uv_handle_t *h)
{
    struct redis_broker *b = h->data;
    if (++b->nclosed < 2)
        return;
    for (int i = 0; i < b->ncons; i++)
        cons_release(&b->cons[i]);
    for (int i = 0; i < b->nex; i++) {
        cr_free(b->ex[i].name);
        cr_free(b->ex[i].type);
    }
    cr_free(b->k_unacked);
    cr_free(b->k_index);
    cr_free(b->k_mutex);
    buf_release(&b->pop_store);
    cr_free(b);
}

static void on_free_deadline(uv_timer_t *t)
{
    *(int *)t->data = 1;
}

static void on_free_timer_closed(uv_handle_t *h)
{
    (void)h;
}

/* A cold stop: every held message goes back to the head of its list, the
 * last acks go out, the mailbox's binding goes, and the BRPOP still out is
 * ended and read (a message it popped is pushed back, never lost as kombu
 * 5.2 loses it). This runs the loop, for FREE_WAIT_MS at most: the worker's
 * loop is ending, and nothing else can wait for these replies. */
static void drain(struct redis_broker *b)
{
    uv_timer_t deadline;
    int expired = 0;

    if (!redis_conn_up(b->cmd)) {
        vsession_drain(b->vs, now_ms(b)); /* nothing reaches the owner any more */
        return;
    }
    vsession_stop_consuming(b->vs);
    unblock_pop(b);
    vsession_drain(b->vs, now_ms(b)); /* held messages back, the last acks out */
    for (int i = 0; i < b->ncons; i++)
        if (b->cons[i].q.auto_delete || b->cons[i].fanout)
            send_binding(b, &b->cons[i].q, "SREM");
    uv_timer_init(b->loop, &deadline);
    deadline.data = &expired;
    uv_timer_start(&deadline, on_free_deadline, FREE_WAIT_MS, 0);
    while (!expired && redis_conn_up(b->cmd) &&
           (redis_conn_inflight(b->cmd) || b->njobs ||
            (vsession_popping(b->vs) && redis_conn_up(b->pop)) || vsession_nacks(b->vs)))
        uv_run(b->loop, UV_RUN_ONCE);
    uv_close((uv_handle_t *)&deadline, on_free_timer_closed);
    uv_run(b->loop, UV_RUN_NOWAIT);
    if (b->njobs || b->waiting || vsession_first(b->vs))
        LOG(LOG_WARNING, "broker: some held messages could not be put back; they come "
                         "back after the visibility timeout");
}

static void rb_free(struct redis_broker *b)
{
    struct rjob *j;
    if (!b)
        return;
    if (b->cmd && b->pop && b->sub && b->vs) {
        /* Held messages are restored, not left to a visibility timeout. */
        drain(b);
    }
    if (b->vs)
        vsession_close(b->vs);
    redis_conn_free(b->pop);
    redis_conn_free(b->sub);
    redis_conn_free(b->cmd);
    while ((j = b->waiting) != NULL) {
        b->waiting = j->next;
        job_free(j);
    }
    vsession_free(b->vs); /* what is still held: its data freed */
    b->vs = NULL;
    b->nclosed = 0;
    uv_close((uv_handle_t *)&b->prepare, on_closed);
    uv_close((uv_handle_t *)&b->tick, on_closed);
}

static char *prefixed(const struct kombu_opts *o, const char *name)
{
    struct buf k;
    buf_init(&k);
    if (kombu_queue_key(o, name, 0, &k)) {
        buf_release(&k);
        return NULL;
    }
    return buf_detach(&k);
}

static struct redis_broker *rb_new(uv_loop_t *loop, const struct broker_config *cfg,
                                   broker_msg_fn *on_msg, broker_conn_fn *on_conn,
                                   void *privdata, struct cr_err *err)
{
    struct redis_broker *b;
    double timeout, vt_ms;
    struct vsession_config vc;
    struct cr_err e2;

    if (err)
        err->code = 0; /* read below to tell a refused URL from a failed allocation */
    b = cr_calloc(1, sizeof(*b));
    if (!b) {
        cr_err_set(err, CR_ENOMEM, "out of memory creating the broker");
        return NULL;
    }
    b->loop = loop;
    b->cfg = *cfg;
    b->on_msg = on_msg;
    b->on_conn = on_conn;
    b->privdata = privdata;
    redact_url(cfg->url, b->shown_url, sizeof(b->shown_url));
    kombu_opts_init(&b->o);
    memset(&e2, 0, sizeof(e2));
    if (cfg->transport_options && *cfg->transport_options &&
        kombu_opts_parse(&b->o, cfg->transport_options, strlen(cfg->transport_options),
                         &e2)) {
        /* kombu's messages name the options already. */
        cr_err_set(err, CR_EINVAL, "%s", e2.msg);
        cr_free(b);
        return NULL;
    }
    if (redis_url_parse(&b->url, cfg->url, "broker", &e2)) {
        cr_err_set(err, CR_EINVAL, "%s", e2.msg);
        cr_free(b);
        return NULL;
    }
    if (b->url.kind == REDIS_URL_SENTINEL && !b->o.master_name[0]) {
        cr_err_set(err, CR_EINVAL,
                   "broker sentinel:// needs master_name in --broker-transport-options");
        cr_free(b);
        return NULL;
    }
    if (b->url.tls.on && !b->url.tls.cert_reqs_given)
        LOG(LOG_WARNING, "broker: rediss:// without ssl_cert_reqs verifies no "
                         "certificate (as kombu does)");
    /* --queue-order strict (an earlier -Q queue first) is kombu's "priority"
     * strategy: the -Q order, never rotated. */
    if (cfg->per_consumer_qos && b->o.order == KOMBU_ORDER_ROUND_ROBIN)
        b->o.order = KOMBU_ORDER_PRIORITY;
    buf_init(&b->pop_store);
    vsession_config_default(&vc);
    vc.prefetch = cfg->prefetch_count;
    vc.ack_emulation = b->o.ack_emulation;
    vt_ms = b->o.visibility_timeout_s * 1000 / 3;
    vc.lease_ms = vt_ms < LEASE_MIN_MS   ? LEASE_MIN_MS
                  : vt_ms > LEASE_MAX_MS ? LEASE_MAX_MS
                                         : (uint64_t)vt_ms;
    vc.restore_ms = RESTORE_EVERY_MS;
    vc.retry_ms = TICK_MS;
    vc.batch = POP_BATCH;
    vc.calls = POP_CALLS;
    vc.wide_room = POP_WIDE_ROOM;
    vc.wide_batch = POP_WIDE_BATCH;
    vc.wide_calls = POP_WIDE_CALLS;
    vc.script_tries = POP_SCRIPT_TRIES;
    vc.script_retry_ms = POP_SCRIPT_RETRY_MS;
    vc.pause_ms = POP_PAUSE_MS;
    vc.ack_batch_max = BATCH_MAX;
    b->vs = vsession_new(&vc, &session_ops, b);
    b->k_unacked = prefixed(&b->o, b->o.unacked_key);
    b->k_index = prefixed(&b->o, b->o.unacked_index_key);
    b->k_mutex = prefixed(&b->o, b->o.unacked_mutex_key);
    snprintf(b->probe_channel, sizeof(b->probe_channel), "%s_celeriac.probe",
             b->o.keyprefix);
    sha1_hex(pop_lua, strlen(pop_lua), b->pop_sha);
    b->probe_argv[0] = "SUBSCRIBE";
    b->probe_argv[1] = b->probe_channel;
    uv_prepare_init(loop, &b->prepare);
    b->prepare.data = b;
    uv_prepare_start(&b->prepare, on_prepare);
    uv_unref((uv_handle_t *)&b->prepare);
    uv_timer_init(loop, &b->tick);
    b->tick.data = b;
    uv_timer_start(&b->tick, on_tick, TICK_MS, TICK_MS);
    uv_unref((uv_handle_t *)&b->tick);
    if (!b->k_unacked || !b->k_index || !b->k_mutex || !b->vs)
        goto oom;
    /* The command timeout: a BRPOP is answered within its own timeout, so
     * the consumer connection's is that plus a margin. */
    timeout = b->o.socket_timeout_s > 0 ? b->o.socket_timeout_s : 30;
    b->cmd = conn_new(b, timeout, b->o.health_check_interval_s, 0, err);
    b->pop =
        b->cmd ? conn_new(b,
                          timeout +
                              (b->o.polling_interval_s > 0 ? b->o.polling_interval_s : 1),
                          0, 0, err)
               : NULL;
    b->sub = b->pop ? conn_new(b, timeout, b->o.health_check_interval_s, 1, err) : NULL;
    if (!b->sub) {
        /* Not only memory: a rediss:// CA or key that cannot be loaded. */
        if (err && err->code && err->code != CR_ENOMEM) {
            rb_free(b);
            return NULL;
        }
        goto oom;
    }
    for (int i = 0; i < cfg->nqueues; i++) {
        struct broker_queue q;
        broker_task_queue(&q, cfg->queues[i]);
        if (rb_add_consumer(b, &q))
            goto oom;
    }
    if (b->o.order == KOMBU_ORDER_SORTED)
        kombu_initial_order(&b->o, b->cycle, b->ncycle);
    if (cfg->dlx && rb_declare_exchange(b, cfg->dlx, "topic", 1))
        goto oom;
    return b;
oom:
    cr_err_set(err, CR_ENOMEM, "out of memory creating the broker");
    rb_free(b);
    return NULL;
}

/* ------------------------------------------------------------ the face */

#define R(b) ((struct redis_broker *)(b))
#define CR(b) ((const struct redis_broker *)(b))

static int v_connect(struct broker *b, struct cr_err *err)
{
    return rb_connect(R(b), err);
}
static int v_wait_subscribed(struct broker *b, int timeout_ms)
{
    return rb_wait_subscribed((struct redis_broker *)b, timeout_ms);
}
static int v_connected(const struct broker *b)
{
    return rb_connected(CR(b));
}
/* Never changes: see the top of the file. */
static unsigned v_generation(const struct broker *b)
{
    (void)b;
    return 1;
}
static unsigned long v_reconnects(const struct broker *b)
{
    return rb_reconnects(CR(b));
}
/* Redis never blocks publishing (an OOM refusal fails the publish). */
static int v_blocked(const struct broker *b, const char **why)
{
    (void)b;
    if (why)
        *why = NULL;
    return 0;
}
static int v_ack(struct broker *b, struct broker_msg *m)
{
    return rb_ack(R(b), m);
}
static int v_reject(struct broker *b, struct broker_msg *m, int requeue)
{
    return rb_reject(R(b), m, requeue);
}
static int v_publish(struct broker *b, const char *exchange, const char *routing_key,
                     const struct broker_props *props, const char *body, size_t len,
                     broker_confirm_fn *cb, void *privdata)
{
    return rb_publish(R(b), exchange, routing_key, props, body, len, cb, privdata);
}
static int v_add_consumer(struct broker *b, const struct broker_queue *q)
{
    return rb_add_consumer(R(b), q);
}
static int v_cancel_consumer(struct broker *b, const char *queue)
{
    return rb_cancel_consumer(R(b), queue);
}
static void v_each_consumer(const struct broker *b,
                            void (*fn)(const struct broker_queue *q, void *arg),
                            void *arg)
{
    rb_each_consumer(CR(b), fn, arg);
}
static int v_declare_exchange(struct broker *b, const char *name, const char *type,
                              int durable)
{
    return rb_declare_exchange(R(b), name, type, durable);
}
static int v_queue_stats(struct broker *b, const char *queue, broker_queue_stats_fn *cb,
                         void *privdata)
{
    return rb_queue_stats(R(b), queue, cb, privdata);
}
static void v_queue_stats_cancel(struct broker *b, void *privdata)
{
    rb_queue_stats_cancel(R(b), privdata);
}
static void v_set_prefetch(struct broker *b, int prefetch_count)
{
    rb_set_prefetch(R(b), prefetch_count);
}
static void v_stop_consuming(struct broker *b)
{
    rb_stop_consuming(R(b));
}
static void v_free(struct broker *b)
{
    rb_free(R(b));
}

/* No BROKER_CAP_PARK: a held eta task keeps its record, whose lease is
 * refreshed, instead of a parked copy. */
static const struct broker_vtab redis_vtab = {
    .name = "redis",
    .caps = BROKER_CAP_CONFIRMS | BROKER_CAP_PRIORITY | BROKER_CAP_PREFETCH,
    .connect = v_connect,
    .connected = v_connected,
    .wait_subscribed = v_wait_subscribed,
    .generation = v_generation,
    .reconnects = v_reconnects,
    .blocked = v_blocked,
    .ack = v_ack,
    .reject = v_reject,
    .publish = v_publish,
    .add_consumer = v_add_consumer,
    .cancel_consumer = v_cancel_consumer,
    .each_consumer = v_each_consumer,
    .declare_exchange = v_declare_exchange,
    .queue_stats = v_queue_stats,
    .queue_stats_cancel = v_queue_stats_cancel,
    .set_prefetch = v_set_prefetch,
    .stop_consuming = v_stop_consuming,
    .free = v_free,
};

struct broker *redis_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                                broker_msg_fn *on_msg, broker_conn_fn *on_conn,
                                void *privdata, struct cr_err *err)
{
    struct redis_broker *b = rb_new(loop, cfg, on_msg, on_conn, privdata, err);
    if (!b)
        return NULL;
    b->base.vt = &redis_vtab;
    return &b->base;
}
