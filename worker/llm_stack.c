/* llm_stack.c -- the LLM client, providers, gates, health and router of a
 * worker, made from its configuration (see llm_stack.h). */
#include "llm_stack.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

void llm_stack_init(struct llm_stack *s)
{
    memset(s, 0, sizeof(*s));
    redact_init(&s->secrets);
    llm_registry_init(&s->providers);
}

static const char *env_of(const char *name)
{
    return getenv(name);
}

/* Loads the named providers (the SDK variables, then --llm-providers) and
 * adds their keys and header values to the redaction set. Start-up only:
 * reading the file blocks. */
static int providers_load(struct llm_stack *w, const struct config *cfg,
                          struct cr_err *err)
{
    const char *src = cfg->llm_providers;
    struct buf doc;
    int rc;

    if ((rc = llm_registry_from_env(&w->providers, env_of, err)))
        return rc;
    buf_init(&doc);
    if (src && src[0] == '{') {
        rc = buf_puts(&doc, src);
    } else if (src && src[0]) {
        FILE *f = fopen(src, "rb");
        char chunk[4096];
        size_t n;
        if (!f)
            return cr_err_set(err, CR_EINVAL, "cannot open --llm-providers file %s: %s",
                              src, strerror(errno));
        while (!rc && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
            rc = doc.len + n > (1u << 20) ? CR_ETOOBIG : buf_append(&doc, chunk, n);
        fclose(f);
        if (rc) {
            buf_release(&doc);
            return cr_err_set(err, CR_EINVAL, "--llm-providers file %s: %s", src,
                              rc == CR_ETOOBIG ? "over 1 MiB" : cr_strerror(rc));
        }
    }
    if (!rc && doc.len) {
        rc = llm_registry_parse(&w->providers, doc.data, doc.len, env_of, err);
        if (rc && src[0] != '{') {
            char why[sizeof(err->msg)];
            const char *m = err->msg;
            /* The file's name says what the registry's prefix would. */
            if (!strncmp(m, "llm providers: ", 15))
                m += 15;
            snprintf(why, sizeof(why), "%s", m);
            /* A long path keeps its end, where the file's name is. */
            size_t n = strlen(src);
            cr_err_set(err, rc, "--llm-providers file %s%s: %.100s", n > 130 ? "..." : "",
                       n > 130 ? src + n - 127 : src, why);
        }
    } else if (rc)
        cr_err_set(err, rc, "out of memory");
    buf_release(&doc);
    if (rc)
        return rc;
    for (int i = 0; i < w->providers.nproviders; i++) {
        const struct llm_named *p = &w->providers.providers[i];
        if (p->api_key && (rc = redact_add_str(&w->secrets, p->api_key)))
            return cr_err_set(err, rc, "out of memory");
        for (int k = 0; p->headers[k]; k++) {
            const char *v = strchr(p->headers[k], ':');
            v = v ? v + 1 : "";
            v += strspn(v, " \t");
            if ((rc = redact_add_str(&w->secrets, v)))
                return cr_err_set(err, rc, "out of memory");
        }
        LOG(LOG_INFO, "LLM provider %s: %s API%s%s", p->name, p->impl->name,
            p->api_key_env ? ", key from $" : "", p->api_key_env ? p->api_key_env : "");
        if (p->max_connections > 0)
            LOG(LOG_INFO, "LLM provider %s: at most %ld calls in flight", p->name,
                p->max_connections);
    }
    /* One more than needed: never a zero-sized allocation. */
    w->gates = cr_calloc((size_t)w->providers.nproviders + 1, sizeof(*w->gates));
    if (!w->gates)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    for (int i = 0; i < w->providers.nproviders; i++)
        llm_gate_init(&w->gates[i], w->providers.providers[i].max_connections);
    w->health = cr_calloc((size_t)w->providers.nproviders + 1, sizeof(*w->health));
    if (!w->health)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    for (int i = 0; i <= w->providers.nproviders; i++)
        llm_health_init(&w->health[i]);
    return 0;
}

/* Says when a provider's calls start failing, are still failing (at most
 * once a minute) and answer again, at WARNING: a retried failure is logged
 * at INFO only, so at the default level an outage was silent. Which failures
 * count, and when a line is due, is llm/health.h's rule. */
void llm_stack_note(struct llm_stack *w, const struct llm_result *res, uint64_t now_ms)
{
    static const struct llm_health_rule rule = LLM_HEALTH_RULE_DEFAULT;
    const char *name = res->provider && res->provider[0] ? res->provider : "default";
    enum llm_health_kind kind = llm_health_kind(res);
    struct llm_health_report rep;
    int i;

    if (kind == LLM_HEALTH_NEUTRAL)
        return;
    i = llm_registry_find(&w->providers, name, strlen(name));
    if (i < 0)
        i = w->providers.nproviders; /* the default provider's */
    switch (llm_health_note(&w->health[i], &rule, kind, (int64_t)now_ms, &rep)) {
    case LLM_HEALTH_QUIET:
        break;
    case LLM_HEALTH_FAILING:
        LOG(LOG_WARNING,
            "LLM provider %s failing: %ld calls in a row failed in %.1fs (last: "
            "%s('%s')); "
            "tasks retry as configured",
            name, rep.failed, (double)rep.for_ms / 1000.0, res->exc_type, res->message);
        break;
    case LLM_HEALTH_STILL:
        LOG(LOG_WARNING,
            "LLM provider %s still failing after %.0fs: %ld more calls failed since the "
            "last report, %ld in a row (last: %s('%s'))",
            name, (double)rep.for_ms / 1000.0, rep.failed_since, rep.failed,
            res->exc_type, res->message);
        break;
    case LLM_HEALTH_RECOVERED:
        LOG(LOG_WARNING, "LLM provider %s recovered after %.1fs (%ld failed calls)", name,
            (double)rep.for_ms / 1000.0, rep.failed);
        break;
    }
}

int llm_stack_open(struct llm_stack *s, uv_loop_t *loop, const struct config *cfg,
                   struct cr_err *err)
{
    struct llm_client_config lc;
    int rc;

    memset(&lc, 0, sizeof(lc));
    lc.connect_timeout_s = cfg->llm_connect_timeout;
    lc.first_byte_timeout_s = cfg->llm_first_byte_timeout;
    lc.first_token_timeout_s = cfg->llm_first_token_timeout;
    lc.idle_timeout_s = cfg->llm_idle_timeout;
    lc.max_connections = cfg->llm_max_connections;
    lc.keep_connections = cfg->llm_keep_connections;
    if ((rc = config_secrets(cfg, &s->secrets)) != 0)
        return cr_err_set(err, rc, "cannot keep the configured secrets: %s",
                          cr_strerror(rc));
    if ((rc = providers_load(s, cfg, err)) != 0)
        return rc;
    if (!cfg->llm_api_key || !cfg->llm_api_key[0]) {
        /* Calls would go out unauthenticated and fail one by one (401) long
         * after start-up; a local server may want no key, so not an error. */
        char shown[512];
        config_redact_url(cfg->llm_base_url, shown, sizeof(shown));
        LOG(LOG_WARNING,
            "LLM provider default (%s): no API key; set OPENAI_API_KEY (or "
            "--llm-api-key), or its calls go without one",
            shown);
    }
    lc.secrets = &s->secrets;
    /* opts_list leaves items[n] NULL (config_load() caps n below the array). */
    lc.headers = (const char *const *)cfg->llm_headers.items;
    lc.ca_file = cfg->llm_ca_file;
    lc.http2 = cfg->llm_http2;
    s->client = llm_client_new(loop, &lc, err);
    if (!s->client)
        return err->code ? err->code : CR_ENOMEM;
    return llm_router_init(&s->router, s->client, &s->providers, s->gates,
                           &(struct llm_provider_config){.base_url = cfg->llm_base_url,
                                                         .api_key = cfg->llm_api_key,
                                                         .headers = lc.headers},
                           err);
}

void llm_stack_close(struct llm_stack *s)
{
    llm_client_free(s->client);
    s->client = NULL;
}

void llm_stack_release(struct llm_stack *s)
{
    llm_router_release(&s->router);
    redact_release(&s->secrets);
    /* After llm_client_free(): every call that named a gate has ended. */
    cr_free(s->gates);
    cr_free(s->health);
    llm_registry_release(&s->providers);
    s->gates = NULL;
    s->health = NULL;
}
