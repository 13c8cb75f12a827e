/* redis_limit.c -- Redis's limit for storing results: a bare pipelined SETEX+PUBLISH
 * loop.
 *
 *   build/bench/redis_limit PORT DB COUNT WINDOW [VALUE_BYTES] [eval|evalsha]
 *
 * Stores COUNT results as Celery does (SETEX celery-task-meta-<id>, then
 * PUBLISH on the same name), keeping at most WINDOW commands unanswered on
 * one connection. With "eval" each store is instead the worker's own EVAL
 * script (GET, check, SETEX, PUBLISH in one call), to price that choice;
 * "evalsha" sends the same script by its SHA1 (SCRIPT LOAD first), which
 * spares Redis hashing the script body on every call. The value is a
 * result-meta-sized JSON. Gives up after 120 s. Prints "stored N in S s (R
 * results/s)". */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* net/backend.c's store script before its final-state and attempt guard: a
 * first store of a first attempt costs the server the same work. */
static const char script[] =
    "local cur = redis.call('GET', KEYS[1])\n"
    "if cur and string.find(cur, '\"status\": *\"SUCCESS\"') then return 0 end\n"
    "if tonumber(ARGV[2]) > 0 then redis.call('SETEX', KEYS[1], ARGV[2], ARGV[1])\n"
    "else redis.call('SET', KEYS[1], ARGV[1]) end\n"
    "redis.call('PUBLISH', KEYS[1], ARGV[1])\n"
    "return 1\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int take_reply(redisContext *c)
{
    void *r;
    if (redisGetReply(c, &r) != REDIS_OK) {
        fprintf(stderr, "redis_limit: %s\n", c->errstr);
        exit(1);
    }
    if (((redisReply *)r)->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "redis_limit: %s\n", ((redisReply *)r)->str);
        exit(1);
    }
    freeReplyObject(r);
    return 1;
}

int main(int argc, char **argv)
{
    redisContext *c;
    long count, window, sent = 0, answered = 0, per;
    size_t vbytes = 200;
    int use_eval, use_sha;
    char key[80], *value, sha[48] = "";
    double t0, t1;

    if (argc < 5) {
        fprintf(stderr, "usage: redis_limit PORT DB COUNT WINDOW [VALUE_BYTES] [eval]\n");
        return 2;
    }
    count = strtol(argv[3], NULL, 10);
    window = strtol(argv[4], NULL, 10);
    if (argc > 5)
        vbytes = (size_t)strtoul(argv[5], NULL, 10);
    use_eval = argc > 6 && !strcmp(argv[6], "eval");
    use_sha = argc > 6 && !strcmp(argv[6], "evalsha");
    per = use_eval || use_sha ? 1 : 2;
    c = redisConnect("127.0.0.1", (int)strtol(argv[1], NULL, 10));
    if (!c || c->err) {
        fprintf(stderr, "redis_limit: cannot connect\n");
        return 1;
    }
    freeReplyObject(redisCommand(c, "SELECT %s", argv[2]));
    if (use_sha) {
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", script);
        if (!r || r->type != REDIS_REPLY_STRING) {
            fprintf(stderr, "redis_limit: SCRIPT LOAD failed\n");
            return 1;
        }
        snprintf(sha, sizeof(sha), "%s", r->str);
        freeReplyObject(r);
    }
    value = malloc(vbytes + 1);
    if (!value)
        return 1;
    /* A result meta: {"status": "SUCCESS", "result": ..., padded. */
    memset(value, 'x', vbytes);
    memcpy(value, "{\"status\": \"SUCCESS\", \"result\": \"", 34);
    value[vbytes - 2] = '"';
    value[vbytes - 1] = '}';
    value[vbytes] = '\0';
    t0 = now_s();
    while (answered < count * per) {
        while (sent < count && (sent - answered / per) < window) {
            snprintf(key, sizeof(key), "celery-task-meta-bench-%ld", sent);
            if (use_eval) {
                redisAppendCommand(c, "EVAL %s 1 %s %b 86400", script, key, value,
                                   vbytes);
            } else if (use_sha) {
                redisAppendCommand(c, "EVALSHA %s 1 %s %b 86400", sha, key, value,
                                   vbytes);
            } else {
                redisAppendCommand(c, "SETEX %s 86400 %b", key, value, vbytes);
                redisAppendCommand(c, "PUBLISH %s %b", key, value, vbytes);
            }
            sent++;
        }
        answered += take_reply(c);
        if (now_s() - t0 > 120) {
            fprintf(stderr, "redis_limit: timed out\n");
            return 1;
        }
    }
    t1 = now_s();
    printf("stored %ld in %.3f s (%.0f results/s)\n", count, t1 - t0,
           (double)count / (t1 - t0));
    freeReplyObject(redisCommand(c, "FLUSHDB"));
    redisFree(c);
    free(value);
    return 0;
}
