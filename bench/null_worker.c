/* null_worker.c -- the latency floor: a worker that does nothing but store SUCCESS and
 * ack.
 *
 *   build/bench/null_worker AMQP_PORT QUEUE REDIS_PORT DB SECONDS
 *
 * Consumes QUEUE (prefetch 1), reads the task id from each message's
 * headers, stores {"status": "SUCCESS", "result": null, ...} with SETEX and
 * PUBLISH as Celery's Redis backend does, then acks. Blocking calls, one
 * message at a time: no real worker can answer a round trip faster, so the
 * latency benchmark subtracts this from every worker's figure. Prints "ready."
 * once consuming and stops after SECONDS. */
#include <hiredis/hiredis.h>

#include "bench_amqp.h"

static int find_id(const amqp_basic_properties_t *p, char *id, size_t size)
{
    if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
        return -1;
    for (int i = 0; i < p->headers.num_entries; i++) {
        const amqp_table_entry_t *e = &p->headers.entries[i];
        if (e->key.len == 2 && !memcmp(e->key.bytes, "id", 2) &&
            e->value.kind == AMQP_FIELD_KIND_UTF8 && e->value.value.bytes.len < size) {
            memcpy(id, e->value.value.bytes.bytes, e->value.value.bytes.len);
            id[e->value.value.bytes.len] = '\0';
            return 0;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    amqp_connection_state_t conn;
    redisContext *rc;
    double secs, t0;
    long n = 0;

    if (argc != 6) {
        fprintf(stderr, "usage: null_worker AMQP_PORT QUEUE REDIS_PORT DB SECONDS\n");
        return 2;
    }
    secs = strtod(argv[5], NULL);
    rc = redisConnect("127.0.0.1", (int)strtol(argv[3], NULL, 10));
    if (!rc || rc->err) {
        fprintf(stderr, "null_worker: cannot connect to redis\n");
        return 1;
    }
    freeReplyObject(redisCommand(rc, "SELECT %s", argv[4]));
    conn = bench_connect((int)strtol(argv[1], NULL, 10));
    bench_declare(conn, argv[2]);
    amqp_basic_qos(conn, 1, 0, 1, 0);
    bench_die_reply(amqp_get_rpc_reply(conn), "basic.qos");
    amqp_basic_consume(conn, 1, amqp_cstring_bytes(argv[2]), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    bench_die_reply(amqp_get_rpc_reply(conn), "basic.consume");
    printf("null_worker ready.\n");
    fflush(stdout);
    t0 = bench_now();
    while (bench_now() - t0 < secs) {
        amqp_envelope_t env;
        struct timeval tv = {0, 200000};
        amqp_rpc_reply_t r;
        char id[128], key[160], meta[400];
        amqp_maybe_release_buffers(conn);
        r = amqp_consume_message(conn, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT)
            continue;
        bench_die_reply(r, "consume");
        if (find_id(&env.message.properties, id, sizeof(id)) == 0) {
            snprintf(key, sizeof(key), "celery-task-meta-%s", id);
            snprintf(meta, sizeof(meta),
                     "{\"status\": \"SUCCESS\", \"result\": null, \"traceback\": null, "
                     "\"children\": [], \"date_done\": null, \"task_id\": \"%s\"}",
                     id);
            redisAppendCommand(rc, "SETEX %s 86400 %s", key, meta);
            redisAppendCommand(rc, "PUBLISH %s %s", key, meta);
            for (int i = 0; i < 2; i++) {
                void *reply = NULL;
                if (redisGetReply(rc, &reply) != REDIS_OK) {
                    fprintf(stderr, "null_worker: redis: %s\n", rc->errstr);
                    return 1;
                }
                freeReplyObject(reply);
            }
        }
        amqp_basic_ack(conn, 1, env.delivery_tag, 0);
        amqp_destroy_envelope(&env);
        n++;
    }
    bench_close(conn);
    redisFree(rc);
    printf("null_worker: %ld messages\n", n);
    return 0;
}
