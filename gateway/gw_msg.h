/* gw_msg.h -- the gateway's request and reply formats: routing, bearer-token
 * checks, validation of POST /v1/tasks, the Celery task built from it, and
 * the JSON replies. Pure: no sockets, no loop, no clock, no randomness (time
 * and random bytes are arguments).
 *
 * HTTP API (every reply is JSON except GET /):
 *   POST /v1/tasks            {"task", "args", "kwargs", "queue", "priority",
 *                             "countdown", "expires", "task_id"} -> 202
 *                             {"task_id", "state": "PENDING", "status_url",
 *                             "stream_url"}
 *   GET  /v1/tasks/{id}       -> 200 {"task_id", "state", "result", "traceback",
 *                             "date_done", "ready"[, "error"]}
 *   WS   /v1/tasks/{id}/stream[?from=SEQ]   see gw_session.h
 *   GET  /                    the web page
 * Errors: {"error": {"status": 4xx, "code": "<code>", "message": "..."}}. */
#ifndef CR_GW_MSG_H
#define CR_GW_MSG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "protocol/celery_msg.h"
#include "util/buf.h"

#define GW_TASK_ID_MAX 155 /* bytes of a task id, as a Redis key part */
#define GW_NAME_MAX 200    /* bytes of a task or queue name */

/* A client error: the HTTP status and a stable machine-readable code. */
struct gw_error {
    int status;       /* 400, 401, 404, 405, 413, 415, 422 */
    const char *code; /* static string, e.g. "bad_json" */
    char message[256];
};

/* Fills e and returns CR_EINVAL (for one-line error returns). */
int gw_error_set(struct gw_error *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Appends {"error": {"status", "code", "message"}}. Returns 0 or CR_ENOMEM. */
int gw_error_json(const struct gw_error *e, struct buf *out);

/* ---------------------------------------------------------------- routing */

enum gw_route_kind {
    GW_ROUTE_PAGE,      /* GET / (and /index.html) */
    GW_ROUTE_SUBMIT,    /* POST /v1/tasks */
    GW_ROUTE_STATUS,    /* GET /v1/tasks/{id} */
    GW_ROUTE_STREAM,    /* GET /v1/tasks/{id}/stream (WebSocket upgrade) */
    GW_ROUTE_HEALTH,    /* GET /healthz */
    GW_ROUTE_PREFLIGHT, /* OPTIONS on any known path (CORS) */
};

struct gw_route {
    enum gw_route_kind kind;
    char task_id[GW_TASK_ID_MAX + 1]; /* STATUS, STREAM */
    int64_t from_seq;                 /* STREAM: ?from=SEQ, 0 when absent */
};

/* Routes method + path (no query) and reads ?from= from query (may be NULL).
 * Returns 0, or CR_EINVAL with e set: 404 not_found, 405 method_not_allowed,
 * 400 bad_task_id / bad_from. */
int gw_route_parse(const char *method, const char *path, const char *query,
                   struct gw_route *out, struct gw_error *e);

/* Copies the %-decoded value of name from a query string ("a=1&b=2", may be
 * NULL) into out (NUL-terminated). Returns 1 when found, 0 when absent, or
 * CR_ERANGE when it does not fit in size bytes. */
int gw_query_get(const char *query, const char *name, char *out, size_t size);

/* Whether a request may pass: always when expected is NULL or ""; otherwise
 * when authorization is "Bearer <expected>" or query_token equals expected
 * (browsers cannot set headers on a WebSocket). Compares in constant time. */
int gw_auth_ok(const char *expected, const char *authorization, const char *query_token);

/* ----------------------------------------------------------- submissions */

/* What a submission may name. NULL lists allow anything. */
struct gw_rules {
    const char *const *tasks; /* known task names */
    int ntasks;
    const char *const *queues; /* queues a client may choose */
    int nqueues;
    const char *default_queue;
};

/* A validated POST /v1/tasks body. Owned: gw_submit_release(). */
struct gw_submit {
    char *task;
    cJSON *args;   /* array */
    cJSON *kwargs; /* object */
    char *queue;
    int priority;       /* 0..255 (0 when absent, as kombu sends) */
    double countdown_s; /* < 0: none */
    double expires_s;   /* < 0: none (relative seconds) */
    int64_t expires_us; /* < 0: none (absolute, from an ISO string) */
    char *task_id;      /* caller-chosen id, or NULL */
};

void gw_submit_init(struct gw_submit *s);
void gw_submit_release(struct gw_submit *s);

/* Parses and validates a body. Returns 0, CR_ENOMEM, or CR_EINVAL with e set:
 * 400 bad_json (not strict JSON), 400 bad_request (not an object, wrong field
 * type, unknown field, bad range), 422 unknown_task, 422 unknown_queue. s must
 * be gw_submit_init()ed; the caller releases it in every case. */
int gw_submit_parse(const char *body, size_t len, const struct gw_rules *rules,
                    struct gw_submit *s, struct gw_error *e);

/* AMQP properties besides the headers, as Python's client sets them. */
struct gw_props {
    char expiration[24]; /* ms as decimal text, "" when no expiry */
    int priority;
};

/* Fills tm (task_msg_init()ed by the caller, released by the caller in every
 * case) with the task as Celery's send_task would publish it: the given id,
 * root_id = id, retries 0, eta = now + countdown, expires, origin. Strings
 * are copied. Returns 0 or CR_ENOMEM. */
int gw_submit_to_task(const struct gw_submit *s, const char *task_id, const char *origin,
                      int64_t now_us, struct task_msg *tm, struct gw_props *props);

/* Whether id may be used as a task id (1..GW_TASK_ID_MAX of [A-Za-z0-9._:-]). */
int gw_task_id_ok(const char *id, size_t len);

/* ---------------------------------------------------------------- replies */

/* Returns a new object {"task_id", "state", "result", "traceback", "date_done",
 * "ready"[, "error"]} from a stored meta (NULL or unreadable: PENDING). "error"
 * is "ExcType: message" for exception states. NULL on OOM. */
cJSON *gw_meta_summary(const char *task_id, const char *meta, size_t len);

/* Whether a stored meta is in a ready state (SUCCESS, FAILURE, REVOKED). */
int gw_meta_ready(const char *meta, size_t len);

/* Appends s (len bytes) as a JSON string literal: UTF-8 kept, invalid bytes
 * replaced by U+FFFD so that the output is valid UTF-8 (a WebSocket text frame
 * must be). Returns 0 or CR_ENOMEM. */
int gw_json_str(struct buf *out, const char *s, size_t len);

#endif
