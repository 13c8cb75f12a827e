/* test_backend.c -- the result store's write rule (net/backend.c), through
 * backend_store() against a real redis-server that the suite starts on a unix
 * socket of its own (skipped, with a note, where there is none installed).
 *
 * The rule is a Lua script Redis runs, so no fake can check it: these tests
 * drive the real store and read back with a second, plain hiredis connection
 * what a Python client would read: the meta under celery-task-meta-<id>
 * byte for byte, its TTL, and the PUBLISH on the key's channel. */
#include <check.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "net/backend.h"
#include "util/alloc.h"

static char dir[64];
static char sock[128];
static pid_t redis_pid;

/* Once for the suite, in the parent process (each test runs in a child). */
static void start_redis(void)
{
    struct stat st;
    snprintf(dir, sizeof(dir), "/tmp/celeriac-results-XXXXXX");
    if (!mkdtemp(dir)) {
        dir[0] = '\0';
        return;
    }
    snprintf(sock, sizeof(sock), "%s/redis.sock", dir);
    redis_pid = fork();
    if (redis_pid == 0) {
        int null = open("/dev/null", 1);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock,
               "--save", "", "--appendonly", "no", "--dir", dir, (char *)NULL);
        _exit(127);
    }
    /* Up to 20 s for the socket: a loaded machine starts it slowly. */
    for (int i = 0; i < 400 && redis_pid > 0; i++) {
        int status;
        if (stat(sock, &st) == 0)
            return;
        if (waitpid(redis_pid, &status, WNOHANG) == redis_pid) {
            redis_pid = 0; /* not installed, or it could not start */
            break;
        }
        usleep(50 * 1000);
    }
    sock[0] = '\0';
}

static void stop_redis(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
    }
    if (sock[0])
        unlink(sock);
    if (dir[0])
        rmdir(dir);
}

/* A test's world: the backend on its loop, a plain connection to read with. */
struct world {
    uv_loop_t loop;
    struct backend *bk;
    redisContext *rc;
};

static int world_init(struct world *w, int result_expires)
{
    struct backend_config cfg;
    struct cr_err err;
    char url[200];
    if (!sock[0]) {
        fprintf(stderr, "test_backend: no redis-server; store rule tests skipped\n");
        return -1;
    }
    snprintf(url, sizeof(url), "redis+socket://%s", sock);
    memset(&cfg, 0, sizeof(cfg));
    cfg.url = url;
    cfg.result_expires = result_expires;
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(uv_loop_init(&w->loop), 0);
    w->bk = backend_new(&w->loop, &cfg, &err);
    ck_assert_msg(w->bk != NULL, "%s", err.msg);
    ck_assert_int_eq(backend_wait_connected(w->bk, &w->loop, 10000, &err), 0);
    w->rc = redisConnectUnix(sock);
    ck_assert(w->rc && !w->rc->err);
    return 0;
}

static void world_release(struct world *w)
{
    backend_free(w->bk);
    while (uv_run(&w->loop, UV_RUN_NOWAIT))
        ;
    uv_loop_close(&w->loop);
    redisFree(w->rc);
}

struct stored {
    int done, status, skipped;
};

static void on_store(struct backend *bk, int status, int skipped, void *privdata)
{
    struct stored *s = privdata;
    (void)bk;
    s->done = 1;
    s->status = status;
    s->skipped = skipped;
}

/* Stores json for id as attempt; returns 1 when it was kept out, 0 stored. */
static int store(struct world *w, const char *id, int attempt, const char *json)
{
    struct stored s = {0, 0, 0};
    ck_assert_int_eq(
        backend_store(w->bk, id, attempt, cr_strdup(json), strlen(json), on_store, &s),
        0);
    while (!s.done)
        uv_run(&w->loop, UV_RUN_ONCE);
    ck_assert_int_eq(s.status, 0);
    return s.skipped;
}

/* The stored value of key (static buffer), or NULL when there is none. */
static const char *get(struct world *w, const char *key)
{
    static char out[4096];
    redisReply *r = redisCommand(w->rc, "GET %s", key);
    const char *v = NULL;
    ck_assert_ptr_nonnull(r);
    if (r->type == REDIS_REPLY_STRING) {
        snprintf(out, sizeof(out), "%s", r->str);
        v = out;
    }
    freeReplyObject(r);
    return v;
}

static long long ttl(struct world *w, const char *key)
{
    redisReply *r = redisCommand(w->rc, "TTL %s", key);
    long long t;
    ck_assert_ptr_nonnull(r);
    t = r->integer;
    freeReplyObject(r);
    return t;
}

/* Metas as Celery writes them (json.dumps: ", " and ": "). */
#define META(st, id)                                                                     \
    "{\"status\": \"" st "\", \"result\": {\"exc_type\": \"RateLimitError\", "           \
    "\"exc_message\": [\"slow down\"], \"exc_module\": \"celeriac.exceptions\"}, "       \
    "\"traceback\": null, \"children\": [], \"date_done\": null, \"task_id\": \"" id     \
    "\"}"

/* The late RETRY of issue 37: attempt 0 published its retry, attempt 1 ran
 * and stored FAILURE, then attempt 0's RETRY arrives. It and any other
 * non-final state must leave the FAILURE (and a REVOKED) as it is, and a
 * SUCCESS is never replaced at all. What is stored is Celery's: the bytes,
 * the TTL, the PUBLISH on the key's channel. */
START_TEST(test_final_state_never_replaced_by_a_non_final_one)
{
    static const char fail[] =
        "{\"status\": \"FAILURE\", \"result\": {\"exc_type\": \"BadRequestError\", "
        "\"exc_message\": [\"nope\"], \"exc_module\": \"celeriac.exceptions\"}, "
        "\"traceback\": \"Traceback\", \"children\": [], \"date_done\": "
        "\"2026-12-07T10:00:00.000000\", \"task_id\": \"t1\"}";
    struct world w;
    redisContext *sub;
    redisReply *r;

    if (world_init(&w, 3600))
        return;
    sub = redisConnectUnix(sock);
    ck_assert(sub && !sub->err);
    r = redisCommand(sub, "SUBSCRIBE celery-task-meta-t1");
    freeReplyObject(r);

    ck_assert_int_eq(store(&w, "t1", 1, fail), 0);
    ck_assert_int_eq(store(&w, "t1", 0, META("RETRY", "t1")), 1);
    ck_assert_int_eq(store(&w, "t1", 1, META("RETRY", "t1")), 1);
    ck_assert_int_eq(store(&w, "t1", 1, META("STARTED", "t1")), 1);
    ck_assert_int_eq(store(&w, "t1", -1, META("PROGRESS", "t1")), 1);
    ck_assert_str_eq(get(&w, "celery-task-meta-t1"), fail);
    ck_assert(ttl(&w, "celery-task-meta-t1") > 3500);
    ck_assert_ptr_null(get(&w, BACKEND_ATTEMPT_PREFIX "t1"));
    /* one message on the channel: the FAILURE, the same bytes */
    ck_assert_int_eq(redisGetReply(sub, (void **)&r), REDIS_OK);
    ck_assert_int_eq(r->type, REDIS_REPLY_ARRAY);
    ck_assert_str_eq(r->element[0]->str, "message");
    ck_assert_str_eq(r->element[2]->str, fail);
    freeReplyObject(r);
    redisFree(sub);

    /* A final state may follow a final state; SUCCESS stays for good. */
    ck_assert_int_eq(store(&w, "t1", 1, META("REVOKED", "t1")), 0);
    ck_assert_int_eq(store(&w, "t1", 2, META("RETRY", "t1")), 1);
    ck_assert_int_eq(store(&w, "t1", 1, META("SUCCESS", "t1")), 0);
    ck_assert_int_eq(store(&w, "t1", 1, fail), 1);
    ck_assert_int_eq(store(&w, "t1", 3, META("RETRY", "t1")), 1);
    ck_assert_str_eq(get(&w, "celery-task-meta-t1"), META("SUCCESS", "t1"));
    world_release(&w);
}
END_TEST

/* A state that is not final is not replaced by an earlier attempt's, final
 * or not; the attempt is kept beside the meta (never in it) only while it
 * matters, with the meta's TTL, and goes with the final state. */
START_TEST(test_earlier_attempt_never_replaces_a_later_one)
{
    struct world w;

    if (world_init(&w, 600))
        return;
    /* attempt 0 leaves nothing beside its meta: nothing is earlier */
    ck_assert_int_eq(store(&w, "t2", 0, META("STARTED", "t2")), 0);
    ck_assert_ptr_null(get(&w, BACKEND_ATTEMPT_PREFIX "t2"));
    ck_assert_int_eq(store(&w, "t2", 2, META("STARTED", "t2")), 0);
    ck_assert_str_eq(get(&w, BACKEND_ATTEMPT_PREFIX "t2"), "2");
    ck_assert(ttl(&w, BACKEND_ATTEMPT_PREFIX "t2") > 500);
    /* attempt 1's late RETRY, and its late outcome, are kept out */
    ck_assert_int_eq(store(&w, "t2", 1, META("RETRY", "t2")), 1);
    ck_assert_int_eq(store(&w, "t2", 0, META("SUCCESS", "t2")), 1);
    ck_assert_str_eq(get(&w, "celery-task-meta-t2"), META("STARTED", "t2"));
    /* the same attempt, a later one, or an unknown one go in */
    ck_assert_int_eq(store(&w, "t2", 2, META("RETRY", "t2")), 0);
    ck_assert_int_eq(store(&w, "t2", 3, META("STARTED", "t2")), 0);
    ck_assert_str_eq(get(&w, BACKEND_ATTEMPT_PREFIX "t2"), "3");
    ck_assert_int_eq(store(&w, "t2", 3, META("FAILURE", "t2")), 0);
    ck_assert_ptr_null(get(&w, BACKEND_ATTEMPT_PREFIX "t2"));
    ck_assert_str_eq(get(&w, "celery-task-meta-t2"), META("FAILURE", "t2"));
    world_release(&w);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("results");
    TCase *tc = tcase_create("store_rule");
    tcase_add_unchecked_fixture(tc, start_redis, stop_redis);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_final_state_never_replaced_by_a_non_final_one);
    tcase_add_test(tc, test_earlier_attempt_never_replaces_a_later_one);
    suite_add_tcase(s, tc);
    return s;
}
