/* listener.h -- the listening TCP sockets of the HTTP servers (the gateway,
 * the worker's /metrics) on the caller's libuv loop. It binds every address a
 * host stands for, on one port, and hands each accepted connection's
 * descriptor to its owner, which gives it to lws.
 *
 * The binding is done here rather than by lws 4.1: with IPv6 enabled, lws
 * given an IPv4 address listens on every address of every interface, and it
 * reads a host as a network interface's name, so "localhost" is not found.
 * Loop thread only. */
#ifndef CR_LISTENER_H
#define CR_LISTENER_H

#include <uv.h>

#include "util/err.h"

#define LISTENER_MAX_ADDRS 8 /* addresses one host may stand for; more are not bound */

struct listener;

/* A connection was accepted: takes fd (a non-blocking socket with TCP_NODELAY
 * set; the callee closes it, whatever becomes of it). */
typedef void listener_accept_fn(struct listener *l, int fd, void *privdata);

/* Returns a new listener, or NULL with err set and nothing left listening.
 * host is an IPv4 address, an IPv6 address (with or without brackets), a name
 * (every address it resolves to: "localhost" is 127.0.0.1 and ::1; an address
 * the machine lacks, such as ::1 with IPv6 off, is skipped when another one
 * binds) or "" (every address of the machine). An IPv6 socket takes IPv6 only:
 * "::" is not also 0.0.0.0. port 0: any free port, the same one for every
 * address. Errors: CR_ENOTFOUND (host does not resolve), CR_EIO (an address
 * cannot be bound: "cannot listen on 127.0.0.1:8080: address already in use"),
 * CR_ENOMEM. host is borrowed for the call; resolving a name may block (it is
 * meant for start-up). */
struct listener *listener_new(uv_loop_t *loop, const char *host, int port,
                              listener_accept_fn *on_accept, void *privdata,
                              struct cr_err *err);
/* The port every address listens on. */
int listener_port(const struct listener *l);
/* The bound addresses for a log line, e.g. "127.0.0.1, [::1]" (borrowed until
 * listener_free()). */
const char *listener_addresses(const struct listener *l);
/* Formats host for a URL: an IPv6 address gets brackets, anything else is
 * copied. Returns out. */
char *listener_url_host(const char *host, char *out, size_t size);
/* Stops listening (the sockets close on the next loop run; connections
 * already handed over are the owner's) and frees. NULL is a no-op. */
void listener_free(struct listener *l);

#endif
