/* sdnotify.h -- tells systemd (Type=notify) when the worker is ready, reloading
 * or stopping, and keeps its watchdog fed from the worker's one loop.
 *
 * The protocol is one datagram per message to the AF_UNIX socket named in
 * $NOTIFY_SOCKET ('@' first: an abstract name), so no libsystemd is needed.
 * Without $NOTIFY_SOCKET every call is a no-op. Sends never block the loop: a
 * full or missing socket loses that one message, and the first failure is
 * logged once. Not thread-safe: loop thread only. */
#ifndef CR_SDNOTIFY_H
#define CR_SDNOTIFY_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <uv.h>

/* Embedded in its owner (the worker). */
struct sdnotify {
    /* read-only */
    int fd;                 /* -1: not under systemd */
    uint64_t watchdog_usec; /* 0: no watchdog asked for */
    /* private */
    struct sockaddr_un addr;
    socklen_t addr_len;
    int warned;
    uv_timer_t watchdog;
    int timer_live;
};

/* ---- pure helpers (no I/O; unit-tested) */

/* Fills addr from a $NOTIFY_SOCKET value: a path ("/run/systemd/notify") or
 * an abstract name ("@name", the '@' becoming a NUL). Returns 0, or -1 for an
 * empty, relative or too long name. */
int sdnotify_addr(const char *name, struct sockaddr_un *addr, socklen_t *len);

/* The watchdog period systemd asks for: $WATCHDOG_USEC when set to a positive
 * number and $WATCHDOG_PID is unset or names self; else 0. */
uint64_t sdnotify_watchdog_usec(const char *usec, const char *pid, pid_t self);

/* Writes "RELOADING=1\nMONOTONIC_USEC=<mono_usec>" (systemd 253+ wants the
 * time with the reload to tell it from an older one) into out. Returns the
 * length, or -1 if cap is too small. */
int sdnotify_reloading_msg(char *out, size_t cap, uint64_t mono_usec);

/* Writes "READY=1\nMAINPID=<pid>\nSTATUS=<status>" into out (status is cut at
 * its first newline: one STATUS line). Returns the length, or -1 if cap is
 * too small. */
int sdnotify_ready_msg(char *out, size_t cap, pid_t pid, const char *status);

/* ---- on the loop */

/* Reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID (left set: a re-exec
 * of the same process reads them again). When a watchdog is asked for, starts
 * a timer on loop that sends WATCHDOG=1 every half period; the timer is
 * unreferenced, so it never keeps the loop alive, and since it runs on the
 * one loop a stuck loop stops the pings. Never fails: a bad value is logged
 * and notification is off. Release with sdnotify_release(). */
void sdnotify_init(struct sdnotify *n, uv_loop_t *loop);

/* Sends one message (the protocol's "KEY=value" lines). A no-op when not
 * under systemd. */
void sdnotify_send(struct sdnotify *n, const char *msg);

void sdnotify_ready(struct sdnotify *n, const char *status);
void sdnotify_reloading(struct sdnotify *n);
void sdnotify_stopping(struct sdnotify *n);

/* Stops and closes the watchdog timer (its close completes on the owner's
 * next loop run) and the socket. The struct can be initialised again after. */
void sdnotify_release(struct sdnotify *n);

#endif
