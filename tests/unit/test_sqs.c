/* test_sqs.c -- the SQS wire codec (protocol/sqs.c) against what the SQS broker
 * reference captured (tests/fixtures/sqs/README): queue names, the message
 * Body of Celery 5.2.6 and 5.6.3 clients decoded and re-encoded byte for
 * byte, the JSON request bodies, the answers and the error kinds; plus
 * malformed and truncated input and an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/sqs.h"
#include "unit.h"
#include "util/alloc.h"

#define FX "tests/fixtures/sqs/"
/* A string literal and its length. */
#define S(lit) lit, strlen(lit)
#define Q "http://127.0.0.1:19324/123456789012/celery"
#define QF "http://127.0.0.1:19324/123456789012/dev-jobs.fifo"
#define TAG526 "d6335da5-cd61-40e9-9ebf-e313382de7c3"

static const char *hstr(const struct kombu_msg *m, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m->headers, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- names ------------------------------------------------------------------ */

static const struct {
    const char *prefix, *queue, *want; /* want NULL: refused */
} names[] = {
    {"dev-", "llm.high", "dev-llm-high"},
    {"dev-", "jobs.fifo", "dev-jobs.fifo"},
    {"", "x.fifo", "x.fifo"},
    {"dev-", "x.fifo", "dev-x.fifo"},
    {NULL, "celery", "celery"},
    {"", "0f0b8c1e-5603-4000-8000-000000005603.reply.celery.pidbox",
     "0f0b8c1e-5603-4000-8000-000000005603-reply-celery-pidbox"},
    {"", "a.b", "a-b"},
    {"", "a-b", "a-b"},
    {"", "a:b@c/d", "a_b_c_d"},
    {"", "a.b.fifo", "a-b.fifo"},
    {"p.", "q_r", "p-q_r"},
    {"", "fifo", "fifo"},
    {"", "x.FIFO", "x-FIFO"},
    {"", "a b", NULL},
    {"", "caf\xc3\xa9", NULL},
    {"", "", NULL},
    {NULL, NULL, NULL},
    {"", ".fifo", NULL},
    {"", "x.fi.fo", "x-fi-fo"},
    {"", "tab\tq", NULL},
    {"",
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
    {"",
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab",
     NULL},
    {"d",
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.fifo",
     "daaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.fifo"},
};
#define N_NAMES ((int)(sizeof names / sizeof *names))

START_TEST(test_queue_names)
{
    char out[SQS_QUEUE_NAME_MAX + 1];
    struct cr_err err = {0};
    int rc = sqs_queue_name(names[_i].prefix, names[_i].queue, out, sizeof out, &err);
    if (names[_i].want) {
        ck_assert_msg(rc == 0, "%s: %s", names[_i].queue, err.msg);
        ck_assert_str_eq(out, names[_i].want);
        ck_assert(sqs_queue_name_ok(out));
    } else {
        ck_assert_int_eq(rc, CR_EINVAL);
        ck_assert_str_ne(err.msg, "");
    }
}
END_TEST

START_TEST(test_name_helpers)
{
    char out[8];
    char big[SQS_QUEUE_NAME_MAX + 1];
    ck_assert_int_eq(sqs_queue_name("dev-", "llm.high", out, sizeof out, NULL),
                     CR_EINVAL);
    ck_assert_int_eq(sqs_queue_name("dev-", "llm.hi", out, sizeof out, NULL), CR_EINVAL);
    ck_assert_int_eq(sqs_queue_name("dev-", "llm", out, sizeof out, NULL), 0);
    ck_assert_str_eq(out, "dev-llm");
    ck_assert(sqs_is_fifo("dev-jobs.fifo"));
    ck_assert(sqs_is_fifo(QF));
    ck_assert(!sqs_is_fifo(Q));
    ck_assert(!sqs_is_fifo(NULL));
    ck_assert(!sqs_is_fifo("fifo"));
    ck_assert(sqs_queue_name_ok("dev-llm-high"));
    ck_assert(sqs_queue_name_ok("a.fifo"));
    ck_assert(!sqs_queue_name_ok(".fifo"));
    ck_assert(!sqs_queue_name_ok("llm.high"));
    ck_assert(!sqs_queue_name_ok(""));
    ck_assert(!sqs_queue_name_ok(NULL));
    ck_assert_int_eq(sqs_url_queue_name(QF, big, sizeof big), 0);
    ck_assert_str_eq(big, "dev-jobs.fifo");
    ck_assert_int_eq(sqs_url_queue_name("celery", big, sizeof big), 0);
    ck_assert_str_eq(big, "celery");
    ck_assert_int_eq(sqs_url_queue_name("http://h/1/", big, sizeof big), CR_EINVAL);
    ck_assert_int_eq(sqs_url_queue_name(NULL, big, sizeof big), CR_EINVAL);
    ck_assert_int_eq(sqs_url_queue_name(Q, out, 6), CR_EINVAL);
    ck_assert_int_eq(sqs_url_queue_name(Q, out, 7), 0);
}
END_TEST

/* ---- message body ----------------------------------------------------------- */

static void check_526(const struct kombu_msg *m)
{
    ck_assert_str_eq(m->body, "[[2, 3], {}, {\"callbacks\": null, \"errbacks\": null, "
                              "\"chain\": null, \"chord\": null}]");
    ck_assert_str_eq(m->content_type, "application/json");
    ck_assert_str_eq(m->content_encoding, "utf-8");
    ck_assert_str_eq(m->exchange, "");
    ck_assert_str_eq(m->routing_key, "celery");
    ck_assert_str_eq(m->delivery_tag, TAG526);
    ck_assert_str_eq(m->correlation_id, "eea074cb-826a-45c5-a052-07ad055bc59c");
    ck_assert_str_eq(m->reply_to, "585115e6-3662-3f94-8352-c06d40c9c3b6");
    ck_assert_int_eq(m->delivery_mode, 2);
    ck_assert_int_eq(m->redelivered, 0);
    ck_assert_str_eq(hstr(m, "task"), "add");
    ck_assert_str_eq(hstr(m, "argsrepr"), "(2, 3)");
}

/* The captured Body decodes, base64 and raw alike. */
START_TEST(test_body_fixture)
{
    size_t len, elen;
    char *b64 = unit_read_file(FX "body_celery526.b64", &len);
    char *env = unit_read_file(FX "env_celery526.json", &elen);
    struct kombu_msg m;
    struct cr_err err = {0};
    ck_assert_uint_eq(len, 1148);
    ck_assert_int_eq(sqs_body_decode(&m, b64, len, 0, &err), 0);
    check_526(&m);
    kombu_msg_release(&m);
    ck_assert_int_eq(sqs_body_decode(&m, env, elen, 0, &err), 0);
    check_526(&m);
    kombu_msg_release(&m);
    free(b64);
    free(env);

    b64 = unit_read_file(FX "body_celery563_countdown.b64", &len);
    ck_assert_int_eq(sqs_body_decode(&m, b64, len, 0, &err), 0);
    ck_assert_str_eq(hstr(&m, "eta"), "2026-12-07T08:41:51.223775+00:00");
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(m.headers, "stamps"));
    ck_assert_str_eq(m.routing_key, "celery");
    kombu_msg_release(&m);
    free(b64);
}
END_TEST

static int encode_from(const struct kombu_msg *m, int raw, size_t max, struct buf *out)
{
    struct outbound o;
    kombu_msg_outbound(m, &o);
    return sqs_body_encode(&o, m->delivery_tag, raw, max, out);
}

/* What we publish is, byte for byte, what the Celery 5.2.6 client sent. */
START_TEST(test_body_encode_fixture)
{
    size_t len, elen;
    char *b64 = unit_read_file(FX "body_celery526.b64", &len);
    char *env = unit_read_file(FX "env_celery526.json", &elen);
    struct kombu_msg m;
    struct buf out;
    buf_init(&out);
    ck_assert_int_eq(sqs_body_decode(&m, b64, len, 0, NULL), 0);
    ck_assert_int_eq(encode_from(&m, 0, 0, &out), 0);
    ck_assert_str_eq(out.data, b64);
    buf_reset(&out);
    ck_assert_int_eq(encode_from(&m, 1, 0, &out), 0);
    ck_assert_str_eq(out.data, env);
    /* bounded: the base64 is 1148 bytes, the raw envelope 860 */
    buf_reset(&out);
    ck_assert_int_eq(encode_from(&m, 0, 1147, &out), CR_ETOOBIG);
    ck_assert_uint_eq(out.len, 0);
    ck_assert_int_eq(encode_from(&m, 0, 1148, &out), 0);
    buf_reset(&out);
    ck_assert_int_eq(encode_from(&m, 1, elen - 1, &out), CR_ETOOBIG);
    ck_assert_uint_eq(out.len, 0);
    kombu_msg_release(&m);
    buf_release(&out);
    free(b64);
    free(env);
}
END_TEST

static const struct {
    const char *body;
    int rc;
} body_forms[] = {
    /* no delivery tag: fine on SQS (the receipt handle is the tag) */
    {"{\"body\": \"\", \"properties\": {}}", 0},
    {"{\"body\": \"\", \"properties\": {\"delivery_tag\": null}}", 0},
    /* base64 of the previous line */
    {"eyJib2R5IjogIiIsICJwcm9wZXJ0aWVzIjoge319", 0},
    /* one character short: not base64, read raw */
    {"eyJib2R5IjogIiIsICJwcm9wZXJ0aWVzIjoge30", CR_EDECODE},
    /* padded, and with its leftover bits set (5.6.2 reads it, 5.2.4 not) */
    {"eyJib2R5IjogIiIsICJwcm9wZXJ0aWVzIjoge319IA==", 0},
    {"eyJib2R5IjogIiIsICJwcm9wZXJ0aWVzIjoge319IB==", 0},
    /* "{}": an envelope with no properties */
    {"e30=", CR_EDECODE},
    {"e31=", CR_EDECODE},
    {"", CR_EDECODE},
    {"[]", CR_EDECODE},
    {"hello", CR_EDECODE},
    {"{\"body\": 1, \"properties\": {}}", CR_EDECODE},
    {"{\"body\": \"\"}", CR_EDECODE},
    {"{\"body\": \"\", \"properties\": {\"delivery_tag\": 5}}", CR_EDECODE},
    {"{\"body\": \"@@\", \"properties\": {\"body_encoding\": \"base64\"}}", CR_EDECODE},
    {"====", CR_EDECODE},
    {"AA==", CR_EDECODE},
};
#define N_BODY_FORMS ((int)(sizeof body_forms / sizeof *body_forms))

START_TEST(test_body_forms)
{
    struct kombu_msg m;
    struct cr_err err = {0};
    int rc = sqs_body_decode(&m, S(body_forms[_i].body), 0, &err);
    ck_assert_msg(rc == body_forms[_i].rc, "'%s': %d (%s)", body_forms[_i].body, rc,
                  err.msg);
    if (rc == 0) {
        ck_assert_str_eq(m.delivery_tag, "");
        kombu_msg_release(&m);
    } else {
        ck_assert_str_ne(err.msg, "");
    }
}
END_TEST

START_TEST(test_body_limits)
{
    size_t len;
    char *b64 = unit_read_file(FX "body_celery526.b64", &len);
    struct kombu_msg m;
    ck_assert_int_eq(sqs_body_decode(&m, b64, len, len - 1, NULL), CR_ETOOBIG);
    ck_assert_int_eq(sqs_body_decode(&m, b64, len, len, NULL), 0);
    kombu_msg_release(&m);
    /* a body whose inner body is over the bound */
    ck_assert_int_eq(
        sqs_body_decode(&m,
                        S("{\"body\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\","
                          " \"properties\": {}}"),
                        50, NULL),
        CR_ETOOBIG);
    free(b64);
}
END_TEST

/* ---- requests --------------------------------------------------------------- */

START_TEST(test_action_names)
{
    for (int a = 0; a < SQS_NACTIONS; a++) {
        ck_assert_str_ne(sqs_action_name(a), "?");
        for (int b = 0; b < a; b++)
            ck_assert_str_ne(sqs_action_name(a), sqs_action_name(b));
    }
    ck_assert_str_eq(sqs_action_name(SQS_RECEIVE_MESSAGE), "ReceiveMessage");
    ck_assert_str_eq(sqs_action_name(SQS_CHANGE_MESSAGE_VISIBILITY_BATCH),
                     "ChangeMessageVisibilityBatch");
    ck_assert_str_eq(sqs_action_name(SQS_NACTIONS), "?");
    ck_assert_str_eq(sqs_action_name((enum sqs_action) - 1), "?");
}
END_TEST

/* The reference's SigV4 vector body is what we send, but for the attribute
 * names' member (AttributeNames: the form local-aws-sqs reads too). */
START_TEST(test_receive_request)
{
    size_t len;
    char *want = unit_read_file(FX "receive_request_sigv4.json", &len);
    char *p = strstr(want, "MessageSystemAttributeNames");
    struct buf out;
    struct sqs_receive r = {Q, 10, 20, -1, NULL, 0};
    static const char *const all[] = {"All"};
    ck_assert_ptr_nonnull(p);
    memmove(p, p + strlen("MessageSystem"), strlen(p + strlen("MessageSystem")) + 1);
    buf_init(&out);
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), 0);
    ck_assert_str_eq(out.data, want);
    buf_reset(&out);
    r.max_messages = 8;
    r.wait_time_s = 2;
    r.visibility_timeout_s = 30;
    r.message_attribute_names = all;
    r.n_message_attribute_names = 1;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"MaxNumberOfMessages\":8,"
                               "\"WaitTimeSeconds\":2,\"VisibilityTimeout\":30,"
                               "\"AttributeNames\":[\"ApproximateReceiveCount\"],"
                               "\"MessageAttributeNames\":[\"All\"]}");
    /* out of range: nothing appended */
    buf_reset(&out);
    r.max_messages = 11;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    r.max_messages = 0;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    r.max_messages = 1;
    r.wait_time_s = 21;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    r.wait_time_s = 0;
    r.visibility_timeout_s = 43201;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    r.visibility_timeout_s = 0;
    r.queue_url = "";
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    r.queue_url = Q;
    r.message_attribute_names = NULL;
    ck_assert_int_eq(sqs_req_receive(&out, &r, NULL), CR_EINVAL);
    ck_assert_uint_eq(out.len, 0);
    buf_release(&out);
    free(want);
}
END_TEST

static cJSON *obj(const char *json)
{
    cJSON *v = cJSON_Parse(json);
    ck_assert_ptr_nonnull(v);
    return v;
}

START_TEST(test_queue_requests)
{
    struct buf out;
    struct cr_err err = {0};
    cJSON *attrs = obj("{\"KmsMasterKeyId\": \"k\", \"VisibilityTimeout\": \"60\", "
                       "\"MessageRetentionPeriod\": \"60\", \"KmsMasterKeyId\": \"k2\"}");
    cJSON *tags = obj("{\"team\": \"llm\"}");
    cJSON *bad = obj("{\"DelaySeconds\": 5}");
    static const char *const depth[] = {"ApproximateNumberOfMessages",
                                        "ApproximateNumberOfMessagesNotVisible"};
    buf_init(&out);
    ck_assert_int_eq(sqs_req_get_queue_url(&out, "dev-llm-high", NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueName\":\"dev-llm-high\"}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_create_queue(&out, "celery", 1800, NULL, NULL, NULL), 0);
    ck_assert_str_eq(
        out.data,
        "{\"QueueName\":\"celery\",\"Attributes\":{\"VisibilityTimeout\":\"1800\"}}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_create_queue(&out, "dev-jobs.fifo", 1800, NULL, NULL, NULL),
                     0);
    ck_assert_str_eq(out.data, "{\"QueueName\":\"dev-jobs.fifo\",\"Attributes\":{"
                               "\"VisibilityTimeout\":\"1800\",\"FifoQueue\":\"true\"}}");
    buf_reset(&out);
    /* dict.update(): VisibilityTimeout replaced in place, the rest appended,
     * the last of a duplicate key kept */
    ck_assert_int_eq(sqs_req_create_queue(&out, "dev-jobs.fifo", 1800, attrs, tags, NULL),
                     0);
    ck_assert_str_eq(out.data,
                     "{\"QueueName\":\"dev-jobs.fifo\",\"Attributes\":{"
                     "\"VisibilityTimeout\":\"60\",\"FifoQueue\":\"true\","
                     "\"MessageRetentionPeriod\":\"60\",\"KmsMasterKeyId\":\"k2\"},"
                     "\"tags\":{\"team\":\"llm\"}}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_create_queue(&out, "celery", 1800, bad, NULL, &err),
                     CR_EINVAL);
    ck_assert_str_eq(err.msg, "sqs creation attribute 'DelaySeconds' is not a string");
    ck_assert_int_eq(sqs_req_create_queue(&out, "celery", 1800, NULL, bad, NULL),
                     CR_EINVAL);
    ck_assert_int_eq(sqs_req_create_queue(&out, "celery", -1, NULL, NULL, NULL),
                     CR_EINVAL);
    ck_assert_int_eq(sqs_req_create_queue(&out, "", 1800, NULL, NULL, NULL), CR_EINVAL);
    ck_assert_uint_eq(out.len, 0);
    ck_assert_int_eq(sqs_req_get_queue_attributes(&out, Q, depth, 2, NULL), 0);
    ck_assert_str_eq(
        out.data,
        "{\"QueueUrl\":\"" Q "\",\"AttributeNames\":["
        "\"ApproximateNumberOfMessages\",\"ApproximateNumberOfMessagesNotVisible\"]}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_get_queue_attributes(&out, Q, NULL, 0, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"AttributeNames\":[\"All\"]}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_purge_queue(&out, Q, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\"}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_delete(&out, Q, "abc+def=", NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"ReceiptHandle\":\"abc+def=\"}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_change_visibility(&out, Q, "rh", 0, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"ReceiptHandle\":\"rh\","
                               "\"VisibilityTimeout\":0}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_change_visibility(&out, Q, "rh", 43201, NULL), CR_EINVAL);
    ck_assert_int_eq(sqs_req_delete(&out, Q, "", NULL), CR_EINVAL);
    ck_assert_uint_eq(out.len, 0);
    cJSON_Delete(attrs);
    cJSON_Delete(tags);
    cJSON_Delete(bad);
    buf_release(&out);
}
END_TEST

START_TEST(test_send_requests)
{
    struct buf out;
    struct cr_err err = {0};
    struct sqs_send s = {Q, "eyJ9", 4, -1, NULL, NULL, 0};
    buf_init(&out);
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"MessageBody\":\"eyJ9\"}");
    buf_reset(&out);
    s.delay_s = 5;
    s.group_id = "g"; /* ignored on a standard queue */
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q
                               "\",\"MessageBody\":\"eyJ9\",\"DelaySeconds\":5}");
    buf_reset(&out);
    /* a raw envelope: quotes, backslashes and the allowed controls escaped,
     * UTF-8 kept */
    s.body = "{\"a\": \"\\u00e9\xc3\xa9\t\n\r\"}";
    s.body_len = strlen(s.body);
    s.delay_s = -1;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"MessageBody\":\"{\\\"a\\\": "
                               "\\\"\\\\u00e9\xc3\xa9\\t\\n\\r\\\"}\"}");
    buf_reset(&out);
    /* FIFO: kombu's default group, the caller's deduplication id */
    s.queue_url = QF;
    s.body = "eyJ9";
    s.body_len = 4;
    s.group_id = NULL;
    s.dedup_id = "8c7f5f2e-0000-4000-8000-000000000001";
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" QF "\",\"MessageBody\":\"eyJ9\","
                               "\"MessageGroupId\":\"default\","
                               "\"MessageDeduplicationId\":"
                               "\"8c7f5f2e-0000-4000-8000-000000000001\"}");
    buf_reset(&out);
    s.group_id = "tenant-1";
    s.dedup_id = NULL;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" QF "\",\"MessageBody\":\"eyJ9\","
                               "\"MessageGroupId\":\"tenant-1\"}");
    buf_reset(&out);
    /* refusals, nothing appended */
    s.delay_s = 1;
    ck_assert_int_eq(sqs_req_send(&out, &s, &err), CR_EINVAL);
    s.queue_url = Q;
    s.delay_s = 901;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), CR_EINVAL);
    s.delay_s = -1;
    s.body = "a\0b";
    s.body_len = 3;
    ck_assert_int_eq(sqs_req_send(&out, &s, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "sqs message body has a character sqs refuses at byte 1");
    s.body = "\xef\xbf\xbf";
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), CR_EINVAL);
    s.body = "\xc3";
    s.body_len = 1;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), CR_EINVAL);
    s.body = "abcd";
    s.body_len = 4;
    s.max_bytes = 3;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), CR_ETOOBIG);
    s.max_bytes = 0;
    s.body_len = 0;
    ck_assert_int_eq(sqs_req_send(&out, &s, NULL), CR_EINVAL);
    ck_assert_uint_eq(out.len, 0);
    buf_release(&out);
}
END_TEST

/* The DelaySeconds of a publish: eta headers as Celery writes them, against
 * 2026-12-07T08:41:46.223775Z (the 5.6.3 fixture's send time, its eta 5 s on). */
#define DELAY_NOW_US INT64_C(1796632906223775)
static const struct {
    const char *headers; /* JSON, or NULL for no headers at all */
    long want;
} delays[] = {
    {"{\"eta\": \"2026-12-07T08:41:51.223775+00:00\"}", 5}, /* countdown=5 */
    {"{\"eta\": \"2026-12-07T08:41:51.223776+00:00\"}", 5}, /* the fraction cut */
    {"{\"eta\": \"2026-12-07T08:41:52.223774+00:00\"}", 5},
    {"{\"eta\": \"2026-12-07T08:41:47.223775+00:00\"}", 1}, /* a second: the least */
    {"{\"eta\": \"2026-12-07T08:41:51.5Z\"}", 5},
    {"{\"eta\": \"2026-12-07T09:41:51.223775+01:00\"}", 5},   /* an offset */
    {"{\"eta\": \"2026-12-07T08:41:51.223775\"}", 5},         /* naive: UTC */
    {"{\"eta\": \"2026-12-07T08:56:46.223775+00:00\"}", 900}, /* 900 s: SQS's most */
    {"{\"eta\": \"2026-12-07T08:56:47.223775+00:00\"}", 900}, /* over: capped */
    {"{\"eta\": \"2026-12-08T08:41:46+00:00\"}", 900},
    {"{\"eta\": \"9999-12-31T23:59:59+00:00\"}", 900},
    {"{\"eta\": \"2026-12-07T08:41:47.223774+00:00\"}", -1}, /* under a second */
    {"{\"eta\": \"2026-12-07T08:41:46.423775+00:00\"}", -1}, /* a 0.2 s back-off */
    {"{\"eta\": \"2026-12-07T08:41:46.223775+00:00\"}", -1}, /* due now */
    {"{\"eta\": \"2026-12-07T08:41:40+00:00\"}", -1},        /* past */
    {"{\"eta\": null, \"retries\": 1}", -1},
    {"{\"retries\": 1}", -1},
    {"{}", -1},
    {NULL, -1},
    {"{\"eta\": 1796632911}", -1}, /* not a string */
    {"{\"eta\": \"\"}", -1},
    {"{\"eta\": \"tomorrow\"}", -1},
    {"{\"eta\": \"2026-13-07T08:41:51+00:00\"}", -1},
    {"{\"eta\": \"2026-12-07T08:41:51+00:00 \"}", -1},
    {"{\"ETA\": \"2026-12-07T08:41:51+00:00\"}", -1}, /* Celery's key is lower-case */
    {"[\"2026-12-07T08:41:51+00:00\"]", -1},          /* not an object */
};
#define N_DELAYS (int)(sizeof delays / sizeof delays[0])

START_TEST(test_eta_delay)
{
    cJSON *h = delays[_i].headers ? cJSON_Parse(delays[_i].headers) : NULL;
    ck_assert(!delays[_i].headers || h);
    ck_assert_msg(sqs_eta_delay_s(h, DELAY_NOW_US) == delays[_i].want, "%s: %ld, not %ld",
                  delays[_i].headers ? delays[_i].headers : "NULL",
                  sqs_eta_delay_s(h, DELAY_NOW_US), delays[_i].want);
    cJSON_Delete(h);
}
END_TEST

/* The 5.6.3 countdown fixture's own headers: 5 s from its send, and nothing
 * once the clock has passed the eta. */
START_TEST(test_eta_delay_fixture)
{
    size_t n;
    char *text = unit_read_file(FX "env_celery563_countdown.json", &n);
    cJSON *env = cJSON_Parse(text);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(env, "headers");
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(sqs_eta_delay_s(h, DELAY_NOW_US), 5);
    ck_assert_int_eq(sqs_eta_delay_s(h, DELAY_NOW_US + 3500000), 1);
    ck_assert_int_eq(sqs_eta_delay_s(h, DELAY_NOW_US + 4500000), -1);
    ck_assert_int_eq(sqs_eta_delay_s(h, DELAY_NOW_US + 5000000), -1);
    cJSON_Delete(env);
    free(text);
}
END_TEST

START_TEST(test_batch_requests)
{
    struct buf out;
    struct cr_err err = {0};
    struct sqs_entry e[SQS_BATCH_MAX + 1];
    char ids[SQS_BATCH_MAX + 1][16];
    for (int i = 0; i <= SQS_BATCH_MAX; i++) {
        snprintf(ids[i], sizeof ids[i], "m%d", i);
        e[i].id = ids[i];
        e[i].receipt_handle = "rh";
        e[i].visibility_timeout_s = 10;
    }
    buf_init(&out);
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"Entries\":["
                               "{\"Id\":\"m0\",\"ReceiptHandle\":\"rh\"},"
                               "{\"Id\":\"m1\",\"ReceiptHandle\":\"rh\"}]}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_change_visibility_batch(&out, Q, e, 1, NULL), 0);
    ck_assert_str_eq(out.data, "{\"QueueUrl\":\"" Q "\",\"Entries\":["
                               "{\"Id\":\"m0\",\"ReceiptHandle\":\"rh\","
                               "\"VisibilityTimeout\":10}]}");
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, SQS_BATCH_MAX, NULL), 0);
    buf_reset(&out);
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, SQS_BATCH_MAX + 1, NULL),
                     CR_EINVAL);
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 0, NULL), CR_EINVAL);
    e[1].id = "m0";
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, &err), CR_EINVAL);
    ck_assert_str_eq(err.msg, "sqs batch entry id 'm0' twice");
    e[1].id = "m.1";
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, NULL), CR_EINVAL);
    e[1].id = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
              "aaaaaaa";
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, NULL), CR_EINVAL);
    e[1].id = "m1";
    e[1].receipt_handle = NULL;
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, NULL), CR_EINVAL);
    e[1].receipt_handle = "rh";
    e[1].visibility_timeout_s = -1;
    ck_assert_int_eq(sqs_req_change_visibility_batch(&out, Q, e, 2, NULL), CR_EINVAL);
    ck_assert_int_eq(sqs_req_delete_batch(&out, Q, e, 2, NULL), 0);
    buf_release(&out);
}
END_TEST

/* ---- responses -------------------------------------------------------------- */

START_TEST(test_receive_fixture)
{
    size_t len, blen;
    char *resp = unit_read_file(FX "receive_two.json", &len);
    char *b64 = unit_read_file(FX "body_celery526.b64", &blen);
    struct sqs_messages ms;
    struct kombu_msg m;
    struct cr_err err = {0};
    ck_assert_int_eq(sqs_parse_receive(resp, len, 0, &ms, &err), 0);
    ck_assert_int_eq(ms.n, 2);
    ck_assert_str_eq(ms.v[0].message_id, "0faf99ea-1c1e-4c8e-9a57-3f7a3c2b8f10");
    ck_assert_str_eq(ms.v[0].receipt_handle, "AQEBexampleReceiptHandle+/=1");
    /* the captured MD5OfMessageBody started 8416dac4 */
    ck_assert_str_eq(ms.v[0].md5_of_body, "8416dac486473a1d314ccf02b163ac9b");
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(
            sqs_md5_matches(ms.v[i].body, ms.v[i].body_len, ms.v[i].md5_of_body), 1);
    ck_assert_int_eq(
        sqs_md5_matches(ms.v[0].body, ms.v[0].body_len - 1, ms.v[0].md5_of_body), 0);
    ck_assert_int_eq(sqs_md5_matches(ms.v[0].body, ms.v[0].body_len,
                                     "8416DAC486473A1D314CCF02B163AC9B"),
                     1);
    ck_assert_int_eq(sqs_md5_matches(ms.v[0].body, ms.v[0].body_len, "8416dac4"), 0);
    ck_assert_int_eq(sqs_md5_matches(ms.v[0].body, ms.v[0].body_len, ""), -1);
    ck_assert_int_eq(sqs_md5_matches(ms.v[0].body, ms.v[0].body_len, NULL), -1);
    ck_assert_str_eq(ms.v[0].body, b64);
    ck_assert_int_eq(ms.v[0].receive_count, 1);
    ck_assert_int_eq(ms.v[1].receive_count, 3);
    ck_assert_int_eq(ms.v[0].oversize, 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(sqs_body_decode(&m, ms.v[i].body, ms.v[i].body_len, 0, NULL), 0);
        check_526(&m);
        kombu_msg_release(&m);
    }
    sqs_messages_release(&ms);
    /* a smaller bound keeps the message, without its body */
    ck_assert_int_eq(sqs_parse_receive(resp, len, 1148, &ms, &err), 0);
    ck_assert_int_eq(ms.n, 2);
    ck_assert_int_eq(ms.v[0].oversize, 0);
    ck_assert_int_eq(ms.v[1].oversize, 0);
    sqs_messages_release(&ms);
    ck_assert_int_eq(sqs_parse_receive(resp, len, 900, &ms, &err), 0);
    ck_assert_int_eq(ms.v[0].oversize, 1);
    ck_assert_ptr_null(ms.v[0].body);
    ck_assert_uint_eq(ms.v[0].body_len, 1148);
    ck_assert_str_eq(ms.v[0].receipt_handle, "AQEBexampleReceiptHandle+/=1");
    ck_assert_int_eq(ms.v[1].oversize, 0);
    sqs_messages_release(&ms);
    free(resp);
    free(b64);

    /* none: {}, an empty body (local-aws-sqs), null */
    resp = unit_read_file(FX "receive_empty.json", &len);
    ck_assert_int_eq(sqs_parse_receive(resp, len, 0, &ms, NULL), 0);
    ck_assert_int_eq(ms.n, 0);
    free(resp);
    resp = unit_read_file(FX "receive_empty_body.txt", &len);
    ck_assert_int_eq(sqs_parse_receive(resp, len, 0, &ms, NULL), 0);
    ck_assert_int_eq(ms.n, 0);
    free(resp);
    ck_assert_int_eq(sqs_parse_receive(S(" \r\n"), 0, &ms, NULL), 0);
    ck_assert_int_eq(sqs_parse_receive(S("{\"Messages\": null}"), 0, &ms, NULL), 0);
    ck_assert_int_eq(sqs_parse_receive(S("{\"Messages\": []}"), 0, &ms, NULL), 0);
    ck_assert_int_eq(ms.n, 0);
}
END_TEST

static const struct {
    const char *resp;
    int rc;
    long count; /* receive count of the one message when rc == 0 */
} receive_forms[] = {
    {"[]", CR_EPROTO, 0},
    {"null", CR_EPROTO, 0},
    {"{", CR_EPROTO, 0},
    {"<ReceiveMessageResponse/>", CR_EPROTO, 0},
    {"{\"Messages\": {}}", CR_EPROTO, 0},
    {"{\"Messages\": [1]}", CR_EPROTO, 0},
    {"{\"Messages\": [{\"ReceiptHandle\": \"r\", \"Body\": \"b\"}]}", CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"Body\": \"b\"}]}", CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"\", \"Body\": \"b\"}]}",
     CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\"}]}", CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": 1}]}",
     CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": \"b\", "
     "\"MD5OfBody\": 5}]}",
     CR_EPROTO, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": "
     "\"b\"}]}",
     0, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": \"b\", "
     "\"Attributes\": {\"ApproximateReceiveCount\": \"x\"}}]}",
     0, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": \"b\", "
     "\"Attributes\": {\"ApproximateReceiveCount\": 2}}]}",
     0, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": \"b\", "
     "\"Attributes\": {\"ApproximateReceiveCount\": \"9999999999999999999\"}}]}",
     0, 0},
    {"{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": \"r\", \"Body\": \"\", "
     "\"Attributes\": {\"ApproximateReceiveCount\": \"12\"}, \"Extra\": [1]}]}",
     0, 12},
};
#define N_RECEIVE_FORMS ((int)(sizeof receive_forms / sizeof *receive_forms))

START_TEST(test_receive_forms)
{
    struct sqs_messages ms;
    struct cr_err err = {0};
    int rc = sqs_parse_receive(S(receive_forms[_i].resp), 0, &ms, &err);
    ck_assert_msg(rc == receive_forms[_i].rc, "'%s': %d %s", receive_forms[_i].resp, rc,
                  err.msg);
    if (rc == 0) {
        ck_assert_int_eq(ms.n, 1);
        ck_assert_int_eq(ms.v[0].receive_count, receive_forms[_i].count);
        sqs_messages_release(&ms);
    } else {
        ck_assert_int_eq(ms.n, 0);
        ck_assert_str_ne(err.msg, "");
    }
}
END_TEST

START_TEST(test_receive_limits)
{
    struct buf b;
    struct sqs_messages ms;
    char rh[SQS_RECEIPT_MAX + 2];
    char *big;
    buf_init(&b);
    ck_assert_int_eq(buf_puts(&b, "{\"Messages\": ["), 0);
    for (int i = 0; i <= SQS_BATCH_MAX; i++)
        ck_assert_int_eq(buf_printf(&b,
                                    "%s{\"MessageId\": \"%d\", \"ReceiptHandle\": \"r\", "
                                    "\"Body\": \"b\"}",
                                    i ? ", " : "", i),
                         0);
    ck_assert_int_eq(buf_puts(&b, "]}"), 0);
    ck_assert_int_eq(sqs_parse_receive(b.data, b.len, 0, &ms, NULL), CR_EPROTO);
    buf_reset(&b);
    memset(rh, 'r', sizeof rh - 1);
    rh[sizeof rh - 1] = '\0';
    ck_assert_int_eq(
        buf_printf(&b,
                   "{\"Messages\": [{\"MessageId\": \"i\", \"ReceiptHandle\": "
                   "\"%s\", \"Body\": \"b\"}]}",
                   rh),
        0);
    ck_assert_int_eq(sqs_parse_receive(b.data, b.len, 0, &ms, NULL), CR_EPROTO);
    buf_release(&b);
    big = malloc(SQS_RESPONSE_MAX_BYTES + 1);
    ck_assert_ptr_nonnull(big);
    memset(big, ' ', SQS_RESPONSE_MAX_BYTES + 1);
    ck_assert_int_eq(sqs_parse_receive(big, SQS_RESPONSE_MAX_BYTES + 1, 0, &ms, NULL),
                     CR_ETOOBIG);
    /* a long blank body is read (and found empty) in linear time */
    ck_assert_int_eq(sqs_parse_receive(big, SQS_RESPONSE_MAX_BYTES, 0, &ms, NULL), 0);
    free(big);
    /* deep nesting is refused by the JSON reader */
    buf_init(&b);
    ck_assert_int_eq(buf_puts(&b, "{\"Messages\": "), 0);
    for (int i = 0; i < 5000; i++)
        ck_assert_int_eq(buf_putc(&b, '['), 0);
    ck_assert_int_eq(sqs_parse_receive(b.data, b.len, 0, &ms, NULL), CR_EPROTO);
    buf_release(&b);
}
END_TEST

START_TEST(test_other_answers)
{
    size_t len;
    char *resp = unit_read_file(FX "queue_url.json", &len);
    char *url = NULL;
    struct sqs_queue_attrs a;
    ck_assert_int_eq(sqs_parse_queue_url(resp, len, &url, NULL), 0);
    ck_assert_str_eq(url, "http://127.0.0.1:19324/123456789012/dev-llm-high");
    cr_free(url);
    free(resp);
    ck_assert_int_eq(sqs_parse_queue_url(S("{}"), &url, NULL), CR_EPROTO);
    ck_assert_ptr_null(url);
    ck_assert_int_eq(sqs_parse_queue_url(S("{\"QueueUrl\": \"\"}"), &url, NULL),
                     CR_EPROTO);
    ck_assert_int_eq(sqs_parse_queue_url(S("{\"QueueUrl\": 1}"), &url, NULL), CR_EPROTO);
    ck_assert_int_eq(sqs_parse_queue_url(S(""), &url, NULL), CR_EPROTO);

    resp = unit_read_file(FX "queue_attrs.json", &len);
    ck_assert_int_eq(sqs_parse_queue_attrs(resp, len, &a, NULL), 0);
    ck_assert_int_eq(a.messages, 5);
    ck_assert_int_eq(a.messages_not_visible, 2);
    ck_assert_int_eq(a.messages_delayed, 0);
    ck_assert_int_eq(a.visibility_timeout_s, 1800);
    ck_assert_int_eq(a.maximum_message_size, 1048576);
    ck_assert_int_eq(a.delay_s, 0);
    ck_assert_int_eq(a.fifo, 0);
    free(resp);
    ck_assert_int_eq(sqs_parse_queue_attrs(S("{\"Attributes\": {\"FifoQueue\": \"true\", "
                                             "\"ApproximateNumberOfMessages\": \"-1\"}}"),
                                           &a, NULL),
                     0);
    ck_assert_int_eq(a.fifo, 1);
    ck_assert_int_eq(a.messages, -1);
    ck_assert_int_eq(a.visibility_timeout_s, -1);
    ck_assert_int_eq(sqs_parse_queue_attrs(S("{}"), &a, NULL), 0);
    ck_assert_int_eq(a.messages, -1);
    ck_assert_int_eq(sqs_parse_queue_attrs(S("{\"Attributes\": []}"), &a, NULL),
                     CR_EPROTO);
}
END_TEST

START_TEST(test_send_answer)
{
    struct sqs_sent r;
    ck_assert_int_eq(
        sqs_parse_send(S("{\"MD5OfMessageBody\":\"8416dac486473a1d314ccf02b163ac9b\","
                         "\"MessageId\":\"0faf99ea-1c1e-4c8e-9a57-3f7a3c2b8f10\"}"),
                       &r, NULL),
        0);
    ck_assert_str_eq(r.message_id, "0faf99ea-1c1e-4c8e-9a57-3f7a3c2b8f10");
    ck_assert_str_eq(r.md5_of_body, "8416dac486473a1d314ccf02b163ac9b");
    ck_assert_str_eq(r.sequence_number, "");
    ck_assert_int_eq(sqs_parse_send(S("{\"MessageId\":\"i\",\"SequenceNumber\":"
                                      "\"18849496460467696128\"}"),
                                    &r, NULL),
                     0);
    ck_assert_str_eq(r.sequence_number, "18849496460467696128");
    ck_assert_int_eq(sqs_parse_send(S("{}"), &r, NULL), CR_EPROTO);
    ck_assert_int_eq(sqs_parse_send(S("{\"MessageId\":1}"), &r, NULL), CR_EPROTO);
    ck_assert_int_eq(sqs_parse_send(S("{\"MessageId\":\"i\",\"MD5OfMessageBody\":"
                                      "\"0123456789012345678901234567890123456789\"}"),
                                    &r, NULL),
                     CR_EPROTO);
    ck_assert_str_eq(r.message_id, "");
    ck_assert_int_eq(sqs_parse_send(S(""), &r, NULL), CR_EPROTO);
}
END_TEST

START_TEST(test_batch_fixture)
{
    size_t len;
    char *resp = unit_read_file(FX "batch_mixed.json", &len);
    struct sqs_batch_result r;
    ck_assert_int_eq(sqs_parse_batch(resp, len, &r, NULL), 0);
    ck_assert_int_eq(r.n, 3);
    ck_assert_int_eq(r.n_failed, 1);
    ck_assert_str_eq(r.v[0].id, "m0");
    ck_assert_int_eq(r.v[0].kind, SQS_ERR_NONE);
    ck_assert_str_eq(r.v[1].id, "m2");
    ck_assert_str_eq(r.v[2].id, "m1");
    ck_assert_int_eq(r.v[2].kind, SQS_ERR_RECEIPT);
    ck_assert_int_eq(r.v[2].sender_fault, 1);
    ck_assert_str_eq(r.v[2].code, "ReceiptHandleIsInvalid");
    ck_assert_str_eq(r.v[2].message, "The input receipt handle is invalid.");
    free(resp);

    ck_assert_int_eq(sqs_parse_batch(S("{}"), &r, NULL), 0);
    ck_assert_int_eq(r.n, 0);
    /* a server fault with an unknown code retries; a sender one does not */
    ck_assert_int_eq(sqs_parse_batch(S("{\"Failed\": [{\"Id\": \"a\", \"SenderFault\": "
                                       "false, \"Code\": \"X\"}, {\"Id\": \"b\", "
                                       "\"SenderFault\": true, \"Code\": \"X\"}]}"),
                                     &r, NULL),
                     0);
    ck_assert_int_eq(r.v[0].kind, SQS_ERR_RETRY);
    ck_assert_int_eq(r.v[1].kind, SQS_ERR_BAD_REQUEST);
    ck_assert_int_eq(sqs_parse_batch(S("{\"Failed\": {}}"), &r, NULL), CR_EPROTO);
    ck_assert_int_eq(sqs_parse_batch(S("{\"Successful\": [{}]}"), &r, NULL), CR_EPROTO);
    ck_assert_int_eq(r.n, 0);
    ck_assert_int_eq(sqs_parse_batch(S("{\"Successful\": [{\"Id\": 1}]}"), &r, NULL),
                     CR_EPROTO);
    ck_assert_int_eq(
        sqs_parse_batch(S("{\"Successful\": [{\"Id\": \"aaaaaaaaaaaaaaaaaaaaaaaaa"
                          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                          "aa\"}]}"),
                        &r, NULL),
        CR_EPROTO);
    ck_assert_int_eq(
        sqs_parse_batch(S("{\"Successful\": [{\"Id\": \"1\"}, {\"Id\": \"2\"}, "
                          "{\"Id\": \"3\"}, {\"Id\": \"4\"}, {\"Id\": \"5\"}, "
                          "{\"Id\": \"6\"}, {\"Id\": \"7\"}, {\"Id\": \"8\"}, "
                          "{\"Id\": \"9\"}, {\"Id\": \"10\"}, {\"Id\": \"11\"}]}"),
                        &r, NULL),
        CR_EPROTO);
    ck_assert_int_eq(sqs_parse_batch(S("[]"), &r, NULL), CR_EPROTO);
}
END_TEST

/* ---- errors ----------------------------------------------------------------- */

START_TEST(test_error_fixtures)
{
    size_t len, hlen;
    char *body = unit_read_file(FX "error_nonexistent.json", &len);
    char *hdr = unit_read_file(FX "error_nonexistent.header", &hlen);
    struct sqs_error e;
    sqs_error_parse(400, hdr, body, len, &e);
    ck_assert_int_eq(e.kind, SQS_ERR_QUEUE_MISSING);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.code, "QueueDoesNotExist");
    ck_assert_str_eq(e.query_code, "AWS.SimpleQueueService.NonExistentQueue");
    ck_assert_int_eq(e.sender_fault, 1);
    ck_assert_str_eq(e.message, "\xe2\x80\xa6");
    sqs_error_parse(400, NULL, body, len, &e);
    ck_assert_int_eq(e.kind, SQS_ERR_QUEUE_MISSING);
    ck_assert_int_eq(e.sender_fault, 0);
    sqs_error_parse(400, hdr, "", 0, &e);
    ck_assert_int_eq(e.kind, SQS_ERR_QUEUE_MISSING);
    free(body);
    body = unit_read_file(FX "error_nonexistent.xml", &len);
    sqs_error_parse(400, NULL, body, len, &e);
    ck_assert_int_eq(e.kind, SQS_ERR_QUEUE_MISSING);
    ck_assert_str_eq(e.code, "AWS.SimpleQueueService.NonExistentQueue");
    ck_assert_str_eq(e.message, "\xe2\x80\xa6");
    ck_assert_int_eq(e.sender_fault, 1);
    free(body);
    free(hdr);
}
END_TEST

static const struct {
    int status;
    const char *header;
    const char *body;
    enum sqs_err_kind kind;
} error_forms[] = {
    {200, NULL, "{}", SQS_ERR_NONE},
    {0, NULL, "", SQS_ERR_RETRY},
    {500, NULL, "", SQS_ERR_RETRY},
    {502, NULL, "<html>bad gateway</html>", SQS_ERR_RETRY},
    {503, NULL, "{\"__type\":\"com.amazonaws.sqs#ServiceUnavailable\"}", SQS_ERR_RETRY},
    {504, NULL, "", SQS_ERR_RETRY},
    {408, NULL, "", SQS_ERR_RETRY},
    {429, NULL, "", SQS_ERR_RETRY},
    {509, NULL, "", SQS_ERR_RETRY},
    {500, NULL, "{\"__type\":\"InternalError\",\"Message\":\"x\"}", SQS_ERR_RETRY},
    {403, NULL,
     "<ErrorResponse><Error><Type>Sender</Type><Code>RequestThrottled</Code></Error>"
     "</ErrorResponse>",
     SQS_ERR_RETRY},
    {400, NULL, "{\"__type\":\"ThrottlingException\"}", SQS_ERR_RETRY},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#KmsThrottled\"}", SQS_ERR_RETRY},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#RequestTimeout\"}", SQS_ERR_RETRY},
    {403, NULL, "{\"__type\":\"com.amazonaws.sqs#OverLimit\"}", SQS_ERR_OVER_LIMIT},
    {400, "OverLimit;Sender", "", SQS_ERR_OVER_LIMIT},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#QueueNameExists\"}",
     SQS_ERR_QUEUE_EXISTS},
    {400, NULL,
     "<ErrorResponse><Error><Code>QueueAlreadyExists</Code></Error></ErrorResponse>",
     SQS_ERR_QUEUE_EXISTS},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#ReceiptHandleIsInvalid\"}",
     SQS_ERR_RECEIPT},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#MessageNotInflight\"}", SQS_ERR_RECEIPT},
    {400, NULL,
     "<ErrorResponse><Error><Code>AWS.SimpleQueueService.MessageNotInflight</Code>"
     "</Error></ErrorResponse>",
     SQS_ERR_RECEIPT},
    {403, NULL, "{\"__type\":\"ExpiredToken\"}", SQS_ERR_CREDENTIALS},
    {400, NULL, "{\"__type\":\"com.amazon.coral.service#ExpiredTokenException\"}",
     SQS_ERR_CREDENTIALS},
    {400, NULL, "{\"__type\":\"RequestExpired\"}", SQS_ERR_CREDENTIALS},
    {403, NULL, "{\"__type\":\"InvalidClientTokenId\"}", SQS_ERR_CREDENTIALS},
    {400, NULL, "{\"__type\":\"com.amazon.coral.service#UnrecognizedClientException\"}",
     SQS_ERR_CREDENTIALS},
    {403, NULL, "{\"__type\":\"com.amazon.coral.service#AccessDeniedException\"}",
     SQS_ERR_DENIED},
    {403, NULL,
     "<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code><Message>The request "
     "signature we calculated does not match</Message></Error></ErrorResponse>",
     SQS_ERR_DENIED},
    {403, NULL, "", SQS_ERR_DENIED},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#InvalidParameterValue\"}",
     SQS_ERR_BAD_REQUEST},
    {400, NULL, "{\"__type\":\"com.amazonaws.sqs#QueueDoesNotExist:http://x/\"}",
     SQS_ERR_QUEUE_MISSING},
    {400, NULL, "{\"code\":\"AccessDenied\"}", SQS_ERR_DENIED},
    {400, NULL, "{\"__type\": 5}", SQS_ERR_BAD_REQUEST},
    {400, NULL, "{not json", SQS_ERR_BAD_REQUEST},
    {400, NULL, "<Error><Code>unterminated", SQS_ERR_BAD_REQUEST},
    {404, NULL, "<html></html>", SQS_ERR_BAD_REQUEST},
    {500, NULL, "{\"__type\":\"com.amazonaws.sqs#\"}", SQS_ERR_RETRY},
    {400, "garbage", "", SQS_ERR_BAD_REQUEST},
    {400, ";Sender", "", SQS_ERR_BAD_REQUEST},
};
#define N_ERROR_FORMS ((int)(sizeof error_forms / sizeof *error_forms))

START_TEST(test_error_forms)
{
    struct sqs_error e;
    sqs_error_parse(error_forms[_i].status, error_forms[_i].header,
                    S(error_forms[_i].body), &e);
    ck_assert_msg(e.kind == error_forms[_i].kind, "%d %s: %s (code '%s')",
                  error_forms[_i].status, error_forms[_i].body, sqs_err_kind_name(e.kind),
                  e.code);
}
END_TEST

START_TEST(test_error_names)
{
    for (int k = 0; k < SQS_ERR_NKINDS; k++) {
        ck_assert_str_ne(sqs_err_kind_name(k), "?");
        ck_assert_str_ne(sqs_err_kind_reason(k), "?");
        for (int j = 0; j < k; j++)
            ck_assert_str_ne(sqs_err_kind_name(k), sqs_err_kind_name(j));
    }
    ck_assert_str_eq(sqs_err_kind_name(SQS_ERR_QUEUE_MISSING), "QUEUE_MISSING");
    ck_assert_str_eq(sqs_err_kind_name(SQS_ERR_NKINDS), "?");
    ck_assert_str_eq(sqs_err_kind_reason(SQS_ERR_NKINDS), "?");
    ck_assert_int_eq(sqs_classify(NULL, 200), SQS_ERR_NONE);
    ck_assert_int_eq(sqs_classify("", 503), SQS_ERR_RETRY);
    ck_assert_int_eq(sqs_classify("OverLimit", 403), SQS_ERR_OVER_LIMIT);
}
END_TEST

/* Long fields are cut, never overrun. */
START_TEST(test_error_limits)
{
    struct sqs_error e;
    struct buf b;
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    buf_init(&b);
    ck_assert_int_eq(buf_printf(&b, "{\"__type\":\"%s\",\"message\":\"%s\"}", big, big),
                     0);
    sqs_error_parse(400, big, b.data, b.len, &e);
    ck_assert_uint_eq(strlen(e.code), sizeof e.code - 1);
    ck_assert_uint_eq(strlen(e.query_code), sizeof e.query_code - 1);
    ck_assert_uint_eq(strlen(e.message), sizeof e.message - 1);
    ck_assert_int_eq(e.kind, SQS_ERR_BAD_REQUEST);
    buf_reset(&b);
    ck_assert_int_eq(
        buf_printf(&b, "<Error><Code>%s</Code><Message>%s</Message></Error>", big, big),
        0);
    sqs_error_parse(500, NULL, b.data, b.len, &e);
    ck_assert_uint_eq(strlen(e.code), sizeof e.code - 1);
    ck_assert_int_eq(e.kind, SQS_ERR_RETRY);
    /* a multi-byte character is not cut in two */
    buf_reset(&b);
    ck_assert_int_eq(buf_puts(&b, "{\"message\":\""), 0);
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(buf_puts(&b, "\xc3\xa9"), 0);
    ck_assert_int_eq(buf_puts(&b, "\"}"), 0);
    sqs_error_parse(400, NULL, b.data, b.len, &e);
    ck_assert_uint_eq(strlen(e.message), sizeof e.message - 2);
    buf_release(&b);
    sqs_error_parse(400, NULL, NULL, 5, &e);
    ck_assert_int_eq(e.kind, SQS_ERR_BAD_REQUEST);
}
END_TEST

/* ---- truncation ------------------------------------------------------------- */

static const char *const answers[] = {"receive_two.json",       "batch_mixed.json",
                                      "queue_url.json",         "queue_attrs.json",
                                      "error_nonexistent.json", "error_nonexistent.xml"};
#define N_ANSWERS ((int)(sizeof answers / sizeof *answers))

/* Every prefix of every answer is read without a crash; a proper prefix of a
 * JSON answer is never taken for a whole one (but the empty receive). */
START_TEST(test_truncations)
{
    char path[128];
    size_t len;
    char *full;
    snprintf(path, sizeof path, FX "%s", answers[_i]);
    full = unit_read_file(path, &len);
    for (size_t n = 0; n <= len; n++) {
        /* a copy of exactly n bytes, so that reading past it is caught */
        char *p = malloc(n ? n : 1);
        struct sqs_messages ms;
        struct sqs_batch_result br;
        struct sqs_queue_attrs qa;
        struct sqs_error e;
        char *url = NULL;
        int rc;
        memcpy(p, full, n);
        rc = sqs_parse_receive(p, n, 0, &ms, NULL);
        if (rc == 0)
            sqs_messages_release(&ms);
        if (_i == 0)
            ck_assert_int_eq(rc == 0, n == 0 || n == len);
        rc = sqs_parse_batch(p, n, &br, NULL);
        if (_i == 1)
            ck_assert_int_eq(rc == 0, n == len);
        rc = sqs_parse_queue_url(p, n, &url, NULL);
        if (_i == 2)
            ck_assert_int_eq(rc == 0, n == len);
        cr_free(url);
        rc = sqs_parse_queue_attrs(p, n, &qa, NULL);
        if (_i == 3)
            ck_assert_int_eq(rc == 0, n == len);
        sqs_error_parse(400, NULL, p, n, &e);
        if (_i >= 4 && n == len)
            ck_assert_int_eq(e.kind, SQS_ERR_QUEUE_MISSING);
        free(p);
    }
    free(full);
}
END_TEST

/* Every proper prefix of a captured Body is refused, base64 or raw. */
START_TEST(test_body_truncations)
{
    static const char *const bodies[] = {FX "body_celery526.b64", FX "env_celery526.json",
                                         FX "body_celery563_countdown.b64"};
    size_t len;
    char *full = unit_read_file(bodies[_i], &len);
    for (size_t n = 0; n <= len; n++) {
        char *p = malloc(n ? n : 1);
        struct kombu_msg m;
        int rc;
        memcpy(p, full, n);
        rc = sqs_body_decode(&m, p, n, 0, NULL);
        ck_assert_int_eq(rc == 0, n == len);
        if (rc == 0)
            kombu_msg_release(&m);
        free(p);
    }
    free(full);
}
END_TEST

/* ---- allocation failures ---------------------------------------------------- */

static int oom_round(const char *b64, size_t blen, const char *recv, size_t rlen)
{
    struct kombu_msg m;
    struct sqs_messages ms;
    struct sqs_batch_result br;
    struct sqs_queue_attrs qa;
    struct sqs_sent sent;
    struct sqs_error e;
    struct buf out;
    char *url = NULL;
    cJSON *attrs = NULL;
    struct sqs_receive r = {Q, 10, 20, -1, NULL, 0};
    struct sqs_send s = {QF, "eyJ9", 4, -1, NULL, "d", 0};
    struct sqs_entry ent[2] = {{"a", "rh", 0}, {"b", "rh2", 5}};
    int rc;

    buf_init(&out);
    rc = sqs_body_decode(&m, b64, blen, 0, NULL);
    if (rc == 0) {
        rc = encode_from(&m, 0, 0, &out);
        if (rc == 0)
            rc = encode_from(&m, 1, 0, &out);
        kombu_msg_release(&m);
    }
    if (rc == 0)
        rc = sqs_parse_receive(recv, rlen, 0, &ms, NULL);
    if (rc == 0)
        sqs_messages_release(&ms);
    if (rc == 0)
        rc = sqs_parse_batch(S("{\"Successful\": [{\"Id\": \"a\"}], \"Failed\": "
                               "[{\"Id\": \"b\", \"Code\": \"OverLimit\"}]}"),
                             &br, NULL);
    if (rc == 0)
        rc = sqs_parse_queue_url(S("{\"QueueUrl\": \"" Q "\"}"), &url, NULL);
    cr_free(url);
    if (rc == 0)
        rc = sqs_parse_send(S("{\"MessageId\": \"i\"}"), &sent, NULL);
    if (rc == 0)
        rc = sqs_parse_queue_attrs(S("{\"Attributes\": {\"VisibilityTimeout\": \"3\"}}"),
                                   &qa, NULL);
    if (rc == 0)
        rc = sqs_error_parse(400, "x;Sender", S("{\"__type\": \"a#OverLimit\"}"), &e);
    if (rc == 0 && e.kind != SQS_ERR_OVER_LIMIT)
        rc = CR_EPROTO;
    if (rc == 0)
        rc = sqs_req_receive(&out, &r, NULL);
    if (rc == 0)
        rc = sqs_req_send(&out, &s, NULL);
    if (rc == 0)
        rc = sqs_req_delete_batch(&out, Q, ent, 2, NULL);
    if (rc == 0)
        rc = sqs_req_change_visibility_batch(&out, Q, ent, 2, NULL);
    if (rc == 0)
        rc = sqs_req_get_queue_url(&out, "celery", NULL);
    if (rc == 0) {
        attrs = cJSON_CreateObject();
        if (!attrs || !cJSON_AddStringToObject(attrs, "RedrivePolicy", "{}"))
            rc = CR_ENOMEM;
    }
    if (rc == 0)
        rc = sqs_req_create_queue(&out, "x.fifo", 1800, attrs, attrs, NULL);
    cJSON_Delete(attrs);
    if (rc == 0)
        rc = sqs_req_get_queue_attributes(&out, Q, NULL, 0, NULL);
    if (rc == 0)
        rc = sqs_req_purge_queue(&out, Q, NULL);
    if (rc == 0)
        rc = sqs_req_delete(&out, Q, "rh", NULL);
    if (rc == 0)
        rc = sqs_req_change_visibility(&out, Q, "rh", 0, NULL);
    buf_release(&out);
    return rc;
}

START_TEST(test_oom)
{
    size_t blen, rlen;
    char *b64 = unit_read_file(FX "body_celery526.b64", &blen);
    char *recv = unit_read_file(FX "receive_two.json", &rlen);
    ck_assert_int_eq(oom_round(b64, blen, recv, rlen), 0);
    for (long k = 1;; k++) {
        int rc, failed;
        cr_alloc_fail_after(k);
        rc = oom_round(b64, blen, recv, rlen);
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        if (!failed) {
            ck_assert_int_eq(rc, 0);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_int_lt(k, 100000);
    }
    free(b64);
    free(recv);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sqs");
    TCase *fx = tcase_create("fixtures");
    TCase *hand = tcase_create("hand");
    TCase *bad = tcase_create("malformed");
    tcase_add_test(fx, test_body_fixture);
    tcase_add_test(fx, test_body_encode_fixture);
    tcase_add_test(fx, test_receive_request);
    tcase_add_test(fx, test_receive_fixture);
    tcase_add_test(fx, test_other_answers);
    tcase_add_test(fx, test_batch_fixture);
    tcase_add_test(fx, test_send_answer);
    tcase_add_test(fx, test_error_fixtures);
    tcase_add_test(fx, test_eta_delay_fixture);
    suite_add_tcase(s, fx);
    tcase_add_loop_test(hand, test_queue_names, 0, N_NAMES);
    tcase_add_test(hand, test_name_helpers);
    tcase_add_test(hand, test_action_names);
    tcase_add_test(hand, test_queue_requests);
    tcase_add_test(hand, test_send_requests);
    tcase_add_test(hand, test_batch_requests);
    tcase_add_loop_test(hand, test_eta_delay, 0, N_DELAYS);
    tcase_add_loop_test(hand, test_error_forms, 0, N_ERROR_FORMS);
    tcase_add_test(hand, test_error_names);
    suite_add_tcase(s, hand);
    tcase_add_loop_test(bad, test_body_forms, 0, N_BODY_FORMS);
    tcase_add_test(bad, test_body_limits);
    tcase_add_loop_test(bad, test_receive_forms, 0, N_RECEIVE_FORMS);
    tcase_add_test(bad, test_receive_limits);
    tcase_add_test(bad, test_error_limits);
    tcase_add_loop_test(bad, test_truncations, 0, N_ANSWERS);
    tcase_add_loop_test(bad, test_body_truncations, 0, 3);
    tcase_add_test(bad, test_oom);
    tcase_set_timeout(bad, 120);
    suite_add_tcase(s, bad);
    return s;
}
