/* test_rmq_sock.c -- rabbitmq-c writes through the wrapper over a loopback TCP
 * connection whose far end stops reading: no write may wait (without the
 * wrapper the first one that finds the send buffer full never returns, and
 * Check's timeout fails the test), the bytes arrive whole and in order once
 * the far end reads again, and only bytes received are counted as received. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/rmq_sock.h"
#include "util/alloc.h"

#define BODY_BYTES 65536
#define NBODIES 40

struct pair {
    amqp_connection_state_t conn;
    amqp_socket_t *sock;
    struct rmq_sock *w;
    int peer; /* the far end: read only when a test says so */
};

/* A loopback TCP connection with small buffers, its near end given to a
 * rabbitmq-c connection (as amqp_socket_open would leave it: non-blocking). */
static void pair_open(struct pair *p, size_t max_queued, int wrap)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    int small = 8192, one = 1;
    int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert(l >= 0 && c >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(setsockopt(l, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small)), 0);
    ck_assert_int_eq(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(l, 1), 0);
    ck_assert_int_eq(getsockname(l, (struct sockaddr *)&a, &alen), 0);
    ck_assert_int_eq(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)), 0);
    ck_assert_int_eq(connect(c, (struct sockaddr *)&a, sizeof(a)), 0);
    p->peer = accept(l, NULL, NULL);
    ck_assert(p->peer >= 0);
    close(l);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ck_assert_int_eq(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK), 0);
    ck_assert_int_eq(fcntl(p->peer, F_SETFL, fcntl(p->peer, F_GETFL) | O_NONBLOCK), 0);

    p->conn = amqp_new_connection();
    ck_assert_ptr_nonnull(p->conn);
    p->sock = amqp_tcp_socket_new(p->conn);
    ck_assert_ptr_nonnull(p->sock);
    amqp_tcp_socket_set_sockfd(p->sock, c);
    p->w = wrap ? rmq_sock_wrap(p->sock, max_queued) : NULL;
    ck_assert(!wrap || p->w != NULL);
}

static void pair_close(struct pair *p)
{
    amqp_destroy_connection(p->conn); /* closes the near end, frees the wrapper */
    close(p->peer);
}

static int publish(struct pair *p, int i)
{
    static char body[BODY_BYTES];
    amqp_bytes_t b = {sizeof(body), body};
    memset(body, 'A' + i, sizeof(body));
    return amqp_basic_publish(p->conn, 1, amqp_cstring_bytes("x"),
                              amqp_cstring_bytes("k"), 0, 0, NULL, b);
}

/* Reads what the far end has, then lets the wrapper write more, until nothing
 * is queued and nothing more arrives. Returns the bytes read (new). */
static char *drain(struct pair *p, size_t *len)
{
    size_t cap = (size_t)NBODIES * (BODY_BYTES + 4096), n = 0;
    char *got = malloc(cap);
    int idle = 0;

    ck_assert_ptr_nonnull(got);
    while (idle < 20) {
        struct pollfd pf = {p->peer, POLLIN, 0};
        ssize_t r;
        ck_assert_int_eq(rmq_sock_flush(p->w), AMQP_STATUS_OK);
        poll(&pf, 1, 10);
        r = read(p->peer, got + n, cap - n);
        if (r > 0) {
            n += (size_t)r;
            idle = 0;
        } else if (rmq_sock_queued(p->w) == 0) {
            idle++;
        }
        ck_assert(n < cap);
    }
    *len = n;
    return got;
}

START_TEST(test_writes_never_wait_and_arrive_in_order)
{
    struct pair p;
    size_t n;
    char *got, seq[NBODIES + 1];
    int nseq = 0;

    pair_open(&p, 0, 1);
    /* 2.5 MiB into a connection whose far end reads nothing */
    for (int i = 0; i < NBODIES; i++)
        ck_assert_int_eq(publish(&p, i), AMQP_STATUS_OK);
    ck_assert_uint_gt(rmq_sock_queued(p.w), (size_t)NBODIES * BODY_BYTES / 2);

    got = drain(&p, &n);
    ck_assert_uint_eq(rmq_sock_queued(p.w), 0);
    ck_assert_uint_gt(n, (size_t)NBODIES * BODY_BYTES);
    /* the bodies' fill bytes, in the order their long runs arrived */
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && got[j] == got[i])
            j++;
        if (j - i >= 1024 && (nseq == 0 || seq[nseq - 1] != got[i])) {
            ck_assert_int_lt(nseq, NBODIES);
            seq[nseq++] = got[i];
        }
        i = j;
    }
    ck_assert_int_eq(nseq, NBODIES);
    for (int i = 0; i < NBODIES; i++)
        ck_assert_int_eq(seq[i], 'A' + i);
    /* and a new write goes straight out again */
    ck_assert_int_eq(amqp_send_header(p.conn), AMQP_STATUS_OK);
    ck_assert_uint_eq(rmq_sock_queued(p.w), 0);
    free(got);
    pair_close(&p);
}
END_TEST

START_TEST(test_only_bytes_received_count)
{
    /* a fresh connection state reads a protocol header first */
    static const char header[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
    static const unsigned char heartbeat[8] = {8, 0, 0, 0, 0, 0, 0, 0xCE};
    struct timeval tv = {0, 200000};
    amqp_frame_t f;
    struct pair p;

    pair_open(&p, 0, 1);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(publish(&p, i), AMQP_STATUS_OK);
    ck_assert_uint_eq(rmq_sock_received(p.w), 0);
    ck_assert_int_eq(amqp_simple_wait_frame_noblock(p.conn, &f, &tv),
                     AMQP_STATUS_TIMEOUT);
    ck_assert_uint_eq(rmq_sock_received(p.w), 0);
    ck_assert_int_eq(write(p.peer, header, sizeof(header)), (int)sizeof(header));
    ck_assert_int_eq(amqp_simple_wait_frame_noblock(p.conn, &f, &tv), AMQP_STATUS_OK);
    ck_assert_uint_eq(rmq_sock_received(p.w), 8);
    ck_assert_int_eq(write(p.peer, heartbeat, sizeof(heartbeat)), (int)sizeof(heartbeat));
    /* a heartbeat is no frame for the caller, but it is life */
    ck_assert_int_eq(amqp_simple_wait_frame_noblock(p.conn, &f, &tv),
                     AMQP_STATUS_TIMEOUT);
    ck_assert_uint_eq(rmq_sock_received(p.w), 16);
    pair_close(&p);
}
END_TEST

START_TEST(test_queue_limit_is_a_socket_error)
{
    size_t max = 3 * BODY_BYTES;
    struct pair p;
    int rc = AMQP_STATUS_OK, i;

    pair_open(&p, max, 1);
    for (i = 0; i < NBODIES && rc == AMQP_STATUS_OK; i++)
        rc = publish(&p, i);
    ck_assert_int_eq(rc, AMQP_STATUS_SOCKET_ERROR);
    ck_assert_int_eq(errno, ENOBUFS);
    ck_assert_int_lt(i, NBODIES);
    ck_assert_uint_le(rmq_sock_queued(p.w), max);
    pair_close(&p);
}
END_TEST

START_TEST(test_out_of_memory)
{
    struct pair p;
    int rc = AMQP_STATUS_OK;

    /* no wrapper: the socket is left as it was, and still works */
    pair_open(&p, 0, 0);
    cr_alloc_fail_after(1);
    ck_assert_ptr_null(rmq_sock_wrap(p.sock, 0));
    cr_alloc_fail_after(0);
    ck_assert_int_eq(amqp_send_header(p.conn), AMQP_STATUS_OK);
    pair_close(&p);

    /* no room to queue: a socket error, never a frame cut short in silence */
    pair_open(&p, 0, 1);
    cr_alloc_fail_after(1);
    for (int i = 0; i < NBODIES && rc == AMQP_STATUS_OK; i++)
        rc = publish(&p, i);
    ck_assert_int_eq(cr_alloc_failed(), 1);
    cr_alloc_fail_after(0);
    ck_assert_int_eq(rc, AMQP_STATUS_SOCKET_ERROR);
    ck_assert_int_eq(errno, ENOMEM);
    pair_close(&p);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rmq_sock");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_writes_never_wait_and_arrive_in_order);
    tcase_add_test(tc, test_only_bytes_received_count);
    tcase_add_test(tc, test_queue_limit_is_a_socket_error);
    tcase_add_test(tc, test_out_of_memory);
    suite_add_tcase(s, tc);
    return s;
}
