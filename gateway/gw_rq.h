/* gw_rq.h -- an RQ job's state for the gateway, read when a task id has no
 * Celery meta: `celeriac rq worker` (and RQ's own workers) keep a job's
 * state in the job hash rq:job:<id> and its result in the stream
 * rq:results:<id>, never in celery-task-meta-<id>. The answer is told as the
 * meta Celery would have stored (protocol/rq_state.h), so the gateway's
 * GET /v1/tasks/<id> and its WebSocket "state" and "result" messages need
 * nothing else.
 *
 * Cost: one HMGET (status, ended_at, exc_info); only for a job that has
 * ended, one XREVRANGE ... COUNT 1 of its result stream more, and for a
 * watch one of its progress stream (see rq_state_hold()). Commands go through
 * the backend (net/backend.h), so the loop never waits on them. Loop thread
 * only. */
#ifndef CR_GW_RQ_H
#define CR_GW_RQ_H

#include <stddef.h>

struct backend;

/* The answer: status 0 with meta (borrowed for the call) the meta JSON of
 * len bytes, or NULL when there is no such RQ job either; CR_ENOMEM when
 * the reads or the meta could not be made; CR_ECANCELED when the backend
 * was freed. */
typedef void gw_rq_fn(int status, const char *meta, size_t len, void *privdata);

/* Reads the RQ job task_id (copied) in bk's database. watch: the reader
 * follows the job's progress stream, and a job whose stream lacks its end
 * yet is told as STARTED for a while (rq_state_hold()). cb is called exactly
 * once, never from inside this call. Returns 0, CR_EINVAL for an id longer
 * than GW_TASK_ID_MAX, or CR_ENOMEM (cb never called then). */
int gw_rq_read(struct backend *bk, const char *task_id, int watch, gw_rq_fn *cb,
               void *privdata);

#endif
