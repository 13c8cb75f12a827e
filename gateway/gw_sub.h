/* gw_sub.h -- one Redis pub/sub connection on the libuv loop (hiredis async),
 * for all the channels the gateway watches, with reconnects. Channels are
 * not remembered across a reconnect: the owner subscribes again when told
 * the connection is up. Not thread-safe: loop thread only. */
#ifndef CR_GW_SUB_H
#define CR_GW_SUB_H

#include <stddef.h>
#include <uv.h>

#include "util/err.h"

struct gw_sub;

enum gw_sub_event {
    GW_SUB_UP,         /* connected (again): subscribe what you need */
    GW_SUB_DOWN,       /* connection lost: every subscription is gone */
    GW_SUB_SUBSCRIBED, /* the channel is subscribed */
};

/* A message (channel and payload borrowed for the call). */
typedef void gw_sub_msg_fn(struct gw_sub *s, const char *channel, size_t channel_len,
                           const char *payload, size_t len, void *privdata);
/* channel is set for GW_SUB_SUBSCRIBED only. */
typedef void gw_sub_event_fn(struct gw_sub *s, enum gw_sub_event ev, const char *channel,
                             size_t channel_len, void *privdata);

/* Returns a new subscriber that connects at once (and again after losses), or
 * NULL with err set (bad URL, OOM). url: redis://[[user]:password@]host[:port]
 * (a database number is ignored: pub/sub is server-wide). Quiet for
 * health_check_interval seconds, the connection is probed, and lost when the
 * probe goes unanswered for timeout seconds (either 0: never). */
struct gw_sub *gw_sub_new(uv_loop_t *loop, const char *url, double timeout,
                          double health_check_interval, gw_sub_msg_fn *on_msg,
                          gw_sub_event_fn *on_event, void *privdata, struct cr_err *err);
int gw_sub_connected(const struct gw_sub *s);
/* SUBSCRIBE / UNSUBSCRIBE n channels (copied). Returns 0, CR_EBACKEND when
 * not connected, or CR_ENOMEM. Events and messages never come from inside. */
int gw_sub_subscribe(struct gw_sub *s, int n, const char *const *channels);
int gw_sub_unsubscribe(struct gw_sub *s, int n, const char *const *channels);
/* Disconnects and frees; no callback afterwards. NULL is a no-op. */
void gw_sub_free(struct gw_sub *s);

#endif
