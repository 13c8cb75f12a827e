/* fuzz_rq_data.c -- libFuzzer target: arbitrary bytes as an RQ job's stored
 * data (protocol/rq_data.c), as they reach the worker from Redis.
 *
 * Every input goes whole to rq_data_decode (inflate, then the restricted
 * pickle reader or the JSON form) and to rq_pickle_loads and the JSON
 * rq_value_loads directly. Whatever decodes is written again with
 * rq_pickle_dumps (and the JSON serializer) and read back, which must give
 * the same JSON text. Every call must return 0 or an error code, bounded in
 * time and memory, and release cleanly (ASan/LSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/pyjson.h"
#include "protocol/rq_data.h"
#include "util/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct rq_limits lim;

static char *text(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    if (py_json_dumps(v, &b) != 0)
        abort();
    return buf_detach(&b);
}

/* v written in ser and read back must be the same JSON. */
static void round_trip(const cJSON *v, enum rq_serializer ser)
{
    struct buf out;
    struct cr_err err;
    cJSON *back = NULL;
    char *a, *b;
    buf_init(&out);
    if (rq_value_dumps(v, ser, &out) != 0)
        abort();
    if (rq_value_loads(out.data, out.len, ser, &lim, &back, &err) != 0) {
        /* JSON text nests one level less than a pickle may hold strings
         * deep; only the pickle form must always come back. */
        if (ser == RQ_SERIALIZER_PICKLE)
            abort();
        buf_release(&out);
        return;
    }
    a = text(v);
    b = text(back);
    if (ser == RQ_SERIALIZER_PICKLE && strcmp(a, b) != 0)
        abort();
    cr_free(a);
    cr_free(b);
    cJSON_Delete(back);
    buf_release(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    struct rq_call call;
    struct cr_err err;
    cJSON *v = NULL;
    if (!init) {
        cr_alloc_init();
        rq_limits_init(&lim);
        /* Small enough for a fast run, large enough for every path. */
        lim.max_inflated_bytes = 1 << 20;
        lim.max_values = 100000;
        init = 1;
    }
    if (rq_data_decode(data, size, &lim, &call, &err) == 0) {
        if (!call.func_name || !cJSON_IsArray(call.args) || !cJSON_IsObject(call.kwargs))
            abort();
        round_trip(call.args, RQ_SERIALIZER_PICKLE);
        round_trip(call.kwargs, RQ_SERIALIZER_PICKLE);
        round_trip(call.kwargs, RQ_SERIALIZER_JSON);
        rq_call_release(&call);
    } else if (call.func_name || call.args || call.kwargs) {
        abort();
    }
    if (rq_pickle_loads(data, size, &lim, &v, &err) == 0) {
        round_trip(v, RQ_SERIALIZER_PICKLE);
        cJSON_Delete(v);
    } else if (v != NULL) {
        abort();
    }
    if (rq_value_loads(data, size, RQ_SERIALIZER_JSON, &lim, &v, &err) == 0) {
        round_trip(v, RQ_SERIALIZER_PICKLE);
        cJSON_Delete(v);
    }
    return 0;
}
