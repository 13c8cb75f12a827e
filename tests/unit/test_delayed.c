/* test_delayed.c -- native delayed delivery keys, names and the decision. */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "protocol/delayed.h"
#include "util/err.h"

/* Keys as kombu's calculate_routing_key() spells them (28 digits, dotted). */
static const struct {
    uint64_t s;
    const char *rk, *key;
} keys[] = {
    {1, "celery", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.celery"},
    {5, "q", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.1.q"},
    {3600, "a.b", "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.1.1.0.0.0.0.1.0.0.0.0.a.b"},
    {DELAYED_MAX_S, "x", "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.x"},
    {UINT64_C(1) << 27, "x", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.x"},
};

START_TEST(routing_keys)
{
    char out[128];
    uint64_t s;
    size_t off;
    int n = delayed_routing_key(keys[_i].s, keys[_i].rk, out, sizeof(out));
    ck_assert_int_eq(n, (int)strlen(keys[_i].key));
    ck_assert_str_eq(out, keys[_i].key);
    ck_assert_int_eq(delayed_parse_routing_key(out, strlen(out), &s, &off), 0);
    ck_assert_uint_eq(s, keys[_i].s);
    ck_assert_str_eq(out + off, keys[_i].rk);
}
END_TEST

START_TEST(routing_key_limits)
{
    char out[128], small[60];
    ck_assert_int_eq(delayed_routing_key(0, "q", out, sizeof(out)), CR_EINVAL);
    ck_assert_int_eq(delayed_routing_key(DELAYED_MAX_S + 1, "q", out, sizeof(out)),
                     CR_EINVAL);
    ck_assert_int_eq(delayed_routing_key(5, "", out, sizeof(out)), CR_EINVAL);
    ck_assert_int_eq(delayed_routing_key(5, NULL, out, sizeof(out)), CR_EINVAL);
    /* 56 digits and dots + "q" + NUL = 58 */
    ck_assert_int_eq(delayed_routing_key(5, "qq", small, 58), CR_ERANGE);
    ck_assert_str_eq(small, "");
    ck_assert_int_eq(delayed_routing_key(5, "q", small, 58), 57);
}
END_TEST

START_TEST(parse_bad)
{
    static const char *const bad[] = {
        "",
        "celery",
        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.", /* no key */
        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.q",  /* 27 digits */
        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.1.q",
        "0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0:1.q",
    };
    uint64_t s;
    size_t off;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(delayed_parse_routing_key(bad[i], strlen(bad[i]), &s, &off),
                         CR_EINVAL);
    ck_assert_int_eq(delayed_parse_routing_key(NULL, 0, &s, &off), CR_EINVAL);
}
END_TEST

/* Every prefix of a good key, fed as a length: none but the whole parses. */
START_TEST(parse_prefixes)
{
    const char *k = keys[1].key;
    size_t len = strlen(k);
    uint64_t s;
    size_t off;
    for (size_t n = 0; n < len; n++)
        ck_assert_int_eq(delayed_parse_routing_key(k, n, &s, &off),
                         n > 56 ? 0 : CR_EINVAL);
    ck_assert_int_eq(delayed_parse_routing_key(k, len, &s, &off), 0);
}
END_TEST

START_TEST(names_and_bindings)
{
    char out[80];
    ck_assert_int_eq(delayed_level_name(0, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "celery_delayed_0");
    ck_assert_int_eq(delayed_level_name(27, out, sizeof(out)), 0);
    ck_assert_str_eq(out, DELAYED_ENTRY_EXCHANGE);
    ck_assert_int_eq(delayed_level_name(28, out, sizeof(out)), CR_EINVAL);
    ck_assert_int_eq(delayed_level_name(-1, out, sizeof(out)), CR_EINVAL);
    ck_assert_int_eq(delayed_level_name(27, out, 10), CR_ERANGE);
    ck_assert_int_eq(delayed_level_binding(27, 1, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "1.#");
    ck_assert_int_eq(delayed_level_binding(27, 0, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "0.#");
    ck_assert_int_eq(delayed_level_binding(25, 1, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "*.*.1.#");
    ck_assert_int_eq(delayed_level_binding(0, 0, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.*.0.#");
    ck_assert_int_eq(delayed_level_binding(0, 2, out, sizeof(out)), CR_EINVAL);
    ck_assert_int_eq(delayed_level_binding(0, 1, out, 57), CR_ERANGE);
    ck_assert_int_eq(delayed_level_binding(0, 1, out, 58), 0);
}
END_TEST

START_TEST(decision)
{
    const int64_t now = INT64_C(1800000000000000);
    /* no eta, past, due, within the horizon: hold */
    ck_assert_uint_eq(delayed_delay_s(-1, now, 3), 0);
    ck_assert_uint_eq(delayed_delay_s(now - 5000000, now, 3), 0);
    ck_assert_uint_eq(delayed_delay_s(now, now, 3), 0);
    ck_assert_uint_eq(delayed_delay_s(now + 3000000, now, 3), 0);
    /* past the horizon: whole seconds, the fraction cut */
    ck_assert_uint_eq(delayed_delay_s(now + 3000001, now, 3), 3);
    ck_assert_uint_eq(delayed_delay_s(now + 7900000, now, 3), 7);
    /* horizon 0: anything of a second or more goes */
    ck_assert_uint_eq(delayed_delay_s(now + 999999, now, 0), 0);
    ck_assert_uint_eq(delayed_delay_s(now + 1000000, now, 0), 1);
    ck_assert_uint_eq(delayed_delay_s(now + 1500000, now, -4), 1);
    /* capped at what 28 digits spell */
    ck_assert_uint_eq(delayed_delay_s(INT64_C(253402300799999999), now, 3),
                      DELAYED_MAX_S);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("delayed");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, routing_keys, 0, (int)(sizeof(keys) / sizeof(keys[0])));
    tcase_add_test(tc, routing_key_limits);
    tcase_add_test(tc, parse_bad);
    tcase_add_test(tc, parse_prefixes);
    tcase_add_test(tc, names_and_bindings);
    tcase_add_test(tc, decision);
    suite_add_tcase(s, tc);
    return s;
}
