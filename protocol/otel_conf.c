/* otel_conf.c -- OTEL_* environment and the trace samplers. */
#include "otel_conf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../util/alloc.h"
#include "../util/pct.h"

/* ----------------------------------------------------------- sampler */

static const struct {
    const char *name;
    enum otel_sampler_kind kind;
} samplers[] = {
    {"always_on", OTEL_SAMPLER_ALWAYS_ON},
    {"always_off", OTEL_SAMPLER_ALWAYS_OFF},
    {"traceidratio", OTEL_SAMPLER_RATIO},
    {"parentbased_always_on", OTEL_SAMPLER_PB_ALWAYS_ON},
    {"parentbased_always_off", OTEL_SAMPLER_PB_ALWAYS_OFF},
    {"parentbased_traceidratio", OTEL_SAMPLER_PB_RATIO},
};

int otel_sampler_parse(struct otel_sampler *s, const char *name, const char *arg,
                       struct cr_err *err)
{
    int rc = 0;
    size_t i;

    s->kind = OTEL_SAMPLER_PB_ALWAYS_ON;
    s->ratio = 1.0;
    if (name && *name) {
        for (i = 0; i < sizeof(samplers) / sizeof(samplers[0]); i++)
            if (strcmp(name, samplers[i].name) == 0)
                break;
        if (i < sizeof(samplers) / sizeof(samplers[0]))
            s->kind = samplers[i].kind;
        else
            rc = cr_err_set(err, CR_EINVAL,
                            "OTEL_TRACES_SAMPLER '%.64s' not known: using "
                            "parentbased_always_on",
                            name);
    }
    if ((s->kind == OTEL_SAMPLER_RATIO || s->kind == OTEL_SAMPLER_PB_RATIO) && arg &&
        *arg) {
        char *end;
        double r = strtod(arg, &end);
        if (end == arg || *end || !isfinite(r) || r < 0 || r > 1)
            rc = cr_err_set(err, CR_EINVAL,
                            "OTEL_TRACES_SAMPLER_ARG '%.64s' is not a ratio in [0, 1]: "
                            "using 1.0",
                            arg);
        else
            s->ratio = r;
    }
    return rc;
}

static int by_ratio(double ratio, const uint8_t id[TRACE_ID_BYTES])
{
    uint64_t low = 0, bound;
    if (ratio >= 1.0)
        return 1;
    if (ratio <= 0.0)
        return 0;
    for (int i = 8; i < 16; i++)
        low = low << 8 | id[i];
    /* ratio * 2^64, below 2^64 since ratio < 1 */
    bound = (uint64_t)ldexp(ratio, 64);
    return low < bound;
}

int otel_sample(const struct otel_sampler *s, const struct trace_ctx *parent,
                const uint8_t trace_id[TRACE_ID_BYTES])
{
    switch (s->kind) {
    case OTEL_SAMPLER_ALWAYS_ON:
        return 1;
    case OTEL_SAMPLER_ALWAYS_OFF:
        return 0;
    case OTEL_SAMPLER_RATIO:
        return by_ratio(s->ratio, trace_id);
    case OTEL_SAMPLER_PB_ALWAYS_ON:
    case OTEL_SAMPLER_PB_ALWAYS_OFF:
    case OTEL_SAMPLER_PB_RATIO:
        if (parent)
            return (parent->flags & TRACE_FLAG_SAMPLED) != 0;
        if (s->kind == OTEL_SAMPLER_PB_ALWAYS_ON)
            return 1;
        if (s->kind == OTEL_SAMPLER_PB_ALWAYS_OFF)
            return 0;
        return by_ratio(s->ratio, trace_id);
    }
    return 0;
}

/* ------------------------------------------------------------- environment */

static const char *env_get(const char *const *env, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    for (; env && *env; env++)
        if (strncmp(*env, name, n) == 0 && (*env)[n] == '=')
            found = *env + n + 1; /* the last one wins, as getenv's callers see */
    return found;
}

static const char *env_nonempty(const char *const *env, const char *name)
{
    const char *v = env_get(env, name);
    return v && *v ? v : NULL;
}

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* One "key=value" list entry a..b, trimmed and percent-decoded into new
 * strings. 0, 1 (skipped: empty key or no '='), or CR_ENOMEM. */
static int split_entry(const char *a, const char *b, char **key, char **value)
{
    const char *eq;
    size_t kn, vn;
    while (a < b && (*a == ' ' || *a == '\t'))
        a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
        b--;
    eq = memchr(a, '=', (size_t)(b - a));
    if (!eq)
        return 1;
    kn = (size_t)(eq - a);
    while (kn && (a[kn - 1] == ' ' || a[kn - 1] == '\t'))
        kn--;
    eq++;
    while (eq < b && (*eq == ' ' || *eq == '\t'))
        eq++;
    vn = (size_t)(b - eq);
    if (!kn)
        return 1;
    *key = cr_malloc(kn + 1);
    *value = cr_malloc(vn + 1);
    if (!*key || !*value) {
        cr_free(*key);
        cr_free(*value);
        *key = *value = NULL;
        return CR_ENOMEM;
    }
    pct_decode(*key, kn + 1, a, kn, 0, NULL);
    pct_decode(*value, vn + 1, eq, vn, 0, NULL);
    return 0;
}

typedef int entry_fn(struct otel_conf *c, char *key, char *value, struct cr_err *err);

/* Calls fn for each entry of a comma-separated list; fn takes key and value. */
static int each_entry(struct otel_conf *c, const char *list, entry_fn *fn,
                      struct cr_err *err)
{
    const char *p = list;
    while (p && *p) {
        const char *e = strchr(p, ',');
        char *key = NULL, *value = NULL;
        int rc;
        if (!e)
            e = p + strlen(p);
        rc = split_entry(p, e, &key, &value);
        if (rc < 0)
            return rc;
        if (rc == 0 && (rc = fn(c, key, value, err)) < 0)
            return rc;
        p = *e ? e + 1 : e;
    }
    return 0;
}

static int add_header(struct otel_conf *c, char *key, char *value, struct cr_err *err)
{
    size_t kn = strlen(key), vn = strlen(value);
    char *line;
    int ok = c->nheaders < OTEL_MAX_HEADERS;
    for (size_t i = 0; ok && i < kn; i++)
        ok = is_tchar((unsigned char)key[i]);
    for (size_t i = 0; ok && i < vn; i++)
        ok = (unsigned char)value[i] >= 0x20 || value[i] == '\t';
    if (!ok) {
        /* the value is never quoted: it may be a secret */
        cr_err_set(err, CR_EINVAL, "OTEL_EXPORTER_OTLP_HEADERS: header '%.64s' skipped",
                   key);
        cr_free(key);
        cr_free(value);
        return 0;
    }
    line = cr_malloc(kn + vn + 3);
    if (line) {
        memcpy(line, key, kn);
        memcpy(line + kn, ": ", 2);
        memcpy(line + kn + 2, value, vn + 1);
        c->headers[c->nheaders++] = line;
    }
    cr_free(key);
    cr_free(value);
    return line ? 0 : CR_ENOMEM;
}

static int add_resource(struct otel_conf *c, char *key, char *value, struct cr_err *err)
{
    size_t i;
    for (i = 0; i < c->nresource; i++)
        if (strcmp(c->resource[i].key, key) == 0)
            break;
    if (i < c->nresource) {
        cr_free(c->resource[i].value);
        c->resource[i].value = value;
        cr_free(key);
        return 0;
    }
    /* one place is kept for service.name */
    if (c->nresource == OTEL_MAX_RESOURCE - 1 && strcmp(key, "service.name") != 0) {
        cr_err_set(err, CR_EINVAL,
                   "OTEL_RESOURCE_ATTRIBUTES: '%.64s' skipped (at most %d)", key,
                   OTEL_MAX_RESOURCE);
        cr_free(key);
        cr_free(value);
        return 0;
    }
    c->resource[c->nresource].key = key;
    c->resource[c->nresource++].value = value;
    return 0;
}

/* service.name first: OTEL_SERVICE_NAME, else the resource attributes',
 * else "celeriac". */
static int set_service(struct otel_conf *c, const char *name)
{
    size_t i;
    struct otel_kv t;
    for (i = 0; i < c->nresource; i++)
        if (strcmp(c->resource[i].key, "service.name") == 0)
            break;
    if (i == c->nresource) {
        c->resource[i].key = cr_strdup("service.name");
        c->resource[i].value = cr_strdup(name ? name : "celeriac");
        c->nresource++;
        if (!c->resource[i].key || !c->resource[i].value)
            return CR_ENOMEM;
    } else if (name) {
        char *v = cr_strdup(name);
        if (!v)
            return CR_ENOMEM;
        cr_free(c->resource[i].value);
        c->resource[i].value = v;
    }
    t = c->resource[i];
    memmove(c->resource + 1, c->resource, i * sizeof(t));
    c->resource[0] = t;
    return 0;
}

static long timeout_of(const char *v, struct cr_err *err)
{
    char *end;
    long ms;
    if (!v)
        return 10000;
    ms = strtol(v, &end, 10);
    if (end == v || *end || ms <= 0 || ms > 600000) {
        cr_err_set(err, CR_EINVAL, "OTEL_EXPORTER_OTLP_TIMEOUT '%.32s' ignored", v);
        return 10000;
    }
    return ms;
}

static char *traces_url_of(const char *const *env)
{
    const char *t = env_nonempty(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    const char *base = env_nonempty(env, "OTEL_EXPORTER_OTLP_ENDPOINT");
    size_t n;
    char *url;
    if (t)
        return cr_strdup(t);
    if (!base)
        return NULL;
    n = strlen(base);
    while (n && base[n - 1] == '/')
        n--;
    url = cr_malloc(n + sizeof("/v1/traces"));
    if (url) {
        memcpy(url, base, n);
        memcpy(url + n, "/v1/traces", sizeof("/v1/traces"));
    }
    return url;
}

void otel_conf_release(struct otel_conf *c)
{
    cr_free(c->traces_url);
    for (size_t i = 0; i < c->nheaders; i++)
        cr_free(c->headers[i]);
    for (size_t i = 0; i < c->nresource; i++) {
        cr_free(c->resource[i].key);
        cr_free(c->resource[i].value);
    }
    memset(c, 0, sizeof(*c));
}

int otel_conf_load(struct otel_conf *c, const char *const *env, struct cr_err *err)
{
    const char *v, *proto;
    const char *disabled = env_get(env, "OTEL_SDK_DISABLED");
    const char *exporter = env_get(env, "OTEL_TRACES_EXPORTER");

    memset(c, 0, sizeof(*c));
    if (err)
        err->code = 0;
    otel_sampler_parse(&c->sampler, env_get(env, "OTEL_TRACES_SAMPLER"),
                       env_get(env, "OTEL_TRACES_SAMPLER_ARG"), err);
    c->timeout_ms =
        timeout_of(env_nonempty(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                       ? env_nonempty(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                       : env_nonempty(env, "OTEL_EXPORTER_OTLP_TIMEOUT"),
                   err);
    if (disabled && strcasecmp(disabled, "true") == 0)
        return 0;
    if (exporter && strcmp(exporter, "none") == 0)
        return 0;
    if (exporter && *exporter && strcmp(exporter, "otlp") != 0) {
        cr_err_set(err, CR_EINVAL,
                   "OTEL_TRACES_EXPORTER '%.32s' not supported: no tracing", exporter);
        return 0;
    }
    proto = env_nonempty(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
    if (!proto)
        proto = env_nonempty(env, "OTEL_EXPORTER_OTLP_PROTOCOL");
    if (proto && strcmp(proto, "http/json") == 0) {
        c->json = 1;
    } else if (proto && strcmp(proto, "http/protobuf") != 0) {
        cr_err_set(err, CR_EINVAL,
                   "OTEL_EXPORTER_OTLP_PROTOCOL '%.32s' not supported (http/protobuf, "
                   "http/json): no tracing",
                   proto);
        return 0;
    }
    c->traces_url = traces_url_of(env);
    if (!c->traces_url) {
        if (env_nonempty(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") ||
            env_nonempty(env, "OTEL_EXPORTER_OTLP_ENDPOINT"))
            goto oom;
        return 0;
    }
    v = env_nonempty(env, "OTEL_SERVICE_NAME");
    if (each_entry(c, env_get(env, "OTEL_RESOURCE_ATTRIBUTES"), add_resource, err) < 0 ||
        set_service(c, v))
        goto oom;
    if (each_entry(c, env_get(env, "OTEL_EXPORTER_OTLP_HEADERS"), add_header, err) < 0 ||
        each_entry(c, env_get(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"), add_header,
                   err) < 0)
        goto oom;
    c->enabled = 1;
    return 0;
oom:
    otel_conf_release(c);
    return cr_err_set(err, CR_ENOMEM, "out of memory");
}
