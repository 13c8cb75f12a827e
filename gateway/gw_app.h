/* gw_app.h -- the gateway: HTTP endpoints and progress WebSockets wired to
 * the broker (net/broker.h: RabbitMQ or Redis, publishes confirmed), the result backend
 * (backend.h) and one Redis pub/sub connection (gw_sub.h), all on one libuv loop. */
#ifndef CR_GW_APP_H
#define CR_GW_APP_H

#include <stddef.h>
#include <uv.h>

#include "util/err.h"

struct gw_app_config {
    const char *broker_url;
    const char *broker_transport_options; /* Redis or SQS broker: JSON, or NULL */
    const char *backend_url;
    double redis_timeout;               /* seconds; 0: none (see backend.h) */
    double redis_health_check_interval; /* seconds; 0: never */
    const char *host;
    int port;               /* 0: any free port */
    const char *auth_token; /* "" or NULL: no auth */
    const char *cors_origin;
    size_t max_body_bytes;
    const char *const *tasks; /* names a client may send; NULL: any */
    int ntasks;
    const char *const *queues; /* queues a client may choose; [0] is the default */
    int nqueues;
    int header_timeout;         /* seconds for a request head (gw_server.h) */
    size_t max_unauthenticated; /* connections without an authorized request */
    size_t max_buffered_bytes;  /* WebSocket output queued over all clients */
};

struct gw_app;

/* Connects to Redis and RabbitMQ (blocking, start-up only) and listens.
 * Returns a new app or NULL with err set. cfg is borrowed for the app's life. */
struct gw_app *gw_app_new(uv_loop_t *loop, const struct gw_app_config *cfg,
                          struct cr_err *err);
int gw_app_port(const struct gw_app *app);
/* The addresses listened on, e.g. "127.0.0.1, [::1]" (borrowed for the app's
 * life). */
const char *gw_app_addresses(const struct gw_app *app);
/* Closes every connection and frees; then run the loop once more so that the
 * closed handles are released. NULL is a no-op. */
void gw_app_free(struct gw_app *app);

#endif
