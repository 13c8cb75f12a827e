/* prom.c -- Prometheus text exposition: registry, rendering, line parser (no I/O). */
#include "prom.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/alloc.h"
#include "../util/err.h"
#include "../util/strmap.h"

struct prom_series {
    struct prom_series *next; /* in order of appearance */
    char **values;            /* one per label */
    double value;             /* counter, gauge */
    double sum;               /* histogram */
    uint64_t count;
    uint64_t *bucket_counts; /* per bucket (not cumulative); [nbuckets] is +Inf */
};

struct prom_family {
    struct prom_family *next;
    char *name;
    char *help;
    enum prom_type type;
    int nlabels;
    char *labels[PROM_MAX_LABELS];
    int nbuckets;
    double buckets[PROM_MAX_BUCKETS];
    size_t max_series;
    struct strmap index; /* series key -> series */
    struct prom_series *head, *tail;
};

struct prom_registry {
    struct prom_family *head, *tail;
};

/* ------------------------------------------------------------ registry */

struct prom_registry *prom_registry_new(void)
{
    return cr_calloc(1, sizeof(struct prom_registry));
}

static void series_free(struct prom_series *s, int nlabels)
{
    if (!s)
        return;
    if (s->values)
        for (int i = 0; i < nlabels; i++)
            cr_free(s->values[i]);
    cr_free(s->values);
    cr_free(s->bucket_counts);
    cr_free(s);
}

void prom_family_clear(struct prom_family *f)
{
    struct prom_series *s = f->head, *next;
    for (; s; s = next) {
        next = s->next;
        series_free(s, f->nlabels);
    }
    f->head = f->tail = NULL;
    strmap_release(&f->index);
    strmap_init(&f->index);
}

static void family_free(struct prom_family *f)
{
    if (!f)
        return;
    prom_family_clear(f);
    strmap_release(&f->index);
    for (int i = 0; i < f->nlabels; i++)
        cr_free(f->labels[i]);
    cr_free(f->name);
    cr_free(f->help);
    cr_free(f);
}

void prom_registry_free(struct prom_registry *r)
{
    struct prom_family *f, *next;
    if (!r)
        return;
    for (f = r->head; f; f = next) {
        next = f->next;
        family_free(f);
    }
    cr_free(r);
}

static int valid_name(const char *s, int allow_colon)
{
    if (!s || !*s)
        return 0;
    for (const char *p = s; *p; p++) {
        char c = *p;
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':');
        if (!alpha && !(p != s && c >= '0' && c <= '9'))
            return 0;
    }
    return 1;
}

struct prom_family *prom_family_add(struct prom_registry *r, const char *name,
                                    const char *help, enum prom_type type,
                                    const char *const *label_names, int nlabels,
                                    const double *buckets, int nbuckets)
{
    struct prom_family *f;
    if (!valid_name(name, 1) || nlabels < 0 || nlabels > PROM_MAX_LABELS ||
        (unsigned)type > PROM_HISTOGRAM)
        return NULL;
    if (type == PROM_HISTOGRAM && (nbuckets < 1 || nbuckets > PROM_MAX_BUCKETS))
        return NULL;
    for (int i = 0; type == PROM_HISTOGRAM && i < nbuckets; i++)
        if (isnan(buckets[i]) || (i && !(buckets[i] > buckets[i - 1])) ||
            isinf(buckets[i]))
            return NULL;
    for (int i = 0; i < nlabels; i++) {
        if (!valid_name(label_names[i], 0) || !strncmp(label_names[i], "__", 2))
            return NULL;
        if (type == PROM_HISTOGRAM && !strcmp(label_names[i], "le"))
            return NULL;
    }
    for (f = r->head; f; f = f->next)
        if (!strcmp(f->name, name))
            return NULL;
    f = cr_calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    strmap_init(&f->index);
    f->type = type;
    f->max_series = PROM_DEFAULT_MAX_SERIES;
    f->name = cr_strdup(name);
    f->help = cr_strdup(help ? help : "");
    if (!f->name || !f->help)
        goto oom;
    for (int i = 0; i < nlabels; i++) {
        f->labels[i] = cr_strdup(label_names[i]);
        if (!f->labels[i])
            goto oom;
        f->nlabels = i + 1;
    }
    if (type == PROM_HISTOGRAM) {
        memcpy(f->buckets, buckets, (size_t)nbuckets * sizeof(double));
        f->nbuckets = nbuckets;
    }
    if (r->tail)
        r->tail->next = f;
    else
        r->head = f;
    r->tail = f;
    return f;
oom:
    family_free(f);
    return NULL;
}

void prom_family_set_max_series(struct prom_family *f, size_t max_series)
{
    f->max_series = max_series ? max_series : 1;
}

size_t prom_family_series(const struct prom_family *f)
{
    return f->index.count;
}

/* The map key of a label set: each value as "<length>:<bytes>", so no value
 * can make two sets collide. */
static int series_key(const struct prom_family *f, const char *const *values,
                      struct buf *key)
{
    int rc = buf_putc(key, '#');
    for (int i = 0; i < f->nlabels && !rc; i++) {
        const char *v = values && values[i] ? values[i] : "";
        size_t n = strlen(v);
        char digits[24];
        int at = (int)sizeof(digits);
        /* by hand: this runs for every metric a task moves, where printf
         * was most of its cost */
        digits[--at] = ':';
        do {
            digits[--at] = (char)('0' + n % 10);
            n /= 10;
        } while (n);
        rc = buf_append(key, digits + at, sizeof(digits) - (size_t)at);
        if (!rc)
            rc = buf_puts(key, v);
    }
    return rc;
}

static struct prom_series *series_new(struct prom_family *f, const char *const *values,
                                      const char *key)
{
    struct prom_series *s = cr_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (f->nlabels) {
        s->values = cr_calloc((size_t)f->nlabels, sizeof(char *));
        if (!s->values)
            goto oom;
        for (int i = 0; i < f->nlabels; i++) {
            s->values[i] = cr_strdup(values && values[i] ? values[i] : "");
            if (!s->values[i])
                goto oom;
        }
    }
    if (f->type == PROM_HISTOGRAM) {
        s->bucket_counts = cr_calloc((size_t)f->nbuckets + 1, sizeof(uint64_t));
        if (!s->bucket_counts)
            goto oom;
    }
    if (strmap_put(&f->index, key, s))
        goto oom;
    if (f->tail)
        f->tail->next = s;
    else
        f->head = s;
    f->tail = s;
    return s;
oom:
    series_free(s, f->nlabels);
    return NULL;
}

/* Finds or makes the series of a label set, folding new sets into the
 * "other" series once the family is full. */
static struct prom_series *series_get(struct prom_family *f, const char *const *values)
{
    struct buf key;
    struct prom_series *s;
    const char *other[PROM_MAX_LABELS];

    buf_init(&key);
    if (series_key(f, values, &key)) {
        buf_release(&key);
        return NULL;
    }
    s = strmap_get(&f->index, key.data);
    if (!s && f->index.count >= f->max_series) {
        for (int i = 0; i < f->nlabels; i++)
            other[i] = "other";
        buf_reset(&key);
        if (series_key(f, other, &key)) {
            buf_release(&key);
            return NULL;
        }
        values = other;
        s = strmap_get(&f->index, key.data);
    }
    if (!s)
        s = series_new(f, values, key.data);
    buf_release(&key);
    return s;
}

int prom_add(struct prom_family *f, const char *const *values, double v)
{
    struct prom_series *s;
    if (f->type == PROM_HISTOGRAM || (f->type == PROM_COUNTER && !(v >= 0)))
        return CR_EINVAL;
    s = series_get(f, values);
    if (!s)
        return CR_ENOMEM;
    s->value += v;
    return 0;
}

int prom_set(struct prom_family *f, const char *const *values, double v)
{
    struct prom_series *s;
    if (f->type == PROM_HISTOGRAM)
        return CR_EINVAL;
    s = series_get(f, values);
    if (!s)
        return CR_ENOMEM;
    s->value = v;
    return 0;
}

int prom_observe(struct prom_family *f, const char *const *values, double v)
{
    struct prom_series *s;
    int i;
    if (f->type != PROM_HISTOGRAM)
        return CR_EINVAL;
    s = series_get(f, values);
    if (!s)
        return CR_ENOMEM;
    for (i = 0; i < f->nbuckets && !(v <= f->buckets[i]); i++)
        ;
    s->bucket_counts[i]++;
    s->count++;
    s->sum += v;
    return 0;
}

/* ------------------------------------------------------------ rendering */

int prom_format_value(double v, struct buf *out)
{
    char tmp[40];
    if (isnan(v))
        return buf_puts(out, "NaN");
    if (isinf(v))
        return buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(tmp, sizeof(tmp), "%.0f", v);
        /* "-0" reads back fine, but "0" is what people expect to see */
        return buf_puts(out, strcmp(tmp, "-0") ? tmp : "0");
    }
    snprintf(tmp, sizeof(tmp), "%.15g", v);
    if (strtod(tmp, NULL) != v)
        snprintf(tmp, sizeof(tmp), "%.17g", v);
    return buf_puts(out, tmp);
}

static int put_escaped(struct buf *out, const char *s, int quote)
{
    int rc = 0;
    for (; *s && !rc; s++) {
        if (*s == '\\')
            rc = buf_puts(out, "\\\\");
        else if (*s == '\n')
            rc = buf_puts(out, "\\n");
        else if (quote && *s == '"')
            rc = buf_puts(out, "\\\"");
        else
            rc = buf_putc(out, *s);
    }
    return rc;
}

/* name{l1="v1",...[,le="x"]} value\n */
static int put_sample(struct buf *out, const struct prom_family *f,
                      const struct prom_series *s, const char *suffix, const char *le,
                      double v)
{
    int rc = buf_puts(out, f->name);
    int n = 0;
    if (!rc)
        rc = buf_puts(out, suffix);
    if (!rc && (f->nlabels || le))
        rc = buf_putc(out, '{');
    for (int i = 0; i < f->nlabels && !rc; i++, n++) {
        rc = buf_printf(out, "%s%s=\"", n ? "," : "", f->labels[i]);
        if (!rc)
            rc = put_escaped(out, s->values[i], 1);
        if (!rc)
            rc = buf_putc(out, '"');
    }
    if (!rc && le)
        rc = buf_printf(out, "%sle=\"%s\"", n ? "," : "", le);
    if (!rc && (f->nlabels || le))
        rc = buf_putc(out, '}');
    if (!rc)
        rc = buf_putc(out, ' ');
    if (!rc)
        rc = prom_format_value(v, out);
    if (!rc)
        rc = buf_putc(out, '\n');
    return rc;
}

static int render_family(const struct prom_family *f, struct buf *out)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    int rc = buf_printf(out, "# HELP %s ", f->name);
    if (!rc)
        rc = put_escaped(out, f->help, 0);
    if (!rc)
        rc = buf_printf(out, "\n# TYPE %s %s\n", f->name, type_names[f->type]);
    for (const struct prom_series *s = f->head; s && !rc; s = s->next) {
        if (f->type != PROM_HISTOGRAM) {
            rc = put_sample(out, f, s, "", NULL, s->value);
            continue;
        }
        uint64_t cum = 0;
        for (int i = 0; i <= f->nbuckets && !rc; i++) {
            struct buf le;
            cum += s->bucket_counts[i];
            buf_init(&le);
            if (i < f->nbuckets)
                rc = prom_format_value(f->buckets[i], &le);
            else
                rc = buf_puts(&le, "+Inf");
            if (!rc)
                rc = put_sample(out, f, s, "_bucket", le.data, (double)cum);
            buf_release(&le);
        }
        if (!rc)
            rc = put_sample(out, f, s, "_sum", NULL, s->sum);
        if (!rc)
            rc = put_sample(out, f, s, "_count", NULL, (double)s->count);
    }
    return rc;
}

int prom_render(const struct prom_registry *r, struct buf *out)
{
    int rc = 0;
    for (const struct prom_family *f = r->head; f && !rc; f = f->next)
        rc = render_family(f, out);
    return rc;
}

/* -------------------------------------------------------------- parsing */

struct cursor {
    const char *p, *end;
};

static void skip_ws(struct cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t'))
        c->p++;
}

static int read_name(struct cursor *c, char *out, size_t size, int allow_colon)
{
    size_t n = 0;
    while (c->p < c->end) {
        char ch = *c->p;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                 (allow_colon && ch == ':') || (n && ch >= '0' && ch <= '9');
        if (!ok)
            break;
        if (n + 1 >= size)
            return CR_EPROTO;
        out[n++] = ch;
        c->p++;
    }
    out[n] = '\0';
    return n ? 0 : CR_EPROTO;
}

static int read_quoted(struct cursor *c, char *out, size_t size)
{
    size_t n = 0;
    if (c->p >= c->end || *c->p != '"')
        return CR_EPROTO;
    c->p++;
    while (c->p < c->end && *c->p != '"') {
        char ch = *c->p++;
        if (ch == '\\') {
            if (c->p >= c->end)
                return CR_EPROTO;
            ch = *c->p++;
            if (ch == 'n')
                ch = '\n';
            else if (ch != '\\' && ch != '"')
                return CR_EPROTO;
        }
        if (n + 1 >= size)
            return CR_EPROTO;
        out[n++] = ch;
    }
    if (c->p >= c->end)
        return CR_EPROTO;
    c->p++;
    out[n] = '\0';
    return 0;
}

/* A float token: digits, sign, '.', exponent, or one of the words the format
 * allows (Inf, +Inf, -Inf, NaN). strtod alone would also take hex and
 * "infinity"; the character check keeps to the format. */
static int read_number(struct cursor *c, double *v)
{
    char tok[64];
    size_t n = 0;
    char *endp;
    while (c->p < c->end && *c->p != ' ' && *c->p != '\t') {
        if (n + 1 >= sizeof(tok))
            return CR_EPROTO;
        tok[n++] = *c->p++;
    }
    tok[n] = '\0';
    if (!n)
        return CR_EPROTO;
    if (!strcmp(tok, "+Inf") || !strcmp(tok, "Inf")) {
        *v = INFINITY;
        return 0;
    }
    if (!strcmp(tok, "-Inf")) {
        *v = -INFINITY;
        return 0;
    }
    if (!strcmp(tok, "NaN")) {
        *v = NAN;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789+-.eE", tok[i]))
            return CR_EPROTO;
    *v = strtod(tok, &endp);
    return *endp ? CR_EPROTO : 0;
}

int prom_parse_line(const char *line, size_t len, struct prom_sample *s)
{
    struct cursor c = {line, line + len};
    double ts;
    memset(s, 0, sizeof(*s));
    if (len && line[len - 1] == '\r')
        c.end--;
    skip_ws(&c);
    if (c.p == c.end || *c.p == '#')
        return 0;
    if (read_name(&c, s->name, sizeof(s->name), 1))
        return CR_EPROTO;
    skip_ws(&c);
    if (c.p < c.end && *c.p == '{') {
        c.p++;
        for (;;) {
            struct prom_label *l;
            skip_ws(&c);
            if (c.p < c.end && *c.p == '}') {
                c.p++;
                break;
            }
            if (s->nlabels == PROM_MAX_LABELS)
                return CR_EPROTO;
            l = &s->labels[s->nlabels];
            if (read_name(&c, l->name, sizeof(l->name), 0))
                return CR_EPROTO;
            skip_ws(&c);
            if (c.p >= c.end || *c.p != '=')
                return CR_EPROTO;
            c.p++;
            skip_ws(&c);
            if (read_quoted(&c, l->value, sizeof(l->value)))
                return CR_EPROTO;
            s->nlabels++;
            skip_ws(&c);
            if (c.p < c.end && *c.p == ',') {
                c.p++;
                continue;
            }
            if (c.p < c.end && *c.p == '}') {
                c.p++;
                break;
            }
            return CR_EPROTO;
        }
    }
    skip_ws(&c);
    if (read_number(&c, &s->value))
        return CR_EPROTO;
    skip_ws(&c);
    if (c.p < c.end) {
        if (read_number(&c, &ts) || ts != floor(ts) || fabs(ts) > 9.2e18)
            return CR_EPROTO;
        s->has_timestamp = 1;
        s->timestamp_ms = (long long)ts;
        skip_ws(&c);
        if (c.p < c.end)
            return CR_EPROTO;
    }
    return 1;
}

const char *prom_sample_label(const struct prom_sample *s, const char *name)
{
    for (int i = 0; i < s->nlabels; i++)
        if (!strcmp(s->labels[i].name, name))
            return s->labels[i].value;
    return NULL;
}
