/* tcp_connect.h -- a bounded TCP connect that says why it failed.
 *
 * rabbitmq-c's own connect (amqp_socket_open_noblock) reads a failed
 * connect's error with getsockopt(SO_ERROR) and drops it: every refusal,
 * unreachable network and reset reads "a socket error occurred". This one
 * does the same work (every address of the name in turn, non-blocking
 * connect, a poll() bounded by the timeout, close-on-exec, TCP_NODELAY,
 * SO_KEEPALIVE) and keeps the reason, and hands the connected socket to
 * rabbitmq-c (amqp_tcp_socket_set_sockfd()). Blocking: start-up and
 * reconnect only. */
#ifndef CR_TCP_CONNECT_H
#define CR_TCP_CONNECT_H

#include "util/err.h"

/* Returns a new connected non-blocking socket (the caller closes it, or hands
 * it to a library that does), or CR_EBROKER with the reason in words in err:
 * "connection refused", "timed out after 5 s", "cannot resolve 'h': ...".
 * With several addresses the last one's reason is kept; the timeout covers
 * them all. */
int tcp_connect(const char *host, int port, double timeout_s, struct cr_err *err);

#endif
