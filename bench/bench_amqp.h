/* bench_amqp.h -- blocking rabbitmq-c helpers shared by the benchmark tools (not the
 * worker). */
#ifndef CR_BENCH_AMQP_H
#define CR_BENCH_AMQP_H

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void bench_die_reply(amqp_rpc_reply_t r, const char *what)
{
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return;
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        fprintf(stderr, "%s: %s\n", what, amqp_error_string2(r.library_error));
    else
        fprintf(stderr, "%s: broker refused (method 0x%08x)\n", what,
                (unsigned)r.reply.id);
    exit(1);
}

/* Connects as guest to 127.0.0.1:port, vhost "/", and opens channel 1. */
static inline amqp_connection_state_t bench_connect(int port)
{
    amqp_connection_state_t conn = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(conn);
    if (!sock || amqp_socket_open(sock, "127.0.0.1", port) != AMQP_STATUS_OK) {
        fprintf(stderr, "cannot connect to 127.0.0.1:%d\n", port);
        exit(1);
    }
    bench_die_reply(
        amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest"),
        "login");
    amqp_channel_open(conn, 1);
    bench_die_reply(amqp_get_rpc_reply(conn), "channel.open");
    return conn;
}

/* Declares a queue the way Celery does (durable direct exchange of the same
 * name, durable queue, bound with its name). */
static inline void bench_declare(amqp_connection_state_t conn, const char *q)
{
    amqp_bytes_t name = amqp_cstring_bytes(q);
    amqp_exchange_declare(conn, 1, name, amqp_cstring_bytes("direct"), 0, 1, 0, 0,
                          amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "exchange.declare");
    amqp_queue_declare(conn, 1, name, 0, 1, 0, 0, amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "queue.declare");
    amqp_queue_bind(conn, 1, name, name, name, amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "queue.bind");
}

/* Messages ready in a queue (passive declare). */
static inline long bench_depth(amqp_connection_state_t conn, const char *q)
{
    amqp_queue_declare_ok_t *ok =
        amqp_queue_declare(conn, 1, amqp_cstring_bytes(q), 1, 0, 0, 0, amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "queue.declare passive");
    return ok ? (long)ok->message_count : -1;
}

static inline void bench_close(amqp_connection_state_t conn)
{
    amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
    amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn);
}

#endif
