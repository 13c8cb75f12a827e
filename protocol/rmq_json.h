/* rmq_json.h -- AMQP 0-9-1 field tables (rabbitmq-c structs) to and from JSON.
 * Pure: no I/O.
 *
 * Every type py-amqp writes or reads is handled: S s t b B U u I i L l f d D T V
 * F A x. Decimals become numbers, timestamps (T) become numbers of seconds,
 * byte arrays (x) become strings, void (V) becomes null.
 *
 * Details (rabbitmq-c kind letters; rabbitmq-c cannot decode 'U' at all):
 * - 'L' (AMQP_FIELD_KIND_U64) is read as a *signed* 64-bit value, because
 *   py-amqp writes every int beyond 32 bits as a signed 'L'. Negative ints from
 *   Python therefore survive; an unsigned value above 2^63-1 does not.
 * - 64-bit ints and timestamps become cJSON doubles: exact up to 2^53 only.
 * - Decimals are signed (as py-amqp writes them): value / 10^decimals.
 * - 'f', 'd', and decimals with decimals > 0 get PY_JSON_FLOAT (pyjson.h), so a
 *   Python float header stays a float when written back.
 * - 'S' and 'x' bytes that are not valid UTF-8, and NUL bytes (cJSON strings
 *   cannot hold them), are replaced by U+FFFD. Keys get the same treatment.
 * - A repeated key keeps its first position and its last value (a Python dict). */
#ifndef CR_RMQ_JSON_H
#define CR_RMQ_JSON_H

#include <amqp.h>
#include <cjson/cJSON.h>

#include "../util/err.h"

/* Converts a table (NULL = empty) to a new JSON object in *out. Returns 0,
 * CR_EDECODE (bad entry: unknown kind, nesting deeper than 64; the top-level
 * table counts as 1) or CR_ENOMEM; *out is NULL on error. */
int rmq_json_from_table(const amqp_table_t *t, cJSON **out, struct cr_err *err);

/* As rmq_json_from_table(), but an entry of the top-level table that cannot
 * be converted is left out rather than failing the whole table, so a message
 * with one bad header keeps the others (id, task...). Returns 0; CR_EDECODE
 * with *out holding every other entry and err naming the first bad key (and
 * how many more there were); or CR_ENOMEM with *out NULL. The caller frees a
 * non-NULL *out in every case. A bad value nested inside an entry drops that
 * whole entry. */
int rmq_json_from_table_partial(const amqp_table_t *t, cJSON **out, struct cr_err *err);

/* Builds a table from a JSON object. Every allocation comes from pool, so the
 * table lives as long as the pool. Strings become S, true/false t, integral
 * numbers I (within +-2147483647, as py-amqp) or L (beyond, signed 64-bit bits in
 * value.u64), numbers with PY_JSON_FLOAT, non-integral or beyond 64 bits d, null V,
 * objects F, arrays A. Returns 0, CR_EINVAL (not an object, nesting deeper than
 * 64, a key longer than 255 bytes) or CR_ENOMEM. On error *out may be partly
 * filled; it is still released with the pool. */
int rmq_json_to_table(const cJSON *obj, amqp_pool_t *pool, amqp_table_t *out,
                      struct cr_err *err);

#endif
