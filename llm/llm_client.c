/* llm_client.c -- libcurl multi interface driven by libuv, for LLM calls.
 *
 * The glue follows libcurl's socket-action model: curl tells us which sockets
 * to watch (socket callback) and when to wake it (timer callback); we tell curl
 * what happened with curl_multi_socket_action() and then collect finished
 * transfers with curl_multi_info_read(). */
#include "llm_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "classify.h"
#include "limits.h"
#include "rl_headers.h"
#include "util/curl_epoll.h"
#include "protocol/ndjson.h"
#include "protocol/sse.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"

#define SWEEP_MS 100
#define MAX_RAW_BODY (64u << 20) /* a non-streamed body (embeddings) */
#define MAX_ERR_BODY (64u << 10) /* an error body is only read for its message */
/* Finished easy handles kept for the next request. Reuse saves the handle's
 * allocation and set-up (a large struct and its buffers) on every call; the
 * bound keeps a burst of thousands of calls from pinning their handles. */
#define EASY_POOL_MAX 64
/* Idle provider connections kept at least; see track_peak(). */
#define MIN_CACHED_CONNECTIONS 64
/* libcurl's receive buffer per transfer (its default is 16 KB; 1 KB is its
 * floor). Stream events are a few hundred bytes and usually arrive one or two
 * per read, so the floor costs nothing there; only a burst of queued events
 * takes more reads. The buffer is held by every idle stream, so its size is
 * most of an idle stream's memory (docs/benchmarks.md, bench/idle_streams.c). */
#define RECV_BUFFER_BYTES 1024L
/* libcurl 7.88 sends a request through an upload buffer of this size (64 KB
 * by default), allocated on the first send and kept until the transfer ends
 * (Curl_get_upload_buffer() in lib/transfer.c, freed in multi_done()): an
 * HTTPS/1.1 request is copied into it whole (Curl_buffer_send() in
 * lib/http.c), and an HTTP/2 body always goes out through it, in DATA frames
 * after the headers. Plain HTTP/1.1 sends a body under 64 KB with the
 * headers and never allocates it. 16 KB is the floor curl allows
 * (UPLOADBUFFER_MIN); a bigger body goes out in more sends. Once the body
 * is out, on_progress() has curl free the buffer: see there. */
#define UPLOAD_BUFFER_BYTES 16384L
/* Calls libcurl runs at once on one HTTP/2 connection (its default is 100),
 * when the server allows as many: 10,000 streams then take ten connections
 * and as many TLS handshakes. */
#define H2_STREAMS_PER_CONNECTION 1000L
/* Connections per provider host with HTTP/2 on and no cap given: 16,000
 * streams at 1,000 each. Uncapped, libcurl 7.88 gives a burst of calls added
 * before the first connection is up a connection each (369 to 3,878 for
 * 10,000 calls in the bench, and a bare client took 51 s for 10,000
 * one-second calls); with this cap 4.5 s. */
#define H2_HOST_CONNECTIONS 16L

struct llm_req {
    struct llm_client *c;
    struct llm_req *prev, *next; /* active list */
    struct llm_req *done_next;   /* aborted, waiting for on_done */
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* NULL once libcurl no longer needs it: see release_body() */
    size_t body_len;
    enum llm_op op;
    int embed_list;
    llm_delta_fn *on_delta;
    llm_done_fn *on_done;
    void *privdata;

    long status;
    int headers_done;
    int is_sse;
    int sniff; /* a 2xx chat body whose first bytes have yet to tell if it streams */
    /* Retry hints, read only after a failure and mostly absent: a heap copy
     * when the header came, else NULL. */
    char *retry_after;
    char *retry_after_ms;
    char *should_retry;
    /* The provider's rate-limit headers, kept for a call under a shared
     * limit only (NULL until one comes): remaining and reset of requests,
     * tokens, input and output tokens. */
    char (*rl)[2][4][48];
    struct sse_parser *sse;
    struct openai_stream chat;
    struct buf raw;
    /* The provider path (llm_request.provider): its answer and, for an
     * NDJSON body, the line splitter; NULL on the default fast path. */
    struct llm_stream *ps;
    struct ndjson_parser *nd;
    enum llm_framing framing;
    int is_nd;
    int fallback_left;
    const char *provider_name;
    const struct llm_prices *prices; /* borrowed: see llm_request */
    const char *model;
    unsigned long pchunks; /* provider path: frames that carried text */
    /* Phase timeouts in ms (this call's, or the client's). */
    uint32_t first_byte_ms, first_token_ms, idle_ms;
    /* Its provider's cap on calls in flight (NULL: none); while waiting
     * for room the call is in the gate's queue, not yet in the multi. */
    struct llm_gate *gate;
    struct llm_gate_node gnode; /* its place in the gate (data: the call) */
    /* Its shared limit (NULL: none): queued (lim_state LIM_QUEUED) in the
     * limit's list until granted (LIM_GRANTED), then its gate as above. */
    struct llm_limit *lim;
    struct llm_limit *counted; /* whose calls count it (llm_limit.calls) */
    struct llm_req *lim_next, *lim_prev;
    int lim_state;
    unsigned long lim_refusals; /* the limit's refusals when it was queued */
    uint64_t holder;
    long est_tokens, used_tokens;
    uint64_t renewed; /* loop ms its permit was last renewed */
    int plain_http;

    uint64_t t_start, t_headers, t_first_token;
    /* Last sign of progress: any byte of a plain body, but only a data event
     * of a stream, so a server that sends nothing but ": ping" comments
     * still trips the idle timeout. */
    uint64_t t_last_data;
    int aborted;
    int removed; /* out of the multi handle and the active list */
    int abort_code;
    int proto_error;
    /* Why an abort or a protocol error ended the transfer, and the exception
     * name an abort gave (NULL: "APIError"). Allocated only then: a healthy
     * stream does not carry message buffers around. */
    char *fail_msg;
    char *abort_exc;
    /* No CURLOPT_ERRORBUFFER: its 256 bytes would sit in every call in
     * flight for the few that fail. describe_failure() says what went wrong
     * from what libcurl keeps after the fact. */
};

struct llm_client {
    uv_loop_t *loop;
    struct llm_client_config cfg;
    CURLM *multi;
    CURLSH *share; /* TLS sessions and DNS answers, for every call */
    uv_timer_t curl_timer;
    uv_timer_t sweep_timer;
    uv_timer_t done_timer;
    int epfd;        /* libcurl's sockets: see on_sockets_ready() */
    uv_poll_t epoll; /* the loop watches that epoll set, as one descriptor */
    struct llm_req *active;
    size_t nactive;
    size_t nwaiting; /* of nactive, calls queued behind a gate or a limit */
    const struct llm_limit_ops *lops;
    void *ldata;
    uv_timer_t limit_timer;           /* asks the limits again */
    struct llm_limit *waiting_limits; /* those with calls queued */
    uint64_t next_holder;
    struct llm_req *done_head;
    int in_curl; /* inside a curl callback: aborts are deferred */
    int closing;
    int closed_handles;
    size_t peak_active; /* most requests in flight at once so far */
    size_t nsockets;    /* sockets libcurl has open (connections, and attempts) */
    CURL *pool[EASY_POOL_MAX];
    int npool;
    /* The request headers, shared by every request with the same API key
     * (libcurl only reads the list): one per operation. */
    struct curl_slist *hdrs[2];
    char *hdrs_key;
};

/* ------------------------------------------------------------ curl glue */

static void check_multi_info(struct llm_client *c);
static void gate_leave(struct llm_client *c, struct llm_req *r);
static void limit_leave(struct llm_client *c, struct llm_req *r);
static void limits_kick(struct llm_client *c, uint64_t delay_ms);

enum { LIM_NONE, LIM_QUEUED, LIM_GRANTED };

/* Events taken from the private epoll set per loop turn, at most, and the
 * time spent on them: the rest stay ready (level-triggered) for the next
 * turn, so broker, Redis and timers get their turn between batches. The time
 * bound matters when events are dear: 4,096 finished calls (results, acks,
 * events) took 100-250 ms, and a Redis broker's pops, sent between turns,
 * waited that long each (docs/benchmarks.md). The clock is read once per
 * SOCKET_EVENTS_PER_WAIT events. */
#define SOCKET_EVENTS_PER_TURN 4096
#define SOCKET_NS_PER_TURN (10 * 1000 * 1000)
#define SOCKET_EVENTS_PER_WAIT 64

/* libcurl's sockets live in an epoll set of the client's own, which the loop
 * watches as one descriptor (still on the loop's thread, never blocking: the
 * set is read with a zero timeout), instead of in one uv_poll_t each. A
 * uv_poll_t costs an allocation and several epoll_ctl() calls per call
 * (uv_poll_init() adds and removes the descriptor to check it, and each change
 * of events removes it and adds it back); in the set a socket costs one ADD
 * and one MOD per change, and nothing on close (figures: docs/benchmarks.md).
 *
 * An error or hang-up is passed on as readable and writable, as libuv does:
 * libcurl finds the error itself when it reads or writes. The event of a
 * socket closed earlier in the same batch may reach a new socket that got its
 * number; libcurl treats that like any spurious wake-up (the read or connect
 * check comes back empty). */
static void on_sockets_ready(uv_poll_t *p, int status, int events)
{
    struct llm_client *c = p->data;
    struct epoll_event ev[SOCKET_EVENTS_PER_WAIT];
    uint64_t t0 = uv_hrtime();
    int n, taken = 0;
    (void)status;
    (void)events;

    do {
        n = epoll_wait(c->epfd, ev, SOCKET_EVENTS_PER_WAIT, 0);
        for (int i = 0; i < n; i++) {
            int running;
            c->in_curl++;
            curl_multi_socket_action(c->multi, ev[i].data.fd,
                                     curl_epoll_flags(ev[i].events), &running);
            c->in_curl--;
            check_multi_info(c);
        }
        taken += n > 0 ? n : 0;
    } while (n == SOCKET_EVENTS_PER_WAIT && taken < SOCKET_EVENTS_PER_TURN &&
             uv_hrtime() - t0 < SOCKET_NS_PER_TURN);
}

/* The pointer curl keeps per socket (socketp) only says "in the set". */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct llm_client *c = userp;
    (void)easy;
    return curl_epoll_socket(c->epfd, c->multi, fd, what, socketp, c);
}

static void on_curl_timer(uv_timer_t *t)
{
    struct llm_client *c = t->data;
    int running;
    c->in_curl++;
    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    c->in_curl--;
    check_multi_info(c);
}

static int on_timer_change(CURLM *multi, long timeout_ms, void *userp)
{
    struct llm_client *c = userp;
    (void)multi;
    if (timeout_ms < 0)
        uv_timer_stop(&c->curl_timer);
    else
        uv_timer_start(&c->curl_timer, on_curl_timer, (uint64_t)timeout_ms, 0);
    return 0;
}

/* ------------------------------------------------------------- requests */

static void header_reset(struct llm_req *r)
{
    cr_free(r->retry_after);
    cr_free(r->retry_after_ms);
    cr_free(r->should_retry);
    r->retry_after = r->retry_after_ms = r->should_retry = NULL;
    if (r->rl)
        memset(r->rl, 0, sizeof(*r->rl));
    r->headers_done = 0;
}

/* Trims spaces and the line end off the header value v (*n bytes): returns
 * its new start, and *n its new length. */
static const char *trim_value(const char *v, size_t *n)
{
    while (*n && (v[*n - 1] == '\r' || v[*n - 1] == '\n' || v[*n - 1] == ' '))
        (*n)--;
    while (*n && *v == ' ') {
        v++;
        (*n)--;
    }
    return v;
}

/* Replaces *dst with a copy of the trimmed value, at most max-1 bytes as the
 * inline buffers these replaced kept, or NULL when it is empty. Out of
 * memory, the hint is dropped: the retry policy then falls back to its own
 * delay. */
static void keep_value(char **dst, size_t max, const char *v, size_t n)
{
    v = trim_value(v, &n);
    if (n >= max)
        n = max - 1;
    cr_free(*dst);
    *dst = n ? cr_strndup(v, n) : NULL;
}

/* A rate-limit header of a call under a shared limit (a copy cut at 47
 * bytes: the values are short). Out of memory: not kept, nothing held. */
static void keep_rl(struct llm_req *r, const char *name, size_t nlen, const char *v,
                    size_t n)
{
    int which, is_reset;
    char *dst;
    if (!llm_rl_header_kind(name, nlen, &which, &is_reset))
        return;
    if (!r->rl && !(r->rl = cr_calloc(1, sizeof(*r->rl))))
        return;
    v = trim_value(v, &n);
    if (n >= sizeof((*r->rl)[0][0]))
        n = sizeof((*r->rl)[0][0]) - 1;
    dst = (*r->rl)[is_reset][which];
    memcpy(dst, v, n);
    dst[n] = 0;
}

/* What the kept rate-limit headers say: ms nothing should go (0: none). */
static int64_t rl_hold(const struct llm_req *r)
{
    struct llm_rl_headers h;
    if (!r->rl)
        return 0;
    for (int i = 0; i < 4; i++) {
        h.remaining[i] = (*r->rl)[0][i][0] ? (*r->rl)[0][i] : NULL;
        h.reset[i] = (*r->rl)[1][i][0] ? (*r->rl)[1][i] : NULL;
    }
    return llm_rl_hold_ms(&h, clock_epoch_us() / 1000);
}

/* Frees our copy of the request body (the prompt, held for a whole stream
 * otherwise) once a final response has come to a request that went out whole.
 * libcurl reads the body again only to send the request again: for a
 * redirect or an authentication round (neither is enabled here) or after a
 * 417 to its own "Expect: 100-continue" (bodies over 1 MB). */
static void release_body(struct llm_req *r)
{
    curl_off_t sent = 0;
    if (!r->body || r->status == 417)
        return;
    if (curl_easy_getinfo(r->easy, CURLINFO_SIZE_UPLOAD_T, &sent) == CURLE_OK &&
        sent >= (curl_off_t)r->body_len) {
        cr_free(r->body);
        r->body = NULL;
    }
}

/* Called by libcurl after each round of work on the transfer. Once the whole
 * body is sent, setting CURLOPT_UPLOAD_BUFFERSIZE again makes libcurl free
 * the upload buffer (setopt.c: "force a realloc next opportunity"), which a
 * stream would otherwise hold, 16 KB of heap, until it ends. The same turn's
 * next call then reuses the chunk, so the heap does not grow with the calls
 * in flight. Nothing points into the buffer by then: the last send returned
 * whole (a partial one leaves the count below the total), and should libcurl
 * send the request again (a retry on a new connection) it allocates a new
 * buffer. The callback then turns itself off (CURLOPT_NOPROGRESS). */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    struct llm_req *r = ud;
    (void)dltotal;
    (void)dlnow;
    if (ultotal > 0 && ulnow >= ultotal) {
        curl_easy_setopt(r->easy, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER_BYTES);
        curl_easy_setopt(r->easy, CURLOPT_NOPROGRESS, 1L);
    }
    return 0;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ud)
{
    struct llm_req *r = ud;
    size_t n = size * nitems, vlen;
    const char *colon;

    if (n >= 5 && !memcmp(line, "HTTP/", 5)) {
        /* A new status line (100-continue, redirect): start over. */
        const char *sp = memchr(line, ' ', n);
        header_reset(r);
        r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        return n;
    }
    if (n <= 2 && (line[0] == '\r' || line[0] == '\n')) {
        if (r->status >= 200) {
            release_body(r);
            r->headers_done = 1;
            r->t_headers = uv_now(r->c->loop);
            /* A chat asks for a stream, but whether one came is read from the
             * body: a gateway may drop the Content-Type or relabel the stream
             * text/plain, and a server may ignore "stream" and answer with
             * one JSON document. So the Content-Type is not read at all. */
            r->is_sse = 0;
            r->is_nd = 0;
            r->sniff = r->op == LLM_OP_CHAT && r->status < 300 &&
                       (!r->ps || r->framing == LLM_FRAMING_SSE);
            if (r->sniff)
                r->raw.max_bytes = MAX_RAW_BODY;
            else if (r->ps && r->op == LLM_OP_CHAT && r->status < 300) {
                /* NDJSON lines are split as they come; a JSON document
                 * (not streamed) waits whole in raw. A non-streamed
                 * Ollama answer is one line, so either reads it. */
                r->is_nd = r->framing == LLM_FRAMING_NDJSON;
                r->raw.max_bytes = MAX_RAW_BODY;
            }
        }
        return n;
    }
    colon = memchr(line, ':', n);
    if (!colon)
        return n;
    vlen = n - (size_t)(colon - line) - 1;
#define IS(name)                                                                         \
    ((size_t)(colon - line) == sizeof(name) - 1 &&                                       \
     !strncasecmp(line, name, sizeof(name) - 1))
    if (IS("retry-after"))
        keep_value(&r->retry_after, 64, colon + 1, vlen);
    else if (IS("retry-after-ms"))
        keep_value(&r->retry_after_ms, 32, colon + 1, vlen);
    else if (IS("x-should-retry"))
        keep_value(&r->should_retry, 8, colon + 1, vlen);
    else if (r->lim && r->c->lops && r->c->lops->hold)
        keep_rl(r, line, (size_t)(colon - line), colon + 1, vlen);
#undef IS
    return n;
}

/* Records why a request failed (kept short; the first reason wins). */
static void set_fail(struct llm_req *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_fail(struct llm_req *r, const char *fmt, ...)
{
    va_list ap;
    if (r->fail_msg)
        return;
    r->fail_msg = cr_malloc(320);
    if (!r->fail_msg)
        return;
    va_start(ap, fmt);
    vsnprintf(r->fail_msg, 320, fmt, ap);
    va_end(ap);
}

/* A text delta read from the stream (SSE event or NDJSON line): counted,
 * the first token's time taken, handed to on_delta when notify. Returns -1
 * when on_delta aborted the request, else 0. */
static int hand_delta(struct llm_req *r, const char *delta, size_t dlen, int notify)
{
    if (!dlen)
        return 0;
    r->pchunks++;
    if (!r->t_first_token)
        r->t_first_token = r->t_last_data;
    if (notify && r->on_delta)
        r->on_delta(r, delta, dlen, r->privdata);
    return r->aborted ? -1 : 0;
}

/* Feeds n bytes of an event stream; notify: hand text deltas to on_delta.
 * Returns 0, or -1 when the stream failed (proto_error) or the request was
 * aborted from on_delta. */
static int feed_sse(struct llm_req *r, const char *ptr, size_t n, int notify)
{
    struct sse_event ev;
    struct cr_err err;
    int rc;

    if ((rc = sse_feed(r->sse, ptr, n)) < 0) {
        r->proto_error = 1;
        set_fail(r, "bad event stream: %s", cr_strerror(rc));
        return -1;
    }
    while ((rc = sse_next(r->sse, &ev)) == 1) {
        const char *delta = NULL;
        size_t dlen = 0;
        r->t_last_data = uv_now(r->c->loop);
        if (r->ps ? llm_stream_feed(
                        r->ps,
                        &(struct llm_frame){ev.type, ev.type_len, ev.data, ev.data_len},
                        &delta, &dlen, &err)
                  : openai_stream_feed(&r->chat, ev.data, ev.data_len, &delta, &dlen,
                                       &err)) {
            r->proto_error = 1;
            set_fail(r, "bad stream chunk: %s", err.msg);
            return -1;
        }
        if (hand_delta(r, delta, dlen, notify))
            return -1;
    }
    if (rc < 0) {
        r->proto_error = 1;
        set_fail(r, "bad event stream: %s", cr_strerror(rc));
        return -1;
    }
    /* A stream spends most of its life waiting for the next token: hold no
     * parser buffers meanwhile, for the price of an allocation or two per
     * read. */
    sse_parser_trim(r->sse);
    return 0;
}

/* Hands one NDJSON line (a provider's frame) on; see feed_nd(). */
static int feed_line(struct llm_req *r, const char *line, size_t len, int notify)
{
    const char *delta = NULL;
    size_t dlen = 0;
    struct cr_err err;

    r->t_last_data = uv_now(r->c->loop);
    if (llm_stream_feed(r->ps, &(struct llm_frame){NULL, 0, line, len}, &delta, &dlen,
                        &err)) {
        r->proto_error = 1;
        set_fail(r, "bad stream line: %s", err.msg);
        return -1;
    }
    return hand_delta(r, delta, dlen, notify);
}

/* Feeds n bytes of a newline-delimited JSON body (Ollama's stream); the
 * same returns as feed_sse(). */
static int feed_nd(struct llm_req *r, const char *ptr, size_t n)
{
    const char *line;
    size_t len;
    int rc;

    if ((rc = ndjson_feed(r->nd, ptr, n)) < 0) {
        r->proto_error = 1;
        set_fail(r, "bad ndjson stream: %s", cr_strerror(rc));
        return -1;
    }
    while ((rc = ndjson_next(r->nd, &line, &len)) == 1)
        if (feed_line(r, line, len, 1))
            return -1;
    if (rc < 0) {
        r->proto_error = 1;
        set_fail(r, "bad ndjson stream: %s", cr_strerror(rc));
        return -1;
    }
    return 0;
}

/* Settles a pending sniff: with at_end, the body is complete. The bytes so
 * far are in raw; a stream moves them to the SSE parser. Returns -1 when
 * the stream failed at once (see feed_sse()), else 0. */
static int settle_sniff(struct llm_req *r, int at_end, int notify)
{
    int v = sse_sniff(r->raw.data, r->raw.len, at_end);
    int rc;

    if (v < 0)
        return 0;
    r->sniff = 0;
    if (v == 0)
        return 0;
    r->is_sse = 1;
    rc = feed_sse(r, r->raw.data, r->raw.len, notify);
    buf_release(&r->raw);
    return rc;
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
    struct llm_req *r = ud;
    size_t n = size * nmemb;

    if (r->aborted)
        return 0; /* makes curl stop with CURLE_WRITE_ERROR */
    if (r->is_nd) {
        r->t_last_data = uv_now(r->c->loop);
        return feed_nd(r, ptr, n) ? 0 : n;
    }
    if (!r->is_sse) {
        r->t_last_data = uv_now(r->c->loop);
        if (buf_append(&r->raw, ptr, n)) {
            r->proto_error = 1;
            set_fail(r, "response body over %zu bytes", r->raw.max_bytes);
            return 0;
        }
        if (r->sniff && settle_sniff(r, 0, 1))
            return 0;
        return n;
    }
    return feed_sse(r, ptr, n, 1) ? 0 : n;
}

/* Keeps a finished easy handle for the next request, or frees it. It must be
 * out of the multi handle already.
 *
 * Never with HTTP/2 on: libcurl 7.88.1 (nghttp2 1.52) corrupts its heap when
 * a handle that ran a multiplexed stream is reset and added again while its
 * connection lives on. A bare libcurl client (thousands of streams at once
 * on a few connections, handles reused after curl_easy_reset()) fails in its
 * second round: "corrupted double-linked list", or nghttp2's assertion in
 * find_stream_on_goaway_func(); with a new handle per call it ran clean. The
 * worker saw the same as calls failing with "Received HTTP/0.9" (another
 * stream's bytes) and then a crash (docs/benchmarks.md, issue 18). */
static void easy_put(struct llm_client *c, CURL *e)
{
    if (!e)
        return;
    if (c->npool < EASY_POOL_MAX && !c->closing && !c->cfg.http2) {
        curl_easy_reset(e);
        c->pool[c->npool++] = e;
        return;
    }
    curl_easy_cleanup(e);
}

static void req_free(struct llm_req *r)
{
    if (r->counted)
        r->counted->calls--;
    limit_leave(r->c, r); /* its place in the limit's queue, or its permit */
    gate_leave(r->c, r);  /* its place, in the queue or in flight */
    easy_put(r->c, r->easy);
    curl_slist_free_all(r->headers);
    cr_free(r->fail_msg);
    cr_free(r->abort_exc);
    header_reset(r);
    cr_free(r->rl);
    cr_free(r->body);
    sse_parser_free(r->sse);
    ndjson_parser_free(r->nd);
    if (r->ps) {
        llm_stream_release(r->ps);
        cr_free(r->ps);
    }
    openai_stream_release(&r->chat);
    buf_release(&r->raw);
    cr_free(r);
}

static void unlink_active(struct llm_client *c, struct llm_req *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (c->active == r)
        c->active = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
    c->nactive--;
}

/* "<libcurl's words for cc>: <the system error, if any> (<host>:<port>)", as
 * in "Couldn't connect to server: Connection refused (127.0.0.1:9)". The
 * host and port, not the URL: a URL may carry a key in its query. */
static void describe_failure(struct llm_req *r, CURLcode cc, char *out, size_t n)
{
    long os_errno = 0, port = 0;
    char *url = NULL, *host = NULL;
    CURLU *u = curl_url();
    size_t len;

    curl_easy_getinfo(r->easy, CURLINFO_OS_ERRNO, &os_errno);
    curl_easy_getinfo(r->easy, CURLINFO_EFFECTIVE_URL, &url);
    snprintf(out, n, "%s", curl_easy_strerror(cc));
    len = strlen(out);
    if (os_errno && len < n)
        len += (size_t)snprintf(out + len, n - len, ": %s", strerror((int)os_errno));
    if (u && url && len < n && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
        char *ps = NULL;
        if (curl_url_get(u, CURLUPART_PORT, &ps, CURLU_DEFAULT_PORT) == CURLUE_OK)
            port = strtol(ps, NULL, 10);
        curl_free(ps);
        snprintf(out + len, n - len, " (%s:%ld)", host, port);
    }
    curl_free(host);
    curl_url_cleanup(u);
}

/* Reads what is left of a 2xx chat answer that came as frames: an SSE
 * event or NDJSON lines without their final newline, and a surrogate the
 * OpenAI reader held back. Its text is not handed to on_delta: the result
 * carries it all the same. A bad last line is a protocol error, as one
 * earlier would have been. */
static void drain(struct llm_req *r)
{
    struct sse_event ev;
    struct cr_err err;
    const char *line;
    size_t len;

    if (r->is_sse && sse_finish(r->sse, &ev) == 1) {
        if (r->ps)
            llm_stream_feed(
                r->ps, &(struct llm_frame){ev.type, ev.type_len, ev.data, ev.data_len},
                NULL, NULL, &err);
        else
            openai_stream_feed(&r->chat, ev.data, ev.data_len, NULL, NULL, &err);
    }
    if (r->is_sse && !r->ps)
        openai_stream_end(&r->chat, NULL, NULL);
    while (r->is_nd && !r->proto_error && ndjson_finish(r->nd, &line, &len) == 1)
        feed_line(r, line, len, 0);
}

/* Works out the outcome of a finished transfer (classify.h) and calls
 * on_done. */
static void finish(struct llm_client *c, struct llm_req *r, CURLcode cc)
{
    struct llm_result res;
    char msg[768], cmsg[512];
    uint64_t now = uv_now(c->loop);
    struct llm_answer a;
    struct llm_exchange x = {
        .op = r->op,
        .embed_list = r->embed_list,
        .aborted = r->aborted,
        .abort_code = r->abort_code,
        .abort_exc = r->abort_exc,
        .curl_code = (int)cc,
        .status = r->status,
        .retry_after = r->retry_after,
        .retry_after_ms = r->retry_after_ms,
        .should_retry = r->should_retry,
    };

    if (!r->aborted && cc == CURLE_OK && r->op == LLM_OP_CHAT && r->status >= 200 &&
        r->status < 300) {
        /* A body too short for the sniff to decide while it arrived. */
        if (r->sniff)
            settle_sniff(r, 1, 0);
        if (!r->proto_error)
            drain(r);
    }
    x.proto_error = r->proto_error;
    x.fail_msg = r->fail_msg;
    x.framed = r->is_sse || r->is_nd;
    x.body = r->raw.data;
    x.body_len = r->raw.len;
    if (!r->aborted && !r->proto_error && cc != CURLE_OK) {
        describe_failure(r, cc, cmsg, sizeof(cmsg));
        x.curl_msg = cmsg;
    }
    /* The clock only for a date to count from: most calls have none. */
    if (r->retry_after)
        x.now_epoch_ms = clock_epoch_us() / 1000;
    a.provider = r->ps ? r->ps->provider : &llm_provider_openai;
    a.fast = r->ps ? NULL : &r->chat;
    a.stream = r->ps;
    a.text_frames = r->pchunks;
    memset(&res, 0, sizeof(res));
    llm_outcome(&x, &a, &res, msg, sizeof(msg));
    res.provider = r->provider_name ? r->provider_name : "";
    res.fallback_left = r->fallback_left;
    res.cost_usd = -1;
    if (r->prices && r->prices->n && res.verdict == LLM_OK) {
        const struct llm_price *pr = llm_prices_pick(r->prices, r->model, res.model);
        if (r->op == LLM_OP_EMBED)
            res.cost_usd = llm_price_cost(pr, res.embed_tokens, 0, -1, -1);
        else
            res.cost_usd = llm_price_cost(pr, res.prompt_tokens, res.completion_tokens,
                                          res.cached_tokens, res.cache_write_tokens);
    }
    if (r->lim && r->lim_state == LIM_GRANTED) {
        /* One 429 (or a 503/529 naming a delay) cools the (provider, model)
         * for every call of the fleet, not only this one's retry. */
        if (res.http_status == 429 ||
            ((res.http_status == 503 || res.http_status == 529) &&
             res.retry_after_ms >= 0)) {
            int64_t ms = res.retry_after_ms >= 0 ? res.retry_after_ms : 1000;
            if (now + (uint64_t)(ms > 0 ? ms : 1) > r->lim->cool_until)
                r->lim->cool_until = now + (uint64_t)(ms > 0 ? ms : 1);
            c->lops->cool(c, r->lim, ms, c->ldata);
            /* Its waiting calls with a fallback go there now. */
            limits_kick(c, 0);
        }
        /* Remaining 0 until a reset: the provider's own word on its limit,
         * which may be tighter than ours (another client on its account). */
        if (c->lops->hold) {
            int64_t hold = rl_hold(r);
            if (hold > 0)
                c->lops->hold(c, r->lim, hold, c->ldata);
        }
        if (res.verdict == LLM_OK)
            r->used_tokens = r->op == LLM_OP_EMBED ? res.embed_tokens
                             : res.total_tokens >= 0
                                 ? res.total_tokens
                                 : (res.prompt_tokens >= 0 && res.completion_tokens >= 0
                                        ? res.prompt_tokens + res.completion_tokens
                                        : -1);
    }
    res.elapsed_s = (double)(now - r->t_start) / 1000.0;
    res.ttft_s = r->t_first_token ? (double)(r->t_first_token - r->t_start) / 1000.0 : -1;
    /* Every failure text passes here, whatever its source (error body, stream
     * error, curl, abort), on its way to logs, results and events. */
    redact_str(c->cfg.secrets, msg);
    res.message = msg;
    r->on_done(r, &res, r->privdata);
    cJSON_Delete(res.embedding);
    req_free(r);
}

static void check_multi_info(struct llm_client *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        struct llm_req *r;
        if (m->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        {
            CURLcode cc = m->data.result;
            curl_multi_remove_handle(c->multi, r->easy);
            unlink_active(c, r);
            r->removed = 1;
            /* An abort from inside a callback already queued it for on_done. */
            if (!r->aborted)
                finish(c, r, cc);
        }
    }
}

static void on_done_timer(uv_timer_t *t)
{
    struct llm_client *c = t->data;
    while (c->done_head) {
        struct llm_req *r = c->done_head;
        c->done_head = r->done_next;
        if (!r->removed) {
            curl_multi_remove_handle(c->multi, r->easy);
            unlink_active(c, r);
            r->removed = 1;
        }
        finish(c, r, CURLE_ABORTED_BY_CALLBACK);
    }
}

/* Marks r aborted with this code, exception name and message (NULL: the
 * defaults); the caller takes it out of the transfer. */
static void mark_aborted(struct llm_req *r, int code, const char *exc_type,
                         const char *message)
{
    r->aborted = 1;
    r->abort_code = code;
    exc_type = exc_type ? exc_type : "APIError";
    cr_free(r->abort_exc);
    r->abort_exc = cr_strndup(exc_type, strnlen(exc_type, 47)); /* NULL: "APIError" */
    /* An earlier protocol error's message would otherwise win. */
    cr_free(r->fail_msg);
    r->fail_msg = NULL;
    set_fail(r, "%s", message ? message : "aborted");
}

void llm_req_abort(struct llm_req *r, int code, const char *exc_type, const char *message)
{
    struct llm_client *c = r->c;
    if (r->aborted)
        return;
    /* A queued call must not start once aborted. One in flight keeps its
     * place until its transfer is out (req_free()). */
    if (r->gnode.state == LLM_GATE_WAITING)
        gate_leave(c, r);
    if (r->lim_state == LIM_QUEUED)
        limit_leave(c, r);
    mark_aborted(r, code, exc_type, message);
    /* libcurl forbids removing a handle from inside its callbacks, so inside
     * one we only mark the request (its write callback then fails the
     * transfer) and the 0 ms timer removes it. */
    if (!c->in_curl) {
        curl_multi_remove_handle(c->multi, r->easy);
        unlink_active(c, r);
        r->removed = 1;
    }
    r->done_next = c->done_head;
    c->done_head = r;
    uv_timer_start(&c->done_timer, on_done_timer, 0, 0);
}

static void on_sweep(uv_timer_t *t)
{
    struct llm_client *c = t->data;
    uint64_t now = uv_now(c->loop);
    struct llm_req *r, *next;
    char msg[128];

    for (r = c->active; r; r = next) {
        next = r->next;
        if (r->aborted || r->gnode.state == LLM_GATE_WAITING ||
            r->lim_state == LIM_QUEUED)
            continue; /* a queued call's timeouts start with its transfer */
        if (r->lim_state == LIM_GRANTED && r->lim->cfg->concurrency > 0 &&
            now - r->renewed >= (uint64_t)r->lim->cfg->lease_ms / 3) {
            r->renewed = now;
            c->lops->renew(c, r->lim, r->holder, c->ldata);
        }
        if (!r->headers_done) {
            if (now - r->t_start > r->first_byte_ms) {
                snprintf(msg, sizeof(msg), "no response within %gs (first-byte timeout)",
                         r->first_byte_ms / 1000.0);
                llm_req_abort(r, CR_ETIMEDOUT, "APITimeoutError", msg);
            }
            continue;
        }
        if ((r->is_sse || r->sniff || r->is_nd) && !r->t_first_token) {
            /* Prefill may legitimately be long and send only pings: until the
             * first token only the first-token timeout applies. */
            if (now - r->t_headers > r->first_token_ms) {
                snprintf(msg, sizeof(msg), "no token within %gs (first-token timeout)",
                         r->first_token_ms / 1000.0);
                llm_req_abort(r, CR_ETIMEDOUT, "APITimeoutError", msg);
            }
            continue;
        }
        {
            uint64_t last = r->t_last_data > r->t_headers ? r->t_last_data : r->t_headers;
            if (now - last > r->idle_ms) {
                snprintf(msg, sizeof(msg), "no data for %gs (idle timeout)",
                         r->idle_ms / 1000.0);
                llm_req_abort(r, CR_ETIMEDOUT, "APITimeoutError", msg);
            }
        }
    }
    if (!c->active)
        uv_timer_stop(&c->sweep_timer);
}

/* Builds the request headers for one operation and API key. Returns a new
 * list, or NULL when out of memory. */
static struct curl_slist *build_headers(enum llm_op op, const char *api_key,
                                        const char *const *extra)
{
    struct curl_slist *list = NULL, *h;
    char auth[512];

    h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h)
        list = h;
    /* An empty Expect: stops libcurl from waiting for 100-continue. */
    h = h ? curl_slist_append(list, "Expect:") : NULL;
    if (h && op == LLM_OP_CHAT)
        h = curl_slist_append(list, "Accept: text/event-stream");
    if (h && api_key && *api_key) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
        h = curl_slist_append(list, auth);
    }
    for (; h && extra && *extra; extra++)
        h = curl_slist_append(list, *extra);
    if (!h) {
        curl_slist_free_all(list);
        return NULL;
    }
    return list;
}

/* The shared header list for this operation and key, built on first use;
 * NULL when the key differs from the shared one (or out of memory), and the
 * caller then builds its own. One worker has one key, so in practice every
 * request shares. */
static struct curl_slist *shared_headers(struct llm_client *c, enum llm_op op,
                                         const char *api_key)
{
    const char *key = api_key ? api_key : "";
    int i = op == LLM_OP_CHAT ? 0 : 1;
    if (!c->hdrs_key) {
        c->hdrs_key = cr_strdup(key);
        if (!c->hdrs_key)
            return NULL;
    }
    if (strcmp(c->hdrs_key, key))
        return NULL;
    if (!c->hdrs[i])
        c->hdrs[i] = build_headers(op, key, c->cfg.headers);
    return c->hdrs[i];
}

/* RFC 9110 token characters. */
static int is_tchar(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch >= '0' && ch <= '9') || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

int llm_header_check(const char *line, struct cr_err *err)
{
    const char *colon = strchr(line, ':');
    size_t i, n;

    if (strpbrk(line, "\r\n"))
        return cr_err_set(err, CR_EINVAL, "invalid --llm-header: contains CR or LF");
    if (!colon)
        return cr_err_set(err, CR_EINVAL, "invalid --llm-header: want 'Name: value'");
    n = (size_t)(colon - line);
    if (n == 0)
        return cr_err_set(err, CR_EINVAL, "invalid --llm-header: empty header name");
    for (i = 0; i < n; i++)
        if (!is_tchar((unsigned char)line[i]))
            return cr_err_set(err, CR_EINVAL, "invalid --llm-header name '%.*s'",
                              (int)(n > 64 ? 64 : n), line);
    return 0;
}

/* libcurl keeps idle connections up to CURLMOPT_MAXCONNECTS, by default four
 * per easy handle currently added. Between two bursts that can fall to zero,
 * and then every connection is closed and the next burst connects again. So
 * the cache
 * follows the most calls ever in flight instead, unless a cap was set. */
static void track_peak(struct llm_client *c)
{
    size_t running = c->nactive - c->nwaiting; /* queued calls hold no connection */
    if (running <= c->peak_active)
        return;
    c->peak_active = running;
    if (c->cfg.max_connections <= 0 && c->peak_active > MIN_CACHED_CONNECTIONS)
        curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)c->peak_active);
}

/* libcurl opens and closes its sockets through these, so the client knows how
 * many connections are open (see no_idle_connection()). */
static curl_socket_t on_open_socket(void *clientp, curlsocktype purpose,
                                    struct curl_sockaddr *addr)
{
    struct llm_client *c = clientp;
    curl_socket_t fd;
    (void)purpose;
    fd = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd != CURL_SOCKET_BAD)
        c->nsockets++;
    return fd;
}

static int on_close_socket(void *clientp, curl_socket_t fd)
{
    struct llm_client *c = clientp;
    c->nsockets--;
    return close(fd);
}

/* Whether a new plain-HTTP call certainly finds no idle connection to reuse:
 * HTTP/1.1 runs one call per connection, so when there are no more sockets
 * than calls in flight, every connection is busy. libcurl 7.88 would still
 * look at each of them before connecting (ConnectionExists walks every
 * connection to the host), which is O(calls in flight) per call, a large share
 * of the worker's CPU with thousands of streams. Over HTTPS the
 * search stays, as HTTP/2 can multiplex calls on a busy connection. */
static int no_idle_connection(const struct llm_client *c, int plain_http)
{
    return c->nsockets <= c->nactive - c->nwaiting && plain_http;
}

/* Whether a call's connection (new or reused) is kept for reuse when the call
 * ends. libcurl 7.88 walks its connection cache from the oldest connection on
 * every curl_multi_remove_handle() until it meets the one the call used
 * (close_connect_only() in lib/multi.c), so with thousands of connections
 * kept each finished call walks half of them. Past keep_connections calls in
 * flight, a plain-HTTP call closes its connection when done
 * (CURLOPT_FORBID_REUSE): a connect per call, which costs the same at any
 * size, against a walk that grows with every connection kept (figures:
 * docs/benchmarks.md). Any call, not only one that connected: a reused or
 * searched-then-new connection kept past the limit grows the set all the same
 * when calls overlap in waves. HTTPS keeps its connections, for HTTP/2 and
 * TLS reuse. */
static int keep_connection(const struct llm_client *c, int plain_http)
{
    /* Calls in flight rather than sockets: libcurl opens a call's socket
     * only on its next turn, so a burst submitted in one go would all see
     * the same socket count. */
    return !plain_http || c->nactive - c->nwaiting < (size_t)c->cfg.keep_connections;
}

/* Adds r's transfer to the multi handle: from submit, or when its gate
 * lets it go. Returns 0 or -1 (out of memory). */
static int start_transfer(struct llm_client *c, struct llm_req *r)
{
    curl_easy_setopt(r->easy, CURLOPT_FRESH_CONNECT,
                     (long)no_idle_connection(c, r->plain_http));
    curl_easy_setopt(r->easy, CURLOPT_FORBID_REUSE,
                     (long)!keep_connection(c, r->plain_http));
    if (curl_multi_add_handle(c->multi, r->easy) != CURLM_OK)
        return -1;
    r->t_start = uv_now(c->loop);
    return 0;
}

/* r leaves its gate, if it has one: out of the queue (cancelled before it
 * started), or its place in flight handed to the calls queued behind it, in
 * order. It starts transfers, which libcurl forbids inside its callbacks, so
 * it is called from req_free() (never inside one), and from llm_req_abort()
 * only for a call still queued: a queue is non-empty only while its gate is
 * full, and a queued call leaving makes no room, so nothing starts then. A
 * call that cannot start (out of memory) ends with its on_done from the loop. */
static void gate_leave(struct llm_client *c, struct llm_req *r)
{
    struct llm_gate *g = r->gate;
    struct llm_gate_node *n;

    if (!g)
        return;
    if (r->gnode.state == LLM_GATE_WAITING)
        c->nwaiting--;
    llm_gate_leave(g, &r->gnode);
    if (c->closing)
        return; /* llm_client_free() ends every call, the queued ones too */
    while ((n = llm_gate_next(g))) {
        struct llm_req *q = n->data;
        c->nwaiting--;
        if (start_transfer(c, q)) {
            llm_gate_leave(g, n);
            llm_req_abort(q, CR_ENOMEM, "APIError", "out of memory starting the call");
        }
    }
}

/* r may go as far as its limits say: into its gate (queued there when the
 * gate is full) or on the wire. Returns 0 or -1 (out of memory). */
static int begin(struct llm_client *c, struct llm_req *r)
{
    if (r->gate && !llm_gate_enter(r->gate, &r->gnode)) {
        /* No room: queued, started when one of the provider's calls ends. */
        c->nwaiting++;
        return 0;
    }
    return start_transfer(c, r);
}

/* ------------------------------------------------------- shared limits */

static void on_limit_timer(uv_timer_t *t);

/* The limits are asked from the timer, never from the call that queued a
 * request (an owner may answer at once, and starting a transfer there would
 * run before submit returned). */
static void limits_kick(struct llm_client *c, uint64_t delay_ms)
{
    if (!c->closing)
        uv_timer_start(&c->limit_timer, on_limit_timer, delay_ms, 0);
}

static void limit_enqueue(struct llm_client *c, struct llm_req *r)
{
    struct llm_limit *lim = r->lim;
    r->lim_state = LIM_QUEUED;
    r->lim_refusals = lim->refusals;
    r->lim_next = NULL;
    r->lim_prev = lim->tail;
    if (lim->tail)
        lim->tail->lim_next = r;
    else
        lim->head = r;
    lim->tail = r;
    c->nwaiting++;
    if (!lim->listed) {
        lim->listed = 1;
        lim->next_waiting = c->waiting_limits;
        c->waiting_limits = lim;
    }
    limits_kick(c, 0);
}

/* r leaves its limit: out of the queue (aborted while waiting), or, once
 * granted, its permit given back and its tokens corrected. */
static void limit_leave(struct llm_client *c, struct llm_req *r)
{
    struct llm_limit *lim = r->lim;
    if (r->lim_state == LIM_QUEUED) {
        if (r->lim_prev)
            r->lim_prev->lim_next = r->lim_next;
        else
            lim->head = r->lim_next;
        if (r->lim_next)
            r->lim_next->lim_prev = r->lim_prev;
        else
            lim->tail = r->lim_prev;
        r->lim_next = r->lim_prev = NULL;
        c->nwaiting--;
    } else if (r->lim_state == LIM_GRANTED) {
        c->lops->done(c, lim, r->holder, r->est_tokens, r->used_tokens, c->ldata);
        /* A permit of ours is free: the next call need not wait for its
         * retry time to learn it. */
        if (lim->cfg->concurrency > 0 && lim->head && !lim->asking) {
            lim->retry_at = 0;
            limits_kick(c, 0);
        }
    }
    r->lim_state = LIM_NONE;
}

static int cool_only(const struct lim_config *cfg)
{
    return cfg->rpm <= 0 && cfg->tpm <= 0 && cfg->concurrency <= 0;
}

/* lim is cooled: its waiting calls that have a fallback end now, unsent,
 * for the caller to move them on (llm_client_limits_changed()). */
static void cooled_to_fallbacks(struct llm_limit *lim, uint64_t now)
{
    struct llm_req *r, *next;
    char msg[320];

    for (r = lim->head; r; r = next) {
        next = r->lim_next;
        if (!r->fallback_left)
            continue;
        snprintf(msg, sizeof(msg),
                 "%.192s is cooled by the provider for %llu ms more: not sent, "
                 "going to its fallback",
                 lim->key, (unsigned long long)(lim->cool_until - now));
        llm_req_abort(r, CR_ECOOLED, "RateLimitError", msg);
    }
}

static void on_limit_timer(uv_timer_t *t)
{
    struct llm_client *c = t->data;
    uint64_t now = uv_now(c->loop), next = UINT64_MAX;
    struct llm_limit **pp = &c->waiting_limits, *lim;

    while ((lim = *pp)) {
        if (lim->head && lim->cool_until > now)
            cooled_to_fallbacks(lim, now);
        if (!lim->head && !lim->asking) {
            *pp = lim->next_waiting; /* nothing waits: off the list */
            lim->listed = 0;
            continue;
        }
        pp = &lim->next_waiting;
        if (lim->asking || !lim->head)
            continue;
        if (cool_only(lim->cfg)) {
            /* Nothing to ask the owner: only cooling holds these calls, and
             * every one goes when it ends. */
            if (lim->cool_until > now) {
                if (lim->cool_until < next)
                    next = lim->cool_until;
                continue;
            }
            while (lim->head && !c->closing) {
                lim->asking = 1;
                lim->ask_holder = lim->head->holder;
                lim->ask_tokens = 0;
                llm_client_limit_answer(c, lim, 1, 0);
            }
            continue;
        }
        if (lim->retry_at > now) {
            if (lim->retry_at < next)
                next = lim->retry_at;
            continue;
        }
        lim->asking = 1;
        lim->ask_holder = lim->head->holder;
        lim->ask_tokens = lim->head->est_tokens;
        /* Held back once at least while it waited: a wait to count. */
        lim->ask_waited_ms = 0;
        if (lim->head->lim_refusals != lim->refusals)
            lim->ask_waited_ms =
                now > lim->head->t_start ? (int64_t)(now - lim->head->t_start) : 1;
        c->lops->ask(c, lim, lim->ask_tokens, lim->ask_holder, c->ldata);
        /* An answer from inside ask() kicked the timer again. */
    }
    if (next != UINT64_MAX && !uv_is_active((uv_handle_t *)&c->limit_timer))
        limits_kick(c, next - now);
}

void llm_client_limits_changed(struct llm_client *c)
{
    if (c->waiting_limits)
        limits_kick(c, 0);
}

uint64_t llm_client_now(const struct llm_client *c)
{
    return uv_now(c->loop);
}

void llm_client_set_limits(struct llm_client *c, const struct llm_limit_ops *ops,
                           void *data)
{
    c->lops = ops;
    c->ldata = data;
}

void llm_client_limit_answer(struct llm_client *c, struct llm_limit *lim, int granted,
                             int64_t wait_ms)
{
    struct llm_req *r;

    lim->asking = 0;
    if (c->closing)
        return;
    if (!granted) {
        lim->refusals++;
        lim->retry_at = uv_now(c->loop) + (uint64_t)(wait_ms > 0 ? wait_ms : 1);
        limits_kick(c, 0);
        return;
    }
    lim->retry_at = 0;
    for (r = lim->head; r && r->holder != lim->ask_holder; r = r->lim_next)
        ;
    if (!r) {
        /* Its call was aborted while the question was out. */
        c->lops->done(c, lim, lim->ask_holder, lim->ask_tokens, 0, c->ldata);
    } else {
        limit_leave(c, r); /* out of the queue */
        r->lim_state = LIM_GRANTED;
        r->renewed = uv_now(c->loop);
        r->t_start = r->renewed;
        if (begin(c, r))
            llm_req_abort(r, CR_ENOMEM, "APIError", "out of memory starting the call");
    }
    limits_kick(c, 0);
}

/* A phase timeout in ms: this call's when given, else the client's. */
static uint32_t timeout_ms(double own_s, double client_s)
{
    double s = own_s > 0 ? own_s : client_s;
    if (s <= 0)
        s = 1e6; /* no limit given: effectively none */
    return s * 1000 > 4e9 ? 4000000000u : (uint32_t)(s * 1000);
}

/* Appends n lines to list; NULL (list freed) when out of memory, or when
 * list is NULL already (an earlier append failed). */
static struct curl_slist *add_lines(struct curl_slist *list, const char *const *lines,
                                    size_t n)
{
    struct curl_slist *h = list;
    for (size_t i = 0; h && i < n; i++)
        h = curl_slist_append(list, lines[i]);
    if (!h) {
        curl_slist_free_all(list);
        return NULL;
    }
    return list;
}

/* A provider call's own header list: the empty Expect, its lines, and the
 * call's trace lines. */
static struct curl_slist *request_headers(const struct llm_request *rq)
{
    struct curl_slist *list = curl_slist_append(NULL, "Expect:");
    list = add_lines(list, rq->headers, rq->nheaders);
    return add_lines(list, rq->trace_headers, rq->ntrace_headers);
}

/* The options of one transfer on r's easy handle (new, or reset from the
 * pool): where and what to send, the callbacks, the socket and buffer
 * settings, the phase timeout libcurl enforces itself. */
static void easy_setup(struct llm_client *c, struct llm_req *r,
                       const struct llm_request *rq, struct curl_slist *hdrs)
{
    curl_easy_setopt(r->easy, CURLOPT_URL, rq->url);
    curl_easy_setopt(r->easy, CURLOPT_POST, 1L);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE, (long)rq->body_len);
    curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(r->easy, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)timeout_ms(rq->connect_timeout_s, c->cfg.connect_timeout_s));
    curl_easy_setopt(r->easy, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(r->easy, CURLOPT_TCP_KEEPIDLE, 60L);
    curl_easy_setopt(r->easy, CURLOPT_TCP_KEEPINTVL, 60L);
    curl_easy_setopt(r->easy, CURLOPT_BUFFERSIZE, RECV_BUFFER_BYTES);
    curl_easy_setopt(r->easy, CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUFFER_BYTES);
    curl_easy_setopt(r->easy, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(r->easy, CURLOPT_XFERINFODATA, r);
    curl_easy_setopt(r->easy, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(r->easy, CURLOPT_OPENSOCKETDATA, c);
    curl_easy_setopt(r->easy, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
    curl_easy_setopt(r->easy, CURLOPT_CLOSESOCKETDATA, c);
    /* HTTPS: HTTP/2 where the server offers it, a new call waiting for a
     * connection being set up to multiplex on it rather than opening one
     * of its own, and the TLS session resumed on a new connection. */
    curl_easy_setopt(r->easy, CURLOPT_HTTP_VERSION,
                     c->cfg.http2 ? (long)CURL_HTTP_VERSION_2TLS
                                  : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(r->easy, CURLOPT_PIPEWAIT, (long)!!c->cfg.http2);
    if (c->share)
        curl_easy_setopt(r->easy, CURLOPT_SHARE, c->share);
    if (c->cfg.ca_file && *c->cfg.ca_file)
        curl_easy_setopt(r->easy, CURLOPT_CAINFO, c->cfg.ca_file);
}

/* The provider path's reader (rq->provider): its answer, the NDJSON
 * splitter its framing may need, and its own header lines. Returns the
 * header list, or NULL when out of memory. */
static struct curl_slist *provider_reader(struct llm_req *r, const struct llm_request *rq)
{
    r->ps = cr_malloc(sizeof(*r->ps));
    if (!r->ps)
        return NULL;
    if (llm_stream_init(r->ps, rq->provider, rq->op)) {
        cr_free(r->ps);
        r->ps = NULL;
        return NULL;
    }
    r->ps->reply.max_content_bytes = MAX_RAW_BODY;
    if (rq->framing == LLM_FRAMING_NDJSON && !(r->nd = ndjson_parser_new(0)))
        return NULL;
    r->headers = request_headers(rq);
    return r->headers;
}

struct llm_req *llm_client_submit(struct llm_client *c, const struct llm_request *rq,
                                  llm_delta_fn *on_delta, llm_done_fn *on_done,
                                  void *privdata, struct cr_err *err)
{
    struct llm_req *r = cr_calloc(1, sizeof(*r));
    struct curl_slist *hdrs;
    if (!r) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    r->c = c;
    r->op = rq->op;
    r->embed_list = rq->embed_list;
    r->on_delta = on_delta;
    r->on_done = on_done;
    r->privdata = privdata;
    r->first_byte_ms = timeout_ms(rq->first_byte_timeout_s, c->cfg.first_byte_timeout_s);
    r->first_token_ms =
        timeout_ms(rq->first_token_timeout_s, c->cfg.first_token_timeout_s);
    r->idle_ms = timeout_ms(rq->idle_timeout_s, c->cfg.idle_timeout_s);
    r->framing = rq->framing;
    r->provider_name = rq->provider_name;
    r->fallback_left = rq->fallback_left;
    r->prices = rq->prices;
    r->model = rq->model;
    openai_stream_init(&r->chat);
    buf_init(&r->raw);
    r->raw.max_bytes = rq->op == LLM_OP_EMBED ? MAX_RAW_BODY : MAX_ERR_BODY;
    r->body = cr_strndup(rq->body, rq->body_len);
    r->body_len = rq->body_len;
    r->easy = c->npool ? c->pool[--c->npool] : curl_easy_init();
    if (rq->op == LLM_OP_CHAT)
        r->sse = sse_parser_new(0);
    if (!r->body || !r->easy || (rq->op == LLM_OP_CHAT && !r->sse))
        goto oom;
    if (rq->provider) {
        if (!(hdrs = provider_reader(r, rq)))
            goto oom;
    } else if (rq->ntrace_headers || !(hdrs = shared_headers(c, rq->op, rq->api_key))) {
        r->headers = build_headers(rq->op, rq->api_key, c->cfg.headers);
        if (r->headers && rq->ntrace_headers)
            r->headers = add_lines(r->headers, rq->trace_headers, rq->ntrace_headers);
        if (!r->headers)
            goto oom;
        hdrs = r->headers;
    }
    easy_setup(c, r, rq, hdrs);
    r->plain_http = !strncmp(rq->url, "http://", 7);
    r->gate = rq->gate && rq->gate->cap > 0 ? rq->gate : NULL;
    r->gnode.data = r;
    r->used_tokens = -1;
    r->t_start = uv_now(c->loop);
    if (rq->limit) {
        r->counted = rq->limit;
        rq->limit->calls++;
    }
    if (rq->limit && c->lops) {
        r->lim = rq->limit;
        r->holder = ++c->next_holder;
        r->est_tokens =
            llm_limits_estimate(rq->body, rq->body_len, rq->op == LLM_OP_CHAT);
        limit_enqueue(c, r);
    } else if (begin(c, r)) {
        goto oom;
    }
    r->next = c->active;
    if (c->active)
        c->active->prev = r;
    c->active = r;
    c->nactive++;
    track_peak(c);
    if (!uv_is_active((uv_handle_t *)&c->sweep_timer))
        uv_timer_start(&c->sweep_timer, on_sweep, SWEEP_MS, SWEEP_MS);
    return r;
oom:
    req_free(r);
    cr_err_set(err, CR_ENOMEM, "out of memory");
    return NULL;
}

const char *llm_req_text(const struct llm_req *r, size_t *len)
{
    const struct buf *b = r->ps ? &r->ps->reply.content : &r->chat.content;
    if (len)
        *len = b->len;
    return b->data ? b->data : "";
}

size_t llm_client_active(const struct llm_client *c)
{
    return c->nactive;
}

struct llm_client *llm_client_new(uv_loop_t *loop, const struct llm_client_config *cfg,
                                  struct cr_err *err)
{
    struct llm_client *c = cr_calloc(1, sizeof(*c));
    int rc;
    if (!c) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    c->loop = loop;
    c->cfg = *cfg;
    c->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (c->epfd < 0) {
        cr_err_set(err, CR_EIO, "cannot create an epoll set: %s", strerror(errno));
        cr_free(c);
        return NULL;
    }
    c->multi = curl_multi_init();
    if (!c->multi) {
        close(c->epfd);
        cr_free(c);
        cr_err_set(err, CR_ENOMEM, "cannot create curl multi handle");
        return NULL;
    }
    /* First of the handles: a failure here leaves none to close. */
    rc = uv_poll_init(loop, &c->epoll, c->epfd);
    if (rc != 0) {
        curl_multi_cleanup(c->multi);
        close(c->epfd);
        cr_free(c);
        cr_err_set(err, CR_EIO, "cannot watch the epoll set: %s", uv_strerror(rc));
        return NULL;
    }
    c->epoll.data = c;
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer_change);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    if (cfg->max_connections > 0) {
        curl_multi_setopt(c->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, cfg->max_connections);
        curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, cfg->max_connections);
    } else {
        curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)MIN_CACHED_CONNECTIONS);
    }
    /* Many calls per HTTP/2 connection (the server's own limit applies
     * too), so thousands of streams need a few connections. */
    curl_multi_setopt(c->multi, CURLMOPT_PIPELINING,
                      c->cfg.http2 ? (long)CURLPIPE_MULTIPLEX : (long)CURLPIPE_NOTHING);
    curl_multi_setopt(c->multi, CURLMOPT_MAX_CONCURRENT_STREAMS,
                      H2_STREAMS_PER_CONNECTION);
    if (c->cfg.http2 && cfg->max_connections <= 0) {
        curl_multi_setopt(c->multi, CURLMOPT_MAX_HOST_CONNECTIONS, H2_HOST_CONNECTIONS);
        log_write(LOG_INFO,
                  "llm: HTTP/2 without a connection cap: at most %ld connections per "
                  "provider host (--llm-max-connections sets a cap of its own)",
                  H2_HOST_CONNECTIONS);
    }
    /* Without a share each call keeps its own TLS session cache, and a new
     * connection is a full handshake. Loop thread only: no locks needed. */
    c->share = curl_share_init();
    if (c->share) {
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    }
    uv_timer_init(loop, &c->curl_timer);
    c->curl_timer.data = c;
    uv_timer_init(loop, &c->sweep_timer);
    c->sweep_timer.data = c;
    uv_timer_init(loop, &c->done_timer);
    c->done_timer.data = c;
    uv_timer_init(loop, &c->limit_timer);
    c->limit_timer.data = c;
    uv_poll_start(&c->epoll, UV_READABLE, on_sockets_ready);
    return c;
}

static void on_client_handle_closed(uv_handle_t *h)
{
    struct llm_client *c = h->data;
    if (++c->closed_handles < 5)
        return;
    close(c->epfd);
    cr_free(c);
}

void llm_client_free(struct llm_client *c)
{
    if (!c)
        return;
    c->closing = 1;
    while (c->active) {
        struct llm_req *r = c->active;
        curl_multi_remove_handle(c->multi, r->easy);
        unlink_active(c, r);
        r->removed = 1;
        if (r->aborted)
            continue; /* already on the done list */
        mark_aborted(r, CR_ECANCELED, "WorkerShutdown", "worker is shutting down");
        finish(c, r, CURLE_ABORTED_BY_CALLBACK);
    }
    on_done_timer(&c->done_timer);
    while (c->npool)
        curl_easy_cleanup(c->pool[--c->npool]);
    curl_multi_cleanup(c->multi);
    if (c->share)
        curl_share_cleanup(c->share);
    curl_slist_free_all(c->hdrs[0]);
    curl_slist_free_all(c->hdrs[1]);
    cr_free(c->hdrs_key);
    uv_close((uv_handle_t *)&c->curl_timer, on_client_handle_closed);
    uv_close((uv_handle_t *)&c->sweep_timer, on_client_handle_closed);
    uv_close((uv_handle_t *)&c->done_timer, on_client_handle_closed);
    uv_close((uv_handle_t *)&c->limit_timer, on_client_handle_closed);
    uv_close((uv_handle_t *)&c->epoll, on_client_handle_closed);
}
