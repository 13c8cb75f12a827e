/* fleet_pools.h -- what a worker knows of the fleet for its pools and
 * fallbacks: each limit's cooling (so that a pool skips a target another
 * worker saw refused, and a cooled route's waiting calls go to their
 * fallbacks), and each pool target's calls in flight across the fleet (for
 * "least-busy").
 *
 * Every FLEET_POOLS_VIEW_MS one Lua script in the result backend's Redis
 * publishes this worker's calls per pool target and reads the others' and
 * every limit's cooling. Keys, under the backend's key prefix:
 * celeriac:pool:<provider>/<model>:busy, a hash of worker -> "calls:expiry ms"
 * (an entry not renewed for FLEET_POOLS_LEASE_MS, a worker killed with -9,
 * counts no more and is removed), and fleet_limits.h's :cool keys. While
 * Redis is away or slow the worker counts its own calls only, and knows only
 * the cooling its own 429s brought. Not thread-safe: the loop thread only. */
#ifndef CR_WORKER_FLEET_POOLS_H
#define CR_WORKER_FLEET_POOLS_H

#include <uv.h>

#include "llm/router.h"
#include "net/backend.h"
#include "util/err.h"

#define FLEET_POOLS_VIEW_MS 200    /* how often the fleet is read */
#define FLEET_POOLS_LEASE_MS 10000 /* a worker's published counts live this long */
#define FLEET_POOLS_MAX_KEYS 64    /* limits read per view, at most */

struct fleet_pools;

/* Returns a new fleet_pools reading the fleet for rt's limits through bk
 * (both borrowed; bk may be NULL: this worker alone), naming this worker
 * after hostname (copied), or NULL with err set (CR_ENOMEM). Free with
 * fleet_pools_free() after backend_free() and before the router is
 * released. */
struct fleet_pools *fleet_pools_new(uv_loop_t *loop, struct backend *bk,
                                    struct llm_router *rt, struct llm_client *client,
                                    const char *hostname, struct cr_err *err);
void fleet_pools_free(struct fleet_pools *p);

/* The worker's cron calls it: a view every FLEET_POOLS_VIEW_MS when the
 * router has limits; one unanswered past FLEET_POOLS_VIEW_MS * 5 leaves the
 * fleet's counts out until one is answered. */
void fleet_pools_tick(struct fleet_pools *p);

#endif
