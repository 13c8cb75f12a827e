/* sqs_url.h -- Amazon SQS as Celery's broker: the broker URL, the
 * broker_transport_options and the AWS environment, resolved the way kombu's SQS
 * transport and botocore resolve them (kombu 5.2.4 and 5.6.2; the facts are in
 * the SQS broker reference, section 1). Pure: no I/O, no clock, no curl, no
 * loop; the environment is passed in, never read.
 *
 * What is resolved:
 * - endpoint: a host in the URL gives "http://host[:port]", or "https://..."
 *   when is_secure is true (kombu: an unset is_secure means plain http for a
 *   given host); no host gives "https://sqs.<region>.amazonaws.com";
 * - region: the 'region' option, else AWS_DEFAULT_REGION, else AWS_REGION,
 *   else us-east-1 (botocore never reads AWS_REGION: read after its own
 *   variable, so that a mixed fleet agrees wherever both are set);
 * - credentials: the URL's key and secret (percent-decoded; never a session
 *   token), else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY with AWS_SESSION_TOKEN
 *   (or the older AWS_SECURITY_TOKEN). botocore's other sources (shared
 *   files, web identity, container and instance credentials) are not
 *   supported: with none of the above, parsing fails and says so, unless
 *   every predefined queue has keys of its own. */
#ifndef CR_SQS_URL_H
#define CR_SQS_URL_H

#include <stddef.h>

#include "protocol/sqs.h" /* SQS_VISIBILITY_MAX_S, SQS_WAIT_MAX_S */
#include "util/err.h"

#define SQS_REGION_MAX 64    /* with the NUL */
#define SQS_ENDPOINT_MAX 320 /* with the NUL */
#define SQS_KEY_ID_MAX 129   /* 128 bytes, AWS's limit for an access key id */
#define SQS_SECRET_MAX 257   /* 256 bytes */
#define SQS_TOKEN_MAX_BYTES 8192
#define SQS_PREFIX_MAX 81 /* a queue name is at most 80 bytes */
#define SQS_OPTS_MAX_BYTES 65536
#define SQS_LIST_MAX 64 /* entries in any one option list or map */

enum sqs_creds_source {
    SQS_CREDS_URL,   /* user and password of the broker URL */
    SQS_CREDS_ENV,   /* AWS_ACCESS_KEY_ID and friends */
    SQS_CREDS_QUEUE, /* a predefined queue's access_key_id / secret_access_key */
};

struct sqs_creds {
    enum sqs_creds_source source;
    char access_key_id[SQS_KEY_ID_MAX];
    char secret_access_key[SQS_SECRET_MAX];
    char *session_token; /* owned by the conf; NULL when there is none */
};

/* One name -> value entry of a string map option, both owned by the conf. */
struct sqs_pair {
    char *key;
    char *value;
};

/* backoff_policy: the visibility set on reject at this ApproximateReceiveCount. */
struct sqs_backoff {
    int receive_count;
    int visibility_s;
};

/* One entry of predefined_queues. Every field is owned by the conf. */
struct sqs_queue_def {
    char *name; /* the key: a canonical SQS name ("dev-llm-high", "jobs.fifo") */
    char *url;  /* "url", as given (http:// or https://) */
    int fifo;   /* name and url end in ".fifo" */
    char region[SQS_REGION_MAX];     /* "region", else the conf's */
    char endpoint[SQS_ENDPOINT_MAX]; /* the conf's host endpoint, else the region's */
    struct sqs_creds creds;          /* its own keys, else the conf's */
    struct sqs_backoff *backoff;     /* backoff_policy, in the order given */
    int nbackoff;
    char **backoff_tasks; /* backoff_tasks: task names */
    int nbackoff_tasks;
};

/* The resolved configuration. Read-only after sqs_conf_parse(). */
struct sqs_conf {
    char endpoint[SQS_ENDPOINT_MAX]; /* scheme://host[:port], no trailing '/' */
    char region[SQS_REGION_MAX];
    struct sqs_creds creds;        /* empty when has_creds is 0 */
    int has_creds;                 /* 0 only when every predefined queue has its own */
    int has_host;                  /* the URL named a host */
    int is_secure;                 /* -1: not given (None), 0, 1 */
    int wait_time_s;               /* wait_time_seconds: 10, 0..20 */
    int visibility_timeout_s;      /* visibility_timeout: 1800, 1..43200 */
    double polling_interval_s;     /* polling_interval: 1 */
    char prefix[SQS_PREFIX_MAX];   /* queue_name_prefix: "" */
    int base64;                    /* sqs_base64_encoding: 1 */
    char *deadletter_queue;        /* deadletter_queue: NULL */
    struct sqs_pair *create_attrs; /* sqs-creation-attributes */
    int ncreate_attrs;
    struct sqs_pair *tags; /* queue_tags */
    int ntags;
    char **fetch_attrs; /* fetch_message_attributes; NULL when not given */
    int nfetch_attrs;
    struct sqs_queue_def *predefined; /* predefined_queues, in the order given */
    int npredefined;
};

/* Sets kombu's defaults; allocates nothing. Call before sqs_conf_parse(). */
void sqs_conf_init(struct sqs_conf *c);
/* Frees what the conf owns, wipes the secrets, and leaves it as after init. */
void sqs_conf_release(struct sqs_conf *c);

/* Parses url ("sqs://", "sqs://KEY:SECRET@", "sqs://KEY:SECRET@host:port";
 * a path is ignored, as kombu ignores it) and options (a JSON object of
 * len bytes, no NUL needed; NULL or len 0 for none) with envp (environ's
 * "NAME=value" form, NULL-terminated, borrowed for the call; NULL is an empty
 * environment, never the process's: pass (const char *const *)environ; the
 * first entry of a name wins, as getenv()). On success the conf holds the
 * result. Returns 0; CR_ENOMEM; or CR_EINVAL with one line in err naming the
 * URL part, the option (its JSON path, e.g. "predefined_queues.q.url") or
 * the environment variable at fault: a malformed URL, an unknown option, one
 * celeriac does not support (sts_role_arn, client-config), a value of the
 * wrong type or out of range, partial or missing credentials. No secret is
 * ever quoted in err. On error the conf is released (as after init). */
int sqs_conf_parse(struct sqs_conf *c, const char *url, const char *options, size_t len,
                   const char *const *envp, struct cr_err *err);

/* The predefined queue named name (a canonical SQS name), or NULL.
 * Borrowed until sqs_conf_release(). */
const struct sqs_queue_def *sqs_conf_queue(const struct sqs_conf *c, const char *name);

/* Writes url into out (size bytes, truncated, always NUL-terminated when size
 * > 0) with its secret replaced by "**": "sqs://AKID:**@host:9324". Anything
 * between the first ':' after "scheme://" and the last '@' is cut, so a
 * malformed URL leaks no part of a secret either. */
void sqs_url_redact(const char *url, char *out, size_t size);

/* One line for the log: endpoint, region and where the credentials came
 * from, e.g. "endpoint=http://127.0.0.1:9324 region=us-east-1 creds=url
 * key=AKID token=no". Never a secret or a token. */
void sqs_conf_describe(const struct sqs_conf *c, char *out, size_t size);

#endif
