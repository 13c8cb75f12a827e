/* curl_loop.h -- a curl multi handle driven by the libuv loop: its sockets kept
 * in one epoll set that a single uv_poll_t watches (util/curl_epoll.h), its
 * timeouts on one uv_timer_t. The OTLP exporter and the SQS transport each own
 * one; the LLM client (llm/, below net/) drives its own the same way.
 *
 * The owner adds easy handles whose CURLOPT_PRIVATE is its own request record,
 * and gets each finished transfer back through its done callback, the easy
 * handle already out of the multi handle (the owner cleans it up). Not
 * thread-safe: loop thread only. */
#ifndef CR_NET_CURL_LOOP_H
#define CR_NET_CURL_LOOP_H

#include <uv.h>
#include <curl/curl.h>

struct curl_loop;

/* One finished transfer: req is its CURLOPT_PRIVATE, cc curl's result, status
 * the HTTP status (0 when none came). Called from the loop's callbacks, never
 * from inside curl_loop_add(). */
typedef void curl_loop_done_fn(void *owner, void *req, CURLcode cc, long status);

/* A new driver on loop, keeping at most maxconnects idle connections. NULL
 * when out of memory or file descriptors. */
struct curl_loop *curl_loop_new(uv_loop_t *loop, long maxconnects,
                                curl_loop_done_fn *done, void *owner);

/* Starts easy (its transfer runs on the loop). Returns 0, or -1 when curl
 * refuses it (the handle stays the caller's, done is not called). */
int curl_loop_add(struct curl_loop *cl, CURL *easy);

/* Takes back an easy handle still running (its done is not called). */
void curl_loop_remove(struct curl_loop *cl, CURL *easy);

/* Ends the driver: the caller has removed or finished every easy handle. The
 * multi handle goes at once; the loop handles close on the loop, the memory
 * after them. NULL is a no-op. */
void curl_loop_free(struct curl_loop *cl);

#endif
