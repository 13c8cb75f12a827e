/* rq_state.c -- an RQ job's state as a Celery result meta (no I/O, no clock). */
#include "rq_state.h"

#include <string.h>
#include <cjson/cJSON.h>

#include "isotime.h"
#include "result.h"
#include "../util/alloc.h"
#include "../util/base64.h"
#include "../util/buf.h"
#include "../util/err.h"

static int is(const char *s, size_t n, const char *lit)
{
    return s && n == strlen(lit) && !memcmp(s, lit, n);
}

const char *rq_status_state(const char *status, size_t len)
{
    static const struct {
        const char *rq, *celery;
    } map[] = {
        {"queued", "PENDING"},  {"deferred", "PENDING"}, {"scheduled", "PENDING"},
        {"created", "PENDING"}, {"started", "STARTED"},  {"finished", "SUCCESS"},
        {"failed", "FAILURE"},  {"stopped", "REVOKED"},  {"canceled", "REVOKED"},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (is(status, len, map[i].rq))
            return map[i].celery;
    return NULL;
}

/* ------------------------------------------------------------ tracebacks */

static int name_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static int name_char(char c)
{
    return name_start(c) || (c >= '0' && c <= '9') || c == '.';
}

void rq_exc_parse(const char *text, size_t len, struct rq_exc *out)
{
    static const char header[] = "Traceback (most recent call last):";
    size_t start = 0, i, end;

    memset(out, 0, sizeof(*out));
    if (!text)
        len = 0;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    /* The exception after the last header (a chained one comes last), past
     * its frames, which Python indents. */
    for (i = 0; i < len; i = end + 1) {
        const char *nl = memchr(text + i, '\n', len - i);
        end = nl ? (size_t)(nl - text) : len;
        if (end - i >= sizeof(header) - 1 &&
            !memcmp(text + i, header, sizeof(header) - 1))
            start = end + 1;
    }
    while (start < len && (text[start] == ' ' || text[start] == '\t')) {
        const char *nl = memchr(text + start, '\n', len - start);
        start = nl ? (size_t)(nl - text) + 1 : len;
    }
    if (start > len)
        start = len;
    i = start;
    if (i < len && name_start(text[i])) {
        while (i < len && name_char(text[i]))
            i++;
        if (text[i - 1] != '.' && (i == len || text[i] == ':' || text[i] == '\n')) {
            const char *dot = NULL;
            for (size_t k = start; k < i; k++)
                if (text[k] == '.')
                    dot = text + k;
            out->type = dot ? dot + 1 : text + start;
            out->type_len = (size_t)(text + i - out->type);
            if (dot) {
                out->module = text + start;
                out->module_len = (size_t)(dot - out->module);
            }
            if (i < len && (text[i] == ':' || text[i] == '\n'))
                i++;
            if (i < len && text[i] == ' ')
                i++;
            out->message = text + i;
            out->message_len = len - i;
            return;
        }
    }
    out->type = "Exception";
    out->type_len = 9;
    out->message = text ? text + start : "";
    out->message_len = len - start;
}

/* -------------------------------------------------------------- decoding */

/* base64 text of n bytes into b, within lim's stored size. 0, CR_ETOOBIG,
 * CR_EDECODE or CR_ENOMEM. */
static int unbase64(const char *s, size_t n, const struct rq_limits *lim, struct buf *b)
{
    long got;
    if (n / 4 * 3 > lim->max_data_bytes)
        return CR_ETOOBIG;
    if (buf_reserve(b, n / 4 * 3 + 2))
        return CR_ENOMEM;
    got = base64_decode(s, n, (unsigned char *)b->data, 0);
    if (got < 0)
        return CR_EDECODE;
    b->len = (size_t)got;
    b->data[b->len] = '\0';
    return 0;
}

/* A return_value as plain data in *v (NULL when it cannot be read). Only
 * CR_ENOMEM is an error. */
static int load_value(const struct rq_state_in *in, const struct rq_limits *lim,
                      cJSON **v)
{
    struct buf b;
    struct cr_err err = {0};
    int rc;
    *v = NULL;
    buf_init(&b);
    rc = unbase64(in->value, in->value_len, lim, &b);
    if (rc == 0 && b.len) {
        enum rq_serializer ser =
            (unsigned char)b.data[0] == 0x80 ? RQ_SERIALIZER_PICKLE : RQ_SERIALIZER_JSON;
        rc = rq_value_loads(b.data, b.len, ser, lim, v, &err);
    }
    buf_release(&b);
    return rc == CR_ENOMEM ? rc : 0;
}

/* The traceback text into t (empty when there is none or it cannot be
 * read): the newest entry's exc_string when it is a failure, else the
 * hash's exc_info. Only CR_ENOMEM is an error. */
static int load_traceback(const struct rq_state_in *in, const struct rq_limits *lim,
                          struct buf *t)
{
    struct buf z;
    struct cr_err err = {0};
    const char *p = in->exc_info;
    size_t n = in->exc_info_len;
    int rc = 0;

    buf_init(&z);
    if (is(in->type, in->type_len, "2") && in->value && in->value_len) {
        rc = unbase64(in->value, in->value_len, lim, &z);
        p = z.data;
        n = z.len;
    }
    if (rc == 0 && p && n) {
        if (n > lim->max_data_bytes)
            rc = CR_ETOOBIG;
        else
            rc = rq_data_inflate(p, n, lim, t, &err);
    }
    buf_release(&z);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc)
        buf_reset(t);
    return 0;
}

/* {"exc_type", "exc_message": [message][, "exc_module"]} of a traceback,
 * named as the RQ worker's progress stream names it. NULL on OOM. */
static cJSON *exc_result(const char *text, size_t len)
{
    struct rq_exc x;
    char *type, *module = NULL, *msg;
    cJSON *o = NULL;

    rq_exc_parse(text, len, &x);
    type = cr_strndup(x.type, x.type_len);
    msg = cr_strndup(x.message, x.message_len);
    if (x.module)
        module = cr_strndup(x.module, x.module_len);
    if (type && msg && (module || !x.module)) {
        o = result_exc_new(type, module, msg);
        if (o && !module)
            cJSON_DeleteItemFromObjectCaseSensitive(o, "exc_module");
    }
    cr_free(type);
    cr_free(module);
    cr_free(msg);
    return o;
}

/* ---------------------------------------------------------------- metas */

int rq_state_meta(const struct rq_state_in *in, const struct rq_limits *lim, char **out,
                  size_t *len)
{
    const char *state = rq_status_state(in->status, in->status_len);
    struct result_meta m;
    struct buf tb;
    cJSON *result = NULL;
    int ready, rc = 0;

    *out = NULL;
    *len = 0;
    if (!state)
        return 0;
    memset(&m, 0, sizeof(m));
    m.task_id = in->task_id;
    m.status = state;
    m.date_done_us = -1;
    buf_init(&tb);
    ready = !strcmp(state, "SUCCESS") || !strcmp(state, "FAILURE") ||
            !strcmp(state, "REVOKED");
    if (ready && in->ended_at && in->ended_at_len && in->ended_at_len < 64) {
        char ts[64];
        int64_t us;
        memcpy(ts, in->ended_at, in->ended_at_len);
        ts[in->ended_at_len] = '\0';
        if (iso8601_parse(ts, &us) == 0)
            m.date_done_us = us;
    }
    if (!strcmp(state, "SUCCESS")) {
        if (is(in->type, in->type_len, "1") && in->value && in->value_len)
            rc = load_value(in, lim, &result);
    } else if (ready) {
        rc = load_traceback(in, lim, &tb);
        if (rc == 0 && tb.len) {
            result = exc_result(tb.data, tb.len);
            if (!result)
                rc = CR_ENOMEM;
            m.traceback = tb.data;
        }
    }
    if (rc == 0) {
        m.result = result;
        *out = result_meta_encode(&m);
        if (*out)
            *len = strlen(*out);
        else
            rc = CR_ENOMEM;
    }
    cJSON_Delete(result);
    buf_release(&tb);
    return rc;
}

int rq_state_hold(const struct rq_state_in *in, const char *stream_state,
                  size_t stream_len, int64_t now_us)
{
    char ts[64];
    int64_t ended_us, d;
    if (!(is(in->status, in->status_len, "finished") ||
          is(in->status, in->status_len, "failed") ||
          is(in->status, in->status_len, "stopped")))
        return 0;
    if (!stream_state || is(stream_state, stream_len, "SUCCESS") ||
        is(stream_state, stream_len, "FAILURE") ||
        is(stream_state, stream_len, "REVOKED"))
        return 0;
    if (!in->ended_at || !in->ended_at_len || in->ended_at_len >= sizeof(ts))
        return 0;
    memcpy(ts, in->ended_at, in->ended_at_len);
    ts[in->ended_at_len] = '\0';
    if (iso8601_parse(ts, &ended_us))
        return 0;
    d = now_us - ended_us;
    return d > -(int64_t)RQ_STATE_HOLD_MS * 1000 && d < (int64_t)RQ_STATE_HOLD_MS * 1000;
}
