/* test_rmq_json.c -- AMQP field tables <-> JSON, including py-amqp's wire bytes. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/rmq_json.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* Exported by librabbitmq 0.11 but declared only in its private header. */
int amqp_decode_table(amqp_bytes_t encoded, amqp_pool_t *pool, amqp_table_t *output,
                      size_t *offset);
int amqp_encode_table(amqp_bytes_t encoded, amqp_table_t *input, size_t *offset);

/* py-amqp 5.1.1: serialization.dumps("F", [headers]) */
static const char wire_py[] =
    "\x00\x00\x01\x07\x01\x73\x53\x00\x00\x00\x03\x73\x74\x72\x01\x62"
    "\x74\x01\x02\x62\x66\x74\x00\x01\x66\x64\x3f\xf8\x00\x00\x00\x00"
    "\x00\x00\x02\x66\x69\x64\x40\x00\x00\x00\x00\x00\x00\x00\x01\x69"
    "\x49\x00\x00\x00\x2a\x03\x6e\x65\x67\x49\xff\xff\xff\xf9\x05\x6d"
    "\x61\x78\x33\x32\x49\x7f\xff\xff\xff\x05\x6d\x69\x6e\x33\x32\x4c"
    "\xff\xff\xff\xff\x80\x00\x00\x00\x03\x62\x69\x67\x4c\x00\x00\x01"
    "\x00\x00\x00\x00\x00\x04\x6e\x62\x69\x67\x4c\xff\xff\xff\x00\x00"
    "\x00\x00\x00\x03\x64\x65\x63\x44\x02\xff\xff\xfb\x2e\x02\x74\x73"
    "\x54\x00\x00\x00\x00\x70\xdd\x55\x25\x03\x74\x62\x6c\x46\x00\x00"
    "\x00\x13\x01\x78\x41\x00\x00\x00\x0c\x49\x00\x00\x00\x01\x53\x00"
    "\x00\x00\x01\x61\x56\x04\x6e\x6f\x6e\x65\x56\x04\x6c\x69\x73\x74"
    "\x41\x00\x00\x00\x18\x64\x3f\xf0\x00\x00\x00\x00\x00\x00\x41\x00"
    "\x00\x00\x05\x49\x00\x00\x00\x02\x46\x00\x00\x00\x00\x05\x62\x79"
    "\x74\x65\x73\x53\x00\x00\x00\x03\x72\x61\x77\x07\x75\x6e\x69\x63"
    "\x6f\x64\x65\x53\x00\x00\x00\x06\x68\xc3\xa9\x6c\x6c\x6f\x09\x74"
    "\x69\x6d\x65\x6c\x69\x6d\x69\x74\x41\x00\x00\x00\x0e\x49\x00\x00"
    "\x00\x1e\x64\x40\x34\x80\x00\x00\x00\x00\x00";

/* py-amqp 5.1.1: the same after a JSON round trip (json.loads of want_json) */
static const char wire_json[] =
    "\x00\x00\x01\x06\x01\x73\x53\x00\x00\x00\x03\x73\x74\x72\x01\x62"
    "\x74\x01\x02\x62\x66\x74\x00\x01\x66\x64\x3f\xf8\x00\x00\x00\x00"
    "\x00\x00\x02\x66\x69\x64\x40\x00\x00\x00\x00\x00\x00\x00\x01\x69"
    "\x49\x00\x00\x00\x2a\x03\x6e\x65\x67\x49\xff\xff\xff\xf9\x05\x6d"
    "\x61\x78\x33\x32\x49\x7f\xff\xff\xff\x05\x6d\x69\x6e\x33\x32\x4c"
    "\xff\xff\xff\xff\x80\x00\x00\x00\x03\x62\x69\x67\x4c\x00\x00\x01"
    "\x00\x00\x00\x00\x00\x04\x6e\x62\x69\x67\x4c\xff\xff\xff\x00\x00"
    "\x00\x00\x00\x03\x64\x65\x63\x64\xc0\x28\xae\x14\x7a\xe1\x47\xae"
    "\x02\x74\x73\x49\x70\xdd\x55\x25\x03\x74\x62\x6c\x46\x00\x00\x00"
    "\x13\x01\x78\x41\x00\x00\x00\x0c\x49\x00\x00\x00\x01\x53\x00\x00"
    "\x00\x01\x61\x56\x04\x6e\x6f\x6e\x65\x56\x04\x6c\x69\x73\x74\x41"
    "\x00\x00\x00\x18\x64\x3f\xf0\x00\x00\x00\x00\x00\x00\x41\x00\x00"
    "\x00\x05\x49\x00\x00\x00\x02\x46\x00\x00\x00\x00\x05\x62\x79\x74"
    "\x65\x73\x53\x00\x00\x00\x03\x72\x61\x77\x07\x75\x6e\x69\x63\x6f"
    "\x64\x65\x53\x00\x00\x00\x06\x68\xc3\xa9\x6c\x6c\x6f\x09\x74\x69"
    "\x6d\x65\x6c\x69\x6d\x69\x74\x41\x00\x00\x00\x0e\x49\x00\x00\x00"
    "\x1e\x64\x40\x34\x80\x00\x00\x00\x00\x00";

/* The headers above: {"s": "str", "b": True, ..., "dec": Decimal("-12.34"),
 * "ts": datetime(2030, 1, 2, 3, 4, 5), ...} as JSON. */
static const char want_json[] =
    "{\"s\": \"str\", \"b\": true, \"bf\": false, \"f\": 1.5, \"fi\": 2.0, \"i\": 42, "
    "\"neg\": -7, \"max32\": 2147483647, \"min32\": -2147483648, \"big\": 1099511627776, "
    "\"nbig\": -1099511627776, \"dec\": -12.34, \"ts\": 1893553445, \"tbl\": {\"x\": [1, "
    "\"a\", null]}, \"none\": null, \"list\": [1.0, [2], {}], \"bytes\": \"raw\", "
    "\"unicode\": \"h\\u00e9llo\", \"timelimit\": [30, 20.5]}";

static char *dumps(const cJSON *v)
{
    struct buf b;
    buf_init(&b);
    ck_assert_int_eq(py_json_dumps(v, &b), 0);
    return buf_detach(&b);
}

static amqp_bytes_t bytes(const char *s)
{
    amqp_bytes_t b;
    b.len = strlen(s);
    b.bytes = (void *)s;
    return b;
}

START_TEST(test_py_amqp_wire)
{
    amqp_pool_t pool;
    amqp_table_t t;
    amqp_bytes_t in = {sizeof(wire_py) - 1, (void *)wire_py};
    size_t off = 0;
    cJSON *j = NULL;
    char *s;

    init_amqp_pool(&pool, 4096);
    ck_assert_int_eq(amqp_decode_table(in, &pool, &t, &off), 0);
    ck_assert_uint_eq(off, sizeof(wire_py) - 1);
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    s = dumps(j);
    ck_assert_str_eq(s, want_json);
    cr_free(s);
    cJSON_Delete(j);
    empty_amqp_pool(&pool);
}
END_TEST

/* JSON -> table -> wire gives the bytes py-amqp writes for the same dict. */
START_TEST(test_json_to_wire)
{
    amqp_pool_t pool;
    amqp_table_t t;
    char out[1024];
    amqp_bytes_t enc = {sizeof(out), out};
    size_t off = 0;
    cJSON *j = NULL;

    ck_assert_int_eq(py_json_parse(want_json, strlen(want_json), &j, NULL), 0);
    init_amqp_pool(&pool, 4096);
    ck_assert_int_eq(rmq_json_to_table(j, &pool, &t, NULL), 0);
    ck_assert_int_eq(amqp_encode_table(enc, &t, &off), 0);
    ck_assert_uint_eq(off, sizeof(wire_json) - 1);
    ck_assert(memcmp(out, wire_json, off) == 0);
    empty_amqp_pool(&pool);
    cJSON_Delete(j);
}
END_TEST

/* Every kind rabbitmq-c defines, built by hand. */
static void every_kind(amqp_table_entry_t *e, amqp_field_value_t *arr,
                       amqp_table_entry_t *sub)
{
    int n = 0;
#define KEY(k) e[n].key = bytes(k)
    KEY("t");
    e[n].value.kind = AMQP_FIELD_KIND_BOOLEAN;
    e[n++].value.value.boolean = 1;
    KEY("b");
    e[n].value.kind = AMQP_FIELD_KIND_I8;
    e[n++].value.value.i8 = -128;
    KEY("B");
    e[n].value.kind = AMQP_FIELD_KIND_U8;
    e[n++].value.value.u8 = 255;
    KEY("s");
    e[n].value.kind = AMQP_FIELD_KIND_I16;
    e[n++].value.value.i16 = -32768;
    KEY("u");
    e[n].value.kind = AMQP_FIELD_KIND_U16;
    e[n++].value.value.u16 = 65535;
    KEY("I");
    e[n].value.kind = AMQP_FIELD_KIND_I32;
    e[n++].value.value.i32 = INT32_MIN;
    KEY("i");
    e[n].value.kind = AMQP_FIELD_KIND_U32;
    e[n++].value.value.u32 = UINT32_MAX;
    KEY("l");
    e[n].value.kind = AMQP_FIELD_KIND_I64;
    e[n++].value.value.i64 = -(INT64_C(1) << 53);
    KEY("L");
    e[n].value.kind = AMQP_FIELD_KIND_U64;
    e[n++].value.value.u64 = (uint64_t)INT64_C(-5);
    KEY("f");
    e[n].value.kind = AMQP_FIELD_KIND_F32;
    e[n++].value.value.f32 = 0.5f;
    KEY("d");
    e[n].value.kind = AMQP_FIELD_KIND_F64;
    e[n++].value.value.f64 = 3.0;
    KEY("D");
    e[n].value.kind = AMQP_FIELD_KIND_DECIMAL;
    e[n].value.value.decimal.decimals = 3;
    e[n++].value.value.decimal.value = 12345;
    KEY("D0");
    e[n].value.kind = AMQP_FIELD_KIND_DECIMAL;
    e[n].value.value.decimal.decimals = 0;
    e[n++].value.value.decimal.value = (uint32_t)-7;
    KEY("S");
    e[n].value.kind = AMQP_FIELD_KIND_UTF8;
    e[n++].value.value.bytes = bytes("h\xc3\xa9");
    KEY("T");
    e[n].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
    e[n++].value.value.u64 = 1893553445;
    KEY("V");
    e[n++].value.kind = AMQP_FIELD_KIND_VOID;
    KEY("x");
    e[n].value.kind = AMQP_FIELD_KIND_BYTES;
    e[n].value.value.bytes.len = 5;
    e[n++].value.value.bytes.bytes = (void *)"a\0b\xff"
                                             "c";
    KEY("A");
    e[n].value.kind = AMQP_FIELD_KIND_ARRAY;
    e[n].value.value.array.num_entries = 2;
    e[n++].value.value.array.entries = arr;
    arr[0].kind = AMQP_FIELD_KIND_I32;
    arr[0].value.i32 = 1;
    arr[1].kind = AMQP_FIELD_KIND_TABLE;
    arr[1].value.table.num_entries = 1;
    arr[1].value.table.entries = sub;
    sub[0].key = bytes("k");
    sub[0].value.kind = AMQP_FIELD_KIND_UTF8;
    sub[0].value.value.bytes = bytes("");
    KEY("F");
    e[n].value.kind = AMQP_FIELD_KIND_TABLE;
    e[n].value.value.table.num_entries = 0;
    e[n++].value.value.table.entries = NULL;
    KEY("e");
    e[n].value.kind = AMQP_FIELD_KIND_ARRAY;
    e[n].value.value.array.num_entries = 0;
    e[n++].value.value.array.entries = NULL;
    ck_assert_int_eq(n, 20);
#undef KEY
}

static const char every_json[] =
    "{\"t\": true, \"b\": -128, \"B\": 255, \"s\": -32768, \"u\": 65535, \"I\": "
    "-2147483648, "
    "\"i\": 4294967295, \"l\": -9007199254740992, \"L\": -5, \"f\": 0.5, \"d\": 3.0, "
    "\"D\": 12.345, \"D0\": -7, \"S\": \"h\\u00e9\", \"T\": 1893553445, \"V\": null, "
    "\"x\": \"a\\ufffdb\\ufffdc\", \"A\": [1, {\"k\": \"\"}], \"F\": {}, \"e\": []}";

START_TEST(test_every_kind)
{
    amqp_table_entry_t e[20], sub[1];
    amqp_field_value_t arr[2];
    amqp_table_t t = {20, e};
    cJSON *j = NULL;
    char *s;

    memset(e, 0, sizeof(e));
    every_kind(e, arr, sub);
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    s = dumps(j);
    ck_assert_str_eq(s, every_json);
    cr_free(s);
    ck_assert(cJSON_GetObjectItem(j, "f")->type & PY_JSON_FLOAT);
    ck_assert(cJSON_GetObjectItem(j, "d")->type & PY_JSON_FLOAT);
    ck_assert(cJSON_GetObjectItem(j, "D")->type & PY_JSON_FLOAT);
    ck_assert(!(cJSON_GetObjectItem(j, "D0")->type & PY_JSON_FLOAT));
    ck_assert(!(cJSON_GetObjectItem(j, "T")->type & PY_JSON_FLOAT));
    cJSON_Delete(j);
}
END_TEST

/* JSON -> table: the kind chosen for each JSON value, then back to JSON. */
START_TEST(test_to_table_kinds)
{
    const char *text =
        "{\"s\": \"x\", \"e\": \"\", \"t\": true, \"f\": false, \"n\": null, "
        "\"i\": -2147483647, \"i2\": -2147483648, \"l\": 4294967296, "
        "\"fl\": 1.0, \"fr\": 0.25, \"huge\": 1e300, \"o\": {\"a\": [1, [], {}]}, "
        "\"a\": []}";
    struct {
        const char *key;
        char kind;
    } want[] = {{"s", 'S'},    {"e", 'S'},  {"t", 't'}, {"f", 't'},  {"n", 'V'},
                {"i", 'I'},    {"i2", 'L'}, {"l", 'L'}, {"fl", 'd'}, {"fr", 'd'},
                {"huge", 'd'}, {"o", 'F'},  {"a", 'A'}};
    amqp_pool_t pool;
    amqp_table_t t;
    cJSON *j = NULL, *back = NULL;
    char *s;

    ck_assert_int_eq(py_json_parse(text, strlen(text), &j, NULL), 0);
    init_amqp_pool(&pool, 512);
    ck_assert_int_eq(rmq_json_to_table(j, &pool, &t, NULL), 0);
    ck_assert_int_eq(t.num_entries, 13);
    for (int i = 0; i < t.num_entries; i++) {
        ck_assert(t.entries[i].key.len == strlen(want[i].key));
        ck_assert(memcmp(t.entries[i].key.bytes, want[i].key, t.entries[i].key.len) == 0);
        ck_assert_int_eq(t.entries[i].value.kind, want[i].kind);
    }
    ck_assert_int_eq((int64_t)t.entries[6].value.value.u64, INT64_C(-2147483648));
    ck_assert_int_eq(t.entries[5].value.value.i32, -2147483647);
    ck_assert_int_eq(
        t.entries[11].value.value.table.entries[0].value.value.array.num_entries, 3);
    ck_assert_int_eq(rmq_json_from_table(&t, &back, NULL), 0);
    s = dumps(back);
    ck_assert_str_eq(
        s, "{\"s\": \"x\", \"e\": \"\", \"t\": true, \"f\": false, \"n\": null, "
           "\"i\": -2147483647, \"i2\": -2147483648, \"l\": 4294967296, "
           "\"fl\": 1.0, \"fr\": 0.25, \"huge\": 1e+300, \"o\": {\"a\": [1, [], "
           "{}]}, \"a\": []}");
    cr_free(s);
    cJSON_Delete(back);
    cJSON_Delete(j);
    empty_amqp_pool(&pool);
}
END_TEST

START_TEST(test_to_table_errors)
{
    amqp_pool_t pool;
    amqp_table_t t;
    struct cr_err err;
    cJSON *arr = cJSON_CreateArray(), *obj = cJSON_CreateObject();
    char key[300];

    init_amqp_pool(&pool, 512);
    ck_assert_int_eq(rmq_json_to_table(arr, &pool, &t, &err), CR_EINVAL);
    ck_assert_int_eq(rmq_json_to_table(NULL, &pool, &t, &err), CR_EINVAL);
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    cJSON_AddNullToObject(obj, key);
    ck_assert_int_eq(rmq_json_to_table(obj, &pool, &t, &err), CR_EINVAL);
    key[255] = '\0';
    cJSON_Delete(obj);
    obj = cJSON_CreateObject();
    cJSON_AddNullToObject(obj, key);
    ck_assert_int_eq(rmq_json_to_table(obj, &pool, &t, &err), 0);
    ck_assert_uint_eq(t.entries[0].key.len, 255);
    cJSON_Delete(obj);
    cJSON_Delete(arr);
    empty_amqp_pool(&pool);
}
END_TEST

/* n nested tables (the top one counts as 1), in static storage. */
#define DEEP 80
static amqp_table_t deep_table(amqp_table_entry_t *e, int n)
{
    amqp_table_t top = {n > 1 ? 1 : 0, e};
    for (int i = 0; i < n - 1; i++) {
        e[i].key = bytes("k");
        e[i].value.kind = AMQP_FIELD_KIND_TABLE;
        e[i].value.value.table.num_entries = i + 2 < n ? 1 : 0;
        e[i].value.value.table.entries = &e[i + 1];
    }
    return top;
}

static int json_depth(const cJSON *v)
{
    int best = 0;
    for (const cJSON *c = v->child; c; c = c->next) {
        int d = json_depth(c);
        if (d > best)
            best = d;
    }
    return (cJSON_IsArray(v) || cJSON_IsObject(v)) ? best + 1 : 0;
}

START_TEST(test_nested_depth)
{
    static amqp_table_entry_t e[DEEP];
    amqp_field_value_t arr[1];
    amqp_table_t t;
    cJSON *j = NULL;

    t = deep_table(e, 64);
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    ck_assert_int_eq(json_depth(j), 64);
    cJSON_Delete(j);
    t = deep_table(e, 65);
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), CR_EDECODE);
    ck_assert_ptr_null(j);
    /* an array level counts too: 63 tables + an empty array = 64 ... */
    t = deep_table(e, 63);
    e[61].value.kind = AMQP_FIELD_KIND_ARRAY;
    e[61].value.value.array.num_entries = 0;
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    ck_assert_int_eq(json_depth(j), 63);
    cJSON_Delete(j);
    t = deep_table(e, 64);
    e[62].value.kind = AMQP_FIELD_KIND_ARRAY;
    e[62].value.value.array.num_entries = 0;
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    ck_assert_int_eq(json_depth(j), 64);
    cJSON_Delete(j);
    /* ... and a 65th level inside an array fails */
    e[62].value.value.array.num_entries = 1;
    e[62].value.value.array.entries = arr;
    arr[0].kind = AMQP_FIELD_KIND_ARRAY;
    arr[0].value.array.num_entries = 0;
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), CR_EDECODE);
}
END_TEST

START_TEST(test_json_depth_limit)
{
    /* 64 nested objects convert, 65 do not */
    cJSON *root = cJSON_CreateObject(), *cur = root;
    amqp_pool_t pool;
    amqp_table_t t;
    init_amqp_pool(&pool, 4096);
    for (int i = 1; i < 64; i++)
        cur = cJSON_AddObjectToObject(cur, "k");
    ck_assert_int_eq(rmq_json_to_table(root, &pool, &t, NULL), 0);
    cJSON_AddArrayToObject(cur, "k");
    ck_assert_int_eq(rmq_json_to_table(root, &pool, &t, NULL), CR_EINVAL);
    cJSON_Delete(root);
    empty_amqp_pool(&pool);
}
END_TEST

START_TEST(test_unknown_kind)
{
    amqp_table_entry_t e[1];
    amqp_table_t t = {1, e};
    cJSON *j = (cJSON *)1;
    struct cr_err err;
    e[0].key = bytes("q");
    e[0].value.kind = 'Q';
    ck_assert_int_eq(rmq_json_from_table(&t, &j, &err), CR_EDECODE);
    ck_assert_ptr_null(j);
    ck_assert(strstr(err.msg, "0x51") != NULL);
}
END_TEST

/* One bad entry among good ones: the partial form keeps the good ones. */
START_TEST(test_partial_keeps_good_entries)
{
    static amqp_table_entry_t deep[DEEP];
    amqp_table_entry_t e[5];
    amqp_table_t t = {5, e}, nested;
    cJSON *j = (cJSON *)1;
    struct cr_err err;
    char *s;
    long n;

    memset(e, 0, sizeof(e));
    nested = deep_table(deep, 66); /* 65 levels below the entry */
    e[0].key = bytes("id");
    e[0].value.kind = AMQP_FIELD_KIND_UTF8;
    e[0].value.value.bytes = bytes("abc");
    e[1].key = bytes("deep");
    e[1].value.kind = AMQP_FIELD_KIND_TABLE;
    e[1].value.value.table = nested.entries[0].value.value.table;
    e[2].key = bytes("task");
    e[2].value.kind = AMQP_FIELD_KIND_UTF8;
    e[2].value.value.bytes = bytes("llm.generate");
    e[3].key = bytes("odd");
    e[3].value.kind = 'Q';
    e[4].key = bytes("retries");
    e[4].value.kind = AMQP_FIELD_KIND_I32;
    e[4].value.value.i32 = 2;
    /* the whole-table form still fails as a whole */
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), CR_EDECODE);
    ck_assert_ptr_null(j);
    ck_assert_int_eq(rmq_json_from_table_partial(&t, &j, &err), CR_EDECODE);
    ck_assert_ptr_nonnull(j);
    s = dumps(j);
    ck_assert_str_eq(s, "{\"id\": \"abc\", \"task\": \"llm.generate\", \"retries\": 2}");
    cr_free(s);
    cJSON_Delete(j);
    ck_assert_msg(strstr(err.msg, "header 'deep': header nested deeper than 64") &&
                      strstr(err.msg, "(and 1 more)"),
                  "%s", err.msg);
    /* nothing bad: 0, as the whole-table form */
    t.num_entries = 1;
    ck_assert_int_eq(rmq_json_from_table_partial(&t, &j, &err), 0);
    cJSON_Delete(j);
    ck_assert_int_eq(rmq_json_from_table_partial(NULL, &j, NULL), 0);
    ck_assert(cJSON_IsObject(j) && j->child == NULL);
    cJSON_Delete(j);
    /* out of memory anywhere: CR_ENOMEM and nothing to free */
    t.num_entries = 5;
    for (n = 1;; n++) {
        int rc;
        cr_alloc_fail_after(n);
        rc = rmq_json_from_table_partial(&t, &j, NULL);
        cr_alloc_fail_after(0);
        if (rc == CR_EDECODE) {
            cJSON_Delete(j);
            break;
        }
        ck_assert_int_eq(rc, CR_ENOMEM);
        ck_assert_ptr_null(j);
    }
}
END_TEST

/* A repeated key: first position, last value (as a Python dict). */
START_TEST(test_duplicate_keys)
{
    amqp_table_entry_t e[3];
    amqp_table_t t = {3, e};
    cJSON *j = NULL;
    char *s;
    memset(e, 0, sizeof(e));
    e[0].key = bytes("a");
    e[0].value.kind = AMQP_FIELD_KIND_I32;
    e[0].value.value.i32 = 1;
    e[1].key = bytes("b");
    e[1].value.kind = AMQP_FIELD_KIND_VOID;
    e[2].key = bytes("a");
    e[2].value.kind = AMQP_FIELD_KIND_I32;
    e[2].value.value.i32 = 2;
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    s = dumps(j);
    ck_assert_str_eq(s, "{\"a\": 2, \"b\": null}");
    cr_free(s);
    cJSON_Delete(j);
}
END_TEST

START_TEST(test_null_and_empty)
{
    cJSON *j = NULL;
    amqp_table_t t = {0, NULL};
    ck_assert_int_eq(rmq_json_from_table(NULL, &j, NULL), 0);
    ck_assert(cJSON_IsObject(j) && j->child == NULL);
    cJSON_Delete(j);
    ck_assert_int_eq(rmq_json_from_table(&t, &j, NULL), 0);
    ck_assert(cJSON_IsObject(j) && j->child == NULL);
    cJSON_Delete(j);
}
END_TEST

START_TEST(test_oom_from_table)
{
    amqp_pool_t pool;
    amqp_table_t t;
    amqp_bytes_t in = {sizeof(wire_py) - 1, (void *)wire_py};
    amqp_table_entry_t e[20], sub[1];
    amqp_field_value_t arr[2];
    amqp_table_t every = {20, e};
    size_t off = 0;
    long n;

    memset(e, 0, sizeof(e));
    every_kind(e, arr, sub);
    init_amqp_pool(&pool, 4096);
    ck_assert_int_eq(amqp_decode_table(in, &pool, &t, &off), 0);
    for (int which = 0; which < 2; which++) {
        for (n = 1;; n++) {
            cJSON *j = (cJSON *)1;
            int rc;
            cr_alloc_fail_after(n);
            rc = rmq_json_from_table(which ? &every : &t, &j, NULL);
            cr_alloc_fail_after(0);
            if (rc == 0) {
                char *s = dumps(j);
                ck_assert_str_eq(s, which ? every_json : want_json);
                cr_free(s);
                cJSON_Delete(j);
                break;
            }
            ck_assert_int_eq(rc, CR_ENOMEM);
            ck_assert_ptr_null(j);
        }
        ck_assert(n > 20);
    }
    empty_amqp_pool(&pool);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("rmq_json");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_py_amqp_wire);
    tcase_add_test(tc, test_json_to_wire);
    tcase_add_test(tc, test_every_kind);
    tcase_add_test(tc, test_to_table_kinds);
    tcase_add_test(tc, test_to_table_errors);
    tcase_add_test(tc, test_nested_depth);
    tcase_add_test(tc, test_json_depth_limit);
    tcase_add_test(tc, test_unknown_kind);
    tcase_add_test(tc, test_duplicate_keys);
    tcase_add_test(tc, test_partial_keeps_good_entries);
    tcase_add_test(tc, test_null_and_empty);
    tcase_add_test(tc, test_oom_from_table);
    suite_add_tcase(s, tc);
    return s;
}
