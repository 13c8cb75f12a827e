/* test_redis_url.c -- the one Redis URL parser (net/redis.c): whole URLs,
 * malformed ones, limits; and the URL redaction it shares with the logs. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "net/redis.h"
#include "net/backend.h"
#include "util/alloc.h"
#include "util/redact.h"

static const struct {
    const char *url;
    const char *host, *user, *password;
    int port, db;
} good[] = {
    {"redis://", "localhost", "", "", 6379, 0},
    {"redis://h", "h", "", "", 6379, 0},
    {"redis://h/", "h", "", "", 6379, 0},
    {"redis://h:6380", "h", "", "", 6380, 0},
    {"redis://127.0.0.1:6379/0", "127.0.0.1", "", "", 6379, 0},
    {"redis://h:1/15", "h", "", "", 1, 15},
    {"redis://h:65535/2147483647", "h", "", "", 65535, 2147483647},
    {"redis://h/3", "h", "", "", 6379, 3},
    {"redis://:pw@h:7/2", "h", "", "pw", 7, 2},
    {"redis://u:pw@h/1", "h", "u", "pw", 6379, 1},
    /* a password alone, as some clients spell it */
    {"redis://secret@h", "h", "", "secret", 6379, 0},
    /* credentials run to the last '@': '@', ':' and '/' in a password */
    {"redis://u:p@ss:w/rd@h:9/4", "h", "u", "p@ss:w/rd", 9, 4},
    /* taken as written: no %XX decoding (as before) */
    {"redis://:p%40ss@h", "h", "", "p%40ss", 6379, 0},
    {"redis://:@h", "h", "", "", 6379, 0},
    {"redis://@h", "h", "", "", 6379, 0},
    {"redis://:pw@:6390/5", "localhost", "", "pw", 6390, 5},
    /* the query is ignored */
    {"redis://h?timeout=3", "h", "", "", 6379, 0},
    {"redis://h:6381?x=1", "h", "", "", 6381, 0},
    {"redis://h:6381/?x=1", "h", "", "", 6381, 0},
    {"redis://h/7?x=1", "h", "", "", 6379, 7},
    /* IPv6 in brackets */
    {"redis://[::1]", "::1", "", "", 6379, 0},
    {"redis://[::1]:6380/2", "::1", "", "", 6380, 2},
    {"redis://u:p@[2001:db8::2]/1", "2001:db8::2", "u", "p", 6379, 1},
};

START_TEST(test_good)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    ck_assert_msg(redis_url_parse(&u, good[_i].url, "result backend", &e) == 0, "%s: %s",
                  good[_i].url, e.msg);
    ck_assert_str_eq(u.host, good[_i].host);
    ck_assert_str_eq(u.user, good[_i].user);
    ck_assert_str_eq(u.password, good[_i].password);
    ck_assert_int_eq(u.port, good[_i].port);
    ck_assert_int_eq(u.db, good[_i].db);
}
END_TEST

/* Every malformed URL is CR_EINVAL with a message that says what is wrong and
 * never quotes the password ("secret"). */
static const struct {
    const char *url;
    const char *says;
} bad[] = {
    {"http://h:6379/0", "unsupported result backend URL (want redis://, rediss://"},
    {"unix:/tmp/redis.sock", "unsupported"},
    {"redis+socket://", "names no socket path"},
    {"redis+socket://relative.sock", "names no socket path"},
    {"unix:///s?virtual_host=x", "invalid database"},
    {"unix:///s?db=-1", "invalid database"},
    {"rediss://h?ssl_cert_reqs=maybe", "invalid ssl_cert_reqs 'maybe'"},
    {"rediss://h?ssl_cert_reqs=required&ssl_check_hostname=perhaps",
     "invalid ssl_check_hostname"},
    {"sentinel://h;redis://h2", "entry 2 is not sentinel://"},
    {"sentinel://h;", "entry 2 is not sentinel://"},
    {"sentinel://h:0", "invalid port"},
    {"sentinel://:secret@h/x", "'sentinel://:**@h/x'"},
    {"sentinel://h;sentinel://h2:x",
     "invalid port in result backend URL 'sentinel://h2:x'"},
    {"REDIS://h", "unsupported"},
    {"", "unsupported"},
    {"redis://h:", "invalid port in result backend URL 'redis://h:'"},
    {"redis://h:0", "invalid port"},
    {"redis://h:65536", "invalid port"},
    {"redis://h:-1", "invalid port"},
    {"redis://h: 1", "invalid port"},
    {"redis://h:12x/0", "invalid port"},
    {"redis://h:99999999999999999999", "invalid port"},
    {"redis://:secret@h:x/0", "invalid port in result backend URL 'redis://:**@h:x/0'"},
    {"redis://secret@h:x", "invalid port in result backend URL 'redis://**@h:x'"},
    {"redis://u:secret@h:x", "'redis://u:**@h:x'"},
    {"redis://h/x", "invalid database in result backend URL 'redis://h/x'"},
    {"redis://h/-1", "invalid database"},
    {"redis://h/+1", "invalid database"},
    {"redis://h/1x", "invalid database"},
    {"redis://h/1/2", "invalid database"},
    {"redis://h/2147483648", "invalid database"},
    {"redis://h/99999999999999999999", "invalid database"},
    {"redis://:secret@h/x", "'redis://:**@h/x'"},
    {"redis://[::1", "invalid IPv6 host"},
    {"redis://[]:6379", "invalid IPv6 host"},
    {"redis://[::1]x", "invalid IPv6 host"},
    {"redis://[::1]:0", "invalid port"},
};

START_TEST(test_bad)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    ck_assert_int_eq(redis_url_parse(&u, bad[_i].url, "result backend", &e), CR_EINVAL);
    ck_assert_int_eq(e.code, CR_EINVAL);
    ck_assert_msg(strstr(e.msg, bad[_i].says) != NULL, "%s: '%s'", bad[_i].url, e.msg);
    ck_assert_msg(strstr(e.msg, "secret") == NULL, "%s: '%s'", bad[_i].url, e.msg);
}
END_TEST

/* The owner's name for the URL goes into the message. */
START_TEST(test_what)
{
    struct redis_url u;
    struct cr_err e;
    ck_assert_int_eq(redis_url_parse(&u, "amqp://h", "broker", &e), CR_EINVAL);
    ck_assert_str_eq(e.msg, "unsupported broker URL (want redis://, rediss://, "
                            "redis+socket://, unix:// or sentinel://)");
}
END_TEST

/* Limits: each part has its buffer, the whole URL REDIS_URL_MAX_BYTES. A part
 * that just fits is taken; one byte more is refused, whole. */
static void fill(char *out, const char *head, char c, size_t n, const char *tail)
{
    size_t h = strlen(head);
    memcpy(out, head, h);
    memset(out + h, c, n);
    memcpy(out + h + n, tail, strlen(tail) + 1); /* sized by the caller */
}

START_TEST(test_limits)
{
    static char url[REDIS_URL_MAX_BYTES + 64];
    struct redis_url u;
    struct cr_err e;

    fill(url, "redis://", 'h', sizeof(u.host) - 1, ":1/2");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), 0);
    ck_assert_uint_eq(strlen(u.host), sizeof(u.host) - 1);
    ck_assert_int_eq(u.port, 1);
    ck_assert_int_eq(u.db, 2);
    fill(url, "redis://", 'h', sizeof(u.host), ":1/2");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "host name too long") != NULL);

    fill(url, "redis://[", ':', sizeof(u.host), "]");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "host name too long") != NULL);

    fill(url, "redis://:", 's', sizeof(u.password) - 1, "@h");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), 0);
    ck_assert_uint_eq(strlen(u.password), sizeof(u.password) - 1);
    fill(url, "redis://:", 's', sizeof(u.password), "@h");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "password too long") != NULL);
    ck_assert(strstr(e.msg, "sss") == NULL);

    fill(url, "redis://", 'u', sizeof(u.user), ":pw@h");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "user name too long") != NULL);

    fill(url, "redis://h/0?", 'q', REDIS_URL_MAX_BYTES - strlen("redis://h/0?"), "");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), 0);
    fill(url, "redis://h/0?", 'q', REDIS_URL_MAX_BYTES + 1 - strlen("redis://h/0?"), "");
    ck_assert_int_eq(redis_url_parse(&u, url, "result backend", &e), CR_EINVAL);
    ck_assert(strstr(e.msg, "too long") != NULL);
}
END_TEST

/* A failed parse leaves nothing to free, and a good one after it is whole. */
START_TEST(test_reuse)
{
    struct redis_url u;
    struct cr_err e;
    ck_assert_int_eq(redis_url_parse(&u, "redis://u:pw@h:1/x", "result backend", &e),
                     CR_EINVAL);
    ck_assert_int_eq(redis_url_parse(&u, "redis://h2", "result backend", &e), 0);
    ck_assert_str_eq(u.host, "h2");
    ck_assert_str_eq(u.user, "");
    ck_assert_str_eq(u.password, "");
    ck_assert_int_eq(u.port, 6379);
    ck_assert_int_eq(u.db, 0);
}
END_TEST

/* rediss://: the ssl_* query keys, %XX-decoded; the result backend's rule
 * (strict: ssl_cert_reqs required) against the broker's (warn, verify none). */
START_TEST(test_tls)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    ck_assert_int_eq(redis_url_parse(&u, "rediss://:pw@h:6380/2", "broker", &e), 0);
    ck_assert(u.tls.on);
    ck_assert(!u.tls.cert_reqs_given);
    ck_assert_int_eq(u.tls.cert_reqs, REDIS_TLS_VERIFY_NONE);
    ck_assert_int_eq(u.tls.check_hostname, -1);
    ck_assert_str_eq(u.password, "pw");
    ck_assert_int_eq(u.port, 6380);
    ck_assert_int_eq(u.db, 2);
    ck_assert_int_eq(redis_url_parse_flags(&u, "rediss://h", "result backend",
                                           REDIS_URL_TLS_STRICT, &e),
                     CR_EINVAL);
    ck_assert_msg(strstr(e.msg, "rediss:// without ssl_cert_reqs") != NULL, "%s", e.msg);
    ck_assert_int_eq(redis_url_parse_flags(
                         &u,
                         "rediss://h/1?ssl_cert_reqs=CERT_REQUIRED&ssl_ca_certs=%2Ftmp%2F"
                         "ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k%20y.pem&"
                         "ssl_check_hostname=false&other=1",
                         "result backend", REDIS_URL_TLS_STRICT, &e),
                     0);
    ck_assert(u.tls.cert_reqs_given);
    ck_assert_int_eq(u.tls.cert_reqs, REDIS_TLS_VERIFY_REQUIRED);
    ck_assert_str_eq(u.tls.ca_certs, "/tmp/ca.pem");
    ck_assert_str_eq(u.tls.certfile, "/c.pem");
    ck_assert_str_eq(u.tls.keyfile, "/k y.pem");
    ck_assert_int_eq(u.tls.check_hostname, 0);
    ck_assert_int_eq(u.db, 1);
    ck_assert_int_eq(redis_url_parse(&u, "rediss://h?ssl_cert_reqs=optional", "b", &e),
                     0);
    ck_assert_int_eq(u.tls.cert_reqs, REDIS_TLS_VERIFY_OPTIONAL);
    ck_assert_int_eq(redis_url_parse(&u, "rediss://h?ssl_cert_reqs=none", "b", &e), 0);
    ck_assert_int_eq(u.tls.cert_reqs, REDIS_TLS_VERIFY_NONE);
    ck_assert(u.tls.cert_reqs_given);
    ck_assert_int_eq(redis_url_parse(&u, "rediss://h?ssl_ca_path=%2Fetc%2Fcas", "b", &e),
                     0);
    ck_assert_str_eq(u.tls.ca_path, "/etc/cas");
    /* '+' is a space in a query, a '%' that starts no whole escape is kept */
    ck_assert_int_eq(redis_url_parse(&u, "rediss://h?ssl_ca_path=/a+b%zz%4", "b", &e), 0);
    ck_assert_str_eq(u.tls.ca_path, "/a b%zz%4");
    /* keys that are not ssl_ still mean nothing */
    ck_assert_int_eq(redis_url_parse(&u, "rediss://h?sslx=1&ssl=1&timeout=3", "b", &e),
                     0);
}
END_TEST

/* ssl_cert_reqs: the six spellings kombu and Celery map, and nothing else
 * (kombu's table lookup is exact: "Required" is a KeyError there). */
static const struct {
    const char *value;
    int ok;
    enum redis_tls_verify want;
} cert_reqs[] = {
    {"required", 1, REDIS_TLS_VERIFY_REQUIRED},
    {"CERT_REQUIRED", 1, REDIS_TLS_VERIFY_REQUIRED},
    {"optional", 1, REDIS_TLS_VERIFY_OPTIONAL},
    {"CERT_OPTIONAL", 1, REDIS_TLS_VERIFY_OPTIONAL},
    {"none", 1, REDIS_TLS_VERIFY_NONE},
    {"CERT_NONE", 1, REDIS_TLS_VERIFY_NONE},
    {"CERT%5FNONE", 1, REDIS_TLS_VERIFY_NONE}, /* values are %XX-decoded */
    {"Required", 0, 0},
    {"REQUIRED", 0, 0},
    {"CERT_required", 0, 0},
    {"cert_required", 0, 0},
    {"CERT_", 0, 0},
    {"", 0, 0},
    {"required ", 0, 0},
    {"1", 0, 0},
};

START_TEST(test_tls_cert_reqs)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    char url[128];
    snprintf(url, sizeof(url), "rediss://h/0?ssl_cert_reqs=%s", cert_reqs[_i].value);
    if (cert_reqs[_i].ok) {
        ck_assert_msg(redis_url_parse_flags(&u, url, "result backend",
                                            REDIS_URL_TLS_STRICT, &e) == 0,
                      "%s: %s", url, e.msg);
        ck_assert(u.tls.cert_reqs_given);
        ck_assert_int_eq(u.tls.cert_reqs, cert_reqs[_i].want);
    } else {
        ck_assert_int_eq(redis_url_parse(&u, url, "broker", &e), CR_EINVAL);
        ck_assert_msg(strstr(e.msg, "invalid ssl_cert_reqs") != NULL, "%s", e.msg);
    }
}
END_TEST

/* Every other ssl_ key is refused at start-up: kombu passes them all to
 * redis-py, whose connection refuses a name it does not know; the ones
 * redis-py knows and celeriac does not do are refused by name. An ssl_ key on
 * redis:// is refused too (Celery's backend refuses it; kombu would switch to
 * TLS). */
static const struct {
    const char *url;
    const char *says;
} tls_bad[] = {
    {"rediss://h?ssl_foo=1", "unknown TLS option 'ssl_foo' in broker URL"},
    {"rediss://h?ssl_=1", "unknown TLS option 'ssl_'"},
    {"rediss://h?SSL_CERT_REQS=none", NULL}, /* not an ssl_ key: ignored */
    {"rediss://h?ssl_cert_reqs=none&ssl_ca_cert=/x", "unknown TLS option 'ssl_ca_cert'"},
    {"rediss://h?ssl_password=x",
     "TLS option 'ssl_password' in broker URL is not supported"},
    {"rediss://h?ssl_ca_data=x", "'ssl_ca_data' in broker URL is not supported"},
    {"rediss://h?ssl_validate_ocsp=true", "'ssl_validate_ocsp' in broker URL is not"},
    {"rediss://h?ssl_validate_ocsp_stapled=1", "'ssl_validate_ocsp_stapled' in"},
    {"redis://h?ssl_cert_reqs=required",
     "has TLS option 'ssl_cert_reqs' but is not rediss://"},
    {"redis://:secret@h?ssl_ca_certs=/x",
     "'redis://:**@h?ssl_ca_certs=/x' has TLS option"},
    {"rediss://h?ssl_check_hostname=true", "ssl_check_hostname without checking"},
    {"rediss://h?ssl_check_hostname=1&ssl_cert_reqs=none", "ssl_check_hostname"},
    {"rediss://h?ssl_check_hostname=yes&ssl_cert_reqs=CERT_OPTIONAL", NULL},
    {"rediss://h?ssl_check_hostname=true&ssl_cert_reqs=required", NULL},
    {"rediss://h?ssl_check_hostname=", "invalid ssl_check_hostname ''"},
    /* the first bad key wins, wherever it is */
    {"rediss://h?ssl_cert_reqs=required&ssl_ca_certs=/a&ssl_bogus=1", "'ssl_bogus'"},
};

START_TEST(test_tls_bad)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    int rc = redis_url_parse(&u, tls_bad[_i].url, "broker", &e);
    if (!tls_bad[_i].says) {
        ck_assert_msg(rc == 0, "%s: %s", tls_bad[_i].url, e.msg);
        return;
    }
    ck_assert_int_eq(rc, CR_EINVAL);
    ck_assert_msg(strstr(e.msg, tls_bad[_i].says) != NULL, "%s: %s", tls_bad[_i].url,
                  e.msg);
    ck_assert_msg(strstr(e.msg, "secret") == NULL, "%s", e.msg);
}
END_TEST

/* Every prefix of a full rediss:// URL parses or is refused cleanly (no
 * crash, no read past the end, which ASan would catch), and the strict rule
 * holds for each: a parsed rediss:// URL under REDIS_URL_TLS_STRICT always has
 * ssl_cert_reqs. */
START_TEST(test_tls_prefixes)
{
    static const char full[] =
        "rediss://u:secret@h:6380/"
        "3?ssl_cert_reqs=CERT_OPTIONAL&ssl_ca_certs=%2Fa%2Fca.pem&"
        "ssl_ca_path=/cas&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_check_hostname=true";
    struct redis_url u;
    struct cr_err e = {0, ""};
    char buf[sizeof(full)];
    for (size_t n = 0; n <= strlen(full); n++) {
        memcpy(buf, full, n);
        buf[n] = '\0';
        if (redis_url_parse_flags(&u, buf, "result backend", REDIS_URL_TLS_STRICT, &e) ==
            0)
            ck_assert(!u.tls.on || u.tls.cert_reqs_given);
        else if (strchr(buf, '@')) /* before it, "u:secret" is a host and a port */
            ck_assert_msg(strstr(e.msg, "secret") == NULL, "%s", e.msg);
    }
    ck_assert_int_eq(
        redis_url_parse_flags(&u, full, "result backend", REDIS_URL_TLS_STRICT, &e), 0);
    ck_assert_int_eq(u.tls.cert_reqs, REDIS_TLS_VERIFY_OPTIONAL);
    ck_assert_str_eq(u.tls.ca_certs, "/a/ca.pem");
    ck_assert_str_eq(u.tls.ca_path, "/cas");
    ck_assert_str_eq(u.tls.certfile, "/c.pem");
    ck_assert_str_eq(u.tls.keyfile, "/k.pem");
    ck_assert_int_eq(u.tls.check_hostname, 1);
    ck_assert_str_eq(u.user, "u");
    ck_assert_int_eq(u.db, 3);
}
END_TEST

START_TEST(test_unix)
{
    struct redis_url u;
    struct cr_err e = {0, ""};
    ck_assert_int_eq(redis_url_parse(&u, "redis+socket:///run/redis.sock", "b", &e), 0);
    ck_assert_int_eq(u.kind, REDIS_URL_UNIX);
    ck_assert_str_eq(u.socket_path, "/run/redis.sock");
    ck_assert_int_eq(u.db, 0);
    ck_assert_int_eq(
        redis_url_parse(&u, "redis+socket:///t/r.sock?virtual_host=3&password=p%40w", "b",
                        &e),
        0);
    ck_assert_str_eq(u.socket_path, "/t/r.sock");
    ck_assert_int_eq(u.db, 3);
    ck_assert_str_eq(u.password, "p@w");
    ck_assert_int_eq(redis_url_parse(&u, "unix:///t/r.sock?db=5", "b", &e), 0);
    ck_assert_int_eq(u.kind, REDIS_URL_UNIX);
    ck_assert_int_eq(u.db, 5);
    /* the password in the query is never quoted */
    ck_assert_int_eq(redis_url_parse(&u, "unix:///s?password=secret&db=x", "b", &e),
                     CR_EINVAL);
    ck_assert_msg(strstr(e.msg, "secret") == NULL, "%s", e.msg);
}
END_TEST

/* ';' ends an entry, so a password cannot hold one; db, user and password of
 * the later entries are ignored, and the limit is REDIS_URL_MAX_SENTINELS. */
START_TEST(test_sentinel_list)
{
    static char url[REDIS_URL_MAX_BYTES + 64];
    struct redis_url u;
    struct cr_err e = {0, ""};
    size_t n = 0;
    ck_assert_int_eq(redis_url_parse(&u,
                                     "sentinel://u:pw@h1:26380/4;sentinel://h2/9;"
                                     "sentinel://:other@[::1]:7",
                                     "b", &e),
                     0);
    ck_assert_int_eq(u.n_sentinels, 3);
    ck_assert_str_eq(u.sentinels[0].host, "h1");
    ck_assert_int_eq(u.sentinels[0].port, 26380);
    ck_assert_str_eq(u.sentinels[1].host, "h2");
    ck_assert_int_eq(u.sentinels[1].port, 26379);
    ck_assert_str_eq(u.sentinels[2].host, "::1");
    ck_assert_int_eq(u.sentinels[2].port, 7);
    ck_assert_str_eq(u.user, "u");
    ck_assert_str_eq(u.password, "pw");
    ck_assert_int_eq(u.db, 4);
    ck_assert_str_eq(u.host, "h1");
    ck_assert_int_eq(u.port, 26380);

    for (int i = 0; i < REDIS_URL_MAX_SENTINELS; i++)
        n += (size_t)snprintf(url + n, sizeof(url) - n, "%ssentinel://h%d:%d",
                              i ? ";" : "", i, 26379 + i);
    ck_assert_int_eq(redis_url_parse(&u, url, "b", &e), 0);
    ck_assert_int_eq(u.n_sentinels, REDIS_URL_MAX_SENTINELS);
    ck_assert_str_eq(u.sentinels[15].host, "h15");
    ck_assert_int_eq(u.sentinels[15].port, 26394);
    snprintf(url + n, sizeof(url) - n, ";sentinel://one-more");
    ck_assert_int_eq(redis_url_parse(&u, url, "b", &e), CR_EINVAL);
    ck_assert_msg(strstr(e.msg, "more than 16 sentinels") != NULL, "%s", e.msg);
}
END_TEST

/* Celery's result_backend_transport_options as the worker takes them. */
START_TEST(test_backend_options)
{
    struct backend_options o;
    struct cr_err e = {0, ""};
    static const char *const bad[][2] = {
        {"[]", "not a JSON object"},
        {"{", "transport options are not JSON: bad JSON at byte 1"},
        {"{\"master_name\": 1}", "'master_name' must be a string"},
        {"{\"socket_timeout\": \"3\"}", "'socket_timeout' must be seconds"},
        {"{\"socket_timeout\": -1}", "must be seconds"},
        {"{\"visibility_timeout\": 3}", "unknown result backend transport option "
                                        "'visibility_timeout'"},
        {"{\"sentinel_kwargs\": {\"ssl\": true}}", "'sentinel_kwargs.ssl'"},
        {"{\"sentinel_kwargs\": 3}", "'sentinel_kwargs' must be an object"},
        {"{\"retry_policy\": 3}", "'retry_policy' must be an object"},
    };
    ck_assert_int_eq(backend_options_parse(&o, NULL, &e), 0);
    ck_assert_str_eq(o.master_name, "");
    ck_assert(o.socket_timeout < 0 && o.health_check_interval < 0);
    ck_assert_int_eq(backend_options_parse(&o, "", &e), 0);
    ck_assert_int_eq(backend_options_parse(
                         &o,
                         "{\"master_name\": \"mymaster\", \"global_keyprefix\": "
                         "\"pfx\", \"sentinel_kwargs\": {\"password\": \"sp\", "
                         "\"username\": \"su\", \"socket_timeout\": 1}, "
                         "\"socket_timeout\": 2.5, \"socket_connect_timeout\": null, "
                         "\"health_check_interval\": 0, \"retry_policy\": "
                         "{\"max_retries\": 3}}",
                         &e),
                     0);
    ck_assert_str_eq(o.master_name, "mymaster");
    ck_assert_str_eq(o.global_keyprefix, "pfx");
    ck_assert_str_eq(o.sentinel_password, "sp");
    ck_assert_str_eq(o.sentinel_user, "su");
    ck_assert(o.socket_timeout == 2.5);
    ck_assert(o.socket_connect_timeout < 0);
    ck_assert(o.health_check_interval == 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(backend_options_parse(&o, bad[i][0], &e), CR_EINVAL);
        ck_assert_msg(strstr(e.msg, bad[i][1]) != NULL, "%s: %s", bad[i][0], e.msg);
    }
}
END_TEST

/* redact_url() (util/redact.c, was config_redact_url): what the worker logs
 * of its broker and backend URLs. */
START_TEST(test_redact_url)
{
    static const char *const v[][2] = {
        {"redis://:pw@h:6379/0", "redis://:**@h:6379/0"},
        {"redis://u:pw@h/1", "redis://u:**@h/1"},
        {"amqp://guest:guest@localhost:5672//", "amqp://guest:**@localhost:5672//"},
        {"redis://h:6379/0", "redis://h:6379/0"},
        {"amqp://user@h//", "amqp://user@h//"},
        {"not a url", "not a url"},
        {"amqp://u:p1@a//;amqp://b;amqp://v:p2@c:5673/x",
         "amqp://u:**@a//;amqp://b;amqp://v:**@c:5673/x"},
        {"sentinel://:pw@a:26379;sentinel://:pw@b:26379",
         "sentinel://:**@a:26379;sentinel://:**@b:26379"},
        {"amqp://a;", "amqp://a;"},
    };
    char out[128];
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        redact_url(v[i][0], out, sizeof(out));
        ck_assert_str_eq(out, v[i][1]);
    }
    redact_url("redis://:pw@hostname", out, 8);
    ck_assert_str_eq(out, "redis:/");
    for (size_t n = 1; n < 40; n++) { /* every cut of a list stays terminated */
        redact_url("amqp://u:secret@a//;amqp://u:secret@b//", out, n);
        ck_assert(strlen(out) < n);
        ck_assert(strstr(out, "secret") == NULL);
    }
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("redis_url");
    TCase *tc = tcase_create("core");
    tcase_add_loop_test(tc, test_good, 0, (int)(sizeof(good) / sizeof(good[0])));
    tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
    tcase_add_test(tc, test_what);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_reuse);
    tcase_add_test(tc, test_redact_url);
    tcase_add_test(tc, test_tls);
    tcase_add_loop_test(tc, test_tls_cert_reqs, 0,
                        (int)(sizeof(cert_reqs) / sizeof(cert_reqs[0])));
    tcase_add_loop_test(tc, test_tls_bad, 0, (int)(sizeof(tls_bad) / sizeof(tls_bad[0])));
    tcase_add_test(tc, test_tls_prefixes);
    tcase_add_test(tc, test_unix);
    tcase_add_test(tc, test_sentinel_list);
    tcase_add_test(tc, test_backend_options);
    suite_add_tcase(s, tc);
    return s;
}
