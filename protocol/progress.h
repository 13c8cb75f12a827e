/* progress.h -- the progress stream's wire format, shared by its writer
 * (worker/progress.c) and its readers (the gateway, any Redis client). Pure:
 * names and encodings only, no I/O.
 *
 *   stream key   "celeriac:progress:<task_id>" (PROGRESS_KEY_PREFIX), expiring
 *                with the result (result_expires) and trimmed to about
 *                PROGRESS_STREAM_MAXLEN entries.
 *   entry id     "0-<seq>": seq counts 1, 2, 3... over the whole life of the
 *                task id, across attempts and workers, so XRANGE "(0-<seq>" "+"
 *                resumes exactly after a given entry (progress_range_after()).
 *   fields       seq, attempt, state, text, tokens, run, n [, error] [, result]
 *     state    STARTED (opens an attempt, text ""; written together with the
 *              attempt's first text, or with its end if it had none),
 *              PROGRESS (new text), or the end of an attempt: SUCCESS,
 *              FAILURE, RETRY, REVOKED.
 *     attempt  1 for the first run; every new run of the task id (a retry,
 *              or a redelivery after a crash) gets a higher number, so text of
 *              one attempt is never mixed with the next.
 *     text     text produced since the previous entry of the same attempt.
 *     tokens   deltas (or, at the end, completion tokens) so far this attempt.
 *     run, n   writer identity and its entry counter: they make a command sent
 *              again after a Redis reconnect a no-op instead of a duplicate.
 *     error    "ExcType: message" on FAILURE, RETRY and REVOKED entries.
 *     result   the JSON result on SUCCESS when the task ignores results (no
 *              meta will be stored, so the stream is the only place for it).
 *   channel      after each write (one or more entries), PUBLISH
 *                "celeriac:progress:<task_id>" <seq of the last one>.
 *   meta         {"status": "PROGRESS", "result": {"text": <all text so far>,
 *                "tokens": N}, ...} stored like Celery's update_state(), at most
 *                every PROGRESS_META_MIN_MS (worker/progress.h), never over
 *                SUCCESS/FAILURE/REVOKED.
 * The gateway's reader of the fields is gw_entry_parse() (gateway/gw_msg.h). */
#ifndef CR_PROTOCOL_PROGRESS_H
#define CR_PROTOCOL_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

#define PROGRESS_KEY_PREFIX "celeriac:progress:"
#define PROGRESS_STREAM_MAXLEN 10000

/* Appends the stream key (also the channel name) of task_id to out. Returns
 * 0, or CR_ENOMEM (out unchanged in length). */
int progress_key(struct buf *out, const char *task_id);

/* Writes the exclusive XRANGE start that resumes after entry seq, "(0-<seq>",
 * into out (size bytes). Returns 0, or CR_ERANGE when it does not fit. */
int progress_range_after(char *out, size_t size, int64_t seq);

#endif
