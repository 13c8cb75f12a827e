/* fuzz_tracectx.c -- libFuzzer target: bytes -> traceparent (first line) and
 * tracestate (the rest) -> a span with the rest as its name and an attribute,
 * encoded as OTLP protobuf and JSON. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "protocol/span.h"
#include "protocol/tracectx.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *nl = memchr(p, '\n', size);
    size_t n = nl ? (size_t)(nl - p) : size;
    const char *rest = nl ? nl + 1 : p + size;
    size_t rn = size - (size_t)(rest - p);
    struct trace_ctx c, again;
    char tp[TRACEPARENT_LEN + 1], *text;
    struct otel_kv kv = {(char *)"service.name", (char *)"fuzz"};
    struct otlp_resource res = {&kv, 1, "fuzz", "0"};
    struct span *s;
    struct buf out;

    memset(&c, 0, sizeof(c));
    if (tracectx_parse_traceparent(&c, p, n) == 0) {
        /* what was read is written back as a version 00 value that reads
         * the same */
        tracectx_format_traceparent(&c, tp);
        memset(&again, 0, sizeof(again));
        if (tracectx_parse_traceparent(&again, tp, TRACEPARENT_LEN) != 0 ||
            memcmp(again.trace_id, c.trace_id, TRACE_ID_BYTES) != 0 ||
            memcmp(again.span_id, c.span_id, SPAN_ID_BYTES) != 0 ||
            again.flags != c.flags)
            abort();
    }
    if (tracectx_set_state(&c, rest, rn) == 0) {
        size_t k = strlen(c.state);
        if (k > TRACESTATE_MAX || strstr(c.state, ",,") || c.state[0] == ',' ||
            c.state[k - 1] == ',')
            abort();
        again = c;
        /* what is kept is kept as it is */
        if (tracectx_set_state(&again, c.state, k) != 0 || strcmp(again.state, c.state))
            abort();
    }
    text = malloc(rn + 1);
    if (!text)
        return 0;
    memcpy(text, rest, rn);
    text[rn] = '\0';
    s = span_new(text, SPAN_KIND_CLIENT, &c);
    if (s) {
        span_attr_str(s, "k", text);
        span_attr_str_list(s, "l", text);
        span_attr_int(s, "i", (int64_t)size - 100);
        span_set_status(s, SPAN_STATUS_ERROR, text);
        buf_init(&out);
        if (otlp_encode_proto(&res, &s, 1, &out) != 0)
            abort();
        buf_reset(&out);
        if (otlp_encode_json(&res, &s, 1, &out) == 0) {
            cJSON *doc = cJSON_ParseWithLength(out.data, out.len);
            if (!doc)
                abort(); /* whatever the input, the request is JSON */
            cJSON_Delete(doc);
        }
        buf_release(&out);
        span_free(s);
    }
    free(text);
    return 0;
}
