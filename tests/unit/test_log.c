/* test_log.c -- util/log: line format, escaping, and batching per loop turn. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/log.h"

static char path[] = "/tmp/test_log.XXXXXX";
static int saved_stderr = -1;

/* stderr goes to a fresh file for the test. */
static void capture(void)
{
    int fd;
    memcpy(path + strlen(path) - 6, "XXXXXX", 6);
    fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    saved_stderr = dup(STDERR_FILENO);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    close(fd);
}

/* What has been written to stderr so far (caller frees). */
static char *written(size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *s;
    long n;
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    s = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return s;
}

static void release(void)
{
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    unlink(path);
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

START_TEST(test_format)
{
    char *s;
    capture();
    log_threshold = LOG_INFO;
    LOG(LOG_INFO, "task %s[%d] received", "llm.chat", 7);
    LOG(LOG_DEBUG, "not shown");
    s = written(NULL);
    /* [2026-12-01 23:45:06,123: INFO/MainProcess] task llm.chat[7] received */
    ck_assert_int_eq(strlen(s), 44 + strlen("task llm.chat[7] received") + 1);
    ck_assert(s[0] == '[' && s[5] == '-' && s[11] == ' ' && s[20] == ',');
    ck_assert_str_eq(s + 24, ": INFO/MainProcess] task llm.chat[7] received\n");
    free(s);
    release();
}
END_TEST

START_TEST(test_escapes_and_truncates)
{
    char big[5000];
    char *s;
    size_t n;
    capture();
    log_threshold = LOG_INFO;
    LOG(LOG_WARNING, "id=%s", "a\nb\x1b[31m");
    s = written(NULL);
    ck_assert_ptr_nonnull(strstr(s, "WARNING/MainProcess] id=a\\nb\\x1b[31m\n"));
    ck_assert_int_eq(count(s, "\n"), 1);
    free(s);
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    LOG(LOG_ERROR, "%s", big);
    s = written(&n);
    /* one line of at most 2047 bytes and its newline */
    ck_assert_int_eq(count(s, "\n"), 2);
    ck_assert_uint_le(strlen(strchr(s, '\n') + 1), 2048);
    free(s);
    release();
}
END_TEST

START_TEST(test_batch_waits_for_flush)
{
    char *s;
    capture();
    log_threshold = LOG_DEBUG;
    LOG(LOG_INFO, "before");
    log_batch_start();
    LOG(LOG_INFO, "one");
    LOG(LOG_DEBUG, "two");
    s = written(NULL);
    ck_assert_int_eq(count(s, "\n"), 1); /* "before" went out at once */
    free(s);
    log_flush();
    log_flush(); /* nothing twice */
    s = written(NULL);
    ck_assert_int_eq(count(s, "\n"), 3);
    ck_assert_ptr_nonnull(strstr(s, "] one\n["));
    ck_assert_ptr_nonnull(strstr(s, "] two\n"));
    free(s);
    /* a warning takes the waiting lines out with it, in order */
    LOG(LOG_INFO, "three");
    LOG(LOG_WARNING, "four");
    s = written(NULL);
    ck_assert_int_eq(count(s, "\n"), 5);
    ck_assert_ptr_nonnull(strstr(s, "] three\n["));
    ck_assert_ptr_nonnull(strstr(s, "] four\n"));
    ck_assert(strstr(s, "] three") < strstr(s, "] four"));
    free(s);
    LOG(LOG_INFO, "five");
    log_batch_stop();
    LOG(LOG_INFO, "six");
    s = written(NULL);
    ck_assert_int_eq(count(s, "\n"), 7);
    free(s);
    release();
}
END_TEST

START_TEST(test_batch_bound)
{
    char msg[1000];
    char *s;
    size_t n;
    int lines = 0;
    capture();
    log_threshold = LOG_INFO;
    memset(msg, 'y', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    log_batch_start();
    /* past LOG_BATCH_BYTES the buffer goes out on its own, whole lines only */
    for (n = 0; n == 0; lines++) {
        ck_assert_int_lt(lines, 2 * LOG_BATCH_BYTES / 1000);
        LOG(LOG_INFO, "%d %s", lines, msg);
        free(written(&n));
    }
    ck_assert_int_ge(lines, LOG_BATCH_BYTES / 1100);
    s = written(&n);
    ck_assert_uint_le(n, LOG_BATCH_BYTES);
    ck_assert(s[n - 1] == '\n');
    ck_assert_int_eq(count(s, "\n"), lines - 1); /* the last one waits */
    free(s);
    for (int i = 0; i < 100; i++, lines++)
        LOG(LOG_INFO, "%d %s", lines, msg);
    log_batch_stop();
    s = written(&n);
    ck_assert_int_eq(count(s, "\n"), lines);
    for (int i = 0; i < lines; i += 17) {
        char want[32];
        snprintf(want, sizeof(want), "] %d yyy", i);
        ck_assert_ptr_nonnull(strstr(s, want));
    }
    free(s);
    release();
}
END_TEST

START_TEST(test_exit_flushes)
{
    pid_t pid;
    int status;
    char *s;
    capture();
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        log_threshold = LOG_INFO;
        log_batch_start();
        LOG(LOG_INFO, "said just before exit");
        exit(3);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_int_eq(WEXITSTATUS(status), 3);
    s = written(NULL);
    ck_assert_ptr_nonnull(strstr(s, "] said just before exit\n"));
    free(s);
    release();
}
END_TEST

START_TEST(test_level_parse)
{
    ck_assert_int_eq(log_level_parse("INFO"), LOG_INFO);
    ck_assert_int_eq(log_level_parse("warn"), LOG_WARNING);
    ck_assert_int_eq(log_level_parse("Warning"), LOG_WARNING);
    ck_assert_int_eq(log_level_parse("fatal"), LOG_CRITICAL);
    ck_assert_int_eq(log_level_parse("loud"), -1);
    ck_assert_int_eq(log_level_parse(NULL), -1);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_format);
    tcase_add_test(tc, test_escapes_and_truncates);
    tcase_add_test(tc, test_batch_waits_for_flush);
    tcase_add_test(tc, test_batch_bound);
    tcase_add_test(tc, test_exit_flushes);
    tcase_add_test(tc, test_level_parse);
    suite_add_tcase(s, tc);
    return s;
}
