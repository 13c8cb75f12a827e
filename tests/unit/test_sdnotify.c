/* test_sdnotify.c -- the sd_notify pieces that need no socket: the address a
 * $NOTIFY_SOCKET names, whether the watchdog is ours, and the messages. */
#include <check.h>
#include <stddef.h>
#include <string.h>

#include "worker/sdnotify.h"

#define PATH_OFF offsetof(struct sockaddr_un, sun_path)

START_TEST(test_path_address)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    ck_assert_int_eq(sdnotify_addr("/run/systemd/notify", &a, &len), 0);
    ck_assert_int_eq(a.sun_family, AF_UNIX);
    ck_assert_str_eq(a.sun_path, "/run/systemd/notify");
    /* the path and its NUL */
    ck_assert_uint_eq(len, PATH_OFF + strlen("/run/systemd/notify") + 1);
}
END_TEST

START_TEST(test_abstract_address)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    ck_assert_int_eq(sdnotify_addr("@sd-notify", &a, &len), 0);
    ck_assert_int_eq(a.sun_path[0], '\0');
    ck_assert(!memcmp(a.sun_path + 1, "sd-notify", 9));
    /* exactly the name's bytes: a trailing NUL would be another name */
    ck_assert_uint_eq(len, PATH_OFF + 10);
}
END_TEST

START_TEST(test_bad_addresses)
{
    struct sockaddr_un a;
    socklen_t len = 0;
    char longest[sizeof(a.sun_path) + 2];
    ck_assert_int_eq(sdnotify_addr(NULL, &a, &len), -1);
    ck_assert_int_eq(sdnotify_addr("", &a, &len), -1);
    ck_assert_int_eq(sdnotify_addr("@", &a, &len), -1);
    ck_assert_int_eq(sdnotify_addr("relative/notify", &a, &len), -1);
    /* a path filling sun_path leaves no room for its NUL; an abstract name may */
    memset(longest, 'x', sizeof(a.sun_path));
    longest[sizeof(a.sun_path)] = '\0';
    longest[0] = '/';
    ck_assert_int_eq(sdnotify_addr(longest, &a, &len), -1);
    longest[0] = '@';
    ck_assert_int_eq(sdnotify_addr(longest, &a, &len), 0);
    ck_assert_uint_eq(len, sizeof(struct sockaddr_un));
    longest[sizeof(a.sun_path)] = 'x';
    longest[sizeof(a.sun_path) + 1] = '\0';
    ck_assert_int_eq(sdnotify_addr(longest, &a, &len), -1);
}
END_TEST

START_TEST(test_watchdog_usec)
{
    ck_assert_uint_eq(sdnotify_watchdog_usec(NULL, NULL, 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("", NULL, 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("30000000", NULL, 42), 30000000);
    ck_assert_uint_eq(sdnotify_watchdog_usec("30000000", "", 42), 30000000);
    ck_assert_uint_eq(sdnotify_watchdog_usec("30000000", "42", 42), 30000000);
    /* another process's watchdog (a shell that started us, say) */
    ck_assert_uint_eq(sdnotify_watchdog_usec("30000000", "41", 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("30000000", "42x", 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("0", NULL, 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("-5", NULL, 42), 0);
    ck_assert_uint_eq(sdnotify_watchdog_usec("30s", NULL, 42), 0);
}
END_TEST

START_TEST(test_messages)
{
    char m[128];
    ck_assert_int_eq(sdnotify_reloading_msg(m, sizeof(m), 1234567890123u),
                     (int)strlen("RELOADING=1\nMONOTONIC_USEC=1234567890123"));
    ck_assert_str_eq(m, "RELOADING=1\nMONOTONIC_USEC=1234567890123");
    ck_assert_int_eq(sdnotify_ready_msg(m, sizeof(m), 777, "w1@h: consuming 1 queue"),
                     (int)strlen("READY=1\nMAINPID=777\nSTATUS=w1@h: consuming 1 queue"));
    ck_assert_str_eq(m, "READY=1\nMAINPID=777\nSTATUS=w1@h: consuming 1 queue");
    /* one STATUS line: a newline in it would start a field of its own */
    sdnotify_ready_msg(m, sizeof(m), 1, "up\nWATCHDOG=trigger");
    ck_assert_str_eq(m, "READY=1\nMAINPID=1\nSTATUS=up");
    ck_assert_int_eq(sdnotify_ready_msg(m, 10, 777, "x"), -1);
    ck_assert_int_eq(sdnotify_reloading_msg(m, 12, 1), -1);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sdnotify");
    TCase *tc = tcase_create("protocol");
    tcase_add_test(tc, test_path_address);
    tcase_add_test(tc, test_abstract_address);
    tcase_add_test(tc, test_bad_addresses);
    tcase_add_test(tc, test_watchdog_usec);
    tcase_add_test(tc, test_messages);
    suite_add_tcase(s, tc);
    return s;
}
