/* backend.c -- Redis result backend: hiredis async glued to the libuv loop. */
#include "backend.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "redis_uv.h"
#include "util/alloc.h"
#include "util/sha1.h"

#define KEY_PREFIX BACKEND_META_PREFIX
#define CONNECT_TIMEOUT_MS 5000
#define RECONNECT_MAX_MS 5000
/* Commands queued in hiredis's output buffer beyond this are written at once
 * rather than at the socket's next write event (see send_op()). */
#define EAGER_WRITE_BYTES (64 * 1024)

/* Store a state unless SUCCESS is already stored, then publish it on the channel
 * named like the key. Doing the check and the write in one script makes the
 * "never overwrite SUCCESS" rule atomic, where Celery's GET-then-SET is not. */
static struct backend_script store_script = BACKEND_SCRIPT(
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur and string.find(cur, '\"status\": *\"SUCCESS\"') then return 0 end\n"
    "if tonumber(ARGV[2]) > 0 then redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1])\n"
    "else redis.call('SET', KEYS[1], ARGV[1]) end\n"
    "redis.call('PUBLISH', KEYS[1], ARGV[1])\n"
    "return 1\n");

enum op_kind { OP_STORE, OP_GET, OP_RAW };

struct op {
    struct op *next;
    struct backend *bk;
    enum op_kind kind;
    char *key;
    char *value; /* OP_STORE */
    size_t value_len;
    backend_store_fn *store_cb;
    backend_get_fn *get_cb;
    backend_reply_fn *raw_cb;
    struct backend_script *script; /* OP_STORE, or OP_RAW by backend_eval() */
    int use_eval;                  /* send the text: see on_noscript() */
    int noscripts;                 /* NOSCRIPT replies to this op so far */
    int argc;                      /* OP_RAW: with the script's two words */
    char **argv;
    size_t *argvlen;
    void *privdata;
};

struct backend {
    uv_loop_t *loop;
    char *host;
    int port;
    int db;
    char *user;
    char *password;
    int result_expires;
    char expires_text[24];

    redisAsyncContext *ac; /* NULL while disconnected */
    int connected;
    int freeing;
    unsigned long reconnects;
    unsigned long conn_gen; /* counts connections made: tells one from the next */
    int ever_connected;
    int64_t backoff_ms;
    uv_timer_t timer; /* connect timeout and reconnect delay */
    uv_timer_t retry; /* resends operations waiting while connected */
    char last_error[200];

    struct op *wait_head, *wait_tail; /* not yet sent */
    size_t inflight;
    size_t waiting;
    unsigned long refusing; /* error replies since the last answer that was not */
};

static void start_connect(struct backend *bk);

/* A timer callback gets the timer, not the backend: go through its data. */
static void on_reconnect_timer(uv_timer_t *t)
{
    start_connect(t->data);
}
static void send_op(struct backend *bk, struct op *op);

static void op_free(struct op *op)
{
    cr_free(op->argv); /* one block with argvlen and the strings */
    cr_free(op->key);
    cr_free(op->value);
    cr_free(op);
}

static void on_retry(uv_timer_t *t);

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
    if (bk->connected && !bk->freeing && !uv_is_active((uv_handle_t *)&bk->retry))
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
    while (bk->connected && n-- && (op = wait_pop(bk)))
        send_op(bk, op);
}

static int parse_url(struct backend *bk, const char *url, struct cr_err *err)
{
    const char *p = url + strlen("redis://");
    const char *at = strrchr(p, '@');
    const char *hostend;
    char redacted[512];

    config_redact_url(url, redacted, sizeof(redacted));
    bk->port = 6379;
    bk->db = 0;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon) {
            if (colon > p)
                bk->user = cr_strndup(p, (size_t)(colon - p));
            bk->password = cr_strndup(colon + 1, (size_t)(at - colon - 1));
        } else {
            /* redis://password@host is how some clients spell it. */
            bk->password = cr_strndup(p, (size_t)(at - p));
        }
        p = at + 1;
    }
    hostend = p + strcspn(p, ":/?");
    bk->host =
        hostend > p ? cr_strndup(p, (size_t)(hostend - p)) : cr_strdup("localhost");
    if (!bk->host)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    p = hostend;
    if (*p == ':') {
        char *end;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || port <= 0 || port > 65535)
            return cr_err_set(err, CR_EINVAL, "invalid port in result backend URL '%s'",
                              redacted);
        bk->port = (int)port;
        p = end;
    }
    if (*p == '/' && p[1] && p[1] != '?') {
        char *end;
        long db = strtol(p + 1, &end, 10);
        if (end == p + 1 || db < 0 || (*end && *end != '?'))
            return cr_err_set(err, CR_EINVAL,
                              "invalid database in result backend URL '%s'", redacted);
        bk->db = (int)db;
    }
    return 0;
}

/* ----------------------------------------------------------- connection */

static void schedule_reconnect(struct backend *bk)
{
    if (bk->freeing)
        return;
    bk->backoff_ms = bk->backoff_ms ? bk->backoff_ms * 2 : 250;
    if (bk->backoff_ms > RECONNECT_MAX_MS)
        bk->backoff_ms = RECONNECT_MAX_MS;
    uv_timer_start(&bk->timer, on_reconnect_timer, (uint64_t)bk->backoff_ms, 0);
}

static void on_auth_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    (void)ac;
    (void)privdata;
    if (reply && reply->type == REDIS_REPLY_ERROR)
        LOG(LOG_ERROR, "result backend: %s", reply->str);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct backend *bk = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;

    if (!bk)
        return;
    uv_timer_stop(&bk->timer);
    if (status != REDIS_OK) {
        snprintf(bk->last_error, sizeof(bk->last_error), "%s", ac->errstr);
        /* hiredis frees the context after this callback. */
        bk->ac = NULL;
        LOG(bk->ever_connected ? LOG_ERROR : LOG_DEBUG,
            "result backend: cannot connect to redis://%s:%d/%d: %s", bk->host, bk->port,
            bk->db, bk->last_error);
        schedule_reconnect(bk);
        return;
    }
    if (bk->ever_connected)
        bk->reconnects++;
    bk->ever_connected = 1;
    bk->connected = 1;
    bk->conn_gen++;
    bk->backoff_ms = 0;
    LOG(LOG_INFO, "Connected to redis://%s:%d/%d", bk->host, bk->port, bk->db);
    /* AUTH and SELECT go first on the wire; replies come back in order. */
    if (bk->password) {
        if (bk->user)
            redisAsyncCommand(ac, on_auth_reply, NULL, "AUTH %s %s", bk->user,
                              bk->password);
        else
            redisAsyncCommand(ac, on_auth_reply, NULL, "AUTH %s", bk->password);
    }
    if (bk->db)
        redisAsyncCommand(ac, on_auth_reply, NULL, "SELECT %d", bk->db);
    send_waiting(bk);
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    struct backend *bk = cac->data;
    (void)status;
    if (!bk)
        return;
    if (bk->connected)
        LOG(LOG_ERROR, "result backend: connection lost: %s; reconnecting",
            cac->errstr[0] ? cac->errstr : "closed");
    bk->connected = 0;
    bk->ac = NULL;
    schedule_reconnect(bk);
}

static void on_connect_timeout(uv_timer_t *t)
{
    struct backend *bk = t->data;
    if (bk->ac && !bk->connected) {
        redisAsyncContext *ac = bk->ac;
        snprintf(bk->last_error, sizeof(bk->last_error), "connection timed out");
        /* Detach first: redisAsyncFree calls the callbacks, which must not
         * schedule anything for this attempt. */
        ac->data = NULL;
        bk->ac = NULL;
        redisAsyncFree(ac);
        schedule_reconnect(bk);
    }
}

static void start_connect(struct backend *bk)
{
    redisAsyncContext *ac;

    if (bk->freeing || bk->ac)
        return;
    ac = redisAsyncConnect(bk->host, bk->port);
    if (!ac || ac->err) {
        snprintf(bk->last_error, sizeof(bk->last_error), "%s",
                 ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        schedule_reconnect(bk);
        return;
    }
    ac->data = bk;
    if (redis_uv_attach(ac, bk->loop) != REDIS_OK) {
        snprintf(bk->last_error, sizeof(bk->last_error), "cannot attach to loop");
        redisAsyncFree(ac);
        schedule_reconnect(bk);
        return;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    bk->ac = ac;
    uv_timer_start(&bk->timer, on_connect_timeout, CONNECT_TIMEOUT_MS, 0);
}

/* ------------------------------------------------------------ operations */

static void finish_op(struct op *op, int status, const redisReply *reply)
{
    if (op->kind == OP_RAW) {
        if (op->raw_cb)
            op->raw_cb(op->bk, status, (const struct redisReply *)reply, op->privdata);
    } else if (op->kind == OP_STORE) {
        int skipped = reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0;
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

/* An error Redis lifts by itself: out of memory, a replica or a node that is
 * not writable yet, a dataset still loading, a script still running. A
 * fire-and-forget command (no callback, e.g. a progress write) refused so is
 * sent again later like a result; any other error of a command is its
 * caller's (or nobody's) to handle. */
static int passing_refusal(const char *e)
{
    static const char *const codes[] = {"OOM ",        "READONLY ",   "LOADING ", "BUSY ",
                                        "MASTERDOWN ", "NOREPLICAS ", "TRYAGAIN "};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (!strncmp(e, codes[i], strlen(codes[i])))
            return 1;
    return 0;
}

/* An EVAL of op's script was answered (or lost with its connection). */
static void eval_answered(struct op *op)
{
    struct backend_script *s = op->script;
    if (s && s->eval_bk == op->bk && s->eval_gen == op->bk->conn_gen &&
        s->evals_unanswered > 0)
        s->evals_unanswered--;
}

/* Redis does not know op's script: it started afresh or its script cache was
 * flushed, and then every EVALSHA in flight comes back so. One EVAL loads the
 * script again; the others go again as EVALSHA when such an EVAL is already
 * ahead of them on this connection, rather than each carrying the whole text
 * (a thousand results ending at once after a Redis restart made an 880 KB
 * write of the same script a thousand times). An op told NOSCRIPT twice (the
 * cache flushed again meanwhile) sends the text itself. */
static void on_noscript(struct op *op)
{
    struct backend *bk = op->bk;
    struct backend_script *s = op->script;
    int ahead =
        s->eval_bk == bk && s->eval_gen == bk->conn_gen && s->evals_unanswered > 0;

    if (op->noscripts++ || !ahead)
        op->use_eval = 1;
    send_op(bk, op);
}

static void on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    struct op *op = privdata;
    struct backend *bk = op->bk;
    redisReply *reply = r;
    (void)ac;

    bk->inflight--;
    if (bk->freeing) {
        finish_op(op, CR_ECANCELED, NULL);
        return;
    }
    if (!reply) {
        /* The connection went away with this command unanswered: it is
         * idempotent, so send it again once we are back. hiredis calls this
         * before the disconnect callback, so say it here while we know. */
        if (bk->connected)
            LOG(LOG_ERROR, "result backend: connection lost: %s; reconnecting",
                ac->errstr[0] ? ac->errstr : "closed");
        bk->connected = 0;
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
        (op->raw_cb || !passing_refusal(reply->str))) {
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

/* Writes what the socket takes of hiredis's output buffer now, without
 * waiting for the write event. A plain write() and not
 * redisAsyncHandleWrite(), which frees the context when the write fails, even
 * from inside a reply callback (where NOSCRIPT resends are made) or the
 * connect callback. A failure here is left for hiredis to meet at the write
 * event, outside any callback. */
static void write_ahead(redisAsyncContext *ac)
{
    redisContext *c = &ac->c;
    ssize_t n;

    if (!(c->flags & REDIS_CONNECTED) || c->fd < 0)
        return;
    n = write(c->fd, c->obuf, sdslen(c->obuf));
    if (n > 0)
        sdsrange(c->obuf, n, -1);
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
        if (s->eval_bk != op->bk || s->eval_gen != op->bk->conn_gen) {
            s->eval_bk = op->bk;
            s->eval_gen = op->bk->conn_gen;
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
    if (!bk->connected || !bk->ac) {
        wait_push(bk, op);
        return;
    }
    if (op->kind == OP_STORE) {
        const char *argv[6] = {NULL, NULL, "1", op->key, op->value, bk->expires_text};
        size_t lens[6] = {
            0, 0, 1, strlen(op->key), op->value_len, strlen(bk->expires_text)};
        script_head(op, argv, lens);
        rc = redisAsyncCommandArgv(bk->ac, on_reply, op, 6, argv, lens);
    } else if (op->kind == OP_RAW && op->script) {
        /* raw_op_new() left the first two slots for the script's words */
        script_head(op, (const char **)op->argv, op->argvlen);
        rc = redisAsyncCommandArgv(bk->ac, on_reply, op, op->argc,
                                   (const char **)op->argv, op->argvlen);
    } else if (op->kind == OP_RAW) {
        rc = redisAsyncCommandArgv(bk->ac, on_reply, op, op->argc,
                                   (const char **)op->argv, op->argvlen);
    } else {
        rc = redisAsyncCommand(bk->ac, on_reply, op, "GET %s", op->key);
    }
    if (rc != REDIS_OK) {
        wait_push(bk, op);
        return;
    }
    bk->inflight++;
    /* When many tasks end in one loop turn (10,000 streams finishing at once),
     * their stores and progress writes would all wait in hiredis's output
     * buffer for the write event, and that buffer's peak is RSS. Write it out
     * once it is large. */
    if (sdslen(bk->ac->c.obuf) >= EAGER_WRITE_BYTES)
        write_ahead(bk->ac);
}

/* Callbacks never run inside backend_store()/backend_get(): a failed send
 * only queues the op for later. While ops wait for a refusal to pass (see
 * on_reply()), a new one waits behind them: sent at once it could overtake
 * them, and then a progress stream drops them as already written, or an
 * older state lands over a newer one. */
static int submit(struct backend *bk, struct op *op)
{
    if (bk->connected && bk->ac && !bk->wait_head) {
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
    op->kind = kind;
    op->key = cr_malloc(sizeof(KEY_PREFIX) + n);
    if (!op->key) {
        cr_free(op);
        return NULL;
    }
    memcpy(op->key, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
    memcpy(op->key + sizeof(KEY_PREFIX) - 1, task_id, n + 1);
    return op;
}

int backend_store(struct backend *bk, const char *task_id, char *json, size_t len,
                  backend_store_fn *cb, void *privdata)
{
    struct op *op = op_new(bk, OP_STORE, task_id);
    if (!op) {
        cr_free(json);
        return CR_ENOMEM;
    }
    op->value = json;
    op->value_len = len;
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

/* ------------------------------------------------------------- lifecycle */

struct backend *backend_new(uv_loop_t *loop, const struct backend_config *cfg,
                            struct cr_err *err)
{
    struct backend *bk = cr_calloc(1, sizeof(*bk));
    if (!bk) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    bk->loop = loop;
    bk->result_expires = cfg->result_expires;
    snprintf(bk->expires_text, sizeof(bk->expires_text), "%d", cfg->result_expires);
    if (strncmp(cfg->url, "redis://", 8)) {
        cr_err_set(err, CR_EINVAL, "unsupported result backend URL (want redis://)");
        cr_free(bk);
        return NULL;
    }
    if (parse_url(bk, cfg->url, err)) {
        cr_free(bk->host);
        cr_free(bk->user);
        cr_free(bk->password);
        cr_free(bk);
        return NULL;
    }
    uv_timer_init(loop, &bk->timer);
    bk->timer.data = bk;
    uv_timer_init(loop, &bk->retry);
    bk->retry.data = bk;
    start_connect(bk);
    return bk;
}

int backend_wait_connected(struct backend *bk, uv_loop_t *loop, int timeout_ms,
                           struct cr_err *err)
{
    uint64_t deadline = uv_now(loop) + (uint64_t)timeout_ms;
    while (!bk->connected) {
        uv_update_time(loop);
        if (uv_now(loop) >= deadline)
            return cr_err_set(err, CR_EBACKEND,
                              "cannot connect to result backend redis://%s:%d/%d: %s",
                              bk->host, bk->port, bk->db,
                              bk->last_error[0] ? bk->last_error : "timed out");
        uv_run(loop, UV_RUN_ONCE);
    }
    return 0;
}

int backend_connected(const struct backend *bk)
{
    return bk->connected;
}

unsigned long backend_reconnects(const struct backend *bk)
{
    return bk->reconnects;
}

size_t backend_pending(const struct backend *bk)
{
    return bk->waiting + bk->inflight;
}

static void on_timer_closed(uv_handle_t *h)
{
    struct backend *bk = h->data;
    /* Two timers close; the second one frees. */
    if (bk->freeing++ < 2)
        return;
    cr_free(bk->host);
    cr_free(bk->user);
    cr_free(bk->password);
    cr_free(bk);
}

void backend_free(struct backend *bk)
{
    struct op *op;
    if (!bk)
        return;
    bk->freeing = 1;
    uv_timer_stop(&bk->timer);
    if (bk->ac) {
        redisAsyncContext *ac = bk->ac;
        bk->ac = NULL;
        /* In-flight callbacks run from here with a NULL reply and see
         * `freeing`, so they report CR_ECANCELED. */
        ac->data = NULL;
        redisAsyncFree(ac);
    }
    while ((op = wait_pop(bk)))
        finish_op(op, CR_ECANCELED, NULL);
    uv_close((uv_handle_t *)&bk->timer, on_timer_closed);
    uv_close((uv_handle_t *)&bk->retry, on_timer_closed);
}
