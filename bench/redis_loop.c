/* redis_loop.c -- the Redis broker's limit: a bare hiredis consumer doing, per message,
 * the Redis commands a kombu consumer with acks does, and storing each result.
 *
 *   build/bench/redis_loop PORT BROKER_DB RESULT_DB QUEUE COUNT [pipe|pipeN|sync]
 *
 * Takes COUNT pre-published task envelopes off QUEUE (kombu's Redis transport,
 * reference/redis-broker.md §5-6), one process, no task logic. Per message:
 *   BRPOP QUEUE QUEUE\x06\x163 QUEUE\x06\x166 QUEUE\x06\x169 1
 *   MULTI, ZADD unacked_index <now> <tag>, HSET unacked <tag> [<env>, "", QUEUE], EXEC
 *   EVALSHA <celeriac's store script> 1 celery-task-meta-<id> <meta> 86400   (RESULT_DB)
 *   MULTI, ZREM unacked_index <tag>, HDEL unacked <tag>, EXEC
 * "pipe" (the default): the BRPOP goes on a connection of its own, one at a
 * time as kombu issues it; everything else is appended to a second and third
 * connection (broker db, result db) without waiting, so the BRPOP round trip
 * is the only wait per message. As in the worker, a message is acked only once
 * its store was answered: the acks of BATCH messages go out together after
 * their stores' replies were read. "pipeN": N BRPOPs in flight at once on
 * the popping connection instead of one (a consumer that pipelines its pops;
 * kombu does not). "sync": every command waits for its reply, on one
 * connection per db. Gives up after 120 s, or after three empty BRPOPs.
 * Prints "consumed N in S s (R msg/s)". */
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#define WINDOW 2000    /* commands unanswered on a pipelined connection */
#define BATCH 100      /* stores read back before their acks go out */
#define SEP "\x06\x16" /* kombu's priority-list separator */

/* The store script of net/backend.c as it was before its final-state and
 * attempt guard (the same text as bench/redis_limit.c). The worker's first
 * store of a first attempt, which is what this loop stands for, still only
 * checks that nothing is stored, so the baseline's server work is the same. */
static const char script[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur and string.find(cur, '\"status\": *\"SUCCESS\"') then return 0 end\n"
    "if tonumber(ARGV[2]) > 0 then redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1])\n"
    "else redis.call('SET', KEYS[1], ARGV[1]) end\n"
    "redis.call('PUBLISH', KEYS[1], ARGV[1])\n"
    "return 1\n";

struct pipe {
    redisContext *c;
    long pending; /* replies not read yet */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, redisContext *c)
{
    fprintf(stderr, "redis_loop: %s: %s\n", what, c ? c->errstr : "?");
    exit(1);
}

static redisContext *connect_db(int port, const char *db)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    redisReply *r;
    if (!c || c->err)
        die("cannot connect", c);
    r = redisCommand(c, "SELECT %s", db);
    if (!r || r->type == REDIS_REPLY_ERROR)
        die("SELECT", c);
    freeReplyObject(r);
    return c;
}

static void take(struct pipe *p)
{
    void *r;
    if (redisGetReply(p->c, &r) != REDIS_OK)
        die("reply", p->c);
    if (((redisReply *)r)->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redis_loop: %s\n", ((redisReply *)r)->str);
        exit(1);
    }
    freeReplyObject(r);
    p->pending--;
}

/* Sends what is buffered; reads every reply once the window is full (or
 * when asked to drain), so the connection never waits on its own. */
static void flush(struct pipe *p, int drain)
{
    int done = 0;
    while (!done)
        if (redisBufferWrite(p->c, &done) != REDIS_OK)
            die("write", p->c);
    if (drain || p->pending >= WINDOW)
        while (p->pending > 0)
            take(p);
}

/* Appends (pipe) or runs (sync) one command. */
static void cmd(struct pipe *p, int sync, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (redisvAppendCommand(p->c, fmt, ap) != REDIS_OK)
        die("append", p->c);
    va_end(ap);
    p->pending++;
    if (sync)
        flush(p, 1);
}

/* Reads back every store sent, then sends the acks of those messages. */
static void ack_all(struct pipe *r, struct pipe *b, int sync, char (*acks)[128],
                    int *nacks)
{
    flush(r, 1);
    for (int i = 0; i < *nacks; i++) {
        cmd(b, sync, "MULTI");
        cmd(b, sync, "ZREM unacked_index %s", acks[i]);
        cmd(b, sync, "HDEL unacked %s", acks[i]);
        cmd(b, sync, "EXEC");
    }
    *nacks = 0;
    flush(b, 0);
}

/* The value of "key": "..." in a JSON text we published ourselves (no
 * escapes in ids and tags): copied into out, or 0 if absent. */
static int field(const char *json, size_t len, const char *key, char *out, size_t cap)
{
    const char *s = memmem(json, len, key, strlen(key)), *e;
    if (!s)
        return 0;
    s += strlen(key);
    e = memchr(s, '"', len - (size_t)(s - json));
    if (!e || (size_t)(e - s) >= cap)
        return 0;
    memcpy(out, s, (size_t)(e - s));
    out[e - s] = '\0';
    return 1;
}

int main(int argc, char **argv)
{
    redisContext *pop;
    struct pipe b = {0}, r = {0};
    const char *queue;
    char bucket[3][256], sha[48], tag[128], id[128], key[192];
    char meta[512], *hval = NULL;
    static char acks[BATCH][128];
    int nacks = 0;
    size_t hcap = 0;
    long count, got = 0, empty = 0, asked = 0, inflight = 0, depth = 1;
    int sync, port, n;
    double t0, t1;
    redisReply *rep;

    if (argc < 6) {
        fprintf(
            stderr,
            "usage: redis_loop PORT BROKER_DB RESULT_DB QUEUE COUNT [pipe|pipeN|sync]\n");
        return 2;
    }
    port = (int)strtol(argv[1], NULL, 10);
    queue = argv[4];
    count = strtol(argv[5], NULL, 10);
    sync = argc > 6 && !strcmp(argv[6], "sync");
    if (argc > 6 && !strncmp(argv[6], "pipe", 4) && argv[6][4])
        depth = strtol(argv[6] + 4, NULL, 10);
    if (depth < 1 || sync)
        depth = 1;
    for (int i = 0; i < 3; i++)
        snprintf(bucket[i], sizeof(bucket[i]), "%s%s%c", queue, SEP, "369"[i]);
    b.c = connect_db(port, argv[2]);
    r.c = connect_db(port, argv[3]);
    pop = sync ? b.c : connect_db(port, argv[2]);
    rep = redisCommand(r.c, "SCRIPT LOAD %s", script);
    if (!rep || rep->type != REDIS_REPLY_STRING)
        die("SCRIPT LOAD", r.c);
    snprintf(sha, sizeof(sha), "%s", rep->str);
    freeReplyObject(rep);

    t0 = now_s();
    while (got < count) {
        struct timeval tv;
        double stamp;
        const char *env;
        size_t len;
        if (now_s() - t0 > 120) {
            fprintf(stderr, "redis_loop: timed out after %ld\n", got);
            return 1;
        }
        /* Up to depth BRPOPs in flight, never more than messages wanted. */
        while (asked < count && inflight < depth) {
            if (redisAppendCommand(pop, "BRPOP %s %s %s %s 1", queue, bucket[0],
                                   bucket[1], bucket[2]) != REDIS_OK)
                die("append", pop);
            asked++;
            inflight++;
        }
        if (redisGetReply(pop, (void **)&rep) != REDIS_OK)
            die("BRPOP", pop);
        inflight--;
        if (rep->type == REDIS_REPLY_ERROR)
            die("BRPOP", pop);
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
            freeReplyObject(rep);
            asked--; /* timed out empty: ask again */
            if (++empty >= 3) {
                fprintf(stderr, "redis_loop: queue empty after %ld\n", got);
                return 1;
            }
            continue;
        }
        env = rep->element[1]->str;
        len = rep->element[1]->len;
        if (!field(env, len, "\"delivery_tag\": \"", tag, sizeof(tag)) ||
            !field(env, len, "\"id\": \"", id, sizeof(id))) {
            fprintf(stderr, "redis_loop: no delivery tag or id in a message\n");
            return 1;
        }
        /* The unacked value: [envelope, exchange, routing key]. */
        if (hcap < len + strlen(queue) + 16) {
            hcap = 2 * (len + strlen(queue) + 16);
            hval = realloc(hval, hcap);
            if (!hval)
                return 1;
        }
        n = snprintf(hval, hcap, "[%.*s, \"\", \"%s\"]", (int)len, env, queue);
        gettimeofday(&tv, NULL);
        stamp = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
        cmd(&b, sync, "MULTI");
        cmd(&b, sync, "ZADD unacked_index %.7f %s", stamp, tag);
        cmd(&b, sync, "HSET unacked %s %b", tag, hval, (size_t)n);
        cmd(&b, sync, "EXEC");
        freeReplyObject(rep);

        snprintf(key, sizeof(key), "celery-task-meta-%s", id);
        n = snprintf(
            meta, sizeof(meta),
            "{\"status\": \"SUCCESS\", \"result\": [1], \"traceback\": null, "
            "\"children\": [], \"date_done\": \"2026-12-02T00:00:00.000000+00:00\", "
            "\"task_id\": \"%s\"}",
            id);
        cmd(&r, sync, "EVALSHA %s 1 %s %b 86400", sha, key, meta, (size_t)n);
        snprintf(acks[nacks++], sizeof(acks[0]), "%s", tag);
        flush(&b, 0);
        if (sync || nacks == BATCH)
            ack_all(&r, &b, sync, acks, &nacks);
        got++;
    }
    ack_all(&r, &b, sync, acks, &nacks);
    flush(&b, 1);
    t1 = now_s();
    printf("consumed %ld in %.3f s (%.0f msg/s)\n", got, t1 - t0,
           (double)got / (t1 - t0));
    free(hval);
    if (!sync)
        redisFree(pop);
    redisFree(b.c);
    redisFree(r.c);
    return 0;
}
