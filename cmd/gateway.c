/* gateway.c -- `celeriac gateway`: options, start-up and the loop of the HTTP
 * and WebSocket gateway (gw_app.h). */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <uv.h>

#include "gateway/gw_app.h"
#include "commands.h"
#include "util/log.h"
#include "engine/tasks.h"
#include "net/listener.h"
#include "util/alloc.h"
#include "util/opts.h"

#define MAX_LIST 64

struct gw_opts {
    char *broker;
    char *broker_transport_options;
    char *backend;
    char *host;
    long port;
    char *auth_token;
    char *cors_origin;
    long max_body_bytes;
    long header_timeout;
    long max_unauthenticated;
    long max_buffered_bytes;
    char *queues;
    char *tasks;
    char *loglevel;
    char *log_format;
    long redis_timeout;
    long redis_health_check_interval;
};

#define OFF(f) offsetof(struct gw_opts, f)

/* The table is the documentation (scripts/readme-options.py copies the --help
 * it generates into the README). */
static const struct opt opts[] = {
    {"broker", 'b', "CELERY_BROKER_URL", OPTS_STR, OFF(broker),
     "amqp://guest:guest@localhost:5672//", 0, 0,
     "broker URL (amqp://, redis://, sentinel://, sqs://)"},
    {"broker-transport-options", 0, "CELERY_BROKER_TRANSPORT_OPTIONS", OPTS_STR,
     OFF(broker_transport_options), NULL, 0, 0,
     "Redis or SQS broker: Celery's broker_transport_options as JSON (master_name, "
     "global_keyprefix, region, queue_name_prefix, ...)",
     "JSON"},
    {"result-backend", 0, "CELERY_RESULT_BACKEND", OPTS_STR, OFF(backend),
     "redis://localhost:6379/0", 0, 0, "Redis result backend URL"},
    {"redis-timeout", 0, "CELERIAC_REDIS_TIMEOUT", OPTS_LONG, OFF(redis_timeout), "120",
     0, 86400,
     "seconds a Redis command may go unanswered before the connection is rebuilt (0: "
     "none)"},
    {"redis-health-check-interval", 0, "CELERIAC_REDIS_HEALTH_CHECK_INTERVAL", OPTS_LONG,
     OFF(redis_health_check_interval), "25", 0, 86400,
     "seconds an idle Redis connection waits before it is tested (0: never)"},
    {"host", 0, "CELERIAC_GATEWAY_HOST", OPTS_STR, OFF(host), "127.0.0.1", 0, 0,
     "address or name to listen on, and only there (::1, localhost; empty: every "
     "address)"},
    {"port", 'p', "CELERIAC_GATEWAY_PORT", OPTS_LONG, OFF(port), "8080", 0, 65535,
     "port to listen on (0: any free port, printed at start)"},
    {"auth-token", 0, "CELERIAC_AUTH_TOKEN", OPTS_STR, OFF(auth_token), "", 0, 0,
     "require 'Authorization: Bearer TOKEN' (or ?token=TOKEN) on every endpoint but "
     "/healthz"},
    {"cors-origin", 0, "CELERIAC_CORS_ORIGIN", OPTS_STR, OFF(cors_origin), "", 0, 0,
     "allowed cross-origin caller: an origin or * (empty: none)"},
    {"max-body-bytes", 0, "CELERIAC_MAX_BODY_BYTES", OPTS_LONG, OFF(max_body_bytes),
     "1048576", 64, 1 << 30, "largest request body accepted"},
    {"header-timeout", 0, "CELERIAC_HEADER_TIMEOUT", OPTS_LONG, OFF(header_timeout), "10",
     1, 3600, "seconds a connection has to send a whole request head"},
    {"max-unauthenticated", 0, "CELERIAC_MAX_UNAUTHENTICATED", OPTS_LONG,
     OFF(max_unauthenticated), "512", 0, 1000000,
     "connections that have not yet sent an authorized request; past it the oldest "
     "is closed (0: no limit)"},
    {"max-buffered-bytes", 0, "CELERIAC_MAX_BUFFERED_BYTES", OPTS_LONG,
     OFF(max_buffered_bytes), "67108864", 0, 1L << 40,
     "WebSocket output queued over all clients; past it the furthest behind are "
     "closed (1008) and may resume (0: no limit)"},
    {"queues", 'Q', "CELERIAC_QUEUES", OPTS_STR, OFF(queues), "celery", 0, 0,
     "queues clients may send to, comma-separated; the first is the default"},
    {"tasks", 0, "CELERIAC_GATEWAY_TASKS", OPTS_STR, OFF(tasks), "", 0, 0,
     "task names clients may send, comma-separated (empty: the built-ins; *: any)"},
    {"log-format", 0, "CELERIAC_LOG_FORMAT", OPTS_STR, OFF(log_format), "text", 0, 0,
     "text (Celery's lines) or json (one object per line)"},
    {"loglevel", 'l', "CELERIAC_LOGLEVEL", OPTS_STR, OFF(loglevel), "warning", 0, 0,
     "debug, info, warning, error or critical"},
};

static const struct opts_spec spec = {
    .opts = opts,
    .n = sizeof(opts) / sizeof(opts[0]),
    .head = "usage: celeriac gateway [options]\n\n"
            "HTTP and WebSocket gateway: POST /v1/tasks, GET /v1/tasks/{id},\n"
            "WS /v1/tasks/{id}/stream, and a web page at /.\n\noptions:\n",
    .width = 24,
    .help_line = "show this help and exit",
};

/* Returns 0, 1 after --help, or CR_EINVAL / CR_ENOMEM with err set. */
static int parse(struct gw_opts *o, int argc, char **argv, struct cr_err *err)
{
    int rc = opts_parse(&spec, o, argc, argv, NULL, NULL, NULL, err);
    if (rc)
        return rc;
    if (log_level_parse(o->loglevel) < 0)
        return cr_err_set(err, CR_EINVAL, "invalid log level '%s'", o->loglevel);
    if (log_format_parse(o->log_format) < 0)
        return cr_err_set(err, CR_EINVAL, "invalid log format '%s' (text or json)",
                          o->log_format);
    return 0;
}

/* Splits a comma list in place into at most MAX_LIST items. */
static int split(char *s, const char **items)
{
    int n = 0;
    for (char *p = s; p && *p && n < MAX_LIST;) {
        char *c = strchr(p, ',');
        if (c)
            *c = '\0';
        if (*p)
            items[n++] = p;
        p = c ? c + 1 : NULL;
    }
    return n;
}

static void on_signal(uv_signal_t *s, int signum)
{
    (void)signum;
    LOG(LOG_WARNING, "gateway: shutting down");
    uv_stop(s->loop);
}

static void on_closed(uv_handle_t *h)
{
    (void)h;
}

int cmd_gateway(int argc, char **argv)
{
    struct gw_opts o;
    struct gw_app_config cfg;
    struct gw_app *app;
    struct cr_err err;
    const char *queues[MAX_LIST], *tasks[MAX_LIST];
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    uv_prepare_t log_flusher;
    struct rlimit rl;
    char url_host[300];
    int rc;

    memset(&o, 0, sizeof(o));
    memset(&cfg, 0, sizeof(cfg));
    memset(&err, 0, sizeof(err));
    rc = parse(&o, argc, argv, &err);
    if (rc) {
        if (rc < 0)
            fprintf(stderr, "celeriac gateway: %s\n", err.msg);
        opts_release(&spec, &o);
        return rc < 0 ? 2 : 0;
    }
    log_threshold = log_level_parse(o.loglevel);
    log_format = log_format_parse(o.log_format);
    cfg.broker_url = o.broker;
    cfg.broker_transport_options = o.broker_transport_options;
    cfg.backend_url = o.backend;
    cfg.redis_timeout = (double)o.redis_timeout;
    cfg.redis_health_check_interval = (double)o.redis_health_check_interval;
    cfg.host = o.host;
    cfg.port = (int)o.port;
    cfg.auth_token = o.auth_token;
    cfg.cors_origin = o.cors_origin;
    cfg.max_body_bytes = (size_t)o.max_body_bytes;
    cfg.header_timeout = (int)o.header_timeout;
    cfg.max_unauthenticated = (size_t)o.max_unauthenticated;
    cfg.max_buffered_bytes = (size_t)o.max_buffered_bytes;
    cfg.nqueues = split(o.queues, queues);
    cfg.queues = cfg.nqueues ? queues : NULL;
    if (!strcmp(o.tasks, "*")) {
        cfg.tasks = NULL;
    } else if (o.tasks[0]) {
        cfg.ntasks = split(o.tasks, tasks);
        cfg.tasks = tasks;
    } else {
        cfg.tasks = (const char *const *)tasks_builtin_names;
        while (tasks_builtin_names[cfg.ntasks])
            cfg.ntasks++;
    }
    /* A thousand WebSockets need a thousand descriptors. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    uv_loop_init(&loop);
    app = gw_app_new(&loop, &cfg, &err);
    if (!app) {
        LOG(LOG_CRITICAL, "gateway: %s", err.msg);
        uv_run(&loop, UV_RUN_NOWAIT);
        uv_loop_close(&loop);
        opts_release(&spec, &o);
        return 1;
    }
    uv_signal_init(&loop, &sigterm);
    uv_signal_init(&loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    /* Always printed: scripts wait for this line and read the port from it.
     * A name, or "" for every address, is followed by what it stands for. */
    listener_url_host(o.host[0] ? o.host : "0.0.0.0", url_host, sizeof(url_host));
    if (!strcmp(url_host, gw_app_addresses(app)))
        log_write(LOG_INFO, "gateway listening on http://%s:%d/", url_host,
                  gw_app_port(app));
    else
        log_write(LOG_INFO, "gateway listening on http://%s:%d/ (%s)", url_host,
                  gw_app_port(app), gw_app_addresses(app));
    cmd_log_attach(&loop, &log_flusher);
    uv_run(&loop, UV_RUN_DEFAULT);
    cmd_log_detach(&log_flusher);
    uv_close((uv_handle_t *)&sigterm, on_closed);
    uv_close((uv_handle_t *)&sigint, on_closed);
    gw_app_free(app);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    opts_release(&spec, &o);
    return 0;
}
