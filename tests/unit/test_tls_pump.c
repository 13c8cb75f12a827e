/* test_tls_pump.c -- the TLS pump (net/tls_pump.c): settings that cannot be
 * loaded, and on a private loop the ends that are not TLS's success: a closed
 * port, a server that hangs up, one that speaks no TLS, one that never
 * answers, a free before anything happened. The full TLS path (handshake,
 * both directions, client certificates, verification) runs against a real
 * redis-server in tests/integration/test_redis_tls.py. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "net/tls_pump.h"

START_TEST(test_ctx_errors)
{
    struct cr_err e = {0, ""};
    struct tls_settings s = {0};
    struct tls_ctx *ctx;
    char path[] = "/tmp/celeriac-test-ca-XXXXXX";
    int fd;

    s.verify = 1;
    s.ca_file = "/nonexistent/ca.pem";
    ck_assert_ptr_null(tls_ctx_new(&s, &e));
    ck_assert_int_eq(e.code, CR_EINVAL);
    ck_assert_str_eq(e.msg,
                     "cannot load ssl_ca_certs '/nonexistent/ca.pem': No such file or "
                     "directory");

    s.ca_file = NULL;
    s.key_file = "/k.pem";
    ck_assert_ptr_null(tls_ctx_new(&s, &e));
    ck_assert_str_eq(e.msg, "ssl_keyfile without ssl_certfile");

    /* a file that is there but holds no certificate */
    fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "not a pem\n", 10), 10);
    close(fd);
    s.key_file = NULL;
    s.ca_file = path;
    ck_assert_ptr_null(tls_ctx_new(&s, &e));
    ck_assert_msg(!strncmp(e.msg, "cannot load ssl_ca_certs '", 26), "%s", e.msg);
    s.ca_file = NULL;
    s.cert_file = path;
    ck_assert_ptr_null(tls_ctx_new(&s, &e));
    ck_assert_msg(!strncmp(e.msg, "cannot load ssl_certfile '", 26), "%s", e.msg);
    unlink(path);

    /* no verification needs no file at all */
    memset(&s, 0, sizeof(s));
    ctx = tls_ctx_new(&s, &e);
    ck_assert_ptr_nonnull(ctx);
    tls_ctx_free(ctx);
    tls_ctx_free(NULL);
}
END_TEST

/* ---- a loop, a client standing in for hiredis, and a TCP "server" */

enum server_kind {
    SERVER_NONE,      /* the port is closed */
    SERVER_HANG_UP,   /* accepts, then closes at once */
    SERVER_PLAINTEXT, /* answers the ClientHello with a Redis error line */
    SERVER_SILENT,    /* listens and never accepts: TCP done, TLS never */
};

struct world {
    uv_loop_t loop;
    uv_tcp_t server;
    uv_tcp_t accepted;
    int server_open, accepted_open;
    enum server_kind kind;
    int port;
    uv_pipe_t client;
    uv_connect_t creq;
    int connected, eof, reads;
    char buf[4096];
    struct tls_ctx *ctx;
    struct tls_pump *pump;
    uv_write_t wreq;
};

static void on_close_noop(uv_handle_t *h)
{
    (void)h;
}

static void on_server_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    struct world *w = h->data;
    (void)n;
    *b = uv_buf_init(w->buf, sizeof(w->buf));
}

static void on_server_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct world *w = s->data;
    static char reply[] = "-ERR this is not TLS\r\n";
    uv_buf_t out = uv_buf_init(reply, sizeof(reply) - 1);
    (void)b;
    if (n > 0 && w->kind == SERVER_PLAINTEXT)
        uv_write(&w->wreq, s, &out, 1, NULL);
}

static void on_server_conn(uv_stream_t *srv, int status)
{
    struct world *w = srv->data;
    ck_assert_int_eq(status, 0);
    uv_tcp_init(&w->loop, &w->accepted);
    w->accepted.data = w;
    w->accepted_open = 1;
    ck_assert_int_eq(uv_accept(srv, (uv_stream_t *)&w->accepted), 0);
    if (w->kind == SERVER_HANG_UP) {
        w->accepted_open = 0;
        uv_close((uv_handle_t *)&w->accepted, on_close_noop);
        return;
    }
    uv_read_start((uv_stream_t *)&w->accepted, on_server_alloc, on_server_read);
}

/* Leaves the connection in the backlog: libuv stops watching the listener. */
static void on_server_ignore(uv_stream_t *srv, int status)
{
    (void)srv;
    (void)status;
}

static void on_client_alloc(uv_handle_t *h, size_t n, uv_buf_t *b)
{
    struct world *w = h->data;
    (void)n;
    *b = uv_buf_init(w->buf, sizeof(w->buf));
}

static void on_client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct world *w = s->data;
    (void)b;
    if (n > 0)
        w->reads++;
    if (n < 0) {
        w->eof++;
        uv_read_stop(s);
    }
}

static void on_client_connected(uv_connect_t *req, int status)
{
    struct world *w = req->data;
    if (status == UV_ECANCELED) /* closed at once by test_free_early */
        return;
    ck_assert_int_eq(status, 0);
    w->connected = 1;
    uv_read_start((uv_stream_t *)&w->client, on_client_alloc, on_client_read);
}

static void world_start(struct world *w, enum server_kind kind)
{
    struct sockaddr_in a;
    struct sockaddr_storage name;
    int len = sizeof(name);
    struct tls_settings s = {0};
    struct cr_err e = {0, ""};

    memset(w, 0, sizeof(*w));
    w->kind = kind;
    ck_assert_int_eq(uv_loop_init(&w->loop), 0);
    uv_tcp_init(&w->loop, &w->server);
    w->server.data = w;
    w->server_open = 1;
    uv_ip4_addr("127.0.0.1", 0, &a);
    ck_assert_int_eq(uv_tcp_bind(&w->server, (struct sockaddr *)&a, 0), 0);
    uv_tcp_getsockname(&w->server, (struct sockaddr *)&name, &len);
    w->port = ntohs(((struct sockaddr_in *)&name)->sin_port);
    if (kind == SERVER_NONE) {
        w->server_open = 0;
        uv_close((uv_handle_t *)&w->server, on_close_noop);
    } else if (kind == SERVER_SILENT) {
        /* Listening, so the kernel completes the TCP handshake, but never
         * accepting or reading. */
        ck_assert_int_eq(uv_listen((uv_stream_t *)&w->server, 4, on_server_ignore), 0);
    } else {
        ck_assert_int_eq(uv_listen((uv_stream_t *)&w->server, 4, on_server_conn), 0);
    }
    w->ctx = tls_ctx_new(&s, &e);
    ck_assert_ptr_nonnull(w->ctx);
    w->pump = tls_pump_new(&w->loop, w->ctx, "127.0.0.1", w->port, &e);
    ck_assert_msg(w->pump != NULL, "%s", e.msg);
    /* The context may go first: the pump keeps what it needs. */
    tls_ctx_free(w->ctx);
    w->ctx = NULL;
    uv_pipe_init(&w->loop, &w->client, 0);
    w->client.data = w;
    w->creq.data = w;
    uv_pipe_connect(&w->creq, &w->client, tls_pump_path(w->pump), on_client_connected);
}

/* Runs the loop until the client has seen its socket closed, for at most
 * about two seconds. */
static void run_until_eof(struct world *w)
{
    for (int i = 0; i < 2000 && !w->eof; i++) {
        uv_run(&w->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
}

/* Frees everything and checks that the loop has nothing left. */
static void world_end(struct world *w)
{
    tls_pump_free(w->pump);
    uv_close((uv_handle_t *)&w->client, on_close_noop);
    if (w->server_open)
        uv_close((uv_handle_t *)&w->server, on_close_noop);
    if (w->accepted_open)
        uv_close((uv_handle_t *)&w->accepted, on_close_noop);
    for (int i = 0; i < 2000 && uv_loop_alive(&w->loop); i++) {
        uv_run(&w->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    ck_assert_int_eq(uv_loop_close(&w->loop), 0);
}

static int gone(const char *path)
{
    struct stat st;
    return stat(path, &st) != 0 && errno == ENOENT;
}

START_TEST(test_port_closed)
{
    struct world w;
    char path[108];
    world_start(&w, SERVER_NONE);
    snprintf(path, sizeof(path), "%s", tls_pump_path(w.pump));
    ck_assert(!gone(path));
    ck_assert_str_eq(tls_pump_error(w.pump), "");
    run_until_eof(&w);
    ck_assert(w.connected);
    ck_assert_int_eq(w.eof, 1);
    ck_assert_int_eq(w.reads, 0);
    ck_assert_msg(strstr(tls_pump_error(w.pump), "cannot connect to 127.0.0.1:") &&
                      strstr(tls_pump_error(w.pump), "connection refused"),
                  "%s", tls_pump_error(w.pump));
    ck_assert(!tls_pump_open(w.pump));
    /* the socket went once the one connection came in; its directory, made
     * once with the context (not per connection), stays until the last
     * pump and the context are gone */
    ck_assert(gone(path));
    *strrchr(path, '/') = '\0';
    ck_assert(!gone(path));
    world_end(&w);
    ck_assert(gone(path));
}
END_TEST

START_TEST(test_server_hangs_up)
{
    struct world w;
    world_start(&w, SERVER_HANG_UP);
    run_until_eof(&w);
    ck_assert_int_eq(w.eof, 1);
    ck_assert_msg(!strncmp(tls_pump_error(w.pump), "TLS: ", 5), "%s",
                  tls_pump_error(w.pump));
    world_end(&w);
}
END_TEST

START_TEST(test_server_speaks_no_tls)
{
    struct world w;
    world_start(&w, SERVER_PLAINTEXT);
    run_until_eof(&w);
    ck_assert_int_eq(w.eof, 1);
    ck_assert_int_eq(w.reads, 0); /* nothing of the reply reaches the client */
    ck_assert_msg(!strncmp(tls_pump_error(w.pump), "TLS: handshake failed: ", 23), "%s",
                  tls_pump_error(w.pump));
    world_end(&w);
}
END_TEST

START_TEST(test_server_silent)
{
    struct world w;
    world_start(&w, SERVER_SILENT);
    ck_assert_str_eq(tls_pump_stalled(w.pump), "connection timed out");
    for (int i = 0;
         i < 2000 && strcmp(tls_pump_stalled(w.pump), "TLS handshake timed out"); i++) {
        uv_run(&w.loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    ck_assert_str_eq(tls_pump_stalled(w.pump), "TLS handshake timed out");
    ck_assert_int_eq(w.eof, 0);
    ck_assert_str_eq(tls_pump_error(w.pump), "");
    world_end(&w);
}
END_TEST

/* Freed before the client's connect was even accepted, or while the name
 * lookup runs: no leak (ASan), nothing left on the loop, no directory left. */
START_TEST(test_free_early)
{
    struct world w;
    char path[108];
    world_start(&w, SERVER_SILENT);
    snprintf(path, sizeof(path), "%s", tls_pump_path(w.pump));
    world_end(&w);
    ck_assert(gone(path));
    *strrchr(path, '/') = '\0';
    ck_assert(gone(path));

    world_start(&w, SERVER_SILENT);
    for (int i = 0; i < 50 && tls_pump_path(w.pump)[0]; i++)
        uv_run(&w.loop, UV_RUN_NOWAIT); /* until accepted: the lookup starts */
    world_end(&w);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("tls_pump");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_ctx_errors);
    tcase_add_test(tc, test_port_closed);
    tcase_add_test(tc, test_server_hangs_up);
    tcase_add_test(tc, test_server_speaks_no_tls);
    tcase_add_test(tc, test_server_silent);
    tcase_add_test(tc, test_free_early);
    suite_add_tcase(s, tc);
    return s;
}
