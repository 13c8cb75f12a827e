/* dlq_redis.c -- `celeriac dlq` over a Redis broker.
 *
 * On Redis the dead-letter queue is a kombu queue like any other: one list per
 * priority bucket, each element an envelope (protocol/kombu.h). A command-line
 * client, so it uses hiredis's blocking context. Dead letters are read oldest
 * first (from the right end of each bucket, bucket 0 first, as a consumer
 * would pop them) and only removed by the command that acts on them: replay
 * moves one with a script that removes that exact element and pushes its new
 * envelope in one step, so a dead letter is never lost or doubled, even when
 * two operators replay at once.
 *
 * rediss:// goes through the worker's TLS pump (net/tls_pump.h) on a private
 * libuv loop run by a thread of its own: the blocking context connects to the
 * pump's unix socket (the kernel's backlog takes the connect at once) and
 * talks plaintext to it while that thread carries the bytes over TLS. The
 * pump is only touched on that thread once it runs; stopping it (an async
 * handle) is how its reason is read. */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "dlq_int.h"
#include "net/redis.h"
#include "net/tls_pump.h"
#include "protocol/kombu.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/uuid.h"

#define PAGE 500
/* A reply larger than this is not read (a dead letter holds one task). */
#define MAX_ENVELOPE_BYTES (64u << 20)

/* Removes ARGV[1] from KEYS[1] and pushes ARGV[2] on KEYS[2] only if it was
 * there: a dead letter another operator took meanwhile is not replayed twice. */
static const char MOVE_LUA[] =
    "if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then "
    "return redis.call('LPUSH', KEYS[2], ARGV[2]) end return -1";

struct entry {
    char *key; /* the bucket list it is on */
    char *env;
    size_t len;
};

struct rdlq {
    redisContext *c;
    /* rediss:// only */
    uv_loop_t tls_loop;
    uv_async_t tls_stop;
    struct tls_pump *pump; /* the thread's, while tls_running */
    pthread_t tls_thread;
    int tls_running, tls_loop_inited;
    char tls_why[200]; /* the pump's reason, once stopped */
    struct kombu_opts ko;
    struct entry *v;
    size_t n, cap;
};

static void on_tls_stop(uv_async_t *a)
{
    struct rdlq *r = a->data;
    const char *why = tls_pump_error(r->pump);
    if (!why[0] && tls_pump_stalled(r->pump))
        why = tls_pump_stalled(r->pump);
    snprintf(r->tls_why, sizeof(r->tls_why), "%s", why);
    tls_pump_free(r->pump);
    r->pump = NULL;
    uv_close((uv_handle_t *)a, NULL);
}

static void *run_tls(void *arg)
{
    struct rdlq *r = arg;
    uv_run(&r->tls_loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Stops the pump's thread (once) and frees its loop. */
static void stop_tls(struct rdlq *r)
{
    if (r->tls_running) {
        r->tls_running = 0;
        uv_async_send(&r->tls_stop);
        pthread_join(r->tls_thread, NULL);
    }
    if (r->tls_loop_inited) {
        r->tls_loop_inited = 0;
        uv_run(&r->tls_loop, UV_RUN_NOWAIT); /* close callbacks left, if any */
        uv_loop_close(&r->tls_loop);
    }
}

/* Starts the pump toward host:port on its thread; *path gets its socket. */
static int start_tls(struct rdlq *r, const struct redis_url *u, const char *host,
                     int port, char *path, size_t size)
{
    struct cr_err e;
    struct tls_ctx *ctx;

    memset(&e, 0, sizeof(e));
    ctx = redis_tls_ctx_new(&u->tls, &e);
    if (!ctx) {
        fprintf(stderr, "celeriac dlq: %s\n", e.msg);
        return 2;
    }
    if (uv_loop_init(&r->tls_loop) != 0) {
        tls_ctx_free(ctx);
        fprintf(stderr, "celeriac dlq: cannot start TLS\n");
        return 1;
    }
    r->tls_loop_inited = 1;
    r->pump = tls_pump_new(&r->tls_loop, ctx, host, port, &e);
    tls_ctx_free(ctx);
    if (!r->pump) {
        fprintf(stderr, "celeriac dlq: %s\n", e.msg);
        return 1;
    }
    snprintf(path, size, "%s", tls_pump_path(r->pump));
    uv_async_init(&r->tls_loop, &r->tls_stop, on_tls_stop);
    r->tls_stop.data = r;
    if (pthread_create(&r->tls_thread, NULL, run_tls, r) != 0) {
        tls_pump_free(r->pump);
        r->pump = NULL;
        uv_close((uv_handle_t *)&r->tls_stop, NULL);
        fprintf(stderr, "celeriac dlq: cannot start TLS\n");
        return 1;
    }
    r->tls_running = 1;
    return 0;
}

static redisReply *cmd(struct rdlq *r, int argc, const char **argv, const size_t *lens)
{
    redisReply *rep = redisCommandArgv(r->c, argc, argv, lens);
    if (!rep) {
        /* Over TLS hiredis only saw its socket closed: the pump knows why. */
        stop_tls(r);
        fprintf(stderr, "celeriac dlq: redis: %s\n",
                r->tls_why[0]     ? r->tls_why
                : r->c->errstr[0] ? r->c->errstr
                                  : "connection lost");
        return NULL;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "celeriac dlq: redis: %s\n", rep->str);
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* Asks the sentinels in turn where the master named in the transport
 * options is; on success host and port hold it. */
static int find_master(struct rdlq *r, const struct redis_url *u, char *host, size_t size,
                       int *port)
{
    struct timeval tv = {2, 0};
    if (!r->ko.master_name[0]) {
        fprintf(stderr, "celeriac dlq: a sentinel:// broker needs master_name in "
                        "--broker-transport-options\n");
        return 2;
    }
    for (int i = 0; i < u->n_sentinels; i++) {
        redisContext *c =
            redisConnectWithTimeout(u->sentinels[i].host, u->sentinels[i].port, tv);
        redisReply *rep = NULL;
        if (c && !c->err) {
            redisSetTimeout(c, tv);
            if (r->ko.sentinel_password[0]) {
                const char *argv[3] = {"AUTH",
                                       r->ko.sentinel_username[0]
                                           ? r->ko.sentinel_username
                                           : r->ko.sentinel_password,
                                       r->ko.sentinel_password};
                rep = redisCommandArgv(c, r->ko.sentinel_username[0] ? 3 : 2, argv, NULL);
                if (rep)
                    freeReplyObject(rep);
            }
            {
                const char *argv[3] = {"SENTINEL", "get-master-addr-by-name",
                                       r->ko.master_name};
                rep = redisCommandArgv(c, 3, argv, NULL);
            }
        }
        if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
            rep->element[0]->type == REDIS_REPLY_STRING &&
            rep->element[1]->type == REDIS_REPLY_STRING) {
            snprintf(host, size, "%s", rep->element[0]->str);
            long v = strtol(rep->element[1]->str, NULL, 10);
            *port = v > 0 && v < 65536 ? (int)v : REDIS_DEFAULT_PORT;
            freeReplyObject(rep);
            redisFree(c);
            return 0;
        }
        if (rep)
            freeReplyObject(rep);
        if (c)
            redisFree(c);
    }
    fprintf(stderr, "celeriac dlq: no sentinel knows a master named '%s'\n",
            r->ko.master_name);
    return 1;
}

static int open_redis(struct rdlq *r, const char *url)
{
    struct redis_url u;
    struct cr_err err;
    struct timeval tv = {5, 0};
    redisReply *rep;
    char host[256];
    int port, rc;

    memset(&err, 0, sizeof(err));
    if (redis_url_parse(&u, url, "broker", &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return 2;
    }
    snprintf(host, sizeof(host), "%s", u.host);
    port = u.port;
    if (u.kind == REDIS_URL_SENTINEL &&
        (rc = find_master(r, &u, host, sizeof(host), &port)))
        return rc;
    if (u.tls.on) {
        char path[108];
        if (!u.tls.cert_reqs_given)
            fprintf(stderr, "celeriac dlq: warning: rediss:// without ssl_cert_reqs "
                            "verifies no certificate (as kombu does)\n");
        rc = start_tls(r, &u, host, port, path, sizeof(path));
        if (rc)
            return rc;
        r->c = redisConnectUnixWithTimeout(path, tv);
    } else {
        r->c = u.kind == REDIS_URL_UNIX ? redisConnectUnixWithTimeout(u.socket_path, tv)
                                        : redisConnectWithTimeout(host, port, tv);
    }
    if (!r->c || r->c->err) {
        fprintf(stderr, "celeriac dlq: cannot connect to Redis at %s: %s\n",
                u.kind == REDIS_URL_UNIX ? u.socket_path : host,
                r->c ? r->c->errstr : "out of memory");
        return 1;
    }
    redisSetTimeout(r->c, tv);
    if (u.password[0]) {
        const char *argv[3] = {"AUTH", u.user[0] ? u.user : u.password, u.password};
        rep = cmd(r, u.user[0] ? 3 : 2, argv, NULL);
        if (!rep)
            return 1;
        freeReplyObject(rep);
    }
    if (u.db) {
        char db[16];
        const char *argv[2] = {"SELECT", db};
        snprintf(db, sizeof(db), "%d", u.db);
        rep = cmd(r, 2, argv, NULL);
        if (!rep)
            return 1;
        freeReplyObject(rep);
    }
    return 0;
}

static int keep(struct rdlq *r, const char *key, const char *env, size_t len)
{
    struct entry *e;
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        struct entry *v = cr_realloc(r->v, cap * sizeof(*v));
        if (!v)
            return CR_ENOMEM;
        r->v = v;
        r->cap = cap;
    }
    e = &r->v[r->n];
    e->key = cr_strdup(key);
    e->env = cr_malloc(len + 1);
    if (!e->key || !e->env) {
        cr_free(e->key);
        cr_free(e->env);
        return CR_ENOMEM;
    }
    memcpy(e->env, env, len);
    e->env[len] = 0;
    e->len = len;
    r->n++;
    return 0;
}

/* Reads every dead letter, oldest first, into r->v. */
static int load(struct rdlq *r, const char *queue)
{
    for (int s = 0; s < r->ko.nsteps; s++) {
        struct buf key;
        long long total;
        redisReply *rep;
        buf_init(&key);
        if (kombu_queue_key(&r->ko, queue, r->ko.steps[s], &key))
            return CR_ENOMEM;
        {
            const char *argv[2] = {"LLEN", key.data};
            rep = cmd(r, 2, argv, NULL);
        }
        if (!rep) {
            buf_release(&key);
            return CR_EBROKER;
        }
        total = rep->type == REDIS_REPLY_INTEGER ? rep->integer : 0;
        freeReplyObject(rep);
        /* The right end is the oldest: pages from there towards the left. */
        for (long long end = total - 1; end >= 0; end -= PAGE) {
            long long start = end - PAGE + 1 < 0 ? 0 : end - PAGE + 1;
            char a[32], b[32];
            const char *argv[4] = {"LRANGE", key.data, a, b};
            snprintf(a, sizeof(a), "%lld", start);
            snprintf(b, sizeof(b), "%lld", end);
            rep = cmd(r, 4, argv, NULL);
            if (!rep) {
                buf_release(&key);
                return CR_EBROKER;
            }
            for (size_t i = rep->type == REDIS_REPLY_ARRAY ? rep->elements : 0;
                 i-- > 0;) {
                const redisReply *el = rep->element[i];
                if (el->type == REDIS_REPLY_STRING && el->len <= MAX_ENVELOPE_BYTES &&
                    keep(r, key.data, el->str, el->len)) {
                    freeReplyObject(rep);
                    buf_release(&key);
                    return CR_ENOMEM;
                }
            }
            freeReplyObject(rep);
        }
        buf_release(&key);
    }
    return 0;
}

/* The list a replayed dead letter goes to: its original queue's bucket, found
 * as kombu finds it (exchange "" names the queue; a named exchange through
 * its binding set, direct match on the routing key). */
static int target_key(struct rdlq *r, const char *exchange, const char *rk, int priority,
                      struct buf *out)
{
    struct buf bkey;
    redisReply *rep;
    int rc = CR_ENOTFOUND;

    if (!*exchange)
        return kombu_queue_key(&r->ko, rk, kombu_bucket(&r->ko, priority), out);
    buf_init(&bkey);
    if (kombu_binding_key(&r->ko, exchange, &bkey))
        return CR_ENOMEM;
    {
        const char *argv[2] = {"SMEMBERS", bkey.data};
        rep = cmd(r, 2, argv, NULL);
    }
    buf_release(&bkey);
    if (!rep)
        return CR_EBROKER;
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
        const char *mrk, *pat, *q;
        size_t mrk_len, pat_len, q_len;
        const redisReply *el = rep->element[i];
        char queue[KOMBU_NAME_MAX];
        if (el->type != REDIS_REPLY_STRING ||
            kombu_binding_parse(&r->ko, el->str, el->len, &mrk, &mrk_len, &pat, &pat_len,
                                &q, &q_len) ||
            q_len >= sizeof(queue))
            continue;
        if (mrk_len != strlen(rk) || memcmp(mrk, rk, mrk_len))
            continue;
        memcpy(queue, q, q_len);
        queue[q_len] = 0;
        rc = kombu_queue_key(&r->ko, queue, kombu_bucket(&r->ko, priority), out);
        break;
    }
    freeReplyObject(rep);
    return rc;
}

static int replay(struct rdlq *r, const struct entry *e, struct kombu_msg *m)
{
    struct outbound o;
    struct buf env, dst;
    unsigned char rnd[16];
    char tag[CR_UUID_LEN + 1];
    char *exchange = cr_strdup(dlq__hstr(m->headers, "x-celeriac-original-exchange"));
    char *rk = cr_strdup(dlq__hstr(m->headers, "x-celeriac-original-routing-key"));
    redisReply *rep = NULL;
    int ok = 0;

    buf_init(&env);
    buf_init(&dst);
    if (!exchange || !rk || getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        goto out;
    cr_uuid4(rnd, tag);
    if (!*exchange && !*rk) {
        fprintf(stderr,
                "celeriac dlq: the dead letter does not say where it came from\n");
        goto out;
    }
    if (target_key(r, exchange, rk, m->priority, &dst)) {
        fprintf(stderr,
                "celeriac dlq: no queue is bound to exchange '%s' with key '%s'\n",
                exchange, rk);
        goto out;
    }
    dlq__reset_headers(m->headers);
    kombu_msg_outbound(m, &o);
    o.exchange = exchange;
    o.routing_key = rk;
    if (kombu_msg_encode(&o, tag, &env))
        goto out;
    {
        const char *argv[7] = {"EVAL", MOVE_LUA, "2", e->key, dst.data, e->env, env.data};
        size_t lens[7] = {
            4, sizeof(MOVE_LUA) - 1, 1, strlen(e->key), dst.len, e->len, env.len};
        rep = cmd(r, 7, argv, lens);
    }
    ok = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer >= 0;
    if (rep && !ok)
        fprintf(stderr, "celeriac dlq: the dead letter was taken meanwhile\n");
out:
    if (rep)
        freeReplyObject(rep);
    buf_release(&env);
    buf_release(&dst);
    cr_free(exchange);
    cr_free(rk);
    return ok;
}

static int drop(struct rdlq *r, const struct entry *e)
{
    const char *argv[4] = {"LREM", e->key, "1", e->env};
    size_t lens[4] = {4, strlen(e->key), 1, e->len};
    redisReply *rep = cmd(r, 4, argv, lens);
    int ok = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    if (rep)
        freeReplyObject(rep);
    return ok;
}

int dlq__run_redis(const struct dlq_opts *o, enum dlq_action a)
{
    struct rdlq r;
    struct cr_err err;
    unsigned long seen = 0, acted = 0;
    int rc;

    memset(&r, 0, sizeof(r));
    memset(&err, 0, sizeof(err));
    kombu_opts_init(&r.ko);
    if (o->transport_options && *o->transport_options &&
        kombu_opts_parse(&r.ko, o->transport_options, strlen(o->transport_options),
                         &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return 2;
    }
    rc = open_redis(&r, o->broker);
    if (rc)
        goto out;
    rc = load(&r, o->queue);
    if (rc) {
        if (rc == CR_ENOMEM)
            fprintf(stderr, "celeriac dlq: out of memory\n");
        rc = 1;
        goto out;
    }
    dlq__print_head(o, a);
    for (size_t i = 0; i < r.n; i++) {
        const struct entry *e = &r.v[i];
        struct kombu_msg m;
        const cJSON *h;

        seen++;
        memset(&err, 0, sizeof(err));
        if (kombu_msg_decode(&m, e->env, e->len, 0, &err)) {
            /* Not an envelope: nothing to show or replay; a purge of
             * everything still drops it. */
            if (a == A_PURGE && !o->task && !o->reason && !o->nids && drop(&r, e))
                acted++;
            continue;
        }
        if (!m.headers)
            m.headers = cJSON_CreateObject();
        h = m.headers;
        if (h && dlq__matches(o, h)) {
            if (a == A_LIST) {
                dlq__print_line(o, h);
            } else if (a == A_SHOW) {
                dlq__print_show(h, m.content_type, strlen(m.content_type), m.body,
                                m.body_len);
                acted++;
            } else if (a == A_REPLAY) {
                char shown_id[1024];
                dlq__tty(dlq__hstr(h, "id"), shown_id, sizeof(shown_id));
                if (replay(&r, e, &m)) {
                    printf("replayed %s\n", shown_id);
                    acted++;
                } else {
                    fprintf(stderr, "celeriac dlq: cannot replay %s\n", shown_id);
                    rc = 1;
                }
            } else if (drop(&r, e)) {
                acted++;
            }
        }
        kombu_msg_release(&m);
    }
    rc = dlq__summary(o, a, acted, seen, rc);
out:
    for (size_t i = 0; i < r.n; i++) {
        cr_free(r.v[i].key);
        cr_free(r.v[i].env);
    }
    cr_free(r.v);
    if (r.c)
        redisFree(r.c);
    stop_tls(&r);
    return rc;
}
