/* pidbox_msg.c -- Celery remote-control requests, replies and reply shapes (no I/O). */
#include "pidbox_msg.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "celery_events.h"
#include "pyjson.h"
#include "../util/alloc.h"
#include "../util/pct.h"
#include "../util/strmap.h"

/* ------------------------------------------------------------- requests */

static const char *str_member(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int pidbox_request_parse(const char *body, size_t len, struct pidbox_request *rq,
                         struct cr_err *err)
{
    const cJSON *v;
    int rc;

    memset(rq, 0, sizeof(*rq));
    rc = py_json_parse(body, len, &rq->root, err);
    if (rc)
        return rc;
    if (!cJSON_IsObject(rq->root))
        return cr_err_set(err, CR_EPROTO, "control message is not an object");
    rq->method = str_member(rq->root, "method");
    if (!rq->method)
        return cr_err_set(err, CR_EPROTO, "control message has no method");
    v = cJSON_GetObjectItemCaseSensitive(rq->root, "arguments");
    if (v && !cJSON_IsNull(v) && !cJSON_IsObject(v))
        return cr_err_set(err, CR_EPROTO, "arguments of '%s' are not an object",
                          rq->method);
    if (cJSON_IsObject(v)) {
        rq->arguments = v;
    } else {
        rq->empty = cJSON_CreateObject();
        if (!rq->empty)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        rq->arguments = rq->empty;
    }
    v = cJSON_GetObjectItemCaseSensitive(rq->root, "destination");
    if (v && !cJSON_IsNull(v)) {
        const cJSON *d;
        if (!cJSON_IsArray(v))
            return cr_err_set(err, CR_EPROTO, "destination is not a list");
        cJSON_ArrayForEach(d, v)
        {
            if (!cJSON_IsString(d))
                return cr_err_set(err, CR_EPROTO, "destination holds a non-string");
        }
        rq->destination = v;
    }
    rq->pattern = str_member(rq->root, "pattern");
    rq->matcher = str_member(rq->root, "matcher");
    rq->ticket = str_member(rq->root, "ticket");
    v = cJSON_GetObjectItemCaseSensitive(rq->root, "reply_to");
    if (v && !cJSON_IsNull(v)) {
        rq->reply_exchange = cJSON_IsObject(v) ? str_member(v, "exchange") : NULL;
        rq->reply_routing_key = cJSON_IsObject(v) ? str_member(v, "routing_key") : NULL;
        if (!rq->reply_exchange || !rq->reply_routing_key) {
            rq->reply_exchange = rq->reply_routing_key = NULL;
            return cr_err_set(err, CR_EPROTO, "reply_to needs exchange and routing_key");
        }
    }
    return 0;
}

void pidbox_request_release(struct pidbox_request *rq)
{
    cJSON_Delete(rq->root);
    cJSON_Delete(rq->empty);
    memset(rq, 0, sizeof(*rq));
}

/* ------------------------------------------------------------- matching */

/* The bounds of one pcre match. A node name is at most a few hundred bytes,
 * and a sane pattern needs a few hundred steps and a handful of backtracking
 * frames on it; a catastrophic one ("(a+)+$", "(a|aa)*b") stops at the first
 * limit within a millisecond, and never holds more than the heap limit. */
#define PCRE_MATCH_LIMIT 10000
#define PCRE_DEPTH_LIMIT 10000
#define PCRE_HEAP_LIMIT_KIB 1024
/* Groups nested deeper, or more capturing groups, are refused: a node name
 * needs two or three, and every step of a match copies a frame holding every
 * capture, so 320 groups made the match limit cost 40 ms where it costs
 * well under one at 32. */
#define PCRE_NEST_LIMIT 32
#define PCRE_CAPTURES_MAX 32
/* Distinct patterns kept compiled. */
#define PCRE_CACHE_SIZE 8

struct pcre_entry {
    char *pattern;         /* NULL: a free slot */
    pcre2_code *code;      /* NULL when the pattern did not compile */
    struct cr_err compile; /* why, when code is NULL */
    char *subject;         /* the last node name matched, NULL before */
    int verdict;           /* its pidbox_match() result */
    struct cr_err why;     /* its detail, when verdict < 0 */
    unsigned long used;    /* for least-recently-used eviction */
};

struct pidbox_matcher {
    pcre2_general_context *gen;
    pcre2_compile_context *cc;
    pcre2_match_context *mc;
    pcre2_match_data *md;
    unsigned long tick;
    struct pcre_entry cache[PCRE_CACHE_SIZE];
};

/* PCRE2 allocates through cr_malloc(), so the OOM tests reach it too. */
static void *pcre_alloc(size_t n, void *data)
{
    (void)data;
    return cr_malloc(n);
}

static void pcre_dealloc(void *p, void *data)
{
    (void)data;
    cr_free(p);
}

static void entry_clear(struct pcre_entry *e)
{
    pcre2_code_free(e->code);
    cr_free(e->pattern);
    cr_free(e->subject);
    memset(e, 0, sizeof(*e));
}

struct pidbox_matcher *pidbox_matcher_new(void)
{
    struct pidbox_matcher *pm = cr_calloc(1, sizeof(*pm));
    if (!pm)
        return NULL;
    pm->gen = pcre2_general_context_create(pcre_alloc, pcre_dealloc, NULL);
    pm->cc = pm->gen ? pcre2_compile_context_create(pm->gen) : NULL;
    pm->mc = pm->gen ? pcre2_match_context_create(pm->gen) : NULL;
    pm->md = pm->gen ? pcre2_match_data_create(1, pm->gen) : NULL;
    if (!pm->cc || !pm->mc || !pm->md) {
        pidbox_matcher_free(pm);
        return NULL;
    }
    pcre2_set_max_pattern_length(pm->cc, PIDBOX_PATTERN_MAX);
    pcre2_set_parens_nest_limit(pm->cc, PCRE_NEST_LIMIT);
    pcre2_set_match_limit(pm->mc, PCRE_MATCH_LIMIT);
    pcre2_set_depth_limit(pm->mc, PCRE_DEPTH_LIMIT);
    pcre2_set_heap_limit(pm->mc, PCRE_HEAP_LIMIT_KIB);
    return pm;
}

void pidbox_matcher_free(struct pidbox_matcher *pm)
{
    if (!pm)
        return;
    for (int i = 0; i < PCRE_CACHE_SIZE; i++)
        entry_clear(&pm->cache[i]);
    pcre2_match_data_free(pm->md);
    pcre2_match_context_free(pm->mc);
    pcre2_compile_context_free(pm->cc);
    pcre2_general_context_free(pm->gen);
    cr_free(pm);
}

/* The entry for pattern, compiled on first sight into the least recently used
 * slot. NULL on OOM. */
static struct pcre_entry *pcre_entry_get(struct pidbox_matcher *pm, const char *pattern)
{
    struct pcre_entry *e = &pm->cache[0];
    int errcode;
    PCRE2_SIZE erroff;
    uint32_t captures;

    pm->tick++;
    for (int i = 0; i < PCRE_CACHE_SIZE; i++) {
        struct pcre_entry *c = &pm->cache[i];
        if (c->pattern && !strcmp(c->pattern, pattern)) {
            c->used = pm->tick;
            return c;
        }
        if (c->used < e->used) /* a free slot's is 0 */
            e = c;
    }
    entry_clear(e);
    e->pattern = cr_strdup(pattern);
    if (!e->pattern)
        return NULL;
    e->used = pm->tick;
    /* Python's re.match on a str: anchored at the start only, code points and
     * Unicode classes; a node name that is not UTF-8 just fails to match. */
    e->code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                            PCRE2_ANCHORED | PCRE2_UTF | PCRE2_UCP |
                                PCRE2_MATCH_INVALID_UTF | PCRE2_NEVER_BACKSLASH_C,
                            &errcode, &erroff, pm->cc);
    if (!e->code) {
        PCRE2_UCHAR msg[160];
        if (errcode == PCRE2_ERROR_HEAP_FAILED) {
            entry_clear(e);
            return NULL;
        }
        if (pcre2_get_error_message(errcode, msg, sizeof(msg)) < 0)
            snprintf((char *)msg, sizeof(msg), "error %d", errcode);
        cr_err_set(&e->compile, CR_EINVAL, "bad pcre pattern at offset %zu: %s",
                   (size_t)erroff, (const char *)msg);
    } else if (pcre2_pattern_info(e->code, PCRE2_INFO_CAPTURECOUNT, &captures) ||
               captures > PCRE_CAPTURES_MAX) {
        pcre2_code_free(e->code);
        e->code = NULL;
        cr_err_set(&e->compile, CR_EINVAL, "pcre pattern has over %d groups",
                   PCRE_CAPTURES_MAX);
    }
    return e;
}

static int pcre_run(struct pidbox_matcher *pm, struct pcre_entry *e, const char *s,
                    struct cr_err *err)
{
    int rc = pcre2_match(e->code, (PCRE2_SPTR)s, strlen(s), 0, 0, pm->md, pm->mc);
    if (rc >= 0)
        return 1; /* 0 only says the one-pair ovector was too small */
    switch (rc) {
    case PCRE2_ERROR_NOMATCH:
        return 0;
    case PCRE2_ERROR_MATCHLIMIT:
    case PCRE2_ERROR_DEPTHLIMIT:
    case PCRE2_ERROR_HEAPLIMIT:
        return cr_err_set(err, CR_ERANGE, "pcre pattern hit its match limit");
    case PCRE2_ERROR_NOMEMORY:
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    default:
        return cr_err_set(err, CR_EINVAL, "pcre match failed (error %d)", rc);
    }
}

static int pcre_match(struct pidbox_matcher *pm, const char *pattern, const char *s,
                      struct cr_err *err)
{
    struct pcre_entry *e = pcre_entry_get(pm, pattern);
    int rc;

    if (!e)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    if (!e->code) {
        if (err)
            *err = e->compile;
        return e->compile.code;
    }
    /* The mailbox always asks for its own node name: a burst of one hostile
     * pattern costs one bounded match. */
    if (e->subject && !strcmp(e->subject, s)) {
        if (e->verdict < 0 && err)
            *err = e->why;
        return e->verdict;
    }
    memset(&e->why, 0, sizeof(e->why));
    rc = pcre_run(pm, e, s, &e->why);
    if (rc < 0 && err)
        *err = e->why;
    if (rc == CR_ENOMEM)
        return rc; /* not a verdict: the next try may have the memory */
    cr_free(e->subject);
    e->subject = cr_strdup(s);
    e->verdict = rc;
    return rc;
}

/* The length of the bracket expression at p ("[...]", p[0] == '['), or 0 when
 * it has no closing ']' (then the '[' is literal). As Python's fnmatch: a ']'
 * right after "[" or "[!" is a member. */
static size_t bracket_len(const char *p)
{
    const char *q = p + 1;
    q += *q == '!';
    q += *q == ']';
    while (*q && *q != ']')
        q++;
    return *q ? (size_t)(q - p) + 1 : 0;
}

/* Whether c is in the bracket expression p of length n: members and "a-z"
 * ranges, '-' first or last is a member, "[!...]" negates; '^' and '\' are
 * plain members, as in Python's fnmatch. A reversed range holds nothing. */
static int bracket_has(const char *p, size_t n, unsigned char c)
{
    const char *q = p + 1, *end = p + n - 1;
    int neg = *q == '!', in = 0;

    q += neg;
    while (q < end && !in) {
        if (q + 2 < end && q[1] == '-') {
            in = (unsigned char)q[0] <= c && c <= (unsigned char)q[2];
            q += 3;
        } else {
            in = (unsigned char)*q == c;
            q++;
        }
    }
    return in != neg;
}

/* Python's fnmatch.fnmatch (case-sensitive, as on POSIX) on bytes. Every token
 * but '*' matches one byte, so on a mismatch it is enough to let the last '*'
 * take one more byte and retry from there: at most strlen(p) * strlen(s)
 * steps, where glibc's fnmatch() recurses at every '*' and can take
 * exponential time. */
static int glob_match(const char *p, const char *s)
{
    const char *star_p = NULL, *star_s = NULL;

    while (*s) {
        size_t n = 0;
        if (*p == '*') {
            while (*p == '*')
                p++;
            star_p = p;
            star_s = s;
            continue;
        }
        if (*p == '?') {
            n = 1;
        } else if (*p == '[' && (n = bracket_len(p)) > 0) {
            if (!bracket_has(p, n, (unsigned char)*s))
                n = 0;
        } else if (*p && *p == *s) {
            n = 1;
        }
        if (n) {
            p += n;
            s++;
        } else if (star_p) {
            p = star_p;
            s = ++star_s;
        } else {
            return 0;
        }
    }
    while (*p == '*')
        p++;
    return !*p;
}

int pidbox_match(struct pidbox_matcher *pm, const struct pidbox_request *rq,
                 const char *nodename, struct cr_err *err)
{
    size_t len;
    int rc;

    if (rq->destination && cJSON_GetArraySize(rq->destination) > 0) {
        const cJSON *d;
        cJSON_ArrayForEach(d, rq->destination)
        {
            if (cJSON_IsString(d) && !strcmp(d->valuestring, nodename))
                return 1;
        }
        return 0;
    }
    /* kombu tests "pattern and matcher": an empty one is a broadcast. */
    if (!rq->pattern || !rq->pattern[0] || !rq->matcher || !rq->matcher[0])
        return 1;
    len = strlen(rq->pattern);
    if (len > PIDBOX_PATTERN_MAX)
        return cr_err_set(err, CR_ETOOBIG, "%s pattern of %zu bytes is over %d",
                          rq->matcher, len, PIDBOX_PATTERN_MAX);
    if (!strcmp(rq->matcher, "glob"))
        return glob_match(rq->pattern, nodename);
    if (strcmp(rq->matcher, "pcre"))
        return cr_err_set(err, CR_EINVAL, "no matcher named '%.64s'", rq->matcher);
    if (pm)
        return pcre_match(pm, rq->pattern, nodename, err);
    pm = pidbox_matcher_new();
    if (!pm)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    rc = pcre_match(pm, rq->pattern, nodename, err);
    pidbox_matcher_free(pm);
    return rc;
}

int pidbox_request_matches(const struct pidbox_request *rq, const char *nodename)
{
    return pidbox_match(NULL, rq, nodename, NULL) == 1;
}

/* ------------------------------------------------------------ arguments */

static const cJSON *arg(const cJSON *args, const char *name)
{
    const cJSON *v = args ? cJSON_GetObjectItemCaseSensitive(args, name) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int pidbox_arg_str(const cJSON *args, const char *name, const char **out)
{
    const cJSON *v = arg(args, name);
    if (!v)
        return 0;
    if (!cJSON_IsString(v))
        return CR_EINVAL;
    *out = v->valuestring;
    return 1;
}

int pidbox_arg_num(const cJSON *args, const char *name, double *out)
{
    const cJSON *v = arg(args, name);
    char *end;
    if (!v)
        return 0;
    if (cJSON_IsNumber(v)) {
        *out = v->valuedouble;
        return 1;
    }
    if (cJSON_IsString(v) && *v->valuestring) {
        double d = strtod(v->valuestring, &end);
        if (!*end) {
            *out = d;
            return 1;
        }
    }
    return CR_EINVAL;
}

int pidbox_arg_bool(const cJSON *args, const char *name, int *out)
{
    const cJSON *v = arg(args, name);
    if (!v)
        return 0;
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v);
        return 1;
    }
    if (cJSON_IsNumber(v)) {
        *out = v->valuedouble != 0;
        return 1;
    }
    if (cJSON_IsString(v) &&
        (!strcmp(v->valuestring, "true") || !strcmp(v->valuestring, "True"))) {
        *out = 1;
        return 1;
    }
    if (cJSON_IsString(v) &&
        (!strcmp(v->valuestring, "false") || !strcmp(v->valuestring, "False"))) {
        *out = 0;
        return 1;
    }
    return CR_EINVAL;
}

int pidbox_arg_ids(const cJSON *args, const char *name, cJSON **ids)
{
    const cJSON *v = arg(args, name), *e;
    struct strmap seen;
    int rc = 1;

    *ids = NULL;
    if (!v)
        return 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return CR_EINVAL;
    *ids = cJSON_CreateArray();
    if (!*ids)
        return CR_ENOMEM;
    if (cJSON_IsString(v)) {
        cJSON *s = cJSON_CreateString(v->valuestring);
        if (!s || !cJSON_AddItemToArray(*ids, s)) {
            cJSON_Delete(s);
            rc = CR_ENOMEM;
        }
        goto out_nomap;
    }
    strmap_init(&seen);
    cJSON_ArrayForEach(e, v)
    {
        cJSON *s;
        if (!cJSON_IsString(e)) {
            rc = CR_EINVAL;
            break;
        }
        if (strmap_get(&seen, e->valuestring))
            continue;
        s = cJSON_CreateString(e->valuestring);
        if (!s || !cJSON_AddItemToArray(*ids, s)) {
            cJSON_Delete(s);
            rc = CR_ENOMEM;
            break;
        }
        if (strmap_put(&seen, s->valuestring, s)) {
            rc = CR_ENOMEM;
            break;
        }
    }
    strmap_release(&seen);
out_nomap:
    if (rc < 0) {
        cJSON_Delete(*ids);
        *ids = NULL;
    }
    return rc;
}

/* --------------------------------------------------------------- replies */

int pidbox_reply_encode(const char *nodename, const cJSON *reply, struct buf *out)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *r = reply ? cJSON_Duplicate(reply, 1) : cJSON_CreateNull();
    int rc;
    if (!o || !r || !cJSON_AddItemToObject(o, nodename, r)) {
        cJSON_Delete(o);
        cJSON_Delete(r);
        return CR_ENOMEM;
    }
    rc = py_json_dumps(o, out);
    cJSON_Delete(o);
    return rc;
}

static cJSON *one(const char *key, const char *text)
{
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, key, text ? text : "")) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *pidbox_ok(const char *text)
{
    return one("ok", text);
}

cJSON *pidbox_error(const char *text)
{
    return one("error", text);
}

cJSON *pidbox_error_exc(const char *exc_type, const char *message)
{
    struct buf b;
    cJSON *r = NULL;
    buf_init(&b);
    if (cev_exception_repr(exc_type, message, &b) == 0)
        r = pidbox_error(b.data);
    buf_release(&b);
    return r;
}

static int join_ids(const cJSON *ids, struct buf *b)
{
    const cJSON *e;
    int n = 0, rc = 0;
    cJSON_ArrayForEach(e, ids)
    {
        if (!cJSON_IsString(e))
            continue;
        if (n++)
            rc = buf_puts(b, ", ");
        if (!rc)
            rc = buf_puts(b, e->valuestring);
        if (rc)
            return rc;
    }
    return 0;
}

cJSON *pidbox_revoke_reply(const cJSON *ids, int terminate, const cJSON *terminated)
{
    struct buf b;
    cJSON *r = NULL;
    int rc;
    buf_init(&b);
    if (!terminate) {
        rc = buf_puts(&b, "tasks ");
        if (!rc)
            rc = join_ids(ids, &b);
        if (!rc)
            rc = buf_puts(&b, " flagged as revoked");
    } else if (!terminated || cJSON_GetArraySize(terminated) == 0) {
        rc = buf_puts(&b, "terminate: tasks unknown");
    } else {
        rc = buf_puts(&b, "terminate: ");
        if (!rc)
            rc = join_ids(terminated, &b);
    }
    if (!rc)
        r = pidbox_ok(b.data);
    buf_release(&b);
    return r;
}

/* Adds key: value to o, taking value (freed on failure). Returns 0 or CR_ENOMEM. */
static int add(cJSON *o, const char *key, cJSON *value)
{
    if (!value)
        return CR_ENOMEM;
    if (!cJSON_AddItemToObjectCS(o, key, value)) {
        cJSON_Delete(value);
        return CR_ENOMEM;
    }
    return 0;
}

static cJSON *str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* The repr of args (as a tuple) or kwargs; NULL stands for () or {}. */
static cJSON *repr_string(const cJSON *v, int as_args)
{
    struct buf b;
    cJSON *s = NULL;
    int rc;
    if (!v)
        return cJSON_CreateString(as_args ? "()" : "{}");
    buf_init(&b);
    rc = as_args ? cev_args_repr(v, &b, CEV_REPR_MAX) : py_repr(v, &b, CEV_REPR_MAX);
    if (!rc)
        s = cJSON_CreateString(b.data ? b.data : "");
    buf_release(&b);
    return s;
}

cJSON *pidbox_task_info_new(const struct pidbox_task_info *ti, int safe)
{
    cJSON *o = cJSON_CreateObject(), *di;
    int rc;
    if (!o)
        return NULL;
    rc = add(o, "id", str_or_null(ti->id));
    rc = rc ? rc : add(o, "name", str_or_null(ti->name));
    if (safe) {
        rc = rc ? rc
                : add(o, "args",
                      ti->argsrepr ? cJSON_CreateString(ti->argsrepr)
                                   : repr_string(ti->args, 1));
        rc = rc ? rc
                : add(o, "kwargs",
                      ti->kwargsrepr ? cJSON_CreateString(ti->kwargsrepr)
                                     : repr_string(ti->kwargs, 0));
    } else {
        rc = rc ? rc
                : add(o, "args",
                      ti->args ? cJSON_Duplicate(ti->args, 1) : cJSON_CreateArray());
        rc = rc ? rc
                : add(o, "kwargs",
                      ti->kwargs ? cJSON_Duplicate(ti->kwargs, 1) : cJSON_CreateObject());
    }
    rc = rc ? rc : add(o, "type", str_or_null(ti->name));
    rc = rc ? rc : add(o, "hostname", str_or_null(ti->hostname));
    rc = rc ? rc
            : add(o, "time_start",
                  ti->time_start >= 0 ? py_json_float(ti->time_start)
                                      : cJSON_CreateNull());
    rc = rc ? rc : add(o, "acknowledged", cJSON_CreateBool(ti->acknowledged != 0));
    di = rc ? NULL : cJSON_CreateObject();
    if (!rc && !di)
        rc = CR_ENOMEM;
    if (!rc) {
        rc = add(di, "exchange", cJSON_CreateString(ti->exchange ? ti->exchange : ""));
        rc = rc ? rc
                : add(di, "routing_key",
                      cJSON_CreateString(ti->routing_key ? ti->routing_key : ""));
        rc = rc ? rc : add(di, "priority", cJSON_CreateNumber(ti->priority));
        rc = rc ? rc : add(di, "redelivered", cJSON_CreateBool(ti->redelivered != 0));
        if (rc)
            cJSON_Delete(di);
        else
            rc = add(o, "delivery_info", di);
    }
    rc = rc ? rc
            : add(o, "worker_pid",
                  ti->worker_pid > 0 ? cJSON_CreateNumber((double)ti->worker_pid)
                                     : cJSON_CreateNull());
    if (rc) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *pidbox_scheduled_item_new(const char *eta, int priority, cJSON *request)
{
    cJSON *o = request ? cJSON_CreateObject() : NULL;
    if (!o) {
        cJSON_Delete(request);
        return NULL;
    }
    if (add(o, "eta", str_or_null(eta)) ||
        add(o, "priority", cJSON_CreateNumber(priority))) {
        cJSON_Delete(request);
        cJSON_Delete(o);
        return NULL;
    }
    if (add(o, "request", request)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int cmp_names(const void *a, const void *b)
{
    const char *const *x = a, *const *y = b;
    return strcmp(*x, *y);
}

cJSON *pidbox_registered_new(const char *const *names, const char *const *rate_limits,
                             int n)
{
    cJSON *list = cJSON_CreateArray();
    const char **sorted = n > 0 ? cr_malloc((size_t)n * sizeof(char *)) : NULL;
    int m = 0;

    if (!list || (n > 0 && !sorted))
        goto oom;
    /* Sort pointers into names, then find each one's rate limit back by
     * pointer: O(n^2), and n is the size of the task registry. */
    for (int i = 0; i < n; i++)
        if (names[i] && strncmp(names[i], "celery.", 7))
            sorted[m++] = names[i];
    if (m > 1) /* qsort(NULL, 0, ...) is undefined behaviour */
        qsort(sorted, (size_t)m, sizeof(*sorted), cmp_names);
    for (int i = 0; i < m; i++) {
        const char *rl = NULL;
        struct buf b;
        cJSON *s;
        for (int k = 0; k < n; k++)
            if (names[k] == sorted[i])
                rl = rate_limits ? rate_limits[k] : NULL;
        if (i && !strcmp(sorted[i], sorted[i - 1]))
            continue;
        buf_init(&b);
        if (buf_puts(&b, sorted[i]) ||
            (rl && *rl && buf_printf(&b, " [rate_limit=%s]", rl))) {
            buf_release(&b);
            goto oom;
        }
        s = cJSON_CreateString(b.data);
        buf_release(&b);
        if (!s || !cJSON_AddItemToArray(list, s)) {
            cJSON_Delete(s);
            goto oom;
        }
    }
    cr_free(sorted);
    return list;
oom:
    cr_free(sorted);
    cJSON_Delete(list);
    return NULL;
}

static cJSON *bool_item(int v)
{
    return cJSON_CreateBool(v != 0);
}

/* kombu keeps these x- arguments as Queue attributes (in seconds where they
 * are times) rather than in queue_arguments. */
static const struct {
    const char *arg, *attr;
    double scale;
} queue_attrs[] = {
    {"x-expires", "expires", 0.001},       {"x-message-ttl", "message_ttl", 0.001},
    {"x-max-length", "max_length", 1},     {"x-max-length-bytes", "max_length_bytes", 1},
    {"x-max-priority", "max_priority", 1},
};

cJSON *pidbox_queue_info_new(const struct pidbox_queue_info *q)
{
    cJSON *o = cJSON_CreateObject(), *ex = cJSON_CreateObject(), *qargs = NULL;
    int rc = (!o || !ex) ? CR_ENOMEM : 0;
    const size_t nattrs = sizeof(queue_attrs) / sizeof(queue_attrs[0]);

    if (!rc && q->arguments && cJSON_IsObject(q->arguments)) {
        const cJSON *a;
        cJSON_ArrayForEach(a, q->arguments)
        {
            int known = 0;
            for (size_t i = 0; i < nattrs; i++)
                known |= !strcmp(a->string, queue_attrs[i].arg);
            if (known)
                continue;
            if (!qargs && !(qargs = cJSON_CreateObject())) {
                rc = CR_ENOMEM;
                break;
            }
            {
                cJSON *d = cJSON_Duplicate(a, 1);
                if (!d || !cJSON_AddItemToObject(qargs, a->string, d)) {
                    cJSON_Delete(d);
                    rc = CR_ENOMEM;
                    break;
                }
            }
        }
    }
    rc = rc ? rc : add(o, "name", cJSON_CreateString(q->name ? q->name : ""));
    rc = rc ? rc : add(ex, "name", cJSON_CreateString(q->exchange ? q->exchange : ""));
    rc = rc ? rc
            : add(ex, "type",
                  cJSON_CreateString(q->exchange_type ? q->exchange_type : "direct"));
    rc = rc ? rc : add(ex, "arguments", cJSON_CreateNull());
    rc = rc ? rc : add(ex, "durable", bool_item(q->exchange_durable));
    rc = rc ? rc : add(ex, "passive", bool_item(0));
    rc = rc ? rc : add(ex, "auto_delete", bool_item(0));
    rc = rc ? rc : add(ex, "delivery_mode", cJSON_CreateNull());
    rc = rc ? rc : add(ex, "no_declare", bool_item(0));
    if (!rc) {
        rc = add(o, "exchange", ex);
        ex = NULL;
    }
    rc = rc ? rc : add(o, "routing_key", str_or_null(q->routing_key));
    if (!rc) {
        rc = add(o, "queue_arguments", qargs ? qargs : cJSON_CreateNull());
        qargs = NULL;
    }
    rc = rc ? rc : add(o, "binding_arguments", cJSON_CreateNull());
    rc = rc ? rc : add(o, "consumer_arguments", cJSON_CreateNull());
    rc = rc ? rc : add(o, "durable", bool_item(q->durable));
    rc = rc ? rc : add(o, "exclusive", bool_item(q->exclusive));
    rc = rc ? rc : add(o, "auto_delete", bool_item(q->auto_delete));
    rc = rc ? rc : add(o, "no_ack", bool_item(q->no_ack));
    rc = rc ? rc : add(o, "alias", cJSON_CreateNull());
    rc = rc ? rc : add(o, "bindings", cJSON_CreateArray());
    rc = rc ? rc : add(o, "no_declare", cJSON_CreateNull());
    for (size_t i = 0; i < nattrs && !rc; i++) {
        const cJSON *a =
            q->arguments && cJSON_IsObject(q->arguments)
                ? cJSON_GetObjectItemCaseSensitive(q->arguments, queue_attrs[i].arg)
                : NULL;
        cJSON *v;
        if (cJSON_IsNumber(a))
            v = queue_attrs[i].scale != 1
                    ? py_json_float(a->valuedouble * queue_attrs[i].scale)
                    : cJSON_CreateNumber(a->valuedouble);
        else
            v = cJSON_CreateNull();
        rc = add(o, queue_attrs[i].attr, v);
    }
    cJSON_Delete(ex);
    cJSON_Delete(qargs);
    if (rc) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Copies [s, e) into out (size bytes), %XX-decoded, cut to fit: what is
 * shown in a reply, where a long name cut is better than none. */
static void copy_decoded(const char *s, const char *e, char *out, size_t size)
{
    (void)pct_decode(out, size, s, e > s ? (size_t)(e - s) : 0, 0, NULL);
}

int pidbox_broker_info_parse(const char *url, struct pidbox_broker_info *out)
{
    const char *p, *auth_end, *host, *host_end, *path, *colon;
    int redis = 0, default_port;
    memset(out, 0, sizeof(*out));
    if (!strncmp(url, "amqp://", 7)) {
        p = url + 7;
    } else if (!strncmp(url, "pyamqp://", 9)) {
        p = url + 9;
    } else if (!strncmp(url, "amqps://", 8)) {
        p = url + 8;
        out->ssl = 1;
    } else if (!strncmp(url, "redis://", 8)) {
        p = url + 8;
        redis = 1;
    } else if (!strncmp(url, "rediss://", 9)) {
        p = url + 9;
        redis = out->ssl = 1;
    } else if (!strncmp(url, "sentinel://", 11)) {
        /* the first sentinel of the list names the connection, as in kombu */
        p = url + 11;
        redis = 2;
    } else if (!strncmp(url, "redis+socket://", 15) || !strncmp(url, "unix://", 7)) {
        snprintf(out->transport, sizeof(out->transport), "redis");
        snprintf(out->hostname, sizeof(out->hostname), "localhost");
        snprintf(out->virtual_host, sizeof(out->virtual_host), "/");
        return 0;
    } else {
        return CR_EINVAL;
    }
    snprintf(out->transport, sizeof(out->transport), "%s",
             redis == 2 ? "sentinel"
             : redis    ? "redis"
                        : "amqp");
    default_port = redis == 2 ? 26379 : redis ? 6379 : out->ssl ? 5671 : 5672;
    path = p + strcspn(p, redis == 2 ? "/?;" : "/?");
    auth_end = NULL;
    /* the last '@' before the path ends the credentials */
    for (const char *q = p; q < path; q++)
        if (*q == '@')
            auth_end = q;
    if (auth_end) {
        const char *user_end = memchr(p, ':', (size_t)(auth_end - p));
        copy_decoded(p, user_end ? user_end : auth_end, out->userid, sizeof(out->userid));
        host = auth_end + 1;
    } else {
        host = p;
    }
    host_end = path;
    colon = NULL;
    if (*host == '[') {
        const char *rb = memchr(host, ']', (size_t)(host_end - host));
        if (rb) {
            copy_decoded(host + 1, rb, out->hostname, sizeof(out->hostname));
            if (rb + 1 < host_end && rb[1] == ':')
                colon = rb + 1;
        }
    } else {
        colon = memchr(host, ':', (size_t)(host_end - host));
        copy_decoded(host, colon ? colon : host_end, out->hostname,
                     sizeof(out->hostname));
    }
    if (colon) {
        long port = strtol(colon + 1, NULL, 10);
        out->port = port > 0 && port < 65536 ? (int)port : 0;
    }
    if (!out->port)
        out->port = default_port;
    if (!out->hostname[0])
        snprintf(out->hostname, sizeof(out->hostname), "localhost");
    if (!out->userid[0] && !redis)
        snprintf(out->userid, sizeof(out->userid), "guest");
    if (*path == '/') {
        const char *end = path + 1 + strcspn(path + 1, "?;");
        copy_decoded(path + 1, end, out->virtual_host, sizeof(out->virtual_host));
    }
    if (!out->virtual_host[0])
        snprintf(out->virtual_host, sizeof(out->virtual_host), "/");
    return 0;
}

static cJSON *rusage_new(const struct pidbox_rusage *ru)
{
    cJSON *o = cJSON_CreateObject();
    int rc = o ? 0 : CR_ENOMEM;
    const struct {
        const char *key;
        long v;
    } ints[] = {
        {"maxrss", ru->maxrss}, {"ixrss", ru->ixrss},     {"idrss", ru->idrss},
        {"isrss", ru->isrss},   {"minflt", ru->minflt},   {"majflt", ru->majflt},
        {"nswap", ru->nswap},   {"inblock", ru->inblock}, {"oublock", ru->oublock},
        {"msgsnd", ru->msgsnd}, {"msgrcv", ru->msgrcv},   {"nsignals", ru->nsignals},
        {"nvcsw", ru->nvcsw},   {"nivcsw", ru->nivcsw},
    };
    rc = rc ? rc : add(o, "utime", py_json_float(ru->utime));
    rc = rc ? rc : add(o, "stime", py_json_float(ru->stime));
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]) && !rc; i++)
        rc = add(o, ints[i].key, cJSON_CreateNumber((double)ints[i].v));
    if (rc) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *pidbox_stats_new(const struct pidbox_stats *st)
{
    cJSON *o = cJSON_CreateObject(), *pool = NULL, *br = NULL, *arr;
    char clock[32];
    int rc = o ? 0 : CR_ENOMEM;

    snprintf(clock, sizeof(clock), "%lu", st->clock);
    rc = rc ? rc
            : add(o, "total",
                  st->total ? cJSON_Duplicate(st->total, 1) : cJSON_CreateObject());
    rc = rc ? rc : add(o, "pid", cJSON_CreateNumber((double)st->pid));
    rc = rc ? rc : add(o, "clock", cJSON_CreateString(clock));
    rc = rc ? rc : add(o, "uptime", cJSON_CreateNumber((double)st->uptime_s));
    if (!rc && !(pool = cJSON_CreateObject()))
        rc = CR_ENOMEM;
    rc = rc ? rc
            : add(pool, "implementation",
                  cJSON_CreateString(st->pool_implementation ? st->pool_implementation
                                                             : ""));
    rc = rc ? rc : add(pool, "max-concurrency", cJSON_CreateNumber(st->max_concurrency));
    if (!rc) {
        arr = cJSON_CreateArray();
        cJSON *pid = cJSON_CreateNumber((double)st->pid);
        if (!arr || !pid || !cJSON_AddItemToArray(arr, pid)) {
            cJSON_Delete(pid);
            cJSON_Delete(arr);
            rc = CR_ENOMEM;
        } else {
            rc = add(pool, "processes", arr);
        }
    }
    rc = rc ? rc : add(pool, "max-tasks-per-child", cJSON_CreateString("N/A"));
    rc = rc ? rc : add(pool, "put-guarded-by-semaphore", bool_item(0));
    if (!rc) {
        arr = cJSON_CreateArray();
        cJSON *a = py_json_float(st->soft_time_limit),
              *b = py_json_float(st->hard_time_limit);
        if (!arr || !a || !b || !cJSON_AddItemToArray(arr, a)) {
            cJSON_Delete(a);
            cJSON_Delete(b);
            cJSON_Delete(arr);
            rc = CR_ENOMEM;
        } else if (!cJSON_AddItemToArray(arr, b)) {
            cJSON_Delete(b);
            cJSON_Delete(arr);
            rc = CR_ENOMEM;
        } else {
            rc = add(pool, "timeouts", arr);
        }
    }
    if (!rc) {
        rc = add(o, "pool", pool);
        pool = NULL;
    }
    if (!rc && !(br = cJSON_CreateObject()))
        rc = CR_ENOMEM;
    if (!rc && st->broker) {
        const struct pidbox_broker_info *b = st->broker;
        rc = add(br, "hostname", cJSON_CreateString(b->hostname));
        /* kombu has no default user for Redis: None */
        rc = rc ? rc
                : add(br, "userid",
                      b->userid[0] || !strcmp(b->transport, "amqp")
                          ? cJSON_CreateString(b->userid)
                          : cJSON_CreateNull());
        rc = rc ? rc : add(br, "virtual_host", cJSON_CreateString(b->virtual_host));
        rc = rc ? rc : add(br, "port", cJSON_CreateNumber(b->port));
        rc = rc ? rc : add(br, "insist", bool_item(0));
        rc = rc ? rc : add(br, "ssl", bool_item(b->ssl));
        rc = rc ? rc
                : add(br, "transport",
                      cJSON_CreateString(b->transport[0] ? b->transport : "amqp"));
        rc = rc ? rc
                : add(br, "connect_timeout", py_json_float(st->broker_connect_timeout));
        rc = rc ? rc
                : add(br, "transport_options",
                      st->transport_options ? cJSON_Duplicate(st->transport_options, 1)
                                            : cJSON_CreateObject());
        rc = rc ? rc : add(br, "login_method", cJSON_CreateString("PLAIN"));
        rc = rc ? rc : add(br, "uri_prefix", cJSON_CreateNull());
        rc = rc ? rc : add(br, "heartbeat", py_json_float((double)st->broker_heartbeat));
        rc = rc ? rc : add(br, "failover_strategy", cJSON_CreateString("round-robin"));
        rc = rc ? rc : add(br, "alternates", cJSON_CreateArray());
    }
    if (!rc) {
        rc = add(o, "broker", br);
        br = NULL;
    }
    rc = rc ? rc : add(o, "prefetch_count", cJSON_CreateNumber(st->prefetch_count));
    rc = rc ? rc
            : add(o, "rusage",
                  st->rusage ? rusage_new(st->rusage) : cJSON_CreateString("N/A"));
    cJSON_Delete(pool);
    cJSON_Delete(br);
    if (rc) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ------------------------------------------------------------- statedb */

#define STATEDB_HEADER "celeriac-statedb 1"
#define STATEDB_ID_MAX 255

static int valid_id(const char *s, size_t n)
{
    if (!n || n > STATEDB_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

int pidbox_statedb_header(struct buf *out)
{
    return buf_puts(out, STATEDB_HEADER "\n");
}

int pidbox_statedb_line(const char *id, int64_t expires_epoch_s, struct buf *out)
{
    if (!valid_id(id, strlen(id)))
        return 0;
    return buf_printf(out, "revoked %" PRId64 " %s\n", expires_epoch_s, id);
}

/* One "revoked <n> <id>" line (without its newline). */
static int parse_line(const char *s, size_t n, int64_t *expires, char *id)
{
    const char *p = s, *e = s + n;
    int64_t v = 0;
    int neg = 0, digits = 0;
    if (n < 8 || memcmp(p, "revoked ", 8))
        return 0;
    p += 8;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    while (p < e && *p >= '0' && *p <= '9') {
        if (v > (INT64_MAX - 9) / 10)
            return 0;
        v = v * 10 + (*p++ - '0');
        digits++;
    }
    if (!digits || p >= e || *p != ' ')
        return 0;
    p++;
    if (!valid_id(p, (size_t)(e - p)))
        return 0;
    memcpy(id, p, (size_t)(e - p));
    id[e - p] = '\0';
    *expires = neg ? -v : v;
    return 1;
}

int pidbox_statedb_parse(const char *text, size_t len, int64_t now_s,
                         void (*fn)(const char *id, int64_t expires_epoch_s, void *arg),
                         void *arg)
{
    const char *p = text, *e = text + len;
    const char *nl = memchr(p, '\n', len);
    size_t hl = nl ? (size_t)(nl - p) : len;
    int count = 0;

    if (hl != strlen(STATEDB_HEADER) || memcmp(p, STATEDB_HEADER, hl))
        return CR_EPROTO;
    p += hl + (nl ? 1 : 0);
    while (p < e) {
        char id[STATEDB_ID_MAX + 1];
        int64_t expires;
        const char *end = memchr(p, '\n', (size_t)(e - p));
        size_t n = end ? (size_t)(end - p) : (size_t)(e - p);
        if (parse_line(p, n, &expires, id) && expires > now_s) {
            fn(id, expires, arg);
            count++;
        }
        p += n + (end ? 1 : 0);
    }
    return count;
}
