/* rmq_broker.c -- rabbitmq-c connections pumped from the libuv loop.
 *
 * rabbitmq-c owns a non-blocking socket per connection; we watch each fd with
 * a uv_poll_t and, when it is readable, pull frames with a zero timeout until
 * the library has nothing more. Deliveries (method + header + body frames) are
 * put together here.
 *
 * Heartbeats are ours alone, on a timer of this loop: it sends ours every half
 * interval and declares a connection lost after two intervals without a byte
 * from the broker. Only bytes read count (rmq_sock counts them): what we
 * write, a readiness without data, frames the library queued earlier say
 * nothing about the broker. rabbitmq-c is told after login that there are no
 * heartbeats (see link_open), and no write ever waits for the socket
 * (rmq_sock.h): either would stop the loop, and that timer with it, on a path
 * that stopped forwarding while the worker is busy. */
#include "rmq_broker.h"
#include "broker_int.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ack_batch.h"
#include "util/log.h"
#include "util/redact.h"
#include "rmq_url.h"
#include "rmq_sock.h"
#include "protocol/rmq_json.h"
#include "protocol/delayed.h"
#include "protocol/rmq_caps.h"
#include "util/alloc.h"
#include "util/rand.h"
#include "tcp_connect.h"

/* Channels of the consuming connection. */
#define CHANNEL 1
/* Queue-depth polls (passive queue.declare) go on their own channel: a missing
 * queue closes the channel it was asked on, and that must never be channel 1. */
#define STATS_CHANNEL 2
/* Consumers without acks (the remote-control mailbox) get a channel of their
 * own, as kombu gives them, so that the task channel's prefetch window and
 * flow never hold back a revoke or an inspect while the worker is busy. */
#define CONTROL_CHANNEL 3
#define CONSUMER_CHANNEL(q) ((q)->no_ack ? CONTROL_CHANNEL : CHANNEL)
/* Our own durable queues (dead letters, park queues) are declared at set-up
 * once the consumers run (see setup_cons), on a channel that no consumer
 * uses: the one of the depth polls, which begin only after set-up. */
#define OWN_CHANNEL STATS_CHANNEL
/* The global-QoS probe at set-up (probe_global_qos): its deliveries are
 * dropped on arrival, whenever rabbitmq-c hands them over. */
#define PROBE_CHANNEL 4
/* The publishing connection's one channel, in confirm mode. */
#define PUB_CHANNEL 1
#define RPC_TIMEOUT_S 10
#define RECONNECT_MAX_MS 30000
/* Publishes held while the broker blocks publishing, at most (bodies and
 * copies); past it rmq_publish() refuses. */
#define HELD_MAX_BYTES (64u << 20)
/* Bytes written that the kernel has not taken yet, at most, per connection;
 * past it the connection is lost. A broker under flow control reads again
 * within moments, and a silent one is found dead in two heartbeat intervals:
 * only a broker that keeps talking but stops reading fills this. */
#define LINK_QUEUE_MAX_BYTES (64u << 20)

struct pending_confirm {
    uint64_t seq;
    broker_confirm_fn *cb;
    void *privdata;
};

/* A publish made while publishing is blocked: everything copied. */
struct held_publish {
    char *exchange, *routing_key;
    char *content_type, *content_encoding, *correlation_id, *reply_to, *expiration;
    int delivery_mode, priority;
    cJSON *headers;
    char *body;
    size_t len;
    broker_confirm_fn *cb;
    void *privdata;
};

struct pending_stats {
    broker_queue_stats_fn *cb; /* NULL once cancelled */
    void *privdata;
};

struct consumer {
    struct broker_queue q; /* owned copies of every string and the arguments */
    char *tag;             /* our consumer tag, stable across reconnects */
    int active;            /* basic.consume sent on this connection */
    /* An exclusive queue whose name another connection still holds (405
     * RESOURCE_LOCKED: our own from before a kill -9 or a partition, until
     * the broker drops it) is consumed under this name on this connection
     * instead; NULL otherwise. Owned. */
    char *alias;
    /* Its queue exists with other arguments than ours and was used as it is:
     * declared again only passively (consume_again). */
    int as_is;
};

/* The queue a consumer declares and consumes on this connection. */
static const char *consumer_queue(const struct consumer *c)
{
    return c->alias ? c->alias : c->q.name;
}

struct exchange_decl {
    char *name;
    char *type;
    int durable;
};

/* One AMQP connection: the consuming one or the publishing one. */
struct link {
    struct rmq_broker *b;
    const char *role;             /* "consume" or "publish" */
    amqp_connection_state_t conn; /* NULL while disconnected */
    uv_poll_t *poll;              /* heap: closed asynchronously */
    struct rmq_sock *sock;        /* conn's socket's writes; owned by conn */
    int heartbeat_s;              /* negotiated at login; 0: none */
    int poll_events;              /* what poll watches: UV_READABLE, | UV_WRITABLE */
    uint64_t rx_seen;             /* rmq_sock_received() at the last look */
    uint64_t last_recv_ms;        /* loop time bytes last came from the broker */
    uint64_t last_beat_ms;        /* loop time our last heartbeat went out */
    int in_pump;
    int blocked; /* connection.blocked received, unblocked not yet */
    char blocked_why[128];
};

#define MAX_CONSUMERS 64
#define MAX_EXCHANGES 16

struct rmq_broker {
    struct broker base; /* first: the face (broker_int.h) */
    uv_loop_t *loop;
    struct broker_config cfg;
    broker_delivery_fn *on_delivery;
    broker_conn_fn *on_conn;
    void *privdata;

    struct link cons; /* consumers, acks, qos, queue declarations, depth polls */
    struct link pub;  /* publishes and the exchanges they go to */
    int up;           /* both connections open */
    char peer[300];   /* host:port, for messages */
    uint64_t hb_ms;   /* negotiated heartbeat interval, 0: none */
    unsigned generation;
    unsigned long reconnects;
    int stopping;     /* no reconnect: rmq_free() in progress */
    int consuming;    /* consumers active */
    int nclosed;      /* handles closed by rmq_free() so far */
    uv_timer_t timer; /* heartbeats and reconnect backoff */
    uv_check_t check; /* drains frames rabbitmq-c buffered during writes */
    /* Sends the acks made during a loop iteration just before the loop waits
     * for I/O: one write per iteration instead of one per delivery. A prepare
     * handle rather than the check handle, because prepare runs after the
     * timer, pending and idle callbacks and right before the poll, so an ack
     * made anywhere in the iteration (a confirm timer, a Redis reply, a
     * delivery pumped from the check handle) goes out before the loop can
     * sleep; acks made after the poll are sent by the next iteration's
     * prepare, which runs before the loop sleeps again. */
    uv_prepare_t prepare;
    /* Delivery tags of CHANNEL on this connection and the acks not yet sent.
     * Only CHANNEL is tracked: the control channel's consumers never ack and
     * the stats channel receives no deliveries. */
    struct ack_batch acks;
    int64_t reconnect_delay_ms;
    /* The failover list (one URL when not a cluster): urls.url[node] is the
     * node used now or tried next; a failed attempt or a lost connection
     * moves on, as kombu's Connection does with its alternates. */
    struct rmq_url_list urls;
    int node;
    enum rmq_failover failover;
    uint64_t rng;

    struct consumer consumers[MAX_CONSUMERS];
    int nconsumers;
    unsigned long next_tag;
    struct exchange_decl exchanges[MAX_EXCHANGES];
    int nexchanges;
    int prefetch;
    /* The broker refused global QoS once (540): per-consumer from then on. */
    int qos_refused;
    /* A task queue was found declared quorum by someone else (its
     * declaration refused for x-queue-type): our own queues follow, for good. */
    int quorum_seen;
    /* The node connected to took a global basic.qos as a per-consumer one
     * when probed at set-up (probe_global_qos): per-consumer on this
     * connection. Said once. */
    int qos_denied, qos_denied_said;
    /* The node takes x-consumer-timeout and one is configured: task
     * consumers carry it (consume_args). */
    int timeout_arg;
    /* Set by a declaration that found its queue with other arguments and used
     * it as it is; read into consumer.as_is right after. */
    int declared_as_is;
    /* Native delayed delivery declared on this connection (MSG_CAP_DELAYED). */
    int delayed_live;

    /* delivery being assembled */
    struct delivery *cur;
    uint64_t cur_body_size;

    /* publisher confirms, in publish order */
    uint64_t next_seq;
    struct pending_confirm *confirms;
    size_t nconfirms, capconfirms, confirm_head;
    /* confirms completed from a 0 ms timer, never synchronously */
    uv_timer_t confirm_timer;
    struct pending_confirm *failed;
    size_t nfailed, capfailed;
    /* publishes held while blocked, oldest first */
    struct held_publish *held;
    size_t nheld, capheld, held_head, held_bytes;

    /* queue-depth polls on STATS_CHANNEL, answered in order */
    struct pending_stats *stats;
    size_t nstats, capstats, stats_head;
    int stats_open; /* 0 closed, 1 open, 2 reopening after a channel error */
};

static void pump(struct link *l);
static void connection_lost(struct rmq_broker *b, const char *why);
static int check_status(struct rmq_broker *b, int rc, const char *what);
static void on_prepare(uv_prepare_t *p);
static int rmq_add_consumer(struct broker *base, const struct broker_queue *q);
static void rmq_free(struct broker *base);
static int is_task_queue(const struct broker_queue *q);

static char *bytes_dup(amqp_bytes_t b)
{
    return cr_strndup(b.bytes ? (const char *)b.bytes : "", b.len);
}

static amqp_bytes_t cstr(const char *s)
{
    amqp_bytes_t b;
    b.len = s ? strlen(s) : 0;
    b.bytes = (void *)(s ? s : "");
    return b;
}

/* ---------------------------------------------------------------- errors */

static int reply_error(amqp_rpc_reply_t r, const char *what, struct cr_err *err)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        return 0;
    case AMQP_RESPONSE_NONE:
        return cr_err_set(err, CR_EBROKER, "%s: no reply from broker", what);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        return cr_err_set(err, CR_EBROKER, "%s: %s", what,
                          amqp_error_string2(r.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            amqp_connection_close_t *c = r.reply.decoded;
            return cr_err_set(err, CR_EBROKER, "%s: connection closed: %d %.*s", what,
                              c->reply_code, (int)c->reply_text.len,
                              (char *)c->reply_text.bytes);
        }
        if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            amqp_channel_close_t *c = r.reply.decoded;
            return cr_err_set(err, CR_EPEER, "%s: channel closed: %d %.*s", what,
                              c->reply_code, (int)c->reply_text.len,
                              (char *)c->reply_text.bytes);
        }
        return cr_err_set(err, CR_EBROKER, "%s: server error (method 0x%08x)", what,
                          (unsigned)r.reply.id);
    }
    return cr_err_set(err, CR_EBROKER, "%s: unknown reply", what);
}

/* What a failed rabbitmq-c call means, in words. For a socket error that is
 * the system error the library keeps to itself: sys_errno is errno right after
 * the call (nothing else runs in between). */
static const char *status_text(int rc, int sys_errno, char *buf, size_t size)
{
    if (rc == AMQP_STATUS_CONNECTION_CLOSED)
        return "connection closed by peer";
    if (rc == AMQP_STATUS_SOCKET_ERROR && sys_errno && sys_errno != EAGAIN &&
        sys_errno != EINPROGRESS) {
        snprintf(buf, size, "%s", strerror(sys_errno));
        buf[0] = (char)tolower((unsigned char)buf[0]);
        return buf;
    }
    return amqp_error_string2(rc);
}

/* A failed login, whole: RabbitMQ closes the connection with its reason
 * (authentication_failure_close), older brokers just close the socket. */
static void login_error(amqp_rpc_reply_t r, int sys_errno, char *out, size_t size)
{
    char tmp[128];
    if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
        r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *c = r.reply.decoded;
        snprintf(out, size, "%s: %.*s",
                 c->reply_code == 403 ? "login refused" : "login failed",
                 (int)c->reply_text.len, (char *)c->reply_text.bytes);
    } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
        snprintf(out, size, "login failed: %s",
                 status_text(r.library_error, sys_errno, tmp, sizeof(tmp)));
    } else {
        snprintf(out, size, "login failed: no reply from broker");
    }
}

/* After a channel-level error (406, 404) rabbitmq-c has not answered the close;
 * answer it and open the channel again so connecting can go on. */
static int reopen_channel_on(struct rmq_broker *b, int ch, struct cr_err *err)
{
    amqp_channel_close_ok_t ok = {0};
    amqp_send_method(b->cons.conn, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    amqp_channel_open(b->cons.conn, ch);
    return reply_error(amqp_get_rpc_reply(b->cons.conn), "cannot reopen channel", err);
}

static int reopen_channel(struct rmq_broker *b, struct cr_err *err)
{
    return reopen_channel_on(b, CHANNEL, err);
}

/* -------------------------------------------------------------- confirms */

static void confirm_push_failed(struct rmq_broker *b, struct pending_confirm pc)
{
    if (b->nfailed == b->capfailed) {
        size_t cap = b->capfailed ? b->capfailed * 2 : 16;
        struct pending_confirm *p = cr_realloc(b->failed, cap * sizeof(*p));
        if (!p) {
            /* Out of memory: call it now rather than lose it. */
            pc.cb(&b->base, 0, pc.privdata);
            return;
        }
        b->failed = p;
        b->capfailed = cap;
    }
    b->failed[b->nfailed++] = pc;
}

static void on_confirm_timer(uv_timer_t *t)
{
    struct rmq_broker *b = t->data;
    while (b->nfailed) {
        struct pending_confirm pc = b->failed[0];
        memmove(b->failed, b->failed + 1, (b->nfailed - 1) * sizeof(pc));
        b->nfailed--;
        pc.cb(&b->base, 0, pc.privdata);
    }
}

/* Resolves every pending confirm with seq <= tag (multiple) or == tag. */
static void resolve_confirms(struct rmq_broker *b, uint64_t tag, int multiple, int ok)
{
    /* RabbitMQ may confirm out of publish order (a transient message routed to
     * a non-durable queue, such as an event, is confirmed before an earlier
     * persistent one), so a single confirm resolves its own entry wherever it
     * is; resolved entries are marked (cb = NULL) and skipped. Indices, not
     * pointers: a callback may publish and grow the array. */
    for (size_t i = b->confirm_head; i < b->nconfirms; i++) {
        struct pending_confirm pc = b->confirms[i];
        if (pc.seq > tag)
            break;
        if (!pc.cb || (!multiple && pc.seq != tag))
            continue;
        b->confirms[i].cb = NULL;
        pc.cb(&b->base, ok, pc.privdata);
        if (!multiple)
            break;
    }
    while (b->confirm_head < b->nconfirms && !b->confirms[b->confirm_head].cb)
        b->confirm_head++;
    if (b->confirm_head == b->nconfirms)
        b->confirm_head = b->nconfirms = 0;
}

static void held_release(struct held_publish *h)
{
    cr_free(h->exchange);
    cr_free(h->routing_key);
    cr_free(h->content_type);
    cr_free(h->content_encoding);
    cr_free(h->correlation_id);
    cr_free(h->reply_to);
    cr_free(h->expiration);
    cJSON_Delete(h->headers);
    cr_free(h->body);
}

/* The held publishes, oldest first, become failed confirms. */
static void fail_held(struct rmq_broker *b)
{
    for (size_t i = b->held_head; i < b->nheld; i++) {
        struct pending_confirm pc = {0, b->held[i].cb, b->held[i].privdata};
        held_release(&b->held[i]);
        confirm_push_failed(b, pc);
    }
    b->held_head = b->nheld = b->held_bytes = 0;
}

static void fail_all_confirms(struct rmq_broker *b)
{
    for (size_t i = b->confirm_head; i < b->nconfirms; i++)
        if (b->confirms[i].cb) /* NULL: confirmed out of order already */
            confirm_push_failed(b, b->confirms[i]);
    b->confirm_head = b->nconfirms = 0;
    fail_held(b);
    if (b->nfailed)
        uv_timer_start(&b->confirm_timer, on_confirm_timer, 0, 0);
}

/* ------------------------------------------------------------ connecting */

/* The arguments a queue is declared with: none, or x-queue-type quorum (what
 * Celery's task_default_queue_type = "quorum" declares) when quorum is set.
 * entry is the table's storage. */
static amqp_table_t queue_type_args(int quorum, amqp_table_entry_t *entry)
{
    amqp_table_t t = amqp_empty_table;
    if (!quorum)
        return t;
    entry->key = amqp_cstring_bytes("x-queue-type");
    entry->value.kind = AMQP_FIELD_KIND_UTF8;
    entry->value.value.bytes = amqp_cstring_bytes("quorum");
    t.num_entries = 1;
    t.entries = entry;
    return t;
}

/* Whether our own durable queues (dead letters, park queues) are declared
 * quorum: when the task queues are, by configuration or as the broker's
 * refusal of global QoS showed (a classic queue lives on one node, and with
 * that node gone no other node lets the worker declare it). */
static int own_quorum(const struct rmq_broker *b)
{
    return b->cfg.quorum || b->qos_refused || b->quorum_seen;
}

/* A copy of args (NULL: none) with what makes a queue of ours quorum (park
 * queues, the delay levels), or NULL when out of memory. At-least-once
 * dead-lettering, so the node that dead-letters a message on cannot drop it
 * (it needs reject-publish). */
static cJSON *quorum_args(const cJSON *args)
{
    cJSON *a = args ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
    if (!a || !cJSON_AddStringToObject(a, "x-queue-type", "quorum") ||
        !cJSON_AddStringToObject(a, "x-overflow", "reject-publish") ||
        !cJSON_AddStringToObject(a, "x-dead-letter-strategy", "at-least-once")) {
        cJSON_Delete(a);
        return NULL;
    }
    return a;
}

/* The dead-letter queue's arguments: none, or quorum with a delivery limit no
 * one reaches. `celeriac dlq list` and `show` read it with basic.get and give
 * every dead letter back, and a quorum queue counts each of those as a
 * delivery: with RabbitMQ 4's default limit (20) the 21st listing would make
 * the broker drop them all. (-1, 4.x's "no limit", is a limit of 0 on 3.10.)
 * entries is the table's storage. */
static amqp_table_t dead_letter_queue_args(const struct rmq_broker *b,
                                           amqp_table_entry_t entries[2])
{
    amqp_table_t t = queue_type_args(own_quorum(b), &entries[0]);
    if (!t.num_entries)
        return t;
    entries[1].key = amqp_cstring_bytes("x-delivery-limit");
    entries[1].value.kind = AMQP_FIELD_KIND_I32;
    entries[1].value.value.i32 = INT32_MAX;
    t.num_entries = 2;
    t.entries = entries;
    return t;
}

/* A durable queue on channel ch (CHANNEL, or OWN_CHANNEL for our own
 * queues): declared with args, or, when it exists with other arguments
 * (classic from before a switch to quorum, or the reverse), used as it is,
 * with one warning. */
static int declare_queue_or_use(struct rmq_broker *b, int ch, const char *name,
                                amqp_table_t args, struct cr_err *err)
{
    amqp_queue_declare(b->cons.conn, ch, cstr(name), 0, 1, 0, 0, args);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.declare", err) == 0)
        return 0;
    if (err->code != CR_EPEER || !strstr(err->msg, "PRECONDITION_FAILED"))
        return err->code;
    LOG(LOG_WARNING, "queue '%s' exists with other arguments; using it as it is (%s)",
        name, err->msg);
    b->declared_as_is = 1;
    if (reopen_channel_on(b, ch, err))
        return err->code;
    amqp_queue_declare(b->cons.conn, ch, cstr(name), 1, 0, 0, 0, amqp_empty_table);
    return reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.declare", err);
}

/* Declares a custom queue (pidbox, add_consumer) with its arguments. With
 * wait = 0 the methods go out without waiting (run time, never blocks); a
 * refusal then closes the channel and the reconnect declares again. */
static int declare_custom(struct rmq_broker *b, const struct broker_queue *q, int wait,
                          struct cr_err *err)
{
    amqp_pool_t pool;
    amqp_table_t args = amqp_empty_table;
    /* On the channel that consumes it, so the consume never overtakes it.
     * Our own queues are declared at set-up after the consumers start, and a
     * refused declaration closes its channel: never the consumers' one. */
    const int ch = wait && q->follow_quorum ? OWN_CHANNEL : CONSUMER_CHANNEL(q);
    int rc = 0;

    amqp_table_entry_t qt;
    cJSON *own = NULL;
    const cJSON *json = q->arguments;

    if (q->follow_quorum && own_quorum(b) && !(json = own = quorum_args(q->arguments)))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    init_amqp_pool(&pool, 1024);
    if (is_task_queue(q))
        args = queue_type_args(b->cfg.quorum, &qt);
    rc = json ? rmq_json_to_table(json, &pool, &args, err) : 0;
    cJSON_Delete(own);
    if (rc) {
        empty_amqp_pool(&pool);
        return rc;
    }
    if (q->exchange && *q->exchange) {
        amqp_exchange_declare_t ed;
        memset(&ed, 0, sizeof(ed));
        ed.exchange = cstr(q->exchange);
        ed.type = cstr(q->exchange_type ? q->exchange_type : "direct");
        ed.durable = q->exchange_durable;
        ed.nowait = !wait;
        ed.arguments = amqp_empty_table;
        if (wait) {
            amqp_exchange_declare(b->cons.conn, ch, ed.exchange, ed.type, 0, ed.durable,
                                  0, 0, amqp_empty_table);
            if ((rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "exchange.declare",
                                  err)))
                goto out;
        } else {
            amqp_send_method(b->cons.conn, ch, AMQP_EXCHANGE_DECLARE_METHOD, &ed);
        }
    }
    if (wait) {
        if ((ch == CHANNEL || ch == OWN_CHANNEL) && q->durable && !q->exclusive &&
            !q->auto_delete) {
            if ((rc = declare_queue_or_use(b, ch, q->name, args, err)))
                goto out;
        } else {
            amqp_queue_declare(b->cons.conn, ch, cstr(q->name), 0, q->durable,
                               q->exclusive, q->auto_delete, args);
            if ((rc =
                     reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.declare", err)))
                goto out;
        }
        if (q->exchange && *q->exchange) {
            amqp_queue_bind(b->cons.conn, ch, cstr(q->name), cstr(q->exchange),
                            cstr(q->routing_key ? q->routing_key : ""), amqp_empty_table);
            rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.bind", err);
        }
    } else {
        amqp_queue_declare_t qd;
        memset(&qd, 0, sizeof(qd));
        qd.queue = cstr(q->name);
        qd.durable = q->durable;
        qd.exclusive = q->exclusive;
        qd.auto_delete = q->auto_delete;
        qd.nowait = 1;
        qd.arguments = args;
        amqp_send_method(b->cons.conn, ch, AMQP_QUEUE_DECLARE_METHOD, &qd);
        if (q->exchange && *q->exchange) {
            amqp_queue_bind_t qb;
            memset(&qb, 0, sizeof(qb));
            qb.queue = cstr(q->name);
            qb.exchange = cstr(q->exchange);
            qb.routing_key = cstr(q->routing_key ? q->routing_key : "");
            qb.nowait = 1;
            qb.arguments = amqp_empty_table;
            amqp_send_method(b->cons.conn, ch, AMQP_QUEUE_BIND_METHOD, &qb);
        }
    }
out:
    empty_amqp_pool(&pool);
    return rc;
}

/* A task queue as Celery declares it, tolerating one the application declared
 * with other arguments. */
static int declare_task_queue(struct rmq_broker *b, const char *q, struct cr_err *err)
{
    amqp_rpc_reply_t r;
    struct cr_err e2;
    amqp_table_entry_t qt;

    /* What Celery declares: a durable direct exchange named like the queue, a
     * durable queue, and a binding with the queue name as routing key. */
    amqp_exchange_declare(b->cons.conn, CHANNEL, cstr(q), cstr("direct"), 0, 1, 0, 0,
                          amqp_empty_table);
    r = amqp_get_rpc_reply(b->cons.conn);
    if (reply_error(r, "exchange.declare", &e2)) {
        if (e2.code != CR_EPEER)
            return cr_err_set(err, CR_EBROKER, "cannot declare exchange '%s': %s", q,
                              e2.msg);
        /* Exists with other settings: use it as it is. */
        LOG(LOG_WARNING, "exchange '%s' exists with other settings; using it (%s)", q,
            e2.msg);
        if (reopen_channel(b, err))
            return err->code;
    }
    amqp_queue_declare(b->cons.conn, CHANNEL, cstr(q), 0, 1, 0, 0,
                       queue_type_args(b->cfg.quorum, &qt));
    r = amqp_get_rpc_reply(b->cons.conn);
    if (reply_error(r, "queue.declare", &e2)) {
        if (e2.code != CR_EPEER)
            return cr_err_set(err, CR_EBROKER, "cannot declare queue '%s': %s", q,
                              e2.msg);
        /* Declared by the application with other arguments (x-max-priority,
         * x-queue-type...): a passive declare checks that it exists. The
         * refusal names the argument that differs: a quorum queue says so
         * here even where no 540 will (global QoS taken per consumer). */
        b->declared_as_is = 1;
        if (strstr(e2.msg, "x-queue-type") && strstr(e2.msg, "quorum"))
            b->quorum_seen = 1;
        if (reopen_channel(b, err))
            return err->code;
        amqp_queue_declare(b->cons.conn, CHANNEL, cstr(q), 1, 0, 0, 0, amqp_empty_table);
        if (reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.declare", &e2))
            return cr_err_set(err, CR_EBROKER, "cannot use queue '%s': %s", q, e2.msg);
        return 0;
    }
    amqp_queue_bind(b->cons.conn, CHANNEL, cstr(q), cstr(q), cstr(q), amqp_empty_table);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.bind", &e2))
        return cr_err_set(err, CR_EBROKER, "cannot bind queue '%s': %s", q, e2.msg);
    return 0;
}

static int is_task_queue(const struct broker_queue *q)
{
    return !q->arguments && q->durable && !q->exclusive && !q->auto_delete &&
           !q->no_ack && q->exchange && !strcmp(q->exchange, q->name) && q->routing_key &&
           !strcmp(q->routing_key, q->name) && q->exchange_type &&
           !strcmp(q->exchange_type, "direct");
}

static int declare_consumer(struct rmq_broker *b, const struct broker_queue *q, int wait,
                            struct cr_err *err)
{
    if (wait && is_task_queue(q))
        return declare_task_queue(b, q->name, err);
    return declare_custom(b, q, wait, err);
}

static int declare_dead_letters(struct rmq_broker *b, struct cr_err *err)
{
    struct cr_err e2;
    amqp_table_entry_t qt[2];
    if (!b->cfg.dlx)
        return 0;
    amqp_exchange_declare(b->cons.conn, OWN_CHANNEL, cstr(b->cfg.dlx), cstr("topic"), 0,
                          1, 0, 0, amqp_empty_table);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "exchange.declare", &e2))
        return cr_err_set(err, CR_EBROKER, "cannot declare dead-letter exchange '%s': %s",
                          b->cfg.dlx, e2.msg);
    if (!b->cfg.dlq)
        return 0;
    if (declare_queue_or_use(b, OWN_CHANNEL, b->cfg.dlq, dead_letter_queue_args(b, qt),
                             &e2))
        return cr_err_set(err, CR_EBROKER, "cannot declare dead-letter queue '%s': %s",
                          b->cfg.dlq, e2.msg);
    amqp_queue_bind(b->cons.conn, OWN_CHANNEL, cstr(b->cfg.dlq), cstr(b->cfg.dlx),
                    cstr("#"), amqp_empty_table);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.bind", &e2))
        return cr_err_set(err, CR_EBROKER, "cannot bind dead-letter queue '%s': %s",
                          b->cfg.dlq, e2.msg);
    return 0;
}

/* ------------------------------------------------- native delayed delivery */

/* One level's queue, declared as kombu declares it for Celery 5.5+ (a quorum
 * queue by default: broker_native_delayed_delivery_queue_type), so that a
 * Celery worker and celeriac declare the same thing. */
static int declare_delayed_level(struct rmq_broker *b, int level, struct cr_err *err)
{
    char name[40], next[40], key[64];
    amqp_pool_t pool;
    amqp_table_t args = amqp_empty_table;
    cJSON *a = quorum_args(NULL);
    int rc;

    delayed_level_name(level, name, sizeof(name));
    if (level > 0)
        delayed_level_name(level - 1, next, sizeof(next));
    else
        snprintf(next, sizeof(next), "%s", DELAYED_DELIVERY_EXCHANGE);
    delayed_level_binding(level, 1, key, sizeof(key));
    if (!a ||
        !cJSON_AddNumberToObject(a, "x-message-ttl", (double)(UINT64_C(1000) << level)) ||
        !cJSON_AddStringToObject(a, "x-dead-letter-exchange", next)) {
        cJSON_Delete(a);
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    }
    init_amqp_pool(&pool, 1024);
    rc = rmq_json_to_table(a, &pool, &args, err);
    cJSON_Delete(a);
    if (rc)
        goto out;
    amqp_exchange_declare(b->cons.conn, CHANNEL, cstr(name), cstr("topic"), 0, 1, 0, 0,
                          amqp_empty_table);
    if ((rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "exchange.declare", err)))
        goto out;
    amqp_queue_declare(b->cons.conn, CHANNEL, cstr(name), 0, 1, 0, 0, args);
    if ((rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.declare", err)))
        goto out;
    amqp_queue_bind(b->cons.conn, CHANNEL, cstr(name), cstr(name), cstr(key),
                    amqp_empty_table);
    rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.bind", err);
out:
    empty_amqp_pool(&pool);
    return rc;
}

static int exchange_bind(struct rmq_broker *b, const char *dest, const char *src,
                         const char *key, struct cr_err *err)
{
    amqp_exchange_bind(b->cons.conn, CHANNEL, cstr(dest), cstr(src), cstr(key),
                       amqp_empty_table);
    return reply_error(amqp_get_rpc_reply(b->cons.conn), "exchange.bind", err);
}

/* The chain celery_delayed_27 .. celery_delayed_0 -> celery_delayed_delivery
 * (see protocol/delayed.h), then a "#.<queue>" binding of every task
 * consumer to celery_delayed_delivery. Start-up and reconnect only
 * (blocking, like every declaration there). */
static int declare_delayed(struct rmq_broker *b, struct cr_err *err)
{
    char name[40], next[40], key[64];
    int rc;

    for (int level = DELAYED_MAX_LEVEL; level >= 0; level--)
        if ((rc = declare_delayed_level(b, level, err)))
            return rc;
    for (int level = DELAYED_MAX_LEVEL; level > 0; level--) {
        delayed_level_name(level, name, sizeof(name));
        delayed_level_name(level - 1, next, sizeof(next));
        delayed_level_binding(level, 0, key, sizeof(key));
        if ((rc = exchange_bind(b, next, name, key, err)))
            return rc;
    }
    amqp_exchange_declare(b->cons.conn, CHANNEL, cstr(DELAYED_DELIVERY_EXCHANGE),
                          cstr("topic"), 0, 1, 0, 0, amqp_empty_table);
    if ((rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "exchange.declare", err)))
        return rc;
    delayed_level_name(0, name, sizeof(name));
    delayed_level_binding(0, 0, key, sizeof(key));
    if ((rc = exchange_bind(b, DELAYED_DELIVERY_EXCHANGE, name, key, err)))
        return rc;
    for (int i = 0; i < b->nconsumers; i++) {
        const struct consumer *c = &b->consumers[i];
        char bkey[300];
        if (c->q.no_ack || c->q.no_consume)
            continue;
        snprintf(bkey, sizeof(bkey), "#.%s", c->q.name);
        amqp_queue_bind(b->cons.conn, CHANNEL, cstr(c->q.name),
                        cstr(DELAYED_DELIVERY_EXCHANGE), cstr(bkey), amqp_empty_table);
        if ((rc = reply_error(amqp_get_rpc_reply(b->cons.conn), "queue.bind", err)))
            return rc;
    }
    return 0;
}

static int rmq_qos_per_consumer(const struct broker *base)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->cfg.per_consumer_qos || b->cfg.quorum || b->qos_refused || b->qos_denied;
}

/* The version the node announced in connection.start (borrowed from the
 * connection), or an empty one. */
static amqp_bytes_t server_version(const struct rmq_broker *b)
{
    const amqp_table_t *props = amqp_get_server_properties(b->cons.conn);
    for (int i = 0; props && i < props->num_entries; i++) {
        const amqp_table_entry_t *e = &props->entries[i];
        if (e->key.len == 7 && !memcmp(e->key.bytes, "version", 7) &&
            (e->value.kind == AMQP_FIELD_KIND_UTF8 ||
             e->value.kind == AMQP_FIELD_KIND_BYTES))
            return e->value.value.bytes;
    }
    return amqp_empty_bytes;
}

/* Whether the node connected to may deny global QoS, by its version:
 * RabbitMQ 3.x never does, and is not asked. */
static int qos_deniable(const struct rmq_broker *b)
{
    amqp_bytes_t v = server_version(b);
    return rmq_global_qos_deniable(v.len ? v.bytes : NULL, v.len);
}

/* The arguments of a task consumer's basic.consume: x-consumer-timeout when
 * configured and the node takes it (see broker_config.consumer_timeout_ms),
 * else none. entry is the table's storage. */
static amqp_table_t consume_args(const struct rmq_broker *b, const struct consumer *c,
                                 amqp_table_entry_t *entry)
{
    amqp_table_t t = amqp_empty_table;
    if (c->q.no_ack || !b->timeout_arg)
        return t;
    entry->key = amqp_cstring_bytes("x-consumer-timeout");
    entry->value.kind = AMQP_FIELD_KIND_I64;
    entry->value.value.i64 = b->cfg.consumer_timeout_ms;
    t.num_entries = 1;
    t.entries = entry;
    return t;
}

/* Asks the broker whether it honours a channel-wide window. A broker that
 * denies global QoS (RabbitMQ 4.3 by default, or any 4.x or managed broker
 * configured so) takes basic.qos global=true without a word and applies it
 * to each consumer, so only its effect can tell: two messages in a private
 * queue, a global window of one, two consumers. Honoured, the second consumer
 * gets nothing while the first holds its message; taken per consumer, it gets
 * the second message at once. The queue's ready count, asked after both
 * consumes on the same channel, says which: the queue hands a new consumer
 * what it can before it answers anything asked after the consume. Returns 1
 * (denied), 0 (honoured) or an error; the probe channel is closed again and
 * its deliveries are dropped by on_frame. Set-up only (blocking). */
static int probe_global_qos(struct rmq_broker *b, struct cr_err *err)
{
    amqp_connection_state_t c = b->cons.conn;
    amqp_queue_declare_ok_t *ok;
    amqp_bytes_t q;
    char name[128];
    uint32_t ready;
    int acked = 0;

    amqp_channel_open(c, PROBE_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(c), "probe channel.open", err))
        return err->code;
    /* exclusive: the one transient kind RabbitMQ 4.3 still declares */
    ok = amqp_queue_declare(c, PROBE_CHANNEL, amqp_empty_bytes, 0, 0, 1, 1,
                            amqp_empty_table);
    if (reply_error(amqp_get_rpc_reply(c), "probe queue.declare", err))
        return err->code;
    snprintf(name, sizeof(name), "%.*s", (int)ok->queue.len, (char *)ok->queue.bytes);
    q = amqp_cstring_bytes(name);
    /* Confirmed, so both are in the queue before the consumes. */
    amqp_confirm_select(c, PROBE_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(c), "probe confirm.select", err))
        return err->code;
    for (int i = 0; i < 2; i++)
        if (amqp_basic_publish(c, PROBE_CHANNEL, amqp_empty_bytes, q, 0, 0, NULL,
                               amqp_cstring_bytes("probe")) != AMQP_STATUS_OK)
            return cr_err_set(err, CR_EBROKER, "probe publish failed");
    while (acked < 2) {
        amqp_frame_t f;
        struct timeval tv = {RPC_TIMEOUT_S, 0};
        if (amqp_simple_wait_frame_noblock(c, &f, &tv) != AMQP_STATUS_OK)
            return cr_err_set(err, CR_EBROKER, "probe: no confirm");
        if (f.frame_type != AMQP_FRAME_METHOD || f.channel != PROBE_CHANNEL)
            continue;
        if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            amqp_basic_ack_t *a = f.payload.method.decoded;
            acked = a->multiple ? (int)a->delivery_tag : acked + 1;
        } else {
            return cr_err_set(err, CR_EBROKER, "probe: publish not confirmed");
        }
    }
    amqp_basic_qos(c, PROBE_CHANNEL, 0, 1, 1);
    if (reply_error(amqp_get_rpc_reply(c), "probe basic.qos", err))
        return err->code;
    for (int i = 0; i < 2; i++) {
        amqp_basic_consume(c, PROBE_CHANNEL, q, amqp_cstring_bytes(i ? "p2" : "p1"), 0, 0,
                           0, amqp_empty_table);
        if (reply_error(amqp_get_rpc_reply(c), "probe basic.consume", err))
            return err->code;
    }
    ok = amqp_queue_declare(c, PROBE_CHANNEL, q, 1, 0, 1, 1, amqp_empty_table);
    if (reply_error(amqp_get_rpc_reply(c), "probe queue.declare", err))
        return err->code;
    ready = ok->message_count;
    /* Closing the channel gives both messages back and, with its consumers
     * gone, deletes the auto-delete queue. */
    amqp_channel_close(c, PROBE_CHANNEL, AMQP_REPLY_SUCCESS);
    if (reply_error(amqp_get_rpc_reply(c), "probe channel.close", err))
        return err->code;
    return ready == 0;
}

/* Per-consumer windows on this connection when the broker takes a global one
 * per consumer: the live raise for held eta tasks would do nothing there, so
 * per-consumer windows and delayed delivery (auto) instead, as on quorum. A
 * probe that fails says nothing and keeps what works on RabbitMQ 3.x (a
 * quorum queue's 540 still switches). */
static void decide_qos(struct rmq_broker *b)
{
    struct cr_err e;
    int rc;

    b->qos_denied = 0;
    if (b->cfg.per_consumer_qos || b->cfg.quorum || b->qos_refused || !qos_deniable(b))
        return;
    rc = probe_global_qos(b, &e);
    if (rc < 0) {
        if (e.code == CR_EPEER) {
            amqp_channel_close_ok_t ok = {0};
            amqp_send_method(b->cons.conn, PROBE_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD,
                             &ok);
        }
        LOG(LOG_WARNING, "cannot tell whether the broker honours global QoS (%s)", e.msg);
        return;
    }
    b->qos_denied = rc;
    if (b->qos_denied && !b->qos_denied_said) {
        b->qos_denied_said = 1;
        LOG(LOG_WARNING, "broker applies global QoS per consumer (denied, as RabbitMQ "
                         "4.3 does by default); consuming with per-consumer QoS");
    }
}

/* Whether this connection should carry delayed delivery. */
static int want_delayed(const struct rmq_broker *b)
{
    return b->cfg.delayed_delivery == BROKER_DELAYED_ON ||
           (b->cfg.delayed_delivery == BROKER_DELAYED_AUTO &&
            rmq_qos_per_consumer(&b->base));
}

/* Declares delayed delivery when wanted. A refusal (a level declared by
 * someone else with other arguments, an old broker without quorum queues) is
 * not fatal: one warning, and far etas are held here as before. */
static int setup_delayed(struct rmq_broker *b, struct cr_err *err)
{
    struct cr_err e2;
    int rc;
    b->delayed_live = 0;
    if (!want_delayed(b))
        return 0;
    rc = declare_delayed(b, &e2);
    if (rc == 0) {
        b->delayed_live = 1;
        return 0;
    }
    if (rc != CR_EPEER)
        return cr_err_set(err, rc, "cannot declare delayed delivery: %s", e2.msg);
    LOG(LOG_WARNING,
        "cannot declare native delayed delivery (%s); eta tasks are held here instead",
        e2.msg);
    return reopen_channel(b, err);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    struct link *l = p->data;
    struct rmq_broker *b;
    char buf[128];
    int soerr = 0;
    socklen_t len = sizeof(soerr);

    if (!l)
        return;
    b = l->b;
    if (status == 0 && (events & UV_WRITABLE) && l->sock &&
        check_status(b, rmq_sock_flush(l->sock), "queued frames"))
        return;
    /* Also on an error: what the broker sent before it (a connection.close
     * with its reason) comes first, and the read that fails names the cause. */
    pump(l);
    if (status == 0 || !l->conn)
        return;
    /* libuv reports any POLLERR as "bad file descriptor" and stops watching;
     * the socket's own error is the real cause (a reset, mostly). */
    if (getsockopt(amqp_get_sockfd(l->conn), SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 &&
        soerr)
        connection_lost(b,
                        status_text(AMQP_STATUS_SOCKET_ERROR, soerr, buf, sizeof(buf)));
    else
        connection_lost(b, "connection closed by peer");
}

static void on_poll_closed(uv_handle_t *h)
{
    cr_free(h);
}

/* Answers the oldest pending queue-depth poll. The entry leaves the queue
 * before its callback runs, so the callback may poll again. */
static void stats_pop(struct rmq_broker *b, int ok, uint32_t messages, uint32_t consumers)
{
    struct pending_stats ps;
    if (b->stats_head >= b->nstats)
        return;
    ps = b->stats[b->stats_head++];
    if (b->stats_head == b->nstats)
        b->stats_head = b->nstats = 0;
    if (ps.cb)
        ps.cb(&b->base, ok, messages, consumers, ps.privdata);
}

static void fail_stats(struct rmq_broker *b)
{
    b->stats_open = 0;
    while (b->stats_head < b->nstats)
        stats_pop(b, 0, 0, 0);
}

static void link_close(struct link *l)
{
    if (l->poll) {
        l->poll->data = NULL;
        uv_poll_stop(l->poll);
        uv_close((uv_handle_t *)l->poll, on_poll_closed);
        l->poll = NULL;
    }
    if (l->conn) {
        amqp_destroy_connection(l->conn); /* frees l->sock */
        l->conn = NULL;
    }
    l->sock = NULL;
    l->heartbeat_s = 0;
    l->poll_events = 0;
    l->blocked = 0;
    l->blocked_why[0] = '\0';
}

static void teardown(struct rmq_broker *b)
{
    b->up = 0;
    link_close(&b->pub);
    link_close(&b->cons);
    delivery_free(b->cur);
    b->cur = NULL;
    /* Delivery tags are per channel and start again on the next connection:
     * an ack still pending for this one must never be sent on the next (it
     * would name another delivery, or an unknown tag). The broker requeues
     * these deliveries itself. */
    ack_batch_clear(&b->acks);
    for (int i = 0; i < b->nconsumers; i++)
        b->consumers[i].active = 0;
    b->consuming = 0;
    fail_stats(b);
}

static amqp_table_entry_t bool_entry(const char *key)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(key);
    e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
    e.value.value.boolean = 1;
    return e;
}

/* TCP connect and login of one connection. The client properties say which
 * of RabbitMQ's extensions we handle (connection.blocked above all: without
 * it RabbitMQ blocks silently) and name the connection. Returns 0 or an error
 * with the reason alone in err. */
static int link_open(struct rmq_broker *b, struct link *l, const struct rmq_url *u,
                     struct cr_err *err)
{
    amqp_table_entry_t caps[5], props[2];
    amqp_table_t props_table;
    amqp_socket_t *sock;
    amqp_rpc_reply_t r;
    struct timeval tv;
    char name[200], why[200];
    int fd, rc, e;

    l->conn = amqp_new_connection();
    sock = l->conn ? amqp_tcp_socket_new(l->conn) : NULL;
    if (!sock)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    /* Our own connect, not amqp_socket_open_noblock(): that one loses the
     * reason ("a socket error occurred" for a refusal too). */
    fd = tcp_connect(u->host, u->port, b->cfg.connect_timeout, err);
    if (fd < 0)
        return fd;
    /* The descriptor before the wrap: rabbitmq-c refuses to set it on a
     * socket whose class is no longer its TCP one. */
    amqp_tcp_socket_set_sockfd(sock, fd);
    l->sock = rmq_sock_wrap(sock, LINK_QUEUE_MAX_BYTES);
    if (!l->sock)
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    tv.tv_sec = RPC_TIMEOUT_S;
    tv.tv_usec = 0;
    amqp_set_handshake_timeout(l->conn, &tv);
    amqp_set_rpc_timeout(l->conn, &tv);
    caps[0] = bool_entry("connection.blocked");
    caps[1] = bool_entry("authentication_failure_close");
    caps[2] = bool_entry("consumer_cancel_notify");
    caps[3] = bool_entry("publisher_confirms");
    caps[4] = bool_entry("basic.nack");
    props[0].key = amqp_cstring_bytes("capabilities");
    props[0].value.kind = AMQP_FIELD_KIND_TABLE;
    props[0].value.value.table.num_entries = 5;
    props[0].value.value.table.entries = caps;
    snprintf(name, sizeof(name), "%s (%s)",
             b->cfg.connection_name ? b->cfg.connection_name : "celeriac", l->role);
    props[1].key = amqp_cstring_bytes("connection_name");
    props[1].value.kind = AMQP_FIELD_KIND_UTF8;
    props[1].value.value.bytes = amqp_cstring_bytes(name);
    props_table.num_entries = 2;
    props_table.entries = props;
    errno = 0;
    r = amqp_login_with_properties(l->conn, u->vhost, 0, 131072, b->cfg.heartbeat,
                                   &props_table, AMQP_SASL_METHOD_PLAIN, u->user,
                                   u->password);
    e = errno;
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        login_error(r, e, why, sizeof(why));
        /* The broker's own no (a refused login) is CR_EPEER: not worth a
         * retry at start-up, as kombu does not retry AccessRefused. */
        return cr_err_set(
            err, r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION ? CR_EPEER : CR_EBROKER,
            "%s", why);
    }
    /* The broker keeps the interval just negotiated; rabbitmq-c is told there
     * is none. Its own check sits in amqp_basic_publish(): once two intervals
     * have passed without a byte, 0.11 to 0.13 wait for one with no deadline
     * (rabbitmq-c issue 780), so the first publish after a path stops
     * forwarding never returns, and the timer that would have noticed never
     * runs again. Our timer sends and checks instead (link_heartbeat). Right
     * after login no frame is half read, as amqp_tune_connection() requires. */
    l->heartbeat_s = amqp_get_heartbeat(l->conn);
    if (l->heartbeat_s > 0) {
        rc = amqp_tune_connection(l->conn, amqp_get_channel_max(l->conn),
                                  amqp_get_frame_max(l->conn), 0);
        if (rc != AMQP_STATUS_OK)
            return cr_err_set(err, rc == AMQP_STATUS_NO_MEMORY ? CR_ENOMEM : CR_EBROKER,
                              "cannot take over heartbeats: %s", amqp_error_string2(rc));
    }
    return 0;
}

static int link_watch(struct rmq_broker *b, struct link *l, struct cr_err *err)
{
    l->poll = cr_malloc(sizeof(*l->poll));
    if (!l->poll || uv_poll_init(b->loop, l->poll, amqp_get_sockfd(l->conn)) != 0) {
        cr_free(l->poll);
        l->poll = NULL;
        return cr_err_set(err, CR_ENOMEM, "cannot watch the broker socket");
    }
    l->poll->data = l;
    l->poll_events = UV_READABLE;
    uv_poll_start(l->poll, l->poll_events, on_poll);
    l->rx_seen = rmq_sock_received(l->sock);
    l->last_recv_ms = l->last_beat_ms = uv_now(b->loop);
    return 0;
}

/* The publishing connection: its channel in confirm mode and the exchanges
 * publishes go to, declared on it so that none is overtaken by a publish. */
static int setup_pub(struct rmq_broker *b, struct cr_err *err)
{
    amqp_connection_state_t c = b->pub.conn;
    amqp_channel_open(c, PUB_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(c), "channel.open", err))
        return err->code;
    for (int i = 0; i < b->nexchanges; i++) {
        amqp_exchange_declare(c, PUB_CHANNEL, cstr(b->exchanges[i].name),
                              cstr(b->exchanges[i].type), 0, b->exchanges[i].durable, 0,
                              0, amqp_empty_table);
        if (reply_error(amqp_get_rpc_reply(c), "exchange.declare", err))
            return err->code;
    }
    amqp_confirm_select(c, PUB_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(c), "confirm.select", err))
        return err->code;
    b->next_seq = 1;
    return 0;
}

/* The window as basic.qos carries it (16 bits; 0 would mean no limit). */
static uint16_t prefetch_u16(const struct rmq_broker *b)
{
    return (uint16_t)(b->prefetch > 65535 ? 65535 : b->prefetch < 0 ? 0 : b->prefetch);
}

/* 540 NOT_IMPLEMENTED in answer to a basic.consume: RabbitMQ's refusal of a
 * channel-wide window on a queue that has none (a quorum or stream queue). */
static int refused_global_qos(amqp_rpc_reply_t r)
{
    if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION)
        return 0;
    if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
        return ((amqp_connection_close_t *)r.reply.decoded)->reply_code ==
               AMQP_NOT_IMPLEMENTED;
    if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
        return ((amqp_channel_close_t *)r.reply.decoded)->reply_code ==
               AMQP_NOT_IMPLEMENTED;
    return 0;
}

/* 405 RESOURCE_LOCKED: an exclusive queue of that name belongs to another
 * connection. */
static int resource_locked(const struct cr_err *e)
{
    return e->code == CR_EPEER && strstr(e->msg, "closed: 405 ") != NULL;
}

/* A consumer's queue, declared at set-up. An exclusive one (the mailbox) may
 * still belong to a connection the broker has not yet dropped: ours from
 * before a kill -9, a crash or a partition, kept until its heartbeats are
 * missed. Waiting for it would leave the worker deaf to remote control for
 * up to two heartbeat intervals, so the queue is declared under a name of
 * this connection's instead: the mailbox exchange is a fanout, and every
 * queue bound to it gets every command. The next connection tries the
 * proper name again. */
static int declare_at_setup(struct rmq_broker *b, struct consumer *c, struct cr_err *err)
{
    struct broker_queue q = c->q;
    char alias[300];

    cr_free(c->alias);
    c->alias = NULL;
    b->declared_as_is = 0;
    if (declare_consumer(b, &c->q, 1, err) == 0) {
        c->as_is = b->declared_as_is;
        return 0;
    }
    if (!c->q.exclusive || !resource_locked(err))
        return err->code;
    snprintf(alias, sizeof(alias), "%s.%08x", c->q.name,
             (unsigned)cr_xorshift64(&b->rng));
    LOG(LOG_WARNING,
        "queue '%s' is still held by an earlier connection; consuming it as '%s' on "
        "this one",
        c->q.name, alias);
    if (reopen_channel_on(b, CONSUMER_CHANNEL(&c->q), err))
        return err->code;
    q.name = alias;
    if (declare_consumer(b, &q, 1, err))
        return err->code;
    if (!(c->alias = cr_strdup(alias)))
        return cr_err_set(err, CR_ENOMEM, "out of memory");
    return 0;
}

static int setup_cons(struct rmq_broker *b, struct cr_err *err)
{
    amqp_bytes_t version = server_version(b);
    amqp_table_entry_t arg;

    b->timeout_arg = b->cfg.consumer_timeout_ms > 0 &&
                     rmq_consumer_timeout_arg(version.bytes, version.len);
    decide_qos(b);
    amqp_channel_open(b->cons.conn, CHANNEL);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "channel.open", err))
        return err->code;
    amqp_channel_open(b->cons.conn, STATS_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "channel.open", err))
        return err->code;
    b->stats_open = 1;
    amqp_channel_open(b->cons.conn, CONTROL_CHANNEL);
    if (reply_error(amqp_get_rpc_reply(b->cons.conn), "channel.open", err))
        return err->code;
    for (int i = 0; i < b->nconsumers; i++)
        if (!b->consumers[i].q.follow_quorum &&
            declare_at_setup(b, &b->consumers[i], err))
            return err->code;
    if (setup_delayed(b, err))
        return err->code;
    /* global = 1 (a channel-wide limit, as Celery uses with RabbitMQ 3.x):
     * RabbitMQ applies a per-consumer qos only to consumers started after it,
     * while a channel-wide one can be raised live for held eta tasks. With
     * per_consumer_qos each consumer of CHANNEL gets its own window instead,
     * set just before its basic.consume, and no channel-wide limit caps the
     * sum (that cap is what would let one queue crowd out another). */
    if (!rmq_qos_per_consumer(&b->base)) {
        amqp_basic_qos(b->cons.conn, CHANNEL, 0, prefetch_u16(b), 1);
        if (reply_error(amqp_get_rpc_reply(b->cons.conn), "basic.qos", err))
            return err->code;
    }
    for (int i = 0; i < b->nconsumers; i++) {
        struct consumer *c = &b->consumers[i];
        if (c->q.no_consume)
            continue;
        if (rmq_qos_per_consumer(&b->base) && CONSUMER_CHANNEL(&c->q) == CHANNEL) {
            amqp_basic_qos(b->cons.conn, CHANNEL, 0, prefetch_u16(b), 0);
            if (reply_error(amqp_get_rpc_reply(b->cons.conn), "basic.qos", err))
                return err->code;
        }
        if (!amqp_basic_consume(b->cons.conn, CONSUMER_CHANNEL(&c->q),
                                cstr(consumer_queue(c)), cstr(c->tag), 0, c->q.no_ack, 0,
                                consume_args(b, c, &arg))) {
            amqp_rpc_reply_t r = amqp_get_rpc_reply(b->cons.conn);
            if (!rmq_qos_per_consumer(&b->base) && refused_global_qos(r))
                return cr_err_set(err, CR_EQOS, "queue '%s' refused global QoS",
                                  c->q.name);
            if (!reply_error(r, "basic.consume", err))
                cr_err_set(err, CR_EBROKER, "basic.consume: failed");
            return err->code;
        }
        c->active = 1;
    }
    /* Our own queues last: only a consume tells whether the broker refuses
     * global QoS (the task queues are quorum), and that decides their type.
     * Declared first, they would be classic for good. Nothing is dead-lettered
     * or parked before set-up returns. */
    for (int i = 0; i < b->nconsumers; i++)
        if (b->consumers[i].q.follow_quorum &&
            declare_consumer(b, &b->consumers[i].q, 1, err))
            return err->code;
    if (declare_dead_letters(b, err))
        return err->code;
    b->consuming = 1;
    return 0;
}

static void on_timer(uv_timer_t *t);

/* After a failed attempt or a lost connection: the next node of the list. */
static void next_node(struct rmq_broker *b)
{
    b->node = rmq_failover_next(b->failover, b->urls.n, b->node, cr_xorshift64(&b->rng));
}

static int connect_node(struct rmq_broker *b, struct cr_err *err)
{
    struct rmq_url u;
    char redacted[512];
    struct cr_err e2;

    redact_url(b->urls.url[b->node], redacted, sizeof(redacted));
    teardown(b);
    if (rmq_url_parse(b->urls.url[b->node], &u, &e2))
        return cr_err_set(err, CR_EINVAL, "invalid broker URL '%s': %s", redacted,
                          e2.msg);
    snprintf(b->peer, sizeof(b->peer), "%s:%d", u.host, u.port);
    /* The publishing connection first: a delivery may arrive as soon as the
     * consumers start, and its outcome may need a publish. */
    if (link_open(b, &b->pub, &u, &e2) || setup_pub(b, &e2) ||
        link_open(b, &b->cons, &u, &e2) || setup_cons(b, &e2)) {
        if (e2.code != CR_EQOS || b->qos_refused)
            goto fail;
        /* A queue the application declared quorum: once, and for good, the
         * windows become per consumer (and delayed delivery may come in). */
        b->qos_refused = 1;
        LOG(LOG_WARNING,
            "broker refused global QoS (%s: a quorum queue?); reconnecting with "
            "per-consumer QoS",
            e2.msg);
        teardown(b);
        if (link_open(b, &b->pub, &u, &e2) || setup_pub(b, &e2) ||
            link_open(b, &b->cons, &u, &e2) || setup_cons(b, &e2))
            goto fail;
    }
    /* The calls above blocked: take the time now, not at the loop's last wake. */
    uv_update_time(b->loop);
    if (link_watch(b, &b->pub, &e2) || link_watch(b, &b->cons, &e2))
        goto fail;
    b->up = 1;
    b->generation++;
    b->reconnect_delay_ms = 0;
    b->hb_ms = (uint64_t)b->cons.heartbeat_s * 1000;
    if (b->hb_ms > 0) {
        uint64_t every = b->hb_ms / 4;
        uv_timer_start(&b->timer, on_timer, every ? every : 250, every ? every : 250);
    } else {
        uv_timer_stop(&b->timer);
    }
    /* A reconnect is said at the level its loss was, so the default level
     * shows both ends of an outage. */
    if (b->urls.n > 1)
        LOG(LOG_WARNING, "Connected to %s (node %d of %d in the failover list)", redacted,
            b->node + 1, b->urls.n);
    else if (b->generation > 1)
        LOG(LOG_WARNING, "Connected to %s again: the broker connection is back",
            redacted);
    else
        LOG(LOG_INFO, "Connected to %s", redacted);
    if (b->on_conn)
        b->on_conn(&b->base, 1, b->privdata);
    return 0;
fail:
    teardown(b);
    next_node(b);
    return cr_err_set(err, e2.code, "cannot connect to broker '%s': %s", redacted,
                      e2.msg);
}

static void lost_heartbeats(struct rmq_broker *b, const struct link *l)
{
    char why[400];
    snprintf(why, sizeof(why), "no heartbeat from %s for %llu s", b->peer,
             (unsigned long long)((uv_now(b->loop) - l->last_recv_ms) / 1000));
    connection_lost(b, why);
}

/* Takes the time of the last byte read: now, if any came since the last
 * look. Called after every read (pump) and before every check, so the time is
 * that of the loop turn that read it. */
static void note_rx(struct rmq_broker *b, struct link *l)
{
    uint64_t rx;
    if (!l->sock)
        return;
    rx = rmq_sock_received(l->sock);
    if (rx != l->rx_seen) {
        l->rx_seen = rx;
        l->last_recv_ms = uv_now(b->loop);
    }
}

/* Watches for writability only while bytes wait to be written: on_poll then
 * drains them. Called before the loop sleeps, after the turn's writes. */
static void watch_writes(struct link *l)
{
    int want;
    if (!l->poll || !l->sock)
        return;
    want = UV_READABLE | (rmq_sock_queued(l->sock) ? UV_WRITABLE : 0);
    if (want != l->poll_events) {
        l->poll_events = want;
        uv_poll_start(l->poll, want, on_poll);
    }
}

/* Two heartbeat intervals without a byte from the broker: the connection is
 * as good as gone, even if the socket stays open (a silent partition, a
 * broker host that vanished). rabbitmq-c does not check (see link_open):
 * this timer does, every quarter interval, and no write can hold it up, so a
 * dead link is found within two and a quarter intervals, busy or idle. Ours
 * go out every half interval, as RabbitMQ sends its own, whatever else was
 * written; when the broker stops reading they wait in rmq_sock's queue with
 * everything else. */
static void link_heartbeat(struct rmq_broker *b, struct link *l, uint64_t now)
{
    amqp_frame_t f;

    if (!b->up || !l->conn)
        return;
    note_rx(b, l);
    if (now - l->last_recv_ms > 2 * b->hb_ms) {
        lost_heartbeats(b, l);
        return;
    }
    if (now - l->last_beat_ms < b->hb_ms / 2)
        return;
    memset(&f, 0, sizeof(f));
    f.frame_type = AMQP_FRAME_HEARTBEAT;
    f.channel = 0;
    l->last_beat_ms = now;
    check_status(b, amqp_send_frame(l->conn, &f), "heartbeat");
}

static void on_timer(uv_timer_t *t)
{
    struct rmq_broker *b = t->data;
    struct cr_err err;

    if (b->up) {
        pump(&b->cons);
        pump(&b->pub);
        if (b->hb_ms) {
            link_heartbeat(b, &b->cons, uv_now(b->loop));
            link_heartbeat(b, &b->pub, uv_now(b->loop));
        }
        return;
    }
    if (b->stopping)
        return;
    if (connect_node(b, &err) == 0) {
        b->reconnects++;
        return;
    }
    /* The attempt blocked: a delay counted from the loop's stale time would
     * be cut short by however long that took. */
    uv_update_time(b->loop);
    b->reconnect_delay_ms = b->reconnect_delay_ms ? b->reconnect_delay_ms * 2 : 1000;
    if (b->reconnect_delay_ms > RECONNECT_MAX_MS)
        b->reconnect_delay_ms = RECONNECT_MAX_MS;
    LOG(LOG_ERROR, "consumer: %s; trying again in %.1f seconds", err.msg,
        (double)b->reconnect_delay_ms / 1000.0);
    uv_timer_start(&b->timer, on_timer, (uint64_t)b->reconnect_delay_ms, 0);
}

/* Either connection lost is the broker lost: both close (the broker requeues
 * the unacked deliveries), pending confirms fail, and both open again. Only
 * the first cause is said: later errors are its consequences. */
static void connection_lost(struct rmq_broker *b, const char *why)
{
    if (!b->up)
        return;
    LOG(LOG_WARNING, "consumer: connection to broker lost: %s; reconnecting", why);
    teardown(b);
    next_node(b);
    fail_all_confirms(b);
    if (b->on_conn)
        b->on_conn(&b->base, 0, b->privdata);
    if (b->stopping)
        return;
    b->reconnect_delay_ms = 0;
    uv_timer_start(&b->timer, on_timer, 500, 0);
}

/* ---------------------------------------------------------------- frames */

static void start_delivery(struct rmq_broker *b, amqp_channel_t channel,
                           const amqp_basic_deliver_t *d)
{
    struct delivery *m = delivery_new();
    delivery_free(b->cur);
    b->cur = m;
    if (channel == CHANNEL) {
        int rc = ack_batch_received(&b->acks, d->delivery_tag);
        if (rc < 0)
            LOG(LOG_WARNING,
                "broker: delivery %llu not tracked (%s): acks go one by one until "
                "the next reconnect",
                (unsigned long long)d->delivery_tag, cr_strerror(rc));
        if (!m) {
            /* Back to the queue now; held, it would sit unacked until the
             * connection closes and keep every later ack from batching. */
            LOG(LOG_ERROR, "out of memory for a delivery; requeued");
            if (ack_batch_reject(&b->acks, d->delivery_tag) >= 0)
                check_status(b,
                             amqp_basic_reject(b->cons.conn, CHANNEL, d->delivery_tag, 1),
                             "reject");
            return;
        }
    }
    if (!m)
        return;
    m->rec.seq = d->delivery_tag;
    m->rec.generation = b->generation;
    m->redelivered = d->redelivered;
    m->exchange = bytes_dup(d->exchange);
    m->routing_key = bytes_dup(d->routing_key);
    for (int i = 0; i < b->nconsumers; i++)
        if (strlen(b->consumers[i].tag) == d->consumer_tag.len &&
            !memcmp(b->consumers[i].tag, d->consumer_tag.bytes, d->consumer_tag.len)) {
            m->queue = cr_strdup(b->consumers[i].q.name);
            m->no_ack = b->consumers[i].q.no_ack;
        }
    if (!m->queue)
        m->queue = cr_strdup(m->routing_key);
    /* Only CHANNEL's consumers ack. A delivery on another channel whose
     * consumer was cancelled meanwhile (not found above) must not be acked on
     * CHANNEL with a tag of another channel's numbering. */
    if (channel != CHANNEL)
        m->no_ack = 1;
}

static void take_properties(struct delivery *m, const amqp_basic_properties_t *p)
{
    struct cr_err err;
    if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
        m->content_type = bytes_dup(p->content_type);
    if (p->_flags & AMQP_BASIC_CONTENT_ENCODING_FLAG)
        m->content_encoding = bytes_dup(p->content_encoding);
    if (p->_flags & AMQP_BASIC_CORRELATION_ID_FLAG)
        m->correlation_id = bytes_dup(p->correlation_id);
    if (p->_flags & AMQP_BASIC_REPLY_TO_FLAG)
        m->reply_to = bytes_dup(p->reply_to);
    if (p->_flags & AMQP_BASIC_EXPIRATION_FLAG)
        m->expiration = bytes_dup(p->expiration);
    if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
        m->message_id = bytes_dup(p->message_id);
    if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
        m->delivery_mode = p->delivery_mode;
    if (p->_flags & AMQP_BASIC_PRIORITY_FLAG)
        m->priority = m->wire_priority = p->priority;
    if (p->_flags & AMQP_BASIC_HEADERS_FLAG) {
        /* A bad entry drops only itself: the others (id, task...) stay in
         * m->headers for the dead letter and the FAILURE. */
        if (rmq_json_from_table_partial(&p->headers, &m->headers, &err)) {
            m->headers_bad = 1;
            m->headers_err = cr_strdup(err.msg); /* NULL on OOM: said as unknown */
        }
    }
}

static void finish_delivery(struct rmq_broker *b)
{
    struct delivery *m = b->cur;
    b->cur = NULL;
    if (!m->body)
        m->body = cr_strdup("");
    m->received_ms = uv_now(b->loop);
    m->caps = broker_delivery_caps(&b->base);
    b->on_delivery(&b->base, m, b->privdata);
}

static void send_held(struct rmq_broker *b);

static void on_blocked(struct rmq_broker *b, struct link *l, const amqp_bytes_t *reason)
{
    if (reason) {
        int was = b->cons.blocked || b->pub.blocked;
        snprintf(l->blocked_why, sizeof(l->blocked_why), "%.*s", (int)reason->len,
                 reason->bytes ? (const char *)reason->bytes : "");
        l->blocked = 1;
        if (!was)
            LOG(LOG_WARNING,
                "broker: publishing blocked by the broker (%s); tasks still run and are "
                "acked, publishes wait",
                l->blocked_why[0] ? l->blocked_why : "no reason given");
        return;
    }
    if (!l->blocked)
        return;
    l->blocked = 0;
    l->blocked_why[0] = '\0';
    if (b->cons.blocked || b->pub.blocked)
        return;
    LOG(LOG_WARNING, "broker: publishing unblocked; sending %zu held publishes",
        b->nheld - b->held_head);
    send_held(b);
}

/* Methods both connections may receive. Returns 1 when f was one. */
static int on_connection_method(struct rmq_broker *b, struct link *l, amqp_frame_t *f)
{
    switch (f->payload.method.id) {
    case AMQP_CHANNEL_CLOSE_METHOD: {
        amqp_channel_close_t *c = f->payload.method.decoded;
        char why[300];
        amqp_channel_close_ok_t ok = {0};
        snprintf(why, sizeof(why), "channel closed by broker: %d %.*s", c->reply_code,
                 (int)c->reply_text.len, (char *)c->reply_text.bytes);
        amqp_send_method(l->conn, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
        connection_lost(b, why);
        return 1;
    }
    case AMQP_CONNECTION_CLOSE_METHOD: {
        amqp_connection_close_t *c = f->payload.method.decoded;
        char why[300];
        amqp_connection_close_ok_t ok = {0};
        snprintf(why, sizeof(why), "connection closed by broker: %d %.*s", c->reply_code,
                 (int)c->reply_text.len, (char *)c->reply_text.bytes);
        amqp_send_method(l->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        connection_lost(b, why);
        return 1;
    }
    case AMQP_CONNECTION_BLOCKED_METHOD: {
        amqp_connection_blocked_t *m = f->payload.method.decoded;
        on_blocked(b, l, &m->reason);
        return 1;
    }
    case AMQP_CONNECTION_UNBLOCKED_METHOD:
        on_blocked(b, l, NULL);
        return 1;
    default:
        return 0;
    }
}

/* Frames of the publishing connection: confirms, and returns (whose content
 * frames are dropped; nothing is published mandatory). */
static void on_pub_frame(struct rmq_broker *b, amqp_frame_t *f)
{
    if (f->frame_type != AMQP_FRAME_METHOD)
        return;
    switch (f->payload.method.id) {
    case AMQP_BASIC_ACK_METHOD: {
        amqp_basic_ack_t *a = f->payload.method.decoded;
        resolve_confirms(b, a->delivery_tag, a->multiple, 1);
        break;
    }
    case AMQP_BASIC_NACK_METHOD: {
        amqp_basic_nack_t *a = f->payload.method.decoded;
        resolve_confirms(b, a->delivery_tag, a->multiple, 0);
        break;
    }
    case AMQP_BASIC_RETURN_METHOD: {
        amqp_basic_return_t *r = f->payload.method.decoded;
        LOG(LOG_WARNING, "broker returned an unroutable message: %d %.*s", r->reply_code,
            (int)r->reply_text.len, (char *)r->reply_text.bytes);
        break;
    }
    default:
        if (!on_connection_method(b, &b->pub, f))
            LOG(LOG_DEBUG, "broker: ignoring method 0x%08x",
                (unsigned)f->payload.method.id);
        break;
    }
}

static void send_consume(struct rmq_broker *b, struct consumer *c);
static void bind_delayed_nowait(struct rmq_broker *b, const struct broker_queue *q);

/* The broker cancelled one of our consumers (consumer_cancel_notify): its
 * queue was deleted, or, on RabbitMQ 4.3, a delivery outlived the quorum
 * queue's consumer timeout (the broker then gives the timed-out delivery
 * back and waits for our cancel-ok before the consumer is gone). Either way
 * the connection and every other consumer are fine: answer, declare the queue
 * again as at set-up (a deleted one comes back, an existing one is left as it
 * is) and consume again under the same tag, all without waiting. A refusal
 * closes the channel, and the reconnect declares everything again, as before.
 * Deliveries already held stay held and are acked as usual. */
static void consume_again(struct rmq_broker *b, amqp_channel_t ch,
                          const amqp_basic_cancel_t *m)
{
    struct consumer *c = NULL;
    struct broker_queue q;
    struct cr_err err;

    if (!m->nowait) {
        amqp_basic_cancel_ok_t ok;
        ok.consumer_tag = m->consumer_tag;
        amqp_send_method(b->cons.conn, ch, AMQP_BASIC_CANCEL_OK_METHOD, &ok);
    }
    for (int i = 0; i < b->nconsumers; i++) {
        const char *tag = b->consumers[i].tag;
        if (strlen(tag) == m->consumer_tag.len &&
            !memcmp(tag, m->consumer_tag.bytes, m->consumer_tag.len))
            c = &b->consumers[i];
    }
    if (!c || !c->active)
        return; /* cancelled by us meanwhile (cancel_consumer) */
    LOG(LOG_WARNING, "broker cancelled the consumer of queue '%s'; consuming it again",
        consumer_queue(c));
    c->active = 0;
    q = c->q;
    q.name = consumer_queue(c);
    if (c->as_is) {
        amqp_queue_declare_t qd;
        memset(&qd, 0, sizeof(qd));
        qd.queue = cstr(q.name);
        qd.passive = 1;
        qd.nowait = 1;
        qd.arguments = amqp_empty_table;
        amqp_send_method(b->cons.conn, CONSUMER_CHANNEL(&q), AMQP_QUEUE_DECLARE_METHOD,
                         &qd);
    } else if (declare_consumer(b, &q, 0, &err)) {
        return;
    }
    if (b->delayed_live && !q.no_ack)
        bind_delayed_nowait(b, &q);
    send_consume(b, c);
}

static void on_method(struct rmq_broker *b, amqp_frame_t *f)
{
    switch (f->payload.method.id) {
    case AMQP_BASIC_DELIVER_METHOD:
        start_delivery(b, f->channel, f->payload.method.decoded);
        break;
    case AMQP_BASIC_CANCEL_METHOD:
        consume_again(b, f->channel, f->payload.method.decoded);
        break;
    case AMQP_BASIC_CANCEL_OK_METHOD:
        break;
    default:
        if (!on_connection_method(b, &b->cons, f))
            LOG(LOG_DEBUG, "broker: ignoring method 0x%08x",
                (unsigned)f->payload.method.id);
        break;
    }
}

/* Frames of the queue-depth channel: replies to polls, and the channel's own
 * close (a polled queue is missing), which is answered and the channel opened
 * again; the broker drops whatever else was sent on it meanwhile, so every
 * poll still pending fails. */
static void on_stats_frame(struct rmq_broker *b, amqp_frame_t *f)
{
    if (f->frame_type != AMQP_FRAME_METHOD)
        return;
    switch (f->payload.method.id) {
    case AMQP_QUEUE_DECLARE_OK_METHOD: {
        amqp_queue_declare_ok_t *ok = f->payload.method.decoded;
        stats_pop(b, 1, ok->message_count, ok->consumer_count);
        break;
    }
    case AMQP_CHANNEL_CLOSE_METHOD: {
        amqp_channel_close_ok_t ok = {0};
        amqp_channel_open_t op;
        memset(&op, 0, sizeof(op));
        op.out_of_band = amqp_empty_bytes;
        amqp_send_method(b->cons.conn, STATS_CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
        amqp_send_method(b->cons.conn, STATS_CHANNEL, AMQP_CHANNEL_OPEN_METHOD, &op);
        b->stats_open = 2;
        while (b->stats_head < b->nstats)
            stats_pop(b, 0, 0, 0);
        break;
    }
    case AMQP_CHANNEL_OPEN_OK_METHOD:
        if (b->stats_open == 2)
            b->stats_open = 1;
        break;
    default:
        break;
    }
}

static void on_frame(struct rmq_broker *b, amqp_frame_t *f)
{
    if (f->channel == PROBE_CHANNEL)
        return; /* what the set-up probe was sent, given back when it closed */
    if (f->channel == STATS_CHANNEL) {
        on_stats_frame(b, f);
        return;
    }
    switch (f->frame_type) {
    case AMQP_FRAME_METHOD:
        on_method(b, f);
        break;
    case AMQP_FRAME_HEADER:
        if (!b->cur)
            break;
        take_properties(b->cur, f->payload.properties.decoded);
        b->cur_body_size = f->payload.properties.body_size;
        if (b->cur_body_size == 0) {
            finish_delivery(b);
        } else {
            b->cur->body = cr_malloc(b->cur_body_size + 1);
            if (!b->cur->body) {
                LOG(LOG_ERROR, "out of memory for a %llu-byte message",
                    (unsigned long long)b->cur_body_size);
                connection_lost(b, "out of memory");
            }
        }
        break;
    case AMQP_FRAME_BODY: {
        amqp_bytes_t frag = f->payload.body_fragment;
        if (!b->cur || !b->cur->body)
            break;
        if (b->cur->body_len + frag.len > b->cur_body_size) {
            connection_lost(b, "body frame larger than announced");
            break;
        }
        memcpy(b->cur->body + b->cur->body_len, frag.bytes, frag.len);
        b->cur->body_len += frag.len;
        if (b->cur->body_len == b->cur_body_size) {
            b->cur->body[b->cur->body_len] = '\0';
            finish_delivery(b);
        }
        break;
    }
    default:
        break;
    }
}

static void pump(struct link *l)
{
    struct rmq_broker *b = l->b;
    struct timeval zero = {0, 0};
    char buf[128];
    if (l->in_pump)
        return;
    l->in_pump = 1;
    /* Bounded so that a flood of deliveries cannot starve the rest of the loop. */
    for (int n = 0; n < 4096 && l->conn; n++) {
        amqp_frame_t f;
        int rc, e;
        errno = 0;
        rc = amqp_simple_wait_frame_noblock(l->conn, &f, &zero);
        e = errno;
        /* (No AMQP_STATUS_HEARTBEAT_TIMEOUT: rabbitmq-c is told there are no
         * heartbeats, link_heartbeat() checks them.) */
        if (rc == AMQP_STATUS_TIMEOUT)
            break;
        if (rc != AMQP_STATUS_OK) {
            connection_lost(b, status_text(rc, e, buf, sizeof(buf)));
            break;
        }
        if (l == &b->pub)
            on_pub_frame(b, &f);
        else
            on_frame(b, &f);
        if (l->conn && (l == &b->pub || !b->cur))
            amqp_maybe_release_buffers(l->conn);
    }
    note_rx(b, l);
    l->in_pump = 0;
}

static void on_check(uv_check_t *c)
{
    struct rmq_broker *b = c->data;
    struct link *links[2] = {&b->cons, &b->pub};
    for (int i = 0; i < 2; i++)
        if (links[i]->conn &&
            (amqp_data_in_buffer(links[i]->conn) || amqp_frames_enqueued(links[i]->conn)))
            pump(links[i]);
}

/* ------------------------------------------------------------ public API */

static struct rmq_broker *rmq_new(uv_loop_t *loop, const struct broker_config *cfg,
                                  broker_delivery_fn *on_delivery,
                                  broker_conn_fn *on_conn, void *privdata)
{
    struct rmq_broker *b = cr_calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->loop = loop;
    b->cfg = *cfg;
    b->cons.b = b->pub.b = b;
    b->cons.role = "consume";
    b->pub.role = "publish";
    b->on_delivery = on_delivery;
    b->on_conn = on_conn;
    b->privdata = privdata;
    uv_timer_init(loop, &b->timer);
    b->timer.data = b;
    uv_timer_init(loop, &b->confirm_timer);
    b->confirm_timer.data = b;
    uv_check_init(loop, &b->check);
    b->check.data = b;
    uv_check_start(&b->check, on_check);
    /* The check handle must not keep the loop alive on its own. */
    uv_unref((uv_handle_t *)&b->check);
    ack_batch_init(&b->acks);
    uv_prepare_init(loop, &b->prepare);
    b->prepare.data = b;
    uv_prepare_start(&b->prepare, on_prepare);
    uv_unref((uv_handle_t *)&b->prepare); /* nor the prepare handle */
    b->prefetch = cfg->prefetch_count;
    if (b->cfg.quorum)
        b->cfg.per_consumer_qos = 1;
    for (int i = 0; i < cfg->nqueues; i++) {
        struct broker_queue q;
        broker_task_queue(&q, cfg->queues[i]);
        if (rmq_add_consumer(&b->base, &q)) {
            rmq_free(&b->base);
            return NULL;
        }
    }
    return b;
}

static void consumer_release(struct consumer *c)
{
    broker_queue_release(&c->q);
    cr_free(c->tag);
    cr_free(c->alias);
    memset(c, 0, sizeof(*c));
}

static void send_consume(struct rmq_broker *b, struct consumer *c)
{
    amqp_basic_consume_t req;
    amqp_table_entry_t arg;
    if (rmq_qos_per_consumer(&b->base) && CONSUMER_CHANNEL(&c->q) == CHANNEL) {
        /* the new consumer's own window (its qos-ok is ignored on arrival) */
        amqp_basic_qos_t qos;
        memset(&qos, 0, sizeof(qos));
        qos.prefetch_count = prefetch_u16(b);
        qos.global = 0;
        amqp_send_method(b->cons.conn, CHANNEL, AMQP_BASIC_QOS_METHOD, &qos);
    }
    memset(&req, 0, sizeof(req));
    req.queue = cstr(consumer_queue(c));
    req.consumer_tag = cstr(c->tag);
    req.no_ack = c->q.no_ack;
    req.nowait = 1;
    req.arguments = consume_args(b, c, &arg);
    amqp_send_method(b->cons.conn, CONSUMER_CHANNEL(&c->q), AMQP_BASIC_CONSUME_METHOD,
                     &req);
    c->active = 1;
}

/* A queue added at run time (add_consumer) joins the delayed-delivery
 * topology as the queues of start-up did: "#.<queue>" on
 * celery_delayed_delivery, sent without waiting on the channel that declared
 * it, so it is in place before the consume. A refusal closes the channel and
 * the reconnect binds it again with the others. */
static void bind_delayed_nowait(struct rmq_broker *b, const struct broker_queue *q)
{
    char bkey[300];
    amqp_queue_bind_t qb;
    snprintf(bkey, sizeof(bkey), "#.%s", q->name);
    memset(&qb, 0, sizeof(qb));
    qb.queue = cstr(q->name);
    qb.exchange = cstr(DELAYED_DELIVERY_EXCHANGE);
    qb.routing_key = cstr(bkey);
    qb.nowait = 1;
    qb.arguments = amqp_empty_table;
    amqp_send_method(b->cons.conn, CONSUMER_CHANNEL(q), AMQP_QUEUE_BIND_METHOD, &qb);
}

static int rmq_add_consumer(struct broker *base, const struct broker_queue *q)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    struct consumer *c;
    char tag[96];
    struct cr_err err;

    for (int i = 0; i < b->nconsumers; i++)
        if (!strcmp(b->consumers[i].q.name, q->name))
            return 0;
    if (b->nconsumers == MAX_CONSUMERS)
        return CR_ERANGE;
    c = &b->consumers[b->nconsumers];
    memset(c, 0, sizeof(*c));
    if (broker_queue_copy(&c->q, q))
        return CR_ENOMEM;
    snprintf(tag, sizeof(tag), "celeriac-%lu-%.60s", ++b->next_tag, q->name);
    c->tag = cr_strdup(tag);
    if (!c->tag) {
        consumer_release(c);
        return CR_ENOMEM;
    }
    b->nconsumers++;
    if (b->up) {
        if (declare_consumer(b, &c->q, 0, &err) == 0 && !c->q.no_consume) {
            if (b->delayed_live && !c->q.no_ack)
                bind_delayed_nowait(b, &c->q);
            send_consume(b, c);
        }
    }
    return 0;
}

static int rmq_cancel_consumer(struct broker *base, const char *queue)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    for (int i = 0; i < b->nconsumers; i++) {
        struct consumer *c = &b->consumers[i];
        if (strcmp(c->q.name, queue))
            continue;
        if (b->up && c->active) {
            amqp_basic_cancel_t req;
            req.consumer_tag = cstr(c->tag);
            req.nowait = 0;
            amqp_send_method(b->cons.conn, CONSUMER_CHANNEL(&c->q),
                             AMQP_BASIC_CANCEL_METHOD, &req);
        }
        consumer_release(c);
        memmove(c, c + 1, (size_t)(b->nconsumers - i - 1) * sizeof(*c));
        b->nconsumers--;
        return 0;
    }
    return CR_ENOTFOUND;
}

static void rmq_each_consumer(const struct broker *base,
                              void (*fn)(const struct broker_queue *q, void *arg),
                              void *arg)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    for (int i = 0; i < b->nconsumers; i++)
        if (!b->consumers[i].q.no_consume)
            fn(&b->consumers[i].q, arg);
}

static int rmq_declare_exchange(struct broker *base, const char *name, const char *type,
                                int durable)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    struct exchange_decl *e;
    for (int i = 0; i < b->nexchanges; i++)
        if (!strcmp(b->exchanges[i].name, name))
            return 0;
    if (b->nexchanges == MAX_EXCHANGES)
        return CR_ERANGE;
    e = &b->exchanges[b->nexchanges];
    e->name = cr_strdup(name);
    e->type = cr_strdup(type);
    e->durable = durable;
    if (!e->name || !e->type) {
        cr_free(e->name);
        cr_free(e->type);
        return CR_ENOMEM;
    }
    b->nexchanges++;
    /* On the publishing channel, ahead of the publishes that need it. */
    if (b->up) {
        amqp_exchange_declare_t ed;
        memset(&ed, 0, sizeof(ed));
        ed.exchange = cstr(name);
        ed.type = cstr(type);
        ed.durable = durable;
        ed.nowait = 1;
        ed.arguments = amqp_empty_table;
        check_status(
            b,
            amqp_send_method(b->pub.conn, PUB_CHANNEL, AMQP_EXCHANGE_DECLARE_METHOD, &ed),
            "exchange.declare");
    }
    return 0;
}

static int rmq_queue_stats(struct broker *base, const char *queue,
                           broker_queue_stats_fn *cb, void *privdata)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    amqp_queue_declare_t qd;
    int rc;
    if (!b->up || b->stats_open != 1)
        return CR_EBROKER;
    if (b->nstats == b->capstats) {
        size_t cap = b->capstats ? b->capstats * 2 : 16;
        struct pending_stats *p = cr_realloc(b->stats, cap * sizeof(*p));
        if (!p)
            return CR_ENOMEM;
        b->stats = p;
        b->capstats = cap;
    }
    memset(&qd, 0, sizeof(qd));
    qd.queue = cstr(queue);
    qd.passive = 1;
    qd.arguments = amqp_empty_table;
    rc = amqp_send_method(b->cons.conn, STATS_CHANNEL, AMQP_QUEUE_DECLARE_METHOD, &qd);
    if (check_status(b, rc, "queue.declare"))
        return CR_EBROKER;
    b->stats[b->nstats].cb = cb;
    b->stats[b->nstats].privdata = privdata;
    b->nstats++;
    return 0;
}

static void rmq_queue_stats_cancel(struct broker *base, void *privdata)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    for (size_t i = b->stats_head; i < b->nstats; i++)
        if (b->stats[i].privdata == privdata)
            b->stats[i].cb = NULL;
}

static void rmq_set_prefetch(struct broker *base, int prefetch_count)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    amqp_basic_qos_t req;
    if (prefetch_count > 65535)
        prefetch_count = 65535;
    if (prefetch_count == b->prefetch)
        return;
    b->prefetch = prefetch_count;
    /* Per-consumer windows are fixed by RabbitMQ when a consumer starts: the
     * new count waits for the next consume (see send_consume(), setup_cons()).
     * NEEDSWORK: so held eta tasks count against their queue's window under
     * strict order; parking (--park-after) bounds how long they hold it. */
    if (!b->up || rmq_qos_per_consumer(&b->base))
        return;
    memset(&req, 0, sizeof(req));
    req.prefetch_count = (uint16_t)prefetch_count;
    req.global = 1;
    amqp_send_method(b->cons.conn, CHANNEL, AMQP_BASIC_QOS_METHOD, &req);
}

static int rmq_connected(const struct broker *base)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->up;
}

static unsigned rmq_generation(const struct broker *base)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->generation;
}

static unsigned long rmq_reconnects(const struct broker *base)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->reconnects;
}

static int rmq_blocked(const struct broker *base, const char **why)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    const struct link *l = b->pub.blocked ? &b->pub : b->cons.blocked ? &b->cons : NULL;
    if (why)
        *why = l ? l->blocked_why : NULL;
    return l != NULL;
}

/* rc of a write: a failure loses the connection, said once with its cause.
 * Called right after the write, so errno is still the write's. */
static int check_status(struct rmq_broker *b, int rc, const char *what)
{
    int e = errno;
    char buf[128], why[200];
    if (rc == AMQP_STATUS_OK)
        return 0;
    snprintf(why, sizeof(why), "cannot send %s: %s", what,
             status_text(rc, e, buf, sizeof(buf)));
    connection_lost(b, why);
    return CR_EBROKER;
}

/* Sends the acks made since the last flush: usually one basic.ack with
 * multiple = 1, plus one frame per ack above a delivery still in progress.
 * Returns 0 or the rabbitmq-c status of the first write that failed; the
 * caller decides whether that loses the connection. */
static int flush_acks(struct rmq_broker *b)
{
    uint64_t upto;
    const uint64_t *singles;
    size_t n;
    int rc;

    if (!b->up || ack_batch_npending(&b->acks) == 0)
        return AMQP_STATUS_OK;
    n = ack_batch_flush(&b->acks, &upto, &singles);
    if (upto) {
        rc = amqp_basic_ack(b->cons.conn, CHANNEL, upto, 1);
        if (rc != AMQP_STATUS_OK)
            return rc;
    }
    for (size_t i = 0; i < n; i++) {
        rc = amqp_basic_ack(b->cons.conn, CHANNEL, singles[i], 0);
        if (rc != AMQP_STATUS_OK)
            return rc;
    }
    return AMQP_STATUS_OK;
}

static void on_prepare(uv_prepare_t *p)
{
    struct rmq_broker *b = p->data;
    check_status(b, flush_acks(b), "ack");
    watch_writes(&b->cons);
    watch_writes(&b->pub);
}

static int rmq_ack(struct broker *base, struct delivery *d)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    int rc;
    if (!b->up || d->rec.generation != b->generation || d->no_ack || d->settled)
        return 0;
    d->settled = 1;
    /* Usually only recorded here and sent by on_prepare() with the other acks
     * of this loop iteration. The delivery's outcome is already durable, so
     * the short delay loses nothing: a crash before the flush redelivers it,
     * exactly as a crash before a direct ack would. */
    rc = ack_batch_ack(&b->acks, d->rec.seq);
    if (rc == 0)
        return 0;
    if (rc < 0) {
        LOG(LOG_ERROR, "broker: delivery %llu acked twice; second ack not sent",
            (unsigned long long)d->rec.seq);
        return 0;
    }
    return check_status(b, amqp_basic_ack(b->cons.conn, CHANNEL, d->rec.seq, 0), "ack");
}

static int rmq_reject(struct broker *base, struct delivery *d, int requeue)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    if (!b->up || d->rec.generation != b->generation || d->no_ack || d->settled)
        return 0;
    d->settled = 1;
    /* Sent at once. The acks still pending need not go first: see
     * ack_batch_reject(). */
    if (ack_batch_reject(&b->acks, d->rec.seq) < 0) {
        LOG(LOG_ERROR, "broker: delivery %llu settled twice; reject not sent",
            (unsigned long long)d->rec.seq);
        return 0;
    }
    return check_status(b, amqp_basic_reject(b->cons.conn, CHANNEL, d->rec.seq, requeue),
                        "reject");
}

/* A delivery of a lost connection is back in its queue already: the broker
 * requeued it when the connection closed. */
static int rmq_live(const struct broker *base, const struct delivery *d)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->up && d->rec.generation == b->generation;
}

/* Writes one publish on the publishing channel and queues its confirm. */
static int send_publish(struct rmq_broker *b, const struct outbound *o,
                        broker_confirm_fn *cb, void *privdata)
{
    amqp_basic_properties_t p;
    amqp_pool_t pool;
    amqp_bytes_t bb;
    struct cr_err err;
    int rc;

    if (b->nconfirms == b->capconfirms) {
        size_t cap = b->capconfirms ? b->capconfirms * 2 : 64;
        struct pending_confirm *pc = cr_realloc(b->confirms, cap * sizeof(*pc));
        if (!pc)
            return CR_ENOMEM;
        b->confirms = pc;
        b->capconfirms = cap;
    }
    memset(&p, 0, sizeof(p));
    init_amqp_pool(&pool, 4096);
#define SETS(field, flag)                                                                \
    if (o->field) {                                                                      \
        p._flags |= flag;                                                                \
        p.field = cstr(o->field);                                                        \
    }
    SETS(content_type, AMQP_BASIC_CONTENT_TYPE_FLAG)
    SETS(content_encoding, AMQP_BASIC_CONTENT_ENCODING_FLAG)
    SETS(correlation_id, AMQP_BASIC_CORRELATION_ID_FLAG)
    SETS(reply_to, AMQP_BASIC_REPLY_TO_FLAG)
    SETS(expiration, AMQP_BASIC_EXPIRATION_FLAG)
#undef SETS
    if (o->delivery_mode) {
        p._flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
        p.delivery_mode = (uint8_t)o->delivery_mode;
    }
    if (o->priority >= 0) {
        p._flags |= AMQP_BASIC_PRIORITY_FLAG;
        p.priority = (uint8_t)o->priority;
    }
    if (o->headers) {
        if (rmq_json_to_table(o->headers, &pool, &p.headers, &err)) {
            empty_amqp_pool(&pool);
            return err.code;
        }
        p._flags |= AMQP_BASIC_HEADERS_FLAG;
    }
    bb.bytes = (void *)o->body;
    bb.len = o->body_len;
    rc =
        amqp_basic_publish(b->pub.conn, PUB_CHANNEL, cstr(o->exchange ? o->exchange : ""),
                           cstr(o->routing_key ? o->routing_key : ""), 0, 0, &p, bb);
    empty_amqp_pool(&pool);
    if (check_status(b, rc, "publish"))
        return CR_EBROKER;
    b->confirms[b->nconfirms].seq = b->next_seq++;
    b->confirms[b->nconfirms].cb = cb;
    b->confirms[b->nconfirms].privdata = privdata;
    b->nconfirms++;
    return 0;
}

static int dup_opt(char **dst, const char *src)
{
    *dst = src ? cr_strdup(src) : NULL;
    return src && !*dst;
}

/* Keeps a copy of the publish until the broker unblocks. RabbitMQ would not
 * read it anyway, and written into a socket it does not read it would fill
 * the send buffer, and the next write would block the whole loop. */
static int hold_publish(struct rmq_broker *b, const struct outbound *o,
                        broker_confirm_fn *cb, void *privdata)
{
    struct held_publish *h;
    size_t len = o->body_len;
    size_t cost = len + 512;
    int oom;

    if (o->no_hold || b->held_bytes + cost > HELD_MAX_BYTES)
        return CR_EBROKER;
    if (b->held_head > 0 && b->held_head == b->nheld)
        b->held_head = b->nheld = 0;
    if (b->nheld == b->capheld) {
        size_t cap = b->capheld ? b->capheld * 2 : 16;
        struct held_publish *p = cr_realloc(b->held, cap * sizeof(*p));
        if (!p)
            return CR_ENOMEM;
        b->held = p;
        b->capheld = cap;
    }
    h = &b->held[b->nheld];
    memset(h, 0, sizeof(*h));
    oom = dup_opt(&h->exchange, o->exchange) | dup_opt(&h->routing_key, o->routing_key) |
          dup_opt(&h->content_type, o->content_type) |
          dup_opt(&h->content_encoding, o->content_encoding) |
          dup_opt(&h->correlation_id, o->correlation_id) |
          dup_opt(&h->reply_to, o->reply_to) | dup_opt(&h->expiration, o->expiration);
    if (o->headers && !(h->headers = cJSON_Duplicate(o->headers, 1)))
        oom = 1;
    if (!(h->body = cr_malloc(len + 1)))
        oom = 1;
    if (oom) {
        held_release(h);
        return CR_ENOMEM;
    }
    memcpy(h->body, o->body, len);
    h->len = len;
    h->delivery_mode = o->delivery_mode;
    h->priority = o->priority;
    h->cb = cb;
    h->privdata = privdata;
    b->nheld++;
    b->held_bytes += cost;
    return 0;
}

/* Publishing unblocked: the held publishes go out in order. A failed write
 * loses the connection, which fails the rest. */
static void send_held(struct rmq_broker *b)
{
    while (b->up && !b->pub.blocked && b->held_head < b->nheld) {
        struct held_publish h = b->held[b->held_head++];
        struct outbound p;
        int rc;
        memset(&p, 0, sizeof(p));
        p.exchange = h.exchange;
        p.routing_key = h.routing_key;
        p.body = h.body;
        p.body_len = h.len;
        p.content_type = h.content_type;
        p.content_encoding = h.content_encoding;
        p.correlation_id = h.correlation_id;
        p.reply_to = h.reply_to;
        p.expiration = h.expiration;
        p.delivery_mode = h.delivery_mode;
        p.priority = h.priority;
        p.headers = h.headers;
        b->held_bytes -= h.len + 512;
        rc = send_publish(b, &p, h.cb, h.privdata);
        held_release(&h);
        if (rc) {
            struct pending_confirm pc = {0, h.cb, h.privdata};
            confirm_push_failed(b, pc);
            uv_timer_start(&b->confirm_timer, on_confirm_timer, 0, 0);
        }
    }
    if (b->held_head == b->nheld)
        b->held_head = b->nheld = b->held_bytes = 0;
}

static int rmq_publish(struct broker *base, const struct outbound *o,
                       broker_confirm_fn *cb, void *privdata)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    if (!b->up)
        return CR_EBROKER;
    /* Behind the held ones too, so that publishes keep their order. */
    if (b->pub.blocked || b->held_head < b->nheld)
        return hold_publish(b, o, cb, privdata);
    return send_publish(b, o, cb, privdata);
}

static void rmq_stop_consuming(struct broker *base)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    if (!b->up || !b->consuming)
        return;
    for (int i = 0; i < b->nconsumers; i++) {
        amqp_basic_cancel_t req;
        if (b->consumers[i].q.no_ack || !b->consumers[i].active)
            continue; /* control queues keep working during a warm shutdown */
        req.consumer_tag = cstr(b->consumers[i].tag);
        req.nowait = 0;
        amqp_send_method(b->cons.conn, CHANNEL, AMQP_BASIC_CANCEL_METHOD, &req);
        b->consumers[i].active = 0;
    }
    b->consuming = 0;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct rmq_broker *b = h->data;
    /* Four handles are closed; the last one frees. */
    if (++b->nclosed == 4) {
        for (int i = 0; i < b->nconsumers; i++)
            consumer_release(&b->consumers[i]);
        for (int i = 0; i < b->nexchanges; i++) {
            cr_free(b->exchanges[i].name);
            cr_free(b->exchanges[i].type);
        }
        cr_free(b->failed);
        cr_free(b->confirms);
        cr_free(b->stats);
        cr_free(b->held);
        ack_batch_release(&b->acks);
        cr_free(b);
    }
}

static void rmq_free(struct broker *base)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    if (!b)
        return;
    b->stopping = 1;
    if (b->up) {
        /* Acks made since the last loop iteration go out first (a warm
         * shutdown's last tasks are settled in the iteration that stops the
         * loop, whose prepare never runs); channel.close waits for close-ok,
         * so the broker has them all before the connection goes. A failed
         * write is not connection_lost(): that would call on_conn into an
         * owner that is being freed. */
        int rc = flush_acks(b);
        if (rc != AMQP_STATUS_OK)
            LOG(LOG_ERROR, "broker: cannot send the last acks: %s",
                amqp_error_string2(rc));
        /* A clean close: unacked deliveries go back to their queues at once. */
        amqp_channel_close(b->cons.conn, CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(b->cons.conn, AMQP_REPLY_SUCCESS);
        /* The broker has read every publish once it answers the close (the
         * last events among them); a blocked one would answer only after
         * the alarm, so that connection is just dropped. */
        if (!b->pub.blocked)
            amqp_connection_close(b->pub.conn, AMQP_REPLY_SUCCESS);
    }
    teardown(b);
    for (size_t i = b->confirm_head; i < b->nconfirms; i++)
        if (b->confirms[i].cb)
            b->confirms[i].cb(&b->base, 0, b->confirms[i].privdata);
    b->confirm_head = b->nconfirms = 0;
    fail_held(b);
    on_confirm_timer(&b->confirm_timer);
    b->nclosed = 0;
    uv_close((uv_handle_t *)&b->timer, on_handle_closed);
    uv_close((uv_handle_t *)&b->confirm_timer, on_handle_closed);
    uv_close((uv_handle_t *)&b->check, on_handle_closed);
    uv_close((uv_handle_t *)&b->prepare, on_handle_closed);
}

/* ------------------------------------------------------------ the face */

/* At start-up every node of a failover list gets one try, in the strategy's
 * order, before the worker gives up: a cluster with one node down still
 * starts. Each failure is said; the last one is returned. */
static int rmq_connect(struct broker *base, struct cr_err *err)
{
    struct rmq_broker *b = (struct rmq_broker *)base;
    int n = b->urls.n;
    for (int i = 0;; i++) {
        if (connect_node(b, err) == 0)
            return 0;
        if (i + 1 >= n)
            return err->code;
        LOG(LOG_ERROR, "consumer: %s; trying the next node", err->msg);
    }
}

static unsigned rmq_live_caps(const struct broker *base)
{
    const struct rmq_broker *b = (const struct rmq_broker *)base;
    return b->up && b->delayed_live ? MSG_CAP_DELAYED : 0;
}

static const struct broker_vtab rmq_vtab = {
    .name = "amqp",
    .caps = MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY | MSG_CAP_PREFETCH | MSG_CAP_PARK,
    .live_caps = rmq_live_caps,
    .qos_per_consumer = rmq_qos_per_consumer,
    .connect = rmq_connect,
    .connected = rmq_connected,
    .generation = rmq_generation,
    .reconnects = rmq_reconnects,
    .blocked = rmq_blocked,
    .ack = rmq_ack,
    .reject = rmq_reject,
    .live = rmq_live,
    .publish = rmq_publish,
    .add_consumer = rmq_add_consumer,
    .cancel_consumer = rmq_cancel_consumer,
    .each_consumer = rmq_each_consumer,
    .declare_exchange = rmq_declare_exchange,
    .queue_stats = rmq_queue_stats,
    .queue_stats_cancel = rmq_queue_stats_cancel,
    .set_prefetch = rmq_set_prefetch,
    .stop_consuming = rmq_stop_consuming,
    .free = rmq_free,
};

struct broker *rmq_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                              broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                              void *privdata, struct cr_err *err)
{
    struct rmq_broker *b = rmq_new(loop, cfg, on_delivery, on_conn, privdata);
    if (!b) {
        cr_err_set(err, CR_ENOMEM, "out of memory creating the broker");
        return NULL;
    }
    b->base.vt = &rmq_vtab;
    if (rmq_url_list_parse(cfg->url, &b->urls, err) ||
        rmq_failover_parse(cfg->failover_strategy, &b->failover, err)) {
        rmq_free(&b->base);
        return NULL;
    }
    b->rng = uv_hrtime() ^ ((uint64_t)(uintptr_t)b << 16);
    return &b->base;
}
