/* amqp_json.h -- AMQP 0-9-1 field tables (rabbitmq-c structs) to and from JSON.
 * Pure: no I/O.
 *
 * Every type py-amqp writes or reads is handled: S s t b B U u I i L l f d D T V
 * F A x. Decimals become numbers, timestamps (T) become numbers of seconds,
 * byte arrays (x) become strings, void (V) becomes null. */
#ifndef CR_AMQP_JSON_H
#define CR_AMQP_JSON_H

#include <amqp.h>
#include <cjson/cJSON.h>

#include "../util/err.h"

/* Converts a table to a new JSON object in *out. Returns 0, CR_EDECODE (bad
 * entry: unknown kind, nesting deeper than 64) or CR_ENOMEM. */
int amqp_json_from_table(const amqp_table_t *t, cJSON **out, struct cr_err *err);

/* Builds a table from a JSON object. Every allocation comes from pool, so the
 * table lives as long as the pool. Strings become S, true/false t, integral
 * numbers I or L (beyond 32 bits), other numbers d, null V, objects F, arrays A.
 * Returns 0, CR_EINVAL (not an object) or CR_ENOMEM. */
int amqp_json_to_table(const cJSON *obj, amqp_pool_t *pool, amqp_table_t *out,
                       struct cr_err *err);

#endif
