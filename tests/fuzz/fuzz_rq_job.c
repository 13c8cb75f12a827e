/* fuzz_rq_job.c -- libFuzzer target: what an RQ worker reads from Redis
 * besides the job data (protocol/rq_job.c): a job hash (HGETALL's fields and
 * values, here the input cut at NUL bytes) and a command published on its
 * pubsub channel (the input whole). The failure text is built from the input
 * too. The gateway's reading of a job (protocol/rq_state.c) takes the first
 * pieces as status, ended_at, result type, result value and exc_info, and
 * the input whole as a traceback. Every call must return 0 or an error code
 * and release cleanly. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/rq_job.h"
#include "protocol/rq_state.h"
#include "util/alloc.h"
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
    {
        struct rq_state_in in;
        struct rq_limits lim;
        struct rq_exc x;
        char *meta = NULL;
        size_t mlen = 0;
        memset(&in, 0, sizeof(in));
        in.task_id = "fuzz";
        in.status = n > 0 ? f[0] : NULL;
        in.status_len = n > 0 ? len[0] : 0;
        in.ended_at = n > 1 ? f[1] : NULL;
        in.ended_at_len = n > 1 ? len[1] : 0;
        in.type = n > 2 ? f[2] : NULL;
        in.type_len = n > 2 ? len[2] : 0;
        in.value = n > 3 ? f[3] : NULL;
        in.value_len = n > 3 ? len[3] : 0;
        in.exc_info = n > 4 ? f[4] : NULL;
        in.exc_info_len = n > 4 ? len[4] : 0;
        rq_limits_init(&lim);
        lim.max_inflated_bytes = 1 << 20;
        if (rq_state_meta(&in, &lim, &meta, &mlen) == 0 && meta &&
            (mlen != strlen(meta) || !rq_status_state(in.status, in.status_len)))
            abort();
        cr_free(meta);
        (void)rq_state_hold(&in, n > 5 ? f[5] : NULL, n > 5 ? len[5] : 0, 0);
        rq_exc_parse((const char *)data, size, &x);
        if (x.type_len == 0 ||
            (x.message_len && (x.message < (const char *)data ||
                               x.message + x.message_len > (const char *)data + size)))
            abort();
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
