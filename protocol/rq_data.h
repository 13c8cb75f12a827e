/* rq_data.h -- RQ's job `data` field and its result/meta values, as plain data:
 * zlib with hard caps, a restricted pickle reader that never runs code, the
 * JSONSerializer form, and a writer of pickle bytes as CPython 3.11 writes them.
 * Pure: no I/O, no clock, no globals. See rq-protocol.md sections 4 and 5.2.
 *
 * Values are cJSON trees. Numbers written as floats carry PY_JSON_FLOAT
 * (protocol/pyjson.h); an int outside +-2**53, which a double cannot hold
 * exactly, is a cJSON_Raw item holding its decimal text; bytes are a string
 * item holding their standard base64, flagged with RQ_JSON_BYTES. Tuples and
 * lists both become arrays; dict keys that were ints become their decimal text. */
#ifndef CR_RQ_DATA_H
#define CR_RQ_DATA_H

#include <stddef.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

/* Set in item->type on a string that was a Python bytes value (its text is the
 * base64 of the bytes). cJSON keeps the bit as PY_JSON_FLOAT is kept. */
#define RQ_JSON_BYTES 0x2000

/* The serializer a job was written with; results and meta go back in the same. */
enum rq_serializer {
    RQ_SERIALIZER_PICKLE = 0, /* rq.serializers.DefaultSerializer */
    RQ_SERIALIZER_JSON = 1,   /* rq.serializers.JSONSerializer */
};

/* "pickle" or "json". */
const char *rq_serializer_name(enum rq_serializer s);

/* Every limit is checked before the memory it guards is allocated. */
struct rq_limits {
    size_t max_data_bytes;     /* the stored (compressed) value */
    size_t max_inflated_bytes; /* after inflating */
    size_t max_ratio;          /* inflated <= max_ratio * compressed */
    size_t max_values;         /* expansion budget, see rq_pickle_loads() */
    size_t max_memo;           /* memo entries (highest index + 1) */
    int max_depth;             /* nested containers; a scalar is 0, [] is 1 */
};

/* Fills the limits of rq-protocol.md 4.4: 16 MiB, 64 MiB, 1000x, 10**6 values,
 * 2**20 memo entries, depth 64. */
void rq_limits_init(struct rq_limits *lim);

/* Appends to out the bytes RQ reads from a stored value: zlib-inflated, or the
 * value itself when it is not zlib (RQ falls back to the raw bytes on any
 * zlib.error; trailing bytes after a complete stream are ignored, as
 * zlib.decompress() ignores them). Returns 0, or CR_ETOOBIG (detail in err)
 * when len or the inflated size passes a limit (found while inflating, never by
 * allocating first), or CR_ENOMEM; out then holds a partial result. */
int rq_data_inflate(const void *data, size_t len, const struct rq_limits *lim,
                    struct buf *out, struct cr_err *err);

/* Reads one pickle of len bytes into a new tree in *out (free with
 * cJSON_Delete()), accepting plain data only (the table of rq-protocol.md 4.4):
 * anything that would import or call Python (GLOBAL, STACK_GLOBAL, REDUCE,
 * BUILD, NEWOBJ...), sets, old text opcodes and unknown bytes are refused,
 * never skipped, with a one-line reason naming the opcode (for STACK_GLOBAL
 * also "module.name"). Memo references are shared read-only: a container
 * reached through a GET cannot be appended to, and one that is still being
 * filled cannot be placed into anything (that would be a cycle). Each value
 * costs one unit of max_values, a MARK too, and a GET costs the size of the
 * whole subtree it copies. Strings must be strict UTF-8 without NUL; floats
 * finite; dict keys str or int. Duplicate keys: the last value wins at the
 * first key's place, as in Python. Returns 0, CR_EDECODE (malformed or
 * refused), CR_ETOOBIG (a limit) or CR_ENOMEM, with the reason in err; *out is
 * NULL on error. */
int rq_pickle_loads(const void *p, size_t len, const struct rq_limits *lim, cJSON **out,
                    struct cr_err *err);

/* A result, meta or exc value in the given serializer (not compressed):
 * rq_pickle_loads(), or Python-flavoured JSON (py_json_parse(); non-finite
 * numbers, ints beyond +-2**53 and more than max_values values refused). Same
 * returns. */
int rq_value_loads(const void *p, size_t len, enum rq_serializer ser,
                   const struct rq_limits *lim, cJSON **out, struct cr_err *err);

/* A decoded job call. Embedded by the caller; release with rq_call_release(). */
struct rq_call {
    char *func_name;               /* new, "tasks.llm_inference" */
    cJSON *args;                   /* new array */
    cJSON *kwargs;                 /* new object */
    enum rq_serializer serializer; /* what `data` was written with */
};

/* Decodes a job's stored `data`: inflate, then a pickle (first byte 0x80) or
 * JSON (first byte '['), which must be (str func_name, None, tuple|list args,
 * dict kwargs). Returns 0 with call filled, or an error as above (CR_EDECODE
 * also for the wrong shape or another first byte); call is then zeroed. */
int rq_data_decode(const void *data, size_t len, const struct rq_limits *lim,
                   struct rq_call *call, struct cr_err *err);

/* Frees what call holds and zeroes it. NULL-safe. */
void rq_call_release(struct rq_call *call);

/* Appends pickle.dumps(v, protocol=5) as CPython 3.11 writes it for the value
 * Python gets from json.loads() of v's JSON: PROTO 5, 64 KiB FRAMEs (strings of
 * 64 KiB or more outside them), MEMOIZE after each str, bytes, list and dict,
 * APPENDS/SETITEMS batches of 1000, the smallest int opcode, BINFLOAT. Repeated
 * dict keys, the empty string and one-character latin-1 strings are written
 * once and then fetched with BINGET, because json.loads() and CPython share
 * those objects and the pickler memoizes by identity. Arrays become lists.
 * Returns 0, CR_EINVAL (a cJSON_Raw that is not an int64, or nesting deeper
 * than 1000) or CR_ENOMEM; out is unchanged on error. */
int rq_pickle_dumps(const cJSON *v, struct buf *out);

/* Appends v in the serializer: rq_pickle_dumps(), or py_json_dumps() (Python's
 * json.dumps() defaults; bytes are written as their base64 text). */
int rq_value_dumps(const cJSON *v, enum rq_serializer ser, struct buf *out);

/* Appends the standard, padded base64 of rq_value_dumps(), the form of a
 * result stream's return_value (rq-protocol.md 5.1). Same returns. */
int rq_value_dumps_b64(const cJSON *v, enum rq_serializer ser, struct buf *out);

#endif
