/* rq_state.h -- an RQ job's state told as a Celery result meta, so that a
 * reader of Celery's metas (the gateway's GET /v1/tasks/<id> and its
 * WebSocket "state" messages) reports RQ jobs with the same words. Pure: no
 * I/O, no clock (the time is an argument), no globals. See rq-protocol.md
 * sections 3 and 5 for what is read: the job hash's status, ended_at and
 * exc_info, and the newest entry of the result stream rq:results:<id>
 * (the same in RQ 1.13's layout and in 2.x's, which only adds fields). */
#ifndef CR_RQ_STATE_H
#define CR_RQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "rq_data.h"

/* The Celery state of an RQ status of len bytes, matched exactly:
 *   queued, deferred, scheduled, created (2.x)  PENDING
 *   started                                     STARTED
 *   finished                                    SUCCESS
 *   failed                                      FAILURE
 *   stopped, canceled                           REVOKED
 * NULL for anything else (RQ has no other status; 2.x refuses to read one). */
const char *rq_status_state(const char *status, size_t len);

/* The exception a traceback text ends with: after the last "Traceback (most
 * recent call last):" header and its indented frames, "<type>: <message>",
 * where type is a dotted Python name; the module is the part before its last
 * dot. Text that does not read so (RQ's "Job stopped by user...", a cleanup's
 * "Moved to FailedJobRegistry...") is all message, with type "Exception" and
 * no module, as the RQ worker's progress stream names it. Every pointer
 * points into the text (or a static string) and is not NUL-terminated. */
struct rq_exc {
    const char *type;
    size_t type_len;
    const char *module; /* NULL when none */
    size_t module_len;
    const char *message;
    size_t message_len; /* the rest of the text, trailing newlines cut */
};

void rq_exc_parse(const char *text, size_t len, struct rq_exc *out);

/* What a reader took from Redis for one job; every pointer borrowed for the
 * call, NULL (length 0) when absent. */
struct rq_state_in {
    const char *task_id; /* required */
    const char *status;  /* the job hash's status */
    size_t status_len;
    const char *ended_at; /* its ended_at, RQ's timestamp text */
    size_t ended_at_len;
    const char *exc_info; /* its exc_info: zlib(traceback), 1.13's cleanup writes it */
    size_t exc_info_len;
    const char *type; /* the newest result entry's type: "1" success, "2" failure */
    size_t type_len;
    const char *value; /* its return_value or exc_string (base64) */
    size_t value_len;
};

/* Builds the meta Celery would have stored for the job, in *out (a new
 * string, cr_free(); *len its length):
 *   status     rq_status_state()
 *   result     SUCCESS: the newest entry's return_value decoded within lim
 *              (pickle when it starts with PROTO, else JSON), null when it is
 *              None, not plain data, over a limit, or the entry is not a
 *              success; FAILURE and REVOKED: {"exc_type", "exc_message":
 *              [message][, "exc_module"]} from rq_exc_parse() of the
 *              traceback, null when there is none; others null
 *   traceback  FAILURE and REVOKED: the newest failure entry's exc_string,
 *              else the hash's exc_info, inflated within lim; else null
 *   date_done  ended_at in the ready states (as Celery writes it: "+00:00"),
 *              else null
 * An absent or unknown status gives 0 with *out NULL: as far as a reader of
 * metas can tell, there is no such task. Returns 0 or CR_ENOMEM. */
int rq_state_meta(const struct rq_state_in *in, const struct rq_limits *lim, char **out,
                  size_t *len);

/* How long after ended_at a job's progress stream may still lack its end:
 * the RQ worker writes it just after the job's end when a progress write was
 * in flight at the end, moments later; a worker that died in between never
 * does, and then the job's status wins after this. */
#define RQ_STATE_HOLD_MS 10000

/* Whether a progress reader should still be told STARTED for a job that
 * ended (finished, failed, stopped) so that it reads the stream's last text
 * before the result: the stream's newest entry has state stream_state
 * (stream_len bytes; NULL when the stream is absent or empty) that is not an
 * end (SUCCESS, FAILURE, REVOKED), and ended_at (parsed as UTC) is less than
 * RQ_STATE_HOLD_MS before now_us (or after it: the worker's clock may be
 * ahead). A malformed ended_at never holds. 1 or 0. */
int rq_state_hold(const struct rq_state_in *in, const char *stream_state,
                  size_t stream_len, int64_t now_us);

#endif
