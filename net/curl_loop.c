/* curl_loop.c -- a curl multi handle on the libuv loop (see curl_loop.h). */
#include "curl_loop.h"

#include <sys/epoll.h>
#include <unistd.h>

#include "util/alloc.h"
#include "util/curl_epoll.h"

struct curl_loop {
    CURLM *multi;
    int epfd;
    uv_poll_t epoll;
    uv_timer_t timer;
    int closed_handles;
    curl_loop_done_fn *done;
    void *owner;
};

static void check_multi_info(struct curl_loop *cl)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(cl->multi, &left))) {
        void *req = NULL;
        long status = 0;
        CURLcode cc;
        CURL *easy = m->easy_handle;
        if (m->msg != CURLMSG_DONE)
            continue;
        cc = m->data.result; /* m is curl's until the handle is removed */
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&req);
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
        curl_multi_remove_handle(cl->multi, easy);
        cl->done(cl->owner, req, cc, status);
    }
}

static void on_sockets_ready(uv_poll_t *p, int status, int events)
{
    struct curl_loop *cl = p->data;
    struct epoll_event ev[32];
    int n;
    (void)status;
    (void)events;
    n = epoll_wait(cl->epfd, ev, 32, 0);
    for (int i = 0; i < n; i++) {
        int running;
        curl_multi_socket_action(cl->multi, ev[i].data.fd, curl_epoll_flags(ev[i].events),
                                 &running);
    }
    check_multi_info(cl);
}

static int on_socket(CURL *easy, curl_socket_t fd, int what, void *userp, void *socketp)
{
    struct curl_loop *cl = userp;
    (void)easy;
    return curl_epoll_socket(cl->epfd, cl->multi, fd, what, socketp, cl);
}

static void on_timer(uv_timer_t *t)
{
    struct curl_loop *cl = t->data;
    int running;
    curl_multi_socket_action(cl->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_multi_info(cl);
}

static int on_timer_change(CURLM *multi, long timeout_ms, void *userp)
{
    struct curl_loop *cl = userp;
    (void)multi;
    if (timeout_ms < 0)
        uv_timer_stop(&cl->timer);
    else
        uv_timer_start(&cl->timer, on_timer, (uint64_t)timeout_ms, 0);
    return 0;
}

struct curl_loop *curl_loop_new(uv_loop_t *loop, long maxconnects,
                                curl_loop_done_fn *done, void *owner)
{
    struct curl_loop *cl = cr_calloc(1, sizeof(*cl));
    if (!cl)
        return NULL;
    cl->done = done;
    cl->owner = owner;
    cl->epfd = epoll_create1(EPOLL_CLOEXEC);
    cl->multi = cl->epfd >= 0 ? curl_multi_init() : NULL;
    if (!cl->multi || uv_poll_init(loop, &cl->epoll, cl->epfd) != 0) {
        if (cl->multi)
            curl_multi_cleanup(cl->multi);
        if (cl->epfd >= 0)
            close(cl->epfd);
        cr_free(cl);
        return NULL;
    }
    cl->epoll.data = cl;
    curl_multi_setopt(cl->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(cl->multi, CURLMOPT_SOCKETDATA, cl);
    curl_multi_setopt(cl->multi, CURLMOPT_TIMERFUNCTION, on_timer_change);
    curl_multi_setopt(cl->multi, CURLMOPT_TIMERDATA, cl);
    curl_multi_setopt(cl->multi, CURLMOPT_MAXCONNECTS, maxconnects);
    uv_timer_init(loop, &cl->timer);
    cl->timer.data = cl;
    uv_poll_start(&cl->epoll, UV_READABLE, on_sockets_ready);
    return cl;
}

int curl_loop_add(struct curl_loop *cl, CURL *easy)
{
    return curl_multi_add_handle(cl->multi, easy) == CURLM_OK ? 0 : -1;
}

void curl_loop_remove(struct curl_loop *cl, CURL *easy)
{
    curl_multi_remove_handle(cl->multi, easy);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct curl_loop *cl = h->data;
    if (++cl->closed_handles < 2)
        return;
    close(cl->epfd);
    cr_free(cl);
}

void curl_loop_free(struct curl_loop *cl)
{
    if (!cl)
        return;
    curl_multi_cleanup(cl->multi);
    cl->multi = NULL;
    uv_close((uv_handle_t *)&cl->epoll, on_handle_closed);
    uv_close((uv_handle_t *)&cl->timer, on_handle_closed);
}
