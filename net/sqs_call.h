/* sqs_call.h -- one SQS call's answer read off a libcurl easy handle (the
 * body, capped, and the x-amzn-query-error header), and the blocking call
 * built on it. Shared by the worker's SQS transport (its asynchronous calls
 * and its start-up) and `celeriac dlq` over SQS. The blocking call must never
 * run on a loop that serves anything else. */
#ifndef CR_SQS_CALL_H
#define CR_SQS_CALL_H

#include <curl/curl.h>

#include "net/sqs_sign.h"
#include "protocol/sqs.h"
#include "util/buf.h"
#include "util/err.h"

#define SQS_QERR_MAX 160

/* What came back. Embedded by its owner; sqs_answer_init() before use,
 * sqs_answer_release() after. */
struct sqs_answer {
    struct buf resp;         /* the body; refused past SQS_RESPONSE_MAX_BYTES */
    char qerr[SQS_QERR_MAX]; /* the x-amzn-query-error header's value, "" if none */
};

void sqs_answer_init(struct sqs_answer *a);
/* Empties a for the next try of a call (keeps its memory). */
void sqs_answer_reset(struct sqs_answer *a);
void sqs_answer_release(struct sqs_answer *a);

/* Points h's body and header callbacks at a, which must outlive the
 * transfer. A body past the cap ends the transfer with a write error. */
void sqs_answer_attach(CURL *h, struct sqs_answer *a);

/* The error a non-2xx answer with HTTP status carries (sqs_error_parse());
 * returns e->kind. */
enum sqs_err_kind sqs_answer_error(const struct sqs_answer *a, long status,
                                   struct sqs_error *e);

/* Where an SQS call goes: a queue's endpoint, signing region and
 * credentials (borrowed from the conf, see net/sqs_url.h). */
struct sqs_dest {
    const char *endpoint;
    const char *region;
    const struct sqs_creds *creds;
};

/* Fills rq for action a to d with body, every pointer borrowed (body until
 * the transfer ends); the other fields zero. */
void sqs_dest_req(const struct sqs_dest *d, enum sqs_action a, const struct buf *body,
                  struct sqs_sign_req *rq);

/* One call of action to d, blocking: body signed (net/sqs_sign.h; all
 * borrowed for the call), at most timeout_ms in all and connect_timeout_ms to
 * connect. On return 0, *status is the HTTP status and ans holds the answer
 * (reset first), whatever the status; CR_ENOMEM, CR_EINVAL (the request
 * cannot be signed) or CR_EBROKER (a transport failure, no answer) with one
 * line in err. */
int sqs_call_blocking(const struct sqs_dest *d, enum sqs_action action,
                      const struct buf *body, long timeout_ms, long connect_timeout_ms,
                      long *status, struct sqs_answer *ans, struct cr_err *err);

#endif
