/* test_revoked_stamps.c -- engine/revoked: Celery's revoked stamps
 * (revoke_by_stamped_headers) and the match a delivery goes through. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "engine/revoked.h"
#include "util/alloc.h"
#include "util/err.h"

static int add(struct revoked_stamps *s, const char *json)
{
    cJSON *h = cJSON_Parse(json);
    int rc;
    ck_assert_ptr_nonnull(h);
    rc = revoked_stamps_add(s, h);
    cJSON_Delete(h);
    return rc;
}

/* Matches a message whose headers are json; the stamp name and the value
 * (as compact JSON) that matched go to name/value. */
static int match(const struct revoked_stamps *s, const char *json, char *name,
                 char *value)
{
    cJSON *h = cJSON_Parse(json);
    const char *n = NULL;
    const cJSON *v = NULL;
    int m;
    ck_assert_ptr_nonnull(h);
    m = revoked_stamps_match(s, h, &n, &v);
    name[0] = value[0] = '\0';
    if (m) {
        char *t = cJSON_PrintUnformatted(v);
        strcpy(name, n);
        strcpy(value, t);
        cJSON_free(t);
    }
    cJSON_Delete(h);
    return m;
}

START_TEST(test_scalar_and_list_values)
{
    struct revoked_stamps s;
    char n[64], v[64];
    revoked_stamps_init(&s);
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": \"a\"}}", n, v), 0);
    ck_assert_int_eq(add(&s, "{\"m\": \"a\"}"), 0);
    ck_assert_int_eq(add(&s, "{\"m\": [\"b\", \"c\"], \"k\": 7}"), 0);
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": \"a\"}}", n, v), 1);
    ck_assert_str_eq(n, "m");
    ck_assert_str_eq(v, "\"a\"");
    /* the message's list: any of its values */
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": [\"x\", \"c\"]}}",
              n, v),
        1);
    ck_assert_str_eq(v, "\"c\"");
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": [\"x\", \"y\"]}}",
              n, v),
        0);
    /* values compare as JSON: 7 is not "7" */
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"k\"], \"stamps\": {\"k\": 7}}", n, v), 1);
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"k\"], \"stamps\": {\"k\": \"7\"}}", n, v), 0);
    revoked_stamps_release(&s);
}
END_TEST

START_TEST(test_first_revoked_header_decides)
{
    /* Celery looks at the message's stamped headers in order and stops at the
     * first one with revoked values, matched or not. */
    struct revoked_stamps s;
    char n[64], v[64];
    revoked_stamps_init(&s);
    ck_assert_int_eq(add(&s, "{\"a\": \"1\", \"b\": \"2\"}"), 0);
    ck_assert_int_eq(match(&s,
                           "{\"stamped_headers\": [\"z\", \"b\", \"a\"], "
                           "\"stamps\": {\"z\": \"2\", \"b\": \"2\", \"a\": \"9\"}}",
                           n, v),
                     1);
    ck_assert_str_eq(n, "b");
    ck_assert_int_eq(match(&s,
                           "{\"stamped_headers\": [\"a\", \"b\"], "
                           "\"stamps\": {\"a\": \"9\", \"b\": \"2\"}}",
                           n, v),
                     0);
    /* only the names in stamped_headers count */
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [], \"stamps\": {\"a\": \"1\"}}", n, v), 0);
    revoked_stamps_release(&s);
}
END_TEST

START_TEST(test_malformed_headers)
{
    static const char *const msgs[] = {
        "{}",
        "{\"stamped_headers\": \"a\", \"stamps\": {\"a\": \"1\"}}",
        "{\"stamped_headers\": [1, null, {}], \"stamps\": {\"a\": \"1\"}}",
        "{\"stamped_headers\": [\"a\"]}",
        "{\"stamped_headers\": [\"a\"], \"stamps\": [\"1\"]}",
        "{\"stamped_headers\": [\"a\"], \"stamps\": {\"a\": null}}",
        "{\"stamped_headers\": [\"a\"], \"stamps\": {\"a\": []}}",
        "[]",
        "null",
    };
    struct revoked_stamps s;
    char n[64], v[64];
    revoked_stamps_init(&s);
    ck_assert_int_eq(add(&s, "[\"a=1\"]"), CR_EINVAL);
    ck_assert_int_eq(add(&s, "\"a\""), CR_EINVAL);
    ck_assert_int_eq(revoked_stamps_add(&s, NULL), CR_EINVAL);
    ck_assert_int_eq(add(&s, "{\"a\": \"1\"}"), 0);
    for (size_t i = 0; i < sizeof(msgs) / sizeof(msgs[0]); i++)
        ck_assert_msg(!match(&s, msgs[i], n, v), "%s", msgs[i]);
    ck_assert_int_eq(revoked_stamps_match(&s, NULL, NULL, NULL), 0);
    revoked_stamps_release(&s);
}
END_TEST

START_TEST(test_bounded)
{
    struct revoked_stamps s;
    char buf[64], n[64], v[64];
    revoked_stamps_init(&s);
    for (int i = 0; i < REVOKED_STAMPS_MAX; i++) {
        snprintf(buf, sizeof(buf), "{\"m\": \"v%d\"}", i);
        ck_assert_int_eq(add(&s, buf), 0);
    }
    /* a value already kept costs nothing; a new one is refused */
    ck_assert_int_eq(add(&s, "{\"m\": \"v0\"}"), 0);
    ck_assert_int_eq(add(&s, "{\"m\": [\"v1\", \"new\"]}"), CR_ETOOBIG);
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": \"new\"}}", n, v),
        0);
    ck_assert_int_eq(
        match(&s, "{\"stamped_headers\": [\"m\"], \"stamps\": {\"m\": \"v9\"}}", n, v),
        1);
    revoked_stamps_release(&s);
}
END_TEST

START_TEST(test_oom_sweep)
{
    cJSON *h = cJSON_Parse("{\"m\": [\"a\", \"b\"], \"k\": {\"x\": 1}}");
    ck_assert_ptr_nonnull(h);
    for (long n = 1; n < 100; n++) {
        struct revoked_stamps s;
        int rc;
        revoked_stamps_init(&s);
        cr_alloc_fail_after(n);
        rc = revoked_stamps_add(&s, h);
        cr_alloc_fail_after(0);
        ck_assert(rc == 0 || rc == CR_ENOMEM);
        revoked_stamps_release(&s);
        if (rc == 0)
            break;
    }
    cJSON_Delete(h);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("revoked_stamps");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_scalar_and_list_values);
    tcase_add_test(tc, test_first_revoked_header_decides);
    tcase_add_test(tc, test_malformed_headers);
    tcase_add_test(tc, test_bounded);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
