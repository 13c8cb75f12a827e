/* sqs_url.c -- SQS broker URL, transport options and environment (no I/O).
 *
 * Each rule is kombu's (kombu/transport/SQS.py, Channel: region, is_secure,
 * endpoint_url, sqs(), new_sqs_client()) or botocore's (the env credential
 * provider, the region setting); where kombu would fail later, at the first
 * call, we refuse up front and say so next to the code. */
#include "sqs_url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "protocol/pyjson.h"
#include "util/alloc.h"
#include "util/pct.h"

#define DEFAULT_REGION "us-east-1"
#define DEFAULT_WAIT_S 10
#define DEFAULT_VISIBILITY_S 1800
#define MAX_PREDEFINED 256

/* ------------------------------------------------------------ helpers */

static void wipe(void *p, size_t n)
{
    /* explicit_bzero: the compiler may not drop it as a dead store. */
    explicit_bzero(p, n);
}

static void creds_release(struct sqs_creds *cr)
{
    if (cr->session_token) {
        wipe(cr->session_token, strlen(cr->session_token));
        cr_free(cr->session_token);
    }
    wipe(cr, sizeof *cr);
}

static void strv_free(char **v, int n)
{
    for (int i = 0; i < n; i++)
        cr_free(v[i]);
    cr_free(v);
}

static void pairs_free(struct sqs_pair *p, int n)
{
    for (int i = 0; i < n; i++) {
        cr_free(p[i].key);
        cr_free(p[i].value);
    }
    cr_free(p);
}

static void queue_release(struct sqs_queue_def *q)
{
    cr_free(q->name);
    cr_free(q->url);
    creds_release(&q->creds);
    cr_free(q->backoff);
    strv_free(q->backoff_tasks, q->nbackoff_tasks);
    memset(q, 0, sizeof *q);
}

/* The value of name in envp, or NULL; "" counts as unset, as botocore's
 * environment provider and region lookup treat it. */
static const char *env_get(const char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return (*envp)[n + 1] ? *envp + n + 1 : NULL;
    return NULL;
}

/* A value that goes into a header or the signing string: printable ASCII
 * only, so that no CR, LF or NUL can split a header. */
static int printable(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

/* A region goes into a host name and into libcurl's "aws:amz:<region>:sqs". */
static int region_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= SQS_REGION_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '-'))
            return 0;
    return 1;
}

static int set_key_pair(struct sqs_creds *cr, enum sqs_creds_source src, const char *key,
                        size_t klen, const char *secret, size_t slen, const char *what,
                        struct cr_err *err)
{
    if (klen >= sizeof cr->access_key_id || slen >= sizeof cr->secret_access_key)
        return cr_err_set(err, CR_EINVAL, "%s: access key id or secret too long", what);
    if (!printable(key, klen) || !printable(secret, slen))
        return cr_err_set(err, CR_EINVAL,
                          "%s: access key id or secret has a control or non-ASCII byte",
                          what);
    cr->source = src;
    memcpy(cr->access_key_id, key, klen);
    cr->access_key_id[klen] = '\0';
    memcpy(cr->secret_access_key, secret, slen);
    cr->secret_access_key[slen] = '\0';
    return 0;
}

static int no_creds(struct cr_err *err)
{
    return cr_err_set(err, CR_EINVAL,
                      "no AWS credentials for SQS: put them in the broker URL "
                      "(sqs://KEY:SECRET@) or set AWS_ACCESS_KEY_ID and "
                      "AWS_SECRET_ACCESS_KEY (profiles, web identity, container and "
                      "instance credentials are not supported)");
}

/* botocore's environment provider: AWS_ACCESS_KEY_ID needs
 * AWS_SECRET_ACCESS_KEY; the token is AWS_SESSION_TOKEN, else
 * AWS_SECURITY_TOKEN. Returns 1 when neither key is set. */
static int creds_from_env(struct sqs_creds *cr, const char *const *envp,
                          struct cr_err *err)
{
    const char *k = env_get(envp, "AWS_ACCESS_KEY_ID");
    const char *s = env_get(envp, "AWS_SECRET_ACCESS_KEY");
    const char *t = env_get(envp, "AWS_SESSION_TOKEN");
    size_t tn;
    int rc;

    if (!t)
        t = env_get(envp, "AWS_SECURITY_TOKEN");
    if (!k && !s)
        return 1;
    if (!k || !s)
        return cr_err_set(err, CR_EINVAL, "partial AWS credentials: %s is set but not %s",
                          k ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY",
                          k ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID");
    rc = set_key_pair(cr, SQS_CREDS_ENV, k, strlen(k), s, strlen(s),
                      "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", err);
    if (rc < 0)
        return rc;
    if (!t)
        return 0;
    tn = strlen(t);
    if (tn > SQS_TOKEN_MAX_BYTES || !printable(t, tn))
        return cr_err_set(err, CR_EINVAL,
                          "AWS_SESSION_TOKEN is too long or has a control or non-ASCII "
                          "byte");
    cr->session_token = cr_strdup(t);
    return cr->session_token ? 0 : CR_ENOMEM;
}

static int copy_creds(struct sqs_creds *dst, const struct sqs_creds *src)
{
    *dst = *src;
    dst->session_token = NULL;
    if (src->session_token && !(dst->session_token = cr_strdup(src->session_token)))
        return CR_ENOMEM;
    return 0;
}

static void region_endpoint(char *out, const char *region)
{
    snprintf(out, SQS_ENDPOINT_MAX, "https://sqs.%s.amazonaws.com", region);
}

/* ------------------------------------------------------------ URL */

struct url_parts {
    const char *user, *pass; /* NULL when absent or empty (kombu: None) */
    size_t ulen, plen;
    const char *host; /* NULL when absent */
    size_t hlen;
    int ipv6;
    long port; /* 0 when absent (or ":0", which kombu reads as None) */
};

/* Splits "sqs://[user[:pass]@][host][:port][/path]" as Python's urlsplit
 * does: the authority ends at the first '/', '?' or '#', and the credentials
 * end at its last '@'. Messages never quote the credentials, and the port
 * text is not quoted either (a secret with a raw '/' ends up there). */
static int url_split(const char *url, struct url_parts *u, struct cr_err *err)
{
    const char *a, *end, *at, *hp, *colon;

    memset(u, 0, sizeof *u);
    if (strncmp(url, "sqs://", 6) != 0)
        return cr_err_set(err, CR_EINVAL, "broker URL scheme must be sqs://");
    a = url + 6;
    end = a + strcspn(a, "/?#");
    if (*end == '?' || *end == '#' || (*end == '/' && strpbrk(end, "?#")))
        return cr_err_set(err, CR_EINVAL,
                          "sqs broker URL: a query or fragment is not supported (use "
                          "broker_transport_options)");
    at = NULL;
    for (const char *p = a; p < end; p++)
        if (*p == '@')
            at = p;
    hp = a;
    if (at) {
        colon = memchr(a, ':', (size_t)(at - a));
        u->user = a;
        u->ulen = colon ? (size_t)(colon - a) : (size_t)(at - a);
        if (colon) {
            u->pass = colon + 1;
            u->plen = (size_t)(at - colon - 1);
        }
        if (u->ulen == 0)
            u->user = NULL;
        if (u->plen == 0)
            u->pass = NULL;
        hp = at + 1;
    }
    if (hp < end && *hp == '[') {
        const char *close = memchr(hp, ']', (size_t)(end - hp));
        if (!close)
            return cr_err_set(err, CR_EINVAL, "sqs broker URL has an unclosed '['");
        u->host = hp + 1;
        u->hlen = (size_t)(close - hp - 1);
        u->ipv6 = 1;
        colon = close + 1;
        if (colon < end && *colon != ':')
            return cr_err_set(err, CR_EINVAL, "sqs broker URL: text after ']'");
    } else {
        colon = memchr(hp, ':', (size_t)(end - hp));
        if (!colon)
            colon = end;
        u->host = hp;
        u->hlen = (size_t)(colon - hp);
    }
    if (u->hlen == 0)
        u->host = NULL;
    if (colon < end) { /* ":port" */
        long port = 0;
        const char *p = colon + 1;
        /* An empty port is none, as urlsplit's port reads it. */
        for (; p < end; p++) {
            if (*p < '0' || *p > '9' || port > 65535)
                return cr_err_set(err, CR_EINVAL,
                                  "sqs broker URL: the port is not a number from 0 to "
                                  "65535");
            port = port * 10 + (*p - '0');
        }
        if (port > 65535)
            return cr_err_set(err, CR_EINVAL,
                              "sqs broker URL: the port is not a number from 0 to 65535");
        u->port = port;
    }
    if (u->host) {
        if (u->hlen > 253 || !printable(u->host, u->hlen) ||
            memchr(u->host, ' ', u->hlen) || memchr(u->host, '%', u->hlen) ||
            memchr(u->host, '\\', u->hlen))
            return cr_err_set(err, CR_EINVAL, "sqs broker URL: invalid host name");
    }
    return 0;
}

static int url_creds(struct sqs_conf *c, const struct url_parts *u, struct cr_err *err)
{
    char key[SQS_KEY_ID_MAX], secret[SQS_SECRET_MAX];
    size_t kn, sn;
    int rc;

    if (!u->user && !u->pass)
        return 1; /* none: the environment's */
    /* boto3 keeps a key without a secret (or the reverse) and fails at the
     * first call; refuse it here. */
    if (!u->user || !u->pass)
        return cr_err_set(err, CR_EINVAL, "sqs broker URL has %s",
                          u->user ? "an access key id without a secret"
                                  : "a secret without an access key id");
    if (pct_decode(key, sizeof key, u->user, u->ulen, 0, &kn) ||
        pct_decode(secret, sizeof secret, u->pass, u->plen, 0, &sn)) {
        wipe(secret, sizeof secret);
        return cr_err_set(err, CR_EINVAL,
                          "sqs broker URL: access key id or secret too long");
    }
    rc = set_key_pair(&c->creds, SQS_CREDS_URL, key, kn, secret, sn, "sqs broker URL",
                      err);
    wipe(secret, sizeof secret);
    return rc;
}

/* ------------------------------------------------------------ options */

static int opt_err_type(struct cr_err *err, const char *path, const char *want)
{
    return cr_err_set(err, CR_EINVAL, "broker transport option '%.120s' must be %s", path,
                      want);
}

/* An integral JSON number in [lo, hi] (3.0 is refused: kombu passes the
 * value to botocore, whose validation wants an int). */
static int opt_int(const cJSON *v, const char *path, long lo, long hi, long *out,
                   struct cr_err *err)
{
    if (!cJSON_IsNumber(v) || (v->type & PY_JSON_FLOAT))
        return opt_err_type(err, path, "an integer");
    /* Written so that NaN (which Python's json reads) is out of range too. */
    if (!(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%.120s' is out of range (%ld..%ld)",
                          path, lo, hi);
    *out = (long)v->valuedouble;
    return 0;
}

/* A string; "" allowed. *out is a new copy. */
static int opt_strdup(const cJSON *v, const char *path, size_t max, char **out,
                      struct cr_err *err)
{
    if (!cJSON_IsString(v))
        return opt_err_type(err, path, "a string");
    if (strlen(v->valuestring) > max)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%.120s' is too long (at most %zu "
                          "bytes)",
                          path, max);
    *out = cr_strdup(v->valuestring);
    return *out ? 0 : CR_ENOMEM;
}

static int opt_strv(const cJSON *v, const char *path, char ***out, int *n,
                    struct cr_err *err)
{
    const cJSON *it;
    int count = cJSON_GetArraySize(v), rc;

    if (!cJSON_IsArray(v))
        return opt_err_type(err, path, "a list of strings");
    if (count > SQS_LIST_MAX)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%.120s' has more than %d entries",
                          path, SQS_LIST_MAX);
    *out = cr_calloc((size_t)count + 1, sizeof(char *));
    if (!*out)
        return CR_ENOMEM;
    cJSON_ArrayForEach(it, v)
    {
        if ((rc = opt_strdup(it, path, 1024, &(*out)[*n], err)) < 0)
            return rc;
        (*n)++;
    }
    return 0;
}

/* A JSON object of strings, as boto3 wants CreateQueue's Attributes and tags. */
static int opt_pairs(const cJSON *v, const char *path, struct sqs_pair **out, int *n,
                     struct cr_err *err)
{
    const cJSON *it;
    int count = cJSON_GetArraySize(v);
    char sub[160];
    int rc;

    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return opt_err_type(err, path, "an object of strings");
    if (count > SQS_LIST_MAX)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%.120s' has more than %d entries",
                          path, SQS_LIST_MAX);
    *out = cr_calloc((size_t)count + 1, sizeof **out);
    if (!*out)
        return CR_ENOMEM;
    cJSON_ArrayForEach(it, v)
    {
        struct sqs_pair *p = &(*out)[*n];
        snprintf(sub, sizeof sub, "%.60s.%.60s", path, it->string);
        if ((rc = opt_strdup(it, sub, 65536, &p->value, err)) < 0)
            return rc;
        (*n)++;
        if (!(p->key = cr_strdup(it->string)))
            return CR_ENOMEM;
    }
    return 0;
}

/* A canonical SQS name, as kombu's entity_name() leaves it: letters, digits,
 * '-' and '_', with a ".fifo" suffix allowed. kombu looks predefined queues
 * up by that name, so any other key could never be used. */
static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int queue_backoff(struct sqs_queue_def *q, const cJSON *v, const char *path,
                         struct cr_err *err)
{
    const cJSON *it;
    int count = cJSON_GetArraySize(v);
    long secs;
    int rc;

    if (!cJSON_IsObject(v))
        return opt_err_type(err, path, "an object of receive count -> seconds");
    if (count > SQS_LIST_MAX)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%.120s' has more than %d entries",
                          path, SQS_LIST_MAX);
    q->backoff = cr_calloc((size_t)count + 1, sizeof *q->backoff);
    if (!q->backoff)
        return CR_ENOMEM;
    cJSON_ArrayForEach(it, v)
    {
        /* JSON keys are strings; Python's are the receive counts as ints. */
        char *end;
        long k = strtol(it->string, &end, 10);
        if (end == it->string || *end || k < 1 || k > 1000000)
            return cr_err_set(err, CR_EINVAL,
                              "broker transport option '%.120s' has a key that is not a "
                              "receive count (1, 2, ...)",
                              path);
        if ((rc = opt_int(it, path, 0, SQS_VISIBILITY_MAX_S, &secs, err)) < 0)
            return rc;
        q->backoff[q->nbackoff].receive_count = (int)k;
        q->backoff[q->nbackoff].visibility_s = (int)secs;
        q->nbackoff++;
    }
    return 0;
}

/* One predefined_queues entry; kombu's sqs(): its own keys, each falling back
 * to the URL's user or password, and both falling back to the default chain
 * (here: the environment) when neither is set; its own region, else the
 * channel's. The endpoint is the channel's (the URL host) when there is
 * one, else the region's. */
static int queue_one(struct sqs_conf *c, struct sqs_queue_def *q, const cJSON *e,
                     const struct url_parts *u, struct cr_err *err)
{
    const cJSON *it, *key = NULL, *secret = NULL;
    char path[200];
    int rc;

    if (!sqs_queue_name_ok(e->string))
        return cr_err_set(err, CR_EINVAL,
                          "predefined queue '%.100s' is not an SQS queue name (letters, "
                          "digits, '-' and '_', at most 80, optional .fifo): kombu "
                          "looks queues up by that name",
                          e->string);
    if (!(q->name = cr_strdup(e->string)))
        return CR_ENOMEM;
    if (!cJSON_IsObject(e)) {
        snprintf(path, sizeof path, "predefined_queues.%s", q->name);
        return opt_err_type(err, path, "an object");
    }
    snprintf(q->region, sizeof q->region, "%s", c->region);
    cJSON_ArrayForEach(it, e)
    {
        snprintf(path, sizeof path, "predefined_queues.%s.%.40s", q->name, it->string);
        if (strcmp(it->string, "url") == 0) {
            cr_free(q->url);
            q->url = NULL;
            if ((rc = opt_strdup(it, path, 1024, &q->url, err)) < 0)
                return rc;
        } else if (strcmp(it->string, "access_key_id") == 0) {
            if (!cJSON_IsString(it))
                return opt_err_type(err, path, "a string");
            key = it;
        } else if (strcmp(it->string, "secret_access_key") == 0) {
            if (!cJSON_IsString(it))
                return opt_err_type(err, path, "a string");
            secret = it;
        } else if (strcmp(it->string, "region") == 0) {
            if (!cJSON_IsString(it) || !region_ok(it->valuestring))
                return opt_err_type(err, path, "a region name (a-z, 0-9, '-')");
            snprintf(q->region, sizeof q->region, "%s", it->valuestring);
        } else if (strcmp(it->string, "backoff_policy") == 0) {
            cr_free(q->backoff);
            q->backoff = NULL;
            q->nbackoff = 0;
            if ((rc = queue_backoff(q, it, path, err)) < 0)
                return rc;
        } else if (strcmp(it->string, "backoff_tasks") == 0) {
            strv_free(q->backoff_tasks, q->nbackoff_tasks);
            q->backoff_tasks = NULL;
            q->nbackoff_tasks = 0;
            if ((rc = opt_strv(it, path, &q->backoff_tasks, &q->nbackoff_tasks, err)) < 0)
                return rc;
        } else {
            return cr_err_set(err, CR_EINVAL, "unknown broker transport option '%.120s'",
                              path);
        }
    }
    snprintf(path, sizeof path, "predefined_queues.%s.url", q->name);
    if (!q->url)
        return cr_err_set(err, CR_EINVAL, "broker transport option '%s' is missing",
                          path);
    if (strncmp(q->url, "http://", 7) != 0 && strncmp(q->url, "https://", 8) != 0)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' must be an http:// or https:// "
                          "URL",
                          path);
    if (!printable(q->url, strlen(q->url)))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' has a control or non-ASCII byte",
                          path);
    q->fifo = ends_with(q->name, ".fifo");
    /* kombu 5.6 raises InvalidQueueException for a FIFO name on a standard
     * URL; the other way round SQS itself refuses the FIFO-only fields. */
    if (q->fifo != ends_with(q->url, ".fifo"))
        return cr_err_set(err, CR_EINVAL,
                          "predefined queue '%s': a .fifo name needs a .fifo url and a "
                          "standard name a standard url",
                          q->name);
    if (c->has_host)
        memcpy(q->endpoint, c->endpoint, sizeof q->endpoint);
    else
        region_endpoint(q->endpoint, q->region);

    if (!key && !secret)
        return c->has_creds ? copy_creds(&q->creds, &c->creds) : no_creds(err);
    {
        const char *k = key ? key->valuestring : NULL;
        const char *s = secret ? secret->valuestring : NULL;
        size_t kn = 0, sn = 0;
        char kbuf[SQS_KEY_ID_MAX], sbuf[SQS_SECRET_MAX];
        /* A missing half comes from the URL, decoded. */
        if (!k && u->user) {
            if (pct_decode(kbuf, sizeof kbuf, u->user, u->ulen, 0, &kn))
                return cr_err_set(err, CR_EINVAL,
                                  "sqs broker URL: access key id too long");
            k = kbuf;
        } else if (k) {
            kn = strlen(k);
        }
        if (!s && u->pass) {
            if (pct_decode(sbuf, sizeof sbuf, u->pass, u->plen, 0, &sn)) {
                wipe(sbuf, sizeof sbuf);
                return cr_err_set(err, CR_EINVAL, "sqs broker URL: secret too long");
            }
            s = sbuf;
        } else if (s) {
            sn = strlen(s);
        }
        if (!k || !s || !kn || !sn) {
            wipe(sbuf, sizeof sbuf);
            return cr_err_set(err, CR_EINVAL, "predefined queue '%s' has %s", q->name,
                              k && kn ? "an access_key_id without a secret_access_key"
                                      : "a secret_access_key without an access_key_id");
        }
        snprintf(path, sizeof path, "predefined queue '%s'", q->name);
        rc = set_key_pair(&q->creds, SQS_CREDS_QUEUE, k, kn, s, sn, path, err);
        wipe(sbuf, sizeof sbuf);
        return rc;
    }
}

static int opt_predefined(struct sqs_conf *c, const cJSON *v, const struct url_parts *u,
                          struct cr_err *err)
{
    const cJSON *it;
    int count = cJSON_GetArraySize(v), rc;

    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsObject(v))
        return opt_err_type(err, "predefined_queues", "an object");
    if (count > MAX_PREDEFINED)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'predefined_queues' has more than %d "
                          "queues",
                          MAX_PREDEFINED);
    c->predefined = cr_calloc((size_t)count + 1, sizeof *c->predefined);
    if (!c->predefined)
        return CR_ENOMEM;
    cJSON_ArrayForEach(it, v)
    {
        for (int i = 0; i < c->npredefined; i++)
            if (strcmp(c->predefined[i].name, it->string) == 0)
                return cr_err_set(err, CR_EINVAL, "predefined queue '%.100s' is repeated",
                                  it->string);
        rc = queue_one(c, &c->predefined[c->npredefined], it, u, err);
        /* Counted even on failure, so that release frees what it holds. */
        c->npredefined++;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The options that do not depend on the region or the credentials. The
 * region is read first (by the caller) and predefined_queues last. */
static int opt_one(struct sqs_conf *c, const cJSON *v, struct cr_err *err)
{
    const char *k = v->string;
    long l;
    int rc;
    /* Read by kombu and never used (port, regioninfo), or Celery's publish
     * retry policy that its docs place here (Connection.ensure). */
    static const char *const ignored[] = {
        "port",           "regioninfo",    "max_retries",
        "interval_start", "interval_step", "interval_max",
    };

    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        if (strcmp(k, ignored[i]) == 0)
            return 0;
    if (strcmp(k, "region") == 0 || strcmp(k, "predefined_queues") == 0)
        return 0; /* read by sqs_conf_parse() in its own order */
    if (strcmp(k, "is_secure") == 0) {
        if (cJSON_IsNull(v))
            c->is_secure = -1;
        else if (cJSON_IsBool(v))
            c->is_secure = cJSON_IsTrue(v) ? 1 : 0;
        else
            return opt_err_type(err, k, "true, false or null");
        return 0;
    }
    if (strcmp(k, "wait_time_seconds") == 0) {
        if ((rc = opt_int(v, k, 0, SQS_WAIT_MAX_S, &l, err)) < 0)
            return rc;
        c->wait_time_s = (int)l;
        return 0;
    }
    if (strcmp(k, "visibility_timeout") == 0) {
        /* kombu: `visibility_timeout or 1800`, so null and 0 are the default. */
        if (cJSON_IsNull(v))
            l = 0;
        else if ((rc = opt_int(v, k, 0, SQS_VISIBILITY_MAX_S, &l, err)) < 0)
            return rc;
        c->visibility_timeout_s = l ? (int)l : DEFAULT_VISIBILITY_S;
        return 0;
    }
    if (strcmp(k, "polling_interval") == 0) {
        if (cJSON_IsNull(v)) {
            c->polling_interval_s = 1;
            return 0;
        }
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 86400))
            return opt_err_type(err, k, "a number of seconds from 0 to 86400");
        c->polling_interval_s = v->valuedouble;
        return 0;
    }
    if (strcmp(k, "queue_name_prefix") == 0) {
        if (!cJSON_IsString(v))
            return opt_err_type(err, k, "a string");
        if (strlen(v->valuestring) >= sizeof c->prefix)
            return cr_err_set(err, CR_EINVAL,
                              "broker transport option 'queue_name_prefix' is longer "
                              "than an SQS queue name (80)");
        snprintf(c->prefix, sizeof c->prefix, "%s", v->valuestring);
        return 0;
    }
    if (strcmp(k, "sqs_base64_encoding") == 0) {
        if (!cJSON_IsBool(v))
            return opt_err_type(err, k, "true or false");
        c->base64 = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    }
    if (strcmp(k, "sqs-creation-attributes") == 0) {
        pairs_free(c->create_attrs, c->ncreate_attrs);
        c->create_attrs = NULL;
        c->ncreate_attrs = 0;
        return opt_pairs(v, k, &c->create_attrs, &c->ncreate_attrs, err);
    }
    if (strcmp(k, "queue_tags") == 0) {
        pairs_free(c->tags, c->ntags);
        c->tags = NULL;
        c->ntags = 0;
        return opt_pairs(v, k, &c->tags, &c->ntags, err);
    }
    if (strcmp(k, "fetch_message_attributes") == 0) {
        strv_free(c->fetch_attrs, c->nfetch_attrs);
        c->fetch_attrs = NULL;
        c->nfetch_attrs = 0;
        return cJSON_IsNull(v) ? 0
                               : opt_strv(v, k, &c->fetch_attrs, &c->nfetch_attrs, err);
    }
    if (strcmp(k, "deadletter_queue") == 0) {
        cr_free(c->deadletter_queue);
        c->deadletter_queue = NULL;
        return cJSON_IsNull(v) ? 0 : opt_strdup(v, k, 1024, &c->deadletter_queue, err);
    }
    if (strcmp(k, "body_encoding") == 0) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, "base64") == 0)
            return 0;
        return opt_err_type(err, k, "'base64'");
    }
    if (strcmp(k, "sts_role_arn") == 0) {
        /* kombu tests it for truth: null and "" mean no role. */
        if (cJSON_IsNull(v) || (cJSON_IsString(v) && !*v->valuestring))
            return 0;
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'sts_role_arn' is not supported (STS "
                          "AssumeRole); pass the role's credentials in the environment");
    }
    if (strcmp(k, "sts_token_timeout") == 0 || strcmp(k, "sts_token_buffer_time") == 0) {
        /* Meaningful only with sts_role_arn, which is refused above. */
        if (!cJSON_IsNumber(v) && !cJSON_IsNull(v))
            return opt_err_type(err, k, "a number");
        return 0;
    }
    if (strcmp(k, "client-config") == 0) {
        if (cJSON_IsNull(v) || (cJSON_IsObject(v) && !v->child))
            return 0;
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'client-config' (botocore Config) is "
                          "not supported");
    }
    return cr_err_set(err, CR_EINVAL, "unknown broker transport option '%.120s'", k);
}

/* ------------------------------------------------------------ parse */

void sqs_conf_init(struct sqs_conf *c)
{
    memset(c, 0, sizeof *c);
    c->is_secure = -1;
    c->wait_time_s = DEFAULT_WAIT_S;
    c->visibility_timeout_s = DEFAULT_VISIBILITY_S;
    c->polling_interval_s = 1;
    c->base64 = 1;
}

void sqs_conf_release(struct sqs_conf *c)
{
    creds_release(&c->creds);
    cr_free(c->deadletter_queue);
    pairs_free(c->create_attrs, c->ncreate_attrs);
    pairs_free(c->tags, c->ntags);
    strv_free(c->fetch_attrs, c->nfetch_attrs);
    for (int i = 0; i < c->npredefined; i++)
        queue_release(&c->predefined[i]);
    cr_free(c->predefined);
    sqs_conf_init(c);
}

static int parse(struct sqs_conf *c, const char *url, const char *options, size_t len,
                 const char *const *envp, cJSON **root, struct cr_err *err)
{
    struct url_parts u;
    const cJSON *it, *region = NULL, *predefined = NULL;
    const char *r;
    int rc;

    if (!url)
        return cr_err_set(err, CR_EINVAL, "no broker URL");
    if ((rc = url_split(url, &u, err)) < 0)
        return rc;
    if (options && len) {
        if (len > SQS_OPTS_MAX_BYTES)
            return cr_err_set(err, CR_EINVAL,
                              "broker transport options are too long (%zu bytes, at most "
                              "%d)",
                              len, SQS_OPTS_MAX_BYTES);
        rc = py_json_parse(options, len, root, err);
        if (rc == CR_ENOMEM)
            return rc;
        if (rc < 0) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err ? err->msg : "");
            return cr_err_set(err, CR_EINVAL, "broker transport options are not JSON: %s",
                              why);
        }
        if (!cJSON_IsObject(*root))
            return cr_err_set(err, CR_EINVAL,
                              "broker transport options must be a JSON object");
        /* Later duplicates win, as in Python's json.loads. */
        cJSON_ArrayForEach(it, *root)
        {
            if (strcmp(it->string, "region") == 0)
                region = it;
            else if (strcmp(it->string, "predefined_queues") == 0)
                predefined = it;
            if ((rc = opt_one(c, it, err)) < 0)
                return rc;
        }
    }

    /* Region: kombu's `options.region or session.region_name or us-east-1`. */
    r = NULL;
    if (region && !cJSON_IsNull(region)) {
        if (!cJSON_IsString(region))
            return opt_err_type(err, "region", "a string");
        if (*region->valuestring) {
            if (!region_ok(region->valuestring))
                return cr_err_set(
                    err, CR_EINVAL,
                    "broker transport option 'region' must be a region name "
                    "(a-z, 0-9, '-')");
            r = region->valuestring;
        }
    }
    if (!r && (r = env_get(envp, "AWS_DEFAULT_REGION")) && !region_ok(r))
        return cr_err_set(err, CR_EINVAL,
                          "AWS_DEFAULT_REGION must be a region name (a-z, 0-9, '-')");
    /* After botocore's own variable, so that where both are set (Lambda and
     * ECS set both) a mixed fleet agrees; alone, it is what every other AWS
     * SDK reads, and what a user who sets it means. */
    if (!r && (r = env_get(envp, "AWS_REGION")) && !region_ok(r))
        return cr_err_set(err, CR_EINVAL,
                          "AWS_REGION must be a region name (a-z, 0-9, '-')");
    snprintf(c->region, sizeof c->region, "%s", r ? r : DEFAULT_REGION);

    /* Endpoint: kombu's endpoint_url, else botocore's for the region. */
    c->has_host = u.host != NULL;
    if (u.host) {
        const char *scheme = c->is_secure == 1 ? "https" : "http";
        char port[8] = "";
        int n;
        if (u.port)
            snprintf(port, sizeof port, ":%ld", u.port);
        n = snprintf(c->endpoint, sizeof c->endpoint, "%s://%s%.*s%s%s", scheme,
                     u.ipv6 ? "[" : "", (int)u.hlen, u.host, u.ipv6 ? "]" : "", port);
        if (n < 0 || (size_t)n >= sizeof c->endpoint)
            return cr_err_set(err, CR_EINVAL, "sqs broker URL: host name too long");
    } else {
        region_endpoint(c->endpoint, c->region);
    }

    /* Credentials: the URL's, else the environment's. */
    rc = url_creds(c, &u, err);
    if (rc < 0)
        return rc;
    if (rc == 1 && (rc = creds_from_env(&c->creds, envp, err)) < 0)
        return rc;
    /* None at all is still fine when every predefined queue has keys of its
     * own: kombu then never builds the channel's default client. */
    c->has_creds = rc == 0;

    if (predefined && (rc = opt_predefined(c, predefined, &u, err)) < 0)
        return rc;
    return c->has_creds || c->npredefined ? 0 : no_creds(err);
}

int sqs_conf_parse(struct sqs_conf *c, const char *url, const char *options, size_t len,
                   const char *const *envp, struct cr_err *err)
{
    cJSON *root = NULL;
    int rc;

    sqs_conf_release(c);
    rc = parse(c, url, options, len, envp, &root, err);
    cJSON_Delete(root);
    if (rc < 0) {
        sqs_conf_release(c);
        if (rc == CR_ENOMEM)
            cr_err_set(err, CR_ENOMEM, "out of memory reading the SQS broker settings");
    }
    return rc;
}

const struct sqs_queue_def *sqs_conf_queue(const struct sqs_conf *c, const char *name)
{
    for (int i = 0; i < c->npredefined; i++)
        if (strcmp(c->predefined[i].name, name) == 0)
            return &c->predefined[i];
    return NULL;
}

/* ------------------------------------------------------------ logging */

void sqs_url_redact(const char *url, char *out, size_t size)
{
    const char *a, *colon, *at = NULL;

    if (size == 0)
        return;
    a = strstr(url, "://");
    a = a ? a + 3 : url;
    /* The last '@' anywhere: a raw '/' or '?' in a secret would end the
     * authority early, and the secret must still not be printed. */
    for (const char *p = a; *p; p++)
        if (*p == '@')
            at = p;
    colon = at ? memchr(a, ':', (size_t)(at - a)) : NULL;
    if (!colon) {
        snprintf(out, size, "%s", url);
        return;
    }
    snprintf(out, size, "%.*s**%s", (int)(colon + 1 - url), url, at);
}

void sqs_conf_describe(const struct sqs_conf *c, char *out, size_t size)
{
    static const char *const src[] = {"url", "env", "queue"};
    if (size == 0)
        return;
    snprintf(out, size, "endpoint=%s region=%s creds=%s key=%s token=%s predefined=%d",
             c->endpoint, c->region, c->has_creds ? src[c->creds.source] : "none",
             c->creds.access_key_id, c->creds.session_token ? "yes" : "no",
             c->npredefined);
}
