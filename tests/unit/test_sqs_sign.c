/* test_sqs_sign.c -- libcurl's SigV4 for SQS reproduces the reference's test
 * vectors (SQS broker reference, section 5), byte for byte.
 *
 * A capture server on a free 127.0.0.1 port (a thread of the test) records one
 * request and answers "{}". The URL keeps the vectors' host, 127.0.0.1:19326,
 * because the host is signed; CURLOPT_CONNECT_TO sends the connection to the
 * free port instead, so the test needs no fixed port. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/sqs_sign.h"
#include "util/alloc.h"

#define VECTOR_HOST "127.0.0.1:19326"
#define DATE "20261207T084730Z"
#define KEY "AKIDEXAMPLE"
#define SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define TOKEN "FQoGZXIvYXdzEXAMPLETOKEN"
#define JSON_BODY                                                                        \
    "{\"QueueUrl\":\"http://127.0.0.1:19324/123456789012/"                               \
    "celery\",\"MaxNumberOfMessages\":"                                                  \
    "10,\"WaitTimeSeconds\":20,\"MessageSystemAttributeNames\":["                        \
    "\"ApproximateReceiveCount\"]}"
#define FORM_BODY                                                                        \
    "Action=DeleteMessage&Version=2012-11-05&QueueUrl=http%3A%2F%2F127.0.0.1%3A19324%"   \
    "2F123456789012%2Fcelery&ReceiptHandle=abc%2Bdef%3D"
#define FORM_TYPE "application/x-www-form-urlencoded; charset=utf-8"

#define AUTH_JSON                                                                        \
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261207/us-east-1/sqs/aws4_request, "      \
    "SignedHeaders=content-type;host;x-amz-date;x-amz-security-token;x-amz-target, "     \
    "Signature=d14fe1c6ace566590bb44b1405894c4710664062f97ff6bf2aac5b0d2aea26ed"
#define AUTH_FORM                                                                        \
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261207/us-east-1/sqs/aws4_request, "      \
    "SignedHeaders=content-type;host;x-amz-date, "                                       \
    "Signature=cbd0445f80b2a3bad2947e6a3297c91aaa265e10017eaffe9e6a436f6a3ea2a1"

struct capture {
    int lfd;
    int port;
    char req[16384]; /* the request as received: head and body */
    size_t len;
};

static void *serve(void *arg)
{
    struct capture *c = arg;
    static const char reply[] =
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0"
        "\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    int fd = accept(c->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    /* Read the head, then the Content-Length bytes of body after it. */
    for (;;) {
        char *end, *cl;
        ssize_t n = read(fd, c->req + c->len, sizeof c->req - 1 - c->len);
        if (n <= 0)
            break;
        c->len += (size_t)n;
        c->req[c->len] = '\0';
        end = strstr(c->req, "\r\n\r\n");
        if (!end)
            continue;
        cl = strcasestr(c->req, "\r\ncontent-length:");
        if (!cl || c->len >= (size_t)(end + 4 - c->req) + strtoul(cl + 17, NULL, 10))
            break;
    }
    if (write(fd, reply, sizeof reply - 1) < 0)
        c->len = 0;
    close(fd);
    return NULL;
}

static void capture_start(struct capture *c, pthread_t *th)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    memset(c, 0, sizeof *c);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(c->lfd, 0);
    ck_assert_int_eq(bind(c->lfd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(c->lfd, 1), 0);
    ck_assert_int_eq(getsockname(c->lfd, (struct sockaddr *)&a, &al), 0);
    c->port = ntohs(a.sin_port);
    ck_assert_int_eq(pthread_create(th, NULL, serve, c), 0);
}

/* The value of header name (case-insensitive) in the captured head, copied
 * into out; "" when absent. */
static void header(const struct capture *c, const char *name, char *out, size_t size)
{
    size_t n = strlen(name);
    const char *p = strstr(c->req, "\r\n");
    out[0] = '\0';
    while (p && p[2] != '\r') {
        const char *line = p + 2, *eol = strstr(line, "\r\n");
        if (!eol)
            return;
        if (strncasecmp(line, name, n) == 0 && line[n] == ':') {
            const char *v = line + n + 1;
            while (*v == ' ')
                v++;
            snprintf(out, size, "%.*s", (int)(eol - v), v);
            return;
        }
        p = eol;
    }
}

static size_t discard(char *p, size_t size, size_t n, void *privdata)
{
    (void)p;
    (void)privdata;
    return size * n;
}

/* Sends rq through a capture server; returns the captured request. */
static void send_captured(const struct sqs_sign_req *rq, struct capture *c)
{
    pthread_t th;
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL, *to;
    struct cr_err e;
    char connect_to[64];
    long code = 0;

    ck_assert_ptr_nonnull(h);
    capture_start(c, &th);
    snprintf(connect_to, sizeof connect_to, "127.0.0.1:19326:127.0.0.1:%d", c->port);
    to = curl_slist_append(NULL, connect_to);
    ck_assert_int_eq(sqs_sign_setup(h, rq, &hdrs, &e), 0);
    curl_easy_setopt(h, CURLOPT_CONNECT_TO, to);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    ck_assert_int_eq(curl_easy_perform(h), CURLE_OK);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    ck_assert_int_eq(code, 200);
    pthread_join(th, NULL);
    close(c->lfd);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    curl_slist_free_all(to);
}

START_TEST(test_vector_json)
{
    char token[] = TOKEN;
    struct sqs_creds cr = {.source = SQS_CREDS_ENV,
                           .access_key_id = KEY,
                           .secret_access_key = SECRET,
                           .session_token = token};
    struct sqs_sign_req rq = {.endpoint = "http://" VECTOR_HOST,
                              .region = "us-east-1",
                              .creds = &cr,
                              .target = "ReceiveMessage",
                              .body = JSON_BODY,
                              .body_len = sizeof JSON_BODY - 1,
                              .amz_date = DATE};
    struct capture c;
    char v[1024];

    send_captured(&rq, &c);
    ck_assert_msg(strncmp(c.req, "POST / HTTP/1.1\r\n", 17) == 0, "%.40s", c.req);
    header(&c, "Authorization", v, sizeof v);
    ck_assert_str_eq(v, AUTH_JSON);
    header(&c, "Host", v, sizeof v);
    ck_assert_str_eq(v, VECTOR_HOST);
    header(&c, "X-Amz-Target", v, sizeof v);
    ck_assert_str_eq(v, "AmazonSQS.ReceiveMessage");
    header(&c, "X-Amz-Security-Token", v, sizeof v);
    ck_assert_str_eq(v, TOKEN);
    header(&c, "Content-Type", v, sizeof v);
    ck_assert_str_eq(v, SQS_CONTENT_TYPE);
    header(&c, "X-Amz-Date", v, sizeof v);
    ck_assert_str_eq(v, DATE);
    /* every signed header is sent; none is empty */
    header(&c, "Expect", v, sizeof v);
    ck_assert_str_eq(v, "");
    ck_assert(strstr(c.req, "\r\n\r\n" JSON_BODY) != NULL);
    ck_assert(strstr(c.req, SECRET) == NULL);
}
END_TEST

START_TEST(test_vector_form)
{
    struct sqs_creds cr = {
        .source = SQS_CREDS_URL, .access_key_id = KEY, .secret_access_key = SECRET};
    struct sqs_sign_req rq = {.endpoint = "http://" VECTOR_HOST,
                              .region = "us-east-1",
                              .creds = &cr,
                              .content_type = FORM_TYPE,
                              .body = FORM_BODY,
                              .body_len = sizeof FORM_BODY - 1,
                              .amz_date = DATE};
    struct capture c;
    char v[1024];

    send_captured(&rq, &c);
    header(&c, "Authorization", v, sizeof v);
    ck_assert_str_eq(v, AUTH_FORM);
    header(&c, "X-Amz-Target", v, sizeof v);
    ck_assert_str_eq(v, "");
    header(&c, "X-Amz-Security-Token", v, sizeof v);
    ck_assert_str_eq(v, "");
}
END_TEST

/* Without a fixed date libcurl signs its clock's: the scope still names the
 * region and service, and the date header it sends is the signed one. */
START_TEST(test_clock_date)
{
    struct sqs_creds cr = {
        .source = SQS_CREDS_URL, .access_key_id = KEY, .secret_access_key = SECRET};
    struct sqs_sign_req rq = {.endpoint = "http://" VECTOR_HOST,
                              .region = "eu-west-1",
                              .creds = &cr,
                              .target = "DeleteMessage",
                              .body = "{}",
                              .body_len = 2};
    struct capture c;
    char v[1024], d[64];

    send_captured(&rq, &c);
    header(&c, "X-Amz-Date", d, sizeof d);
    ck_assert_uint_eq(strlen(d), 16);
    header(&c, "Authorization", v, sizeof v);
    ck_assert(strstr(v, "/eu-west-1/sqs/aws4_request, SignedHeaders=content-type;host;"
                        "x-amz-date;x-amz-target, Signature=") != NULL);
    ck_assert(strncmp(v + strlen("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"), d, 8) == 0);
}
END_TEST

/* libcurl 7.88 adds "Expect: 100-continue" (unsigned) on its own only to
 * bodies over 1 MiB: an ordinary SendMessage of a few KiB goes out at once,
 * whole, with nothing but the signed headers of ours. */
START_TEST(test_body_no_expect)
{
    static char body[4096];
    struct sqs_creds cr = {
        .source = SQS_CREDS_URL, .access_key_id = KEY, .secret_access_key = SECRET};
    struct sqs_sign_req rq = {.endpoint = "http://" VECTOR_HOST,
                              .region = "us-east-1",
                              .creds = &cr,
                              .target = "SendMessage",
                              .body = body,
                              .body_len = sizeof body - 1,
                              .amz_date = DATE};
    struct capture c;
    char v[1024];

    memset(body, 'x', sizeof body - 1);
    send_captured(&rq, &c);
    header(&c, "Expect", v, sizeof v);
    ck_assert_str_eq(v, "");
    header(&c, "Authorization", v, sizeof v);
    ck_assert(strstr(v, "SignedHeaders=content-type;host;x-amz-date;x-amz-target, ") !=
              NULL);
    ck_assert(strstr(c.req, "\r\n\r\n") != NULL);
    ck_assert_uint_eq(strlen(strstr(c.req, "\r\n\r\n") + 4), sizeof body - 1);
}
END_TEST

START_TEST(test_refused)
{
    struct sqs_creds cr = {.access_key_id = KEY, .secret_access_key = SECRET};
    char evil[] = "a\r\nb: c";
    struct sqs_creds bad_token = {
        .access_key_id = KEY, .secret_access_key = SECRET, .session_token = evil};
    struct sqs_sign_req ok = {.endpoint = "http://h:1",
                              .region = "us-east-1",
                              .creds = &cr,
                              .target = "ReceiveMessage",
                              .body = "{}",
                              .body_len = 2};
    struct sqs_sign_req rq;
    struct curl_slist *hdrs = (struct curl_slist *)1;
    struct cr_err e;
    CURL *h = curl_easy_init();

    rq = ok;
    rq.region = "us-east-1:x";
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    ck_assert_ptr_null(hdrs);
    ck_assert(strstr(e.msg, "region") != NULL);
    rq = ok;
    rq.region = "";
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    rq = ok;
    rq.target = "Receive\r\nX-Evil: 1";
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    rq = ok;
    rq.creds = &bad_token;
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "a\r\nb") == NULL);
    rq = ok;
    rq.body = NULL;
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    rq = ok;
    rq.creds = NULL;
    ck_assert_int_eq(sqs_sign_setup(h, &rq, &hdrs, &e), CR_EINVAL);
    ck_assert_int_eq(sqs_sign_setup(h, &ok, &hdrs, &e), 0);
    ck_assert_ptr_nonnull(hdrs);
    ck_assert_str_eq(hdrs->data, "Content-Type: " SQS_CONTENT_TYPE);
    ck_assert_str_eq(hdrs->next->data, "X-Amz-Target: AmazonSQS.ReceiveMessage");
    ck_assert_ptr_null(hdrs->next->next);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sqs_sign");
    TCase *tc = tcase_create("core");
    curl_global_init(CURL_GLOBAL_DEFAULT);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_vector_json);
    tcase_add_test(tc, test_vector_form);
    tcase_add_test(tc, test_clock_date);
    tcase_add_test(tc, test_body_no_expect);
    tcase_add_test(tc, test_refused);
    suite_add_tcase(s, tc);
    return s;
}
