/* sqs.h -- Amazon SQS as kombu's SQS transport uses it, on the wire: queue
 * names, the message body (kombu's envelope, base64), the JSON-protocol
 * request bodies (Content-Type application/x-amz-json-1.0, header
 * X-Amz-Target: AmazonSQS.<Action>, POST / with QueueUrl in every body), the
 * response parsers and the classification of errors. Pure: no I/O, no clock,
 * no globals.
 *
 * The facts (kombu 5.2.4 and 5.6.2, botocore's SQS model, a capture against
 * local-aws-sqs) are in the project's SQS broker reference. Everything read
 * from the network is bounded: a response over SQS_RESPONSE_MAX_BYTES is
 * refused before parsing, JSON nests at most PY_JSON_MAX_DEPTH deep, every
 * kept string has a length cap, and the work is linear in the input. */
#ifndef CR_SQS_H
#define CR_SQS_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"
#include "kombu.h"
#include "message.h"

#define SQS_QUEUE_NAME_MAX 80         /* SQS refuses longer names */
#define SQS_BATCH_MAX 10              /* entries per batch call, messages per receive */
#define SQS_BATCH_ID_MAX 80           /* a batch entry Id: [A-Za-z0-9_-]{1,80} */
#define SQS_WAIT_MAX_S 20             /* WaitTimeSeconds */
#define SQS_VISIBILITY_MAX_S 43200    /* VisibilityTimeout (12 h) */
#define SQS_DELAY_MAX_S 900           /* DelaySeconds */
#define SQS_MESSAGE_MAX_BYTES 1048576 /* MaximumMessageSize at most (1 MiB) */
#define SQS_RESPONSE_MAX_BYTES (32u << 20) /* any response longer is refused */
#define SQS_URL_MAX 2048                   /* a QueueUrl longer is refused */
#define SQS_RECEIPT_MAX 8192               /* a ReceiptHandle longer is refused */
#define SQS_CONTENT_TYPE "application/x-amz-json-1.0"
#define SQS_TARGET_PREFIX "AmazonSQS." /* X-Amz-Target: AmazonSQS.<action name> */

/* ------------------------------------------------------------ names */

/* The SQS queue of a Celery queue, as kombu's entity_name() makes it from
 * prefix + queue: '.' becomes '-', every other ASCII punctuation character but
 * '-' and '_' becomes '_', and a final ".fifo" is kept. Written NUL-terminated
 * into out. kombu checks nothing more; SQS then refuses what is not 1..80
 * characters of [A-Za-z0-9_-] (plus the ".fifo"), so that is refused here:
 * CR_EINVAL with one line in err (also when out_size is too small). prefix may
 * be NULL. */
int sqs_queue_name(const char *prefix, const char *queue, char *out, size_t out_size,
                   struct cr_err *err);

/* Whether name is a canonical SQS queue name, as sqs_queue_name() makes them:
 * 1..80 characters of [A-Za-z0-9_-], a final ".fifo" allowed (counted). */
int sqs_queue_name_ok(const char *name);

/* Whether an SQS queue name (or URL) names a FIFO queue (ends in ".fifo"). */
int sqs_is_fifo(const char *name);

/* The queue name of a queue URL: its last path segment (kombu's cache key).
 * Written NUL-terminated into out. Returns 0 or CR_EINVAL (no segment, or it
 * does not fit). */
int sqs_url_queue_name(const char *url, char *out, size_t out_size);

/* ------------------------------------------------------------ message body */

/* Decodes an SQS message Body (len bytes, no NUL needed) into m: kombu's
 * envelope, base64-encoded (what kombu sends by default) or as raw JSON (also
 * consumed by Python workers). The body is taken as base64 when it is strict
 * standard base64 (padded, the standard alphabet: a JSON text never is), then
 * it must be kombu's envelope (protocol/kombu.h), whose delivery tag may be
 * missing: the receipt handle is the tag on SQS. A Body longer than max_bytes
 * (0: SQS_MESSAGE_MAX_BYTES) is CR_ETOOBIG; the inner body is bounded by the same figure.
 * Returns 0, CR_EDECODE / CR_ETOOBIG with one line in err, or CR_ENOMEM; m is released on
 * error (kombu 5.6.2 would hand a non-envelope to Celery as a bare body, which Celery
 * rejects as an invalid message). */
int sqs_body_decode(struct kombu_msg *m, const char *body, size_t len, size_t max_bytes,
                    struct cr_err *err);

/* Appends the Body kombu sends for o (borrowed for the call):
 * kombu_msg_encode(o, delivery_tag) -- a fresh uuid4 per publish, the
 * caller's -- then base64 (raw != 0: the JSON envelope itself, as kombu with
 * sqs_base64_encoding False). o->exchange should be "" and o->routing_key the
 * Celery queue name (not the SQS one). Over max_bytes (0:
 * SQS_MESSAGE_MAX_BYTES) is CR_ETOOBIG; CR_ENOMEM; out is as it was on error. */
int sqs_body_encode(const struct outbound *o, const char *delivery_tag, int raw,
                    size_t max_bytes, struct buf *out);

/* ------------------------------------------------------------ requests */

enum sqs_action {
    SQS_GET_QUEUE_URL,
    SQS_CREATE_QUEUE,
    SQS_GET_QUEUE_ATTRIBUTES,
    SQS_PURGE_QUEUE,
    SQS_SEND_MESSAGE,
    SQS_RECEIVE_MESSAGE,
    SQS_DELETE_MESSAGE,
    SQS_DELETE_MESSAGE_BATCH,
    SQS_CHANGE_MESSAGE_VISIBILITY,
    SQS_CHANGE_MESSAGE_VISIBILITY_BATCH,
    SQS_NACTIONS
};

/* The action's name ("ReceiveMessage"): the X-Amz-Target header is
 * SQS_TARGET_PREFIX followed by it. "?" out of range. */
const char *sqs_action_name(enum sqs_action a);

/* Every sqs_req_*() appends one compact JSON body to out and returns 0,
 * CR_EINVAL (an argument out of SQS's range, one line in err; out is then
 * as it was) or CR_ENOMEM (out as it was). Strings are borrowed for the call
 * and escaped as JSON. */

int sqs_req_get_queue_url(struct buf *out, const char *queue_name, struct cr_err *err);

/* CreateQueue as kombu sends it: Attributes {"VisibilityTimeout": "<s>"}, then
 * "FifoQueue": "true" for a ".fifo" name, then the creation attributes (a JSON
 * object of strings, transport option sqs-creation-attributes, or NULL), a key
 * already there taking the new value in place, as Python's dict.update does;
 * tags (5.6 queue_tags: an object of strings, or NULL) go in "tags". SQS
 * refuses a CreateQueue whose attributes differ from the existing queue's, so
 * these must be byte-identical to what Python workers send. */
int sqs_req_create_queue(struct buf *out, const char *queue_name,
                         long visibility_timeout_s, const cJSON *creation_attrs,
                         const cJSON *tags, struct cr_err *err);

/* AttributeNames: names[0..n) (NULL, 0: ["All"]). */
int sqs_req_get_queue_attributes(struct buf *out, const char *queue_url,
                                 const char *const *names, int n, struct cr_err *err);

int sqs_req_purge_queue(struct buf *out, const char *queue_url, struct cr_err *err);

struct sqs_send {
    const char *queue_url;
    const char *body; /* valid SQS characters only (base64 always is) */
    size_t body_len;
    long delay_s;         /* 0..900, < 0 omits; refused on a FIFO queue */
    const char *group_id; /* FIFO: NULL reads "default" (kombu); ignored otherwise */
    const char *dedup_id; /* FIFO: kombu's is a fresh uuid4; NULL omits it (queues
                           * with content-based deduplication) */
    size_t max_bytes;     /* the queue's MaximumMessageSize; 0: SQS_MESSAGE_MAX_BYTES */
};

/* The DelaySeconds celeriac adds when it publishes a task whose headers
 * (borrowed for the call; NULL reads as none) carry an eta, at now_us (epoch
 * microseconds): the whole seconds until the eta, at most SQS_DELAY_MAX_S.
 * The fraction of a second is cut, not rounded up, as Celery cuts it for
 * RabbitMQ's delayed delivery (protocol/delayed.h): the message shows just
 * before its eta and the receiving worker holds the rest, so the task runs
 * on time rather than up to a second late (a 0.2 s retry back-off gets no
 * delay at all). -1, meaning "send no DelaySeconds", when there is no eta
 * (absent, null, not a string, not an ISO-8601 time) or it is less than a
 * second away. The caller leaves it out on FIFO queues, which refuse a
 * per-message delay. Python workers read the eta header alone, so the same
 * message serves a mixed fleet. */
long sqs_eta_delay_s(const cJSON *headers, int64_t now_us);

/* SendMessage. FIFO-ness is read from the URL's name. A body over max_bytes
 * is CR_ETOOBIG; a byte SQS refuses (NUL, other control characters, invalid
 * UTF-8, U+FFFE/U+FFFF) is CR_EINVAL. */
int sqs_req_send(struct buf *out, const struct sqs_send *s, struct cr_err *err);

struct sqs_receive {
    const char *queue_url;
    int max_messages;          /* 1..10 */
    int wait_time_s;           /* 0..20 */
    long visibility_timeout_s; /* 0..43200, < 0 omits (the queue's default) */
    const char *const *message_attribute_names; /* MessageAttributeNames, or NULL */
    int n_message_attribute_names;
};

/* ReceiveMessage. Asks for ApproximateReceiveCount through AttributeNames
 * (deprecated, still honoured by AWS, and the only form local-aws-sqs reads;
 * kombu 5.6.2 uses MessageSystemAttributeNames). */
int sqs_req_receive(struct buf *out, const struct sqs_receive *r, struct cr_err *err);

int sqs_req_delete(struct buf *out, const char *queue_url, const char *receipt_handle,
                   struct cr_err *err);
int sqs_req_change_visibility(struct buf *out, const char *queue_url,
                              const char *receipt_handle, long visibility_timeout_s,
                              struct cr_err *err);

/* One entry of a batch call. */
struct sqs_entry {
    const char *id;             /* [A-Za-z0-9_-]{1,80}, distinct in the call */
    const char *receipt_handle; /* not empty */
    long visibility_timeout_s;  /* ChangeMessageVisibilityBatch only: 0..43200 */
};

/* DeleteMessageBatch / ChangeMessageVisibilityBatch of e[0..n), 1 <= n <= 10. */
int sqs_req_delete_batch(struct buf *out, const char *queue_url,
                         const struct sqs_entry *e, int n, struct cr_err *err);
int sqs_req_change_visibility_batch(struct buf *out, const char *queue_url,
                                    const struct sqs_entry *e, int n, struct cr_err *err);

/* ------------------------------------------------------------ responses */

/* Every sqs_parse_*() reads an HTTP 200 body (len bytes, no NUL needed) and
 * returns 0, CR_EPROTO (not the response's shape, one line in err), CR_ETOOBIG
 * (over SQS_RESPONSE_MAX_BYTES) or CR_ENOMEM; nothing to free on error.
 * Unknown members are ignored. */

/* One received message. Strings are the message's own. */
struct sqs_message {
    char *message_id;
    char *receipt_handle; /* what it is settled by: delete, change visibility */
    char *md5_of_body;    /* "" when absent */
    char *body;           /* NUL-terminated; NULL when oversize */
    size_t body_len;      /* the Body's length, also when oversize */
    int oversize;         /* Body longer than the parser's max_body_bytes: kept
                           * so it can be settled, never decoded */
    long receive_count;   /* ApproximateReceiveCount; 0 when absent or unreadable */
};

struct sqs_messages {
    struct sqs_message v[SQS_BATCH_MAX];
    int n;
};

/* ReceiveMessage's answer: {"Messages": [...]}; {} and an empty (or blank)
 * body both mean none. More than SQS_BATCH_MAX messages, or a message without
 * a string MessageId, ReceiptHandle (<= SQS_RECEIPT_MAX) or Body, is
 * CR_EPROTO. A Body longer than max_body_bytes (0: SQS_MESSAGE_MAX_BYTES) is
 * kept oversize. On success release with sqs_messages_release(). */
int sqs_parse_receive(const char *resp, size_t len, size_t max_body_bytes,
                      struct sqs_messages *out, struct cr_err *err);
void sqs_messages_release(struct sqs_messages *ms);

/* GetQueueUrl's or CreateQueue's answer: *url gets a new copy of QueueUrl
 * (<= SQS_URL_MAX), the caller cr_free()s it. */
int sqs_parse_queue_url(const char *resp, size_t len, char **url, struct cr_err *err);

/* SendMessage's answer. */
struct sqs_sent {
    char message_id[128];
    char md5_of_body[40];      /* MD5OfMessageBody (hex), "" if absent */
    char sequence_number[128]; /* FIFO queues only, "" otherwise */
};
/* A missing MessageId, or a member longer than its field, is CR_EPROTO. */
int sqs_parse_send(const char *resp, size_t len, struct sqs_sent *out,
                   struct cr_err *err);

/* Whether data[0..len) is what SQS says it stored: 1 when md5 (a received
 * message's MD5OfBody, a send's MD5OfMessageBody: hex, either case) is its
 * MD5, 0 when it is not, -1 when md5 is NULL or "" (nothing to check). A
 * mismatch means the body was damaged on the way. */
int sqs_md5_matches(const char *data, size_t len, const char *md5);

/* GetQueueAttributes' answer, the attributes the worker reads; -1 when absent
 * (or not a decimal). */
struct sqs_queue_attrs {
    long messages;             /* ApproximateNumberOfMessages */
    long messages_not_visible; /* ApproximateNumberOfMessagesNotVisible */
    long messages_delayed;     /* ApproximateNumberOfMessagesDelayed */
    long visibility_timeout_s; /* VisibilityTimeout */
    long maximum_message_size; /* MaximumMessageSize */
    long delay_s;              /* DelaySeconds */
    int fifo;                  /* FifoQueue "true": 1, else 0 */
};
int sqs_parse_queue_attrs(const char *resp, size_t len, struct sqs_queue_attrs *out,
                          struct cr_err *err);

/* The error kinds, in the order a caller handles them. */
enum sqs_err_kind {
    SQS_ERR_NONE,          /* no error (2xx, or a batch entry that succeeded) */
    SQS_ERR_RETRY,         /* throttling, 5xx, timeouts, transport errors: back off
                            * with jitter and send again */
    SQS_ERR_OVER_LIMIT,    /* OverLimit: too many messages in flight; stop receiving,
                            * keep acking */
    SQS_ERR_QUEUE_MISSING, /* QueueDoesNotExist: resolve the URL again, or create once */
    SQS_ERR_QUEUE_EXISTS,  /* CreateQueue with other attributes than the queue's */
    SQS_ERR_RECEIPT,       /* ReceiptHandleIsInvalid / MessageNotInflight: the handle is
                            * stale; another worker may have the message */
    SQS_ERR_CREDENTIALS,   /* expired or unknown token, request expired (clock):
                            * refresh credentials, then retry */
    SQS_ERR_DENIED,        /* AccessDenied, SignatureDoesNotMatch: fatal for the call,
                            * fix the configuration */
    SQS_ERR_BAD_REQUEST,   /* any other refusal: fatal for the call */
    SQS_ERR_NKINDS
};

/* "RETRY", ... for logs and tests; "?" out of range. */
const char *sqs_err_kind_name(enum sqs_err_kind k);
/* What the caller should do, one lowercase line; "?" out of range. */
const char *sqs_err_kind_reason(enum sqs_err_kind k);

/* The kind of an error code (with or without its "namespace#" prefix, query
 * forms such as "AWS.SimpleQueueService.NonExistentQueue" too) given with an
 * HTTP status (0: a transport error, or unknown). An unknown code goes by the
 * status: 5xx, 408, 429 and 509 (and 0) retry, 403 is DENIED, 2xx NONE, any
 * other BAD_REQUEST. code may be NULL or "". */
enum sqs_err_kind sqs_classify(const char *code, int status);

/* A failed call, read from its answer. */
struct sqs_error {
    enum sqs_err_kind kind;
    int status;
    int sender_fault;    /* query <Type>Sender</Type> or the header's ";Sender" */
    char code[96];       /* "QueueDoesNotExist" (prefix dropped), "" if none */
    char query_code[96]; /* the x-amzn-query-error code, "" if none */
    char message[256];   /* the service's message, truncated, "" if none */
};

/* Reads an error answer: the HTTP status, the x-amzn-query-error header's
 * value (NULL when absent: "Code;Sender"), and the body (JSON {"__type",
 * "message"/"Message"}, or the query protocol's XML <ErrorResponse>; anything
 * else is read by the status alone). The body's code decides, else the
 * header's, else the status. Malformed input is not an error: the worst
 * gives the status's kind. Returns 0, or CR_ENOMEM (e then holds what the
 * header and the status say). */
int sqs_error_parse(int status, const char *query_error_header, const char *body,
                    size_t len, struct sqs_error *e);

/* One entry of a batch answer. */
struct sqs_batch_entry {
    char id[SQS_BATCH_ID_MAX + 1];
    enum sqs_err_kind kind; /* SQS_ERR_NONE for Successful; else sqs_classify(Code,
                             * SenderFault ? 400 : 500) */
    int sender_fault;
    char code[96];
    char message[128];
};

struct sqs_batch_result {
    struct sqs_batch_entry v[2 * SQS_BATCH_MAX];
    int n; /* Successful first, then Failed */
    int n_failed;
};

/* DeleteMessageBatch's or ChangeMessageVisibilityBatch's answer: "Successful"
 * [{Id}] and "Failed" [{Id, SenderFault, Code, Message}]. More than
 * SQS_BATCH_MAX of either, or an entry without a string Id of at most
 * SQS_BATCH_ID_MAX, is CR_EPROTO. No allocation is kept. */
int sqs_parse_batch(const char *resp, size_t len, struct sqs_batch_result *out,
                    struct cr_err *err);

#endif
