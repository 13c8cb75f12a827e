/* rq_data.c -- RQ's job data: capped zlib, a restricted pickle reader, the
 * JSONSerializer form, and a CPython-exact pickle writer (no I/O). */
#include "rq_data.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "pyjson.h"
#include "../util/alloc.h"
#include "../util/base64.h"
#include "../util/strmap.h"

const char *rq_serializer_name(enum rq_serializer s)
{
    return s == RQ_SERIALIZER_JSON ? "json" : "pickle";
}

void rq_limits_init(struct rq_limits *lim)
{
    lim->max_data_bytes = (size_t)16 << 20;
    lim->max_inflated_bytes = (size_t)64 << 20;
    lim->max_ratio = 1000;
    lim->max_values = 1000000;
    lim->max_memo = (size_t)1 << 20;
    lim->max_depth = 64;
}

/* ======================================================================== */
/* zlib                                                                     */
/* ======================================================================== */

int rq_data_inflate(const void *data, size_t len, const struct rq_limits *lim,
                    struct buf *out, struct cr_err *err)
{
    z_stream zs;
    size_t cap, start = out->len, chunk;
    int zrc, rc = 0;

    if (len > lim->max_data_bytes)
        return cr_err_set(err, CR_ETOOBIG, "job data of %zu bytes exceeds %zu", len,
                          lim->max_data_bytes);
    cap = lim->max_inflated_bytes;
    if (lim->max_ratio && len <= cap / lim->max_ratio)
        cap = len * lim->max_ratio;
    memset(&zs, 0, sizeof zs);
    zs.zalloc = Z_NULL;
    zs.zfree = Z_NULL;
    if (inflateInit(&zs) != Z_OK)
        return cr_err_set(err, CR_ENOMEM, "cannot start inflating job data");
    zs.next_in = (Bytef *)(uintptr_t)data;
    zs.avail_in = (uInt)len; /* len <= max_data_bytes, far below 4 GiB */
    chunk = len < 4096 ? 4096 : len * 4;
    for (;;) {
        size_t room, have = out->len - start;
        if (have >= cap) {
            /* Full: one more byte of output would pass the cap. */
            unsigned char probe;
            zs.next_out = &probe;
            zs.avail_out = 1;
            zrc = inflate(&zs, Z_NO_FLUSH);
            if (zs.avail_out == 0) {
                rc = cr_err_set(err, CR_ETOOBIG,
                                "job data inflates past %zu bytes (%zu compressed)", cap,
                                len);
                break;
            }
            if (zrc == Z_STREAM_END)
                break;
            if (zrc == Z_OK)
                continue; /* input read (the checksum), no output: read on */
            goto raw;
        }
        room = cap - have < chunk ? cap - have : chunk;
        rc = buf_reserve(out, room);
        if (rc != 0) {
            cr_err_set(err, rc, "cannot allocate %zu bytes for job data", room);
            break;
        }
        zs.next_out = (Bytef *)out->data + out->len;
        zs.avail_out = (uInt)room;
        zrc = inflate(&zs, Z_NO_FLUSH);
        out->len += room - zs.avail_out;
        out->data[out->len] = '\0';
        if (zrc == Z_STREAM_END)
            break;
        if (zrc == Z_OK || (zrc == Z_BUF_ERROR && zs.avail_in > 0)) {
            if (chunk < ((size_t)1 << 24))
                chunk *= 2;
            continue;
        }
        goto raw; /* not zlib, corrupt or truncated: RQ reads the bytes as they are */
    }
    inflateEnd(&zs);
    return rc;
raw:
    inflateEnd(&zs);
    out->len = start;
    if (out->data)
        out->data[start] = '\0';
    rc = buf_append(out, data, len);
    if (rc != 0)
        cr_err_set(err, rc, "cannot copy %zu bytes of job data", len);
    return rc;
}

/* ======================================================================== */
/* Restricted pickle reader                                                 */
/* ======================================================================== */

/* Set on a list or dict while it is a value on the stack that can still be
 * filled; cleared when it is placed into its parent. COPIED_BIT is set on an
 * open container a memo reference was copied from: CPython does that for
 * (x, x) and [x, x] (the second x is fetched before the first is placed), and
 * it is exact as long as x is not filled again; if it is, the copy ends up
 * inside x, which in Python is x inside itself, so a fill then is refused as a
 * cycle. Neither bit is left on output. */
#define OPEN_BIT 0x4000
#define COPIED_BIT 0x8000
#define OUR_BITS (OPEN_BIT | COPIED_BIT)

enum { E_MARK, E_VALUE, E_REF };

struct ent {
    cJSON *node; /* E_VALUE: owned; E_REF: a memo entry's node, borrowed */
    int kind;
    int depth; /* E_VALUE only */
};

struct dec {
    const unsigned char *s;
    size_t len, pos;
    const struct rq_limits *lim;
    struct ent *st;
    size_t n, cap;
    cJSON **memo;
    size_t memo_cap, memo_count;
    size_t used;  /* of lim->max_values */
    size_t bytes; /* text copied by memo fetches, of lim->max_inflated_bytes */
    cJSON *spare; /* consumed key nodes, kept because the memo may point at them */
    struct cr_err *err;
};

static const struct {
    unsigned char op;
    const char *name;
} opnames[] = {
    {0x28, "MARK"},         {0x2e, "STOP"},
    {0x30, "POP"},          {0x31, "POP_MARK"},
    {0x32, "DUP"},          {0x46, "FLOAT"},
    {0x49, "INT"},          {0x4a, "BININT"},
    {0x4b, "BININT1"},      {0x4c, "LONG"},
    {0x4d, "BININT2"},      {0x4e, "NONE"},
    {0x50, "PERSID"},       {0x51, "BINPERSID"},
    {0x52, "REDUCE"},       {0x53, "STRING"},
    {0x54, "BINSTRING"},    {0x55, "SHORT_BINSTRING"},
    {0x56, "UNICODE"},      {0x58, "BINUNICODE"},
    {0x61, "APPEND"},       {0x62, "BUILD"},
    {0x63, "GLOBAL"},       {0x64, "DICT"},
    {0x7d, "EMPTY_DICT"},   {0x65, "APPENDS"},
    {0x67, "GET"},          {0x68, "BINGET"},
    {0x69, "INST"},         {0x6a, "LONG_BINGET"},
    {0x6c, "LIST"},         {0x5d, "EMPTY_LIST"},
    {0x6f, "OBJ"},          {0x70, "PUT"},
    {0x71, "BINPUT"},       {0x72, "LONG_BINPUT"},
    {0x73, "SETITEM"},      {0x74, "TUPLE"},
    {0x29, "EMPTY_TUPLE"},  {0x75, "SETITEMS"},
    {0x47, "BINFLOAT"},     {0x80, "PROTO"},
    {0x81, "NEWOBJ"},       {0x82, "EXT1"},
    {0x83, "EXT2"},         {0x84, "EXT4"},
    {0x85, "TUPLE1"},       {0x86, "TUPLE2"},
    {0x87, "TUPLE3"},       {0x88, "NEWTRUE"},
    {0x89, "NEWFALSE"},     {0x8a, "LONG1"},
    {0x8b, "LONG4"},        {0x43, "SHORT_BINBYTES"},
    {0x42, "BINBYTES"},     {0x8c, "SHORT_BINUNICODE"},
    {0x8d, "BINUNICODE8"},  {0x8e, "BINBYTES8"},
    {0x8f, "EMPTY_SET"},    {0x90, "ADDITEMS"},
    {0x91, "FROZENSET"},    {0x92, "NEWOBJ_EX"},
    {0x93, "STACK_GLOBAL"}, {0x94, "MEMOIZE"},
    {0x95, "FRAME"},        {0x96, "BYTEARRAY8"},
    {0x97, "NEXT_BUFFER"},  {0x98, "READONLY_BUFFER"},
};

static const char *opname(unsigned char op)
{
    for (size_t i = 0; i < sizeof opnames / sizeof opnames[0]; i++)
        if (opnames[i].op == op)
            return opnames[i].name;
    return "unknown";
}

static int fail(struct dec *d, int code, const char *what)
{
    return cr_err_set(d->err, code, "pickle %s at offset %zu", what, d->pos);
}

/* Makes sure n more bytes are there. */
static int need(struct dec *d, size_t n)
{
    if (d->len - d->pos < n)
        return cr_err_set(d->err, CR_EDECODE, "pickle truncated at offset %zu", d->len);
    return 0;
}

static uint64_t le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Reads a length prefix of n bytes and checks it against what is left. */
static int length(struct dec *d, int n, size_t *out)
{
    uint64_t v;
    int rc = need(d, (size_t)n);
    if (rc)
        return rc;
    v = le(d->s + d->pos, n);
    d->pos += (size_t)n;
    if (v > d->len - d->pos)
        return cr_err_set(d->err, CR_EDECODE,
                          "pickle length %" PRIu64
                          " at offset %zu exceeds the %zu bytes left",
                          v, d->pos - (size_t)n - 1, d->len - d->pos);
    *out = (size_t)v;
    return 0;
}

static int spend(struct dec *d, size_t n)
{
    if (n > d->lim->max_values - d->used)
        return cr_err_set(d->err, CR_ETOOBIG,
                          "pickle expands past %zu values at offset %zu",
                          d->lim->max_values, d->pos);
    d->used += n;
    return 0;
}

static int push(struct dec *d, int kind, cJSON *node, int depth)
{
    int rc;
    if (node == NULL && kind != E_MARK)
        return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
    rc = spend(d, 1);
    if (rc == 0 && d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 32;
        struct ent *st = cr_realloc(d->st, cap * sizeof *st);
        if (st == NULL)
            rc = cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
        else {
            d->st = st;
            d->cap = cap;
        }
    }
    if (rc) {
        if (kind == E_VALUE)
            cJSON_Delete(node);
        return rc;
    }
    d->st[d->n].node = node;
    d->st[d->n].kind = kind;
    d->st[d->n].depth = depth;
    d->n++;
    return 0;
}

/* Index of the topmost MARK, or -1. */
static long find_mark(const struct dec *d)
{
    for (size_t i = d->n; i > 0; i--)
        if (d->st[i - 1].kind == E_MARK)
            return (long)(i - 1);
    return -1;
}

/* Counts the nodes of a tree (stopping past limit), the text it holds and its
 * depth. */
static void measure(const cJSON *n, size_t limit, size_t *count, size_t *bytes,
                    int *depth)
{
    int deepest = 0;
    (*count)++;
    if (n->string)
        *bytes += strlen(n->string);
    if (n->valuestring)
        *bytes += strlen(n->valuestring);
    if (!cJSON_IsArray(n) && !cJSON_IsObject(n)) {
        *depth = 0;
        return;
    }
    for (const cJSON *c = n->child; c && *count <= limit; c = c->next) {
        int cd;
        measure(c, limit, count, bytes, &cd);
        if (cd > deepest)
            deepest = cd;
    }
    *depth = deepest + 1;
}

/* Takes the value of stack entry e for placing into a container: a value is
 * moved out, a memo reference is copied at the cost of its whole subtree. */
static int take(struct dec *d, struct ent *e, cJSON **out, int *depth)
{
    size_t count = 0, bytes = 0;
    cJSON *dup;
    if (e->kind == E_VALUE) {
        *out = e->node;
        e->node->type &= ~OUR_BITS;
        e->node = NULL;
        e->kind = E_MARK; /* nothing left to free */
        *depth = e->depth;
        return 0;
    }
    measure(e->node, d->lim->max_values - d->used, &count, &bytes, depth);
    /* The reference itself was already paid for when it was pushed. */
    if (spend(d, count - 1))
        return CR_ETOOBIG;
    if (bytes > d->lim->max_inflated_bytes - d->bytes)
        return cr_err_set(d->err, CR_ETOOBIG,
                          "pickle memo fetches copy more than %zu bytes at offset %zu",
                          d->lim->max_inflated_bytes, d->pos);
    d->bytes += bytes;
    dup = cJSON_Duplicate(e->node, 1);
    if (dup == NULL)
        return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
    if (e->node->type & OPEN_BIT)
        e->node->type |= COPIED_BIT;
    dup->type &= ~OUR_BITS;
    if (dup->string) {
        cr_free(dup->string);
        dup->string = NULL;
    }
    *out = dup;
    return 0;
}

static int cycle(struct dec *d)
{
    return fail(d, CR_EDECODE,
                "fill of a container already copied through the memo (a cycle)");
}

static int too_deep(struct dec *d, int depth)
{
    if (depth > d->lim->max_depth)
        return cr_err_set(d->err, CR_ETOOBIG, "pickle nests deeper than %d at offset %zu",
                          d->lim->max_depth, d->pos);
    return 0;
}

/* Moves the entries from index first to the top into the array at index to,
 * in order; the array must be an E_VALUE. */
static int fill_array(struct dec *d, size_t first, size_t to)
{
    struct ent *t = &d->st[to];
    for (size_t i = first; i < d->n; i++) {
        cJSON *item;
        int depth, rc = take(d, &d->st[i], &item, &depth);
        if (rc)
            return rc;
        if (depth + 1 > t->depth)
            t->depth = depth + 1;
        if (t->node->type & COPIED_BIT) {
            cJSON_Delete(item);
            return cycle(d);
        }
        if (!cJSON_AddItemToArray(t->node, item)) {
            cJSON_Delete(item);
            return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
        }
        if (too_deep(d, t->depth))
            return CR_ETOOBIG;
    }
    return 0;
}

/* Pops entries down to (and without) index keep, freeing what they own. */
static void drop_to(struct dec *d, size_t keep)
{
    while (d->n > keep) {
        struct ent *e = &d->st[--d->n];
        if (e->kind == E_VALUE)
            cJSON_Delete(e->node);
    }
}

static int key_text(struct dec *d, const cJSON *k, char *tmp, size_t tmplen,
                    const char **out)
{
    if (cJSON_IsString(k) && !(k->type & RQ_JSON_BYTES)) {
        *out = k->valuestring;
        return 0;
    }
    if (cJSON_IsRaw(k)) {
        *out = k->valuestring;
        return 0;
    }
    if (cJSON_IsNumber(k) && !(k->type & PY_JSON_FLOAT)) {
        snprintf(tmp, tmplen, "%" PRId64, (int64_t)k->valuedouble);
        *out = tmp;
        return 0;
    }
    return fail(d, CR_EDECODE, "dict key that is not a str or an int");
}

/* Moves key/value pairs from index first to the top into the dict at to. */
static int fill_dict(struct dec *d, size_t first, size_t to)
{
    struct ent *t = &d->st[to];
    if ((d->n - first) % 2)
        return fail(d, CR_EDECODE, "odd number of items for a dict");
    for (size_t i = first; i < d->n; i += 2) {
        struct ent *ke = &d->st[i];
        char tmp[32];
        const char *key = NULL;
        cJSON *item;
        int depth, rc = key_text(d, ke->node, tmp, sizeof tmp, &key);
        if (rc)
            return rc;
        rc = take(d, &d->st[i + 1], &item, &depth);
        if (rc)
            return rc;
        if (t->node->type & COPIED_BIT) {
            cJSON_Delete(item);
            return cycle(d);
        }
        if (!cJSON_AddItemToObject(t->node, key, item)) {
            cJSON_Delete(item);
            return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
        }
        if (ke->kind == E_VALUE) {
            /* The memo may point at the key: keep it until the end. */
            ke->node->string = NULL;
            cJSON_AddItemToArray(d->spare, ke->node);
            ke->kind = E_MARK;
            ke->node = NULL;
        }
        if (depth + 1 > t->depth)
            t->depth = depth + 1;
        if (too_deep(d, t->depth))
            return CR_ETOOBIG;
    }
    return 0;
}

/* The open list or dict that APPEND(S)/SETITEM(S) at stack index i fill. */
static int target(struct dec *d, long i, int is_dict, unsigned char op)
{
    struct ent *t;
    char what[80];
    if (i < 0 || d->st[i].kind == E_MARK) {
        snprintf(what, sizeof what, "%s without a %s below it", opname(op),
                 is_dict ? "dict" : "list");
        return fail(d, CR_EDECODE, what);
    }
    t = &d->st[i];
    if (t->kind == E_REF) {
        snprintf(what, sizeof what, "%s into a memo reference", opname(op));
        return fail(d, CR_EDECODE, what);
    }
    if (t->node->type & COPIED_BIT)
        return cycle(d);
    if (!(t->node->type & OPEN_BIT) ||
        (is_dict ? !cJSON_IsObject(t->node) : !cJSON_IsArray(t->node))) {
        snprintf(what, sizeof what, "%s into something that is not a %s", opname(op),
                 is_dict ? "dict" : "list");
        return fail(d, CR_EDECODE, what);
    }
    return 0;
}

static int make_tuple(struct dec *d, size_t first)
{
    cJSON *arr = cJSON_CreateArray();
    struct ent tmp;
    int rc;
    if (arr == NULL)
        return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
    /* Placed on the stack first, so that its items are freed with it on error. */
    tmp.node = arr;
    tmp.kind = E_VALUE;
    tmp.depth = 1;
    rc = push(d, E_VALUE, arr, 1);
    if (rc)
        return rc;
    /* Move the new entry below the items. */
    memmove(&d->st[first + 1], &d->st[first], (d->n - 1 - first) * sizeof *d->st);
    d->st[first] = tmp;
    rc = fill_array(d, first + 1, first);
    drop_to(d, first + 1);
    return rc;
}

static int strict_text(struct dec *d, const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k;
        if (p[i] == 0)
            return fail(d, CR_EDECODE, "string holds a NUL character");
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        k = py_utf8_next((const char *)p + i, n - i, &cp);
        if (k == 0)
            return cr_err_set(d->err, CR_EDECODE,
                              "pickle string is not valid UTF-8 at offset %zu",
                              d->pos + i);
        i += k;
    }
    return 0;
}

static int read_str(struct dec *d, int lenbytes)
{
    size_t n;
    char *s;
    cJSON *item;
    int rc = length(d, lenbytes, &n);
    if (rc == 0)
        rc = strict_text(d, d->s + d->pos, n);
    if (rc)
        return rc;
    s = cr_strndup((const char *)d->s + d->pos, n);
    d->pos += n;
    if (s == NULL)
        return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
    item = cJSON_CreateString(s);
    cr_free(s);
    return push(d, E_VALUE, item, 0);
}

static int read_bytes(struct dec *d, int lenbytes)
{
    size_t n;
    struct buf b;
    cJSON *item;
    int rc = length(d, lenbytes, &n);
    if (rc)
        return rc;
    buf_init(&b);
    rc = buf_reserve(&b, n / 3 * 4 + 4);
    if (rc == 0)
        rc = base64_encode(d->s + d->pos, n, &b);
    d->pos += n;
    if (rc) {
        buf_release(&b);
        return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
    }
    item = cJSON_CreateString(b.data ? b.data : "");
    buf_release(&b);
    if (item)
        item->type |= RQ_JSON_BYTES;
    return push(d, E_VALUE, item, 0);
}

/* An int64 as JSON: a number when a double holds it exactly, else its text. */
static cJSON *make_int(int64_t v)
{
    char tmp[32];
    if (v >= -((int64_t)1 << 53) && v <= ((int64_t)1 << 53))
        return cJSON_CreateNumber((double)v);
    snprintf(tmp, sizeof tmp, "%" PRId64, v);
    return cJSON_CreateRaw(tmp);
}

static int read_long1(struct dec *d)
{
    size_t n;
    uint64_t u;
    int rc = need(d, 1);
    if (rc)
        return rc;
    n = d->s[d->pos++];
    if (n > 8)
        return fail(d, CR_EDECODE, "LONG1 wider than 64 bits");
    rc = need(d, n);
    if (rc)
        return rc;
    u = le(d->s + d->pos, (int)n);
    if (n > 0 && n < 8 && (d->s[d->pos + n - 1] & 0x80))
        u |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    d->pos += n;
    return push(d, E_VALUE, make_int((int64_t)u), 0);
}

static int read_float(struct dec *d)
{
    uint64_t u = 0;
    double v;
    int rc = need(d, 8);
    if (rc)
        return rc;
    for (int i = 0; i < 8; i++)
        u = u << 8 | d->s[d->pos + (size_t)i];
    memcpy(&v, &u, sizeof v);
    if (!isfinite(v))
        return fail(d, CR_EDECODE, "float that is NaN or infinite");
    d->pos += 8;
    return push(d, E_VALUE, py_json_float(v), 0);
}

static int memo_put(struct dec *d, size_t idx)
{
    if (d->n == 0 || d->st[d->n - 1].kind == E_MARK)
        return fail(d, CR_EDECODE, "memo store with no value on the stack");
    if (idx >= d->lim->max_memo)
        return cr_err_set(d->err, CR_ETOOBIG,
                          "pickle memo index %zu at offset %zu exceeds %zu entries", idx,
                          d->pos, d->lim->max_memo);
    if (idx >= d->memo_cap) {
        size_t cap = d->memo_cap ? d->memo_cap : 64;
        cJSON **m;
        while (cap <= idx)
            cap *= 2;
        if (cap > d->lim->max_memo)
            cap = d->lim->max_memo;
        m = cr_realloc(d->memo, cap * sizeof *m);
        if (m == NULL)
            return cr_err_set(d->err, CR_ENOMEM, "out of memory decoding pickle");
        memset(m + d->memo_cap, 0, (cap - d->memo_cap) * sizeof *m);
        d->memo = m;
        d->memo_cap = cap;
    }
    if (d->memo[idx])
        return fail(d, CR_EDECODE, "memo store over an index already used");
    d->memo[idx] = d->st[d->n - 1].node;
    d->memo_count++;
    return 0;
}

static int memo_get(struct dec *d, size_t idx)
{
    if (idx >= d->memo_cap || d->memo[idx] == NULL)
        return fail(d, CR_EDECODE, "memo fetch of an empty index");
    return push(d, E_REF, d->memo[idx], 0);
}

static int refuse(struct dec *d, unsigned char op)
{
    const char *name = opname(op);
    if (op == 0x93 && d->n >= 2 && d->st[d->n - 1].kind != E_MARK &&
        d->st[d->n - 2].kind != E_MARK && cJSON_IsString(d->st[d->n - 2].node) &&
        cJSON_IsString(d->st[d->n - 1].node))
        return cr_err_set(d->err, CR_EDECODE,
                          "pickle opcode STACK_GLOBAL (0x93) '%.80s.%.80s' at offset %zu "
                          "refused: only plain data is accepted",
                          d->st[d->n - 2].node->valuestring,
                          d->st[d->n - 1].node->valuestring, d->pos - 1);
    if (strcmp(name, "unknown") == 0)
        return cr_err_set(d->err, CR_EDECODE,
                          "unknown pickle opcode 0x%02x at offset %zu", op, d->pos - 1);
    return cr_err_set(d->err, CR_EDECODE,
                      "pickle opcode %s (0x%02x) at offset %zu refused: only plain data "
                      "is accepted",
                      name, op, d->pos - 1);
}

/* One opcode. Returns 0, 1 at STOP, or an error. */
static int step(struct dec *d)
{
    unsigned char op;
    size_t n;
    long m;
    int rc = need(d, 1);
    if (rc)
        return rc;
    op = d->s[d->pos++];
    switch (op) {
    case 0x80: /* PROTO */
        if (d->pos != 1)
            return fail(d, CR_EDECODE, "PROTO after the first opcode");
        rc = need(d, 1);
        if (rc)
            return rc;
        if (d->s[d->pos] < 2 || d->s[d->pos] > 5)
            return fail(d, CR_EDECODE, "protocol other than 2 to 5");
        d->pos++;
        return 0;
    case 0x95: /* FRAME: only a hint for buffered readers */
        return length(d, 8, &n);
    case 0x2e: /* STOP */
        if (d->n != 1 || d->st[0].kind == E_MARK)
            return fail(d, CR_EDECODE, "STOP without exactly one value on the stack");
        if (d->pos != d->len)
            return fail(d, CR_EDECODE, "trailing bytes after STOP");
        return 1;
    case 0x28:
        return push(d, E_MARK, NULL, 0);
    case 0x4e:
        return push(d, E_VALUE, cJSON_CreateNull(), 0);
    case 0x88:
        return push(d, E_VALUE, cJSON_CreateTrue(), 0);
    case 0x89:
        return push(d, E_VALUE, cJSON_CreateFalse(), 0);
    case 0x4b: /* BININT1 */
    case 0x4d: /* BININT2 */
    case 0x4a: /* BININT */ {
        int w = op == 0x4b ? 1 : op == 0x4d ? 2 : 4;
        int64_t v;
        rc = need(d, (size_t)w);
        if (rc)
            return rc;
        v = (int64_t)le(d->s + d->pos, w);
        if (w == 4)
            v = (int32_t)(uint32_t)v;
        d->pos += (size_t)w;
        return push(d, E_VALUE, cJSON_CreateNumber((double)v), 0);
    }
    case 0x8a:
        return read_long1(d);
    case 0x47:
        return read_float(d);
    case 0x8c:
        return read_str(d, 1);
    case 0x58:
        return read_str(d, 4);
    case 0x8d:
        return read_str(d, 8);
    case 0x43:
        return read_bytes(d, 1);
    case 0x42:
        return read_bytes(d, 4);
    case 0x8e:
    case 0x96:
        return read_bytes(d, 8);
    case 0x29: /* EMPTY_TUPLE */
        return push(d, E_VALUE, cJSON_CreateArray(), 1);
    case 0x85:
    case 0x86:
    case 0x87: {
        size_t k = (size_t)(op - 0x84);
        if (d->n < k)
            return fail(d, CR_EDECODE, "TUPLE with too few values");
        for (size_t i = d->n - k; i < d->n; i++)
            if (d->st[i].kind == E_MARK)
                return fail(d, CR_EDECODE, "TUPLE over a MARK");
        return make_tuple(d, d->n - k);
    }
    case 0x74: /* TUPLE */
        m = find_mark(d);
        if (m < 0)
            return fail(d, CR_EDECODE, "TUPLE without a MARK");
        /* The new tuple takes the MARK's place. */
        rc = make_tuple(d, (size_t)m + 1);
        if (rc)
            return rc;
        d->st[m] = d->st[m + 1];
        d->n--;
        return 0;
    case 0x5d: /* EMPTY_LIST */
    case 0x7d: /* EMPTY_DICT */ {
        cJSON *c = op == 0x5d ? cJSON_CreateArray() : cJSON_CreateObject();
        if (c)
            c->type |= OPEN_BIT;
        return push(d, E_VALUE, c, 1);
    }
    case 0x61: /* APPEND */
        rc = target(d, (long)d->n - 2, 0, op);
        if (rc == 0 && d->st[d->n - 1].kind == E_MARK)
            rc = fail(d, CR_EDECODE, "APPEND of a MARK");
        if (rc == 0)
            rc = fill_array(d, d->n - 1, d->n - 2);
        drop_to(d, d->n - 1);
        return rc;
    case 0x65: /* APPENDS */
        m = find_mark(d);
        if (m < 0)
            return fail(d, CR_EDECODE, "APPENDS without a MARK");
        rc = target(d, m - 1, 0, op);
        if (rc == 0)
            rc = fill_array(d, (size_t)m + 1, (size_t)m - 1);
        drop_to(d, (size_t)m);
        return rc;
    case 0x73: /* SETITEM */
        if (d->n < 3 || d->st[d->n - 1].kind == E_MARK || d->st[d->n - 2].kind == E_MARK)
            return fail(d, CR_EDECODE, "SETITEM without a key and a value");
        rc = target(d, (long)d->n - 3, 1, op);
        if (rc == 0)
            rc = fill_dict(d, d->n - 2, d->n - 3);
        drop_to(d, d->n - 2);
        return rc;
    case 0x75: /* SETITEMS */
        m = find_mark(d);
        if (m < 0)
            return fail(d, CR_EDECODE, "SETITEMS without a MARK");
        rc = target(d, m - 1, 1, op);
        if (rc == 0)
            rc = fill_dict(d, (size_t)m + 1, (size_t)m - 1);
        drop_to(d, (size_t)m);
        return rc;
    case 0x94: /* MEMOIZE */
        return memo_put(d, d->memo_count);
    case 0x71: /* BINPUT */
    case 0x72: /* LONG_BINPUT */
        rc = need(d, op == 0x71 ? 1 : 4);
        if (rc)
            return rc;
        n = (size_t)le(d->s + d->pos, op == 0x71 ? 1 : 4);
        d->pos += op == 0x71 ? 1 : 4;
        return memo_put(d, n);
    case 0x68: /* BINGET */
    case 0x6a: /* LONG_BINGET */
        rc = need(d, op == 0x68 ? 1 : 4);
        if (rc)
            return rc;
        n = (size_t)le(d->s + d->pos, op == 0x68 ? 1 : 4);
        d->pos += op == 0x68 ? 1 : 4;
        return memo_get(d, n);
    default:
        return refuse(d, op);
    }
}

/* Python keeps one entry per key, at the first key's place with the last
 * value. Only pickles not written by Python have duplicates; small dicts are
 * checked pairwise, larger ones through a map. */
static int dedupe(cJSON *obj, struct cr_err *err)
{
    size_t count = 0;
    struct strmap map;
    int rc = 0;
    for (cJSON *c = obj->child; c; c = c->next, count++)
        if ((cJSON_IsArray(c) || cJSON_IsObject(c)) && (rc = dedupe(c, err)) != 0)
            return rc;
    if (!cJSON_IsObject(obj) || count < 2)
        return 0;
    if (count <= 16) {
        for (cJSON *a = obj->child; a; a = a->next) {
            cJSON *b = a->next, *last = NULL;
            while (b) {
                cJSON *next = b->next;
                if (strcmp(a->string, b->string) == 0) {
                    cJSON_DetachItemViaPointer(obj, b);
                    cJSON_Delete(last);
                    last = b;
                }
                b = next;
            }
            if (last) {
                cJSON_ReplaceItemViaPointer(obj, a, last);
                a = last;
            }
        }
        return 0;
    }
    strmap_init(&map);
    for (cJSON *c = obj->child, *next; c && rc == 0; c = next) {
        cJSON *first = strmap_get(&map, c->string);
        next = c->next;
        if (first == NULL) {
            rc = strmap_put(&map, c->string, c);
            continue;
        }
        cJSON_DetachItemViaPointer(obj, c);
        /* The map's copy of the key stays valid: it does not borrow c's. */
        cJSON_ReplaceItemViaPointer(obj, first, c);
        rc = strmap_put(&map, c->string, c);
    }
    strmap_release(&map);
    if (rc)
        return cr_err_set(err, CR_ENOMEM, "out of memory decoding pickle");
    return 0;
}

int rq_pickle_loads(const void *p, size_t len, const struct rq_limits *lim, cJSON **out,
                    struct cr_err *err)
{
    struct dec d;
    int rc;
    memset(&d, 0, sizeof d);
    d.s = p;
    d.len = len;
    d.lim = lim;
    d.err = err;
    *out = NULL;
    d.spare = cJSON_CreateArray();
    if (d.spare == NULL)
        return cr_err_set(err, CR_ENOMEM, "out of memory decoding pickle");
    while ((rc = step(&d)) == 0)
        ;
    if (rc == 1) {
        cJSON *v;
        int depth;
        rc = take(&d, &d.st[0], &v, &depth);
        if (rc == 0) {
            rc = dedupe(v, err);
            if (rc)
                cJSON_Delete(v);
            else
                *out = v;
        }
    }
    drop_to(&d, 0);
    cr_free(d.st);
    cr_free(d.memo);
    cJSON_Delete(d.spare);
    return rc;
}

/* ======================================================================== */
/* JSONSerializer values and the job call                                   */
/* ======================================================================== */

/* Counts the values of a parsed JSON text against the budget and refuses the
 * non-finite numbers Python's json module accepts, and ints a double cannot
 * hold exactly (the text is gone by now; a pickle keeps them exact). */
static int json_check(const cJSON *v, size_t *left, struct cr_err *err)
{
    if (*left == 0)
        return cr_err_set(err, CR_ETOOBIG, "json job data holds too many values");
    (*left)--;
    if (cJSON_IsNumber(v) && !isfinite(v->valuedouble))
        return cr_err_set(err, CR_EDECODE, "json number that is NaN or infinite");
    if (cJSON_IsNumber(v) && !(v->type & PY_JSON_FLOAT) &&
        fabs(v->valuedouble) > 9007199254740992.0)
        return cr_err_set(err, CR_EDECODE,
                          "json int beyond 2**53 (not exact in a double)");
    for (const cJSON *c = v->child; c; c = c->next) {
        int rc = json_check(c, left, err);
        if (rc)
            return rc;
    }
    return 0;
}

int rq_value_loads(const void *p, size_t len, enum rq_serializer ser,
                   const struct rq_limits *lim, cJSON **out, struct cr_err *err)
{
    size_t left = lim->max_values;
    int rc;
    if (ser == RQ_SERIALIZER_PICKLE)
        return rq_pickle_loads(p, len, lim, out, err);
    rc = py_json_parse(p, len, out, err);
    if (rc == 0 && (rc = json_check(*out, &left, err)) != 0) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return rc;
}

void rq_call_release(struct rq_call *call)
{
    if (call == NULL)
        return;
    cr_free(call->func_name);
    cJSON_Delete(call->args);
    cJSON_Delete(call->kwargs);
    memset(call, 0, sizeof *call);
}

int rq_data_decode(const void *data, size_t len, const struct rq_limits *lim,
                   struct rq_call *call, struct cr_err *err)
{
    struct buf b;
    cJSON *v = NULL, *f, *inst, *args, *kw;
    int rc;

    memset(call, 0, sizeof *call);
    buf_init(&b);
    rc = rq_data_inflate(data, len, lim, &b, err);
    if (rc)
        goto out;
    if (b.len > 0 && (unsigned char)b.data[0] == 0x80) {
        call->serializer = RQ_SERIALIZER_PICKLE;
    } else if (b.len > 0 && b.data[0] == '[') {
        call->serializer = RQ_SERIALIZER_JSON;
    } else {
        rc = cr_err_set(err, CR_EDECODE, "job data is neither a pickle nor json");
        goto out;
    }
    rc = rq_value_loads(b.data, b.len, call->serializer, lim, &v, err);
    if (rc)
        goto out;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 4) {
        rc = cr_err_set(err, CR_EDECODE, "job data is not a 4-tuple");
        goto out;
    }
    f = v->child;
    inst = f->next;
    args = inst->next;
    kw = args->next;
    if (!cJSON_IsString(f) || (f->type & RQ_JSON_BYTES)) {
        rc = cr_err_set(err, CR_EDECODE, "job function name is not a str");
        goto out;
    }
    if (!cJSON_IsNull(inst)) {
        rc = cr_err_set(err, CR_EDECODE,
                        "job calls a method of an object (instance is not None)");
        goto out;
    }
    if (!cJSON_IsArray(args) || !cJSON_IsObject(kw)) {
        rc = cr_err_set(err, CR_EDECODE, "job args are not a tuple or kwargs not a dict");
        goto out;
    }
    call->func_name = cr_strdup(f->valuestring);
    if (call->func_name == NULL) {
        rc = cr_err_set(err, CR_ENOMEM, "out of memory decoding job data");
        goto out;
    }
    call->args = cJSON_DetachItemViaPointer(v, args);
    call->kwargs = cJSON_DetachItemViaPointer(v, kw);
out:
    if (rc) {
        enum rq_serializer ser = call->serializer;
        rq_call_release(call);
        call->serializer = ser;
    }
    cJSON_Delete(v);
    buf_release(&b);
    return rc;
}

/* ======================================================================== */
/* Pickle writer                                                            */
/* ======================================================================== */

/* CPython's framing constants (Modules/_pickle.c). */
#define FRAME_TARGET 65536
#define FRAME_MIN 4
#define FRAME_HDR 9

struct enc {
    unsigned char *p;
    size_t len, cap;
    long frame_start; /* offset of the open frame's header, or -1 */
    int framing;
    size_t memo;          /* next MEMOIZE index */
    struct strmap shared; /* str text -> memo index + 1 */
    int oom;
};

static void raw_put(struct enc *e, const void *p, size_t n)
{
    if (e->oom)
        return;
    if (e->cap - e->len < n) {
        size_t cap = e->cap ? e->cap : 256;
        unsigned char *np;
        while (cap - e->len < n)
            cap *= 2;
        np = cr_realloc(e->p, cap);
        if (np == NULL) {
            e->oom = 1;
            return;
        }
        e->p = np;
        e->cap = cap;
    }
    memcpy(e->p + e->len, p, n);
    e->len += n;
}

/* What _Pickler_Write does: a write opens a frame when none is open. */
static void put(struct enc *e, const void *p, size_t n)
{
    if (e->framing && e->frame_start < 0) {
        static const unsigned char zero[FRAME_HDR];
        e->frame_start = (long)e->len;
        raw_put(e, zero, FRAME_HDR);
    }
    raw_put(e, p, n);
}

static void put1(struct enc *e, unsigned char c)
{
    put(e, &c, 1);
}

static void commit_frame(struct enc *e)
{
    size_t flen;
    if (e->frame_start < 0 || e->oom)
        return;
    flen = e->len - (size_t)e->frame_start - FRAME_HDR;
    if (flen >= FRAME_MIN) {
        unsigned char *h = e->p + e->frame_start;
        h[0] = 0x95;
        for (int i = 0; i < 8; i++)
            h[1 + i] = (unsigned char)(flen >> (8 * i));
    } else {
        memmove(e->p + e->frame_start, e->p + e->frame_start + FRAME_HDR, flen);
        e->len -= FRAME_HDR;
    }
    e->frame_start = -1;
}

/* After each whole value: a frame is closed once it reaches 64 KiB. */
static void boundary(struct enc *e)
{
    if (e->frame_start >= 0 && !e->oom &&
        e->len - (size_t)e->frame_start - FRAME_HDR >= FRAME_TARGET)
        commit_frame(e);
}

/* An opcode with its length prefix and payload; payloads of 64 KiB and more
 * are written outside any frame, as CPython writes them. */
static void put_sized(struct enc *e, const unsigned char *hdr, size_t hlen, const void *p,
                      size_t n)
{
    int framing = e->framing;
    if (n >= FRAME_TARGET) {
        commit_frame(e);
        e->framing = 0;
    }
    put(e, hdr, hlen);
    put(e, p, n);
    e->framing = framing;
}

static void memoize(struct enc *e)
{
    put1(e, 0x94);
    e->memo++;
}

static void get(struct enc *e, size_t idx)
{
    unsigned char b[5];
    if (idx < 256) {
        b[0] = 0x68;
        b[1] = (unsigned char)idx;
        put(e, b, 2);
        return;
    }
    b[0] = 0x6a;
    for (int i = 0; i < 4; i++)
        b[1 + i] = (unsigned char)(idx >> (8 * i));
    put(e, b, 5);
}

static void put_int(struct enc *e, int64_t v)
{
    unsigned char b[10];
    if (v >= 0 && v <= 0xff) {
        b[0] = 0x4b;
        b[1] = (unsigned char)v;
        put(e, b, 2);
    } else if (v >= 0 && v <= 0xffff) {
        b[0] = 0x4d;
        b[1] = (unsigned char)v;
        b[2] = (unsigned char)(v >> 8);
        put(e, b, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        uint32_t u = (uint32_t)(int32_t)v;
        b[0] = 0x4a;
        for (int i = 0; i < 4; i++)
            b[1 + i] = (unsigned char)(u >> (8 * i));
        put(e, b, 5);
    } else {
        /* encode_long: (bit_length >> 3) + 1 bytes of two's complement, one
         * less for a negative number whose top byte is only sign. */
        uint64_t u = (uint64_t)v, mag = v < 0 ? (uint64_t)0 - u : u;
        int bits = 0, n;
        while (mag) {
            bits++;
            mag >>= 1;
        }
        n = (bits >> 3) + 1;
        if (n > 8)
            n = 8; /* only -2**63 (0x80 then 0xff, the 0xff dropped) */
        else if (v < 0 && n > 1 && (unsigned char)(u >> (8 * (n - 1))) == 0xff &&
                 ((u >> (8 * (n - 2))) & 0x80))
            n--;
        b[0] = 0x8a;
        b[1] = (unsigned char)n;
        for (int i = 0; i < n; i++)
            b[2 + i] = (unsigned char)(u >> (8 * i));
        put(e, b, (size_t)n + 2);
    }
}

static void put_float(struct enc *e, double v)
{
    unsigned char b[9];
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    b[0] = 0x47;
    for (int i = 0; i < 8; i++)
        b[1 + i] = (unsigned char)(u >> (56 - 8 * i));
    put(e, b, 9);
}

/* Strict decimal int64 text (what rq_pickle_loads() puts in a cJSON_Raw). */
static int parse_i64(const char *s, int64_t *out)
{
    int neg = *s == '-';
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    const char *p = s + neg;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '\0'))
        return -1;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || v > (lim - (uint64_t)(*p - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = neg ? (int64_t)((uint64_t)0 - v) : (int64_t)v;
    return 0;
}

/* CPython shares the empty string and one-character latin-1 strings. */
static int singleton(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    return u[0] == 0 || (u[0] < 0x80 && u[1] == 0) ||
           ((u[0] == 0xc2 || u[0] == 0xc3) && u[1] && u[2] == 0);
}

static void put_str(struct enc *e, const char *s, int shared)
{
    size_t n = strlen(s);
    unsigned char h[9];
    void *hit;
    shared = shared || singleton(s);
    if (shared && (hit = strmap_get(&e->shared, s)) != NULL) {
        get(e, (size_t)(uintptr_t)hit - 1);
        return;
    }
    if (n < 256) {
        h[0] = 0x8c;
        h[1] = (unsigned char)n;
        put_sized(e, h, 2, s, n);
    } else if ((uint64_t)n <= 0xffffffffu) {
        h[0] = 0x58;
        for (int i = 0; i < 4; i++)
            h[1 + i] = (unsigned char)(n >> (8 * i));
        put_sized(e, h, 5, s, n);
    } else {
        h[0] = 0x8d;
        for (int i = 0; i < 8; i++)
            h[1 + i] = (unsigned char)((uint64_t)n >> (8 * i));
        put_sized(e, h, 9, s, n);
    }
    if (shared && strmap_put(&e->shared, s, (void *)(uintptr_t)(e->memo + 1)) != 0)
        e->oom = 1;
    memoize(e);
}

static int put_bytes(struct enc *e, const char *b64)
{
    size_t n = strlen(b64);
    unsigned char *raw = cr_malloc(n / 4 * 3 + 3), h[9];
    long len;
    if (raw == NULL) {
        e->oom = 1;
        return 0;
    }
    len = base64_decode(b64, n, raw, BASE64_STRICT);
    if (len < 0) {
        cr_free(raw);
        return CR_EINVAL;
    }
    if (len < 256) {
        h[0] = 0x43;
        h[1] = (unsigned char)len;
        put_sized(e, h, 2, raw, (size_t)len);
    } else {
        h[0] = 0x42;
        for (int i = 0; i < 4; i++)
            h[1 + i] = (unsigned char)((size_t)len >> (8 * i));
        put_sized(e, h, 5, raw, (size_t)len);
    }
    cr_free(raw);
    memoize(e);
    return 0;
}

#define ENC_MAX_DEPTH 1000
#define BATCH 1000

static int save(struct enc *e, const cJSON *v, int depth)
{
    int rc = 0;
    if (depth > ENC_MAX_DEPTH)
        return CR_EINVAL;
    switch (v->type & 0xff) {
    case cJSON_NULL:
        put1(e, 0x4e);
        break;
    case cJSON_True:
        put1(e, 0x88);
        break;
    case cJSON_False:
        put1(e, 0x89);
        break;
    case cJSON_Number: {
        double d = v->valuedouble;
        if (!(v->type & PY_JSON_FLOAT) && d == floor(d) && d >= -9223372036854775808.0 &&
            d < 9223372036854775808.0)
            put_int(e, (int64_t)d);
        else
            put_float(e, d);
        break;
    }
    case cJSON_Raw: {
        int64_t i;
        if (v->valuestring == NULL || parse_i64(v->valuestring, &i) != 0)
            return CR_EINVAL;
        put_int(e, i);
        break;
    }
    case cJSON_String:
        if (v->type & RQ_JSON_BYTES)
            rc = put_bytes(e, v->valuestring);
        else
            put_str(e, v->valuestring, 0);
        break;
    case cJSON_Array:
    case cJSON_Object: {
        int is_dict = (v->type & 0xff) == cJSON_Object;
        const cJSON *c = v->child;
        put1(e, is_dict ? 0x7d : 0x5d);
        memoize(e);
        if (c && c->next == NULL) {
            if (is_dict) {
                put_str(e, c->string, 1);
                boundary(e);
            }
            rc = save(e, c, depth + 1);
            put1(e, is_dict ? 0x73 : 0x61);
            break;
        }
        while (c && rc == 0) {
            put1(e, 0x28);
            for (int i = 0; c && i < BATCH && rc == 0; i++, c = c->next) {
                if (is_dict) {
                    put_str(e, c->string, 1);
                    boundary(e);
                }
                rc = save(e, c, depth + 1);
            }
            put1(e, is_dict ? 0x75 : 0x65);
        }
        break;
    }
    default:
        return CR_EINVAL;
    }
    boundary(e);
    return rc;
}

int rq_pickle_dumps(const cJSON *v, struct buf *out)
{
    static const unsigned char proto[2] = {0x80, 5};
    struct enc e;
    int rc;
    memset(&e, 0, sizeof e);
    e.frame_start = -1;
    strmap_init(&e.shared);
    raw_put(&e, proto, 2);
    e.framing = 1;
    rc = save(&e, v, 0);
    put1(&e, 0x2e);
    commit_frame(&e);
    if (rc == 0 && e.oom)
        rc = CR_ENOMEM;
    if (rc == 0)
        rc = buf_append(out, e.p, e.len);
    strmap_release(&e.shared);
    cr_free(e.p);
    return rc;
}

int rq_value_dumps(const cJSON *v, enum rq_serializer ser, struct buf *out)
{
    struct buf tmp;
    int rc;
    if (ser == RQ_SERIALIZER_PICKLE)
        return rq_pickle_dumps(v, out);
    buf_init(&tmp);
    rc = py_json_dumps(v, &tmp);
    if (rc == 0)
        rc = buf_append(out, tmp.data, tmp.len);
    buf_release(&tmp);
    return rc;
}

int rq_value_dumps_b64(const cJSON *v, enum rq_serializer ser, struct buf *out)
{
    struct buf tmp;
    size_t len = out->len;
    int rc;
    buf_init(&tmp);
    rc = rq_value_dumps(v, ser, &tmp);
    if (rc == 0)
        rc = base64_encode(tmp.data, tmp.len, out);
    buf_release(&tmp);
    if (rc && out->data) {
        out->len = len; /* NEEDSWORK: buf has no truncate; restore by hand */
        out->data[len] = '\0';
    }
    return rc;
}
