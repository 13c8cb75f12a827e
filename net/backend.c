/* backend.c -- Celery's Redis result store, and the queue of commands that
 * outlasts reconnects, on one net/redis.c connection. */
#include "backend.h"

#include <cJSON.h>
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"
#include "protocol/pyjson.h"
#include "util/alloc.h"
#include "util/log.h"
#include "util/replay.h"
#include "util/sha1.h"

#define KEY_PREFIX BACKEND_META_PREFIX

/* Stores a state, then publishes it on the channel named like the key, as
 * Celery's RedisBackend.set() does (SETEX, PUBLISH), unless what is stored
 * already must win. Celery's own GET-then-SET protects only SUCCESS, and not
 * atomically; here the check and the write are one script, and the rule is:
 *  - a stored SUCCESS is never replaced;
 *  - a stored FAILURE or REVOKED is replaced only by a final state (SUCCESS,
 *    FAILURE, REVOKED), never by RETRY, STARTED or any other;
 *  - a stored non-final state of attempt N is not replaced by a state of an
 *    earlier attempt (ARGV[3] < N).
 * The second rule is what the late RETRY needs: a retry is published before
 * its RETRY is stored, so its next attempt can run and store FAILURE first.
 * The attempt (the message's retries) is not in Celery's meta unless
 * result_extended, and the meta is left exactly as Celery writes it, so it
 * goes under KEYS[2] (BACKEND_ATTEMPT_PREFIX <id>, same TTL), kept only while a
 * retried task's stored state is not final: set by a non-final state of
 * attempt 1 or later (attempt 0 has nothing earlier to keep out), deleted by
 * the final state. ARGV: meta, result_expires, attempt (-1: unknown,
 * no order check). Returns 1 stored, 0 kept what was there. The first store of
 * a first attempt (most results) checks nothing more than whether a meta is
 * there: one GET before the write, as before. */
static struct backend_script store_script =
    BACKEND_SCRIPT("local att = tonumber(ARGV[3]) or -1\n"
                   "local ttl = tonumber(ARGV[2])\n"
                   "local cur = redis.call('GET', KEYS[1])\n"
                   "if cur or att ~= 0 then\n"
                   "  local function st(m)\n"
                   "    return string.match(m, '^%s*{%s*\"status\"%s*:%s*\"(%u+)\"') or\n"
                   "      string.match(m, '\"status\"%s*:%s*\"(%u+)\"')\n"
                   "  end\n"
                   "  local fin = {SUCCESS = true, FAILURE = true, REVOKED = true}\n"
                   "  local new = fin[st(ARGV[1]) or '']\n"
                   "  if cur then\n"
                   "    local c = st(cur) or ''\n"
                   "    if c == 'SUCCESS' or (fin[c] and not new) then return 0 end\n"
                   "    if not fin[c] and att >= 0 then\n"
                   "      local ca = tonumber(redis.call('GET', KEYS[2]))\n"
                   "      if ca and ca > att then return 0 end\n"
                   "    end\n"
                   "  end\n"
                   "  if new then\n"
                   "    if att ~= 0 then redis.call('DEL', KEYS[2]) end\n"
                   "  elseif att > 0 then\n"
                   "    if ttl > 0 then redis.call('SETEX', KEYS[2], ttl, att)\n"
                   "    else redis.call('SET', KEYS[2], att) end\n"
                   "  end\n"
                   "end\n"
                   "if ttl > 0 then redis.call('SETEX', KEYS[1], ttl, ARGV[1])\n"
                   "else redis.call('SET', KEYS[1], ARGV[1]) end\n"
                   "redis.call('PUBLISH', KEYS[1], ARGV[1])\n"
                   "return 1\n");

/* Celery's set_chord_size: the header size under <gid>.s, written as its
 * RedisBackend writes any value (SETEX, then PUBLISH on the key's channel). */
static struct backend_script chord_size_script = BACKEND_SCRIPT(
    "if tonumber(ARGV[2]) > 0 then redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1])\n"
    "else redis.call('SET', KEYS[1], ARGV[1]) end\n"
    "redis.call('PUBLISH', KEYS[1], ARGV[1])\n"
    "return 1\n");

/* Celery's on_chord_part_return pipeline (ZADD, ZCOUNT, GET .t, GET .s, the
 * three EXPIREs), and its completion test and ZRANGE, as one script: a MULTI
 * pipeline there, atomic here too, and one round trip. KEYS: .j .t .s and the
 * join claim; ARGV: member, score, result_expires, the joining task's id.
 * Returns the members in score order when the chord is complete (.s set and
 * count = .s + .t) and this task is to join it, else the count. A .s that is
 * not a number never completes, as Celery's int() raises.
 *
 * The claim is celeriac's own (a Python worker neither sets nor reads it): the
 * task whose ZADD completed the chord names itself there, so that when a crash
 * brings several members back at once, only that task's redelivery joins the
 * chord again (its own ZADD changes nothing, count is still complete), not
 * every member's. A complete chord nobody claimed (joined by Python) is joined
 * by whoever finds it so, as Celery would. */
static struct backend_script chord_part_script = BACKEND_SCRIPT(
    "local added = redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])\n"
    "local n = redis.call('ZCOUNT', KEYS[1], '-inf', '+inf')\n"
    "local t = redis.call('GET', KEYS[2])\n"
    "local s = redis.call('GET', KEYS[3])\n"
    "local ttl = tonumber(ARGV[3])\n"
    "if ttl > 0 then\n"
    "  redis.call('EXPIRE', KEYS[1], ttl)\n"
    "  redis.call('EXPIRE', KEYS[2], ttl)\n"
    "  redis.call('EXPIRE', KEYS[3], ttl)\n"
    "end\n"
    "local size = s and tonumber(s)\n"
    "if not (size and n == size + ((t and tonumber(t)) or 0)) then return n end\n"
    "local claim = redis.call('GET', KEYS[4])\n"
    "if added == 0 and claim and claim ~= ARGV[4] then return n end\n"
    "if ttl > 0 then redis.call('SET', KEYS[4], ARGV[4], 'EX', ttl)\n"
    "else redis.call('SET', KEYS[4], ARGV[4]) end\n"
    "return redis.call('ZRANGE', KEYS[1], 0, -1)\n");

enum op_kind { OP_STORE, OP_GET, OP_RAW };

/* Results Redis confirmed lately, kept (RECENT_MAX of them, RECENT_BYTES_MAX
 * in all, for RECENT_REPLAY_MS) to be written again after a reconnect
 * (util/replay.h says why). The broker sends its acks of the same span again
 * too (net/vsession.c), and an ack that reached the new master without its
 * result would lose the task; writing the results again first closes that.
 * Writing one twice is harmless: the store script never overwrites a
 * SUCCESS. */
#define RECENT_MAX 4096
#define RECENT_BYTES_MAX ((size_t)8 << 20)
#define RECENT_REPLAY_MS 10000

struct op {
    struct op *next;
    struct backend *bk;
    struct redis_req req; /* req.data is the op */
    enum op_kind kind;
    char *key;
    char *value; /* OP_STORE */
    size_t value_len;
    int attempt;                /* OP_STORE: see store_script */
    backend_store_fn *store_cb; /* NULL: a store written again (replay_recent()) */
    uint64_t recent_at;         /* such a store's first confirmation */
    backend_get_fn *get_cb;
    backend_reply_fn *raw_cb;
    backend_done_fn *done_cb;      /* OP_RAW of a chord command */
    backend_chord_fn *chord_cb;    /* OP_RAW of a part-return */
    struct backend_script *script; /* OP_STORE, or OP_RAW by backend_eval() */
    int use_eval;                  /* send the text: see on_noscript() */
    int noscripts;                 /* NOSCRIPT replies to this op so far */
    int argc;                      /* OP_RAW: with the script's two words */
    char **argv;
    size_t *argvlen;
    void *privdata;
};

struct backend {
    struct redis_conn *conn; /* connects, times out, reconnects */
    /* global_keyprefix, with Celery's '_' added: before every key and
     * channel; "" when none. */
    char prefix[BACKEND_KEYPREFIX_MAX + 2];
    size_t prefix_len;
    int result_expires;
    char expires_text[24];
    int freeing;
    /* Resends operations waiting while connected; its close callback frees
     * the backend. */
    uv_timer_t retry;
    struct op *wait_head, *wait_tail; /* not yet sent */
    size_t waiting;
    unsigned long refusing; /* error replies since the last answer that was not */
    uv_loop_t *loop;
    int ever_up;          /* the first connect has nothing to write again */
    struct replay recent; /* see RECENT_MAX; entries' aux is the attempt */
};

static void send_op(struct backend *bk, struct op *op);

static void op_free(struct op *op)
{
    cr_free(op->argv); /* one block with argvlen and the strings */
    cr_free(op->key);
    cr_free(op->value);
    cr_free(op);
}

static void on_retry(uv_timer_t *t);

/* ------------------------------------------------------ recent results */

/* Takes a confirmed store's key and value into the ring (op keeps neither). */
static void recent_keep(struct backend *bk, struct op *op, uint64_t at)
{
    replay_put(&bk->recent, op->key, op->value, op->value_len, op->attempt, at,
               uv_now(bk->loop));
    op->key = op->value = NULL;
    op->value_len = 0;
}

/* After a reconnect: the results of the last RECENT_REPLAY_MS go again, in
 * the order first written and ahead of whatever waits, to whichever server
 * now answers. They come back to the ring once confirmed, under their first
 * time, so a second failover soon after writes them again too. */
static void replay_recent(struct backend *bk)
{
    uint64_t now = uv_now(bk->loop);
    struct op *head = NULL, *last = NULL;
    struct replay_entry e;
    size_t n = 0;

    while (replay_take(&bk->recent, now, &e)) {
        struct op *op = cr_calloc(1, sizeof(*op));
        if (!op) {
            cr_free(e.key);
            cr_free(e.value);
            continue;
        }
        op->bk = bk;
        op->req.data = op;
        op->kind = OP_STORE;
        op->script = &store_script;
        op->key = e.key;
        op->value = e.value;
        op->value_len = e.value_len;
        op->attempt = e.aux;
        op->recent_at = e.at;
        if (last)
            last->next = op;
        else
            head = op;
        last = op;
        n++;
    }
    if (!n)
        return;
    last->next = bk->wait_head;
    if (!bk->wait_head)
        bk->wait_tail = last;
    bk->wait_head = head;
    bk->waiting += n;
    LOG(LOG_INFO,
        "result backend: writing again %zu result(s) of the last %d s, which the "
        "server lost may not have passed on",
        n, RECENT_REPLAY_MS / 1000);
}

/* Queues op to be sent later. Disconnected, the reconnect sends the queue;
 * connected (Redis refused it, hiredis could not take it, or others wait
 * ahead of it), the retry timer does, so nothing waits without one. */
static void wait_push(struct backend *bk, struct op *op)
{
    op->next = NULL;
    if (bk->wait_tail)
        bk->wait_tail->next = op;
    else
        bk->wait_head = op;
    bk->wait_tail = op;
    bk->waiting++;
    if (redis_conn_up(bk->conn) && !bk->freeing &&
        !uv_is_active((uv_handle_t *)&bk->retry))
        uv_timer_start(&bk->retry, on_retry, 1000, 0);
}

static struct op *wait_pop(struct backend *bk)
{
    struct op *op = bk->wait_head;
    if (op) {
        bk->wait_head = op->next;
        if (!bk->wait_head)
            bk->wait_tail = NULL;
        bk->waiting--;
    }
    return op;
}

/* Sends what waits, in order, once connected (on connect and on the retry
 * timer). Only what waits now: an op that has to wait again (hiredis or Redis
 * refused it) goes in the next round, where looping until the queue is empty
 * would never end. */
static void send_waiting(struct backend *bk)
{
    size_t n = bk->waiting;
    struct op *op;
    while (redis_conn_up(bk->conn) && n-- && (op = wait_pop(bk)))
        send_op(bk, op);
}

/* ----------------------------------------------------------- connection */

/* Where the connection goes, for messages: redis://host:port/db (after a
 * sentinel answered, the master it named, with "via sentinel"), or the unix
 * socket. */
static const char *where(const struct redis_url *u, char *out, size_t size)
{
    if (u->kind == REDIS_URL_UNIX)
        snprintf(out, size, "redis+socket://%.200s?virtual_host=%d", u->socket_path,
                 u->db);
    else
        snprintf(out, size, "%s://%.200s:%d/%d%s", u->tls.on ? "rediss" : "redis",
                 u->host, u->port, u->db,
                 u->kind == REDIS_URL_SENTINEL ? " (via sentinel)" : "");
    return out;
}

/* The connection's news, said in the result backend's words. */
static void on_conn_event(struct redis_conn *c, enum redis_conn_event ev,
                          const struct redis_conn_news *news, void *privdata)
{
    struct backend *bk = privdata;
    const struct redis_url *u = redis_conn_url(c);
    char at[300];

    switch (ev) {
    case REDIS_CONN_UP:
        /* A reconnect at the level of the loss: both ends of an outage show
         * at the default level. */
        if (bk->ever_up)
            LOG(LOG_WARNING,
                "Connected to %s again: the result backend connection is back",
                where(u, at, sizeof(at)));
        else
            LOG(LOG_INFO, "Connected to %s", where(u, at, sizeof(at)));
        if (bk->ever_up)
            replay_recent(bk);
        bk->ever_up = 1;
        send_waiting(bk);
        break;
    case REDIS_CONN_FAILED:
        if (news->loud)
            LOG(LOG_ERROR, "result backend: cannot connect to %s: %s; retrying",
                where(u, at, sizeof(at)), news->why);
        else
            LOG(LOG_DEBUG, "result backend: cannot connect to %s: %s",
                where(u, at, sizeof(at)), news->why);
        break;
    case REDIS_CONN_LOST:
        LOG(LOG_WARNING, "result backend: connection lost: %s; reconnecting", news->why);
        break;
    case REDIS_CONN_SILENT:
        LOG(LOG_WARNING,
            "result backend: connection lost: no reply from %s for %g s; reconnecting",
            where(u, at, sizeof(at)), (double)redis_conn_timeout_ms(c) / 1000);
        break;
    }
}

/* ------------------------------------------------------------ operations */

/* A chord command's reply, said as a status: an error reply is Redis refusing
 * for good (one that passes by itself was sent again, see on_reply()). */
static int chord_status(int status, const redisReply *reply)
{
    if (status == 0 && reply && reply->type == REDIS_REPLY_ERROR) {
        LOG(LOG_ERROR, "result backend: chord command refused: %s", reply->str);
        return CR_EBACKEND;
    }
    return status;
}

static void finish_part(struct op *op, int status, const redisReply *reply)
{
    const char **members = NULL;
    size_t *lens = NULL, n = 0;
    static const char *none[1];

    status = chord_status(status, reply);
    if (status == 0 && reply->type == REDIS_REPLY_ARRAY) {
        n = reply->elements;
        members = n ? cr_malloc(n * sizeof(*members)) : none;
        lens = cr_malloc((n ? n : 1) * sizeof(*lens));
        if (!members || !lens)
            status = CR_ENOMEM;
        for (size_t i = 0; status == 0 && i < n; i++) {
            const redisReply *m = reply->element[i];
            if (m->type != REDIS_REPLY_STRING) {
                status = CR_EBACKEND;
                LOG(LOG_ERROR, "result backend: a chord member is not a string");
                break;
            }
            members[i] = m->str;
            lens[i] = (size_t)m->len;
        }
    }
    if (status)
        op->chord_cb(op->bk, status, NULL, NULL, 0, op->privdata);
    else
        op->chord_cb(op->bk, 0, members, lens, n, op->privdata);
    if (members != none)
        cr_free(members);
    cr_free(lens);
}

static void finish_op(struct op *op, int status, const redisReply *reply)
{
    if (op->kind == OP_RAW && op->chord_cb) {
        finish_part(op, status, reply);
    } else if (op->kind == OP_RAW && op->done_cb) {
        op->done_cb(op->bk, chord_status(status, reply), op->privdata);
    } else if (op->kind == OP_RAW) {
        if (op->raw_cb)
            op->raw_cb(op->bk, status, (const struct redisReply *)reply, op->privdata);
    } else if (op->kind == OP_STORE) {
        int skipped = reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0;
        if (status == 0)
            recent_keep(op->bk, op, op->store_cb ? uv_now(op->bk->loop) : op->recent_at);
        if (op->store_cb)
            op->store_cb(op->bk, status, skipped, op->privdata);
    } else if (reply && reply->type == REDIS_REPLY_STRING) {
        op->get_cb(op->bk, status, reply->str, (size_t)reply->len, op->privdata);
    } else {
        op->get_cb(op->bk, status, NULL, 0, op->privdata);
    }
    op_free(op);
}

static void on_retry(uv_timer_t *t)
{
    send_waiting(t->data);
}

/* An EVAL of op's script was answered (or lost with its connection). */
static void eval_answered(struct op *op)
{
    struct backend_script *s = op->script;
    if (s && s->eval_bk == op->bk && s->eval_gen == redis_conn_generation(op->bk->conn) &&
        s->evals_unanswered > 0)
        s->evals_unanswered--;
}

/* Redis does not know op's script: it started afresh or its script cache was
 * flushed, and then every EVALSHA in flight comes back so. One EVAL loads the
 * script again; the others go again as EVALSHA when such an EVAL is already
 * ahead of them on this connection, rather than each carrying the whole text
 * (a burst of results after a Redis restart would otherwise write the same
 * script once per result). An op told NOSCRIPT twice (the
 * cache flushed again meanwhile) sends the text itself. */
static void on_noscript(struct op *op)
{
    struct backend *bk = op->bk;
    struct backend_script *s = op->script;
    int ahead = s->eval_bk == bk && s->eval_gen == redis_conn_generation(bk->conn) &&
                s->evals_unanswered > 0;

    if (op->noscripts++ || !ahead)
        op->use_eval = 1;
    send_op(bk, op);
}

/* An error Redis lifts by itself (redis_refusal_passes()) refuses a result,
 * or a fire-and-forget command (no callback, e.g. a progress write): it is sent
 * again later. Any other error of a command is its caller's (or nobody's) to
 * handle. */
static void on_reply(struct redis_req *req, int status, struct redisReply *r)
{
    struct op *op = req->data;
    struct backend *bk = op->bk;
    redisReply *reply = (redisReply *)r;

    if (bk->freeing || status == CR_ECANCELED) {
        finish_op(op, CR_ECANCELED, NULL);
        return;
    }
    if (!reply) {
        /* The connection went away with this command unanswered (the
         * connection's LOST said so): it is idempotent, so send it again once
         * we are back. */
        wait_push(bk, op);
        return;
    }
    if (op->use_eval)
        eval_answered(op);
    if (reply->type == REDIS_REPLY_ERROR && op->script && !op->use_eval &&
        !strncmp(reply->str, "NOSCRIPT", 8)) {
        on_noscript(op);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR && op->kind == OP_RAW &&
        (op->raw_cb || !redis_refusal_passes(reply->str))) {
        finish_op(op, 0, reply);
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* Redis said no (OOM, READONLY replica, LOADING...): try again later
         * rather than lose the result. Said once per spell of refusals: a
         * streaming worker makes many writes a second. */
        if (!bk->refusing++)
            LOG(LOG_ERROR, "result backend: %s; will retry", reply->str);
        wait_push(bk, op);
        return;
    }
    if (bk->refusing) {
        LOG(LOG_WARNING, "result backend: writes accepted again after %lu refused",
            bk->refusing);
        bk->refusing = 0;
    }
    finish_op(op, 0, reply);
}

/* The first two words of a script's command: EVALSHA and the digest, or EVAL
 * and the text (see on_noscript()). */
static void script_head(struct op *op, const char **argv, size_t *lens)
{
    struct backend_script *s = op->script;
    if (!s->sha[0])
        sha1_hex(s->text, s->len, s->sha);
    if (op->use_eval) {
        /* Counted until answered: whatever is sent behind it on this
         * connection finds the script loaded. */
        unsigned long gen = redis_conn_generation(op->bk->conn);
        if (s->eval_bk != op->bk || s->eval_gen != gen) {
            s->eval_bk = op->bk;
            s->eval_gen = gen;
            s->evals_unanswered = 0;
        }
        s->evals_unanswered++;
    }
    argv[0] = op->use_eval ? "EVAL" : "EVALSHA";
    lens[0] = strlen(argv[0]);
    argv[1] = op->use_eval ? s->text : s->sha;
    lens[1] = op->use_eval ? s->len : SHA1_HEX_LEN;
}

static void send_op(struct backend *bk, struct op *op)
{
    int rc;
    if (!redis_conn_up(bk->conn)) {
        wait_push(bk, op);
        return;
    }
    if (op->kind == OP_STORE) {
        /* The attempt key is the meta key with Celery's prefix swapped: made
         * here rather than kept with every result waiting for Redis. */
        const char *id = op->key + bk->prefix_len + sizeof(KEY_PREFIX) - 1;
        char small[256], *akey = small, att[24];
        size_t need = bk->prefix_len + sizeof(BACKEND_ATTEMPT_PREFIX) + strlen(id);
        if (need > sizeof(small) && !(akey = cr_malloc(need))) {
            wait_push(bk, op);
            return;
        }
        snprintf(akey, need, "%s%s%s", bk->prefix, BACKEND_ATTEMPT_PREFIX, id);
        snprintf(att, sizeof(att), "%d", op->attempt);
        const char *argv[8] = {
            NULL, NULL, "2", op->key, akey, op->value, bk->expires_text, att};
        size_t lens[8] = {0,
                          0,
                          1,
                          strlen(op->key),
                          strlen(akey),
                          op->value_len,
                          strlen(bk->expires_text),
                          strlen(att)};
        script_head(op, argv, lens);
        rc = redis_conn_send(bk->conn, &op->req, on_reply, 8, argv, lens);
        if (akey != small)
            cr_free(akey);
    } else if (op->kind == OP_RAW) {
        /* raw_op_new() left the first two slots for a script's words */
        if (op->script)
            script_head(op, (const char **)op->argv, op->argvlen);
        rc = redis_conn_send(bk->conn, &op->req, on_reply, op->argc,
                             (const char *const *)op->argv, op->argvlen);
    } else {
        const char *argv[2] = {"GET", op->key};
        rc = redis_conn_send(bk->conn, &op->req, on_reply, 2, argv, NULL);
    }
    if (rc)
        wait_push(bk, op);
}

/* Callbacks never run inside backend_store()/backend_get(): a failed send
 * only queues the op for later. While ops wait for a refusal to pass (see
 * on_reply()), a new one waits behind them: sent at once it could overtake
 * them, and then a progress stream drops them as already written, or an
 * older state lands over a newer one. */
static int submit(struct backend *bk, struct op *op)
{
    if (redis_conn_up(bk->conn) && !bk->wait_head) {
        send_op(bk, op);
        return 0;
    }
    wait_push(bk, op);
    return 0;
}

static struct op *op_new(struct backend *bk, enum op_kind kind, const char *task_id)
{
    struct op *op = cr_calloc(1, sizeof(*op));
    size_t n = strlen(task_id);
    if (!op)
        return NULL;
    op->bk = bk;
    op->req.data = op;
    op->kind = kind;
    op->key = cr_malloc(bk->prefix_len + sizeof(KEY_PREFIX) + n);
    if (!op->key) {
        cr_free(op);
        return NULL;
    }
    memcpy(op->key, bk->prefix, bk->prefix_len);
    memcpy(op->key + bk->prefix_len, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
    memcpy(op->key + bk->prefix_len + sizeof(KEY_PREFIX) - 1, task_id, n + 1);
    return op;
}

int backend_store(struct backend *bk, const char *task_id, int attempt, char *json,
                  size_t len, backend_store_fn *cb, void *privdata)
{
    struct op *op = op_new(bk, OP_STORE, task_id);
    if (!op) {
        cr_free(json);
        return CR_ENOMEM;
    }
    op->value = json;
    op->value_len = len;
    op->attempt = attempt < 0 ? -1 : attempt;
    op->script = &store_script;
    op->store_cb = cb;
    op->privdata = privdata;
    return submit(bk, op);
}

int backend_get(struct backend *bk, const char *task_id, backend_get_fn *cb,
                void *privdata)
{
    struct op *op = op_new(bk, OP_GET, task_id);
    if (!op)
        return CR_ENOMEM;
    op->get_cb = cb;
    op->privdata = privdata;
    return submit(bk, op);
}

_Static_assert(sizeof(char *) % _Alignof(size_t) == 0, "argvlen follows argv");

/* The arguments are copied into one block (pointers, lengths, then the
 * strings): a progress write has 13 of them, and separate allocations that
 * live until Redis answers, interleaved with long-lived ones, cost RSS. A
 * script's command gets two more slots in front, which send_op() fills with
 * EVALSHA and the digest (or EVAL and the text). */
static struct op *raw_op_new(struct backend *bk, struct backend_script *script, int argc,
                             const char *const *argv, const size_t *argvlen,
                             backend_reply_fn *cb, void *privdata)
{
    struct op *op = cr_calloc(1, sizeof(*op));
    int skip = script ? 2 : 0, slots = argc + skip;
    size_t head = (size_t)slots * (sizeof(char *) + sizeof(size_t)), total = head;
    char *block, *at;

    if (!op)
        return NULL;
    for (int i = 0; i < argc; i++)
        total += (argvlen ? argvlen[i] : strlen(argv[i])) + 1;
    block = cr_malloc(total ? total : 1);
    if (!block) {
        cr_free(op);
        return NULL;
    }
    op->bk = bk;
    op->req.data = op;
    op->kind = OP_RAW;
    op->script = script;
    op->raw_cb = cb;
    op->privdata = privdata;
    op->argv = (char **)(void *)block;
    op->argvlen = (size_t *)(void *)(block + (size_t)slots * sizeof(char *));
    at = block + head;
    for (int i = 0; i < argc; i++) {
        size_t n = argvlen ? argvlen[i] : strlen(argv[i]);
        memcpy(at, argv[i], n);
        at[n] = '\0';
        op->argv[skip + i] = at;
        op->argvlen[skip + i] = n;
        at += n + 1;
    }
    op->argc = slots;
    return op;
}

int backend_command(struct backend *bk, int argc, const char *const *argv,
                    const size_t *argvlen, backend_reply_fn *cb, void *privdata)
{
    struct op *op = raw_op_new(bk, NULL, argc, argv, argvlen, cb, privdata);
    if (!op)
        return CR_ENOMEM;
    return submit(bk, op);
}

int backend_eval(struct backend *bk, struct backend_script *script, int argc,
                 const char *const *argv, const size_t *argvlen, backend_reply_fn *cb,
                 void *privdata)
{
    struct op *op = raw_op_new(bk, script, argc, argv, argvlen, cb, privdata);
    if (!op)
        return CR_ENOMEM;
    return submit(bk, op);
}

/* -------------------------------------------------------------- chords */

#define CHORD_KEY_MAX 512
#define GROUP_PREFIX "celery-taskset-meta-"

/* prefix, group_id, suffix into out (CHORD_KEY_MAX bytes); 0 or CR_EINVAL
 * when too long. */
static int group_key(const struct backend *bk, char *out, const char *prefix,
                     const char *group_id, const char *suffix)
{
    int n =
        snprintf(out, CHORD_KEY_MAX, "%s%s%s%s", bk->prefix, prefix, group_id, suffix);
    return n > 0 && n < CHORD_KEY_MAX ? 0 : CR_EINVAL;
}

/* A chord's keys: Celery's .j .t .s, then celeriac's join claim. */
static int group_keys(const struct backend *bk, const char *group_id,
                      char keys[4][CHORD_KEY_MAX])
{
    if (group_key(bk, keys[0], GROUP_PREFIX, group_id, ".j") ||
        group_key(bk, keys[1], GROUP_PREFIX, group_id, ".t") ||
        group_key(bk, keys[2], GROUP_PREFIX, group_id, ".s") ||
        group_key(bk, keys[3], BACKEND_CHORD_CLAIM_PREFIX, group_id, ""))
        return CR_EINVAL;
    return 0;
}

int backend_chord_size(struct backend *bk, const char *group_id, long size,
                       backend_done_fn *cb, void *privdata)
{
    char key[CHORD_KEY_MAX], n[24];
    const char *argv[4] = {"1", key, n, bk->expires_text};
    struct op *op;
    if (group_key(bk, key, GROUP_PREFIX, group_id, ".s"))
        return CR_EINVAL;
    snprintf(n, sizeof(n), "%ld", size);
    op = raw_op_new(bk, &chord_size_script, 4, argv, NULL, NULL, privdata);
    if (!op)
        return CR_ENOMEM;
    op->done_cb = cb;
    return submit(bk, op);
}

int backend_chord_part(struct backend *bk, const char *group_id, long group_index,
                       const char *member, size_t len, const char *task_id,
                       backend_chord_fn *cb, void *privdata)
{
    char keys[4][CHORD_KEY_MAX], score[24];
    const char *argv[9] = {"4",    keys[0], keys[1],          keys[2], keys[3],
                           member, score,   bk->expires_text, task_id};
    size_t lens[9];
    struct op *op;
    if (group_keys(bk, group_id, keys))
        return CR_EINVAL;
    if (group_index < 0)
        snprintf(score, sizeof(score), "+inf");
    else
        snprintf(score, sizeof(score), "%ld", group_index);
    for (int i = 0; i < 9; i++)
        lens[i] = i == 5 ? len : strlen(argv[i]);
    op = raw_op_new(bk, &chord_part_script, 9, argv, lens, NULL, privdata);
    if (!op)
        return CR_ENOMEM;
    op->chord_cb = cb;
    return submit(bk, op);
}

int backend_chord_clear(struct backend *bk, const char *group_id, backend_done_fn *cb,
                        void *privdata)
{
    char keys[4][CHORD_KEY_MAX];
    const char *argv[5] = {"DEL", keys[0], keys[1], keys[2], keys[3]};
    struct op *op;
    if (group_keys(bk, group_id, keys))
        return CR_EINVAL;
    op = raw_op_new(bk, NULL, 5, argv, NULL, NULL, privdata);
    if (!op)
        return CR_ENOMEM;
    op->done_cb = cb;
    return submit(bk, op);
}

/* ------------------------------------------------------ transport options */

static int opt_string(const cJSON *v, const char *name, char *out, size_t size,
                      struct cr_err *err)
{
    if (!cJSON_IsString(v))
        return cr_err_set(err, CR_EINVAL,
                          "result backend transport option '%s' must be a string", name);
    if (strlen(v->valuestring) >= size)
        return cr_err_set(
            err, CR_EINVAL,
            "result backend transport option '%s' too long (over %zu bytes)", name,
            size - 1);
    snprintf(out, size, "%s", v->valuestring);
    return 0;
}

static int opt_seconds(const cJSON *v, const char *name, double *out, struct cr_err *err)
{
    if (cJSON_IsNull(v))
        return 0; /* redis-py's None: the default */
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 86400)
        return cr_err_set(err, CR_EINVAL,
                          "result backend transport option '%s' must be seconds "
                          "(0..86400)",
                          name);
    *out = v->valuedouble;
    return 0;
}

int backend_options_parse(struct backend_options *o, const char *json, struct cr_err *err)
{
    cJSON *root, *v;
    int rc = 0;

    memset(o, 0, sizeof(*o));
    o->socket_timeout = o->socket_connect_timeout = o->health_check_interval = -1;
    if (!json || !json[0])
        return 0;
    if (strlen(json) > BACKEND_OPTIONS_MAX_BYTES)
        return cr_err_set(err, CR_EINVAL,
                          "result backend transport options too long (over %d bytes)",
                          BACKEND_OPTIONS_MAX_BYTES);
    /* py_json_parse() for its reason with the byte it stopped at. */
    rc = py_json_parse(json, strlen(json), &root, err);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0) {
        char why[sizeof(err->msg)];
        snprintf(why, sizeof(why), "%s", err ? err->msg : "");
        return cr_err_set(err, CR_EINVAL,
                          "result backend transport options are not JSON: %s", why);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EINVAL,
                          "result backend transport options are not a JSON object");
    }
    cJSON_ArrayForEach(v, root)
    {
        const char *k = v->string;
        if (!strcmp(k, "master_name")) {
            rc = opt_string(v, k, o->master_name, sizeof(o->master_name), err);
        } else if (!strcmp(k, "global_keyprefix")) {
            rc = opt_string(v, k, o->global_keyprefix, sizeof(o->global_keyprefix), err);
        } else if (!strcmp(k, "socket_timeout")) {
            rc = opt_seconds(v, k, &o->socket_timeout, err);
        } else if (!strcmp(k, "socket_connect_timeout")) {
            rc = opt_seconds(v, k, &o->socket_connect_timeout, err);
        } else if (!strcmp(k, "health_check_interval")) {
            rc = opt_seconds(v, k, &o->health_check_interval, err);
        } else if (!strcmp(k, "retry_policy")) {
            /* Celery's retries of a failed store: ours wait for the
             * reconnect and go again without a limit. Accepted, ignored. */
            if (!cJSON_IsObject(v) && !cJSON_IsNull(v))
                rc = cr_err_set(err, CR_EINVAL,
                                "result backend transport option 'retry_policy' must be "
                                "an object");
        } else if (!strcmp(k, "sentinel_kwargs")) {
            const cJSON *e;
            if (cJSON_IsNull(v))
                continue;
            if (!cJSON_IsObject(v)) {
                rc = cr_err_set(err, CR_EINVAL,
                                "result backend transport option 'sentinel_kwargs' must "
                                "be an object");
                break;
            }
            cJSON_ArrayForEach(e, v)
            {
                if (!strcmp(e->string, "password"))
                    rc = opt_string(e, "sentinel_kwargs.password", o->sentinel_password,
                                    sizeof(o->sentinel_password), err);
                else if (!strcmp(e->string, "username"))
                    rc = opt_string(e, "sentinel_kwargs.username", o->sentinel_user,
                                    sizeof(o->sentinel_user), err);
                else if (!strcmp(e->string, "socket_timeout") ||
                         !strcmp(e->string, "socket_connect_timeout"))
                    rc = opt_seconds(e, e->string, &(double){0}, err);
                else
                    rc = cr_err_set(err, CR_EINVAL,
                                    "unknown result backend transport option "
                                    "'sentinel_kwargs.%.60s' (known: username, password, "
                                    "socket_timeout, socket_connect_timeout)",
                                    e->string);
                if (rc)
                    break;
            }
        } else {
            rc = cr_err_set(err, CR_EINVAL,
                            "unknown result backend transport option '%.60s' (known: "
                            "master_name, sentinel_kwargs, global_keyprefix, "
                            "socket_timeout, socket_connect_timeout, "
                            "health_check_interval, retry_policy)",
                            k);
        }
        if (rc)
            break;
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------- lifecycle */

struct backend *backend_new(uv_loop_t *loop, const struct backend_config *cfg,
                            struct cr_err *err)
{
    struct backend *bk;
    struct redis_url url;
    struct redis_conn_config rc;
    struct backend_options o;

    if (redis_url_parse_flags(&url, cfg->url, "result backend", REDIS_URL_TLS_STRICT,
                              err) ||
        backend_options_parse(&o, cfg->transport_options, err))
        return NULL;
    if (url.kind == REDIS_URL_SENTINEL && !o.master_name[0]) {
        cr_err_set(err, CR_EINVAL,
                   "result backend sentinel:// needs master_name in "
                   "--result-backend-transport-options");
        return NULL;
    }
    bk = cr_calloc(1, sizeof(*bk));
    if (!bk) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    replay_init(&bk->recent, RECENT_MAX, RECENT_BYTES_MAX, RECENT_REPLAY_MS);
    if (o.global_keyprefix[0]) {
        /* Celery 5.3+ (BaseKeyValueStoreBackend._add_global_keyprefix): a
         * prefix not ending in one of ":_-." gets a '_'. */
        size_t n = strlen(o.global_keyprefix);
        snprintf(bk->prefix, sizeof(bk->prefix), "%s%s", o.global_keyprefix,
                 strchr(":_-.", o.global_keyprefix[n - 1]) ? "" : "_");
        bk->prefix_len = strlen(bk->prefix);
    }
    bk->result_expires = cfg->result_expires;
    snprintf(bk->expires_text, sizeof(bk->expires_text), "%d", cfg->result_expires);
    memset(&rc, 0, sizeof(rc));
    rc.url = &url;
    rc.timeout = o.socket_timeout >= 0 ? o.socket_timeout : cfg->timeout;
    rc.health_check_interval = o.health_check_interval >= 0 ? o.health_check_interval
                                                            : cfg->health_check_interval;
    rc.connect_timeout = o.socket_connect_timeout >= 0 ? o.socket_connect_timeout : 0;
    rc.master_name = o.master_name;
    rc.sentinel_user = o.sentinel_user;
    rc.sentinel_password = o.sentinel_password;
    rc.on_event = on_conn_event;
    rc.privdata = bk;
    bk->conn = redis_conn_new(loop, &rc, err);
    if (!bk->conn) {
        cr_free(bk);
        return NULL;
    }
    uv_timer_init(loop, &bk->retry);
    bk->retry.data = bk;
    bk->loop = loop;
    return bk;
}

int backend_wait_connected(struct backend *bk, uv_loop_t *loop, int timeout_ms,
                           struct cr_err *err)
{
    const struct redis_url *u = redis_conn_url(bk->conn);
    const char *why;
    char at[300];
    (void)loop; /* the connection's own */
    if (redis_conn_wait(bk->conn, timeout_ms) == 0)
        return 0;
    why = redis_conn_last_error(bk->conn);
    return cr_err_set(err, CR_EBACKEND, "cannot connect to result backend %s: %s",
                      where(u, at, sizeof(at)), why[0] ? why : "timed out");
}

int backend_connect_attempt(struct backend *bk, int timeout_ms, struct cr_err *err)
{
    struct redis_conn *c = bk->conn;
    const struct redis_url *u = redis_conn_url(c);
    unsigned long failures = redis_conn_failures(c);
    uint64_t deadline;
    const char *why;
    char at[300];
    int rc = 0;

    uv_update_time(bk->loop);
    deadline = uv_now(bk->loop) + (uint64_t)timeout_ms;
    /* The connection retries by itself (its own backoff): this only watches
     * for its next outcome. */
    while (!redis_conn_up(c) && redis_conn_failures(c) == failures) {
        if (uv_now(bk->loop) >= deadline) {
            rc = CR_ETIMEDOUT;
            break;
        }
        uv_run(bk->loop, UV_RUN_ONCE);
        uv_update_time(bk->loop);
    }
    if (redis_conn_up(c))
        return 0;
    why = redis_conn_last_error(c);
    if (redis_conn_refused(c))
        rc = CR_EPEER;
    else if (rc == 0 || why[0])
        rc = CR_EBACKEND;
    return cr_err_set(err, rc, "cannot connect to result backend %s: %s",
                      where(u, at, sizeof(at)), why[0] ? why : "timed out");
}

const char *backend_key_prefix(const struct backend *bk)
{
    return bk->prefix;
}

int backend_connected(const struct backend *bk)
{
    return redis_conn_up(bk->conn);
}

unsigned long backend_reconnects(const struct backend *bk)
{
    return redis_conn_reconnects(bk->conn);
}

size_t backend_pending(const struct backend *bk)
{
    return bk->waiting + redis_conn_inflight(bk->conn);
}

static void on_retry_closed(uv_handle_t *h)
{
    cr_free(h->data);
}

void backend_free(struct backend *bk)
{
    struct op *op;
    if (!bk)
        return;
    bk->freeing = 1;
    /* What is in flight comes back from here with CR_ECANCELED. */
    redis_conn_free(bk->conn);
    while ((op = wait_pop(bk)))
        finish_op(op, CR_ECANCELED, NULL);
    replay_release(&bk->recent);
    uv_close((uv_handle_t *)&bk->retry, on_retry_closed);
}
