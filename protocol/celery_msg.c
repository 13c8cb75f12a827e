/* celery_msg.c -- decode Celery task messages (v1, v2, hybrid) and encode v2. */
#include "celery_msg.h"

#include <limits.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "../util/alloc.h"
#include "isotime.h"
#include "pyjson.h"

/* Celery's argsrepr_maxsize / kwargsrepr_maxsize. */
#define REPR_MAX 1024

void task_msg_init(struct task_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->eta_us = -1;
    m->expires_us = -1;
    m->ignore_result = -1;
}

void task_msg_release(struct task_msg *m)
{
    char **strs[] = {&m->id,
                     &m->task,
                     &m->shadow,
                     &m->root_id,
                     &m->parent_id,
                     &m->group,
                     &m->eta,
                     &m->expires,
                     &m->argsrepr,
                     &m->kwargsrepr,
                     &m->origin,
                     &m->content_type,
                     &m->content_encoding,
                     &m->correlation_id,
                     &m->reply_to};
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        cr_free(*strs[i]);
    cJSON_Delete(m->args);
    cJSON_Delete(m->kwargs);
    cJSON_Delete(m->embed);
    cJSON_Delete(m->headers);
    task_msg_init(m);
}

const char *task_msg_display_name(const struct task_msg *m)
{
    if (m->shadow)
        return m->shadow;
    return m->task ? m->task : "unknown";
}

/* ---- helpers ---- */

static int oom(struct cr_err *err)
{
    return cr_err_set(err, CR_ENOMEM, "out of memory");
}

/* Like cJSON_GetObjectItemCaseSensitive, but a repeated key yields its last value,
 * as Python's json.loads() and dict() do. */
static cJSON *get(const cJSON *obj, const char *key)
{
    cJSON *found = NULL;
    if (!cJSON_IsObject(obj))
        return NULL;
    for (cJSON *c = obj->child; c; c = c->next)
        if (c->string && strcmp(c->string, key) == 0)
            found = c;
    return found;
}

/* Where a field is looked up: headers first (present, even as null, wins), then
 * the v1 body dict. This is the "hybrid" rule of Celery's hybrid_to_proto2. */
struct src {
    const cJSON *h;
    const cJSON *body; /* NULL for v2 */
};

static const cJSON *field(const struct src *s, const char *key)
{
    const cJSON *v = get(s->h, key);
    return v ? v : get(s->body, key);
}

static int set_str(char **dst, const char *s, struct cr_err *err)
{
    char *copy = cr_strdup(s);
    if (!copy)
        return oom(err);
    cr_free(*dst);
    *dst = copy;
    return 0;
}

static int copy_prop(char **dst, const char *s, struct cr_err *err)
{
    return s ? set_str(dst, s, err) : 0;
}

/* Identity and routing fields: string or null, anything else is a bad message. */
static int opt_str(const struct src *s, const char *key, char **dst, struct cr_err *err)
{
    const cJSON *v = field(s, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return cr_err_set(err, CR_EPROTO, "header '%s' is not a string", key);
    return set_str(dst, v->valuestring, err);
}

/* Display-only fields: a wrong type is ignored, as Python merely logs them. */
static int info_str(const struct src *s, const char *key, char **dst, struct cr_err *err)
{
    const cJSON *v = field(s, key);
    return cJSON_IsString(v) ? set_str(dst, v->valuestring, err) : 0;
}

static int req_str(const struct src *s, const char *key, char **dst, struct cr_err *err)
{
    const cJSON *v = field(s, key);
    if (!cJSON_IsString(v) || !*v->valuestring)
        return cr_err_set(err, CR_EPROTO, "missing %s", key);
    return set_str(dst, v->valuestring, err);
}

static int is_integral(const cJSON *v)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
           floor(v->valuedouble) == v->valuedouble;
}

static int opt_time(const struct src *s, const char *key, char **text, int64_t *us,
                    struct cr_err *err)
{
    int rc = opt_str(s, key, text, err);
    if (rc || !*text)
        return rc;
    if (iso8601_parse(*text, us))
        return cr_err_set(err, CR_EPROTO, "bad %s '%.64s'", key, *text);
    return 0;
}

static int timelimit(const struct src *s, struct task_msg *m, struct cr_err *err)
{
    const cJSON *v = field(s, "timelimit");
    double lim[2] = {0, 0};
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return cr_err_set(err, CR_EPROTO, "timelimit is not [hard, soft]");
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        if (cJSON_IsNull(x))
            continue;
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0)
            return cr_err_set(err, CR_EPROTO, "bad timelimit");
        lim[i] = x->valuedouble;
    }
    m->time_limit_hard = lim[0];
    m->time_limit_soft = lim[1];
    return 0;
}

/* Every header field except args/kwargs/embed, for both protocols. */
static int fields(const struct src *s, struct task_msg *m, struct cr_err *err)
{
    const cJSON *v;
    int rc;

    if ((rc = req_str(s, "task", &m->task, err)) || (rc = req_str(s, "id", &m->id, err)))
        return rc;
    if ((rc = opt_str(s, "shadow", &m->shadow, err)) ||
        (rc = opt_str(s, "root_id", &m->root_id, err)) ||
        (rc = opt_str(s, "parent_id", &m->parent_id, err)) ||
        (rc = opt_str(s, "group", &m->group, err)))
        return rc;
    /* v1 sends the group id as both "group" and the older "taskset". */
    if (!m->group && s->body && (rc = opt_str(s, "taskset", &m->group, err)))
        return rc;
    /* Celery: "if not root_id: root_id = task_id". */
    if ((!m->root_id || !*m->root_id) && (rc = set_str(&m->root_id, m->id, err)))
        return rc;

    v = field(s, "group_index");
    if (v && !cJSON_IsNull(v)) {
        if (!is_integral(v) || fabs(v->valuedouble) > 9007199254740992.0) /* 2^53 */
            return cr_err_set(err, CR_EPROTO, "bad group_index");
        m->group_index = (long)v->valuedouble;
        m->has_group_index = 1;
    }
    v = field(s, "retries");
    if (v && !cJSON_IsNull(v)) {
        if (!is_integral(v) || v->valuedouble < 0 || v->valuedouble > INT_MAX)
            return cr_err_set(err, CR_EPROTO, "bad retries");
        m->retries = (int)v->valuedouble;
    }
    if ((rc = opt_time(s, "eta", &m->eta, &m->eta_us, err)) ||
        (rc = opt_time(s, "expires", &m->expires, &m->expires_us, err)) ||
        (rc = timelimit(s, m, err)))
        return rc;

    v = field(s, "ignore_result");
    if (cJSON_IsBool(v))
        m->ignore_result = cJSON_IsTrue(v);
    else if (cJSON_IsNumber(v))
        m->ignore_result = v->valuedouble != 0;
    else if (v && !cJSON_IsNull(v))
        return cr_err_set(err, CR_EPROTO, "bad ignore_result");

    if ((rc = info_str(s, "argsrepr", &m->argsrepr, err)) ||
        (rc = info_str(s, "kwargsrepr", &m->kwargsrepr, err)) ||
        (rc = info_str(s, "origin", &m->origin, err)))
        return rc;
    return 0;
}

/* Media type without parameters, case-insensitive; absent or empty means JSON
 * (kombu's default serializer). */
static int is_json(const char *ct)
{
    static const char json[] = "application/json";
    size_t n = sizeof(json) - 1;
    if (!ct)
        return 1;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (!*ct)
        return 1;
    if (strncasecmp(ct, json, n) != 0)
        return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

/* Best effort, before anything can fail: lets the caller store a FAILURE under
 * the right id even when the body is garbage. */
static void early_ids(const cJSON *h, struct task_msg *m)
{
    const cJSON *id = get(h, "id"), *task = get(h, "task");
    if (cJSON_IsString(id) && !m->id)
        m->id = cr_strdup(id->valuestring);
    if (cJSON_IsString(task) && !m->task)
        m->task = cr_strdup(task->valuestring);
}

/* Whether embed is what Celery sends for a task with no callbacks, errbacks,
 * chain or chord: encode_v2 writes exactly that for a NULL embed, so it need
 * not be kept (five cJSON nodes, about 300 bytes, per task in flight). */
static int is_default_embed(const cJSON *embed)
{
    static const char *const keys[] = {"callbacks", "errbacks", "chain", "chord"};
    const cJSON *c = embed->child;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++, c = c->next)
        if (!c || !c->string || strcmp(c->string, keys[i]) || !cJSON_IsNull(c))
            return 0;
    return c == NULL;
}

static int decode_v2(cJSON *body, const cJSON *h, struct task_msg *m, struct cr_err *err)
{
    struct src s = {h, NULL};
    int n = cJSON_GetArraySize(body), rc;
    cJSON *args, *kwargs, *embed;

    m->proto = 2;
    if ((rc = fields(&s, m, err)))
        return rc;
    /* Celery sends [args, kwargs, embed]; embed may be null, or left out by
     * hand-written producers. */
    if (n != 2 && n != 3)
        return cr_err_set(err, CR_EPROTO, "body is not [args, kwargs, embed]");
    args = cJSON_GetArrayItem(body, 0);
    kwargs = cJSON_GetArrayItem(body, 1);
    embed = n == 3 ? cJSON_GetArrayItem(body, 2) : NULL;
    if (!cJSON_IsArray(args))
        return cr_err_set(err, CR_EPROTO, "args is not a list");
    if (!cJSON_IsObject(kwargs))
        return cr_err_set(err, CR_EPROTO, "kwargs is not a dict");
    if (embed && !cJSON_IsNull(embed) && !cJSON_IsObject(embed))
        return cr_err_set(err, CR_EPROTO, "embed is not a dict");
    m->args = cJSON_DetachItemViaPointer(body, args);
    m->kwargs = cJSON_DetachItemViaPointer(body, kwargs);
    if (cJSON_IsObject(embed) && !is_default_embed(embed))
        m->embed = cJSON_DetachItemViaPointer(body, embed);
    return 0;
}

/* v1 keeps callbacks/errbacks/chord at the top of the body; they are moved into
 * a v2-shaped embed (chain is always null in v1) so callers see one layout. */
static int v1_embed(cJSON *body, struct task_msg *m, struct cr_err *err)
{
    static const char *const keys[] = {"callbacks", "errbacks", "chain", "chord"};
    int any = 0;
    cJSON *embed;

    for (size_t i = 0; i < 4; i++) {
        const cJSON *v = get(body, keys[i]);
        if (i != 2 && v && !cJSON_IsNull(v))
            any = 1;
    }
    if (!any)
        return 0;
    embed = cJSON_CreateObject();
    if (!embed)
        return oom(err);
    for (size_t i = 0; i < 4; i++) {
        cJSON *v = i == 2 ? NULL : get(body, keys[i]);
        cJSON *item = v ? cJSON_DetachItemViaPointer(body, v) : cJSON_CreateNull();
        if (!item) {
            cJSON_Delete(embed);
            return oom(err);
        }
        if (!cJSON_AddItemToObject(embed, keys[i], item)) {
            cJSON_Delete(item);
            cJSON_Delete(embed);
            return oom(err);
        }
    }
    m->embed = embed;
    return 0;
}

static int decode_v1(cJSON *body, const cJSON *h, struct task_msg *m, struct cr_err *err)
{
    struct src s = {h, body};
    cJSON *args, *kwargs;
    int rc;

    m->proto = 1;
    /* Name and id first so that a later shape error still reports them. */
    if (!m->task && cJSON_IsString(field(&s, "task")))
        m->task = cr_strdup(field(&s, "task")->valuestring);
    if (!m->id && cJSON_IsString(field(&s, "id")))
        m->id = cr_strdup(field(&s, "id")->valuestring);
    if ((rc = fields(&s, m, err)))
        return rc;
    args = get(body, "args");
    kwargs = get(body, "kwargs");
    if (args && !cJSON_IsArray(args))
        return cr_err_set(err, CR_EPROTO, "args is not a list");
    if (kwargs && !cJSON_IsObject(kwargs))
        return cr_err_set(err, CR_EPROTO, "kwargs is not a dict");
    m->args = args ? cJSON_DetachItemViaPointer(body, args) : cJSON_CreateArray();
    m->kwargs = kwargs ? cJSON_DetachItemViaPointer(body, kwargs) : cJSON_CreateObject();
    if (!m->args || !m->kwargs)
        return oom(err);
    return v1_embed(body, m, err);
}

static cJSON *keep_headers(const cJSON *h, int proto);
static int is_std_header(const char *key);

int celery_msg_decode(const struct celery_raw_msg *in, struct task_msg *out,
                      struct cr_err *err)
{
    const cJSON *h = in->headers, *comp;
    cJSON *body = NULL;
    int rc;

    out->delivery_mode = in->delivery_mode;
    out->priority = in->priority;
    if ((rc = copy_prop(&out->content_type, in->content_type, err)) ||
        (rc = copy_prop(&out->content_encoding, in->content_encoding, err)) ||
        (rc = copy_prop(&out->correlation_id, in->correlation_id, err)) ||
        (rc = copy_prop(&out->reply_to, in->reply_to, err)))
        return rc;
    if (h && !cJSON_IsObject(h))
        return cr_err_set(err, CR_EPROTO, "headers are not a mapping");
    early_ids(h, out);

    /* Never deserialize anything but JSON: pickle would run code, and yaml and
     * msgpack are not worth a parser here. A compressed body cannot be JSON. */
    if (!is_json(in->content_type))
        return cr_err_set(err, CR_ECONTENT, "content type '%.64s' not allowed",
                          in->content_type);
    comp = get(h, "compression");
    if (comp && !cJSON_IsNull(comp))
        return cr_err_set(err, CR_ECONTENT, "compressed body (%.64s) not supported",
                          cJSON_IsString(comp) ? comp->valuestring : "?");

    rc = py_json_parse(in->body, in->body_len, &body, err);
    if (rc)
        return rc;
    if (cJSON_IsObject(body))
        rc = decode_v1(body, h, out, err);
    else if (cJSON_IsArray(body) && get(h, "task"))
        rc = decode_v2(body, h, out, err);
    else if (cJSON_IsArray(body))
        rc = cr_err_set(err, CR_EPROTO, "missing task");
    else
        rc = cr_err_set(err, CR_EPROTO, "body is neither a list nor a dict");
    cJSON_Delete(body);
    if (rc == 0 && !(out->headers = keep_headers(h, out->proto)))
        rc = oom(err);
    return rc;
}

/* What of the headers the decoded message keeps: v2 headers Celery defines are
 * in the fields and rebuilt exactly from them (see celery_msg_headers()), so
 * only the others are copied; a Celery message's headers as a cJSON tree cost
 * about 2 KB per task in flight. v1 headers are all kept: they go back out
 * with a v1 body. */
static cJSON *keep_headers(const cJSON *h, int proto)
{
    cJSON *out;
    if (h && proto == 1)
        return cJSON_Duplicate(h, 1);
    out = cJSON_CreateObject();
    for (const cJSON *c = h ? h->child : NULL; out && c; c = c->next) {
        cJSON *dup;
        if (!c->string || is_std_header(c->string))
            continue;
        dup = cJSON_Duplicate(c, 1);
        if (!dup || !cJSON_AddItemToObject(out, c->string, dup)) {
            cJSON_Delete(dup);
            cJSON_Delete(out);
            return NULL;
        }
    }
    return out;
}

/* ---- encoding ---- */

static const char *const std_headers[] = {
    "lang",     "task",        "id",      "shadow",        "eta",     "expires",
    "group",    "group_index", "retries", "timelimit",     "root_id", "parent_id",
    "argsrepr", "kwargsrepr",  "origin",  "ignore_result",
};

static int is_std_header(const char *key)
{
    for (size_t i = 0; i < sizeof(std_headers) / sizeof(std_headers[0]); i++)
        if (key && strcmp(key, std_headers[i]) == 0)
            return 1;
    return 0;
}

/* Adds item under key, or returns -1 (item freed) on OOM. */
static int put(cJSON *obj, const char *key, cJSON *item)
{
    if (!item)
        return -1;
    if (!cJSON_AddItemToObject(obj, key, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

/* Appends item to an array, or returns -1 (item freed) on OOM. */
static int push(cJSON *arr, cJSON *item)
{
    if (!item)
        return -1;
    if (!cJSON_AddItemToArray(arr, item)) {
        cJSON_Delete(item);
        return -1;
    }
    return 0;
}

static cJSON *str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

static cJSON *time_item(const char *text, int64_t us)
{
    char iso[40];
    if (text)
        return cJSON_CreateString(text);
    if (us < 0)
        return cJSON_CreateNull();
    iso8601_format(us, iso);
    return cJSON_CreateString(iso);
}

static cJSON *limit_item(double v)
{
    return v > 0 ? cJSON_CreateNumber(v) : cJSON_CreateNull();
}

/* Python's saferepr of the args tuple: "(1, 2)", "(1,)", "()". */
static cJSON *args_repr(const cJSON *args)
{
    struct buf b;
    cJSON *item = NULL;
    buf_init(&b);
    if (py_repr(args, &b, REPR_MAX) == 0 && b.len >= 2 && b.data[0] == '[') {
        b.data[0] = '(';
        if (b.data[b.len - 1] == ']') {
            /* Not truncated: close as a tuple, with the 1-tuple comma. */
            int one = cJSON_GetArraySize(args) == 1;
            b.data[b.len - 1] = one ? ',' : ')';
            if (!one || buf_putc(&b, ')') == 0)
                item = cJSON_CreateString(b.data);
        } else {
            item = cJSON_CreateString(b.data);
        }
    }
    buf_release(&b);
    return item;
}

static cJSON *kwargs_repr(const cJSON *kwargs)
{
    struct buf b;
    cJSON *item = NULL;
    buf_init(&b);
    if (py_repr(kwargs, &b, REPR_MAX) == 0 && b.data)
        item = cJSON_CreateString(b.data);
    buf_release(&b);
    return item;
}

static cJSON *build_headers(const struct task_msg *m, const cJSON *args,
                            const cJSON *kwargs)
{
    cJSON *h = cJSON_CreateObject(), *tl;
    if (!h)
        return NULL;
    if (put(h, "lang", cJSON_CreateString("py")) ||
        put(h, "task", str_or_null(m->task)) || put(h, "id", str_or_null(m->id)) ||
        put(h, "shadow", str_or_null(m->shadow)) ||
        put(h, "eta", time_item(m->eta, m->eta_us)) ||
        put(h, "expires", time_item(m->expires, m->expires_us)) ||
        put(h, "group", str_or_null(m->group)) ||
        put(h, "group_index",
            m->has_group_index ? cJSON_CreateNumber((double)m->group_index)
                               : cJSON_CreateNull()) ||
        put(h, "retries", cJSON_CreateNumber(m->retries)))
        goto fail;
    tl = cJSON_CreateArray();
    if (put(h, "timelimit", tl) || push(tl, limit_item(m->time_limit_hard)) ||
        push(tl, limit_item(m->time_limit_soft)))
        goto fail;
    if (put(h, "root_id", str_or_null(m->root_id ? m->root_id : m->id)) ||
        put(h, "parent_id", str_or_null(m->parent_id)) ||
        put(h, "argsrepr",
            m->argsrepr ? cJSON_CreateString(m->argsrepr) : args_repr(args)) ||
        put(h, "kwargsrepr",
            m->kwargsrepr ? cJSON_CreateString(m->kwargsrepr) : kwargs_repr(kwargs)) ||
        put(h, "origin", str_or_null(m->origin)) ||
        put(h, "ignore_result", cJSON_CreateBool(m->ignore_result == 1)))
        goto fail;

    /* Custom headers ride along, after Celery's own, in their original order. */
    for (const cJSON *c = m->headers ? m->headers->child : NULL; c; c = c->next) {
        cJSON *dup, *old;
        if (!c->string || is_std_header(c->string))
            continue;
        dup = cJSON_Duplicate(c, 1);
        if (!dup)
            goto fail;
        old = cJSON_GetObjectItemCaseSensitive(h, c->string);
        if (old) {
            /* A repeated key: the last value wins, in place (Python dict). */
            cJSON_ReplaceItemViaPointer(h, old, dup); /* dup->string was copied */
        } else if (put(h, c->string, dup)) {
            goto fail;
        }
    }
    return h;
fail:
    cJSON_Delete(h);
    return NULL;
}

int celery_msg_encode_v2(const struct task_msg *m, struct buf *body, cJSON **headers)
{
    static const char default_embed[] =
        "{\"callbacks\": null, \"errbacks\": null, \"chain\": null, \"chord\": null}";
    cJSON *empty_args = NULL, *empty_kwargs = NULL;
    const cJSON *args = m->args, *kwargs = m->kwargs;
    struct buf tmp;
    cJSON *h = NULL;
    int rc = CR_ENOMEM;

    *headers = NULL;
    buf_init(&tmp);
    if (!args && !(args = empty_args = cJSON_CreateArray()))
        goto out;
    if (!kwargs && !(kwargs = empty_kwargs = cJSON_CreateObject()))
        goto out;
    h = build_headers(m, args, kwargs);
    if (!h)
        goto out;
    /* Rendered aside and appended once, so a failure leaves *body untouched. */
    if (buf_putc(&tmp, '[') || py_json_dumps(args, &tmp) || buf_puts(&tmp, ", ") ||
        py_json_dumps(kwargs, &tmp) || buf_puts(&tmp, ", ") ||
        (m->embed ? py_json_dumps(m->embed, &tmp) : buf_puts(&tmp, default_embed)) ||
        buf_putc(&tmp, ']') || buf_append(body, tmp.data, tmp.len))
        goto out;
    *headers = h;
    h = NULL;
    rc = 0;
out:
    cJSON_Delete(h);
    cJSON_Delete(empty_args);
    cJSON_Delete(empty_kwargs);
    buf_release(&tmp);
    return rc;
}

cJSON *celery_msg_headers(const struct task_msg *m)
{
    cJSON *empty_args = NULL, *empty_kwargs = NULL, *h = NULL;
    const cJSON *args = m->args, *kwargs = m->kwargs;

    if (m->proto == 1)
        return m->headers ? cJSON_Duplicate(m->headers, 1) : cJSON_CreateObject();
    if ((args || (args = empty_args = cJSON_CreateArray())) &&
        (kwargs || (kwargs = empty_kwargs = cJSON_CreateObject())))
        h = build_headers(m, args, kwargs);
    cJSON_Delete(empty_args);
    cJSON_Delete(empty_kwargs);
    return h;
}

int celery_msg_trace_ctx(const struct task_msg *m, struct trace_ctx *out)
{
    const cJSON *tp = get(m->headers, "traceparent");
    const cJSON *ts = get(m->headers, "tracestate");
    struct trace_ctx c;

    if (!cJSON_IsString(tp) ||
        tracectx_parse_traceparent(&c, tp->valuestring, strlen(tp->valuestring)))
        return 0;
    c.state[0] = '\0';
    if (cJSON_IsString(ts))
        tracectx_set_state(&c, ts->valuestring, strlen(ts->valuestring));
    *out = c;
    return 1;
}
