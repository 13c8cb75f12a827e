/* fuzz_celery_msg.c -- libFuzzer target: arbitrary bytes through celery_msg_decode.
 *
 * Build (from the repo root):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_celery_msg.c \
 *       protocol/celery_msg.c protocol/pyjson.c protocol/isotime.c protocol/rmq_json.c \
 *       util/alloc.c util/buf.c util/err.c -lcjson -lrabbitmq -lm
 * Run:
 *   ./a.out -max_total_time=60 tests/fuzz/corpus/celery_msg/
 *
 * Input layout: the first byte picks the mode.
 *   bit 0 clear: the rest is the body, with fixed v2 headers.
 *   bit 0 set:   the rest is split at the first NUL: the part before is parsed as
 *                the headers object (if it is not JSON, no headers are passed), the
 *                part after is the body. So inputs can reach v1, hybrid and every
 *                header check.
 *   bit 1 set:   content type "application/json; charset=utf-8" instead of none.
 * Every successful decode is re-encoded and the result decoded again, which must
 * succeed: encode_v2 has to produce what decode accepts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/celery_msg.h"
#include "protocol/result.h"
#include "util/alloc.h"

static const char fixed_headers[] =
    "{\"lang\": \"py\", \"task\": \"proj.add\", \"id\": \"6d39b888\", \"shadow\": null, "
    "\"eta\": null, \"expires\": null, \"group\": null, \"group_index\": null, "
    "\"retries\": 0, \"timelimit\": [null, null], \"root_id\": \"6d39b888\", "
    "\"parent_id\": null, \"argsrepr\": \"(2, 2)\", \"kwargsrepr\": \"{}\", "
    "\"origin\": \"gen1@host\", \"ignore_result\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Equal as Python would write them (cJSON_Compare says NaN != NaN). */
static int same(const cJSON *a, const cJSON *b)
{
    struct buf x, y;
    int eq;
    buf_init(&x);
    buf_init(&y);
    eq = py_json_dumps(a, &x) == 0 && py_json_dumps(b, &y) == 0 && x.len == y.len &&
         memcmp(x.data, y.data, x.len) == 0;
    buf_release(&x);
    buf_release(&y);
    return eq;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct celery_raw_msg raw;
    struct task_msg m;
    struct cr_err err;
    cJSON *headers = NULL;
    const char *body;
    size_t body_len;
    uint8_t mode;

    if (size < 1)
        return 0;
    cr_alloc_init();
    mode = data[0];
    body = (const char *)data + 1;
    body_len = size - 1;
    if (mode & 1) {
        const char *nul = memchr(body, '\0', body_len);
        size_t hlen = nul ? (size_t)(nul - body) : body_len;
        if (py_json_parse(body, hlen, &headers, NULL) != 0)
            headers = NULL;
        body = nul ? nul + 1 : body + body_len;
        body_len = nul ? body_len - hlen - 1 : 0;
    } else {
        py_json_parse(fixed_headers, sizeof(fixed_headers) - 1, &headers, NULL);
    }

    memset(&raw, 0, sizeof(raw));
    raw.content_type = (mode & 2) ? "application/json; charset=utf-8" : NULL;
    raw.headers = headers;
    raw.correlation_id = "6d39b888";
    raw.delivery_mode = 2;
    raw.body = body;
    raw.body_len = body_len;

    task_msg_init(&m);
    if (celery_msg_decode(&raw, &m, &err) == 0) {
        struct buf out;
        cJSON *h2 = NULL;
        buf_init(&out);
        if (celery_msg_encode_v2(&m, &out, &h2) == 0) {
            struct celery_raw_msg raw2 = raw;
            struct task_msg m2;
            int rc;
            raw2.headers = h2;
            raw2.body = out.data;
            raw2.body_len = out.len;
            task_msg_init(&m2);
            rc = celery_msg_decode(&raw2, &m2, &err);
            /* Our own output must decode to the same task. The one exception:
             * v1 callbacks move one level down into embed, so a v1 body that
             * was exactly at the depth limit is one level too deep as v2. */
            if (rc != 0 && !(m.proto == 1 && rc == CR_EDECODE))
                abort();
            if (rc == 0 && (strcmp(m2.id, m.id) != 0 || strcmp(m2.task, m.task) != 0 ||
                            !same(m2.args, m.args) || !same(m2.kwargs, m.kwargs)))
                abort();
            task_msg_release(&m2);
            cJSON_Delete(h2);
        }
        buf_release(&out);
    }
    task_msg_release(&m);
    cJSON_Delete(headers);
    return 0;
}
