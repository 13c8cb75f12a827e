/* test_otlp.c -- the exporter's bounds with a collector that is not there:
 * the queue holds queue_max spans, the rest and every failed batch are
 * dropped and counted, and nothing is left behind. */
#include <check.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>
#include <curl/curl.h>

#include "net/otlp.h"
#include "util/alloc.h"

static struct span *one(void)
{
    struct trace_ctx c;
    memset(&c, 0, sizeof(c));
    c.trace_id[0] = 1;
    c.span_id[0] = 2;
    return span_new("run/t", SPAN_KIND_CONSUMER, &c);
}

START_TEST(test_collector_down)
{
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9", NULL};
    struct otel_conf conf;
    struct otlp_exporter_config cfg;
    struct otlp_exporter *x;
    struct otlp_stats st;
    struct cr_err err = {0};
    uv_loop_t loop;
    uint64_t t0;

    curl_global_init(CURL_GLOBAL_ALL);
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(otel_conf_load(&conf, env, &err), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.conf = &conf;
    cfg.scope_version = "test";
    cfg.queue_max = 100;
    cfg.batch_max = 30;
    cfg.interval_ms = 10;
    x = otlp_exporter_new(&loop, &cfg, &err);
    ck_assert_ptr_nonnull(x);
    for (int i = 0; i < 150; i++)
        otlp_exporter_add(x, one());
    otlp_exporter_stats(x, &st);
    ck_assert_uint_eq(st.queued, 100);
    ck_assert(st.dropped == 50);
    ck_assert_int_eq(st.inflight, 0); /* nothing sent from inside add */
    t0 = uv_now(&loop);
    do {
        uv_run(&loop, UV_RUN_ONCE);
        otlp_exporter_stats(x, &st);
        ck_assert_int_le(st.inflight, 2);
    } while ((st.queued || st.inflight) && uv_now(&loop) - t0 < 10000);
    ck_assert_uint_eq(st.queued, 0);
    ck_assert(st.dropped == 150);
    ck_assert(st.exported == 0);
    otlp_exporter_free(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    otel_conf_release(&conf);
}
END_TEST

START_TEST(test_free_with_queue)
{
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9", NULL};
    struct otel_conf conf;
    struct otlp_exporter_config cfg;
    struct otlp_exporter *x;
    struct cr_err err = {0};
    uv_loop_t loop;

    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(otel_conf_load(&conf, env, &err), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.conf = &conf;
    x = otlp_exporter_new(&loop, &cfg, &err);
    ck_assert_ptr_nonnull(x);
    for (int i = 0; i < 600; i++)
        otlp_exporter_add(x, one());
    uv_run(&loop, UV_RUN_NOWAIT); /* a full batch starts on the next turn */
    otlp_exporter_free(x);
    otlp_exporter_free(NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    otel_conf_release(&conf);
}
END_TEST

static int drained_calls;

static void on_drained(struct otlp_exporter *x, void *privdata)
{
    struct otlp_stats st;
    (void)privdata;
    otlp_exporter_stats(x, &st);
    drained_calls++;
    ck_assert_uint_eq(st.queued, 0);
    ck_assert_int_eq(st.inflight, 0);
}

/* Turns the loop without blocking (the 60 s tick would) until the drain
 * callback has run n times in all, for at most 10 s. */
static void run_until_calls(uv_loop_t *loop, int n)
{
    for (int k = 0; drained_calls < n && k < 10000; k++) {
        uv_run(loop, UV_RUN_NOWAIT);
        if (drained_calls < n)
            usleep(1000);
    }
}

START_TEST(test_drain)
{
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9", NULL};
    struct otel_conf conf;
    struct otlp_exporter_config cfg;
    struct otlp_exporter *x;
    struct otlp_stats st;
    struct cr_err err = {0};
    uv_loop_t loop;

    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(otel_conf_load(&conf, env, &err), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.conf = &conf;
    cfg.batch_max = 7;
    cfg.interval_ms = 60000; /* only the drain sends */
    x = otlp_exporter_new(&loop, &cfg, &err);
    ck_assert_ptr_nonnull(x);
    /* nothing queued: done on the next turn, not from inside the call */
    drained_calls = 0;
    otlp_exporter_drain(x, 5000, on_drained, NULL);
    ck_assert_int_eq(drained_calls, 0);
    run_until_calls(&loop, 1);
    ck_assert_int_eq(drained_calls, 1);
    /* 50 spans in batches of 7, two at a time: all tried, then done once */
    for (int i = 0; i < 50; i++)
        otlp_exporter_add(x, one());
    otlp_exporter_drain(x, 5000, on_drained, NULL);
    run_until_calls(&loop, 2);
    ck_assert_int_eq(drained_calls, 2);
    otlp_exporter_stats(x, &st);
    ck_assert(st.dropped == 50);
    otlp_exporter_free(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    otel_conf_release(&conf);
}
END_TEST

static void on_drained_late(struct otlp_exporter *x, void *privdata)
{
    struct otlp_stats st;
    otlp_exporter_stats(x, &st);
    *(int *)privdata = st.inflight;
    drained_calls++;
}

/* A collector that takes the connection and never answers: the drain ends
 * at its time limit, the request still in flight. */
START_TEST(test_drain_time_limit)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof(sa);
    char url[128];
    const char *env[] = {url, NULL};
    struct otel_conf conf;
    struct otlp_exporter_config cfg;
    struct otlp_exporter *x;
    struct cr_err err = {0};
    uv_loop_t loop;
    uint64_t t0;
    int inflight = -1, fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(url, sizeof(url), "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:%d",
             ntohs(sa.sin_port));
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(otel_conf_load(&conf, env, &err), 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.conf = &conf;
    cfg.interval_ms = 60000;
    x = otlp_exporter_new(&loop, &cfg, &err);
    otlp_exporter_add(x, one());
    drained_calls = 0;
    uv_update_time(&loop);
    t0 = uv_now(&loop);
    otlp_exporter_drain(x, 300, on_drained_late, &inflight);
    run_until_calls(&loop, 1);
    ck_assert_int_eq(drained_calls, 1);
    ck_assert_int_eq(inflight, 1);
    ck_assert_uint_ge(uv_now(&loop) - t0, 290);
    otlp_exporter_free(x);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    otel_conf_release(&conf);
    close(fd);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("otlp");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_collector_down);
    tcase_add_test(tc, test_free_with_queue);
    tcase_add_test(tc, test_drain);
    tcase_add_test(tc, test_drain_time_limit);
    suite_add_tcase(s, tc);
    return s;
}
