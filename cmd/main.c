/* main.c -- the celeriac command: subcommands and process exit codes. */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <curl/curl.h>
#include <uv.h>

#include "commands.h"
#include "worker/config.h"
#include "util/log.h"
#include "worker/worker.h"
#include "util/alloc.h"
#include "util/version.h"

static const struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"worker", cmd_worker, "run a Celery-compatible worker for LLM tasks"},
    {"gateway", cmd_gateway, "HTTP and WebSocket gateway: submit tasks, stream progress"},
    {"dlq", cmd_dlq, "list, show, replay or purge dead-lettered tasks"},
    {"top", cmd_top, "live terminal view of workers"},
    {"rq", cmd_rq, "rq worker: run RQ (python-rq) jobs as built-in LLM tasks"},
};

/* The whole command line, for the re-exec of a SIGHUP restart. */
static char **main_argv;

static void usage(FILE *out)
{
    fprintf(out, "usage: celeriac <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\nRun 'celeriac <command> --help' for the options of a command.\n");
}

/* `celeriac help-man [COMMAND]`: the man page of celeriac(1), or of
 * celeriac-COMMAND(1) whose body the command's own option parser writes from
 * its table (the hidden --help-man of opts_parse), so a page cannot drift from
 * --help. Not listed in usage: the build runs it (scripts/gen-man.sh). */
static int help_man(int argc, char **argv)
{
    const size_t n = sizeof(commands) / sizeof(commands[0]);
    char upper[32], flag[] = "--help-man";
    size_t i, k;

    if (argc < 2) {
        printf(".TH CELERIAC 1 \"\" \"celeriac %s\" \"celeriac\"\n"
               ".SH NAME\nceleriac \\- native Celery worker for LLM jobs\n"
               ".SH SYNOPSIS\n\\fBceleriac\\fR \\fICOMMAND\\fR [options]\n"
               ".SH DESCRIPTION\n"
               "A worker in C that speaks Celery's message protocol on RabbitMQ or "
               "Redis and runs LLM tasks, with the tools around it.\n"
               ".SH COMMANDS\n",
               CELERIAC_VERSION);
        for (i = 0; i < n; i++)
            printf(".TP\n\\fB%s\\fR\n%s; see \\fBceleriac\\-%s\\fR(1)\n",
                   commands[i].name, commands[i].help, commands[i].name);
        printf(".SH SEE ALSO\n");
        for (i = 0; i < n; i++)
            printf("\\fBceleriac\\-%s\\fR(1)%s\n", commands[i].name,
                   i + 1 < n ? "," : "");
        return 0;
    }
    for (i = 0; i < n && strcmp(argv[1], commands[i].name); i++)
        ;
    if (i == n) {
        fprintf(stderr, "celeriac help-man: unknown command '%s'\n", argv[1]);
        return 2;
    }
    for (k = 0; commands[i].name[k] && k + 1 < sizeof(upper); k++)
        upper[k] = (char)toupper((unsigned char)commands[i].name[k]);
    upper[k] = '\0';
    printf(".TH CELERIAC\\-%s 1 \"\" \"celeriac %s\" \"celeriac\"\n"
           ".SH NAME\nceleriac\\-%s \\- %s\n",
           upper, CELERIAC_VERSION, commands[i].name, commands[i].help);
    fflush(stdout);
    if (commands[i].fn(2, (char *[]){argv[1], flag, NULL}))
        return 1;
    printf(".SH SEE ALSO\n\\fBceleriac\\fR(1)\n");
    return 0;
}

int cmd_worker(int argc, char **argv)
{
    struct config cfg;
    struct cr_err err;
    struct worker *w;
    uv_loop_t loop;
    uv_prepare_t log_flusher;
    int rc, restart;

    /* hiredis writes with write(): were the Redis end gone, SIGPIPE would kill
     * the worker before hiredis could see EPIPE and reconnect. Python ignores
     * it too, so a Celery worker never dies of it. (libcurl and rabbitmq-c
     * send with MSG_NOSIGNAL.) */
    signal(SIGPIPE, SIG_IGN);
    memset(&cfg, 0, sizeof(cfg));
    memset(&err, 0, sizeof(err));
    rc = config_load(&cfg, argc, argv, &err);
    if (rc) {
        config_release(&cfg);
        if (rc == 1)
            return 0;
        fprintf(stderr, "celeriac worker: %s\n", err.msg);
        return 2;
    }
    log_threshold = log_level_parse(cfg.loglevel);
    log_format = log_format_parse(cfg.log_format);
    log_set_worker(cfg.hostname);
    uv_loop_init(&loop);
    w = worker_new(&cfg, &loop, &err);
    if (!w || worker_start(w, &err)) {
        LOG(LOG_CRITICAL, "%s", err.msg);
        worker_free(w);
        uv_loop_close(&loop);
        config_release(&cfg);
        return 1;
    }
    cmd_log_attach(&loop, &log_flusher);
    rc = worker_run(w);
    restart = worker_restart_asked(w);
    /* Before worker_free(), whose last loop run completes the close. */
    cmd_log_detach(&log_flusher);
    worker_free(w);
    uv_loop_close(&loop);
    config_release(&cfg);
    if (restart) {
        /* Everything is closed (the metrics port too), so the new image binds
         * and connects as a fresh start would; the pid stays, which systemd's
         * MAINPID and a pidfile both want. /proc/self/exe, not argv[0]: the
         * binary we run, wherever PATH would lead. */
        fflush(NULL);
        execv("/proc/self/exe", main_argv);
        LOG(LOG_CRITICAL, "restart: exec of /proc/self/exe failed: %s", strerror(errno));
        return 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    int rc;
    cr_alloc_init();
    main_argv = argv;
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = -1;
    if (!strcmp(argv[1], "help-man"))
        rc = help_man(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            rc = commands[i].fn(argc - 1, argv + 1);
    if (rc == -1) {
        fprintf(stderr, "celeriac: unknown command '%s'\n", argv[1]);
        usage(stderr);
        rc = 2;
    }
    curl_global_cleanup();
    return rc;
}
