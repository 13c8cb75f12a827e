/* test_rmq_url.c -- broker URL parsing as kombu does it. */
#include <check.h>
#include <string.h>

#include "util/alloc.h"
#include "net/rmq_url.h"

static const struct {
    const char *url;
    const char *host, *user, *password, *vhost;
    int port;
} good[] = {
    {"amqp://guest:guest@localhost:5672//", "localhost", "guest", "guest", "/", 5672},
    {"amqp://", "localhost", "guest", "guest", "/", 5672},
    {"amqp://h", "h", "guest", "guest", "/", 5672},
    {"amqp://h/", "h", "guest", "guest", "/", 5672},
    {"amqp://u:p@h:1234/vh", "h", "u", "p", "vh", 1234},
    {"amqp://u:p%40ss@h/%2Fprod", "h", "u", "p@ss", "/prod", 5672},
    {"pyamqp://u@h:5/v?heartbeat=10", "h", "u", "guest", "v", 5},
    {"amqp://u:p@[::1]:5673/x", "::1", "u", "p", "x", 5673},
    {"amqp://u:p:q@h/x", "h", "u", "p:q", "x", 5672},
    /* a '%' that starts no whole escape is kept, and '+' is no space */
    {"amqp://u%zz:p+w%4@h/v%", "h", "u%zz", "p+w%4", "v%", 5672},
};

START_TEST(test_good)
{
    struct rmq_url u;
    struct cr_err e;
    ck_assert_int_eq(rmq_url_parse(good[_i].url, &u, &e), 0);
    ck_assert_str_eq(u.host, good[_i].host);
    ck_assert_str_eq(u.user, good[_i].user);
    ck_assert_str_eq(u.password, good[_i].password);
    ck_assert_str_eq(u.vhost, good[_i].vhost);
    ck_assert_int_eq(u.port, good[_i].port);
}
END_TEST

START_TEST(test_bad)
{
    static const char *const bad[] = {"redis://h",     "amqp://h:0/",  "amqp://h:99999/",
                                      "amqp://h:12x/", "amqp://[::1/", "http://h"};
    struct rmq_url u;
    struct cr_err e;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rmq_url_parse(bad[i], &u, &e), CR_EINVAL);
        ck_assert(strstr(e.msg, "secret") == NULL);
    }
}
END_TEST

START_TEST(test_list)
{
    struct rmq_url_list l;
    struct cr_err e;
    ck_assert_int_eq(rmq_url_list_parse("amqp://a", &l, &e), 0);
    ck_assert_int_eq(l.n, 1);
    ck_assert_str_eq(l.url[0], "amqp://a");
    ck_assert_int_eq(
        rmq_url_list_parse("amqp://u:p@a:1//; amqp://b:2/v ;pyamqp://c", &l, &e), 0);
    ck_assert_int_eq(l.n, 3);
    ck_assert_str_eq(l.url[0], "amqp://u:p@a:1//");
    ck_assert_str_eq(l.url[1], "amqp://b:2/v");
    ck_assert_str_eq(l.url[2], "pyamqp://c");
}
END_TEST

START_TEST(test_list_bad)
{
    static const char *const bad[] = {"",
                                      ";",
                                      "amqp://a;",
                                      "amqp://a;;amqp://b",
                                      "amqp://a; ",
                                      "amqp://a;redis://b",
                                      "amqp://u:secret@a;amqp://u:secret@b:0"};
    struct rmq_url_list l;
    struct cr_err e;
    char many[40 * 20] = "";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(rmq_url_list_parse(bad[i], &l, &e), CR_EINVAL);
        ck_assert(strstr(e.msg, "secret") == NULL);
        ck_assert(strstr(e.msg, "entry") != NULL);
    }
    ck_assert_int_eq(rmq_url_list_parse("amqp://a;amqp://b:0", &l, &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "entry 2") != NULL);
    for (int i = 0; i < RMQ_URL_LIST_MAX + 1; i++)
        strcat(many, i ? ";amqp://h" : "amqp://h");
    ck_assert_int_eq(rmq_url_list_parse(many, &l, &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "more than") != NULL);
}
END_TEST

START_TEST(test_failover)
{
    enum rmq_failover s;
    struct cr_err e;
    ck_assert_int_eq(rmq_failover_parse(NULL, &s, &e), 0);
    ck_assert_int_eq(s, RMQ_FAILOVER_ROUND_ROBIN);
    ck_assert_int_eq(rmq_failover_parse("round-robin", &s, &e), 0);
    ck_assert_int_eq(s, RMQ_FAILOVER_ROUND_ROBIN);
    ck_assert_int_eq(rmq_failover_parse("shuffle", &s, &e), 0);
    ck_assert_int_eq(s, RMQ_FAILOVER_SHUFFLE);
    ck_assert_int_eq(rmq_failover_parse("random", &s, &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "random") != NULL);

    /* Round-robin: each in turn, then the first again. */
    ck_assert_int_eq(rmq_failover_next(RMQ_FAILOVER_ROUND_ROBIN, 3, 0, 7), 1);
    ck_assert_int_eq(rmq_failover_next(RMQ_FAILOVER_ROUND_ROBIN, 3, 1, 7), 2);
    ck_assert_int_eq(rmq_failover_next(RMQ_FAILOVER_ROUND_ROBIN, 3, 2, 7), 0);
    ck_assert_int_eq(rmq_failover_next(RMQ_FAILOVER_ROUND_ROBIN, 1, 0, 7), 0);
    ck_assert_int_eq(rmq_failover_next(RMQ_FAILOVER_SHUFFLE, 1, 0, 7), 0);
    /* Shuffle: never the node just lost, and every other one reachable. */
    for (int cur = 0; cur < 4; cur++) {
        int seen[4] = {0};
        for (uint64_t r = 0; r < 12; r++) {
            int nx = rmq_failover_next(RMQ_FAILOVER_SHUFFLE, 4, cur,
                                       r * 0x9e3779b97f4a7c15ull);
            ck_assert(nx >= 0 && nx < 4);
            ck_assert_int_ne(nx, cur);
            seen[nx] = 1;
        }
        ck_assert_int_eq(seen[0] + seen[1] + seen[2] + seen[3], 3);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rmq_url");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_good, 0, (int)(sizeof(good) / sizeof(good[0])));
    tcase_add_test(tc, test_bad);
    tcase_add_test(tc, test_list);
    tcase_add_test(tc, test_list_bad);
    tcase_add_test(tc, test_failover);
    suite_add_tcase(s, tc);
    return s;
}
