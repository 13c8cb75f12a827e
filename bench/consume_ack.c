/* consume_ack.c -- the broker's limit: a bare rabbitmq-c consume-and-ack loop, no work at
 * all.
 *
 *   build/bench/consume_ack PORT QUEUE COUNT PREFETCH [ACK_EVERY]
 *
 * Consumes COUNT pre-published messages with basic.qos PREFETCH and acks each
 * one (ACK_EVERY 1, the default) or every ACK_EVERY-th with multiple=1. The
 * clock runs from basic.consume to the broker's answer to an RPC sent after
 * the last ack (acks are handled in order, so by then all are done). Gives up
 * after 120 s. Prints "consumed N in S s (R msg/s)". */
#include "bench_amqp.h"

int main(int argc, char **argv)
{
    amqp_connection_state_t conn;
    long count, got = 0, every = 1;
    int prefetch;
    double t0, t1;
    uint64_t last_tag = 0;

    if (argc < 5) {
        fprintf(stderr, "usage: consume_ack PORT QUEUE COUNT PREFETCH [ACK_EVERY]\n");
        return 2;
    }
    count = strtol(argv[3], NULL, 10);
    prefetch = (int)strtol(argv[4], NULL, 10);
    if (argc > 5)
        every = strtol(argv[5], NULL, 10);
    if (prefetch > 65535)
        prefetch = 65535;
    conn = bench_connect((int)strtol(argv[1], NULL, 10));
    amqp_basic_qos(conn, 1, 0, (uint16_t)prefetch, 0);
    bench_die_reply(amqp_get_rpc_reply(conn), "basic.qos");
    t0 = bench_now();
    amqp_basic_consume(conn, 1, amqp_cstring_bytes(argv[2]), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "basic.consume");
    while (got < count) {
        amqp_envelope_t env;
        struct timeval tv = {1, 0};
        amqp_rpc_reply_t r;
        amqp_maybe_release_buffers(conn);
        r = amqp_consume_message(conn, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT) {
            if (bench_now() - t0 > 120) {
                fprintf(stderr, "consume_ack: timed out after %ld messages\n", got);
                return 1;
            }
            continue;
        }
        bench_die_reply(r, "consume");
        got++;
        last_tag = env.delivery_tag;
        if (every <= 1)
            amqp_basic_ack(conn, 1, env.delivery_tag, 0);
        else if (got % every == 0)
            amqp_basic_ack(conn, 1, env.delivery_tag, 1);
        amqp_destroy_envelope(&env);
    }
    if (every > 1 && got % every)
        amqp_basic_ack(conn, 1, last_tag, 1);
    /* Any synchronous method will do as a barrier behind the acks. */
    amqp_basic_qos(conn, 1, 0, (uint16_t)prefetch, 0);
    bench_die_reply(amqp_get_rpc_reply(conn), "basic.qos barrier");
    t1 = bench_now();
    bench_close(conn);
    printf("consumed %ld in %.3f s (%.0f msg/s)\n", got, t1 - t0,
           (double)got / (t1 - t0));
    return 0;
}
