/* test_rq_data.c -- RQ's job data (protocol/rq_data.c): the captured jobs of
 * rq-protocol.md 4.2, the writer's bytes against what CPython wrote
 * (tests/fixtures/rq/, made by gen.py there), every refused opcode, every
 * limit, every truncation, malformed UTF-8, round trips and an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "unit.h"
#include "protocol/pyjson.h"
#include "protocol/rq_data.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

#define FX "tests/fixtures/rq/"

static struct rq_limits lim;

static void setup(void)
{
    rq_limits_init(&lim);
}

/* json.dumps() of v, as a new string. */
static char *dumps(const cJSON *v)
{
    struct buf b;
    char *s;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    s = strdup(b.data ? b.data : "");
    buf_release(&b);
    return s;
}

/* json.dumps([func, args, kwargs]) of a decoded call. */
static char *call_json(const struct rq_call *c)
{
    cJSON *a = cJSON_CreateArray();
    char *s;
    cJSON_AddItemToArray(a, cJSON_CreateString(c->func_name));
    cJSON_AddItemReferenceToArray(a, c->args);
    cJSON_AddItemReferenceToArray(a, c->kwargs);
    s = dumps(a);
    cJSON_Delete(a);
    return s;
}

static int loads(const void *p, size_t n, cJSON **out, struct cr_err *err)
{
    return rq_pickle_loads(p, n, &lim, out, err);
}

/* Decodes n bytes and expects an error code whose text holds want. */
static void expect_fail(const void *p, size_t n, int code, const char *want)
{
    struct cr_err err = {0};
    cJSON *v = (cJSON *)1;
    int rc = loads(p, n, &v, &err);
    ck_assert_msg(rc == code, "rc %d (want %d): %s", rc, code, err.msg);
    ck_assert_ptr_null(v);
    if (want)
        ck_assert_msg(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
}

static void expect_json(const void *p, size_t n, const char *want)
{
    struct cr_err err = {0};
    cJSON *v = NULL;
    char *got;
    int rc = loads(p, n, &v, &err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err.msg);
    got = dumps(v);
    ck_assert_str_eq(got, want);
    free(got);
    cJSON_Delete(v);
}

#define S(lit) lit, sizeof(lit) - 1

/* ---- the captures ---------------------------------------------------- */

static const char *const caps[] = {"cap1", "cap2", "cap3"};

START_TEST(test_captures)
{
    char path[128];
    size_t zn, pn;
    char *z, *p, *want;
    struct rq_call c;
    struct cr_err err = {0};
    snprintf(path, sizeof path, FX "%s.zlib", caps[_i]);
    z = unit_read_file(path, &zn);
    snprintf(path, sizeof path, FX "%s.pickle", caps[_i]);
    p = unit_read_file(path, &pn);
    snprintf(path, sizeof path, FX "%s.json", caps[_i]);
    want = unit_read_file(path, NULL);

    /* Compressed as RQ stores it, and raw (RQ's fallback when not zlib). */
    for (int raw = 0; raw < 2; raw++) {
        char *got;
        int rc = rq_data_decode(raw ? p : z, raw ? pn : zn, &lim, &c, &err);
        ck_assert_msg(rc == 0, "%s: %s", caps[_i], err.msg);
        ck_assert_int_eq(c.serializer, RQ_SERIALIZER_PICKLE);
        got = call_json(&c);
        ck_assert_str_eq(got, want);
        free(got);
        rq_call_release(&c);
        ck_assert_ptr_null(c.func_name);
    }
    free(z);
    free(p);
    free(want);
}
END_TEST

START_TEST(test_capture_values)
{
    /* The exact values, not only their JSON text. */
    size_t n;
    char *z = unit_read_file(FX "cap2.zlib", &n);
    struct rq_call c;
    struct cr_err err = {0};
    const cJSON *t;
    ck_assert_int_eq(rq_data_decode(z, n, &lim, &c, &err), 0);
    ck_assert_str_eq(c.func_name, "tasks.llm_inference");
    ck_assert_int_eq(cJSON_GetArraySize(c.args), 0);
    t = cJSON_GetObjectItemCaseSensitive(c.kwargs, "temperature");
    ck_assert(cJSON_IsNumber(t) && (t->type & PY_JSON_FLOAT) && t->valuedouble == 0.5);
    t = cJSON_GetObjectItemCaseSensitive(c.kwargs, "max_tokens");
    ck_assert(cJSON_IsNumber(t) && !(t->type & PY_JSON_FLOAT) && t->valueint == 64);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(c.kwargs, "stream")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(c.kwargs, "stop")));
    rq_call_release(&c);
    rq_call_release(NULL);
    free(z);
}
END_TEST

START_TEST(test_json_serializer)
{
    size_t n;
    char *z = unit_read_file(FX "cap1_json.zlib", &n);
    char *got;
    struct rq_call c;
    struct cr_err err = {0};
    ck_assert_int_eq(rq_data_decode(z, n, &lim, &c, &err), 0);
    ck_assert_int_eq(c.serializer, RQ_SERIALIZER_JSON);
    ck_assert_str_eq(rq_serializer_name(c.serializer), "json");
    got = call_json(&c);
    ck_assert_str_eq(got, "[\"tasks.llm_inference\", [\"Hello\"], {}]");
    free(got);
    rq_call_release(&c);
    free(z);

    /* Raw JSON, and JSON of the wrong shape or with NaN. */
    ck_assert_int_eq(
        rq_data_decode(S("[\"f\", null, [1.5], {\"a\": 1}]"), &lim, &c, &err), 0);
    ck_assert_str_eq(c.func_name, "f");
    rq_call_release(&c);
    ck_assert_int_eq(rq_data_decode(S("[\"f\", null, [NaN], {}]"), &lim, &c, &err),
                     CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("[\"f\", 1, [], {}]"), &lim, &c, &err), CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("[\"f\", null, {}, {}]"), &lim, &c, &err),
                     CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("[\"f\", null, []]"), &lim, &c, &err), CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("[1, null, [], {}]"), &lim, &c, &err), CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("{\"f\": 1}"), &lim, &c, &err), CR_EDECODE);
    ck_assert_ptr_nonnull(strstr(err.msg, "neither"));
    ck_assert_int_eq(rq_data_decode(S(""), &lim, &c, &err), CR_EDECODE);
    ck_assert_ptr_null(c.func_name);
}
END_TEST

START_TEST(test_shape)
{
    struct rq_call c;
    struct cr_err err = {0};
    /* (func, 1, (), {}), ("f", None, {}, {}), a 3-tuple, a bytes name. */
    ck_assert_int_eq(
        rq_data_decode(S("\x80\x05\x8c\x01\x66\x4b\x01\x29\x7d\x87\x2e"), &lim, &c, &err),
        CR_EDECODE);
    ck_assert_int_eq(
        rq_data_decode(S("\x80\x05(\x8c\x01\x66N\x7d\x7dt."), &lim, &c, &err),
        CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("\x80\x05\x8c\x01\x66N)\x87."), &lim, &c, &err),
                     CR_EDECODE);
    ck_assert_int_eq(rq_data_decode(S("\x80\x05(C\x01\x66N)\x7dt."), &lim, &c, &err),
                     CR_EDECODE);
    /* A list of four is what RQ would unpack as well; args may be a list. */
    ck_assert_int_eq(rq_data_decode(S("\x80\x05](\x8c\x01\x66N]\x7d"
                                      "e."),
                                    &lim, &c, &err),
                     0);
    rq_call_release(&c);
}
END_TEST

/* ---- the writer against CPython ---------------------------------------- */

static const char *const values[] = {
    "str",       "dict_small", "dict_mixed", "list_mixed", "chat",
    "ints",      "list_2500",  "dict_1500",  "str_300",    "str_70000",
    "list_strs", "empty_dict", "empty_list", "empty_str",  "nested",
    "latin1",    "one",        "one_dict",   "float_list", "bigints",
};

START_TEST(test_writer_fixtures)
{
    char path[128];
    size_t jn, pn;
    char *text, *pk, *got;
    cJSON *v = NULL, *back = NULL;
    struct buf out;
    struct cr_err err = {0};
    snprintf(path, sizeof path, FX "%s.json", values[_i]);
    text = unit_read_file(path, &jn);
    snprintf(path, sizeof path, FX "%s.pickle", values[_i]);
    pk = unit_read_file(path, &pn);
    ck_assert_int_eq(py_json_parse(text, jn, &v, &err), 0);

    buf_init(&out);
    if (strncmp(values[_i], "bigints", 7) == 0) {
        /* A double cannot hold these: take the reader's exact values. */
        cJSON_Delete(v);
        ck_assert_int_eq(loads(pk, pn, &v, &err), 0);
    }
    ck_assert_int_eq(rq_pickle_dumps(v, &out), 0);
    ck_assert_msg(out.len == pn && memcmp(out.data, pk, pn) == 0,
                  "%s: %zu bytes written, CPython wrote %zu", values[_i], out.len, pn);

    /* CPython's bytes read back to the same JSON, and ours too. */
    expect_json(pk, pn, text);
    ck_assert_int_eq(loads(out.data, out.len, &back, &err), 0);
    got = dumps(back);
    ck_assert_str_eq(got, text);
    free(got);

    /* The JSON serializer writes json.dumps() text. */
    buf_reset(&out);
    ck_assert_int_eq(rq_value_dumps(v, RQ_SERIALIZER_JSON, &out), 0);
    ck_assert_str_eq(out.data, text);
    buf_release(&out);
    cJSON_Delete(back);
    cJSON_Delete(v);
    free(text);
    free(pk);
}
END_TEST

START_TEST(test_result_bytes)
{
    /* rq-protocol.md 5.2, byte for byte and as base64. */
    cJSON *s = cJSON_CreateString("echo: Hello");
    cJSON *d = cJSON_CreateObject();
    struct buf out;
    cJSON_AddStringToObject(d, "text", "hi");
    cJSON_AddNumberToObject(d, "n", 7);
    buf_init(&out);
    ck_assert_int_eq(rq_pickle_dumps(s, &out), 0);
    ck_assert_int_eq(out.len, 26);
    ck_assert_mem_eq(out.data,
                     "\x80\x05\x95\x0f\x00\x00\x00\x00\x00\x00\x00\x8c\x0b"
                     "echo: Hello\x94.",
                     26);
    buf_reset(&out);
    ck_assert_int_eq(rq_value_dumps_b64(s, RQ_SERIALIZER_PICKLE, &out), 0);
    ck_assert_str_eq(out.data, "gAWVDwAAAAAAAACMC2VjaG86IEhlbGxvlC4=");
    buf_reset(&out);
    ck_assert_int_eq(rq_value_dumps_b64(d, RQ_SERIALIZER_PICKLE, &out), 0);
    ck_assert_str_eq(out.data, "gAWVFwAAAAAAAAB9lCiMBHRleHSUjAJoaZSMAW6USwd1Lg==");
    buf_reset(&out);
    ck_assert_int_eq(rq_value_dumps_b64(d, RQ_SERIALIZER_JSON, &out), 0);
    ck_assert_str_eq(out.data, "eyJ0ZXh0IjogImhpIiwgIm4iOiA3fQ==");
    buf_release(&out);
    cJSON_Delete(s);
    cJSON_Delete(d);
}
END_TEST

START_TEST(test_writer_refuses)
{
    cJSON *r = cJSON_CreateRaw("12x");
    cJSON *deep = cJSON_CreateArray(), *cur = deep;
    struct buf out;
    buf_init(&out);
    ck_assert_int_eq(rq_pickle_dumps(r, &out), CR_EINVAL);
    ck_assert_int_eq(out.len, 0);
    for (int i = 0; i < 1100; i++) {
        cJSON *n = cJSON_CreateArray();
        cJSON_AddItemToArray(cur, n);
        cur = n;
    }
    ck_assert_int_eq(rq_pickle_dumps(deep, &out), CR_EINVAL);
    ck_assert_int_eq(out.len, 0);
    cJSON_Delete(r);
    cJSON_Delete(deep);
    buf_release(&out);
}
END_TEST

/* ---- what the reader accepts -------------------------------------------- */

START_TEST(test_special)
{
    size_t n;
    char *p;
    struct buf out;
    cJSON *v = NULL;
    struct cr_err err = {0};

    /* (x, x, [x, x]): CPython fetches x while it is still on the stack. */
    p = unit_read_file(FX "shared.pickle", &n);
    expect_json(p, n, "[[1], [1], [[1], [1]]]");
    free(p);

    p = unit_read_file(FX "intkey.pickle", &n);
    expect_json(p, n, "{\"logit_bias\": {\"50256\": -100, \"7\": 1}}");
    free(p);

    /* bytes and bytearray are base64 text flagged RQ_JSON_BYTES; written back
     * as CPython writes bytes. */
    p = unit_read_file(FX "bytes.pickle", &n);
    ck_assert_int_eq(loads(p, n, &v, &err), 0);
    ck_assert_str_eq(v->child->valuestring, "AP9hYg==");
    ck_assert(v->child->type & RQ_JSON_BYTES);
    ck_assert_str_eq(v->child->next->valuestring, "eHk=");
    cJSON_DeleteItemFromArray(v, 1); /* bytearray, which the writer writes as bytes */
    buf_init(&out);
    ck_assert_int_eq(rq_pickle_dumps(v, &out), 0);
    {
        cJSON *back = NULL;
        char *a = dumps(v), *b;
        ck_assert_int_eq(loads(out.data, out.len, &back, &err), 0);
        b = dumps(back);
        ck_assert_str_eq(a, b);
        ck_assert(back->child->type & RQ_JSON_BYTES);
        free(a);
        free(b);
        cJSON_Delete(back);
    }
    buf_release(&out);
    cJSON_Delete(v);
    free(p);

    /* Duplicate keys: last value, first place. Protocol 2 and no PROTO. */
    expect_json(S("\x80\x05\x7d(\x8c\x01"
                  "a"
                  "K\x01\x8c\x01"
                  "bK\x02\x8c\x01"
                  "aK\x03u."),
                "{\"a\": 3, \"b\": 2}");
    expect_json(S("\x80\x02N."), "null");
    expect_json(S("N."), "null");
    /* LONG1 of 0, 8 bytes, negative; a big one is kept exact as text. */
    expect_json(S("\x80\x05\x8a\x00."), "0");
    expect_json(S("\x80\x05\x8a\x01\xff."), "-1");
    expect_json(S("\x80\x05\x8a\x08\x01\x00\x00\x00\x00\x00\x20\x00."),
                "9007199254740993");
    expect_json(S("\x80\x05\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."),
                "-9223372036854775808");
    /* FRAME anywhere between opcodes; BINPUT/LONG_BINGET; memo of a key. */
    expect_json(S("\x80\x05\x95\x01\x00\x00\x00\x00\x00\x00\x00]\x95\x00\x00\x00\x00\x00"
                  "\x00\x00\x00."),
                "[]");
    expect_json(S("\x80\x05]q\x05(\x8c\x01xr\x07\x00\x00\x00j\x07\x00\x00\x00"
                  "e."),
                "[\"x\", \"x\"]");
    expect_json(S("\x80\x05]\x94(\x7d\x94\x8c\x01k\x94K\x01s\x7d\x94h\x02K\x02se."),
                "[{\"k\": 1}, {\"k\": 2}]");
    /* Sparse BINPUT, then MEMOIZE takes the next count, not the next index. */
    expect_json(S("\x80\x05\x8c\x01"
                  "aq\x09\x94h\x01h\x09\x87."),
                "[\"a\", \"a\", \"a\"]");
}
END_TEST

/* ---- what the reader refuses --------------------------------------------- */

static const struct {
    unsigned char op;
    const char *name;
} refused[] = {
    {0x63, "GLOBAL"},
    {0x93, "STACK_GLOBAL"},
    {0x52, "REDUCE"},
    {0x62, "BUILD"},
    {0x69, "INST"},
    {0x6f, "OBJ"},
    {0x81, "NEWOBJ"},
    {0x92, "NEWOBJ_EX"},
    {0x82, "EXT1"},
    {0x83, "EXT2"},
    {0x84, "EXT4"},
    {0x50, "PERSID"},
    {0x51, "BINPERSID"},
    {0x97, "NEXT_BUFFER"},
    {0x98, "READONLY_BUFFER"},
    {0x8b, "LONG4"},
    {0x30, "POP"},
    {0x31, "POP_MARK"},
    {0x32, "DUP"},
    {0x8f, "EMPTY_SET"},
    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},
    {0x49, "INT"},
    {0x4c, "LONG"},
    {0x46, "FLOAT"},
    {0x53, "STRING"},
    {0x54, "BINSTRING"},
    {0x55, "SHORT_BINSTRING"},
    {0x56, "UNICODE"},
    {0x70, "PUT"},
    {0x67, "GET"},
    {0x6c, "LIST"},
    {0x64, "DICT"},
    {0x00, "unknown"},
    {0xff, "unknown"},
    {0x41, "unknown"},
};

START_TEST(test_refused_opcodes)
{
    /* After a value and a MARK, so that no stack check comes first. */
    unsigned char p[16] = {0x80, 0x05, 0x4e,           0x4e, 0x28,
                           0x4e, 0x4e, refused[_i].op, 0x2e};
    char want[64];
    snprintf(want, sizeof want, "%s", refused[_i].name);
    if (strcmp(refused[_i].name, "unknown") != 0)
        snprintf(want, sizeof want, "opcode %s (0x%02x) at offset 7", refused[_i].name,
                 refused[_i].op);
    expect_fail(p, 9, CR_EDECODE, want);
}
END_TEST

START_TEST(test_refused_python)
{
    static const struct {
        const char *file, *want;
    } v[] = {
        {"bad_datetime", "STACK_GLOBAL (0x93) 'datetime.datetime'"},
        {"bad_decimal", "STACK_GLOBAL (0x93) 'decimal.Decimal'"},
        {"bad_uuid", "STACK_GLOBAL (0x93) 'uuid.UUID'"},
        {"bad_set", "EMPTY_SET"},
        {"bad_frozenset", "FROZENSET"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char path[128];
        size_t n;
        char *p;
        struct rq_call c;
        struct cr_err err = {0};
        snprintf(path, sizeof path, FX "%s.pickle", v[i].file);
        p = unit_read_file(path, &n);
        ck_assert_int_eq(rq_data_decode(p, n, &lim, &c, &err), CR_EDECODE);
        ck_assert_msg(strstr(err.msg, v[i].want) != NULL, "%s: %s", v[i].file, err.msg);
        ck_assert_ptr_null(strchr(err.msg, '\n'));
        free(p);
    }
}
END_TEST

START_TEST(test_malformed)
{
    expect_fail(S(""), CR_EDECODE, "truncated");
    expect_fail(S("\x80"), CR_EDECODE, "truncated");
    expect_fail(S("\x80\x06N."), CR_EDECODE, "protocol");
    expect_fail(S("\x80\x01N."), CR_EDECODE, "protocol");
    expect_fail(S("\x80\x05\x80\x05N."), CR_EDECODE, "PROTO after");
    expect_fail(S("\x80\x05N"), CR_EDECODE, "truncated");
    expect_fail(S("\x80\x05."), CR_EDECODE, "STOP without");
    expect_fail(S("\x80\x05NN."), CR_EDECODE, "STOP without");
    expect_fail(S("\x80\x05(."), CR_EDECODE, "STOP without");
    expect_fail(S("\x80\x05N.N"), CR_EDECODE, "trailing");
    expect_fail(S("\x80\x05Na."), CR_EDECODE, "APPEND");
    expect_fail(S("\x80\x05NNa."), CR_EDECODE, "not a list");
    expect_fail(S("\x80\x05](a."), CR_EDECODE, "APPEND of a MARK");
    expect_fail(S("\x80\x05"
                  "e."),
                CR_EDECODE, "without a MARK");
    expect_fail(S("\x80\x05(e."), CR_EDECODE, "without a list");
    expect_fail(S("\x80\x05]NNs."), CR_EDECODE, "not a dict");
    expect_fail(S("\x80\x05\x7d(Nu."), CR_EDECODE, "odd");
    expect_fail(S("\x80\x05\x7d(NNu."), CR_EDECODE, "dict key");
    expect_fail(S("\x80\x05\x7d(\x88Nu."), CR_EDECODE, "dict key");
    expect_fail(S("\x80\x05\x7d(G?\xe0\x00\x00\x00\x00\x00\x00Nu."), CR_EDECODE,
                "dict key");
    expect_fail(S("\x80\x05\x7d(C\x01xNu."), CR_EDECODE, "dict key");
    expect_fail(S("\x80\x05t."), CR_EDECODE, "TUPLE without");
    expect_fail(S("\x80\x05N\x86."), CR_EDECODE, "too few");
    expect_fail(S("\x80\x05(N\x86."), CR_EDECODE, "over a MARK");
    expect_fail(S("\x80\x05\x94."), CR_EDECODE, "no value");
    expect_fail(S("\x80\x05h\x00."), CR_EDECODE, "empty index");
    expect_fail(S("\x80\x05N\x94N\x94h\x05."), CR_EDECODE, "empty index");
    expect_fail(S("\x80\x05Nq\x00Nq\x00."), CR_EDECODE, "already used");
    expect_fail(S("\x80\x05Nq\x01N\x94\x94."), CR_EDECODE, "already used");
    expect_fail(S("\x80\x05\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x00."), CR_EDECODE,
                "LONG1");
    expect_fail(S("\x80\x05\x8a\x02\x00."), CR_EDECODE, "truncated");
    /* Floats with no JSON form. */
    expect_fail(S("\x80\x05G\x7f\xf8\x00\x00\x00\x00\x00\x00."), CR_EDECODE, "NaN");
    expect_fail(S("\x80\x05G\x7f\xf0\x00\x00\x00\x00\x00\x00."), CR_EDECODE, "NaN");
    expect_fail(S("\x80\x05G\xff\xf0\x00\x00\x00\x00\x00\x00."), CR_EDECODE, "NaN");
    /* Memo references: a list into itself, appending to a fetched list, a
     * dict value that is its own dict. */
    expect_fail(S("\x80\x05]\x94h\x00"
                  "a."),
                CR_EDECODE, "cycle");
    expect_fail(S("\x80\x05]\x94(h\x00"
                  "e."),
                CR_EDECODE, "cycle");
    expect_fail(S("\x80\x05\x7d\x94\x8c\x01kh\x00s."), CR_EDECODE, "cycle");
    expect_fail(S("\x80\x05]\x94h\x00"
                  "K\x01"
                  "a."),
                CR_EDECODE, "memo reference");
    /* x copied into y while x is open, then y into x: x inside itself. */
    expect_fail(S("\x80\x05]\x94]h\x00"
                  "aa."),
                CR_EDECODE, "cycle");
    expect_fail(S("\x80\x05\x7d\x94\x8c\x01k]h\x00"
                  "as."),
                CR_EDECODE, "cycle");
    expect_fail(S("\x80\x05\x7d\x94h\x00\x8c\x01kNs."), CR_EDECODE, "memo reference");
    /* A tuple cannot be appended to. */
    expect_fail(S("\x80\x05)Na."), CR_EDECODE, "not a list");
}
END_TEST

START_TEST(test_utf8)
{
    static const struct {
        const char *s;
        size_t n;
    } bad[] = {
        {"\xed\xa0\x80", 3},     /* U+D800, as surrogatepass writes it */
        {"\xed\xbf\xbf", 3},     /* U+DFFF */
        {"\xc0\x80", 2},         /* overlong NUL */
        {"\xe0\x80\xaf", 3},     /* overlong '/' */
        {"\xf4\x90\x80\x80", 4}, /* above U+10FFFF */
        {"\x80", 1},             /* lone continuation */
        {"\xe2\x9c", 2},         /* truncated */
        {"\xff", 1},
        {"a\x00"
         "b",
         3}, /* NUL: not in a cJSON string */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char p[32] = {0x80, 0x05, 0x8c, (unsigned char)bad[i].n};
        memcpy(p + 4, bad[i].s, bad[i].n);
        p[4 + bad[i].n] = 0x2e;
        expect_fail(p, 5 + bad[i].n, CR_EDECODE, NULL);
        /* The same through BINUNICODE. */
        p[2] = 0x58;
        memmove(p + 7, p + 4, bad[i].n + 1);
        p[3] = (unsigned char)bad[i].n;
        p[4] = p[5] = p[6] = 0;
        expect_fail(p, 8 + bad[i].n, CR_EDECODE, NULL);
    }
    expect_json(S("\x80\x05\x8c\x04\xf0\x9f\x98\x80."), "\"\\ud83d\\ude00\"");
}
END_TEST

/* ---- limits ---------------------------------------------------------------- */

START_TEST(test_memo_bomb)
{
    size_t n;
    char *p = unit_read_file(FX "bomb.pickle", &n);
    expect_fail(p, n, CR_ETOOBIG, "expands past 1000000 values");
    free(p);
}
END_TEST

START_TEST(test_string_copies)
{
    /* One long string fetched many times copies text, not values. */
    struct buf b;
    char big[1100];
    buf_init(&b);
    memset(big, 'x', sizeof big);
    buf_append(&b, "\x80\x05]\x94(X\x4c\x04\x00\x00", 10);
    buf_append(&b, big, sizeof big);
    buf_putc(&b, (char)0x94);
    for (int i = 0; i < 1000; i++)
        buf_append(&b, "h\x01", 2);
    buf_append(&b, "e.", 2);
    lim.max_inflated_bytes = 1 << 20;
    expect_fail(b.data, b.len, CR_ETOOBIG, "copy more than");
    lim.max_inflated_bytes = 4 << 20;
    {
        cJSON *v = NULL;
        struct cr_err err = {0};
        ck_assert_int_eq(loads(b.data, b.len, &v, &err), 0);
        ck_assert_int_eq(cJSON_GetArraySize(v), 1001);
        cJSON_Delete(v);
    }
    rq_limits_init(&lim);
    buf_release(&b);
}
END_TEST

START_TEST(test_depth)
{
    struct buf b;
    for (int depth = 64; depth <= 65; depth++) {
        buf_init(&b);
        buf_append(&b, "\x80\x05", 2);
        for (int i = 0; i < depth; i++)
            buf_putc(&b, ']');
        for (int i = 1; i < depth; i++)
            buf_putc(&b, 'a');
        buf_putc(&b, '.');
        if (depth == 64) {
            cJSON *v = NULL;
            struct cr_err err = {0};
            ck_assert_int_eq(loads(b.data, b.len, &v, &err), 0);
            cJSON_Delete(v);
        } else
            expect_fail(b.data, b.len, CR_ETOOBIG, "deeper than 64");
        buf_release(&b);
    }
    /* Through tuples and dicts as well. */
    buf_init(&b);
    buf_append(&b, "\x80\x05N", 3);
    for (int i = 0; i < 65; i++)
        buf_putc(&b, (char)0x85);
    buf_putc(&b, '.');
    expect_fail(b.data, b.len, CR_ETOOBIG, "deeper");
    buf_release(&b);
    buf_init(&b);
    buf_append(&b, "\x80\x05", 2);
    for (int i = 0; i < 65; i++)
        buf_append(&b, "\x7d\x8c\x01k", 4);
    buf_putc(&b, 'N');
    for (int i = 0; i < 65; i++)
        buf_putc(&b, 's');
    buf_putc(&b, '.');
    expect_fail(b.data, b.len, CR_ETOOBIG, "deeper");
    buf_release(&b);
}
END_TEST

START_TEST(test_lengths)
{
    expect_fail(S("\x80\x05X\xff\xff\xff\x7f."), CR_EDECODE, "exceeds the 1 bytes left");
    expect_fail(S("\x80\x05\x8d\xff\xff\xff\xff\xff\xff\xff\xff."), CR_EDECODE,
                "exceeds");
    expect_fail(S("\x80\x05\x8c\x03"
                  "a."),
                CR_EDECODE, "exceeds");
    expect_fail(S("\x80\x05\x8e\x00\x00\x00\x00\x00\x00\x00\x01."), CR_EDECODE,
                "exceeds");
    expect_fail(S("\x80\x05\x96\x05\x00\x00\x00\x00\x00\x00\x00."), CR_EDECODE,
                "exceeds");
    expect_fail(S("\x80\x05\x42\x05\x00\x00\x00."), CR_EDECODE, "exceeds");
    expect_fail(S("\x80\x05\x43\x05."), CR_EDECODE, "exceeds");
    expect_fail(S("\x80\x05\x95\x05\x00\x00\x00\x00\x00\x00\x00N."), CR_EDECODE,
                "exceeds");
    expect_fail(S("\x80\x05\x95\xff\xff\xff\xff\xff\xff\xff\xff."), CR_EDECODE,
                "exceeds");
    /* Memo index over the limit: refused before the memo grows. */
    expect_fail(S("\x80\x05Nr\x00\x00\x10\x00."), CR_ETOOBIG, "memo index");
    expect_fail(S("\x80\x05Nr\xff\xff\xff\xff."), CR_ETOOBIG, "memo index");
    lim.max_memo = 2;
    expect_fail(S("\x80\x05N\x94N\x94N\x94\x87."), CR_ETOOBIG, "memo index");
    rq_limits_init(&lim);
    expect_json(S("\x80\x05Nr\xff\xff\x0f\x00."), "null");
}
END_TEST

static void compress_buf(const void *p, size_t n, struct buf *out)
{
    uLongf zn = compressBound((uLong)n);
    buf_init(out);
    ck_assert_int_eq(buf_reserve(out, zn), 0);
    ck_assert_int_eq(compress2((Bytef *)out->data, &zn, p, (uLong)n, 9), Z_OK);
    out->len = zn;
}

START_TEST(test_zip_bomb)
{
    size_t n = 10u << 20;
    char *zeros = calloc(1, n);
    struct buf z, out;
    struct cr_err err = {0};
    struct rq_call c;
    compress_buf(zeros, n, &z);
    ck_assert_uint_gt(n / z.len, 1000); /* past the ratio */

    buf_init(&out);
    ck_assert_int_eq(rq_data_inflate(z.data, z.len, &lim, &out, &err), CR_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "inflates past"));
    ck_assert_uint_le(out.len, z.len * 1000);
    ck_assert_int_eq(rq_data_decode(z.data, z.len, &lim, &c, &err), CR_ETOOBIG);
    /* Without the ratio, the size cap. */
    lim.max_ratio = 0;
    lim.max_inflated_bytes = 1 << 20;
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(z.data, z.len, &lim, &out, &err), CR_ETOOBIG);
    ck_assert_uint_le(out.len, 1 << 20);
    /* Both generous: all of it. */
    lim.max_inflated_bytes = n;
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(z.data, z.len, &lim, &out, &err), 0);
    ck_assert_uint_eq(out.len, n);
    /* At the cap with the checksum cut short: not zlib after all, so raw. */
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(z.data, z.len - 2, &lim, &out, &err), 0);
    ck_assert_uint_eq(out.len, z.len - 2);
    /* Exactly at the cap is allowed, one byte less is not. */
    lim.max_inflated_bytes = n - 1;
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(z.data, z.len, &lim, &out, &err), CR_ETOOBIG);
    /* The stored value itself. */
    rq_limits_init(&lim);
    lim.max_data_bytes = z.len - 1;
    ck_assert_int_eq(rq_data_inflate(z.data, z.len, &lim, &out, &err), CR_ETOOBIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds"));
    rq_limits_init(&lim);
    buf_release(&out);
    buf_release(&z);
    free(zeros);
}
END_TEST

START_TEST(test_inflate_fallback)
{
    /* Not zlib, a broken stream, a truncated one: the bytes as they are;
     * bytes after a whole stream are ignored, as zlib.decompress() does. */
    size_t n;
    char *z = unit_read_file(FX "cap1.zlib", &n);
    struct buf out, tail;
    struct cr_err err = {0};
    buf_init(&out);
    ck_assert_int_eq(rq_data_inflate(S("\x80\x05N."), &lim, &out, &err), 0);
    ck_assert_mem_eq(out.data, "\x80\x05N.", 4);
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(z, n - 3, &lim, &out, &err), 0);
    ck_assert_uint_eq(out.len, n - 3);
    ck_assert_mem_eq(out.data, z, n - 3);
    buf_reset(&out);
    z[10] ^= 0x55;
    ck_assert_int_eq(rq_data_inflate(z, n, &lim, &out, &err), 0);
    ck_assert_uint_eq(out.len, n);
    z[10] ^= 0x55;
    buf_init(&tail);
    buf_append(&tail, z, n);
    buf_append(&tail, "junk", 4);
    buf_reset(&out);
    ck_assert_int_eq(rq_data_inflate(tail.data, tail.len, &lim, &out, &err), 0);
    ck_assert_uint_eq(out.len, 50);
    ck_assert_int_eq((unsigned char)out.data[0], 0x80);
    buf_release(&tail);
    buf_release(&out);
    free(z);
}
END_TEST

START_TEST(test_truncations)
{
    /* Every prefix of every capture fails cleanly, raw and compressed. */
    char path[128];
    size_t pn, zn;
    char *p, *z;
    snprintf(path, sizeof path, FX "%s.pickle", caps[_i]);
    p = unit_read_file(path, &pn);
    snprintf(path, sizeof path, FX "%s.zlib", caps[_i]);
    z = unit_read_file(path, &zn);
    for (size_t k = 0; k < pn; k++) {
        struct rq_call c;
        struct cr_err err = {0};
        ck_assert_int_eq(rq_data_decode(p, k, &lim, &c, &err), CR_EDECODE);
        ck_assert_ptr_null(c.func_name);
    }
    for (size_t k = 0; k < zn; k++) {
        struct rq_call c;
        struct cr_err err = {0};
        ck_assert_int_eq(rq_data_decode(z, k, &lim, &c, &err), CR_EDECODE);
    }
    free(p);
    free(z);
}
END_TEST

/* ---- round trips and allocation failure ------------------------------------ */

START_TEST(test_round_trip)
{
    static const char *const texts[] = {
        "null",
        "[true, false, null, 0, -1, 255, 256, 65535, 65536, 2147483648, -2147483649]",
        "[1.0, -0.0, 0.1, 1e+300, 5e-324]",
        "{\"a\": {\"b\": [\"\\u00e9\", \"\", \"x\"]}, \"c\": \"\\ud83d\\ude00\"}",
        "[9007199254740993, -9223372036854775808, 9223372036854775807]",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        cJSON *v = NULL, *back = NULL;
        struct cr_err err = {0};
        struct buf out;
        char *got;
        ck_assert_int_eq(py_json_parse(texts[i], strlen(texts[i]), &v, &err), 0);
        /* Ints beyond 2**53 as cJSON_Raw text, which is what the reader makes. */
        if (i == 4)
            for (cJSON *c = v->child; c; c = c->next) {
                char tmp[32];
                snprintf(tmp, sizeof tmp, "%s",
                         c == v->child ? "9007199254740993"
                         : c->next     ? "-9223372036854775808"
                                       : "9223372036854775807");
                c->type = cJSON_Raw;
                c->valuestring = cr_strdup(tmp);
            }
        for (int ser = 0; ser < 2; ser++) {
            buf_init(&out);
            ck_assert_int_eq(rq_value_dumps(v, (enum rq_serializer)ser, &out), 0);
            if (i == 4 && ser == 1) {
                /* JSON text of ints beyond 2**53 is written exactly but refused
                 * when read: a double would round them. */
                ck_assert_str_eq(out.data, texts[i]);
                ck_assert_int_eq(rq_value_loads(out.data, out.len, RQ_SERIALIZER_JSON,
                                                &lim, &back, &err),
                                 CR_EDECODE);
                buf_release(&out);
                continue;
            }
            ck_assert_int_eq(rq_value_loads(out.data, out.len, (enum rq_serializer)ser,
                                            &lim, &back, &err),
                             0);
            got = dumps(back);
            ck_assert_str_eq(got, texts[i]);
            free(got);
            cJSON_Delete(back);
            buf_release(&out);
        }
        cJSON_Delete(v);
    }
}
END_TEST

START_TEST(test_oom_sweep)
{
    static const char *const files[] = {FX "cap3.zlib", FX "cap1_json.zlib",
                                        FX "chat.pickle", FX "dict_mixed.pickle"};
    size_t n;
    char *p = unit_read_file(files[_i], &n);
    char *want = NULL;
    long k;
    for (k = 1; k < 100000; k++) {
        struct rq_call c;
        struct cr_err err = {0};
        cJSON *v = NULL;
        struct buf out;
        long failed;
        int rc, rc2 = 0;
        buf_init(&out);
        cr_alloc_fail_after(k);
        if (_i < 2)
            rc = rq_data_decode(p, n, &lim, &c, &err);
        else {
            rc = rq_pickle_loads(p, n, &lim, &v, &err);
            if (rc == 0)
                rc2 = rq_pickle_dumps(v, &out);
        }
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        if (failed == 0) {
            ck_assert_msg(rc == 0 && rc2 == 0, "%s: %s", files[_i], err.msg);
            if (_i < 2) {
                want = call_json(&c);
                ck_assert_ptr_nonnull(strstr(want, "tasks."));
                rq_call_release(&c);
            } else
                ck_assert_mem_eq(out.data, p, n);
            cJSON_Delete(v);
            buf_release(&out);
            break;
        }
        ck_assert_msg(rc == CR_ENOMEM || rc2 == CR_ENOMEM, "pass %ld: rc %d/%d %s", k, rc,
                      rc2, err.msg);
        if (_i < 2)
            ck_assert_ptr_null(c.func_name);
        cJSON_Delete(v);
        buf_release(&out);
    }
    ck_assert_int_lt(k, 100000);
    free(want);
    free(p);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rq_data");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_captures, 0, 3);
    tcase_add_test(tc, test_capture_values);
    tcase_add_test(tc, test_json_serializer);
    tcase_add_test(tc, test_shape);
    tcase_add_loop_test(tc, test_writer_fixtures, 0,
                        (int)(sizeof values / sizeof values[0]));
    tcase_add_test(tc, test_result_bytes);
    tcase_add_test(tc, test_writer_refuses);
    tcase_add_test(tc, test_special);
    tcase_add_loop_test(tc, test_refused_opcodes, 0,
                        (int)(sizeof refused / sizeof refused[0]));
    tcase_add_test(tc, test_refused_python);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_memo_bomb);
    tcase_add_test(tc, test_string_copies);
    tcase_add_test(tc, test_depth);
    tcase_add_test(tc, test_lengths);
    tcase_add_test(tc, test_zip_bomb);
    tcase_add_test(tc, test_inflate_fallback);
    tcase_add_loop_test(tc, test_truncations, 0, 3);
    tcase_add_test(tc, test_round_trip);
    tcase_add_loop_test(tc, test_oom_sweep, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
