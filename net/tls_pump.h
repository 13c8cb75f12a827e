/* tls_pump.h -- TLS for hiredis 0.14's async API: a local socket whose bytes are
 * carried over TLS to a Redis server, on the libuv loop.
 *
 * Why a pump: Debian 12's hiredis 0.14 has no TLS, and its async API cannot
 * adopt a socket we made (redisAsyncInitialize is static; only
 * redisAsyncConnect* make contexts). So each TLS connection is two: hiredis
 * connects, unchanged, to a unix socket of our own (in a fresh 0700
 * directory, removed as soon as the one connection it waits for has come in);
 * the pump accepts it, connects to the server over TCP, runs the TLS
 * handshake (OpenSSL on memory BIOs, so no OpenSSL call ever touches a socket
 * or blocks), then copies plaintext from hiredis into TLS records and back.
 * Nothing here blocks the loop: the name lookup is uv_getaddrinfo(), the
 * connect uv_tcp_connect(), and all I/O libuv's.
 *
 * Until the handshake is done the pump does not read from hiredis, so what
 * hiredis sends first (AUTH, SELECT, PING) waits in the kernel and goes out
 * as the first TLS records. Each direction is bounded: when more than
 * TLS_PUMP_QUEUE_MAX_BYTES wait to be written on one side, the pump stops
 * reading the other until half of it has gone.
 *
 * The pump never calls its owner. It reports an end the way a server would:
 * it closes hiredis's socket, hiredis sees the connection closed and calls
 * its disconnect callback, and the owner then reads tls_pump_error() for the
 * reason ("TLS: certificate verify failed (self-signed certificate)"), which
 * hiredis itself cannot know. One pump carries one connection: make a new one
 * for each connect attempt.
 *
 * Not thread-safe: loop thread only. */
#ifndef CR_TLS_PUMP_H
#define CR_TLS_PUMP_H

#include <uv.h>

#include "util/err.h"

#define TLS_PUMP_QUEUE_MAX_BYTES (256 * 1024)

/* What the client checks, as Python's ssl module and redis-py take it. */
struct tls_settings {
    /* 1: the server's certificate must chain to a trusted CA (Python's
     * CERT_REQUIRED, and CERT_OPTIONAL, which a client treats the same);
     * 0: anything is accepted (CERT_NONE). */
    int verify;
    /* 1: the certificate must also name the host we connect to (DNS name or
     * IP address); needs verify. */
    int check_hostname;
    const char *ca_file;   /* PEM CAs; NULL or "": see ca_path */
    const char *ca_path;   /* a c_rehash'ed directory; both empty: the system's store */
    const char *cert_file; /* the client's certificate chain (PEM), or NULL / "" */
    const char *key_file;  /* its key (PEM); NULL or "": in cert_file */
};

/* The settings, loaded once (at start-up: this reads the files). */
struct tls_ctx;

/* Returns a new context, or NULL with err set: CR_EINVAL when a file cannot be
 * loaded or the key does not match the certificate ("cannot load ssl_ca_certs
 * '/x': No such file or directory"), CR_ENOMEM, CR_EIO when the sockets' directory cannot
 * be made (it is made here, once). Strings are not kept. Free with tls_ctx_free(); pumps
 * made from it keep what they need, so it may go first. */
struct tls_ctx *tls_ctx_new(const struct tls_settings *s, struct cr_err *err);
/* NULL is a no-op. */
void tls_ctx_free(struct tls_ctx *ctx);

struct tls_pump;

/* Returns a new pump listening on its private unix socket, to carry one
 * connection to host:port (host: a name, or an IPv4/IPv6 address without
 * brackets; copied); or NULL with err set (CR_ENOMEM, CR_EIO when the
 * directory or the socket cannot be made). The caller then connects hiredis
 * to tls_pump_path() and frees the pump with tls_pump_free() once hiredis's
 * context has gone (or no later than it frees the context). */
struct tls_pump *tls_pump_new(uv_loop_t *loop, struct tls_ctx *ctx, const char *host,
                              int port, struct cr_err *err);

/* The unix socket to connect to; borrowed until the pump is freed. */
const char *tls_pump_path(const struct tls_pump *p);

/* Why the pump closed hiredis's socket (or why the server did), "TLS: ..." or
 * "cannot connect to h:p: ..."; "" while it has not. Borrowed until the pump
 * is freed. */
const char *tls_pump_error(const struct tls_pump *p);

/* Where a connection that is not through yet is stuck, for a timeout's
 * message: "connection timed out" (name lookup or TCP connect), "TLS
 * handshake timed out", or NULL once the handshake is done. */
const char *tls_pump_stalled(const struct tls_pump *p);

/* 1 once the TLS handshake is done. */
int tls_pump_open(const struct tls_pump *p);

/* Closes both sides (if not yet) and removes the socket and its directory;
 * the memory goes once libuv has closed the handles. NULL is a no-op. */
void tls_pump_free(struct tls_pump *p);

#endif
