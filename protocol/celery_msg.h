/* celery_msg.h -- Celery task messages (protocol v2 and v1, JSON) to and from
 * struct task_msg. Pure: no I/O, no clock.
 *
 * The decoder is given what the broker delivered (properties, headers already
 * converted to JSON by amqp_json, body bytes) and keeps the whole message, so a
 * later retry or dead-letter can republish it unchanged. */
#ifndef CR_CELERY_MSG_H
#define CR_CELERY_MSG_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "../util/buf.h"
#include "../util/err.h"

/* What arrived (all borrowed for the duration of the call). */
struct celery_raw_msg {
    const char *content_type;     /* may be NULL */
    const char *content_encoding; /* may be NULL */
    const cJSON *headers;         /* application headers as a JSON object, or NULL */
    const char *correlation_id;   /* may be NULL */
    const char *reply_to;         /* may be NULL */
    int delivery_mode;            /* 0 when absent */
    int priority;                 /* 0 when absent */
    const char *body;
    size_t body_len;
};

/* A decoded task. Every pointer is owned by the struct: task_msg_release(). */
struct task_msg {
    int proto;       /* 2 (task header present) or 1 (body dict) */
    char *id;        /* task id; never NULL after a successful decode */
    char *task;      /* task name; never NULL after a successful decode */
    char *shadow;    /* NULL unless set */
    char *root_id;   /* defaults to id when absent */
    char *parent_id; /* NULL when absent */
    char *group;     /* NULL when absent */
    long group_index;
    int has_group_index;
    int retries;
    char *eta;          /* ISO text as sent, or NULL */
    char *expires;      /* ISO text as sent, or NULL */
    int64_t eta_us;     /* epoch microseconds, or -1 when absent */
    int64_t expires_us; /* epoch microseconds, or -1 when absent */
    double time_limit_hard; /* seconds; 0 when not set */
    double time_limit_soft; /* seconds; 0 when not set */
    int ignore_result;      /* -1 when the message does not say, else 0/1 */
    char *argsrepr;
    char *kwargsrepr;
    char *origin;
    cJSON *args;    /* JSON array (never NULL after success) */
    cJSON *kwargs;  /* JSON object (never NULL after success) */
    cJSON *embed;   /* JSON object, or NULL (v2 embed null, or v1) */
    cJSON *headers; /* every header as received (object), for republishing */
    /* properties */
    char *content_type;
    char *content_encoding;
    char *correlation_id;
    char *reply_to;
    int delivery_mode;
    int priority;
};

/* Zeroes *m so that task_msg_release() is always safe on it. */
void task_msg_init(struct task_msg *m);
void task_msg_release(struct task_msg *m);

/* Decodes one message. Returns 0, or an error with detail in err:
 *  CR_ECONTENT  content type other than JSON (pickle, yaml, msgpack, ...) or a
 *               compression header: the body is never deserialized;
 *  CR_EDECODE   body is not valid UTF-8 JSON, or is nested deeper than 64;
 *  CR_EPROTO    valid JSON of the wrong shape (v2 body not [args, kwargs, embed],
 *               kwargs not an object, missing id or task, bad eta/expires/timelimit);
 *  CR_ENOMEM.
 * Even on error, out->id and out->task are filled when they could be read, so the
 * caller can store a FAILURE for that id. out must be task_msg_init()ed; the
 * caller releases it in every case. */
int celery_msg_decode(const struct celery_raw_msg *in, struct task_msg *out,
                      struct cr_err *err);

/* Encodes m as a protocol v2 message: body JSON "[args, kwargs, embed]" appended
 * to *body, and *headers set to a new JSON object holding m->headers with the
 * decoded fields (id, task, retries, eta, expires, root_id, parent_id, group,
 * group_index, timelimit, ...) written over it, so unknown custom headers are
 * kept. Returns 0 or CR_ENOMEM (then *headers is NULL). */
int celery_msg_encode_v2(const struct task_msg *m, struct buf *body, cJSON **headers);

#endif
