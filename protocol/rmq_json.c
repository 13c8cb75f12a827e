/* rmq_json.c -- AMQP field tables (rabbitmq-c) to and from cJSON trees. */
#include "rmq_json.h"

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "../util/alloc.h"
#include "../util/buf.h"
#include "pyjson.h"

/* Same limit as the JSON body decoder; the top-level table counts as 1. */
#define MAX_DEPTH PY_JSON_MAX_DEPTH

/* ---- table -> JSON ---- */

/* Returns a new NUL-terminated UTF-8 copy of an AMQP string. Broker strings are
 * not checked by rabbitmq-c and cJSON strings cannot hold NUL, so invalid
 * sequences and NUL bytes become U+FFFD rather than failing the whole message. */
static char *utf8_copy(amqp_bytes_t b)
{
    const char *s = b.bytes;
    struct buf out;
    size_t i = 0;

    buf_init(&out);
    /* The empty append NUL-terminates: buf_reserve() alone does not. */
    if (buf_reserve(&out, b.len) || buf_append(&out, "", 0)) {
        buf_release(&out);
        return NULL;
    }
    while (i < b.len) {
        uint32_t cp;
        size_t n = py_utf8_next(s + i, b.len - i, &cp);
        int rc;
        if (n == 0 || cp == 0) {
            rc = buf_append(&out, "\xEF\xBF\xBD", 3);
            n = 1;
        } else {
            rc = buf_append(&out, s + i, n);
        }
        if (rc) {
            buf_release(&out);
            return NULL;
        }
        i += n;
    }
    return buf_detach(&out);
}

static cJSON *string_item(amqp_bytes_t b)
{
    char *s = utf8_copy(b);
    cJSON *item = s ? cJSON_CreateString(s) : NULL;
    cr_free(s);
    return item;
}

static int table_to_json(const amqp_table_t *t, int depth, cJSON **out,
                         struct cr_err *err);

static int value_to_json(const amqp_field_value_t *v, int depth, cJSON **out,
                         struct cr_err *err)
{
    cJSON *item = NULL;
    int rc;

    *out = NULL;
    switch (v->kind) {
    case AMQP_FIELD_KIND_BOOLEAN:
        item = cJSON_CreateBool(v->value.boolean != 0);
        break;
    case AMQP_FIELD_KIND_I8:
        item = cJSON_CreateNumber(v->value.i8);
        break;
    case AMQP_FIELD_KIND_U8:
        item = cJSON_CreateNumber(v->value.u8);
        break;
    case AMQP_FIELD_KIND_I16:
        item = cJSON_CreateNumber(v->value.i16);
        break;
    case AMQP_FIELD_KIND_U16:
        item = cJSON_CreateNumber(v->value.u16);
        break;
    case AMQP_FIELD_KIND_I32:
        item = cJSON_CreateNumber(v->value.i32);
        break;
    case AMQP_FIELD_KIND_U32:
        item = cJSON_CreateNumber(v->value.u32);
        break;
    case AMQP_FIELD_KIND_I64:
        item = cJSON_CreateNumber((double)v->value.i64);
        break;
    case AMQP_FIELD_KIND_U64:
        /* rabbitmq-c calls 'L' unsigned, but py-amqp writes every int beyond
         * 32 bits as a signed 'L' (struct '>q'), and Python is the peer. */
        item = cJSON_CreateNumber((double)(int64_t)v->value.u64);
        break;
    case AMQP_FIELD_KIND_F32:
        item = py_json_float(v->value.f32);
        break;
    case AMQP_FIELD_KIND_F64:
        item = py_json_float(v->value.f64);
        break;
    case AMQP_FIELD_KIND_DECIMAL: {
        /* py-amqp writes the unscaled value as a signed 32-bit int. */
        double d = (double)(int32_t)v->value.decimal.value;
        d /= pow(10.0, v->value.decimal.decimals);
        item = v->value.decimal.decimals ? py_json_float(d) : cJSON_CreateNumber(d);
        break;
    }
    case AMQP_FIELD_KIND_TIMESTAMP:
        item = cJSON_CreateNumber((double)v->value.u64);
        break;
    case AMQP_FIELD_KIND_VOID:
        item = cJSON_CreateNull();
        break;
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
        item = string_item(v->value.bytes);
        break;
    case AMQP_FIELD_KIND_TABLE:
        return table_to_json(&v->value.table, depth + 1, out, err);
    case AMQP_FIELD_KIND_ARRAY:
        if (depth + 1 > MAX_DEPTH)
            return cr_err_set(err, CR_EDECODE, "header nested deeper than %d", MAX_DEPTH);
        item = cJSON_CreateArray();
        if (!item)
            break;
        for (int i = 0; i < v->value.array.num_entries; i++) {
            cJSON *elem;
            rc = value_to_json(&v->value.array.entries[i], depth + 1, &elem, err);
            if (rc) {
                cJSON_Delete(item);
                return rc;
            }
            if (!cJSON_AddItemToArray(item, elem)) {
                cJSON_Delete(elem);
                cJSON_Delete(item);
                return cr_err_set(err, CR_ENOMEM, "out of memory");
            }
        }
        break;
    default:
        return cr_err_set(err, CR_EDECODE, "unknown header field kind 0x%02x", v->kind);
    }
    if (!item)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    *out = item;
    return 0;
}

/* Converts one entry and adds it to obj; obj is unchanged on error. */
static int add_entry(cJSON *obj, const amqp_table_entry_t *e, int depth,
                     struct cr_err *err)
{
    cJSON *item, *old;
    char *key;
    int rc = value_to_json(&e->value, depth, &item, err);
    if (rc)
        return rc;
    key = utf8_copy(e->key);
    if (!key) {
        cJSON_Delete(item);
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    }
    /* The name is set by hand (cJSON frees it with the same allocator) so
     * that a repeated key can replace the earlier value in place, which is
     * what a Python dict does; cJSON's own replace ignores a failed strdup. */
    item->string = key;
    old = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (old)
        cJSON_ReplaceItemViaPointer(obj, old, item);
    else
        cJSON_AddItemToArray(obj, item);
    return 0;
}

static int table_to_json(const amqp_table_t *t, int depth, cJSON **out,
                         struct cr_err *err)
{
    cJSON *obj;

    *out = NULL;
    if (depth > MAX_DEPTH)
        return cr_err_set(err, CR_EDECODE, "header nested deeper than %d", MAX_DEPTH);
    obj = cJSON_CreateObject();
    if (!obj)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    for (int i = 0; i < t->num_entries; i++) {
        int rc = add_entry(obj, &t->entries[i], depth, err);
        if (rc) {
            cJSON_Delete(obj);
            return rc;
        }
    }
    *out = obj;
    return 0;
}

int rmq_json_from_table(const amqp_table_t *t, cJSON **out, struct cr_err *err)
{
    static const amqp_table_t empty = {0, NULL};
    return table_to_json(t ? t : &empty, 1, out, err);
}

int rmq_json_from_table_partial(const amqp_table_t *t, cJSON **out, struct cr_err *err)
{
    cJSON *obj = cJSON_CreateObject();
    int dropped = 0;

    *out = NULL;
    if (!obj)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    for (int i = 0; t && i < t->num_entries; i++) {
        const amqp_table_entry_t *e = &t->entries[i];
        struct cr_err one;
        int rc = add_entry(obj, e, 1, &one);
        if (rc == CR_EDECODE) {
            /* The first bad entry is named; the count says if there were more. */
            if (!dropped++) {
                char *key = utf8_copy(e->key);
                cr_err_set(err, CR_EDECODE, "header '%.64s': %s", key ? key : "?",
                           one.msg);
                cr_free(key);
            }
            continue;
        }
        if (rc) {
            cJSON_Delete(obj);
            return cr_err_set(err, rc, "%s", one.msg);
        }
    }
    *out = obj;
    if (dropped > 1 && err)
        snprintf(err->msg + strlen(err->msg), sizeof(err->msg) - strlen(err->msg),
                 " (and %d more)", dropped - 1);
    return dropped ? CR_EDECODE : 0;
}

/* ---- JSON -> table ---- */

static int pool_bytes(amqp_pool_t *pool, const char *s, size_t len, amqp_bytes_t *out)
{
    out->len = len;
    out->bytes = NULL;
    if (len == 0)
        return 0;
    out->bytes = amqp_pool_alloc(pool, len);
    if (!out->bytes)
        return CR_ENOMEM;
    memcpy(out->bytes, s, len);
    return 0;
}

static int obj_to_table(const cJSON *obj, amqp_pool_t *pool, int depth, amqp_table_t *out,
                        struct cr_err *err);

static int json_to_value(const cJSON *v, amqp_pool_t *pool, int depth,
                         amqp_field_value_t *out, struct cr_err *err)
{
    memset(out, 0, sizeof(*out));
    switch (v->type & 0xFF) {
    case cJSON_False:
    case cJSON_True:
        out->kind = AMQP_FIELD_KIND_BOOLEAN;
        out->value.boolean = cJSON_IsTrue(v);
        return 0;
    case cJSON_Number: {
        double d = v->valuedouble;
        /* Mirrors py-amqp's _write_item: floats 'd', ints 'I' within
         * +-2147483647, else a signed 64-bit 'L'. */
        if ((v->type & PY_JSON_FLOAT) || floor(d) != d || !isfinite(d) ||
            d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
            out->kind = AMQP_FIELD_KIND_F64;
            out->value.f64 = d;
        } else if (d >= -2147483647.0 && d <= 2147483647.0) {
            out->kind = AMQP_FIELD_KIND_I32;
            out->value.i32 = (int32_t)d;
        } else {
            out->kind = AMQP_FIELD_KIND_U64;
            out->value.u64 = (uint64_t)(int64_t)d;
        }
        return 0;
    }
    case cJSON_String:
    case cJSON_Raw: {
        const char *s = v->valuestring ? v->valuestring : "";
        out->kind = AMQP_FIELD_KIND_UTF8;
        if (pool_bytes(pool, s, strlen(s), &out->value.bytes))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        return 0;
    }
    case cJSON_Object:
        out->kind = AMQP_FIELD_KIND_TABLE;
        return obj_to_table(v, pool, depth + 1, &out->value.table, err);
    case cJSON_Array: {
        int n = cJSON_GetArraySize(v), i = 0;
        const cJSON *c;
        if (depth + 1 > MAX_DEPTH)
            return cr_err_set(err, CR_EINVAL, "JSON nested deeper than %d", MAX_DEPTH);
        out->kind = AMQP_FIELD_KIND_ARRAY;
        out->value.array.num_entries = n;
        out->value.array.entries = NULL;
        if (n == 0)
            return 0;
        out->value.array.entries =
            amqp_pool_alloc(pool, (size_t)n * sizeof(amqp_field_value_t));
        if (!out->value.array.entries)
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        for (c = v->child; c; c = c->next, i++) {
            int rc = json_to_value(c, pool, depth + 1, &out->value.array.entries[i], err);
            if (rc)
                return rc;
        }
        return 0;
    }
    default: /* null, invalid */
        out->kind = AMQP_FIELD_KIND_VOID;
        return 0;
    }
}

static int obj_to_table(const cJSON *obj, amqp_pool_t *pool, int depth, amqp_table_t *out,
                        struct cr_err *err)
{
    int n = cJSON_GetArraySize(obj), i = 0;
    const cJSON *c;

    out->num_entries = 0;
    out->entries = NULL;
    if (depth > MAX_DEPTH)
        return cr_err_set(err, CR_EINVAL, "JSON nested deeper than %d", MAX_DEPTH);
    if (n == 0)
        return 0;
    out->entries = amqp_pool_alloc(pool, (size_t)n * sizeof(amqp_table_entry_t));
    if (!out->entries)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    for (c = obj->child; c; c = c->next, i++) {
        amqp_table_entry_t *e = &out->entries[i];
        const char *key = c->string ? c->string : "";
        size_t klen = strlen(key);
        int rc;
        /* Field names are AMQP short strings. */
        if (klen > 255)
            return cr_err_set(err, CR_EINVAL, "header name longer than 255 bytes");
        if (pool_bytes(pool, key, klen, &e->key))
            return cr_err_set(err, CR_ENOMEM, "out of memory");
        rc = json_to_value(c, pool, depth, &e->value, err);
        if (rc)
            return rc;
        out->num_entries = i + 1;
    }
    return 0;
}

int rmq_json_to_table(const cJSON *obj, amqp_pool_t *pool, amqp_table_t *out,
                      struct cr_err *err)
{
    out->num_entries = 0;
    out->entries = NULL;
    if (!cJSON_IsObject(obj))
        return cr_err_set(err, CR_EINVAL, "headers are not a JSON object");
    return obj_to_table(obj, pool, 1, out, err);
}
