/* listener.c -- listening TCP sockets on the loop (see listener.h). The
 * sockets are bound with plain system calls, all of them before the first loop
 * handle exists, so that a failure leaves nothing to close on the loop; then a
 * uv_poll_t per socket accepts. */
#include "listener.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/log.h"

#define ACCEPTS_PER_TURN 64 /* so that a flood of connections cannot hold the loop */
#define PAUSE_MS 200        /* out of descriptors: accepting waits this long */
#define PORT0_TRIES 4 /* port 0 over several addresses: a port free on all of them */

struct lsock {
    uv_poll_t poll;
    uv_timer_t pause; /* out of descriptors: polling resumes when it fires */
    int fd;
    int open_handles; /* freed when both handles are closed */
    struct listener *l;
};

struct listener {
    uv_loop_t *loop;
    struct lsock *socks[LISTENER_MAX_ADDRS];
    int nsocks;
    int port;
    listener_accept_fn *on_accept;
    void *privdata;
    char addrs[LISTENER_MAX_ADDRS * (INET6_ADDRSTRLEN + 4)];
};

/* ----------------------------------------------------------- addresses */

static void addr_name(const struct sockaddr *sa, char *out, size_t size)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, ip, sizeof(ip));
        snprintf(out, size, "[%s]", ip);
    } else {
        uv_ip4_name((const struct sockaddr_in *)sa, ip, sizeof(ip));
        snprintf(out, size, "%s", ip);
    }
}

static void set_port(struct sockaddr_storage *ss, int port)
{
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
}

char *listener_url_host(const char *host, char *out, size_t size)
{
    if (strchr(host, ':') && host[0] != '[')
        snprintf(out, size, "[%s]", host);
    else
        snprintf(out, size, "%s", host);
    return out;
}

/* The addresses host stands for, each once, at most LISTENER_MAX_ADDRS.
 * Returns how many, or an error. */
static int resolve(const char *host, struct sockaddr_storage *out, struct cr_err *err)
{
    struct addrinfo hints, *res = NULL;
    char name[256];
    size_t n = strlen(host);
    int rc, count = 0;

    /* "[::1]" as in a URL. */
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof(name)) {
        memcpy(name, host + 1, n - 2);
        name[n - 2] = '\0';
    } else {
        snprintf(name, sizeof(name), "%s", host);
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    /* Not AI_ADDRCONFIG: it leaves out ::1 on a machine whose only IPv6
     * address is ::1, where "localhost" should still listen on it. */
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(name[0] ? name : NULL, "0", &hints, &res);
    if (rc)
        return cr_err_set(err, CR_ENOTFOUND, "cannot resolve '%s': %s", host,
                          rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    for (struct addrinfo *ai = res; ai && count < LISTENER_MAX_ADDRS; ai = ai->ai_next) {
        int dup = 0;
        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            ai->ai_addrlen > sizeof(*out))
            continue;
        for (int i = 0; i < count && !dup; i++)
            dup = !memcmp(&out[i], ai->ai_addr, ai->ai_addrlen);
        if (dup)
            continue;
        memset(&out[count], 0, sizeof(out[count]));
        memcpy(&out[count], ai->ai_addr, ai->ai_addrlen);
        count++;
    }
    freeaddrinfo(res);
    if (!count)
        return cr_err_set(err, CR_ENOTFOUND, "cannot resolve '%s': no IP address", host);
    return count;
}

/* A listening socket on ss, or -errno. */
static int open_socket(const struct sockaddr_storage *ss)
{
    int one = 1, fd, e;
    socklen_t len = ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                              : sizeof(struct sockaddr_in);
    fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* SO_REUSEADDR lets a restart bind while the last run's connections are
     * in TIME_WAIT; it does not let two listeners share the port. IPv6
     * sockets take IPv6 only, so that "::1" does not answer on 127.0.0.1's
     * port and "::" does not also take 0.0.0.0. */
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        (ss->ss_family == AF_INET6 &&
         setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one))) ||
        bind(fd, (const struct sockaddr *)ss, len) || listen(fd, SOMAXCONN)) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* The port fd is bound to, or -errno. */
static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len))
        return -errno;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

/* An address the machine does not have (::1 with IPv6 off): with other
 * addresses to listen on, it is passed over. */
static int missing_address(int rc)
{
    return rc == -EADDRNOTAVAIL || rc == -EAFNOSUPPORT;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
    }
}

/* One line: the address, then the host it came from when that is a name. */
static int bind_error(const char *host, const struct sockaddr_storage *ss, int port,
                      int rc, struct cr_err *err)
{
    char where[INET6_ADDRSTRLEN + 4], given[300];
    addr_name((const struct sockaddr *)ss, where, sizeof(where));
    listener_url_host(host, given, sizeof(given));
    if (host[0] && strcmp(where, given))
        return cr_err_set(err, CR_EIO, "cannot listen on %s:%d ('%s'): %s", where, port,
                          host, uv_strerror(rc));
    return cr_err_set(err, CR_EIO, "cannot listen on %s:%d: %s", where, port,
                      uv_strerror(rc));
}

/* Opens a socket on each address, all on one port; fds[i] is -1 for an
 * address passed over. Returns the port, CR_ECANCELED when port 0 gave a
 * port that another address has taken (try again), or an error; on any
 * error nothing is left open. */
static int bind_all(const char *host, struct sockaddr_storage *addrs, int n, int port,
                    int *fds, struct cr_err *err)
{
    int want = port, nopen = 0, first_rc = 0, first_bad = 0;

    for (int i = 0; i < n; i++)
        fds[i] = -1;
    for (int i = 0; i < n; i++) {
        int rc;
        set_port(&addrs[i], port);
        rc = open_socket(&addrs[i]);
        if (rc >= 0) {
            fds[i] = rc;
            nopen++;
            if (port)
                continue;
            port = bound_port(rc);
            if (port > 0)
                continue;
            rc = port;
            port = 0;
        } else if (n > 1 && missing_address(rc)) {
            if (!first_rc) {
                first_rc = rc;
                first_bad = i;
            }
            continue;
        }
        close_all(fds, n);
        if (!want && rc == -EADDRINUSE && nopen)
            return CR_ECANCELED;
        return bind_error(host, &addrs[i], port, rc, err);
    }
    if (!nopen)
        return bind_error(host, &addrs[first_bad], port, first_rc, err);
    return port;
}

/* ----------------------------------------------------------- accepting */

static void on_pause_over(uv_timer_t *t);

static void on_readable(uv_poll_t *p, int status, int events)
{
    struct lsock *s = p->data;
    (void)events;
    if (status < 0) {
        LOG(LOG_WARNING, "listener: poll error: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPTS_PER_TURN; i++) {
        int one = 1;
        int fd = accept4(s->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM) {
                /* The poll is level-triggered: left on, it would spin. The
                 * connection waits in the backlog until a descriptor frees. */
                LOG(LOG_WARNING, "listener: cannot accept: %s; pausing %d ms",
                    strerror(errno), PAUSE_MS);
                uv_poll_stop(&s->poll);
                uv_timer_start(&s->pause, on_pause_over, PAUSE_MS, 0);
            }
            return;
        }
        /* Small WebSocket frames and HTTP answers go out at once. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        s->l->on_accept(s->l, fd, s->l->privdata);
    }
}

static void on_pause_over(uv_timer_t *t)
{
    struct lsock *s = t->data;
    uv_poll_start(&s->poll, UV_READABLE, on_readable);
}

/* ----------------------------------------------------------- lifecycle */

struct listener *listener_new(uv_loop_t *loop, const char *host, int port,
                              listener_accept_fn *on_accept, void *privdata,
                              struct cr_err *err)
{
    struct sockaddr_storage addrs[LISTENER_MAX_ADDRS];
    int fds[LISTENER_MAX_ADDRS];
    struct listener *l;
    int n, rc = CR_ECANCELED;
    size_t used = 0;

    if (!host)
        host = "";
    n = resolve(host, addrs, err);
    if (n < 0)
        return NULL;
    for (int i = 0; i < PORT0_TRIES && rc == CR_ECANCELED; i++)
        rc = bind_all(host, addrs, n, port, fds, err);
    if (rc == CR_ECANCELED)
        cr_err_set(err, CR_EIO,
                   "cannot listen on '%s': no port free on all its addresses", host);
    if (rc < 0)
        return NULL;
    l = cr_calloc(1, sizeof(*l));
    if (!l) {
        close_all(fds, n);
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0 && !(l->socks[l->nsocks] = cr_calloc(1, sizeof(struct lsock)))) {
            for (int j = 0; j < l->nsocks; j++)
                cr_free(l->socks[j]);
            cr_free(l);
            close_all(fds, n);
            cr_err_set(err, CR_ENOMEM, "out of memory");
            return NULL;
        }
        if (fds[i] >= 0)
            l->nsocks++;
    }
    l->loop = loop;
    l->port = rc;
    l->on_accept = on_accept;
    l->privdata = privdata;
    for (int i = 0, k = 0; i < n; i++) {
        struct lsock *s;
        char name[INET6_ADDRSTRLEN + 4];
        if (fds[i] < 0)
            continue;
        s = l->socks[k++];
        s->fd = fds[i];
        s->l = l;
        uv_poll_init(loop, &s->poll, s->fd);
        uv_timer_init(loop, &s->pause);
        s->poll.data = s->pause.data = s;
        s->open_handles = 2;
        uv_poll_start(&s->poll, UV_READABLE, on_readable);
        addr_name((const struct sockaddr *)&addrs[i], name, sizeof(name));
        used += (size_t)snprintf(l->addrs + used, sizeof(l->addrs) - used, "%s%s",
                                 used ? ", " : "", name);
    }
    return l;
}

int listener_port(const struct listener *l)
{
    return l->port;
}

const char *listener_addresses(const struct listener *l)
{
    return l->addrs;
}

static void on_closed(uv_handle_t *h)
{
    struct lsock *s = h->data;
    if (--s->open_handles == 0)
        cr_free(s);
}

void listener_free(struct listener *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->nsocks; i++) {
        struct lsock *s = l->socks[i];
        uv_close((uv_handle_t *)&s->poll, on_closed);
        uv_close((uv_handle_t *)&s->pause, on_closed);
        /* libuv forgets the descriptor in uv_close(): it can go now. */
        close(s->fd);
    }
    cr_free(l);
}
