/* config.c -- option table, command line and environment parsing. */
#include "config.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm/llm_client.h"
#include "net/rmq_url.h"
#include "net/broker.h"
#include "net/redis.h"
#include "net/sqs_url.h"
#include "net/backend.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/opts.h"
#include "util/pct.h"

#define OFF(f) offsetof(struct config, f)

static const struct opt opts[] = {
    {"broker", 'b', "CELERY_BROKER_URL", OPTS_STR, OFF(broker),
     "amqp://guest:guest@localhost:5672//", 0, 0,
     "broker URL (amqp://, redis://, sentinel://, sqs://)"},
    {"broker-transport-options", 0, "CELERY_BROKER_TRANSPORT_OPTIONS", OPTS_STR,
     OFF(broker_transport_options), "", 0, 0,
     "Redis or SQS broker: Celery's broker_transport_options as JSON, e.g. "
     "{\"visibility_timeout\": 3600, \"global_keyprefix\": \"pfx:\"}"},
    {"result-backend", 0, "CELERY_RESULT_BACKEND", OPTS_STR, OFF(result_backend),
     "redis://localhost:6379/0", 0, 0,
     "Redis result backend URL: redis://, rediss:// (with ssl_cert_reqs), "
     "redis+socket:// or sentinel://h1:26379/0;sentinel://h2:26379/0"},
    {"result-backend-transport-options", 0, "CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS",
     OPTS_STR, OFF(result_backend_transport_options), "", 0, 0,
     "JSON object, Celery's result_backend_transport_options: master_name, "
     "sentinel_kwargs, global_keyprefix, socket_timeout, socket_connect_timeout, "
     "health_check_interval, retry_policy (ignored)"},
    {"redis-timeout", 0, "CELERIAC_REDIS_TIMEOUT", OPTS_DOUBLE, OFF(redis_timeout), "120",
     0, 86400,
     "seconds a Redis command may go unanswered before the connection is rebuilt (0: "
     "none)"},
    {"redis-health-check-interval", 0, "CELERIAC_REDIS_HEALTH_CHECK_INTERVAL",
     OPTS_DOUBLE, OFF(redis_health_check_interval), "25", 0, 86400,
     "seconds an idle Redis connection waits before a PING tests it (0: never)"},
    {"limits-redis", 0, "CELERIAC_LIMITS_REDIS", OPTS_STR, OFF(limits_redis), "", 0, 0,
     "Redis where the providers' limits are shared by the fleet: redis://, rediss:// or "
     "redis+socket:// (default: the result backend's)"},
    {"queues", 'Q', "CELERIAC_QUEUES", OPTS_LIST, OFF(queues), "celery", 0, 0,
     "queues to consume, comma-separated (repeatable)"},
    {"default-queue", 0, "CELERIAC_DEFAULT_QUEUE", OPTS_STR, OFF(default_queue), "celery",
     0, 0,
     "queue of a canvas follow-up (callback, chain step, chord body) that names none "
     "(Celery's task_default_queue)"},
    {"task-route", 0, NULL, OPTS_LIST, OFF(task_routes), NULL, 0, 0,
     "PATTERN=QUEUE: a follow-up whose task name matches PATTERN (* and ?) and names "
     "no queue goes to QUEUE; first match wins (repeatable)"},
    {"concurrency", 'c', "CELERIAC_CONCURRENCY", OPTS_INT, OFF(concurrency), "100", 1,
     CONFIG_MAX_CONCURRENCY, "tasks (LLM calls) in flight at once"},
    {"hostname", 'n', "CELERIAC_HOSTNAME", OPTS_STR, OFF(hostname), "celery@%h", 0, 0,
     "node name; %h host, %n name part, %d domain"},
    {"loglevel", 'l', "CELERIAC_LOGLEVEL", OPTS_STR, OFF(loglevel), "warning", 0, 0,
     "debug, info, warning, error or critical"},
    {"log-format", 0, "CELERIAC_LOG_FORMAT", OPTS_STR, OFF(log_format), "text", 0, 0,
     "text (Celery's lines) or json (one object per line)"},
    {"prefetch-multiplier", 0, "CELERIAC_PREFETCH_MULTIPLIER", OPTS_INT,
     OFF(prefetch_multiplier), "4", 1, 1000, "basic.qos = concurrency x this"},
    {"queue-order", 0, "CELERIAC_QUEUE_ORDER", OPTS_STR, OFF(queue_order), "fair", 0, 0,
     "fair (arrival order across -Q queues, as Celery) or strict (an earlier -Q queue "
     "first, with a prefetch window per queue)"},
    {"queue-type", 0, "CELERIAC_QUEUE_TYPE", OPTS_STR, OFF(queue_type), "classic", 0, 0,
     "classic or quorum: how -Q queues are declared (Celery's task_default_queue_type); "
     "quorum consumes with per-consumer QoS"},
    {"broker-failover-strategy", 0, "CELERIAC_BROKER_FAILOVER_STRATEGY", OPTS_STR,
     OFF(broker_failover_strategy), "round-robin", 0, 0,
     "round-robin or shuffle: the order a broker URL list 'amqp://a;amqp://b' is tried "
     "in, on connect and on every reconnect (Celery's broker_failover_strategy)"},
    {"broker-connection-retry-on-startup", 0,
     "CELERIAC_BROKER_CONNECTION_RETRY_ON_STARTUP", OPTS_BOOL,
     OFF(broker_connection_retry_on_startup), "1", 0, 1,
     "retry the broker and the result backend at start-up, a WARNING line per failed "
     "attempt, 2 s more between tries each time up to 30 s (as Celery 5.3+); false: "
     "exit at the first failure"},
    {"broker-connection-max-retries", 0, "CELERIAC_BROKER_CONNECTION_MAX_RETRIES",
     OPTS_INT, OFF(broker_connection_max_retries), "100", 0, 1000000,
     "start-up retries of the broker, and of the result backend, before the worker "
     "gives up and exits 1 (0: retry for ever; as Celery's)"},
    {"delayed-delivery", 0, "CELERIAC_DELAYED_DELIVERY", OPTS_STR, OFF(delayed_delivery),
     "auto", 0, 0,
     "auto, on or off: declare RabbitMQ's native delayed delivery (celery_delayed_*) "
     "and send far etas through it; auto: when QoS is per consumer (quorum)"},
    {"delayed-delivery-horizon", 0, "CELERIAC_DELAYED_DELIVERY_HORIZON", OPTS_DOUBLE,
     OFF(delayed_delivery_horizon), "3", 0, 86400,
     "seconds: an eta further away goes through delayed delivery, a nearer one is held "
     "(with per-consumer QoS, only one under a second away)"},
    {"delivery-limit", 0, "CELERIAC_DELIVERY_LIMIT", OPTS_INT, OFF(delivery_limit), "20",
     0, 1000000,
     "a delivery whose x-delivery-count reaches this minus one is dead-lettered with "
     "FAILURE DeliveryLimitExceeded (0: off)"},
    {"task-alias", 0, NULL, OPTS_LIST, OFF(aliases), NULL, 0, 0,
     "NAME=TASK: run task NAME as built-in TASK (repeatable)"},
    {"acks-early", 0, "CELERIAC_ACKS_EARLY", OPTS_BOOL, OFF(acks_early), "0", 0, 1,
     "ack when a task starts (Celery's default) instead of after its result is stored"},
    {"result-expires", 0, "CELERIAC_RESULT_EXPIRES", OPTS_INT, OFF(result_expires),
     "86400", 0, 1e9, "result TTL in seconds (0: never)"},
    {"result-extended", 0, "CELERIAC_RESULT_EXTENDED", OPTS_BOOL, OFF(result_extended),
     "0", 0, 1, "store name, args, kwargs, worker, retries, queue with results"},
    {"track-started", 0, "CELERIAC_TRACK_STARTED", OPTS_BOOL, OFF(track_started), "0", 0,
     1, "store STARTED when a task starts"},
    {"shutdown-timeout", 0, "CELERIAC_SHUTDOWN_TIMEOUT", OPTS_DOUBLE,
     OFF(shutdown_timeout), "60", 0, 86400,
     "seconds a warm shutdown waits for in-flight tasks"},
    {"heartbeat", 0, "CELERIAC_HEARTBEAT", OPTS_INT, OFF(heartbeat), "60", 0, 3600,
     "AMQP heartbeat in seconds (0: off)"},
    {"llm-base-url", 0, "OPENAI_BASE_URL", OPTS_STR, OFF(llm_base_url),
     "https://api.openai.com/v1", 0, 0, "OpenAI-compatible API base URL"},
    {"llm-api-key", 0, "OPENAI_API_KEY", OPTS_STR, OFF(llm_api_key), "", 0, 0,
     "API key (sent as a bearer token, never logged)"},
    {"llm-header", 0, "CELERIAC_LLM_HEADERS", OPTS_LINES, OFF(llm_headers), NULL, 0, 0,
     "extra header 'Name: value' on every LLM request (repeatable; env: one per line; "
     "values never logged)",
     "HEADER"},
    {"llm-ca-file", 0, "CELERIAC_LLM_CA_FILE", OPTS_STR, OFF(llm_ca_file), "", 0, 0,
     "PEM file of the CAs trusted for an HTTPS base URL (empty: the system's)", "FILE"},
    {"llm-providers", 0, "CELERIAC_LLM_PROVIDERS", OPTS_STR, OFF(llm_providers), "", 0, 0,
     "named LLM providers and model routes with fallbacks: a JSON file, or the JSON "
     "itself (see README, Providers)",
     "FILE"},
    {"llm-http2", 0, "CELERIAC_LLM_HTTP2", OPTS_BOOL, OFF(llm_http2), "0", 0, 1,
     "HTTP/2 over HTTPS: many calls multiplexed on one connection (16 connections "
     "per host unless --llm-max-connections; see README)"},
    {"llm-model", 0, "CELERIAC_MODEL", OPTS_STR, OFF(llm_model), "gpt-4o-mini", 0, 0,
     "default chat model"},
    {"llm-embed-model", 0, "CELERIAC_EMBED_MODEL", OPTS_STR, OFF(llm_embed_model),
     "text-embedding-3-small", 0, 0, "default embedding model"},
    {"llm-connect-timeout", 0, "CELERIAC_LLM_CONNECT_TIMEOUT", OPTS_DOUBLE,
     OFF(llm_connect_timeout), "10", 0.001, 3600, "seconds to connect"},
    {"llm-first-byte-timeout", 0, "CELERIAC_LLM_FIRST_BYTE_TIMEOUT", OPTS_DOUBLE,
     OFF(llm_first_byte_timeout), "120", 0.001, 86400, "seconds to the response headers"},
    {"llm-first-token-timeout", 0, "CELERIAC_LLM_FIRST_TOKEN_TIMEOUT", OPTS_DOUBLE,
     OFF(llm_first_token_timeout), "300", 0.001, 86400, "seconds to the first token"},
    {"llm-idle-timeout", 0, "CELERIAC_LLM_IDLE_TIMEOUT", OPTS_DOUBLE,
     OFF(llm_idle_timeout), "120", 0.001, 86400,
     "longest silence between received bytes, in seconds"},
    {"llm-max-connections", 0, "CELERIAC_LLM_MAX_CONNECTIONS", OPTS_INT,
     OFF(llm_max_connections), "0", 0, 100000,
     "cap on open provider connections (0: none)"},
    {"llm-keep-connections", 0, "CELERIAC_LLM_KEEP_CONNECTIONS", OPTS_INT,
     OFF(llm_keep_connections), "1024", 0, 100000,
     "calls in flight past which a new plain-HTTP connection is not kept"},
    {"max-message-size", 0, "CELERIAC_MAX_MESSAGE_SIZE", OPTS_INT, OFF(max_message_size),
     "10485760", 1024, 1e9, "largest task message body accepted, in bytes"},
    {"max-retries", 0, "CELERIAC_MAX_RETRIES", OPTS_INT, OFF(max_retries), "3", -1,
     1000000, "retries of a retryable LLM failure before FAILURE (-1: no limit)"},
    {"retry-backoff", 0, "CELERIAC_RETRY_BACKOFF", OPTS_DOUBLE, OFF(retry_backoff), "1",
     0, 86400, "first retry delay in seconds, doubled (by the factor) each retry"},
    {"retry-backoff-factor", 0, "CELERIAC_RETRY_BACKOFF_FACTOR", OPTS_DOUBLE,
     OFF(retry_backoff_factor), "2", 1, 100, "growth factor of the retry delay"},
    {"retry-backoff-max", 0, "CELERIAC_RETRY_BACKOFF_MAX", OPTS_DOUBLE,
     OFF(retry_backoff_max), "60", 0, 86400, "cap on the retry delay in seconds"},
    {"retry-jitter", 0, "CELERIAC_RETRY_JITTER", OPTS_BOOL, OFF(retry_jitter), "1", 0, 1,
     "full jitter: wait a random time up to the delay"},
    {"time-limit", 0, "CELERIAC_TIME_LIMIT", OPTS_DOUBLE, OFF(time_limit), "0", 0, 1e9,
     "hard time limit per task in seconds (0: none)"},
    {"soft-time-limit", 0, "CELERIAC_SOFT_TIME_LIMIT", OPTS_DOUBLE, OFF(soft_time_limit),
     "0", 0, 1e9, "soft time limit per task in seconds (0: none)"},
    {"dead-letter-exchange", 0, "CELERIAC_DEAD_LETTER_EXCHANGE", OPTS_STR,
     OFF(dead_letter_exchange), "celeriac.dlx", 0, 0,
     "topic exchange for tasks that cannot run (\"\": off)"},
    {"dead-letter-queue", 0, "CELERIAC_DEAD_LETTER_QUEUE", OPTS_STR,
     OFF(dead_letter_queue), "celeriac.dead", 0, 0,
     "queue bound to the dead-letter exchange with #"},
    {"park-after", 0, "CELERIAC_PARK_AFTER", OPTS_DOUBLE, OFF(park_after), "900", 0,
     86400,
     "seconds a delivery may stay unacked (long eta, long task) before it is parked in "
     "celeriac.park.<queue> and acked, so RabbitMQ's consumer_timeout never fires (0: "
     "off)"},
    {"task-events", 'E', "CELERIAC_TASK_EVENTS", OPTS_BOOL, OFF(task_events), "0", 0, 1,
     "send task events (Flower, celery events)"},
    {"heartbeat-interval", 0, "CELERIAC_HEARTBEAT_INTERVAL", OPTS_DOUBLE,
     OFF(event_heartbeat), "2", 0.1, 3600, "seconds between worker-heartbeat events"},
    {"metrics-port", 0, "CELERIAC_METRICS_PORT", OPTS_INT, OFF(metrics_port), "0", 0,
     65535, "serve /metrics and /healthz on this port (0: off)"},
    {"metrics-host", 0, "CELERIAC_METRICS_HOST", OPTS_STR, OFF(metrics_host), "127.0.0.1",
     0, 0,
     "address or name the metrics endpoint listens on, and only there (empty: every "
     "address)"},
    {"statedb", 0, "CELERIAC_STATEDB", OPTS_STR, OFF(statedb), "", 0, 0,
     "file that keeps revoked task ids across restarts"},
    {"progress", 0, "CELERIAC_PROGRESS", OPTS_STR, OFF(progress), "stream", 0, 0,
     "off, meta (PROGRESS state) or stream (PROGRESS state and a Redis stream)"},
    {"progress-interval", 0, "CELERIAC_PROGRESS_INTERVAL", OPTS_INT,
     OFF(progress_interval_ms), "100", 1, 60000, "milliseconds between progress writes"},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

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

static const struct opts_spec spec = {
    .opts = opts,
    .n = NOPTS,
    .head = "usage: celeriac worker [options]\n\n"
            "Runs a Celery-compatible worker for LLM tasks (llm.generate, llm.chat,\n"
            "llm.embed, celery.accumulate).\n\noptions:\n",
    .width = 30,
    .help_line = "show this help and exit",
};

const struct opt *config_llm_opts(size_t *n)
{
    size_t first = 0, last = 0;
    for (size_t i = 0; i < NOPTS; i++) {
        if (!strcmp(opts[i].name, "llm-base-url"))
            first = i;
        if (!strcmp(opts[i].name, "llm-keep-connections"))
            last = i;
    }
    *n = last >= first ? last - first + 1 : 0;
    return opts + first;
}

void config_usage(FILE *out)
{
    opts_usage(&spec, out);
}

int config_load(struct config *cfg, int argc, char **argv, struct cr_err *err)
{
    int rc = opts_parse(&spec, cfg, argc, argv, NULL, NULL, NULL, err);
    if (rc)
        return rc;
    if (log_level_parse(cfg->loglevel) < 0)
        return cr_err_set(err, CR_EINVAL, "invalid log level '%s'", cfg->loglevel);
    if (log_format_parse(cfg->log_format) < 0)
        return cr_err_set(err, CR_EINVAL, "invalid log format '%s' (text or json)",
                          cfg->log_format);
    if (cfg->queues.n == 0)
        return cr_err_set(err, CR_EINVAL, "no queue to consume");
    for (int i = 0; i < cfg->aliases.n; i++) {
        const char *eq = strchr(cfg->aliases.items[i], '=');
        if (!eq || eq == cfg->aliases.items[i] || !eq[1])
            return cr_err_set(err, CR_EINVAL,
                              "invalid --task-alias '%s' (want NAME=TASK)",
                              cfg->aliases.items[i]);
    }
    if (cfg->llm_headers.n > LLM_MAX_EXTRA_HEADERS)
        return cr_err_set(err, CR_EINVAL, "too many --llm-header values (at most %d)",
                          LLM_MAX_EXTRA_HEADERS);
    for (int i = 0; i < cfg->llm_headers.n; i++)
        if (llm_header_check(cfg->llm_headers.items[i], err))
            return err->code;
    for (int i = 0; i < cfg->task_routes.n; i++) {
        const char *eq = strchr(cfg->task_routes.items[i], '=');
        if (!eq || eq == cfg->task_routes.items[i] || !eq[1])
            return cr_err_set(err, CR_EINVAL,
                              "invalid --task-route '%s' (want PATTERN=QUEUE)",
                              cfg->task_routes.items[i]);
    }
    if (!cfg->default_queue[0])
        return cr_err_set(err, CR_EINVAL, "--default-queue cannot be empty");
    if (strcmp(cfg->progress, "off") && strcmp(cfg->progress, "meta") &&
        strcmp(cfg->progress, "stream"))
        return cr_err_set(err, CR_EINVAL, "invalid --progress '%s' (off, meta or stream)",
                          cfg->progress);
    if (strcmp(cfg->queue_order, "fair") && strcmp(cfg->queue_order, "strict"))
        return cr_err_set(err, CR_EINVAL, "invalid --queue-order '%s' (fair or strict)",
                          cfg->queue_order);
    if (strcmp(cfg->queue_type, "classic") && strcmp(cfg->queue_type, "quorum"))
        return cr_err_set(err, CR_EINVAL, "invalid --queue-type '%s' (classic or quorum)",
                          cfg->queue_type);
    if (strcmp(cfg->delayed_delivery, "auto") && strcmp(cfg->delayed_delivery, "on") &&
        strcmp(cfg->delayed_delivery, "off"))
        return cr_err_set(err, CR_EINVAL,
                          "invalid --delayed-delivery '%s' (auto, on or off)",
                          cfg->delayed_delivery);
    if (strncmp(cfg->broker, "amqp://", 7) && strncmp(cfg->broker, "pyamqp://", 9) &&
        !broker_url_is_redis(cfg->broker) && !broker_url_is_sqs(cfg->broker))
        return cr_err_set(
            err, CR_EINVAL,
            "unsupported broker URL scheme (want amqp://, redis:// or sqs://)");
    if (broker_url_is_sqs(cfg->broker)) {
        /* Parsed with the environment the broker will read, so that a bad
         * option or missing credentials stop the worker here. */
        struct sqs_conf *sc = cr_malloc(sizeof(*sc));
        const char *o = cfg->broker_transport_options;
        int rc;
        if (!sc)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        sqs_conf_init(sc);
        rc = sqs_conf_parse(sc, cfg->broker, o, strlen(o), (const char *const *)environ,
                            err);
        sqs_conf_release(sc);
        cr_free(sc);
        if (rc)
            return err->code;
    } else if (!broker_url_is_redis(cfg->broker)) {
        struct rmq_url_list *l = cr_malloc(sizeof(*l));
        enum rmq_failover f;
        int rc = !l ? cr_err_set(err, CR_ENOMEM, "out of memory")
                    : rmq_url_list_parse(cfg->broker, l, err);
        free(l);
        if (rc || rmq_failover_parse(cfg->broker_failover_strategy, &f, err))
            return err->code;
    }
    if (cfg->broker_transport_options[0] && !broker_url_is_redis(cfg->broker) &&
        !broker_url_is_sqs(cfg->broker))
        return cr_err_set(err, CR_EINVAL,
                          "--broker-transport-options is for a Redis or SQS broker");
    {
        struct redis_url u;
        struct backend_options bo;
        if (redis_url_parse_flags(&u, cfg->result_backend, "result backend",
                                  REDIS_URL_TLS_STRICT, err) ||
            backend_options_parse(&bo, cfg->result_backend_transport_options, err))
            return err->code;
        if (u.kind == REDIS_URL_SENTINEL && !bo.master_name[0])
            return cr_err_set(err, CR_EINVAL,
                              "result backend sentinel:// needs master_name in "
                              "--result-backend-transport-options");
    }
    if (cfg->limits_redis && cfg->limits_redis[0]) {
        struct redis_url u;
        if (redis_url_parse_flags(&u, cfg->limits_redis, "limits Redis",
                                  REDIS_URL_TLS_STRICT, err))
            return err->code;
        /* One Redis is named, not a set of sentinels (no options to name
         * their master here). */
        if (u.kind == REDIS_URL_SENTINEL)
            return cr_err_set(err, CR_EINVAL,
                              "--limits-redis takes redis://, rediss:// or "
                              "redis+socket://, not sentinel://");
    }
    return expand_hostname(cfg, err);
}

void config_release(struct config *cfg)
{
    opts_release(&spec, cfg);
}

void config_redact_url(const char *url, char *out, size_t size)
{
    redact_url(url, out, size);
}

/* Adds s[0..n) and, when it holds %XX escapes, its percent-decoded form. */
static int add_secret(struct redact *r, const char *s, size_t n)
{
    char dec[512];
    size_t o;
    int rc = redact_add(r, s, n);
    if (rc || !memchr(s, '%', n) || n >= sizeof(dec))
        return rc;
    /* never cut: the decoded form is no longer than s */
    (void)pct_decode(dec, sizeof(dec), s, n, 0, &o);
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
    /* Extra headers often carry a gateway key: every value is a secret. */
    for (int i = 0; !rc && i < cfg->llm_headers.n; i++) {
        const char *v = strchr(cfg->llm_headers.items[i], ':');
        v = v ? v + 1 : "";
        v += strspn(v, " \t");
        rc = redact_add_str(r, v);
    }
    /* redis://secret@host: a Redis URL's user part may be a password. A
     * failover list (amqp://a;amqp://b, sentinel://a;sentinel://b) URL by URL. */
    for (const char *u = cfg->broker; !rc && u && *u;) {
        size_t n = strcspn(u, ";");
        char *one = cr_strndup(u, n);
        rc = one ? add_url_secrets(r, one, broker_url_is_redis(cfg->broker), 0)
                 : CR_ENOMEM;
        free(one);
        u += n + (u[n] == ';');
    }
    if (!rc && cfg->result_backend)
        rc = add_url_secrets(r, cfg->result_backend, 1, 0);
    if (!rc && cfg->result_backend) {
        /* What the URL parser finds (a password=... of redis+socket://),
         * and the sentinels' password of the transport options. */
        struct redis_url u;
        struct backend_options bo;
        struct cr_err e;
        if (!redis_url_parse(&u, cfg->result_backend, "result backend", &e) &&
            u.password[0])
            rc = add_secret(r, u.password, strlen(u.password));
        if (!rc &&
            !backend_options_parse(&bo, cfg->result_backend_transport_options, &e) &&
            bo.sentinel_password[0])
            rc = add_secret(r, bo.sentinel_password, strlen(bo.sentinel_password));
    }
    if (!rc && cfg->limits_redis && cfg->limits_redis[0]) {
        struct redis_url u;
        struct cr_err e;
        rc = add_url_secrets(r, cfg->limits_redis, 1, 0);
        if (!rc && !redis_url_parse(&u, cfg->limits_redis, "limits Redis", &e) &&
            u.password[0])
            rc = add_secret(r, u.password, strlen(u.password));
    }
    if (!rc && cfg->llm_base_url)
        rc = add_url_secrets(r, cfg->llm_base_url, 1, 1);
    return rc;
}
