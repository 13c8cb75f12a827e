/* main.c -- the one main() of every Check unit-test binary.
 *
 * Each tests/unit/test_<module>.c is linked with this file into build/tests/test_<module>
 * and defines, instead of a main() of its own:
 *
 *     Suite *suite(void);
 *
 * which builds and returns its Suite (suite_create, tcase_create, tcase_add_*,
 * suite_add_tcase, and any tcase_set_timeout). To convert a file that still has its
 * own main(): rename `int main(void)` to `Suite *suite(void)`, drop the SRunner and the
 * `failed` variable, and end it with `return s;` where the srunner_create() line was.
 * cr_alloc_init() is called here, before suite(), so a suite need not call it.
 *
 * Check's own environment variables still work: CK_RUN_CASE=name or CK_RUN_SUITE=name
 * to run a part, CK_FORK=no to debug in one process, CK_VERBOSITY=verbose to list every
 * test. scripts/run-unit.sh reads the "NN%: Checks: ..." summary line this prints.
 * Helpers every suite may call are declared in tests/unit/unit.h. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit.h"
#include "protocol/pyjson.h"
#include "util/alloc.h"

Suite *suite(void);

char *unit_read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    char *data;
    long n;
    ck_assert_msg(fp != NULL, "cannot open '%s' (run tests from the repo root)", path);
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    data = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(data);
    ck_assert_uint_eq(fread(data, 1, (size_t)n, fp), (size_t)n);
    data[n] = '\0';
    fclose(fp);
    if (len)
        *len = (size_t)n;
    return data;
}

const char *unit_str(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void unit_load_message(const char *path, cJSON **root, struct celery_raw_msg *raw)
{
    size_t len;
    char *text = unit_read_file(path, &len);
    const cJSON *props, *body;

    ck_assert_int_eq(py_json_parse(text, len, root, NULL), 0);
    free(text);
    props = cJSON_GetObjectItemCaseSensitive(*root, "properties");
    body = cJSON_GetObjectItemCaseSensitive(*root, "body");
    ck_assert(cJSON_IsString(body));
    memset(raw, 0, sizeof(*raw));
    raw->content_type = unit_str(*root, "content_type");
    raw->content_encoding = unit_str(*root, "content_encoding");
    raw->headers = cJSON_GetObjectItemCaseSensitive(*root, "headers");
    raw->correlation_id = unit_str(props, "correlation_id");
    raw->reply_to = unit_str(props, "reply_to");
    raw->delivery_mode =
        cJSON_GetObjectItemCaseSensitive(props, "delivery_mode")->valueint;
    raw->priority = cJSON_GetObjectItemCaseSensitive(props, "priority")->valueint;
    raw->body = body->valuestring;
    raw->body_len = strlen(body->valuestring);
}

int main(void)
{
    SRunner *sr;
    int failed;

    cr_alloc_init();
    sr = srunner_create(suite());
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
