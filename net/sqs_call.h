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

/* One call, blocking: rq signed (net/sqs_sign.h; rq and its body borrowed
 * for the call), at most timeout_ms in all and connect_timeout_ms to
 * connect. On return 0, *status is the HTTP status and a holds the answer
 * (a is reset first), whatever the status; CR_ENOMEM, CR_EINVAL (rq cannot
 * be signed) or CR_EBROKER (a transport failure, no answer) with one line in
 * err. */
int sqs_call_blocking(const struct sqs_sign_req *rq, long timeout_ms,
                      long connect_timeout_ms, long *status, struct sqs_answer *a,
                      struct cr_err *err);

#endif
