/* celery_events.c -- Celery event bodies as JSON (no I/O, no clock). */
#include "celery_events.h"

#include <math.h>
#include <string.h>

#include "pyjson.h"
#include "../util/err.h"

static const char *const task_type_names[] = {
    "task-received", "task-started",  "task-succeeded", "task-failed",
    "task-retried",  "task-rejected", "task-revoked",
};

const char *cev_task_type_name(enum cev_task_type type)
{
    if ((unsigned)type >= sizeof(task_type_names) / sizeof(task_type_names[0]))
        return "task-unknown";
    return task_type_names[type];
}

/* An object under construction with a sticky out-of-memory flag, so the
 * encoders read as a list of fields and check once at the end. Keys are
 * string literals and are not copied (cJSON's "CS" variants). */
struct ob {
    cJSON *o;
    int oom;
};

static void put(struct ob *b, const char *key, cJSON *v)
{
    if (!v || !b->o) {
        cJSON_Delete(v);
        b->oom = 1;
        return;
    }
    if (!cJSON_AddItemToObjectCS(b->o, key, v)) {
        cJSON_Delete(v);
        b->oom = 1;
    }
}

static void put_str(struct ob *b, const char *key, const char *s)
{
    put(b, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

static void put_int(struct ob *b, const char *key, double v)
{
    put(b, key, cJSON_CreateNumber(v));
}

static void put_float(struct ob *b, const char *key, double v)
{
    put(b, key, py_json_float(v));
}

static void put_bool(struct ob *b, const char *key, int v)
{
    put(b, key, cJSON_CreateBool(v != 0));
}

static void put_common_head(struct ob *b, const struct cev_common *c)
{
    put_str(b, "hostname", c->hostname);
    put_int(b, "utcoffset", c->utcoffset);
    put_int(b, "pid", (double)c->pid);
    put_int(b, "clock", (double)c->clock);
}

static void put_common_tail(struct ob *b, const struct cev_common *c, const char *type)
{
    put_float(b, "timestamp", c->timestamp);
    put_str(b, "type", type);
}

static int finish(struct ob *b, struct buf *out)
{
    int rc = b->oom ? CR_ENOMEM : py_json_dumps(b->o, out);
    cJSON_Delete(b->o);
    return rc;
}

int cev_worker_encode(const struct cev_common *c, const char *type,
                      const struct cev_worker *wk, struct buf *out)
{
    struct ob b;
    if (!type || (strcmp(type, "worker-online") && strcmp(type, "worker-heartbeat") &&
                  strcmp(type, "worker-offline")))
        return CR_EINVAL;
    b.o = cJSON_CreateObject();
    b.oom = 0;
    put_common_head(&b, c);
    put_float(&b, "freq", wk->freq);
    if (!wk->sw_only) {
        cJSON *la = cJSON_CreateArray();
        put_int(&b, "active", wk->active);
        put_int(&b, "processed", (double)wk->processed);
        for (int i = 0; i < 3 && la; i++) {
            cJSON *v = py_json_float(round(wk->loadavg[i] * 100.0) / 100.0);
            if (!v || !cJSON_AddItemToArray(la, v)) {
                cJSON_Delete(v);
                b.oom = 1;
            }
        }
        put(&b, "loadavg", la);
    }
    put_str(&b, "sw_ident", wk->sw_ident);
    put_str(&b, "sw_ver", wk->sw_ver);
    put_str(&b, "sw_sys", wk->sw_sys);
    put_common_tail(&b, c, type);
    return finish(&b, out);
}

static void put_llm(struct ob *b, const struct cev_task *t)
{
    if (!t->has_llm)
        return;
    if (t->model)
        put_str(b, "model", t->model);
    if (t->provider)
        put_str(b, "provider", t->provider);
    if (t->prompt_tokens >= 0)
        put_int(b, "prompt_tokens", (double)t->prompt_tokens);
    else
        put(b, "prompt_tokens", cJSON_CreateNull());
    if (t->completion_tokens >= 0)
        put_int(b, "completion_tokens", (double)t->completion_tokens);
    else
        put(b, "completion_tokens", cJSON_CreateNull());
    put(b, "ttft", t->ttft >= 0 ? py_json_float(t->ttft) : cJSON_CreateNull());
    put(b, "tokens_per_second",
        t->tokens_per_second >= 0 ? py_json_float(t->tokens_per_second)
                                  : cJSON_CreateNull());
    if (t->has_cost)
        put(b, "cost", py_json_float(t->cost));
}

int cev_task_encode(const struct cev_common *c, const struct cev_task *t, struct buf *out)
{
    struct ob b;
    if (!t->uuid || (unsigned)t->type > CEV_TASK_REVOKED)
        return CR_EINVAL;
    b.o = cJSON_CreateObject();
    b.oom = 0;
    put_common_head(&b, c);
    put_str(&b, "uuid", t->uuid);
    switch (t->type) {
    case CEV_TASK_RECEIVED:
        put_str(&b, "name", t->name);
        put_str(&b, "args", t->args ? t->args : "()");
        put_str(&b, "kwargs", t->kwargs ? t->kwargs : "{}");
        put_str(&b, "root_id", t->root_id);
        put_str(&b, "parent_id", t->parent_id);
        put_int(&b, "retries", t->retries);
        put_str(&b, "eta", t->eta);
        put_str(&b, "expires", t->expires);
        break;
    case CEV_TASK_STARTED:
        break;
    case CEV_TASK_SUCCEEDED:
        put_str(&b, "result", t->result ? t->result : "None");
        put_float(&b, "runtime", t->runtime);
        put_llm(&b, t);
        break;
    case CEV_TASK_FAILED:
    case CEV_TASK_RETRIED:
        put_str(&b, "exception", t->exception);
        put_str(&b, "traceback", t->traceback);
        put_llm(&b, t);
        break;
    case CEV_TASK_REJECTED:
        put_bool(&b, "requeue", t->requeue);
        break;
    case CEV_TASK_REVOKED:
        put_bool(&b, "terminated", t->terminated);
        put(&b, "signum", t->signum ? cJSON_CreateNumber(t->signum) : cJSON_CreateNull());
        put_bool(&b, "expired", t->expired);
        break;
    }
    put_common_tail(&b, c, cev_task_type_name(t->type));
    return finish(&b, out);
}

int cev_routing_key(const char *type, char *out, size_t size)
{
    size_t n = strlen(type);
    if (n + 1 > size)
        return CR_ERANGE;
    for (size_t i = 0; i < n; i++)
        out[i] = type[i] == '-' ? '.' : type[i];
    out[n] = '\0';
    return 0;
}

int cev_utcoffset(long gmtoff_east_s)
{
    long west = -gmtoff_east_s;
    long q = west / 3600;
    /* C division truncates; Python's // floors. */
    if (west % 3600 != 0 && west < 0)
        q--;
    return (int)q;
}

/* Cuts b back to start + max_bytes (at a UTF-8 boundary) and appends "...". */
static int cut(struct buf *b, size_t start, size_t max_bytes)
{
    size_t end;
    if (!max_bytes || b->len - start <= max_bytes)
        return 0;
    end = start + max_bytes;
    while (end > start && ((unsigned char)b->data[end] & 0xC0) == 0x80)
        end--;
    b->len = end;
    b->data[end] = '\0';
    return buf_puts(b, "...");
}

int cev_args_repr(const cJSON *args, struct buf *out, size_t max_bytes)
{
    size_t start = out->len;
    int n = 0, rc = 0;
    const cJSON *a;
    if (!cJSON_IsArray(args))
        return CR_EINVAL;
    rc = buf_putc(out, '(');
    cJSON_ArrayForEach(a, args)
    {
        if (!rc && n++)
            rc = buf_puts(out, ", ");
        if (!rc)
            rc = py_repr(a, out, 0);
    }
    if (!rc && n == 1)
        rc = buf_putc(out, ',');
    if (!rc)
        rc = buf_putc(out, ')');
    if (!rc)
        rc = cut(out, start, max_bytes);
    if (rc) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

int cev_exception_repr(const char *exc_type, const char *message, struct buf *out)
{
    size_t start = out->len;
    int rc = buf_puts(out, exc_type && *exc_type ? exc_type : "Exception");
    if (!rc)
        rc = buf_putc(out, '(');
    if (!rc && message) {
        cJSON *s = cJSON_CreateString(message);
        rc = s ? py_repr(s, out, 0) : CR_ENOMEM;
        cJSON_Delete(s);
    }
    if (!rc)
        rc = buf_putc(out, ')');
    if (rc) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

double cev_tokens_per_second(long completion_tokens, double elapsed_s, double ttft_s)
{
    double gen = elapsed_s;
    if (completion_tokens <= 0 || !(elapsed_s > 0))
        return -1;
    if (ttft_s >= 0 && ttft_s <= elapsed_s)
        gen = elapsed_s - ttft_s;
    /* A stream sent in one write has no measurable generation time; a
     * millisecond floor keeps the figure finite and still says "fast". */
    if (gen < 0.001)
        gen = 0.001;
    return (double)completion_tokens / gen;
}
