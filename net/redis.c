/* redis.c -- hiredis async glue for libuv that reports poll errors. */
#include "redis.h"

#include <hiredis/hiredis.h>

#include "util/alloc.h"

struct redis_uv {
    redisAsyncContext *ac; /* NULL once hiredis has let go */
    uv_poll_t poll;
    int events; /* what hiredis wants watched */
    int polled; /* what the poll handle watches */
};

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct redis_uv *r = h->data;
    if (status < 0) {
        r->polled = 0;
        /* libuv has stopped the handle: let hiredis find the error itself.
         * A write attempt covers a failed connect, a read everything else. */
        if (r->ac && (r->ac->c.flags & REDIS_CONNECTED))
            redisAsyncHandleRead(r->ac);
        else if (r->ac)
            redisAsyncHandleWrite(r->ac);
        return;
    }
    if (r->ac && (events & UV_READABLE))
        redisAsyncHandleRead(r->ac);
    /* The read may have freed the context (disconnect): check again. */
    if (r->ac && (events & UV_WRITABLE))
        redisAsyncHandleWrite(r->ac);
}

/* hiredis asks for the write event on every command, though it is already
 * watched while its buffer waits. libuv's uv_poll_start() takes the descriptor
 * out of epoll and puts it back even when nothing changes: two system calls
 * per command, four per task in the concurrency bench. */
static void update(struct redis_uv *r)
{
    if (r->events == r->polled)
        return;
    r->polled = r->events;
    if (r->events)
        uv_poll_start(&r->poll, r->events, on_poll);
    else
        uv_poll_stop(&r->poll);
}

static void add_read(void *p)
{
    struct redis_uv *r = p;
    r->events |= UV_READABLE;
    update(r);
}

static void del_read(void *p)
{
    struct redis_uv *r = p;
    r->events &= ~UV_READABLE;
    update(r);
}

static void add_write(void *p)
{
    struct redis_uv *r = p;
    r->events |= UV_WRITABLE;
    update(r);
}

static void del_write(void *p)
{
    struct redis_uv *r = p;
    r->events &= ~UV_WRITABLE;
    update(r);
}

static void on_closed(uv_handle_t *h)
{
    cr_free(h->data);
}

static void cleanup(void *p)
{
    struct redis_uv *r = p;
    r->ac = NULL;
    uv_poll_stop(&r->poll);
    uv_close((uv_handle_t *)&r->poll, on_closed);
}

int redis_uv_attach(redisAsyncContext *ac, uv_loop_t *loop)
{
    struct redis_uv *r;
    if (ac->ev.data)
        return REDIS_ERR;
    r = cr_calloc(1, sizeof(*r));
    if (!r)
        return REDIS_ERR;
    if (uv_poll_init_socket(loop, &r->poll, ac->c.fd) != 0) {
        cr_free(r);
        return REDIS_ERR;
    }
    r->ac = ac;
    r->poll.data = r;
    ac->ev.data = r;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    return REDIS_OK;
}
