/* registry.c -- named providers and model routes (see registry.h). */
#include "registry.h"

#include <stdio.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "llm_client.h"
#include "util/alloc.h"

void llm_registry_init(struct llm_registry *r)
{
    memset(r, 0, sizeof(*r));
}

static void named_release(struct llm_named *p)
{
    cr_free(p->base_url);
    cr_free(p->api_key);
    cr_free(p->api_version);
    cr_free(p->deployment);
    cr_free(p->api_key_env);
    for (int i = 0; p->headers[i]; i++)
        cr_free(p->headers[i]);
    llm_prices_release(&p->prices);
    llm_limits_release(&p->limits);
    memset(p, 0, sizeof(*p));
}

void llm_registry_release(struct llm_registry *r)
{
    for (int i = 0; i < r->nproviders; i++)
        named_release(&r->providers[i]);
    for (int i = 0; i < r->nmodels; i++) {
        cr_free(r->models[i].pattern);
        for (int k = 0; k < r->models[i].ntargets; k++)
            cr_free(r->models[i].targets[k].model);
    }
    llm_prices_release(&r->default_prices);
    llm_limits_release(&r->default_limits);
    llm_registry_init(r);
}

int llm_registry_find(const struct llm_registry *r, const char *name, size_t n)
{
    for (int i = 0; i < r->nproviders; i++)
        if (strlen(r->providers[i].name) == n && !memcmp(r->providers[i].name, name, n))
            return i;
    return -1;
}

/* Names are what a model prefix can hold: [a-z0-9_-], 1 to 31 of them. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 31)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return 0;
    return 1;
}

/* Points the provider's config at its own strings. */
static void named_link(struct llm_named *p)
{
    p->cfg.base_url = p->base_url;
    p->cfg.api_key = p->api_key;
    p->cfg.api_version = p->api_version;
    p->cfg.deployment = p->deployment;
    p->cfg.headers = (const char *const *)p->headers;
}

/* A slot for name: the existing one (emptied), or a new one. NULL when full. */
static struct llm_named *slot_for(struct llm_registry *r, const char *name)
{
    int i = llm_registry_find(r, name, strlen(name));
    struct llm_named *p;

    if (i >= 0) {
        named_release(&r->providers[i]);
        p = &r->providers[i];
    } else {
        if (r->nproviders >= LLM_REGISTRY_MAX_PROVIDERS)
            return NULL;
        p = &r->providers[r->nproviders++];
        memset(p, 0, sizeof(*p));
    }
    snprintf(p->name, sizeof(p->name), "%s", name);
    return p;
}

static int dup_opt(char **dst, const char *s)
{
    if (!s || !s[0])
        return 0;
    *dst = cr_strdup(s);
    return *dst ? 0 : CR_ENOMEM;
}

/* ------------------------------------------------------------ environment */

/* A new provider of this name and type, or NULL when the name exists
 * already (*rc 0) or there is no room (*rc CR_EINVAL). */
static struct llm_named *env_slot(struct llm_registry *r, const char *name,
                                  const struct llm_provider *impl, int *rc)
{
    struct llm_named *p;

    *rc = 0;
    if (llm_registry_find(r, name, strlen(name)) >= 0)
        return NULL;
    if (!(p = slot_for(r, name))) {
        *rc = CR_EINVAL;
        return NULL;
    }
    p->impl = impl;
    return p;
}

int llm_registry_from_env(struct llm_registry *r, llm_getenv_fn *env, struct cr_err *err)
{
    const char *v;
    struct llm_named *p;
    int rc = 0;

    if ((env("ANTHROPIC_API_KEY") || env("ANTHROPIC_BASE_URL")) &&
        (p = env_slot(r, "anthropic", &llm_provider_anthropic, &rc))) {
        if (dup_opt(&p->api_key, env("ANTHROPIC_API_KEY")) ||
            dup_opt(&p->base_url, env("ANTHROPIC_BASE_URL")) ||
            dup_opt(&p->api_key_env, "ANTHROPIC_API_KEY"))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        named_link(p);
    }
    if (!rc && (v = env("OLLAMA_HOST")) && v[0] &&
        (p = env_slot(r, "ollama", &llm_provider_ollama, &rc))) {
        /* OLLAMA_HOST may be "host:port" without a scheme, as ollama's own
         * client takes it. */
        size_t n = strlen(v) + 8;
        char *u = cr_malloc(n);
        if (!u)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        snprintf(u, n, "%s%s", strstr(v, "://") ? "" : "http://", v);
        p->base_url = u;
        named_link(p);
    }
    if (!rc && (v = env("AZURE_OPENAI_ENDPOINT")) && v[0] &&
        (p = env_slot(r, "azure", &llm_provider_azure, &rc))) {
        if (dup_opt(&p->base_url, v) ||
            dup_opt(&p->api_key, env("AZURE_OPENAI_API_KEY")) ||
            dup_opt(&p->api_version, env("OPENAI_API_VERSION")) ||
            dup_opt(&p->api_key_env, "AZURE_OPENAI_API_KEY"))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        named_link(p);
    }
    if (rc)
        return cr_err_set(err, rc, "more than %d llm providers",
                          LLM_REGISTRY_MAX_PROVIDERS);
    return 0;
}

/* --------------------------------------------------------------- document */

static const char *str_of(const cJSON *o, const char *k)
{
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
}

static int parse_timeouts(struct llm_named *p, const cJSON *t, struct cr_err *err)
{
    const cJSON *k;
    if (!cJSON_IsObject(t))
        return cr_err_set(err, CR_EINVAL, "llm provider '%s': timeouts must be an object",
                          p->name);
    cJSON_ArrayForEach(k, t)
    {
        double *dst = !strcmp(k->string, "connect")       ? &p->connect_s
                      : !strcmp(k->string, "first_byte")  ? &p->first_byte_s
                      : !strcmp(k->string, "first_token") ? &p->first_token_s
                      : !strcmp(k->string, "idle")        ? &p->idle_s
                                                          : NULL;
        if (!dst)
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': unknown timeout '%.40s' (connect, "
                              "first_byte, first_token, idle)",
                              p->name, k->string);
        if (!cJSON_IsNumber(k) || k->valuedouble <= 0 || k->valuedouble > 86400)
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': timeout '%s' must be seconds in (0, "
                              "86400]",
                              p->name, k->string);
        *dst = k->valuedouble;
    }
    return 0;
}

/* The default provider is configured by the worker's options; its entry
 * may only price it. */
static int parse_default(struct llm_registry *r, const cJSON *o, struct cr_err *err)
{
    const cJSON *k;
    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL, "llm provider 'default' must be an object");
    cJSON_ArrayForEach(k, o)
    {
        if (strcmp(k->string, "prices") && strcmp(k->string, "budget") &&
            strcmp(k->string, "limits"))
            return cr_err_set(err, CR_EINVAL,
                              "llm provider 'default' is the worker's own provider "
                              "(--llm-base-url and the other options): its entry may "
                              "only hold 'prices', 'budget' and 'limits', not '%.40s'",
                              k->string);
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "prices")) &&
        llm_prices_parse(&r->default_prices, k, "default", err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "limits")) &&
        llm_limits_parse(&r->default_limits, k, "default", err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "budget")))
        return llm_budget_parse(&r->default_budget, k, "default", err);
    return 0;
}

static int parse_provider(struct llm_registry *r, const cJSON *o, llm_getenv_fn *env,
                          struct cr_err *err)
{
    static const char *const keys[] = {
        "type",    "base_url",   "api_key_env", "api_version",     "deployment",
        "headers", "max_tokens", "timeouts",    "max_connections", "prices",
        "budget",  "limits",     NULL};
    const char *name = o->string, *type;
    const struct llm_provider *impl;
    struct llm_named *p;
    const cJSON *k, *h;
    int nh = 0;

    if (!valid_name(name) || !strcmp(name, "default"))
        return cr_err_set(err, CR_EINVAL,
                          "llm provider name '%.40s' must be 1-31 of [a-z0-9_-], not "
                          "'default'",
                          name);
    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL, "llm provider '%s' must be an object", name);
    cJSON_ArrayForEach(k, o)
    {
        int known = 0;
        for (int i = 0; keys[i]; i++)
            known |= !strcmp(k->string, keys[i]);
        if (!known)
            return cr_err_set(err, CR_EINVAL, "llm provider '%s': unknown key '%.40s'",
                              name, k->string);
        if (strcmp(k->string, "headers") && strcmp(k->string, "max_tokens") &&
            strcmp(k->string, "timeouts") && strcmp(k->string, "max_connections") &&
            strcmp(k->string, "prices") && strcmp(k->string, "budget") &&
            strcmp(k->string, "limits") && !cJSON_IsString(k))
            return cr_err_set(err, CR_EINVAL, "llm provider '%s': '%s' must be a string",
                              name, k->string);
    }
    type = str_of(o, "type");
    impl = type ? llm_provider_find(type) : NULL;
    if (!impl)
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': type must be openai, anthropic, ollama or "
                          "azure",
                          name);
    if (!str_of(o, "base_url") && impl != &llm_provider_anthropic)
        return cr_err_set(err, CR_EINVAL, "llm provider '%s' needs a base_url", name);
    if (!(p = slot_for(r, name)))
        return cr_err_set(err, CR_EINVAL, "more than %d llm providers",
                          LLM_REGISTRY_MAX_PROVIDERS);
    p->impl = impl;
    if (dup_opt(&p->base_url, str_of(o, "base_url")) ||
        dup_opt(&p->api_version, str_of(o, "api_version")) ||
        dup_opt(&p->deployment, str_of(o, "deployment")) ||
        dup_opt(&p->api_key_env, str_of(o, "api_key_env")))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    if (p->api_key_env) {
        const char *key = env(p->api_key_env);
        if (!key || !key[0])
            return cr_err_set(
                err, CR_EINVAL,
                "llm provider '%s': the variable %.64s named by api_key_env "
                "is not set",
                name, p->api_key_env);
        if (dup_opt(&p->api_key, key))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "max_tokens"))) {
        if (!cJSON_IsNumber(k) || k->valuedouble < 1 || k->valuedouble > 1e7)
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': max_tokens must be a positive integer",
                              name);
        p->cfg.default_max_tokens = (long)k->valuedouble;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "max_connections"))) {
        /* A whole number: 2.5 calls in flight means nothing, and a cut
         * fraction would hide a typo. */
        if (!cJSON_IsNumber(k) || k->valuedouble < 0 ||
            k->valuedouble > LLM_REGISTRY_MAX_CONNECTIONS ||
            k->valuedouble != (double)(long)k->valuedouble)
            return cr_err_set(err, CR_EINVAL,
                              "llm provider '%s': max_connections must be an integer "
                              "in [0, %d] (0: no cap of its own)",
                              name, LLM_REGISTRY_MAX_CONNECTIONS);
        p->max_connections = (long)k->valuedouble;
    }
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "timeouts")) &&
        parse_timeouts(p, k, err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "prices")) &&
        llm_prices_parse(&p->prices, k, name, err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "budget")) &&
        llm_budget_parse(&p->budget, k, name, err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "limits")) &&
        llm_limits_parse(&p->limits, k, name, err))
        return err->code;
    if ((k = cJSON_GetObjectItemCaseSensitive(o, "headers"))) {
        if (!cJSON_IsArray(k))
            return cr_err_set(
                err, CR_EINVAL,
                "llm provider '%s': headers must be a list of 'Name: value'", name);
        cJSON_ArrayForEach(h, k)
        {
            if (nh >= LLM_REGISTRY_MAX_HEADERS)
                return cr_err_set(err, CR_EINVAL, "llm provider '%s': over %d headers",
                                  name, LLM_REGISTRY_MAX_HEADERS);
            if (!cJSON_IsString(h))
                return cr_err_set(err, CR_EINVAL,
                                  "llm provider '%s': each header must be a string",
                                  name);
            if (llm_header_check(h->valuestring, err)) {
                char why[sizeof(err->msg)];
                snprintf(why, sizeof(why), "%s", err->msg);
                return cr_err_set(err, CR_EINVAL, "llm provider '%s': %s", name, why);
            }
            if (!(p->headers[nh++] = cr_strdup(h->valuestring)))
                return cr_err_set(err, CR_ENOMEM, "out of memory");
        }
    }
    named_link(p);
    return 0;
}

/* "name/model" or "name" -> a target. */
static int parse_target(struct llm_registry *r, const char *route, const cJSON *t,
                        struct llm_target *out, struct cr_err *err)
{
    const char *s = cJSON_GetStringValue(t), *slash;
    size_t n;

    if (!s || !s[0])
        return cr_err_set(err, CR_EINVAL,
                          "llm model '%.64s': each target must be 'provider' or "
                          "'provider/model'",
                          route);
    slash = strchr(s, '/');
    n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 7 && !memcmp(s, "default", 7))
        out->provider = -1;
    else if ((out->provider = llm_registry_find(r, s, n)) < 0)
        return cr_err_set(err, CR_EINVAL, "llm model '%.64s': no provider named '%.*s'",
                          route, (int)(n > 40 ? 40 : n), s);
    if (slash && slash[1] && !(out->model = cr_strdup(slash + 1)))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    return 0;
}

/* A list of 1 .. max targets into mr's targets from index mr->ntargets. */
static int parse_list(struct llm_registry *r, const char *route, const cJSON *l,
                      const char *what, int max, struct llm_model_route *mr,
                      struct cr_err *err)
{
    const cJSON *t;
    if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) < 1 || cJSON_GetArraySize(l) > max)
        return cr_err_set(err, CR_EINVAL,
                          "llm model '%.64s': %s must be a list of 1 to %d targets",
                          route, what, max);
    cJSON_ArrayForEach(t, l)
    {
        if (parse_target(r, route, t, &mr->targets[mr->ntargets], err))
            return err->code;
        mr->ntargets++;
    }
    return 0;
}

/* {"targets": [...], "strategy": ..., "weights": [...], "fallbacks": [...]} */
static int parse_pool(struct llm_registry *r, const cJSON *m, struct llm_model_route *mr,
                      struct cr_err *err)
{
    const char *route = m->string;
    const cJSON *k, *w;
    long sum = 0;
    int i = 0;

    cJSON_ArrayForEach(k, m)
    {
        if (strcmp(k->string, "targets") && strcmp(k->string, "strategy") &&
            strcmp(k->string, "weights") && strcmp(k->string, "fallbacks"))
            return cr_err_set(
                err, CR_EINVAL,
                "llm model '%.64s': unknown key '%.40s' (targets, strategy, "
                "weights, fallbacks)",
                route, k->string);
    }
    mr->strategy = llm_pool_strategy_of(str_of(m, "strategy"));
    if (!mr->strategy)
        return cr_err_set(
            err, CR_EINVAL,
            "llm model '%.64s': strategy must be 'weighted' or 'least-busy'", route);
    if (!(k = cJSON_GetObjectItemCaseSensitive(m, "targets")))
        return cr_err_set(err, CR_EINVAL, "llm model '%.64s': a pool needs 'targets'",
                          route);
    if (parse_list(r, route, k, "targets", LLM_POOL_MAX, mr, err))
        return err->code;
    mr->npool = mr->ntargets;
    w = cJSON_GetObjectItemCaseSensitive(m, "weights");
    if (w && mr->strategy != LLM_POOL_WEIGHTED)
        return cr_err_set(
            err, CR_EINVAL,
            "llm model '%.64s': weights are for the 'weighted' strategy only", route);
    if (w && (!cJSON_IsArray(w) || cJSON_GetArraySize(w) != mr->npool))
        return cr_err_set(err, CR_EINVAL,
                          "llm model '%.64s': weights must be a list of %d numbers, one "
                          "per target",
                          route, mr->npool);
    for (i = 0; i < mr->npool; i++) {
        const cJSON *x = w ? cJSON_GetArrayItem(w, i) : NULL;
        if (x && (!cJSON_IsNumber(x) || x->valuedouble < 0 ||
                  x->valuedouble > LLM_POOL_MAX_WEIGHT ||
                  x->valuedouble != (double)(long)x->valuedouble))
            return cr_err_set(
                err, CR_EINVAL,
                "llm model '%.64s': weight %d must be a whole number in [0, "
                "%d]",
                route, i + 1, LLM_POOL_MAX_WEIGHT);
        mr->weights[i] = x ? (long)x->valuedouble : 1;
        sum += mr->weights[i];
    }
    if (sum <= 0)
        return cr_err_set(
            err, CR_EINVAL,
            "llm model '%.64s': the weights add up to 0: no target would be "
            "picked",
            route);
    k = cJSON_GetObjectItemCaseSensitive(m, "fallbacks");
    if (k && mr->npool >= LLM_REGISTRY_MAX_TARGETS)
        return cr_err_set(err, CR_EINVAL,
                          "llm model '%.64s': targets and fallbacks are %d at most",
                          route, LLM_REGISTRY_MAX_TARGETS);
    if (k && parse_list(r, route, k, "fallbacks", LLM_REGISTRY_MAX_TARGETS - mr->npool,
                        mr, err))
        return err->code;
    return 0;
}

static int parse_models(struct llm_registry *r, const cJSON *models, struct cr_err *err)
{
    const cJSON *m;

    if (!cJSON_IsObject(models))
        return cr_err_set(err, CR_EINVAL, "llm providers: 'models' must be an object");
    cJSON_ArrayForEach(m, models)
    {
        struct llm_model_route *mr;
        const char *star = strchr(m->string, '*');

        if (!m->string[0] || (star && star[1]))
            return cr_err_set(err, CR_EINVAL,
                              "llm model '%.64s': a pattern may only end in '*'",
                              m->string);
        if (!cJSON_IsObject(m) && (!cJSON_IsArray(m) || cJSON_GetArraySize(m) < 1 ||
                                   cJSON_GetArraySize(m) > LLM_REGISTRY_MAX_TARGETS))
            return cr_err_set(
                err, CR_EINVAL,
                "llm model '%.64s' must map to a list of 1 to %d targets, or "
                "a pool {\"targets\": [...], \"strategy\": ...}",
                m->string, LLM_REGISTRY_MAX_TARGETS);
        if (r->nmodels >= LLM_REGISTRY_MAX_MODELS)
            return cr_err_set(err, CR_EINVAL, "more than %d llm models",
                              LLM_REGISTRY_MAX_MODELS);
        mr = &r->models[r->nmodels++];
        memset(mr, 0, sizeof(*mr));
        if (!(mr->pattern = cr_strdup(m->string)))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        if (cJSON_IsObject(m) ? parse_pool(r, m, mr, err)
                              : parse_list(r, m->string, m, "its value",
                                           LLM_REGISTRY_MAX_TARGETS, mr, err))
            return err->code;
    }
    return 0;
}

int llm_registry_parse(struct llm_registry *r, const char *doc, size_t len,
                       llm_getenv_fn *env, struct cr_err *err)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(doc, len, &end, 0);
    const cJSON *k, *p;
    int rc = 0;

    if (!root) {
        /* cJSON points end at the byte it stopped at: said as an editor
         * would, line and column from 1. */
        size_t at = end && end >= doc && end <= doc + len ? (size_t)(end - doc) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < at; i++) {
            col = doc[i] == '\n' ? 1 : col + 1;
            line += doc[i] == '\n';
        }
        return cr_err_set(err, CR_EINVAL,
                          "llm providers: bad JSON near line %d, column %d (byte %zu)",
                          line, col, at);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EINVAL, "llm providers: not a JSON object");
    }
    cJSON_ArrayForEach(k, root)
    {
        if (strcmp(k->string, "providers") && strcmp(k->string, "models")) {
            rc = cr_err_set(err, CR_EINVAL,
                            "llm providers: unknown key '%.40s' (providers, models)",
                            k->string);
            goto out;
        }
    }
    p = cJSON_GetObjectItemCaseSensitive(root, "providers");
    if (p && !cJSON_IsObject(p)) {
        rc = cr_err_set(err, CR_EINVAL, "llm providers: 'providers' must be an object");
        goto out;
    }
    cJSON_ArrayForEach(k, p)
    {
        if (!strcmp(k->string, "default")) {
            if ((rc = parse_default(r, k, err)))
                goto out;
            continue;
        }
        if ((rc = parse_provider(r, k, env, err)))
            goto out;
    }
    /* After every provider: a target may name one defined later in the file. */
    if ((k = cJSON_GetObjectItemCaseSensitive(root, "models")))
        rc = parse_models(r, k, err);
out:
    cJSON_Delete(root);
    return rc;
}

/* -------------------------------------------------------------- resolving */

static const struct llm_model_route *route_of(const struct llm_registry *r,
                                              const char *model)
{
    const struct llm_model_route *best = NULL;
    long best_score = -1;

    for (int i = 0; i < r->nmodels; i++) {
        long s = llm_pattern_score(r->models[i].pattern, model);
        if (s > best_score) {
            best = &r->models[i];
            best_score = s;
        }
    }
    return best;
}

void llm_registry_target(const struct llm_registry *r, const struct llm_model_route *mr,
                         int i, const char *model, struct llm_resolved *out)
{
    const struct llm_target *t = &mr->targets[i];
    const char *slash = strchr(model, '/');
    int pi = slash ? llm_registry_find(r, model, (size_t)(slash - model)) : -1;
    /* "name/rest" with name a provider: rest is the model that name knows. */
    const char *bare = pi >= 0 && slash[1] ? slash + 1 : model;

    out->named = t->provider >= 0 ? &r->providers[t->provider] : NULL;
    out->model = t->model ? t->model : bare;
    out->name = out->named ? out->named->name : "default";
}

int llm_registry_resolve(const struct llm_registry *r, const char *model, int step,
                         struct llm_resolved *out)
{
    const struct llm_model_route *mr = route_of(r, model);
    const char *slash = strchr(model, '/');
    int pi = slash ? llm_registry_find(r, model, (size_t)(slash - model)) : -1;
    /* "name/rest" with name a provider: rest is the model that name knows. */
    const char *bare = pi >= 0 && slash[1] ? slash + 1 : model;

    memset(out, 0, sizeof(*out));
    if (mr) {
        if (step < 0 || step >= mr->ntargets)
            return -1;
        /* A pool's steps name its first target until the router picks. */
        llm_registry_target(r, mr, step < mr->npool ? 0 : step, model, out);
        out->more = step + 1 < mr->ntargets;
        out->pool = step < mr->npool ? mr : NULL;
        return 0;
    } else if (step != 0) {
        return -1;
    } else if (pi >= 0 && slash[1]) {
        out->named = &r->providers[pi];
        out->model = bare;
    } else {
        out->model = model;
    }
    out->name = out->named ? out->named->name : "default";
    return 0;
}
