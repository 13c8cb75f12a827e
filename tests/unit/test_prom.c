/* test_prom.c -- Prometheus registry, text rendering and line parsing. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "protocol/prom.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

static const char *const task_state[] = {"task", "state"};
static const char *const model_l[] = {"model"};
static const double buckets[] = {0.1, 1, 10};

/* A registry with one family of each type and a few samples. */
static struct prom_registry *sample_registry(int *rc)
{
    struct prom_registry *r = prom_registry_new();
    struct prom_family *c, *g, *h;
    const char *v1[] = {"llm.generate", "SUCCESS"};
    const char *v2[] = {"llm.chat", "FAILURE"};
    const char *m[] = {"gpt \"x\"\n\\"};
    *rc = CR_ENOMEM;
    if (!r)
        return NULL;
    c = prom_family_add(r, "celeriac_tasks_total", "Tasks by name and final state.",
                        PROM_COUNTER, task_state, 2, NULL, 0);
    g = prom_family_add(r, "celeriac_in_flight", "Tasks running\nnow \\ here.",
                        PROM_GAUGE, NULL, 0, NULL, 0);
    h = prom_family_add(r, "celeriac_llm_seconds", "LLM time.", PROM_HISTOGRAM, model_l,
                        1, buckets, 3);
    if (!c || !g || !h)
        return r;
    if ((*rc = prom_add(c, v1, 1)) || (*rc = prom_add(c, v1, 2)) ||
        (*rc = prom_add(c, v2, 1)) || (*rc = prom_set(g, NULL, 3)) ||
        (*rc = prom_observe(h, m, 0.05)) || (*rc = prom_observe(h, m, 0.1)) ||
        (*rc = prom_observe(h, m, 5)) || (*rc = prom_observe(h, m, 100)))
        return r;
    *rc = 0;
    return r;
}

static const char sample_text[] =
    "# HELP celeriac_tasks_total Tasks by name and final state.\n"
    "# TYPE celeriac_tasks_total counter\n"
    "celeriac_tasks_total{task=\"llm.generate\",state=\"SUCCESS\"} 3\n"
    "celeriac_tasks_total{task=\"llm.chat\",state=\"FAILURE\"} 1\n"
    "# HELP celeriac_in_flight Tasks running\\nnow \\\\ here.\n"
    "# TYPE celeriac_in_flight gauge\n"
    "celeriac_in_flight 3\n"
    "# HELP celeriac_llm_seconds LLM time.\n"
    "# TYPE celeriac_llm_seconds histogram\n"
    "celeriac_llm_seconds_bucket{model=\"gpt \\\"x\\\"\\n\\\\\",le=\"0.1\"} 2\n"
    "celeriac_llm_seconds_bucket{model=\"gpt \\\"x\\\"\\n\\\\\",le=\"1\"} 2\n"
    "celeriac_llm_seconds_bucket{model=\"gpt \\\"x\\\"\\n\\\\\",le=\"10\"} 3\n"
    "celeriac_llm_seconds_bucket{model=\"gpt \\\"x\\\"\\n\\\\\",le=\"+Inf\"} 4\n"
    "celeriac_llm_seconds_sum{model=\"gpt \\\"x\\\"\\n\\\\\"} 105.15\n"
    "celeriac_llm_seconds_count{model=\"gpt \\\"x\\\"\\n\\\\\"} 4\n";

START_TEST(test_render)
{
    int rc;
    struct prom_registry *r = sample_registry(&rc);
    struct buf b;
    ck_assert_int_eq(rc, 0);
    buf_init(&b);
    ck_assert_int_eq(prom_render(r, &b), 0);
    ck_assert_str_eq(b.data, sample_text);
    buf_release(&b);
    prom_registry_free(r);
}
END_TEST

/* Every rendered line parses, and the escaped label comes back unescaped. */
START_TEST(test_render_parse_round_trip)
{
    const char *p = sample_text;
    int samples = 0;
    while (*p) {
        const char *nl = strchr(p, '\n');
        struct prom_sample s;
        int rc = prom_parse_line(p, (size_t)(nl - p), &s);
        ck_assert_int_ge(rc, 0);
        if (rc == 1) {
            samples++;
            if (!strcmp(s.name, "celeriac_llm_seconds_sum")) {
                ck_assert_str_eq(prom_sample_label(&s, "model"), "gpt \"x\"\n\\");
                ck_assert_double_eq_tol(s.value, 105.15, 1e-9);
            }
            if (!strcmp(s.name, "celeriac_tasks_total") &&
                !strcmp(prom_sample_label(&s, "state"), "SUCCESS"))
                ck_assert_double_eq(s.value, 3);
        }
        p = nl + 1;
    }
    ck_assert_int_eq(samples, 9);
}
END_TEST

static const struct {
    double v;
    const char *want;
} values[] = {
    {0, "0"},
    {-0.0, "0"},
    {1, "1"},
    {-42, "-42"},
    {0.1, "0.1"},
    {1e-05, "1.0000000000000001e-05"},
    {2.5e20, "2.5e+20"},
    {1.0 / 3, "0.33333333333333331"},
    {123456789012345.0, "123456789012345"},
};

START_TEST(test_format_value)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(prom_format_value(values[_i].v, &b), 0);
    if (_i == 5) /* shortest round-trip form is either spelling */
        ck_assert(!strcmp(b.data, "1e-05") || !strcmp(b.data, values[_i].want));
    else
        ck_assert_str_eq(b.data, values[_i].want);
    buf_release(&b);
}
END_TEST

START_TEST(test_format_special)
{
    struct buf b;
    buf_init(&b);
    prom_format_value(INFINITY, &b);
    buf_putc(&b, ' ');
    prom_format_value(-INFINITY, &b);
    buf_putc(&b, ' ');
    prom_format_value(NAN, &b);
    ck_assert_str_eq(b.data, "+Inf -Inf NaN");
    buf_release(&b);
}
END_TEST

START_TEST(test_bad_families)
{
    struct prom_registry *r = prom_registry_new();
    const char *le[] = {"le"};
    const char *bad_label[] = {"9x"};
    const char *reserved[] = {"__name"};
    const double unsorted[] = {1, 0.5};
    const double with_inf[] = {1, INFINITY};
    ck_assert_ptr_null(prom_family_add(r, "", "", PROM_GAUGE, NULL, 0, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "9abc", "", PROM_GAUGE, NULL, 0, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "a-b", "", PROM_GAUGE, NULL, 0, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "h", "", PROM_HISTOGRAM, le, 1, buckets, 3));
    ck_assert_ptr_null(prom_family_add(r, "h", "", PROM_HISTOGRAM, NULL, 0, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "h", "", PROM_HISTOGRAM, NULL, 0, unsorted, 2));
    ck_assert_ptr_null(prom_family_add(r, "h", "", PROM_HISTOGRAM, NULL, 0, with_inf, 2));
    ck_assert_ptr_null(prom_family_add(r, "g", "", PROM_GAUGE, bad_label, 1, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "g", "", PROM_GAUGE, reserved, 1, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "g", "", PROM_GAUGE, NULL, 9, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "g", "", (enum prom_type)7, NULL, 0, NULL, 0));
    ck_assert_ptr_nonnull(prom_family_add(r, "ns:g_1", "", PROM_GAUGE, le, 1, NULL, 0));
    ck_assert_ptr_null(prom_family_add(r, "ns:g_1", "", PROM_GAUGE, NULL, 0, NULL, 0));
    prom_registry_free(r);
}
END_TEST

START_TEST(test_wrong_updates)
{
    struct prom_registry *r = prom_registry_new();
    struct prom_family *c = prom_family_add(r, "c", "", PROM_COUNTER, NULL, 0, NULL, 0);
    struct prom_family *h =
        prom_family_add(r, "h", "", PROM_HISTOGRAM, NULL, 0, buckets, 3);
    ck_assert_int_eq(prom_add(c, NULL, -1), CR_EINVAL);
    ck_assert_int_eq(prom_add(c, NULL, NAN), CR_EINVAL);
    ck_assert_int_eq(prom_observe(c, NULL, 1), CR_EINVAL);
    ck_assert_int_eq(prom_add(h, NULL, 1), CR_EINVAL);
    ck_assert_int_eq(prom_set(h, NULL, 1), CR_EINVAL);
    /* a counter may be set (from a total kept elsewhere) */
    ck_assert_int_eq(prom_set(c, NULL, 7), 0);
    ck_assert_uint_eq(prom_family_series(c), 1);
    prom_family_clear(c);
    ck_assert_uint_eq(prom_family_series(c), 0);
    prom_registry_free(r);
}
END_TEST

START_TEST(test_series_bound)
{
    struct prom_registry *r = prom_registry_new();
    struct prom_family *c =
        prom_family_add(r, "c_total", "", PROM_COUNTER, task_state, 2, NULL, 0);
    struct buf b;
    char name[16];
    prom_family_set_max_series(c, 3);
    for (int i = 0; i < 10; i++) {
        const char *v[] = {name, "SUCCESS"};
        snprintf(name, sizeof(name), "t%d", i);
        ck_assert_int_eq(prom_add(c, v, 1), 0);
    }
    /* a known label set still gets its own series */
    {
        const char *v[] = {"t0", "SUCCESS"};
        ck_assert_int_eq(prom_add(c, v, 1), 0);
    }
    ck_assert_uint_eq(prom_family_series(c), 4);
    buf_init(&b);
    prom_render(r, &b);
    ck_assert_ptr_nonnull(strstr(b.data, "c_total{task=\"t0\",state=\"SUCCESS\"} 2\n"));
    ck_assert_ptr_nonnull(strstr(b.data, "c_total{task=\"other\",state=\"other\"} 7\n"));
    buf_release(&b);
    /* NULL label values are "" and distinct from the other sets */
    {
        const char *v[] = {NULL, NULL};
        prom_family_set_max_series(c, 100);
        ck_assert_int_eq(prom_add(c, v, 1), 0);
        ck_assert_uint_eq(prom_family_series(c), 5);
    }
    prom_registry_free(r);
}
END_TEST

/* Label sets that would collide if values were only joined by a separator. */
START_TEST(test_series_keys_distinct)
{
    struct prom_registry *r = prom_registry_new();
    struct prom_family *c =
        prom_family_add(r, "c", "", PROM_GAUGE, task_state, 2, NULL, 0);
    const char *a[] = {"a:1", "b"};
    const char *b[] = {"a", "1:b"};
    ck_assert_int_eq(prom_set(c, a, 1), 0);
    ck_assert_int_eq(prom_set(c, b, 2), 0);
    ck_assert_uint_eq(prom_family_series(c), 2);
    prom_registry_free(r);
}
END_TEST

/* ------------------------------------------------------------------ parser */

static const struct {
    const char *line;
    int rc;
    const char *name;
    int nlabels;
    double value;
} lines[] = {
    {"", 0, NULL, 0, 0},
    {"   ", 0, NULL, 0, 0},
    {"# HELP x y", 0, NULL, 0, 0},
    {"#", 0, NULL, 0, 0},
    {"up 1", 1, "up", 0, 1},
    {"up 1\r", 1, "up", 0, 1},
    {"up{} 2", 1, "up", 0, 2},
    {"a_b:c{x=\"1\",y=\"\"} -3.5", 1, "a_b:c", 2, -3.5},
    {"m{x=\"1\",} 4 1700000000000", 1, "m", 1, 4},
    {"  m { x = \"v\" } 1e3", 1, "m", 1, 1000},
    {"m +Inf", 1, "m", 0, INFINITY},
    {"m -Inf", 1, "m", 0, -INFINITY},
    {"m{l=\"a\\\\b\\\"c\\nd\"} 0", 1, "m", 1, 0},
    {"m", CR_EPROTO, NULL, 0, 0},
    {"m ", CR_EPROTO, NULL, 0, 0},
    {"m abc", CR_EPROTO, NULL, 0, 0},
    {"m 0x10", CR_EPROTO, NULL, 0, 0},
    {"m infinity", CR_EPROTO, NULL, 0, 0},
    {"m 1 2 3", CR_EPROTO, NULL, 0, 0},
    {"m 1 2.5", CR_EPROTO, NULL, 0, 0},
    {"9m 1", CR_EPROTO, NULL, 0, 0},
    {"{x=\"1\"} 1", CR_EPROTO, NULL, 0, 0},
    {"m{x=\"1\" 1", CR_EPROTO, NULL, 0, 0},
    {"m{x=\"1} 1", CR_EPROTO, NULL, 0, 0},
    {"m{x=1} 1", CR_EPROTO, NULL, 0, 0},
    {"m{x} 1", CR_EPROTO, NULL, 0, 0},
    {"m{x=\"\\t\"} 1", CR_EPROTO, NULL, 0, 0},
    {"m{x=\"a\" y=\"b\"} 1", CR_EPROTO, NULL, 0, 0},
    {"m{a=\"\",b=\"\",c=\"\",d=\"\",e=\"\",f=\"\",g=\"\",h=\"\",i=\"\"} 1", CR_EPROTO,
     NULL, 0, 0},
};

START_TEST(test_parse_lines)
{
    struct prom_sample s;
    int rc = prom_parse_line(lines[_i].line, strlen(lines[_i].line), &s);
    ck_assert_int_eq(rc, lines[_i].rc);
    if (rc != 1)
        return;
    ck_assert_str_eq(s.name, lines[_i].name);
    ck_assert_int_eq(s.nlabels, lines[_i].nlabels);
    if (isinf(lines[_i].value))
        ck_assert(isinf(s.value) && (s.value > 0) == (lines[_i].value > 0));
    else
        ck_assert_double_eq_tol(s.value, lines[_i].value, 1e-12);
}
END_TEST

START_TEST(test_parse_details)
{
    struct prom_sample s;
    const char *l = "m{l=\"a\\\\b\\\"c\\nd\"} NaN 17";
    ck_assert_int_eq(prom_parse_line(l, strlen(l), &s), 1);
    ck_assert_str_eq(prom_sample_label(&s, "l"), "a\\b\"c\nd");
    ck_assert_ptr_null(prom_sample_label(&s, "nope"));
    ck_assert(isnan(s.value));
    ck_assert_int_eq(s.has_timestamp, 1);
    ck_assert_int_eq(s.timestamp_ms, 17);
}
END_TEST

START_TEST(test_parse_limits)
{
    char line[700];
    struct prom_sample s;
    memset(line, 'a', 200);
    memcpy(line + 200, " 1", 3);
    ck_assert_int_eq(prom_parse_line(line, strlen(line), &s), CR_EPROTO);
    memcpy(line, "m{l=\"", 5);
    memset(line + 5, 'v', 300);
    memcpy(line + 305, "\"} 1", 5);
    ck_assert_int_eq(prom_parse_line(line, strlen(line), &s), CR_EPROTO);
    /* not NUL-terminated: only len bytes count */
    ck_assert_int_eq(prom_parse_line("up 12345", 4, &s), 1);
    ck_assert_double_eq(s.value, 1);
}
END_TEST

/* Every prefix of every sample line is either refused or read without
 * running past its end. */
START_TEST(test_parse_prefixes)
{
    const char *p = sample_text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        for (size_t n = 0; n <= (size_t)(nl - p); n++) {
            char *copy = cr_malloc(n ? n : 1);
            struct prom_sample s;
            memcpy(copy, p, n);
            ck_assert_int_ge(prom_parse_line(copy, n, &s), CR_EPROTO);
            cr_free(copy);
        }
        p = nl + 1;
    }
}
END_TEST

/* --------------------------------------------------------------------- OOM */

START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1;; n++) {
        int rc;
        struct prom_registry *r;
        struct buf b;
        buf_init(&b);
        cr_alloc_fail_after(n);
        r = sample_registry(&rc);
        if (!rc)
            rc = prom_render(r, &b);
        cr_alloc_fail_after(0);
        if (!rc)
            ck_assert_str_eq(b.data, sample_text);
        prom_registry_free(r);
        buf_release(&b);
        if (!rc)
            break;
    }
    ck_assert(n > 10);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("prom");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_render);
    tcase_add_test(tc, test_render_parse_round_trip);
    tcase_add_loop_test(tc, test_format_value, 0, sizeof(values) / sizeof(values[0]));
    tcase_add_test(tc, test_format_special);
    tcase_add_test(tc, test_bad_families);
    tcase_add_test(tc, test_wrong_updates);
    tcase_add_test(tc, test_series_bound);
    tcase_add_test(tc, test_series_keys_distinct);
    tcase_add_loop_test(tc, test_parse_lines, 0, sizeof(lines) / sizeof(lines[0]));
    tcase_add_test(tc, test_parse_details);
    tcase_add_test(tc, test_parse_limits);
    tcase_add_test(tc, test_parse_prefixes);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
