/* opts.h -- one table-driven parser for the options of every celeriac command.
 *
 * A command describes its options in a table of struct opt (long name, short
 * letter, environment variable, kind, field offset, default, bounds, help) and
 * calls opts_parse(). Each value comes from, in rising precedence: the default,
 * the environment variable (when set and non-empty), the command line. The
 * --help text is generated from the same table, so the table is the
 * documentation (scripts/readme-options.py turns `celeriac worker --help` and
 * `celeriac gateway --help` into the README's tables).
 *
 * The command line follows getopt_long: "--name VALUE", "--name=VALUE", a
 * unique prefix of a long name, "-x VALUE", "-xVALUE", clusters of short
 * letters ("-Ec 5"), and "--" ending the options. Pure but for printing
 * --help to stdout: no globals, and the environment is an argument. Error
 * messages are one line, name the option as "--name", and quote the value. */
#ifndef CR_OPTS_H
#define CR_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "err.h"

/* The most items an OPTS_LIST option holds. */
#define OPTS_MAX_LIST 64

enum opts_kind {
    OPTS_STR,    /* char *: a cr_strdup()'d copy; freed by opts_release() */
    OPTS_INT,    /* int, in [min, max] */
    OPTS_LONG,   /* long, in [min, max] */
    OPTS_DOUBLE, /* double, in [min, max] */
    OPTS_BOOL,   /* int 0/1: "--x", "--x=false", "--x no"; 1/0 true/false yes/no on/off */
    OPTS_FLAG,   /* int set to 1 by "--x"; takes no value */
    OPTS_LIST,   /* struct opts_list: comma-separated, repeatable; the first value given
                    on the command line (or from the environment) replaces the default */
    OPTS_LINES,  /* struct opts_list, repeatable: each command-line value is one item
                    whole (commas and all); the environment gives one item per line
                    (a CR before the LF is dropped, empty lines skipped). For values
                    that may hold commas, such as "Name: a, b" headers */
};

struct opts_list {
    int n;
    char *items[OPTS_MAX_LIST]; /* cr_strndup()'d; freed by opts_release() */
};

/* Per-option --help tweaks. */
#define OPT_HIDE_DEFAULT 1u /* do not print "[default: ...]" */
#define OPT_HIDE_ENV 2u     /* do not print "[env: ...]" */

struct opt {
    const char *name; /* long option, without "--" */
    char short_flag;  /* 0: none */
    const char *env;  /* environment variable, or NULL */
    enum opts_kind kind;
    size_t offset;       /* of the field in the caller's struct */
    const char *def;     /* default as it would be written on the command line, or NULL */
    double min, max;     /* bounds of numbers, inclusive */
    const char *help;    /* one line */
    const char *metavar; /* shown after the flag in --help ("URL"), or NULL */
    unsigned flags;      /* OPT_HIDE_* */
};

/* Spec-wide behaviour. */
#define OPTS_PERMUTE 1u /* non-options may come between options (see opts_parse) */

struct opts_spec {
    const struct opt *opts;
    size_t n;
    const char *head;      /* --help text before the option lines (may be "") */
    int width;             /* --help: the flag column is padded to this many characters */
    const char *help_line; /* help of the generated "-h, --help" line; NULL: no line */
    const char *bad_option; /* printf format with one %s (the argument) for an unknown
                               option or a missing value; NULL: "unknown or incomplete
                               option '%s'" */
    unsigned flags;         /* OPTS_PERMUTE */
};

/* Fills dst (a zeroed struct holding the fields named by the table) from the
 * defaults, the environment `envp` (NULL-terminated "NAME=value" strings;
 * NULL: the process environment) and argv[1..argc). argv[0] is skipped.
 *
 * Non-options: without OPTS_PERMUTE the first one is an error ("unexpected
 * argument '%s'"); with it, they are stored in order into rest (room for argc
 * pointers, borrowed from argv) and counted in *nrest. "--" makes every later
 * argument a non-option.
 *
 * Returns 0; 1 when -h/--help was given (the help went to stdout; the caller
 * exits 0) or --help-man (opts_man() went to stdout; spelt out in full, never
 * a prefix, and not listed in --help); CR_EINVAL with a one-line reason in err (a bad
 * option, a missing value, a value out of range or not a number, a list too long);
 * CR_ENOMEM. On error dst may be partly filled: call opts_release() in every case. */
int opts_parse(const struct opts_spec *spec, void *dst, int argc, char **argv,
               char **envp, char **rest, int *nrest, struct cr_err *err);

/* Writes the --help text generated from the table: spec->head, then one line
 * per option ("  -b, --broker URL   help [default: X] [env: Y]"), then the
 * "-h, --help" line. */
void opts_usage(const struct opts_spec *spec, FILE *out);

/* Writes the body of a man page (roff, from SYNOPSIS on) generated from the
 * same table as opts_usage(), so the page cannot drift from --help: the
 * synopsis is head's first line without "usage: ", the description the rest
 * of head (up to a line "options:"; "  word  text" lines become tagged
 * paragraphs), then one paragraph per option with its default and
 * environment variable, and an ENVIRONMENT section. The caller writes .TH and
 * NAME. opts_parse() prints it, then returns 1, for the hidden "--help-man". */
void opts_man(const struct opts_spec *spec, FILE *out);

/* Frees the strings and lists the table names in dst and zeroes them. */
void opts_release(const struct opts_spec *spec, void *dst);

/* Parses a boolean word as OPTS_BOOL does. Returns 0 and sets *out, or
 * CR_EINVAL. */
int opts_parse_bool(const char *v, int *out);

#endif
