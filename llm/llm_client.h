/* llm_client.h -- many concurrent OpenAI-compatible HTTP calls on the worker loop.
 *
 * Owns one CURLM glued to libuv (its sockets in a private epoll set that the loop
 * watches through one uv_poll_t, curl's single timer in a uv_timer_t). A request is a
 * POST of a JSON body; a streamed chat response is parsed incrementally (SSE, then chunk
 * mapping) and each text delta is handed to the caller as it arrives. Phase timeouts
 * (connect, first byte, first token, idle gap) are enforced here. Not thread-safe:
 * create, use and free on the loop thread only. */
#ifndef CR_LLM_CLIENT_H
#define CR_LLM_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include <cjson/cJSON.h>

#include "gate.h"
#include "limiter.h"
#include "llm_types.h"
#include "policy.h"
#include "prices.h"
#include "provider.h"
#include "protocol/openai.h"
#include "util/err.h"
#include "util/redact.h"

/* The most extra request headers llm_client_config.headers may hold. */
#define LLM_MAX_EXTRA_HEADERS 32

struct llm_client_config {
    double connect_timeout_s;
    double first_byte_timeout_s;
    double first_token_timeout_s;
    double idle_timeout_s;
    long max_connections;  /* 0: no cap */
    long keep_connections; /* plain HTTP: calls in flight past which a call's
                            * new connection is closed when it ends */
    /* Cut out of every result message (borrowed: must outlive the client; NULL:
     * none). A provider or proxy may quote the key it was sent, and the
     * message goes to logs, results, dead letters and events. */
    const struct redact *secrets;
    /* Extra request headers, "Name: value" lines checked with
     * llm_header_check(), NULL-terminated (borrowed: must outlive the client;
     * NULL: none). Sent on every request after the client's own. */
    const char *const *headers;
    /* PEM file of the CAs that verify an HTTPS provider, instead of the
     * system's store (borrowed; NULL or "": the system's). */
    const char *ca_file;
    /* 1: HTTP/2 over HTTPS where the server offers it, calls multiplexed on
     * a few connections (a new call waits for a stream on one being opened;
     * without max_connections, 16 per host at most). Off by default: with
     * it every call takes a new easy handle, as libcurl 7.88 corrupts its
     * heap when a handle that ran an HTTP/2 stream is reused. */
    int http2;
};

struct llm_request {
    enum llm_op op;
    const char *url;     /* full endpoint URL (copied) */
    const char *api_key; /* may be NULL or "" (copied) */
    const char *body;    /* JSON body (copied) */
    size_t body_len;
    int embed_list; /* LLM_OP_EMBED: the input was a list */
    /* NULL: the default OpenAI-compatible provider, read on a fast path
     * (openai_stream) with api_key and the client's headers. Else the call
     * is this provider's (provider.h): the request was built by its build(),
     * headers are exactly the lines below, a 2xx body is framed as framing
     * says and mapped into a chat_reply, errors go through its error_parse. */
    const struct llm_provider *provider;
    const char *const *headers; /* nheaders "Name: value" lines (copied) */
    size_t nheaders;
    /* This call's own lines, added on either path (copied): the W3C trace
     * context (traceparent, tracestate) of its span, so that a provider or
     * gateway that traces continues the task's trace. NULL/0: none, and the
     * default provider's calls share one header list. */
    const char *const *trace_headers;
    size_t ntrace_headers;
    enum llm_framing framing;
    /* Borrowed, must outlive the call: named in the result. */
    const char *provider_name;
    int fallback_left; /* passed to the result as it is */
    /* Its provider's prices and the model name sent (both borrowed, must
     * outlive the call; NULL: no cost). The result's cost_usd is priced by
     * the model sent, else by the one the server named. */
    const struct llm_prices *prices;
    const char *model;
    /* Its provider's cap on calls in flight (borrowed: must outlive every
     * call that names it; NULL or cap <= 0: none). A call past the cap waits
     * in the gate's queue, in order, not yet sent; its phase timeouts count
     * from when it starts, and an abort takes it out of the queue. */
    struct llm_gate *gate;
    /* Its (provider, model)'s shared limits (borrowed: must outlive every
     * call that names it; NULL: none, or no llm_limit_ops set). The call
     * waits in the limit's queue, in order, before its gate, until the
     * limit's owner grants it; its phase timeouts count from when it starts,
     * and an abort takes it out of the queue. */
    struct llm_limit *limit;
    /* Phase timeouts for this call, in seconds; <= 0: the client's. */
    double connect_timeout_s;
    double first_byte_timeout_s;
    double first_token_timeout_s;
    double idle_timeout_s;
};

struct llm_client;
struct llm_req;

/* ---- Shared limits. The client queues the calls of one (provider, model)
 * and asks its owner for each in turn; the owner decides (the worker: with
 * a script in Redis for the whole fleet, or alone while Redis is away). */
struct llm_limit {
    /* public: set by the owner before the first call names it */
    const struct lim_config *cfg; /* borrowed; no rpm, tpm nor concurrency: the
                                   * client grants its calls by itself unless
                                   * it is cooled (a pool's target, see
                                   * pooled) and never asks the owner */
    char key[192];                /* "provider/model", for the owner */
    void *data;                   /* the owner's */
    struct llm_limit *next;       /* the owner's list */
    /* read-only, for the owner inside ops->ask: how long the call asked for
     * has waited for this limit (ms, at least 1) when a refusal held it back
     * since it was queued, else 0 */
    int64_t ask_waited_ms;
    int pooled; /* a pool's target: its calls in flight are
                 * counted across the fleet (fleet_busy) */
    /* public: raised by the client (its own 429s) and by the owner (the
     * fleet's state, then llm_client_limits_changed()); read by the router */
    uint64_t cool_until; /* loop ms: known cooled until then; 0: never */
    long fleet_busy;     /* owner: the other workers' calls on it, last known */
    /* read-only: this client's calls naming it, waiting or in flight */
    long calls;
    /* private: the client's */
    unsigned long refusals;      /* answers that said wait */
    struct llm_req *head, *tail; /* calls waiting, oldest first */
    int asking;                  /* a question is out */
    uint64_t ask_holder;         /* whom it is for */
    long ask_tokens;
    uint64_t retry_at; /* loop ms: ask no sooner; 0: now */
    int listed;
    struct llm_limit *next_waiting; /* the client's limits with calls waiting */
};

/* What the owner of the limits does for the client. Each function gets the
 * ops' data last. holder names one call (unique per client). */
struct llm_limit_ops {
    /* May the holder's call, estimated at tokens, go now? The answer comes
     * through llm_client_limit_answer(), later or from inside this call. */
    void (*ask)(struct llm_client *c, struct llm_limit *lim, long tokens, uint64_t holder,
                void *data);
    /* A granted call ended: its permit is free, and it was charged est
     * tokens where actual were used (-1: no usage came). */
    void (*done)(struct llm_client *c, struct llm_limit *lim, uint64_t holder, long est,
                 long actual, void *data);
    /* The provider said to wait ms (a 429, or a 503/529 with a delay). */
    void (*cool)(struct llm_client *c, struct llm_limit *lim, int64_t ms, void *data);
    /* The holder's call still runs: its permit lives a lease more. */
    void (*renew)(struct llm_client *c, struct llm_limit *lim, uint64_t holder,
                  void *data);
    /* The provider's rate-limit headers say a limit of its is spent for ms
     * more (x-ratelimit-remaining-* 0 until x-ratelimit-reset-*): nothing
     * should go before then. Not a 429: no cooling to count. May be NULL. */
    void (*hold)(struct llm_client *c, struct llm_limit *lim, int64_t ms, void *data);
};

/* A streamed text delta (borrowed for the call). */
typedef void llm_delta_fn(struct llm_req *r, const char *text, size_t len,
                          void *privdata);
/* Called exactly once per accepted request, including on abort and on
 * llm_client_free(); never from inside llm_client_submit() or llm_req_abort().
 * The request is freed right after it returns. */
typedef void llm_done_fn(struct llm_req *r, const struct llm_result *res, void *privdata);

/* Checks one extra header line "Name: value" for llm_client_config.headers:
 * a non-empty token name (RFC 9110 tchar), a colon, and no CR, LF or NUL
 * anywhere. Returns 0, or CR_EINVAL with the reason in err (the value is
 * never quoted: it may be a secret). Pure. */
int llm_header_check(const char *line, struct cr_err *err);

/* Returns a new client or NULL with err set. Free with llm_client_free(). */
struct llm_client *llm_client_new(uv_loop_t *loop, const struct llm_client_config *cfg,
                                  struct cr_err *err);

/* Starts a request. Returns it, or NULL with err set (then on_done is never
 * called). on_delta may be NULL. */
struct llm_req *llm_client_submit(struct llm_client *c, const struct llm_request *rq,
                                  llm_delta_fn *on_delta, llm_done_fn *on_done,
                                  void *privdata, struct cr_err *err);

/* Aborts a request's transfer now; on_done follows from the loop with code
 * (CR_ECANCELED or CR_ETIMEDOUT), exc_type and message as given. */
void llm_req_abort(struct llm_req *r, int code, const char *exc_type,
                   const char *message);

/* The text streamed so far by a chat request (borrowed until the next loop
 * iteration); "" before the first token. */
const char *llm_req_text(const struct llm_req *r, size_t *len);

/* Sets who decides for the calls that name a limit (ops and data borrowed,
 * must outlive the client); without it llm_request.limit is ignored. */
void llm_client_set_limits(struct llm_client *c, const struct llm_limit_ops *ops,
                           void *data);

/* The answer to ops->ask for lim: granted (the call it was for starts, or,
 * when that call is gone, its grant is handed back with ops->done), or
 * wait_ms before asking again. */
void llm_client_limit_answer(struct llm_client *c, struct llm_limit *lim, int granted,
                             int64_t wait_ms);

/* The owner raised cool_until of some limits: calls waiting on a cooled
 * limit that have a fallback (llm_request.fallback_left) leave it at once,
 * each ending with a retryable CR_ECOOLED result ("RateLimitError", nothing
 * sent), so that the caller moves them on; the others wait. The client does
 * the same by itself when a 429 cools a limit, and for calls submitted to a
 * limit already cooled. */
void llm_client_limits_changed(struct llm_client *c);

/* The client's loop time in ms (the clock of llm_limit.cool_until). */
uint64_t llm_client_now(const struct llm_client *c);

/* Requests in flight. */
size_t llm_client_active(const struct llm_client *c);

/* Aborts every request (each gets on_done with CR_ECANCELED), then frees once
 * the loop has closed the handles. NULL is a no-op. */
void llm_client_free(struct llm_client *c);

#endif
