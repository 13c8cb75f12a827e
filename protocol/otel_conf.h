/* otel_conf.h -- the OpenTelemetry SDK environment (OTEL_*) read into one
 * struct, and the trace sampler it names. Pure: the environment is an
 * argument, nothing is read from the process, nothing is logged.
 *
 * The variables and their defaults are the OpenTelemetry specification's
 * ("SDK environment variables", "OTLP exporter"); celeriac reads:
 *   OTEL_SDK_DISABLED                  "true" (any case): no tracing at all
 *   OTEL_TRACES_EXPORTER               "none": no tracing; "otlp" (default)
 *   OTEL_EXPORTER_OTLP_ENDPOINT        base URL; "/v1/traces" is appended
 *   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT the whole URL, used as it is (wins)
 *   OTEL_EXPORTER_OTLP_PROTOCOL        http/protobuf (default) or http/json;
 *   OTEL_EXPORTER_OTLP_TRACES_PROTOCOL grpc is not spoken: tracing stays off
 *   OTEL_EXPORTER_OTLP_HEADERS         "k=v,k2=v2", values percent-encoded;
 *   OTEL_EXPORTER_OTLP_TRACES_HEADERS  its entries are added after
 *   OTEL_EXPORTER_OTLP_TIMEOUT         ms per export request (10000)
 *   OTEL_EXPORTER_OTLP_TRACES_TIMEOUT  (wins)
 *   OTEL_SERVICE_NAME                  service.name (default "celeriac"),
 *   OTEL_RESOURCE_ATTRIBUTES           wins over a service.name given here
 *   OTEL_TRACES_SAMPLER, OTEL_TRACES_SAMPLER_ARG
 * Tracing is on only when an endpoint is set: nothing set, nothing paid. */
#ifndef CR_OTEL_CONF_H
#define CR_OTEL_CONF_H

#include <stddef.h>
#include <stdint.h>

#include "../util/err.h"
#include "tracectx.h"

enum otel_sampler_kind {
    OTEL_SAMPLER_ALWAYS_ON,
    OTEL_SAMPLER_ALWAYS_OFF,
    OTEL_SAMPLER_RATIO,
    OTEL_SAMPLER_PB_ALWAYS_ON, /* the default */
    OTEL_SAMPLER_PB_ALWAYS_OFF,
    OTEL_SAMPLER_PB_RATIO,
};

struct otel_sampler {
    enum otel_sampler_kind kind;
    double ratio; /* RATIO kinds: 0..1 */
};

/* Sets s from OTEL_TRACES_SAMPLER's value (NULL or "": the default,
 * parentbased_always_on) and OTEL_TRACES_SAMPLER_ARG (the ratio; NULL, ""
 * or not a number in [0, 1]: 1.0). An unknown name falls back to the
 * default and, like a bad ratio, returns CR_EINVAL with a warning in err;
 * s is usable in every case. */
int otel_sampler_parse(struct otel_sampler *s, const char *name, const char *arg,
                       struct cr_err *err);

/* Whether a span of trace_id is recorded and exported, as the specification's
 * samplers decide: parent is the remote parent's context, or NULL for a root
 * span. Parent-based kinds follow the parent's sampled flag when there is a
 * parent and use their root sampler otherwise; TraceIdRatioBased compares
 * the trace id's low 8 bytes (big-endian) with ratio * 2^64, so every
 * service with the same ratio keeps the same traces. 1 or 0. */
int otel_sample(const struct otel_sampler *s, const struct trace_ctx *parent,
                const uint8_t trace_id[TRACE_ID_BYTES]);

#define OTEL_MAX_HEADERS 16
#define OTEL_MAX_RESOURCE 16

struct otel_kv {
    char *key;
    char *value;
};

/* Everything owned: otel_conf_release(). */
struct otel_conf {
    int enabled;      /* an endpoint, and neither disabled nor "none" */
    char *traces_url; /* NULL when not enabled */
    int json;         /* http/json; else http/protobuf */
    long timeout_ms;
    char *headers[OTEL_MAX_HEADERS]; /* "Name: value" lines */
    size_t nheaders;
    struct otel_kv resource[OTEL_MAX_RESOURCE]; /* [0] is service.name */
    size_t nresource;
    struct otel_sampler sampler;
};

/* Fills c from env (a NULL-terminated "NAME=value" array, as environ).
 * Returns 0, or CR_ENOMEM (c released). Values that are wrong are not
 * errors, as in the SDKs: the default is used and err holds a warning for
 * the caller to log once (err->code CR_EINVAL; 0 when all was well).
 * Headers and resource attributes past their bounds, with an empty name,
 * or with a header name that is not an HTTP token or a value with a
 * control byte after decoding, are skipped with a warning. */
int otel_conf_load(struct otel_conf *c, const char *const *env, struct cr_err *err);
void otel_conf_release(struct otel_conf *c);

#endif
