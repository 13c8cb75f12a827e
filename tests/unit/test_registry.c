/* test_registry.c -- the providers document and model resolution
 * (llm/registry.c): every key, every refusal, the resolution order and the
 * environment's providers, with a fake environment. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "llm/registry.h"

static const char *fake_env(const char *name)
{
    static const char *const vars[][2] = {
        {"K1", "secret-one"},
        {"ANTHROPIC_API_KEY", "sk-ant-env"},
        {"OLLAMA_HOST", "127.0.0.1:11434"},
        {NULL, NULL},
    };
    for (int i = 0; vars[i][0]; i++)
        if (!strcmp(vars[i][0], name))
            return vars[i][1];
    return NULL;
}

static const char *no_env(const char *name)
{
    (void)name;
    return NULL;
}

static const char *DOC =
    "{\"providers\": {"
    " \"claude\": {\"type\": \"anthropic\", \"api_key_env\": \"K1\", \"max_tokens\": 99,"
    "   \"headers\": [\"anthropic-beta: x\"], \"timeouts\": {\"first_token\": 5}},"
    " \"local\": {\"type\": \"ollama\", \"base_url\": \"http://h:11434\","
    "   \"max_connections\": 2},"
    " \"az\": {\"type\": \"azure\", \"base_url\": \"https://r.openai.azure.com\","
    "   \"deployment\": \"dep\", \"api_version\": \"2024-10-21\"}},"
    " \"models\": {\"smart\": [\"claude/claude-x\", \"local\", \"default/gpt-4o\"],"
    "   \"llama*\": [\"local\"], \"llama3-big*\": [\"az\"]}}";

static void load(struct llm_registry *r, const char *doc, llm_getenv_fn *env)
{
    struct cr_err err;
    llm_registry_init(r);
    memset(&err, 0, sizeof(err));
    ck_assert_msg(llm_registry_parse(r, doc, strlen(doc), env, &err) == 0, "%s", err.msg);
}

static void resolve_is(const struct llm_registry *r, const char *model, int step,
                       const char *name, const char *sent, int more)
{
    struct llm_resolved rs;
    ck_assert_int_eq(llm_registry_resolve(r, model, step, &rs), 0);
    ck_assert_str_eq(rs.name, name);
    ck_assert_str_eq(rs.model, sent);
    ck_assert_int_eq(rs.more, more);
    ck_assert(!strcmp(name, "default") ? rs.named == NULL : rs.named != NULL);
}

START_TEST(test_document)
{
    struct llm_registry r;
    const struct llm_named *c;
    load(&r, DOC, fake_env);
    ck_assert_int_eq(r.nproviders, 3);
    c = &r.providers[llm_registry_find(&r, "claude", 6)];
    ck_assert_ptr_eq(c->impl, &llm_provider_anthropic);
    ck_assert_str_eq(c->cfg.api_key, "secret-one");
    ck_assert_ptr_null(c->cfg.base_url); /* its default */
    ck_assert_int_eq(c->cfg.default_max_tokens, 99);
    ck_assert_str_eq(c->cfg.headers[0], "anthropic-beta: x");
    ck_assert_ptr_null(c->cfg.headers[1]);
    ck_assert(c->first_token_s == 5 && c->idle_s == 0);
    ck_assert_int_eq(c->max_connections, 0); /* absent: no cap of its own */
    c = &r.providers[llm_registry_find(&r, "local", 5)];
    ck_assert_int_eq(c->max_connections, 2);
    c = &r.providers[llm_registry_find(&r, "az", 2)];
    ck_assert_str_eq(c->cfg.deployment, "dep");
    ck_assert_str_eq(c->cfg.api_version, "2024-10-21");
    ck_assert_ptr_null(c->cfg.api_key);
    llm_registry_release(&r);
}
END_TEST

START_TEST(test_resolution_order)
{
    struct llm_registry r;
    struct llm_resolved rs;
    load(&r, DOC, fake_env);
    /* a listed model: its targets in order, then none */
    resolve_is(&r, "smart", 0, "claude", "claude-x", 1);
    resolve_is(&r, "smart", 1, "local", "smart", 1);
    resolve_is(&r, "smart", 2, "default", "gpt-4o", 0);
    ck_assert_int_eq(llm_registry_resolve(&r, "smart", 3, &rs), -1);
    /* the longest pattern wins */
    resolve_is(&r, "llama3", 0, "local", "llama3", 0);
    resolve_is(&r, "llama3-big-70b", 0, "az", "llama3-big-70b", 0);
    /* a configured prefix; an unknown one stays whole on the default */
    resolve_is(&r, "local/qwen", 0, "local", "qwen", 0);
    resolve_is(&r, "anthropic/claude-y", 0, "default", "anthropic/claude-y", 0);
    resolve_is(&r, "openai/gpt-4o", 0, "default", "openai/gpt-4o", 0);
    resolve_is(&r, "local/", 0, "default", "local/", 0);
    resolve_is(&r, "gpt-4o-mini", 0, "default", "gpt-4o-mini", 0);
    ck_assert_int_eq(llm_registry_resolve(&r, "gpt-4o-mini", 1, &rs), -1);
    llm_registry_release(&r);
}
END_TEST

START_TEST(test_environment)
{
    struct llm_registry r;
    struct cr_err err;
    const struct llm_named *p;
    llm_registry_init(&r);
    ck_assert_int_eq(llm_registry_from_env(&r, fake_env, &err), 0);
    ck_assert_int_eq(r.nproviders, 2);
    p = &r.providers[llm_registry_find(&r, "anthropic", 9)];
    ck_assert_str_eq(p->cfg.api_key, "sk-ant-env");
    p = &r.providers[llm_registry_find(&r, "ollama", 6)];
    ck_assert_str_eq(p->cfg.base_url, "http://127.0.0.1:11434");
    resolve_is(&r, "anthropic/claude-z", 0, "anthropic", "claude-z", 0);
    /* a document's provider of the same name replaces it */
    ck_assert_int_eq(llm_registry_parse(&r,
                                        "{\"providers\":{\"ollama\":{\"type\":\"ollama\","
                                        "\"base_url\":\"http://other:1\"}}}",
                                        70, fake_env, &err),
                     0);
    ck_assert_int_eq(r.nproviders, 2);
    p = &r.providers[llm_registry_find(&r, "ollama", 6)];
    ck_assert_str_eq(p->cfg.base_url, "http://other:1");
    llm_registry_release(&r);
    llm_registry_init(&r);
    ck_assert_int_eq(llm_registry_from_env(&r, no_env, &err), 0);
    ck_assert_int_eq(r.nproviders, 0);
    llm_registry_release(&r);
}
END_TEST

/* max_connections: a whole number from 0 (no cap of its own) to the bound. */
START_TEST(test_max_connections)
{
    static const struct {
        const char *value;
        long want;
    } good[] = {{"0", 0}, {"1", 1}, {"64", 64}, {"100000", 100000}, {"3.0", 3}};
    static const char *const bad[] = {"-1",    "2.5",  "100001", "1e9",
                                      "\"2\"", "true", "null",   "[2]"};
    char doc[256];
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct llm_registry r;
        snprintf(doc, sizeof(doc),
                 "{\"providers\": {\"x\": {\"type\": \"anthropic\", "
                 "\"max_connections\": %s}}}",
                 good[i].value);
        load(&r, doc, fake_env);
        ck_assert_int_eq(r.providers[0].max_connections, good[i].want);
        llm_registry_release(&r);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct llm_registry r;
        struct cr_err err;
        memset(&err, 0, sizeof(err));
        llm_registry_init(&r);
        snprintf(doc, sizeof(doc),
                 "{\"providers\": {\"x\": {\"type\": \"anthropic\", "
                 "\"max_connections\": %s}}}",
                 bad[i]);
        ck_assert_int_eq(llm_registry_parse(&r, doc, strlen(doc), fake_env, &err),
                         CR_EINVAL);
        ck_assert_msg(strstr(err.msg, "llm provider 'x': max_connections must be an "
                                      "integer in [0, 100000]"),
                      "%s: got '%s'", bad[i], err.msg);
        llm_registry_release(&r);
    }
}
END_TEST

START_TEST(test_limits)
{
    struct llm_registry r;
    const struct lim_config *c;
    load(&r,
         "{\"providers\": {\"default\": {\"limits\": {\"*\": {\"rpm\": 60}}},"
         " \"x\": {\"type\": \"anthropic\", \"limits\": {"
         "  \"*\": {\"concurrency\": 4},"
         "  \"claude*\": {\"rpm\": 500, \"tpm\": 30000.5},"
         "  \"claude-opus\": {\"concurrency\": 2, \"lease_s\": 5}}}}}",
         fake_env);
    ck_assert_int_eq(r.default_limits.n, 1);
    c = llm_limits_find(&r.default_limits, "gpt-4o");
    ck_assert_ptr_nonnull(c);
    ck_assert(c->rpm == 60 && c->tpm == 0 && c->concurrency == 0);
    ck_assert_int_eq(c->lease_ms, 30000);
    /* The longest match wins: the exact name, then the longest prefix, '*'. */
    c = llm_limits_find(&r.providers[0].limits, "claude-opus");
    ck_assert(c->concurrency == 2 && c->rpm == 0 && c->lease_ms == 5000);
    c = llm_limits_find(&r.providers[0].limits, "claude-haiku");
    ck_assert(c->rpm == 500 && c->tpm == 30000.5 && c->concurrency == 0);
    c = llm_limits_find(&r.providers[0].limits, "other");
    ck_assert(c->concurrency == 4 && c->rpm == 0);
    ck_assert_ptr_null(llm_limits_find(NULL, "m"));
    ck_assert_ptr_null(llm_limits_find(&r.providers[0].limits, NULL));
    llm_registry_release(&r);
    /* No "limits": nothing matches. */
    load(&r, "{\"providers\": {\"x\": {\"type\": \"anthropic\"}}}", fake_env);
    ck_assert_ptr_null(llm_limits_find(&r.providers[0].limits, "m"));
    ck_assert_ptr_null(llm_limits_find(&r.default_limits, "m"));
    llm_registry_release(&r);
}
END_TEST

START_TEST(test_refusals)
{
    static const struct {
        const char *doc, *want;
    } bad[] = {
        {"[]", "not a JSON object"},
        {"{\n  \"providers\": {,}\n}", "bad JSON near line 2, column 18 (byte 19)"},
        {"{\"models\": ", "bad JSON near line 1, column 11 (byte 10)"},
        {"{\"provider\": {}}", "unknown key 'provider'"},
        {"{\"providers\": []}", "'providers' must be an object"},
        {"{\"providers\": {\"x\": {\"type\": \"gpt\"}}}", "type must be openai"},
        {"{\"providers\": {\"x\": {\"type\": \"ollama\"}}}", "needs a base_url"},
        {"{\"providers\": {\"default\": {\"type\": \"openai\", \"base_url\": \"u\"}}}",
         "'default' is the worker's own provider"},
        {"{\"providers\": {\"default\": {\"prices\": {\"m\": {\"input\": 1}}}}}",
         "prices 'm' needs 'input' and 'output'"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"prices\": {\"m\": "
         "{\"input\": 1, \"output\": -2}}}}}",
         "'output' must be USD per million tokens"},
        {"{\"providers\": {\"default\": {\"limits\": []}}}",
         "'limits' must be an object of model patterns"},
        {"{\"providers\": {\"default\": {\"limits\": {\"m\": {\"rps\": 1}}}}}",
         "limits 'm': unknown key 'rps'"},
        {"{\"providers\": {\"default\": {\"limits\": {\"m\": {}}}}}",
         "limits 'm' needs rpm, tpm or concurrency"},
        {"{\"providers\": {\"default\": {\"limits\": {\"m\": 5}}}}",
         "limits 'm' must be an object"},
        {"{\"providers\": {\"default\": {\"limits\": {\"a*b\": {\"rpm\": 1}}}}}",
         "limit pattern 'a*b' must be"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"rpm\": 0}}}}}",
         "'rpm' must be a number per minute"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"tpm\": \"9\"}}}}}",
         "'tpm' must be a number per minute"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"tpm\": -3}}}}}",
         "'tpm' must be a number per minute"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"concurrency\": 1.5}}}}}",
         "'concurrency' must be a whole number"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"concurrency\": 0}}}}}",
         "'concurrency' must be a whole number"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"limits\": {\"m\": "
         "{\"rpm\": 5, \"lease_s\": 0.5}}}}}",
         "'lease_s' must be seconds"},
        {"{\"providers\": {\"default\": {\"max_connections\": 3}}}",
         "only hold 'prices', 'budget' and 'limits'"},
        {"{\"providers\": {\"Bad Name\": {\"type\": \"anthropic\"}}}", "must be 1-31"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"api_key\": \"k\"}}}",
         "unknown key 'api_key'"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"api_key_env\": \"NOPE\"}}}",
         "NOPE named by api_key_env is not set"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"headers\": [\"a b: c\"]}}}",
         "invalid --llm-header name"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"headers\": \"h: v\"}}}",
         "headers must be a list"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"timeouts\": {\"all\": "
         "1}}}}",
         "unknown timeout 'all'"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"timeouts\": {\"idle\": "
         "0}}}}",
         "must be seconds"},
        {"{\"providers\": {\"x\": {\"type\": \"anthropic\", \"max_tokens\": 0}}}",
         "max_tokens must be"},
        {"{\"providers\": {\"x\": {\"type\": 5}}}", "'type' must be a string"},
        {"{\"models\": {\"m\": [\"nobody/x\"]}}", "no provider named 'nobody'"},
        {"{\"models\": {\"m\": []}}", "list of 1 to 8 targets"},
        {"{\"models\": {\"a*b\": [\"default\"]}}", "may only end in '*'"},
        {"{\"models\": {\"m\": [7]}}", "each target must be"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct llm_registry r;
        struct cr_err err;
        memset(&err, 0, sizeof(err));
        llm_registry_init(&r);
        ck_assert_int_eq(
            llm_registry_parse(&r, bad[i].doc, strlen(bad[i].doc), fake_env, &err),
            CR_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].want), "%s: got '%s'", bad[i].doc, err.msg);
        ck_assert_ptr_null(strstr(err.msg, "secret-one"));
        llm_registry_release(&r);
    }
}
END_TEST

/* A pool: its targets first (steps picked by the router), then its
 * fallbacks in order; every impossible value refused, every cut too. */
START_TEST(test_pools)
{
    static const char *doc =
        "{\"providers\": {\"a\": {\"type\": \"openai\", \"base_url\": \"http://a\"},"
        " \"b\": {\"type\": \"openai\", \"base_url\": \"http://b\"}},"
        " \"models\": {\"w\": {\"targets\": [\"a/m1\", \"b\"], \"strategy\": "
        "\"weighted\","
        "   \"weights\": [3, 1], \"fallbacks\": [\"default/gpt-4o\"]},"
        "   \"lb*\": {\"strategy\": \"least-busy\", \"targets\": [\"a\", \"b\", "
        "\"default\"]},"
        "   \"eq\": {\"strategy\": \"weighted\", \"targets\": [\"a\", \"b\"]}}}";
    static const struct {
        const char *models, *want;
    } bad[] = {
        {"{\"m\": {\"targets\": [\"a\"]}}",
         "strategy must be 'weighted' or 'least-busy'"},
        {"{\"m\": {\"targets\": [\"a\"], \"strategy\": \"random\"}}",
         "strategy must be 'weighted' or 'least-busy'"},
        {"{\"m\": {\"strategy\": \"weighted\"}}", "a pool needs 'targets'"},
        {"{\"m\": {\"targets\": [], \"strategy\": \"weighted\"}}",
         "targets must be a list of 1 to 8 targets"},
        {"{\"m\": {\"targets\": [\"a\", \"b\"], \"strategy\": \"weighted\", "
         "\"weights\": [3]}}",
         "weights must be a list of 2 numbers, one per target"},
        {"{\"m\": {\"targets\": [\"a\", \"b\"], \"strategy\": \"weighted\", "
         "\"weights\": [3, 1, 1]}}",
         "weights must be a list of 2 numbers"},
        {"{\"m\": {\"targets\": [\"a\", \"b\"], \"strategy\": \"weighted\", "
         "\"weights\": [3, -1]}}",
         "weight 2 must be a whole number in [0, 1000000]"},
        {"{\"m\": {\"targets\": [\"a\", \"b\"], \"strategy\": \"weighted\", "
         "\"weights\": [1.5, 1]}}",
         "weight 1 must be a whole number"},
        {"{\"m\": {\"targets\": [\"a\", \"b\"], \"strategy\": \"weighted\", "
         "\"weights\": [0, 0]}}",
         "the weights add up to 0"},
        {"{\"m\": {\"targets\": [\"a\"], \"strategy\": \"least-busy\", \"weights\": "
         "[1]}}",
         "weights are for the 'weighted' strategy only"},
        {"{\"m\": {\"targets\": [\"a\"], \"strategy\": \"weighted\", \"weight\": [1]}}",
         "unknown key 'weight'"},
        {"{\"m\": {\"targets\": [\"a\", \"zz\"], \"strategy\": \"weighted\"}}",
         "no provider named 'zz'"},
        {"{\"m\": {\"targets\": [\"a\", \"b\", \"a\", \"b\", \"a\", \"b\", \"a\", "
         "\"b\"], "
         "\"strategy\": \"least-busy\", \"fallbacks\": [\"default\"]}}",
         "targets and fallbacks are 8 at most"},
        {"{\"m\": {\"targets\": [\"a\"], \"strategy\": \"least-busy\", \"fallbacks\": "
         "\"b\"}}",
         "fallbacks must be a list"},
        {"{\"m\": \"a\"}", "must map to a list of 1 to 8 targets, or a pool"},
    };
    struct llm_registry r;
    struct llm_resolved rs;
    const struct llm_model_route *w;

    load(&r, doc, no_env);
    /* "w": two pool steps naming its first target until picked, then the fallback */
    ck_assert_int_eq(llm_registry_resolve(&r, "w", 0, &rs), 0);
    ck_assert_ptr_nonnull(w = rs.pool);
    ck_assert_int_eq(w->strategy, LLM_POOL_WEIGHTED);
    ck_assert_int_eq(w->npool, 2);
    ck_assert_int_eq(w->ntargets, 3);
    ck_assert_int_eq(w->weights[0], 3);
    ck_assert_int_eq(w->weights[1], 1);
    ck_assert_str_eq(rs.name, "a");
    ck_assert_str_eq(rs.model, "m1");
    ck_assert_int_eq(rs.more, 1);
    ck_assert_int_eq(llm_registry_resolve(&r, "w", 1, &rs), 0);
    ck_assert_ptr_eq(rs.pool, w);
    ck_assert_int_eq(rs.more, 1);
    llm_registry_target(&r, w, 1, "w", &rs);
    ck_assert_str_eq(rs.name, "b");
    ck_assert_str_eq(rs.model, "w"); /* "b": the task's model */
    ck_assert_int_eq(llm_registry_resolve(&r, "w", 2, &rs), 0);
    ck_assert_ptr_null(rs.pool);
    ck_assert_str_eq(rs.name, "default");
    ck_assert_str_eq(rs.model, "gpt-4o");
    ck_assert_int_eq(rs.more, 0);
    ck_assert_int_eq(llm_registry_resolve(&r, "w", 3, &rs), -1);
    /* a pattern; no fallbacks: the last pool step has no more */
    ck_assert_int_eq(llm_registry_resolve(&r, "lb-x", 2, &rs), 0);
    ck_assert_ptr_nonnull(rs.pool);
    ck_assert_int_eq(rs.pool->strategy, LLM_POOL_LEAST_BUSY);
    ck_assert_int_eq(rs.more, 0);
    llm_registry_target(&r, rs.pool, 2, "lb-x", &rs);
    ck_assert_str_eq(rs.name, "default");
    ck_assert_ptr_null(rs.named);
    /* weights default to equal */
    ck_assert_int_eq(llm_registry_resolve(&r, "eq", 0, &rs), 0);
    ck_assert_int_eq(rs.pool->weights[0], 1);
    ck_assert_int_eq(rs.pool->weights[1], 1);
    /* an ordered list is no pool */
    llm_registry_release(&r);
    load(&r, DOC, fake_env);
    ck_assert_int_eq(llm_registry_resolve(&r, "smart", 0, &rs), 0);
    ck_assert_ptr_null(rs.pool);
    llm_registry_release(&r);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char d[1024];
        struct cr_err err;
        snprintf(d, sizeof(d),
                 "{\"providers\": {\"a\": {\"type\": \"openai\", \"base_url\": \"u\"},"
                 " \"b\": {\"type\": \"openai\", \"base_url\": \"u\"}}, \"models\": %s}",
                 bad[i].models);
        memset(&err, 0, sizeof(err));
        llm_registry_init(&r);
        ck_assert_int_eq(llm_registry_parse(&r, d, strlen(d), no_env, &err), CR_EINVAL);
        ck_assert_msg(strstr(err.msg, bad[i].want), "%s: got '%s'", d, err.msg);
        llm_registry_release(&r);
    }
    for (size_t k = 0; k <= strlen(doc); k++) {
        struct cr_err err;
        int rc;
        llm_registry_init(&r);
        rc = llm_registry_parse(&r, doc, k, no_env, &err);
        ck_assert(k == strlen(doc) ? rc == 0 : rc == CR_EINVAL);
        llm_registry_release(&r);
    }
}
END_TEST

/* Every prefix of the document: refused or taken, never a crash or a leak. */
START_TEST(test_every_cut)
{
    size_t n = strlen(DOC);
    for (size_t k = 0; k <= n; k++) {
        struct llm_registry r;
        struct cr_err err;
        llm_registry_init(&r);
        int rc = llm_registry_parse(&r, DOC, k, fake_env, &err);
        ck_assert(k == n ? rc == 0 : rc == CR_EINVAL);
        llm_registry_release(&r);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_document);
    tcase_add_test(tc, test_resolution_order);
    tcase_add_test(tc, test_environment);
    tcase_add_test(tc, test_max_connections);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_every_cut);
    tcase_add_test(tc, test_pools);
    suite_add_tcase(s, tc);
    return s;
}
