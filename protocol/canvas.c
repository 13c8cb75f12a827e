/* canvas.c -- the messages a finished task's signatures give, built as Celery
 * 5.2.6's worker builds them (celery/app/trace.py, celery/canvas.py,
 * celery/backends/base.py and redis.py). Pure: no I/O, no clock, no
 * randomness of its own.
 *
 * Python applies a signature through a chain of apply_async() overrides, each
 * merging the options it is given into the signature's own. The functions
 * below follow that shape: apply() takes a signature dict, the partial args
 * to prepend and the options "passed" by the caller, and dispatches on
 * subtask_type. Every signature dict is only read; what Python mutates in
 * place (freeze() writing task_id, group_id, chord into options) is done on
 * copies. */
#include "canvas.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "isotime.h"
#include "pyjson.h"
#include "../util/alloc.h"

/* Deepest signature nesting applied (a group in a chord in a chain...). Celery
 * has no limit but Python's recursion limit; a hostile message must not make
 * the worker recurse without bound. */
#define CANVAS_MAX_DEPTH 32
/* Most messages one plan may hold: a group of groups can multiply. */
#define CANVAS_MAX_MSGS 100000

struct ctx {
    const struct canvas_opts *o;
    struct canvas_plan *p;
    struct cr_err *err;
    /* The task that finished: Celery's current_worker_task, whose ids
     * send_task() fills in when the options do not name a parent and root. */
    const char *cur_id;
    const char *cur_root;
    /* Set for the one signature trace.py applies as it came (a lone
     * callback, the next chain step), read and cleared by apply(): without
     * partial args Python then sends the args list as it was decoded, whose
     * argsrepr is "[...]", where every cloned signature has a tuple. */
    int direct;
};

static int apply(struct ctx *c, const cJSON *sig, const cJSON *partial,
                 const cJSON *passed, int depth);

/* ---- small helpers ---------------------------------------------------- */

static int oom(struct ctx *c)
{
    return cr_err_set(c->err, CR_ENOMEM, "out of memory building the canvas plan");
}

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_IsObject(obj) ? cJSON_GetObjectItemCaseSensitive(obj, key) : NULL;
}

/* A non-empty string member, else NULL. */
static const char *get_str(const cJSON *obj, const char *key)
{
    const cJSON *v = get(obj, key);
    return cJSON_IsString(v) && v->valuestring[0] ? v->valuestring : NULL;
}

/* Python's truth of a JSON value. */
static int truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return 0;
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v))
        return v->child != NULL;
    return 1;
}

/* obj[key] = val as a Python dict assignment: an existing key keeps its place.
 * Takes val, also on failure. */
static int set_item(cJSON *obj, const char *key, cJSON *val)
{
    cJSON *old;
    if (!val)
        return CR_ENOMEM;
    old = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (old) {
        /* This one gives val the key (ReplaceItemViaPointer would not). */
        if (!cJSON_ReplaceItemInObjectCaseSensitive(obj, key, val)) {
            cJSON_Delete(val);
            return CR_ENOMEM;
        }
        return 0;
    }
    if (!cJSON_AddItemToObject(obj, key, val)) {
        cJSON_Delete(val);
        return CR_ENOMEM;
    }
    return 0;
}

static int set_str(cJSON *obj, const char *key, const char *s)
{
    return set_item(obj, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

static int set_dup(cJSON *obj, const char *key, const cJSON *v)
{
    return set_item(obj, key, v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
}

/* dict(base, **over): a new object. drop_null skips None values of over (as
 * Signature.apply_async drops them); keep_gid keeps base's group_id
 * (Signature._IMMUTABLE_OPTIONS). NULL on OOM. */
/* Whether over's v replaces base's value of the same key in merge(). */
static int overrides(const cJSON *v, const cJSON *base, int drop_null, int keep_gid)
{
    if (!v->string || (drop_null && cJSON_IsNull(v)))
        return 0;
    return !(keep_gid && !strcmp(v->string, "group_id") && get(base, "group_id"));
}

static cJSON *merge(const cJSON *base, const cJSON *over, int drop_null, int keep_gid)
{
    cJSON *out = cJSON_CreateObject();
    if (!out)
        return NULL;
    if (!cJSON_IsObject(over))
        over = NULL;
    /* base's keys in their order, each value from over when over replaces it
     * (copied once: the values are often whole chord bodies) */
    for (const cJSON *b = cJSON_IsObject(base) ? base->child : NULL; b; b = b->next) {
        const cJSON *v = b->string ? get(over, b->string) : NULL;
        cJSON *d;
        if (!b->string)
            continue;
        d = cJSON_Duplicate(v && overrides(v, base, drop_null, keep_gid) ? v : b, 1);
        if (!d || !cJSON_AddItemToObject(out, b->string, d)) {
            cJSON_Delete(d);
            cJSON_Delete(out);
            return NULL;
        }
    }
    for (const cJSON *v = over ? over->child : NULL; v; v = v->next) {
        if (!overrides(v, base, drop_null, keep_gid) || get(base, v->string))
            continue;
        if (set_dup(out, v->string, v)) {
            cJSON_Delete(out);
            return NULL;
        }
    }
    return out;
}

/* The parts of a signature dict, borrowed; absent or null members read as
 * empty (NULL here). CR_EPROTO for what Signature() could not take. */
struct sig {
    const char *task;
    const char *type; /* subtask_type, NULL for a plain task */
    const cJSON *args, *kwargs, *options;
    int immutable;
};

/* s[key] into *out: a list (list set) or a dict, or NULL when absent or null;
 * anything else is CR_EPROTO. */
static int sig_member(struct ctx *c, const cJSON *s, const char *task, const char *key,
                      int list, const cJSON **out)
{
    const cJSON *v = get(s, key);
    *out = cJSON_IsNull(v) ? NULL : v;
    if (*out && !(list ? cJSON_IsArray(*out) : cJSON_IsObject(*out)))
        return cr_err_set(c->err, CR_EPROTO, "signature '%.100s': %s is not a %s", task,
                          key, list ? "list" : "dict");
    return 0;
}

static int sig_parts(struct ctx *c, const cJSON *s, struct sig *out)
{
    const cJSON *t, *st;
    int rc;
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(s))
        return cr_err_set(c->err, CR_EPROTO, "signature is not a dict");
    t = get(s, "task");
    if (!cJSON_IsString(t) || !t->valuestring[0])
        return cr_err_set(c->err, CR_EPROTO, "signature has no task name");
    out->task = t->valuestring;
    st = get(s, "subtask_type");
    if (st && !cJSON_IsNull(st)) {
        if (!cJSON_IsString(st))
            return cr_err_set(c->err, CR_EPROTO, "signature '%.100s': bad subtask_type",
                              out->task);
        if (st->valuestring[0])
            out->type = st->valuestring;
    }
    if ((rc = sig_member(c, s, out->task, "args", 1, &out->args)) ||
        (rc = sig_member(c, s, out->task, "kwargs", 0, &out->kwargs)) ||
        (rc = sig_member(c, s, out->task, "options", 0, &out->options)))
        return rc;
    out->immutable = truthy(get(s, "immutable"));
    return 0;
}

/* partial + args as a new list (args alone when immutable or no partial). */
static cJSON *join_args(const cJSON *partial, const cJSON *args, int immutable)
{
    cJSON *out = cJSON_CreateArray();
    if (!out)
        return NULL;
    if (!immutable && partial) {
        for (const cJSON *v = partial->child; v; v = v->next) {
            cJSON *d = cJSON_Duplicate(v, 1);
            if (!d || !cJSON_AddItemToArray(out, d)) {
                cJSON_Delete(d);
                goto fail;
            }
        }
    }
    for (const cJSON *v = args ? args->child : NULL; v; v = v->next) {
        cJSON *d = cJSON_Duplicate(v, 1);
        if (!d || !cJSON_AddItemToArray(out, d)) {
            cJSON_Delete(d);
            goto fail;
        }
    }
    return out;
fail:
    cJSON_Delete(out);
    return NULL;
}

/* maybe_list(): a dict alone becomes [dict]; null/absent stays null. */
static cJSON *maybe_list(const cJSON *v)
{
    cJSON *out, *d;
    if (!v || cJSON_IsNull(v))
        return cJSON_CreateNull();
    if (cJSON_IsArray(v))
        return cJSON_Duplicate(v, 1);
    out = cJSON_CreateArray();
    d = cJSON_Duplicate(v, 1);
    if (!out || !d || !cJSON_AddItemToArray(out, d)) {
        cJSON_Delete(out);
        cJSON_Delete(d);
        return NULL;
    }
    return out;
}

static int new_id(struct ctx *c, char out[37])
{
    out[0] = 0;
    c->o->new_uuid(out, c->o->uuid_arg);
    out[36] = 0;
    return 0;
}

/* fnmatch-style glob: '*' any run, '?' one byte. */
static int glob_match(const char *p, size_t plen, const char *s)
{
    size_t pi = 0, star = (size_t)-1;
    const char *si = s, *mark = NULL;
    while (*si) {
        if (pi < plen && (p[pi] == '?' || p[pi] == *si)) {
            pi++;
            si++;
        } else if (pi < plen && p[pi] == '*') {
            star = pi++;
            mark = si;
        } else if (star != (size_t)-1) {
            pi = star + 1;
            si = ++mark;
        } else {
            return 0;
        }
    }
    while (pi < plen && p[pi] == '*')
        pi++;
    return pi == plen;
}

/* The queue of a task by --task-route, else the default queue. */
static const char *route_queue(const struct canvas_opts *o, const char *name)
{
    for (int i = 0; i < o->nroutes; i++) {
        const char *r = o->routes[i], *eq = r ? strrchr(r, '=') : NULL;
        if (eq && eq[1] && glob_match(r, (size_t)(eq - r), name))
            return eq + 1;
    }
    return o->default_queue ? o->default_queue : "celery";
}

/* ---- the plan ----------------------------------------------------------- */

void canvas_plan_init(struct canvas_plan *p)
{
    memset(p, 0, sizeof *p);
}

static void msg_release(struct canvas_msg *m)
{
    cr_free(m->id);
    cr_free(m->task);
    cr_free(m->exchange);
    cr_free(m->routing_key);
    cr_free(m->reply_to);
    cr_free(m->expiration);
    cJSON_Delete(m->headers);
    buf_release(&m->body);
}

void canvas_plan_release(struct canvas_plan *p)
{
    for (size_t i = 0; i < p->nmsgs; i++)
        msg_release(&p->msgs[i]);
    cr_free(p->msgs);
    for (size_t i = 0; i < p->nsizes; i++)
        cr_free(p->sizes[i].group_id);
    cr_free(p->sizes);
    for (size_t i = 0; i < p->nfails; i++)
        cr_free(p->fails[i]);
    cr_free(p->fails);
    for (size_t i = 0; i < p->nparts; i++) {
        cr_free(p->parts[i].task_id);
        cr_free(p->parts[i].group_id);
        cJSON_Delete(p->parts[i].body);
    }
    cr_free(p->parts);
    canvas_plan_init(p);
}

/* Makes room for element n of an array that holds n: capacities are powers
 * of two from 8, so the capacity need not be stored. */
static int grow(void **arr, size_t n, size_t size)
{
    size_t cap;
    void *np;
    if (n != 0 && (n < 8 || (n & (n - 1)) != 0))
        return 0;
    cap = n == 0 ? 8 : n * 2;
    np = cr_realloc(*arr, cap * size);
    if (!np)
        return CR_ENOMEM;
    *arr = np;
    return 0;
}

static int add_size(struct ctx *c, const char *gid, long size)
{
    struct canvas_plan *p = c->p;
    char *g;
    if (grow((void **)&p->sizes, p->nsizes, sizeof *p->sizes))
        return oom(c);
    g = cr_strdup(gid);
    if (!g)
        return oom(c);
    p->sizes[p->nsizes].group_id = g;
    p->sizes[p->nsizes].size = size;
    p->nsizes++;
    return 0;
}

static int add_fail(struct ctx *c, const char *id)
{
    struct canvas_plan *p = c->p;
    char *d;
    if (grow((void **)&p->fails, p->nfails, sizeof *p->fails))
        return oom(c);
    d = cr_strdup(id);
    if (!d)
        return oom(c);
    p->fails[p->nfails++] = d;
    return 0;
}

/* ---- one task message (send_task + as_task_v2 + send_task_message) ------ */

/* opts[key] detached (the caller owns it), or a new null when absent. */
static cJSON *take(cJSON *opts, const char *key)
{
    cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(opts, key);
    return v ? v : cJSON_CreateNull();
}

/* take() through maybe_list(). */
static cJSON *take_list(cJSON *opts, const char *key)
{
    cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(opts, key), *l;
    if (!v || cJSON_IsNull(v) || cJSON_IsArray(v))
        return v ? v : cJSON_CreateNull();
    l = cJSON_CreateArray();
    if (!l || !cJSON_AddItemToArray(l, v)) {
        cJSON_Delete(l);
        cJSON_Delete(v);
        return NULL;
    }
    return l;
}

static int opt_seconds(struct ctx *c, const char *task, const char *key, const cJSON *v,
                       double *out)
{
    *out = 0;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return cr_err_set(c->err, CR_EPROTO, "signature '%.100s': bad %s", task, key);
    *out = v->valuedouble;
    return 0;
}

/* Publishes one plain task: name, args and kwargs as given (already merged),
 * every other field from opts (the merged options). route is the name routes
 * match against. */
static int publish(struct ctx *c, const char *name, cJSON *args, const cJSON *kwargs,
                   cJSON *opts, const char *route)
{
    struct task_msg m;
    struct canvas_msg out;
    struct canvas_plan *p = c->p;
    const cJSON *v;
    char idbuf[37];
    const char *s, *ex, *rk, *queue;
    double secs;
    int rc;

    memset(&out, 0, sizeof out);
    buf_init(&out.body);
    task_msg_init(&m);
    m.args = args; /* taken */
    if (p->nmsgs >= CANVAS_MAX_MSGS) {
        rc = cr_err_set(c->err, CR_EPROTO, "canvas plan larger than %d messages",
                        CANVAS_MAX_MSGS);
        goto out;
    }
    m.proto = 2;
    rc = CR_ENOMEM;
    s = get_str(opts, "task_id");
    if (!s) {
        new_id(c, idbuf);
        s = idbuf;
    }
    if (!(m.id = cr_strdup(s)) || !(m.task = cr_strdup(name)))
        goto oom;
    if (!(m.kwargs = kwargs ? cJSON_Duplicate(kwargs, 1) : cJSON_CreateObject()))
        goto oom;
    if (!(s = get_str(opts, "root_id")))
        s = c->cur_root;
    if (s && !(m.root_id = cr_strdup(s)))
        goto oom;
    if (!(s = get_str(opts, "parent_id")))
        s = c->cur_id;
    if (s && !(m.parent_id = cr_strdup(s)))
        goto oom;
    if ((s = get_str(opts, "shadow")) && !(m.shadow = cr_strdup(s)))
        goto oom;
    if ((s = get_str(opts, "group_id")) && !(m.group = cr_strdup(s)))
        goto oom;
    v = get(opts, "group_index");
    if (cJSON_IsNumber(v)) {
        m.group_index = (long)v->valuedouble;
        m.has_group_index = 1;
    }
    v = get(opts, "retries");
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 1e9)
        m.retries = (int)v->valuedouble;

    /* countdown wins over eta when it is non-zero (as_task_v2). */
    if ((rc = opt_seconds(c, name, "countdown", get(opts, "countdown"), &secs)))
        goto out;
    rc = CR_ENOMEM;
    v = get(opts, "eta");
    if (secs != 0) {
        m.eta_us = c->o->now_us + (int64_t)llround(secs * 1e6);
    } else if (cJSON_IsString(v) && v->valuestring[0]) {
        if (!(m.eta = cr_strdup(v->valuestring)))
            goto oom;
    } else if (v && !cJSON_IsNull(v) && truthy(v)) {
        rc = cr_err_set(c->err, CR_EPROTO, "signature '%.100s': bad eta", name);
        goto out;
    }
    v = get(opts, "expires");
    if (cJSON_IsNumber(v)) {
        char ms[32];
        double e = v->valuedouble;
        if (!isfinite(e) || fabs(e) > 1e12) {
            rc = cr_err_set(c->err, CR_EPROTO, "signature '%.100s': bad expires", name);
            goto out;
        }
        m.expires_us = c->o->now_us + (int64_t)llround(e * 1e6);
        snprintf(ms, sizeof ms, "%lld", (long long)(e < 0 ? 0 : (e * 1000)));
        if (!(out.expiration = cr_strdup(ms)))
            goto oom;
    } else if (cJSON_IsString(v) && v->valuestring[0]) {
        /* Celery 5.2.6's send_task cannot take an ISO string here (it compares
         * it with 0); the header keeps the text and the TTL follows from it. */
        int64_t at;
        char ms[32];
        if (!(m.expires = cr_strdup(v->valuestring)))
            goto oom;
        if (iso8601_parse(v->valuestring, &at) == 0) {
            int64_t d = (at - c->o->now_us) / 1000;
            snprintf(ms, sizeof ms, "%lld", (long long)(d < 0 ? 0 : d));
            if (!(out.expiration = cr_strdup(ms)))
                goto oom;
        }
    }
    if ((rc = opt_seconds(c, name, "time_limit", get(opts, "time_limit"),
                          &m.time_limit_hard)) ||
        (rc = opt_seconds(c, name, "soft_time_limit", get(opts, "soft_time_limit"),
                          &m.time_limit_soft)))
        goto out;
    rc = CR_ENOMEM;
    m.ignore_result = truthy(get(opts, "ignore_result"));
    v = get(opts, "argsrepr");
    if (cJSON_IsString(v) && !(m.argsrepr = cr_strdup(v->valuestring)))
        goto oom;
    v = get(opts, "kwargsrepr");
    if (cJSON_IsString(v) && !(m.kwargsrepr = cr_strdup(v->valuestring)))
        goto oom;
    if (c->o->hostname && !(m.origin = cr_strdup(c->o->hostname)))
        goto oom;

    /* The embed: link / link_error through maybe_list(), chain and chord as
     * the options hold them (a chain of [] stays [], as Python sends it),
     * moved out of opts rather than copied: they can be large and opts is
     * only read for the headers after this. */
    if (!(m.embed = cJSON_CreateObject()) ||
        set_item(m.embed, "callbacks", take_list(opts, "link")) ||
        set_item(m.embed, "errbacks", take_list(opts, "link_error")) ||
        set_item(m.embed, "chain", take(opts, "chain")) ||
        set_item(m.embed, "chord", take(opts, "chord")))
        goto oom;

    if (celery_msg_encode_v2(&m, &out.body, &out.headers))
        goto oom;
    /* timelimit holds the two options as given, so 30.0 stays 30.0 and 0
     * stays 0 (the struct keeps doubles and reads 0 as unset). */
    {
        const cJSON *hard = get(opts, "time_limit"), *soft = get(opts, "soft_time_limit");
        cJSON *tl = cJSON_CreateArray();
        cJSON *h = hard ? cJSON_Duplicate(hard, 1) : cJSON_CreateNull();
        cJSON *so = soft ? cJSON_Duplicate(soft, 1) : cJSON_CreateNull();
        if (!tl || !h || !so) {
            cJSON_Delete(tl);
            cJSON_Delete(h);
            cJSON_Delete(so);
            goto oom;
        }
        cJSON_AddItemToArray(tl, h); /* cannot fail with both non-NULL */
        cJSON_AddItemToArray(tl, so);
        if (set_item(out.headers, "timelimit", tl))
            goto oom;
    }
    /* Stamps, as a Celery 5.3+ producer writes them: a stamped signature's
     * options list the stamp names in stamped_headers and hold each value
     * under its name; the message carries both, and replaced_task_nesting. */
    v = get(opts, "stamped_headers");
    if (cJSON_IsArray(v)) {
        cJSON *stamps = cJSON_CreateObject();
        if (!stamps || set_item(out.headers, "stamps", stamps) ||
            set_dup(out.headers, "stamped_headers", v))
            goto oom;
        for (const cJSON *n = v->child; n; n = n->next) {
            const cJSON *sv = cJSON_IsString(n) ? get(opts, n->valuestring) : NULL;
            if (sv && set_dup(stamps, n->valuestring, sv))
                goto oom;
        }
    }
    v = get(opts, "replaced_task_nesting");
    if (cJSON_IsNumber(v) && set_dup(out.headers, "replaced_task_nesting", v))
        goto oom;
    /* headers= is merged over the message's headers (send_task_message's
     * headers2.update(headers)). */
    v = get(opts, "headers");
    for (const cJSON *h = cJSON_IsObject(v) ? v->child : NULL; h; h = h->next)
        if (h->string && set_dup(out.headers, h->string, h))
            goto oom;

    v = get(opts, "priority");
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 255)
        out.priority = (int)v->valuedouble;
    if (!(s = get_str(opts, "reply_to")))
        s = c->o->reply_to;
    if (s && !(out.reply_to = cr_strdup(s)))
        goto oom;

    /* Routing, as send_task_message does it for direct exchanges. */
    ex = get_str(opts, "exchange");
    rk = get_str(opts, "routing_key");
    queue = get_str(opts, "queue");
    if (ex && rk) {
        out.exchange = cr_strdup(ex);
        out.routing_key = cr_strdup(rk);
    } else {
        out.exchange = cr_strdup("");
        out.routing_key =
            cr_strdup(queue ? queue : route_queue(c->o, route ? route : name));
    }
    if (!out.exchange || !out.routing_key)
        goto oom;
    if (!(out.id = cr_strdup(m.id)) || !(out.task = cr_strdup(m.task)))
        goto oom;
    if (grow((void **)&p->msgs, p->nmsgs, sizeof *p->msgs))
        goto oom;
    p->msgs[p->nmsgs++] = out;
    task_msg_release(&m);
    return 0;
oom:
    rc = oom(c);
out:
    msg_release(&out);
    task_msg_release(&m);
    return rc;
}

/* ---- signatures --------------------------------------------------------- */

/* Signature.apply_async for a plain task. */
static int apply_plain(struct ctx *c, const struct sig *s, const cJSON *partial,
                       const cJSON *passed, int direct)
{
    cJSON *opts = merge(s->options, passed, 1, 1), *args;
    int rc;
    if (!opts)
        return oom(c);
    args = join_args(partial, s->args, s->immutable);
    if (!args) {
        cJSON_Delete(opts);
        return oom(c);
    }
    /* as_task_v2's "args or ()" makes an empty list a tuple again */
    if (direct && args->child && (s->immutable || !partial || !partial->child) &&
        !get(opts, "argsrepr")) {
        struct buf r;
        buf_init(&r);
        if (py_repr(args, &r, 1024) ||
            set_str(opts, "argsrepr", r.data ? r.data : "[]")) {
            buf_release(&r);
            cJSON_Delete(opts);
            cJSON_Delete(args);
            return oom(c);
        }
        buf_release(&r);
    }
    rc = publish(c, s->task, args, s->kwargs, opts, NULL);
    cJSON_Delete(opts);
    return rc;
}

/* Celery's _chord._descend(): how many results a header member adds. */
static long descend(const cJSON *sig, int depth)
{
    const char *type = get_str(sig, "subtask_type");
    const cJSON *kw = get(sig, "kwargs");
    long n = 0;
    if (depth > CANVAS_MAX_DEPTH)
        return 1;
    if (!type)
        return 1;
    if (!strcmp(type, "group")) {
        const cJSON *t = get(kw, "tasks");
        for (const cJSON *v = cJSON_IsArray(t) ? t->child : NULL; v; v = v->next)
            n += descend(v, depth + 1);
        return n;
    }
    if (!strcmp(type, "chain")) {
        const cJSON *t = get(kw, "tasks");
        /* from the last step back (cJSON keeps the last item in child->prev) */
        const cJSON *first = cJSON_IsArray(t) ? t->child : NULL;
        for (const cJSON *v = first ? first->prev : NULL; v;
             v = v == first ? NULL : v->prev) {
            n = descend(v, depth + 1);
            if (n > 0)
                return n;
        }
        return 0;
    }
    if (!strcmp(type, "chord"))
        return descend(get(kw, "body"), depth + 1);
    return 1;
}

static int flatten_n(struct ctx *c, const cJSON *tasks, cJSON *out, size_t *n, int depth);

/* Appends the leaves of a group's task list to out (copies), nested groups
 * flattened in order (group._prepared / _freeze_unroll). */
static int flatten(struct ctx *c, const cJSON *tasks, cJSON *out, int depth)
{
    size_t n = 0;
    return flatten_n(c, tasks, out, &n, depth);
}

static int flatten_n(struct ctx *c, const cJSON *tasks, cJSON *out, size_t *n, int depth)
{
    if (depth > CANVAS_MAX_DEPTH)
        return cr_err_set(c->err, CR_EPROTO, "signature nested deeper than %d",
                          CANVAS_MAX_DEPTH);
    if (!cJSON_IsArray(tasks))
        return cr_err_set(c->err, CR_EPROTO, "group tasks is not a list");
    for (const cJSON *t = tasks->child; t; t = t->next) {
        const char *type = get_str(t, "subtask_type");
        if (!cJSON_IsObject(t))
            return cr_err_set(c->err, CR_EPROTO, "group member is not a dict");
        if (type && !strcmp(type, "group")) {
            int rc = flatten_n(c, get(get(t, "kwargs"), "tasks"), out, n, depth + 1);
            if (rc)
                return rc;
            continue;
        }
        if (++*n > CANVAS_MAX_MSGS)
            return cr_err_set(c->err, CR_EPROTO, "group larger than %d members",
                              CANVAS_MAX_MSGS);
        cJSON *d = cJSON_Duplicate(t, 1);
        if (!d || !cJSON_AddItemToArray(out, d)) {
            cJSON_Delete(d);
            return oom(c);
        }
    }
    return 0;
}

/* A member's options object, created when missing (for freeze on a copy). */
static cJSON *own_options(cJSON *sig)
{
    cJSON *o = cJSON_GetObjectItemCaseSensitive(sig, "options");
    if (cJSON_IsObject(o))
        return o;
    if (set_item(sig, "options", cJSON_CreateObject()))
        return NULL;
    return cJSON_GetObjectItemCaseSensitive(sig, "options");
}

/* Signature.freeze() on a copy's options: task_id (id, else a fresh one)
 * unless present, root_id and parent_id when given, reply_to unless present,
 * group_id when given and absent, chord when given, group_index when >= 0. */
static int freeze_opts(struct ctx *c, cJSON *o, const char *id, const char *root,
                       const char *parent, const char *gid, const cJSON *chord, long gidx)
{
    if (!get(o, "task_id")) {
        char fresh[37];
        if (!id) {
            new_id(c, fresh);
            id = fresh;
        }
        if (set_str(o, "task_id", id))
            return oom(c);
    }
    if ((root && set_str(o, "root_id", root)) ||
        (parent && set_str(o, "parent_id", parent)))
        return oom(c);
    if (c->o->reply_to && !get(o, "reply_to") && set_str(o, "reply_to", c->o->reply_to))
        return oom(c);
    if (gid && !get(o, "group_id") && set_str(o, "group_id", gid))
        return oom(c);
    if (chord && set_dup(o, "chord", chord))
        return oom(c);
    if (gidx >= 0 && set_item(o, "group_index", cJSON_CreateNumber((double)gidx)))
        return oom(c);
    return 0;
}

/* group.apply_async over already flattened members (copies, mutated here by
 * the freeze). gopts are the group's merged options; "task_id" is the group
 * id. */
static int apply_members(struct ctx *c, cJSON *members, const cJSON *gopts,
                         const cJSON *partial, int header, int depth)
{
    cJSON *opts = NULL, *chord = NULL;
    const char *root;
    char gid[37];
    const char *g = get_str(gopts, "task_id");
    long size = 0;
    int rc = 0, n = cJSON_GetArraySize(members), i = 0;

    if (n == 0)
        return 0; /* an empty group publishes nothing (group.freeze()) */
    /* _freeze_gid() draws a uuid even when it has an id (the default of
     * options.pop('task_id', uuid())); drawn here too, so ids made later
     * match Python's. */
    new_id(c, gid);
    if (g) {
        if (strlen(g) > 36)
            return cr_err_set(c->err, CR_EPROTO, "group id too long");
        snprintf(gid, sizeof gid, "%s", g);
    }
    /* _freeze_gid(): task_id becomes group_id; a chord key is the chord
     * parameter of _apply_tasks, not an option passed on. */
    opts = merge(gopts, NULL, 0, 0);
    if (!opts)
        return oom(c);
    cJSON_DeleteItemFromObjectCaseSensitive(opts, "task_id");
    if (set_str(opts, "group_id", gid))
        goto oom;
    chord = cJSON_DetachItemFromObjectCaseSensitive(opts, "chord");
    if (chord && cJSON_IsNull(chord)) {
        cJSON_Delete(chord);
        chord = NULL;
    }
    root = get_str(opts, "root_id");
    /* Fail before building any of a group that cannot fit. */
    if ((size_t)n > CANVAS_MAX_MSGS - c->p->nmsgs) {
        rc = cr_err_set(c->err, CR_EPROTO, "canvas plan larger than %d messages",
                        CANVAS_MAX_MSGS);
        goto out;
    }

    for (cJSON *t = members->child; t; t = t->next)
        size += descend(t, depth);
    for (cJSON *t = members->child; t; t = t->next, i++) {
        cJSON *mo = own_options(t), *passed;
        const cJSON *cobj;
        if (!mo)
            goto oom;
        /* _prepared(): freeze(group_id=gid, root_id=root) on the clone; a
         * composite member gets its ids when it is applied */
        if (!get_str(t, "subtask_type") &&
            (rc = freeze_opts(c, mo, NULL, root, NULL, gid, NULL, -1)))
            goto out;
        cobj = chord ? chord : get(mo, "chord");
        if (cJSON_IsNull(cobj))
            cobj = NULL;
        /* Celery sets the size only when the last member carries the chord,
         * which a chain as last header member does not (its last step does):
         * such a chord would never complete, so a chord header always sets
         * it here. */
        if ((cobj || header) && i == n - 1) {
            const char *mg = get_str(mo, "group_id");
            if ((rc = add_size(c, mg ? mg : gid, size)))
                goto out;
        }
        passed = merge(opts, NULL, 0, 0);
        if (!passed || (cobj && set_dup(passed, "chord", cobj))) {
            cJSON_Delete(passed);
            goto oom;
        }
        rc = apply(c, t, partial, passed, depth + 1);
        cJSON_Delete(passed);
        if (rc)
            goto out;
    }
    goto out;
oom:
    rc = oom(c);
out:
    cJSON_Delete(chord);
    cJSON_Delete(opts);
    return rc;
}

/* group.apply_async(partial, **passed). */
static int apply_group(struct ctx *c, const struct sig *s, const cJSON *partial,
                       const cJSON *passed, int depth)
{
    cJSON *members = cJSON_CreateArray(), *gopts = NULL;
    int rc;
    if (!members)
        return oom(c);
    rc = flatten(c, get(s->kwargs, "tasks"), members, depth + 1);
    if (rc)
        goto out;
    gopts = merge(s->options, passed, 0, 0);
    if (!gopts) {
        rc = oom(c);
        goto out;
    }
    rc = apply_members(c, members, gopts, partial, 0, depth);
out:
    cJSON_Delete(gopts);
    cJSON_Delete(members);
    return rc;
}

/* Appends a chain's steps to out (copies), nested chains inlined. */
static int chain_steps(struct ctx *c, const cJSON *tasks, cJSON *out, int depth)
{
    if (depth > CANVAS_MAX_DEPTH)
        return cr_err_set(c->err, CR_EPROTO, "signature nested deeper than %d",
                          CANVAS_MAX_DEPTH);
    if (!cJSON_IsArray(tasks))
        return cr_err_set(c->err, CR_EPROTO, "chain tasks is not a list");
    for (const cJSON *t = tasks->child; t; t = t->next) {
        const char *type = get_str(t, "subtask_type");
        const cJSON *sub;
        cJSON *d;
        if (!cJSON_IsObject(t))
            return cr_err_set(c->err, CR_EPROTO, "chain step is not a dict");
        if (type && !strcmp(type, "chain")) {
            int rc = chain_steps(c, get(get(t, "kwargs"), "tasks"), out, depth + 1);
            if (rc)
                return rc;
            continue;
        }
        /* maybe_unroll_group(): a group of one is that one task */
        sub = get(get(t, "kwargs"), "tasks");
        if (type && !strcmp(type, "group") && cJSON_GetArraySize(sub) == 1)
            t = sub->child;
        d = cJSON_Duplicate(t, 1);
        if (!d || !cJSON_AddItemToArray(out, d)) {
            cJSON_Delete(d);
            return oom(c);
        }
    }
    return 0;
}

/* A chord signature {header: group, body} as prepare_steps builds it when a
 * group is followed by another step. Takes header and body. */
static cJSON *make_chord(cJSON *header, cJSON *body, const char *task_id,
                         const char *root_id)
{
    cJSON *s = cJSON_CreateObject(), *kw = NULL, *o = NULL;
    if (!s || set_str(s, "task", "celery.chord") ||
        set_item(s, "args", cJSON_CreateArray()) ||
        set_item(s, "kwargs", kw = cJSON_CreateObject()) ||
        set_item(kw, "kwargs", cJSON_CreateObject())) {
        cJSON_Delete(header);
        cJSON_Delete(body);
        cJSON_Delete(s);
        return NULL;
    }
    if (set_item(kw, "header", header)) {
        cJSON_Delete(body);
        cJSON_Delete(s);
        return NULL;
    }
    if (set_item(kw, "body", body) || set_item(s, "options", o = cJSON_CreateObject()) ||
        (task_id && set_str(o, "task_id", task_id)) ||
        (root_id && set_str(o, "root_id", root_id)) ||
        set_str(s, "subtask_type", "chord") ||
        set_item(s, "immutable", cJSON_CreateFalse())) {
        cJSON_Delete(s);
        return NULL;
    }
    return s;
}

/* extend_list_option(): appends add (a signature or a list) to o[key], as a
 * list; with nodup, items already there are skipped (append_to_list_option). */
static int extend_list(cJSON *o, const char *key, const cJSON *add, int nodup)
{
    cJSON *l = maybe_list(get(o, key)), *more = maybe_list(add), *x;
    if (!l || !more) {
        cJSON_Delete(l);
        cJSON_Delete(more);
        return CR_ENOMEM;
    }
    if (cJSON_IsNull(l)) {
        cJSON_Delete(l);
        l = cJSON_CreateArray();
        if (!l) {
            cJSON_Delete(more);
            return CR_ENOMEM;
        }
    }
    while ((x = more->child) != NULL) {
        int dup = 0;
        cJSON_DetachItemViaPointer(more, x);
        for (const cJSON *y = nodup ? l->child : NULL; y && !dup; y = y->next)
            dup = cJSON_Compare(x, y, 1);
        if (dup)
            cJSON_Delete(x);
        else
            cJSON_AddItemToArray(l, x);
    }
    cJSON_Delete(more);
    return set_item(o, key, l);
}

/* _chain.apply_async / run / prepare_steps. */
static int apply_chain(struct ctx *c, const struct sig *s, const cJSON *partial,
                       const cJSON *passed, int depth)
{
    cJSON *steps = cJSON_CreateArray(), *opts = NULL, *rest = NULL, *args = NULL,
          *fpassed = NULL, **v = NULL, *x;
    const cJSON *link, *link_error, *chord, *gidx, *outer;
    const char *root, *last_id, *group_id;
    size_t n = 0;
    int rc;

    if (!steps)
        return oom(c);
    rc = chain_steps(c, get(s->kwargs, "tasks"), steps, depth + 1);
    if (rc)
        goto out;
    for (x = steps->child; x; x = x->next)
        n++;
    if (n == 0)
        goto out; /* an empty chain applies nothing */
    if (n > CANVAS_MAX_MSGS) {
        rc = cr_err_set(c->err, CR_EPROTO, "chain longer than %d steps", CANVAS_MAX_MSGS);
        goto out;
    }
    /* The steps by index, detached: prepare_steps walks them back to front. */
    if (!(v = cr_calloc(n, sizeof *v)))
        goto oom;
    for (size_t i = 0; (x = steps->child) != NULL; i++) {
        cJSON_DetachItemViaPointer(steps, x);
        v[i] = x;
    }
    if (!(opts = merge(s->options, passed, 0, 0)))
        goto oom;
    /* run()'s own parameters, which are not passed on to the first step */
    root = get_str(opts, "root_id");
    last_id = get_str(opts, "task_id");
    group_id = get_str(opts, "group_id");
    chord = get(opts, "chord");
    gidx = get(opts, "group_index");
    link = get(opts, "link");
    link_error = get(opts, "link_error");
    if (cJSON_IsNull(chord))
        chord = NULL;
    if (cJSON_IsNull(link))
        link = NULL;
    if (cJSON_IsNull(link_error))
        link_error = NULL;
    /* the partial args (and a chain's own, rare) go to the first step */
    if (!(args = join_args(partial, s->args, s->immutable)))
        goto oom;

    for (size_t k = n; k-- > 0;) {
        const char *type = get_str(v[k], "subtask_type");
        int last = k == n - 1;
        cJSON *o;
        if (type && !strcmp(type, "group") && !last) {
            /* A group followed by a step: the chord the client would make,
             * whose id is the body's. */
            size_t b = k + 1;
            cJSON *ch;
            char bid[37] = "";
            const char *bs;
            while (b < n && !v[b])
                b++;
            bs = get_str(get(v[b], "options"), "task_id");
            if (bs)
                snprintf(bid, sizeof bid, "%.36s", bs);
            ch = make_chord(v[k], v[b], bs ? bid : NULL, root);
            v[k] = ch;
            v[b] = NULL;
            if (!ch)
                goto oom;
            type = "chord";
        }
        if (!(o = own_options(v[k])))
            goto oom;
        if (!type) {
            /* freeze(); the last step also gets the chain's id, group, chord */
            rc = freeze_opts(c, o, last ? last_id : NULL, root, NULL,
                             last ? group_id : NULL, last ? chord : NULL,
                             last && cJSON_IsNumber(gidx) ? (long)gidx->valuedouble : -1);
            if (rc)
                goto out;
        }
        if ((last && link && extend_list(o, "link", link, 0)) ||
            (link_error && extend_list(o, "link_error", link_error, 1)))
            goto oom;
    }

    /* The first step goes out with the rest, reversed, as its chain; an
     * outer chain already in the options comes first (it runs after). */
    outer = get(opts, "chain");
    if (!(rest = cJSON_IsArray(outer) ? cJSON_Duplicate(outer, 1) : cJSON_CreateArray()))
        goto oom;
    for (size_t k = n; k-- > 1;) {
        if (v[k] && !cJSON_AddItemToArray(rest, v[k]))
            goto oom;
        v[k] = NULL;
    }
    if (!(fpassed = merge(opts, NULL, 0, 0)))
        goto oom;
    static const char *const run_params[] = {"group_id",  "chord",      "task_id",
                                             "link",      "link_error", "root_id",
                                             "parent_id", "group_index"};
    for (size_t i = 0; i < sizeof run_params / sizeof *run_params; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(fpassed, run_params[i]);
    rc = set_item(fpassed, "chain", rest);
    rest = NULL;
    if (rc)
        goto oom;
    rc = apply(c, v[0], args->child ? args : NULL, fpassed, depth + 1);
    goto out;
oom:
    rc = oom(c);
out:
    for (size_t k = 0; v && k < n; k++)
        cJSON_Delete(v[k]);
    cr_free(v);
    cJSON_Delete(fpassed);
    cJSON_Delete(rest);
    cJSON_Delete(args);
    cJSON_Delete(opts);
    cJSON_Delete(steps);
    return rc;
}

/* The header members of a chord: a serialized group, a chain or a plain
 * list. Like chord's _maybe_group(), a group's or chain's own options are
 * dropped: the chord makes a new group for the members. */
static int chord_header(struct ctx *c, const cJSON *header, cJSON *members, int depth)
{
    if (cJSON_IsArray(header))
        return flatten(c, header, members, depth + 1);
    if (cJSON_IsObject(header)) {
        const char *type = get_str(header, "subtask_type");
        cJSON *d;
        if (type && (!strcmp(type, "group") || !strcmp(type, "chain")))
            return flatten(c, get(get(header, "kwargs"), "tasks"), members, depth + 1);
        /* a single signature as header: a group of one */
        d = cJSON_Duplicate(header, 1);
        if (!d || !cJSON_AddItemToArray(members, d)) {
            cJSON_Delete(d);
            return oom(c);
        }
        return 0;
    }
    return cr_err_set(c->err, CR_EPROTO, "chord without a header");
}

/* _chain.freeze(id, group_id, chord, root_id, group_index) on a copy: from
 * the last step back (prepare_steps with clone=False), the last step gets the
 * id, group, chord and index, every plain step a task_id and the root. */
static int freeze_chain(struct ctx *c, cJSON *t, const char *id, const char *root,
                        const char *gid, const cJSON *chord, long gidx, int depth);

/* freeze(group_id, chord=body, root_id, parent_id, group_index) of one
 * header member copy (group._freeze_unroll). */
static int freeze_member(struct ctx *c, cJSON *t, const char *gid, const cJSON *body,
                         const char *root, const char *parent, int index, int depth)
{
    const char *type = get_str(t, "subtask_type");
    cJSON *o;
    if (depth > CANVAS_MAX_DEPTH)
        return cr_err_set(c->err, CR_EPROTO, "signature nested deeper than %d",
                          CANVAS_MAX_DEPTH);
    if (type && !strcmp(type, "chain"))
        return freeze_chain(c, t, NULL, root, gid, body, index, depth + 1);
    if (type && !strcmp(type, "chord")) {
        /* a chord in a chord header: its body is the member */
        cJSON *b = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(t, "kwargs"), "body");
        if (!cJSON_IsObject(b))
            return cr_err_set(c->err, CR_EPROTO, "chord without a body");
        return freeze_member(c, b, gid, body, root, parent, index, depth + 1);
    }
    if (!(o = own_options(t)))
        return oom(c);
    return freeze_opts(c, o, NULL, root, parent, gid, body, index);
}

static int freeze_chain(struct ctx *c, cJSON *t, const char *id, const char *root,
                        const char *gid, const cJSON *chord, long gidx, int depth)
{
    cJSON *tasks = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(t, "kwargs"), "tasks");
    cJSON *first = cJSON_IsArray(tasks) ? tasks->child : NULL;
    if (depth > CANVAS_MAX_DEPTH)
        return cr_err_set(c->err, CR_EPROTO, "signature nested deeper than %d",
                          CANVAS_MAX_DEPTH);
    for (cJSON *step = first ? first->prev : NULL; step;
         step = step == first ? NULL : step->prev) {
        cJSON *so;
        int last = step == first->prev, rc;
        if (!cJSON_IsObject(step))
            return cr_err_set(c->err, CR_EPROTO, "chain step is not a dict");
        if (get_str(step, "subtask_type")) {
            if (last && chord) {
                rc = freeze_member(c, step, gid, chord, root, NULL, gidx, depth + 1);
                if (rc)
                    return rc;
            }
            continue;
        }
        if (!(so = own_options(step)))
            return oom(c);
        rc = freeze_opts(c, so, last ? id : NULL, root, NULL, last ? gid : NULL,
                         last ? chord : NULL, last ? gidx : -1);
        if (rc)
            return rc;
    }
    return 0;
}

/* chord.apply_async / run. */
static int apply_chord(struct ctx *c, const struct sig *s, const cJSON *partial,
                       const cJSON *passed, int depth)
{
    const cJSON *body0 = get(s->kwargs, "body");
    cJSON *members = NULL, *body = NULL, *opts = NULL, *bo, *hpassed = NULL, *args = NULL;
    char gid[37], bid[37], rootbuf[37];
    const char *root, *tid;
    int rc, i = 0;

    if (!cJSON_IsObject(body0))
        return cr_err_set(c->err, CR_EPROTO, "chord without a body");
    if (!(members = cJSON_CreateArray()))
        return oom(c);
    if ((rc = chord_header(c, get(s->kwargs, "header"), members, depth)))
        goto out;
    if (!(args = join_args(partial, s->args, s->immutable)))
        goto oom;
    /* body.clone(**options), then the chord's merged options minus task_id
     * update the body (chord.run). */
    {
        cJSON *bsig = cJSON_Duplicate(body0, 1), *bopts;
        if (!bsig)
            goto oom;
        body = bsig;
        bopts = merge(get(body0, "options"), passed, 0, 1);
        if (!bopts || set_item(body, "options", bopts))
            goto oom;
    }
    if (!(opts = merge(s->options, passed, 0, 0)))
        goto oom;
    tid = get_str(opts, "task_id");
    if (tid) {
        snprintf(bid, sizeof bid, "%.36s", tid);
        tid = bid;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(opts, "task_id");
    static const char *const run_params[] = {"interval", "countdown", "max_retries",
                                             "eager"};
    for (size_t k = 0; k < sizeof run_params / sizeof *run_params; k++)
        cJSON_DeleteItemFromObjectCaseSensitive(opts, run_params[k]);
    bo = own_options(body);
    if (!bo)
        goto oom;
    /* copied: the update below may replace the item it points into */
    root = get_str(bo, "root_id");
    if (root) {
        snprintf(rootbuf, sizeof rootbuf, "%.36s", root);
        root = strlen(root) > 36 ? NULL : rootbuf;
    }
    for (const cJSON *v = opts->child; v; v = v->next)
        if (v->string && set_dup(bo, v->string, v))
            goto oom;
    /* body.freeze(task_id, root_id) */
    {
        const char *bt = get_str(body, "subtask_type");
        if (!bt)
            rc = freeze_opts(c, bo, tid, root, NULL, NULL, NULL, -1);
        else if (!strcmp(bt, "chain"))
            rc = freeze_chain(c, body, tid, root, NULL, NULL, -1, depth + 1);
        if (rc)
            goto out;
    }
    /* Chains and chords are not passed to the header tasks (#3771). */
    cJSON_DeleteItemFromObjectCaseSensitive(opts, "chain");
    cJSON_DeleteItemFromObjectCaseSensitive(opts, "chord");

    new_id(c, gid);
    for (cJSON *t = members->child; t; t = t->next, i++)
        if ((rc = freeze_member(c, t, gid, body, root, NULL, i, depth + 1)))
            goto out;
    if (i == 0) {
        /* An empty header: the body gets [] at once. */
        cJSON *empty = cJSON_CreateArray(), *pa = cJSON_CreateArray();
        if (!empty || !pa || !cJSON_AddItemToArray(pa, empty)) {
            cJSON_Delete(empty);
            cJSON_Delete(pa);
            goto oom;
        }
        rc = apply(c, body, pa, NULL, depth + 1);
        cJSON_Delete(pa);
        goto out;
    }
    /* header(*partial, task_id=gid, **options) */
    if (!(hpassed = merge(opts, NULL, 0, 0)) || set_str(hpassed, "task_id", gid))
        goto oom;
    rc = apply_members(c, members, hpassed, cJSON_GetArraySize(args) ? args : NULL, 1,
                       depth);
    goto out;
oom:
    rc = oom(c);
out:
    cJSON_Delete(hpassed);
    cJSON_Delete(opts);
    cJSON_Delete(body);
    cJSON_Delete(args);
    cJSON_Delete(members);
    return rc;
}

static int apply(struct ctx *c, const cJSON *sig, const cJSON *partial,
                 const cJSON *passed, int depth)
{
    struct sig s;
    int rc, direct = c->direct;
    c->direct = 0;
    if (depth > CANVAS_MAX_DEPTH)
        return cr_err_set(c->err, CR_EPROTO, "signature nested deeper than %d",
                          CANVAS_MAX_DEPTH);
    if ((rc = sig_parts(c, sig, &s)))
        return rc;
    if (!s.type)
        return apply_plain(c, &s, partial, passed, direct);
    if (!strcmp(s.type, "group"))
        return apply_group(c, &s, partial, passed, depth);
    if (!strcmp(s.type, "chain"))
        return apply_chain(c, &s, partial, passed, depth);
    if (!strcmp(s.type, "chord"))
        return apply_chord(c, &s, partial, passed, depth);
    /* chunks, xmap and xstarmap signatures reach a worker as plain
     * celery.chunks / celery.map / celery.starmap tasks (5.2.6 serializes them
     * with subtask_type null); a dict that names the type is applied the same
     * way, so both spellings run the same builtin. */
    if (!strcmp(s.type, "chunks") || !strcmp(s.type, "xmap") ||
        !strcmp(s.type, "xstarmap"))
        return apply_plain(c, &s, partial, passed, direct);
    return cr_err_set(c->err, CR_EPROTO,
                      "signature '%.100s': unknown subtask_type '%.50s'", s.task, s.type);
}

/* ---- entry points ------------------------------------------------------- */

static void ctx_init(struct ctx *c, const struct task_msg *m, const struct canvas_opts *o,
                     struct canvas_plan *out, struct cr_err *err)
{
    c->o = o;
    c->p = out;
    c->err = err;
    c->cur_id = m->id;
    c->cur_root = m->root_id ? m->root_id : m->id;
    c->direct = 0;
}

int canvas_has_followups(const struct task_msg *m)
{
    static const char *const keys[] = {"callbacks", "errbacks", "chain", "chord"};
    if (!cJSON_IsObject(m->embed))
        return 0;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m->embed, keys[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsArray(v) && !v->child))
            return 1;
    }
    return 0;
}

/* {"parent_id": id, "root_id": root} (+ chain when given, taken). */
static cJSON *trace_opts(const struct ctx *c, cJSON *chain)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || (chain && set_item(o, "chain", chain)) ||
        set_str(o, "parent_id", c->cur_id) || set_str(o, "root_id", c->cur_root) ||
        set_item(o, "priority", cJSON_CreateNull())) {
        if (!o)
            cJSON_Delete(chain);
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* A group signature over a list of signature copies (takes tasks). */
static cJSON *make_group(cJSON *tasks)
{
    cJSON *g = cJSON_CreateObject(), *kw = NULL;
    if (!g || set_str(g, "task", "celery.group") ||
        set_item(g, "args", cJSON_CreateArray()) ||
        set_item(g, "kwargs", kw = cJSON_CreateObject())) {
        cJSON_Delete(tasks);
        cJSON_Delete(g);
        return NULL;
    }
    if (set_item(kw, "tasks", tasks) || set_item(g, "options", cJSON_CreateObject()) ||
        set_str(g, "subtask_type", "group") ||
        set_item(g, "immutable", cJSON_CreateFalse())) {
        cJSON_Delete(g);
        return NULL;
    }
    return g;
}

/* What trace.py does with embed.callbacks. */
static int callbacks(struct ctx *c, const cJSON *cbs, const cJSON *partial)
{
    cJSON *passed, *plain = NULL, *g = NULL;
    int rc = 0;
    if (!cbs || cJSON_IsNull(cbs) || (cJSON_IsArray(cbs) && !cbs->child))
        return 0;
    if (!cJSON_IsArray(cbs))
        return cr_err_set(c->err, CR_EPROTO, "callbacks is not a list");
    if (!(passed = trace_opts(c, NULL)))
        return oom(c);
    if (!cbs->child->next) {
        c->direct = 1;
        rc = apply(c, cbs->child, partial, passed, 0);
        goto out;
    }
    /* Several: group-type ones each on their own, the rest as one new group. */
    if (!(plain = cJSON_CreateArray()))
        goto oom;
    for (const cJSON *s = cbs->child; s; s = s->next) {
        const char *type = get_str(s, "subtask_type");
        if (!cJSON_IsObject(s)) {
            rc = cr_err_set(c->err, CR_EPROTO, "callback is not a dict");
            goto out;
        }
        if (type && !strcmp(type, "group")) {
            if ((rc = apply(c, s, partial, passed, 0)))
                goto out;
        } else {
            cJSON *d = cJSON_Duplicate(s, 1);
            if (!d || !cJSON_AddItemToArray(plain, d)) {
                cJSON_Delete(d);
                goto oom;
            }
        }
    }
    if (plain->child) {
        g = make_group(plain);
        plain = NULL;
        if (!g)
            goto oom;
        rc = apply(c, g, partial, passed, 0);
    }
    goto out;
oom:
    rc = oom(c);
out:
    cJSON_Delete(g);
    cJSON_Delete(plain);
    cJSON_Delete(passed);
    return rc;
}

int canvas_on_success(const struct task_msg *m, const cJSON *result,
                      const struct canvas_opts *o, struct canvas_plan *out,
                      struct cr_err *err)
{
    struct ctx c;
    const cJSON *chain;
    cJSON *partial = NULL, *passed = NULL, *rest = NULL, *r;
    int rc = 0;

    canvas_plan_init(out);
    ctx_init(&c, m, o, out, err);
    if (!cJSON_IsObject(m->embed))
        return 0;
    if (!(partial = cJSON_CreateArray()))
        return oom(&c);
    r = result ? cJSON_Duplicate(result, 1) : cJSON_CreateNull();
    if (!r || !cJSON_AddItemToArray(partial, r)) {
        cJSON_Delete(r);
        goto oom;
    }
    if ((rc = callbacks(&c, get(m->embed, "callbacks"), partial)))
        goto out;
    chain = get(m->embed, "chain");
    if (chain && !cJSON_IsNull(chain)) {
        int n;
        if (!cJSON_IsArray(chain)) {
            rc = cr_err_set(err, CR_EPROTO, "chain is not a list");
            goto out;
        }
        n = cJSON_GetArraySize(chain);
        if (n > 0) {
            /* chain.pop(): the next step is the last element. */
            if (!(rest = cJSON_Duplicate(chain, 1)))
                goto oom;
            cJSON *next = cJSON_DetachItemFromArray(rest, n - 1);
            passed = trace_opts(&c, rest);
            rest = NULL;
            if (!passed) {
                cJSON_Delete(next);
                goto oom;
            }
            c.direct = 1;
            rc = apply(&c, next, partial, passed, 0);
            cJSON_Delete(next);
        }
    }
    goto out;
oom:
    rc = oom(&c);
out:
    cJSON_Delete(rest);
    cJSON_Delete(passed);
    cJSON_Delete(partial);
    if (rc)
        canvas_plan_release(out);
    return rc;
}

/* _call_task_errbacks for a worker that calls none inline: every errback
 * goes out in one group with args [id] (parent and root as given). */
static int errbacks(struct ctx *c, const cJSON *ebs, const char *id)
{
    cJSON *tasks = NULL, *g = NULL, *partial = NULL, *passed = NULL;
    int rc = 0;
    if (!ebs || cJSON_IsNull(ebs) || (cJSON_IsArray(ebs) && !ebs->child))
        return 0;
    if (cJSON_IsObject(ebs)) {
        tasks = cJSON_CreateArray();
        cJSON *d = cJSON_Duplicate(ebs, 1);
        if (!tasks || !d || !cJSON_AddItemToArray(tasks, d)) {
            cJSON_Delete(d);
            goto oom;
        }
    } else if (cJSON_IsArray(ebs)) {
        if (!(tasks = cJSON_Duplicate(ebs, 1)))
            goto oom;
    } else {
        return cr_err_set(c->err, CR_EPROTO, "errbacks is not a list");
    }
    g = make_group(tasks);
    tasks = NULL;
    if (!g || !(partial = cJSON_CreateArray()))
        goto oom;
    {
        cJSON *a = id ? cJSON_CreateString(id) : cJSON_CreateNull();
        if (!a || !cJSON_AddItemToArray(partial, a)) {
            cJSON_Delete(a);
            goto oom;
        }
    }
    if (!(passed = trace_opts(c, NULL)))
        goto oom;
    rc = apply(c, g, partial, passed, 0);
    goto out;
oom:
    rc = oom(c);
out:
    cJSON_Delete(passed);
    cJSON_Delete(partial);
    cJSON_Delete(g);
    cJSON_Delete(tasks);
    return rc;
}

int canvas_on_failure(const struct task_msg *m, const struct canvas_opts *o,
                      struct canvas_plan *out, struct cr_err *err)
{
    struct ctx c;
    const cJSON *chain;
    int rc = 0;

    canvas_plan_init(out);
    ctx_init(&c, m, o, out, err);
    if (!cJSON_IsObject(m->embed))
        return 0;
    chain = get(m->embed, "chain");
    if (chain && !cJSON_IsNull(chain) && !cJSON_IsArray(chain)) {
        rc = cr_err_set(err, CR_EPROTO, "chain is not a list");
        goto out;
    }
    for (const cJSON *e = cJSON_IsArray(chain) ? chain->child : NULL; e; e = e->next) {
        const cJSON *opts = get(e, "options"), *ch;
        const char *id = get_str(opts, "task_id");
        const char *type = get_str(e, "subtask_type");
        if (!cJSON_IsObject(e)) {
            rc = cr_err_set(err, CR_EPROTO, "chain step is not a dict");
            goto out;
        }
        if (!id && type && !strcmp(type, "chord"))
            id = get_str(get(get(get(e, "kwargs"), "body"), "options"), "task_id");
        if (id && (rc = add_fail(&c, id)))
            goto out;
        ch = get(opts, "chord");
        if (id && ch && cJSON_IsObject(ch) && get_str(opts, "group_id")) {
            struct canvas_plan *p = out;
            const cJSON *gi = get(opts, "group_index");
            struct canvas_chord_part *pt;
            if (grow((void **)&p->parts, p->nparts, sizeof *p->parts))
                goto oom;
            pt = &p->parts[p->nparts];
            memset(pt, 0, sizeof *pt);
            pt->task_id = cr_strdup(id);
            pt->group_id = cr_strdup(get_str(opts, "group_id"));
            pt->body = cJSON_Duplicate(ch, 1);
            pt->group_index = cJSON_IsNumber(gi) ? (long)gi->valuedouble : -1;
            p->nparts++;
            if (!pt->task_id || !pt->group_id || !pt->body)
                goto oom;
        }
    }
    c.cur_id = m->id;
    rc = errbacks(&c, get(m->embed, "errbacks"), m->id);
    goto out;
oom:
    rc = oom(&c);
out:
    if (rc)
        canvas_plan_release(out);
    return rc;
}

/* ---- chords ------------------------------------------------------------- */

int canvas_chord_of(const struct task_msg *m, struct canvas_chord *out)
{
    const cJSON *body = cJSON_IsObject(m->embed) ? get(m->embed, "chord") : NULL;
    memset(out, 0, sizeof *out);
    out->group_index = -1;
    if (!m->group || !cJSON_IsObject(body))
        return 0;
    out->group_id = m->group;
    out->group_index = m->has_group_index ? m->group_index : -1;
    out->body = body;
    return 1;
}

int canvas_chord_member(const char *task_id, const char *state, const cJSON *result,
                        struct buf *out)
{
    struct buf tmp;
    int rc = CR_ENOMEM;
    buf_init(&tmp);
    if (buf_puts(&tmp, "[1, ") || py_json_string(&tmp, task_id ? task_id : "") ||
        buf_puts(&tmp, ", ") || py_json_string(&tmp, state ? state : "") ||
        buf_puts(&tmp, ", "))
        goto out;
    if (result ? py_json_dumps(result, &tmp) : buf_puts(&tmp, "null"))
        goto out;
    if (buf_putc(&tmp, ']') || buf_append(out, tmp.data, tmp.len))
        goto out;
    rc = 0;
out:
    buf_release(&tmp);
    return rc;
}

/* repr() of the exception Celery rebuilds from an exception dict
 * (exception_to_python): ValueError('x'), KeyError('a', 1), Exc(). */
static int exc_repr(const cJSON *exc, struct buf *out)
{
    const cJSON *type = get(exc, "exc_type"), *msg = get(exc, "exc_message");
    if (!cJSON_IsObject(exc) || !cJSON_IsString(type))
        return py_repr(exc, out, 0);
    if (buf_puts(out, type->valuestring) || buf_putc(out, '('))
        return CR_ENOMEM;
    if (cJSON_IsArray(msg)) {
        for (const cJSON *a = msg->child; a; a = a->next)
            if ((a != msg->child && buf_puts(out, ", ")) || py_repr(a, out, 0))
                return CR_ENOMEM;
    } else if (msg && py_repr(msg, out, 0)) {
        return CR_ENOMEM;
    }
    return buf_putc(out, ')');
}

int canvas_chord_join(const struct task_msg *m, const struct canvas_chord *ch,
                      const char *const *members, const size_t *lens, size_t n,
                      const struct canvas_opts *o, struct canvas_plan *out, int *failed,
                      char **body_id, cJSON **exc, struct cr_err *err)
{
    struct ctx c;
    cJSON *results = NULL, *partial = NULL, *item = NULL;
    struct buf why;
    int rc = 0;

    canvas_plan_init(out);
    ctx_init(&c, m, o, out, err);
    buf_init(&why);
    *failed = 0;
    *body_id = NULL;
    *exc = NULL;
    if (!ch || !cJSON_IsObject(ch->body))
        return cr_err_set(err, CR_EPROTO, "chord without a body");
    if (!(results = cJSON_CreateArray()))
        return oom(&c);
    for (size_t i = 0; i < n; i++) {
        const cJSON *tid, *state, *res;
        cJSON *r;
        rc = py_json_parse(members[i], lens[i], &item, err);
        if (rc == CR_ENOMEM)
            goto oom;
        if (rc) {
            rc = cr_err_set(err, CR_EPROTO, "chord member %zu is not JSON", i);
            goto out;
        }
        if (!cJSON_IsArray(item) || cJSON_GetArraySize(item) != 4 ||
            !cJSON_IsString(tid = cJSON_GetArrayItem(item, 1)) ||
            !cJSON_IsString(state = cJSON_GetArrayItem(item, 2))) {
            rc = cr_err_set(err, CR_EPROTO,
                            "chord member %zu is not [1, id, state, result]", i);
            goto out;
        }
        res = cJSON_GetArrayItem(item, 3);
        if (!strcmp(state->valuestring, "FAILURE") ||
            !strcmp(state->valuestring, "REVOKED")) {
            const char *bid = get_str(get(ch->body, "options"), "task_id");
            if (buf_printf(&why, "Dependency %s raised ", tid->valuestring) ||
                exc_repr(res, &why))
                goto oom;
            *failed = 1;
            if (bid && !(*body_id = cr_strdup(bid)))
                goto oom;
            {
                cJSON *e = cJSON_CreateObject(), *msg = NULL;
                if (!e || set_str(e, "exc_type", "ChordError") ||
                    set_item(e, "exc_message", msg = cJSON_CreateArray()) ||
                    !cJSON_AddItemToArray(msg, cJSON_CreateString(why.data)) ||
                    set_str(e, "exc_module", "celery.exceptions")) {
                    cJSON_Delete(e);
                    goto oom;
                }
                *exc = e;
            }
            /* chord_error_from_stack: the body's errbacks with its id; the
             * fake request has no root, so root and parent are the body id. */
            c.cur_id = *body_id;
            c.cur_root = *body_id;
            rc = errbacks(&c, get(get(ch->body, "options"), "link_error"), *body_id);
            goto out;
        }
        r = cJSON_Duplicate(res, 1);
        if (!r || !cJSON_AddItemToArray(results, r)) {
            cJSON_Delete(r);
            goto oom;
        }
        cJSON_Delete(item);
        item = NULL;
    }
    /* callback.delay(resl) from inside the last header task. */
    if (!(partial = cJSON_CreateArray()) || !cJSON_AddItemToArray(partial, results))
        goto oom;
    results = NULL;
    rc = apply(&c, ch->body, partial, NULL, 0);
    goto out;
oom:
    rc = oom(&c);
out:
    cJSON_Delete(item);
    cJSON_Delete(results);
    cJSON_Delete(partial);
    buf_release(&why);
    if (rc) {
        canvas_plan_release(out);
        cr_free(*body_id);
        *body_id = NULL;
        cJSON_Delete(*exc);
        *exc = NULL;
        *failed = 0;
    }
    return rc;
}
