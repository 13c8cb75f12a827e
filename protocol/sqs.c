/* sqs.c -- Amazon SQS as kombu's SQS transport uses it: names, bodies, JSON
 * requests and responses, error kinds (no I/O). */
#include "sqs.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "../util/alloc.h"
#include "../util/base64.h"
#include "../util/md5.h"
#include "isotime.h"
#include "pyjson.h"

/* ------------------------------------------------------------ names tables */

static const char *const action_names[SQS_NACTIONS] = {"GetQueueUrl",
                                                       "CreateQueue",
                                                       "GetQueueAttributes",
                                                       "PurgeQueue",
                                                       "SendMessage",
                                                       "ReceiveMessage",
                                                       "DeleteMessage",
                                                       "DeleteMessageBatch",
                                                       "ChangeMessageVisibility",
                                                       "ChangeMessageVisibilityBatch"};

static const char *const kind_names[SQS_ERR_NKINDS] = {
    "NONE",    "RETRY",       "OVER_LIMIT", "QUEUE_MISSING", "QUEUE_EXISTS",
    "RECEIPT", "CREDENTIALS", "DENIED",     "BAD_REQUEST"};

static const char *const kind_reasons[SQS_ERR_NKINDS] = {
    "no error",
    "throttled or unavailable: back off and retry",
    "too many messages in flight: stop receiving, keep acking",
    "queue does not exist: resolve or create it again",
    "queue exists with other attributes",
    "receipt handle is stale: the message may be with another consumer",
    "credentials expired or unknown (or the clock is off): refresh and retry",
    "access denied or bad signature: fix the configuration",
    "request refused"};

#define NAME(table, n, v) ((unsigned)(v) < (n) ? (table)[v] : "?")

const char *sqs_action_name(enum sqs_action a)
{
    return NAME(action_names, SQS_NACTIONS, a);
}

const char *sqs_err_kind_name(enum sqs_err_kind k)
{
    return NAME(kind_names, SQS_ERR_NKINDS, k);
}

const char *sqs_err_kind_reason(enum sqs_err_kind k)
{
    return NAME(kind_reasons, SQS_ERR_NKINDS, k);
}

/* ------------------------------------------------------------ names */

/* Python's string.punctuation. */
static const char punctuation[] = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
static const char fifo_suffix[] = ".fifo";
#define FIFO_LEN (sizeof fifo_suffix - 1)

static int ends_with_fifo(const char *s, size_t n)
{
    return n >= FIFO_LEN && memcmp(s + n - FIFO_LEN, fifo_suffix, FIFO_LEN) == 0;
}

int sqs_is_fifo(const char *name)
{
    return name && ends_with_fifo(name, strlen(name));
}

static int name_char_ok(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

int sqs_queue_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0, stem, i;
    if (n == 0 || n > SQS_QUEUE_NAME_MAX)
        return 0;
    stem = ends_with_fifo(name, n) ? n - FIFO_LEN : n;
    for (i = 0; i < stem; i++)
        if (!name_char_ok((unsigned char)name[i]))
            return 0;
    return stem > 0;
}

int sqs_queue_name(const char *prefix, const char *queue, char *out, size_t out_size,
                   struct cr_err *err)
{
    size_t pl = prefix ? strlen(prefix) : 0, ql = queue ? strlen(queue) : 0;
    size_t n = pl + ql, stem, i;

    if (n == 0)
        return cr_err_set(err, CR_EINVAL, "queue name is empty");
    if (n > SQS_QUEUE_NAME_MAX)
        return cr_err_set(err, CR_EINVAL, "sqs queue name '%s%s' is longer than %d",
                          prefix ? prefix : "", queue ? queue : "", SQS_QUEUE_NAME_MAX);
    if (n >= out_size)
        return cr_err_set(err, CR_EINVAL, "sqs queue name does not fit");
    if (pl)
        memcpy(out, prefix, pl);
    if (ql)
        memcpy(out + pl, queue, ql);
    out[n] = '\0';
    /* kombu keeps a final ".fifo" and translates what comes before it. */
    stem = ends_with_fifo(out, n) ? n - FIFO_LEN : n;
    for (i = 0; i < stem; i++) {
        if (out[i] == '.')
            out[i] = '-';
        else if (out[i] != '-' && out[i] != '_' && strchr(punctuation, out[i]))
            out[i] = '_';
    }
    /* kombu stops here; SQS would refuse the rest. */
    if (!sqs_queue_name_ok(out)) {
        out[0] = '\0';
        return cr_err_set(err, CR_EINVAL,
                          "sqs queue name for '%s%s' is not [A-Za-z0-9_-] with an "
                          "optional .fifo",
                          prefix ? prefix : "", queue ? queue : "");
    }
    return 0;
}

int sqs_url_queue_name(const char *url, char *out, size_t out_size)
{
    const char *slash = url ? strrchr(url, '/') : NULL;
    const char *seg = slash ? slash + 1 : url;
    size_t n = seg ? strlen(seg) : 0;
    if (n == 0 || n >= out_size)
        return CR_EINVAL;
    memcpy(out, seg, n + 1);
    return 0;
}

/* ------------------------------------------------------------ message body */

int sqs_body_decode(struct kombu_msg *m, const char *body, size_t len, size_t max_bytes,
                    struct cr_err *err)
{
    unsigned char *tmp = NULL;
    const char *env = body;
    size_t env_len = len;
    int rc;

    memset(m, 0, sizeof *m);
    if (!max_bytes)
        max_bytes = SQS_MESSAGE_MAX_BYTES;
    if (len > max_bytes)
        return cr_err_set(err, CR_ETOOBIG, "sqs message body is %zu bytes, over %zu", len,
                          max_bytes);
    /* Base64 when it is strict standard base64 (padded, no stray byte), as
     * 5.6.2's regex and validate=True want; 5.2.4's re-encoding test also
     * refuses non-zero leftover bits, which no producer writes and which
     * could never be read as raw JSON, so they are accepted. Anything else, a
     * JSON envelope first of all, is read as it is. */
    if (len && len % 4 == 0) {
        long got;
        tmp = cr_malloc(len / 4 * 3 + 2);
        if (!tmp)
            return CR_ENOMEM;
        got = base64_decode(body, len, tmp, BASE64_STRICT);
        if (got >= 0) {
            env = (const char *)tmp;
            env_len = (size_t)got;
        }
    }
    rc = kombu_msg_decode_flags(m, env, env_len, max_bytes, KOMBU_DECODE_ANY_TAG, err);
    cr_free(tmp);
    return rc;
}

int sqs_body_encode(const struct outbound *o, const char *delivery_tag, int raw,
                    size_t max_bytes, struct buf *out)
{
    struct buf env;
    size_t start = out->len;
    int rc;

    if (!max_bytes)
        max_bytes = SQS_MESSAGE_MAX_BYTES;
    if (raw) {
        rc = kombu_msg_encode(o, delivery_tag, out);
        if (rc == 0 && out->len - start > max_bytes)
            rc = CR_ETOOBIG;
    } else {
        buf_init(&env);
        rc = kombu_msg_encode(o, delivery_tag, &env);
        if (rc == 0 && (env.len + 2) / 3 * 4 > max_bytes)
            rc = CR_ETOOBIG;
        if (rc == 0)
            rc = base64_encode(env.data, env.len, out);
        buf_release(&env);
    }
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

/* ------------------------------------------------------------ requests */

/* A compact JSON object under construction: the first error sticks. */
struct jw {
    struct buf *b;
    size_t start;
    int rc;
    int n; /* members written at this level */
};

static void jw_open(struct jw *w, struct buf *b)
{
    w->b = b;
    w->start = b->len;
    w->rc = buf_putc(b, '{');
    w->n = 0;
}

static void jw_key(struct jw *w, const char *key)
{
    if (w->rc == 0 && w->n++)
        w->rc = buf_putc(w->b, ',');
    if (w->rc == 0)
        w->rc = py_json_string(w->b, key);
    if (w->rc == 0)
        w->rc = buf_putc(w->b, ':');
}

static void jw_str(struct jw *w, const char *key, const char *val)
{
    jw_key(w, key);
    if (w->rc == 0)
        w->rc = py_json_string(w->b, val ? val : "");
}

static void jw_long(struct jw *w, const char *key, long v)
{
    jw_key(w, key);
    if (w->rc == 0)
        w->rc = buf_printf(w->b, "%ld", v);
}

static void jw_raw(struct jw *w, const char *s)
{
    if (w->rc == 0)
        w->rc = buf_puts(w->b, s);
}

static void jw_str_array(struct jw *w, const char *key, const char *const *v, int n)
{
    jw_key(w, key);
    jw_raw(w, "[");
    for (int i = 0; i < n && w->rc == 0; i++) {
        if (i)
            jw_raw(w, ",");
        if (w->rc == 0)
            w->rc = py_json_string(w->b, v[i] ? v[i] : "");
    }
    jw_raw(w, "]");
}

/* Closes the object; on error puts the buffer back as it was. */
static int jw_close(struct jw *w)
{
    if (w->rc == 0)
        w->rc = buf_putc(w->b, '}');
    if (w->rc < 0) {
        w->b->len = w->start;
        if (w->b->data)
            w->b->data[w->start] = '\0';
    }
    return w->rc;
}

static int need_str(const char *what, const char *s, size_t max, struct cr_err *err)
{
    if (!s || !*s)
        return cr_err_set(err, CR_EINVAL, "sqs %s is empty", what);
    if (strlen(s) > max)
        return cr_err_set(err, CR_EINVAL, "sqs %s is longer than %zu", what, max);
    return 0;
}

static int need_range(const char *what, long v, long lo, long hi, struct cr_err *err)
{
    if (v < lo || v > hi)
        return cr_err_set(err, CR_EINVAL, "sqs %s %ld is out of %ld..%ld", what, v, lo,
                          hi);
    return 0;
}

int sqs_req_get_queue_url(struct buf *out, const char *queue_name, struct cr_err *err)
{
    struct jw w;
    int rc = need_str("queue name", queue_name, SQS_QUEUE_NAME_MAX, err);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueName", queue_name);
    return jw_close(&w);
}

/* The last member named key (json.loads keeps the last duplicate). */
static const cJSON *get_last(const cJSON *o, const char *key)
{
    const cJSON *it, *v = NULL;
    for (it = o->child; it; it = it->next)
        if (it->string && strcmp(it->string, key) == 0)
            v = it;
    return v;
}

/* An object of strings only (what botocore accepts for Attributes and tags). */
static int strings_object(const char *what, const cJSON *o, struct cr_err *err)
{
    const cJSON *it;
    if (!o)
        return 0;
    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL, "sqs %s is not an object", what);
    cJSON_ArrayForEach(it, o)
    {
        if (!cJSON_IsString(it) || !it->string)
            return cr_err_set(err, CR_EINVAL, "sqs %s '%s' is not a string", what,
                              it->string ? it->string : "");
    }
    return 0;
}

/* Whether it is the last member with its name (json.loads keeps the last of
 * duplicate keys). */
static int last_of_name(const cJSON *it)
{
    for (const cJSON *later = it->next; later; later = later->next)
        if (strcmp(later->string, it->string) == 0)
            return 0;
    return 1;
}

/* The value dict.update(extra) leaves for key: extra's, else base. */
static const char *updated(const cJSON *extra, const char *key, const char *base)
{
    const cJSON *v = extra ? get_last(extra, key) : NULL;
    return v ? v->valuestring : base;
}

/* Appends the members of o (strings, checked) that are the last of their
 * name and not in skip[0..nskip). */
static void put_members(struct jw *w, const cJSON *o, const char *const *skip, int nskip)
{
    const cJSON *it;
    if (!o)
        return;
    for (it = o->child; it; it = it->next) {
        int i;
        for (i = 0; i < nskip; i++)
            if (strcmp(it->string, skip[i]) == 0)
                break;
        if (i == nskip && last_of_name(it))
            jw_str(w, it->string, it->valuestring);
    }
}

/* Opens a nested object as the value of key in w. */
static void jw_nest(struct jw *w, const char *key, struct jw *inner)
{
    jw_key(w, key);
    inner->b = w->b;
    inner->start = w->b->len;
    inner->rc = w->rc;
    inner->n = 0;
    jw_raw(inner, "{");
}

/* Closes a nested object and hands its result to the outer one. */
static void jw_unnest(struct jw *w, struct jw *inner)
{
    jw_raw(inner, "}");
    w->rc = inner->rc;
}

int sqs_req_create_queue(struct buf *out, const char *queue_name,
                         long visibility_timeout_s, const cJSON *creation_attrs,
                         const cJSON *tags, struct cr_err *err)
{
    static const char *const base_keys[] = {"VisibilityTimeout", "FifoQueue"};
    struct jw w, a;
    char vt[32];
    int fifo = sqs_is_fifo(queue_name);
    int rc = need_str("queue name", queue_name, SQS_QUEUE_NAME_MAX, err);
    if (rc == 0)
        rc = need_range("visibility timeout", visibility_timeout_s, 0,
                        SQS_VISIBILITY_MAX_S, err);
    if (rc == 0)
        rc = strings_object("creation attribute", creation_attrs, err);
    if (rc == 0)
        rc = strings_object("queue tag", tags, err);
    if (rc < 0)
        return rc;
    snprintf(vt, sizeof vt, "%ld", visibility_timeout_s);

    jw_open(&w, out);
    jw_str(&w, "QueueName", queue_name);
    /* kombu's dict: VisibilityTimeout, FifoQueue, then the creation
     * attributes (update() replaces in place and appends the rest). */
    jw_nest(&w, "Attributes", &a);
    jw_str(&a, "VisibilityTimeout", updated(creation_attrs, "VisibilityTimeout", vt));
    if (fifo)
        jw_str(&a, "FifoQueue", updated(creation_attrs, "FifoQueue", "true"));
    put_members(&a, creation_attrs, base_keys, fifo ? 2 : 1);
    jw_unnest(&w, &a);
    if (tags && tags->child) {
        struct jw t;
        jw_nest(&w, "tags", &t);
        put_members(&t, tags, NULL, 0);
        jw_unnest(&w, &t);
    }
    return jw_close(&w);
}

int sqs_req_get_queue_attributes(struct buf *out, const char *queue_url,
                                 const char *const *names, int n, struct cr_err *err)
{
    static const char *const all[] = {"All"};
    struct jw w;
    int rc = need_str("queue url", queue_url, SQS_URL_MAX, err);
    if (rc == 0 && (n < 0 || n > 64 || (n > 0 && !names)))
        rc = cr_err_set(err, CR_EINVAL, "sqs attribute names: %d", n);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", queue_url);
    if (n == 0)
        jw_str_array(&w, "AttributeNames", all, 1);
    else
        jw_str_array(&w, "AttributeNames", names, n);
    return jw_close(&w);
}

int sqs_req_purge_queue(struct buf *out, const char *queue_url, struct cr_err *err)
{
    struct jw w;
    int rc = need_str("queue url", queue_url, SQS_URL_MAX, err);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", queue_url);
    return jw_close(&w);
}

/* Whether a body holds only the characters SQS accepts: #x9 #xA #xD
 * #x20-#xD7FF #xE000-#xFFFD #x10000-#x10FFFF, in valid UTF-8. */
static int body_chars_ok(const char *s, size_t n, size_t *bad_at)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = py_utf8_next(s + i, n - i, &cp);
        if (k == 0 ||
            !(cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
              (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000)) {
            *bad_at = i;
            return 0;
        }
        i += k;
    }
    return 1;
}

/* Appends s[0..n) (checked by body_chars_ok) as a JSON string: quote,
 * backslash and the three allowed control characters escaped, UTF-8 as is. */
static int json_body_string(struct buf *out, const char *s, size_t n)
{
    size_t i, run = 0;
    int rc = buf_reserve(out, n + 2);
    if (rc == 0)
        rc = buf_putc(out, '"');
    for (i = 0; i < n && rc == 0; i++) {
        const char *esc = NULL;
        switch (s[i]) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        default:
            continue;
        }
        rc = buf_append(out, s + run, i - run);
        if (rc == 0)
            rc = buf_puts(out, esc);
        run = i + 1;
    }
    if (rc == 0)
        rc = buf_append(out, s + run, n - run);
    if (rc == 0)
        rc = buf_putc(out, '"');
    return rc;
}

long sqs_eta_delay_s(const cJSON *headers, int64_t now_us)
{
    const cJSON *eta = cJSON_GetObjectItemCaseSensitive(headers, "eta");
    int64_t eta_us, left_us;

    if (!cJSON_IsString(eta) || !eta->valuestring ||
        iso8601_parse(eta->valuestring, &eta_us))
        return -1;
    if (eta_us - now_us < 1000000)
        return -1;
    left_us = eta_us - now_us;
    if (left_us > (int64_t)SQS_DELAY_MAX_S * 1000000)
        return SQS_DELAY_MAX_S;
    return (long)(left_us / 1000000);
}

int sqs_req_send(struct buf *out, const struct sqs_send *s, struct cr_err *err)
{
    struct jw w;
    size_t max = s->max_bytes ? s->max_bytes : SQS_MESSAGE_MAX_BYTES, bad;
    int fifo = sqs_is_fifo(s->queue_url);
    int rc = need_str("queue url", s->queue_url, SQS_URL_MAX, err);
    if (rc < 0)
        return rc;
    if (!s->body || s->body_len == 0)
        return cr_err_set(err, CR_EINVAL, "sqs message body is empty");
    if (s->body_len > max)
        return cr_err_set(err, CR_ETOOBIG, "sqs message body is %zu bytes, over %zu",
                          s->body_len, max);
    if (!body_chars_ok(s->body, s->body_len, &bad))
        return cr_err_set(err, CR_EINVAL,
                          "sqs message body has a character sqs refuses at byte %zu",
                          bad);
    if (s->delay_s >= 0 && fifo)
        return cr_err_set(err, CR_EINVAL,
                          "sqs DelaySeconds is per queue on a fifo queue");
    if (s->delay_s >= 0) {
        rc = need_range("delay", s->delay_s, 0, SQS_DELAY_MAX_S, err);
        if (rc < 0)
            return rc;
    }
    if (fifo && s->group_id && (rc = need_str("group id", s->group_id, 128, err)) < 0)
        return rc;
    if (fifo && s->dedup_id &&
        (rc = need_str("deduplication id", s->dedup_id, 128, err)) < 0)
        return rc;

    jw_open(&w, out);
    jw_str(&w, "QueueUrl", s->queue_url);
    jw_key(&w, "MessageBody");
    if (w.rc == 0)
        w.rc = json_body_string(out, s->body, s->body_len);
    if (s->delay_s >= 0)
        jw_long(&w, "DelaySeconds", s->delay_s);
    if (fifo) {
        jw_str(&w, "MessageGroupId", s->group_id ? s->group_id : "default");
        if (s->dedup_id)
            jw_str(&w, "MessageDeduplicationId", s->dedup_id);
    }
    return jw_close(&w);
}

int sqs_req_receive(struct buf *out, const struct sqs_receive *r, struct cr_err *err)
{
    static const char *const attrs[] = {"ApproximateReceiveCount"};
    struct jw w;
    int rc = need_str("queue url", r->queue_url, SQS_URL_MAX, err);
    if (rc == 0)
        rc = need_range("MaxNumberOfMessages", r->max_messages, 1, SQS_BATCH_MAX, err);
    if (rc == 0)
        rc = need_range("WaitTimeSeconds", r->wait_time_s, 0, SQS_WAIT_MAX_S, err);
    if (rc == 0 && r->visibility_timeout_s >= 0)
        rc = need_range("VisibilityTimeout", r->visibility_timeout_s, 0,
                        SQS_VISIBILITY_MAX_S, err);
    if (rc == 0 &&
        (r->n_message_attribute_names < 0 || r->n_message_attribute_names > 64 ||
         (r->n_message_attribute_names > 0 && !r->message_attribute_names)))
        rc = cr_err_set(err, CR_EINVAL, "sqs message attribute names: %d",
                        r->n_message_attribute_names);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", r->queue_url);
    jw_long(&w, "MaxNumberOfMessages", r->max_messages);
    jw_long(&w, "WaitTimeSeconds", r->wait_time_s);
    if (r->visibility_timeout_s >= 0)
        jw_long(&w, "VisibilityTimeout", r->visibility_timeout_s);
    jw_str_array(&w, "AttributeNames", attrs, 1);
    if (r->n_message_attribute_names > 0)
        jw_str_array(&w, "MessageAttributeNames", r->message_attribute_names,
                     r->n_message_attribute_names);
    return jw_close(&w);
}

int sqs_req_delete(struct buf *out, const char *queue_url, const char *receipt_handle,
                   struct cr_err *err)
{
    struct jw w;
    int rc = need_str("queue url", queue_url, SQS_URL_MAX, err);
    if (rc == 0)
        rc = need_str("receipt handle", receipt_handle, SQS_RECEIPT_MAX, err);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", queue_url);
    jw_str(&w, "ReceiptHandle", receipt_handle);
    return jw_close(&w);
}

int sqs_req_change_visibility(struct buf *out, const char *queue_url,
                              const char *receipt_handle, long visibility_timeout_s,
                              struct cr_err *err)
{
    struct jw w;
    int rc = need_str("queue url", queue_url, SQS_URL_MAX, err);
    if (rc == 0)
        rc = need_str("receipt handle", receipt_handle, SQS_RECEIPT_MAX, err);
    if (rc == 0)
        rc = need_range("VisibilityTimeout", visibility_timeout_s, 0,
                        SQS_VISIBILITY_MAX_S, err);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", queue_url);
    jw_str(&w, "ReceiptHandle", receipt_handle);
    jw_long(&w, "VisibilityTimeout", visibility_timeout_s);
    return jw_close(&w);
}

static int entries_ok(const struct sqs_entry *e, int n, int with_vt, struct cr_err *err)
{
    int i, j, rc;
    if (n < 1 || n > SQS_BATCH_MAX || !e)
        return cr_err_set(err, CR_EINVAL, "sqs batch of %d entries (1..%d)", n,
                          SQS_BATCH_MAX);
    for (i = 0; i < n; i++) {
        const char *p;
        rc = need_str("batch entry id", e[i].id, SQS_BATCH_ID_MAX, err);
        if (rc < 0)
            return rc;
        for (p = e[i].id; *p; p++)
            if (!name_char_ok((unsigned char)*p))
                return cr_err_set(err, CR_EINVAL,
                                  "sqs batch entry id '%s' is not "
                                  "[A-Za-z0-9_-]",
                                  e[i].id);
        for (j = 0; j < i; j++)
            if (strcmp(e[i].id, e[j].id) == 0)
                return cr_err_set(err, CR_EINVAL, "sqs batch entry id '%s' twice",
                                  e[i].id);
        rc = need_str("receipt handle", e[i].receipt_handle, SQS_RECEIPT_MAX, err);
        if (rc == 0 && with_vt)
            rc = need_range("VisibilityTimeout", e[i].visibility_timeout_s, 0,
                            SQS_VISIBILITY_MAX_S, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int batch(struct buf *out, const char *queue_url, const struct sqs_entry *e, int n,
                 int with_vt, struct cr_err *err)
{
    struct jw w;
    int rc = need_str("queue url", queue_url, SQS_URL_MAX, err);
    if (rc == 0)
        rc = entries_ok(e, n, with_vt, err);
    if (rc < 0)
        return rc;
    jw_open(&w, out);
    jw_str(&w, "QueueUrl", queue_url);
    jw_key(&w, "Entries");
    jw_raw(&w, "[");
    for (int i = 0; i < n && w.rc == 0; i++) {
        struct jw ew = {out, out->len, w.rc, 0};
        if (i)
            jw_raw(&w, ",");
        ew.rc = w.rc;
        jw_raw(&ew, "{");
        jw_str(&ew, "Id", e[i].id);
        jw_str(&ew, "ReceiptHandle", e[i].receipt_handle);
        if (with_vt)
            jw_long(&ew, "VisibilityTimeout", e[i].visibility_timeout_s);
        jw_raw(&ew, "}");
        w.rc = ew.rc;
    }
    jw_raw(&w, "]");
    return jw_close(&w);
}

int sqs_req_delete_batch(struct buf *out, const char *queue_url,
                         const struct sqs_entry *e, int n, struct cr_err *err)
{
    return batch(out, queue_url, e, n, 0, err);
}

int sqs_req_change_visibility_batch(struct buf *out, const char *queue_url,
                                    const struct sqs_entry *e, int n, struct cr_err *err)
{
    return batch(out, queue_url, e, n, 1, err);
}

/* ------------------------------------------------------------ responses */

static const cJSON *get(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

static int blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return 0;
    return 1;
}

/* Parses a response object into *root (NULL for an empty or blank body when
 * empty_ok). */
static int parse_object(const char *what, const char *resp, size_t len, int empty_ok,
                        cJSON **root, struct cr_err *err)
{
    int rc;
    *root = NULL;
    if (len > SQS_RESPONSE_MAX_BYTES)
        return cr_err_set(err, CR_ETOOBIG, "sqs %s answer is %zu bytes, over %u", what,
                          len, SQS_RESPONSE_MAX_BYTES);
    if (empty_ok && blank(resp, len))
        return 0;
    rc = py_json_parse(resp, len, root, err);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0)
        return cr_err_set(err, CR_EPROTO, "sqs %s answer is not JSON: %s", what,
                          err ? err->msg : "");
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return cr_err_set(err, CR_EPROTO, "sqs %s answer is not an object", what);
    }
    return 0;
}

/* A decimal of at most 18 digits, or -1. */
static long decimal(const cJSON *v)
{
    const char *s;
    long r = 0;
    int k = 0;
    if (!cJSON_IsString(v))
        return -1;
    for (s = v->valuestring; *s; s++, k++) {
        if (*s < '0' || *s > '9' || k >= 18)
            return -1;
        r = r * 10 + (*s - '0');
    }
    return k ? r : -1;
}

/* Copies at most size - 1 bytes of s, cut back to a UTF-8 character start. */
static void copy_trunc(char *dst, size_t size, const char *s, size_t n)
{
    if (n >= size) {
        n = size - 1;
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
}

void sqs_messages_release(struct sqs_messages *ms)
{
    for (int i = 0; i < ms->n; i++) {
        struct sqs_message *m = &ms->v[i];
        cr_free(m->message_id);
        cr_free(m->receipt_handle);
        cr_free(m->md5_of_body);
        cr_free(m->body);
    }
    memset(ms, 0, sizeof *ms);
}

static int take(const cJSON *o, const char *key, int required, size_t max, char **dst,
                struct cr_err *err)
{
    const cJSON *v = get(o, key);
    const char *s = "";
    if (cJSON_IsString(v))
        s = v->valuestring;
    else if (required || (v && !cJSON_IsNull(v)))
        return cr_err_set(err, CR_EPROTO, "sqs message has no string %s", key);
    if (max && strlen(s) > max)
        return cr_err_set(err, CR_EPROTO, "sqs message %s is longer than %zu", key, max);
    *dst = cr_strdup(s);
    return *dst ? 0 : CR_ENOMEM;
}

static int one_message(const cJSON *jm, size_t max_body, struct sqs_message *m,
                       struct cr_err *err)
{
    const cJSON *body, *attrs;
    int rc;
    if (!cJSON_IsObject(jm))
        return cr_err_set(err, CR_EPROTO, "sqs message is not an object");
    body = get(jm, "Body");
    if (!cJSON_IsString(body))
        return cr_err_set(err, CR_EPROTO, "sqs message has no string Body");
    rc = take(jm, "MessageId", 1, 1024, &m->message_id, err);
    if (rc == 0)
        rc = take(jm, "ReceiptHandle", 1, SQS_RECEIPT_MAX, &m->receipt_handle, err);
    if (rc == 0 && !m->receipt_handle[0])
        rc = cr_err_set(err, CR_EPROTO, "sqs message has an empty ReceiptHandle");
    if (rc == 0)
        rc = take(jm, "MD5OfBody", 0, 64, &m->md5_of_body, err);
    if (rc < 0)
        return rc;
    m->body_len = strlen(body->valuestring);
    if (m->body_len > max_body) {
        m->oversize = 1;
    } else {
        m->body = cr_strndup(body->valuestring, m->body_len);
        if (!m->body)
            return CR_ENOMEM;
    }
    attrs = get(jm, "Attributes");
    if (cJSON_IsObject(attrs)) {
        long rcount = decimal(get(attrs, "ApproximateReceiveCount"));
        m->receive_count = rcount > 0 ? rcount : 0;
    }
    return 0;
}

int sqs_parse_receive(const char *resp, size_t len, size_t max_body_bytes,
                      struct sqs_messages *out, struct cr_err *err)
{
    cJSON *root;
    const cJSON *msgs, *it;
    int rc;

    memset(out, 0, sizeof *out);
    if (!max_body_bytes)
        max_body_bytes = SQS_MESSAGE_MAX_BYTES;
    rc = parse_object("ReceiveMessage", resp, len, 1, &root, err);
    if (rc < 0 || !root)
        return rc;
    msgs = get(root, "Messages");
    if (msgs && !cJSON_IsNull(msgs) && !cJSON_IsArray(msgs))
        rc = cr_err_set(err, CR_EPROTO, "sqs Messages is not an array");
    else if (cJSON_GetArraySize(msgs) > SQS_BATCH_MAX)
        rc = cr_err_set(err, CR_EPROTO, "sqs answer has more than %d messages",
                        SQS_BATCH_MAX);
    if (rc == 0 && cJSON_IsArray(msgs)) {
        cJSON_ArrayForEach(it, msgs)
        {
            /* counted before the fill, so release frees the partial one too */
            rc = one_message(it, max_body_bytes, &out->v[out->n++], err);
            if (rc < 0)
                break;
        }
    }
    cJSON_Delete(root);
    if (rc < 0)
        sqs_messages_release(out);
    return rc;
}

int sqs_parse_queue_url(const char *resp, size_t len, char **url, struct cr_err *err)
{
    cJSON *root;
    const cJSON *v;
    int rc;
    *url = NULL;
    rc = parse_object("QueueUrl", resp, len, 0, &root, err);
    if (rc < 0)
        return rc;
    v = get(root, "QueueUrl");
    if (!cJSON_IsString(v) || !v->valuestring[0])
        rc = cr_err_set(err, CR_EPROTO, "sqs answer has no QueueUrl");
    else if (strlen(v->valuestring) > SQS_URL_MAX)
        rc = cr_err_set(err, CR_EPROTO, "sqs QueueUrl is longer than %d", SQS_URL_MAX);
    else if (!(*url = cr_strdup(v->valuestring)))
        rc = CR_ENOMEM;
    cJSON_Delete(root);
    return rc;
}

/* Copies an optional string member into dst; absent or null leaves "". */
static int member_into(const cJSON *o, const char *key, char *dst, size_t size,
                       struct cr_err *err)
{
    const cJSON *v = get(o, key);
    dst[0] = '\0';
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v))
        return cr_err_set(err, CR_EPROTO, "sqs %s is not a string", key);
    if (strlen(v->valuestring) >= size)
        return cr_err_set(err, CR_EPROTO, "sqs %s is longer than %zu", key, size - 1);
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

int sqs_parse_send(const char *resp, size_t len, struct sqs_sent *out, struct cr_err *err)
{
    cJSON *root;
    int rc;
    memset(out, 0, sizeof *out);
    rc = parse_object("SendMessage", resp, len, 0, &root, err);
    if (rc < 0)
        return rc;
    rc = member_into(root, "MessageId", out->message_id, sizeof out->message_id, err);
    if (rc == 0 && !out->message_id[0])
        rc = cr_err_set(err, CR_EPROTO, "sqs answer has no MessageId");
    if (rc == 0)
        rc = member_into(root, "MD5OfMessageBody", out->md5_of_body,
                         sizeof out->md5_of_body, err);
    if (rc == 0)
        rc = member_into(root, "SequenceNumber", out->sequence_number,
                         sizeof out->sequence_number, err);
    cJSON_Delete(root);
    if (rc < 0)
        memset(out, 0, sizeof *out);
    return rc;
}

int sqs_md5_matches(const char *data, size_t len, const char *md5)
{
    char hex[MD5_HEX_LEN + 1];
    if (!md5 || !*md5)
        return -1;
    if (strlen(md5) != MD5_HEX_LEN)
        return 0;
    md5_hex(data, len, hex);
    return strcasecmp(hex, md5) == 0;
}

int sqs_parse_queue_attrs(const char *resp, size_t len, struct sqs_queue_attrs *out,
                          struct cr_err *err)
{
    cJSON *root;
    const cJSON *a, *fifo;
    int rc;
    out->messages = out->messages_not_visible = out->messages_delayed = -1;
    out->visibility_timeout_s = out->maximum_message_size = out->delay_s = -1;
    out->fifo = 0;
    rc = parse_object("GetQueueAttributes", resp, len, 0, &root, err);
    if (rc < 0)
        return rc;
    a = get(root, "Attributes");
    if (a && !cJSON_IsObject(a)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EPROTO, "sqs Attributes is not an object");
    }
    out->messages = decimal(get(a, "ApproximateNumberOfMessages"));
    out->messages_not_visible = decimal(get(a, "ApproximateNumberOfMessagesNotVisible"));
    out->messages_delayed = decimal(get(a, "ApproximateNumberOfMessagesDelayed"));
    out->visibility_timeout_s = decimal(get(a, "VisibilityTimeout"));
    out->maximum_message_size = decimal(get(a, "MaximumMessageSize"));
    out->delay_s = decimal(get(a, "DelaySeconds"));
    fifo = get(a, "FifoQueue");
    out->fifo = cJSON_IsString(fifo) && strcmp(fifo->valuestring, "true") == 0;
    cJSON_Delete(root);
    return 0;
}

/* ------------------------------------------------------------ errors */

/* Codes by kind: JSON names (botocore's model), the query protocol's legacy
 * names, and the generic AWS ones (botocore's retry tables). */
static const struct {
    const char *code;
    enum sqs_err_kind kind;
} codes[] = {
    {"InternalError", SQS_ERR_RETRY},
    {"InternalFailure", SQS_ERR_RETRY},
    {"ServiceUnavailable", SQS_ERR_RETRY},
    {"ServiceUnavailableException", SQS_ERR_RETRY},
    {"RequestThrottled", SQS_ERR_RETRY},
    {"RequestThrottledException", SQS_ERR_RETRY},
    {"Throttling", SQS_ERR_RETRY},
    {"ThrottlingException", SQS_ERR_RETRY},
    {"ThrottledException", SQS_ERR_RETRY},
    {"TooManyRequestsException", SQS_ERR_RETRY},
    {"ProvisionedThroughputExceededException", SQS_ERR_RETRY},
    {"KmsThrottled", SQS_ERR_RETRY},
    {"RequestTimeout", SQS_ERR_RETRY},
    {"RequestTimeoutException", SQS_ERR_RETRY},
    {"PriorRequestNotComplete", SQS_ERR_RETRY},
    {"PurgeQueueInProgress", SQS_ERR_RETRY},
    {"AWS.SimpleQueueService.PurgeQueueInProgress", SQS_ERR_RETRY},
    {"QueueDeletedRecently", SQS_ERR_RETRY},
    {"AWS.SimpleQueueService.QueueDeletedRecently", SQS_ERR_RETRY},
    {"OverLimit", SQS_ERR_OVER_LIMIT},
    {"QueueDoesNotExist", SQS_ERR_QUEUE_MISSING},
    {"AWS.SimpleQueueService.NonExistentQueue", SQS_ERR_QUEUE_MISSING},
    {"QueueAlreadyExists", SQS_ERR_QUEUE_EXISTS},
    {"QueueNameExists", SQS_ERR_QUEUE_EXISTS},
    {"ReceiptHandleIsInvalid", SQS_ERR_RECEIPT},
    {"InvalidIdFormat", SQS_ERR_RECEIPT},
    {"MessageNotInflight", SQS_ERR_RECEIPT},
    {"AWS.SimpleQueueService.MessageNotInflight", SQS_ERR_RECEIPT},
    {"ExpiredToken", SQS_ERR_CREDENTIALS},
    {"ExpiredTokenException", SQS_ERR_CREDENTIALS},
    {"RequestExpired", SQS_ERR_CREDENTIALS},
    {"InvalidClientTokenId", SQS_ERR_CREDENTIALS},
    {"UnrecognizedClientException", SQS_ERR_CREDENTIALS},
    {"AccessDenied", SQS_ERR_DENIED},
    {"AccessDeniedException", SQS_ERR_DENIED},
    {"SignatureDoesNotMatch", SQS_ERR_DENIED},
    {"IncompleteSignature", SQS_ERR_DENIED},
    {"MissingAuthenticationToken", SQS_ERR_DENIED},
    {"InvalidSecurity", SQS_ERR_DENIED},
    {"AWS.SimpleQueueService.InvalidSecurity", SQS_ERR_DENIED},
    {"KmsAccessDenied", SQS_ERR_DENIED},
};

/* The code without a "namespace#" prefix or a ":detail" suffix, as botocore
 * reads __type. */
static const char *bare_code(const char *code, size_t *n)
{
    const char *hash = strrchr(code, '#');
    const char *colon;
    if (hash)
        code = hash + 1;
    colon = strchr(code, ':');
    *n = colon ? (size_t)(colon - code) : strlen(code);
    return code;
}

static int code_kind(const char *code, enum sqs_err_kind *kind)
{
    size_t n, i;
    if (!code || !*code)
        return 0;
    code = bare_code(code, &n);
    for (i = 0; i < sizeof codes / sizeof *codes; i++) {
        if (strlen(codes[i].code) == n && memcmp(codes[i].code, code, n) == 0) {
            *kind = codes[i].kind;
            return 1;
        }
    }
    return 0;
}

static enum sqs_err_kind status_kind(int status)
{
    if (status >= 200 && status < 300)
        return SQS_ERR_NONE;
    if (status == 0 || status >= 500 || status == 408 || status == 429)
        return SQS_ERR_RETRY;
    if (status == 403)
        return SQS_ERR_DENIED;
    return SQS_ERR_BAD_REQUEST;
}

enum sqs_err_kind sqs_classify(const char *code, int status)
{
    enum sqs_err_kind k;
    if (code_kind(code, &k))
        return k;
    return status_kind(status);
}

/* The text between <tag> and </tag> in s[0..n), or NULL. */
static const char *xml_elem(const char *s, size_t n, const char *tag, size_t *out_len)
{
    char open[32], close[32];
    const char *a, *b;
    int ol = snprintf(open, sizeof open, "<%s>", tag);
    int cl = snprintf(close, sizeof close, "</%s>", tag);
    a = memmem(s, n, open, (size_t)ol);
    if (!a)
        return NULL;
    a += ol;
    b = memmem(a, n - (size_t)(a - s), close, (size_t)cl);
    if (!b)
        return NULL;
    *out_len = (size_t)(b - a);
    return a;
}

static void parse_xml_error(const char *body, size_t len, struct sqs_error *e)
{
    size_t n;
    const char *v = xml_elem(body, len, "Code", &n);
    if (v)
        copy_trunc(e->code, sizeof e->code, v, n);
    v = xml_elem(body, len, "Message", &n);
    if (v)
        copy_trunc(e->message, sizeof e->message, v, n);
    v = xml_elem(body, len, "Type", &n);
    if (v && n == 6 && memcmp(v, "Sender", 6) == 0)
        e->sender_fault = 1;
}

static int parse_json_error(const char *body, size_t len, struct sqs_error *e)
{
    cJSON *root = NULL;
    const cJSON *t, *m;
    int rc = py_json_parse(body, len, &root, NULL);
    if (rc < 0)
        return rc == CR_ENOMEM ? rc : 0;
    if (cJSON_IsObject(root)) {
        t = get(root, "__type");
        if (!cJSON_IsString(t))
            t = get(root, "code");
        if (cJSON_IsString(t)) {
            size_t n;
            const char *c = bare_code(t->valuestring, &n);
            copy_trunc(e->code, sizeof e->code, c, n);
        }
        m = get(root, "message");
        if (!cJSON_IsString(m))
            m = get(root, "Message");
        if (cJSON_IsString(m))
            copy_trunc(e->message, sizeof e->message, m->valuestring,
                       strlen(m->valuestring));
    }
    cJSON_Delete(root);
    return 0;
}

int sqs_error_parse(int status, const char *query_error_header, const char *body,
                    size_t len, struct sqs_error *e)
{
    enum sqs_err_kind k;
    size_t i = 0;
    int rc = 0;
    memset(e, 0, sizeof *e);
    e->status = status;
    if (query_error_header) {
        const char *semi = strchr(query_error_header, ';');
        size_t n =
            semi ? (size_t)(semi - query_error_header) : strlen(query_error_header);
        copy_trunc(e->query_code, sizeof e->query_code, query_error_header, n);
        if (semi && strcmp(semi + 1, "Sender") == 0)
            e->sender_fault = 1;
    }
    if (body && len <= SQS_RESPONSE_MAX_BYTES) {
        while (i < len &&
               (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r'))
            i++;
        if (i < len && body[i] == '{')
            rc = parse_json_error(body, len, e);
        else if (i < len && body[i] == '<')
            parse_xml_error(body, len, e);
    }
    if (code_kind(e->code, &k) || code_kind(e->query_code, &k))
        e->kind = k;
    else
        e->kind = status_kind(status);
    return rc;
}

static int batch_entry(const cJSON *je, int failed, struct sqs_batch_entry *be,
                       struct cr_err *err)
{
    const cJSON *id, *v;
    memset(be, 0, sizeof *be);
    if (!cJSON_IsObject(je))
        return cr_err_set(err, CR_EPROTO, "sqs batch entry is not an object");
    id = get(je, "Id");
    if (!cJSON_IsString(id) || !id->valuestring[0] ||
        strlen(id->valuestring) > SQS_BATCH_ID_MAX)
        return cr_err_set(err, CR_EPROTO, "sqs batch entry has no Id");
    memcpy(be->id, id->valuestring, strlen(id->valuestring) + 1);
    if (!failed)
        return 0;
    be->sender_fault = cJSON_IsTrue(get(je, "SenderFault"));
    v = get(je, "Code");
    if (cJSON_IsString(v))
        copy_trunc(be->code, sizeof be->code, v->valuestring, strlen(v->valuestring));
    v = get(je, "Message");
    if (cJSON_IsString(v))
        copy_trunc(be->message, sizeof be->message, v->valuestring,
                   strlen(v->valuestring));
    be->kind = sqs_classify(be->code, be->sender_fault ? 400 : 500);
    if (be->kind == SQS_ERR_NONE)
        be->kind = SQS_ERR_BAD_REQUEST;
    return 0;
}

int sqs_parse_batch(const char *resp, size_t len, struct sqs_batch_result *out,
                    struct cr_err *err)
{
    static const char *const lists[2] = {"Successful", "Failed"};
    cJSON *root;
    int rc, f;
    memset(out, 0, sizeof *out);
    rc = parse_object("batch", resp, len, 0, &root, err);
    if (rc < 0)
        return rc;
    for (f = 0; f < 2 && rc == 0; f++) {
        const cJSON *arr = get(root, lists[f]), *it;
        if (!arr || cJSON_IsNull(arr))
            continue;
        if (!cJSON_IsArray(arr)) {
            rc = cr_err_set(err, CR_EPROTO, "sqs %s is not an array", lists[f]);
            break;
        }
        if (cJSON_GetArraySize(arr) > SQS_BATCH_MAX) {
            rc = cr_err_set(err, CR_EPROTO, "sqs %s has more than %d entries", lists[f],
                            SQS_BATCH_MAX);
            break;
        }
        cJSON_ArrayForEach(it, arr)
        {
            rc = batch_entry(it, f, &out->v[out->n], err);
            if (rc < 0)
                break;
            out->n++;
            out->n_failed += f;
        }
    }
    cJSON_Delete(root);
    if (rc < 0)
        memset(out, 0, sizeof *out);
    return rc;
}
