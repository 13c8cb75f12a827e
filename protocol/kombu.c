/* kombu.c -- kombu's Redis transport on the wire (no I/O, no clock, no globals).
 *
 * The rules each function follows are those of kombu 5.2.4 and 5.6.2
 * (kombu/transport/redis.py, virtual/base.py, virtual/exchange.py); where kombu
 * would raise on odd input we refuse it or pick the harmless reading, and say
 * which next to the code. docs/internals/redis-broker.md sums up the format. */
#include "kombu.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/alloc.h"
#include "../util/base64.h"
#include "pyjson.h"

#define DEFAULT_SEP "\x06\x16"

/* ------------------------------------------------------------ options */

void kombu_opts_init(struct kombu_opts *o)
{
    static const int steps[] = {0, 3, 6, 9};
    memset(o, 0, sizeof *o);
    o->visibility_timeout_s = 3600;
    memcpy(o->steps, steps, sizeof steps);
    o->nsteps = 4;
    memcpy(o->sep, DEFAULT_SEP, sizeof DEFAULT_SEP);
    o->order = KOMBU_ORDER_ROUND_ROBIN;
    o->fanout_prefix = 1;
    o->fanout_patterns = 1;
    snprintf(o->unacked_key, sizeof o->unacked_key, "unacked");
    snprintf(o->unacked_index_key, sizeof o->unacked_index_key, "unacked_index");
    snprintf(o->unacked_mutex_key, sizeof o->unacked_mutex_key, "unacked_mutex");
    o->unacked_mutex_expire_s = 300;
    o->ack_emulation = 1;
    o->health_check_interval_s = 25;
}

/* Copies a string option into dst (size bytes with the NUL); empty when
 * allow_empty is 0 is refused. */
static int opt_str(const cJSON *v, const char *key, char *dst, size_t size,
                   int allow_null, int allow_empty, struct cr_err *err)
{
    size_t n;
    if (allow_null && cJSON_IsNull(v)) {
        dst[0] = '\0';
        return 0;
    }
    if (!cJSON_IsString(v))
        return cr_err_set(err, CR_EINVAL, "broker transport option '%s' must be a string",
                          key);
    n = strlen(v->valuestring);
    if (n >= size)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' is too long (at most %zu bytes)",
                          key, size - 1);
    if (n == 0 && !allow_empty)
        return cr_err_set(err, CR_EINVAL, "broker transport option '%s' is empty", key);
    memcpy(dst, v->valuestring, n + 1);
    return 0;
}

/* A number option in [lo, hi]; null gives dflt when allow_null. */
static int opt_num(const cJSON *v, const char *key, double *dst, double lo, double hi,
                   int allow_null, double dflt, struct cr_err *err)
{
    if (allow_null && cJSON_IsNull(v)) {
        *dst = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || isnan(v->valuedouble))
        return cr_err_set(err, CR_EINVAL, "broker transport option '%s' must be a number",
                          key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' is out of range (%g..%g)", key,
                          lo, hi);
    *dst = v->valuedouble;
    return 0;
}

/* An integral number option in [lo, hi] (2.0 is refused: kombu passes ints). */
static int opt_int(const cJSON *v, const char *key, long *dst, long lo, long hi,
                   int allow_null, long dflt, struct cr_err *err)
{
    double d;
    if (allow_null && cJSON_IsNull(v)) {
        *dst = dflt;
        return 0;
    }
    if (!cJSON_IsNumber(v) || (v->type & PY_JSON_FLOAT))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' must be an integer", key);
    d = v->valuedouble;
    if (d < (double)lo || d > (double)hi)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' is out of range (%ld..%ld)", key,
                          lo, hi);
    *dst = (long)d;
    return 0;
}

static int opt_bool(const cJSON *v, const char *key, int *dst, struct cr_err *err)
{
    if (!cJSON_IsBool(v))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option '%s' must be true or false", key);
    *dst = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int opt_steps(const cJSON *v, struct kombu_opts *o, struct cr_err *err)
{
    const cJSON *it;
    int n = 0;
    long s;
    if (!cJSON_IsArray(v))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'priority_steps' must be a list");
    cJSON_ArrayForEach(it, v)
    {
        if (n == KOMBU_MAX_STEPS)
            return cr_err_set(err, CR_EINVAL,
                              "broker transport option 'priority_steps' has more than %d "
                              "steps",
                              KOMBU_MAX_STEPS);
        if (opt_int(it, "priority_steps", &s, 0, KOMBU_PRIORITY_MAX, 0, 0, err) < 0)
            return err ? err->code : CR_EINVAL;
        if (n > 0 && s <= o->steps[n - 1])
            return cr_err_set(
                err, CR_EINVAL,
                "broker transport option 'priority_steps' must be ascending "
                "without repeats");
        o->steps[n++] = (int)s;
    }
    /* kombu picks a bucket with bisect: a list not starting at 0 sends the
     * most urgent messages to its largest step. */
    if (n == 0 || o->steps[0] != 0)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'priority_steps' must start with 0");
    o->nsteps = n;
    return 0;
}

/* kombu formats the fanout prefix with str.format(db=...): "{db}", "{{" and
 * "}}" are all it may hold, or Python raises when it connects. */
static int fanout_prefix_ok(const char *s)
{
    for (; *s; s++) {
        if (*s == '{') {
            if (s[1] == '{')
                s++;
            else if (strncmp(s, "{db}", 4) == 0)
                s += 3;
            else
                return 0;
        } else if (*s == '}') {
            if (s[1] != '}')
                return 0;
            s++;
        }
    }
    return 1;
}

static int opt_sentinel_kwargs(const cJSON *v, struct kombu_opts *o, struct cr_err *err)
{
    const cJSON *it;
    if (cJSON_IsNull(v)) {
        o->sentinel_username[0] = o->sentinel_password[0] = '\0';
        return 0;
    }
    if (!cJSON_IsObject(v))
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'sentinel_kwargs' must be an object");
    /* Other keys are redis-py connection arguments to the sentinels (ssl,
     * socket options) that the worker takes from its own settings. */
    cJSON_ArrayForEach(it, v)
    {
        int rc = 0;
        if (strcmp(it->string, "username") == 0)
            rc = opt_str(it, "sentinel_kwargs.username", o->sentinel_username,
                         sizeof o->sentinel_username, 1, 1, err);
        else if (strcmp(it->string, "password") == 0)
            rc = opt_str(it, "sentinel_kwargs.password", o->sentinel_password,
                         sizeof o->sentinel_password, 1, 1, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int opt_one(struct kombu_opts *o, const cJSON *v, struct cr_err *err)
{
    const char *k = v->string;
    long l;
    int rc;
    static const char *const ignored[] = {
        "max_connections",
        "socket_keepalive",
        "socket_keepalive_options",
        "retry_on_timeout",
        "unacked_restore_interval",
        "unacked_restore_throttle",
        /* the publish retry policy Celery's docs put here (Connection.ensure) */
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
    };

    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        if (strcmp(k, ignored[i]) == 0)
            return 0;
    if (strcmp(k, "visibility_timeout") == 0)
        return opt_num(v, k, &o->visibility_timeout_s, 0, 1e9, 0, 0, err);
    if (strcmp(k, "priority_steps") == 0)
        return opt_steps(v, o, err);
    if (strcmp(k, "sep") == 0)
        return opt_str(v, k, o->sep, sizeof o->sep, 0, 0, err);
    if (strcmp(k, "queue_order_strategy") == 0) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, "round_robin") == 0)
            o->order = KOMBU_ORDER_ROUND_ROBIN;
        else if (cJSON_IsString(v) && strcmp(v->valuestring, "priority") == 0)
            o->order = KOMBU_ORDER_PRIORITY;
        else if (cJSON_IsString(v) && strcmp(v->valuestring, "sorted") == 0)
            o->order = KOMBU_ORDER_SORTED;
        else
            return cr_err_set(err, CR_EINVAL,
                              "broker transport option 'queue_order_strategy' must be "
                              "'round_robin', 'priority' or 'sorted'");
        return 0;
    }
    if (strcmp(k, "global_keyprefix") == 0)
        return opt_str(v, k, o->keyprefix, sizeof o->keyprefix, 0, 1, err);
    if (strcmp(k, "fanout_prefix") == 0) {
        if (cJSON_IsBool(v)) {
            o->fanout_prefix = cJSON_IsTrue(v) ? 1 : 0;
            o->fanout_prefix_str[0] = '\0';
            return 0;
        }
        rc = opt_str(v, k, o->fanout_prefix_str, sizeof o->fanout_prefix_str, 0, 1, err);
        if (rc < 0)
            return rc;
        if (!fanout_prefix_ok(o->fanout_prefix_str))
            return cr_err_set(err, CR_EINVAL,
                              "broker transport option 'fanout_prefix' may format only "
                              "{db}");
        /* An empty string is false to Python: no prefix at all. */
        o->fanout_prefix = o->fanout_prefix_str[0] ? 2 : 0;
        return 0;
    }
    if (strcmp(k, "fanout_patterns") == 0)
        return opt_bool(v, k, &o->fanout_patterns, err);
    if (strcmp(k, "unacked_key") == 0)
        return opt_str(v, k, o->unacked_key, sizeof o->unacked_key, 0, 0, err);
    if (strcmp(k, "unacked_index_key") == 0)
        return opt_str(v, k, o->unacked_index_key, sizeof o->unacked_index_key, 0, 0,
                       err);
    if (strcmp(k, "unacked_mutex_key") == 0)
        return opt_str(v, k, o->unacked_mutex_key, sizeof o->unacked_mutex_key, 0, 0,
                       err);
    if (strcmp(k, "unacked_mutex_expire") == 0) /* the lock's PX must be >= 1 ms */
        return opt_num(v, k, &o->unacked_mutex_expire_s, 0.001, 1e9, 0, 0, err);
    if (strcmp(k, "unacked_restore_limit") == 0)
        return opt_int(v, k, &o->unacked_restore_limit, 0, 1000000000L, 1, 0, err);
    if (strcmp(k, "ack_emulation") == 0)
        return opt_bool(v, k, &o->ack_emulation, err);
    if (strcmp(k, "polling_interval") == 0)
        return opt_num(v, k, &o->polling_interval_s, 0, 1e6, 1, 0, err);
    if (strcmp(k, "master_name") == 0)
        return opt_str(v, k, o->master_name, sizeof o->master_name, 1, 1, err);
    if (strcmp(k, "sentinel_kwargs") == 0)
        return opt_sentinel_kwargs(v, o, err);
    if (strcmp(k, "min_other_sentinels") == 0) {
        rc = opt_int(v, k, &l, 0, 1000, 0, 0, err);
        if (rc == 0)
            o->min_other_sentinels = (int)l;
        return rc;
    }
    if (strcmp(k, "socket_timeout") == 0)
        return opt_num(v, k, &o->socket_timeout_s, 0, 1e6, 1, 0, err);
    if (strcmp(k, "socket_connect_timeout") == 0)
        return opt_num(v, k, &o->socket_connect_timeout_s, 0, 1e6, 1, 0, err);
    if (strcmp(k, "health_check_interval") == 0)
        return opt_num(v, k, &o->health_check_interval_s, 0, 1e6, 0, 0, err);
    if (strcmp(k, "client_name") == 0)
        return opt_str(v, k, o->client_name, sizeof o->client_name, 1, 1, err);
    if (strcmp(k, "body_encoding") == 0) {
        if (cJSON_IsString(v) && strcmp(v->valuestring, "base64") == 0)
            return 0;
        return cr_err_set(err, CR_EINVAL,
                          "broker transport option 'body_encoding' must be 'base64'");
    }
    return cr_err_set(err, CR_EINVAL, "unknown broker transport option '%.64s'", k);
}

int kombu_opts_parse(struct kombu_opts *o, const char *json, size_t len,
                     struct cr_err *err)
{
    cJSON *root = NULL, *it;
    int rc;
    if (len > KOMBU_OPTS_MAX_BYTES)
        return cr_err_set(err, CR_EINVAL,
                          "broker transport options are too long (%zu bytes, at most %d)",
                          len, KOMBU_OPTS_MAX_BYTES);
    rc = py_json_parse(json, len, &root, err);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0) {
        /* Copied first: err->msg as both the reason and the destination
         * printed the prefix twice and lost the reason. */
        char why[sizeof(err->msg)];
        snprintf(why, sizeof(why), "%s", err ? err->msg : "");
        return cr_err_set(err, CR_EINVAL, "broker transport options are not JSON: %s",
                          why);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EINVAL,
                          "broker transport options must be a JSON object");
    }
    rc = 0;
    /* Later duplicates win, as in Python's json.loads. */
    cJSON_ArrayForEach(it, root)
    {
        rc = opt_one(o, it, err);
        if (rc < 0)
            break;
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ envelope */

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* An optional string member: absent or null -> "", a string -> a copy, any
 * other kind is refused. */
static int take_str(const cJSON *obj, const char *key, char **dst, struct cr_err *err)
{
    const cJSON *v = obj ? get(obj, key) : NULL;
    const char *s = "";
    if (v && cJSON_IsString(v))
        s = v->valuestring;
    else if (v && !cJSON_IsNull(v))
        return cr_err_set(err, CR_EDECODE, "envelope '%s' is not a string", key);
    *dst = cr_strdup(s);
    return *dst ? 0 : CR_ENOMEM;
}

/* kombu reads a priority with int(): floats truncate, numeric strings and
 * booleans convert, anything else (or NaN) is the default 0; then it clamps. */
static int priority_of(const cJSON *v)
{
    double d = 0;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? 1 : 0;
    if (cJSON_IsNumber(v)) {
        d = v->valuedouble;
    } else if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        char *end;
        long l;
        while (isspace((unsigned char)*s))
            s++;
        if (!isdigit((unsigned char)*s) &&
            !((*s == '-' || *s == '+') && isdigit((unsigned char)s[1])))
            return 0;
        l = strtol(s, &end, 10);
        while (isspace((unsigned char)*end))
            end++;
        if (*end)
            return 0;
        d = (double)l;
    } else {
        return 0;
    }
    if (isnan(d))
        return 0;
    if (d < 0)
        return 0;
    if (d > KOMBU_PRIORITY_MAX)
        return KOMBU_PRIORITY_MAX;
    return (int)d;
}

void kombu_msg_release(struct kombu_msg *m)
{
    cr_free(m->body);
    cr_free(m->content_type);
    cr_free(m->content_encoding);
    cJSON_Delete(m->headers);
    cr_free(m->correlation_id);
    cr_free(m->reply_to);
    cr_free(m->expiration);
    cr_free(m->exchange);
    cr_free(m->routing_key);
    cr_free(m->delivery_tag);
    memset(m, 0, sizeof *m);
}

static int decode_body(struct kombu_msg *m, const cJSON *body, const cJSON *props,
                       size_t max_body_bytes, struct cr_err *err)
{
    const cJSON *enc = get(props, "body_encoding");
    const char *s = "";
    size_t n;
    if (body && cJSON_IsString(body))
        s = body->valuestring;
    else if (body && !cJSON_IsNull(body))
        return cr_err_set(err, CR_EDECODE, "envelope body is not a string");
    n = strlen(s);
    /* kombu decodes only when body_encoding is set; 'utf-8' (which kombu 5.x
     * itself cannot decode) is read as the raw text some writers meant. */
    if (n == 0 || !enc || cJSON_IsNull(enc) ||
        (cJSON_IsString(enc) &&
         (enc->valuestring[0] == '\0' || strcmp(enc->valuestring, "utf-8") == 0))) {
        if (max_body_bytes && n > max_body_bytes)
            return cr_err_set(err, CR_ETOOBIG, "message body is %zu bytes, over %zu", n,
                              max_body_bytes);
        m->body = cr_strndup(s, n);
        if (!m->body)
            return CR_ENOMEM;
        m->body_len = n;
        return 0;
    }
    if (!cJSON_IsString(enc) || strcmp(enc->valuestring, "base64") != 0)
        return cr_err_set(err, CR_EDECODE, "unsupported body_encoding");
    if (max_body_bytes && n / 4 * 3 > max_body_bytes + 2)
        return cr_err_set(err, CR_ETOOBIG, "message body is about %zu bytes, over %zu",
                          n / 4 * 3, max_body_bytes);
    m->body = cr_malloc(n / 4 * 3 + 1);
    if (!m->body)
        return CR_ENOMEM;
    long got = base64_decode(s, n, (unsigned char *)m->body, BASE64_STRICT);
    if (got < 0)
        return cr_err_set(err, CR_EDECODE, "envelope body is not base64");
    if (max_body_bytes && (size_t)got > max_body_bytes)
        return cr_err_set(err, CR_ETOOBIG, "message body is %ld bytes, over %zu", got,
                          max_body_bytes);
    m->body[got] = '\0';
    m->body_len = (size_t)got;
    return 0;
}

static int decode_tree(struct kombu_msg *m, cJSON *root, size_t max_body_bytes,
                       unsigned flags, struct cr_err *err)
{
    const cJSON *props, *info, *tag, *v;
    cJSON *headers;
    int rc;

    if (!cJSON_IsObject(root))
        return cr_err_set(err, CR_EDECODE, "envelope is not a JSON object");
    props = get(root, "properties");
    if (!cJSON_IsObject(props))
        return cr_err_set(err, CR_EDECODE, "envelope has no properties object");
    tag = get(props, "delivery_tag");
    if (!cJSON_IsString(tag) &&
        !((flags & KOMBU_DECODE_ANY_TAG) && (!tag || cJSON_IsNull(tag))))
        return cr_err_set(err, CR_EDECODE, "envelope has no delivery tag");
    info = get(props, "delivery_info");
    if (info && !cJSON_IsObject(info) && !cJSON_IsNull(info))
        return cr_err_set(err, CR_EDECODE, "envelope delivery_info is not an object");
    if (!cJSON_IsObject(info))
        info = NULL;
    headers = cJSON_GetObjectItemCaseSensitive(root, "headers");
    if (headers && !cJSON_IsObject(headers) && !cJSON_IsNull(headers))
        return cr_err_set(err, CR_EDECODE, "envelope headers are not an object");

    rc = decode_body(m, get(root, "body"), props, max_body_bytes, err);
    if (rc == 0)
        rc = take_str(root, "content-type", &m->content_type, err);
    if (rc == 0)
        rc = take_str(root, "content-encoding", &m->content_encoding, err);
    if (rc == 0)
        rc = take_str(props, "correlation_id", &m->correlation_id, err);
    if (rc == 0)
        rc = take_str(props, "reply_to", &m->reply_to, err);
    if (rc == 0)
        rc = take_str(props, "expiration", &m->expiration, err);
    if (rc == 0)
        rc = take_str(props, "delivery_tag", &m->delivery_tag, err);
    if (rc == 0)
        rc = take_str(info, "exchange", &m->exchange, err);
    if (rc == 0)
        rc = take_str(info, "routing_key", &m->routing_key, err);
    if (rc < 0)
        return rc;

    v = get(props, "delivery_mode");
    if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 255)
        m->delivery_mode = (int)v->valuedouble;
    m->priority = priority_of(get(props, "priority"));
    if (cJSON_IsTrue(info ? get(info, "redelivered") : NULL))
        m->redelivered = 1;
    if (cJSON_IsObject(headers)) {
        if (cJSON_IsTrue(get(headers, "redelivered")))
            m->redelivered = 1;
        cJSON_DetachItemViaPointer(root, headers);
        m->headers = headers;
    }
    return 0;
}

int kombu_msg_decode(struct kombu_msg *m, const char *env, size_t len,
                     size_t max_body_bytes, struct cr_err *err)
{
    return kombu_msg_decode_flags(m, env, len, max_body_bytes, 0, err);
}

int kombu_msg_decode_flags(struct kombu_msg *m, const char *env, size_t len,
                           size_t max_body_bytes, unsigned flags, struct cr_err *err)
{
    cJSON *root = NULL;
    int rc;
    memset(m, 0, sizeof *m);
    rc = py_json_parse(env, len, &root, err);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0)
        return cr_err_set(err, CR_EDECODE, "envelope is not JSON: %s",
                          err ? err->msg : "");
    rc = decode_tree(m, root, max_body_bytes, flags, err);
    cJSON_Delete(root);
    if (rc < 0)
        kombu_msg_release(m);
    return rc;
}

static int put_key(struct buf *out, const char *key)
{
    int rc = py_json_string(out, key);
    return rc ? rc : buf_append(out, ": ", 2);
}

static int put_str_member(struct buf *out, const char *key, const char *val, int comma)
{
    int rc = comma ? buf_append(out, ", ", 2) : 0;
    if (rc == 0)
        rc = put_key(out, key);
    return rc ? rc : py_json_string(out, val ? val : "");
}

int kombu_msg_encode(const struct outbound *o, const char *delivery_tag, struct buf *out)
{
    size_t start = out->len;
    int comma = 0;
    int prio = o->priority < 0 ? 0 : o->priority > 9 ? 9 : o->priority;
    int rc = buf_puts(out, "{\"body\": \"");

    /* kombu's order: prepare_message() builds body, content-encoding,
     * content-type, headers, properties; the properties dict holds what the
     * caller passed (Celery: correlation_id, reply_to), then delivery_mode and
     * expiration (Producer.publish), delivery_info and priority
     * (prepare_message), body_encoding and delivery_tag (basic_publish). */
    if (rc == 0)
        rc = base64_encode(o->body, o->body ? o->body_len : 0, out);
    if (rc == 0)
        rc = buf_putc(out, '"');
    if (rc == 0)
        rc = put_str_member(out, "content-encoding",
                            o->content_encoding ? o->content_encoding : "utf-8", 1);
    if (rc == 0)
        rc = put_str_member(out, "content-type",
                            o->content_type ? o->content_type : "application/json", 1);
    if (rc == 0)
        rc = buf_puts(out, ", \"headers\": ");
    if (rc == 0)
        rc = o->headers ? py_json_dumps(o->headers, out) : buf_puts(out, "{}");
    if (rc == 0)
        rc = buf_puts(out, ", \"properties\": {");
    if (rc == 0 && o->correlation_id) {
        rc = put_str_member(out, "correlation_id", o->correlation_id, comma);
        comma = 1;
    }
    if (rc == 0 && o->reply_to) {
        rc = put_str_member(out, "reply_to", o->reply_to, comma);
        comma = 1;
    }
    if (rc == 0)
        rc = buf_printf(out, "%s\"delivery_mode\": %d", comma ? ", " : "",
                        o->delivery_mode ? o->delivery_mode : 2);
    if (rc == 0 && o->expiration)
        rc = put_str_member(out, "expiration", o->expiration, 1);
    if (rc == 0)
        rc = buf_puts(out, ", \"delivery_info\": {");
    if (rc == 0)
        rc = put_str_member(out, "exchange", o->exchange, 0);
    if (rc == 0)
        rc = put_str_member(out, "routing_key", o->routing_key, 1);
    if (rc == 0)
        rc = buf_printf(out, "}, \"priority\": %d, \"body_encoding\": \"base64\"", prio);
    if (rc == 0)
        rc = put_str_member(out, "delivery_tag", delivery_tag, 1);
    if (rc == 0)
        rc = buf_puts(out, "}}");
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

/* Sets obj[key] = true where kombu's dict assignment would: in place when the
 * key is there (later duplicates dropped, as json.loads keeps one), else at
 * the end. */
static int set_true(cJSON *obj, const char *key)
{
    cJSON *t, *it, *next, *first = NULL;
    for (it = obj->child; it; it = next) {
        next = it->next;
        if (!it->string || strcmp(it->string, key) != 0)
            continue;
        if (!first)
            first = it;
        else
            cJSON_Delete(cJSON_DetachItemViaPointer(obj, it));
    }
    t = cJSON_CreateTrue();
    if (!t)
        return CR_ENOMEM;
    /* cJSON 1.7.15's ReplaceItemInObject ignores a failed name copy, so the
     * name is set here. */
    t->string = first ? cr_strdup(key) : NULL;
    if ((first && !t->string) || (first ? !cJSON_ReplaceItemViaPointer(obj, first, t)
                                        : !cJSON_AddItemToObject(obj, key, t))) {
        cJSON_Delete(t);
        return CR_ENOMEM;
    }
    return 0;
}

int kombu_mark_redelivered(const char *env, size_t len, struct buf *out,
                           struct cr_err *err)
{
    cJSON *root = NULL, *h, *p, *info;
    size_t start = out->len;
    int rc = py_json_parse(env, len, &root, err);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0)
        return cr_err_set(err, CR_EDECODE, "envelope is not JSON: %s",
                          err ? err->msg : "");
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cr_err_set(err, CR_EDECODE, "envelope is not a JSON object");
    }
    /* kombu sets headers first and stops at the first missing level
     * (KeyError); a non-object there would make kombu drop the message, so it
     * is treated as missing and the envelope goes back as it was. */
    h = cJSON_GetObjectItemCaseSensitive(root, "headers");
    if (cJSON_IsObject(h)) {
        rc = set_true(h, "redelivered");
        p = cJSON_GetObjectItemCaseSensitive(root, "properties");
        info = cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, "delivery_info")
                                 : NULL;
        if (rc == 0 && cJSON_IsObject(info))
            rc = set_true(info, "redelivered");
    }
    if (rc == 0)
        rc = py_json_dumps(root, out);
    cJSON_Delete(root);
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

/* Trims the four JSON whitespace bytes around s[0..*n). */
static const char *trim(const char *s, size_t *n)
{
    while (*n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) {
        s++;
        (*n)--;
    }
    while (*n && (s[*n - 1] == ' ' || s[*n - 1] == '\t' || s[*n - 1] == '\n' ||
                  s[*n - 1] == '\r'))
        (*n)--;
    return s;
}

int kombu_unacked_encode(const char *env, size_t len, const char *exchange,
                         const char *routing_key, struct buf *out, struct cr_err *err)
{
    struct py_json_scan sc;
    size_t start = out->len;
    int rc;
    /* The envelope is embedded as it was popped: kombu writes it back with
     * json.dumps, which gives the same bytes for what kombu wrote, and the
     * text keeps integers beyond a double's precision exact. */
    env = trim(env, &len);
    py_json_scan_init(&sc, env, len);
    if (len == 0 || env[0] != '{' || py_json_scan_text(&sc) < 0)
        return cr_err_set(err, CR_EDECODE, "envelope is not a JSON object: %s",
                          sc.why ? sc.why : "empty");
    rc = buf_putc(out, '[');
    if (rc == 0)
        rc = buf_append(out, env, len);
    if (rc == 0)
        rc = buf_append(out, ", ", 2);
    if (rc == 0)
        rc = py_json_string(out, exchange ? exchange : "");
    if (rc == 0)
        rc = buf_append(out, ", ", 2);
    if (rc == 0)
        rc = py_json_string(out, routing_key ? routing_key : "");
    if (rc == 0)
        rc = buf_putc(out, ']');
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

struct unacked_scan {
    const char *env;
    size_t env_len;
    struct py_json_str str[2];
    int isnull[2];
    int bad;
};

static int unacked_elem(struct py_json_scan *sc, size_t index, void *privdata)
{
    struct unacked_scan *u = privdata;
    size_t at = sc->pos;
    if (at >= sc->len)
        return 1;
    if (index > 2) {
        u->bad = 1;
        return 1;
    }
    if (index == 0) {
        if (sc->s[at] != '{') {
            u->bad = 1;
            return 1;
        }
        if (py_json_scan_value(sc) < 0)
            return 1;
        u->env = sc->s + at;
        u->env_len = sc->pos - at;
        return 0;
    }
    /* kombu routes a restore with None as the nameless exchange: null reads "". */
    if (sc->s[at] == 'n') {
        u->isnull[index - 1] = 1;
        return py_json_scan_literal(sc, "null") < 0;
    }
    if (sc->s[at] != '"') {
        u->bad = 1;
        return 1;
    }
    return py_json_scan_string(sc, &u->str[index - 1]) < 0;
}

static char *unescape_new(const struct py_json_str *s, int isnull)
{
    char *p;
    if (isnull)
        return cr_strdup("");
    p = cr_malloc(s->len + 1);
    if (!p)
        return NULL;
    py_json_unescape(s, p);
    p[s->len] = '\0';
    return p;
}

int kombu_unacked_decode(const char *value, size_t len, char **env, char **exchange,
                         char **routing_key, struct cr_err *err)
{
    struct py_json_scan sc;
    struct unacked_scan u;
    char *e = NULL, *x = NULL, *r = NULL;

    *env = *exchange = *routing_key = NULL;
    memset(&u, 0, sizeof u);
    py_json_scan_init(&sc, value, len);
    py_json_skip_ws(&sc);
    if (sc.pos >= len || value[sc.pos] != '[' ||
        py_json_scan_array(&sc, unacked_elem, &u) < 0)
        return cr_err_set(err, CR_EDECODE,
                          "unacked entry is not [envelope, exchange, "
                          "routing_key]");
    py_json_skip_ws(&sc);
    if (sc.pos != len || !u.env || (!u.str[1].p && !u.isnull[1]))
        return cr_err_set(err, CR_EDECODE,
                          "unacked entry is not [envelope, exchange, "
                          "routing_key]");
    e = cr_strndup(u.env, u.env_len);
    x = unescape_new(&u.str[0], u.isnull[0]);
    r = unescape_new(&u.str[1], u.isnull[1]);
    if (!e || !x || !r) {
        cr_free(e);
        cr_free(x);
        cr_free(r);
        return CR_ENOMEM;
    }
    *env = e;
    *exchange = x;
    *routing_key = r;
    return 0;
}

/* ------------------------------------------------------------ priorities */

static int clamp9(int p)
{
    return p < 0 ? 0 : p > KOMBU_PRIORITY_MAX ? KOMBU_PRIORITY_MAX : p;
}

int kombu_bucket(const struct kombu_opts *o, int priority)
{
    int p = clamp9(priority), b = o->nsteps > 0 ? o->steps[0] : 0;
    for (int i = 0; i < o->nsteps; i++)
        if (o->steps[i] <= p)
            b = o->steps[i];
    return b;
}

int kombu_to_engine_priority(int kombu_priority)
{
    return KOMBU_PRIORITY_MAX - clamp9(kombu_priority);
}

int kombu_from_engine_priority(int engine_priority)
{
    return KOMBU_PRIORITY_MAX - clamp9(engine_priority);
}

/* ------------------------------------------------------------ names */

int kombu_queue_key(const struct kombu_opts *o, const char *queue, int bucket,
                    struct buf *out)
{
    size_t start = out->len;
    int rc = buf_puts(out, o->keyprefix);
    if (rc == 0)
        rc = buf_puts(out, queue);
    if (rc == 0 && bucket != 0)
        rc = buf_printf(out, "%s%d", o->sep, bucket);
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

static int has_prefix(const char *s, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(s, prefix, n) == 0;
}

int kombu_queue_of_key(const struct kombu_opts *o, const char *key, size_t len, char *out,
                       size_t out_size)
{
    size_t plen = strlen(o->keyprefix), seplen = strlen(o->sep), n;
    const char *q;
    if (!has_prefix(key, len, o->keyprefix))
        return CR_EINVAL;
    q = key + plen;
    n = len - plen;
    /* kombu splits at the last sep whatever follows; only a step's suffix is
     * cut here, so a queue whose own name holds sep keeps it. */
    if (seplen && n > seplen) {
        for (size_t i = n - seplen; i-- > 0;) {
            if (memcmp(q + i, o->sep, seplen) != 0)
                continue;
            const char *suf = q + i + seplen;
            size_t slen = n - i - seplen;
            for (int s = 0; s < o->nsteps; s++) {
                char num[4];
                int k = snprintf(num, sizeof num, "%d", o->steps[s]);
                if (o->steps[s] != 0 && (size_t)k == slen &&
                    memcmp(suf, num, slen) == 0) {
                    n = i;
                    break;
                }
            }
            break;
        }
    }
    if (n + 1 > out_size)
        return CR_EINVAL;
    memcpy(out, q, n);
    out[n] = '\0';
    return 0;
}

/* Python's repr of a float, for the BRPOP timeout: shortest digits that read
 * back, and an integer with no fraction ("1"), as kombu sends an int. */
static void fmt_timeout(double t, char *dst, size_t size)
{
    if (!(t > 0) || t > 1e15) {
        snprintf(dst, size, "%s", t > 1e15 ? "1000000000000000" : "0");
        return;
    }
    if (t == floor(t)) {
        snprintf(dst, size, "%.0f", t);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(dst, size, "%.*g", prec, t);
        if (strtod(dst, NULL) == t)
            return;
    }
}

int kombu_brpop_args(const struct kombu_opts *o, const char *const *queues, int n_queues,
                     double timeout_s, struct buf *store, const char **argv,
                     size_t *argvlen, int max_args)
{
    size_t start = store->len;
    size_t offs[2 + KOMBU_MAX_STEPS * 64];
    size_t *off = offs;
    int nargs = n_queues * o->nsteps + 2, k = 0, rc;
    char tbuf[32];

    if (n_queues < 0 || nargs > max_args)
        return CR_ERANGE;
    /* Offsets first: store may move while it grows. */
    if ((size_t)nargs > sizeof offs / sizeof offs[0]) {
        off = cr_malloc((size_t)nargs * sizeof *off);
        if (!off)
            return CR_ENOMEM;
    }
    off[k++] = store->len;
    rc = buf_append(store, "BRPOP", 6);
    for (int s = 0; s < o->nsteps && rc == 0; s++)
        for (int q = 0; q < n_queues && rc == 0; q++) {
            off[k++] = store->len;
            rc = kombu_queue_key(o, queues[q], o->steps[s], store);
            if (rc == 0)
                rc = buf_putc(store, '\0');
        }
    fmt_timeout(timeout_s, tbuf, sizeof tbuf);
    if (rc == 0) {
        off[k++] = store->len;
        rc = buf_append(store, tbuf, strlen(tbuf) + 1);
    }
    if (rc < 0) {
        store->len = start;
        if (store->data)
            store->data[start] = '\0';
    } else {
        for (int i = 0; i < k; i++) {
            argv[i] = store->data + off[i];
            argvlen[i] = strlen(argv[i]);
        }
        rc = k;
    }
    if (off != offs)
        cr_free(off);
    return rc;
}

void kombu_rotate(const struct kombu_opts *o, const char **queues, int n_queues,
                  const char *queue)
{
    if (o->order != KOMBU_ORDER_ROUND_ROBIN)
        return;
    for (int i = 0; i < n_queues; i++) {
        if (strcmp(queues[i], queue) != 0)
            continue;
        const char *q = queues[i];
        memmove(queues + i, queues + i + 1, (size_t)(n_queues - i - 1) * sizeof *queues);
        queues[n_queues - 1] = q;
        return;
    }
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void kombu_initial_order(const struct kombu_opts *o, const char **queues, int n_queues)
{
    if (o->order == KOMBU_ORDER_SORTED && n_queues > 1)
        qsort(queues, (size_t)n_queues, sizeof *queues, cmp_str);
}

int kombu_binding_key(const struct kombu_opts *o, const char *exchange, struct buf *out)
{
    return buf_printf(out, "%s_kombu.binding.%s", o->keyprefix, exchange);
}

int kombu_binding_member(const struct kombu_opts *o, const char *routing_key,
                         const char *pattern, const char *queue, struct buf *out)
{
    return buf_printf(out, "%s%s%s%s%s", routing_key ? routing_key : "", o->sep,
                      pattern ? pattern : "", o->sep, queue ? queue : "");
}

static const char *find_sep(const char *s, size_t len, const char *sep, size_t seplen)
{
    for (size_t i = 0; seplen && i + seplen <= len; i++)
        if (memcmp(s + i, sep, seplen) == 0)
            return s + i;
    return NULL;
}

int kombu_binding_parse(const struct kombu_opts *o, const char *member, size_t len,
                        const char **routing_key, size_t *rk_len, const char **pattern,
                        size_t *pattern_len, const char **queue, size_t *queue_len)
{
    size_t seplen = strlen(o->sep);
    const char *end = member + len, *a, *b;
    a = find_sep(member, len, o->sep, seplen);
    if (!a)
        return CR_EDECODE;
    b = find_sep(a + seplen, (size_t)(end - a - seplen), o->sep, seplen);
    if (!b || find_sep(b + seplen, (size_t)(end - b - seplen), o->sep, seplen))
        return CR_EDECODE;
    *routing_key = member;
    *rk_len = (size_t)(a - member);
    *pattern = a + seplen;
    *pattern_len = (size_t)(b - a - seplen);
    *queue = b + seplen;
    *queue_len = (size_t)(end - b - seplen);
    return 0;
}

/* ------------------------------------------------------------ topics */

int kombu_topic_pattern(const char *binding_key, struct buf *out)
{
    size_t start = out->len;
    const char *w = binding_key;
    int rc = buf_putc(out, '^');
    /* key_to_pattern: escape (alphanumerics, '.', '#' and '*' stay), split
     * at '.', turn a word that is exactly '*' or '#' into its regex, join
     * with "\.". Escaping first cannot add a '.', so splitting the key is the
     * same as splitting the escaped text. */
    while (rc == 0) {
        const char *e = strchr(w, '.');
        size_t n = e ? (size_t)(e - w) : strlen(w);
        if (n == 1 && *w == '*') {
            rc = buf_puts(out, ".*?[^\\.]");
        } else if (n == 1 && *w == '#') {
            rc = buf_puts(out, ".*?");
        } else {
            for (size_t i = 0; i < n && rc == 0; i++) {
                unsigned char c = (unsigned char)w[i];
                /* Non-ASCII stays as it is: str.isalnum() holds for letters
                 * and digits of every script, and an escaped non-ASCII
                 * character means itself to re either way. */
                if (isalnum(c) || c == '#' || c == '*' || c >= 0x80)
                    rc = buf_putc(out, (char)c);
                else
                    rc = buf_printf(out, "\\%c", c);
            }
        }
        if (rc || !e)
            break;
        rc = buf_puts(out, "\\.");
        w = e + 1;
    }
    if (rc == 0)
        rc = buf_putc(out, '$');
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

enum tok_kind { TK_LIT, TK_ANY, TK_NOTDOT };

struct tok {
    uint32_t c;       /* TK_LIT: the code point */
    unsigned char k;  /* enum tok_kind */
    unsigned char st; /* repeated zero or more times */
};

/* Code points of s (strict UTF-8), at most max; -1 when invalid or longer. */
static int code_points(const char *s, size_t len, uint32_t *cp, int max)
{
    int n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = py_utf8_next(s + i, len - i, &cp[n]);
        if (k == 0 || n == max)
            return -1;
        i += k;
        n++;
    }
    return n;
}

/* The binding key as the regex kombu builds reads it: a '*' inside a word
 * repeats the character before it (a word starting with '*' repeats the
 * escaped dot before it); '*' with nothing to repeat, or after another '*',
 * does not compile in Python, so such a key matches nothing. */
static int tokens(const uint32_t *k, int n, struct tok *t, int max)
{
    int nt = 0, ws = 0;
    while (ws <= n) {
        int we = ws;
        while (we < n && k[we] != '.')
            we++;
        if (we - ws == 1 && k[ws] == '*') {
            t[nt++] = (struct tok){0, TK_ANY, 1};
            t[nt++] = (struct tok){0, TK_NOTDOT, 0};
        } else if (we - ws == 1 && k[ws] == '#') {
            t[nt++] = (struct tok){0, TK_ANY, 1};
        } else {
            for (int i = ws; i < we; i++) {
                if (k[i] == '*') {
                    if (nt == 0 || t[nt - 1].st)
                        return -1;
                    t[nt - 1].st = 1;
                } else {
                    t[nt++] = (struct tok){k[i], TK_LIT, 0};
                }
            }
        }
        if (we == n)
            break;
        if (nt + 3 > max)
            return -1;
        t[nt++] = (struct tok){'.', TK_LIT, 0};
        ws = we + 1;
    }
    return nt;
}

static int tok_eats(const struct tok *t, uint32_t c)
{
    switch (t->k) {
    case TK_LIT:
        return t->c == c;
    case TK_ANY:
        return c != '\n';
    default:
        return c != '.';
    }
}

/* Follows the zero-repeat moves: a state before a starred token may also be
 * after it. */
static void closure(unsigned char *set, const struct tok *t, int nt)
{
    for (int i = 0; i < nt; i++)
        if (set[i] && t[i].st)
            set[i + 1] = 1;
}

int kombu_topic_match(const char *binding_key, size_t bk_len, const char *routing_key,
                      size_t rk_len)
{
    uint32_t bk[KOMBU_NAME_MAX], rk[KOMBU_NAME_MAX];
    struct tok t[2 * KOMBU_NAME_MAX + 2];
    unsigned char cur[2 * KOMBU_NAME_MAX + 3], nxt[2 * KOMBU_NAME_MAX + 3];
    int nb, nr, nt, any;

    if (bk_len > KOMBU_NAME_MAX || rk_len > KOMBU_NAME_MAX)
        return 0;
    nb = code_points(binding_key, bk_len, bk, KOMBU_NAME_MAX);
    nr = code_points(routing_key, rk_len, rk, KOMBU_NAME_MAX);
    if (nb < 0 || nr < 0)
        return 0;
    nt = tokens(bk, nb, t, (int)(sizeof t / sizeof t[0]));
    if (nt < 0)
        return 0;
    /* A set of positions in the token list, advanced one code point at a
     * time: O(nt * nr), no backtracking. */
    memset(cur, 0, (size_t)nt + 1);
    cur[0] = 1;
    closure(cur, t, nt);
    for (int i = 0; i < nr; i++) {
        /* '$' also matches before a final newline. */
        if (i == nr - 1 && rk[i] == '\n' && cur[nt])
            return 1;
        memset(nxt, 0, (size_t)nt + 1);
        any = 0;
        for (int s = 0; s < nt; s++) {
            if (!cur[s] || !tok_eats(&t[s], rk[i]))
                continue;
            any = 1;
            if (t[s].st)
                nxt[s] = 1;
            else
                nxt[s + 1] = 1;
        }
        if (!any)
            return 0;
        closure(nxt, t, nt);
        memcpy(cur, nxt, (size_t)nt + 1);
    }
    return cur[nt];
}

/* ------------------------------------------------------------ fanout */

/* The fanout prefix formatted for db; db < 0 leaves "{db}" as it is, the
 * spelling kombu < 5.4 uses on Sentinel. */
static int put_fanout_prefix(const struct kombu_opts *o, int db, struct buf *out)
{
    const char *s;
    int rc = 0;
    if (o->fanout_prefix == 0)
        return 0;
    s = o->fanout_prefix == 1 || !o->fanout_prefix_str[0] ? "/{db}."
                                                          : o->fanout_prefix_str;
    for (; *s && rc == 0; s++) {
        if (strncmp(s, "{db}", 4) == 0) {
            rc = db < 0 ? buf_puts(out, "{db}") : buf_printf(out, "%d", db);
            s += 3;
        } else if ((*s == '{' && s[1] == '{') || (*s == '}' && s[1] == '}')) {
            rc = buf_putc(out, *s);
            s++;
        } else {
            rc = buf_putc(out, *s);
        }
    }
    return rc;
}

static int channel_of(const struct kombu_opts *o, int db, const char *exchange,
                      const char *rk, int star, struct buf *out)
{
    size_t start = out->len;
    int rc = buf_puts(out, o->keyprefix);
    if (rc == 0)
        rc = put_fanout_prefix(o, db, out);
    if (rc == 0)
        rc = buf_puts(out, exchange);
    if (rc == 0 && rk && *rk && o->fanout_patterns) {
        rc = buf_putc(out, '/');
        for (; *rk && rc == 0; rk++)
            rc = buf_putc(out, star && *rk == '#' ? '*' : *rk);
    }
    if (rc < 0) {
        out->len = start;
        if (out->data)
            out->data[start] = '\0';
    }
    return rc;
}

int kombu_channel(const struct kombu_opts *o, int db, const char *exchange,
                  const char *routing_key, struct buf *out)
{
    return channel_of(o, db, exchange, routing_key, 0, out);
}

int kombu_channel_pattern(const struct kombu_opts *o, int db, const char *exchange,
                          const char *binding_key, struct buf *out)
{
    return channel_of(o, db, exchange, binding_key, 1, out);
}

int kombu_channel_parse(const struct kombu_opts *o, const char *channel, size_t len,
                        char *exchange, size_t exchange_size, char *routing_key,
                        size_t rk_size)
{
    size_t plen = strlen(o->keyprefix), n, x;
    const char *c, *slash;
    if (!has_prefix(channel, len, o->keyprefix))
        return CR_EINVAL;
    c = channel + plen;
    n = len - plen;
    if (n > 0 && c[0] == '/') {
        const char *dot = memchr(c, '.', n);
        /* str.partition leaves nothing when there is no '.'. */
        if (!dot)
            return CR_EINVAL;
        n -= (size_t)(dot + 1 - c);
        c = dot + 1;
    }
    slash = memchr(c, '/', n);
    x = slash ? (size_t)(slash - c) : n;
    if (x == 0 || x + 1 > exchange_size)
        return CR_EINVAL;
    memcpy(exchange, c, x);
    exchange[x] = '\0';
    n = slash ? n - x - 1 : 0;
    if (n + 1 > rk_size)
        return CR_EINVAL;
    if (n)
        memcpy(routing_key, slash + 1, n);
    routing_key[n] = '\0';
    return 0;
}

/* ------------------------------------------------------------ restore */

int kombu_restore_due(const struct kombu_opts *o, double score, double now_s)
{
    /* ZREVRANGEBYSCORE key (now - timeout) 0: both ends inclusive. */
    return score >= 0 && score <= now_s - o->visibility_timeout_s;
}

void kombu_msg_outbound(const struct kombu_msg *m, struct outbound *o)
{
    memset(o, 0, sizeof(*o));
    o->body = m->body;
    o->body_len = m->body_len;
    o->content_type = m->content_type;
    o->content_encoding = m->content_encoding;
    o->headers = m->headers;
    o->correlation_id = m->correlation_id;
    o->reply_to = m->reply_to;
    o->expiration = m->expiration && *m->expiration ? m->expiration : NULL;
    o->delivery_mode = m->delivery_mode;
    o->priority = m->priority;
    o->exchange = m->exchange;
    o->routing_key = m->routing_key;
}

/* An empty kombu string is an absent property. */
static char *take_opt(char **s)
{
    char *v = *s;
    *s = NULL;
    if (v && !*v) {
        cr_free(v);
        return NULL;
    }
    return v;
}

void kombu_msg_move_to(struct kombu_msg *m, struct delivery *d)
{
    d->redelivered = d->redelivered || m->redelivered;
    d->exchange = m->exchange;
    m->exchange = NULL;
    d->routing_key = m->routing_key;
    m->routing_key = NULL;
    d->content_type = take_opt(&m->content_type);
    d->content_encoding = take_opt(&m->content_encoding);
    d->correlation_id = take_opt(&m->correlation_id);
    d->reply_to = take_opt(&m->reply_to);
    d->expiration = take_opt(&m->expiration);
    d->delivery_mode = m->delivery_mode;
    d->wire_priority = m->priority;
    d->headers = m->headers;
    m->headers = NULL;
    d->body = m->body;
    d->body_len = m->body_len;
    m->body = NULL;
}
