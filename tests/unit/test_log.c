/* test_log.c -- util/log: line format, escaping, and batching per loop turn. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

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

/* Every line of s parses as one JSON object; returns the last (caller
 * deletes), and the number of lines in *lines. */
static cJSON *json_lines(const char *s, int *lines)
{
    cJSON *last = NULL;
    *lines = 0;
    for (const char *p = s; *p;) {
        const char *nl = strchr(p, '\n');
        char *line;
        cJSON *o;
        ck_assert_ptr_nonnull(nl);
        line = strndup(p, (size_t)(nl - p));
        o = cJSON_ParseWithOpts(line, NULL, 1);
        if (!o)
            ck_abort_msg("not JSON: %s", line);
        ck_assert(cJSON_IsObject(o));
        free(line);
        cJSON_Delete(last);
        last = o;
        (*lines)++;
        p = nl + 1;
    }
    return last;
}

static const char *field(cJSON *o, const char *k)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

START_TEST(test_json_format)
{
    char *s;
    int lines;
    cJSON *o;
    capture();
    log_threshold = LOG_INFO;
    log_format = LOG_FORMAT_JSON;
    log_set_worker("celeriac@box");
    LOG(LOG_INFO, "Task %s[%s] received", "llm.chat", "0f1e-2d");
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_int_eq(lines, 1);
    ck_assert_str_eq(field(o, "level"), "INFO");
    ck_assert_str_eq(field(o, "logger"), "celeriac.tests.unit.test_log");
    ck_assert_str_eq(field(o, "message"), "Task llm.chat[0f1e-2d] received");
    ck_assert_str_eq(field(o, "worker"), "celeriac@box");
    ck_assert_str_eq(field(o, "task_id"), "0f1e-2d");
    ck_assert_str_eq(field(o, "task_name"), "llm.chat");
    /* 2026-12-07T19:20:01.123Z */
    ck_assert_uint_eq(strlen(field(o, "time")), 24);
    ck_assert(field(o, "time")[10] == 'T' && field(o, "time")[23] == 'Z');
    cJSON_Delete(o);
    free(s);
    /* not a task line: no task fields; log_write() names no file */
    log_write(LOG_WARNING, "Tasks are fine [x] here");
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_int_eq(lines, 2);
    ck_assert_str_eq(field(o, "logger"), "celeriac");
    ck_assert_ptr_null(field(o, "task_id"));
    cJSON_Delete(o);
    free(s);
    log_set_worker(NULL);
    LOG(LOG_ERROR, "Task a.b[id]: cannot");
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_ptr_null(field(o, "worker"));
    ck_assert_str_eq(field(o, "task_id"), "id");
    cJSON_Delete(o);
    free(s);
    log_format = LOG_FORMAT_TEXT;
    release();
}
END_TEST

/* A lookup that knows one task. */
static int known_trace(const char *id, size_t n, char trace_id[33], char span_id[17],
                       void *arg)
{
    int *calls = arg;
    (*calls)++;
    if (n != 5 || memcmp(id, "t-one", 5) != 0)
        return 0;
    memcpy(trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", 33);
    memcpy(span_id, "00f067aa0ba902b7", 17);
    return 1;
}

START_TEST(test_json_trace_ids)
{
    char *s;
    int lines, calls = 0;
    cJSON *o;
    capture();
    log_threshold = LOG_INFO;
    log_format = LOG_FORMAT_JSON;
    log_set_trace_lookup(known_trace, &calls);
    LOG(LOG_INFO, "Task llm.chat[t-one] succeeded in 0.1s: 'x'");
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_str_eq(field(o, "trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736");
    ck_assert_str_eq(field(o, "span_id"), "00f067aa0ba902b7");
    ck_assert_str_eq(field(o, "task_id"), "t-one");
    cJSON_Delete(o);
    free(s);
    /* another task, a line without a task: no ids, and no lookup for the latter */
    LOG(LOG_INFO, "Task llm.chat[t-two] received");
    LOG(LOG_INFO, "Connected to somewhere");
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_int_eq(lines, 3);
    ck_assert_ptr_null(field(o, "trace_id"));
    ck_assert_int_eq(calls, 2);
    cJSON_Delete(o);
    free(s);
    /* the text format never asks */
    log_format = LOG_FORMAT_TEXT;
    LOG(LOG_INFO, "Task llm.chat[t-one] received");
    ck_assert_int_eq(calls, 2);
    log_set_trace_lookup(NULL, NULL);
    release();
}
END_TEST

START_TEST(test_json_hostile_ids)
{
    /* Whatever a publisher puts in a task id or name, each call is one line
     * that parses, and the message keeps the escaped text. */
    static const char *const ids[] = {"q\"uote",
                                      "back\\slash",
                                      "new\nline\r",
                                      "\x1b[31mred",
                                      "bad\xff\xfe utf8",
                                      "c1\xc2\x9b",
                                      "caf\xc3\xa9",
                                      "]",
                                      "a] b",
                                      "[[]]",
                                      "\"}],{\"x\":1",
                                      "",
                                      "trunc\xe2\x82"};
    char *s;
    int lines;
    capture();
    log_threshold = LOG_INFO;
    log_format = LOG_FORMAT_JSON;
    log_set_worker("w\"\n\\");
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        LOG(LOG_INFO, "Task %s[%s] received", ids[i], ids[i]);
    /* every byte value, alone in an id */
    for (int c = 1; c < 256; c++) {
        char id[4] = {'<', (char)c, '>', '\0'};
        LOG(LOG_INFO, "Task t[%s] received", id);
    }
    s = written(NULL);
    cJSON_Delete(json_lines(s, &lines));
    ck_assert_int_eq(lines, (int)(sizeof(ids) / sizeof(ids[0])) + 255);
    free(s);
    log_set_worker(NULL);
    log_format = LOG_FORMAT_TEXT;
    release();
}
END_TEST

START_TEST(test_json_long_and_random)
{
    char big[6000];
    char *s;
    int lines;
    unsigned x = 12345u;
    cJSON *o;
    capture();
    log_threshold = LOG_INFO;
    log_format = LOG_FORMAT_JSON;
    /* quotes double in JSON, control bytes grow fourfold in esc_ctl: the
     * longest message still makes one whole line */
    for (size_t i = 0; i < sizeof(big) - 1; i++)
        big[i] = i % 3 == 0 ? '"' : i % 3 == 1 ? '\x01' : '\\';
    big[sizeof(big) - 1] = '\0';
    LOG(LOG_ERROR, "Task %s[%s]", big, big);
    /* a multi-byte character cut by the 2 KB bound */
    memset(big, 'x', sizeof(big));
    for (size_t i = 0; i + 3 < sizeof(big); i += 3)
        memcpy(big + i, "\xe2\x82\xac", 3);
    big[sizeof(big) - 1] = '\0';
    LOG(LOG_ERROR, "%s", big);
    /* seeded random bytes */
    for (int n = 0; n < 2000; n++) {
        char r[64];
        size_t len = (size_t)(n % 63);
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            r[i] = (char)((x >> 16) & 0xff);
            if (!r[i])
                r[i] = 'z';
        }
        r[len] = '\0';
        LOG(LOG_INFO, "Task %s[%s] %s", r, r + len / 2, r);
    }
    s = written(NULL);
    o = json_lines(s, &lines);
    ck_assert_int_eq(lines, 2002);
    cJSON_Delete(o);
    free(s);
    log_format = LOG_FORMAT_TEXT;
    release();
}
END_TEST

START_TEST(test_format_parse)
{
    ck_assert_int_eq(log_format_parse("text"), LOG_FORMAT_TEXT);
    ck_assert_int_eq(log_format_parse("JSON"), LOG_FORMAT_JSON);
    ck_assert_int_eq(log_format_parse("xml"), -1);
    ck_assert_int_eq(log_format_parse(""), -1);
    ck_assert_int_eq(log_format_parse(NULL), -1);
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
    tcase_add_test(tc, test_json_format);
    tcase_add_test(tc, test_json_trace_ids);
    tcase_add_test(tc, test_json_hostile_ids);
    tcase_add_test(tc, test_json_long_and_random);
    tcase_add_test(tc, test_format_parse);
    suite_add_tcase(s, tc);
    return s;
}
