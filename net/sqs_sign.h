/* sqs_sign.h -- one SQS request on a libcurl easy handle, signed with
 * Signature Version 4 by libcurl itself (CURLOPT_AWS_SIGV4, libcurl >= 7.75;
 * written against Debian 12's 7.88.1).
 *
 * What libcurl 7.88 signs, and so what this module must get right: the host
 * (with its port when not the default), the x-amz-date it generates (or the
 * X-Amz-Date header given, for a fixed test time), and every header of
 * CURLOPT_HTTPHEADER, lowercased and trimmed; the payload hash is the SHA-256
 * of CURLOPT_POSTFIELDS. The canonical URI and query are taken as they are,
 * so every request is "POST /" on the endpoint with the JSON body (the SQS
 * JSON protocol: QueueUrl goes in the body). An empty-valued header such as
 * "Expect:" would be signed but not sent, so none is ever added; libcurl 7.88
 * adds "Expect: 100-continue" (unsigned, which SQS accepts) on its own only to
 * bodies over 1 MiB, so only a near-limit SendMessage waits for a 100 (the
 * caller's CURLOPT_EXPECT_100_TIMEOUT_MS bounds that). No I/O here. */
#ifndef CR_SQS_SIGN_H
#define CR_SQS_SIGN_H

#include <stddef.h>
#include <curl/curl.h>

#include "net/sqs_url.h"
#include "protocol/sqs.h"
#include "util/err.h"

/* One request. Every pointer is borrowed for the sqs_sign_setup() call,
 * except body, which libcurl reads in place: it must stay valid and unchanged
 * until the transfer ends (or the handle is reset or set up again). */
struct sqs_sign_req {
    const char *endpoint;          /* "https://sqs.eu-west-1.amazonaws.com", no '/' */
    const char *region;            /* the signing region; the endpoint's */
    const struct sqs_creds *creds; /* key, secret, session token (may be NULL) */
    const char *target;            /* "ReceiveMessage" -> X-Amz-Target: AmazonSQS.<op>;
                                    * NULL: no X-Amz-Target (query protocol) */
    const char *content_type;      /* NULL: SQS_CONTENT_TYPE (protocol/sqs.h) */
    const char *body;
    size_t body_len;
    const char *amz_date; /* NULL: libcurl's clock; "20261207T084730Z" for tests */
};

/* Sets h up for rq: URL "<endpoint>/", POST of body (not copied), SigV4 for
 * "aws:amz:<region>:sqs" with the key and secret as user name and password,
 * and the headers Content-Type, X-Amz-Target, X-Amz-Security-Token (when the
 * credentials carry one, so that it is signed) and X-Amz-Date (when given).
 * Nothing else of h is touched (timeouts, callbacks, the share, TLS are the
 * caller's). On success *hdrs is a new list that h points to: the caller frees
 * it with curl_slist_free_all() after the transfer ends, never before. Returns
 * 0; CR_EINVAL with err (a field missing, a region, target, content type or
 * date that cannot go into a header or the signing scope); CR_ENOMEM. On
 * error *hdrs is NULL and h may hold some of the options: reset it or set it
 * up again before use. */
int sqs_sign_setup(CURL *h, const struct sqs_sign_req *rq, struct curl_slist **hdrs,
                   struct cr_err *err);

#endif
