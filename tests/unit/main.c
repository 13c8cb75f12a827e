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

#include "unit.h"
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
