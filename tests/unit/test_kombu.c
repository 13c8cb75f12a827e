/* test_kombu.c -- the Redis transport's wire codec against what kombu 5.2.4 and
 * celery 5.2.6 wrote on a real Redis (tests/fixtures/kombu/capture.py):
 * envelopes decoded and re-encoded byte for byte, unacked values, binding
 * members, BRPOP and channel names, topic matching against Python's re; plus
 * options, names, malformed input and an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/kombu.h"
#include "protocol/pyjson.h"
#include "unit.h"
#include "util/alloc.h"

#define FX "tests/fixtures/kombu/"
/* A string literal and its length. */
#define S(lit) lit, strlen(lit)

static const char *const env_names[] = {"plain", "prio7",   "prio9", "eta",
                                        "other", "topic",   "reply", "broadcast",
                                        "event", "restored"};
#define N_ENVS ((int)(sizeof env_names / sizeof *env_names))

static cJSON *load_json(const char *path)
{
    size_t len;
    char *text = unit_read_file(path, &len);
    cJSON *v = NULL;
    ck_assert_int_eq(py_json_parse(text, len, &v, NULL), 0);
    free(text);
    return v;
}

static char *load_env(const char *name, size_t *len)
{
    char path[128];
    snprintf(path, sizeof path, FX "env_%s.json", name);
    return unit_read_file(path, len);
}

static const char *jstr(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static char *dump(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return buf_detach(&b);
}

static struct kombu_opts dflt(void)
{
    struct kombu_opts o;
    kombu_opts_init(&o);
    return o;
}

/* ---- envelopes ----------------------------------------------------------- */

START_TEST(test_decode_fixture)
{
    const char *name = env_names[_i];
    cJSON *expect = load_json(FX "expect.json");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(expect, name);
    struct kombu_msg m;
    struct cr_err err = {0, ""};
    size_t len;
    char *env = load_env(name, &len);

    ck_assert_ptr_nonnull(e);
    ck_assert_msg(kombu_msg_decode(&m, env, len, 0, &err) == 0, "%s: %s", name, err.msg);
    ck_assert_str_eq(m.body, jstr(e, "body"));
    ck_assert_uint_eq(m.body_len, strlen(jstr(e, "body")));
    ck_assert_str_eq(m.content_type, jstr(e, "content_type"));
    ck_assert_str_eq(m.content_encoding, jstr(e, "content_encoding"));
    ck_assert_str_eq(m.correlation_id, jstr(e, "correlation_id"));
    ck_assert_str_eq(m.reply_to, jstr(e, "reply_to"));
    ck_assert_str_eq(m.expiration, jstr(e, "expiration"));
    ck_assert_str_eq(m.exchange, jstr(e, "exchange"));
    ck_assert_str_eq(m.routing_key, jstr(e, "routing_key"));
    ck_assert_str_eq(m.delivery_tag, jstr(e, "delivery_tag"));
    ck_assert_int_eq(m.delivery_mode,
                     cJSON_GetObjectItemCaseSensitive(e, "delivery_mode")->valueint);
    ck_assert_int_eq(m.priority,
                     cJSON_GetObjectItemCaseSensitive(e, "priority")->valueint);
    ck_assert_int_eq(m.redelivered,
                     cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "redelivered")));
    ck_assert_ptr_nonnull(m.headers);
    /* expect.json sorts keys; the order is checked by test_encode_fixture. */
    ck_assert(
        cJSON_Compare(m.headers, cJSON_GetObjectItemCaseSensitive(e, "headers"), 1));
    kombu_msg_release(&m);
    free(env);
    cJSON_Delete(expect);
}
END_TEST

static int encode_from(const struct kombu_msg *m, struct buf *out)
{
    struct outbound o;
    kombu_msg_outbound(m, &o);
    /* What kombu was given: Celery passes correlation_id and reply_to for
     * tasks, pidbox and events pass neither. */
    o.correlation_id = m->correlation_id[0] ? m->correlation_id : NULL;
    o.reply_to = m->correlation_id[0] ? m->reply_to : NULL;
    return kombu_msg_encode(&o, m->delivery_tag, out);
}

/* Every captured envelope comes out of our encoder byte for byte. */
START_TEST(test_encode_fixture)
{
    const char *name = env_names[_i];
    struct kombu_msg m;
    struct buf out;
    size_t len;
    char *env = load_env(name, &len);

    if (strcmp(name, "restored") == 0) {
        free(env);
        return;
    }
    ck_assert_int_eq(kombu_msg_decode(&m, env, len, 0, NULL), 0);
    buf_init(&out);
    ck_assert_int_eq(encode_from(&m, &out), 0);
    ck_assert_str_eq(out.data, env);
    buf_release(&out);
    kombu_msg_release(&m);
    free(env);
}
END_TEST

/* kombu's restore of the held eta message is exactly our redelivered copy. */
START_TEST(test_mark_redelivered)
{
    size_t elen, rlen;
    char *eta = load_env("eta", &elen), *restored = load_env("restored", &rlen);
    struct buf out;
    struct kombu_msg m;
    buf_init(&out);
    ck_assert_int_eq(kombu_mark_redelivered(eta, elen, &out, NULL), 0);
    ck_assert_str_eq(out.data, restored);
    ck_assert_int_eq(kombu_msg_decode(&m, out.data, out.len, 0, NULL), 0);
    ck_assert_int_eq(m.redelivered, 1);
    kombu_msg_release(&m);
    /* Twice: the key is kept in place, not repeated. */
    buf_reset(&out);
    ck_assert_int_eq(kombu_mark_redelivered(restored, rlen, &out, NULL), 0);
    ck_assert_str_eq(out.data, restored);
    buf_reset(&out);
    ck_assert_int_eq(kombu_mark_redelivered("{\"properties\": {}}", 18, &out, NULL), 0);
    ck_assert_str_eq(out.data, "{\"properties\": {}}");
    buf_reset(&out);
    ck_assert_int_eq(
        kombu_mark_redelivered(
            S("{\"headers\":{\"redelivered\":false,\"redelivered\":0}}"), &out, NULL),
        0);
    ck_assert_str_eq(out.data, "{\"headers\": {\"redelivered\": true}}");
    buf_reset(&out);
    ck_assert_int_eq(kombu_mark_redelivered("[1]", 3, &out, NULL), CR_EDECODE);
    ck_assert_int_eq(kombu_mark_redelivered("{", 1, &out, NULL), CR_EDECODE);
    ck_assert_uint_eq(out.len, 0);
    buf_release(&out);
    free(eta);
    free(restored);
}
END_TEST

START_TEST(test_unacked_fixture)
{
    cJSON *u = load_json(FX "unacked.json"), *it;
    const cJSON *vals = cJSON_GetObjectItemCaseSensitive(u, "values");
    size_t elen;
    char *eta = load_env("eta", &elen);
    int n = 0;
    cJSON_ArrayForEach(it, vals)
    {
        char *env, *ex, *rk;
        struct buf out;
        struct kombu_msg m;
        struct cr_err err = {0, ""};
        const char *v = it->valuestring;
        ck_assert_int_eq(kombu_unacked_decode(v, strlen(v), &env, &ex, &rk, &err), 0);
        ck_assert_str_eq(env, eta);
        ck_assert_str_eq(ex, "");
        ck_assert_str_eq(rk, "celery");
        ck_assert_int_eq(kombu_msg_decode(&m, env, strlen(env), 0, NULL), 0);
        ck_assert_str_eq(m.delivery_tag, it->string);
        kombu_msg_release(&m);
        buf_init(&out);
        ck_assert_int_eq(kombu_unacked_encode(env, strlen(env), ex, rk, &out, NULL), 0);
        ck_assert_str_eq(out.data, v);
        buf_release(&out);
        cr_free(env);
        cr_free(ex);
        cr_free(rk);
        n++;
    }
    ck_assert_int_eq(n, 1);
    free(eta);
    cJSON_Delete(u);
}
END_TEST

START_TEST(test_unacked_bad)
{
    static const char *const bad[] = {
        "",
        "[]",
        "[{}]",
        "[{}, \"\"]",
        "[{}, \"\", \"\", \"\"]",
        "[\"{}\", \"\", \"\"]",
        "[{}, 1, \"\"]",
        "[{}, \"\", []]",
        "{\"a\": 1}",
        "[{}, \"\", \"x\"] x",
        "[{\"a\": }, \"\", \"\"]",
        "[{}, \"\", \"",
        "[[], \"\", \"\"]",
        "[",
        "[{}, ",
        " [ ",
    };
    char *env, *ex, *rk;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_msg(kombu_unacked_decode(bad[i], strlen(bad[i]), &env, &ex, &rk,
                                           NULL) == CR_EDECODE,
                      "%s", bad[i]);
        ck_assert_ptr_null(env);
    }
    ck_assert_int_eq(kombu_unacked_decode(S(" [ {\"a\" : 1} , null, \"r\\u00e9\" ] "),
                                          &env, &ex, &rk, NULL),
                     0);
    ck_assert_str_eq(env, "{\"a\" : 1}");
    ck_assert_str_eq(ex, "");
    ck_assert_str_eq(rk, "r\xc3\xa9");
    cr_free(env);
    cr_free(ex);
    cr_free(rk);
    {
        struct buf out;
        buf_init(&out);
        ck_assert_int_eq(kombu_unacked_encode("[1]", 3, "", "", &out, NULL), CR_EDECODE);
        ck_assert_int_eq(kombu_unacked_encode("{", 1, "", "", &out, NULL), CR_EDECODE);
        ck_assert_int_eq(kombu_unacked_encode(" {} ", 4, "x\"", NULL, &out, NULL), 0);
        ck_assert_str_eq(out.data, "[{}, \"x\\\"\", \"\"]");
        buf_release(&out);
    }
}
END_TEST

/* Every truncation of every fixture: 0 or a clean error, no leak. */
START_TEST(test_truncations)
{
    size_t len;
    char *env = load_env(env_names[_i], &len);
    for (size_t n = 0; n < len; n++) {
        struct kombu_msg m;
        struct cr_err err = {0, ""};
        char *copy = malloc(n + 1), *e, *x, *r;
        struct buf out;
        memcpy(copy, env, n);
        ck_assert_int_eq(kombu_msg_decode(&m, copy, n, 0, &err), CR_EDECODE);
        ck_assert_ptr_null(m.body);
        buf_init(&out);
        ck_assert_int_eq(kombu_mark_redelivered(copy, n, &out, NULL), CR_EDECODE);
        ck_assert_int_lt(kombu_unacked_encode(copy, n, "", "", &out, NULL), 0);
        buf_release(&out);
        ck_assert_int_lt(kombu_unacked_decode(copy, n, &e, &x, &r, NULL), 0);
        free(copy);
    }
    free(env);
}
END_TEST

/* Each field of a real envelope swapped for each JSON kind. */
START_TEST(test_kind_swaps)
{
    static const char *const paths[][3] = {
        {"body", NULL, NULL},
        {"content-type", NULL, NULL},
        {"content-encoding", NULL, NULL},
        {"headers", NULL, NULL},
        {"properties", NULL, NULL},
        {"properties", "correlation_id", NULL},
        {"properties", "reply_to", NULL},
        {"properties", "expiration", NULL},
        {"properties", "delivery_mode", NULL},
        {"properties", "priority", NULL},
        {"properties", "body_encoding", NULL},
        {"properties", "delivery_tag", NULL},
        {"properties", "delivery_info", NULL},
        {"properties", "delivery_info", "exchange"},
        {"properties", "delivery_info", "routing_key"},
        {"properties", "delivery_info", "redelivered"},
        {"headers", "redelivered", NULL},
    };
    static const char *const kinds[] = {"null", "true",  "false", "0",       "7.9",
                                        "-3",   "1e400", "\"\"",  "\"x\"",   "[]",
                                        "[1]",  "{}",    "\"7\"", "\"QQ==\""};
    size_t len;
    char *env = load_env("eta", &len);
    for (size_t p = 0; p < sizeof paths / sizeof *paths; p++)
        for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
            cJSON *root = NULL, *obj, *nv = NULL;
            struct kombu_msg m;
            struct cr_err err = {0, ""};
            char *text;
            int d = 0, rc;
            ck_assert_int_eq(py_json_parse(env, len, &root, NULL), 0);
            ck_assert_int_eq(py_json_parse(kinds[k], strlen(kinds[k]), &nv, NULL), 0);
            obj = root;
            while (d < 2 && paths[p][d + 1]) {
                obj = cJSON_GetObjectItemCaseSensitive(obj, paths[p][d]);
                d++;
            }
            if (cJSON_GetObjectItemCaseSensitive(obj, paths[p][d]))
                cJSON_ReplaceItemInObjectCaseSensitive(obj, paths[p][d], nv);
            else
                cJSON_AddItemToObject(obj, paths[p][d], nv);
            text = dump(root);
            rc = kombu_msg_decode(&m, text, strlen(text), 0, &err);
            ck_assert_msg(rc == 0 || rc == CR_EDECODE, "%s.%s=%s: %d", paths[p][0],
                          paths[p][d], kinds[k], rc);
            if (rc == 0) {
                ck_assert(m.priority >= 0 && m.priority <= 9);
                kombu_msg_release(&m);
            } else {
                ck_assert(err.msg[0]);
            }
            cr_free(text);
            cJSON_Delete(root);
        }
    free(env);
}
END_TEST

static int decode_str(const char *s, struct kombu_msg *m, size_t max)
{
    return kombu_msg_decode(m, s, strlen(s), max, NULL);
}

/* Without a delivery tag an envelope is refused, but with
 * KOMBU_DECODE_ANY_TAG (SQS), where it reads "". */
START_TEST(test_any_tag)
{
    static const char *const forms[] = {"{\"body\": \"\", \"properties\": {}}",
                                        "{\"body\": \"\", \"properties\": "
                                        "{\"delivery_tag\": null}}"};
    struct kombu_msg m;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kombu_msg_decode(&m, S(forms[i]), 0, NULL), CR_EDECODE);
        ck_assert_int_eq(
            kombu_msg_decode_flags(&m, S(forms[i]), 0, KOMBU_DECODE_ANY_TAG, NULL), 0);
        ck_assert_str_eq(m.delivery_tag, "");
        kombu_msg_release(&m);
    }
    ck_assert_int_eq(kombu_msg_decode_flags(&m,
                                            S("{\"properties\": {\"delivery_tag\": 1}}"),
                                            0, KOMBU_DECODE_ANY_TAG, NULL),
                     CR_EDECODE);
}
END_TEST

START_TEST(test_body_forms)
{
    static const char *const bad64[] = {"QQ=",  "Q===",  "QQ=A", "====",       "QQ==QQ==",
                                        "Q Q=", "QQ\n=", "QQ-_", "\xc3\xa9QQQ"};
    struct kombu_msg m;
    char env[256];
    for (size_t i = 0; i < sizeof bad64 / sizeof *bad64; i++) {
        snprintf(env, sizeof env,
                 "{\"body\": \"%s\", \"properties\": {\"body_encoding\": \"base64\", "
                 "\"delivery_tag\": \"t\"}}",
                 bad64[i]);
        ck_assert_msg(decode_str(env, &m, 0) == CR_EDECODE, "%s", bad64[i]);
    }
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJD\", \"properties\": {\"body_encoding\": "
                   "\"base64\", \"delivery_tag\": \"t\"}}",
                   &m, 0),
        0);
    ck_assert_str_eq(m.body, "ABC");
    ck_assert_ptr_null(m.headers);
    ck_assert_str_eq(m.exchange, "");
    kombu_msg_release(&m);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUI=\", \"properties\": {\"body_encoding\": "
                   "\"base64\", \"delivery_tag\": \"t\"}}",
                   &m, 2),
        0);
    ck_assert_str_eq(m.body, "AB");
    kombu_msg_release(&m);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJD\", \"properties\": {\"body_encoding\": "
                   "\"base64\", \"delivery_tag\": \"t\"}}",
                   &m, 2),
        CR_ETOOBIG);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJDRA==\", \"properties\": "
                   "{\"body_encoding\": \"base64\", \"delivery_tag\": \"t\"}}",
                   &m, 3),
        CR_ETOOBIG);
    /* Raw bodies: no body_encoding, null, or utf-8. */
    ck_assert_int_eq(decode_str("{\"body\": \"{\\\"a\\\": 1}\", \"properties\": "
                                "{\"delivery_tag\": \"t\"}}",
                                &m, 0),
                     0);
    ck_assert_str_eq(m.body, "{\"a\": 1}");
    kombu_msg_release(&m);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJD\", \"properties\": {\"body_encoding\": "
                   "\"utf-8\", \"delivery_tag\": \"t\"}}",
                   &m, 0),
        0);
    ck_assert_str_eq(m.body, "QUJD");
    kombu_msg_release(&m);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJD\", \"properties\": {\"body_encoding\": "
                   "null, \"delivery_tag\": \"t\"}}",
                   &m, 4),
        0);
    kombu_msg_release(&m);
    ck_assert_int_eq(decode_str("{\"body\": \"QUJD\", \"properties\": {\"delivery_tag\": "
                                "\"t\"}}",
                                &m, 2),
                     CR_ETOOBIG);
    ck_assert_int_eq(
        decode_str("{\"body\": \"QUJD\", \"properties\": {\"body_encoding\": "
                   "\"zlib\", \"delivery_tag\": \"t\"}}",
                   &m, 0),
        CR_EDECODE);
    ck_assert_int_eq(decode_str("{\"properties\": {\"delivery_tag\": \"t\"}}", &m, 0), 0);
    ck_assert_str_eq(m.body, "");
    ck_assert_uint_eq(m.body_len, 0);
    kombu_msg_release(&m);
    /* A NUL inside a decoded body is kept, its length says so. */
    ck_assert_int_eq(
        decode_str("{\"body\": \"AEE=\", \"properties\": {\"body_encoding\": "
                   "\"base64\", \"delivery_tag\": \"t\"}}",
                   &m, 0),
        0);
    ck_assert_uint_eq(m.body_len, 2);
    ck_assert_int_eq(m.body[1], 'A');
    kombu_msg_release(&m);
    ck_assert_int_eq(decode_str("{\"body\": \"\"}", &m, 0), CR_EDECODE);
    ck_assert_int_eq(decode_str("{\"properties\": {}}", &m, 0), CR_EDECODE);
    ck_assert_int_eq(decode_str("[]", &m, 0), CR_EDECODE);
    ck_assert_int_eq(decode_str("nope", &m, 0), CR_EDECODE);
}
END_TEST

START_TEST(test_priority_forms)
{
    static const struct {
        const char *v;
        int want;
    } cases[] = {{"0", 0},     {"7", 7},     {"9", 9},       {"12", 9},
                 {"-4", 0},    {"7.9", 7},   {"\"8\"", 8},   {"\" 3 \"", 3},
                 {"\"x\"", 0}, {"null", 0},  {"true", 1},    {"false", 0},
                 {"[]", 0},    {"1e400", 9}, {"\"3.5\"", 0}, {"\"-2\"", 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char env[128];
        struct kombu_msg m;
        snprintf(env, sizeof env,
                 "{\"properties\": {\"priority\": %s, \"delivery_tag\": 1}}", cases[i].v);
        ck_assert_int_eq(decode_str(env, &m, 0), CR_EDECODE); /* tag not a string */
        snprintf(env, sizeof env,
                 "{\"properties\": {\"priority\": %s, \"delivery_tag\": \"t\"}}",
                 cases[i].v);
        ck_assert_int_eq(decode_str(env, &m, 0), 0);
        ck_assert_msg(m.priority == cases[i].want, "%s: %d", cases[i].v, m.priority);
        kombu_msg_release(&m);
    }
}
END_TEST

START_TEST(test_deep_nesting)
{
    struct buf b;
    struct kombu_msg m;
    struct cr_err err = {0, ""};
    buf_init(&b);
    buf_puts(&b, "{\"properties\": {\"delivery_tag\": \"t\"}, \"headers\": {\"x\": ");
    for (int i = 0; i < 200; i++)
        buf_putc(&b, '[');
    for (int i = 0; i < 200; i++)
        buf_putc(&b, ']');
    buf_puts(&b, "}}");
    ck_assert_int_eq(kombu_msg_decode(&m, b.data, b.len, 0, &err), CR_EDECODE);
    ck_assert(err.msg[0]);
    buf_release(&b);
}
END_TEST

START_TEST(test_encode_defaults)
{
    struct outbound o;
    struct buf out;
    cJSON *h = NULL;
    memset(&o, 0, sizeof o);
    buf_init(&out);
    o.priority = 12;
    ck_assert_int_eq(kombu_msg_encode(&o, NULL, &out), 0);
    ck_assert_str_eq(
        out.data, "{\"body\": \"\", \"content-encoding\": \"utf-8\", \"content-type\": "
                  "\"application/json\", \"headers\": {}, \"properties\": "
                  "{\"delivery_mode\": 2, \"delivery_info\": {\"exchange\": \"\", "
                  "\"routing_key\": \"\"}, \"priority\": 9, \"body_encoding\": "
                  "\"base64\", \"delivery_tag\": \"\"}}");
    buf_reset(&out);
    ck_assert_int_eq(py_json_parse("{\"f\": 1.0, \"s\": \"\xc3\xa9\"}", 21, &h, NULL), 0);
    o.headers = h;
    o.body = "\x00\xff";
    o.body_len = 2;
    o.reply_to = "";
    o.priority = -1;
    o.delivery_mode = 1;
    ck_assert_int_eq(kombu_msg_encode(&o, NULL, &out), 0);
    ck_assert_str_eq(
        out.data,
        "{\"body\": \"AP8=\", \"content-encoding\": \"utf-8\", \"content-type\": "
        "\"application/json\", \"headers\": {\"f\": 1.0, \"s\": \"\\u00e9\"}, "
        "\"properties\": {\"reply_to\": \"\", \"delivery_mode\": 1, "
        "\"delivery_info\": {\"exchange\": \"\", \"routing_key\": \"\"}, "
        "\"priority\": 0, \"body_encoding\": \"base64\", \"delivery_tag\": "
        "\"\"}}");
    {
        struct kombu_msg m;
        ck_assert_int_eq(kombu_msg_decode(&m, out.data, out.len, 0, NULL), 0);
        ck_assert_uint_eq(m.body_len, 2);
        ck_assert(memcmp(m.body, "\x00\xff", 2) == 0);
        ck_assert(m.headers->child->type & PY_JSON_FLOAT);
        kombu_msg_release(&m);
    }
    cJSON_Delete(h);
    buf_release(&out);
}
END_TEST

/* ---- bindings, BRPOP, channels -------------------------------------------- */

START_TEST(test_bindings_fixture)
{
    cJSON *b = load_json(FX "bindings.json"), *set, *mem;
    struct kombu_opts o = dflt();
    int n = 0;
    cJSON_ArrayForEach(set, b)
    {
        const char *exchange = set->string + strlen("_kombu.binding.");
        struct buf out;
        buf_init(&out);
        ck_assert_int_eq(kombu_binding_key(&o, exchange, &out), 0);
        ck_assert_str_eq(out.data, set->string);
        cJSON_ArrayForEach(mem, set)
        {
            const char *rk, *pat, *q;
            size_t rl, pl, ql;
            char rks[256], pats[256], qs[256];
            const char *s = mem->valuestring;
            ck_assert_int_eq(
                kombu_binding_parse(&o, s, strlen(s), &rk, &rl, &pat, &pl, &q, &ql), 0);
            snprintf(rks, sizeof rks, "%.*s", (int)rl, rk);
            snprintf(pats, sizeof pats, "%.*s", (int)pl, pat);
            snprintf(qs, sizeof qs, "%.*s", (int)ql, q);
            buf_reset(&out);
            ck_assert_int_eq(kombu_binding_member(&o, rks, pats, qs, &out), 0);
            ck_assert_str_eq(out.data, s);
            if (strcmp(exchange, "topics") == 0) {
                buf_reset(&out);
                ck_assert_int_eq(kombu_topic_pattern(rks, &out), 0);
                ck_assert_str_eq(out.data, pats);
            }
            n++;
        }
        buf_release(&out);
    }
    ck_assert_int_ge(n, 6);
    cJSON_Delete(b);
}
END_TEST

START_TEST(test_binding_parse_forms)
{
    struct kombu_opts o = dflt();
    const char *a, *b, *c;
    size_t al, bl, cl;
    struct buf out;
    ck_assert_int_eq(kombu_binding_parse(&o, "a\x06\x16", 3, &a, &al, &b, &bl, &c, &cl),
                     CR_EDECODE);
    ck_assert_int_eq(kombu_binding_parse(&o, "abc", 3, &a, &al, &b, &bl, &c, &cl),
                     CR_EDECODE);
    ck_assert_int_eq(
        kombu_binding_parse(&o, "\x06\x16\x06\x16\x06\x16", 6, &a, &al, &b, &bl, &c, &cl),
        CR_EDECODE);
    ck_assert_int_eq(
        kombu_binding_parse(&o, "\x06\x16\x06\x16", 4, &a, &al, &b, &bl, &c, &cl), 0);
    ck_assert_uint_eq(al + bl + cl, 0);
    snprintf(o.sep, sizeof o.sep, ":");
    buf_init(&out);
    ck_assert_int_eq(kombu_binding_member(&o, NULL, NULL, "q", &out), 0);
    ck_assert_str_eq(out.data, "::q");
    ck_assert_int_eq(kombu_binding_parse(&o, "k:p:q", 5, &a, &al, &b, &bl, &c, &cl), 0);
    ck_assert(al == 1 && *a == 'k' && bl == 1 && *b == 'p' && cl == 1 && *c == 'q');
    buf_release(&out);
}
END_TEST

static void check_brpop(const struct kombu_opts *o, const char *const *queues, int n,
                        double timeout, const cJSON *want)
{
    const char *argv[64];
    size_t argvlen[64];
    struct buf store;
    int argc, i = 0;
    const cJSON *w;
    buf_init(&store);
    argc = kombu_brpop_args(o, queues, n, timeout, &store, argv, argvlen, 64);
    ck_assert_int_eq(argc, cJSON_GetArraySize(want));
    cJSON_ArrayForEach(w, want)
    {
        ck_assert_uint_eq(argvlen[i], strlen(w->valuestring));
        ck_assert_str_eq(argv[i], w->valuestring);
        i++;
    }
    buf_release(&store);
}

START_TEST(test_commands_fixture)
{
    cJSON *cmds = load_json(FX "commands.json"), *c;
    struct kombu_opts o = dflt();
    const char *cycle[2] = {"celery", "other"};
    int brpops = 0, rotated = 0, subs = 0, pubs = 0;
    cJSON_ArrayForEach(c, cmds)
    {
        const char *name = cJSON_GetArrayItem(c, 0)->valuestring;
        const char *arg1 = cJSON_GetArrayItem(c, 1)->valuestring;
        struct buf out;
        char ex[128], rk[128];
        buf_init(&out);
        if (strcmp(name, "BRPOP") == 0 && strcmp(arg1, "celery") == 0) {
            const char *q[2] = {"celery", "other"};
            check_brpop(&o, q, 2, 1, c);
            brpops++;
        } else if (strcmp(name, "BRPOP") == 0 && strcmp(arg1, "other") == 0) {
            /* The worker's cycle after a pop from celery. */
            kombu_rotate(&o, cycle, 2, "celery");
            check_brpop(&o, cycle, 2, 1, c);
            kombu_rotate(&o, cycle, 2, "other");
            rotated++;
        } else if (strcmp(name, "BRPOP") == 0) {
            const char *q[1] = {arg1};
            check_brpop(&o, q, 1, 1.0, c);
            brpops++;
        } else if (strcmp(name, "PSUBSCRIBE") == 0) {
            if (strcmp(arg1, "/0.celery.pidbox") == 0)
                kombu_channel_pattern(&o, 0, "celery.pidbox", "", &out);
            else if (strcmp(arg1, "/0.celeryev/worker.*") == 0)
                kombu_channel_pattern(&o, 0, "celeryev", "worker.#", &out);
            else
                kombu_channel_pattern(&o, 0, "celeryev", "#", &out);
            ck_assert_str_eq(out.data, arg1);
            subs++;
        } else if (strcmp(name, "PUBLISH") == 0) {
            ck_assert_int_eq(
                kombu_channel_parse(&o, arg1, strlen(arg1), ex, sizeof ex, rk, sizeof rk),
                0);
            ck_assert_int_eq(kombu_channel(&o, 0, ex, rk, &out), 0);
            ck_assert_str_eq(out.data, arg1);
            pubs++;
        }
        buf_release(&out);
    }
    ck_assert_int_ge(brpops, 2);
    ck_assert_int_ge(rotated, 1);
    ck_assert_int_ge(subs, 2);
    ck_assert_int_ge(pubs, 2);
    cJSON_Delete(cmds);
}
END_TEST

START_TEST(test_brpop_forms)
{
    struct kombu_opts o = dflt();
    const char *q[3] = {"b", "a", "c"};
    const char *argv[16];
    size_t argvlen[16];
    struct buf store;
    buf_init(&store);
    snprintf(o.keyprefix, sizeof o.keyprefix, "pfx:");
    ck_assert_int_eq(kombu_brpop_args(&o, q, 1, 0.5, &store, argv, argvlen, 16), 6);
    ck_assert_str_eq(argv[0], "BRPOP");
    ck_assert_str_eq(argv[1], "pfx:b");
    ck_assert_str_eq(argv[2], "pfx:b\x06\x16\x33");
    ck_assert_str_eq(argv[4], "pfx:b\x06\x16\x39");
    ck_assert_str_eq(argv[5], "0.5");
    ck_assert_int_eq(kombu_brpop_args(&o, q, 3, 2, &store, argv, argvlen, 13), CR_ERANGE);
    ck_assert_int_eq(kombu_brpop_args(&o, q, 3, 2, &store, argv, argvlen, 14), 14);
    ck_assert_str_eq(argv[13], "2");
    ck_assert_str_eq(argv[4], "pfx:b\x06\x16\x33");
    ck_assert_int_eq(kombu_brpop_args(&o, q, 1, 0.1, &store, argv, argvlen, 16), 6);
    ck_assert_str_eq(argv[5], "0.1");
    ck_assert_int_eq(kombu_brpop_args(&o, q, 1, 0, &store, argv, argvlen, 16), 6);
    ck_assert_str_eq(argv[5], "0");
    buf_release(&store);

    /* Cycle orders. */
    kombu_rotate(&o, q, 3, "b");
    ck_assert(strcmp(q[0], "a") == 0 && strcmp(q[1], "c") == 0 && strcmp(q[2], "b") == 0);
    kombu_rotate(&o, q, 3, "zz");
    ck_assert_str_eq(q[0], "a");
    o.order = KOMBU_ORDER_PRIORITY;
    kombu_rotate(&o, q, 3, "a");
    ck_assert_str_eq(q[0], "a");
    kombu_initial_order(&o, q, 3);
    ck_assert_str_eq(q[1], "c");
    o.order = KOMBU_ORDER_SORTED;
    kombu_initial_order(&o, q, 3);
    ck_assert(strcmp(q[0], "a") == 0 && strcmp(q[1], "b") == 0 && strcmp(q[2], "c") == 0);
    kombu_rotate(&o, q, 3, "a");
    ck_assert_str_eq(q[0], "a");
}
END_TEST

START_TEST(test_names)
{
    struct kombu_opts o = dflt();
    struct buf out;
    char q[64];
    buf_init(&out);
    ck_assert_int_eq(kombu_queue_key(&o, "celery", 0, &out), 0);
    ck_assert_str_eq(out.data, "celery");
    buf_reset(&out);
    ck_assert_int_eq(kombu_queue_key(&o, "celery", 6, &out), 0);
    ck_assert_str_eq(out.data, "celery\x06\x16\x36");
    ck_assert_int_eq(kombu_queue_of_key(&o, out.data, out.len, q, sizeof q), 0);
    ck_assert_str_eq(q, "celery");
    ck_assert_int_eq(kombu_queue_of_key(&o, "a\x06\x16\x62", 4, q, sizeof q), 0);
    ck_assert_str_eq(q, "a\x06\x16\x62"); /* not a step: kept */
    ck_assert_int_eq(kombu_queue_of_key(&o, "a\x06\x16x\x06\x16\x39", 7, q, sizeof q), 0);
    ck_assert_str_eq(q, "a\x06\x16x");
    ck_assert_int_eq(kombu_queue_of_key(&o, "celery", 6, q, 6), CR_EINVAL);
    ck_assert_int_eq(kombu_queue_of_key(&o, "celery", 6, q, 7), 0);

    /* Ten steps and ':' (the documented alternative), with a prefix. */
    ck_assert_int_eq(
        kombu_opts_parse(&o,
                         S("{\"priority_steps\": [0,1,2,3,4,5,6,7,8,9], "
                           "\"sep\": \":\", \"global_keyprefix\": \"pfx:\"}"),
                         NULL),
        0);
    for (int p = 0; p <= 9; p++)
        ck_assert_int_eq(kombu_bucket(&o, p), p);
    buf_reset(&out);
    ck_assert_int_eq(kombu_queue_key(&o, "celery", 7, &out), 0);
    ck_assert_str_eq(out.data, "pfx:celery:7");
    ck_assert_int_eq(kombu_queue_of_key(&o, out.data, out.len, q, sizeof q), 0);
    ck_assert_str_eq(q, "celery");
    ck_assert_int_eq(kombu_queue_of_key(&o, "pfx:a:b:0", 9, q, sizeof q), 0);
    ck_assert_str_eq(q, "a:b:0");
    ck_assert_int_eq(kombu_queue_of_key(&o, "celery:7", 8, q, sizeof q), CR_EINVAL);
    buf_reset(&out);
    ck_assert_int_eq(kombu_binding_key(&o, "celery", &out), 0);
    ck_assert_str_eq(out.data, "pfx:_kombu.binding.celery");
    buf_release(&out);
}
END_TEST

START_TEST(test_priorities)
{
    struct kombu_opts o = dflt();
    static const int want[] = {0, 0, 0, 3, 3, 3, 6, 6, 6, 9};
    for (int p = 0; p <= 9; p++)
        ck_assert_int_eq(kombu_bucket(&o, p), want[p]);
    ck_assert_int_eq(kombu_bucket(&o, -5), 0);
    ck_assert_int_eq(kombu_bucket(&o, 42), 9);
    ck_assert_int_eq(kombu_to_engine_priority(0), 9);
    ck_assert_int_eq(kombu_to_engine_priority(9), 0);
    ck_assert_int_eq(kombu_to_engine_priority(12), 0);
    ck_assert_int_eq(kombu_from_engine_priority(9), 0);
    ck_assert_int_eq(kombu_from_engine_priority(-1), 9);
    for (int p = 0; p <= 9; p++)
        ck_assert_int_eq(kombu_from_engine_priority(kombu_to_engine_priority(p)), p);
}
END_TEST

START_TEST(test_channels)
{
    struct kombu_opts o = dflt();
    struct buf out;
    char ex[32], rk[32];
    buf_init(&out);
    ck_assert_int_eq(kombu_channel(&o, 3, "celeryev", "task.multi", &out), 0);
    ck_assert_str_eq(out.data, "/3.celeryev/task.multi");
    buf_reset(&out);
    ck_assert_int_eq(kombu_channel(&o, -1, "celery.pidbox", "", &out), 0);
    ck_assert_str_eq(out.data, "/{db}.celery.pidbox");
    buf_reset(&out);
    snprintf(o.keyprefix, sizeof o.keyprefix, "pfx:");
    ck_assert_int_eq(kombu_channel(&o, 2, "celeryev", "worker.heartbeat", &out), 0);
    ck_assert_str_eq(out.data, "pfx:/2.celeryev/worker.heartbeat");
    ck_assert_int_eq(
        kombu_channel_parse(&o, out.data, out.len, ex, sizeof ex, rk, sizeof rk), 0);
    ck_assert_str_eq(ex, "celeryev");
    ck_assert_str_eq(rk, "worker.heartbeat");
    ck_assert_int_eq(
        kombu_channel_parse(&o, "/2.celeryev", 11, ex, sizeof ex, rk, sizeof rk),
        CR_EINVAL);
    buf_reset(&out);
    ck_assert_int_eq(kombu_channel_pattern(&o, 2, "celeryev", "#", &out), 0);
    ck_assert_str_eq(out.data, "pfx:/2.celeryev/*");
    o.keyprefix[0] = '\0';
    o.fanout_patterns = 0;
    buf_reset(&out);
    ck_assert_int_eq(kombu_channel(&o, 0, "celeryev", "worker.online", &out), 0);
    ck_assert_str_eq(out.data, "/0.celeryev");
    ck_assert_int_eq(
        kombu_opts_parse(&o, S("{\"fanout_prefix\": \"/x{db}{{}}.\"}"), NULL), 0);
    buf_reset(&out);
    ck_assert_int_eq(kombu_channel(&o, 5, "e", "r", &out), 0);
    ck_assert_str_eq(out.data, "/x5{}.e");
    ck_assert_int_eq(kombu_opts_parse(&o, S("{\"fanout_prefix\": false}"), NULL), 0);
    buf_reset(&out);
    ck_assert_int_eq(kombu_channel(&o, 5, "e", "r", &out), 0);
    ck_assert_str_eq(out.data, "e");
    ck_assert_int_eq(kombu_channel_parse(&o, "e/r/s", 5, ex, sizeof ex, rk, sizeof rk),
                     0);
    ck_assert_str_eq(ex, "e");
    ck_assert_str_eq(rk, "r/s");
    ck_assert_int_eq(kombu_channel_parse(&o, "/0.e", 4, ex, sizeof ex, rk, sizeof rk), 0);
    ck_assert_str_eq(ex, "e");
    ck_assert_int_eq(kombu_channel_parse(&o, "", 0, ex, sizeof ex, rk, sizeof rk),
                     CR_EINVAL);
    ck_assert_int_eq(kombu_channel_parse(&o, "/0.", 3, ex, sizeof ex, rk, sizeof rk),
                     CR_EINVAL);
    ck_assert_int_eq(kombu_channel_parse(&o, "abcdef", 6, ex, 6, rk, sizeof rk),
                     CR_EINVAL);
    ck_assert_int_eq(kombu_channel_parse(&o, "a/bcdef", 7, ex, 6, rk, 5), CR_EINVAL);
    buf_release(&out);
}
END_TEST

START_TEST(test_restore_due)
{
    struct kombu_opts o = dflt();
    ck_assert(kombu_restore_due(&o, 1000, 4600));
    ck_assert(!kombu_restore_due(&o, 1000.5, 4600));
    ck_assert(!kombu_restore_due(&o, -1, 1e10));
    o.visibility_timeout_s = 5;
    ck_assert(kombu_restore_due(&o, 1796150559.0285344, 1796150564.03));
}
END_TEST

/* ---- topics -------------------------------------------------------------- */

START_TEST(test_topic_fixture)
{
    cJSON *t = load_json(FX "topic.json"), *k, *c;
    int n = 0;
    cJSON_ArrayForEach(k, t)
    {
        const char *bk = jstr(k, "key");
        struct buf out;
        buf_init(&out);
        ck_assert_int_eq(kombu_topic_pattern(bk, &out), 0);
        ck_assert_str_eq(out.data, jstr(k, "pattern"));
        buf_release(&out);
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(k, "cases"))
        {
            const char *rk = cJSON_GetArrayItem(c, 0)->valuestring;
            int want = cJSON_IsTrue(cJSON_GetArrayItem(c, 1));
            ck_assert_msg(kombu_topic_match(bk, strlen(bk), rk, strlen(rk)) == want,
                          "key '%s' routing key '%s': want %d", bk, rk, want);
            n++;
        }
    }
    ck_assert_int_gt(n, 1000);
    cJSON_Delete(t);
}
END_TEST

START_TEST(test_topic_limits)
{
    char big[KOMBU_NAME_MAX + 2];
    memset(big, 'a', sizeof big);
    ck_assert(kombu_topic_match("#", 1, big, KOMBU_NAME_MAX));
    ck_assert(!kombu_topic_match("#", 1, big, KOMBU_NAME_MAX + 1));
    ck_assert(!kombu_topic_match(big, KOMBU_NAME_MAX + 1, big, KOMBU_NAME_MAX + 1));
    ck_assert(kombu_topic_match(big, KOMBU_NAME_MAX, big, KOMBU_NAME_MAX));
    for (int i = 0; i < KOMBU_NAME_MAX; i += 2)
        big[i] = '*', big[i + 1] = '.';
    ck_assert(!kombu_topic_match(big, KOMBU_NAME_MAX - 1, "a", 1));
    ck_assert(!kombu_topic_match("a", 1, "\xff", 1));
    ck_assert(kombu_topic_match("a\0b", 3, "a\0b", 3));
}
END_TEST

/* ---- options ------------------------------------------------------------- */

START_TEST(test_opts_defaults)
{
    struct kombu_opts o = dflt();
    ck_assert(o.visibility_timeout_s == 3600);
    ck_assert_int_eq(o.nsteps, 4);
    ck_assert_int_eq(o.steps[3], 9);
    ck_assert_str_eq(o.sep, "\x06\x16");
    ck_assert_int_eq(o.order, KOMBU_ORDER_ROUND_ROBIN);
    ck_assert_int_eq(o.fanout_prefix, 1);
    ck_assert_int_eq(o.fanout_patterns, 1);
    ck_assert_str_eq(o.unacked_key, "unacked");
    ck_assert_str_eq(o.unacked_index_key, "unacked_index");
    ck_assert_str_eq(o.unacked_mutex_key, "unacked_mutex");
    ck_assert(o.unacked_mutex_expire_s == 300);
    ck_assert_int_eq(o.ack_emulation, 1);
    ck_assert(o.health_check_interval_s == 25);
    ck_assert(o.polling_interval_s == 0);
    ck_assert_int_eq(kombu_opts_parse(&o, "{}", 2, NULL), 0);
    ck_assert_int_eq(kombu_opts_parse(&o, " { } ", 5, NULL), 0);
}
END_TEST

START_TEST(test_opts_every_key)
{
    static const char doc[] =
        "{\"visibility_timeout\": 43200, \"priority_steps\": [0, 5], \"sep\": \":\", "
        "\"queue_order_strategy\": \"sorted\", \"global_keyprefix\": \"app1:\", "
        "\"fanout_prefix\": true, \"fanout_patterns\": false, \"unacked_key\": \"u\", "
        "\"unacked_index_key\": \"ui\", \"unacked_mutex_key\": \"um\", "
        "\"unacked_mutex_expire\": 60, \"unacked_restore_limit\": 50, "
        "\"ack_emulation\": false, \"polling_interval\": 0.5, \"master_name\": "
        "\"mymaster\", \"sentinel_kwargs\": {\"username\": \"su\", \"password\": \"sp\", "
        "\"ssl\": true}, \"min_other_sentinels\": 1, \"socket_timeout\": 5.5, "
        "\"socket_connect_timeout\": 2, \"health_check_interval\": 10, \"client_name\": "
        "\"w1\", \"max_connections\": 20, \"socket_keepalive\": true, "
        "\"socket_keepalive_options\": {\"1\": 2}, \"retry_on_timeout\": true, "
        "\"body_encoding\": \"base64\", \"unacked_restore_interval\": 10, "
        "\"unacked_restore_throttle\": 10, \"max_retries\": 3, \"interval_start\": 0, "
        "\"interval_step\": 0.2, \"interval_max\": 0.5}";
    struct kombu_opts o = dflt();
    struct cr_err err = {0, ""};
    ck_assert_msg(kombu_opts_parse(&o, doc, sizeof doc - 1, &err) == 0, "%s", err.msg);
    ck_assert(o.visibility_timeout_s == 43200);
    ck_assert_int_eq(o.nsteps, 2);
    ck_assert_int_eq(o.steps[1], 5);
    ck_assert_int_eq(kombu_bucket(&o, 4), 0);
    ck_assert_int_eq(kombu_bucket(&o, 9), 5);
    ck_assert_str_eq(o.sep, ":");
    ck_assert_int_eq(o.order, KOMBU_ORDER_SORTED);
    ck_assert_str_eq(o.keyprefix, "app1:");
    ck_assert_int_eq(o.fanout_prefix, 1);
    ck_assert_int_eq(o.fanout_patterns, 0);
    ck_assert_str_eq(o.unacked_key, "u");
    ck_assert_str_eq(o.unacked_index_key, "ui");
    ck_assert_str_eq(o.unacked_mutex_key, "um");
    ck_assert(o.unacked_mutex_expire_s == 60);
    ck_assert_int_eq(o.unacked_restore_limit, 50);
    ck_assert_int_eq(o.ack_emulation, 0);
    ck_assert(o.polling_interval_s == 0.5);
    ck_assert_str_eq(o.master_name, "mymaster");
    ck_assert_str_eq(o.sentinel_username, "su");
    ck_assert_str_eq(o.sentinel_password, "sp");
    ck_assert_int_eq(o.min_other_sentinels, 1);
    ck_assert(o.socket_timeout_s == 5.5);
    ck_assert(o.socket_connect_timeout_s == 2);
    ck_assert(o.health_check_interval_s == 10);
    ck_assert_str_eq(o.client_name, "w1");
    ck_assert_int_eq(
        kombu_opts_parse(&o,
                         S("{\"queue_order_strategy\": \"priority\", "
                           "\"unacked_restore_limit\": null, \"polling_interval\": "
                           "null, \"sentinel_kwargs\": null, \"client_name\": null}"),
                         &err),
        0);
    ck_assert_int_eq(o.order, KOMBU_ORDER_PRIORITY);
    ck_assert_int_eq(o.unacked_restore_limit, 0);
    ck_assert(o.polling_interval_s == 0);
    ck_assert_str_eq(o.sentinel_password, "");
    ck_assert_str_eq(o.client_name, "");
}
END_TEST

START_TEST(test_opts_bad)
{
    static const struct {
        const char *doc;
        const char *needle;
    } cases[] = {
        {"{\"nope\": 1}", "unknown broker transport option 'nope'"},
        {"{\"visibility_timeout\": \"1\"}", "'visibility_timeout'"},
        {"{\"visibility_timeout\": -1}", "'visibility_timeout'"},
        {"{\"priority_steps\": [3, 6, 9]}", "must start with 0"},
        {"{\"priority_steps\": [0, 6, 3]}", "ascending"},
        {"{\"priority_steps\": [0, 3, 3]}", "ascending"},
        {"{\"priority_steps\": [0, 10]}", "'priority_steps'"},
        {"{\"priority_steps\": [0, 1.0]}", "'priority_steps'"},
        {"{\"priority_steps\": []}", "must start with 0"},
        {"{\"priority_steps\": \"0,3\"}", "'priority_steps'"},
        {"{\"priority_steps\": [0,1,2,3,4,5,6,7,8,9,9]}", "'priority_steps'"},
        {"{\"sep\": \"\"}", "'sep'"},
        {"{\"sep\": \"0123456789abcdef\"}", "'sep'"},
        {"{\"sep\": 1}", "'sep'"},
        {"{\"queue_order_strategy\": \"fair\"}", "'queue_order_strategy'"},
        {"{\"global_keyprefix\": null}", "'global_keyprefix'"},
        {"{\"fanout_prefix\": 1}", "'fanout_prefix'"},
        {"{\"fanout_prefix\": \"/{x}.\"}", "'fanout_prefix'"},
        {"{\"fanout_prefix\": \"/{db:02d}.\"}", "'fanout_prefix'"},
        {"{\"fanout_prefix\": \"}\"}", "'fanout_prefix'"},
        {"{\"fanout_patterns\": 1}", "'fanout_patterns'"},
        {"{\"unacked_key\": \"\"}", "'unacked_key'"},
        {"{\"unacked_index_key\": []}", "'unacked_index_key'"},
        {"{\"unacked_mutex_key\": null}", "'unacked_mutex_key'"},
        {"{\"unacked_mutex_expire\": 0}", "'unacked_mutex_expire'"},
        {"{\"unacked_restore_limit\": 1.5}", "'unacked_restore_limit'"},
        {"{\"unacked_restore_limit\": -1}", "'unacked_restore_limit'"},
        {"{\"ack_emulation\": \"yes\"}", "'ack_emulation'"},
        {"{\"polling_interval\": true}", "'polling_interval'"},
        {"{\"master_name\": 3}", "'master_name'"},
        {"{\"sentinel_kwargs\": []}", "'sentinel_kwargs'"},
        {"{\"sentinel_kwargs\": {\"password\": 1}}", "'sentinel_kwargs.password'"},
        {"{\"min_other_sentinels\": -1}", "'min_other_sentinels'"},
        {"{\"socket_timeout\": \"x\"}", "'socket_timeout'"},
        {"{\"socket_connect_timeout\": []}", "'socket_connect_timeout'"},
        {"{\"health_check_interval\": null}", "'health_check_interval'"},
        {"{\"client_name\": false}", "'client_name'"},
        {"{\"body_encoding\": \"utf-8\"}", "'body_encoding'"},
        {"[]", "object"},
        {"{\"sep\": \":\",}",
         "broker transport options are not JSON: bad JSON at byte 12"},
        {"", "not JSON: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct kombu_opts o = dflt();
        struct cr_err err = {0, ""};
        ck_assert_int_eq(kombu_opts_parse(&o, cases[i].doc, strlen(cases[i].doc), &err),
                         CR_EINVAL);
        ck_assert_msg(strstr(err.msg, cases[i].needle), "%s: '%s'", cases[i].doc,
                      err.msg);
    }
    {
        /* The reason said once, whole (it was the prefix twice and nothing). */
        struct kombu_opts o = dflt();
        struct cr_err err = {0, ""};
        ck_assert_int_eq(kombu_opts_parse(&o, "{\"a\": 1,}", 10, &err), CR_EINVAL);
        ck_assert_str_eq(err.msg,
                         "broker transport options are not JSON: bad JSON at byte 8: "
                         "expected key");
    }
    {
        struct kombu_opts o = dflt();
        char *big = malloc(KOMBU_OPTS_MAX_BYTES + 2);
        memset(big, ' ', KOMBU_OPTS_MAX_BYTES + 1);
        big[0] = '{';
        big[KOMBU_OPTS_MAX_BYTES] = '}';
        ck_assert_int_eq(kombu_opts_parse(&o, big, KOMBU_OPTS_MAX_BYTES + 1, NULL),
                         CR_EINVAL);
        ck_assert_int_eq(kombu_opts_parse(&o, big, KOMBU_OPTS_MAX_BYTES, NULL),
                         CR_EINVAL);
        big[KOMBU_OPTS_MAX_BYTES - 1] = '}';
        ck_assert_int_eq(kombu_opts_parse(&o, big, KOMBU_OPTS_MAX_BYTES, NULL), 0);
        free(big);
    }
}
END_TEST

/* ---- allocation failures ---------------------------------------------------- */

static int oom_round(const char *env, size_t len, const char *unacked)
{
    struct kombu_msg m;
    struct kombu_opts o = dflt();
    struct buf out;
    char *e = NULL, *x = NULL, *r = NULL;
    const char *q[2] = {"celery", "other"};
    const char *argv[16];
    size_t argvlen[16];
    int rc;

    buf_init(&out);
    rc = kombu_msg_decode(&m, env, len, 0, NULL);
    if (rc == 0) {
        rc = encode_from(&m, &out);
        kombu_msg_release(&m);
    }
    if (rc == 0)
        rc = kombu_mark_redelivered(env, len, &out, NULL);
    if (rc == 0)
        rc = kombu_unacked_encode(env, len, "", "celery", &out, NULL);
    if (rc == 0)
        rc = kombu_unacked_decode(unacked, strlen(unacked), &e, &x, &r, NULL);
    if (rc == 0)
        rc = kombu_opts_parse(&o, S("{\"sep\": \":\", \"sentinel_kwargs\": {}}"), NULL);
    if (rc == 0) {
        rc = kombu_brpop_args(&o, q, 2, 1, &out, argv, argvlen, 16);
        rc = rc < 0 ? rc : 0;
    }
    if (rc == 0)
        rc = kombu_topic_pattern("a.*.#", &out);
    if (rc == 0)
        rc = kombu_channel(&o, 0, "celeryev", "worker.online", &out);
    cr_free(e);
    cr_free(x);
    cr_free(r);
    buf_release(&out);
    return rc;
}

START_TEST(test_oom)
{
    cJSON *u = load_json(FX "unacked.json");
    const char *unacked =
        cJSON_GetObjectItemCaseSensitive(u, "values")->child->valuestring;
    size_t len;
    char *env = load_env(env_names[_i], &len);
    ck_assert_int_eq(oom_round(env, len, unacked), 0);
    for (long k = 1;; k++) {
        int rc, failed;
        cr_alloc_fail_after(k);
        rc = oom_round(env, len, unacked);
        failed = cr_alloc_failed() > 0;
        cr_alloc_fail_after(0);
        if (!failed) {
            ck_assert_int_eq(rc, 0);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_int_lt(k, 100000);
    }
    free(env);
    cJSON_Delete(u);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("kombu");
    TCase *fx = tcase_create("fixtures");
    TCase *hand = tcase_create("hand");
    TCase *bad = tcase_create("malformed");
    tcase_add_loop_test(fx, test_decode_fixture, 0, N_ENVS);
    tcase_add_loop_test(fx, test_encode_fixture, 0, N_ENVS);
    tcase_add_test(fx, test_mark_redelivered);
    tcase_add_test(fx, test_unacked_fixture);
    tcase_add_test(fx, test_bindings_fixture);
    tcase_add_test(fx, test_commands_fixture);
    tcase_add_test(fx, test_topic_fixture);
    suite_add_tcase(s, fx);
    tcase_add_test(hand, test_encode_defaults);
    tcase_add_test(hand, test_binding_parse_forms);
    tcase_add_test(hand, test_brpop_forms);
    tcase_add_test(hand, test_names);
    tcase_add_test(hand, test_priorities);
    tcase_add_test(hand, test_channels);
    tcase_add_test(hand, test_restore_due);
    tcase_add_test(hand, test_topic_limits);
    tcase_add_test(hand, test_opts_defaults);
    tcase_add_test(hand, test_opts_every_key);
    tcase_add_test(hand, test_opts_bad);
    suite_add_tcase(s, hand);
    tcase_add_loop_test(bad, test_truncations, 0, N_ENVS);
    tcase_add_test(bad, test_kind_swaps);
    tcase_add_test(bad, test_unacked_bad);
    tcase_add_test(bad, test_body_forms);
    tcase_add_test(bad, test_any_tag);
    tcase_add_test(bad, test_priority_forms);
    tcase_add_test(bad, test_deep_nesting);
    tcase_add_loop_test(bad, test_oom, 0, N_ENVS);
    tcase_set_timeout(bad, 120);
    suite_add_tcase(s, bad);
    return s;
}
