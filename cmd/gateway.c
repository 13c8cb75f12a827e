/* gateway.c -- `celeriac gateway`: options, start-up and the loop of the HTTP
 * and WebSocket gateway (gw_app.h). */
#include <errno.h>
#include <getopt.h>
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
#include "util/alloc.h"

#define MAX_LIST 64

struct gw_opts {
    char *broker;
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
    long redis_timeout;
    long redis_health_check_interval;
};

enum opt_type { OPT_STR, OPT_INT };

/* The table is the documentation (see also worker/config.c). */
static const struct gw_opt {
    const char *name;
    char short_flag;
    const char *env;
    enum opt_type type;
    size_t offset;
    const char *def;
    long min, max;
    const char *help;
} opts[] = {
    {"broker", 'b', "CELERY_BROKER_URL", OPT_STR, offsetof(struct gw_opts, broker),
     "amqp://guest:guest@localhost:5672//", 0, 0, "AMQP broker URL"},
    {"result-backend", 0, "CELERY_RESULT_BACKEND", OPT_STR,
     offsetof(struct gw_opts, backend), "redis://localhost:6379/0", 0, 0,
     "Redis result backend URL"},
    {"redis-timeout", 0, "CELERIAC_REDIS_TIMEOUT", OPT_INT,
     offsetof(struct gw_opts, redis_timeout), "120", 0, 86400,
     "seconds a Redis command may go unanswered before the connection is rebuilt (0: "
     "none)"},
    {"redis-health-check-interval", 0, "CELERIAC_REDIS_HEALTH_CHECK_INTERVAL", OPT_INT,
     offsetof(struct gw_opts, redis_health_check_interval), "25", 0, 86400,
     "seconds an idle Redis connection waits before it is tested (0: never)"},
    {"host", 0, "CELERIAC_GATEWAY_HOST", OPT_STR, offsetof(struct gw_opts, host),
     "127.0.0.1", 0, 0, "address to listen on"},
    {"port", 'p', "CELERIAC_GATEWAY_PORT", OPT_INT, offsetof(struct gw_opts, port),
     "8080", 0, 65535, "port to listen on (0: any free port, printed at start)"},
    {"auth-token", 0, "CELERIAC_AUTH_TOKEN", OPT_STR,
     offsetof(struct gw_opts, auth_token), "", 0, 0,
     "require 'Authorization: Bearer TOKEN' (or ?token=TOKEN) on every endpoint but "
     "/healthz"},
    {"cors-origin", 0, "CELERIAC_CORS_ORIGIN", OPT_STR,
     offsetof(struct gw_opts, cors_origin), "", 0, 0,
     "allowed cross-origin caller: an origin or * (empty: none)"},
    {"max-body-bytes", 0, "CELERIAC_MAX_BODY_BYTES", OPT_INT,
     offsetof(struct gw_opts, max_body_bytes), "1048576", 64, 1 << 30,
     "largest request body accepted"},
    {"header-timeout", 0, "CELERIAC_HEADER_TIMEOUT", OPT_INT,
     offsetof(struct gw_opts, header_timeout), "10", 1, 3600,
     "seconds a connection has to send a whole request head"},
    {"max-unauthenticated", 0, "CELERIAC_MAX_UNAUTHENTICATED", OPT_INT,
     offsetof(struct gw_opts, max_unauthenticated), "512", 0, 1000000,
     "connections that have not yet sent an authorized request; past it the oldest "
     "is closed (0: no limit)"},
    {"max-buffered-bytes", 0, "CELERIAC_MAX_BUFFERED_BYTES", OPT_INT,
     offsetof(struct gw_opts, max_buffered_bytes), "67108864", 0, 1L << 40,
     "WebSocket output queued over all clients; past it the furthest behind are "
     "closed (1008) and may resume (0: no limit)"},
    {"queues", 'Q', "CELERIAC_QUEUES", OPT_STR, offsetof(struct gw_opts, queues),
     "celery", 0, 0,
     "queues clients may send to, comma-separated; the first is the default"},
    {"tasks", 0, "CELERIAC_GATEWAY_TASKS", OPT_STR, offsetof(struct gw_opts, tasks), "",
     0, 0, "task names clients may send, comma-separated (empty: the built-ins; *: any)"},
    {"loglevel", 'l', "CELERIAC_LOGLEVEL", OPT_STR, offsetof(struct gw_opts, loglevel),
     "info", 0, 0, "debug, info, warning, error or critical"},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static void usage(FILE *out)
{
    fprintf(out, "usage: celeriac gateway [options]\n\n"
                 "HTTP and WebSocket gateway: POST /v1/tasks, GET /v1/tasks/{id},\n"
                 "WS /v1/tasks/{id}/stream, and a web page at /.\n\noptions:\n");
    for (size_t i = 0; i < NOPTS; i++) {
        char flag[64];
        if (opts[i].short_flag)
            snprintf(flag, sizeof(flag), "-%c, --%s", opts[i].short_flag, opts[i].name);
        else
            snprintf(flag, sizeof(flag), "    --%s", opts[i].name);
        fprintf(out, "  %-24s %s", flag, opts[i].help);
        if (opts[i].def && *opts[i].def)
            fprintf(out, " [default: %s]", opts[i].def);
        fprintf(out, " [env: %s]\n", opts[i].env);
    }
    fprintf(out, "  %-24s %s\n", "-h, --help", "show this help and exit");
}

static int set_opt(struct gw_opts *o, const struct gw_opt *d, const char *v, char *err,
                   size_t errlen)
{
    char *base = (char *)o;
    if (d->type == OPT_STR) {
        char **p = (char **)(base + d->offset);
        char *s = cr_strdup(v);
        if (!s) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        cr_free(*p);
        *p = s;
    } else {
        char *end;
        long n;
        errno = 0;
        n = strtol(v, &end, 10);
        if (errno || end == v || *end || n < d->min || n > d->max) {
            snprintf(err, errlen, "invalid value '%s' for --%s (%ld to %ld)", v, d->name,
                     d->min, d->max);
            return -1;
        }
        *(long *)(base + d->offset) = n;
    }
    return 0;
}

static void opts_release(struct gw_opts *o)
{
    for (size_t i = 0; i < NOPTS; i++)
        if (opts[i].type == OPT_STR) {
            char **p = (char **)((char *)o + opts[i].offset);
            cr_free(*p);
            *p = NULL;
        }
}

/* Returns 0, 1 after --help, or -1 with err set. */
static int parse(struct gw_opts *o, int argc, char **argv, char *err, size_t errlen)
{
    struct option lopts[NOPTS + 2];
    char shorts[2 * NOPTS + 4];
    size_t ns = 0;
    int c, idx;

    for (size_t i = 0; i < NOPTS; i++) {
        const char *env = getenv(opts[i].env);
        if (set_opt(o, &opts[i], env && *env ? env : opts[i].def, err, errlen))
            return -1;
    }
    shorts[ns++] = '+';
    shorts[ns++] = 'h';
    for (size_t i = 0; i < NOPTS; i++) {
        lopts[i] = (struct option){opts[i].name, required_argument, NULL, 1000 + (int)i};
        if (opts[i].short_flag) {
            shorts[ns++] = opts[i].short_flag;
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
            usage(stdout);
            return 1;
        }
        if (c == '?' || c == ':') {
            snprintf(err, errlen, "unknown or incomplete option '%s'", argv[optind - 1]);
            return -1;
        }
        if (c >= 1000)
            i = (size_t)(c - 1000);
        else
            for (i = 0; i < NOPTS && opts[i].short_flag != c; i++)
                ;
        if (i == NOPTS || set_opt(o, &opts[i], optarg, err, errlen)) {
            if (i == NOPTS)
                snprintf(err, errlen, "unknown option '-%c'", c);
            return -1;
        }
    }
    if (optind < argc) {
        snprintf(err, errlen, "unexpected argument '%s'", argv[optind]);
        return -1;
    }
    if (log_level_parse(o->loglevel) < 0) {
        snprintf(err, errlen, "invalid log level '%s'", o->loglevel);
        return -1;
    }
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
    char msg[300];
    uv_loop_t loop;
    uv_signal_t sigterm, sigint;
    struct rlimit rl;
    int rc;

    memset(&o, 0, sizeof(o));
    memset(&cfg, 0, sizeof(cfg));
    memset(&err, 0, sizeof(err));
    rc = parse(&o, argc, argv, msg, sizeof(msg));
    if (rc) {
        if (rc < 0)
            fprintf(stderr, "celeriac gateway: %s\n", msg);
        opts_release(&o);
        return rc < 0 ? 2 : 0;
    }
    log_threshold = log_level_parse(o.loglevel);
    cfg.broker_url = o.broker;
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
        opts_release(&o);
        return 1;
    }
    uv_signal_init(&loop, &sigterm);
    uv_signal_init(&loop, &sigint);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_signal_start(&sigint, on_signal, SIGINT);
    /* Always printed: scripts wait for this line and read the port from it. */
    log_write(LOG_INFO, "gateway listening on http://%s:%d/", o.host, gw_app_port(app));
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&sigterm, on_closed);
    uv_close((uv_handle_t *)&sigint, on_closed);
    gw_app_free(app);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    opts_release(&o);
    return 0;
}
