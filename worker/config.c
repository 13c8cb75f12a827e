/* config.c -- option table, command line and environment parsing. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

enum opt_type { OPT_STR, OPT_INT, OPT_DBL, OPT_BOOL, OPT_LIST };

struct opt {
    const char *name; /* long option */
    char short_flag;  /* 0 if none */
    const char *env;  /* environment fallback, or NULL */
    enum opt_type type;
    size_t offset;
    const char *def; /* default as text, or NULL */
    double min, max; /* bounds for numbers */
    const char *help;
};

#define OFF(f) offsetof(struct config, f)

static const struct opt opts[] = {
    {"broker", 'b', "CELERY_BROKER_URL", OPT_STR, OFF(broker),
     "amqp://guest:guest@localhost:5672//", 0, 0, "AMQP broker URL"},
    {"result-backend", 0, "CELERY_RESULT_BACKEND", OPT_STR, OFF(result_backend),
     "redis://localhost:6379/0", 0, 0, "Redis result backend URL"},
    {"redis-timeout", 0, "CELERIAC_REDIS_TIMEOUT", OPT_DBL, OFF(redis_timeout), "120", 0,
     86400,
     "seconds a Redis command may go unanswered before the connection is rebuilt (0: "
     "none)"},
    {"redis-health-check-interval", 0, "CELERIAC_REDIS_HEALTH_CHECK_INTERVAL", OPT_DBL,
     OFF(redis_health_check_interval), "25", 0, 86400,
     "seconds an idle Redis connection waits before a PING tests it (0: never)"},
    {"queues", 'Q', "CELERIAC_QUEUES", OPT_LIST, OFF(queues), "celery", 0, 0,
     "queues to consume, comma-separated (repeatable)"},
    {"concurrency", 'c', "CELERIAC_CONCURRENCY", OPT_INT, OFF(concurrency), "100", 1,
     CONFIG_MAX_CONCURRENCY, "tasks (LLM calls) in flight at once"},
    {"hostname", 'n', "CELERIAC_HOSTNAME", OPT_STR, OFF(hostname), "celery@%h", 0, 0,
     "node name; %h host, %n name part, %d domain"},
    {"loglevel", 'l', "CELERIAC_LOGLEVEL", OPT_STR, OFF(loglevel), "info", 0, 0,
     "debug, info, warning, error or critical"},
    {"prefetch-multiplier", 0, "CELERIAC_PREFETCH_MULTIPLIER", OPT_INT,
     OFF(prefetch_multiplier), "4", 1, 1000, "basic.qos = concurrency x this"},
    {"task-alias", 0, NULL, OPT_LIST, OFF(aliases), NULL, 0, 0,
     "NAME=TASK: run task NAME as built-in TASK (repeatable)"},
    {"acks-early", 0, "CELERIAC_ACKS_EARLY", OPT_BOOL, OFF(acks_early), "0", 0, 1,
     "ack when a task starts (Celery's default) instead of after its result is stored"},
    {"result-expires", 0, "CELERIAC_RESULT_EXPIRES", OPT_INT, OFF(result_expires),
     "86400", 0, 1e9, "result TTL in seconds (0: never)"},
    {"result-extended", 0, "CELERIAC_RESULT_EXTENDED", OPT_BOOL, OFF(result_extended),
     "0", 0, 1, "store name, args, kwargs, worker, retries, queue with results"},
    {"track-started", 0, "CELERIAC_TRACK_STARTED", OPT_BOOL, OFF(track_started), "0", 0,
     1, "store STARTED when a task starts"},
    {"shutdown-timeout", 0, "CELERIAC_SHUTDOWN_TIMEOUT", OPT_DBL, OFF(shutdown_timeout),
     "60", 0, 86400, "seconds a warm shutdown waits for in-flight tasks"},
    {"heartbeat", 0, "CELERIAC_HEARTBEAT", OPT_INT, OFF(heartbeat), "60", 0, 3600,
     "AMQP heartbeat in seconds (0: off)"},
    {"llm-base-url", 0, "OPENAI_BASE_URL", OPT_STR, OFF(llm_base_url),
     "https://api.openai.com/v1", 0, 0, "OpenAI-compatible API base URL"},
    {"llm-api-key", 0, "OPENAI_API_KEY", OPT_STR, OFF(llm_api_key), "", 0, 0,
     "API key (sent as a bearer token, never logged)"},
    {"llm-model", 0, "CELERIAC_MODEL", OPT_STR, OFF(llm_model), "gpt-4o-mini", 0, 0,
     "default chat model"},
    {"llm-embed-model", 0, "CELERIAC_EMBED_MODEL", OPT_STR, OFF(llm_embed_model),
     "text-embedding-3-small", 0, 0, "default embedding model"},
    {"llm-connect-timeout", 0, "CELERIAC_LLM_CONNECT_TIMEOUT", OPT_DBL,
     OFF(llm_connect_timeout), "10", 0.001, 3600, "seconds to connect"},
    {"llm-first-byte-timeout", 0, "CELERIAC_LLM_FIRST_BYTE_TIMEOUT", OPT_DBL,
     OFF(llm_first_byte_timeout), "120", 0.001, 86400, "seconds to the response headers"},
    {"llm-first-token-timeout", 0, "CELERIAC_LLM_FIRST_TOKEN_TIMEOUT", OPT_DBL,
     OFF(llm_first_token_timeout), "300", 0.001, 86400, "seconds to the first token"},
    {"llm-idle-timeout", 0, "CELERIAC_LLM_IDLE_TIMEOUT", OPT_DBL, OFF(llm_idle_timeout),
     "120", 0.001, 86400, "longest silence between received bytes, in seconds"},
    {"llm-max-connections", 0, "CELERIAC_LLM_MAX_CONNECTIONS", OPT_INT,
     OFF(llm_max_connections), "0", 0, 100000,
     "cap on open provider connections (0: none)"},
    {"llm-keep-connections", 0, "CELERIAC_LLM_KEEP_CONNECTIONS", OPT_INT,
     OFF(llm_keep_connections), "1024", 0, 100000,
     "calls in flight past which a new plain-HTTP connection is not kept"},
    {"max-message-size", 0, "CELERIAC_MAX_MESSAGE_SIZE", OPT_INT, OFF(max_message_size),
     "10485760", 1024, 1e9, "largest task message body accepted, in bytes"},
    {"max-retries", 0, "CELERIAC_MAX_RETRIES", OPT_INT, OFF(max_retries), "3", -1,
     1000000, "retries of a retryable LLM failure before FAILURE (-1: no limit)"},
    {"retry-backoff", 0, "CELERIAC_RETRY_BACKOFF", OPT_DBL, OFF(retry_backoff), "1", 0,
     86400, "first retry delay in seconds, doubled (by the factor) each retry"},
    {"retry-backoff-factor", 0, "CELERIAC_RETRY_BACKOFF_FACTOR", OPT_DBL,
     OFF(retry_backoff_factor), "2", 1, 100, "growth factor of the retry delay"},
    {"retry-backoff-max", 0, "CELERIAC_RETRY_BACKOFF_MAX", OPT_DBL,
     OFF(retry_backoff_max), "60", 0, 86400, "cap on the retry delay in seconds"},
    {"retry-jitter", 0, "CELERIAC_RETRY_JITTER", OPT_BOOL, OFF(retry_jitter), "1", 0, 1,
     "full jitter: wait a random time up to the delay"},
    {"time-limit", 0, "CELERIAC_TIME_LIMIT", OPT_DBL, OFF(time_limit), "0", 0, 1e9,
     "hard time limit per task in seconds (0: none)"},
    {"soft-time-limit", 0, "CELERIAC_SOFT_TIME_LIMIT", OPT_DBL, OFF(soft_time_limit), "0",
     0, 1e9, "soft time limit per task in seconds (0: none)"},
    {"dead-letter-exchange", 0, "CELERIAC_DEAD_LETTER_EXCHANGE", OPT_STR,
     OFF(dead_letter_exchange), "celeriac.dlx", 0, 0,
     "topic exchange for tasks that cannot run (\"\": off)"},
    {"dead-letter-queue", 0, "CELERIAC_DEAD_LETTER_QUEUE", OPT_STR,
     OFF(dead_letter_queue), "celeriac.dead", 0, 0,
     "queue bound to the dead-letter exchange with #"},
    {"park-after", 0, "CELERIAC_PARK_AFTER", OPT_DBL, OFF(park_after), "900", 0, 86400,
     "seconds a delivery may stay unacked (long eta, long task) before it is parked in "
     "celeriac.park.<queue> and acked, so RabbitMQ's consumer_timeout never fires (0: "
     "off)"},
    {"task-events", 'E', "CELERIAC_TASK_EVENTS", OPT_BOOL, OFF(task_events), "0", 0, 1,
     "send task events (Flower, celery events)"},
    {"heartbeat-interval", 0, "CELERIAC_HEARTBEAT_INTERVAL", OPT_DBL,
     OFF(event_heartbeat), "2", 0.1, 3600, "seconds between worker-heartbeat events"},
    {"metrics-port", 0, "CELERIAC_METRICS_PORT", OPT_INT, OFF(metrics_port), "0", 0,
     65535, "serve /metrics and /healthz on this port (0: off)"},
    {"metrics-host", 0, "CELERIAC_METRICS_HOST", OPT_STR, OFF(metrics_host), "127.0.0.1",
     0, 0, "address the metrics endpoint listens on"},
    {"statedb", 0, "CELERIAC_STATEDB", OPT_STR, OFF(statedb), "", 0, 0,
     "file that keeps revoked task ids across restarts"},
    {"progress", 0, "CELERIAC_PROGRESS", OPT_STR, OFF(progress), "stream", 0, 0,
     "off, meta (PROGRESS state) or stream (PROGRESS state and a Redis stream)"},
    {"progress-interval", 0, "CELERIAC_PROGRESS_INTERVAL", OPT_INT,
     OFF(progress_interval_ms), "100", 1, 60000, "milliseconds between progress writes"},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static int list_add(struct config_list *l, const char *v, size_t n)
{
    if (l->n >= CONFIG_MAX_LIST)
        return CR_ERANGE;
    l->items[l->n] = cr_strndup(v, n);
    if (!l->items[l->n])
        return CR_ENOMEM;
    l->n++;
    return 0;
}

static void list_clear(struct config_list *l)
{
    for (int i = 0; i < l->n; i++)
        cr_free(l->items[i]);
    l->n = 0;
}

static int parse_bool(const char *v, int *out)
{
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
        !strcasecmp(v, "on")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
        !strcasecmp(v, "off")) {
        *out = 0;
        return 0;
    }
    return CR_EINVAL;
}

/* Applies one value. For lists, `replace` clears the default first (the first
 * time an option is given on the command line or from the environment). */
static int set_opt(struct config *cfg, const struct opt *o, const char *v, int replace,
                   struct cr_err *err)
{
    char *base = (char *)cfg;
    char *end;
    double d;
    long l;

    switch (o->type) {
    case OPT_STR: {
        char **p = (char **)(base + o->offset);
        char *s = cr_strdup(v);
        if (!s)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        cr_free(*p);
        *p = s;
        return 0;
    }
    case OPT_INT:
        errno = 0;
        l = strtol(v, &end, 10);
        if (errno || end == v || *end || l < o->min || l > o->max)
            return cr_err_set(err, CR_EINVAL,
                              "invalid value '%s' for --%s (%.0f to %.0f)", v, o->name,
                              o->min, o->max);
        *(int *)(base + o->offset) = (int)l;
        return 0;
    case OPT_DBL:
        errno = 0;
        d = strtod(v, &end);
        if (errno || end == v || *end || d < o->min || d > o->max)
            return cr_err_set(err, CR_EINVAL, "invalid value '%s' for --%s (%g to %g)", v,
                              o->name, o->min, o->max);
        *(double *)(base + o->offset) = d;
        return 0;
    case OPT_BOOL:
        if (parse_bool(v, (int *)(base + o->offset)))
            return cr_err_set(err, CR_EINVAL,
                              "invalid value '%s' for --%s (true or false)", v, o->name);
        return 0;
    case OPT_LIST: {
        struct config_list *lst = (struct config_list *)(base + o->offset);
        const char *s = v;
        if (replace)
            list_clear(lst);
        /* Queues are comma-separated as in `celery worker -Q a,b`. */
        while (*s) {
            const char *c = strchr(s, ',');
            size_t n = c ? (size_t)(c - s) : strlen(s);
            if (n && list_add(lst, s, n))
                return cr_err_set(err, CR_EINVAL, "too many values for --%s", o->name);
            s += n;
            if (*s == ',')
                s++;
        }
        return 0;
    }
    }
    return CR_EINVAL;
}

static int expand_hostname(struct config *cfg, struct cr_err *err)
{
    char host[256];
    const char *dot;
    struct buf b;
    const char *p;

    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    dot = strchr(host, '.');
    buf_init(&b);
    for (p = cfg->hostname; *p; p++) {
        int rc = 0;
        if (*p == '%' && p[1]) {
            p++;
            if (*p == 'h')
                rc = buf_puts(&b, host);
            else if (*p == 'n')
                rc = buf_append(&b, host, dot ? (size_t)(dot - host) : strlen(host));
            else if (*p == 'd')
                rc = buf_puts(&b, dot ? dot + 1 : "");
            else if (*p == '%')
                rc = buf_putc(&b, '%');
            else
                rc = buf_append(&b, p - 1, 2);
        } else {
            rc = buf_putc(&b, *p);
        }
        if (rc) {
            buf_release(&b);
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        }
    }
    /* Celery prefixes a bare host name with "celery@". */
    if (!strchr(b.data ? b.data : "", '@')) {
        struct buf n;
        buf_init(&n);
        if (buf_printf(&n, "celery@%s", b.data ? b.data : "")) {
            buf_release(&b);
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        }
        buf_release(&b);
        b = n;
    }
    cr_free(cfg->hostname);
    cfg->hostname = buf_detach(&b);
    return cfg->hostname ? 0 : cr_err_set(err, CR_ENOMEM, "out of memory");
}

void config_usage(FILE *out)
{
    fprintf(out,
            "usage: celeriac worker [options]\n\n"
            "Runs a Celery-compatible worker for LLM tasks (llm.generate, llm.chat,\n"
            "llm.embed, celery.accumulate).\n\noptions:\n");
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *o = &opts[i];
        char flag[64];
        if (o->short_flag)
            snprintf(flag, sizeof(flag), "-%c, --%s", o->short_flag, o->name);
        else
            snprintf(flag, sizeof(flag), "    --%s", o->name);
        fprintf(out, "  %-30s %s", flag, o->help);
        if (o->def && *o->def)
            fprintf(out, " [default: %s]", o->def);
        if (o->env)
            fprintf(out, " [env: %s]", o->env);
        fputc('\n', out);
    }
    fprintf(out, "  %-30s %s\n", "-h, --help", "show this help and exit");
}

int config_load(struct config *cfg, int argc, char **argv, struct cr_err *err)
{
    struct option lopts[NOPTS + 2];
    char shorts[2 * NOPTS + 4];
    int given[NOPTS];
    size_t ns = 0;
    int rc, c, idx;

    memset(given, 0, sizeof(given));
    /* Defaults, then environment, then the command line. */
    for (size_t i = 0; i < NOPTS; i++) {
        const char *v = opts[i].def;
        const char *env = opts[i].env ? getenv(opts[i].env) : NULL;
        if (v && (rc = set_opt(cfg, &opts[i], v, 1, err)))
            return rc;
        if (env && *env) {
            if ((rc = set_opt(cfg, &opts[i], env, 1, err)))
                return rc;
        }
    }
    shorts[ns++] = '+';
    shorts[ns++] = 'h';
    for (size_t i = 0; i < NOPTS; i++) {
        lopts[i].name = opts[i].name;
        lopts[i].has_arg =
            opts[i].type == OPT_BOOL ? optional_argument : required_argument;
        lopts[i].flag = NULL;
        lopts[i].val = 1000 + (int)i;
        if (opts[i].short_flag) {
            shorts[ns++] = opts[i].short_flag;
            /* A bool flag (-E) takes no argument, as its long form. */
            if (opts[i].type != OPT_BOOL)
                shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    lopts[NOPTS] = (struct option){"help", no_argument, NULL, 'h'};
    lopts[NOPTS + 1] = (struct option){NULL, 0, NULL, 0};

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, shorts, lopts, &idx)) != -1) {
        size_t i;
        if (c == 'h') {
            config_usage(stdout);
            return 1;
        }
        if (c == '?' || c == ':')
            return cr_err_set(err, CR_EINVAL, "unknown or incomplete option '%s'",
                              argv[optind - 1]);
        if (c >= 1000) {
            i = (size_t)(c - 1000);
        } else {
            for (i = 0; i < NOPTS && opts[i].short_flag != c; i++)
                ;
            if (i == NOPTS)
                return cr_err_set(err, CR_EINVAL, "unknown option '-%c'", c);
        }
        if (opts[i].type == OPT_BOOL && !optarg) {
            int dummy;
            /* "--flag false" as well as "--flag=false" and a bare "--flag". */
            if (optind < argc && parse_bool(argv[optind], &dummy) == 0)
                rc = set_opt(cfg, &opts[i], argv[optind++], 0, err);
            else
                rc = set_opt(cfg, &opts[i], "1", 0, err);
        } else
            rc = set_opt(cfg, &opts[i], optarg, !given[i], err);
        if (rc)
            return rc;
        given[i] = 1;
    }
    if (optind < argc)
        return cr_err_set(err, CR_EINVAL, "unexpected argument '%s'", argv[optind]);
    if (log_level_parse(cfg->loglevel) < 0)
        return cr_err_set(err, CR_EINVAL, "invalid log level '%s'", cfg->loglevel);
    if (cfg->queues.n == 0)
        return cr_err_set(err, CR_EINVAL, "no queue to consume");
    for (int i = 0; i < cfg->aliases.n; i++) {
        const char *eq = strchr(cfg->aliases.items[i], '=');
        if (!eq || eq == cfg->aliases.items[i] || !eq[1])
            return cr_err_set(err, CR_EINVAL,
                              "invalid --task-alias '%s' (want NAME=TASK)",
                              cfg->aliases.items[i]);
    }
    if (strcmp(cfg->progress, "off") && strcmp(cfg->progress, "meta") &&
        strcmp(cfg->progress, "stream"))
        return cr_err_set(err, CR_EINVAL, "invalid --progress '%s' (off, meta or stream)",
                          cfg->progress);
    if (strncmp(cfg->broker, "amqp://", 7) && strncmp(cfg->broker, "pyamqp://", 9))
        return cr_err_set(err, CR_EINVAL, "unsupported broker URL scheme (want amqp://)");
    if (strncmp(cfg->result_backend, "redis://", 8))
        return cr_err_set(err, CR_EINVAL,
                          "unsupported result backend URL scheme (want redis://)");
    return expand_hostname(cfg, err);
}

void config_release(struct config *cfg)
{
    for (size_t i = 0; i < NOPTS; i++) {
        char *base = (char *)cfg;
        if (opts[i].type == OPT_STR) {
            char **p = (char **)(base + opts[i].offset);
            cr_free(*p);
            *p = NULL;
        } else if (opts[i].type == OPT_LIST) {
            list_clear((struct config_list *)(base + opts[i].offset));
        }
    }
}

void config_redact_url(const char *url, char *out, size_t size)
{
    redact_url(url, out, size);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Adds s[0..n) and, when it holds %XX escapes, its percent-decoded form. */
static int add_secret(struct redact *r, const char *s, size_t n)
{
    char dec[512];
    size_t o = 0;
    int rc = redact_add(r, s, n);
    if (rc || !memchr(s, '%', n) || n >= sizeof(dec))
        return rc;
    for (size_t i = 0; i < n; i++) {
        int hi = s[i] == '%' && i + 2 < n ? hexval(s[i + 1]) : -1;
        int lo = hi >= 0 ? hexval(s[i + 2]) : -1;
        if (lo >= 0) {
            dec[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            dec[o++] = s[i];
        }
    }
    return redact_add(r, dec, o);
}

/* The secrets of one URL: see config_secrets(). */
static int add_url_secrets(struct redact *r, const char *url, int user_is_secret,
                           int query_is_secret)
{
    const char *p = strstr(url, "://");
    const char *at, *colon, *q;
    int rc = 0;

    if (!p)
        return 0;
    p += 3;
    /* The last '@', as backend.c reads it: a password may hold an '@'. */
    at = strrchr(p, '@');
    if (at) {
        colon = memchr(p, ':', (size_t)(at - p));
        if (colon)
            rc = add_secret(r, colon + 1, (size_t)(at - colon - 1));
        else if (user_is_secret)
            rc = add_secret(r, p, (size_t)(at - p));
    }
    q = strchr(at ? at : p, '?');
    while (!rc && query_is_secret && q) {
        const char *v = q + 1, *end = v + strcspn(v, "&#");
        const char *eq = memchr(v, '=', (size_t)(end - v));
        if (eq)
            v = eq + 1;
        rc = add_secret(r, v, (size_t)(end - v));
        q = *end == '&' ? end : NULL;
    }
    return rc;
}

int config_secrets(const struct config *cfg, struct redact *r)
{
    int rc = 0;
    if (cfg->llm_api_key && *cfg->llm_api_key)
        rc = add_secret(r, cfg->llm_api_key, strlen(cfg->llm_api_key));
    if (!rc && cfg->broker)
        rc = add_url_secrets(r, cfg->broker, 0, 0);
    if (!rc && cfg->result_backend)
        rc = add_url_secrets(r, cfg->result_backend, 1, 0);
    if (!rc && cfg->llm_base_url)
        rc = add_url_secrets(r, cfg->llm_base_url, 1, 1);
    return rc;
}
