/* fuzz_rq_job.c -- libFuzzer target: what an RQ worker reads from Redis
 * besides the job data (protocol/rq_job.c): a job hash (HGETALL's fields and
 * values, here the input cut at NUL bytes) and a command published on its
 * pubsub channel (the input whole). The failure text is built from the input
 * too. Every call must return 0 or an error code and release cleanly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/rq_job.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_FIELDS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *f[MAX_FIELDS];
    size_t len[MAX_FIELDS], n = 0, start = 0;
    struct rq_job job;
    struct rq_command cmd;
    struct cr_err err;
    struct buf t, b;

    if (rq_command_parse((const char *)data, size, &cmd, &err) == 0 &&
        cmd.kind == RQ_CMD_STOP_JOB &&
        (cmd.job_id[0] == '\0' || strlen(cmd.job_id) > RQ_MAX_ID))
        abort();
    for (size_t i = 0; i <= size && n < MAX_FIELDS; i++) {
        if (i == size || data[i] == '\0') {
            f[n] = (const char *)data + start;
            len[n++] = i - start;
            start = i + 1;
        }
    }
    if (rq_job_parse(&job, f, len, n, &err) == 0) {
        if (!job.data || job.nintervals < 0 || job.nintervals > RQ_MAX_INTERVALS)
            abort();
        (void)rq_retry_interval(&job);
        (void)rq_heartbeat_ttl(job.timeout_s, 0, 30);
    }
    buf_init(&t);
    buf_init(&b);
    if (size < 4096) {
        char *msg = malloc(size + 1);
        if (!msg)
            return 0;
        memcpy(msg, data, size);
        msg[size] = '\0';
        if (rq_exc_text(&t, "f", "E", msg) == 0)
            (void)rq_exc_string(&b, t.data, t.len);
        free(msg);
    }
    buf_release(&t);
    buf_release(&b);
    return 0;
}
