/* results.c -- Redis result backend: hiredis async glued to the libuv loop. */
#include "results.h"

#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#include <hiredis/sds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/config.h"
#include "util/log.h"
#include "redis.h"
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
    int connected;         /* Redis answered the handshake: ops may be sent */
    int handshake;         /* handshake replies still awaited on ac */
    int refused;           /* the last handshake was refused (AUTH, SELECT) */
    int freeing;
    unsigned long reconnects;
    unsigned long conn_gen; /* counts connections made: tells one from the next */
    int ever_connected;
    int64_t backoff_ms;
    /* The one deadline of the connection's state: the connect (and
     * handshake) timeout, the reconnect delay, or while connected the
     * watchdog of on_watch(). */
    uv_timer_t timer;
    uv_timer_t retry; /* resends operations waiting while connected */
    char last_error[200];
    char logged_error[200]; /* the connect error last logged: each said once */

    uint64_t timeout_ms; /* 0: none */
    uint64_t health_ms;  /* 0: no health-check PING */
    uint64_t heard_ms;   /* last reply, or the send that ended a quiet spell */
    uint64_t watch_due;  /* when the watchdog fires next, while connected */
    int ping_out;        /* a health-check PING is unanswered */

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

/* A connection attempt failed. Said once per distinct reason, not at each
 * retry of an outage; before the first connection not at all, as
 * backend_wait_connected() reports the last reason. */
static void connect_failed(struct backend *bk, const char *why)
{
    snprintf(bk->last_error, sizeof(bk->last_error), "%s", why);
    if (bk->ever_connected && strcmp(bk->last_error, bk->logged_error)) {
        LOG(LOG_ERROR, "result backend: cannot connect to redis://%s:%d/%d: %s; retrying",
            bk->host, bk->port, bk->db, bk->last_error);
        snprintf(bk->logged_error, sizeof(bk->logged_error), "%s", bk->last_error);
    } else {
        LOG(LOG_DEBUG, "result backend: cannot connect to redis://%s:%d/%d: %s", bk->host,
            bk->port, bk->db, bk->last_error);
    }
    schedule_reconnect(bk);
}

/* Ends the connection at once. Detached first, so that no callback of it
 * schedules anything: the unanswered operations come back to on_reply()
 * with no reply and wait, in order, for the next connection; the caller
 * decides what follows. Safe inside one of its reply callbacks, where hiredis
 * defers the free until the callback returns. */
static void drop_connection(struct backend *bk)
{
    redisAsyncContext *ac = bk->ac;
    bk->connected = 0;
    bk->handshake = 0;
    bk->ping_out = 0;
    bk->ac = NULL;
    ac->data = NULL;
    redisAsyncFree(ac);
}

static int passing_refusal(const char *e);
static void on_watch(uv_timer_t *t);

/* Makes the watchdog fire no later than due (an absolute uv_now() time).
 * Only ever brought forward here: when it fires early, on_watch() works out
 * the real deadline and sets it again, so a busy connection does not restart
 * the timer at every command. */
static void watch_by(struct backend *bk, uint64_t due)
{
    uint64_t now = uv_now(bk->loop);
    if (uv_is_active((uv_handle_t *)&bk->timer) && bk->watch_due <= due)
        return;
    bk->watch_due = due;
    uv_timer_start(&bk->timer, on_watch, due > now ? due - now : 0, 0);
}

static void on_ping(redisAsyncContext *ac, void *r, void *privdata)
{
    struct backend *bk = privdata;
    if (bk->freeing || ac != bk->ac || !r)
        return; /* a lost connection: on_disconnect() or drop_connection() */
    bk->ping_out = 0;
    bk->heard_ms = uv_now(bk->loop);
    if (!bk->inflight && bk->health_ms)
        watch_by(bk, bk->heard_ms + bk->health_ms);
}

/* While connected: a command unanswered for the timeout with nothing heard
 * meanwhile means the connection is gone though its socket is open (a
 * partition drops packets, and TCP would take many minutes to give up). It
 * is dropped and rebuilt by the path an error takes, so what was in flight
 * goes again, in order, on the next connection. Quiet for the health-check
 * interval, it sends a PING, which the timeout then covers. */
static void on_watch(uv_timer_t *t)
{
    struct backend *bk = t->data;
    uint64_t now = uv_now(bk->loop), quiet = now - bk->heard_ms;

    if (!bk->connected || !bk->ac)
        return;
    if (bk->inflight || bk->ping_out) {
        if (!bk->timeout_ms)
            return;
        if (quiet < bk->timeout_ms) {
            watch_by(bk, bk->heard_ms + bk->timeout_ms);
            return;
        }
        LOG(LOG_ERROR,
            "result backend: connection lost: no reply from redis://%s:%d/%d for %g s; "
            "reconnecting",
            bk->host, bk->port, bk->db, (double)bk->timeout_ms / 1000);
        drop_connection(bk);
        schedule_reconnect(bk);
        return;
    }
    if (!bk->health_ms)
        return;
    if (quiet < bk->health_ms) {
        watch_by(bk, bk->heard_ms + bk->health_ms);
        return;
    }
    if (redisAsyncCommand(bk->ac, on_ping, bk, "PING") != REDIS_OK)
        return;
    bk->ping_out = 1;
    bk->heard_ms = now;
    if (bk->timeout_ms)
        watch_by(bk, now + bk->timeout_ms);
}

/* Redis answered the handshake: the connection is up. */
static void connection_up(struct backend *bk)
{
    uv_timer_stop(&bk->timer);
    if (bk->ever_connected)
        bk->reconnects++;
    bk->ever_connected = 1;
    bk->connected = 1;
    bk->refused = 0;
    bk->backoff_ms = 0;
    bk->last_error[0] = '\0';
    bk->logged_error[0] = '\0';
    bk->ping_out = 0;
    bk->heard_ms = uv_now(bk->loop);
    LOG(LOG_INFO, "Connected to redis://%s:%d/%d", bk->host, bk->port, bk->db);
    if (bk->health_ms)
        watch_by(bk, bk->heard_ms + bk->health_ms);
    send_waiting(bk);
}

/* A reply to AUTH, SELECT or the PING that stands in for them. Until all
 * have come back without error the connection does not count: a wrong
 * password is then one failed connect, not a "connected" followed by every
 * write refused with NOAUTH. An error Redis lifts by itself (LOADING,
 * BUSY...) is an answer, and the writes wait it out as usual. */
static void on_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    struct backend *bk = privdata;
    redisReply *reply = r;

    if (bk->freeing || ac != bk->ac || !reply || bk->connected)
        return;
    if (reply->type == REDIS_REPLY_ERROR && !passing_refusal(reply->str)) {
        char why[sizeof(bk->last_error)];
        snprintf(why, sizeof(why), "%s", reply->str);
        bk->refused = 1;
        drop_connection(bk);
        connect_failed(bk, why);
        return;
    }
    if (--bk->handshake == 0)
        connection_up(bk);
}

static void on_connect(const redisAsyncContext *cac, int status)
{
    struct backend *bk = cac->data;
    redisAsyncContext *ac = (redisAsyncContext *)cac;

    if (!bk)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this callback. */
        bk->ac = NULL;
        connect_failed(bk, ac->errstr);
        return;
    }
    bk->conn_gen++;
    /* The connect timeout goes on running until Redis has answered these,
     * which go first on the wire; ops wait for connection_up(). */
    bk->handshake = 0;
    if (bk->password) {
        if (bk->user)
            redisAsyncCommand(ac, on_handshake, bk, "AUTH %s %s", bk->user, bk->password);
        else
            redisAsyncCommand(ac, on_handshake, bk, "AUTH %s", bk->password);
        bk->handshake++;
    }
    if (bk->db) {
        redisAsyncCommand(ac, on_handshake, bk, "SELECT %d", bk->db);
        bk->handshake++;
    }
    if (!bk->handshake) {
        /* TCP alone proves nothing: a proxy or a load balancer accepts
         * connections for a Redis that may not answer. */
        redisAsyncCommand(ac, on_handshake, bk, "PING");
        bk->handshake++;
    }
}

static void on_disconnect(const redisAsyncContext *cac, int status)
{
    struct backend *bk = cac->data;
    (void)status;
    if (!bk)
        return;
    bk->ac = NULL;
    bk->ping_out = 0;
    if (bk->handshake) {
        bk->handshake = 0;
        connect_failed(bk, cac->errstr[0] ? cac->errstr : "connection closed");
        return;
    }
    if (bk->connected)
        LOG(LOG_ERROR, "result backend: connection lost: %s; reconnecting",
            cac->errstr[0] ? cac->errstr : "closed");
    bk->connected = 0;
    schedule_reconnect(bk);
}

static void on_connect_timeout(uv_timer_t *t)
{
    struct backend *bk = t->data;
    if (bk->ac && !bk->connected) {
        int answered_tcp = bk->handshake > 0;
        drop_connection(bk);
        connect_failed(bk, answered_tcp ? "no reply to the handshake"
                                        : "connection timed out");
    }
}

static void start_connect(struct backend *bk)
{
    redisAsyncContext *ac;

    if (bk->freeing || bk->ac)
        return;
    ac = redisAsyncConnect(bk->host, bk->port);
    if (!ac || ac->err) {
        char why[sizeof(bk->last_error)];
        snprintf(why, sizeof(why), "%s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        connect_failed(bk, why);
        return;
    }
    ac->data = bk;
    if (redis_uv_attach(ac, bk->loop) != REDIS_OK) {
        redisAsyncFree(ac);
        connect_failed(bk, "cannot attach to loop");
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
    if (reply && ac == bk->ac) {
        bk->heard_ms = uv_now(bk->loop);
        if (!bk->inflight && !bk->ping_out && bk->health_ms)
            watch_by(bk, bk->heard_ms + bk->health_ms);
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
    if (!bk->inflight++ && !bk->ping_out) {
        /* A quiet spell ends: the timeout runs from here. */
        bk->heard_ms = uv_now(bk->loop);
        if (bk->timeout_ms)
            watch_by(bk, bk->heard_ms + bk->timeout_ms);
    }
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
    bk->timeout_ms = cfg->timeout > 0 ? (uint64_t)(cfg->timeout * 1000 + 0.5) : 0;
    bk->health_ms = cfg->health_check_interval > 0
                        ? (uint64_t)(cfg->health_check_interval * 1000 + 0.5)
                        : 0;
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
        if (bk->refused || uv_now(loop) >= deadline)
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
