/* router.c -- from a task's call to one request on the client (see router.h). */
#include "router.h"

#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"

/* base without its trailing slashes, then path: the default provider's
 * endpoints, as --llm-base-url has always been read. */
static char *join(const char *base, const char *path)
{
    struct buf b;
    size_t n = strlen(base);

    buf_init(&b);
    while (n && base[n - 1] == '/')
        n--;
    if (buf_append(&b, base, n) || buf_puts(&b, path)) {
        buf_release(&b);
        return NULL;
    }
    return buf_detach(&b);
}

static struct llm_limit *limit_of(struct llm_router *rt, const struct llm_named *named,
                                  const char *name, const char *model, int pooled,
                                  int *oom);

int llm_router_init(struct llm_router *rt, struct llm_client *client,
                    const struct llm_registry *providers, struct llm_gate *gates,
                    const struct llm_provider_config *deflt, struct cr_err *err)
{
    const char *base = deflt->base_url ? deflt->base_url : "";

    memset(rt, 0, sizeof(*rt));
    rt->client = client;
    rt->providers = providers;
    rt->gates = gates;
    rt->deflt = *deflt;
    if (providers) {
        for (int i = 0; i < providers->nproviders; i++)
            rt->budgets[i] = providers->providers[i].budget;
        rt->budgets[providers->nproviders] = providers->default_budget;
        for (int i = 0; i <= providers->nproviders; i++)
            rt->budgets[i].day = -1;
    }
    /* The limits of the pool targets known now (a model named, or an exact
     * route's own): the fleet's view of them starts before the first call. */
    for (int i = 0; providers && i < providers->nmodels; i++) {
        const struct llm_model_route *mr = &providers->models[i];
        for (int k = 0; k < mr->npool; k++) {
            struct llm_resolved rs;
            int oom;
            if (!mr->targets[k].model && strchr(mr->pattern, '*'))
                continue;
            llm_registry_target(providers, mr, k, mr->pattern, &rs);
            if (!limit_of(rt, rs.named, rs.name, rs.model, 1, &oom)) {
                llm_router_release(rt);
                return cr_err_set(err, CR_ENOMEM, "out of memory");
            }
        }
    }
    rt->chat_url = join(base, "/chat/completions");
    rt->embed_url = join(base, "/embeddings");
    if (!rt->chat_url || !rt->embed_url) {
        llm_router_release(rt);
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    }
    return 0;
}

void llm_router_release(struct llm_router *rt)
{
    while (rt->limits) {
        struct llm_limit *l = rt->limits;
        rt->limits = l->next;
        cr_free(l);
    }
    cr_free(rt->chat_url);
    cr_free(rt->embed_url);
    rt->chat_url = rt->embed_url = NULL;
}

/* out names the target rs gives (more and pool left as they are). */
static void fill_route(const struct llm_router *rt, const struct llm_call *c,
                       const struct llm_resolved *rs, struct llm_route *out)
{
    out->named = rs->named;
    out->name = rs->name;
    out->model = rs->model;
    out->impl = rs->named ? rs->named->impl : &llm_provider_openai;
    out->cfg = rs->named ? &rs->named->cfg : &rt->deflt;
    /* Leaving the fast path: another provider, another model name than the
     * one in the body, or an answer that may hold tool calls (the fast
     * path's reader keeps none). */
    out->fast = !rs->named && strcmp(rs->model, c->model) == 0 &&
                !(c->op == LLM_OP_CHAT && c->tools);
}

int llm_router_plan(const struct llm_router *rt, const struct llm_call *c,
                    struct llm_route *out, struct cr_err *err)
{
    struct llm_resolved rs;

    if (llm_registry_resolve(rt->providers, c->model, c->route_step, &rs))
        return cr_err_set(err, CR_EINVAL, "model %.64s has no provider number %d",
                          c->model, c->route_step + 1);
    fill_route(rt, c, &rs, out);
    out->more = rs.more;
    out->pool = rs.pool;
    out->pooled = 0;
    return 0;
}

int llm_router_pick(struct llm_router *rt, const struct llm_call *c, int64_t now_ms,
                    struct llm_route *to, struct cr_err *err)
{
    const struct llm_model_route *mr = to->pool;
    struct llm_pool_member m[LLM_POOL_MAX];
    struct llm_resolved each[LLM_POOL_MAX];
    int k, oom;

    if (!mr)
        return 0;
    for (int i = 0; i < mr->npool; i++) {
        struct llm_limit *lim;
        llm_registry_target(rt->providers, mr, i, c->model, &each[i]);
        lim = limit_of(rt, each[i].named, each[i].name, each[i].model, 1, &oom);
        if (!lim)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        m[i].weight = mr->weights[i];
        m[i].busy = lim->calls + lim->fleet_busy;
        m[i].cool_until_ms = (int64_t)lim->cool_until;
    }
    k = llm_pool_pick(&rt->pools[mr - rt->providers->models], mr->strategy, m, mr->npool,
                      now_ms, NULL);
    if (k < 0) { /* all cooled: the first to be open again */
        k = 0;
        for (int i = 1; i < mr->npool; i++)
            if (m[i].cool_until_ms < m[k].cool_until_ms)
                k = i;
    }
    fill_route(rt, c, &each[k], to);
    to->pool = NULL;
    to->pooled = 1;
    return 0;
}

/* The default provider's plain call: the task's body as it is. */
static struct llm_req *call_fast(struct llm_router *rt, const struct llm_call *c,
                                 const struct llm_route *to, llm_delta_fn *on_delta,
                                 llm_done_fn *on_done, void *privdata, struct cr_err *err)
{
    struct llm_request rq;
    int oom;

    memset(&rq, 0, sizeof(rq));
    rq.op = c->op;
    rq.url = c->op == LLM_OP_EMBED ? rt->embed_url : rt->chat_url;
    rq.api_key = rt->deflt.api_key;
    rq.body = c->body;
    rq.body_len = c->body_len;
    rq.embed_list = c->embed_list;
    rq.fallback_left = to->more;
    rq.prices = rt->providers ? &rt->providers->default_prices : NULL;
    rq.model = c->model;
    rq.trace_headers = c->trace_headers;
    rq.ntrace_headers = c->ntrace_headers;
    rq.limit = llm_router_limit(rt, NULL, "default", c->model, &oom);
    if (oom) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    return llm_client_submit(rt->client, &rq, on_delta, on_done, privdata, err);
}

/* Every other call: the provider's request, built from the task's
 * OpenAI-shaped body, and its own timeouts and gate when it is a named one. */
static struct llm_req *call_built(struct llm_router *rt, const struct llm_call *c,
                                  const struct llm_route *to, llm_delta_fn *on_delta,
                                  llm_done_fn *on_done, void *privdata,
                                  struct cr_err *err)
{
    struct llm_http_request hr;
    struct llm_request rq;
    struct llm_req *r;
    cJSON *req;
    int rc, oom;

    req = cJSON_ParseWithLength(c->body, c->body_len);
    if (!req) {
        cr_err_set(err, CR_ENOMEM, "cannot read the request back");
        return NULL;
    }
    llm_http_request_init(&hr);
    rc = to->impl->build(to->cfg, c->op, req, to->model, &hr, err);
    cJSON_Delete(req);
    if (rc) {
        llm_http_request_release(&hr);
        if (rc == CR_EINVAL) {
            char why[sizeof(err->msg)];
            memcpy(why, err->msg, sizeof(why));
            cr_err_set(err, CR_EINVAL, "provider %s: %s", to->name, why);
        }
        return NULL;
    }
    memset(&rq, 0, sizeof(rq));
    rq.op = c->op;
    rq.url = hr.url;
    rq.body = hr.body;
    rq.body_len = hr.body_len;
    rq.embed_list = c->embed_list;
    rq.provider = to->impl;
    rq.headers = (const char *const *)hr.headers;
    rq.nheaders = hr.nheaders;
    rq.framing = hr.framing;
    rq.provider_name = to->name; /* the registry's, or a literal */
    rq.fallback_left = to->more;
    rq.prices = to->named       ? &to->named->prices
                : rt->providers ? &rt->providers->default_prices
                                : NULL;
    rq.model = to->model;
    rq.trace_headers = c->trace_headers;
    rq.ntrace_headers = c->ntrace_headers;
    if (to->named) {
        rq.gate = &rt->gates[to->named - rt->providers->providers];
        rq.connect_timeout_s = to->named->connect_s;
        rq.first_byte_timeout_s = to->named->first_byte_s;
        rq.first_token_timeout_s = to->named->first_token_s;
        rq.idle_timeout_s = to->named->idle_s;
    }
    rq.limit = llm_router_limit(rt, to->named, to->name, to->model, &oom);
    if (oom) {
        llm_http_request_release(&hr);
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    r = llm_client_submit(rt->client, &rq, on_delta, on_done, privdata, err);
    llm_http_request_release(&hr);
    return r;
}

/* A pool's target without "limits" of its own: no limit but the cooling
 * a provider's 429 brings (llm_client grants its calls itself). */
static const struct lim_config cool_only = {0, 0, 0, LLM_LIMIT_DEFAULT_LEASE_MS};

static struct llm_limit *limit_of(struct llm_router *rt, const struct llm_named *named,
                                  const char *name, const char *model, int pooled,
                                  int *oom)
{
    const struct lim_config *cfg;
    struct llm_limit *l;
    char key[sizeof(l->key)];

    *oom = 0;
    if (!rt->providers)
        return NULL;
    snprintf(key, sizeof(key), "%s/%s", name, model);
    /* Made before, maybe by a pool: the same (provider, model) whichever
     * route names it, so its cooling holds for each. */
    for (l = rt->limits; l; l = l->next)
        if (!strcmp(l->key, key)) {
            l->pooled |= pooled;
            return l;
        }
    cfg = llm_limits_find(named ? &named->limits : &rt->providers->default_limits, model);
    if (!cfg && !pooled)
        return NULL;
    if (!(l = cr_calloc(1, sizeof(*l)))) {
        *oom = 1;
        return NULL;
    }
    l->cfg = cfg ? cfg : &cool_only;
    l->pooled = pooled;
    memcpy(l->key, key, sizeof(key));
    l->next = rt->limits;
    rt->limits = l;
    return l;
}

struct llm_limit *llm_router_limit(struct llm_router *rt, const struct llm_named *named,
                                   const char *name, const char *model, int *oom)
{
    return limit_of(rt, named, name, model, 0, oom);
}

struct llm_limit *llm_router_limits(struct llm_router *rt)
{
    return rt->limits;
}

struct llm_budget *llm_router_budget(struct llm_router *rt, int i, const char **name)
{
    if (!rt->providers || i < 0 || i > rt->providers->nproviders)
        return NULL;
    *name = i < rt->providers->nproviders ? rt->providers->providers[i].name : "default";
    return &rt->budgets[i];
}

static struct llm_budget *budget_named(struct llm_router *rt, const char *name)
{
    int i;
    if (!rt->providers)
        return NULL;
    if (!name || !name[0] || !strcmp(name, "default"))
        return &rt->budgets[rt->providers->nproviders];
    i = llm_registry_find(rt->providers, name, strlen(name));
    return i >= 0 ? &rt->budgets[i] : NULL;
}

void llm_router_spent(struct llm_router *rt, const char *name, long day, double usd)
{
    struct llm_budget *b = budget_named(rt, name);
    if (b && b->usd_per_day > 0)
        llm_budget_add(b, day, usd);
}

struct llm_req *llm_router_call(struct llm_router *rt, const struct llm_call *c,
                                llm_delta_fn *on_delta, llm_done_fn *on_done,
                                void *privdata, struct cr_err *err)
{
    struct llm_route to;
    struct llm_budget *b;

    if (llm_router_plan(rt, c, &to, err))
        return NULL;
    if (to.pool && llm_router_pick(rt, c, (int64_t)llm_client_now(rt->client), &to, err))
        return NULL;
    b = budget_named(rt, to.name);
    if (b && b->usd_per_day > 0) {
        long day = llm_budget_day(clock_epoch_us() / 1000);
        if (!llm_budget_open(b, day)) {
            cr_err_set(err, CR_EBUDGET,
                       "provider %s reached its budget of %.2f USD for today (UTC): %.4f "
                       "USD spent across the fleet",
                       to.name, b->usd_per_day, llm_budget_spent(b, day));
            return NULL;
        }
    }
    if (to.fast)
        return call_fast(rt, c, &to, on_delta, on_done, privdata, err);
    return call_built(rt, c, &to, on_delta, on_done, privdata, err);
}
