/* test_rq_redis.c -- the RQ worker's Redis commands (net/rq_redis.c): the
 * arguments each step sends, key by key and value by value, for the pop
 * order, the registries' scores and the TTLs of each way a job ends. */
#include <check.h>
#include <string.h>

#include "unit.h"
#include "net/rq_redis.h"
#include "protocol/progress.h"
#include "protocol/rq_job.h"

static const char *arg(struct redis_args *a, int i)
{
    const char **argv = redis_args_argv(a);
    ck_assert_ptr_nonnull(argv);
    ck_assert_int_lt(i, a->n);
    return argv[i];
}

START_TEST(test_pop_order)
{
    const char *q[] = {"high", "low"};
    struct redis_args a;
    redis_args_init(&a);
    rq_redis_pop(&a, q, 2, 1);
    ck_assert_int_eq(a.n, 4);
    ck_assert_str_eq(arg(&a, 0), "BLPOP");
    ck_assert_str_eq(arg(&a, 1), "rq:queue:high");
    ck_assert_str_eq(arg(&a, 2), "rq:queue:low");
    ck_assert_str_eq(arg(&a, 3), "1");
    redis_args_release(&a);
}
END_TEST

START_TEST(test_pop_many)
{
    const char *q[] = {"high", "low"};
    struct redis_args a;
    redis_args_init(&a);
    rq_redis_pop_many(&a, q, 2, 40);
    ck_assert_int_eq(a.n, 7);
    ck_assert_str_eq(arg(&a, 0), "EVAL");
    ck_assert_str_eq(arg(&a, 2), "3");
    ck_assert_str_eq(arg(&a, 3), "rq:queue:high");
    ck_assert_str_eq(arg(&a, 4), "rq:queue:low");
    ck_assert_str_eq(arg(&a, 5), "rq:suspended");
    ck_assert_str_eq(arg(&a, 6), "40");
    redis_args_release(&a);
}
END_TEST

/* EVAL script nkeys k1..k11 then ARGV: how id ts working ttl score value left
 * interval stream_ttl eid worker started ended */
enum { K0 = 3, A0 = 3 + 11 };

static void end_args(struct redis_args *a, const struct rq_end_info *e)
{
    redis_args_init(a);
    rq_redis_end(a, e);
    ck_assert_int_eq(a->n, A0 + 14);
    ck_assert_str_eq(arg(a, 0), "EVAL");
    ck_assert_str_eq(arg(a, 2), "11");
}

START_TEST(test_end_finished)
{
    struct rq_end_info e = {.how = RQ_END_FINISHED,
                            .worker = "w",
                            .id = "j1",
                            .queue = "default",
                            .ts = "T",
                            .now_s = 1000,
                            .working_s = 1.5,
                            .return_b64 = "gAR9",
                            .result_ttl_s = 500};
    static const char *const keys[] = {
        "rq:job:j1",           "rq:wip:default",       "rq:worker:w",
        "rq:results:j1",       "rq:job:j1:dependents", "rq:job::j1:dependencies",
        "rq:finished:default", "rq:queue:default",     "rq:queues",
        "rq:execution:j1:",    "rq:executions:j1"};
    struct redis_args a;
    end_args(&a, &e);
    for (int i = 0; i < 11; i++)
        ck_assert_str_eq(arg(&a, K0 + i), keys[i]);
    ck_assert_str_eq(arg(&a, A0 + 10), ""); /* layout 1: no execution */
    ck_assert_str_eq(arg(&a, A0), "finished");
    ck_assert_str_eq(arg(&a, A0 + 1), "j1");
    ck_assert_str_eq(arg(&a, A0 + 2), "T");
    ck_assert_str_eq(arg(&a, A0 + 3), "1.500000");
    ck_assert_str_eq(arg(&a, A0 + 4), "500");
    ck_assert_str_eq(arg(&a, A0 + 5), "1500");
    ck_assert_str_eq(arg(&a, A0 + 6), "gAR9");
    redis_args_release(&a);
    e.result_ttl_s = -1;
    e.return_b64 = NULL;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, A0 + 4), "-1");
    ck_assert_str_eq(arg(&a, A0 + 5), "+inf");
    ck_assert_str_eq(arg(&a, A0 + 6), "");
    redis_args_release(&a);
}
END_TEST

START_TEST(test_end_failed)
{
    struct rq_end_info e = {.how = RQ_END_FAILED,
                            .worker = "w",
                            .id = "j1",
                            .queue = "q",
                            .ts = "T",
                            .now_s = 1000,
                            .exc_b64 = "eJw=",
                            .failure_ttl_s = -2};
    struct redis_args a;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, K0 + 6), "rq:failed:q");
    ck_assert_str_eq(arg(&a, A0), "failed");
    ck_assert_str_eq(arg(&a, A0 + 4), "31536000"); /* the default: one year */
    ck_assert_str_eq(arg(&a, A0 + 5), "31537000");
    ck_assert_str_eq(arg(&a, A0 + 6), "eJw=");
    ck_assert_str_eq(arg(&a, A0 + 9), "0"); /* the stream keeps no TTL */
    redis_args_release(&a);
    e.failure_ttl_s = 60;
    e.how = RQ_END_STOPPED;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, A0), "stopped");
    ck_assert_str_eq(arg(&a, A0 + 5), "1060");
    ck_assert_str_eq(arg(&a, A0 + 9), "1");
    redis_args_release(&a);
    e.failure_ttl_s = -1;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, A0 + 5), "-1");
    redis_args_release(&a);
}
END_TEST

START_TEST(test_end_layout2)
{
    struct rq_exec x = {
        .eid = "0123456789abcdef0123456789abcdef", .started_s = 10.5, .now_s = 12.25};
    struct rq_end_info e = {.how = RQ_END_FINISHED,
                            .worker = "w",
                            .id = "j1",
                            .queue = "q",
                            .ts = "T",
                            .now_s = 12,
                            .result_ttl_s = 500,
                            .exec = &x};
    struct redis_args a;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, K0 + 9), "rq:execution:j1:0123456789abcdef0123456789abcdef");
    ck_assert_str_eq(arg(&a, K0 + 10), "rq:executions:j1");
    ck_assert_str_eq(arg(&a, A0 + 10), x.eid);
    ck_assert_str_eq(arg(&a, A0 + 11), "w");
    ck_assert_str_eq(arg(&a, A0 + 12), "10.500000");
    ck_assert_str_eq(arg(&a, A0 + 13), "12.250000");
    redis_args_release(&a);
    redis_args_init(&a);
    rq_redis_start(&a, "w", "j1", "q", "T", 100, 90, &x, 1);
    ck_assert_int_eq(a.n, 3 + 7 + 8);
    ck_assert_str_eq(arg(&a, 2), "7");
    ck_assert_str_eq(arg(&a, 6), "rq:execution:j1:0123456789abcdef0123456789abcdef");
    ck_assert_str_eq(arg(&a, 8), "rq:suspended");
    ck_assert_str_eq(arg(&a, 9), "rq:queue:q");
    ck_assert_str_eq(arg(&a, 15), x.eid);
    ck_assert_str_eq(arg(&a, 17), "1");
    redis_args_release(&a);
}
END_TEST

START_TEST(test_end_retry)
{
    struct rq_end_info e = {.how = RQ_END_RETRY,
                            .worker = "w",
                            .id = "j1",
                            .queue = "q",
                            .ts = "T",
                            .now_s = 1000,
                            .retries_left = 1,
                            .interval_s = 5};
    struct redis_args a;
    end_args(&a, &e);
    ck_assert_str_eq(arg(&a, K0 + 6), "rq:scheduled:q");
    ck_assert_str_eq(arg(&a, A0), "retry");
    ck_assert_str_eq(arg(&a, A0 + 5), "1006"); /* never sooner than asked */
    ck_assert_str_eq(arg(&a, A0 + 7), "1");
    ck_assert_str_eq(arg(&a, A0 + 8), "5");
    redis_args_release(&a);
}
END_TEST

START_TEST(test_worker_keys)
{
    const char *q[] = {"high", "low"};
    struct rq_worker_info w = {.name = "w-1",
                               .queues = "high,low",
                               .queue_names = q,
                               .nqueues = 2,
                               .ts = "T",
                               .pid = 42,
                               .hostname = "h",
                               .version = "v",
                               .ttl_s = 480};
    struct redis_args a;
    redis_args_init(&a);
    rq_redis_birth(&a, &w);
    ck_assert_str_eq(arg(&a, 2), "4");
    ck_assert_str_eq(arg(&a, 3), "rq:worker:w-1");
    ck_assert_str_eq(arg(&a, 4), "rq:workers");
    ck_assert_str_eq(arg(&a, 5), "rq:workers:high");
    ck_assert_str_eq(arg(&a, 6), "rq:workers:low");
    ck_assert_str_eq(arg(&a, 7), "T");
    ck_assert_str_eq(arg(&a, 8), "high,low");
    ck_assert_str_eq(arg(&a, 9), "42");
    ck_assert_str_eq(arg(&a, 12), "480");
    redis_args_release(&a);
    redis_args_init(&a);
    rq_redis_schedule(&a, "high", 1000, "T", 42);
    ck_assert_str_eq(arg(&a, 3), "rq:scheduled:high");
    ck_assert_str_eq(arg(&a, 4), "rq:queue:high");
    ck_assert_str_eq(arg(&a, 5), "rq:queues");
    ck_assert_str_eq(arg(&a, 6), "rq:scheduler-lock:high");
    ck_assert_str_eq(arg(&a, 9), "42");
    redis_args_release(&a);
}
END_TEST

/* The progress stream's write: the Celery worker's script and argument
 * layout, the job's stream key, no meta, and each entry's fields. */
START_TEST(test_progress)
{
    struct rq_progress_entry e[] = {
        {"STARTED", "", 0, 0, NULL, NULL},
        {"PROGRESS", "hello there", 5, 3, NULL, NULL},
        {"FAILURE", "", 0, 3, "JobTimeoutException: late", "{\"exc_type\": \"J\"}"},
        {"SUCCESS", "", 0, 9, NULL, NULL},
    };
    struct redis_args a;
    const size_t *lens;
    redis_args_init(&a);
    rq_redis_progress(&a, "job-1", "h:7:2", 5, 500, e, 4); /* one too many: cut to 3 */
    ck_assert_int_eq(a.n, 3 + 2 + 7 + 4 + 4 + 8);
    ck_assert_str_eq(arg(&a, 0), "EVAL");
    ck_assert_str_eq(arg(&a, 1), PROGRESS_WRITE_LUA);
    ck_assert_str_eq(arg(&a, 2), "2");
    ck_assert_str_eq(arg(&a, 3), "celeriac:progress:job-1");
    ck_assert_str_eq(arg(&a, 5), "h:7:2");
    ck_assert_str_eq(arg(&a, 6), "5");
    ck_assert_str_eq(arg(&a, 8), "10000");
    ck_assert_str_eq(arg(&a, 9), "500");
    ck_assert_str_eq(arg(&a, 10), ""); /* no meta */
    ck_assert_str_eq(arg(&a, 11), "3");
    ck_assert_str_eq(arg(&a, 12), "STARTED");
    ck_assert_str_eq(arg(&a, 15), "0");
    ck_assert_str_eq(arg(&a, 16), "PROGRESS");
    lens = a.len;
    ck_assert_int_eq((int)lens[17], 5);
    ck_assert(!memcmp(arg(&a, 17), "hello", 5));
    ck_assert_str_eq(arg(&a, 18), "3");
    ck_assert_str_eq(arg(&a, 20), "FAILURE");
    ck_assert_str_eq(arg(&a, 23), "2");
    ck_assert_str_eq(arg(&a, 24), "error");
    ck_assert_str_eq(arg(&a, 25), "JobTimeoutException: late");
    ck_assert_str_eq(arg(&a, 26), "result");
    ck_assert_str_eq(arg(&a, 27), "{\"exc_type\": \"J\"}");
    redis_args_release(&a);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rq_redis");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_pop_order);
    tcase_add_test(tc, test_pop_many);
    tcase_add_test(tc, test_end_finished);
    tcase_add_test(tc, test_end_failed);
    tcase_add_test(tc, test_end_retry);
    tcase_add_test(tc, test_end_layout2);
    tcase_add_test(tc, test_worker_keys);
    tcase_add_test(tc, test_progress);
    suite_add_tcase(s, tc);
    return s;
}
