/* opts.c -- the option-table parser: defaults, environment, command line. */
#include "opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "alloc.h"

extern char **environ;

int opts_parse_bool(const char *v, int *out)
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

static void list_clear(struct opts_list *l)
{
    for (int i = 0; i < l->n; i++) {
        cr_free(l->items[i]);
        l->items[i] = NULL;
    }
    l->n = 0;
}

/* Appends the comma-separated items of v ("a,b" as in `celery worker -Q a,b`;
 * empty items are skipped). */
/* Appends the items of v to l: split at sep ('\0': v whole), empty items
 * skipped; with trim_cr, a '\r' ending an item is dropped (lines written on
 * Windows). */
static int split_add(const struct opt *o, struct opts_list *l, const char *v, char sep,
                     int trim_cr, struct cr_err *err)
{
    while (*v) {
        size_t n = sep ? strcspn(v, (char[]){sep, '\0'}) : strlen(v), m = n;
        if (trim_cr && m && v[m - 1] == '\r')
            m--;
        if (m) {
            if (l->n >= OPTS_MAX_LIST)
                return cr_err_set(err, CR_EINVAL, "too many values for --%s", o->name);
            l->items[l->n] = cr_strndup(v, m);
            if (!l->items[l->n])
                return cr_err_set(err, CR_ENOMEM, "out of memory");
            l->n++;
        }
        v += n;
        if (sep && *v == sep)
            v++;
    }
    return 0;
}

static int list_add(const struct opt *o, struct opts_list *l, const char *v,
                    struct cr_err *err)
{
    return split_add(o, l, v, ',', 0, err);
}

/* Appends v to an OPTS_LINES list: whole, or (from the environment) split
 * into lines. */
static int lines_add(const struct opt *o, struct opts_list *l, const char *v, int split,
                     struct cr_err *err)
{
    return split_add(o, l, v, split ? '\n' : '\0', split, err);
}

/* Applies one value. `replace` clears a list first (the default, the
 * environment, and the first time the option is given on the command line);
 * from_env: the value came from the environment. */
static int set_from(const struct opt *o, void *dst, const char *v, int replace,
                    int from_env, struct cr_err *err);

static int set(const struct opt *o, void *dst, const char *v, int replace,
               struct cr_err *err)
{
    return set_from(o, dst, v, replace, 0, err);
}

static int set_from(const struct opt *o, void *dst, const char *v, int replace,
                    int from_env, struct cr_err *err)
{
    char *field = (char *)dst + o->offset;
    char *end;
    double d;
    long l;

    switch (o->kind) {
    case OPTS_STR: {
        char *s = cr_strdup(v);
        if (!s)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        cr_free(*(char **)field);
        *(char **)field = s;
        return 0;
    }
    case OPTS_INT:
    case OPTS_LONG:
        errno = 0;
        l = strtol(v, &end, 10);
        if (errno || end == v || *end || l < o->min || l > o->max)
            return cr_err_set(err, CR_EINVAL,
                              "invalid value '%s' for --%s (%.0f to %.0f)", v, o->name,
                              o->min, o->max);
        if (o->kind == OPTS_INT)
            *(int *)field = (int)l;
        else
            *(long *)field = l;
        return 0;
    case OPTS_DOUBLE:
        errno = 0;
        d = strtod(v, &end);
        /* Written so that a NaN ("nan" parses) is out of every range. */
        if (errno || end == v || *end || !(d >= o->min && d <= o->max))
            return cr_err_set(err, CR_EINVAL, "invalid value '%s' for --%s (%g to %g)", v,
                              o->name, o->min, o->max);
        *(double *)field = d;
        return 0;
    case OPTS_BOOL:
        if (opts_parse_bool(v, (int *)field))
            return cr_err_set(err, CR_EINVAL,
                              "invalid value '%s' for --%s (true or false)", v, o->name);
        return 0;
    case OPTS_FLAG:
        *(int *)field = 1;
        return 0;
    case OPTS_LIST:
        if (replace)
            list_clear((struct opts_list *)field);
        return list_add(o, (struct opts_list *)field, v, err);
    case OPTS_LINES:
        if (replace)
            list_clear((struct opts_list *)field);
        return lines_add(o, (struct opts_list *)field, v, from_env, err);
    }
    return cr_err_set(err, CR_EINVAL, "bad option table entry --%s", o->name);
}

static const char *env_get(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (!strncmp(*e, name, n) && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

static int bad(const struct opts_spec *spec, const char *arg, struct cr_err *err)
{
    const char *fmt =
        spec->bad_option ? spec->bad_option : "unknown or incomplete option '%s'";
    /* The format is the table's constant, with exactly one %s. */
    return cr_err_set(err, CR_EINVAL, fmt, arg);
}

/* The option whose long name is name[0..len): an exact match, else the only
 * one it is a prefix of (as getopt_long). Returns its index, spec->n for
 * "help", or -1 (unknown or ambiguous). */
static long find_long(const struct opts_spec *spec, const char *name, size_t len)
{
    long found = -1;
    int matches = 0;

    if (!len)
        return -1;
    for (size_t i = 0; i <= spec->n; i++) {
        const char *ln = i < spec->n ? spec->opts[i].name : "help";
        if (strncmp(ln, name, len))
            continue;
        if (ln[len] == '\0')
            return (long)i;
        found = (long)i;
        matches++;
    }
    return matches == 1 ? found : -1;
}

int opts_parse(const struct opts_spec *spec, void *dst, int argc, char **argv,
               char **envp, char **rest, int *nrest, struct cr_err *err)
{
    unsigned char *given;
    int only_args = 0;
    int rc = 0;

    if (nrest)
        *nrest = 0;
    if (!envp)
        envp = environ;
    /* Defaults, then the environment; the command line comes last. */
    for (size_t i = 0; i < spec->n; i++) {
        const struct opt *o = &spec->opts[i];
        const char *env = o->env ? env_get(envp, o->env) : NULL;
        if (o->def && (rc = set(o, dst, o->def, 1, err)))
            return rc;
        if (env && *env && (rc = set_from(o, dst, env, 1, 1, err)))
            return rc;
    }
    given = cr_calloc(spec->n + 1, 1);
    if (!given)
        return cr_err_set(err, CR_ENOMEM, "out of memory");

    for (int i = 1; i < argc && !rc; i++) {
        char *a = argv[i];
        const struct opt *o;
        const char *v;
        int b;

        if (only_args || a[0] != '-' || a[1] == '\0') {
            if (!(spec->flags & OPTS_PERMUTE) || !rest) {
                rc = cr_err_set(err, CR_EINVAL, "unexpected argument '%s'", a);
                break;
            }
            rest[(*nrest)++] = a;
            continue;
        }
        if (!strcmp(a, "--")) {
            only_args = 1;
            continue;
        }
        if (!strcmp(a, "--help-man")) {
            opts_man(spec, stdout);
            rc = 1;
            break;
        }
        if (a[1] == '-') {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            long k = find_long(spec, name, eq ? (size_t)(eq - name) : strlen(name));

            if (k < 0 ||
                (eq && ((size_t)k == spec->n || spec->opts[k].kind == OPTS_FLAG))) {
                rc = bad(spec, a, err);
                break;
            }
            if ((size_t)k == spec->n) {
                opts_usage(spec, stdout);
                rc = 1;
                break;
            }
            o = &spec->opts[k];
            if (eq) {
                v = eq + 1;
            } else if (o->kind == OPTS_FLAG) {
                v = "1";
            } else if (o->kind == OPTS_BOOL) {
                /* "--flag false" as well as "--flag=false" and a bare "--flag". */
                v = i + 1 < argc && opts_parse_bool(argv[i + 1], &b) == 0 ? argv[++i]
                                                                          : "1";
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                rc = bad(spec, a, err);
                break;
            }
            rc = set(o, dst, v, !given[k], err);
            given[k] = 1;
            continue;
        }
        /* A cluster of short letters: "-E", "-c5", "-Ec 5". */
        for (const char *p = a + 1; *p && !rc; p++) {
            size_t k;
            if (*p == 'h') {
                opts_usage(spec, stdout);
                rc = 1;
                break;
            }
            for (k = 0; k < spec->n && spec->opts[k].short_flag != *p; k++)
                ;
            if (k == spec->n) {
                rc = bad(spec, a, err);
                break;
            }
            o = &spec->opts[k];
            if (o->kind == OPTS_FLAG || o->kind == OPTS_BOOL) {
                /* A bool letter takes no value, except a bool word as the next
                 * argument when it ends the cluster ("-E false"). */
                v = o->kind == OPTS_BOOL && !p[1] && i + 1 < argc &&
                            opts_parse_bool(argv[i + 1], &b) == 0
                        ? argv[++i]
                        : "1";
                rc = set(o, dst, v, !given[k], err);
                given[k] = 1;
                continue;
            }
            if (p[1]) {
                v = p + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                rc = bad(spec, a, err);
                break;
            }
            rc = set(o, dst, v, !given[k], err);
            given[k] = 1;
            break; /* the value took the rest of the cluster */
        }
    }
    cr_free(given);
    return rc;
}

void opts_usage(const struct opts_spec *spec, FILE *out)
{
    fputs(spec->head ? spec->head : "", out);
    for (size_t i = 0; i < spec->n; i++) {
        const struct opt *o = &spec->opts[i];
        char flag[96];
        int n;
        if (o->short_flag)
            n = snprintf(flag, sizeof(flag), "-%c, --%s", o->short_flag, o->name);
        else
            n = snprintf(flag, sizeof(flag), "    --%s", o->name);
        if (o->metavar && n >= 0 && (size_t)n < sizeof(flag))
            snprintf(flag + n, sizeof(flag) - (size_t)n, " %s", o->metavar);
        fprintf(out, "  %-*s %s", spec->width, flag, o->help);
        if (o->def && *o->def && !(o->flags & OPT_HIDE_DEFAULT))
            fprintf(out, " [default: %s]", o->def);
        if (o->env && !(o->flags & OPT_HIDE_ENV))
            fprintf(out, " [env: %s]", o->env);
        fputc('\n', out);
    }
    if (spec->help_line)
        fprintf(out, "  %-*s %s\n", spec->width, "-h, --help", spec->help_line);
}

/* Writes s[0..n) as roff text: backslashes escaped, '-' as a minus sign when
 * `minus` (option names: neither hyphenated nor broken across lines), and a
 * leading '.' or '\'' made literal (it would start a request). */
static void roff_text(FILE *out, const char *s, size_t n, int minus)
{
    if (n && (s[0] == '.' || s[0] == '\''))
        fputs("\\&", out);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\')
            fputs("\\e", out);
        else if (s[i] == '-' && minus)
            fputs("\\-", out);
        else
            fputc(s[i], out);
    }
}

static void roff_str(FILE *out, const char *s, int minus)
{
    roff_text(out, s, strlen(s), minus);
}

/* The flag of o as "\fB\-b\fR, \fB\-\-broker\fR \fIURL\fR". */
static void roff_flag(FILE *out, const struct opt *o)
{
    if (o->short_flag)
        fprintf(out, "\\fB\\-%c\\fR, ", o->short_flag);
    fputs("\\fB\\-\\-", out);
    roff_str(out, o->name, 1);
    fputs("\\fR", out);
    if (o->metavar) {
        fputs(" \\fI", out);
        roff_str(out, o->metavar, 0);
        fputs("\\fR", out);
    }
    fputc('\n', out);
}

/* SYNOPSIS and DESCRIPTION from spec->head. */
static void man_head(const struct opts_spec *spec, FILE *out)
{
    const char *p = spec->head ? spec->head : "";
    size_t n = strcspn(p, "\n"), cmd;
    int para = 0;

    if (!strncmp(p, "usage: ", 7)) {
        p += 7;
        n -= 7;
    }
    /* The command's words in bold, its arguments as written. */
    for (cmd = 0; cmd < n && (p[cmd] == ' ' || (p[cmd] >= 'a' && p[cmd] <= 'z'));)
        cmd++;
    while (cmd && p[cmd - 1] == ' ')
        cmd--;
    fputs(".SH SYNOPSIS\n\\fB", out);
    roff_text(out, p, cmd, 0);
    fputs("\\fR", out);
    roff_text(out, p + cmd, n - cmd, 0);
    fputs("\n.SH DESCRIPTION\n", out);
    p += n;
    while (*p == '\n')
        p++;
    while (*p) {
        n = strcspn(p, "\n");
        if (n && !(n == 8 && !strncmp(p, "options:", 8)) && para) {
            fputs(".PP\n", out);
            para = 0;
        }
        if (n == 8 && !strncmp(p, "options:", 8)) {
            /* the heading of the option lines, which OPTIONS replaces */
        } else if (n == 0) {
            para = 1; /* written before the next text only: none before OPTIONS */
        } else if (p[0] == ' ') {
            /* "  list      one line per ...": a tagged paragraph */
            const char *t = p + strspn(p, " ");
            const char *gap = strstr(t, "  ");
            size_t tn = gap && gap < p + n ? (size_t)(gap - t) : (size_t)(p + n - t);
            const char *d = t + tn + strspn(t + tn, " ");
            fputs(".TP\n\\fB", out);
            roff_text(out, t, tn, 0);
            fputs("\\fR\n", out);
            if (d < p + n) {
                roff_text(out, d, (size_t)(p + n - d), 0);
                fputc('\n', out);
            }
        } else {
            roff_text(out, p, n, 0);
            fputc('\n', out);
        }
        p += n;
        if (*p == '\n')
            p++;
    }
}

void opts_man(const struct opts_spec *spec, FILE *out)
{
    int any_env = 0;

    man_head(spec, out);
    fputs(".SH OPTIONS\n", out);
    for (size_t i = 0; i < spec->n; i++) {
        const struct opt *o = &spec->opts[i];
        fputs(".TP\n", out);
        roff_flag(out, o);
        roff_str(out, o->help, 0);
        fputc('\n', out);
        if (o->def && *o->def && !(o->flags & OPT_HIDE_DEFAULT)) {
            fputs("Default: \\fI", out);
            roff_str(out, o->def, 0);
            fputs("\\fR.\n", out);
        }
        if (o->env && !(o->flags & OPT_HIDE_ENV)) {
            fputs("Environment: \\fB", out);
            roff_str(out, o->env, 0);
            fputs("\\fR.\n", out);
            any_env = 1;
        }
    }
    if (spec->help_line) {
        fputs(".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\n", out);
        roff_str(out, spec->help_line, 0);
        fputc('\n', out);
    }
    if (!any_env)
        return;
    fputs(".SH ENVIRONMENT\n"
          "A variable that is set and not empty gives the option's value; the command "
          "line overrides it.\n",
          out);
    for (size_t i = 0; i < spec->n; i++) {
        const struct opt *o = &spec->opts[i];
        if (!o->env || (o->flags & OPT_HIDE_ENV))
            continue;
        fputs(".TP\n\\fB", out);
        roff_str(out, o->env, 0);
        fputs("\\fR\nas \\fB\\-\\-", out);
        roff_str(out, o->name, 1);
        fputs("\\fR\n", out);
    }
}

void opts_release(const struct opts_spec *spec, void *dst)
{
    for (size_t i = 0; i < spec->n; i++) {
        char *field = (char *)dst + spec->opts[i].offset;
        if (spec->opts[i].kind == OPTS_STR) {
            cr_free(*(char **)field);
            *(char **)field = NULL;
        } else if (spec->opts[i].kind == OPTS_LIST || spec->opts[i].kind == OPTS_LINES) {
            list_clear((struct opts_list *)field);
        }
    }
}
