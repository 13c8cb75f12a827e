/* sqs_sign.c -- a SigV4-signed SQS request on a libcurl easy handle (no I/O). */
#include "sqs_sign.h"

#include <stdio.h>
#include <string.h>

/* Header values and the scope: printable ASCII, so nothing can split a header
 * line or the "aws:amz:<region>:sqs" string; id also refuses ':' there. */
static int clean(const char *s, int colon_ok)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e ||
            (!colon_ok && *s == ':'))
            return 0;
    return 1;
}

static int add(struct curl_slist **list, const char *name, const char *value)
{
    char line[SQS_TOKEN_MAX_BYTES + 64];
    struct curl_slist *n;
    int len = snprintf(line, sizeof line, "%s: %s", name, value);

    if (len < 0 || (size_t)len >= sizeof line)
        return CR_EINVAL;
    n = curl_slist_append(*list, line);
    explicit_bzero(line, (size_t)len); /* it may hold the session token */
    if (!n)
        return CR_ENOMEM;
    *list = n;
    return 0;
}

int sqs_sign_setup(CURL *h, const struct sqs_sign_req *rq, struct curl_slist **hdrs,
                   struct cr_err *err)
{
    const char *ctype = rq->content_type ? rq->content_type : SQS_CONTENT_TYPE;
    const struct sqs_creds *cr = rq->creds;
    char url[SQS_ENDPOINT_MAX + 2], scope[SQS_REGION_MAX + 16], target[128];
    struct curl_slist *list = NULL;
    int rc = 0;

    *hdrs = NULL;
    if (!rq->endpoint || !cr || !rq->body)
        return cr_err_set(err, CR_EINVAL,
                          "sqs request: no endpoint, credentials or body");
    if (!clean(rq->region, 0) || strlen(rq->region) >= SQS_REGION_MAX)
        return cr_err_set(err, CR_EINVAL, "sqs request: invalid signing region");
    if (!clean(ctype, 1) || (rq->target && !clean(rq->target, 0)) ||
        (rq->amz_date && !clean(rq->amz_date, 0)))
        return cr_err_set(err, CR_EINVAL,
                          "sqs request: invalid content type, target or date");
    if (cr->session_token && !clean(cr->session_token, 1))
        return cr_err_set(err, CR_EINVAL, "sqs request: invalid session token");
    if (snprintf(url, sizeof url, "%s/", rq->endpoint) >= (int)sizeof url ||
        (rq->target && snprintf(target, sizeof target, "AmazonSQS.%s", rq->target) >=
                           (int)sizeof target))
        return cr_err_set(err, CR_EINVAL, "sqs request: endpoint or target too long");
    snprintf(scope, sizeof scope, "aws:amz:%s:sqs", rq->region);

    rc = add(&list, "Content-Type", ctype);
    if (!rc && rq->target)
        rc = add(&list, "X-Amz-Target", target);
    /* libcurl 7.88 does not know about session tokens: the header is added
     * here, and being in CURLOPT_HTTPHEADER it is signed, as SQS requires. */
    if (!rc && cr->session_token)
        rc = add(&list, "X-Amz-Security-Token", cr->session_token);
    /* Given, libcurl signs this date instead of reading its clock. */
    if (!rc && rq->amz_date)
        rc = add(&list, "X-Amz-Date", rq->amz_date);
    if (rc) {
        curl_slist_free_all(list);
        return rc == CR_ENOMEM ? cr_err_set(err, CR_ENOMEM, "out of memory")
                               : cr_err_set(err, rc, "sqs request: a header is too long");
    }

    /* The setopt calls below copy their strings (URL, scope, user name and
     * password) except POSTFIELDS and the header list; any one failing means
     * libcurl ran out of memory or lacks SigV4 (older than 7.75). */
    if (curl_easy_setopt(h, CURLOPT_URL, url) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_POST, 1L) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq->body) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)rq->body_len) !=
            CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, list) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, scope) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_USERNAME, cr->access_key_id) != CURLE_OK ||
        curl_easy_setopt(h, CURLOPT_PASSWORD, cr->secret_access_key) != CURLE_OK) {
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, (struct curl_slist *)NULL);
        curl_slist_free_all(list);
        return cr_err_set(err, CR_ENOMEM, "sqs request: libcurl refused an option");
    }
    *hdrs = list;
    return 0;
}
