/* rq_job.h -- RQ's job hash and worker fields as RQ 1.13 reads and writes them:
 * key names, the timestamp text, the job fields a worker needs, the heartbeat
 * and retry rules, and the traceback text of a failure. Pure: no I/O, no
 * clock (every time is an argument), no globals. See rq-protocol.md
 * sections 1, 3, 5, 7 and 8. */
#ifndef CR_RQ_JOB_H
#define CR_RQ_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "../util/buf.h"
#include "../util/err.h"

/* RQ's defaults (rq-protocol.md sections 3 and 7.3). */
#define RQ_DEFAULT_TIMEOUT_S 180          /* Queue.DEFAULT_TIMEOUT */
#define RQ_DEFAULT_RESULT_TTL_S 500       /* --results-ttl */
#define RQ_DEFAULT_FAILURE_TTL_S 31536000 /* one year */
#define RQ_WORKER_TTL_S 420               /* --worker-ttl */
#define RQ_MONITORING_INTERVAL_S 30       /* --job-monitoring-interval */

/* The longest id accepted; a longer one is refused, never cut. */
#define RQ_MAX_ID 180
/* The longest queue or worker name. */
#define RQ_MAX_NAME 180
/* The longest name a key is built from: an id, a name, or "<id>:<eid>". */
#define RQ_KEY_MAX_NAME 224
/* Room for any key built here: the longest prefix and suffix ("rq:job::"
 * and ":dependencies") around RQ_KEY_MAX_NAME bytes. */
#define RQ_KEY_SIZE 256
/* "2026-12-07T08:24:38.040468Z" and its NUL. */
#define RQ_TS_SIZE 28

enum rq_key_kind {
    RQ_KEY_QUEUE,        /* rq:queue:<q> */
    RQ_KEY_JOB,          /* rq:job:<id> */
    RQ_KEY_DEPENDENTS,   /* rq:job:<id>:dependents */
    RQ_KEY_DEPENDENCIES, /* rq:job::<id>:dependencies (two colons, as RQ spells it) */
    RQ_KEY_RESULTS,      /* rq:results:<id> */
    RQ_KEY_STARTED,      /* rq:wip:<q> */
    RQ_KEY_FINISHED,     /* rq:finished:<q> */
    RQ_KEY_FAILED,       /* rq:failed:<q> */
    RQ_KEY_DEFERRED,     /* rq:deferred:<q> */
    RQ_KEY_SCHEDULED,    /* rq:scheduled:<q> */
    RQ_KEY_WORKER,       /* rq:worker:<w> */
    RQ_KEY_WORKERS_OF,   /* rq:workers:<q> */
    RQ_KEY_PUBSUB,       /* rq:pubsub:<w> */
    RQ_KEY_SCHED_LOCK,   /* rq:scheduler-lock:<q> */
    RQ_KEY_EXECUTION,    /* rq:execution:<id>:<eid> (2.x; name = "<id>:<eid>") */
    RQ_KEY_EXECUTIONS,   /* rq:executions:<id> (2.x) */
};

/* The sets and strings with fixed names. */
#define RQ_QUEUES_KEY "rq:queues"
#define RQ_WORKERS_KEY "rq:workers"
#define RQ_SUSPENDED_KEY "rq:suspended"

/* Writes the key of kind for name (a job id, queue or worker name) into out
 * (RQ_KEY_SIZE bytes). Returns 0, or CR_EINVAL when name is empty or longer
 * than RQ_KEY_MAX_NAME (out is then ""). */
int rq_key(char out[RQ_KEY_SIZE], enum rq_key_kind kind, const char *name);

/* Writes RQ's timestamp text of epoch_us (UTC, six fraction digits, "Z"). */
void rq_ts_format(char out[RQ_TS_SIZE], int64_t epoch_us);

/* The retry intervals a job may carry; more are refused as malformed. */
#define RQ_MAX_INTERVALS 64

/* The fields of a job hash a worker acts on. Filled by rq_job_parse(); the
 * strings point into the reply it was given (borrowed until that is freed)
 * and are not NUL-terminated: each has its length. */
struct rq_job {
    const char *data;
    size_t data_len;
    const char *origin; /* "" when absent */
    size_t origin_len;
    const char *status;
    size_t status_len;
    const char *meta; /* serializer.dumps(dict), NULL when absent or "" */
    size_t meta_len;
    long timeout_s;     /* RQ_DEFAULT_TIMEOUT_S when absent; -1: none */
    long result_ttl_s;  /* -2 when absent: the worker's default */
    long failure_ttl_s; /* -2 when absent: RQ_DEFAULT_FAILURE_TTL_S, and the result
                         * stream keeps no TTL (as RQ leaves it) */
    long retries_left;  /* 0 when absent */
    int nintervals;
    long intervals[RQ_MAX_INTERVALS]; /* retry_intervals, seconds */
    /* Names of Python callables RQ would import and call after the job;
     * non-empty means the job asks for code celeriac will not run. */
    const char *callback; /* the first non-empty one, or NULL */
    const char *callback_field;
    size_t callback_len;
};

/* Reads an HGETALL reply given as n strings (field, value, field, value...;
 * field[i] of len[i] bytes). Returns 0, or CR_EDECODE with a one-line reason
 * when n is odd, `data` is missing, or a number or the intervals list is
 * malformed. Unknown fields are ignored, as RQ's readers ignore them. */
int rq_job_parse(struct rq_job *j, const char *const *field, const size_t *len, size_t n,
                 struct cr_err *err);

/* The started-registry score a heartbeat sets, as RQ computes it:
 * now + min(timeout - elapsed, interval) + 60 when the job has a timeout,
 * else now + interval + 60. Seconds. */
int64_t rq_heartbeat_ttl(long timeout_s, int64_t elapsed_s, long interval_s);

/* The wait before the next attempt of a job with retries_left > 0, as RQ 1.13
 * picks it: intervals[max(n - retries_left, 0)] (the first value repeats while
 * more retries are left than intervals); 0 when there are no intervals. */
long rq_retry_interval(const struct rq_job *j);

/* A registry score for an expiry ttl_s after now_s: -1 keeps forever, given
 * as "+inf" for the finished registry (inf_for_forever) and as "-1" for the
 * failed one, as RQ writes them. Writes decimal text into out (32 bytes). */
void rq_expiry_score(char out[32], int64_t now_s, long ttl_s, int inf_for_forever);

/* Appends a traceback text as Python's traceback.format_exception() ends
 * one: a header, one frame naming the function, then "<exc_type>: <message>\n"
 * (message on one line: CR and LF become spaces), so that RQ's readers and
 * tools that take the last line see the class and the message. */
int rq_exc_text(struct buf *out, const char *func, const char *exc_type,
                const char *message);

/* Appends base64(zlib(text)), the form of a results stream's exc_string.
 * Returns 0 or CR_ENOMEM. */
int rq_exc_string(struct buf *out, const char *text, size_t len);

/* A command published on rq:pubsub:<worker> (rq/command.py). */
enum rq_command_kind {
    RQ_CMD_SHUTDOWN,   /* {"command": "shutdown"}: warm shutdown */
    RQ_CMD_KILL_HORSE, /* {"command": "kill-horse"}: end the running job as killed */
    RQ_CMD_STOP_JOB,   /* {"command": "stop-job", "job_id": ID}: stop that job */
};

struct rq_command {
    enum rq_command_kind kind;
    char job_id[RQ_MAX_ID + 1]; /* RQ_CMD_STOP_JOB */
};

/* Reads a command message of n bytes. Returns 0, or CR_EDECODE with a
 * one-line reason: not a JSON object, no "command" string, an unknown
 * command, or stop-job without a job_id string of 1..RQ_MAX_ID bytes. */
int rq_command_parse(const char *p, size_t n, struct rq_command *out, struct cr_err *err);

#endif
