/* result.h -- Celery result-backend metas (the JSON stored per task id). Pure.
 * Includes pyjson.h, which used to be part of this header. */
#ifndef CR_RESULT_H
#define CR_RESULT_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"
#include "pyjson.h"

/* Fields of one stored state. Every pointer is borrowed for the call. */
struct result_meta {
    const char *task_id;   /* required */
    const char *status;    /* "SUCCESS", "FAILURE", "RETRY", "STARTED", ... */
    const cJSON *result;   /* NULL writes null */
    const char *traceback; /* NULL writes null */
    int64_t date_done_us;  /* < 0 writes null */
    const cJSON *children; /* NULL writes [] */
    const char *group_id;  /* written only when non-NULL */
    const char *parent_id; /* written only when non-NULL */
    /* result_extended */
    int extended;
    const char *name;
    const cJSON *args;
    const cJSON *kwargs;
    const char *worker;
    int retries;
    const char *queue;
    /* Celery 5.3+: the message's stamped_headers (any JSON) and stamps (an
     * object), written after queue when stamps is a non-empty object: then
     * stamped_headers, and each stamp as a key of its own (a stamp named as
     * one of the keys above is left out: Celery would overwrite that key). */
    const cJSON *stamped_headers;
    const cJSON *stamps;
};

/* Returns a new JSON text (cr_free) with the keys Celery writes, in Celery's
 * order (status, result, traceback, children, date_done, [group_id, parent_id,]
 * [name, args, kwargs, worker, retries, queue, [stamped_headers, stamps...]]
 * task_id), or NULL on OOM. */
char *result_meta_encode(const struct result_meta *m);

/* Returns a new exception object {"exc_type", "exc_message": [message],
 * "exc_module"} (message NULL gives an empty list), or NULL on OOM. */
cJSON *result_exc_new(const char *exc_type, const char *exc_module, const char *message);

/* Appends the Python-looking traceback celeriac stores with a FAILURE or RETRY
 * and sends in task-failed events, so that tools which print it show
 * something familiar; the one frame names the task, not Python code:
 *   Traceback (most recent call last):\n
 *     File "celeriac", in <task>\n
 *   <exc_module>.<exc_type>: <message>\n
 * "<exc_module>." is left out when exc_module is NULL, "" or "builtins" (as
 * Python prints builtin exceptions). NULL reads as "unknown" for task,
 * "Exception" for exc_type and "" for message. Returns 0 or CR_ENOMEM (out may
 * then hold part of the text). */
int result_traceback(struct buf *out, const char *task, const char *exc_module,
                     const char *exc_type, const char *message);

/* Reads the "status" of a stored meta JSON into status (NUL-terminated, cut at
 * size; size 0 copies nothing). Returns 0, CR_EDECODE when it is not a meta
 * object (not strict JSON, not an object, no string "status"), or CR_ENOMEM. */
int result_meta_status(const char *json, size_t len, char *status, size_t size);

#endif
