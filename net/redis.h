/* redis.h -- hiredis async contexts on a libuv loop.
 *
 * Our own glue instead of hiredis's adapters/libuv.h, because that one (as
 * shipped in Debian's hiredis 0.14) drops every poll error: libuv stops a poll
 * handle on POLLERR and reports a negative status, the adapter returns without
 * telling hiredis, and the connection hangs forever with its commands
 * unanswered (seen when Redis is shut down under load). Here an error is handed
 * to hiredis as readiness, so its read or write fails and it disconnects
 * normally, calling every pending callback. */
#ifndef CR_REDIS_UV_H
#define CR_REDIS_UV_H

#include <hiredis/async.h>
#include <uv.h>

/* Attaches ac to loop. Returns REDIS_OK, or REDIS_ERR (then ac is untouched
 * and the caller frees it). The glue is freed by hiredis through its cleanup
 * hook when the context goes away. */
int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop);

#endif
