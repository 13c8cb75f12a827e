/* test_redact.c -- util/redact (secrets cut out of text) and config_secrets(). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "util/alloc.h"
#include "util/err.h"
#include "util/redact.h"
#include "worker/config.h"

struct vec {
    const char *secrets[3];
    const char *in;
    const char *out;
};

static const struct vec vecs[] = {
    /* whole, and at both boundaries */
    {{"sk-test-secret-key"}, "sk-test-secret-key", "***"},
    {{"sk-test-secret-key"},
     "Incorrect API key provided: sk-test-secret-key.",
     "Incorrect API key provided: ***."},
    {{"sk-test-secret-key"}, "sk-test-secret-key at start", "*** at start"},
    {{"sk-test-secret-key"}, "at end sk-test-secret-key", "at end ***"},
    /* many occurrences, adjacent ones as one mark */
    {{"hunter22"}, "a hunter22 b hunter22 c hunter22", "a *** b *** c ***"},
    {{"hunter22"}, "hunter22hunter22", "***"},
    /* overlapping occurrences of one secret: no fragment left between them */
    {{"abcabc"}, "xabcabcabcy", "x***y"},
    {{"aaaa"}, "aaaaaaa!", "***!"},
    /* overlapping occurrences of two secrets */
    {{"password1", "word1234"}, "it was password1234!", "it was ***!"},
    /* the head of a long secret, cut short or masked after it */
    {{"sk-test-secret-key"}, "key sk-test-secr... given", "key ***... given"},
    {{"sk-test-secret-key"}, "key sk-test-******-key given", "key *********-key given"},
    /* less than the head: kept */
    {{"sk-test-secret-key"}, "sk-test is a prefix", "sk-test is a prefix"},
    /* a short secret is matched whole only */
    {{"guest"}, "user guest:guest@h, gues", "user ***:***@h, gues"},
    /* empty and too short secrets are ignored */
    {{"", "abc"}, "abc and more abc", "abc and more abc"},
    /* no secrets at all */
    {{NULL}, "nothing to do", "nothing to do"},
    {{"sk-test-secret-key"}, "", ""},
};

START_TEST(test_redact_vectors)
{
    const struct vec *v = &vecs[_i];
    struct redact r;
    char s[256];
    size_t n;

    redact_init(&r);
    for (int k = 0; k < 3 && v->secrets[k]; k++)
        ck_assert_int_eq(redact_add_str(&r, v->secrets[k]), 0);
    snprintf(s, sizeof(s), "%s", v->in);
    n = redact_str(&r, s);
    ck_assert_msg(!strcmp(s, v->out), "case %d: '%s' -> '%s', want '%s'", _i, v->in, s,
                  v->out);
    ck_assert_uint_eq(n, strlen(v->out));
    redact_release(&r);
}
END_TEST

START_TEST(test_redact_add)
{
    struct redact r;
    char name[32];
    redact_init(&r);
    ck_assert_int_eq(redact_add_str(&r, NULL), 0);
    ck_assert_int_eq(redact_add_str(&r, "abc"), 0);
    ck_assert_int_eq(r.n, 0);
    ck_assert_int_eq(redact_add_str(&r, "abcd"), 0);
    ck_assert_int_eq(redact_add_str(&r, "abcd"), 0); /* repeated: kept once */
    ck_assert_int_eq(r.n, 1);
    for (int i = 1; i < REDACT_MAX; i++) {
        snprintf(name, sizeof(name), "secret-%d", i);
        ck_assert_int_eq(redact_add_str(&r, name), 0);
    }
    ck_assert_int_eq(redact_add_str(&r, "one too many"), CR_ERANGE);
    ck_assert_int_eq(r.n, REDACT_MAX);
    redact_release(&r);
    ck_assert_int_eq(r.n, 0);
    cr_alloc_fail_after(1);
    ck_assert_int_eq(redact_add_str(&r, "abcdef"), CR_ENOMEM);
    ck_assert_int_eq(r.n, 0);
    cr_alloc_fail_after(0);
    ck_assert_uint_eq(redact_str(NULL, name), strlen(name));
}
END_TEST

/* Many occurrences in a long text: every one goes, nothing else moves. */
START_TEST(test_redact_long)
{
    static char s[64 * 1024], want[64 * 1024];
    struct redact r;
    size_t n = 0, m = 0;

    redact_init(&r);
    ck_assert_int_eq(redact_add_str(&r, "sk-0123456789"), 0);
    while (n + 40 < sizeof(s))
        n += (size_t)snprintf(s + n, sizeof(s) - n, "x%zu sk-0123456789 ", n);
    /* the same text with each key replaced, by hand */
    for (size_t i = 0; i < n;) {
        if (!strncmp(s + i, "sk-0123456789", 13)) {
            memcpy(want + m, "***", 3);
            m += 3;
            i += 13;
        } else {
            want[m++] = s[i++];
        }
    }
    want[m] = '\0';
    ck_assert_uint_eq(redact_mem(&r, s, n), m);
    ck_assert(!memcmp(s, want, m));
    redact_release(&r);
}
END_TEST

START_TEST(test_config_secrets)
{
    struct config cfg;
    struct redact r;
    char s[512];

    memset(&cfg, 0, sizeof(cfg));
    cfg.llm_api_key = (char *)"sk-test-secret-key";
    cfg.broker = (char *)"amqp://guest:rabbit%40pw@localhost:5672//";
    cfg.result_backend = (char *)"redis://:redispass@localhost:6379/0";
    cfg.llm_base_url = (char *)"https://tok1234@proxy.example/v1?api-key=qkey5678&x=1";
    redact_init(&r);
    ck_assert_int_eq(config_secrets(&cfg, &r), 0);
    snprintf(s, sizeof(s),
             "sk-test-secret-key rabbit%%40pw rabbit@pw redispass tok1234 qkey5678 guest "
             "x=1");
    redact_str(&r, s);
    ck_assert_str_eq(s, "*** *** *** *** *** *** guest x=1");
    redact_release(&r);

    /* the decoded form too, with a '%' that starts no escape kept */
    cfg.broker = (char *)"amqp://guest:p%zz%41w%4@localhost:5672//";
    redact_init(&r);
    ck_assert_int_eq(config_secrets(&cfg, &r), 0);
    snprintf(s, sizeof(s), "p%%zzAw%%4 p%%zz%%41w%%4");
    redact_str(&r, s);
    ck_assert_str_eq(s, "*** ***");
    redact_release(&r);

    /* redis://password@host, and an amqp user name alone is not a secret */
    cfg.llm_api_key = (char *)"";
    cfg.broker = (char *)"amqp://someuser@localhost//";
    cfg.result_backend = (char *)"redis://justapassword@localhost/0";
    cfg.llm_base_url = (char *)"http://127.0.0.1:9/v1";
    redact_init(&r);
    ck_assert_int_eq(config_secrets(&cfg, &r), 0);
    snprintf(s, sizeof(s), "someuser justapassword");
    redact_str(&r, s);
    ck_assert_str_eq(s, "someuser ***");
    redact_release(&r);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("redact");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_redact_vectors, 0, sizeof(vecs) / sizeof(vecs[0]));
    tcase_add_test(tc, test_redact_add);
    tcase_add_test(tc, test_redact_long);
    tcase_add_test(tc, test_config_secrets);
    suite_add_tcase(s, tc);
    return s;
}
