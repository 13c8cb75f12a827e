/* tls_pump.c -- a local socket carried over TLS to a Redis server (see tls_pump.h). */
#include "net/tls_pump.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"

#define READ_CHUNK 65536

/* ------------------------------------------------------------ settings */

struct tls_ctx {
    SSL_CTX *ssl_ctx;
    int check_hostname;
    /* Made once here, at start-up: each pump binds its socket inside, so no
     * connect or reconnect makes a directory on the event loop. */
    char dir[96];
    _Atomic int refs; /* the owner's, and one per pump made from it */
};

/* Names the pumps' sockets apart inside their context's directory. */
static _Atomic unsigned pump_serial;

/* The reason of the first error on OpenSSL's queue, or fallback. */
static const char *ssl_reason(const char *fallback, char *out, size_t size)
{
    /* The oldest error is the cause; later ones say where it surfaced. */
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    if (e && !r) {
        ERR_error_string_n(e, out, size);
        return out;
    }
    snprintf(out, size, "%s", r ? r : fallback);
    return out;
}

static int set(const char *s)
{
    return s && s[0];
}

struct tls_ctx *tls_ctx_new(const struct tls_settings *s, struct cr_err *err)
{
    struct tls_ctx *ctx;
    char why[160];
    int ok = 1;

    if (set(s->key_file) && !set(s->cert_file)) {
        cr_err_set(err, CR_EINVAL, "ssl_keyfile without ssl_certfile");
        return NULL;
    }
    /* OpenSSL 3 reports a missing file as "system lib": say it as errno does. */
    {
        const char *const files[][2] = {{"ssl_ca_certs", s->ca_file},
                                        {"ssl_ca_path", s->ca_path},
                                        {"ssl_certfile", s->cert_file},
                                        {"ssl_keyfile", s->key_file}};
        for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
            if (set(files[i][1]) && access(files[i][1], R_OK) != 0) {
                cr_err_set(err, CR_EINVAL, "cannot load %s '%s': %s", files[i][0],
                           files[i][1], strerror(errno));
                return NULL;
            }
    }
    ctx = cr_calloc(1, sizeof(*ctx));
    if (!ctx) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    ERR_clear_error();
    ctx->refs = 1;
    ctx->ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx->ssl_ctx) {
        cr_err_set(err, CR_ENOMEM, "cannot make a TLS context: %s",
                   ssl_reason("out of memory", why, sizeof(why)));
        cr_free(ctx);
        return NULL;
    }
    ctx->check_hostname = s->verify && s->check_hostname;
    /* Python's default floor too; Redis speaks 1.2 and 1.3. */
    SSL_CTX_set_min_proto_version(ctx->ssl_ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx->ssl_ctx, s->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    if (set(s->ca_file) || set(s->ca_path)) {
        if (SSL_CTX_load_verify_locations(ctx->ssl_ctx,
                                          set(s->ca_file) ? s->ca_file : NULL,
                                          set(s->ca_path) ? s->ca_path : NULL) != 1) {
            ssl_reason("unreadable", why, sizeof(why));
            if (set(s->ca_file))
                cr_err_set(err, CR_EINVAL, "cannot load ssl_ca_certs '%s': %s",
                           s->ca_file, why);
            else
                cr_err_set(err, CR_EINVAL, "cannot load ssl_ca_path '%s': %s", s->ca_path,
                           why);
            ok = 0;
        }
    } else if (s->verify && SSL_CTX_set_default_verify_paths(ctx->ssl_ctx) != 1) {
        cr_err_set(err, CR_EINVAL, "cannot load the system's CA certificates: %s",
                   ssl_reason("unreadable", why, sizeof(why)));
        ok = 0;
    }
    if (ok && set(s->cert_file)) {
        const char *key = set(s->key_file) ? s->key_file : s->cert_file;
        if (SSL_CTX_use_certificate_chain_file(ctx->ssl_ctx, s->cert_file) != 1) {
            cr_err_set(err, CR_EINVAL, "cannot load ssl_certfile '%s': %s", s->cert_file,
                       ssl_reason("unreadable", why, sizeof(why)));
            ok = 0;
        } else if (SSL_CTX_use_PrivateKey_file(ctx->ssl_ctx, key, SSL_FILETYPE_PEM) !=
                   1) {
            cr_err_set(err, CR_EINVAL, "cannot load ssl_keyfile '%s': %s", key,
                       ssl_reason("unreadable", why, sizeof(why)));
            ok = 0;
        } else if (SSL_CTX_check_private_key(ctx->ssl_ctx) != 1) {
            cr_err_set(err, CR_EINVAL,
                       "ssl_keyfile '%s' does not match ssl_certfile '%s'", key,
                       s->cert_file);
            ok = 0;
        }
    }
    ERR_clear_error();
    if (ok) {
        const char *tmp = getenv("TMPDIR");
        /* sun_path holds 108 bytes: a long TMPDIR falls back to /tmp. */
        if (!tmp || !tmp[0] || strlen(tmp) > 60)
            tmp = "/tmp";
        snprintf(ctx->dir, sizeof(ctx->dir), "%s/celeriac-tls-XXXXXX", tmp);
        if (!mkdtemp(ctx->dir)) {
            cr_err_set(err, CR_EIO, "cannot make a directory in '%s': %s", tmp,
                       strerror(errno));
            ctx->dir[0] = '\0';
            ok = 0;
        }
    }
    if (!ok) {
        tls_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

void tls_ctx_free(struct tls_ctx *ctx)
{
    if (!ctx || --ctx->refs > 0)
        return;
    if (ctx->dir[0])
        rmdir(ctx->dir);
    SSL_CTX_free(ctx->ssl_ctx);
    cr_free(ctx);
}

/* ------------------------------------------------------------ the pump */

enum pump_state {
    PUMP_LISTEN,    /* waiting for hiredis to connect to the unix socket */
    PUMP_RESOLVING, /* uv_getaddrinfo() under way */
    PUMP_CONNECTING,
    PUMP_HANDSHAKE,
    PUMP_OPEN,    /* copying both ways */
    PUMP_CLOSING, /* the server's side ended cleanly: what it sent reaches hiredis */
    PUMP_DONE,    /* both sides closed or closing */
};

struct tls_pump {
    uv_loop_t *loop;
    SSL_CTX *ssl_ctx; /* one reference of our own */
    int check_hostname;
    char host[256];
    int port;
    struct tls_ctx *ctx; /* a reference: its directory holds path */
    char path[108];
    enum pump_state state;
    int freeing;
    int handles; /* open (or closing) libuv handles, and the lookup under way */
    char error[200];

    uv_pipe_t listener;
    int listener_open;
    uv_pipe_t local; /* hiredis's side */
    int local_open;
    uv_tcp_t tcp; /* the server's side */
    int tcp_open;
    uv_getaddrinfo_t gai;
    struct addrinfo *addrs, *next_addr;
    uv_connect_t connect_req;
    uv_shutdown_t shutdown_req;
    int local_paused, tcp_paused; /* reading stopped: the other side's queue is full */

    SSL *ssl;
    BIO *rbio;            /* what the server sent, for OpenSSL to read */
    BIO *wbio;            /* what OpenSSL wrote, for the server */
    char buf[READ_CHUNK]; /* libuv reads into it; used up before the next read */
};

struct pump_write {
    uv_write_t req;
    struct tls_pump *p;
    char data[];
};

static void start_tcp_connect(struct tls_pump *p);
static void pump_plaintext_in(struct tls_pump *p);

static void pump_release(struct tls_pump *p)
{
    if (!p->freeing || p->handles)
        return;
    if (p->addrs)
        uv_freeaddrinfo(p->addrs);
    SSL_free(p->ssl);     /* frees both BIOs */
    tls_ctx_free(p->ctx); /* after the socket is gone: the directory may go */
    cr_free(p);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct tls_pump *p = h->data;
    p->handles--;
    pump_release(p);
}

static void close_handle(struct tls_pump *p, uv_handle_t *h, int *open)
{
    if (!*open)
        return;
    *open = 0;
    uv_close(h, on_handle_closed);
    (void)p;
}

static void remove_socket(struct tls_pump *p)
{
    if (p->path[0]) {
        unlink(p->path);
        p->path[0] = '\0';
    }
}

/* Ends the connection: hiredis sees its socket closed. The first reason
 * stays. */
static void fail(struct tls_pump *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void fail(struct tls_pump *p, const char *fmt, ...)
{
    if (!p->error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->error, sizeof(p->error), fmt, ap);
        va_end(ap);
    }
    p->state = PUMP_DONE;
    close_handle(p, (uv_handle_t *)&p->listener, &p->listener_open);
    close_handle(p, (uv_handle_t *)&p->tcp, &p->tcp_open);
    close_handle(p, (uv_handle_t *)&p->local, &p->local_open);
    remove_socket(p);
}

/* Why OpenSSL stopped, for fail(): the certificate's verdict when that was
 * it, else the newest reason on the error queue. */
static void fail_ssl(struct tls_pump *p, const char *during)
{
    char why[160];
    unsigned long e = ERR_peek_last_error();
    long v = p->ssl ? SSL_get_verify_result(p->ssl) : X509_V_OK;
    if (e && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && v != X509_V_OK)
        fail(p, "TLS: certificate verify failed (%s)", X509_verify_cert_error_string(v));
    else
        fail(p, "TLS: %s%s", during, ssl_reason("failed", why, sizeof(why)));
    ERR_clear_error();
}

/* ---- writes, bounded */

static void resume(struct tls_pump *p);

static void on_written(uv_write_t *req, int status)
{
    struct pump_write *w = (struct pump_write *)req;
    struct tls_pump *p = w->p;
    cr_free(w);
    if (status < 0) {
        if (status != UV_ECANCELED && p->state != PUMP_DONE)
            fail(p, "%s: %s",
                 req->handle == (uv_stream_t *)&p->tcp
                     ? "TLS: cannot write to the server"
                     : "TLS: cannot write to the client",
                 uv_strerror(status));
        return;
    }
    resume(p);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct tls_pump *p = h->data;
    (void)suggested;
    *buf = uv_buf_init(p->buf, sizeof(p->buf));
}

static void on_local_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);
static void on_tcp_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

/* Reading a side starts again once the other side's queue is down to half. */
static void resume(struct tls_pump *p)
{
    if (p->state != PUMP_OPEN)
        return;
    if (p->local_paused && p->tcp.write_queue_size < TLS_PUMP_QUEUE_MAX_BYTES / 2) {
        p->local_paused = 0;
        uv_read_start((uv_stream_t *)&p->local, alloc_cb, on_local_read);
    }
    if (p->tcp_paused && p->local.write_queue_size < TLS_PUMP_QUEUE_MAX_BYTES / 2) {
        p->tcp_paused = 0;
        uv_read_start((uv_stream_t *)&p->tcp, alloc_cb, on_tcp_read);
    }
}

/* Queues a copy of data on s. Returns 0, or -1 after fail(). */
static int queue_write(struct tls_pump *p, uv_stream_t *s, const char *data, size_t n)
{
    struct pump_write *w = cr_malloc(sizeof(*w) + n);
    uv_buf_t b;
    int rc;
    if (!w) {
        fail(p, "TLS: out of memory");
        return -1;
    }
    w->p = p;
    memcpy(w->data, data, n);
    b = uv_buf_init(w->data, (unsigned int)n);
    rc = uv_write(&w->req, s, &b, 1, on_written);
    if (rc < 0) {
        cr_free(w);
        fail(p, "TLS: cannot write: %s", uv_strerror(rc));
        return -1;
    }
    return 0;
}

/* Sends what OpenSSL has written to the server. Returns 0 or -1 (failed). */
static int flush_records(struct tls_pump *p)
{
    char out[16384];
    int n;
    while ((n = BIO_read(p->wbio, out, sizeof(out))) > 0)
        if (queue_write(p, (uv_stream_t *)&p->tcp, out, (size_t)n))
            return -1;
    if (p->local_open && !p->local_paused &&
        p->tcp.write_queue_size > TLS_PUMP_QUEUE_MAX_BYTES) {
        p->local_paused = 1;
        uv_read_stop((uv_stream_t *)&p->local);
    }
    return 0;
}

/* ---- hiredis's side */

/* The server ended cleanly: hiredis gets what was already decrypted, then
 * its socket is shut and closed. */
static void on_local_shut(uv_shutdown_t *req, int status)
{
    struct tls_pump *p = req->data;
    (void)status;
    fail(p, "TLS: connection closed by the server");
}

static void end_cleanly(struct tls_pump *p)
{
    /* Said now: hiredis may see the end before on_local_shut() runs. */
    if (!p->error[0])
        snprintf(p->error, sizeof(p->error), "TLS: connection closed by the server");
    p->state = PUMP_CLOSING;
    close_handle(p, (uv_handle_t *)&p->tcp, &p->tcp_open);
    uv_read_stop((uv_stream_t *)&p->local);
    p->shutdown_req.data = p;
    if (uv_shutdown(&p->shutdown_req, (uv_stream_t *)&p->local, on_local_shut) < 0)
        fail(p, "TLS: connection closed by the server");
}

static void on_local_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct tls_pump *p = s->data;
    if (n == 0 || p->state != PUMP_OPEN)
        return;
    if (n < 0) {
        /* hiredis went away: nothing to report. */
        fail(p, "closed by the client");
        return;
    }
    ERR_clear_error();
    if (SSL_write(p->ssl, buf->base, (int)n) != (int)n) {
        fail_ssl(p, "");
        return;
    }
    flush_records(p);
}

/* Hands hiredis what the server's records decrypt to. */
static void pump_plaintext_in(struct tls_pump *p)
{
    char out[16384];
    for (;;) {
        int n, e;
        ERR_clear_error();
        n = SSL_read(p->ssl, out, sizeof(out));
        if (n > 0) {
            if (queue_write(p, (uv_stream_t *)&p->local, out, (size_t)n))
                return;
            continue;
        }
        e = SSL_get_error(p->ssl, n);
        if (e == SSL_ERROR_WANT_READ) /* all read; maybe a ticket to answer */
            break;
        if (e == SSL_ERROR_ZERO_RETURN) { /* close_notify */
            if (flush_records(p) == 0)
                end_cleanly(p);
            return;
        }
        fail_ssl(p, "");
        return;
    }
    if (flush_records(p))
        return;
    if (!p->tcp_paused && p->local.write_queue_size > TLS_PUMP_QUEUE_MAX_BYTES) {
        p->tcp_paused = 1;
        uv_read_stop((uv_stream_t *)&p->tcp);
    }
}

/* ---- the server's side */

static void step_handshake(struct tls_pump *p)
{
    int rc, e;
    ERR_clear_error();
    rc = SSL_do_handshake(p->ssl);
    if (rc == 1) {
        if (flush_records(p))
            return;
        p->state = PUMP_OPEN;
        /* Only now what hiredis has sent (AUTH, PING...) is read. */
        if (uv_read_start((uv_stream_t *)&p->local, alloc_cb, on_local_read) < 0) {
            fail(p, "TLS: cannot read from the client");
            return;
        }
        pump_plaintext_in(p); /* records that came with the last flight */
        return;
    }
    e = SSL_get_error(p->ssl, rc);
    if (e == SSL_ERROR_WANT_READ) {
        flush_records(p);
        return;
    }
    fail_ssl(p, "handshake failed: ");
}

static void on_tcp_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct tls_pump *p = s->data;
    if (n == 0 || (p->state != PUMP_HANDSHAKE && p->state != PUMP_OPEN))
        return;
    if (n < 0) {
        if (n != UV_EOF)
            fail(p, "TLS: connection to %.120s:%d: %s", p->host, p->port,
                 uv_strerror((int)n));
        else if (p->state == PUMP_HANDSHAKE)
            fail(p, "TLS: handshake failed: connection closed by the server");
        else
            end_cleanly(p);
        return;
    }
    if (BIO_write(p->rbio, buf->base, (int)n) != (int)n) {
        fail(p, "TLS: out of memory");
        return;
    }
    if (p->state == PUMP_HANDSHAKE)
        step_handshake(p);
    else
        pump_plaintext_in(p);
}

static int is_ip(const char *host)
{
    unsigned char a[16];
    return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

static void start_tls(struct tls_pump *p)
{
    ERR_clear_error();
    p->ssl = SSL_new(p->ssl_ctx);
    p->rbio = BIO_new(BIO_s_mem());
    p->wbio = BIO_new(BIO_s_mem());
    if (!p->ssl || !p->rbio || !p->wbio) {
        BIO_free(p->rbio);
        BIO_free(p->wbio);
        p->rbio = p->wbio = NULL;
        fail(p, "TLS: out of memory");
        return;
    }
    SSL_set_bio(p->ssl, p->rbio, p->wbio); /* the SSL owns them now */
    /* SNI for names only, as Python sends it (an address is not a name). */
    if (!is_ip(p->host))
        SSL_set_tlsext_host_name(p->ssl, p->host);
    if (p->check_hostname) {
        int ok = is_ip(p->host)
                     ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(p->ssl), p->host)
                     : SSL_set1_host(p->ssl, p->host);
        if (ok != 1) {
            fail(p, "TLS: cannot check the host name '%.120s'", p->host);
            return;
        }
    }
    SSL_set_connect_state(p->ssl);
    p->state = PUMP_HANDSHAKE;
    if (uv_read_start((uv_stream_t *)&p->tcp, alloc_cb, on_tcp_read) < 0) {
        fail(p, "TLS: cannot read from the server");
        return;
    }
    step_handshake(p);
}

static void on_tcp_closed_retry(uv_handle_t *h)
{
    struct tls_pump *p = h->data;
    p->handles--;
    if (p->freeing) {
        pump_release(p);
        return;
    }
    if (p->state == PUMP_CONNECTING)
        start_tcp_connect(p);
}

static void on_tcp_connected(uv_connect_t *req, int status)
{
    struct tls_pump *p = req->data;
    if (status == UV_ECANCELED || p->state != PUMP_CONNECTING)
        return;
    if (status < 0) {
        if (p->next_addr) {
            /* Another address of the name: the handle is made again once
             * this one has closed. */
            p->tcp_open = 0;
            uv_close((uv_handle_t *)&p->tcp, on_tcp_closed_retry);
            return;
        }
        fail(p, "cannot connect to %.120s:%d: %s", p->host, p->port, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&p->tcp, 1);
    start_tls(p);
}

static void start_tcp_connect(struct tls_pump *p)
{
    struct addrinfo *ai = p->next_addr;
    int rc;
    p->next_addr = ai->ai_next;
    rc = uv_tcp_init(p->loop, &p->tcp);
    if (rc < 0) {
        fail(p, "cannot connect to %.120s:%d: %s", p->host, p->port, uv_strerror(rc));
        return;
    }
    p->tcp.data = p;
    p->tcp_open = 1;
    p->handles++;
    p->connect_req.data = p;
    rc = uv_tcp_connect(&p->connect_req, &p->tcp, ai->ai_addr, on_tcp_connected);
    if (rc < 0)
        fail(p, "cannot connect to %.120s:%d: %s", p->host, p->port, uv_strerror(rc));
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct tls_pump *p = req->data;
    p->handles--;
    if (p->freeing) {
        if (res)
            uv_freeaddrinfo(res);
        pump_release(p);
        return;
    }
    if (p->state != PUMP_RESOLVING) {
        if (res)
            uv_freeaddrinfo(res);
        return;
    }
    if (status < 0 || !res) {
        fail(p, "cannot resolve '%.120s': %s", p->host, uv_strerror(status));
        return;
    }
    p->addrs = p->next_addr = res;
    p->state = PUMP_CONNECTING;
    start_tcp_connect(p);
}

/* hiredis connected: the one connection this pump waits for. */
static void on_accept(uv_stream_t *server, int status)
{
    struct tls_pump *p = server->data;
    struct addrinfo hints;
    struct ucred peer;
    socklen_t peer_len = sizeof(peer);
    uv_os_fd_t fd;
    char port[16];
    int rc;

    if (p->state != PUMP_LISTEN)
        return;
    if (status < 0) {
        fail(p, "TLS: local socket: %s", uv_strerror(status));
        return;
    }
    uv_pipe_init(p->loop, &p->local, 0);
    p->local.data = p;
    p->local_open = 1;
    p->handles++;
    rc = uv_accept(server, (uv_stream_t *)&p->local);
    /* One connection, and ours: the directory is 0700, and the peer must be
     * this process (another of the same user could have raced us). */
    if (rc == 0 && (uv_fileno((uv_handle_t *)&p->local, &fd) != 0 ||
                    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 ||
                    peer.pid != getpid()))
        rc = UV_EPERM;
    close_handle(p, (uv_handle_t *)&p->listener, &p->listener_open);
    remove_socket(p);
    if (rc < 0) {
        fail(p, "TLS: local socket: %s", uv_strerror(rc));
        return;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", p->port);
    p->gai.data = p;
    p->state = PUMP_RESOLVING;
    rc = uv_getaddrinfo(p->loop, &p->gai, on_resolved, p->host, port, &hints);
    if (rc < 0) {
        fail(p, "cannot resolve '%.120s': %s", p->host, uv_strerror(rc));
        return;
    }
    p->handles++; /* the lookup holds the pump until its callback */
}

struct tls_pump *tls_pump_new(uv_loop_t *loop, struct tls_ctx *ctx, const char *host,
                              int port, struct cr_err *err)
{
    struct tls_pump *p;
    int rc;

    if (strlen(host) >= sizeof(p->host)) {
        cr_err_set(err, CR_EINVAL, "host name too long");
        return NULL;
    }
    p = cr_calloc(1, sizeof(*p));
    if (!p) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    p->loop = loop;
    p->ssl_ctx = ctx->ssl_ctx;
    p->ctx = ctx;
    ctx->refs++;
    p->check_hostname = ctx->check_hostname;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    snprintf(p->path, sizeof(p->path), "%s/s%u", ctx->dir, pump_serial++);
    uv_pipe_init(loop, &p->listener, 0);
    p->listener.data = p;
    p->listener_open = 1;
    p->handles++;
    rc = uv_pipe_bind(&p->listener, p->path);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&p->listener, 1, on_accept);
    if (rc < 0) {
        cr_err_set(err, CR_EIO, "cannot listen on '%s': %s", p->path, uv_strerror(rc));
        goto fail;
    }
    return p;
fail:
    tls_pump_free(p);
    return NULL;
}

const char *tls_pump_path(const struct tls_pump *p)
{
    return p->path;
}

const char *tls_pump_error(const struct tls_pump *p)
{
    return p->error;
}

const char *tls_pump_stalled(const struct tls_pump *p)
{
    switch (p->state) {
    case PUMP_LISTEN:
    case PUMP_RESOLVING:
    case PUMP_CONNECTING:
        return "connection timed out";
    case PUMP_HANDSHAKE:
        return "TLS handshake timed out";
    default:
        return NULL;
    }
}

int tls_pump_open(const struct tls_pump *p)
{
    return p->state == PUMP_OPEN;
}

void tls_pump_free(struct tls_pump *p)
{
    if (!p)
        return;
    p->freeing = 1;
    if (p->state == PUMP_RESOLVING)
        uv_cancel((uv_req_t *)&p->gai); /* its callback still comes */
    p->state = PUMP_DONE;
    close_handle(p, (uv_handle_t *)&p->listener, &p->listener_open);
    close_handle(p, (uv_handle_t *)&p->tcp, &p->tcp_open);
    close_handle(p, (uv_handle_t *)&p->local, &p->local_open);
    remove_socket(p);
    pump_release(p);
}
