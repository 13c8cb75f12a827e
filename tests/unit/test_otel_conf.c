/* test_otel_conf.c -- the OTEL_* environment and the samplers. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/otel_conf.h"
#include "util/alloc.h"
#include "util/err.h"

static void id_with_low(uint8_t id[16], uint64_t low)
{
    memset(id, 0xab, 8);
    for (int i = 0; i < 8; i++)
        id[15 - i] = (uint8_t)(low >> (8 * i));
}

START_TEST(test_sampler_names)
{
    struct otel_sampler s;
    struct cr_err err = {0};
    ck_assert_int_eq(otel_sampler_parse(&s, NULL, NULL, &err), 0);
    ck_assert_int_eq(s.kind, OTEL_SAMPLER_PB_ALWAYS_ON);
    ck_assert_int_eq(otel_sampler_parse(&s, "always_off", "0.5", &err), 0);
    ck_assert_int_eq(s.kind, OTEL_SAMPLER_ALWAYS_OFF);
    ck_assert_int_eq(otel_sampler_parse(&s, "traceidratio", "0.25", &err), 0);
    ck_assert_int_eq(s.kind, OTEL_SAMPLER_RATIO);
    ck_assert(s.ratio == 0.25);
    ck_assert_int_eq(otel_sampler_parse(&s, "parentbased_traceidratio", "", &err), 0);
    ck_assert(s.ratio == 1.0);
    ck_assert_int_eq(otel_sampler_parse(&s, "traceidratio", "1.5", &err), CR_EINVAL);
    ck_assert(s.ratio == 1.0);
    ck_assert_int_eq(otel_sampler_parse(&s, "traceidratio", "0.5x", &err), CR_EINVAL);
    ck_assert_int_eq(otel_sampler_parse(&s, "traceidratio", "nan", &err), CR_EINVAL);
    ck_assert_int_eq(otel_sampler_parse(&s, "sometimes", NULL, &err), CR_EINVAL);
    ck_assert_int_eq(s.kind, OTEL_SAMPLER_PB_ALWAYS_ON);
    ck_assert_ptr_nonnull(strstr(err.msg, "sometimes"));
    ck_assert_int_eq(otel_sampler_parse(&s, "parentbased_always_off", NULL, &err), 0);
    ck_assert_int_eq(s.kind, OTEL_SAMPLER_PB_ALWAYS_OFF);
}
END_TEST

START_TEST(test_sampler_decisions)
{
    struct otel_sampler s;
    struct trace_ctx on, off;
    uint8_t id[16];

    memset(&on, 0, sizeof(on));
    on.flags = 1;
    off = on;
    off.flags = 0;
    id_with_low(id, 0);

    s.kind = OTEL_SAMPLER_ALWAYS_ON;
    ck_assert_int_eq(otel_sample(&s, &off, id), 1);
    s.kind = OTEL_SAMPLER_ALWAYS_OFF;
    ck_assert_int_eq(otel_sample(&s, &on, id), 0);
    s.kind = OTEL_SAMPLER_PB_ALWAYS_ON;
    ck_assert_int_eq(otel_sample(&s, NULL, id), 1);
    ck_assert_int_eq(otel_sample(&s, &on, id), 1);
    ck_assert_int_eq(otel_sample(&s, &off, id), 0);
    s.kind = OTEL_SAMPLER_PB_ALWAYS_OFF;
    ck_assert_int_eq(otel_sample(&s, NULL, id), 0);
    ck_assert_int_eq(otel_sample(&s, &on, id), 1);

    /* ratio 0.5: the bound is 2^63 on the low 8 bytes, the high 8 ignored */
    s.kind = OTEL_SAMPLER_RATIO;
    s.ratio = 0.5;
    id_with_low(id, UINT64_C(0x7fffffffffffffff));
    ck_assert_int_eq(otel_sample(&s, &off, id), 1);
    id_with_low(id, UINT64_C(0x8000000000000000));
    ck_assert_int_eq(otel_sample(&s, &on, id), 0);
    s.ratio = 0.0;
    id_with_low(id, 0);
    ck_assert_int_eq(otel_sample(&s, NULL, id), 0);
    s.ratio = 1.0;
    id_with_low(id, UINT64_MAX);
    ck_assert_int_eq(otel_sample(&s, NULL, id), 1);
    /* parent-based ratio: the parent decides, the ratio only for roots */
    s.kind = OTEL_SAMPLER_PB_RATIO;
    s.ratio = 0.5;
    ck_assert_int_eq(otel_sample(&s, &on, id), 1);
    ck_assert_int_eq(otel_sample(&s, NULL, id), 0);
    id_with_low(id, 5);
    ck_assert_int_eq(otel_sample(&s, &off, id), 0);
    ck_assert_int_eq(otel_sample(&s, NULL, id), 1);
}
END_TEST

START_TEST(test_sampler_ratio_share)
{
    /* about ratio of uniformly spread ids are kept */
    struct otel_sampler s = {OTEL_SAMPLER_RATIO, 0.1};
    struct trace_rng r;
    uint8_t id[16];
    int kept = 0;
    trace_rng_seed(&r, 7);
    for (int i = 0; i < 100000; i++) {
        trace_rng_trace_id(&r, id);
        kept += otel_sample(&s, NULL, id);
    }
    ck_assert_int_gt(kept, 9500);
    ck_assert_int_lt(kept, 10500);
}
END_TEST

START_TEST(test_conf_nothing)
{
    const char *env[] = {"PATH=/bin", "OTEL_SERVICE_NAME=x", NULL};
    struct otel_conf c;
    struct cr_err err = {0};
    ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
    ck_assert_int_eq(c.enabled, 0);
    ck_assert_ptr_null(c.traces_url);
    ck_assert_uint_eq(c.nresource, 0);
    otel_conf_release(&c);
    ck_assert_int_eq(otel_conf_load(&c, NULL, &err), 0);
    ck_assert_int_eq(c.enabled, 0);
    otel_conf_release(&c);
}
END_TEST

START_TEST(test_conf_full)
{
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318/",
                         "OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
                         "OTEL_EXPORTER_OTLP_HEADERS=api-key=s%20e%2Ccret , x-tenant = "
                         "t1,bad name=1,=x,noeq",
                         "OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,service."
                         "name=fromres,a=%3D1",
                         "OTEL_TRACES_SAMPLER=traceidratio",
                         "OTEL_TRACES_SAMPLER_ARG=0.5",
                         "OTEL_EXPORTER_OTLP_TIMEOUT=2500",
                         NULL};
    struct otel_conf c;
    struct cr_err err = {0};
    ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
    ck_assert_int_eq(c.enabled, 1);
    ck_assert_str_eq(c.traces_url, "http://collector:4318/v1/traces");
    ck_assert_int_eq(c.json, 1);
    ck_assert_int_eq(c.timeout_ms, 2500);
    ck_assert_uint_eq(c.nheaders, 2);
    ck_assert_str_eq(c.headers[0], "api-key: s e,cret");
    ck_assert_str_eq(c.headers[1], "x-tenant: t1");
    ck_assert_int_eq(err.code, CR_EINVAL); /* "bad name" skipped */
    ck_assert_ptr_null(strstr(err.msg, "=1"));
    ck_assert_uint_eq(c.nresource, 3);
    ck_assert_str_eq(c.resource[0].key, "service.name");
    ck_assert_str_eq(c.resource[0].value, "fromres");
    ck_assert_str_eq(c.resource[1].key, "deployment.environment");
    ck_assert_str_eq(c.resource[2].value, "=1");
    ck_assert_int_eq(c.sampler.kind, OTEL_SAMPLER_RATIO);
    ck_assert(c.sampler.ratio == 0.5);
    otel_conf_release(&c);
}
END_TEST

START_TEST(test_conf_variants)
{
    struct otel_conf c;
    struct cr_err err = {0};
    {
        /* the traces endpoint is used as it is, and wins; service name wins */
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1",
                             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://b:2/custom",
                             "OTEL_SERVICE_NAME=svc",
                             "OTEL_RESOURCE_ATTRIBUTES=service.name=no", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_str_eq(c.traces_url, "http://b:2/custom");
        ck_assert_int_eq(c.json, 0);
        ck_assert_int_eq(c.timeout_ms, 10000);
        ck_assert_uint_eq(c.nresource, 1);
        ck_assert_str_eq(c.resource[0].value, "svc");
        ck_assert_int_eq(c.sampler.kind, OTEL_SAMPLER_PB_ALWAYS_ON);
        otel_conf_release(&c);
    }
    {
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_str_eq(c.traces_url, "http://a:1/v1/traces");
        ck_assert_str_eq(c.resource[0].value, "celeriac");
        otel_conf_release(&c);
    }
    {
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1",
                             "OTEL_SDK_DISABLED=TRUE", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_int_eq(c.enabled, 0);
        otel_conf_release(&c);
    }
    {
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1",
                             "OTEL_TRACES_EXPORTER=none", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_int_eq(c.enabled, 0);
        otel_conf_release(&c);
    }
    {
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1",
                             "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_int_eq(c.enabled, 0);
        ck_assert_int_eq(err.code, CR_EINVAL);
        otel_conf_release(&c);
    }
    {
        /* the traces protocol wins over the general one */
        const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1",
                             "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
                             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
                             "OTEL_EXPORTER_OTLP_TIMEOUT=-3", NULL};
        ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
        ck_assert_int_eq(c.enabled, 1);
        ck_assert_int_eq(c.timeout_ms, 10000);
        otel_conf_release(&c);
    }
}
END_TEST

START_TEST(test_conf_bounds)
{
    char hdr[4096] = "OTEL_EXPORTER_OTLP_HEADERS=",
         res[4096] = "OTEL_RESOURCE_ATTRIBUTES=";
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://a:1", hdr, res, NULL};
    struct otel_conf c;
    struct cr_err err = {0};
    for (int i = 0; i < 40; i++) {
        size_t n = strlen(hdr), m = strlen(res);
        snprintf(hdr + n, sizeof(hdr) - n, "h%d=v,", i);
        snprintf(res + m, sizeof(res) - m, "r%d=v,", i);
    }
    ck_assert_int_eq(otel_conf_load(&c, env, &err), 0);
    ck_assert_uint_eq(c.nheaders, OTEL_MAX_HEADERS);
    ck_assert_uint_eq(c.nresource, OTEL_MAX_RESOURCE);
    ck_assert_str_eq(c.resource[0].key, "service.name");
    otel_conf_release(&c);
}
END_TEST

START_TEST(test_conf_oom)
{
    const char *env[] = {"OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318",
                         "OTEL_EXPORTER_OTLP_HEADERS=a=1,b=2",
                         "OTEL_RESOURCE_ATTRIBUTES=x=1,y=2", NULL};
    struct otel_conf c;
    struct cr_err err = {0};
    long n;
    for (n = 1; n < 200; n++) {
        int rc;
        cr_alloc_fail_after(n);
        rc = otel_conf_load(&c, env, &err);
        cr_alloc_fail_after(0);
        if (rc == 0) {
            ck_assert_int_eq(c.enabled, 1);
            ck_assert_uint_eq(c.nheaders, 2);
            ck_assert_uint_eq(c.nresource, 3);
            otel_conf_release(&c);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_ptr_null(c.traces_url);
    }
    ck_assert_int_lt(n, 200);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("otel_conf");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_sampler_names);
    tcase_add_test(tc, test_sampler_decisions);
    tcase_add_test(tc, test_sampler_ratio_share);
    tcase_add_test(tc, test_conf_nothing);
    tcase_add_test(tc, test_conf_full);
    tcase_add_test(tc, test_conf_variants);
    tcase_add_test(tc, test_conf_bounds);
    tcase_add_test(tc, test_conf_oom);
    suite_add_tcase(s, tc);
    return s;
}
