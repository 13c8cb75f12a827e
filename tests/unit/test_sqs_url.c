/* test_sqs_url.c -- the SQS broker URL, transport options and environment,
 * resolved as kombu and botocore resolve them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/sqs_url.h"
#include "util/alloc.h"

static const char *const env_keys[] = {"AWS_ACCESS_KEY_ID=ENVKEY",
                                       "AWS_SECRET_ACCESS_KEY=envsecret/+x", NULL};

/* ------------------------------------------------------------ URL forms */

static const struct {
    const char *url, *opts;
    const char *endpoint, *region, *key, *secret;
    int source, has_host;
} good[] = {
    /* no host: the region's https endpoint, the environment's keys */
    {"sqs://", NULL, "https://sqs.us-east-1.amazonaws.com", "us-east-1", "ENVKEY",
     "envsecret/+x", SQS_CREDS_ENV, 0},
    {"sqs://k:s@", NULL, "https://sqs.us-east-1.amazonaws.com", "us-east-1", "k", "s",
     SQS_CREDS_URL, 0},
    /* a host: plain http unless is_secure is true (kombu's endpoint_url) */
    {"sqs://test:test@127.0.0.1:9324", NULL, "http://127.0.0.1:9324", "us-east-1", "test",
     "test", SQS_CREDS_URL, 1},
    {"sqs://test:test@127.0.0.1:9324", "{\"is_secure\": false}", "http://127.0.0.1:9324",
     "us-east-1", "test", "test", SQS_CREDS_URL, 1},
    {"sqs://test:test@127.0.0.1:9324", "{\"is_secure\": null}", "http://127.0.0.1:9324",
     "us-east-1", "test", "test", SQS_CREDS_URL, 1},
    {"sqs://k:s@sqs.eu-west-1.amazonaws.com", "{\"is_secure\": true}",
     "https://sqs.eu-west-1.amazonaws.com", "us-east-1", "k", "s", SQS_CREDS_URL, 1},
    {"sqs://k:s@sqs.eu-west-1.amazonaws.com", NULL, "http://sqs.eu-west-1.amazonaws.com",
     "us-east-1", "k", "s", SQS_CREDS_URL, 1},
    /* is_secure without a host changes nothing: AWS is https */
    {"sqs://k:s@", "{\"is_secure\": false, \"region\": \"eu-west-1\"}",
     "https://sqs.eu-west-1.amazonaws.com", "eu-west-1", "k", "s", SQS_CREDS_URL, 0},
    /* a host without credentials: the environment's */
    {"sqs://localhost:4566", NULL, "http://localhost:4566", "us-east-1", "ENVKEY",
     "envsecret/+x", SQS_CREDS_ENV, 1},
    /* percent-decoded credentials (kombu's safequote encodes '/' and '+') */
    {"sqs://AKID%2Fx:wJal%2BrXU%2Fab%3D@h:1", NULL, "http://h:1", "us-east-1", "AKID/x",
     "wJal+rXU/ab=", SQS_CREDS_URL, 1},
    /* '+' is no space, and a lone '%' is kept */
    {"sqs://k+1:s%zz@h", NULL, "http://h", "us-east-1", "k+1", "s%zz", SQS_CREDS_URL, 1},
    /* the last '@' ends the credentials, as urlsplit reads them */
    {"sqs://k:a@b@h", NULL, "http://h", "us-east-1", "k", "a@b", SQS_CREDS_URL, 1},
    /* a ':' in the secret stays in it */
    {"sqs://k:a:b@h", NULL, "http://h", "us-east-1", "k", "a:b", SQS_CREDS_URL, 1},
    /* a path is ignored, as kombu ignores the vhost; :0 is no port (kombu: None) */
    {"sqs://k:s@h:0/vhost", NULL, "http://h", "us-east-1", "k", "s", SQS_CREDS_URL, 1},
    {"sqs://k:s@h/", NULL, "http://h", "us-east-1", "k", "s", SQS_CREDS_URL, 1},
    {"sqs://k:s@h:", NULL, "http://h", "us-east-1", "k", "s", SQS_CREDS_URL, 1},
    /* a port without a host: kombu's hostname is None */
    {"sqs://k:s@:5", NULL, "https://sqs.us-east-1.amazonaws.com", "us-east-1", "k", "s",
     SQS_CREDS_URL, 0},
    /* IPv6 keeps its brackets (kombu would write http://::1:9324) */
    {"sqs://k:s@[::1]:9324", NULL, "http://[::1]:9324", "us-east-1", "k", "s",
     SQS_CREDS_URL, 1},
    {"sqs://k:s@h:65535", NULL, "http://h:65535", "us-east-1", "k", "s", SQS_CREDS_URL,
     1},
};

START_TEST(test_good)
{
    struct sqs_conf c;
    struct cr_err e = {0};
    const char *o = good[_i].opts;
    sqs_conf_init(&c);
    ck_assert_msg(sqs_conf_parse(&c, good[_i].url, o, o ? strlen(o) : 0, env_keys, &e) ==
                      0,
                  "%s: %s", good[_i].url, e.msg);
    ck_assert_str_eq(c.endpoint, good[_i].endpoint);
    ck_assert_str_eq(c.region, good[_i].region);
    ck_assert_str_eq(c.creds.access_key_id, good[_i].key);
    ck_assert_str_eq(c.creds.secret_access_key, good[_i].secret);
    ck_assert_int_eq(c.creds.source, good[_i].source);
    ck_assert_ptr_null(c.creds.session_token);
    ck_assert_int_eq(c.has_host, good[_i].has_host);
    sqs_conf_release(&c);
    ck_assert_str_eq(c.creds.secret_access_key, "");
}
END_TEST

/* ------------------------------------------------------------ environment */

START_TEST(test_env_precedence)
{
    const char *const env[] = {"AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
                               "AWS_SESSION_TOKEN=TOK", "AWS_ACCESS_KEY_ID=SECOND", NULL};
    const char *const legacy[] = {"AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
                                  "AWS_SESSION_TOKEN=", "AWS_SECURITY_TOKEN=OLD", NULL};
    const char *const empty_key[] = {
        "AWS_ACCESS_KEY_ID=", "AWS_SECRET_ACCESS_KEY=", NULL};
    struct sqs_conf c;
    struct cr_err e;
    char line[256];

    sqs_conf_init(&c);
    /* the environment: keys and the token; the first entry of a name wins */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, env, &e), 0);
    ck_assert_str_eq(c.creds.access_key_id, "EK");
    ck_assert_str_eq(c.creds.secret_access_key, "ES");
    ck_assert_str_eq(c.creds.session_token, "TOK");
    ck_assert_int_eq(c.creds.source, SQS_CREDS_ENV);
    sqs_conf_describe(&c, line, sizeof line);
    ck_assert_str_eq(line, "endpoint=https://sqs.us-east-1.amazonaws.com "
                           "region=us-east-1 creds=env key=EK token=yes predefined=0");
    /* URL keys win, and never carry the environment's token */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://uk:us@", NULL, 0, env, &e), 0);
    ck_assert_str_eq(c.creds.access_key_id, "uk");
    ck_assert_str_eq(c.creds.secret_access_key, "us");
    ck_assert_ptr_null(c.creds.session_token);
    ck_assert_int_eq(c.creds.source, SQS_CREDS_URL);
    sqs_conf_describe(&c, line, sizeof line);
    ck_assert(strstr(line, "us") == strstr(line, "us-east-1"));
    /* an empty AWS_SESSION_TOKEN is unset: the older name is read */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, legacy, &e), 0);
    ck_assert_str_eq(c.creds.session_token, "OLD");
    /* empty is unset */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, empty_key, &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "no AWS credentials") != NULL);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, NULL, &e), CR_EINVAL);
    ck_assert_int_eq(c.creds.session_token == NULL, 1);
    sqs_conf_release(&c);
}
END_TEST

START_TEST(test_region_precedence)
{
    const char *const env_default[] = {"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s",
                                       "AWS_DEFAULT_REGION=ap-south-1",
                                       "AWS_REGION=eu-north-1", NULL};
    const char *const env_region_only[] = {
        "AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s", "AWS_REGION=eu-north-1", NULL};
    const char *const env_none[] = {"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s",
                                    NULL};
    const char *const env_bad[] = {"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s",
                                   "AWS_REGION=eu north", NULL};
    static const char opts[] = "{\"region\": \"eu-west-1\"}";
    static const char opts_empty[] = "{\"region\": \"\"}";
    static const char opts_null[] = "{\"region\": null}";
    struct sqs_conf c;
    struct cr_err e;

    sqs_conf_init(&c);
    /* the option wins over the environment */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", opts, strlen(opts), env_default, &e),
                     0);
    ck_assert_str_eq(c.region, "eu-west-1");
    ck_assert_str_eq(c.endpoint, "https://sqs.eu-west-1.amazonaws.com");
    /* then AWS_DEFAULT_REGION; "" and null are no region (kombu's `or`) */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, env_default, &e), 0);
    ck_assert_str_eq(c.region, "ap-south-1");
    ck_assert_str_eq(c.endpoint, "https://sqs.ap-south-1.amazonaws.com");
    ck_assert_int_eq(
        sqs_conf_parse(&c, "sqs://", opts_empty, strlen(opts_empty), env_default, &e), 0);
    ck_assert_str_eq(c.region, "ap-south-1");
    ck_assert_int_eq(
        sqs_conf_parse(&c, "sqs://", opts_null, strlen(opts_null), env_default, &e), 0);
    ck_assert_str_eq(c.region, "ap-south-1");
    /* AWS_REGION alone (botocore's own variable wins above) */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, env_region_only, &e), 0);
    ck_assert_str_eq(c.region, "eu-north-1");
    ck_assert_str_eq(c.endpoint, "https://sqs.eu-north-1.amazonaws.com");
    /* none: us-east-1 */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, env_none, &e), 0);
    ck_assert_str_eq(c.region, "us-east-1");
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, env_bad, &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "AWS_REGION must be a region name (a-z, 0-9, '-')");
    /* a host keeps its endpoint, the region still signs */
    ck_assert_int_eq(
        sqs_conf_parse(&c, "sqs://a:b@127.0.0.1:9324", opts, strlen(opts), NULL, &e), 0);
    ck_assert_str_eq(c.region, "eu-west-1");
    ck_assert_str_eq(c.endpoint, "http://127.0.0.1:9324");
    sqs_conf_release(&c);
}
END_TEST

/* ------------------------------------------------------------ options */

START_TEST(test_defaults)
{
    struct sqs_conf c;
    struct cr_err e;
    sqs_conf_init(&c);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://k:s@", "{}", 2, NULL, &e), 0);
    ck_assert_int_eq(c.is_secure, -1);
    ck_assert_int_eq(c.wait_time_s, 10);
    ck_assert_int_eq(c.visibility_timeout_s, 1800);
    ck_assert(c.polling_interval_s == 1.0);
    ck_assert_str_eq(c.prefix, "");
    ck_assert_int_eq(c.base64, 1);
    ck_assert_ptr_null(c.deadletter_queue);
    ck_assert_int_eq(c.ncreate_attrs, 0);
    ck_assert_int_eq(c.ntags, 0);
    ck_assert_ptr_null(c.fetch_attrs);
    ck_assert_int_eq(c.npredefined, 0);
    ck_assert_ptr_null(sqs_conf_queue(&c, "celery"));
    sqs_conf_release(&c);
}
END_TEST

START_TEST(test_options)
{
    static const char opts[] =
        "{\"region\": \"eu-central-1\", \"is_secure\": true, \"wait_time_seconds\": 20, "
        "\"visibility_timeout\": 43200, \"polling_interval\": 0.5, "
        "\"queue_name_prefix\": \"dev-\", \"sqs_base64_encoding\": false, "
        "\"sqs-creation-attributes\": {\"KmsMasterKeyId\": \"alias/aws/sqs\", "
        "\"MessageRetentionPeriod\": \"86400\"}, \"queue_tags\": {\"team\": \"llm\"}, "
        "\"fetch_message_attributes\": [\"All\"], \"deadletter_queue\": \"dead\", "
        "\"body_encoding\": \"base64\", \"port\": 1, \"regioninfo\": null, "
        "\"max_retries\": 3, \"interval_start\": 0, \"interval_step\": 0.2, "
        "\"interval_max\": 0.5, \"sts_role_arn\": \"\", \"sts_token_timeout\": 900, "
        "\"sts_token_buffer_time\": null, \"client-config\": {}, "
        "\"wait_time_seconds\": 0}";
    struct sqs_conf c;
    struct cr_err e = {0};

    sqs_conf_init(&c);
    ck_assert_msg(sqs_conf_parse(&c, "sqs://k:s@h:9", opts, strlen(opts), NULL, &e) == 0,
                  "%s", e.msg);
    ck_assert_str_eq(c.endpoint, "https://h:9");
    ck_assert_int_eq(c.is_secure, 1);
    ck_assert_int_eq(c.wait_time_s, 0); /* a later duplicate wins */
    ck_assert_int_eq(c.visibility_timeout_s, 43200);
    ck_assert(c.polling_interval_s == 0.5);
    ck_assert_str_eq(c.prefix, "dev-");
    ck_assert_int_eq(c.base64, 0);
    ck_assert_int_eq(c.ncreate_attrs, 2);
    ck_assert_str_eq(c.create_attrs[0].key, "KmsMasterKeyId");
    ck_assert_str_eq(c.create_attrs[0].value, "alias/aws/sqs");
    ck_assert_str_eq(c.create_attrs[1].value, "86400");
    ck_assert_int_eq(c.ntags, 1);
    ck_assert_str_eq(c.tags[0].key, "team");
    ck_assert_int_eq(c.nfetch_attrs, 1);
    ck_assert_str_eq(c.fetch_attrs[0], "All");
    ck_assert_str_eq(c.deadletter_queue, "dead");
    sqs_conf_release(&c);
}
END_TEST

/* kombu: `visibility_timeout or 1800` */
START_TEST(test_visibility_falsy)
{
    static const char *const opts[] = {"{\"visibility_timeout\": 0}",
                                       "{\"visibility_timeout\": null}"};
    struct sqs_conf c;
    struct cr_err e;
    sqs_conf_init(&c);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(
            sqs_conf_parse(&c, "sqs://k:s@", opts[i], strlen(opts[i]), NULL, &e), 0);
        ck_assert_int_eq(c.visibility_timeout_s, 1800);
    }
    sqs_conf_release(&c);
}
END_TEST

START_TEST(test_predefined)
{
    static const char opts[] =
        "{\"region\": \"eu-west-1\", \"predefined_queues\": {"
        "\"dev-llm-high\": {\"url\": "
        "\"https://sqs.eu-west-1.amazonaws.com/123456789012/dev-llm-high\"}, "
        "\"jobs.fifo\": {\"url\": \"https://sqs.us-east-2.amazonaws.com/1/jobs.fifo\", "
        "\"access_key_id\": \"QK\", \"secret_access_key\": \"QS/+\", "
        "\"region\": \"us-east-2\", "
        "\"backoff_policy\": {\"1\": 10, \"2\": 20, \"3\": 40}, "
        "\"backoff_tasks\": [\"svc.tasks.task1\", \"svc.tasks.task2\"]}, "
        "\"half\": {\"url\": \"https://q/1/half\", \"access_key_id\": \"HK\"}}}";
    const char *const env[] = {"AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
                               "AWS_SESSION_TOKEN=TOK", NULL};
    struct sqs_conf c;
    struct cr_err e = {0};
    const struct sqs_queue_def *q;
    char line[256];

    sqs_conf_init(&c);
    /* URL credentials: "half" takes its key and the URL's secret (kombu's
     * q.get('secret_access_key', conninfo.password)) */
    ck_assert_msg(sqs_conf_parse(&c, "sqs://UK:U%2FS@", opts, strlen(opts), env, &e) == 0,
                  "%s", e.msg);
    ck_assert_int_eq(c.npredefined, 3);
    q = sqs_conf_queue(&c, "dev-llm-high");
    ck_assert_ptr_nonnull(q);
    ck_assert_int_eq(q->fifo, 0);
    ck_assert_str_eq(q->region, "eu-west-1");
    ck_assert_str_eq(q->endpoint, "https://sqs.eu-west-1.amazonaws.com");
    ck_assert_str_eq(q->creds.access_key_id, "UK");
    ck_assert_str_eq(q->creds.secret_access_key, "U/S");
    ck_assert_int_eq(q->creds.source, SQS_CREDS_URL);
    ck_assert_ptr_null(q->creds.session_token);
    q = sqs_conf_queue(&c, "jobs.fifo");
    ck_assert_ptr_nonnull(q);
    ck_assert_int_eq(q->fifo, 1);
    ck_assert_str_eq(q->url, "https://sqs.us-east-2.amazonaws.com/1/jobs.fifo");
    ck_assert_str_eq(q->region, "us-east-2");
    ck_assert_str_eq(q->endpoint, "https://sqs.us-east-2.amazonaws.com");
    ck_assert_str_eq(q->creds.access_key_id, "QK");
    ck_assert_str_eq(q->creds.secret_access_key, "QS/+"); /* not URL-decoded */
    ck_assert_int_eq(q->creds.source, SQS_CREDS_QUEUE);
    ck_assert_int_eq(q->nbackoff, 3);
    ck_assert_int_eq(q->backoff[2].receive_count, 3);
    ck_assert_int_eq(q->backoff[2].visibility_s, 40);
    ck_assert_int_eq(q->nbackoff_tasks, 2);
    ck_assert_str_eq(q->backoff_tasks[1], "svc.tasks.task2");
    q = sqs_conf_queue(&c, "half");
    ck_assert_str_eq(q->creds.access_key_id, "HK");
    ck_assert_str_eq(q->creds.secret_access_key, "U/S");
    ck_assert_ptr_null(sqs_conf_queue(&c, "llm.high"));
    sqs_conf_describe(&c, line, sizeof line);
    ck_assert(strstr(line, "predefined=3") != NULL);

    /* environment credentials: a queue without keys shares them and the token */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://h:1", opts, strlen(opts), env, &e),
                     CR_EINVAL);
    ck_assert_str_eq(e.msg, "predefined queue 'half' has an access_key_id without a "
                            "secret_access_key");
    {
        static const char two[] = "{\"predefined_queues\": {\"a\": {\"url\": "
                                  "\"http://h:1/1/a\"}}}";
        ck_assert_int_eq(sqs_conf_parse(&c, "sqs://h:1", two, strlen(two), env, &e), 0);
        q = sqs_conf_queue(&c, "a");
        ck_assert_str_eq(q->endpoint, "http://h:1"); /* the URL's host */
        ck_assert_str_eq(q->region, "us-east-1");
        ck_assert_str_eq(q->creds.access_key_id, "EK");
        ck_assert_str_eq(q->creds.session_token, "TOK");
        ck_assert_ptr_ne(q->creds.session_token, c.creds.session_token);
    }
    sqs_conf_release(&c);
}
END_TEST

/* No URL keys and no environment: fine when every predefined queue has keys
 * of its own (kombu never builds the default client then), refused when one
 * does not, or when there is no predefined queue at all. */
START_TEST(test_predefined_own_keys_only)
{
    static const char own[] =
        "{\"predefined_queues\": {\"a\": {\"url\": \"http://h/1/a\", "
        "\"access_key_id\": \"AK\", \"secret_access_key\": \"AS\"}}}";
    static const char mixed[] =
        "{\"predefined_queues\": {\"a\": {\"url\": \"http://h/1/a\", "
        "\"access_key_id\": \"AK\", \"secret_access_key\": \"AS\"}, "
        "\"b\": {\"url\": \"http://h/1/b\"}}}";
    static const char none[] = "{\"predefined_queues\": {}}";
    struct sqs_conf c;
    struct cr_err e = {0};
    char line[256];

    sqs_conf_init(&c);
    ck_assert_msg(sqs_conf_parse(&c, "sqs://", own, strlen(own), NULL, &e) == 0, "%s",
                  e.msg);
    ck_assert_int_eq(c.has_creds, 0);
    ck_assert_str_eq(sqs_conf_queue(&c, "a")->creds.access_key_id, "AK");
    sqs_conf_describe(&c, line, sizeof line);
    ck_assert(strstr(line, "creds=none") != NULL);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", mixed, strlen(mixed), NULL, &e),
                     CR_EINVAL);
    ck_assert(strncmp(e.msg, "no AWS credentials", 18) == 0);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", none, strlen(none), NULL, &e),
                     CR_EINVAL);
    ck_assert(strncmp(e.msg, "no AWS credentials", 18) == 0);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", mixed, strlen(mixed), env_keys, &e), 0);
    ck_assert_int_eq(c.has_creds, 1);
    sqs_conf_release(&c);
}
END_TEST

/* ------------------------------------------------------------ refusals */

static const struct {
    const char *url, *opts, *msg;
} bad[] = {
    {"amqp://h", NULL, "broker URL scheme must be sqs://"},
    {"SQS://h", NULL, "broker URL scheme must be sqs://"},
    {"sqs://k:s@h?region=x", NULL,
     "sqs broker URL: a query or fragment is not supported (use "
     "broker_transport_options)"},
    {"sqs://k:s@h/x#f", NULL,
     "sqs broker URL: a query or fragment is not supported (use "
     "broker_transport_options)"},
    {"sqs://k:s@h:99999", NULL,
     "sqs broker URL: the port is not a number from 0 to 65535"},
    {"sqs://k:s@h:1x", NULL, "sqs broker URL: the port is not a number from 0 to 65535"},
    {"sqs://k:s@[::1", NULL, "sqs broker URL has an unclosed '['"},
    {"sqs://k:s@[::1]x", NULL, "sqs broker URL: text after ']'"},
    {"sqs://k:s@h%20x", NULL, "sqs broker URL: invalid host name"},
    {"sqs://k@h", NULL, "sqs broker URL has an access key id without a secret"},
    {"sqs://k:@h", NULL, "sqs broker URL has an access key id without a secret"},
    {"sqs://:s@h", NULL, "sqs broker URL has a secret without an access key id"},
    {"sqs://k%0A:s@h", NULL,
     "sqs broker URL: access key id or secret has a control or non-ASCII byte"},
    {"sqs://k:s%00@h", NULL,
     "sqs broker URL: access key id or secret has a control or non-ASCII byte"},
    /* a raw '/' in a secret ends the authority: the rest is no port, and the
     * message quotes neither */
    {"sqs://k:ab/cd@h", NULL, "sqs broker URL: the port is not a number from 0 to 65535"},
    {"sqs://", NULL,
     "no AWS credentials for SQS: put them in the broker URL "
     "(sqs://KEY:SECRET@) or set AWS_ACCESS_KEY_ID and "
     "AWS_SECRET_ACCESS_KEY (profiles, web identity, container and "
     "instance credentials are not supported)"},
    {"sqs://k:s@", "[]", "broker transport options must be a JSON object"},
    {"sqs://k:s@", "{", "broker transport options are not JSON: "},
    {"sqs://k:s@", "{\"visibility\": 1}", "unknown broker transport option 'visibility'"},
    {"sqs://k:s@", "{\"region\": 1}",
     "broker transport option 'region' must be a string"},
    {"sqs://k:s@", "{\"region\": \"us-east-1:x\"}",
     "broker transport option 'region' must be a region name (a-z, 0-9, '-')"},
    {"sqs://k:s@", "{\"is_secure\": 1}",
     "broker transport option 'is_secure' must be true, false or null"},
    {"sqs://k:s@", "{\"is_secure\": \"yes\"}",
     "broker transport option 'is_secure' must be true, false or null"},
    {"sqs://k:s@", "{\"wait_time_seconds\": 21}",
     "broker transport option 'wait_time_seconds' is out of range (0..20)"},
    {"sqs://k:s@", "{\"wait_time_seconds\": -1}",
     "broker transport option 'wait_time_seconds' is out of range (0..20)"},
    {"sqs://k:s@", "{\"wait_time_seconds\": NaN}",
     "broker transport option 'wait_time_seconds' must be an integer"},
    {"sqs://k:s@", "{\"visibility_timeout\": Infinity}",
     "broker transport option 'visibility_timeout' must be an integer"},
    {"sqs://k:s@", "{\"polling_interval\": NaN}",
     "broker transport option 'polling_interval' must be a number of seconds from 0 to "
     "86400"},
    {"sqs://k:s@", "{\"wait_time_seconds\": 2.0}",
     "broker transport option 'wait_time_seconds' must be an integer"},
    {"sqs://k:s@", "{\"wait_time_seconds\": \"10\"}",
     "broker transport option 'wait_time_seconds' must be an integer"},
    {"sqs://k:s@", "{\"wait_time_seconds\": null}",
     "broker transport option 'wait_time_seconds' must be an integer"},
    {"sqs://k:s@", "{\"visibility_timeout\": 43201}",
     "broker transport option 'visibility_timeout' is out of range (0..43200)"},
    {"sqs://k:s@", "{\"visibility_timeout\": 30.5}",
     "broker transport option 'visibility_timeout' must be an integer"},
    {"sqs://k:s@", "{\"polling_interval\": -1}",
     "broker transport option 'polling_interval' must be a number of seconds from 0 to "
     "86400"},
    {"sqs://k:s@", "{\"queue_name_prefix\": null}",
     "broker transport option 'queue_name_prefix' must be a string"},
    {"sqs://k:s@",
     "{\"queue_name_prefix\": "
     "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "\"}",
     "broker transport option 'queue_name_prefix' is longer than an SQS queue name (80)"},
    {"sqs://k:s@", "{\"sqs_base64_encoding\": 1}",
     "broker transport option 'sqs_base64_encoding' must be true or false"},
    {"sqs://k:s@", "{\"sqs-creation-attributes\": {\"MessageRetentionPeriod\": 86400}}",
     "broker transport option 'sqs-creation-attributes.MessageRetentionPeriod' must be a "
     "string"},
    {"sqs://k:s@", "{\"sqs-creation-attributes\": []}",
     "broker transport option 'sqs-creation-attributes' must be an object of strings"},
    {"sqs://k:s@", "{\"queue_tags\": {\"a\": null}}",
     "broker transport option 'queue_tags.a' must be a string"},
    {"sqs://k:s@", "{\"fetch_message_attributes\": \"All\"}",
     "broker transport option 'fetch_message_attributes' must be a list of strings"},
    {"sqs://k:s@", "{\"fetch_message_attributes\": [1]}",
     "broker transport option 'fetch_message_attributes' must be a string"},
    {"sqs://k:s@", "{\"deadletter_queue\": 1}",
     "broker transport option 'deadletter_queue' must be a string"},
    {"sqs://k:s@", "{\"body_encoding\": \"utf-8\"}",
     "broker transport option 'body_encoding' must be 'base64'"},
    {"sqs://k:s@", "{\"sts_role_arn\": \"arn:aws:iam::1:role/x\"}",
     "broker transport option 'sts_role_arn' is not supported (STS AssumeRole); pass the "
     "role's credentials in the environment"},
    {"sqs://k:s@", "{\"sts_token_timeout\": \"900\"}",
     "broker transport option 'sts_token_timeout' must be a number"},
    {"sqs://k:s@", "{\"client-config\": {\"connect_timeout\": 5}}",
     "broker transport option 'client-config' (botocore Config) is not supported"},
    {"sqs://k:s@", "{\"predefined_queues\": []}",
     "broker transport option 'predefined_queues' must be an object"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": \"http://h/1/q\"}}",
     "broker transport option 'predefined_queues.q' must be an object"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": {}}}",
     "broker transport option 'predefined_queues.q.url' is missing"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": {\"url\": 1}}}",
     "broker transport option 'predefined_queues.q.url' must be a string"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": {\"url\": \"ftp://h/1/q\"}}}",
     "broker transport option 'predefined_queues.q.url' must be an http:// or https:// "
     "URL"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\x01\"}}}",
     "broker transport options are not JSON: "},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q.fifo\": {\"url\": \"http://h/1/q\"}}}",
     "predefined queue 'q.fifo': a .fifo name needs a .fifo url and a standard name a "
     "standard url"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q.fifo\"}}}",
     "predefined queue 'q': a .fifo name needs a .fifo url and a standard name a "
     "standard "
     "url"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"llm.high\": {\"url\": \"http://h/1/q\"}}}",
     "predefined queue 'llm.high' is not an SQS queue name (letters, digits, '-' and "
     "'_', "
     "at most 80, optional .fifo): kombu looks queues up by that name"},
    {"sqs://k:s@", "{\"predefined_queues\": {\"\": {\"url\": \"http://h/1/q\"}}}",
     "predefined queue '' is not an SQS queue name (letters, digits, '-' and '_', at "
     "most "
     "80, optional .fifo): kombu looks queues up by that name"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\"}, "
     "\"q\": {\"url\": \"http://h/1/q\"}}}",
     "predefined queue 'q' is repeated"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"visibility_timeout\": 5}}}",
     "unknown broker transport option 'predefined_queues.q.visibility_timeout'"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"access_key_id\": null}}}",
     "broker transport option 'predefined_queues.q.access_key_id' must be a string"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"region\": \"EU\"}}}",
     "broker transport option 'predefined_queues.q.region' must be a region name (a-z, "
     "0-9, '-')"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"backoff_policy\": {\"x\": 1}}}}",
     "broker transport option 'predefined_queues.q.backoff_policy' has a key that is not "
     "a receive count (1, 2, ...)"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"backoff_policy\": {\"1\": 50000}}}}",
     "broker transport option 'predefined_queues.q.backoff_policy' is out of range "
     "(0..43200)"},
    {"sqs://k:s@",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"backoff_tasks\": \"t\"}}}",
     "broker transport option 'predefined_queues.q.backoff_tasks' must be a list of "
     "strings"},
    {"sqs://",
     "{\"predefined_queues\": {\"q\": {\"url\": \"http://h/1/q\", "
     "\"secret_access_key\": \"S\"}}}",
     "predefined queue 'q' has a secret_access_key without an access_key_id"},
};

START_TEST(test_bad)
{
    struct sqs_conf c;
    struct cr_err e = {0};
    const char *o = bad[_i].opts;
    sqs_conf_init(&c);
    ck_assert_int_eq(sqs_conf_parse(&c, bad[_i].url, o, o ? strlen(o) : 0, NULL, &e),
                     CR_EINVAL);
    ck_assert_int_eq(e.code, CR_EINVAL);
    if (strstr(bad[_i].msg, "not JSON"))
        ck_assert_msg(strncmp(e.msg, bad[_i].msg, strlen(bad[_i].msg)) == 0, "%s", e.msg);
    else
        ck_assert_str_eq(e.msg, bad[_i].msg);
    /* released on error: nothing left to free, and no secret quoted */
    ck_assert_int_eq(c.npredefined, 0);
    ck_assert_ptr_null(c.predefined);
    ck_assert_str_eq(c.creds.secret_access_key, "");
    ck_assert(strstr(e.msg, "cd@") == NULL);
    sqs_conf_release(&c);
}
END_TEST

START_TEST(test_env_refusals)
{
    const char *const partial[] = {"AWS_ACCESS_KEY_ID=k", NULL};
    const char *const partial2[] = {"AWS_SECRET_ACCESS_KEY=s", NULL};
    const char *const badreg[] = {"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s",
                                  "AWS_DEFAULT_REGION=eu west", NULL};
    const char *const badtok[] = {"AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=s",
                                  "AWS_SESSION_TOKEN=a\nb", NULL};
    struct sqs_conf c;
    struct cr_err e;
    sqs_conf_init(&c);
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, partial, &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "partial AWS credentials: AWS_ACCESS_KEY_ID is set but not "
                            "AWS_SECRET_ACCESS_KEY");
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, partial2, &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "partial AWS credentials: AWS_SECRET_ACCESS_KEY is set but "
                            "not AWS_ACCESS_KEY_ID");
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, badreg, &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "AWS_DEFAULT_REGION must be a region name (a-z, 0-9, '-')");
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", NULL, 0, badtok, &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "AWS_SESSION_TOKEN is too long or has a control or non-ASCII "
                            "byte");
    /* the URL's keys make a partial environment irrelevant */
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://a:b@", NULL, 0, partial, &e), 0);
    sqs_conf_release(&c);
}
END_TEST

/* ------------------------------------------------------------ logging */

START_TEST(test_redact)
{
    static const struct {
        const char *in, *out;
    } v[] = {
        {"sqs://AKID:secret@127.0.0.1:9324", "sqs://AKID:**@127.0.0.1:9324"},
        {"sqs://AKID:se%2Fcret@", "sqs://AKID:**@"},
        {"sqs://", "sqs://"},
        {"sqs://h:9324", "sqs://h:9324"},
        {"sqs://k:a@b@h", "sqs://k:**@h"},
        /* malformed: a raw '/' in the secret still never shows */
        {"sqs://k:ab/cd@h", "sqs://k:**@h"},
        {"sqs://k:ab?cd@h", "sqs://k:**@h"},
    };
    char out[128], small[12];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        sqs_url_redact(v[i].in, out, sizeof out);
        ck_assert_str_eq(out, v[i].out);
    }
    sqs_url_redact("sqs://AKID:secret@h", small, sizeof small);
    ck_assert_str_eq(small, "sqs://AKID:");
    sqs_url_redact("sqs://AKID:secret@h", out, 0);
}
END_TEST

/* ------------------------------------------------------------ malformed input */

/* Bounded: every prefix of a long URL and options text, and random bytes in
 * both, never crash and either parse or fail with CR_EINVAL. */
START_TEST(test_malformed)
{
    static const char url[] = "sqs://AK%2FID:se%2Bc:ret@[::1]:9324/vh";
    static const char opts[] =
        "{\"region\": \"eu-west-1\", \"is_secure\": false, \"predefined_queues\": "
        "{\"a.fifo\": {\"url\": \"http://h/1/a.fifo\", \"access_key_id\": \"k\", "
        "\"secret_access_key\": \"s\", \"backoff_policy\": {\"1\": 2}, "
        "\"backoff_tasks\": [\"t\"]}}, \"queue_tags\": {\"a\": \"b\"}}";
    struct sqs_conf c;
    struct cr_err e;
    char buf[sizeof opts];
    unsigned seed = 12345;

    sqs_conf_init(&c);
    for (size_t n = 0; n <= sizeof url - 1; n++) {
        char u[sizeof url];
        int rc;
        memcpy(u, url, n);
        u[n] = '\0';
        rc = sqs_conf_parse(&c, u, NULL, 0, env_keys, &e);
        ck_assert(rc == 0 || rc == CR_EINVAL);
    }
    for (size_t n = 0; n <= sizeof opts - 1; n++) {
        int rc = sqs_conf_parse(&c, "sqs://", opts, n, env_keys, &e);
        ck_assert(rc == 0 || rc == CR_EINVAL);
    }
    ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", opts, sizeof opts - 1, env_keys, &e),
                     0);
    for (int round = 0; round < 2000; round++) {
        int rc;
        memcpy(buf, opts, sizeof opts);
        for (int k = 0; k < 3; k++) {
            seed = seed * 1103515245u + 12345u;
            buf[(seed >> 8) % (sizeof opts - 1)] = (char)(seed >> 16);
        }
        rc = sqs_conf_parse(&c, "sqs://", buf, sizeof opts - 1, env_keys, &e);
        ck_assert(rc == 0 || rc == CR_EINVAL);
        memcpy(buf, url, sizeof url);
        seed = seed * 1103515245u + 12345u;
        buf[(seed >> 8) % (sizeof url - 1)] = (char)((seed >> 16) | 1);
        rc = sqs_conf_parse(&c, buf, NULL, 0, env_keys, &e);
        ck_assert(rc == 0 || rc == CR_EINVAL);
    }
    /* too long, and a deep nesting */
    {
        size_t big = SQS_OPTS_MAX_BYTES + 1;
        char *p = malloc(big);
        memset(p, ' ', big);
        ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", p, big, env_keys, &e), CR_EINVAL);
        memset(p, '[', 1000);
        ck_assert_int_eq(sqs_conf_parse(&c, "sqs://", p, 1000, env_keys, &e), CR_EINVAL);
        free(p);
    }
    ck_assert_int_eq(sqs_conf_parse(&c, NULL, NULL, 0, env_keys, &e), CR_EINVAL);
    sqs_conf_release(&c);
}
END_TEST

/* ------------------------------------------------------------ allocation failure */

static int oom_round(void)
{
    static const char opts[] =
        "{\"sqs-creation-attributes\": {\"A\": \"1\", \"B\": \"2\"}, "
        "\"queue_tags\": {\"t\": \"v\"}, \"fetch_message_attributes\": [\"All\", \"X\"], "
        "\"deadletter_queue\": \"dlq\", \"predefined_queues\": {"
        "\"a\": {\"url\": \"http://h/1/a\"}, "
        "\"b.fifo\": {\"url\": \"http://h/1/b.fifo\", \"access_key_id\": \"k\", "
        "\"secret_access_key\": \"s\", \"backoff_policy\": {\"1\": 2, \"2\": 4}, "
        "\"backoff_tasks\": [\"t1\", \"t2\"]}}}";
    const char *const env[] = {"AWS_ACCESS_KEY_ID=EK", "AWS_SECRET_ACCESS_KEY=ES",
                               "AWS_SESSION_TOKEN=TOKEN", NULL};
    struct sqs_conf c;
    struct cr_err e;
    int rc;

    sqs_conf_init(&c);
    rc = sqs_conf_parse(&c, "sqs://", opts, strlen(opts), env, &e);
    if (rc == 0) {
        const struct sqs_queue_def *q = sqs_conf_queue(&c, "b.fifo");
        ck_assert_int_eq(c.npredefined, 2);
        ck_assert_str_eq(c.creds.session_token, "TOKEN");
        ck_assert_str_eq(sqs_conf_queue(&c, "a")->creds.session_token, "TOKEN");
        ck_assert_int_eq(q->nbackoff, 2);
        ck_assert_str_eq(q->backoff_tasks[1], "t2");
        ck_assert_str_eq(c.tags[0].value, "v");
        ck_assert_str_eq(c.create_attrs[1].key, "B");
        ck_assert_str_eq(c.fetch_attrs[1], "X");
        ck_assert_str_eq(c.deadletter_queue, "dlq");
    } else {
        ck_assert_int_eq(e.code, CR_ENOMEM);
        ck_assert_int_eq(c.npredefined, 0);
    }
    sqs_conf_release(&c);
    return rc;
}

START_TEST(test_oom)
{
    ck_assert_int_eq(oom_round(), 0);
    for (long k = 1;; k++) {
        int rc, failed;
        cr_alloc_fail_after(k);
        rc = oom_round();
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        if (!failed) {
            ck_assert_int_eq(rc, 0);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_int_lt(k, 10000);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("sqs_url");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 30);
    tcase_add_loop_test(tc, test_good, 0, sizeof good / sizeof good[0]);
    tcase_add_test(tc, test_env_precedence);
    tcase_add_test(tc, test_region_precedence);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_options);
    tcase_add_test(tc, test_visibility_falsy);
    tcase_add_test(tc, test_predefined);
    tcase_add_test(tc, test_predefined_own_keys_only);
    tcase_add_loop_test(tc, test_bad, 0, sizeof bad / sizeof bad[0]);
    tcase_add_test(tc, test_env_refusals);
    tcase_add_test(tc, test_redact);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_oom);
    suite_add_tcase(s, tc);
    return s;
}
