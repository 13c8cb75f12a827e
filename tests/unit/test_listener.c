/* test_listener.c -- the listening sockets (net/listener.c) on a private loop:
 * a connection handed over, a port in use (one line, nothing left on the
 * loop), IPv6 sockets that take IPv6 only, "" as every address on one port.
 * The commands that use it are tested in tests/integration/test_listen.py. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "net/listener.h"

static void on_accept(struct listener *l, int fd, void *privdata)
{
    int *got = privdata;
    (void)l;
    if (*got >= 0)
        close(*got);
    *got = fd;
}

/* A blocking connect to addr:port; the socket, or -1 when refused. */
static int dial(int family, const char *addr, int port)
{
    struct sockaddr_storage ss;
    socklen_t len;
    int fd = socket(family, SOCK_STREAM, 0);
    memset(&ss, 0, sizeof(ss));
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, addr, &a->sin6_addr);
        len = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, addr, &a->sin_addr);
        len = sizeof(*a);
    }
    if (connect(fd, (struct sockaddr *)&ss, len)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int have_ipv6_loopback(void)
{
    struct sockaddr_in6 a;
    int fd = socket(AF_INET6, SOCK_STREAM, 0), ok;
    if (fd < 0)
        return 0;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    ok = !bind(fd, (struct sockaddr *)&a, sizeof(a));
    close(fd);
    return ok;
}

/* Runs the loop until *got holds a descriptor (bounded). */
static void run_until_accepted(uv_loop_t *loop, int *got)
{
    for (int i = 0; i < 2000 && *got < 0; i++) {
        uv_run(loop, UV_RUN_NOWAIT);
        if (*got < 0)
            usleep(1000);
    }
}

static void close_loop(uv_loop_t *loop)
{
    uv_run(loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(loop), 0); /* every handle closed and freed */
}

START_TEST(test_hands_over_connections)
{
    uv_loop_t loop;
    struct cr_err e = {0, ""};
    struct listener *l;
    int got = -1, c, one = 0;
    socklen_t len = sizeof(one);

    uv_loop_init(&loop);
    l = listener_new(&loop, "127.0.0.1", 0, on_accept, &got, &e);
    ck_assert_msg(l != NULL, "%s", e.msg);
    ck_assert_int_gt(listener_port(l), 0);
    ck_assert_str_eq(listener_addresses(l), "127.0.0.1");
    c = dial(AF_INET, "127.0.0.1", listener_port(l));
    ck_assert_int_ge(c, 0);
    run_until_accepted(&loop, &got);
    ck_assert_int_ge(got, 0);
    ck_assert(fcntl(got, F_GETFL) & O_NONBLOCK);
    ck_assert_int_eq(getsockopt(got, IPPROTO_TCP, TCP_NODELAY, &one, &len), 0);
    ck_assert_int_ne(one, 0);
    close(got);
    close(c);
    listener_free(l);
    listener_free(NULL);
    close_loop(&loop);
}
END_TEST

START_TEST(test_port_in_use)
{
    uv_loop_t loop;
    struct cr_err e = {0, ""};
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    char want[128];
    int got = -1, fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    uv_loop_init(&loop);
    ck_assert_ptr_null(
        listener_new(&loop, "127.0.0.1", ntohs(a.sin_port), on_accept, &got, &e));
    ck_assert_int_eq(e.code, CR_EIO);
    snprintf(want, sizeof(want), "cannot listen on 127.0.0.1:%d: address already in use",
             ntohs(a.sin_port));
    ck_assert_str_eq(e.msg, want);
    close_loop(&loop);
    close(fd);
}
END_TEST

START_TEST(test_ipv6_takes_ipv6_only)
{
    uv_loop_t loop;
    struct cr_err e = {0, ""};
    struct listener *l;
    int got = -1, c;

    if (!have_ipv6_loopback())
        return; /* nothing to test on a machine without ::1 */
    uv_loop_init(&loop);
    l = listener_new(&loop, "[::1]", 0, on_accept, &got, &e);
    ck_assert_msg(l != NULL, "%s", e.msg);
    ck_assert_str_eq(listener_addresses(l), "[::1]");
    ck_assert_int_eq(dial(AF_INET, "127.0.0.1", listener_port(l)), -1);
    c = dial(AF_INET6, "::1", listener_port(l));
    ck_assert_int_ge(c, 0);
    run_until_accepted(&loop, &got);
    ck_assert_int_ge(got, 0);
    close(got);
    close(c);
    listener_free(l);
    close_loop(&loop);
}
END_TEST

START_TEST(test_every_address_one_port)
{
    uv_loop_t loop;
    struct cr_err e = {0, ""};
    struct listener *l;
    int got = -1, c;

    uv_loop_init(&loop);
    l = listener_new(&loop, "", 0, on_accept, &got, &e);
    ck_assert_msg(l != NULL, "%s", e.msg);
    if (have_ipv6_loopback()) {
        ck_assert_str_eq(listener_addresses(l), "0.0.0.0, [::]");
        c = dial(AF_INET6, "::1", listener_port(l));
        ck_assert_int_ge(c, 0);
        close(c);
    } else {
        ck_assert_str_eq(listener_addresses(l), "0.0.0.0");
    }
    c = dial(AF_INET, "127.0.0.1", listener_port(l));
    ck_assert_int_ge(c, 0);
    close(c);
    listener_free(l);
    close_loop(&loop);
}
END_TEST

START_TEST(test_url_host)
{
    char out[64];
    ck_assert_str_eq(listener_url_host("::1", out, sizeof(out)), "[::1]");
    ck_assert_str_eq(listener_url_host("[::1]", out, sizeof(out)), "[::1]");
    ck_assert_str_eq(listener_url_host("127.0.0.1", out, sizeof(out)), "127.0.0.1");
    ck_assert_str_eq(listener_url_host("localhost", out, sizeof(out)), "localhost");
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("listener");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_hands_over_connections);
    tcase_add_test(tc, test_port_in_use);
    tcase_add_test(tc, test_ipv6_takes_ipv6_only);
    tcase_add_test(tc, test_every_address_one_port);
    tcase_add_test(tc, test_url_host);
    suite_add_tcase(s, tc);
    return s;
}
