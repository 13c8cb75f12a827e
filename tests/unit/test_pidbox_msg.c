/* test_pidbox_msg.c -- remote-control requests, matching, reply shapes, statedb. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "protocol/pidbox_msg.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

static char *dump(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return buf_detach(&b);
}

static void assert_json(cJSON *v, const char *want)
{
    char *s;
    ck_assert_ptr_nonnull(v);
    s = dump(v);
    ck_assert_str_eq(s, want);
    cr_free(s);
    cJSON_Delete(v);
}

static cJSON *parse(const char *text)
{
    cJSON *v = NULL;
    ck_assert_int_eq(py_json_parse(text, strlen(text), &v, NULL), 0);
    return v;
}

/* ------------------------------------------------------------- requests */

/* What kombu 5.2.4 publishes for `celery inspect ping` (one destination). */
static const char ping_body[] =
    "{\"method\": \"ping\", \"arguments\": {}, \"destination\": [\"celery@a\"], "
    "\"pattern\": null, \"matcher\": null, \"ticket\": \"t-1\", "
    "\"reply_to\": {\"exchange\": \"reply.celery.pidbox\", \"routing_key\": \"oid-9\"}}";

START_TEST(test_parse_call)
{
    struct pidbox_request rq;
    struct cr_err err;
    ck_assert_int_eq(pidbox_request_parse(ping_body, strlen(ping_body), &rq, &err), 0);
    ck_assert_str_eq(rq.method, "ping");
    ck_assert(cJSON_IsObject(rq.arguments));
    ck_assert_str_eq(rq.ticket, "t-1");
    ck_assert_str_eq(rq.reply_exchange, "reply.celery.pidbox");
    ck_assert_str_eq(rq.reply_routing_key, "oid-9");
    ck_assert_ptr_null(rq.pattern);
    ck_assert_int_eq(pidbox_request_matches(&rq, "celery@a"), 1);
    ck_assert_int_eq(pidbox_request_matches(&rq, "celery@b"), 0);
    pidbox_request_release(&rq);
    pidbox_request_release(&rq); /* released twice is harmless */
}
END_TEST

START_TEST(test_parse_cast)
{
    struct pidbox_request rq;
    const char *b = "{\"method\": \"enable_events\", \"arguments\": null}";
    ck_assert_int_eq(pidbox_request_parse(b, strlen(b), &rq, NULL), 0);
    ck_assert_ptr_null(rq.ticket);
    ck_assert_ptr_null(rq.reply_exchange);
    ck_assert_ptr_null(rq.destination);
    ck_assert_int_eq(cJSON_GetArraySize(rq.arguments), 0);
    ck_assert_int_eq(pidbox_request_matches(&rq, "anyone@x"), 1);
    pidbox_request_release(&rq);
}
END_TEST

static const struct {
    const char *body;
    int rc;
} bad_requests[] = {
    {"", CR_EDECODE},
    {"{", CR_EDECODE},
    {"{\"method\": \"ping\",}", CR_EDECODE},
    {"[]", CR_EPROTO},
    {"\"ping\"", CR_EPROTO},
    {"{}", CR_EPROTO},
    {"{\"method\": 1}", CR_EPROTO},
    {"{\"method\": \"ping\", \"arguments\": []}", CR_EPROTO},
    {"{\"method\": \"ping\", \"destination\": \"celery@a\"}", CR_EPROTO},
    {"{\"method\": \"ping\", \"destination\": [1]}", CR_EPROTO},
    {"{\"method\": \"ping\", \"reply_to\": {\"exchange\": \"x\"}}", CR_EPROTO},
    {"{\"method\": \"ping\", \"reply_to\": \"x\"}", CR_EPROTO},
};

START_TEST(test_parse_bad)
{
    struct pidbox_request rq;
    struct cr_err err = {0, ""};
    const char *b = bad_requests[_i].body;
    ck_assert_int_eq(pidbox_request_parse(b, strlen(b), &rq, &err), bad_requests[_i].rc);
    ck_assert_int_ne(err.msg[0], '\0');
    pidbox_request_release(&rq);
}
END_TEST

/* Every prefix of a good request is refused cleanly (never read past len). */
START_TEST(test_parse_prefixes)
{
    size_t n = strlen(ping_body);
    for (size_t i = 0; i < n; i++) {
        char *copy = cr_malloc(i ? i : 1);
        struct pidbox_request rq;
        memcpy(copy, ping_body, i);
        ck_assert_int_lt(pidbox_request_parse(copy, i, &rq, NULL), 0);
        pidbox_request_release(&rq);
        cr_free(copy);
    }
}
END_TEST

#define PLUS10 "++++++++++"
#define PLUS100 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10 PLUS10
#define GROUPS8 "(x)?(x)?(x)?(x)?(x)?(x)?(x)?(x)?"
#define OPEN8 "(?:(?:(?:(?:(?:(?:(?:(?:"
#define CLOSE8 "))))))))"

/* The pattern libFuzzer found (fuzz_pidbox_msg) on which glibc's regcomp() ran
 * for over 20 minutes; the corpus keeps it as pcre_hostile_eclosure. */
#define HOSTILE_PCRE ".....??*????????????????????????+++++...z...............''edery@*"

static const struct {
    const char *extra;
    const char *node;
    int want;
} matches[] = {
    {"\"destination\": []", "celery@a", 1},
    {"\"destination\": null", "celery@a", 1},
    {"\"destination\": [\"x@1\", \"celery@a\"]", "celery@a", 1},
    {"\"destination\": [\"x@1\"], \"pattern\": \"*\", \"matcher\": \"glob\"", "celery@a",
     0},
    /* kombu tests "pattern and matcher": an empty one is a broadcast */
    {"\"pattern\": \"\", \"matcher\": \"glob\"", "celery@a", 1},
    {"\"pattern\": \"x*\", \"matcher\": \"\"", "celery@a", 1},
    {"\"pattern\": \"x*\"", "celery@a", 1},
    {"\"pattern\": \"x*\", \"matcher\": \"regex\"", "celery@a", CR_EINVAL},
    /* glob is Python's fnmatch */
    {"\"pattern\": \"celery@*\", \"matcher\": \"glob\"", "celery@a", 1},
    {"\"pattern\": \"*\", \"matcher\": \"glob\"", "", 1},
    {"\"pattern\": \"celery@?\", \"matcher\": \"glob\"", "celery@ab", 0},
    {"\"pattern\": \"celery@?\", \"matcher\": \"glob\"", "celery@a", 1},
    {"\"pattern\": \"worker@*\", \"matcher\": \"glob\"", "celery@a", 0},
    {"\"pattern\": \"*@*.example.*\", \"matcher\": \"glob\"", "w1@h.example.org", 1},
    {"\"pattern\": \"*@*.example.*\", \"matcher\": \"glob\"", "w1@h.example", 0},
    {"\"pattern\": \"w[0-9]@*\", \"matcher\": \"glob\"", "w7@h", 1},
    {"\"pattern\": \"w[!0-9]@*\", \"matcher\": \"glob\"", "w7@h", 0},
    {"\"pattern\": \"w[!0-9]@*\", \"matcher\": \"glob\"", "wx@h", 1},
    {"\"pattern\": \"[]x]@h\", \"matcher\": \"glob\"", "]@h", 1},
    {"\"pattern\": \"[a-]@h\", \"matcher\": \"glob\"", "-@h", 1},
    {"\"pattern\": \"[z-a]@h\", \"matcher\": \"glob\"", "z@h", 0},
    {"\"pattern\": \"[x@h\", \"matcher\": \"glob\"", "[x@h", 1},
    /* in Python's fnmatch '^' does not negate and '\' escapes nothing */
    {"\"pattern\": \"[^c]elery@a\", \"matcher\": \"glob\"", "xelery@a", 0},
    {"\"pattern\": \"[^c]elery@a\", \"matcher\": \"glob\"", "^elery@a", 1},
    {"\"pattern\": \"celery\\\\@a\", \"matcher\": \"glob\"", "celery@a", 0},
    {"\"pattern\": \"celery\\\\@a\", \"matcher\": \"glob\"", "celery\\@a", 1},
    /* pcre is re.match: anchored at the start, not at the end */
    {"\"pattern\": \"cel.*a\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"ery@a\", \"matcher\": \"pcre\"", "celery@a", 0},
    {"\"pattern\": \"celery\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"celery@a$\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"a|celery\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"(\", \"matcher\": \"pcre\"", "celery@a", CR_EINVAL},
    {"\"pattern\": \"worker[0-9]{2}@.*\", \"matcher\": \"pcre\"", "worker12@h", 1},
    {"\"pattern\": \"\\\\w+@(?!b)\\\\w\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"(?i)CELERY@\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"c[{" PLUS10 PLUS10 "]*e+lery@a\", \"matcher\": \"pcre\"", "celery@a",
     1},
    /* Unicode, as re on a str: '.' is one code point */
    {"\"pattern\": \"w.@h\", \"matcher\": \"pcre\"", "w\xc3\xa9@h", 1},
    /* What glibc's regcomp() took gigabytes for is refused as Python's re
     * refuses it ("multiple repeat"), or matched as it should. */
    {"\"pattern\": \"celery@a" PLUS100 "\", \"matcher\": \"pcre\"", "celery@a",
     CR_EINVAL},
    {"\"pattern\": \"celery@a++\", \"matcher\": \"pcre\"", "celery@a", 1},
    {"\"pattern\": \"(c{99}){99}\", \"matcher\": \"pcre\"", "celery@a", 0},
    {"\"pattern\": \"c+e+l+e+r+y+@+a+(x)?\", \"matcher\": \"pcre\"", "celery@a", 1},
    /* at most 32 capturing groups, and groups nested 32 deep */
    {"\"pattern\": \"celery" GROUPS8 GROUPS8 GROUPS8 GROUPS8 "\", \"matcher\": \"pcre\"",
     "celery@a", 1},
    {"\"pattern\": \"celery" GROUPS8 GROUPS8 GROUPS8 GROUPS8 "(x)?\", \"matcher\": "
     "\"pcre\"",
     "celery@a", CR_EINVAL},
    {"\"pattern\": \"" OPEN8 OPEN8 OPEN8 OPEN8 "celery" CLOSE8 CLOSE8 CLOSE8 CLOSE8
     "\", \"matcher\": \"pcre\"",
     "celery@a", 1},
    {"\"pattern\": \"(?:" OPEN8 OPEN8 OPEN8 OPEN8 "celery" CLOSE8 CLOSE8 CLOSE8 CLOSE8
     ")\", \"matcher\": \"pcre\"",
     "celery@a", CR_EINVAL},
};

START_TEST(test_matches)
{
    char body[512];
    struct pidbox_request rq;
    struct pidbox_matcher *pm = pidbox_matcher_new();
    struct cr_err err = {0, ""};
    int want = matches[_i].want;

    ck_assert_ptr_nonnull(pm);
    snprintf(body, sizeof(body), "{\"method\": \"ping\", %s}", matches[_i].extra);
    ck_assert_int_eq(pidbox_request_parse(body, strlen(body), &rq, NULL), 0);
    ck_assert_int_eq(pidbox_match(NULL, &rq, matches[_i].node, &err), want);
    ck_assert_int_eq(pidbox_request_matches(&rq, matches[_i].node), want == 1);
    /* the same twice through a cache: compiled the first time, reused after */
    for (int k = 0; k < 2; k++) {
        memset(&err, 0, sizeof(err));
        ck_assert_int_eq(pidbox_match(pm, &rq, matches[_i].node, &err), want);
        ck_assert_int_eq(err.code, want < 0 ? want : 0);
        if (want < 0)
            ck_assert_int_ne(err.msg[0], '\0');
    }
    pidbox_request_release(&rq);
    pidbox_matcher_free(pm);
}
END_TEST

/* Patterns that take a backtracking matcher (or glibc's regcomp()) exponential
 * time, on node names that make them try: each one matches nothing and returns
 * at once, refused when it does not compile (HOSTILE_PCRE is "multiple repeat"
 * in Python's re too), cut off by PCRE2's match limit (CR_ERANGE) where its
 * optimizer does not see through it. No clock is read: a hang shows as Check's
 * per-test timeout. */
#define A48 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define HOSTS "celery@hostcelery@hostcelery@hostcelery@host"
static const struct {
    const char *pattern;
    const char *node;
    int want;
} hostile[] = {
    {HOSTILE_PCRE, "celery@host", CR_EINVAL},
    {HOSTILE_PCRE, "......................................................", CR_EINVAL},
    {"(a+)+$", A48 "!", CR_ERANGE},
    {"(a|aa)*b", A48 "!b", CR_ERANGE},
    {"(a|a)*b", A48 "!b", CR_ERANGE},
    {"(.*a){20}", A48, CR_ERANGE},
    {"(\\w+\\s?)*$", "celeriac worker node name with many words that ends in a !",
     CR_ERANGE},
    {"((((((((((a*)*)*)*)*)*)*)*)*)*)*b", A48 "!b", CR_ERANGE},
    {"(x+x+)+y", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx!y", CR_ERANGE},
    /* nested lazy and greedy '?' and '*', as in HOSTILE_PCRE but valid */
    {"(.?){40}.{40}", "celery@aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 0},
    {".??.??.??.??.??.??.??.??.??.??.*?.*?.*?.*?.*?.*?.*?.*?!", HOSTS HOSTS, 0},
    {"((.)*)*\\2z", HOSTS "!", 0},
    {"(?:.?\?(?:.*?)?)*x", HOSTS, 0}, /* "??(" would be a trigraph */
};

START_TEST(test_match_hostile)
{
    struct pidbox_matcher *pm = pidbox_matcher_new();
    cJSON *o = cJSON_CreateObject();
    char *body;
    struct pidbox_request rq;
    struct cr_err err;
    int rc;

    ck_assert_ptr_nonnull(pm);
    cJSON_AddStringToObject(o, "method", "ping");
    cJSON_AddStringToObject(o, "pattern", hostile[_i].pattern);
    cJSON_AddStringToObject(o, "matcher", "pcre");
    body = cJSON_PrintUnformatted(o);
    ck_assert_int_eq(pidbox_request_parse(body, strlen(body), &rq, NULL), 0);
    for (int k = 0; k < 3; k++) {
        memset(&err, 0, sizeof(err));
        rc = pidbox_match(pm, &rq, hostile[_i].node, &err);
        ck_assert_int_eq(rc, hostile[_i].want);
        ck_assert_int_eq(err.code, rc);
    }
    pidbox_request_release(&rq);
    cJSON_free(body);
    cJSON_Delete(o);
    pidbox_matcher_free(pm);
}
END_TEST

/* Returns pidbox_match() of a request with this pattern (a JSON-safe string). */
static int match_one(struct pidbox_matcher *pm, const char *matcher, const char *pattern,
                     const char *node)
{
    struct buf b;
    struct pidbox_request rq;
    int rc;
    buf_init(&b);
    ck_assert_int_eq(buf_printf(&b,
                                "{\"method\": \"ping\", \"pattern\": \"%s\", "
                                "\"matcher\": \"%s\"}",
                                pattern, matcher),
                     0);
    ck_assert_int_eq(pidbox_request_parse(b.data, b.len, &rq, NULL), 0);
    rc = pidbox_match(pm, &rq, node, NULL);
    pidbox_request_release(&rq);
    buf_release(&b);
    return rc;
}

/* A pattern of PIDBOX_PATTERN_MAX bytes is matched; one byte more, never. */
START_TEST(test_match_length)
{
    char pat[PIDBOX_PATTERN_MAX + 2];
    const char *matcher = _i ? "glob" : "pcre";
    /* pcre: "celery" then "x?" pairs; glob: "celery" then '*'s */
    memset(pat, _i ? '*' : '?', sizeof(pat));
    memcpy(pat, "celery", 6);
    for (size_t k = 6; !_i && k + 1 < sizeof(pat); k += 2)
        pat[k] = 'x';
    pat[PIDBOX_PATTERN_MAX] = '\0';
    ck_assert_int_eq(match_one(NULL, matcher, pat, "celery@a"), 1);
    pat[PIDBOX_PATTERN_MAX] = _i ? '*' : 'x';
    pat[PIDBOX_PATTERN_MAX + 1] = '\0';
    ck_assert_int_eq(match_one(NULL, matcher, pat, "celery@a"), CR_ETOOBIG);
}
END_TEST

/* Many '*' and '?' cost the glob matcher length x length steps, not more. */
START_TEST(test_match_glob_stars)
{
    char pat[PIDBOX_PATTERN_MAX + 1];
    char node[256];
    memset(node, 'a', sizeof(node) - 1);
    node[sizeof(node) - 1] = '\0';
    for (size_t k = 0; k < sizeof(pat) - 1; k++)
        pat[k] = "*a*?"[k % 4];
    pat[sizeof(pat) - 2] = 'b';
    pat[sizeof(pat) - 1] = '\0';
    ck_assert_int_eq(match_one(NULL, "glob", pat, node), 0);
    pat[sizeof(pat) - 2] = '*';
    ck_assert_int_eq(match_one(NULL, "glob", pat, node), 0); /* 510 bytes needed */
    ck_assert_int_eq(match_one(NULL, "glob", "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", node),
                     0);
    ck_assert_int_eq(match_one(NULL, "glob", "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*", node),
                     1);
}
END_TEST

/* A cached pattern is matched again without allocating: compiled once. */
START_TEST(test_match_cache)
{
    struct pidbox_matcher *pm = pidbox_matcher_new();
    char pat[32];

    ck_assert_ptr_nonnull(pm);
    ck_assert_int_eq(match_one(pm, "pcre", "cel+ery@", "celery@a"), 1);
    ck_assert_int_eq(match_one(pm, "pcre", "(", "celery@a"), CR_EINVAL);
    /* parse first: then the armed failure can only hit the matcher */
    {
        const char *b = "{\"method\": \"ping\", \"pattern\": \"cel+ery@\", "
                        "\"matcher\": \"pcre\"}";
        const char *bad = "{\"method\": \"ping\", \"pattern\": \"(\", "
                          "\"matcher\": \"pcre\"}";
        struct pidbox_request rq, rq_bad;
        ck_assert_int_eq(pidbox_request_parse(b, strlen(b), &rq, NULL), 0);
        ck_assert_int_eq(pidbox_request_parse(bad, strlen(bad), &rq_bad, NULL), 0);
        cr_alloc_fail_after(1);
        ck_assert_int_eq(pidbox_match(pm, &rq, "celery@a", NULL), 1);
        ck_assert_int_eq(pidbox_match(pm, &rq_bad, "celery@a", NULL), CR_EINVAL);
        ck_assert_int_eq(cr_alloc_failed(), 0);
        cr_alloc_fail_after(0);
        /* another node name: the pattern is reused, the verdict is not */
        ck_assert_int_eq(pidbox_match(pm, &rq, "worker@b", NULL), 0);
        ck_assert_int_eq(pidbox_match(pm, &rq, "celery@a", NULL), 1);
        pidbox_request_release(&rq);
        pidbox_request_release(&rq_bad);
    }
    /* twenty other patterns push the first two out; they compile again */
    for (int k = 0; k < 20; k++) {
        snprintf(pat, sizeof(pat), "w%d@", k);
        ck_assert_int_eq(match_one(pm, "pcre", pat, "celery@a"), 0);
    }
    ck_assert_int_eq(match_one(pm, "pcre", "cel+ery@", "celery@a"), 1);
    ck_assert_int_eq(match_one(pm, "pcre", "(", "celery@a"), CR_EINVAL);
    pidbox_matcher_free(pm);
    pidbox_matcher_free(NULL);
}
END_TEST

/* Out of memory anywhere in the matcher: CR_ENOMEM or NULL, nothing leaks. */
START_TEST(test_match_oom)
{
    const char *b = "{\"method\": \"ping\", \"pattern\": \"(c|x)el+ery@\", "
                    "\"matcher\": \"pcre\"}";
    struct pidbox_request rq;
    long n;
    ck_assert_int_eq(pidbox_request_parse(b, strlen(b), &rq, NULL), 0);
    for (n = 1;; n++) {
        struct pidbox_matcher *pm;
        int rc;
        cr_alloc_fail_after(n);
        pm = pidbox_matcher_new();
        rc = pm ? pidbox_match(pm, &rq, "celery@a", NULL) : CR_ENOMEM;
        cr_alloc_fail_after(0);
        pidbox_matcher_free(pm);
        if (rc == 1)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
    ck_assert(n > 1);
    pidbox_request_release(&rq);
}
END_TEST

/* ------------------------------------------------------------ arguments */

START_TEST(test_arguments)
{
    cJSON *a =
        parse("{\"s\": \"x\", \"n\": 2.5, \"ns\": \"10\", \"bad\": \"1x\", "
              "\"t\": true, \"z\": 0, \"ts\": \"True\", \"null\": null, "
              "\"list\": [\"a\", \"b\", \"a\"], \"one\": \"id\", \"mixed\": [\"a\", 1]}");
    const char *s;
    double d;
    int b;
    cJSON *ids;
    ck_assert_int_eq(pidbox_arg_str(a, "s", &s), 1);
    ck_assert_str_eq(s, "x");
    ck_assert_int_eq(pidbox_arg_str(a, "missing", &s), 0);
    ck_assert_int_eq(pidbox_arg_str(a, "null", &s), 0);
    ck_assert_int_eq(pidbox_arg_str(a, "n", &s), CR_EINVAL);
    ck_assert_int_eq(pidbox_arg_num(a, "n", &d), 1);
    ck_assert_double_eq(d, 2.5);
    ck_assert_int_eq(pidbox_arg_num(a, "ns", &d), 1);
    ck_assert_double_eq(d, 10);
    ck_assert_int_eq(pidbox_arg_num(a, "bad", &d), CR_EINVAL);
    ck_assert_int_eq(pidbox_arg_num(a, "list", &d), CR_EINVAL);
    ck_assert_int_eq(pidbox_arg_num(a, "null", &d), 0);
    ck_assert_int_eq(pidbox_arg_bool(a, "t", &b), 1);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(pidbox_arg_bool(a, "z", &b), 1);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(pidbox_arg_bool(a, "ts", &b), 1);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(pidbox_arg_bool(a, "s", &b), CR_EINVAL);
    ck_assert_int_eq(pidbox_arg_bool(a, "missing", &b), 0);
    ck_assert_int_eq(pidbox_arg_ids(a, "list", &ids), 1);
    assert_json(ids, "[\"a\", \"b\"]");
    ck_assert_int_eq(pidbox_arg_ids(a, "one", &ids), 1);
    assert_json(ids, "[\"id\"]");
    ck_assert_int_eq(pidbox_arg_ids(a, "mixed", &ids), CR_EINVAL);
    ck_assert_ptr_null(ids);
    ck_assert_int_eq(pidbox_arg_ids(a, "n", &ids), CR_EINVAL);
    ck_assert_int_eq(pidbox_arg_ids(a, "missing", &ids), 0);
    ck_assert_ptr_null(ids);
    cJSON_Delete(a);
}
END_TEST

/* --------------------------------------------------------------- replies */

START_TEST(test_reply_encode)
{
    struct buf b;
    cJSON *ok = pidbox_ok("pong");
    buf_init(&b);
    ck_assert_int_eq(pidbox_reply_encode("celery@a", ok, &b), 0);
    ck_assert_str_eq(b.data, "{\"celery@a\": {\"ok\": \"pong\"}}");
    buf_reset(&b);
    ck_assert_int_eq(pidbox_reply_encode("celery@a", NULL, &b), 0);
    ck_assert_str_eq(b.data, "{\"celery@a\": null}");
    buf_release(&b);
    cJSON_Delete(ok);
    assert_json(pidbox_error("unknown task"), "{\"error\": \"unknown task\"}");
    assert_json(pidbox_error_exc("KeyError", "no_such"),
                "{\"error\": \"KeyError('no_such')\"}");
}
END_TEST

START_TEST(test_revoke_replies)
{
    cJSON *ids = parse("[\"a\", \"b\"]"), *one = parse("[\"b\"]"), *none = parse("[]");
    assert_json(pidbox_revoke_reply(ids, 0, NULL),
                "{\"ok\": \"tasks a, b flagged as revoked\"}");
    assert_json(pidbox_revoke_reply(ids, 1, one), "{\"ok\": \"terminate: b\"}");
    assert_json(pidbox_revoke_reply(ids, 1, none),
                "{\"ok\": \"terminate: tasks unknown\"}");
    assert_json(pidbox_revoke_reply(ids, 1, NULL),
                "{\"ok\": \"terminate: tasks unknown\"}");
    cJSON_Delete(ids);
    cJSON_Delete(one);
    cJSON_Delete(none);
}
END_TEST

START_TEST(test_task_info)
{
    cJSON *args = parse("[\"hi\", 2]"), *kwargs = parse("{\"model\": \"m\"}");
    struct pidbox_task_info ti = {
        "id1", "llm.generate", args, kwargs, NULL, NULL, "celery@a", 1700000000.5, 1,
        "",    "celery",       0,    0,      4242};
    assert_json(pidbox_task_info_new(&ti, 0),
                "{\"id\": \"id1\", \"name\": \"llm.generate\", \"args\": [\"hi\", 2], "
                "\"kwargs\": {\"model\": \"m\"}, \"type\": \"llm.generate\", "
                "\"hostname\": \"celery@a\", \"time_start\": 1700000000.5, "
                "\"acknowledged\": true, \"delivery_info\": {\"exchange\": \"\", "
                "\"routing_key\": \"celery\", \"priority\": 0, \"redelivered\": false}, "
                "\"worker_pid\": 4242}");
    assert_json(pidbox_task_info_new(&ti, 1),
                "{\"id\": \"id1\", \"name\": \"llm.generate\", \"args\": \"('hi', 2)\", "
                "\"kwargs\": \"{'model': 'm'}\", \"type\": \"llm.generate\", "
                "\"hostname\": \"celery@a\", \"time_start\": 1700000000.5, "
                "\"acknowledged\": true, \"delivery_info\": {\"exchange\": \"\", "
                "\"routing_key\": \"celery\", \"priority\": 0, \"redelivered\": false}, "
                "\"worker_pid\": 4242}");
    ti.argsrepr = "('x',)";
    ti.kwargsrepr = "{}";
    ti.time_start = -1;
    ti.worker_pid = 0;
    ti.args = NULL;
    ti.kwargs = NULL;
    ti.redelivered = 1;
    ti.priority = 3;
    assert_json(pidbox_task_info_new(&ti, 1),
                "{\"id\": \"id1\", \"name\": \"llm.generate\", \"args\": \"('x',)\", "
                "\"kwargs\": \"{}\", \"type\": \"llm.generate\", "
                "\"hostname\": \"celery@a\", \"time_start\": null, "
                "\"acknowledged\": true, \"delivery_info\": {\"exchange\": \"\", "
                "\"routing_key\": \"celery\", \"priority\": 3, \"redelivered\": true}, "
                "\"worker_pid\": null}");
    assert_json(pidbox_task_info_new(&ti, 0),
                "{\"id\": \"id1\", \"name\": \"llm.generate\", \"args\": [], "
                "\"kwargs\": {}, \"type\": \"llm.generate\", "
                "\"hostname\": \"celery@a\", \"time_start\": null, "
                "\"acknowledged\": true, \"delivery_info\": {\"exchange\": \"\", "
                "\"routing_key\": \"celery\", \"priority\": 3, \"redelivered\": true}, "
                "\"worker_pid\": null}");
    ti.argsrepr = ti.kwargsrepr = NULL;
    {
        cJSON *o = pidbox_task_info_new(&ti, 1);
        ck_assert_str_eq(cJSON_GetObjectItem(o, "args")->valuestring, "()");
        ck_assert_str_eq(cJSON_GetObjectItem(o, "kwargs")->valuestring, "{}");
        cJSON_Delete(o);
    }
    assert_json(pidbox_scheduled_item_new("2030-01-01T00:00:00+00:00", 6, parse("{}")),
                "{\"eta\": \"2030-01-01T00:00:00+00:00\", \"priority\": 6, "
                "\"request\": {}}");
    ck_assert_ptr_null(pidbox_scheduled_item_new("x", 6, NULL));
    cJSON_Delete(args);
    cJSON_Delete(kwargs);
}
END_TEST

START_TEST(test_registered)
{
    const char *names[] = {"llm.generate", "celery.accumulate", "llm.chat", "tasks.x",
                           "llm.chat"};
    const char *rates[] = {"10/m", "1/s", NULL, "", NULL};
    assert_json(pidbox_registered_new(names, rates, 5),
                "[\"llm.chat\", \"llm.generate [rate_limit=10/m]\", \"tasks.x\"]");
    assert_json(pidbox_registered_new(names, NULL, 3),
                "[\"llm.chat\", \"llm.generate\"]");
    assert_json(pidbox_registered_new(NULL, NULL, 0), "[]");
}
END_TEST

START_TEST(test_queue_info)
{
    struct pidbox_queue_info q = {"celery", "celery", "direct", 1, "celery",
                                  1,        0,        0,        0, NULL};
    cJSON *args = parse("{\"x-expires\": 10000, \"x-message-ttl\": 300000, "
                        "\"x-queue-type\": \"quorum\"}");
    assert_json(
        pidbox_queue_info_new(&q),
        "{\"name\": \"celery\", \"exchange\": {\"name\": \"celery\", "
        "\"type\": \"direct\", \"arguments\": null, \"durable\": true, "
        "\"passive\": false, \"auto_delete\": false, \"delivery_mode\": null, "
        "\"no_declare\": false}, \"routing_key\": \"celery\", "
        "\"queue_arguments\": null, \"binding_arguments\": null, "
        "\"consumer_arguments\": null, \"durable\": true, \"exclusive\": false, "
        "\"auto_delete\": false, \"no_ack\": false, \"alias\": null, "
        "\"bindings\": [], \"no_declare\": null, \"expires\": null, "
        "\"message_ttl\": null, \"max_length\": null, \"max_length_bytes\": null, "
        "\"max_priority\": null}");
    q.arguments = args;
    q.auto_delete = 1;
    {
        cJSON *o = pidbox_queue_info_new(&q);
        char *s = dump(o);
        ck_assert_ptr_nonnull(
            strstr(s, "\"queue_arguments\": {\"x-queue-type\": \"quorum\"}"));
        ck_assert_ptr_nonnull(strstr(s, "\"expires\": 10.0, \"message_ttl\": 300.0"));
        ck_assert_ptr_nonnull(strstr(s, "\"auto_delete\": true, \"no_ack\""));
        cr_free(s);
        cJSON_Delete(o);
    }
    cJSON_Delete(args);
}
END_TEST

static const struct {
    const char *url;
    int rc;
    const char *host, *user, *vhost;
    int port, ssl;
} urls[] = {
    {"amqp://guest:secret@127.0.0.1:5673/t-1", 0, "127.0.0.1", "guest", "t-1", 5673, 0},
    {"amqp://h//", 0, "h", "guest", "/", 5672, 0},
    {"amqp://h/", 0, "h", "guest", "/", 5672, 0},
    {"amqp://", 0, "localhost", "guest", "/", 5672, 0},
    {"pyamqp://u@h:1/v%2Fx?heartbeat=5", 0, "h", "u", "v/x", 1, 0},
    {"amqps://us%40r:p@ss@[::1]:5999/", 0, "::1", "us@r", "/", 5999, 1},
    {"amqp://u+%zz@h/v%4", 0, "h", "u+%zz", "v%4", 5672, 0},
    {"amqps://h", 0, "h", "guest", "/", 5671, 1},
    {"amqp://h:notaport/", 0, "h", "guest", "/", 5672, 0},
    {"redis://h/3", 0, "h", "", "3", 6379, 0},
    {"redis://:pw@h", 0, "h", "", "/", 6379, 0},
    {"rediss://u:pw@h:6380/1?ssl_cert_reqs=none", 0, "h", "u", "1", 6380, 1},
    {"sentinel://s1:26380/2;sentinel://s2:26381/2", 0, "s1", "", "2", 26380, 0},
    {"sentinel://s1;sentinel://s2", 0, "s1", "", "/", 26379, 0},
    {"redis+socket:///tmp/r.sock", 0, "localhost", "", "/", 0, 0},
    {"memory://", CR_EINVAL, "", "", "", 0, 0},
};

START_TEST(test_broker_info)
{
    struct pidbox_broker_info bi;
    ck_assert_int_eq(pidbox_broker_info_parse(urls[_i].url, &bi), urls[_i].rc);
    if (urls[_i].rc)
        return;
    ck_assert_str_eq(bi.hostname, urls[_i].host);
    ck_assert_str_eq(bi.userid, urls[_i].user);
    ck_assert_str_eq(bi.virtual_host, urls[_i].vhost);
    ck_assert_int_eq(bi.port, urls[_i].port);
    ck_assert_int_eq(bi.ssl, urls[_i].ssl);
}
END_TEST

START_TEST(test_stats)
{
    struct pidbox_broker_info bi;
    struct pidbox_rusage ru;
    cJSON *total = parse("{\"llm.generate\": 3}");
    struct pidbox_stats st;
    cJSON *o;
    char *s;
    memset(&ru, 0, sizeof(ru));
    ru.utime = 0.25;
    ru.maxrss = 1000;
    pidbox_broker_info_parse("amqp://guest:hunter2@localhost:5672//", &bi);
    memset(&st, 0, sizeof(st));
    st.total = total;
    st.pid = 77;
    st.clock = 35;
    st.uptime_s = 5;
    st.pool_implementation = "celeriac:libuv";
    st.max_concurrency = 100;
    st.broker = &bi;
    st.broker_heartbeat = 60;
    st.broker_connect_timeout = 5;
    st.prefetch_count = 400;
    st.rusage = &ru;
    o = pidbox_stats_new(&st);
    s = dump(o);
    ck_assert_ptr_null(strstr(s, "hunter2"));
    ck_assert_ptr_nonnull(strstr(
        s, "{\"total\": {\"llm.generate\": 3}, \"pid\": 77, \"clock\": \"35\", "
           "\"uptime\": 5, \"pool\": {\"implementation\": \"celeriac:libuv\", "
           "\"max-concurrency\": 100, \"processes\": [77], "
           "\"max-tasks-per-child\": \"N/A\", \"put-guarded-by-semaphore\": false, "
           "\"timeouts\": [0.0, 0.0]}, \"broker\": {\"hostname\": \"localhost\", "
           "\"userid\": \"guest\", \"virtual_host\": \"/\", \"port\": 5672, "));
    ck_assert_ptr_nonnull(strstr(s,
                                 "\"prefetch_count\": 400, \"rusage\": {\"utime\": 0.25, "
                                 "\"stime\": 0.0, \"maxrss\": 1000, "));
    cr_free(s);
    cJSON_Delete(o);
    st.rusage = NULL;
    st.total = NULL;
    o = pidbox_stats_new(&st);
    ck_assert_str_eq(cJSON_GetObjectItem(o, "rusage")->valuestring, "N/A");
    ck_assert(cJSON_IsObject(cJSON_GetObjectItem(o, "total")));
    cJSON_Delete(o);
    cJSON_Delete(total);
}
END_TEST

/* ------------------------------------------------------------- statedb */

struct collected {
    int n;
    char ids[8][64];
    int64_t expires[8];
};

static void collect(const char *id, int64_t expires, void *arg)
{
    struct collected *c = arg;
    if (c->n < 8) {
        snprintf(c->ids[c->n], sizeof(c->ids[0]), "%s", id);
        c->expires[c->n] = expires;
    }
    c->n++;
}

START_TEST(test_statedb_round_trip)
{
    struct buf b;
    struct collected c;
    char long_id[300];
    memset(long_id, 'x', sizeof(long_id) - 1);
    long_id[sizeof(long_id) - 1] = '\0';
    buf_init(&b);
    ck_assert_int_eq(pidbox_statedb_header(&b), 0);
    ck_assert_int_eq(pidbox_statedb_line("a1", 2000, &b), 0);
    ck_assert_int_eq(pidbox_statedb_line("expired", 500, &b), 0);
    ck_assert_int_eq(pidbox_statedb_line("with space", 2000, &b), 0); /* skipped */
    ck_assert_int_eq(pidbox_statedb_line(long_id, 2000, &b), 0);      /* skipped */
    ck_assert_int_eq(pidbox_statedb_line("", 2000, &b), 0);           /* skipped */
    ck_assert_int_eq(pidbox_statedb_line("b2", 3000, &b), 0);
    ck_assert_str_eq(b.data, "celeriac-statedb 1\nrevoked 2000 a1\nrevoked 500 expired\n"
                             "revoked 3000 b2\n");
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(pidbox_statedb_parse(b.data, b.len, 1000, collect, &c), 2);
    ck_assert_str_eq(c.ids[0], "a1");
    ck_assert_int_eq(c.expires[0], 2000);
    ck_assert_str_eq(c.ids[1], "b2");
    /* a file cut anywhere still gives the whole lines before the cut */
    for (size_t n = 0; n < b.len; n++) {
        int rc;
        memset(&c, 0, sizeof(c));
        rc = pidbox_statedb_parse(b.data, n, 1000, collect, &c);
        ck_assert(rc == CR_EPROTO || (rc >= 0 && rc <= 2));
    }
    buf_release(&b);
}
END_TEST

static const struct {
    const char *text;
    int want;
} statedb_files[] = {
    {"", CR_EPROTO},
    {"celeriac-statedb 2\nrevoked 2000 a\n", CR_EPROTO},
    {"garbage", CR_EPROTO},
    {"celeriac-statedb 1", 0},
    {"celeriac-statedb 1\n", 0},
    {"celeriac-statedb 1\nrevoked 2000 a", 1},
    {"celeriac-statedb 1\n\nrevoked 2000 a\n\n", 1},
    {"celeriac-statedb 1\nrevoked  2000 a\nrevoked 2000\nrevoked x a\nrevoke 2000 a\n",
     0},
    {"celeriac-statedb 1\nrevoked 99999999999999999999999 a\n", 0},
    {"celeriac-statedb 1\nrevoked -5 a\nrevoked 2000 b c\nrevoked 2000 d\r\n", 0},
    {"celeriac-statedb 1\nrevoked 2000 \xc3\xa9t\xc3\xa9\n", 1},
};

START_TEST(test_statedb_malformed)
{
    struct collected c;
    const char *t = statedb_files[_i].text;
    memset(&c, 0, sizeof(c));
    ck_assert_int_eq(pidbox_statedb_parse(t, strlen(t), 1000, collect, &c),
                     statedb_files[_i].want);
}
END_TEST

/* --------------------------------------------------------------------- OOM */

static int oom_case(int which)
{
    cJSON *v = NULL, *a = NULL, *ids = NULL;
    struct pidbox_request rq;
    struct buf b;
    int rc = 0;
    buf_init(&b);
    switch (which) {
    case 0:
        rc = pidbox_request_parse(ping_body, strlen(ping_body), &rq, NULL);
        pidbox_request_release(&rq);
        break;
    case 1: {
        cJSON *args = cJSON_CreateArray(), *kw = cJSON_CreateObject();
        struct pidbox_task_info ti = {"id", "n", args, kw,  NULL, NULL, "h",
                                      1,    0,   "",   "q", 0,    0,    1};
        if (!args || !kw) {
            rc = CR_ENOMEM;
        } else {
            v = pidbox_task_info_new(&ti, 1);
            a = v ? pidbox_task_info_new(&ti, 0) : NULL;
            rc = a ? 0 : CR_ENOMEM;
        }
        cJSON_Delete(args);
        cJSON_Delete(kw);
        break;
    }
    case 2: {
        const char *names[] = {"b", "a"};
        const char *rates[] = {"1/s", NULL};
        v = pidbox_registered_new(names, rates, 2);
        rc = v ? 0 : CR_ENOMEM;
        break;
    }
    case 3: {
        struct pidbox_queue_info q = {"q", "q", "direct", 1, "q", 1, 0, 0, 0, NULL};
        v = pidbox_queue_info_new(&q);
        rc = v ? 0 : CR_ENOMEM;
        break;
    }
    case 4: {
        struct pidbox_stats st;
        struct pidbox_rusage ru;
        struct pidbox_broker_info bi;
        memset(&st, 0, sizeof(st));
        memset(&ru, 0, sizeof(ru));
        pidbox_broker_info_parse("amqp://h//", &bi);
        st.broker = &bi;
        st.rusage = &ru;
        v = pidbox_stats_new(&st);
        rc = v ? 0 : CR_ENOMEM;
        break;
    }
    case 5: {
        cJSON *args = cJSON_Parse("{\"task_id\": [\"a\", \"b\"]}");
        rc = args ? pidbox_arg_ids(args, "task_id", &ids) : CR_ENOMEM;
        if (rc == 1) {
            v = pidbox_revoke_reply(ids, 1, ids);
            a = v ? pidbox_error_exc("KeyError", "x") : NULL;
            rc = a ? 0 : CR_ENOMEM;
        }
        cJSON_Delete(args);
        break;
    }
    default: {
        cJSON *ok = pidbox_ok("pong");
        rc = ok ? pidbox_reply_encode("n@h", ok, &b) : CR_ENOMEM;
        if (!rc)
            rc = pidbox_statedb_header(&b);
        if (!rc)
            rc = pidbox_statedb_line("abc", 5, &b);
        cJSON_Delete(ok);
        break;
    }
    }
    cJSON_Delete(v);
    cJSON_Delete(a);
    cJSON_Delete(ids);
    buf_release(&b);
    return rc;
}

START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1;; n++) {
        int rc;
        cr_alloc_fail_after(n);
        rc = oom_case(_i);
        cr_alloc_fail_after(0);
        if (rc == 0)
            break;
        ck_assert_int_eq(rc, CR_ENOMEM);
    }
    ck_assert(n > 1);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("pidbox_msg");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_parse_call);
    tcase_add_test(tc, test_parse_cast);
    tcase_add_loop_test(tc, test_parse_bad, 0,
                        sizeof(bad_requests) / sizeof(bad_requests[0]));
    tcase_add_test(tc, test_parse_prefixes);
    tcase_add_loop_test(tc, test_matches, 0, sizeof(matches) / sizeof(matches[0]));
    tcase_add_loop_test(tc, test_match_hostile, 0, sizeof(hostile) / sizeof(hostile[0]));
    tcase_add_loop_test(tc, test_match_length, 0, 2);
    tcase_add_test(tc, test_match_glob_stars);
    tcase_add_test(tc, test_match_cache);
    tcase_add_test(tc, test_match_oom);
    tcase_add_test(tc, test_arguments);
    tcase_add_test(tc, test_reply_encode);
    tcase_add_test(tc, test_revoke_replies);
    tcase_add_test(tc, test_task_info);
    tcase_add_test(tc, test_registered);
    tcase_add_test(tc, test_queue_info);
    tcase_add_loop_test(tc, test_broker_info, 0, sizeof(urls) / sizeof(urls[0]));
    tcase_add_test(tc, test_stats);
    tcase_add_test(tc, test_statedb_round_trip);
    tcase_add_loop_test(tc, test_statedb_malformed, 0,
                        sizeof(statedb_files) / sizeof(statedb_files[0]));
    tcase_add_loop_test(tc, test_oom_sweep, 0, 7);
    suite_add_tcase(s, tc);
    return s;
}
