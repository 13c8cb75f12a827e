/* rq_job.c -- RQ's job hash, key names and failure text (no I/O, no clock). */
#include "rq_job.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>
#include <cjson/cJSON.h>

#include "../util/alloc.h"
#include "../util/base64.h"

static const char *const key_fmt[] = {
    [RQ_KEY_QUEUE] = "rq:queue:%s",
    [RQ_KEY_JOB] = "rq:job:%s",
    [RQ_KEY_DEPENDENTS] = "rq:job:%s:dependents",
    [RQ_KEY_DEPENDENCIES] = "rq:job::%s:dependencies",
    [RQ_KEY_RESULTS] = "rq:results:%s",
    [RQ_KEY_STARTED] = "rq:wip:%s",
    [RQ_KEY_FINISHED] = "rq:finished:%s",
    [RQ_KEY_FAILED] = "rq:failed:%s",
    [RQ_KEY_DEFERRED] = "rq:deferred:%s",
    [RQ_KEY_SCHEDULED] = "rq:scheduled:%s",
    [RQ_KEY_WORKER] = "rq:worker:%s",
    [RQ_KEY_WORKERS_OF] = "rq:workers:%s",
    [RQ_KEY_PUBSUB] = "rq:pubsub:%s",
    [RQ_KEY_SCHED_LOCK] = "rq:scheduler-lock:%s",
    [RQ_KEY_EXECUTION] = "rq:execution:%s",
    [RQ_KEY_EXECUTIONS] = "rq:executions:%s",
};

int rq_key(char out[RQ_KEY_SIZE], enum rq_key_kind kind, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    out[0] = '\0';
    if (n == 0 || n > RQ_KEY_MAX_NAME ||
        (unsigned)kind >= sizeof(key_fmt) / sizeof(key_fmt[0]))
        return CR_EINVAL;
    snprintf(out, RQ_KEY_SIZE, key_fmt[kind], name);
    return 0;
}

void rq_ts_format(char out[RQ_TS_SIZE], int64_t epoch_us)
{
    time_t s = (time_t)(epoch_us / 1000000);
    long us = (long)(epoch_us % 1000000);
    struct tm tm;
    if (us < 0) {
        us += 1000000;
        s -= 1;
    }
    char tmp[96]; /* room for any int the compiler imagines */
    gmtime_r(&s, &tm);
    snprintf(tmp, sizeof(tmp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, us);
    memcpy(out, tmp, RQ_TS_SIZE - 1);
    out[RQ_TS_SIZE - 1] = '\0';
}

/* ------------------------------------------------------------ job hash */

static int field_is(const char *f, size_t n, const char *name)
{
    return n == strlen(name) && !memcmp(f, name, n);
}

/* A decimal long of n bytes, optionally signed; "" reads as absent (dflt). */
static int parse_long(const char *v, size_t n, long dflt, long *out)
{
    char tmp[32];
    char *end;
    if (n == 0) {
        *out = dflt;
        return 0;
    }
    if (n >= sizeof(tmp))
        return CR_EDECODE;
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    errno = 0;
    *out = strtol(tmp, &end, 10);
    return errno || end != tmp + n || (tmp[0] != '-' && (tmp[0] < '0' || tmp[0] > '9'))
               ? CR_EDECODE
               : 0;
}

/* retry_intervals as json.dumps writes a list of ints: "[1, 2]". */
static int parse_intervals(struct rq_job *j, const char *v, size_t n)
{
    size_t i = 0;
    j->nintervals = 0;
    if (n == 0)
        return 0;
    while (i < n && v[i] == ' ')
        i++;
    if (i >= n || v[i++] != '[')
        return CR_EDECODE;
    for (;;) {
        long x = 0;
        int digits = 0;
        while (i < n && v[i] == ' ')
            i++;
        if (i < n && v[i] == ']' && j->nintervals == 0) {
            i++;
            break;
        }
        while (i < n && v[i] >= '0' && v[i] <= '9') {
            if (x > (LONG_MAX - 9) / 10)
                return CR_EDECODE;
            x = x * 10 + (v[i++] - '0');
            digits++;
        }
        if (!digits || j->nintervals >= RQ_MAX_INTERVALS)
            return CR_EDECODE;
        j->intervals[j->nintervals++] = x;
        while (i < n && v[i] == ' ')
            i++;
        if (i < n && v[i] == ',') {
            i++;
            continue;
        }
        if (i < n && v[i] == ']') {
            i++;
            break;
        }
        return CR_EDECODE;
    }
    while (i < n && v[i] == ' ')
        i++;
    return i == n ? 0 : CR_EDECODE;
}

int rq_job_parse(struct rq_job *j, const char *const *field, const size_t *len, size_t n,
                 struct cr_err *err)
{
    int has_data = 0;
    memset(j, 0, sizeof(*j));
    j->origin = j->status = "";
    j->timeout_s = RQ_DEFAULT_TIMEOUT_S;
    j->result_ttl_s = -2;
    j->failure_ttl_s = -2;
    if (n % 2)
        return cr_err_set(err, CR_EDECODE, "job hash has an odd number of items");
    for (size_t i = 0; i < n; i += 2) {
        const char *f = field[i], *v = field[i + 1];
        size_t fn = len[i], vn = len[i + 1];
        int rc = 0;
        if (field_is(f, fn, "data")) {
            j->data = v;
            j->data_len = vn;
            has_data = 1;
        } else if (field_is(f, fn, "origin")) {
            j->origin = v;
            j->origin_len = vn;
        } else if (field_is(f, fn, "meta")) {
            j->meta = vn ? v : NULL;
            j->meta_len = vn;
        } else if (field_is(f, fn, "status")) {
            j->status = v;
            j->status_len = vn;
        } else if (field_is(f, fn, "timeout")) {
            rc = parse_long(v, vn, RQ_DEFAULT_TIMEOUT_S, &j->timeout_s);
        } else if (field_is(f, fn, "result_ttl")) {
            rc = parse_long(v, vn, -2, &j->result_ttl_s);
        } else if (field_is(f, fn, "failure_ttl")) {
            rc = parse_long(v, vn, -2, &j->failure_ttl_s);
        } else if (field_is(f, fn, "retries_left")) {
            rc = parse_long(v, vn, 0, &j->retries_left);
        } else if (field_is(f, fn, "retry_intervals")) {
            rc = parse_intervals(j, v, vn);
        } else if ((field_is(f, fn, "success_callback_name") ||
                    field_is(f, fn, "failure_callback_name") ||
                    field_is(f, fn, "stopped_callback_name")) &&
                   vn && !j->callback) {
            j->callback = v;
            j->callback_len = vn;
            j->callback_field = f[1] == 'u'   ? "on_success"
                                : f[0] == 'f' ? "on_failure"
                                              : "on_stopped";
        }
        if (rc)
            return cr_err_set(err, CR_EDECODE, "job field '%.*s' is malformed: '%.*s'",
                              (int)(fn > 40 ? 40 : fn), f, (int)(vn > 40 ? 40 : vn), v);
    }
    if (!has_data)
        return cr_err_set(err, CR_EDECODE, "job hash has no 'data' field");
    return 0;
}

int64_t rq_heartbeat_ttl(long timeout_s, int64_t elapsed_s, long interval_s)
{
    int64_t t = interval_s;
    if (timeout_s > 0) {
        int64_t left = (int64_t)timeout_s - elapsed_s;
        if (left < t)
            t = left;
    }
    return t + 60;
}

long rq_retry_interval(const struct rq_job *j)
{
    long i;
    if (j->nintervals == 0)
        return 0;
    i = (long)j->nintervals - j->retries_left;
    if (i < 0)
        i = 0;
    if (i >= j->nintervals)
        i = j->nintervals - 1;
    return j->intervals[i];
}

void rq_expiry_score(char out[32], int64_t now_s, long ttl_s, int inf_for_forever)
{
    if (ttl_s == -1)
        snprintf(out, 32, "%s", inf_for_forever ? "+inf" : "-1");
    else
        snprintf(out, 32, "%lld", (long long)(now_s + ttl_s));
}

/* ------------------------------------------------------------ failures */

int rq_exc_text(struct buf *out, const char *func, const char *exc_type,
                const char *message)
{
    size_t start;
    int rc = buf_printf(out,
                        "Traceback (most recent call last):\n"
                        "  File \"celeriac\", line 1, in %s\n"
                        "%s: ",
                        func && func[0] ? func : "<job>", exc_type);
    if (rc)
        return rc;
    start = out->len;
    if ((rc = buf_puts(out, message ? message : "")) || (rc = buf_putc(out, '\n')))
        return rc;
    for (size_t i = start; i + 1 < out->len; i++)
        if (out->data[i] == '\n' || out->data[i] == '\r')
            out->data[i] = ' ';
    return 0;
}

int rq_exc_string(struct buf *out, const char *text, size_t len)
{
    uLongf zn = compressBound((uLong)len);
    unsigned char *z = cr_malloc(zn ? zn : 1);
    int rc;
    if (!z)
        return CR_ENOMEM;
    if (compress2(z, &zn, (const Bytef *)text, (uLong)len, 6) != Z_OK) {
        cr_free(z);
        return CR_ENOMEM;
    }
    rc = base64_encode(z, zn, out);
    cr_free(z);
    return rc;
}

/* ------------------------------------------------------------ commands */

int rq_command_parse(const char *p, size_t n, struct rq_command *out, struct cr_err *err)
{
    cJSON *root = cJSON_ParseWithLength(p, n);
    const cJSON *cmd, *id;
    int rc = 0;
    memset(out, 0, sizeof(*out));
    if (!root || !cJSON_IsObject(root)) {
        rc = cr_err_set(err, CR_EDECODE, "command is not a JSON object");
        goto done;
    }
    cmd = cJSON_GetObjectItemCaseSensitive(root, "command");
    if (!cJSON_IsString(cmd)) {
        rc = cr_err_set(err, CR_EDECODE, "command has no \"command\" string");
        goto done;
    }
    if (!strcmp(cmd->valuestring, "shutdown")) {
        out->kind = RQ_CMD_SHUTDOWN;
    } else if (!strcmp(cmd->valuestring, "kill-horse")) {
        out->kind = RQ_CMD_KILL_HORSE;
    } else if (!strcmp(cmd->valuestring, "stop-job")) {
        size_t len;
        out->kind = RQ_CMD_STOP_JOB;
        id = cJSON_GetObjectItemCaseSensitive(root, "job_id");
        len = cJSON_IsString(id) ? strlen(id->valuestring) : 0;
        if (len == 0 || len > RQ_MAX_ID) {
            rc = cr_err_set(err, CR_EDECODE, "stop-job without a valid job_id");
            goto done;
        }
        memcpy(out->job_id, id->valuestring, len + 1);
    } else {
        rc = cr_err_set(err, CR_EDECODE, "unknown command '%.40s'", cmd->valuestring);
    }
done:
    cJSON_Delete(root);
    return rc;
}
