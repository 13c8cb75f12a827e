/* test_router.c -- which provider answers a task's call (llm_router_plan()),
 * and the default provider's endpoints. */
#include <check.h>
#include <string.h>

#include "llm/router.h"
#include "util/alloc.h"

static const char *env(const char *name)
{
    return strcmp(name, "CLAUDE_KEY") == 0 ? "sk-ant-x" : NULL;
}

static const char doc[] =
    "{\"providers\": {\"claude\": {\"type\": \"anthropic\", \"api_key_env\": "
    "\"CLAUDE_KEY\", \"max_connections\": 4},"
    "                 \"local\": {\"type\": \"ollama\", \"base_url\": "
    "\"http://127.0.0.1:11434\"}},"
    " \"models\": {\"smart\": [\"claude/claude-x\", \"default\"],"
    "            \"alias\": [\"default/gpt-4o\"]}}";

struct fixture {
    struct llm_registry reg;
    struct llm_gate gates[2];
    struct llm_router rt;
};

static void setup(struct fixture *f, const char *base)
{
    struct llm_provider_config d;
    struct cr_err err;

    memset(&d, 0, sizeof(d));
    d.base_url = base;
    d.api_key = "sk-default";
    llm_registry_init(&f->reg);
    ck_assert_msg(llm_registry_parse(&f->reg, doc, strlen(doc), env, &err) == 0, "%s",
                  err.msg);
    llm_gate_init(&f->gates[0], 4);
    llm_gate_init(&f->gates[1], 0);
    /* The plan needs no client: only a call does. */
    ck_assert_int_eq(llm_router_init(&f->rt, NULL, &f->reg, f->gates, &d, &err), 0);
}

static void teardown(struct fixture *f)
{
    llm_router_release(&f->rt);
    llm_router_release(&f->rt); /* twice: a no-op */
    llm_registry_release(&f->reg);
}

static struct llm_call call_of(enum llm_op op, const char *model, int step, int tools)
{
    struct llm_call c = {op, "{}", 2, 0, model, step, tools};
    return c;
}

START_TEST(test_fast_path)
{
    struct fixture f;
    struct llm_route to;
    struct llm_call c = call_of(LLM_OP_CHAT, "gpt-4o", 0, 0);
    struct cr_err err;

    setup(&f, "http://h/v1/");
    ck_assert_str_eq(f.rt.chat_url, "http://h/v1/chat/completions");
    ck_assert_str_eq(f.rt.embed_url, "http://h/v1/embeddings");
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 1);
    ck_assert_ptr_null(to.named);
    ck_assert_ptr_eq(to.impl, &llm_provider_openai);
    ck_assert_str_eq(to.cfg->api_key, "sk-default");
    ck_assert_int_eq(to.more, 0);
    /* An embeddings call with the task's model, too. */
    c = call_of(LLM_OP_EMBED, "text-embedding-3-small", 0, 1);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 1);
    /* A gateway's "org/model" name stays whole, on the fast path. */
    c = call_of(LLM_OP_CHAT, "meta/llama-3", 0, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 1);
    ck_assert_str_eq(to.model, "meta/llama-3");
    teardown(&f);
}
END_TEST

START_TEST(test_built_path)
{
    struct fixture f;
    struct llm_route to;
    struct llm_call c = call_of(LLM_OP_CHAT, "gpt-4o", 0, 1);
    struct cr_err err;

    setup(&f, "http://h");
    /* Tools: the answer may hold tool calls, which the fast path drops. */
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 0);
    ck_assert_ptr_null(to.named);
    ck_assert_ptr_eq(to.impl, &llm_provider_openai);
    ck_assert_str_eq(to.cfg->base_url, "http://h");
    /* A route that renames the model for the default provider. */
    c = call_of(LLM_OP_CHAT, "alias", 0, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 0);
    ck_assert_str_eq(to.model, "gpt-4o");
    /* A named provider, then its fallback, the default with the model whole. */
    c = call_of(LLM_OP_CHAT, "smart", 0, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 0);
    ck_assert_ptr_eq(to.named, &f.reg.providers[0]);
    ck_assert_ptr_eq(to.impl, &llm_provider_anthropic);
    ck_assert_str_eq(to.name, "claude");
    ck_assert_str_eq(to.model, "claude-x");
    ck_assert_int_eq(to.more, 1);
    c = call_of(LLM_OP_CHAT, "smart", 1, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_int_eq(to.fast, 1);
    ck_assert_int_eq(to.more, 0);
    /* By prefix. */
    c = call_of(LLM_OP_CHAT, "local/llama3.2", 0, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), 0);
    ck_assert_ptr_eq(to.impl, &llm_provider_ollama);
    ck_assert_str_eq(to.model, "llama3.2");
    /* No provider at that step. */
    c = call_of(LLM_OP_CHAT, "smart", 2, 0);
    ck_assert_int_eq(llm_router_plan(&f.rt, &c, &to, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "model smart has no provider number 3");
    teardown(&f);
}
END_TEST

/* One limit per (provider, model) that a pattern covers, made once. */
START_TEST(test_limits)
{
    static const char ldoc[] =
        "{\"providers\": {\"default\": {\"limits\": {\"gpt*\": {\"rpm\": 60}}},"
        " \"claude\": {\"type\": \"anthropic\", \"api_key_env\": \"CLAUDE_KEY\","
        "   \"limits\": {\"*\": {\"concurrency\": 2}}}}}";
    struct llm_provider_config d = {0};
    struct llm_registry reg;
    struct llm_router rt;
    struct cr_err err;
    struct llm_limit *a, *b, *c;
    int oom = 1;

    llm_registry_init(&reg);
    ck_assert_int_eq(llm_registry_parse(&reg, ldoc, strlen(ldoc), env, &err), 0);
    d.base_url = "http://h";
    ck_assert_int_eq(llm_router_init(&rt, NULL, &reg, NULL, &d, &err), 0);
    a = llm_router_limit(&rt, NULL, "default", "gpt-4o", &oom);
    ck_assert_ptr_nonnull(a);
    ck_assert_int_eq(oom, 0);
    ck_assert_str_eq(a->key, "default/gpt-4o");
    ck_assert(a->cfg->rpm == 60);
    ck_assert_ptr_eq(llm_router_limit(&rt, NULL, "default", "gpt-4o", &oom), a);
    b = llm_router_limit(&rt, NULL, "default", "gpt-4o-mini", &oom);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_ne(a, b);
    ck_assert_ptr_null(llm_router_limit(&rt, NULL, "default", "o1", &oom));
    ck_assert_int_eq(oom, 0);
    c = llm_router_limit(&rt, &reg.providers[0], "claude", "gpt-4o", &oom);
    ck_assert_str_eq(c->key, "claude/gpt-4o");
    ck_assert_int_eq(c->cfg->concurrency, 2);
    cr_alloc_fail_after(1);
    ck_assert_ptr_null(llm_router_limit(&rt, NULL, "default", "gpt-5", &oom));
    cr_alloc_fail_after(0);
    ck_assert_int_eq(oom, 1);
    ck_assert_ptr_nonnull(llm_router_limit(&rt, NULL, "default", "gpt-5", &oom));
    llm_router_release(&rt);
    llm_registry_release(&reg);
}
END_TEST

/* Without a client no call can start, but a request a provider cannot
 * express is refused before one would: Anthropic has no embeddings. */
START_TEST(test_refused)
{
    struct fixture f;
    struct llm_call c = call_of(LLM_OP_EMBED, "claude/claude-x", 0, 0);
    struct cr_err err;

    setup(&f, "http://h");
    memset(&err, 0, sizeof(err));
    ck_assert_ptr_null(llm_router_call(&f.rt, &c, NULL, NULL, NULL, &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    ck_assert_int_eq(strncmp(err.msg, "provider claude: ", 17), 0);
    c = call_of(LLM_OP_CHAT, "smart", 5, 0);
    ck_assert_ptr_null(llm_router_call(&f.rt, &c, NULL, NULL, NULL, &err));
    ck_assert_int_eq(err.code, CR_EINVAL);
    teardown(&f);
}
END_TEST

static const char pool_doc[] =
    "{\"providers\": {\"a\": {\"type\": \"openai\", \"base_url\": \"http://a/v1\"},"
    "  \"b\": {\"type\": \"openai\", \"base_url\": \"http://b/v1\","
    "        \"limits\": {\"m*\": {\"rpm\": 60}}}},"
    " \"models\": {\"w\": {\"targets\": [\"a/m1\", \"b/m2\"], \"strategy\": \"weighted\","
    "   \"weights\": [3, 1], \"fallbacks\": [\"default/gpt-4o\"]},"
    "   \"lb\": {\"targets\": [\"a/m1\", \"b/m2\"], \"strategy\": \"least-busy\"}}}";

static struct llm_limit *limit_named(struct llm_router *rt, const char *key)
{
    for (struct llm_limit *l = llm_router_limits(rt); l; l = l->next)
        if (!strcmp(l->key, key))
            return l;
    return NULL;
}

static const char *pick(struct llm_router *rt, const char *model, int step, int64_t now,
                        int *more)
{
    struct llm_call c = call_of(LLM_OP_CHAT, model, step, 0);
    struct llm_route to;
    struct cr_err err;
    ck_assert_int_eq(llm_router_plan(rt, &c, &to, &err), 0);
    ck_assert_ptr_nonnull(to.pool);
    ck_assert_int_eq(llm_router_pick(rt, &c, now, &to, &err), 0);
    ck_assert_ptr_null(to.pool);
    ck_assert_int_eq(to.pooled, 1);
    ck_assert_int_eq(to.fast, 0);
    *more = to.more;
    return to.name;
}

/* A pool's step picks its target: by weight, by calls in flight, never a
 * cooled one while another is open; each target has a limit (its own
 * "limits", or one that only cools). */
START_TEST(test_pool_pick)
{
    struct llm_registry reg;
    struct llm_gate gates[2];
    struct llm_router rt;
    struct llm_provider_config d;
    struct llm_limit *la, *lb;
    struct cr_err err;
    int n[2] = {0, 0}, more;

    memset(&d, 0, sizeof(d));
    d.base_url = "http://h/v1";
    llm_registry_init(&reg);
    ck_assert_msg(llm_registry_parse(&reg, pool_doc, strlen(pool_doc), env, &err) == 0,
                  "%s", err.msg);
    llm_gate_init(&gates[0], 0);
    llm_gate_init(&gates[1], 0);
    ck_assert_int_eq(llm_router_init(&rt, NULL, &reg, gates, &d, &err), 0);
    /* made at start: the fleet's view of them needs no call first */
    ck_assert_ptr_nonnull(limit_named(&rt, "a/m1"));
    ck_assert_ptr_nonnull(limit_named(&rt, "b/m2"));
    for (int i = 0; i < 400; i++)
        n[!strcmp(pick(&rt, "w", i % 2, 1000, &more), "b")]++;
    ck_assert_int_eq(n[0], 300);
    ck_assert_int_eq(n[1], 100);
    ck_assert_int_eq(more, 1);
    la = limit_named(&rt, "a/m1");
    lb = limit_named(&rt, "b/m2");
    ck_assert_ptr_nonnull(la);
    ck_assert_ptr_nonnull(lb);
    ck_assert_int_eq(la->pooled && lb->pooled, 1);
    ck_assert(la->cfg->rpm == 0 && la->cfg->concurrency == 0); /* cooling only */
    ck_assert(lb->cfg->rpm == 60);
    /* the same limit for a non-pool call to that target */
    ck_assert_ptr_eq(llm_router_limit(&rt, &reg.providers[0], "a", "m1", &more), la);
    /* a cooled: every pick is b until the cooling ends */
    la->cool_until = 2000;
    for (int i = 0; i < 20; i++)
        ck_assert_str_eq(pick(&rt, "w", 0, 1999, &more), "b");
    /* both cooled: the one open first, b; at 2000 a again */
    lb->cool_until = 3000;
    ck_assert_str_eq(pick(&rt, "w", 1, 1500, &more), "a");
    ck_assert_str_eq(pick(&rt, "w", 0, 2000, &more), "a");
    /* least busy, counting this worker's calls and the fleet's */
    la->calls = 2;
    lb->fleet_busy = 1;
    ck_assert_str_eq(pick(&rt, "lb", 0, 5000, &more), "b");
    ck_assert_int_eq(more, 1);
    lb->fleet_busy = 3;
    ck_assert_str_eq(pick(&rt, "lb", 1, 5000, &more), "a");
    ck_assert_int_eq(more, 0);
    la->cool_until = 6000;
    ck_assert_str_eq(pick(&rt, "lb", 0, 5000, &more), "b");
    la->calls = 0; /* the client's count: back to what it was */
    llm_router_release(&rt);

    /* out of memory making a target's limit: an error, nothing leaked */
    for (long k = 1;; k++) {
        int rc;
        ck_assert_int_lt(k, 10);
        cr_alloc_fail_after(k);
        rc = llm_router_init(&rt, NULL, &reg, gates, &d, &err);
        cr_alloc_fail_after(0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
    llm_router_release(&rt);
    memset(&rt, 0, sizeof(rt));
    /* a route by pattern: its targets' limits are made at the first pick */
    llm_registry_release(&reg);
    llm_registry_init(&reg);
    {
        static const char pat[] =
            "{\"providers\": {\"a\": {\"type\": \"openai\", \"base_url\": \"http://a\"}},"
            " \"models\": {\"w*\": {\"targets\": [\"a\", \"default\"], \"strategy\": "
            "\"weighted\"}}}";
        ck_assert_int_eq(llm_registry_parse(&reg, pat, strlen(pat), env, &err), 0);
    }
    ck_assert_int_eq(llm_router_init(&rt, NULL, &reg, gates, &d, &err), 0);
    ck_assert_ptr_null(llm_router_limits(&rt));
    for (long k = 1;; k++) {
        struct llm_call c = call_of(LLM_OP_CHAT, "w-1", 0, 0);
        struct llm_route to;
        int rc;
        ck_assert_int_lt(k, 10);
        ck_assert_int_eq(llm_router_plan(&rt, &c, &to, &err), 0);
        cr_alloc_fail_after(k);
        rc = llm_router_pick(&rt, &c, 0, &to, &err);
        cr_alloc_fail_after(0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
    ck_assert_ptr_nonnull(limit_named(&rt, "a/w-1"));
    ck_assert_ptr_nonnull(limit_named(&rt, "default/w-1"));
    llm_router_release(&rt);
    llm_registry_release(&reg);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("router");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_fast_path);
    tcase_add_test(tc, test_built_path);
    tcase_add_test(tc, test_refused);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_pool_pick);
    suite_add_tcase(s, tc);
    return s;
}
