/* result.c -- Celery result-backend metas (the JSON stored per task id). */
#include "result.h"

#include <string.h>

#include "isotime.h"

/* ======================================================================== */
/* Result meta                                                              */
/* ======================================================================== */

static int put_key(struct buf *b, const char *key, int first)
{
    return buf_printf(b, "%s\"%s\": ", first ? "" : ", ", key);
}

static int put_str_or_null(struct buf *b, const char *s)
{
    return s ? py_json_string(b, s) : buf_puts(b, "null");
}

/* Celery's request_meta['stamped_headers'] = ...; request_meta.update(stamps). */
static int put_stamps(struct buf *b, const struct result_meta *m)
{
    static const char *const taken[] = {
        "status", "result",  "traceback", "children",  "date_done",
        "name",   "args",    "kwargs",    "worker",    "retries",
        "queue",  "task_id", "group_id",  "parent_id", "stamped_headers"};
    const cJSON *s;
    int rc = put_key(b, "stamped_headers", 0);
    if (!rc)
        rc = m->stamped_headers ? py_json_dumps(m->stamped_headers, b)
                                : buf_puts(b, "null");
    cJSON_ArrayForEach(s, m->stamps)
    {
        size_t i;
        for (i = 0; i < sizeof(taken) / sizeof(taken[0]); i++)
            if (!strcmp(s->string, taken[i]))
                break;
        if (rc || i < sizeof(taken) / sizeof(taken[0]))
            continue;
        if (!(rc = buf_puts(b, ", ")) && !(rc = py_json_string(b, s->string)) &&
            !(rc = buf_puts(b, ": ")))
            rc = py_json_dumps(s, b);
    }
    return rc;
}

char *result_meta_encode(const struct result_meta *m)
{
    struct buf b;
    int rc;

    buf_init(&b);
    rc = buf_putc(&b, '{');
    if (!rc)
        rc = put_key(&b, "status", 1);
    if (!rc)
        rc = put_str_or_null(&b, m->status);
    if (!rc && !(rc = put_key(&b, "result", 0)))
        rc = py_json_dumps(m->result, &b);
    if (!rc && !(rc = put_key(&b, "traceback", 0)))
        rc = put_str_or_null(&b, m->traceback);
    if (!rc && !(rc = put_key(&b, "children", 0)))
        rc = m->children ? py_json_dumps(m->children, &b) : buf_puts(&b, "[]");
    if (!rc && !(rc = put_key(&b, "date_done", 0))) {
        if (m->date_done_us >= 0) {
            char iso[40];
            iso8601_format(m->date_done_us, iso);
            rc = py_json_string(&b, iso);
        } else {
            rc = buf_puts(&b, "null");
        }
    }
    /* Celery tests these with getattr(request, ...) truthiness: "" is absent. */
    if (!rc && m->group_id && *m->group_id && !(rc = put_key(&b, "group_id", 0)))
        rc = py_json_string(&b, m->group_id);
    if (!rc && m->parent_id && *m->parent_id && !(rc = put_key(&b, "parent_id", 0)))
        rc = py_json_string(&b, m->parent_id);
    if (!rc && m->extended) {
        if (!(rc = put_key(&b, "name", 0)))
            rc = put_str_or_null(&b, m->name);
        if (!rc && !(rc = put_key(&b, "args", 0)))
            rc = py_json_dumps(m->args, &b);
        if (!rc && !(rc = put_key(&b, "kwargs", 0)))
            rc = py_json_dumps(m->kwargs, &b);
        if (!rc && !(rc = put_key(&b, "worker", 0)))
            rc = put_str_or_null(&b, m->worker);
        if (!rc && !(rc = put_key(&b, "retries", 0)))
            rc = buf_printf(&b, "%d", m->retries);
        if (!rc && !(rc = put_key(&b, "queue", 0)))
            rc = put_str_or_null(&b, m->queue);
        if (!rc && cJSON_IsObject(m->stamps) && m->stamps->child)
            rc = put_stamps(&b, m);
    }
    if (!rc && !(rc = put_key(&b, "task_id", 0)))
        rc = put_str_or_null(&b, m->task_id);
    if (!rc)
        rc = buf_putc(&b, '}');
    if (rc) {
        buf_release(&b);
        return NULL;
    }
    return buf_detach(&b);
}

static cJSON *str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

cJSON *result_exc_new(const char *exc_type, const char *exc_module, const char *message)
{
    cJSON *o = cJSON_CreateObject(), *msg = cJSON_CreateArray(), *t, *mod;
    if (!o || !msg)
        goto oom;
    if (!(t = str_or_null(exc_type)) || !cJSON_AddItemToObject(o, "exc_type", t)) {
        cJSON_Delete(t);
        goto oom;
    }
    if (!cJSON_AddItemToObject(o, "exc_message", msg))
        goto oom;
    msg = NULL; /* owned by o now */
    if (!(mod = str_or_null(exc_module)) ||
        !cJSON_AddItemToObject(o, "exc_module", mod)) {
        cJSON_Delete(mod);
        goto oom;
    }
    if (message) {
        cJSON *s = cJSON_CreateString(message);
        if (!s || !cJSON_AddItemToArray(
                      cJSON_GetObjectItemCaseSensitive(o, "exc_message"), s)) {
            cJSON_Delete(s);
            goto oom;
        }
    }
    return o;
oom:
    cJSON_Delete(msg);
    cJSON_Delete(o);
    return NULL;
}

int result_traceback(struct buf *out, const char *task, const char *exc_module,
                     const char *exc_type, const char *message)
{
    int builtin = !exc_module || !*exc_module || strcmp(exc_module, "builtins") == 0;

    return buf_printf(out,
                      "Traceback (most recent call last):\n  File \"celeriac\", in %s\n"
                      "%s%s%s: %s\n",
                      task ? task : "unknown", builtin ? "" : exc_module,
                      builtin ? "" : ".", exc_type ? exc_type : "Exception",
                      message ? message : "");
}

int result_meta_status(const char *json, size_t len, char *status, size_t size)
{
    cJSON *root = NULL;
    const cJSON *st;
    size_t n;
    int rc = py_json_parse(json, len, &root, NULL);

    if (rc)
        return rc == CR_ENOMEM ? rc : CR_EDECODE;
    st = cJSON_GetObjectItemCaseSensitive(root, "status");
    if (!cJSON_IsObject(root) || !cJSON_IsString(st)) {
        cJSON_Delete(root);
        return CR_EDECODE;
    }
    if (size) {
        n = strlen(st->valuestring);
        if (n >= size)
            n = size - 1;
        memcpy(status, st->valuestring, n);
        status[n] = '\0';
    }
    cJSON_Delete(root);
    return 0;
}
