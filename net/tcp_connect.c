/* tcp_connect.c -- a bounded TCP connect that says why it failed. */
#include "tcp_connect.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* strerror() in the lower case of our messages: "connection refused". */
static void reason(char *out, size_t size, int e)
{
    snprintf(out, size, "%s", strerror(e));
    out[0] = (char)tolower((unsigned char)out[0]);
}

/* One address: returns the socket, or -1 with errno-like *e (ETIMEDOUT when
 * the deadline passed). */
static int try_one(const struct addrinfo *a, int64_t deadline, int *e)
{
    int one = 1, fd, soerr = 0;
    socklen_t len = sizeof(soerr);

    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) {
        *e = errno;
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        *e = errno;
        close(fd);
        return -1;
    }
    for (;;) {
        struct pollfd p = {fd, POLLOUT, 0};
        int64_t left = deadline - now_ms();
        int n;
        if (left <= 0) {
            *e = ETIMEDOUT;
            close(fd);
            return -1;
        }
        n = poll(&p, 1, (int)left);
        if (n > 0)
            break;
        if (n < 0 && errno != EINTR) {
            *e = errno;
            close(fd);
            return -1;
        }
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
        soerr = errno;
    if (soerr) {
        *e = soerr;
        close(fd);
        return -1;
    }
    return fd;
}

int tcp_connect(const char *host, int port, double timeout_s, struct cr_err *err)
{
    struct addrinfo hints, *res = NULL;
    char service[16], why[160];
    int64_t deadline = now_ms() + (int64_t)(timeout_s * 1000);
    int rc, e = 0, fd = -1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    snprintf(service, sizeof(service), "%d", port);
    rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0)
        return cr_err_set(err, CR_EBROKER, "cannot resolve '%s': %s", host,
                          rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    for (const struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = try_one(a, deadline, &e);
        if (fd < 0 && e == ETIMEDOUT)
            break;
    }
    freeaddrinfo(res);
    if (fd >= 0)
        return fd;
    if (e == ETIMEDOUT)
        return cr_err_set(err, CR_EBROKER, "timed out after %g s", timeout_s);
    reason(why, sizeof(why), e ? e : EHOSTUNREACH);
    return cr_err_set(err, CR_EBROKER, "%s", why);
}
