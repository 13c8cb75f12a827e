/* test_tcp_connect.c -- the bounded connect that says why (net/tcp_connect.c),
 * on loopback: a port that listens, one that refuses, a name that does not
 * resolve. The AMQP side is tested in tests/integration/test_startup.py. */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/tcp_connect.h"

/* A listening loopback socket; its port in *port. */
static int listening(int *port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

START_TEST(test_connects)
{
    struct cr_err err = {0, ""};
    int port, l = listening(&port);
    int fd = tcp_connect("127.0.0.1", port, 5, &err);
    ck_assert_int_ge(fd, 0);
    /* rabbitmq-c polls its socket itself: it must be non-blocking */
    ck_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    close(l);
}
END_TEST

START_TEST(test_refused_in_words)
{
    struct cr_err err = {0, ""};
    int port, l = listening(&port);
    close(l); /* nothing listens there now */
    ck_assert_int_eq(tcp_connect("127.0.0.1", port, 5, &err), CR_EBROKER);
    ck_assert_str_eq(err.msg, "connection refused");
}
END_TEST

START_TEST(test_unresolvable)
{
    struct cr_err err = {0, ""};
    ck_assert_int_eq(tcp_connect("no-such-host.invalid", 5672, 5, &err), CR_EBROKER);
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot resolve 'no-such-host.invalid': "));
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("tcp_connect");
    TCase *tc = tcase_create("loopback");
    tcase_add_test(tc, test_connects);
    tcase_add_test(tc, test_refused_in_words);
    tcase_add_test(tc, test_unresolvable);
    suite_add_tcase(s, tc);
    return s;
}
