/* config.h -- the worker's one configuration, filled from a table of options.
 *
 * The table in config.c is the documentation: each option has a long name, an
 * optional short flag, an environment variable, a kind, bounds and a default
 * (util/opts.h parses it). config_load() validates everything up front;
 * afterwards the config is const. */
#ifndef CR_CONFIG_H
#define CR_CONFIG_H

#include <stdio.h>

#include "util/err.h"
#include "util/opts.h"
#include "util/redact.h"

#define CONFIG_MAX_LIST OPTS_MAX_LIST
/* The largest --concurrency, also the cap of pool_grow. */
#define CONFIG_MAX_CONCURRENCY 100000

struct config {
    char *broker; /* AMQP or Redis URL */
    /* Redis broker: Celery's broker_transport_options as a JSON object
     * (visibility_timeout, priority_steps, global_keyprefix...); "": none */
    char *broker_transport_options;
    char *result_backend; /* redis:// URL */
    double redis_timeout; /* seconds a Redis command may go unanswered; 0: none */
    double redis_health_check_interval; /* seconds idle before a PING; 0: never */
    /* Celery's result_backend_transport_options, JSON ("": none); checked by
     * config_validate() with backend_options_parse(). */
    char *result_backend_transport_options;
    /* Redis of the providers' shared limits (redis://, rediss://,
     * redis+socket://); "" or NULL: the result backend's. */
    char *limits_redis;
    struct opts_list queues;
    char *default_queue;          /* where a follow-up without a route goes */
    struct opts_list task_routes; /* PATTERN=QUEUE, for follow-ups */
    int concurrency;
    char *hostname; /* expanded nodename, e.g. celery@host */
    char *loglevel;
    char *log_format; /* text or json (util/log.h) */
    int prefetch_multiplier;
    char *queue_order;              /* "fair" or "strict" (see enum engine_queue_order) */
    char *queue_type;               /* "classic" or "quorum" */
    char *broker_failover_strategy; /* "round-robin" or "shuffle" */
    /* Celery's broker_connection_retry_on_startup and
     * broker_connection_max_retries (0: no bound): the broker and the result
     * backend at start-up (util/startup_retry.h). */
    int broker_connection_retry_on_startup;
    int broker_connection_max_retries;
    char *delayed_delivery;          /* "auto", "on" or "off" */
    double delayed_delivery_horizon; /* seconds an eta may be held here */
    int delivery_limit;              /* x-delivery-count bound; 0: none */
    struct opts_list aliases;        /* NAME=TASK */
    int acks_early;
    int result_expires; /* seconds; 0 = never expire */
    int result_extended;
    int track_started;
    double shutdown_timeout; /* seconds */
    int heartbeat;           /* AMQP heartbeat seconds; 0 disables */
    char *llm_base_url;
    char *llm_api_key;
    struct opts_list llm_headers; /* "Name: value" extra request headers */
    int llm_http2;                /* multiplex calls over HTTPS */
    char *llm_ca_file;            /* "": the system's CA store */
    char *llm_providers;          /* providers document: a file, or inline JSON */
    char *llm_model;
    char *llm_embed_model;
    double llm_connect_timeout;
    double llm_first_byte_timeout;
    double llm_first_token_timeout;
    double llm_idle_timeout;
    int llm_max_connections;
    int llm_keep_connections;
    int max_message_size; /* bytes */
    int max_retries;      /* per task; -1: no limit */
    double retry_backoff; /* base seconds */
    double retry_backoff_factor;
    double retry_backoff_max; /* seconds */
    int retry_jitter;
    double time_limit;          /* hard, seconds; 0: none */
    double soft_time_limit;     /* seconds; 0: none */
    char *dead_letter_exchange; /* "" disables dead-lettering */
    char *dead_letter_queue;
    double park_after; /* seconds an unacked delivery may be held; 0: never park */
    /* monitoring (issue 4) */
    int task_events;        /* -E: send task events */
    double event_heartbeat; /* worker-heartbeat interval, seconds */
    int metrics_port;       /* 0: no metrics endpoint */
    char *metrics_host;
    char *statedb; /* "" : revoked ids are not persisted */
    /* progress (issue 5) */
    char *progress;           /* off, meta or stream */
    int progress_interval_ms; /* batching window for progress writes */
};

/* Parses argv (after the subcommand) and the environment into cfg, applying
 * defaults. Returns 0, 1 when --help was printed (caller exits 0), or
 * CR_EINVAL with a one-line reason in err. cfg must be zeroed; free with
 * config_release(). */
int config_load(struct config *cfg, int argc, char **argv, struct cr_err *err);
void config_release(struct config *cfg);
/* Writes --help text, generated from the table. */
void config_usage(FILE *out);

/* The rows of the option table that configure the LLM client and its
 * providers (--llm-base-url ... --llm-keep-connections), contiguous, *n of
 * them; their offsets are into struct config. For another command that runs
 * the built-in tasks with the same options (celeriac rq worker embeds a
 * struct config first in its own). */
const struct opt *config_llm_opts(size_t *n);

/* Adds every secret the configuration holds to r, to be cut out of any text
 * that leaves the worker (see util/redact.h): the LLM API key; the password
 * of the broker, result backend and LLM base URLs (a user name alone too,
 * except in the broker URL: redis://secret@host and https://token@proxy put a
 * secret there); and every query value of the LLM base URL (a key may ride
 * there). Each as written and, when it holds %XX escapes, decoded. Returns 0,
 * CR_ENOMEM or CR_ERANGE (more secrets than a set holds). */
int config_secrets(const struct config *cfg, struct redact *r);

/* redact_url() (util/redact.h) under its old name, for the worker's callers. */
void config_redact_url(const char *url, char *out, size_t size);

#endif
