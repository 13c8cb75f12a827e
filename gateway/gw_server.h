/* gw_server.h -- thin libwebsockets glue for the gateway: HTTP requests with
 * bodies, responses that may come later (after a broker confirm or a Redis
 * reply), and WebSocket connections with a write queue. lws runs on the
 * caller's libuv loop (LWS_SERVER_OPTION_LIBUV with a foreign loop). All
 * decisions (routes, auth, JSON) belong to the handlers; this file only moves
 * bytes. Not thread-safe: loop thread only. */
#ifndef CR_GW_SERVER_H
#define CR_GW_SERVER_H

#include <stddef.h>
#include <uv.h>

#include "util/err.h"

#define GW_WS_QUEUE_MAX                                                                  \
    (8u << 20) /* bytes queued to one slow client before                                 \
                * it is disconnected (it may resume) */

struct gw_server;
struct gw_conn; /* one HTTP transaction or one WebSocket */

struct gw_server_config {
    /* Where to listen: an address ("127.0.0.1", "::1"), a name (each of its
     * addresses) or "" (every address); see net/listener.h. */
    const char *host;
    int port; /* 0: any free port (see gw_server_port()) */
    size_t max_body_bytes;
    const char *cors_origin; /* "" or NULL: no CORS headers; "*"; or one origin */
    /* Seconds a connection has, from its accept or from the end of its
     * previous request, to send a whole request head; trickling bytes does
     * not extend it. 0: 10. */
    int header_timeout;
    /* Connections that have not completed an authorized request (see
     * gw_conn_trust()); past this many, the oldest of them is closed for
     * each new one. 0: no limit. */
    size_t max_untrusted;
};

/* Handlers; conn pointers are valid for the call, or longer with gw_conn_ref(). */
struct gw_server_handlers {
    /* A whole HTTP request (body read, or over max_body_bytes: see
     * gw_conn_body_too_big()). Must end with gw_conn_respond(), now or later. */
    void (*on_request)(struct gw_server *srv, struct gw_conn *c, void *privdata);
    /* A WebSocket is open (the request accessors still work during this call). */
    void (*on_ws_open)(struct gw_server *srv, struct gw_conn *c, void *privdata);
    /* It is closed: called exactly once per on_ws_open, never from inside a
     * gw_conn_* call. */
    void (*on_ws_close)(struct gw_server *srv, struct gw_conn *c, void *privdata);
    /* A queued frame of len bytes has been handed to the socket. */
    void (*on_ws_written)(struct gw_server *srv, struct gw_conn *c, size_t len,
                          void *privdata);
};

/* Returns a new listening server, or NULL with err set. cfg strings and
 * handlers are borrowed for the server's life. */
struct gw_server *gw_server_new(uv_loop_t *loop, const struct gw_server_config *cfg,
                                const struct gw_server_handlers *h, void *privdata,
                                struct cr_err *err);
int gw_server_port(const struct gw_server *srv);
/* The addresses listened on, e.g. "127.0.0.1, [::1]" (borrowed for the
 * server's life). */
const char *gw_server_addresses(const struct gw_server *srv);
size_t gw_server_ws_count(const struct gw_server *srv);
/* Connections not yet trusted, and how many of them were closed to make room. */
size_t gw_server_untrusted(const struct gw_server *srv);
size_t gw_server_evicted(const struct gw_server *srv);
/* Closes every connection (on_ws_close for each WebSocket) and destroys the
 * lws context; the caller then runs the loop so lws's handles close. NULL is
 * a no-op. */
void gw_server_free(struct gw_server *srv);

/* Request accessors (borrowed until on_request/on_ws_open returns, or while
 * a reference is held). Absent headers read as NULL. */
const char *gw_conn_method(const struct gw_conn *c); /* "GET", "POST", ... */
const char *gw_conn_path(const struct gw_conn *c);
const char *gw_conn_query(const struct gw_conn *c); /* "a=1&b=2" or NULL */
const char *gw_conn_authorization(const struct gw_conn *c);
const char *gw_conn_origin(const struct gw_conn *c);
const char *gw_conn_content_type(const struct gw_conn *c);
/* The request's "traceparent" and "tracestate" headers as sent (borrowed
 * until the connection is freed), each NULL when absent. Not checked. */
void gw_conn_trace(const struct gw_conn *c, const char **traceparent,
                   const char **tracestate);
const char *gw_conn_body(const struct gw_conn *c, size_t *len);
int gw_conn_body_too_big(const struct gw_conn *c);
/* The body came without a Content-Length (chunked), which is not read. */
int gw_conn_length_required(const struct gw_conn *c);

/* Keeps c allocated after the handler returns (for a later response); every
 * ref needs one unref. */
void gw_conn_ref(struct gw_conn *c);
void gw_conn_unref(struct gw_conn *c);
/* Whether the peer is still there. */
int gw_conn_alive(const struct gw_conn *c);

/* Answers an HTTP request (body copied). A second call, or a call after the
 * peer left, is a no-op. Returns 0 or CR_ENOMEM (the connection is then
 * dropped). */
int gw_conn_respond(struct gw_conn *c, int status, const char *content_type,
                    const char *body, size_t len);

/* WebSocket: queues a text frame (copied). Past GW_WS_QUEUE_MAX the client is
 * disconnected. Returns 0, CR_ENOMEM or CR_ECANCELED (closing or gone). */
int gw_conn_send(struct gw_conn *c, const char *text, size_t len);
/* Closes with status (1000 normal, 1008 policy...) once the queue is out. */
void gw_conn_close(struct gw_conn *c, int status, const char *reason);
/* Discards the queue and closes with status now: the close frame goes out
 * when the socket takes it, and the connection is cut after
 * GW_DROP_GRACE_S seconds if it never does (a client that stopped reading). */
void gw_conn_drop(struct gw_conn *c, int status, const char *reason);
#define GW_DROP_GRACE_S 30

/* The connection carried an authorized request: it no longer counts against
 * max_untrusted and is never closed to make room. */
void gw_conn_trust(struct gw_conn *c);

void gw_conn_set_data(struct gw_conn *c, void *data);
void *gw_conn_data(const struct gw_conn *c);

#endif
