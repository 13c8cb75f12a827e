/* test_amqp_url.c -- broker URL parsing as kombu does it. */
#include <check.h>
#include <string.h>

#include "util/alloc.h"
#include "net/amqp_url.h"

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
};

START_TEST(test_good)
{
    struct amqp_url u;
    struct cr_err e;
    ck_assert_int_eq(amqp_url_parse(good[_i].url, &u, &e), 0);
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
    struct amqp_url u;
    struct cr_err e;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(amqp_url_parse(bad[i], &u, &e), CR_EINVAL);
        ck_assert(strstr(e.msg, "secret") == NULL);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("amqp_url");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_good, 0, (int)(sizeof(good) / sizeof(good[0])));
    tcase_add_test(tc, test_bad);
    suite_add_tcase(s, tc);
    return s;
}
