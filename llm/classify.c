/* classify.c -- one outcome for every LLM call, whoever answered (no I/O). */
#include "classify.h"

#include <stdio.h>
#include <string.h>

#include "policy.h"

/* An error as its reader saw it, in a body or inside the answer. Views of
 * the reader's strings: nothing is copied. */
struct seen_error {
    const char *type, *code, *param, *message;
    long status; /* the status its class means; 0: none known */
    /* The provider's mapping of it, or NULL on the fast path: a known kind
     * names the exception, else the status does. */
    const struct chat_error *ce;
};

const char *llm_exc_for_status(long status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 401:
        return "AuthenticationError";
    case 403:
        return "PermissionDeniedError";
    case 404:
        return "NotFoundError";
    case 409:
        return "ConflictError";
    case 422:
        return "UnprocessableEntityError";
    case 429:
        return "RateLimitError";
    }
    return status >= 500 ? "InternalServerError" : "APIStatusError";
}

static const char *exc_of(const struct seen_error *e, long status)
{
    if (e->ce && e->ce->kind != CHAT_ERROR_UNKNOWN)
        return llm_error_exc_type(e->ce);
    return llm_exc_for_status(status);
}

/* Appends " (type: T, code: C, param: P)" with the parts that are set, so
 * the stored error keeps what a caller would branch on. */
static void add_detail(char *msg, size_t cap, const struct seen_error *e)
{
    const char *name[3] = {"type", "code", "param"};
    const char *val[3] = {e->type, e->code, e->param};
    size_t len = strlen(msg);
    int first = 1;

    for (int i = 0; i < 3 && len + 1 < cap; i++) {
        if (!val[i] || !val[i][0])
            continue;
        snprintf(msg + len, cap - len, "%s%s: %s", first ? " (" : ", ", name[i], val[i]);
        len = strlen(msg);
        first = 0;
    }
    if (!first && len + 1 < cap)
        snprintf(msg + len, cap - len, ")");
}

static int is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

static void fail(struct llm_result *res, enum llm_verdict v, const char *exc)
{
    res->code = CR_ELLM;
    res->verdict = v;
    res->exc_type = exc;
}

static int64_t hint(const struct llm_exchange *x)
{
    return llm_retry_after_ms(x->retry_after_ms, x->retry_after, x->now_epoch_ms);
}

/* A non-2xx response: its body read by the reader's error mapping. */
static void body_error(const struct llm_exchange *x, const struct llm_answer *a,
                       struct llm_result *res, char *msg, size_t cap)
{
    const char *body = x->body ? x->body : "";
    struct openai_error oe;
    struct chat_error ce;
    struct seen_error e;

    if (!a->stream) {
        openai_error_parse(body, x->body_len, &oe);
        e = (struct seen_error){oe.type, oe.code, oe.param, oe.message, x->status, NULL};
    } else {
        a->provider->error_parse(x->status, body, x->body_len, &ce);
        e = (struct seen_error){
            ce.type, ce.code, "", ce.message, llm_error_status(&ce, x->status), &ce};
    }
    fail(res, llm_classify(0, e.status, e.code, e.type, x->should_retry, 0),
         exc_of(&e, x->status));
    res->retry_after_ms = hint(x);
    snprintf(msg, cap, "Error code: %ld - %s", x->status,
             e.message[0] ? e.message : "(no message)");
    add_detail(msg, cap, &e);
}

static void embeddings(const struct llm_exchange *x, const struct llm_answer *a,
                       struct llm_result *res, char *msg, size_t cap)
{
    const struct llm_provider *p = a->provider;
    struct cr_err err;

    if (!p->embed_parse) {
        fail(res, LLM_PERMANENT, "APIError");
        snprintf(msg, cap, "bad embeddings response: the provider has no embeddings");
        return;
    }
    res->embedding = p->embed_parse(x->body ? x->body : "", x->body_len, x->embed_list,
                                    &res->embed_tokens, &err);
    if (!res->embedding) {
        fail(res, LLM_RETRYABLE, "APIError");
        snprintf(msg, cap, "bad embeddings response: %s", err.msg);
    }
}

/* A chat answer that came whole: parsed into the reader. Returns 0, or -1
 * when it is neither a stream nor an answer (res and msg then say so).
 * Sending the same request again buys the same body, so a body that is
 * neither is permanent; an empty one is a cut exchange rather than an
 * answer, and out of memory is ours: both are retried. */
static int parse_whole(const struct llm_exchange *x, struct llm_answer *a,
                       struct llm_result *res, char *msg, size_t cap)
{
    const char *body = x->body ? x->body : "";
    const char *name = a->provider->name;
    struct cr_err err;
    int bad;

    if (a->fast ? !openai_chat_parse(a->fast, body, x->body_len, &err)
                : !llm_stream_parse(a->stream, body, x->body_len, &err))
        return 0;
    bad = !is_blank(body, x->body_len) && (a->stream || err.code == CR_EPROTO);
    if (a->fast)
        snprintf(msg, cap,
                 "response is neither an event stream nor a chat completion: %s",
                 err.msg);
    else
        snprintf(msg, cap, "response is neither a %s stream nor a %s answer: %s", name,
                 name, err.msg);
    fail(res, bad ? LLM_PERMANENT : LLM_RETRYABLE,
         bad ? "APIResponseValidationError" : "APIError");
    if (!bad && a->fast)
        res->retry_after_ms = hint(x);
    return -1;
}

/* The error the answer carried, if any: 1 with *e filled, else 0. */
static int answer_error(const struct llm_answer *a, struct seen_error *e)
{
    const struct chat_error *ce;
    const struct openai_stream *s = a->fast;

    if (s) {
        if (!s->error)
            return 0;
        *e = (struct seen_error){s->error_type,
                                 s->error_code,
                                 "",
                                 s->error_message,
                                 openai_error_status(s->error_type, s->error_code),
                                 NULL};
        return 1;
    }
    if (!a->stream->reply.error)
        return 0;
    ce = a->stream->reply.err; /* NULL when its details could not be stored */
    if (!ce)
        *e = (struct seen_error){"", "", "", "", 0, NULL};
    else
        *e = (struct seen_error){
            ce->type, ce->code, "", ce->message, llm_error_status(ce, 0), ce};
    return 1;
}

/* A chat that ended at the HTTP level with a 2xx. */
static void chat(const struct llm_exchange *x, struct llm_answer *a,
                 struct llm_result *res, char *msg, size_t cap)
{
    struct seen_error e;

    if (!x->framed && parse_whole(x, a, res, msg, cap))
        return;
    if (answer_error(a, &e)) {
        /* An error sent after the 200 is judged as the same error in a body
         * would be (auth, quota, bad request: permanent; rate limit,
         * overload, server: retryable); one that names no known class is a
         * broken stream, retried. */
        if (e.status)
            fail(res, llm_classify(0, e.status, e.code, e.type, NULL, 0),
                 exc_of(&e, e.status));
        else
            fail(res, llm_classify(0, x->status, e.code, e.type, NULL, 1), "APIError");
        res->retry_after_ms = hint(x);
        snprintf(msg, cap, "error in stream: %s",
                 e.message[0] ? e.message : "(no message)");
        add_detail(msg, cap, &e); /* no param: answers name none */
        return;
    }
    if (a->fast && x->framed && !openai_stream_complete(a->fast)) {
        fail(res, LLM_RETRYABLE, "APIError");
        snprintf(msg, cap,
                 "stream ended without a finish reason or [DONE] after %zu bytes of text",
                 a->fast->content.len);
    } else if (a->stream && !llm_stream_complete(a->stream)) {
        fail(res, LLM_RETRYABLE, "APIError");
        snprintf(msg, cap,
                 "%s answer ended without its completion marker after %zu bytes of text",
                 a->provider->name, a->stream->reply.content.len);
    }
}

void llm_outcome(const struct llm_exchange *x, struct llm_answer *a,
                 struct llm_result *res, char *msg, size_t cap)
{
    res->verdict = LLM_OK;
    res->code = 0;
    res->exc_type = NULL;
    res->http_status = x->status;
    res->curl_code = x->curl_code;
    res->retry_after_ms = -1;
    res->embedding = NULL;
    res->embed_tokens = -1;
    res->message = msg;
    msg[0] = '\0';

    if (x->aborted) {
        res->code = x->abort_code;
        /* A call taken off a cooled limit to go to its fallback at once
         * (CR_ECOOLED) was never sent: retryable, as the 429 that cooled it. */
        res->verdict = x->abort_code == CR_ETIMEDOUT || x->abort_code == CR_ECOOLED
                           ? LLM_RETRYABLE
                           : LLM_PERMANENT;
        res->exc_type = x->abort_exc ? x->abort_exc : "APIError";
        snprintf(msg, cap, "%s", x->fail_msg ? x->fail_msg : "aborted");
    } else if (x->proto_error) {
        fail(res, LLM_RETRYABLE, "APIError");
        snprintf(msg, cap, "%s", x->fail_msg ? x->fail_msg : "protocol error");
    } else if (x->curl_code) {
        int timedout = x->curl_code == LLM_CURL_TIMEDOUT;
        fail(res, llm_classify(x->curl_code, x->status, NULL, NULL, NULL, 0),
             timedout ? "APITimeoutError" : "APIConnectionError");
        res->code = timedout ? CR_ETIMEDOUT : CR_ELLM;
        snprintf(msg, cap, "%s", x->curl_msg ? x->curl_msg : "transfer failed");
    } else if (x->status < 200 || x->status >= 300) {
        body_error(x, a, res, msg, cap);
    } else if (x->op == LLM_OP_EMBED) {
        embeddings(x, a, res, msg, cap);
    } else {
        chat(x, a, res, msg, cap);
    }
    if (res->code == 0)
        res->verdict = LLM_OK;
    if (x->op != LLM_OP_CHAT)
        return;
    if (a->fast) {
        llm_result_set_openai(res, a->fast);
    } else if (a->stream) {
        llm_result_set_reply(res, &a->stream->reply);
        res->content_chunks = a->text_frames;
    }
}
