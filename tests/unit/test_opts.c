/* test_opts.c -- util/opts (the option-table parser) and the worker's table on it. */
#include <check.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/err.h"
#include "util/opts.h"
#include "worker/config.h"

struct t {
    char *s;
    int i;
    long l;
    double d;
    int b;
    int f;
    struct opts_list q;
    char *nodef;
};

#define OFF(f) offsetof(struct t, f)

static const struct opt topts[] = {
    {"str", 's', "T_STR", OPTS_STR, OFF(s), "dflt", 0, 0, "a string"},
    {"int", 'i', "T_INT", OPTS_INT, OFF(i), "5", 1, 10, "an int"},
    {"long", 0, "T_LONG", OPTS_LONG, OFF(l), "0", 0, 1099511627776.0, "a long"},
    {"dbl", 0, "T_DBL", OPTS_DOUBLE, OFF(d), "0.5", 0.1, 2, "a double"},
    {"bool", 'B', "T_BOOL", OPTS_BOOL, OFF(b), "0", 0, 1, "a bool"},
    {"flag", 'F', NULL, OPTS_FLAG, OFF(f), NULL, 0, 0, "a flag"},
    {"queues", 'Q', "T_Q", OPTS_LIST, OFF(q), "celery", 0, 0, "a list"},
    {"nodef", 0, NULL, OPTS_STR, OFF(nodef), NULL, 0, 0, "no default", "X", OPT_HIDE_ENV},
    {"hidden", 0, "T_HIDDEN", OPTS_STR, OFF(nodef), "h", 0, 0, "hidden default", NULL,
     OPT_HIDE_DEFAULT},
};

static const struct opts_spec tspec = {
    .opts = topts,
    .n = sizeof(topts) / sizeof(topts[0]),
    .head = "usage: t [options]\n\noptions:\n",
    .width = 16,
    .help_line = "show this help and exit",
};

static const struct opts_spec tspec_permute = {
    .opts = topts,
    .n = sizeof(topts) / sizeof(topts[0]),
    .head = "",
    .width = 16,
    .bad_option = "unknown option '%s'",
    .flags = OPTS_PERMUTE,
};

/* Parses a NULL-terminated argument list (argv[0] added) with envp. */
static int parse(const struct opts_spec *spec, struct t *t, char **envp,
                 struct cr_err *err, char **rest, int *nrest, ...)
{
    char *argv[32];
    int argc = 0;
    va_list ap;
    char *a;

    argv[argc++] = (char *)"t";
    va_start(ap, nrest);
    while ((a = va_arg(ap, char *)) && argc < 31)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    memset(t, 0, sizeof(*t));
    memset(err, 0, sizeof(*err));
    return opts_parse(spec, t, argc, argv, envp, rest, nrest, err);
}

#define P(t, envp, err, ...)                                                             \
    parse(&tspec, (t), (envp), (err), NULL, NULL, __VA_ARGS__, NULL)

static char *noenv[] = {NULL};

START_TEST(test_defaults)
{
    struct t t;
    struct cr_err err;
    ck_assert_int_eq(P(&t, noenv, &err, NULL), 0);
    ck_assert_str_eq(t.s, "dflt");
    ck_assert_int_eq(t.i, 5);
    ck_assert_int_eq(t.l, 0);
    ck_assert(t.d == 0.5);
    ck_assert_int_eq(t.b, 0);
    ck_assert_int_eq(t.f, 0);
    ck_assert_int_eq(t.q.n, 1);
    ck_assert_str_eq(t.q.items[0], "celery");
    /* "hidden" shares the field and comes later: its default wins. */
    ck_assert_str_eq(t.nodef, "h");
    opts_release(&tspec, &t);
    ck_assert_ptr_null(t.s);
    ck_assert_int_eq(t.q.n, 0);
}
END_TEST

START_TEST(test_every_kind)
{
    struct t t;
    struct cr_err err;
    ck_assert_int_eq(P(&t, noenv, &err, "--str", "x", "--int=7", "--long",
                       "1099511627776", "--dbl", "1.25", "--bool", "--flag", "-Q", "a,b",
                       "--queues", "c", "--nodef=y"),
                     0);
    ck_assert_str_eq(t.s, "x");
    ck_assert_int_eq(t.i, 7);
    ck_assert(t.l == 1099511627776L);
    ck_assert(t.d == 1.25);
    ck_assert_int_eq(t.b, 1);
    ck_assert_int_eq(t.f, 1);
    ck_assert_int_eq(t.q.n, 3);
    ck_assert_str_eq(t.q.items[0], "a");
    ck_assert_str_eq(t.q.items[2], "c");
    ck_assert_str_eq(t.nodef, "y");
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_short_forms)
{
    struct t t;
    struct cr_err err;
    /* a cluster, a glued value, a bool letter followed by a bool word */
    ck_assert_int_eq(P(&t, noenv, &err, "-FBi3", "-sv", "-B", "false"), 0);
    ck_assert_int_eq(t.f, 1);
    ck_assert_int_eq(t.i, 3);
    ck_assert_str_eq(t.s, "v");
    ck_assert_int_eq(t.b, 0);
    opts_release(&tspec, &t);
    /* a value may start with '-' */
    ck_assert_int_eq(P(&t, noenv, &err, "-s", "-x", "--nodef", "--flag"), 0);
    ck_assert_str_eq(t.s, "-x");
    ck_assert_str_eq(t.nodef, "--flag");
    ck_assert_int_eq(t.f, 0);
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_bool_words)
{
    static const char *const yes[] = {"1", "true", "YES", "On"};
    static const char *const no[] = {"0", "False", "no", "OFF"};
    struct t t;
    struct cr_err err;
    char arg[32];
    for (size_t i = 0; i < 4; i++) {
        snprintf(arg, sizeof(arg), "--bool=%s", yes[i]);
        ck_assert_int_eq(P(&t, noenv, &err, arg), 0);
        ck_assert_int_eq(t.b, 1);
        opts_release(&tspec, &t);
        ck_assert_int_eq(P(&t, noenv, &err, "--bool", "--bool", no[i]), 0);
        ck_assert_int_eq(t.b, 0);
        opts_release(&tspec, &t);
    }
    /* a bare bool before a word that is not one leaves the word alone */
    ck_assert_int_eq(P(&t, noenv, &err, "--bool", "maybe"), CR_EINVAL);
    ck_assert_str_eq(err.msg, "unexpected argument 'maybe'");
    opts_release(&tspec, &t);
    ck_assert_int_eq(P(&t, noenv, &err, "--bool=maybe"), CR_EINVAL);
    ck_assert_str_eq(err.msg, "invalid value 'maybe' for --bool (true or false)");
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_env_precedence)
{
    char *envp[] = {(char *)"T_STR=fromenv",
                    (char *)"T_INT=9",
                    (char *)"T_Q=e1,e2",
                    (char *)"T_BOOL=yes",
                    (char *)"T_DBL=",
                    (char *)"T_STRX=no",
                    NULL};
    struct t t;
    struct cr_err err;
    /* the environment over the default; an empty variable is unset */
    ck_assert_int_eq(P(&t, envp, &err, NULL), 0);
    ck_assert_str_eq(t.s, "fromenv");
    ck_assert_int_eq(t.i, 9);
    ck_assert_int_eq(t.b, 1);
    ck_assert(t.d == 0.5);
    ck_assert_int_eq(t.q.n, 2);
    opts_release(&tspec, &t);
    /* the command line over the environment; its first list value replaces */
    ck_assert_int_eq(
        P(&t, envp, &err, "-s", "cli", "-i", "2", "-Q", "c1", "-Q", "c2", "--bool", "no"),
        0);
    ck_assert_str_eq(t.s, "cli");
    ck_assert_int_eq(t.i, 2);
    ck_assert_int_eq(t.b, 0);
    ck_assert_int_eq(t.q.n, 2);
    ck_assert_str_eq(t.q.items[0], "c1");
    ck_assert_str_eq(t.q.items[1], "c2");
    opts_release(&tspec, &t);
    /* the last of a repeated string wins */
    ck_assert_int_eq(P(&t, envp, &err, "-s", "a", "--str", "b"), 0);
    ck_assert_str_eq(t.s, "b");
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_env_errors)
{
    char *bad_int[] = {(char *)"T_INT=abc", NULL};
    char *bad_dbl[] = {(char *)"T_DBL=9", NULL};
    struct t t;
    struct cr_err err;
    /* checked even when the command line would override it, as before */
    ck_assert_int_eq(P(&t, bad_int, &err, "-i", "3"), CR_EINVAL);
    ck_assert_str_eq(err.msg, "invalid value 'abc' for --int (1 to 10)");
    opts_release(&tspec, &t);
    ck_assert_int_eq(P(&t, bad_dbl, &err, NULL), CR_EINVAL);
    ck_assert_str_eq(err.msg, "invalid value '9' for --dbl (0.1 to 2)");
    opts_release(&tspec, &t);
}
END_TEST

struct bad {
    const char *args[4];
    const char *msg;
};

static const struct bad bads[] = {
    {{"-i", "zero"}, "invalid value 'zero' for --int (1 to 10)"},
    {{"-i", "5x"}, "invalid value '5x' for --int (1 to 10)"},
    {{"-i", ""}, "invalid value '' for --int (1 to 10)"},
    {{"-i", "0"}, "invalid value '0' for --int (1 to 10)"},
    {{"--int=11"}, "invalid value '11' for --int (1 to 10)"},
    {{"--int", "99999999999999999999"},
     "invalid value '99999999999999999999' for --int (1 to 10)"},
    {{"--long", "1099511627777"},
     "invalid value '1099511627777' for --long (0 to "
     "1099511627776)"},
    {{"--dbl", "0.05"}, "invalid value '0.05' for --dbl (0.1 to 2)"},
    {{"--dbl", "nan"}, "invalid value 'nan' for --dbl (0.1 to 2)"},
    {{"--dbl", "1e999"}, "invalid value '1e999' for --dbl (0.1 to 2)"},
    {{"--dbl", "1s"}, "invalid value '1s' for --dbl (0.1 to 2)"},
    {{"--no-such-option"}, "unknown or incomplete option '--no-such-option'"},
    {{"-x"}, "unknown or incomplete option '-x'"},
    {{"--str"}, "unknown or incomplete option '--str'"},
    {{"-i"}, "unknown or incomplete option '-i'"},
    {{"--flag=1"}, "unknown or incomplete option '--flag=1'"},
    {{"--help=1"}, "unknown or incomplete option '--help=1'"},
    {{"--"}, NULL},
    {{"--", "x"}, "unexpected argument 'x'"},
    {{"x", "--bogus"}, "unexpected argument 'x'"},
    {{"-"}, "unexpected argument '-'"},
    /* "--h" is a prefix of --help only; "--s" of --str only; "--f" is not unique */
    {{"--s", "v"}, NULL},
    {{"--fl"}, NULL},
    {{"--lo", "3"}, NULL},
    {{"--"
      "q",
      "a,b"},
     NULL},
    {{"--x"}, "unknown or incomplete option '--x'"},
    {{"--"}, NULL},
};

START_TEST(test_bad_input)
{
    const struct bad *b = &bads[_i];
    struct t t;
    struct cr_err err;
    int rc = P(&t, noenv, &err, (char *)b->args[0], (char *)b->args[1],
               (char *)b->args[2], (char *)b->args[3]);
    if (b->msg) {
        ck_assert_int_eq(rc, CR_EINVAL);
        ck_assert_str_eq(err.msg, b->msg);
    } else {
        ck_assert_int_eq(rc, 0);
    }
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_ambiguous_prefix)
{
    struct t t;
    struct cr_err err;
    /* --hidden and --help both start with "--h" */
    ck_assert_int_eq(P(&t, noenv, &err, "--h"), CR_EINVAL);
    ck_assert_str_eq(err.msg, "unknown or incomplete option '--h'");
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_list_too_long)
{
    char big[4 * OPTS_MAX_LIST + 8];
    struct t t;
    struct cr_err err;
    size_t n = 0;
    for (int i = 0; i <= OPTS_MAX_LIST; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "%s%d", i ? "," : "", i % 10);
    ck_assert_int_eq(P(&t, noenv, &err, "-Q", big), CR_EINVAL);
    ck_assert_str_eq(err.msg, "too many values for --queues");
    opts_release(&tspec, &t);
    /* empty items are skipped */
    ck_assert_int_eq(P(&t, noenv, &err, "-Q", ",a,,b,"), 0);
    ck_assert_int_eq(t.q.n, 2);
    opts_release(&tspec, &t);
}
END_TEST

START_TEST(test_permute)
{
    struct t t;
    struct cr_err err;
    char *rest[32];
    int nrest = -1;
    ck_assert_int_eq(parse(&tspec_permute, &t, noenv, &err, rest, &nrest, "list", "-F",
                           "a", "--", "-i", NULL),
                     0);
    ck_assert_int_eq(nrest, 3);
    ck_assert_str_eq(rest[0], "list");
    ck_assert_str_eq(rest[1], "a");
    ck_assert_str_eq(rest[2], "-i");
    ck_assert_int_eq(t.f, 1);
    opts_release(&tspec_permute, &t);
    ck_assert_int_eq(
        parse(&tspec_permute, &t, noenv, &err, rest, &nrest, "a", "-i", NULL), CR_EINVAL);
    ck_assert_str_eq(err.msg, "unknown option '-i'");
    opts_release(&tspec_permute, &t);
}
END_TEST

static char *usage_text(const struct opts_spec *spec)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    ck_assert_ptr_nonnull(f);
    opts_usage(spec, f);
    fclose(f);
    return s;
}

START_TEST(test_usage_bytes)
{
    char *s = usage_text(&tspec);
    ck_assert_str_eq(s, "usage: t [options]\n\noptions:\n"
                        "  -s, --str        a string [default: dflt] [env: T_STR]\n"
                        "  -i, --int        an int [default: 5] [env: T_INT]\n"
                        "      --long       a long [default: 0] [env: T_LONG]\n"
                        "      --dbl        a double [default: 0.5] [env: T_DBL]\n"
                        "  -B, --bool       a bool [default: 0] [env: T_BOOL]\n"
                        "  -F, --flag       a flag\n"
                        "  -Q, --queues     a list [default: celery] [env: T_Q]\n"
                        "      --nodef X    no default\n"
                        "      --hidden     hidden default [env: T_HIDDEN]\n"
                        "  -h, --help       show this help and exit\n");
    free(s);
    s = usage_text(&tspec_permute);
    /* no help line; a flag wider than the column pushes its help right */
    ck_assert_ptr_null(strstr(s, "--help"));
    free(s);
}
END_TEST

static char *man_text(const struct opts_spec *spec)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    ck_assert_ptr_nonnull(f);
    opts_man(spec, f);
    fclose(f);
    return s;
}

static const struct opts_spec tspec_man = {
    .opts = topts,
    .n = 2,
    .head = "usage: t sub [options] ID\n\n"
            "Does a-b things.\n.dot \\ back\n\n"
            "  verb ARG   what it does\n\noptions:\n",
    .help_line = "show this help and exit",
};

START_TEST(test_man_bytes)
{
    char *s = man_text(&tspec_man);
    /* minus signs in flags only; a leading '.' and a backslash made literal; no
     * paragraph break before OPTIONS */
    ck_assert_str_eq(s, ".SH SYNOPSIS\n\\fBt sub\\fR [options] ID\n"
                        ".SH DESCRIPTION\n"
                        "Does a-b things.\n\\&.dot \\e back\n"
                        ".PP\n.TP\n\\fBverb ARG\\fR\nwhat it does\n"
                        ".SH OPTIONS\n"
                        ".TP\n\\fB\\-s\\fR, \\fB\\-\\-str\\fR\na string\n"
                        "Default: \\fIdflt\\fR.\nEnvironment: \\fBT_STR\\fR.\n"
                        ".TP\n\\fB\\-i\\fR, \\fB\\-\\-int\\fR\nan int\n"
                        "Default: \\fI5\\fR.\nEnvironment: \\fBT_INT\\fR.\n"
                        ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nshow this help and exit\n"
                        ".SH ENVIRONMENT\n"
                        "A variable that is set and not empty gives the option's value; "
                        "the command line overrides it.\n"
                        ".TP\n\\fBT_STR\\fR\nas \\fB\\-\\-str\\fR\n"
                        ".TP\n\\fBT_INT\\fR\nas \\fB\\-\\-int\\fR\n");
    free(s);
    /* every option of --help is in the page, metavar and all; hidden env hidden */
    s = man_text(&tspec);
    ck_assert_ptr_nonnull(strstr(s, "\\fB\\-\\-nodef\\fR \\fIX\\fR\nno default\n"));
    ck_assert_ptr_nonnull(strstr(s, "\\fB\\-\\-hidden\\fR\nhidden default\n"
                                    "Environment: \\fBT_HIDDEN\\fR.\n"));
    ck_assert_ptr_nonnull(strstr(s, "\\fB\\-F\\fR, \\fB\\-\\-flag\\fR\na flag\n.TP"));
    free(s);
}
END_TEST

/* --help writes to stdout: sent to /dev/null for the test and given back after,
 * so that a run in one process (CK_FORK=no, as `make asan` runs) still prints its
 * summary. Returns the saved descriptor. */
static int mute_stdout(void)
{
    int saved, null;
    fflush(stdout);
    saved = dup(STDOUT_FILENO);
    null = open("/dev/null", O_WRONLY);
    ck_assert(saved >= 0 && null >= 0);
    ck_assert_int_eq(dup2(null, STDOUT_FILENO), STDOUT_FILENO);
    close(null);
    return saved;
}

static void unmute_stdout(int saved)
{
    fflush(stdout);
    ck_assert_int_eq(dup2(saved, STDOUT_FILENO), STDOUT_FILENO);
    close(saved);
}

START_TEST(test_help_man_returns_one)
{
    struct t t;
    struct cr_err err;
    int saved = mute_stdout();
    ck_assert_int_eq(P(&t, noenv, &err, "--help-man"), 1);
    opts_release(&tspec, &t);
    /* spelt out in full: a prefix is the unknown option it always was */
    ck_assert_int_eq(P(&t, noenv, &err, "--help-ma"), CR_EINVAL);
    opts_release(&tspec, &t);
    unmute_stdout(saved);
}
END_TEST

START_TEST(test_help_returns_one)
{
    struct t t;
    struct cr_err err;
    int saved;
    /* an error before --help wins, as getopt_long would see it first */
    ck_assert_int_eq(P(&t, noenv, &err, "-i", "0", "--help"), CR_EINVAL);
    opts_release(&tspec, &t);
    saved = mute_stdout();
    ck_assert_int_eq(P(&t, noenv, &err, "-F", "--help", "--bogus"), 1);
    opts_release(&tspec, &t);
    ck_assert_int_eq(P(&t, noenv, &err, "-Fh"), 1);
    opts_release(&tspec, &t);
    ck_assert_int_eq(P(&t, noenv, &err, "--he"), 1);
    opts_release(&tspec, &t);
    unmute_stdout(saved);
}
END_TEST

START_TEST(test_oom_sweep)
{
    long failures = 0;
    for (long n = 1;; n++) {
        struct t t;
        struct cr_err err;
        int rc;
        cr_alloc_fail_after(n);
        rc = P(&t, noenv, &err, "-s", "x", "-Q", "a,b,c", "--nodef", "y");
        failures += cr_alloc_failed();
        cr_alloc_fail_after(0);
        opts_release(&tspec, &t);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_str_eq(err.msg, "out of memory");
        ck_assert_int_lt(n, 100);
    }
    ck_assert_int_gt(failures, 5);
}
END_TEST

/* The worker's table through config_load(): its own checks after the parser's. */
START_TEST(test_worker_config)
{
    char *argv[] = {(char *)"worker", (char *)"-c",  (char *)"7",
                    (char *)"-Q",     (char *)"a,b", (char *)"-E",
                    (char *)"-n",     (char *)"x@y", NULL};
    struct config cfg;
    struct cr_err err;
    memset(&cfg, 0, sizeof(cfg));
    memset(&err, 0, sizeof(err));
    unsetenv("CELERIAC_CONCURRENCY");
    unsetenv("CELERY_BROKER_URL");
    unsetenv("CELERIAC_QUEUES");
    unsetenv("CELERIAC_HOSTNAME");
    unsetenv("CELERIAC_LOGLEVEL");
    ck_assert_int_eq(config_load(&cfg, 8, argv, &err), 0);
    ck_assert_int_eq(cfg.concurrency, 7);
    ck_assert_int_eq(cfg.queues.n, 2);
    ck_assert_int_eq(cfg.task_events, 1);
    ck_assert_str_eq(cfg.hostname, "x@y");
    ck_assert_str_eq(cfg.broker, "amqp://guest:guest@localhost:5672//");
    config_release(&cfg);
    setenv("CELERIAC_LOGLEVEL", "loud", 1);
    memset(&cfg, 0, sizeof(cfg));
    ck_assert_int_eq(config_load(&cfg, 1, argv, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "invalid log level 'loud'");
    config_release(&cfg);
    unsetenv("CELERIAC_LOGLEVEL");
}
END_TEST

/* --queue-order: fair by default (Celery's arrival order), strict, or refused. */
START_TEST(test_worker_queue_order)
{
    char *argv[] = {(char *)"worker", (char *)"--queue-order", (char *)"strict", NULL};
    char *bad[] = {(char *)"worker", (char *)"--queue-order", (char *)"first", NULL};
    struct config cfg;
    struct cr_err err;
    unsetenv("CELERIAC_QUEUE_ORDER");
    unsetenv("CELERIAC_LOGLEVEL");
    memset(&cfg, 0, sizeof(cfg));
    ck_assert_int_eq(config_load(&cfg, 1, argv, &err), 0);
    ck_assert_str_eq(cfg.queue_order, "fair");
    config_release(&cfg);
    memset(&cfg, 0, sizeof(cfg));
    ck_assert_int_eq(config_load(&cfg, 3, argv, &err), 0);
    ck_assert_str_eq(cfg.queue_order, "strict");
    config_release(&cfg);
    memset(&cfg, 0, sizeof(cfg));
    ck_assert_int_eq(config_load(&cfg, 3, bad, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "invalid --queue-order 'first' (fair or strict)");
    config_release(&cfg);
}
END_TEST

START_TEST(test_worker_usage_head)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    ck_assert_ptr_nonnull(f);
    config_usage(f);
    fclose(f);
    /* scripts/readme-options.py and test_core.py read these lines */
    ck_assert(!strncmp(s, "usage: celeriac worker [options]\n\n", 34));
    ck_assert_ptr_nonnull(strstr(s, "\n  -b, --broker                   broker URL "
                                    "(amqp://, redis://, sentinel://, sqs://) "
                                    "[default: amqp://guest:guest@localhost:5672//] "
                                    "[env: CELERY_BROKER_URL]\n"));
    ck_assert_ptr_nonnull(strstr(s, "\n      --redis-health-check-interval seconds"));
    ck_assert_ptr_nonnull(strstr(s, "\n  -E, --task-events              send task events "
                                    "(Flower, celery events) [default: 0] [env: "
                                    "CELERIAC_TASK_EVENTS]\n"));
    ck_assert_ptr_nonnull(
        strstr(s, "\n  -h, --help                     show this help and exit\n"));
    free(s);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("opts");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_every_kind);
    tcase_add_test(tc, test_short_forms);
    tcase_add_test(tc, test_bool_words);
    tcase_add_test(tc, test_env_precedence);
    tcase_add_test(tc, test_env_errors);
    tcase_add_loop_test(tc, test_bad_input, 0, sizeof(bads) / sizeof(bads[0]));
    tcase_add_test(tc, test_ambiguous_prefix);
    tcase_add_test(tc, test_list_too_long);
    tcase_add_test(tc, test_permute);
    tcase_add_test(tc, test_usage_bytes);
    tcase_add_test(tc, test_help_returns_one);
    tcase_add_test(tc, test_oom_sweep);
    tcase_add_test(tc, test_worker_config);
    tcase_add_test(tc, test_worker_queue_order);
    tcase_add_test(tc, test_worker_usage_head);
    tcase_add_test(tc, test_man_bytes);
    tcase_add_test(tc, test_help_man_returns_one);
    suite_add_tcase(s, tc);
    return s;
}
