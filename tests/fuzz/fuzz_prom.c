/* fuzz_prom.c -- libFuzzer target: bytes -> Prometheus text lines -> parser, and
 * parsed samples back through a registry and the renderer. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "protocol/prom.h"
#include "util/alloc.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every line is parsed; each sample that parses is counted into a registry
 * (label names as given), whose rendering must parse again line by line. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    struct prom_registry *r = prom_registry_new();
    struct buf out;

    buf_init(&out);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        struct prom_sample s;
        if (prom_parse_line(p, n, &s) == 1 && r) {
            const char *names[PROM_MAX_LABELS], *values[PROM_MAX_LABELS];
            struct prom_family *f;
            for (int i = 0; i < s.nlabels; i++) {
                names[i] = s.labels[i].name;
                values[i] = s.labels[i].value;
            }
            f = prom_family_add(r, s.name, "fuzz", PROM_GAUGE, names, s.nlabels, NULL, 0);
            if (f)
                prom_set(f, values, s.value);
        }
        p += n + 1;
    }
    if (r && prom_render(r, &out) == 0 && out.data) {
        const char *q = out.data, *e = out.data + out.len;
        while (q < e) {
            const char *nl = memchr(q, '\n', (size_t)(e - q));
            size_t n = nl ? (size_t)(nl - q) : (size_t)(e - q);
            struct prom_sample s;
            if (prom_parse_line(q, n, &s) < 0)
                __builtin_trap(); /* what we render must read back */
            q += n + 1;
        }
    }
    buf_release(&out);
    prom_registry_free(r);
    return 0;
}
