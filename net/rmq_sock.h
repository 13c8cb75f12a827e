/* rmq_sock.h -- rabbitmq-c's TCP socket with writes that never wait.
 *
 * rabbitmq-c writes a frame whole: when the kernel takes only part of it, the
 * library polls the socket for writability with no deadline. A peer that
 * stops reading (a route that stops forwarding, a broker host that froze)
 * then stops the whole loop, heartbeat timer included, for as long as the
 * socket stays open: a partition goes unnoticed precisely when the worker is
 * busiest. So every write goes through this wrapper instead. It writes what
 * the kernel takes at once and keeps the rest, in order, in a queue of its
 * own; the library always sees its frame written. The owner drains the queue
 * with rmq_sock_flush() when the socket turns writable, and decides on its
 * own clock whether a link that hears nothing is dead (the wrapper counts the
 * bytes received for that).
 *
 * The wrapper sits between rabbitmq-c and its socket object by replacing the
 * object's method table, whose layout (six functions behind a pointer at the
 * start of every socket) rabbitmq-c does not install as a header but has kept
 * from 0.4 to 0.15. Requests made with a blocking call (amqp_get_rpc_reply)
 * still work: their writes go straight to the kernel as before, unless bytes
 * are already queued, and then the call ends at its RPC timeout.
 *
 * Not thread-safe. The wrapper lives as long as the connection's socket:
 * amqp_destroy_connection() frees both. */
#ifndef CR_RMQ_SOCK_H
#define CR_RMQ_SOCK_H

#include <amqp.h>
#include <stddef.h>
#include <stdint.h>

struct rmq_sock;

/* Wraps sock, a socket just made by amqp_tcp_socket_new() and not opened
 * yet. Past max_queued bytes waiting (0: no limit) a write fails as a socket
 * error with errno ENOBUFS, which loses the connection: a link that cannot
 * take that much is not coming back soon. Returns the wrapper, owned by the
 * socket (freed with it, never by the caller), or NULL when out of memory
 * (sock is then unchanged). */
struct rmq_sock *rmq_sock_wrap(amqp_socket_t *sock, size_t max_queued);

/* Writes what the kernel takes of the queue now, without waiting. Returns
 * AMQP_STATUS_OK (whether or not bytes remain queued), or
 * AMQP_STATUS_SOCKET_ERROR with errno set, or AMQP_STATUS_SOCKET_CLOSED. */
int rmq_sock_flush(struct rmq_sock *s);

/* Bytes waiting in the queue for the kernel to take them. */
size_t rmq_sock_queued(const struct rmq_sock *s);

/* Bytes received on the socket since it was wrapped: the only sign that the
 * peer is alive (what we write says nothing about it). */
uint64_t rmq_sock_received(const struct rmq_sock *s);

#endif
