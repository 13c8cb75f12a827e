/* backend.h -- Celery's Redis result backend on the worker loop (hiredis async).
 *
 * Writes results exactly as Celery's RedisBackend does: the meta JSON under
 * "celery-task-meta-<id>" with SETEX (result_expires) and a PUBLISH of the same
 * bytes on the channel of the same name. What is stored wins over a late
 * write that must not replace it (see backend_store()).
 * While Redis is unreachable, operations wait and are sent again after the
 * reconnect: a caller's callback only ever sees success, or CR_ECANCELED when
 * the backend is freed. Not thread-safe: loop thread only. */
#ifndef CR_BACKEND_H
#define CR_BACKEND_H

#include <stddef.h>
#include <uv.h>

#include "util/err.h"

struct backend_config {
    const char *url;    /* redis://[[user]:password@]host[:port][/db] */
    int result_expires; /* seconds; 0 stores without TTL */
    /* Seconds a sent command may go unanswered, with nothing else heard from
     * Redis meanwhile, before the connection counts as lost (dropped, rebuilt,
     * its unanswered operations sent again); 0: wait for ever. */
    double timeout;
    /* Seconds without traffic after which an idle connection is tested with a
     * PING (that timeout applies to it); 0: never. */
    double health_check_interval;
    /* Celery's result_backend_transport_options as JSON (see
     * backend_options_parse()); NULL or "": none. Its socket_timeout and
     * health_check_interval win over the two fields above. */
    const char *transport_options;
};

#define BACKEND_OPTIONS_MAX_BYTES 8192
#define BACKEND_KEYPREFIX_MAX 255

/* Celery's result_backend_transport_options that the worker understands. */
struct backend_options {
    char master_name[256];       /* sentinel:// (required there) */
    char sentinel_user[256];     /* sentinel_kwargs.username */
    char sentinel_password[512]; /* sentinel_kwargs.password */
    /* Celery 5.3+: before every result key, chord key and channel (with '_'
     * added unless it ends in one of ":_-."). */
    char global_keyprefix[BACKEND_KEYPREFIX_MAX + 1];
    double socket_timeout;         /* seconds; -1 when not given */
    double socket_connect_timeout; /* seconds; -1 when not given */
    double health_check_interval;  /* seconds; -1 when not given */
};

/* Parses the JSON object of transport options: master_name, sentinel_kwargs
 * (username, password; socket_timeout and socket_connect_timeout accepted and
 * ignored), global_keyprefix, socket_timeout, socket_connect_timeout,
 * health_check_interval (seconds or null), retry_policy (an object, accepted
 * and ignored: stores wait for the reconnect and go again without a limit).
 * NULL or "" gives the defaults. Returns 0, or CR_EINVAL with detail in err
 * for malformed JSON, a wrong type, or an unknown key. Pure. */
int backend_options_parse(struct backend_options *o, const char *json,
                          struct cr_err *err);

struct backend;

/* status 0: stored, or kept out (skipped 1) by what was stored already (see
 * backend_store()); CR_ECANCELED on backend_free(). */
typedef void backend_store_fn(struct backend *bk, int status, int skipped,
                              void *privdata);
/* value is the stored meta (borrowed for the call) or NULL when the key does not
 * exist; status 0, or CR_ECANCELED on backend_free(). */
typedef void backend_get_fn(struct backend *bk, int status, const char *value, size_t len,
                            void *privdata);

/* Returns a new backend that starts connecting at once, or NULL with err set
 * (bad URL, OOM). cfg strings are copied. */
struct backend *backend_new(uv_loop_t *loop, const struct backend_config *cfg,
                            struct cr_err *err);

/* Runs the loop until connected or timeout_ms passes. For start-up only.
 * Connected means Redis has answered the AUTH, SELECT (or PING) that open
 * every connection; when it refuses them (WRONGPASS, NOAUTH, a bad database)
 * this returns at once, since retrying the same credentials will not help.
 * Returns 0 or CR_EBACKEND with the last connection error in err. */
int backend_wait_connected(struct backend *bk, uv_loop_t *loop, int timeout_ms,
                           struct cr_err *err);

/* Start-up only (runs the loop): waits for the connection's next outcome,
 * the connection up or one more attempt failed, at most timeout_ms. Returns
 * 0 when up; otherwise, with "cannot connect to result backend <where>:
 * <reason>" in err, CR_EPEER when Redis refused the handshake (WRONGPASS,
 * NOAUTH, a bad database: no use trying again), CR_EBACKEND when an attempt
 * failed, CR_ETIMEDOUT when none ended in time. The connection goes on
 * retrying by itself (see net/redis.h) whatever this returns. */
int backend_connect_attempt(struct backend *bk, int timeout_ms, struct cr_err *err);

/* Stores the meta JSON of task_id, in one atomic step with the check that
 * keeps it out when it must not replace what is stored: a SUCCESS is never
 * replaced; a FAILURE or REVOKED only by a final state (SUCCESS, FAILURE,
 * REVOKED); a state that is not final only by a state of the same or a later
 * attempt. attempt is the message's retries when the meta was made (the
 * RETRY of attempt N is stored after attempt N + 1 is published), or -1 when
 * unknown (a final state stored for another task). Takes json (cr_malloc'd,
 * len bytes, NUL-terminated) in every case, so a burst of results holds one copy of each
 * until Redis answers; a stored one is kept 10 s more (4,096 and 8 MiB at
 * most) and written again after a reconnect, in case the server that took it
 * lost it (see RECENT_MAX in backend.c). cb is called exactly once, never
 * from inside this call. Returns 0, or CR_ENOMEM (cb never called). */
int backend_store(struct backend *bk, const char *task_id, int attempt, char *json,
                  size_t len, backend_store_fn *cb, void *privdata);

/* Reads the stored meta of task_id. Same contract as backend_store(). */
int backend_get(struct backend *bk, const char *task_id, backend_get_fn *cb,
                void *privdata);

/* Any Redis command (argv copied), e.g. XADD for progress streams. cb (may be
 * NULL) gets the hiredis reply (borrowed for the call; an error reply is passed
 * on, not retried) or NULL with CR_ECANCELED on backend_free(). Without cb, a
 * refusal Redis lifts by itself (OOM, READONLY, LOADING, BUSY...) makes the
 * command wait and go again, in order, as results do. Like the other
 * operations it waits for a reconnect and is sent again when a connection
 * drops unanswered, so use it for idempotent commands. Never calls back from
 * inside this call. Returns 0 or CR_ENOMEM. */
struct redisReply;
typedef void backend_reply_fn(struct backend *bk, int status,
                              const struct redisReply *reply, void *privdata);
int backend_command(struct backend *bk, int argc, const char *const *argv,
                    const size_t *argvlen, backend_reply_fn *cb, void *privdata);

/* A Lua script sent by EVALSHA, so Redis neither receives nor hashes its text
 * each call (measured: 140k EVAL/s against 199k EVALSHA/s on the bench Redis).
 * When Redis answers NOSCRIPT (restarted, SCRIPT FLUSH) the command is sent
 * again once as EVAL, which also puts the script back in Redis's cache.
 * Define one per script with static storage: BACKEND_SCRIPT(text); the digest
 * is computed on first use and the text must outlive every backend. */
struct backend_script {
    const char *text;
    size_t len;
    char sha[41]; /* "" until first use */
    /* EVALs of it sent and not yet answered, on the connection eval_gen of
     * eval_bk (see on_noscript() in backend.c). */
    const struct backend *eval_bk;
    unsigned long eval_gen;
    int evals_unanswered;
};
#define BACKEND_SCRIPT(text)                                                             \
    {                                                                                    \
        (text), sizeof(text) - 1, "", NULL, 0, 0                                         \
    }

/* Runs script with argv = numkeys, keys..., args... (copied). Same contract as
 * backend_command(). */
int backend_eval(struct backend *bk, struct backend_script *script, int argc,
                 const char *const *argv, const size_t *argvlen, backend_reply_fn *cb,
                 void *privdata);

/* ---- Chords, as Celery's RedisBackend keeps them (celery/backends/redis.py):
 * celery-taskset-meta-<group_id>.j, the sorted set of finished header members
 * scored by group_index; .t, the members added at run time; .s, the header
 * size. The callbacks follow backend_command()'s contract, except that an
 * error reply is not passed on: one that Redis lifts by itself makes the
 * command wait and go again, any other is logged here and becomes status
 * CR_EBACKEND. Each returns 0, CR_EINVAL (a group id too long for a key) or
 * CR_ENOMEM; on error cb is never called. */
typedef void backend_done_fn(struct backend *bk, int status, void *privdata);
/* members: n of them, lens[i] bytes each, in score order, borrowed for the
 * call, when the part completed the chord; else NULL with n 0. */
typedef void backend_chord_fn(struct backend *bk, int status, const char *const *members,
                              const size_t *lens, size_t n, void *privdata);

/* Celery's set_chord_size: SETEX .s <result_expires> <size> (SET when
 * result_expires is 0), then PUBLISH on the key's channel. */
int backend_chord_size(struct backend *bk, const char *group_id, long size,
                       backend_done_fn *cb, void *privdata);
/* Celery's on_chord_part_return, atomically: ZADD .j member (score
 * group_index, +inf when < 0), the TTL of .j .t .s set to result_expires
 * (unless 0), and, when .s exists and the count of .j equals .s + .t, the
 * members in order (ZRANGE .j 0 -1) for task_id to join the chord. Of the
 * celeriac tasks that find a chord complete, only the one whose member
 * completed it gets the members (again, when it is redelivered): it claims the
 * join under BACKEND_CHORD_CLAIM_PREFIX <group_id> (TTL result_expires).
 * member is len bytes, copied. */
int backend_chord_part(struct backend *bk, const char *group_id, long group_index,
                       const char *member, size_t len, const char *task_id,
                       backend_chord_fn *cb, void *privdata);
/* DEL .j .t .s and the claim of a chord that was joined. */
int backend_chord_clear(struct backend *bk, const char *group_id, backend_done_fn *cb,
                        void *privdata);

#define BACKEND_CHORD_CLAIM_PREFIX "celeriac-chord-join-"

/* The key prefix results are stored under ("celery-task-meta-"). */
#define BACKEND_META_PREFIX "celery-task-meta-"
/* celeriac's own: the attempt of a retried task's stored state while it is
 * not final (see backend_store()); a Python worker neither sets nor reads it. */
#define BACKEND_ATTEMPT_PREFIX "celeriac-task-attempt-"

/* What every key and channel of this backend starts with before Celery's own
 * prefix (global_keyprefix and its '_'); "" when none. Borrowed for the
 * backend's life. Writers of result metas elsewhere (the progress writer)
 * must put it before BACKEND_META_PREFIX. */
const char *backend_key_prefix(const struct backend *bk);

int backend_connected(const struct backend *bk);
unsigned long backend_reconnects(const struct backend *bk);
/* Operations not yet answered (waiting or in flight). */
size_t backend_pending(const struct backend *bk);

/* Cancels pending operations (callbacks get CR_ECANCELED), disconnects, frees.
 * NULL is a no-op. */
void backend_free(struct backend *bk);

#endif
