/* publish.c -- pre-publishes N Celery protocol-2 task messages, fast, for the benchmarks.
 *
 *   build/bench/publish PORT QUEUE COUNT TASK ARGS_JSON KWARGS_JSON
 *   build/bench/publish PORT QUEUE purge
 *
 * Messages are what Celery 5's apply_async sends (headers, properties and
 * body), persistent, each with a fresh task id, so both the Python worker and
 * celeriac take them as their own. No publisher confirms: at the end the
 * queue depth is polled until every message is there (bounded in time).
 * Prints "published N in S s (R msg/s)". */
#include <stdint.h>
#include <unistd.h>

#include "bench_amqp.h"

#define ENTRIES 16

static amqp_table_entry_t str_entry(const char *k, const char *v)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(v);
    return e;
}

static amqp_table_entry_t void_entry(const char *k)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(k);
    e.value.kind = AMQP_FIELD_KIND_VOID;
    return e;
}

int main(int argc, char **argv)
{
    amqp_connection_state_t conn;
    const char *queue, *task, *args, *kwargs;
    long count, depth = 0, base;
    char id[40], body[8192], origin[64];
    amqp_table_entry_t h[ENTRIES];
    amqp_field_value_t tl[2];
    uint64_t run;
    double t0, t1;
    int n;

    if (argc == 4 && !strcmp(argv[3], "purge")) {
        conn = bench_connect((int)strtol(argv[1], NULL, 10));
        bench_declare(conn, argv[2]);
        amqp_queue_purge(conn, 1, amqp_cstring_bytes(argv[2]));
        bench_die_reply(amqp_get_rpc_reply(conn), "queue.purge");
        bench_close(conn);
        return 0;
    }
    if (argc != 7) {
        fprintf(stderr, "usage: publish PORT QUEUE COUNT TASK ARGS_JSON KWARGS_JSON\n"
                        "       publish PORT QUEUE purge\n");
        return 2;
    }
    queue = argv[2];
    count = strtol(argv[3], NULL, 10);
    task = argv[4];
    args = argv[5];
    kwargs = argv[6];
    n = snprintf(body, sizeof(body),
                 "[%s, %s, {\"callbacks\": null, \"errbacks\": null, \"chain\": null, "
                 "\"chord\": null}]",
                 args, kwargs);
    if (n < 0 || (size_t)n >= sizeof(body)) {
        fprintf(stderr, "publish: arguments too long\n");
        return 2;
    }
    snprintf(origin, sizeof(origin), "%d@bench", (int)getpid());
    run = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);

    conn = bench_connect((int)strtol(argv[1], NULL, 10));
    bench_declare(conn, queue);
    base = bench_depth(conn, queue);
    t0 = bench_now();
    for (long i = 0; i < count; i++) {
        amqp_basic_properties_t p;
        amqp_table_t headers;
        int k = 0;
        /* uuid-shaped, unique per run and message */
        snprintf(id, sizeof(id), "%08x-%04x-4%03x-8%03x-%012lx", (unsigned)(run >> 32),
                 (unsigned)(run & 0xffff), (unsigned)((run >> 16) & 0xfff),
                 (unsigned)(i >> 48 & 0xfff), (unsigned long)(i & 0xffffffffffffL));
        h[k++] = str_entry("lang", "py");
        h[k++] = str_entry("task", task);
        h[k++] = str_entry("id", id);
        h[k++] = void_entry("shadow");
        h[k++] = void_entry("eta");
        h[k++] = void_entry("expires");
        h[k++] = void_entry("group");
        h[k++] = void_entry("group_index");
        h[k].key = amqp_cstring_bytes("retries");
        h[k].value.kind = AMQP_FIELD_KIND_I64;
        h[k++].value.value.i64 = 0;
        tl[0].kind = tl[1].kind = AMQP_FIELD_KIND_VOID;
        h[k].key = amqp_cstring_bytes("timelimit");
        h[k].value.kind = AMQP_FIELD_KIND_ARRAY;
        h[k].value.value.array.num_entries = 2;
        h[k++].value.value.array.entries = tl;
        h[k++] = str_entry("root_id", id);
        h[k++] = void_entry("parent_id");
        h[k++] = str_entry("argsrepr", "()");
        h[k++] = str_entry("kwargsrepr", "{}");
        h[k++] = str_entry("origin", origin);
        h[k].key = amqp_cstring_bytes("ignore_result");
        h[k].value.kind = AMQP_FIELD_KIND_BOOLEAN;
        h[k++].value.value.boolean = 0;
        headers.num_entries = k;
        headers.entries = h;

        memset(&p, 0, sizeof(p));
        p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                   AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_PRIORITY_FLAG |
                   AMQP_BASIC_CORRELATION_ID_FLAG | AMQP_BASIC_REPLY_TO_FLAG |
                   AMQP_BASIC_HEADERS_FLAG;
        p.content_type = amqp_cstring_bytes("application/json");
        p.content_encoding = amqp_cstring_bytes("utf-8");
        p.delivery_mode = 2;
        p.priority = 0;
        p.correlation_id = amqp_cstring_bytes(id);
        p.reply_to = amqp_cstring_bytes("bench-reply");
        p.headers = headers;
        if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(queue),
                               amqp_cstring_bytes(queue), 0, 0, &p,
                               amqp_cstring_bytes(body)) != AMQP_STATUS_OK) {
            fprintf(stderr, "publish: failed at message %ld\n", i);
            return 1;
        }
    }
    /* Everything sent; wait (at most 60 s) until the broker has it all. */
    for (int tries = 0; tries < 6000; tries++) {
        depth = bench_depth(conn, queue);
        if (depth >= base + count)
            break;
        usleep(10000);
    }
    t1 = bench_now();
    bench_close(conn);
    printf("published %ld in %.3f s (%.0f msg/s), queue depth %ld\n", count, t1 - t0,
           (double)count / (t1 - t0), depth);
    return depth >= base + count ? 0 : 1;
}
