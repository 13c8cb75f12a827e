/* limits.c -- a provider's limits per model pattern (see limits.h). */
#include "limits.h"

#include <stdlib.h>
#include <string.h>

#include "prices.h"
#include "util/alloc.h"

static int parse_one(struct lim_config *c, const cJSON *o, const char *provider,
                     struct cr_err *err)
{
    const cJSON *k;
    int any = 0;

    *c = (struct lim_config){0};
    c->lease_ms = LLM_LIMIT_DEFAULT_LEASE_MS;
    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': limits '%.64s' must be an object "
                          "(rpm, tpm, concurrency, lease_s)",
                          provider, o->string);
    cJSON_ArrayForEach(k, o)
    {
        double v = cJSON_IsNumber(k) ? k->valuedouble : -1;
        int whole = v == (double)(long)v;
        if (!strcmp(k->string, "rpm") || !strcmp(k->string, "tpm")) {
            if (!(v > 0) || v > LLM_LIMIT_MAX_PER_MIN)
                return cr_err_set(err, CR_EINVAL,
                                  "llm provider '%s': limits '%.64s': '%s' must be a "
                                  "number per minute in (0, %.0f]",
                                  provider, o->string, k->string, LLM_LIMIT_MAX_PER_MIN);
            *(k->string[0] == 'r' ? &c->rpm : &c->tpm) = v;
            any = 1;
        } else if (!strcmp(k->string, "concurrency")) {
            if (v < 1 || v > LIM_MAX_PERMITS || !whole)
                return cr_err_set(err, CR_EINVAL,
                                  "llm provider '%s': limits '%.64s': 'concurrency' must "
                                  "be a whole number in [1, %d]",
                                  provider, o->string, LIM_MAX_PERMITS);
            c->concurrency = (long)v;
            any = 1;
        } else if (!strcmp(k->string, "lease_s")) {
            if (v < 1 || v > 3600)
                return cr_err_set(err, CR_EINVAL,
                                  "llm provider '%s': limits '%.64s': 'lease_s' must be "
                                  "seconds in [1, 3600]",
                                  provider, o->string);
            c->lease_ms = (int64_t)(v * 1000);
        } else {
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': limits '%.64s': unknown key '%.40s' "
                              "(rpm, tpm, concurrency, lease_s)",
                              provider, o->string, k->string);
        }
    }
    if (!any)
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': limits '%.64s' needs rpm, tpm or "
                          "concurrency",
                          provider, o->string);
    return 0;
}

int llm_limits_parse(struct llm_limits *l, const cJSON *o, const char *provider,
                     struct cr_err *err)
{
    const cJSON *m;
    int n, rc = 0;

    llm_limits_release(l);
    if (!cJSON_IsObject(o))
        return cr_err_set(
            err, CR_EINVAL,
            "llm provider '%s': 'limits' must be an object of model patterns", provider);
    n = cJSON_GetArraySize(o);
    if (n > LLM_LIMITS_MAX)
        return cr_err_set(err, CR_EINVAL, "llm provider '%s': over %d limits", provider,
                          LLM_LIMITS_MAX);
    if (n == 0)
        return 0;
    if (!(l->items = cr_calloc((size_t)n, sizeof(*l->items))))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    cJSON_ArrayForEach(m, o)
    {
        struct llm_limit_rule *r = &l->items[l->n];
        const char *star = strchr(m->string, '*');
        size_t len = strlen(m->string);
        if (!len || len >= sizeof(r->pattern) || (star && star[1])) {
            rc = cr_err_set(err, CR_EINVAL,
                            "llm provider '%s': limit pattern '%.64s' must be a model "
                            "name or a prefix ending in '*' (under %d bytes)",
                            provider, m->string, LLM_LIMIT_PATTERN_MAX);
            break;
        }
        if ((rc = parse_one(&r->cfg, m, provider, err)))
            break;
        memcpy(r->pattern, m->string, len + 1);
        l->n++;
    }
    if (rc)
        llm_limits_release(l);
    return rc;
}

void llm_limits_release(struct llm_limits *l)
{
    cr_free(l->items);
    l->items = NULL;
    l->n = 0;
}

const struct lim_config *llm_limits_find(const struct llm_limits *l, const char *model)
{
    const struct lim_config *best = NULL;
    long best_score = -1;

    if (!l || !model)
        return NULL;
    for (int i = 0; i < l->n; i++) {
        long s = llm_pattern_score(l->items[i].pattern, model);
        if (s > best_score) {
            best_score = s;
            best = &l->items[i].cfg;
        }
    }
    return best;
}

/* The number after "key": in body, or -1. */
static long number_after(const char *body, size_t len, const char *key)
{
    size_t klen = strlen(key);
    const char *p = body, *end = body + len;

    while (p && (size_t)(end - p) > klen &&
           (p = memmem(p, (size_t)(end - p), key, klen))) {
        const char *q = p + klen;
        p = q;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
            q++;
        if (q >= end || *q != ':')
            continue;
        q++;
        while (q < end && (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r'))
            q++;
        if (q < end && *q >= '0' && *q <= '9') {
            long v = 0;
            while (q < end && *q >= '0' && *q <= '9' && v < 100000000)
                v = v * 10 + (*q++ - '0');
            return v < 100000000 ? v : 100000000; /* no answer is longer */
        }
    }
    return -1;
}

long llm_limits_estimate(const char *body, size_t len, int chat)
{
    static const char *const keys[] = {"\"max_tokens\"", "\"max_completion_tokens\"",
                                       "\"num_predict\"", NULL};
    long est = (long)(len / 4), answer = -1;

    if (!chat)
        return est;
    for (int i = 0; keys[i] && answer < 0; i++)
        answer = body ? number_after(body, len, keys[i]) : -1;
    return est + (answer >= 0 ? answer : LLM_LIMIT_DEFAULT_ANSWER);
}
