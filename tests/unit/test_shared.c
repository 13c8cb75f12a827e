/* test_shared.c -- the small pieces every layer shares, one copy each: the
 * task's display name, the two clocks and the version string. */
#include <check.h>
#include <string.h>
#include <time.h>

#include "protocol/celery_msg.h"
#include "util/alloc.h"
#include "util/clock.h"
#include "util/version.h"

START_TEST(test_display_name)
{
    struct task_msg m;
    char task[] = "tasks.add", shadow[] = "add-as-shown";

    task_msg_init(&m);
    ck_assert_str_eq(task_msg_display_name(&m), "unknown");
    m.task = task;
    ck_assert_ptr_eq(task_msg_display_name(&m), task);
    m.shadow = shadow;
    ck_assert_ptr_eq(task_msg_display_name(&m), shadow);
    m.task = NULL;
    ck_assert_ptr_eq(task_msg_display_name(&m), shadow);
}
END_TEST

/* A decoded message: the shadow header wins, as in Celery's logs. */
START_TEST(test_display_name_decoded)
{
    static const char body[] = "[[], {}, {}]";
    static const char *const hdr[] = {
        "{\"task\": \"tasks.add\", \"id\": \"i1\"}",
        "{\"task\": \"tasks.add\", \"id\": \"i1\", \"shadow\": \"shown\"}",
        "{\"task\": \"tasks.add\", \"id\": \"i1\", \"shadow\": null}",
    };
    static const char *const want[] = {"tasks.add", "shown", "tasks.add"};

    for (size_t i = 0; i < sizeof(hdr) / sizeof(hdr[0]); i++) {
        struct celery_raw_msg raw;
        struct task_msg m;
        struct cr_err err;
        cJSON *h = cJSON_Parse(hdr[i]);

        ck_assert_ptr_nonnull(h);
        memset(&raw, 0, sizeof(raw));
        raw.body = body;
        raw.body_len = sizeof(body) - 1;
        raw.headers = h;
        raw.content_type = "application/json";
        raw.content_encoding = "utf-8";
        task_msg_init(&m);
        ck_assert_int_eq(celery_msg_decode(&raw, &m, &err), 0);
        ck_assert_str_eq(task_msg_display_name(&m), want[i]);
        task_msg_release(&m);
        cJSON_Delete(h);
    }
}
END_TEST

START_TEST(test_clock_epoch)
{
    /* Read against the same clock: time() is the kernel's coarse clock,
     * up to a tick behind, so a second could turn between the two reads. */
    struct timespec t0, t1;
    int64_t us;
    ck_assert_int_eq(clock_gettime(CLOCK_REALTIME, &t0), 0);
    us = clock_epoch_us();
    ck_assert_int_eq(clock_gettime(CLOCK_REALTIME, &t1), 0);

    ck_assert_int_ge(us, (int64_t)t0.tv_sec * 1000000 + t0.tv_nsec / 1000);
    ck_assert_int_le(us, (int64_t)t1.tv_sec * 1000000 + t1.tv_nsec / 1000);
}
END_TEST

START_TEST(test_clock_mono)
{
    int64_t a = clock_mono_ms(), b;
    struct timespec nap = {0, 20 * 1000 * 1000};

    nanosleep(&nap, NULL);
    b = clock_mono_ms();
    ck_assert_int_ge(b - a, 19);
    ck_assert_int_lt(b - a, 5000);
}
END_TEST

START_TEST(test_version)
{
    /* the worker_info metric and sw_ver say this; test_monitoring.py checks it */
    ck_assert_str_eq(CELERIAC_VERSION, "0.1.0");
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("shared");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_display_name);
    tcase_add_test(tc, test_display_name_decoded);
    tcase_add_test(tc, test_clock_epoch);
    tcase_add_test(tc, test_clock_mono);
    tcase_add_test(tc, test_version);
    suite_add_tcase(s, tc);
    return s;
}
