/* test_redis_broker.c -- the Redis transport's face without a server: what
 * broker_new() refuses, what the transport says of itself, a publish or a
 * depth poll refused while not connected, settling and liveness of a delivery
 * on both transports, and a free that never connected.
 * The wire behaviour is tested against real Redis and Celery in
 * tests/integration/test_redis_broker.py. */
#include <check.h>
#include <string.h>
#include <uv.h>

#include "net/broker.h"

static void on_delivery(struct broker *b, struct delivery *d, void *privdata)
{
    (void)b;
    (void)privdata;
    delivery_free(d);
}

static int confirms;

static void on_confirm(struct broker *b, int ok, void *privdata)
{
    (void)b;
    (void)ok;
    (void)privdata;
    confirms++;
}

static struct broker *make(uv_loop_t *loop, const char *url, const char *opts,
                           struct cr_err *err)
{
    static char q1[] = "celery", q2[] = "other";
    static char *queues[] = {q1, q2};
    struct broker_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.url = url;
    cfg.queues = queues;
    cfg.nqueues = 2;
    cfg.prefetch_count = 4;
    cfg.connect_timeout = 1;
    cfg.dlx = "celeriac.dlx";
    cfg.dlq = "celeriac.dead";
    cfg.transport_options = opts;
    memset(err, 0, sizeof(*err));
    return broker_new(loop, &cfg, on_delivery, NULL, NULL, err);
}

static void free_and_drain(uv_loop_t *loop, struct broker *b)
{
    broker_free(b);
    uv_run(loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

START_TEST(test_refusals)
{
    uv_loop_t loop;
    struct cr_err err;
    uv_loop_init(&loop);
    ck_assert_ptr_null(make(&loop, "redis://127.0.0.1:1/0", "{\"nope\": 1}", &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "unknown broker transport option 'nope'"));
    ck_assert_ptr_null(make(&loop, "redis://127.0.0.1:1/0", "[1]", &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    ck_assert_ptr_null(make(&loop, "redis://h:99999/0", NULL, &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    ck_assert_ptr_null(make(&loop, "sentinel://127.0.0.1:26379/0", NULL, &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "master_name"));
    /* an AMQP URL takes no transport options */
    ck_assert_ptr_null(make(&loop, "amqp://guest:guest@localhost:5672//",
                            "{\"visibility_timeout\": 5}", &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

static int nqueues;

static void count_queue(const struct broker_queue *q, void *arg)
{
    (void)q;
    (void)arg;
    nqueues++;
}

START_TEST(test_face_before_connecting)
{
    uv_loop_t loop;
    struct cr_err err;
    struct broker *b;
    struct outbound p;
    const char *why = "x";
    struct broker_queue q;

    uv_loop_init(&loop);
    b = make(&loop, "redis://127.0.0.1:1/3",
             "{\"visibility_timeout\": 5, \"global_keyprefix\": \"pfx:\"}", &err);
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(broker_transport(b), "redis");
    ck_assert_uint_eq(broker_delivery_caps(b),
                      MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY | MSG_CAP_PREFETCH);
    ck_assert_int_eq(broker_connected(b), 0);
    ck_assert_uint_eq(broker_generation(b), 1);
    ck_assert_int_eq(broker_blocked(b, &why), 0);
    ck_assert_ptr_null(why);
    memset(&p, 0, sizeof(p));
    p.priority = -1;
    p.routing_key = "celery";
    p.body = "[]";
    p.body_len = 2;
    confirms = 0;
    ck_assert_int_eq(broker_publish(b, &p, on_confirm, NULL), CR_EBROKER);
    ck_assert_int_eq(broker_queue_stats(b, "celery", NULL, NULL), CR_EBROKER);
    /* consumers: the two task queues, then a fanout mailbox and its cancel */
    memset(&q, 0, sizeof(q));
    q.name = "w@h.celery.pidbox";
    q.exchange = "celery.pidbox";
    q.exchange_type = "fanout";
    q.routing_key = "";
    q.no_ack = 1;
    q.auto_delete = 1;
    ck_assert_int_eq(broker_add_consumer(b, &q), 0);
    ck_assert_int_eq(broker_add_consumer(b, &q), 0); /* again: left as it is */
    nqueues = 0;
    broker_each_consumer(b, count_queue, NULL);
    ck_assert_int_eq(nqueues, 3);
    ck_assert_int_eq(broker_cancel_consumer(b, "w@h.celery.pidbox"), 0);
    ck_assert_int_eq(broker_cancel_consumer(b, "w@h.celery.pidbox"), CR_ENOTFOUND);
    ck_assert_int_eq(broker_declare_exchange(b, "celeryev", "fanout", 1), 0);
    broker_set_prefetch(b, 10);
    broker_stop_consuming(b);
    broker_stop_consuming(b);
    free_and_drain(&loop, b);
    ck_assert_int_eq(confirms, 0);
}
END_TEST

/* What the face answers for a delivery, whatever the connections: a Redis
 * record lives in Redis, so its delivery stays live and settles once while
 * no connection is up; an AMQP delivery of a connection that is not up is
 * neither live nor settled (the broker has it back). */
START_TEST(test_settle_and_live)
{
    uv_loop_t loop;
    struct cr_err err;
    struct broker *b;
    struct delivery *d;

    uv_loop_init(&loop);
    b = make(&loop, "redis://127.0.0.1:1/3", NULL, &err);
    ck_assert_ptr_nonnull(b);
    d = delivery_new();
    ck_assert_ptr_nonnull(d);
    d->rec.id = strdup("tag-1");
    d->rec.generation = broker_generation(b);
    ck_assert_int_eq(broker_live(b, d), 1);
    ck_assert_int_eq(broker_ack(b, d), 0);
    ck_assert_int_eq(d->settled, 1);
    ck_assert_int_eq(broker_reject(b, d, 1), 0); /* settled: nothing more */
    ck_assert_int_eq(d->settled, 1);
    delivery_free(d);
    d = delivery_new();
    ck_assert_ptr_nonnull(d);
    d->rec.id = strdup("tag-2");
    d->no_ack = 1;
    ck_assert_int_eq(broker_ack(b, d), 0);
    ck_assert_int_eq(d->settled, 0); /* consumed without acks: nothing to settle */
    delivery_free(d);
    free_and_drain(&loop, b);

    uv_loop_init(&loop);
    b = make(&loop, "amqp://guest:guest@127.0.0.1:1//", NULL, &err);
    ck_assert_ptr_nonnull(b);
    ck_assert_str_eq(broker_transport(b), "amqp");
    ck_assert_uint_eq(broker_delivery_caps(b), MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY |
                                                   MSG_CAP_PREFETCH | MSG_CAP_PARK);
    d = delivery_new();
    ck_assert_ptr_nonnull(d);
    d->rec.seq = 1;
    d->rec.generation = broker_generation(b);
    ck_assert_int_eq(broker_live(b, d), 0);
    ck_assert_int_eq(broker_ack(b, d), 0);
    ck_assert_int_eq(d->settled, 0);
    ck_assert_int_eq(broker_reject(b, d, 1), 0);
    ck_assert_int_eq(d->settled, 0);
    delivery_free(d);
    free_and_drain(&loop, b);
}
END_TEST

START_TEST(test_connect_times_out)
{
    uv_loop_t loop;
    struct cr_err err;
    struct broker *b;
    uv_loop_init(&loop);
    /* port 1: refused at once, and again after each backoff, until the
     * connect timeout (1 s) */
    b = make(&loop, "redis://127.0.0.1:1/0", NULL, &err);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_ne(broker_connect(b, &err), 0);
    ck_assert_int_eq(err.code, CR_EBROKER);
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot connect to broker"));
    free_and_drain(&loop, b);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("redis_broker");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_face_before_connecting);
    tcase_add_test(tc, test_settle_and_live);
    tcase_add_test(tc, test_connect_times_out);
    suite_add_tcase(s, tc);
    return s;
}
