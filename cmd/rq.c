/* rq.c -- `celeriac rq worker [QUEUE...]`: the options, then worker/rq_worker. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "commands.h"
#include "util/alloc.h"
#include "util/log.h"
#include "util/opts.h"
#include "worker/rq_worker.h"

#define OFF(f) offsetof(struct rq_config, f)

static const struct opt rq_opts[] = {
    {"url", 'u', "RQ_REDIS_URL", OPTS_STR, OFF(url), "redis://localhost:6379/0", 0, 0,
     "Redis URL of RQ's database (the db number is RQ's only namespace)", "URL"},
    {"name", 'n', "CELERIAC_RQ_NAME", OPTS_STR, OFF(name), "", 0, 0,
     "worker name (default celeriac-HOST-PID); with -c N each slot is NAME-1..NAME-N",
     "NAME", OPT_HIDE_DEFAULT},
    {"concurrency", 'c', "CELERIAC_CONCURRENCY", OPTS_INT, OFF(concurrency), "10", 1,
     10000, "jobs run at once, each slot registered as one RQ worker"},
    {"task-alias", 0, NULL, OPTS_LIST, OFF(aliases), NULL, 0, 0,
     "MODULE.FUNC=TASK: run RQ jobs of function MODULE.FUNC as built-in TASK "
     "(llm.generate, llm.chat, llm.embed; repeatable)"},
    {"results-ttl", 0, "CELERIAC_RQ_RESULTS_TTL", OPTS_INT, OFF(result_ttl), "500", -1,
     1e9, "seconds a result is kept when the job sets no result_ttl (RQ's default)"},
    {"worker-ttl", 0, "CELERIAC_RQ_WORKER_TTL", OPTS_INT, OFF(worker_ttl), "420", 60, 1e6,
     "RQ's worker TTL: a worker's hash expires this plus 60 s after its last heartbeat"},
    {"job-monitoring-interval", 0, "CELERIAC_RQ_MONITORING_INTERVAL", OPTS_INT,
     OFF(monitoring_interval), "30", 1, 3600,
     "seconds: a running job's started-registry entry is kept this far ahead of now"},
    {"shutdown-timeout", 0, "CELERIAC_SHUTDOWN_TIMEOUT", OPTS_DOUBLE,
     OFF(shutdown_timeout), "600", 0, 86400,
     "seconds a warm shutdown waits for running jobs"},
    {"with-scheduler", 0, "CELERIAC_RQ_WITH_SCHEDULER", OPTS_BOOL, OFF(with_scheduler),
     "1", 0, 1,
     "run RQ's scheduler for the queues (retries with an interval, enqueue_in and "
     "enqueue_at), under RQ's per-queue lock"},
    {"progress-meta", 0, "CELERIAC_RQ_PROGRESS_META", OPTS_BOOL, OFF(progress_meta), "1",
     0, 1,
     "write a running job's text so far into job.meta['progress'] ({text, tokens}); the "
     "job's own meta is kept"},
    {"progress-stream", 0, "CELERIAC_RQ_PROGRESS_STREAM", OPTS_BOOL, OFF(progress_stream),
     "1", 0, 1,
     "write a running job's text to the progress stream celeriac:progress:<job id>, "
     "which the gateway's WebSocket follows"},
    {"progress-interval", 0, "CELERIAC_PROGRESS_INTERVAL", OPTS_INT,
     OFF(progress_interval_ms), "500", 50, 600000,
     "milliseconds between two progress writes of a job"},
    {"rq-protocol", 0, "CELERIAC_RQ_PROTOCOL", OPTS_INT, OFF(protocol), "1", 1, 2,
     "1: RQ 1.13's layout (read by 1.13 and 2.x); 2: RQ 2.x's, with execution records "
     "(job.get_executions()), which 1.13's cleanup cannot read"},
    {"loglevel", 'l', "CELERIAC_LOGLEVEL", OPTS_STR, OFF(base.loglevel), "warning", 0, 0,
     "log level: debug, info, warning, error, critical"},
    {"log-format", 0, "CELERIAC_LOG_FORMAT", OPTS_STR, OFF(base.log_format), "text", 0, 0,
     "text (Celery's lines) or json (one object per line)"},
};
#define NRQ (sizeof(rq_opts) / sizeof(rq_opts[0]))

int cmd_rq(int argc, char **argv)
{
    struct rq_config cfg;
    struct cr_err err;
    struct opt *table;
    const struct opt *llm;
    size_t nllm;
    struct opts_spec spec;
    char **rest;
    int nrest = 0, rc;
    uv_loop_t loop;
    uv_prepare_t log_flusher;
    struct rq_worker *w;
    static const char *const default_queue[] = {"default"};

    /* `celeriac rq worker ...`; `celeriac rq --help-man` for the man page. */
    if (argc >= 2 && !strcmp(argv[1], "worker")) {
        argc--;
        argv++;
    } else if (argc < 2 || strncmp(argv[1], "--help", 6)) {
        fprintf(stderr, "usage: celeriac rq worker [QUEUE...] [options]\n");
        return 2;
    }
    llm = config_llm_opts(&nllm);
    table = cr_calloc(NRQ + nllm, sizeof(*table));
    rest = cr_calloc((size_t)argc + 1, sizeof(*rest));
    if (!table || !rest) {
        cr_free(table);
        cr_free(rest);
        fprintf(stderr, "celeriac rq: out of memory\n");
        return 1;
    }
    memcpy(table, rq_opts, sizeof(rq_opts));
    /* struct config comes first in struct rq_config: its rows' offsets hold. */
    memcpy(table + NRQ, llm, nllm * sizeof(*table));
    memset(&spec, 0, sizeof(spec));
    spec.opts = table;
    spec.n = NRQ + nllm;
    spec.head =
        "usage: celeriac rq worker [QUEUE...] [options]\n\n"
        "Works RQ's job queues (python-rq 1.13's layout) as rq worker does, running\n"
        "jobs mapped to the built-in LLM tasks; queues are popped in the order\n"
        "given (strict priority; default: default). Nothing pickled is ever run.\n"
        "\noptions:\n";
    spec.width = 30;
    spec.help_line = "show this help and exit";
    spec.flags = OPTS_PERMUTE;
    memset(&cfg, 0, sizeof(cfg));
    memset(&err, 0, sizeof(err));
    signal(SIGPIPE, SIG_IGN);
    rc = opts_parse(&spec, &cfg, argc, argv, NULL, rest, &nrest, &err);
    if (rc) {
        opts_release(&spec, &cfg);
        cr_free(table);
        cr_free(rest);
        if (rc == 1)
            return 0;
        fprintf(stderr, "celeriac rq worker: %s\n", err.msg);
        return 2;
    }
    for (int i = 0; i < cfg.aliases.n; i++) {
        const char *eq = strchr(cfg.aliases.items[i], '=');
        if (!eq || eq == cfg.aliases.items[i] || !eq[1]) {
            fprintf(stderr,
                    "celeriac rq worker: invalid --task-alias '%s' (want NAME=TASK)\n",
                    cfg.aliases.items[i]);
            opts_release(&spec, &cfg);
            cr_free(table);
            cr_free(rest);
            return 2;
        }
    }
    rc = log_level_parse(cfg.base.loglevel);
    if (rc < 0) {
        fprintf(stderr, "celeriac rq worker: invalid log level '%s'\n",
                cfg.base.loglevel);
        opts_release(&spec, &cfg);
        cr_free(table);
        cr_free(rest);
        return 2;
    }
    log_threshold = rc;
    if ((rc = log_format_parse(cfg.base.log_format)) < 0) {
        fprintf(stderr, "celeriac rq worker: invalid log format '%s' (text or json)\n",
                cfg.base.log_format);
        opts_release(&spec, &cfg);
        cr_free(table);
        cr_free(rest);
        return 2;
    }
    log_format = rc;
    cfg.queues = nrest ? (const char *const *)rest : default_queue;
    cfg.nqueues = nrest ? nrest : 1;
    /* Its password is a secret to cut out of what is shown. */
    cfg.base.result_backend = cfg.url;
    uv_loop_init(&loop);
    w = rq_worker_new(&cfg, &loop, &err);
    if (!w || rq_worker_start(w, &err)) {
        LOG(LOG_CRITICAL, "%s", err.msg);
        rc = 1;
    } else {
        cmd_log_attach(&loop, &log_flusher);
        rc = rq_worker_run(w);
        cmd_log_detach(&log_flusher);
    }
    rq_worker_free(w);
    uv_loop_close(&loop);
    cfg.base.result_backend = NULL;
    opts_release(&spec, &cfg);
    cr_free(table);
    cr_free(rest);
    return rc;
}
