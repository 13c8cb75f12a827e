/* prom.h -- Prometheus metrics: a registry of counters, gauges and histograms
 * with labels, rendered in the text exposition format (version 0.0.4), and a
 * line parser for the same format (celeriac top, tests). Pure: no I/O, no
 * clock. Not thread-safe.
 *
 * Label sets are bounded per family: past max_series, new label sets are
 * folded into one series whose every label value is "other", so a flood of
 * distinct task names cannot grow memory without limit. */
#ifndef CR_PROM_H
#define CR_PROM_H

#include <stddef.h>

#include "../util/buf.h"

enum prom_type { PROM_COUNTER, PROM_GAUGE, PROM_HISTOGRAM };

#define PROM_MAX_LABELS 8
#define PROM_MAX_BUCKETS 32
#define PROM_DEFAULT_MAX_SERIES 500

struct prom_registry;
struct prom_family;

/* Returns a new, empty registry, or NULL on OOM. Free with prom_registry_free(). */
struct prom_registry *prom_registry_new(void);
/* Frees the registry and every family in it. NULL is a no-op. */
void prom_registry_free(struct prom_registry *r);

/* Adds a family. name, help and the label names are copied; buckets (upper
 * bounds, strictly increasing, +Inf implied) are copied and used only by
 * histograms. Returns the family, owned by r until prom_registry_free(), or
 * NULL on OOM or invalid input (bad metric or label name, a label called
 * "le" on a histogram, too many labels or buckets, unsorted buckets, a
 * duplicate family name). */
struct prom_family *prom_family_add(struct prom_registry *r, const char *name,
                                    const char *help, enum prom_type type,
                                    const char *const *label_names, int nlabels,
                                    const double *buckets, int nbuckets);
/* Changes the series bound of f (default PROM_DEFAULT_MAX_SERIES, at least 1). */
void prom_family_set_max_series(struct prom_family *f, size_t max_series);

/* The value updates take one label value per label name (copied when a new
 * series is made; NULL counts as ""). Each returns 0, CR_EINVAL (wrong family
 * type; a negative counter increment) or CR_ENOMEM (nothing changed). */
int prom_add(struct prom_family *f, const char *const *values,
             double v); /* counter, gauge */
int prom_set(struct prom_family *f, const char *const *values,
             double v); /* gauge, counter */
int prom_observe(struct prom_family *f, const char *const *values,
                 double v); /* histogram */
/* Removes every series of f (for gauges refreshed from polls). */
void prom_family_clear(struct prom_family *f);
/* Number of series in f. */
size_t prom_family_series(const struct prom_family *f);

/* Appends the whole registry: families in the order they were added, series in
 * the order they appeared, "# HELP" and "# TYPE" lines first; histograms as
 * cumulative _bucket{le=...} lines, then _sum and _count. Label values and help
 * text are escaped as the format requires. Returns 0 or CR_ENOMEM (out may
 * hold a partial text). */
int prom_render(const struct prom_registry *r, struct buf *out);

/* Appends a sample value as the format spells it: integers without a fraction,
 * other numbers in the shortest form that reads back exactly, +Inf, -Inf, NaN. */
int prom_format_value(double v, struct buf *out);

/* ------------------------------------------------------------- parsing */

struct prom_label {
    char name[64];
    char value[256];
};

/* One sample line. Names and values longer than the fields are refused. */
struct prom_sample {
    char name[128];
    int nlabels;
    struct prom_label labels[PROM_MAX_LABELS];
    double value;
    int has_timestamp;
    long long timestamp_ms;
};

/* Parses one line (len bytes, no newline needed, a trailing "\r" ignored).
 * Returns 1 with *s filled for a sample, 0 for a blank or comment line, or
 * CR_EPROTO for anything else (bad name, bad escape, unterminated labels,
 * bad number, too many or too long labels). */
int prom_parse_line(const char *line, size_t len, struct prom_sample *s);

/* The value of label name in s, or NULL. Borrowed from s. */
const char *prom_sample_label(const struct prom_sample *s, const char *name);

#endif
