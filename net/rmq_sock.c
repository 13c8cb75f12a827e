/* rmq_sock.c -- rabbitmq-c's TCP socket with writes that never wait. */
#include "rmq_sock.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "util/alloc.h"
#include "util/buf.h"

#if AMQP_VERSION < AMQP_VERSION_CODE(0, 8, 0, 0)
#error "rmq_sock needs the six-method socket table of rabbitmq-c 0.8 or later"
#endif

/* rabbitmq-c's socket methods (its private amqp_socket.h), in its order. The
 * close method's second argument is an enum there; an int is passed the same
 * way. */
struct sock_methods {
    ssize_t (*send)(void *self, const void *buf, size_t len, int flags);
    ssize_t (*recv)(void *self, void *buf, size_t len, int flags);
    int (*open)(void *self, const char *host, int port, const struct timeval *timeout);
    int (*close)(void *self, int force);
    int (*get_sockfd)(void *self);
    void (*del)(void *self);
};

/* What every rabbitmq-c socket object starts with. */
struct sock_head {
    const struct sock_methods *methods;
};

/* rabbitmq-c's AMQP_SF_MORE: more of the frame follows at once. */
#define SEND_MORE 1
/* The sent part of the queue is cut off once it is this large and at least
 * half the queue, so that draining a long queue costs O(n) in all. */
#define COMPACT_BYTES (64u * 1024)

struct rmq_sock {
    /* private */
    struct sock_methods methods; /* first: the socket's table points here */
    const struct sock_methods *real;
    void *sock;   /* the socket object whose table this is */
    struct buf q; /* bytes the kernel did not take yet: q.data[head..q.len) */
    size_t head;
    size_t max_queued;
    uint64_t received;
};

/* The wrapper of a socket, found from the table the socket points to. */
static struct rmq_sock *of(void *self)
{
    return (struct rmq_sock *)(void *)((struct sock_head *)self)->methods;
}

/* Sends what the kernel takes now. Returns the bytes sent (maybe 0), or
 * AMQP_STATUS_SOCKET_ERROR with errno set. */
static ssize_t send_some(int fd, const char *p, size_t len, int more)
{
    size_t done = 0;
    int flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0);
    while (done < len) {
        ssize_t n = send(fd, p + done, len - done, flags);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n == 0)
            errno = EPIPE;
        return AMQP_STATUS_SOCKET_ERROR;
    }
    return (ssize_t)done;
}

static void compact(struct rmq_sock *s)
{
    if (s->head == s->q.len) {
        buf_reset(&s->q);
        s->head = 0;
    } else if (s->head >= COMPACT_BYTES && s->head * 2 >= s->q.len) {
        buf_consume(&s->q, s->head);
        s->head = 0;
    }
}

/* Always the whole frame, as far as rabbitmq-c can tell: either the kernel
 * took it, or the rest waits here behind what already waits. */
static ssize_t w_send(void *self, const void *buf, size_t len, int flags)
{
    struct rmq_sock *s = of(self);
    int fd = s->real->get_sockfd(self);
    size_t done = 0;

    if (fd < 0)
        return AMQP_STATUS_SOCKET_CLOSED;
    if (s->head == s->q.len) {
        ssize_t n = send_some(fd, buf, len, flags & SEND_MORE);
        if (n < 0)
            return n;
        done = (size_t)n;
        if (done == len)
            return (ssize_t)len;
    }
    if (s->max_queued && rmq_sock_queued(s) + (len - done) > s->max_queued) {
        errno = ENOBUFS;
        return AMQP_STATUS_SOCKET_ERROR;
    }
    if (buf_append(&s->q, (const char *)buf + done, len - done)) {
        errno = ENOMEM;
        return AMQP_STATUS_SOCKET_ERROR;
    }
    return (ssize_t)len;
}

static ssize_t w_recv(void *self, void *buf, size_t len, int flags)
{
    struct rmq_sock *s = of(self);
    ssize_t n = s->real->recv(self, buf, len, flags);
    if (n > 0)
        s->received += (uint64_t)n;
    return n;
}

static int w_open(void *self, const char *host, int port, const struct timeval *timeout)
{
    return of(self)->real->open(self, host, port, timeout);
}

/* What waits is for a socket that is going away: dropped. */
static int w_close(void *self, int force)
{
    struct rmq_sock *s = of(self);
    buf_reset(&s->q);
    s->head = 0;
    return s->real->close(self, force);
}

static int w_get_sockfd(void *self)
{
    return of(self)->real->get_sockfd(self);
}

static void w_del(void *self)
{
    struct rmq_sock *s = of(self);
    s->real->del(self);
    buf_release(&s->q);
    cr_free(s);
}

struct rmq_sock *rmq_sock_wrap(amqp_socket_t *sock, size_t max_queued)
{
    struct sock_head *h = (struct sock_head *)(void *)sock;
    struct rmq_sock *s = cr_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->real = h->methods;
    s->sock = sock;
    s->methods.send = w_send;
    s->methods.recv = w_recv;
    s->methods.open = w_open;
    s->methods.close = w_close;
    s->methods.get_sockfd = w_get_sockfd;
    s->methods.del = w_del;
    buf_init(&s->q);
    s->max_queued = max_queued;
    h->methods = &s->methods;
    return s;
}

int rmq_sock_flush(struct rmq_sock *s)
{
    int fd;
    ssize_t n;

    if (s->head == s->q.len)
        return AMQP_STATUS_OK;
    fd = s->real->get_sockfd(s->sock);
    if (fd < 0)
        return AMQP_STATUS_SOCKET_CLOSED;
    n = send_some(fd, s->q.data + s->head, s->q.len - s->head, 0);
    if (n < 0)
        return (int)n;
    s->head += (size_t)n;
    compact(s);
    return AMQP_STATUS_OK;
}

size_t rmq_sock_queued(const struct rmq_sock *s)
{
    return s->q.len - s->head;
}

uint64_t rmq_sock_received(const struct rmq_sock *s)
{
    return s->received;
}
