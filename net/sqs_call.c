/* sqs_call.c -- an SQS call's answer off a curl easy handle, and the
 * blocking call (see sqs_call.h). */
#include "net/sqs_call.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

void sqs_answer_init(struct sqs_answer *a)
{
    buf_init(&a->resp);
    a->resp.max_bytes = SQS_RESPONSE_MAX_BYTES;
    a->qerr[0] = '\0';
}

void sqs_answer_reset(struct sqs_answer *a)
{
    buf_reset(&a->resp);
    a->qerr[0] = '\0';
}

void sqs_answer_release(struct sqs_answer *a)
{
    buf_release(&a->resp);
    sqs_answer_init(a);
}

static size_t on_body(char *ptr, size_t size, size_t n, void *ud)
{
    struct sqs_answer *a = ud;
    return buf_append(&a->resp, ptr, size * n) ? 0 : size * n;
}

static size_t on_header(char *ptr, size_t size, size_t n, void *ud)
{
    struct sqs_answer *a = ud;
    size_t len = size * n;
    static const char name[] = "x-amzn-query-error:";
    if (len > sizeof(name) - 1 && !strncasecmp(ptr, name, sizeof(name) - 1)) {
        const char *v = ptr + sizeof(name) - 1;
        size_t vl = len - (sizeof(name) - 1);
        while (vl && (*v == ' ' || *v == '\t'))
            v++, vl--;
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
            vl--;
        if (vl >= sizeof(a->qerr))
            vl = sizeof(a->qerr) - 1;
        memcpy(a->qerr, v, vl);
        a->qerr[vl] = '\0';
    }
    return len;
}

void sqs_answer_attach(CURL *h, struct sqs_answer *a)
{
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
}

enum sqs_err_kind sqs_answer_error(const struct sqs_answer *a, long status,
                                   struct sqs_error *e)
{
    memset(e, 0, sizeof(*e));
    sqs_error_parse((int)status, a->qerr[0] ? a->qerr : NULL,
                    a->resp.data ? a->resp.data : "", a->resp.len, e);
    return e->kind;
}

void sqs_dest_req(const struct sqs_dest *d, enum sqs_action a, const struct buf *body,
                  struct sqs_sign_req *rq)
{
    memset(rq, 0, sizeof(*rq));
    rq->endpoint = d->endpoint;
    rq->region = d->region;
    rq->creds = d->creds;
    rq->target = sqs_action_name(a);
    rq->body = body->data;
    rq->body_len = body->len;
}

int sqs_call_blocking(const struct sqs_dest *d, enum sqs_action action,
                      const struct buf *body, long timeout_ms, long connect_timeout_ms,
                      long *status, struct sqs_answer *a, struct cr_err *err)
{
    struct sqs_sign_req rq;
    struct curl_slist *hdrs = NULL;
    CURL *h = curl_easy_init();
    CURLcode cc;

    *status = 0;
    sqs_answer_reset(a);
    sqs_dest_req(d, action, body, &rq);
    if (!h)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    if (sqs_sign_setup(h, &rq, &hdrs, err)) {
        curl_easy_cleanup(h);
        return err->code ? err->code : CR_EINVAL;
    }
    sqs_answer_attach(h, a);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
    cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (cc != CURLE_OK) {
        sqs_answer_reset(a);
        return cr_err_set(err, CR_EBROKER, "sqs: %s at %s: %s", rq.target, rq.endpoint,
                          curl_easy_strerror(cc));
    }
    return 0;
}
