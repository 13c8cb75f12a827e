/* gw_server.c -- libwebsockets on the libuv loop: HTTP transactions and
 * WebSocket write queues (see gw_server.h). The lws callback is a switch
 * that moves bytes and calls the handlers; it decides nothing. */
#include "gw_server.h"

#include <libwebsockets.h>
#include <stdio.h>
#include <string.h>

#include "net/listener.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

#define CHUNK 16384             /* bytes of an HTTP body written per writable event */
#define DISCARD_MAX (16u << 20) /* oversize bodies up to this are read, then 413 */
/* lws 4.1 frames a write of this kind as a close (its private
 * LWS_WRITE_CLOSE: the public header leaves it to lws_close_reason()). */
#define WRITE_CLOSE ((enum lws_write_protocol)4)

struct frame {
    struct frame *next;
    size_t len;
    unsigned char data[]; /* LWS_PRE bytes, then the payload */
};

struct gw_conn {
    struct gw_server *srv;
    struct lws *wsi; /* NULL once the peer is gone */
    int refs;
    int ws_open; /* on_ws_open was called, on_ws_close not yet */
    void *data;
    char method[8];
    char *path, *query, *auth, *origin, *ctype;
    char *traceparent, *tracestate; /* the caller's W3C context, or NULL */
    struct buf body;
    int too_big;         /* body over max_body_bytes: dropped, 413 */
    int length_required; /* a body without Content-Length (chunked): 411 */
    /* HTTP response */
    int responded;
    int status;
    char resp_type[64];
    struct buf resp;
    size_t sent;
    int headers_done;
    /* WebSocket */
    struct frame *qhead, *qtail;
    size_t qbytes;
    int closing;
    int close_sent; /* the close frame is written: the next writable ends it */
    int close_status;
    char close_reason[64];
};

struct pss {
    struct gw_conn *c;
};

/* One accepted connection, from its accept to its end (lws's opaque user
 * data of the wsi, which unlike the per-session memory exists from the
 * accept on). Untrusted ones are in the server's list, oldest first. */
struct peer {
    struct peer *prev, *next;
    struct lws *wsi;
    int listed; /* in the untrusted list */
};

struct gw_server {
    uv_loop_t *loop;
    struct lws_context *ctx;
    struct lws_vhost *vh;
    struct listener *listener; /* ours, not lws's: see net/listener.h */
    struct lws_protocols protocols[2];
    const struct gw_server_config *cfg;
    const struct gw_server_handlers *h;
    void *privdata;
    int port;
    size_t nws;
    struct peer *uhead, *utail; /* untrusted connections, oldest first */
    size_t nuntrusted, nevicted;
};

/* --------------------------------------------------------------- peers */

static void peer_unlist(struct gw_server *srv, struct peer *p)
{
    if (!p->listed)
        return;
    if (p->prev)
        p->prev->next = p->next;
    else
        srv->uhead = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        srv->utail = p->prev;
    p->prev = p->next = NULL;
    p->listed = 0;
    srv->nuntrusted--;
}

/* A new connection: untrusted until it carries an authorized request. Past
 * max_untrusted the oldest untrusted one goes, so that idle or trickling
 * connections cannot hold every slot while new clients wait. */
static int peer_new(struct gw_server *srv, struct lws *wsi)
{
    struct peer *p = cr_calloc(1, sizeof(*p));
    if (!p)
        return -1;
    p->wsi = wsi;
    p->listed = 1;
    p->prev = srv->utail;
    if (srv->utail)
        srv->utail->next = p;
    else
        srv->uhead = p;
    srv->utail = p;
    srv->nuntrusted++;
    lws_set_opaque_user_data(wsi, p);
    if (srv->cfg->max_untrusted && srv->nuntrusted > srv->cfg->max_untrusted) {
        struct peer *old = srv->uhead;
        peer_unlist(srv, old);
        srv->nevicted++;
        lws_set_timeout(old->wsi, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    }
    return 0;
}

static void peer_free(struct gw_server *srv, struct lws *wsi)
{
    struct peer *p = lws_get_opaque_user_data(wsi);
    if (!p)
        return;
    lws_set_opaque_user_data(wsi, NULL);
    peer_unlist(srv, p);
    cr_free(p);
}

void gw_conn_trust(struct gw_conn *c)
{
    struct peer *p = c->wsi ? lws_get_opaque_user_data(c->wsi) : NULL;
    if (p)
        peer_unlist(c->srv, p);
}

size_t gw_server_untrusted(const struct gw_server *srv)
{
    return srv->nuntrusted;
}

size_t gw_server_evicted(const struct gw_server *srv)
{
    return srv->nevicted;
}

/* --------------------------------------------------------------- conns */

static struct gw_conn *conn_new(struct gw_server *srv, struct lws *wsi)
{
    struct gw_conn *c = cr_calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->srv = srv;
    c->wsi = wsi;
    c->refs = 1; /* the connection's own */
    buf_init(&c->body);
    buf_init(&c->resp);
    return c;
}

static void queue_clear(struct gw_conn *c)
{
    while (c->qhead) {
        struct frame *f = c->qhead;
        c->qhead = f->next;
        cr_free(f);
    }
    c->qtail = NULL;
    c->qbytes = 0;
}

void gw_conn_ref(struct gw_conn *c)
{
    c->refs++;
}

void gw_conn_unref(struct gw_conn *c)
{
    if (--c->refs > 0)
        return;
    queue_clear(c);
    cr_free(c->path);
    cr_free(c->query);
    cr_free(c->auth);
    cr_free(c->origin);
    cr_free(c->ctype);
    cr_free(c->traceparent);
    cr_free(c->tracestate);
    buf_release(&c->body);
    buf_release(&c->resp);
    cr_free(c);
}

/* The peer is gone (or the transaction is over): drop the connection's ref. */
static void conn_detach(struct pss *pss)
{
    struct gw_conn *c = pss->c;
    if (!c)
        return;
    pss->c = NULL;
    c->wsi = NULL;
    queue_clear(c);
    gw_conn_unref(c);
}

int gw_conn_alive(const struct gw_conn *c)
{
    return c->wsi != NULL;
}

const char *gw_conn_method(const struct gw_conn *c)
{
    return c->method;
}
const char *gw_conn_path(const struct gw_conn *c)
{
    return c->path ? c->path : "/";
}
const char *gw_conn_query(const struct gw_conn *c)
{
    return c->query;
}
const char *gw_conn_authorization(const struct gw_conn *c)
{
    return c->auth;
}
const char *gw_conn_origin(const struct gw_conn *c)
{
    return c->origin;
}
const char *gw_conn_content_type(const struct gw_conn *c)
{
    return c->ctype;
}

void gw_conn_trace(const struct gw_conn *c, const char **traceparent,
                   const char **tracestate)
{
    *traceparent = c->traceparent;
    *tracestate = c->tracestate;
}
const char *gw_conn_body(const struct gw_conn *c, size_t *len)
{
    *len = c->body.len;
    return c->body.data ? c->body.data : "";
}
int gw_conn_body_too_big(const struct gw_conn *c)
{
    return c->too_big;
}
int gw_conn_length_required(const struct gw_conn *c)
{
    return c->length_required;
}
void gw_conn_set_data(struct gw_conn *c, void *data)
{
    c->data = data;
}
void *gw_conn_data(const struct gw_conn *c)
{
    return c->data;
}

int gw_conn_respond(struct gw_conn *c, int status, const char *content_type,
                    const char *body, size_t len)
{
    if (c->responded || !c->wsi)
        return 0;
    c->responded = 1;
    c->status = status;
    snprintf(c->resp_type, sizeof(c->resp_type), "%s", content_type);
    if (len && buf_append(&c->resp, body, len)) {
        /* No memory for the answer: the client sees the connection drop. */
        lws_set_timeout(c->wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC);
        return CR_ENOMEM;
    }
    lws_callback_on_writable(c->wsi);
    return 0;
}

int gw_conn_send(struct gw_conn *c, const char *text, size_t len)
{
    struct frame *f;
    if (!c->wsi || c->closing)
        return CR_ECANCELED;
    if (c->qbytes + len > GW_WS_QUEUE_MAX) {
        /* Too slow to keep up: free the memory now; it may resume with ?from. */
        gw_conn_drop(c, LWS_CLOSE_STATUS_POLICY_VIOLATION, "too slow");
        return CR_ECANCELED;
    }
    f = cr_malloc(sizeof(*f) + LWS_PRE + len);
    if (!f)
        return CR_ENOMEM;
    f->next = NULL;
    f->len = len;
    memcpy(f->data + LWS_PRE, text, len);
    if (c->qtail)
        c->qtail->next = f;
    else
        c->qhead = f;
    c->qtail = f;
    c->qbytes += len;
    lws_callback_on_writable(c->wsi);
    return 0;
}

void gw_conn_close(struct gw_conn *c, int status, const char *reason)
{
    if (!c->wsi || c->closing)
        return;
    c->closing = 1;
    c->close_status = status;
    snprintf(c->close_reason, sizeof(c->close_reason), "%s", reason ? reason : "");
    lws_callback_on_writable(c->wsi);
}

void gw_conn_drop(struct gw_conn *c, int status, const char *reason)
{
    if (!c->wsi)
        return;
    queue_clear(c);
    c->closing = 1;
    c->close_status = status;
    snprintf(c->close_reason, sizeof(c->close_reason), "%s", reason ? reason : "");
    lws_callback_on_writable(c->wsi);
    /* A client that reads nothing never makes the socket writable again. */
    lws_set_timeout(c->wsi, PENDING_TIMEOUT_CLOSE_SEND, GW_DROP_GRACE_S);
}

/* ------------------------------------------------------------- requests */

static char *hdr_dup(struct lws *wsi, enum lws_token_indexes t)
{
    int n = lws_hdr_total_length(wsi, t);
    char *s;
    if (n <= 0)
        return NULL;
    s = cr_malloc((size_t)n + 1);
    if (!s)
        return NULL;
    if (lws_hdr_copy(wsi, s, n + 1, t) < 0) {
        cr_free(s);
        return NULL;
    }
    return s;
}

/* A header lws has no token for ("name:" with its colon, lower case), or
 * NULL when absent, too long for a trace header, or lws was built without
 * custom headers. */
static char *custom_dup(struct lws *wsi, const char *name)
{
#if defined(LWS_WITH_CUSTOM_HEADERS)
    int nl = (int)strlen(name), n = lws_hdr_custom_length(wsi, name, nl);
    char *s;
    if (n <= 0 || n > 1024)
        return NULL;
    s = cr_malloc((size_t)n + 1);
    if (!s)
        return NULL;
    if (lws_hdr_custom_copy(wsi, s, n + 1, name, nl) < 0) {
        cr_free(s);
        return NULL;
    }
    return s;
#else
    (void)wsi;
    (void)name;
    return NULL;
#endif
}

/* Reads what the handlers need; 0 or CR_ENOMEM. */
static int capture(struct gw_conn *c, struct lws *wsi)
{
    static const struct {
        enum lws_token_indexes t;
        const char *m;
    } methods[] = {
        {WSI_TOKEN_GET_URI, "GET"},         {WSI_TOKEN_POST_URI, "POST"},
        {WSI_TOKEN_OPTIONS_URI, "OPTIONS"}, {WSI_TOKEN_PUT_URI, "PUT"},
        {WSI_TOKEN_DELETE_URI, "DELETE"},   {WSI_TOKEN_PATCH_URI, "PATCH"},
        {WSI_TOKEN_HEAD_URI, "HEAD"},
    };
    struct buf q;
    char frag[1024];

    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        if (lws_hdr_total_length(wsi, methods[i].t) > 0) {
            snprintf(c->method, sizeof(c->method), "%s", methods[i].m);
            c->path = hdr_dup(wsi, methods[i].t);
            if (!c->path)
                return CR_ENOMEM;
            break;
        }
    }
    if (!c->method[0])
        snprintf(c->method, sizeof(c->method), "?");
    buf_init(&q);
    for (int i = 0;; i++) {
        int n =
            lws_hdr_copy_fragment(wsi, frag, sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i);
        if (n < 0)
            break;
        if ((i && buf_putc(&q, '&')) || buf_append(&q, frag, (size_t)n)) {
            buf_release(&q);
            return CR_ENOMEM;
        }
    }
    if (q.len) {
        c->query = buf_detach(&q);
        if (!c->query)
            return CR_ENOMEM;
    }
    buf_release(&q);
    c->auth = hdr_dup(wsi, WSI_TOKEN_HTTP_AUTHORIZATION);
    c->origin = hdr_dup(wsi, WSI_TOKEN_ORIGIN);
    c->ctype = hdr_dup(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE);
    c->traceparent = custom_dup(wsi, "traceparent:");
    c->tracestate = custom_dup(wsi, "tracestate:");
    return 0;
}

static void dispatch(struct gw_server *srv, struct gw_conn *c)
{
    gw_conn_ref(c);
    srv->h->on_request(srv, c, srv->privdata);
    gw_conn_unref(c);
}

static int on_http(struct gw_server *srv, struct lws *wsi, struct pss *pss)
{
    struct gw_conn *c;
    char cl[32];

    conn_detach(pss); /* a keep-alive connection's previous transaction */
    c = conn_new(srv, wsi);
    if (!c)
        return -1;
    pss->c = c;
    if (capture(c, wsi))
        return -1;
    c->body.max_bytes = srv->cfg->max_body_bytes;
    if (!strcmp(c->method, "POST") || !strcmp(c->method, "PUT") ||
        !strcmp(c->method, "PATCH")) {
        int has_len =
            lws_hdr_copy(wsi, cl, sizeof(cl), WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0;
        unsigned long long n = has_len ? strtoull(cl, NULL, 10) : 0;
        if (has_len && n > srv->cfg->max_body_bytes) {
            c->too_big = 1;
            /* A body of reasonable size is read and dropped before the 413,
             * so a client still sending it is not reset mid-write; a huge
             * one is answered at once and the connection closed. */
            if (n <= DISCARD_MAX)
                return 0;
            dispatch(srv, c);
            return 0;
        }
        if (has_len && n == 0) {
            dispatch(srv, c);
            return 0;
        }
        if (has_len)
            return 0; /* the body follows */
        if (lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) > 0) {
            /* lws 4.1 drops chunked request bodies: say so, then close. */
            c->length_required = 1;
        }
    }
    dispatch(srv, c);
    return 0;
}

static int add_header(struct lws *wsi, const char *name, const char *value,
                      unsigned char **p, unsigned char *end)
{
    return lws_add_http_header_by_name(wsi, (const unsigned char *)name,
                                       (const unsigned char *)value, (int)strlen(value),
                                       p, end);
}

/* Returns non-zero when the headers do not fit. */
static int cors_headers(struct gw_server *srv, struct gw_conn *c, struct lws *wsi,
                        unsigned char **p, unsigned char *end)
{
    const char *allow = srv->cfg->cors_origin;
    if (!allow || !*allow)
        return 0;
    if (strcmp(allow, "*") && (!c->origin || strcmp(c->origin, allow)))
        return 0;
    return add_header(wsi, "access-control-allow-origin:", allow, p, end) ||
           add_header(wsi, "access-control-allow-methods:", "GET, POST, OPTIONS", p,
                      end) ||
           add_header(wsi, "access-control-allow-headers:", "Authorization, Content-Type",
                      p, end) ||
           add_header(wsi, "access-control-max-age:", "600", p, end) ||
           add_header(wsi, "vary:", "Origin", p, end);
}

/* A request whose body was not read in full: its body is dropped, and the
 * connection closes after the answer, since what follows on it is not a request. */
static int closes(const struct gw_conn *c)
{
    return c->too_big || c->length_required;
}

static int on_http_writable(struct gw_server *srv, struct lws *wsi, struct pss *pss)
{
    struct gw_conn *c = pss->c;
    unsigned char hdr[LWS_PRE + 2048];
    unsigned char *start = hdr + LWS_PRE, *p = start, *end = hdr + sizeof(hdr) - 1;
    size_t left, n;
    unsigned char *chunk;
    int final, drop;

    if (!c || !c->responded)
        return 0;
    if (!c->headers_done) {
        if (lws_add_http_common_headers(wsi, (unsigned int)c->status, c->resp_type,
                                        (lws_filepos_t)c->resp.len, &p, end))
            return 1;
        if (add_header(wsi, "cache-control:", "no-store", &p, end) ||
            cors_headers(srv, c, wsi, &p, end) ||
            (closes(c) && add_header(wsi, "connection:", "close", &p, end)) ||
            lws_finalize_write_http_header(wsi, start, &p, end))
            return 1;
        c->headers_done = 1;
        lws_callback_on_writable(wsi);
        return 0;
    }
    left = c->resp.len - c->sent;
    n = left > CHUNK ? CHUNK : left;
    final = n == left;
    chunk = cr_malloc(LWS_PRE + n + 1);
    if (!chunk)
        return -1;
    if (n)
        memcpy(chunk + LWS_PRE, c->resp.data + c->sent, n);
    if (lws_write(wsi, chunk + LWS_PRE, n,
                  final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)n) {
        cr_free(chunk);
        return -1;
    }
    cr_free(chunk);
    c->sent += n;
    if (!final) {
        lws_callback_on_writable(wsi);
        return 0;
    }
    drop = closes(c);
    conn_detach(pss);
    if (drop || lws_http_transaction_completed(wsi))
        return -1;
    return 0;
}

/* ----------------------------------------------------------- websockets */

static int on_ws_writable(struct lws *wsi, struct pss *pss)
{
    struct gw_conn *c = pss->c;
    struct frame *f;
    if (!c)
        return -1;
    f = c->qhead;
    if (f) {
        c->qhead = f->next;
        if (!c->qhead)
            c->qtail = NULL;
        c->qbytes -= f->len;
        c->srv->h->on_ws_written(c->srv, c, f->len, c->srv->privdata);
        if (lws_write(wsi, f->data + LWS_PRE, f->len, LWS_WRITE_TEXT) < (int)f->len) {
            cr_free(f);
            return -1;
        }
        cr_free(f);
        if (c->qhead || c->closing)
            lws_callback_on_writable(wsi);
        return 0;
    }
    if (c->closing && !c->close_sent) {
        /* The close frame is written here rather than left to lws 4.1,
         * which with lws_close_reason() and a -1 return cuts the socket
         * without it: the client is to see why it was closed. */
        unsigned char buf[LWS_PRE + 2 + sizeof(c->close_reason)];
        size_t n = strlen(c->close_reason);
        buf[LWS_PRE] = (unsigned char)((c->close_status >> 8) & 0xff);
        buf[LWS_PRE + 1] = (unsigned char)(c->close_status & 0xff);
        memcpy(buf + LWS_PRE + 2, c->close_reason, n);
        c->close_sent = 1;
        if (lws_write(wsi, buf + LWS_PRE, n + 2, WRITE_CLOSE) < (int)(n + 2))
            return -1;
        /* Once lws has it all on the socket, it calls back and we hang up. */
        lws_callback_on_writable(wsi);
        return 0;
    }
    return c->closing ? -1 : 0;
}

static void on_ws_closed(struct gw_server *srv, struct pss *pss)
{
    struct gw_conn *c = pss->c;
    if (!c)
        return;
    c->wsi = NULL;
    queue_clear(c);
    if (c->ws_open) {
        c->ws_open = 0;
        srv->nws--;
        srv->h->on_ws_close(srv, c, srv->privdata);
    }
    conn_detach(pss);
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user,
                    void *in, size_t len)
{
    struct lws_context *ctx = lws_get_context(wsi);
    struct gw_server *srv = ctx ? lws_context_user(ctx) : NULL;
    struct pss *pss = user;

    if (srv && reason == LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED)
        return peer_new(srv, wsi);
    if (srv && reason == LWS_CALLBACK_WSI_DESTROY)
        peer_free(srv, wsi);
    /* lws may report on a connection that never got per-session memory
     * (a browser's speculative connect closed before its first request). */
    if (!pss || !srv)
        return lws_callback_http_dummy(wsi, reason, user, in, len);
    switch (reason) {
    case LWS_CALLBACK_HTTP:
        return on_http(srv, wsi, pss);
    case LWS_CALLBACK_HTTP_BODY:
        if (pss->c && !closes(pss->c) && buf_append(&pss->c->body, in, len))
            pss->c->too_big = 1; /* over max_body_bytes (or out of memory) */
        return 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (pss->c)
            dispatch(srv, pss->c);
        return 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return on_http_writable(srv, wsi, pss);
    case LWS_CALLBACK_CLOSED_HTTP:
        conn_detach(pss);
        return 0;
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        conn_detach(pss);
        pss->c = conn_new(srv, wsi);
        if (!pss->c || capture(pss->c, wsi))
            return -1;
        return 0;
    case LWS_CALLBACK_ESTABLISHED:
        if (!pss->c)
            return -1;
        pss->c->ws_open = 1;
        srv->nws++;
        srv->h->on_ws_open(srv, pss->c, srv->privdata);
        return 0;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return on_ws_writable(wsi, pss);
    case LWS_CALLBACK_RECEIVE:
        return 0; /* nothing to read from clients */
    case LWS_CALLBACK_CLOSED:
        on_ws_closed(srv, pss);
        return 0;
    case LWS_CALLBACK_WSI_DESTROY:
        on_ws_closed(srv, pss);
        return 0;
    default:
        return lws_callback_http_dummy(wsi, reason, user, in, len);
    }
}

/* ----------------------------------------------------------- lifecycle */

static void lws_log(int level, const char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    LOG(level == LLL_ERR ? LOG_ERROR : LOG_WARNING, "lws: %.*s", (int)n, line);
}

/* An accepted connection goes to lws as if its own listener had taken it
 * (lws closes fd if it cannot adopt it). */
static void on_accept(struct listener *l, int fd, void *privdata)
{
    struct gw_server *srv = privdata;
    (void)l;
    lws_adopt_socket_vhost(srv->vh, fd);
}

struct gw_server *gw_server_new(uv_loop_t *loop, const struct gw_server_config *cfg,
                                const struct gw_server_handlers *h, void *privdata,
                                struct cr_err *err)
{
    struct gw_server *srv = cr_calloc(1, sizeof(*srv));
    struct lws_context_creation_info info;
    void *loops[1];

    if (!srv) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    srv->loop = loop;
    srv->cfg = cfg;
    srv->h = h;
    srv->privdata = privdata;
    srv->protocols[0].name = "celeriac";
    srv->protocols[0].callback = callback;
    srv->protocols[0].per_session_data_size = sizeof(struct pss);
    srv->protocols[0].rx_buffer_size = 4096;

    /* The sockets first: a port in use fails here, before lws exists. */
    srv->listener = listener_new(loop, cfg->host, cfg->port, on_accept, srv, err);
    if (!srv->listener) {
        cr_free(srv);
        return NULL;
    }
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log);
    memset(&info, 0, sizeof(info));
    loops[0] = loop;
    info.foreign_loops = loops;
    info.options = LWS_SERVER_OPTION_LIBUV | LWS_SERVER_OPTION_UV_NO_SIGSEGV_SIGFPE_SPIN |
                   LWS_SERVER_OPTION_VALIDATE_UTF8;
    /* A server vhost that listens nowhere: the listener hands it connections. */
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;
    info.protocols = srv->protocols;
    info.user = srv;
    info.timeout_secs = 30;
    info.keepalive_timeout = 5;
    /* lws 4.1 gives each connection a header buffer when it is accepted and
     * takes it back when the head is parsed, or after timeout_secs_ah_idle
     * counted from the accept (or from the first byte of a keep-alive
     * connection's next request), however slowly the bytes trickle in.
     * Connections past the pool wait for a buffer; so the pool is kept
     * larger than the untrusted connections may ever hold. */
    info.timeout_secs_ah_idle = cfg->header_timeout > 0 ? cfg->header_timeout : 10;
    info.max_http_header_data = 4096;
    info.max_http_header_pool2 =
        (unsigned int)(cfg->max_untrusted ? cfg->max_untrusted + 1024 : 1024);
    srv->ctx = lws_create_context(&info);
    srv->vh = srv->ctx ? lws_get_vhost_by_name(srv->ctx, "default") : NULL;
    if (!srv->vh) {
        cr_err_set(err, CR_EIO, "cannot start the HTTP server (libwebsockets)");
        gw_server_free(srv);
        return NULL;
    }
    srv->port = listener_port(srv->listener);
    return srv;
}

int gw_server_port(const struct gw_server *srv)
{
    return srv->port;
}

const char *gw_server_addresses(const struct gw_server *srv)
{
    return listener_addresses(srv->listener);
}

size_t gw_server_ws_count(const struct gw_server *srv)
{
    return srv->nws;
}

void gw_server_free(struct gw_server *srv)
{
    if (!srv)
        return;
    listener_free(srv->listener);
    if (!srv->ctx) {
        cr_free(srv);
        return;
    }
    /* With a foreign loop, lws closes its handles from the loop: a few
     * turns let their close callbacks run before the memory goes. */
    lws_context_destroy(srv->ctx);
    for (int i = 0; i < 8; i++)
        uv_run(srv->loop, UV_RUN_NOWAIT);
    /* lws 4.1 finishes a foreign-loop context on a second call, once its
     * handles are closed. */
    lws_context_destroy(srv->ctx);
    cr_free(srv);
}
