/* rq_data_tool.c -- protocol/rq_data.c on stdin lines, for the cross-check
 * against CPython (tests/integration/test_rq_data_python.py).
 *
 *   rq_data_tool loads   each line: hex of a pickle -> its JSON, or "!<error>"
 *   rq_data_tool dumps   each line: JSON text -> hex of rq_pickle_dumps(), or "!<error>"
 *   rq_data_tool json    each line: JSON text -> rq_value_dumps() in the JSON serializer
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/pyjson.h"
#include "protocol/rq_data.h"
#include "util/alloc.h"
#include "util/hex.h"

/* By hand: sscanf("%2x") measures the whole rest of the line on every call,
 * which made a 2.4 MB batch take 8 s. */
static int unhex(const char *s, size_t n, unsigned char *out)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        int hi = cr_hexval(s[i]), lo = cr_hexval(s[i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i / 2] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct rq_limits lim;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    const char *mode = argc > 1 ? argv[1] : "";
    cr_alloc_init();
    rq_limits_init(&lim);
    if (strcmp(mode, "loads") && strcmp(mode, "dumps") && strcmp(mode, "json")) {
        fprintf(stderr, "usage: rq_data_tool loads|dumps|json <lines\n");
        return 2;
    }
    while ((n = getline(&line, &cap, stdin)) > 0) {
        struct cr_err err = {0};
        struct buf out;
        cJSON *v = NULL;
        int rc;
        if (line[n - 1] == '\n')
            line[--n] = '\0';
        buf_init(&out);
        if (strcmp(mode, "loads") == 0) {
            unsigned char *p = malloc((size_t)n / 2 + 1);
            rc = p ? unhex(line, (size_t)n, p) : CR_ENOMEM;
            if (rc == 0)
                rc = rq_pickle_loads(p, (size_t)n / 2, &lim, &v, &err);
            if (rc == 0)
                rc = py_json_dumps(v, &out);
            free(p);
        } else {
            rc = py_json_parse(line, (size_t)n, &v, &err);
            if (rc == 0 && strcmp(mode, "json") == 0)
                rc = rq_value_dumps(v, RQ_SERIALIZER_JSON, &out);
            else if (rc == 0) {
                struct buf bin;
                buf_init(&bin);
                rc = rq_pickle_dumps(v, &bin);
                for (size_t i = 0; rc == 0 && i < bin.len; i++)
                    rc = buf_printf(&out, "%02x", (unsigned char)bin.data[i]);
                buf_release(&bin);
            }
        }
        if (rc == 0)
            printf("%s\n", out.data ? out.data : "");
        else
            printf("!%d %s\n", rc, err.msg);
        cJSON_Delete(v);
        buf_release(&out);
    }
    free(line);
    return 0;
}
