/* gw_msg.c -- gateway routing, validation, Celery message building and JSON
 * replies (no I/O). */
#include "gw_msg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "protocol/isotime.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/pct.h"

int gw_error_set(struct gw_error *e, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    if (!e)
        return CR_EINVAL;
    e->status = status;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return CR_EINVAL;
}

int gw_json_str(struct buf *out, const char *s, size_t len)
{
    size_t start = out->len;
    size_t i = 0;
    if (buf_putc(out, '"'))
        return CR_ENOMEM;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        int rc = 0;
        if (c >= 0x80) {
            uint32_t cp;
            size_t n = py_utf8_next(s + i, len - i, &cp);
            if (n == 0) {
                rc = buf_puts(out, "\xef\xbf\xbd"); /* U+FFFD */
                n = 1;
            } else {
                rc = buf_append(out, s + i, n);
            }
            i += n;
        } else {
            i++;
            if (c == '"')
                rc = buf_puts(out, "\\\"");
            else if (c == '\\')
                rc = buf_puts(out, "\\\\");
            else if (c == '\n')
                rc = buf_puts(out, "\\n");
            else if (c == '\r')
                rc = buf_puts(out, "\\r");
            else if (c == '\t')
                rc = buf_puts(out, "\\t");
            else if (c < 0x20 || c == 0x7f)
                rc = buf_printf(out, "\\u%04x", c);
            else
                rc = buf_putc(out, (char)c);
        }
        if (rc)
            goto oom;
    }
    if (buf_putc(out, '"'))
        goto oom;
    return 0;
oom:
    out->len = start;
    if (out->data)
        out->data[start] = '\0';
    return CR_ENOMEM;
}

int gw_error_json(const struct gw_error *e, struct buf *out)
{
    size_t start = out->len;
    if (buf_printf(out, "{\"error\": {\"status\": %d, \"code\": ", e->status) ||
        gw_json_str(out, e->code, strlen(e->code)) || buf_puts(out, ", \"message\": ") ||
        gw_json_str(out, e->message, strlen(e->message)) || buf_puts(out, "}}")) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
        return CR_ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- routing */

int gw_task_id_ok(const char *id, size_t len)
{
    if (len == 0 || len > GW_TASK_ID_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

int gw_query_get(const char *query, const char *name, char *out, size_t size)
{
    size_t nlen = strlen(name);
    const char *p = query;
    while (p && *p) {
        const char *amp = strchr(p, '&');
        const char *end = amp ? amp : p + strlen(p);
        if ((size_t)(end - p) >= nlen && !strncmp(p, name, nlen) &&
            (p + nlen == end || p[nlen] == '=')) {
            const char *v = p + nlen + (p + nlen < end);
            if (pct_decode(out, size, v, (size_t)(end - v), PCT_PLUS, NULL))
                return CR_ERANGE;
            return 1;
        }
        p = amp ? amp + 1 : NULL;
    }
    return 0;
}

int gw_route_parse(const char *method, const char *path, const char *query,
                   struct gw_route *out, struct gw_error *e)
{
    static const char prefix[] = "/v1/tasks/";
    static const char stream_suffix[] = "/stream";
    int get = !strcmp(method, "GET"), options = !strcmp(method, "OPTIONS");
    size_t plen = strlen(path);

    memset(out, 0, sizeof(*out));
    if (!strcmp(path, "/") || !strcmp(path, "/index.html") || !strcmp(path, "/healthz")) {
        if (options) {
            out->kind = GW_ROUTE_PREFLIGHT;
            return 0;
        }
        if (!get)
            return gw_error_set(e, 405, "method_not_allowed", "use GET for '%s'", path);
        out->kind = !strcmp(path, "/healthz") ? GW_ROUTE_HEALTH : GW_ROUTE_PAGE;
        return 0;
    }
    if (!strcmp(path, "/v1/tasks") || !strcmp(path, "/v1/tasks/")) {
        if (options) {
            out->kind = GW_ROUTE_PREFLIGHT;
            return 0;
        }
        if (strcmp(method, "POST"))
            return gw_error_set(e, 405, "method_not_allowed", "use POST for '/v1/tasks'");
        out->kind = GW_ROUTE_SUBMIT;
        return 0;
    }
    if (plen > sizeof(prefix) - 1 && !strncmp(path, prefix, sizeof(prefix) - 1)) {
        const char *id = path + sizeof(prefix) - 1;
        size_t idlen = strlen(id);
        int stream = 0;
        if (idlen > sizeof(stream_suffix) - 1 &&
            !strcmp(id + idlen - (sizeof(stream_suffix) - 1), stream_suffix)) {
            idlen -= sizeof(stream_suffix) - 1;
            stream = 1;
        }
        if (memchr(id, '/', idlen))
            return gw_error_set(e, 404, "not_found", "no such path '%.200s'", path);
        if (!gw_task_id_ok(id, idlen))
            return gw_error_set(
                e, 400, "bad_task_id",
                "task id must be 1 to %d characters of A-Z a-z 0-9 . _ : -",
                GW_TASK_ID_MAX);
        memcpy(out->task_id, id, idlen);
        out->task_id[idlen] = '\0';
        if (options) {
            out->kind = GW_ROUTE_PREFLIGHT;
            return 0;
        }
        if (!get)
            return gw_error_set(e, 405, "method_not_allowed", "use GET for '%.200s'",
                                path);
        out->kind = stream ? GW_ROUTE_STREAM : GW_ROUTE_STATUS;
        if (stream) {
            char v[32];
            int rc = gw_query_get(query, "from", v, sizeof(v));
            if (rc < 0)
                return gw_error_set(e, 400, "bad_from", "from must be a sequence number");
            if (rc == 1) {
                int64_t n = 0;
                if (!v[0])
                    return gw_error_set(e, 400, "bad_from",
                                        "from must be a sequence number");
                for (const char *c = v; *c; c++) {
                    if (*c < '0' || *c > '9' || n > ((int64_t)1 << 53) / 10)
                        return gw_error_set(e, 400, "bad_from",
                                            "from must be a sequence number");
                    n = n * 10 + (*c - '0');
                }
                out->from_seq = n;
            }
        }
        return 0;
    }
    return gw_error_set(e, 404, "not_found", "no such path '%.200s'", path);
}

/* Constant-time equality of a and b (b's length is not secret). */
static int same_secret(const char *a, size_t alen, const char *b, size_t blen)
{
    unsigned char diff = (unsigned char)(alen != blen);
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned char)((i < alen ? a[i] : 0) ^ b[i]);
    return diff == 0;
}

int gw_auth_ok(const char *expected, const char *authorization, const char *query_token)
{
    size_t n;
    if (!expected || !*expected)
        return 1;
    n = strlen(expected);
    if (authorization && !strncasecmp(authorization, "Bearer ", 7)) {
        const char *t = authorization + 7;
        while (*t == ' ')
            t++;
        if (same_secret(t, strlen(t), expected, n))
            return 1;
    }
    if (query_token && same_secret(query_token, strlen(query_token), expected, n))
        return 1;
    return 0;
}

/* ----------------------------------------------------------- submissions */

void gw_submit_init(struct gw_submit *s)
{
    memset(s, 0, sizeof(*s));
    s->countdown_s = -1;
    s->expires_s = -1;
    s->expires_us = -1;
}

void gw_submit_release(struct gw_submit *s)
{
    cr_free(s->task);
    cJSON_Delete(s->args);
    cJSON_Delete(s->kwargs);
    cr_free(s->queue);
    cr_free(s->task_id);
    gw_submit_init(s);
}

static int in_list(const char *const *list, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], name))
            return 1;
    return 0;
}

static int name_ok(const cJSON *v)
{
    return cJSON_IsString(v) && v->valuestring[0] &&
           strlen(v->valuestring) <= GW_NAME_MAX;
}

static int number_in(const cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= lo &&
           v->valuedouble <= hi;
}

int gw_submit_parse(const char *body, size_t len, const struct gw_rules *rules,
                    struct gw_submit *s, struct gw_error *e)
{
    cJSON *root = NULL, *it;
    struct cr_err perr;
    const char *queue;
    int rc;

    rc = py_json_parse(body, len, &root, &perr);
    if (rc == CR_ENOMEM)
        return CR_ENOMEM;
    if (rc)
        return gw_error_set(e, 400, "bad_json", "body is not valid JSON: %s", perr.msg);
    if (!cJSON_IsObject(root)) {
        rc = gw_error_set(e, 400, "bad_request", "body must be a JSON object");
        goto out;
    }
    rc = CR_EINVAL;
    cJSON_ArrayForEach(it, root)
    {
        const char *k = it->string;
        int null = cJSON_IsNull(it);
        if (!strcmp(k, "task")) {
            if (!name_ok(it)) {
                gw_error_set(e, 400, "bad_request",
                             "'task' must be a non-empty string of at most %d bytes",
                             GW_NAME_MAX);
                goto out;
            }
            cr_free(s->task);
            if (!(s->task = cr_strdup(it->valuestring)))
                goto oom;
        } else if (!strcmp(k, "args")) {
            if (!null && !cJSON_IsArray(it)) {
                gw_error_set(e, 400, "bad_request", "'args' must be a list");
                goto out;
            }
            cJSON_Delete(s->args);
            s->args = NULL;
            if (!null && !(s->args = cJSON_Duplicate(it, 1)))
                goto oom;
        } else if (!strcmp(k, "kwargs")) {
            if (!null && !cJSON_IsObject(it)) {
                gw_error_set(e, 400, "bad_request", "'kwargs' must be an object");
                goto out;
            }
            cJSON_Delete(s->kwargs);
            s->kwargs = NULL;
            if (!null && !(s->kwargs = cJSON_Duplicate(it, 1)))
                goto oom;
        } else if (!strcmp(k, "queue")) {
            if (null)
                continue;
            if (!name_ok(it)) {
                gw_error_set(e, 400, "bad_request", "'queue' must be a non-empty string");
                goto out;
            }
            cr_free(s->queue);
            if (!(s->queue = cr_strdup(it->valuestring)))
                goto oom;
        } else if (!strcmp(k, "priority")) {
            if (null)
                continue;
            if (!number_in(it, 0, 255) || it->valuedouble != floor(it->valuedouble)) {
                gw_error_set(e, 400, "bad_request",
                             "'priority' must be an integer from 0 to 255");
                goto out;
            }
            s->priority = (int)it->valuedouble;
        } else if (!strcmp(k, "countdown")) {
            if (null)
                continue;
            if (!number_in(it, 0, 1e9)) {
                gw_error_set(e, 400, "bad_request",
                             "'countdown' must be a number of seconds >= 0");
                goto out;
            }
            s->countdown_s = it->valuedouble;
        } else if (!strcmp(k, "expires")) {
            if (null)
                continue;
            if (cJSON_IsString(it)) {
                if (iso8601_parse(it->valuestring, &s->expires_us)) {
                    gw_error_set(e, 400, "bad_request",
                                 "'expires' must be seconds or an ISO-8601 date");
                    goto out;
                }
            } else if (number_in(it, 0, 1e9)) {
                s->expires_s = it->valuedouble;
            } else {
                gw_error_set(e, 400, "bad_request",
                             "'expires' must be seconds or an ISO-8601 date");
                goto out;
            }
        } else if (!strcmp(k, "task_id")) {
            if (null)
                continue;
            if (!cJSON_IsString(it) ||
                !gw_task_id_ok(it->valuestring, strlen(it->valuestring))) {
                gw_error_set(
                    e, 400, "bad_request",
                    "'task_id' must be 1 to %d characters of A-Z a-z 0-9 . _ : -",
                    GW_TASK_ID_MAX);
                goto out;
            }
            cr_free(s->task_id);
            if (!(s->task_id = cr_strdup(it->valuestring)))
                goto oom;
        } else {
            gw_error_set(e, 400, "bad_request", "unknown field '%.100s'", k);
            goto out;
        }
    }
    if (!s->task) {
        gw_error_set(e, 400, "bad_request", "'task' is required");
        goto out;
    }
    if (rules && rules->tasks && !in_list(rules->tasks, rules->ntasks, s->task)) {
        gw_error_set(e, 422, "unknown_task", "unknown task '%.200s'", s->task);
        goto out;
    }
    queue = s->queue ? s->queue
                     : (rules && rules->default_queue ? rules->default_queue : "celery");
    if (rules && rules->queues && !in_list(rules->queues, rules->nqueues, queue)) {
        gw_error_set(e, 422, "unknown_queue", "unknown queue '%.200s'", queue);
        goto out;
    }
    if (!s->queue && !(s->queue = cr_strdup(queue)))
        goto oom;
    if (!s->args && !(s->args = cJSON_CreateArray()))
        goto oom;
    if (!s->kwargs && !(s->kwargs = cJSON_CreateObject()))
        goto oom;
    rc = 0;
    goto out;
oom:
    rc = CR_ENOMEM;
out:
    cJSON_Delete(root);
    return rc;
}

int gw_submit_to_task(const struct gw_submit *s, const char *task_id, const char *origin,
                      int64_t now_us, struct task_msg *tm, struct gw_props *props)
{
    int64_t expires_us = s->expires_us;
    memset(props, 0, sizeof(*props));
    props->priority = s->priority;
    tm->proto = 2;
    tm->id = cr_strdup(task_id);
    tm->task = cr_strdup(s->task);
    tm->root_id = cr_strdup(task_id);
    tm->origin = cr_strdup(origin);
    tm->args = cJSON_Duplicate(s->args, 1);
    tm->kwargs = cJSON_Duplicate(s->kwargs, 1);
    if (!tm->id || !tm->task || !tm->root_id || !tm->origin || !tm->args || !tm->kwargs)
        return CR_ENOMEM;
    tm->retries = 0;
    tm->priority = s->priority;
    tm->delivery_mode = 2;
    if (s->countdown_s >= 0)
        tm->eta_us = now_us + (int64_t)llround(s->countdown_s * 1e6);
    if (s->expires_s >= 0)
        expires_us = now_us + (int64_t)llround(s->expires_s * 1e6);
    if (expires_us >= 0) {
        /* kombu: the per-message TTL is the time left, clamped at 0. */
        int64_t left_ms = expires_us > now_us ? (expires_us - now_us) / 1000 : 0;
        tm->expires_us = expires_us;
        snprintf(props->expiration, sizeof(props->expiration), "%lld",
                 (long long)left_ms);
    }
    return 0;
}

/* ---------------------------------------------------------------- replies */

static int ready_state(const char *st)
{
    return !strcmp(st, "SUCCESS") || !strcmp(st, "FAILURE") || !strcmp(st, "REVOKED");
}

int gw_meta_ready(const char *meta, size_t len)
{
    char st[32];
    if (!meta || result_meta_status(meta, len, st, sizeof(st)))
        return 0;
    return ready_state(st);
}

/* "ExcType: message" of an exception result, or NULL when it is not one. */
static cJSON *exc_text(const cJSON *res)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(res, "exc_type");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(res, "exc_message");
    struct buf b;
    cJSON *out;
    if (!cJSON_IsString(type))
        return NULL;
    buf_init(&b);
    if (buf_puts(&b, type->valuestring) || buf_puts(&b, ": "))
        goto oom;
    if (cJSON_IsArray(msg) && cJSON_GetArraySize(msg) == 1 &&
        cJSON_IsString(cJSON_GetArrayItem(msg, 0))) {
        if (buf_puts(&b, cJSON_GetArrayItem(msg, 0)->valuestring))
            goto oom;
    } else if (cJSON_IsString(msg)) {
        if (buf_puts(&b, msg->valuestring))
            goto oom;
    } else if (msg && py_repr(msg, &b, 400)) {
        goto oom;
    }
    out = cJSON_CreateString(b.data);
    buf_release(&b);
    return out;
oom:
    buf_release(&b);
    return NULL;
}

cJSON *gw_meta_summary(const char *task_id, const char *meta, size_t len)
{
    cJSON *m = NULL, *out = cJSON_CreateObject();
    const cJSON *st = NULL;
    const char *state = "PENDING";
    struct cr_err err;
    int ok = 1;

    if (!out)
        return NULL;
    if (meta && py_json_parse(meta, len, &m, &err) == 0 && cJSON_IsObject(m)) {
        st = cJSON_GetObjectItemCaseSensitive(m, "status");
        if (cJSON_IsString(st))
            state = st->valuestring;
    }
    ok &= cJSON_AddStringToObject(out, "task_id", task_id) != NULL;
    ok &= cJSON_AddStringToObject(out, "state", state) != NULL;
#define MOVE(key)                                                                        \
    do {                                                                                 \
        cJSON *v = m ? cJSON_DetachItemFromObjectCaseSensitive(m, key) : NULL;           \
        if (!v)                                                                          \
            v = cJSON_CreateNull();                                                      \
        if (!v || !cJSON_AddItemToObject(out, key, v)) {                                 \
            cJSON_Delete(v);                                                             \
            ok = 0;                                                                      \
        }                                                                                \
    } while (0)
    MOVE("result");
    MOVE("traceback");
    MOVE("date_done");
#undef MOVE
    ok &= cJSON_AddBoolToObject(out, "ready", ready_state(state)) != NULL;
    if (ok && (!strcmp(state, "FAILURE") || !strcmp(state, "REVOKED") ||
               !strcmp(state, "RETRY"))) {
        cJSON *x = exc_text(cJSON_GetObjectItemCaseSensitive(out, "result"));
        if (x && !cJSON_AddItemToObject(out, "error", x))
            cJSON_Delete(x);
    }
    cJSON_Delete(m);
    if (!ok) {
        cJSON_Delete(out);
        return NULL;
    }
    return out;
}
