/* sdnotify.c -- the sd_notify datagram protocol and the watchdog timer. */
#include "sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/log.h"

int sdnotify_addr(const char *name, struct sockaddr_un *addr, socklen_t *len)
{
    size_t n = name ? strlen(name) : 0;
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    /* systemd itself only sends absolute paths or '@' names; anything else is
     * a stray value that must not make us write to a socket in our cwd. */
    if (n < 2 || (name[0] != '/' && name[0] != '@') || n > sizeof(addr->sun_path))
        return -1;
    if (name[0] == '/' && n == sizeof(addr->sun_path))
        return -1; /* a path needs its terminating NUL */
    memcpy(addr->sun_path, name, n);
    if (name[0] == '@')
        addr->sun_path[0] = '\0';
    /* An abstract name is exactly its bytes: no trailing NUL counted. */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (name[0] == '/'));
    return 0;
}

uint64_t sdnotify_watchdog_usec(const char *usec, const char *pid, pid_t self)
{
    char *end;
    unsigned long long v;
    if (!usec || !*usec)
        return 0;
    if (pid && *pid) {
        long long p;
        errno = 0;
        p = strtoll(pid, &end, 10);
        if (errno || *end || p != (long long)self)
            return 0;
    }
    if (*usec == '-')
        return 0;
    errno = 0;
    v = strtoull(usec, &end, 10);
    if (errno || *end || v == 0)
        return 0;
    return (uint64_t)v;
}

static int fit(int n, size_t cap)
{
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int sdnotify_reloading_msg(char *out, size_t cap, uint64_t mono_usec)
{
    return fit(snprintf(out, cap, "RELOADING=1\nMONOTONIC_USEC=%" PRIu64, mono_usec),
               cap);
}

int sdnotify_ready_msg(char *out, size_t cap, pid_t pid, const char *status)
{
    int line = (int)strcspn(status ? status : "", "\n");
    return fit(snprintf(out, cap, "READY=1\nMAINPID=%ld\nSTATUS=%.*s", (long)pid, line,
                        status ? status : ""),
               cap);
}

/* ------------------------------------------------------------ on the loop */

void sdnotify_send(struct sdnotify *n, const char *msg)
{
    ssize_t r;
    if (n->fd < 0)
        return;
    /* MSG_DONTWAIT on a non-blocking socket: a manager that is slow to read
     * costs us a lost message, never a stalled loop. */
    do
        r = sendto(n->fd, msg, strlen(msg), MSG_DONTWAIT | MSG_NOSIGNAL,
                   (struct sockaddr *)&n->addr, n->addr_len);
    while (r < 0 && errno == EINTR);
    if (r < 0 && !n->warned) {
        n->warned = 1;
        LOG(LOG_WARNING, "systemd notify: %s (further failures not logged)",
            strerror(errno));
    }
}

static void on_watchdog(uv_timer_t *t)
{
    sdnotify_send(t->data, "WATCHDOG=1");
}

void sdnotify_init(struct sdnotify *n, uv_loop_t *loop)
{
    const char *name = getenv("NOTIFY_SOCKET");
    memset(n, 0, sizeof(*n));
    n->fd = -1;
    if (!name || !*name)
        return;
    if (sdnotify_addr(name, &n->addr, &n->addr_len)) {
        LOG(LOG_WARNING,
            "systemd notify: NOTIFY_SOCKET=%s is not a socket name; not notifying", name);
        return;
    }
    /* CLOEXEC: a warm restart re-executes us and opens its own. */
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (n->fd < 0) {
        LOG(LOG_WARNING, "systemd notify: socket: %s; not notifying", strerror(errno));
        return;
    }
    n->watchdog_usec =
        sdnotify_watchdog_usec(getenv("WATCHDOG_USEC"), getenv("WATCHDOG_PID"), getpid());
    if (!n->watchdog_usec)
        return;
    uv_timer_init(loop, &n->watchdog);
    n->watchdog.data = n;
    n->timer_live = 1;
    /* Half the period, as systemd advises: one late turn is not a kill. A
     * period under 2 ms is pinged every millisecond. */
    {
        uint64_t ms = n->watchdog_usec / 2000;
        if (!ms)
            ms = 1;
        uv_timer_start(&n->watchdog, on_watchdog, ms, ms);
    }
    uv_unref((uv_handle_t *)&n->watchdog);
    LOG(LOG_INFO, "systemd watchdog: pinging every %" PRIu64 " ms",
        n->watchdog_usec / 2000);
}

void sdnotify_ready(struct sdnotify *n, const char *status)
{
    char msg[512];
    if (n->fd < 0)
        return;
    if (sdnotify_ready_msg(msg, sizeof(msg), getpid(), status) < 0)
        sdnotify_ready_msg(msg, sizeof(msg), getpid(), "");
    sdnotify_send(n, msg);
}

void sdnotify_reloading(struct sdnotify *n)
{
    char msg[128];
    struct timespec ts;
    if (n->fd < 0)
        return;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    sdnotify_reloading_msg(msg, sizeof(msg),
                           (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
    sdnotify_send(n, msg);
}

void sdnotify_stopping(struct sdnotify *n)
{
    sdnotify_send(n, "STOPPING=1");
}

static void on_timer_closed(uv_handle_t *h)
{
    (void)h;
}

void sdnotify_release(struct sdnotify *n)
{
    if (n->timer_live) {
        uv_close((uv_handle_t *)&n->watchdog, on_timer_closed);
        n->timer_live = 0;
    }
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}
