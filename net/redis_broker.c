/* redis_broker.c -- kombu's Redis transport behind net/broker.h: the
 * connections, the replies, the Lua text and the face.
 *
 * Three connections (net/redis.h), as kombu keeps them: one blocked in BRPOP,
 * one for every other command (records, acks, restores, publishes, bindings,
 * depth polls), one subscribed (PSUBSCRIBE) for fanout queues. The wire format
 * is protocol/kombu.h's; the facts are in docs/internals/redis-broker.md.
 * When to pop and how much, what is held, when it is acked, refreshed or
 * restored is net/vsession.c's to decide (a pure module, unit-tested); this
 * file sends what it asks for and feeds it the replies. The queues and
 * bindings are in redis_consumers.c, the restores in redis_restore.c, what
 * is sent out in redis_publish.c (redis_broker_int.h joins them).
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
 * the record is still the one read. Dead workers' records are moved back in
 * restore rounds under kombu's mutex.
 *
 * Deliveries stay settleable across reconnects: a record lives in Redis, not
 * in a connection, so broker_generation() never changes and acks made while
 * a connection is down are sent when it is back. */
#include "redis_broker_int.h" /* hiredis, kombu, redis, vsession */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/alloc.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/redact.h"

/* The lease refresh runs every visibility_timeout / 3, but at least once a
 * minute: a peer with a shorter visibility timeout than ours (Python workers
 * and every `celery inspect` client restore with their own) then still sees
 * fresh scores as long as its timeout is above a minute; and at most once a
 * second, for the short timeouts tests use. Its cost is one ZADD per held
 * message per period, pipelined. */
#define LEASE_MIN_MS 1000
#define LEASE_MAX_MS 60000
/* broker_free() waits this long, at most, for its restores and last acks. */
#define FREE_WAIT_MS 3000
/* The bytes of envelopes one pop script call returns (past its first): what
 * is in flight stays near 4 MB whatever they weigh. The window, the batch
 * sizes and the calls in flight are vsession_config_default()'s. */
#define POP_BATCH_BYTES (1024 * 1024)

/* Deletes the lock only while it still holds our token. */
const char redis_broker__unlock_lua[] = "if redis.call('GET', KEYS[1]) == ARGV[1] then "
                                        "return redis.call('DEL', KEYS[1]) end return 0";
/* kombu's restore as one script: the record is removed and the message pushed
 * only if the record is still the value we read (nobody acked, restored or
 * re-recorded it meanwhile). KEYS: unacked, unacked_index, target lists.
 * ARGV: tag, value read, envelope to push, "R" (RPUSH: head of the line) or
 * "L" (LPUSH: the tail). */
const char redis_broker__restore_lua[] =
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

uint64_t redis_broker__now_ms(const struct redis_broker *b)
{
    return uv_now(b->loop);
}

double redis_broker__epoch_s(void)
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
int redis_broker__send_op(struct redis_broker *b, struct redis_conn *c, op_fn *fn,
                          void *arg, struct redis_args *a)
{
    const char **argv = redis_args_argv(a);
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

/* MULTI, the commands, EXEC: fn gets EXEC's reply. Same return as
 * redis_broker__send_op(). The commands are queued in hiredis in one go, so either all or
 * none go. */
int redis_broker__send_multi(struct redis_broker *b, op_fn *fn, void *arg,
                             struct redis_args *cmds, int n)
{
    struct redis_args m;
    int rc;
    for (int i = 0; i < n; i++)
        if (!redis_args_argv(&cmds[i]))
            return CR_ENOMEM;
    if (!redis_conn_up(b->cmd))
        return CR_EBROKER;
    redis_args_init(&m);
    redis_args_s(&m, "MULTI");
    rc = redis_broker__send_op(b, b->cmd, NULL, NULL, &m);
    redis_args_release(&m);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++)
        redis_broker__send_op(b, b->cmd, NULL, NULL, &cmds[i]);
    redis_args_init(&m);
    redis_args_s(&m, "EXEC");
    rc = redis_broker__send_op(b, b->cmd, fn, arg, &m);
    redis_args_release(&m);
    return rc;
}

int redis_broker__is_error(const redisReply *r)
{
    return !r || r->type == REDIS_REPLY_ERROR;
}

/* An error reply that says "not now" rather than "never". */
int redis_broker__refused_for_now(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && redis_refusal_passes(r->str);
}

/* An EXEC reply whose every command succeeded. */
int redis_broker__exec_ok(int status, const redisReply *r)
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

void redis_broker__args_key(struct redis_broker *b, struct redis_args *a,
                            const char *queue, int bucket)
{
    struct buf k;
    buf_init(&k);
    if (key_of(b, &k, queue, bucket))
        a->oom = 1;
    else
        redis_args_add(a, k.data, k.len);
    buf_release(&k);
}

void redis_broker__random_bytes(unsigned char *p, size_t n)
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

/* ------------------------------------------------------------ deliveries */

void redis_broker__deliver(struct redis_broker *b, struct kombu_msg *km,
                           const char *queue, int no_ack)
{
    struct delivery *m = delivery_new();
    if (!m) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message");
        return;
    }
    m->rec.generation = 1;
    m->priority = kombu_to_engine_priority(km->priority);
    kombu_msg_move_to(km, m);
    m->queue = cr_strdup(queue);
    m->no_ack = no_ack;
    m->received_ms = redis_broker__now_ms(b);
    m->rec.id = km->delivery_tag;
    km->delivery_tag = NULL;
    m->caps = broker_delivery_caps(&b->base);
    if (!m->queue) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message");
        delivery_free(m);
        return;
    }
    b->on_delivery(&b->base, m, b->privdata);
}

/* What a popped value may weigh. Twice the body limit and some: a body
 * just over the limit still reaches the engine, which refuses it the way it
 * refuses one from RabbitMQ (a stored FAILURE, a dead letter); only what is far
 * beyond is set aside here, unread. */
size_t redis_broker__body_bound(const struct redis_broker *b)
{
    size_t m = b->cfg.max_message_bytes;
    return m ? 2 * m + 65536 : 0;
}

void redis_broker__held_free(struct held *h)
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
        int ok = redis_broker__exec_ok(status, r);
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
    struct redis_args c[2];
    struct buf v;
    char score[64];
    char *tag = cr_strdup(rec->tag);
    struct cr_err err;
    int rc;

    buf_init(&v);
    redis_args_init(&c[0]);
    redis_args_init(&c[1]);
    snprintf(score, sizeof(score), "%.7f", redis_broker__epoch_s());
    rc = tag ? kombu_unacked_encode(h->env, h->env_len, h->exchange, h->routing_key, &v,
                                    &err)
             : CR_ENOMEM;
    if (!rc) {
        redis_args_s(&c[0], "ZADD");
        redis_args_s(&c[0], b->k_index);
        redis_args_s(&c[0], score);
        redis_args_s(&c[0], rec->tag);
        redis_args_s(&c[1], "HSET");
        redis_args_s(&c[1], b->k_unacked);
        redis_args_s(&c[1], rec->tag);
        redis_args_add(&c[1], v.data, v.len);
        rc = redis_broker__send_multi(b, on_recorded, tag, c, 2);
    }
    if (rc)
        cr_free(tag);
    buf_release(&v);
    redis_args_release(&c[0]);
    redis_args_release(&c[1]);
    return rc;
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
        redis_broker__held_free(h);
        return CR_ENOMEM;
    }
    if (!recorded) {
        memcpy(h->env, env, len);
        h->env[len] = '\0';
        h->env_len = len;
    }
    if (vsession_hold(b->vs, km->delivery_tag, h, recorded) < 0) {
        redis_broker__held_free(h);
        return CR_ENOMEM;
    }
    return 0;
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
        redis_broker__push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    c = redis_broker__find_cons(b, queue);
    /* Cancelled meanwhile, or stopped: back to the head of its list, as
     * kombu requeues a message that finds no consumer. */
    if (redis_broker__stopping(b) || !c || c->fanout ||
        (!redis_broker__consuming(b) && !c->q.no_ack)) {
        redis_broker__push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    if (rotate)
        kombu_rotate(&b->o, b->cycle, b->ncycle, queue);
    memset(&err, 0, sizeof(err));
    rc = redis_broker__body_bound(b) && len > redis_broker__body_bound(b)
             ? CR_ETOOBIG
             : kombu_msg_decode(&km, env, len, redis_broker__body_bound(b), &err);
    if (rc == CR_ENOMEM) {
        LOG(LOG_ERROR, "broker: out of memory decoding a message; pushing it back");
        redis_broker__push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    if (rc) {
        redis_broker__set_aside(b, key, klen, env, len,
                                err.msg[0] ? err.msg : cr_strerror(rc));
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
        redis_broker__push_back_rec(b, key, klen, env, len, tag);
        return;
    }
    redis_broker__deliver(b, &km, queue, c->q.no_ack);
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
                          redis_broker__now_ms(b));
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (b->bad_pops++ < 10)
            LOG(LOG_ERROR, "broker: BRPOP refused: %s", r->str);
        vsession_on_block(b->vs, VSESSION_REFUSED, 0, redis_broker__now_ms(b));
        return;
    }
    /* nil: the timeout or CLIENT UNBLOCK; the next BRPOP goes from prepare */
    popped = r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
             r->element[0]->type == REDIS_REPLY_STRING &&
             r->element[1]->type == REDIS_REPLY_STRING;
    vsession_on_block(b->vs, VSESSION_OK, popped, redis_broker__now_ms(b));
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

static void on_batch(struct redis_broker *b, int status, redisReply *r, void *arg)
{
    struct batch_arg *ba = arg;
    long asked = ba->asked;
    const char *last = NULL;
    size_t lastlen = 0, got;
    int cut;
    char queue[KOMBU_NAME_MAX];

    /* Lost: what it popped, if it ran, is recorded under its score and held
     * by nobody; the session has it looked up as soon as the commands
     * connection is up (a BRPOP's reply lost is lost, as in kombu).
     * Cancelled (broker_free): left to the visibility timeout. */
    if (status) {
        vsession_on_batch(b->vs, asked,
                          status == CR_ECANCELED ? VSESSION_CANCELED : VSESSION_LOST,
                          redis_broker__now_ms(b));
        if (status != CR_ECANCELED)
            vsession_on_pop_lost(b->vs, ba->score);
        cr_free(ba);
        return;
    }
    cr_free(ba);
    if (r->type == REDIS_REPLY_ERROR) {
        /* NOSCRIPT: flushed meanwhile, loaded again by the next call */
        int noscript = !strncmp(r->str, "NOSCRIPT", 8), fails, off;
        int was_off = vsession_script_state(b->vs) == VSESSION_SCRIPT_OFF;
        if (noscript)
            b->script_loaded = 0;
        vsession_on_batch(b->vs, asked, noscript ? VSESSION_NOSCRIPT : VSESSION_REFUSED,
                          redis_broker__now_ms(b));
        fails = vsession_script_fails(b->vs);
        off = vsession_script_state(b->vs) == VSESSION_SCRIPT_OFF;
        if (fails <= 3 || (off && !was_off))
            LOG(LOG_WARNING, "broker: pop script refused: %s%s", r->str,
                off ? "; popping with BRPOP alone for a minute" : "");
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        vsession_on_batch(b->vs, asked, VSESSION_MALFORMED, redis_broker__now_ms(b));
        return;
    }
    vsession_on_batch(b->vs, asked, VSESSION_OK, redis_broker__now_ms(b));
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
        struct redis_args a;
        redis_args_init(&a);
        redis_args_s(&a, "SCRIPT");
        redis_args_s(&a, "LOAD");
        redis_args_s(&a, pop_lua);
        if (redis_broker__send_op(b, b->pop, NULL, NULL, &a) == 0)
            b->script_loaded = 1;
        redis_args_release(&a);
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
    snprintf(score, sizeof(score), "%.7f", redis_broker__epoch_s());
    snprintf(lim, sizeof(lim), "%zu", redis_broker__body_bound(b));
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
        const struct rcons *c = redis_broker__find_cons(b, qs[i % n]);
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
        if (redis_broker__find_cons(b, b->cycle[i]))
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
        struct rcons *c = redis_broker__find_cons(b, b->cycle[i]);
        if (c && (c->q.no_ack || tasks))
            qs[n++] = b->cycle[i];
    }
    if (!n)
        return CR_ENOTFOUND;
    if (b->client_id_state == 0) {
        struct redis_args a;
        redis_args_init(&a);
        redis_args_s(&a, "CLIENT");
        redis_args_s(&a, "ID");
        if (redis_broker__send_op(b, b->pop, on_client_id, NULL, &a) == 0)
            b->client_id_state = 1;
        redis_args_release(&a);
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
    if (status == 0 && !redis_broker__exec_ok(status, r)) {
        if (vsession_ack_refusals(b->vs) == 0)
            LOG(LOG_WARNING, "broker: ack refused: %s; sent again until it is taken",
                r->type == REDIS_REPLY_ERROR ? r->str : "bad reply");
        rep = VSESSION_REFUSED;
    } else if (status == 0) {
        rep = VSESSION_OK;
    }
    if (b->vs)
        vsession_on_acked(b->vs, a->tags, a->n, rep, redis_broker__now_ms(b));
    cr_free(a);
}

/* One MULTI ZREM unacked_index T... / HDEL unacked T... / EXEC per batch. */
static int op_ack(void *ctx, const char *const *tags, int n)
{
    struct redis_broker *b = ctx;
    struct ack_arg *a = ack_arg_new(tags, n);
    struct redis_args c[2];
    int rc;
    if (!a)
        return CR_ENOMEM;
    redis_args_init(&c[0]);
    redis_args_init(&c[1]);
    redis_args_s(&c[0], "ZREM");
    redis_args_s(&c[0], b->k_index);
    redis_args_s(&c[1], "HDEL");
    redis_args_s(&c[1], b->k_unacked);
    for (int i = 0; i < n; i++) {
        redis_args_s(&c[0], tags[i]);
        redis_args_s(&c[1], tags[i]);
    }
    rc = redis_broker__send_multi(b, on_acked, a, c, 2);
    redis_args_release(&c[0]);
    redis_args_release(&c[1]);
    if (rc)
        cr_free(a);
    return rc;
}

static int rb_ack(struct broker *base, struct delivery *m)
{
    struct redis_broker *b = (struct redis_broker *)base;
    if (m->no_ack || m->settled || !m->rec.id)
        return 0;
    m->settled = 1;
    if (vsession_ack(b->vs, m->rec.id)) {
        LOG(LOG_ERROR,
            "broker: out of memory acking %s; it comes back after the "
            "visibility timeout",
            m->rec.id);
        return CR_ENOMEM;
    }
    return 0;
}

/* ------------------------------------------------------------ restores */

static int rb_reject(struct broker *base, struct delivery *m, int requeue)
{
    struct redis_broker *b = (struct redis_broker *)base;
    if (!requeue)
        return rb_ack(base, m);
    if (m->no_ack || m->settled || !m->rec.id)
        return 0;
    m->settled = 1;
    vsession_requeue(b->vs, m->rec.id);
    return 0;
}

/* ------------------------------------------------------------ leases */

/* ZADD unacked_index XX <now> <tag>... for every record we hold: XX, so an
 * entry removed meanwhile is not made again. */
static void op_refresh(void *ctx, const char *const *tags, int n)
{
    struct redis_broker *b = ctx;
    char score[64];
    struct redis_args a;
    snprintf(score, sizeof(score), "%.7f", redis_broker__epoch_s());
    redis_args_init(&a);
    redis_args_s(&a, "ZADD");
    redis_args_s(&a, b->k_index);
    redis_args_s(&a, "XX");
    for (int i = 0; i < n; i++) {
        redis_args_s(&a, score);
        redis_args_s(&a, tags[i]);
    }
    redis_broker__send_op(b, b->cmd, NULL, NULL, &a);
    redis_args_release(&a);
}

static void op_release(void *ctx, void *data)
{
    (void)ctx;
    redis_broker__held_free(data);
}

static const struct vsession_ops session_ops = {
    .link_up = op_link_up,
    .pop_batch = op_pop_batch,
    .pop_wide = op_pop_wide,
    .pop_block = op_pop_block,
    .record = op_record,
    .ack = op_ack,
    .refresh = op_refresh,
    .restore = redis_broker__op_restore,
    .release = op_release,
    .round_lock = redis_broker__op_round_lock,
    .round_scan = redis_broker__op_round_scan,
    .round_unlock = redis_broker__op_round_unlock,
    .scan_lost = redis_broker__op_scan_lost,
    .restores_again = redis_broker__op_restores_again,
};

static void on_tick(uv_timer_t *t)
{
    struct redis_broker *b = t->data;
    uint64_t now = redis_broker__now_ms(b);
    if (redis_broker__closed(b) || !redis_conn_up(b->cmd))
        return;
    vsession_tick(b->vs, now); /* and what was refused for now */
    vsession_pop(b->vs, now);
}

static void on_prepare(uv_prepare_t *p)
{
    struct redis_broker *b = p->data;
    if (b->vs)
        vsession_pump(b->vs, redis_broker__now_ms(b));
}

/* ------------------------------------------------------------ connections */

static int all_up(const struct redis_broker *b)
{
    return redis_conn_up(b->cmd) && redis_conn_up(b->pop) && redis_conn_up(b->sub);
}

static void tell_owner(struct redis_broker *b)
{
    int up = all_up(b);
    if (redis_broker__closed(b) || up == b->up_said)
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
        redis_broker__send_binding(b, &b->cons[i].q, "SADD");
    redis_broker__send_dlq_binding(b);
    /* records not written yet, the acks of the last seconds again, leases,
     * the waiting restores, the lost pop calls' records */
    vsession_on_link(b->vs, VSESSION_LINK_STORE, 1, redis_broker__now_ms(b));
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
            redis_broker__psubscribe(b, &b->cons[i], "PSUBSCRIBE");
    }
}

static void on_event(struct redis_conn *c, enum redis_conn_event ev,
                     const struct redis_conn_news *news, void *privdata)
{
    struct redis_broker *b = privdata;
    const char *role = c == b->cmd ? "commands" : c == b->pop ? "consumer" : "pub/sub";
    if (redis_broker__closed(b))
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
            vsession_on_link(b->vs, VSESSION_LINK_POP, 1, redis_broker__now_ms(b));
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
                                    : (news->why ? news->why : "redis_broker__closed"));
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

static int rb_connect(struct broker *base, struct cr_err *err)
{
    struct redis_broker *b = (struct redis_broker *)base;
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
static int rb_wait_subscribed(struct broker *base, int timeout_ms)
{
    struct redis_broker *b = (struct redis_broker *)base;
    uv_update_time(b->loop);
    for (uint64_t until = redis_broker__now_ms(b) + (uint64_t)timeout_ms;
         b->psub_unconfirmed > 0 && redis_conn_up(b->sub) &&
         redis_broker__now_ms(b) < until;) {
        struct timespec pause = {0, 1000000};
        uv_run(b->loop, UV_RUN_NOWAIT);
        if (b->psub_unconfirmed > 0)
            nanosleep(&pause, NULL);
        uv_update_time(b->loop);
    }
    return b->psub_unconfirmed > 0 ? CR_ETIMEDOUT : 0;
}

static int rb_connected(const struct broker *base)
{
    const struct redis_broker *b = (const struct redis_broker *)base;
    return all_up(b);
}

static unsigned long rb_reconnects(const struct broker *base)
{
    const struct redis_broker *b = (const struct redis_broker *)base;
    return redis_conn_reconnects(b->cmd) + redis_conn_reconnects(b->pop) +
           redis_conn_reconnects(b->sub);
}

static void rb_set_prefetch(struct broker *base, int n)
{
    struct redis_broker *b = (struct redis_broker *)base;
    vsession_set_prefetch(b->vs, n);
}

/* Ends the BRPOP at once rather than at its timeout (Redis >= 5; older ones
 * refuse and the BRPOP ends by itself within its timeout). What it still
 * returns goes back to the head of its list (on_popped()). */
static void unblock_pop(struct redis_broker *b)
{
    struct redis_args a;
    char id[32];
    if (vsession_block_state(b->vs) != VSESSION_BLOCK_OUT || b->client_id_state != 2 ||
        !redis_conn_up(b->cmd))
        return;
    snprintf(id, sizeof(id), "%lld", b->client_id);
    redis_args_init(&a);
    redis_args_s(&a, "CLIENT");
    redis_args_s(&a, "UNBLOCK");
    redis_args_s(&a, id);
    redis_broker__send_op(b, b->cmd, NULL, NULL, &a);
    redis_args_release(&a);
}

static void rb_stop_consuming(struct broker *base)
{
    struct redis_broker *b = (struct redis_broker *)base;
    if (!redis_broker__consuming(b))
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
        redis_broker__cons_release(&b->cons[i]);
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
        vsession_drain(b->vs,
                       redis_broker__now_ms(b)); /* nothing reaches the owner any more */
        return;
    }
    vsession_stop_consuming(b->vs);
    unblock_pop(b);
    vsession_drain(b->vs,
                   redis_broker__now_ms(b)); /* held messages back, the last acks out */
    for (int i = 0; i < b->ncons; i++)
        if (b->cons[i].q.auto_delete || b->cons[i].fanout)
            redis_broker__send_binding(b, &b->cons[i].q, "SREM");
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

static void rb_free(struct broker *base)
{
    struct redis_broker *b = (struct redis_broker *)base;
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
        redis_broker__job_free(j);
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
                                   broker_delivery_fn *on_delivery,
                                   broker_conn_fn *on_conn, void *privdata,
                                   struct cr_err *err)
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
    b->on_delivery = on_delivery;
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
    vc.retry_ms = TICK_MS; /* a refused ack batch goes again a tick later */
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
            rb_free(&b->base);
            return NULL;
        }
        goto oom;
    }
    for (int i = 0; i < cfg->nqueues; i++) {
        struct broker_queue q;
        broker_task_queue(&q, cfg->queues[i]);
        if (redis_broker__add_consumer(&b->base, &q))
            goto oom;
    }
    if (b->o.order == KOMBU_ORDER_SORTED)
        kombu_initial_order(&b->o, b->cycle, b->ncycle);
    if (cfg->dlx && redis_broker__declare_exchange(&b->base, cfg->dlx, "topic", 1))
        goto oom;
    return b;
oom:
    cr_err_set(err, CR_ENOMEM, "out of memory creating the broker");
    rb_free(&b->base);
    return NULL;
}

/* ------------------------------------------------------------ the face */

/* Never changes: see the top of the file. */
static unsigned rb_generation(const struct broker *base)
{
    (void)base;
    return 1;
}

/* Redis never blocks publishing (an OOM refusal fails the publish). */
static int rb_blocked(const struct broker *base, const char **why)
{
    (void)base;
    if (why)
        *why = NULL;
    return 0;
}

/* A delivery's record lives in Redis, not in a connection: it can be settled
 * whatever became of the connections (an ack made while one is down waits for
 * it). */
static int rb_live(const struct broker *base, const struct delivery *d)
{
    (void)base;
    (void)d;
    return 1;
}

/* No MSG_CAP_PARK: a held eta task keeps its record, whose lease is
 * refreshed, instead of a parked copy. */
static const struct broker_vtab redis_vtab = {
    .name = "redis",
    .caps = MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY | MSG_CAP_PREFETCH,
    .connect = rb_connect,
    .connected = rb_connected,
    .wait_subscribed = rb_wait_subscribed,
    .generation = rb_generation,
    .reconnects = rb_reconnects,
    .blocked = rb_blocked,
    .ack = rb_ack,
    .reject = rb_reject,
    .live = rb_live,
    .publish = redis_broker__publish,
    .add_consumer = redis_broker__add_consumer,
    .cancel_consumer = redis_broker__cancel_consumer,
    .each_consumer = redis_broker__each_consumer,
    .declare_exchange = redis_broker__declare_exchange,
    .queue_stats = redis_broker__queue_stats,
    .queue_stats_cancel = redis_broker__queue_stats_cancel,
    .set_prefetch = rb_set_prefetch,
    .stop_consuming = rb_stop_consuming,
    .free = rb_free,
};

struct broker *redis_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                                broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                                void *privdata, struct cr_err *err)
{
    struct redis_broker *b = rb_new(loop, cfg, on_delivery, on_conn, privdata, err);
    if (!b)
        return NULL;
    b->base.vt = &redis_vtab;
    return &b->base;
}
