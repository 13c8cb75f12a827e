/* prices.c -- token prices per model pattern and the cost of an answer. */
#include "prices.h"

#include <limits.h>
#include <string.h>

#include "util/alloc.h"

static int number_in_range(const cJSON *v, double *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) ||
        v->valuedouble > LLM_PRICE_MAX_USD)
        return -1;
    *out = v->valuedouble;
    return 0;
}

static int parse_one(struct llm_price *pr, const cJSON *o, const char *provider,
                     struct cr_err *err)
{
    static const char *const keys[] = {"input", "output", "cached_input", "cache_write",
                                       NULL};
    double *const dst[] = {&pr->input, &pr->output, &pr->cached_input, &pr->cache_write};
    int have[4] = {0, 0, 0, 0};
    const cJSON *k;

    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': prices '%.64s' must be an object of USD "
                          "per million tokens",
                          provider, o->string);
    cJSON_ArrayForEach(k, o)
    {
        int i = 0;
        while (keys[i] && strcmp(k->string, keys[i]))
            i++;
        if (!keys[i])
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': prices '%.64s': unknown key '%.40s' "
                              "(input, output, cached_input, cache_write)",
                              provider, o->string, k->string);
        if (number_in_range(k, dst[i]))
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': prices '%.64s': '%s' must be USD per "
                              "million tokens in [0, %.0f]",
                              provider, o->string, keys[i], LLM_PRICE_MAX_USD);
        have[i] = 1;
    }
    if (!have[0] || !have[1])
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': prices '%.64s' needs 'input' and 'output'",
                          provider, o->string);
    if (!have[2])
        pr->cached_input = pr->input;
    if (!have[3])
        pr->cache_write = pr->input;
    return 0;
}

int llm_prices_parse(struct llm_prices *p, const cJSON *o, const char *provider,
                     struct cr_err *err)
{
    const cJSON *m;
    int n = 0, rc = 0;

    llm_prices_release(p);
    if (!cJSON_IsObject(o))
        return cr_err_set(
            err, CR_EINVAL,
            "llm provider '%s': 'prices' must be an object of model patterns", provider);
    n = cJSON_GetArraySize(o);
    if (n > LLM_PRICES_MAX)
        return cr_err_set(err, CR_EINVAL, "llm provider '%s': over %d prices", provider,
                          LLM_PRICES_MAX);
    if (n == 0)
        return 0;
    if (!(p->items = cr_calloc((size_t)n, sizeof(*p->items))))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    cJSON_ArrayForEach(m, o)
    {
        struct llm_price *pr = &p->items[p->n];
        const char *star = strchr(m->string, '*');
        size_t len = strlen(m->string);
        if (!len || len >= sizeof(pr->pattern) || (star && star[1])) {
            rc = cr_err_set(err, CR_EINVAL,
                            "llm provider '%s': price pattern '%.64s' must be a model "
                            "name or a prefix ending in '*' (under %d bytes)",
                            provider, m->string, LLM_PRICE_PATTERN_MAX);
            break;
        }
        if ((rc = parse_one(pr, m, provider, err)))
            break;
        memcpy(pr->pattern, m->string, len + 1);
        p->n++;
    }
    if (rc)
        llm_prices_release(p);
    return rc;
}

void llm_prices_release(struct llm_prices *p)
{
    cr_free(p->items);
    p->items = NULL;
    p->n = 0;
}

long llm_pattern_score(const char *pattern, const char *model)
{
    size_t n = strlen(pattern);
    if (n && pattern[n - 1] == '*')
        return strncmp(pattern, model, n - 1) ? -1 : (long)(n - 1);
    return strcmp(pattern, model) ? -1 : LONG_MAX;
}

const struct llm_price *llm_prices_find(const struct llm_prices *p, const char *model)
{
    const struct llm_price *best = NULL;
    long best_score = -1;

    if (!p || !model)
        return NULL;
    for (int i = 0; i < p->n; i++) {
        long s = llm_pattern_score(p->items[i].pattern, model);
        if (s > best_score) {
            best = &p->items[i];
            best_score = s;
        }
    }
    return best;
}

const struct llm_price *llm_prices_pick(const struct llm_prices *p, const char *sent,
                                        const char *served)
{
    const struct llm_price *pr = llm_prices_find(p, sent);
    return pr ? pr : llm_prices_find(p, served);
}

double llm_price_cost(const struct llm_price *pr, long prompt, long completion,
                      long cached, long cache_write)
{
    double c = cached > 0 ? (double)cached : 0,
           w = cache_write > 0 ? (double)cache_write : 0;
    double plain;

    if (!pr || prompt < 0 || completion < 0)
        return -1;
    /* A provider that says more cached tokens than prompt ones is believed
     * for the cached part; the plain part does not go negative. */
    plain = (double)prompt - c - w;
    if (plain < 0)
        plain = 0;
    return (plain * pr->input + c * pr->cached_input + w * pr->cache_write +
            (double)completion * pr->output) /
           1e6;
}
