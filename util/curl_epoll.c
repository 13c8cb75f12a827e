/* curl_epoll.c -- a curl multi handle's sockets in an epoll set (see
 * curl_epoll.h). */
#include "curl_epoll.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

int curl_epoll_socket(int epfd, CURLM *multi, curl_socket_t fd, int what, void *socketp,
                      void *owner)
{
    struct epoll_event ev;
    int op = socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;

    if (what == CURL_POLL_REMOVE) {
        if (socketp) {
            /* Usually followed by close(), which would also take it out. */
            epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
            curl_multi_assign(multi, fd, NULL);
        }
        return 0;
    }
    memset(&ev, 0, sizeof(ev));
    ev.data.fd = fd;
    if (what & CURL_POLL_IN)
        ev.events |= EPOLLIN;
    if (what & CURL_POLL_OUT)
        ev.events |= EPOLLOUT;
    if (epoll_ctl(epfd, op, fd, &ev) != 0) {
        /* The set and curl's view disagree (a socket closed without
         * CURL_POLL_REMOVE left the set by itself): the other way works. */
        op = op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
        if ((errno != EEXIST && errno != ENOENT) || epoll_ctl(epfd, op, fd, &ev) != 0)
            return -1;
    }
    if (!socketp)
        curl_multi_assign(multi, fd, owner);
    return 0;
}

int curl_epoll_flags(uint32_t events)
{
    int flags = 0;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP))
        flags |= CURL_CSELECT_IN;
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        flags |= CURL_CSELECT_OUT;
    return flags;
}
