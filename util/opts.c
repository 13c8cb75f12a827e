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
