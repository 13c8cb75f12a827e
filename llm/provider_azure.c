/* provider_azure.c -- Azure OpenAI behind the provider face: deployment URLs,
 * api-version and the api-key header; bodies and streams are OpenAI's, so the
 * mapping is provider_openai.c's. */
#include "provider.h"

#include <stdlib.h>
#include <string.h>

#include "protocol/openai.h"
#include "util/alloc.h"
#include "util/buf.h"

/* The newest GA data-plane version when this was written. */
#define DEFAULT_API_VERSION "2024-10-21"

/* Deployment names are letters, digits, '-', '_' and '.': anything else
 * would change the URL's meaning, so it is refused rather than escaped. */
static int valid_deployment(const char *d)
{
    const char *p;

    if (!d || !d[0] || strlen(d) > 64 || strcmp(d, ".") == 0 || strcmp(d, "..") == 0)
        return 0;
    for (p = d; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
            return 0;
    }
    return 1;
}

/* api-version goes into the query as it is: the same rule keeps it inert. */
static int valid_version(const char *v)
{
    const char *p;

    if (!v[0] || strlen(v) > 32)
        return 0;
    for (p = v; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == '-'))
            return 0;
    return 1;
}

static int build(const struct llm_provider_config *cfg, enum llm_op op, const cJSON *req,
                 const char *model, struct llm_http_request *out, struct cr_err *err)
{
    const char *dep = cfg->deployment, *ver = cfg->api_version;
    struct buf path, query;
    cJSON *body;
    int rc;

    if (!cJSON_IsObject(req))
        return cr_err_set(err, CR_EINVAL, "request is not a json object");
    if (!cfg->base_url || !cfg->base_url[0])
        return cr_err_set(err, CR_EINVAL, "provider 'azure' needs a base url");
    if (!dep)
        dep = model
                  ? model
                  : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(req, "model"));
    if (!valid_deployment(dep))
        return cr_err_set(err, CR_EINVAL, "bad azure deployment name '%.64s'",
                          dep ? dep : "");
    ver = ver ? ver : DEFAULT_API_VERSION;
    if (!valid_version(ver))
        return cr_err_set(err, CR_EINVAL, "bad azure api-version '%.32s'", ver);
    buf_init(&path);
    buf_init(&query);
    rc = buf_printf(&path, "/openai/deployments/%s/%s", dep,
                    op == LLM_OP_EMBED ? "embeddings" : "chat/completions");
    if (!rc)
        rc = buf_printf(&query, "api-version=%s", ver);
    if (!rc) {
        out->url = llm__join_url(cfg->base_url, path.data, query.data);
        rc = out->url ? 0 : CR_ENOMEM;
    }
    buf_release(&path);
    buf_release(&query);
    if (rc)
        return cr_err_set(err, rc, "cannot build url");

    /* The deployment picks the model: "model" is not needed, and a routing
     * prefix must not reach the service. */
    body = cJSON_Duplicate(req, 1);
    if (body)
        cJSON_DeleteItemFromObjectCaseSensitive(body, "model");
    return llm__openai_finish(cfg, op, body, "api-key", "", out, err);
}

const struct llm_provider llm_provider_azure = {
    .name = "azure",
    .build = build,
    .stream_init = llm__openai_stream_init,
    .stream_release = llm__openai_stream_release,
    .feed = llm__openai_feed,
    .parse = llm__openai_parse,
    .embed_parse = openai_embed_parse,
    .error_parse = llm__openai_error_parse,
    .complete = llm__openai_complete,
};
