/* sqs_broker.c -- Amazon SQS as the broker, as kombu's SQS transport uses it
 * (the SQS broker reference, sections 6 and 7), on the libuv loop.
 *
 * Every call is one signed JSON-protocol POST (net/sqs_sign.h) run by one
 * curl multi handle on the loop (net/curl_loop.h), so connections are pooled
 * and nothing blocks the loop. Only broker_connect() blocks: it
 * resolves the queue URLs (GetQueueUrl, CreateQueue when missing, as kombu
 * creates them; predefined_queues are taken as given).
 *
 * What is held, how much to ask for, when an ack goes and when a visibility
 * is extended or given back is net/vsession.c's to decide, as for Redis (in
 * its long-polls mode: one ReceiveMessage per consumed queue, of at most ten
 * and the free room of the window, none while it is full). A held message is
 * a session record whose tag is its queue's name and receipt handle
 * (sqs_tag_new()): a lease refresh is a visibility change to the queue's
 * timeout, an ack a delete, a requeue or our stop a visibility change to
 * wait_time_seconds or 0. This file keeps the queue URL cache, one poll per
 * queue with its pause after a failure, and the deletes and visibility
 * changes the session asked for in the loop iteration, sent before the loop
 * next waits, per queue, in batches of at most ten. */
#include "broker_int.h"
#include "sqs_broker_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <curl/curl.h>

#include "net/curl_loop.h"
#include "net/sqs_call.h"
#include "net/sqs_sign.h"
#include "net/sqs_url.h"
#include "net/vsession.h"
#include "protocol/sqs.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/uuid.h"

extern char **environ;

#define TICK_MS 100
#define CALL_TIMEOUT_MS 15000
#define CONNECT_TIMEOUT_MS 5000
#define RETRY_MAX 6
#define BACKOFF_CAP_MS 10000
#define POLL_ERROR_PAUSE_MS 5000
#define FREE_WAIT_MS 3000
#define MAX_CONSUMERS 1024

/* ------------------------------------------------------------ state */

/* One SQS queue we know the URL of (or are finding it). Never freed before
 * the broker: held messages, polls and publishes point at it. */
struct qurl {
    struct qurl *next;
    char name[SQS_QUEUE_NAME_MAX + 8]; /* the SQS name */
    char *url;                         /* NULL while being resolved */
    int resolving;
    struct sqs_dest dest; /* the conf's or a predefined queue's */
    long vis_s;           /* the queue's VisibilityTimeout, read at connect; 0: the
                           * visibility_timeout option */
    struct pub *waiting;  /* publishes waiting for the URL */
};

/* A consumed queue. */
struct cons {
    struct broker_queue q;
    struct qurl *qu;
    int polling; /* a ReceiveMessage is in flight */
    int asked;   /* its MaxNumberOfMessages (room the session holds for it) */
    int cancelled;
    int failures;
    uint64_t paused_until; /* loop ms */
};

/* A session record's data: a message received and not settled (its tag
 * says the queue and the receipt handle). */
struct held {
    struct qurl *qu;
    uint64_t received_ms; /* SQS's 12 h cap counts from here */
};

/* A settlement waiting for the next flush: delete, or change visibility. */
struct settle {
    struct sqs_pending p; /* first: next, the queue (its qurl), the kind */
    struct qurl *qu;
    char *tag;           /* the session's: queue name, space, receipt handle */
    const char *receipt; /* in tag */
    long vis_s;
};

/* A publish. */
struct pub {
    struct pub *next; /* on its qurl's waiting list */
    struct qurl *qu;
    struct buf msg; /* the Body */
    long delay_s;   /* DelaySeconds on a standard queue, -1: none */
    broker_confirm_fn *cb;
    void *privdata;
};

enum req_kind { RK_RECEIVE, RK_SETTLE, RK_SEND, RK_GET_URL, RK_CREATE, RK_STATS };

struct req {
    struct req *next; /* active or retry list */
    struct sqs_broker *b;
    enum req_kind kind;
    enum sqs_action action;
    struct qurl *qu;
    CURL *easy;
    struct curl_slist *hdrs;
    struct buf body;
    struct sqs_answer ans;
    int attempts;
    uint64_t due_ms;
    struct cons *cons;      /* RK_RECEIVE */
    struct settle *settles; /* RK_SETTLE: what the batch carries */
    int nsettles;
    struct pub *pub;                 /* RK_SEND */
    broker_queue_stats_fn *stats_cb; /* RK_STATS; NULL once cancelled */
    void *privdata;
};

struct sqs_broker {
    struct broker base;
    uv_loop_t *loop;
    struct broker_config cfg;
    broker_delivery_fn *on_delivery;
    void *privdata;
    struct sqs_conf conf;
    cJSON *create_attrs, *tags;

    struct curl_loop *http;
    uv_timer_t tick;
    uv_prepare_t prepare;
    int closed_handles;

    struct qurl *urls;
    struct cons *cons;
    int ncons, cap_cons;
    struct vsession *vs;         /* what is held, polled, acked, refreshed */
    struct sqs_pending *settles; /* struct settle nodes, to flush */
    struct req *active;
    struct req *retry;
    int nactive_receives;
    int connected;
    int freeing;
    char last_err[256]; /* why the last add_consumer failed */
};

static uint64_t now_ms(struct sqs_broker *b)
{
    return uv_now(b->loop);
}

static double jitter(void)
{
    unsigned char r[2];
    if (uv_random(NULL, NULL, r, sizeof(r), 0, NULL) != 0)
        return 0.5;
    return (double)((r[0] << 8) | r[1]) / 65535.0;
}

static void req_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status);
static void settles_done(struct sqs_broker *b, struct settle *list,
                         enum vsession_reply rep);

/* ------------------------------------------------------------ curl on the loop */

/* curl_loop's done: one request answered (or failed). */
static void on_req_done(void *owner, void *req, CURLcode cc, long status)
{
    struct sqs_broker *b = owner;
    struct req *r = req;
    for (struct req **p = &b->active; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            break;
        }
    }
    req_done(b, r, cc, status);
}

static struct req *req_new(struct sqs_broker *b, enum req_kind kind,
                           enum sqs_action action, struct qurl *qu)
{
    struct req *r = cr_calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->b = b;
    r->kind = kind;
    r->action = action;
    r->qu = qu;
    buf_init(&r->body);
    sqs_answer_init(&r->ans);
    return r;
}

static void req_drop_easy(struct req *r)
{
    if (r->easy)
        curl_easy_cleanup(r->easy);
    r->easy = NULL;
    curl_slist_free_all(r->hdrs);
    r->hdrs = NULL;
}

static void settles_free(struct settle *s)
{
    while (s) {
        struct settle *n = (struct settle *)s->p.next;
        cr_free(s->tag);
        cr_free(s);
        s = n;
    }
}

static void pub_free(struct pub *p)
{
    if (!p)
        return;
    buf_release(&p->msg);
    cr_free(p);
}

static void req_free(struct req *r)
{
    req_drop_easy(r);
    buf_release(&r->body);
    sqs_answer_release(&r->ans);
    settles_free(r->settles);
    pub_free(r->pub);
    cr_free(r);
}

/* Starts r (its body built). Returns 0, or an error (r untouched but for its
 * handle). */
static int req_start(struct sqs_broker *b, struct req *r)
{
    struct sqs_sign_req rq;
    struct cr_err err = {0};
    long timeout = CALL_TIMEOUT_MS;

    req_drop_easy(r);
    sqs_answer_reset(&r->ans);
    r->easy = curl_easy_init();
    if (!r->easy)
        return CR_ENOMEM;
    sqs_dest_req(&r->qu->dest, r->action, &r->body, &rq);
    if (sqs_sign_setup(r->easy, &rq, &r->hdrs, &err)) {
        LOG(LOG_ERROR, "broker: sqs: cannot sign %s: %s", rq.target, err.msg);
        req_drop_easy(r);
        return err.code ? err.code : CR_EINVAL;
    }
    if (r->kind == RK_RECEIVE)
        timeout = (long)b->conf.wait_time_s * 1000 + CALL_TIMEOUT_MS;
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    sqs_answer_attach(r->easy, &r->ans);
    curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, timeout);
    curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
    curl_easy_setopt(r->easy, CURLOPT_EXPECT_100_TIMEOUT_MS, 1000L);
    if (curl_loop_add(b->http, r->easy)) {
        req_drop_easy(r);
        return CR_ENOMEM;
    }
    r->next = b->active;
    b->active = r;
    if (r->kind == RK_RECEIVE)
        b->nactive_receives++;
    return 0;
}

/* Sends r again after its back-off; 0 when it was scheduled, -1 when it has
 * had its attempts. */
static int req_retry(struct sqs_broker *b, struct req *r)
{
    if (++r->attempts > RETRY_MAX || b->freeing)
        return -1;
    req_drop_easy(r);
    r->due_ms = now_ms(b) + sqs_backoff_ms(r->attempts, BACKOFF_CAP_MS, jitter());
    r->next = b->retry;
    b->retry = r;
    return 0;
}

/* ------------------------------------------------------------ queue URLs */

static struct qurl *qurl_find(struct sqs_broker *b, const char *name)
{
    for (struct qurl *u = b->urls; u; u = u->next)
        if (!strcmp(u->name, name))
            return u;
    return NULL;
}

/* The entry of SQS queue name, added when new (URL still unknown, or taken
 * from predefined_queues). NULL with err: a name SQS refuses, a queue not
 * predefined while some are, out of memory. */
static struct qurl *qurl_get(struct sqs_broker *b, const char *celery_name,
                             struct cr_err *err)
{
    char name[SQS_QUEUE_NAME_MAX + 8];
    struct qurl *u;
    if (sqs_queue_name(b->conf.prefix, celery_name, name, sizeof(name), err))
        return NULL;
    if ((u = qurl_find(b, name)))
        return u;
    u = cr_calloc(1, sizeof(*u));
    if (!u) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(u->name, sizeof(u->name), "%s", name);
    u->dest.endpoint = b->conf.endpoint;
    u->dest.region = b->conf.region;
    u->dest.creds = &b->conf.creds;
    if (b->conf.npredefined) {
        const struct sqs_queue_def *d = sqs_conf_queue(&b->conf, name);
        if (!d) {
            cr_free(u);
            cr_err_set(err, CR_EINVAL,
                       "sqs: queue '%s' (SQS name '%s') is not in predefined_queues",
                       celery_name, name);
            return NULL;
        }
        u->url = cr_strdup(d->url);
        u->dest.endpoint = d->endpoint;
        u->dest.region = d->region;
        u->dest.creds = &d->creds;
        if (!u->url) {
            cr_free(u);
            cr_err_set(err, CR_ENOMEM, "out of memory");
            return NULL;
        }
    }
    u->next = b->urls;
    b->urls = u;
    return u;
}

/* One call at start-up, blocking, bounded by CALL_TIMEOUT_MS. Returns 0 with
 * *status and the answer in ans, or an error in err (transport failure). */
static int call_blocking(struct sqs_broker *b, struct qurl *u, enum sqs_action a,
                         struct buf *body, long *status, struct sqs_answer *ans,
                         struct cr_err *err)
{
    return sqs_call_blocking(&u->dest, a, body, CALL_TIMEOUT_MS,
                             b->cfg.connect_timeout > 0 ? b->cfg.connect_timeout * 1000L
                                                        : CONNECT_TIMEOUT_MS,
                             status, ans, err);
}

static int create_body(struct sqs_broker *b, struct qurl *u, struct buf *body,
                       struct cr_err *err)
{
    return sqs_req_create_queue(body, u->name, b->conf.visibility_timeout_s,
                                b->create_attrs, b->tags, err);
}

/* Start-up: GetQueueUrl, and CreateQueue when it is missing. */
static int resolve_blocking(struct sqs_broker *b, struct qurl *u, struct cr_err *err)
{
    for (int create = 0; create < 2; create++) {
        struct buf body;
        struct sqs_answer ans;
        long status = 0;
        struct sqs_error e;
        int rc;
        buf_init(&body);
        sqs_answer_init(&ans);
        rc = create ? create_body(b, u, &body, err)
                    : sqs_req_get_queue_url(&body, u->name, err);
        if (!rc)
            rc = call_blocking(b, u, create ? SQS_CREATE_QUEUE : SQS_GET_QUEUE_URL, &body,
                               &status, &ans, err);
        buf_release(&body);
        if (rc) {
            sqs_answer_release(&ans);
            return rc;
        }
        if (status == 200) {
            char *url = NULL;
            rc = sqs_parse_queue_url(ans.resp.data ? ans.resp.data : "", ans.resp.len,
                                     &url, err);
            sqs_answer_release(&ans);
            if (rc)
                return rc;
            cr_free(u->url);
            u->url = url;
            if (create)
                LOG(LOG_INFO, "broker: sqs: created queue %s", u->name);
            return 0;
        }
        sqs_answer_error(&ans, status, &e);
        sqs_answer_release(&ans);
        if (!create && e.kind == SQS_ERR_QUEUE_MISSING)
            continue;
        return cr_err_set(err, e.kind == SQS_ERR_RETRY ? CR_EBROKER : CR_EINVAL,
                          "sqs: %s %s: HTTP %ld %s %s",
                          create ? "CreateQueue" : "GetQueueUrl", u->name, status, e.code,
                          e.message);
    }
    return cr_err_set(err, CR_EBROKER, "sqs: cannot resolve %s", u->name);
}

/* Start-up: the queue's own VisibilityTimeout, which is what a held message
 * must be extended to (the option only applies to queues we create). A
 * failure leaves the option's value in use. */
static void read_visibility(struct sqs_broker *b, struct qurl *u)
{
    static const char *const names[] = {"VisibilityTimeout"};
    struct buf body;
    struct sqs_answer ans;
    struct cr_err err = {0};
    struct sqs_queue_attrs a;
    long status = 0;
    buf_init(&body);
    sqs_answer_init(&ans);
    if (sqs_req_get_queue_attributes(&body, u->url, names, 1, &err) ||
        call_blocking(b, u, SQS_GET_QUEUE_ATTRIBUTES, &body, &status, &ans, &err)) {
        buf_release(&body);
        sqs_answer_release(&ans);
        return;
    }
    buf_release(&body);
    if (status == 200 &&
        !sqs_parse_queue_attrs(ans.resp.data ? ans.resp.data : "", ans.resp.len, &a,
                               &err) &&
        a.visibility_timeout_s > 0) {
        u->vis_s = a.visibility_timeout_s;
        if (a.visibility_timeout_s != b->conf.visibility_timeout_s)
            LOG(LOG_INFO, "broker: sqs: queue %s has a visibility timeout of %ld s",
                u->name, a.visibility_timeout_s);
    }
    sqs_answer_release(&ans);
}

/* ------------------------------------------------------------ publishing */

static void pub_finish(struct sqs_broker *b, struct pub *p, int ok)
{
    if (p->cb)
        p->cb(&b->base, ok, p->privdata);
    pub_free(p);
}

static void send_start(struct sqs_broker *b, struct pub *p)
{
    struct req *r = req_new(b, RK_SEND, SQS_SEND_MESSAGE, p->qu);
    struct sqs_send s;
    struct cr_err err = {0};
    char dedup[CR_UUID_LEN + 1];
    unsigned char rnd[16];

    if (!r) {
        pub_finish(b, p, 0);
        return;
    }
    uv_random(NULL, NULL, rnd, sizeof(rnd), 0, NULL);
    cr_uuid4(rnd, dedup);
    memset(&s, 0, sizeof(s));
    s.queue_url = p->qu->url;
    s.body = p->msg.data;
    s.body_len = p->msg.len;
    /* SQS refuses a per-message delay on a FIFO queue: there the eta header
     * alone holds the task, as it does for every Python publisher. */
    s.delay_s = sqs_is_fifo(p->qu->url) ? -1 : p->delay_s;
    s.dedup_id = dedup;
    if (sqs_req_send(&r->body, &s, &err)) {
        LOG(LOG_ERROR, "broker: sqs: cannot publish to %s: %s", p->qu->name, err.msg);
        req_free(r);
        pub_finish(b, p, 0);
        return;
    }
    buf_release(&p->msg);
    r->pub = p;
    if (req_start(b, r)) {
        r->pub = NULL;
        req_free(r);
        pub_finish(b, p, 0);
    }
}

static void resolve_start(struct sqs_broker *b, struct qurl *u, int create)
{
    struct req *r = req_new(b, create ? RK_CREATE : RK_GET_URL,
                            create ? SQS_CREATE_QUEUE : SQS_GET_QUEUE_URL, u);
    struct cr_err err = {0};
    int rc = r ? 0 : CR_ENOMEM;
    if (!rc)
        rc = create ? create_body(b, u, &r->body, &err)
                    : sqs_req_get_queue_url(&r->body, u->name, &err);
    if (!rc)
        rc = req_start(b, r);
    u->resolving = 1;
    if (!rc)
        return;
    if (r)
        req_free(r);
    u->resolving = 0;
    LOG(LOG_ERROR, "broker: sqs: cannot resolve queue %s: %s", u->name,
        err.msg[0] ? err.msg : cr_strerror(rc));
    while (u->waiting) {
        struct pub *p = u->waiting;
        u->waiting = p->next;
        pub_finish(b, p, 0);
    }
}

static void resolved(struct sqs_broker *b, struct qurl *u)
{
    u->resolving = 0;
    /* a poll paused for a missing queue goes again at once */
    for (int i = 0; u->url && i < b->ncons; i++)
        if (b->cons[i].qu == u)
            b->cons[i].paused_until = 0;
    while (u->waiting) {
        struct pub *p = u->waiting;
        u->waiting = p->next;
        if (u->url)
            send_start(b, p);
        else
            pub_finish(b, p, 0);
    }
    vsession_pop(b->vs, now_ms(b));
}

static int sqs_publish(struct broker *base, const struct outbound *o,
                       broker_confirm_fn *cb, void *privdata)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    const char *ex = o->exchange ? o->exchange : "";
    const char *queue = o->routing_key ? o->routing_key : "";
    struct outbound copy = *o;
    struct cr_err err = {0};
    struct qurl *u;
    struct pub *p;
    char tag[CR_UUID_LEN + 1];
    unsigned char rnd[16];
    int rc, dead = 0;

    /* No exchanges on SQS (kombu keeps them in memory): a direct exchange
     * routes by queue name, and the dead-letter exchange to its queue. */
    if (b->cfg.dlx && b->cfg.dlq && !strcmp(ex, b->cfg.dlx)) {
        queue = b->cfg.dlq;
        dead = 1;
    }
    if (!*queue) {
        LOG(LOG_WARNING, "broker: sqs: a publish without a queue name (exchange '%s')",
            ex);
        return CR_EINVAL;
    }
    u = qurl_get(b, queue, &err);
    if (!u) {
        LOG(LOG_ERROR, "broker: %s", err.msg);
        return err.code;
    }
    p = cr_calloc(1, sizeof(*p));
    if (!p)
        return CR_ENOMEM;
    buf_init(&p->msg);
    copy.exchange = "";
    copy.routing_key = queue;
    uv_random(NULL, NULL, rnd, sizeof(rnd), 0, NULL);
    cr_uuid4(rnd, tag);
    rc = sqs_body_encode(&copy, tag, !b->conf.base64, 0, &p->msg);
    if (rc) {
        pub_free(p);
        return rc;
    }
    p->qu = u;
    /* A task with an eta (a retry's countdown, a follow-up's eta) is kept out
     * of sight by SQS until its last whole second, up to 15 min, instead of
     * being received at once and held in flight: Python workers still read
     * the eta header, so a mixed fleet sees the message it always did. Worked out here,
     * not when the queue's URL is known: a first publish to a queue waits a round trip
     * for it, and the eta header covers that much. Never on a dead letter: it is read at
     * once by `celeriac dlq`, whatever its eta. */
    p->delay_s = dead ? -1 : sqs_eta_delay_s(o->headers, clock_epoch_us());
    p->cb = cb;
    p->privdata = privdata;
    if (u->url) {
        send_start(b, p);
        return 0;
    }
    p->next = u->waiting;
    u->waiting = p;
    if (!u->resolving)
        resolve_start(b, u, 0);
    return 0;
}

/* ------------------------------------------------------------ receiving */

static long vis_of(const struct sqs_broker *b, const struct qurl *u)
{
    return u->vis_s > 0 ? u->vis_s : b->conf.visibility_timeout_s;
}

/* A third of a visibility timeout, at least a second (the short timeouts
 * tests use). */
static uint64_t lease_of(long vis_s)
{
    uint64_t ms = (uint64_t)(vis_s > 0 ? vis_s : 0) * 1000 / 3;
    return ms < 1000 ? 1000 : ms;
}

/* The session's lease period: the shortest of the consumed queues' (a queue
 * with a longer timeout is refreshed more often than it needs, never less). */
static void set_lease(struct sqs_broker *b)
{
    uint64_t ms = lease_of(b->conf.visibility_timeout_s);
    for (int i = 0; i < b->ncons; i++) {
        uint64_t q = lease_of(vis_of(b, b->cons[i].qu));
        if (q < ms)
            ms = q;
    }
    vsession_set_lease_ms(b->vs, ms);
}

/* Hands sm over, held by the session under its tag (out of memory, it is
 * left: it comes back after the visibility timeout). */
static void deliver(struct sqs_broker *b, struct cons *c, struct sqs_message *sm)
{
    struct kombu_msg km;
    struct cr_err err = {0};
    struct delivery *m;
    struct held *h;
    char *tag;
    int rc;
    size_t bound = b->cfg.max_message_bytes ? 2 * b->cfg.max_message_bytes + 65536 : 0;

    if (sm->oversize || !sm->body) {
        LOG(LOG_ERROR,
            "broker: sqs: message %s on %s is too large (%zu bytes); left to "
            "the queue's redrive policy",
            sm->message_id, c->qu->name, sm->body_len);
        return;
    }
    if (sqs_md5_matches(sm->body, sm->body_len, sm->md5_of_body) == 0) {
        LOG(LOG_ERROR, "broker: sqs: message %s on %s: MD5OfBody does not match; left",
            sm->message_id, c->qu->name);
        return;
    }
    if (sqs_body_decode(&km, sm->body, sm->body_len, bound, &err)) {
        LOG(LOG_ERROR, "broker: sqs: message %s on %s cannot be read: %s", sm->message_id,
            c->qu->name, err.msg);
        return;
    }
    m = delivery_new();
    h = cr_calloc(1, sizeof(*h));
    tag = sqs_tag_new(c->qu->name, sm->receipt_handle);
    rc = m && h && tag && (m->queue = cr_strdup(c->q.name)) ? 0 : CR_ENOMEM;
    if (!rc) {
        h->qu = c->qu;
        h->received_ms = now_ms(b);
        rc = vsession_hold(b->vs, tag, h, 1); /* the receive made it in flight */
    }
    if (rc < 0) {
        LOG(LOG_ERROR, "broker: out of memory receiving a message");
        cr_free(tag);
        cr_free(h);
        delivery_free(m);
        kombu_msg_release(&km);
        return;
    }
    if (rc == 1)
        cr_free(h); /* a receipt handle we hold already (never seen): one record */

    m->rec.id = tag;
    m->rec.generation = 1;
    m->rec.seq = 1; /* 0 once settled */
    m->redelivered = sm->receive_count > 1;
    kombu_msg_move_to(&km, m);
    m->received_ms = now_ms(b);
    m->message_id = cr_strdup(sm->message_id);
    m->priority = 0; /* SQS has no priorities */
    m->caps = broker_delivery_caps(&b->base);
    kombu_msg_release(&km);
    b->on_delivery(&b->base, m, b->privdata);
}

static int poll_start(struct sqs_broker *b, struct cons *c, int n)
{
    struct req *r = req_new(b, RK_RECEIVE, SQS_RECEIVE_MESSAGE, c->qu);
    struct sqs_receive rcv;
    struct cr_err err = {0};
    if (!r)
        return CR_ENOMEM;
    memset(&rcv, 0, sizeof(rcv));
    rcv.queue_url = c->qu->url;
    rcv.max_messages = n;
    rcv.wait_time_s = b->conf.wait_time_s;
    rcv.visibility_timeout_s = -1;
    if (sqs_req_receive(&r->body, &rcv, &err) || req_start(b, r)) {
        if (err.msg[0])
            LOG(LOG_ERROR, "broker: sqs: cannot poll %s: %s", c->qu->name, err.msg);
        req_free(r);
        c->paused_until = now_ms(b) + POLL_ERROR_PAUSE_MS;
        return CR_EBROKER;
    }
    r->cons = c;
    c->polling = 1;
    c->asked = n;
    return 0;
}

static void receive_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    struct cons *c = r->cons;
    struct sqs_messages ms;
    struct cr_err err = {0};
    struct sqs_error e;
    long asked = c->asked;

    b->nactive_receives--;
    c->polling = 0;
    c->asked = 0;
    if (cc != CURLE_OK || status != 200) {
        unsigned pause;
        vsession_on_batch(b->vs, asked, cc != CURLE_OK ? VSESSION_LOST : VSESSION_REFUSED,
                          now_ms(b));
        if (cc != CURLE_OK) {
            c->failures++;
            pause = sqs_backoff_ms(c->failures, BACKOFF_CAP_MS, jitter());
            LOG(LOG_WARNING,
                "broker: sqs: ReceiveMessage on %s failed: %s; again in %u ms",
                c->qu->name, curl_easy_strerror(cc), pause);
        } else {
            sqs_answer_error(&r->ans, status, &e);
            c->failures++;
            pause = e.kind == SQS_ERR_RETRY || e.kind == SQS_ERR_OVER_LIMIT
                        ? sqs_backoff_ms(c->failures, BACKOFF_CAP_MS, jitter())
                        : POLL_ERROR_PAUSE_MS;
            LOG(LOG_WARNING,
                "broker: sqs: ReceiveMessage on %s: HTTP %ld %s %s (%s); again in %u ms",
                c->qu->name, status, e.code, e.message, sqs_err_kind_name(e.kind), pause);
            /* Deleted under us: found again, or created as at start-up (the
             * old URL stays in use until then). A predefined URL is as given. */
            if (e.kind == SQS_ERR_QUEUE_MISSING && !c->qu->resolving &&
                !b->conf.npredefined)
                resolve_start(b, c->qu, 0);
        }
        c->paused_until = now_ms(b) + pause;
        return;
    }
    c->failures = 0;
    if (sqs_parse_receive(r->ans.resp.data ? r->ans.resp.data : "", r->ans.resp.len, 0,
                          &ms, &err)) {
        vsession_on_batch(b->vs, asked, VSESSION_MALFORMED, now_ms(b));
        LOG(LOG_ERROR, "broker: sqs: ReceiveMessage on %s: %s", c->qu->name, err.msg);
        c->paused_until = now_ms(b) + POLL_ERROR_PAUSE_MS;
        return;
    }
    vsession_on_batch(b->vs, asked, VSESSION_OK, now_ms(b));
    for (int i = 0; i < ms.n; i++)
        deliver(b, c, &ms.v[i]);
    vsession_on_batch_end(b->vs, asked, ms.n, 0);
    sqs_messages_release(&ms);
}

/* ------------------------------------------------------------ settling */

/* Queues a settlement of tag (copied) for the next flush: a delete, or a
 * visibility change to vis_s. Out of memory, it is lost: the message comes
 * back after its visibility timeout. */
static void settle_push(struct sqs_broker *b, const char *tag, int del, long vis_s)
{
    size_t qlen;
    const char *receipt = sqs_tag_split(tag, &qlen);
    struct settle *s;
    struct qurl *u;
    for (u = b->urls; receipt && u; u = u->next)
        if (strlen(u->name) == qlen && !memcmp(u->name, tag, qlen))
            break;
    if (!u || !u->url)
        return; /* not a tag of ours (never expected) */
    s = cr_calloc(1, sizeof(*s));
    if (!s || !(s->tag = cr_strdup(tag))) {
        LOG(LOG_ERROR, "broker: sqs: out of memory settling a message on %s", u->name);
        cr_free(s);
        return;
    }
    s->receipt = s->tag + (receipt - tag);
    s->qu = u;
    s->p.queue = u;
    s->p.del = del;
    s->vis_s = vis_s;
    s->p.next = b->settles;
    b->settles = &s->p;
}

/* Sends the batched settlements: per queue and kind, ten at a time. */
static void flush_settles(struct sqs_broker *b)
{
    while (b->settles) {
        struct sqs_entry e[SQS_BATCH_MAX];
        char ids[SQS_BATCH_MAX][16];
        struct cr_err err = {0};
        struct settle *batch, *first;
        struct req *r;
        int n = 0, rc;
        batch = first = (struct settle *)sqs_batch_take(&b->settles, &n);
        n = 0;
        for (struct settle *s = batch; s; s = (struct settle *)s->p.next, n++) {
            snprintf(ids[n], sizeof(ids[n]), "m%d", n);
            e[n].id = ids[n];
            e[n].receipt_handle = s->receipt;
            e[n].visibility_timeout_s = s->vis_s;
        }
        r = req_new(b, RK_SETTLE,
                    first->p.del ? SQS_DELETE_MESSAGE_BATCH
                                 : SQS_CHANGE_MESSAGE_VISIBILITY_BATCH,
                    first->qu);
        if (!r) {
            settles_done(b, batch, VSESSION_CANCELED);
            continue;
        }
        r->settles = batch;
        r->nsettles = n;
        rc = first->p.del
                 ? sqs_req_delete_batch(&r->body, first->qu->url, e, n, &err)
                 : sqs_req_change_visibility_batch(&r->body, first->qu->url, e, n, &err);
        if (!rc)
            rc = req_start(b, r);
        if (rc) {
            LOG(LOG_ERROR, "broker: sqs: cannot settle %d message(s) on %s: %s", n,
                first->qu->name, err.msg[0] ? err.msg : cr_strerror(rc));
            r->settles = NULL;
            req_free(r);
            settles_done(b, batch, VSESSION_CANCELED);
        }
    }
}

/* The answer to a batch: deletes are the session's acks (OK, or CANCELED
 * once given up: they come back after their visibility timeout). Frees the
 * list. */
static void settles_done(struct sqs_broker *b, struct settle *list,
                         enum vsession_reply rep)
{
    const char *tags[SQS_BATCH_MAX];
    int n = 0;
    for (struct settle *s = list; s && n < SQS_BATCH_MAX; s = (struct settle *)s->p.next)
        if (s->p.del)
            tags[n++] = s->tag;
    if (n && b->vs)
        vsession_on_acked(b->vs, tags, n, rep, now_ms(b));
    settles_free(list);
}

static void settle_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    struct sqs_batch_result br;
    struct cr_err err = {0};
    struct sqs_error e;
    struct settle *list = r->settles;
    const char *what = r->action == SQS_DELETE_MESSAGE_BATCH
                           ? "DeleteMessageBatch"
                           : "ChangeMessageVisibilityBatch";
    if (cc != CURLE_OK || status != 200) {
        int kind = cc != CURLE_OK ? SQS_ERR_RETRY : sqs_answer_error(&r->ans, status, &e);
        if (kind == SQS_ERR_RETRY && !req_retry(b, r))
            return;
        LOG(LOG_WARNING,
            "broker: sqs: %s of %d on %s failed (%s); they come back after "
            "their visibility timeout",
            what, r->nsettles, r->qu->name,
            cc != CURLE_OK ? curl_easy_strerror(cc) : sqs_err_kind_name(kind));
        r->settles = NULL;
        req_free(r);
        settles_done(b, list, VSESSION_CANCELED);
        return;
    }
    /* An entry SQS refused (ReceiptHandleIsInvalid, MessageNotInflight: the
     * message went back, or was deleted, meanwhile) is logged, not sent again. */
    if (sqs_parse_batch(r->ans.resp.data ? r->ans.resp.data : "", r->ans.resp.len, &br,
                        &err) == 0 &&
        br.n_failed)
        for (int i = 0; i < br.n; i++)
            if (br.v[i].kind != SQS_ERR_NONE)
                LOG(LOG_WARNING, "broker: sqs: %s on %s: entry %s failed: %s %s", what,
                    r->qu->name, br.v[i].id, br.v[i].code, br.v[i].message);
    r->settles = NULL;
    req_free(r);
    settles_done(b, list, VSESSION_OK);
}

static int sqs_ack(struct broker *base, struct delivery *d)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    if (d->settled || d->no_ack || !d->rec.seq)
        return 0;
    d->rec.seq = 0;
    d->settled = 1;
    if (vsession_ack(b->vs, d->rec.id)) {
        LOG(LOG_ERROR, "broker: sqs: out of memory acking a message; it comes back after "
                       "the visibility timeout");
        return CR_ENOMEM;
    }
    return 0;
}

/* requeue: visible again after wait_time_seconds (kombu 5.6.2's rule: an
 * orphaned long poll of ours cannot take it; op_restore()); no requeue:
 * deleted (the worker has published the dead letter itself). */
static int sqs_reject(struct broker *base, struct delivery *d, int requeue)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    if (!requeue)
        return sqs_ack(base, d);
    if (d->settled || d->no_ack || !d->rec.seq)
        return 0;
    d->rec.seq = 0;
    d->settled = 1;
    vsession_requeue(b->vs, d->rec.id);
    return 0;
}

/* ------------------------------------------------------------ the session's ops */

/* HTTP has no link to lose: both are up once connected. */
static int op_link_up(void *ctx, enum vsession_link l)
{
    struct sqs_broker *b = ctx;
    (void)l;
    return b->connected;
}

/* One long poll of max messages on the first consumed queue without one out
 * (nor a pause after a failure). */
static int op_pop_batch(void *ctx, long max, int wide)
{
    struct sqs_broker *b = ctx;
    uint64_t now = now_ms(b);
    (void)wide;
    for (int i = 0; i < b->ncons; i++) {
        struct cons *c = &b->cons[i];
        if (c->polling || c->cancelled || c->q.no_consume || !c->qu || !c->qu->url ||
            c->paused_until > now)
            continue;
        if (poll_start(b, c, (int)max) == 0)
            return 0;
    }
    return CR_ENOTFOUND;
}

/* One DeleteMessageBatch per queue and ten tags, at the next flush. */
static int op_ack(void *ctx, const char *const *tags, int n)
{
    for (int i = 0; i < n; i++)
        settle_push(ctx, tags[i], 1, 0);
    return 0;
}

/* Every held message's visibility is pushed back to its queue's timeout
 * every third of it (the session's lease), so a long task or a held eta is
 * never handed to another worker meanwhile; but not past SQS's 12 h, which
 * count from the receive. */
static void op_refresh(void *ctx, const char *const *tags, int n)
{
    struct sqs_broker *b = ctx;
    uint64_t now = now_ms(b);
    for (int i = 0; i < n; i++) {
        struct vsession_rec *r = vsession_held(b->vs, tags[i]);
        struct held *h = r ? r->data : NULL;
        long vis;
        if (!h)
            continue;
        vis = vis_of(b, h->qu);
        if (now - h->received_ms > (uint64_t)SQS_VISIBILITY_MAX_S * 1000 - lease_of(vis))
            continue;
        settle_push(b, tags[i], 0, vis);
    }
}

/* A requeue: visible again after wait_time_seconds (see sqs_reject()); our
 * stop (sqs_free()): at once, unless a poll of ours is still open. */
static void op_restore(void *ctx, const char *tag, void *data, enum vsession_rec_state st,
                       char side, int round)
{
    struct sqs_broker *b = ctx;
    int now = vsession_state(b->vs) == VSESSION_DRAINING && !b->nactive_receives;
    (void)st;
    (void)side;
    (void)round;
    settle_push(b, tag, 0, now ? 0 : b->conf.wait_time_s);
    cr_free(data);
}

static void op_release(void *ctx, void *data)
{
    (void)ctx;
    cr_free(data);
}

static const struct vsession_ops session_ops = {
    .link_up = op_link_up,
    .pop_batch = op_pop_batch,
    .ack = op_ack,
    .refresh = op_refresh,
    .restore = op_restore,
    .release = op_release,
};

static void on_prepare(uv_prepare_t *p)
{
    struct sqs_broker *b = p->data;
    vsession_pump(b->vs, now_ms(b)); /* the acks, then polls while there is room */
    flush_settles(b);
}

static void on_tick(uv_timer_t *t)
{
    struct sqs_broker *b = t->data;
    uint64_t now = now_ms(b);
    struct req **pp = &b->retry;
    while (*pp) {
        struct req *r = *pp;
        if (r->due_ms > now) {
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        if (req_start(b, r))
            req_done(b, r, CURLE_OUT_OF_MEMORY, 0);
    }
    vsession_tick(b->vs, now); /* leases */
    vsession_pop(b->vs, now);  /* a queue whose pause ended */
}

/* ------------------------------------------------------------ answers */

static void stats_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    struct sqs_queue_attrs a;
    struct cr_err err = {0};
    int ok = cc == CURLE_OK && status == 200 &&
             !sqs_parse_queue_attrs(r->ans.resp.data ? r->ans.resp.data : "",
                                    r->ans.resp.len, &a, &err);
    if (r->stats_cb)
        r->stats_cb(&b->base, ok, ok && a.messages > 0 ? (uint32_t)a.messages : 0, 0,
                    r->privdata);
    req_free(r);
}

static void resolve_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    struct qurl *u = r->qu;
    struct sqs_error e;
    struct cr_err err = {0};
    int create = r->kind == RK_CREATE;
    if (cc == CURLE_OK && status == 200) {
        char *url = NULL;
        if (sqs_parse_queue_url(r->ans.resp.data ? r->ans.resp.data : "", r->ans.resp.len,
                                &url, &err))
            LOG(LOG_ERROR, "broker: sqs: %s", err.msg);
        else {
            cr_free(u->url);
            u->url = url;
            if (create)
                LOG(LOG_INFO, "broker: sqs: created queue %s", u->name);
        }
        req_free(r);
        resolved(b, u);
        return;
    }
    if (cc == CURLE_OK &&
        sqs_answer_error(&r->ans, status, &e) == SQS_ERR_QUEUE_MISSING && !create) {
        req_free(r);
        resolve_start(b, u, 1);
        return;
    }
    if ((cc != CURLE_OK || e.kind == SQS_ERR_RETRY) && !req_retry(b, r))
        return;
    LOG(LOG_ERROR, "broker: sqs: cannot resolve queue %s (%s)", u->name,
        cc != CURLE_OK ? curl_easy_strerror(cc) : e.code);
    req_free(r);
    resolved(b, u);
}

static void send_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    struct sqs_error e;
    if (cc == CURLE_OK && status == 200) {
        struct pub *p = r->pub;
        r->pub = NULL;
        req_free(r);
        pub_finish(b, p, 1);
        return;
    }
    if ((cc != CURLE_OK || sqs_answer_error(&r->ans, status, &e) == SQS_ERR_RETRY) &&
        !req_retry(b, r))
        return;
    LOG(LOG_ERROR, "broker: sqs: SendMessage to %s failed (%s)", r->qu->name,
        cc != CURLE_OK ? curl_easy_strerror(cc) : e.code);
    {
        struct pub *p = r->pub;
        r->pub = NULL;
        req_free(r);
        pub_finish(b, p, 0);
    }
}

static void req_done(struct sqs_broker *b, struct req *r, CURLcode cc, long status)
{
    switch (r->kind) {
    case RK_RECEIVE:
        receive_done(b, r, cc, status);
        req_free(r);
        vsession_pop(b->vs, now_ms(b));
        return;
    case RK_SETTLE:
        settle_done(b, r, cc, status);
        return;
    case RK_SEND:
        send_done(b, r, cc, status);
        return;
    case RK_GET_URL:
    case RK_CREATE:
        resolve_done(b, r, cc, status);
        return;
    case RK_STATS:
        stats_done(b, r, cc, status);
        return;
    }
}

/* ------------------------------------------------------------ the face */

static int sqs_connect(struct broker *base, struct cr_err *err)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    char desc[256];
    sqs_conf_describe(&b->conf, desc, sizeof(desc));
    for (int i = 0; i < b->ncons; i++) {
        struct qurl *u = b->cons[i].qu;
        if (!u->url && resolve_blocking(b, u, err))
            return err->code;
        if (!u->vis_s && !b->cons[i].q.no_consume)
            read_visibility(b, u);
    }
    if (b->cfg.dlq) {
        struct qurl *u = qurl_get(b, b->cfg.dlq, err);
        if (!u || (!u->url && resolve_blocking(b, u, err)))
            return err->code;
    }
    set_lease(b);
    b->connected = 1;
    LOG(LOG_INFO, "broker: sqs: %s, %d queue%s, wait_time_seconds %d", desc, b->ncons,
        b->ncons == 1 ? "" : "s", b->conf.wait_time_s);
    vsession_on_link(b->vs, VSESSION_LINK_STORE, 1, now_ms(b));
    vsession_on_link(b->vs, VSESSION_LINK_POP, 1, now_ms(b));
    vsession_pop(b->vs, now_ms(b));
    return 0;
}

static int sqs_connected(const struct broker *base)
{
    return ((const struct sqs_broker *)base)->connected;
}

static unsigned sqs_generation(const struct broker *base)
{
    (void)base;
    return 1;
}

static unsigned long sqs_reconnects(const struct broker *base)
{
    (void)base;
    return 0;
}

static int sqs_blocked(const struct broker *base, const char **why)
{
    (void)base;
    (void)why;
    return 0;
}

static int sqs_live(const struct broker *base, const struct delivery *d)
{
    (void)base;
    return d->rec.seq != 0;
}

static int sqs_add_consumer(struct broker *base, const struct broker_queue *q)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    struct cr_err err = {0};
    struct cons *c;
    struct qurl *u;
    for (int i = 0; i < b->ncons; i++)
        if (!strcmp(b->cons[i].q.name, q->name)) {
            b->cons[i].cancelled = 0;
            return 0;
        }
    u = qurl_get(b, q->name, &err);
    if (!u) {
        LOG(LOG_ERROR, "broker: %s", err.msg);
        snprintf(b->last_err, sizeof(b->last_err), "%s", err.msg);
        return err.code;
    }
    if (b->ncons == b->cap_cons) {
        int cap = b->cap_cons ? 2 * b->cap_cons : 8;
        struct cons *v;
        if (cap > MAX_CONSUMERS)
            return CR_ERANGE;
        v = cr_realloc(b->cons, (size_t)cap * sizeof(*v));
        if (!v)
            return CR_ENOMEM;
        /* polls in flight point at their queue: fix them up */
        for (struct req *r = b->active; r; r = r->next)
            if (r->cons)
                r->cons = v + (r->cons - b->cons);
        b->cons = v;
        b->cap_cons = cap;
    }
    c = &b->cons[b->ncons];
    memset(c, 0, sizeof(*c));
    if (broker_queue_copy(&c->q, q))
        return CR_ENOMEM;
    c->qu = u;
    b->ncons++;
    if (b->connected && !u->url && !u->resolving)
        resolve_start(b, u, 0);
    return 0;
}

static int sqs_cancel_consumer(struct broker *base, const char *queue)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    for (int i = 0; i < b->ncons; i++)
        if (!b->cons[i].cancelled && !strcmp(b->cons[i].q.name, queue)) {
            b->cons[i].cancelled = 1;
            return 0;
        }
    return CR_ENOTFOUND;
}

static void sqs_each_consumer(const struct broker *base,
                              void (*fn)(const struct broker_queue *q, void *arg),
                              void *arg)
{
    const struct sqs_broker *b = (const struct sqs_broker *)base;
    for (int i = 0; i < b->ncons; i++)
        if (!b->cons[i].cancelled && !b->cons[i].q.no_consume)
            fn(&b->cons[i].q, arg);
}

static int sqs_declare_exchange(struct broker *base, const char *name, const char *type,
                                int durable)
{
    (void)base;
    (void)name;
    (void)type;
    (void)durable;
    return 0; /* kombu keeps exchanges in memory; publishes route by queue name */
}

static int sqs_queue_stats(struct broker *base, const char *queue,
                           broker_queue_stats_fn *cb, void *privdata)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    static const char *const names[] = {"ApproximateNumberOfMessages"};
    struct cr_err err = {0};
    struct qurl *u = qurl_get(b, queue, &err);
    struct req *r;
    if (!u || !u->url)
        return CR_EBROKER;
    r = req_new(b, RK_STATS, SQS_GET_QUEUE_ATTRIBUTES, u);
    if (!r)
        return CR_ENOMEM;
    r->stats_cb = cb;
    r->privdata = privdata;
    if (sqs_req_get_queue_attributes(&r->body, u->url, names, 1, &err) ||
        req_start(b, r)) {
        req_free(r);
        return CR_EBROKER;
    }
    return 0;
}

static void sqs_queue_stats_cancel(struct broker *base, void *privdata)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    for (struct req *r = b->active; r; r = r->next)
        if (r->kind == RK_STATS && r->privdata == privdata)
            r->stats_cb = NULL;
}

static void sqs_set_prefetch(struct broker *base, int prefetch_count)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    vsession_set_prefetch(b->vs, prefetch_count);
}

static void sqs_stop_consuming(struct broker *base)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    vsession_stop_consuming(b->vs);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct sqs_broker *b = h->data;
    if (++b->closed_handles < 2)
        return;
    cr_free(b);
}

static void run_until(struct sqs_broker *b, int (*done)(struct sqs_broker *), uint64_t ms)
{
    uint64_t deadline;
    uv_update_time(b->loop);
    deadline = now_ms(b) + ms;
    while (!done(b) && now_ms(b) < deadline)
        uv_run(b->loop, UV_RUN_ONCE);
}

static int no_receive(struct sqs_broker *b)
{
    return b->nactive_receives == 0;
}

static int all_answered(struct sqs_broker *b)
{
    return b->active == NULL && b->retry == NULL && b->settles == NULL;
}

/* What was received and not settled is made visible again: after the open
 * long polls have ended (what they bring too), so none of ours can take it
 * back; at 0 then, or at wait_time_seconds if a poll is still open (5.6.2's
 * rule). Runs the loop, bounded: the owner's loop is ending. */
static void sqs_free(struct broker *base)
{
    struct sqs_broker *b = (struct sqs_broker *)base;
    long n;
    vsession_stop_consuming(b->vs);
    if (b->connected) {
        vsession_pump(b->vs, now_ms(b)); /* the acks made so far */
        flush_settles(b);
        run_until(b, no_receive, FREE_WAIT_MS);
        n = vsession_nheld(b->vs);
        vsession_drain(b->vs, now_ms(b)); /* op_restore() for each, the last acks */
        if (n)
            LOG(LOG_INFO, "broker: sqs: restoring %ld unacknowledged message(s)", n);
        b->freeing = 1;
        flush_settles(b);
        run_until(b, all_answered, FREE_WAIT_MS);
    }
    b->freeing = 1;
    vsession_close(b->vs);
    while (b->active) {
        struct req *r = b->active;
        b->active = r->next;
        curl_loop_remove(b->http, r->easy);
        if (r->kind == RK_RECEIVE) {
            req_free(r);
            continue;
        }
        req_done(b, r, CURLE_ABORTED_BY_CALLBACK, 0);
    }
    while (b->retry) {
        struct req *r = b->retry;
        b->retry = r->next;
        if (r->pub) {
            struct pub *p = r->pub;
            r->pub = NULL;
            pub_finish(b, p, 0);
        } else if (r->kind == RK_STATS && r->stats_cb) {
            r->stats_cb(&b->base, 0, 0, 0, r->privdata);
        }
        req_free(r);
    }
    settles_free((struct settle *)b->settles);
    b->settles = NULL;
    vsession_free(b->vs); /* what a late poll brought: left to its visibility timeout */
    b->vs = NULL;
    while (b->urls) {
        struct qurl *u = b->urls;
        b->urls = u->next;
        while (u->waiting) {
            struct pub *p = u->waiting;
            u->waiting = p->next;
            pub_finish(b, p, 0);
        }
        cr_free(u->url);
        cr_free(u);
    }
    for (int i = 0; i < b->ncons; i++)
        broker_queue_release(&b->cons[i].q);
    cr_free(b->cons);
    curl_loop_free(b->http);
    cJSON_Delete(b->create_attrs);
    cJSON_Delete(b->tags);
    sqs_conf_release(&b->conf);
    uv_close((uv_handle_t *)&b->tick, on_handle_closed);
    uv_close((uv_handle_t *)&b->prepare, on_handle_closed);
}

static const struct broker_vtab sqs_vtab = {
    .name = "sqs",
    .caps = MSG_CAP_CONFIRMS | MSG_CAP_PREFETCH,
    .connect = sqs_connect,
    .connected = sqs_connected,
    .generation = sqs_generation,
    .reconnects = sqs_reconnects,
    .blocked = sqs_blocked,
    .ack = sqs_ack,
    .reject = sqs_reject,
    .live = sqs_live,
    .publish = sqs_publish,
    .add_consumer = sqs_add_consumer,
    .cancel_consumer = sqs_cancel_consumer,
    .each_consumer = sqs_each_consumer,
    .declare_exchange = sqs_declare_exchange,
    .queue_stats = sqs_queue_stats,
    .queue_stats_cancel = sqs_queue_stats_cancel,
    .set_prefetch = sqs_set_prefetch,
    .stop_consuming = sqs_stop_consuming,
    .free = sqs_free,
};

static cJSON *pairs_json(const struct sqs_pair *p, int n)
{
    cJSON *o;
    if (!n)
        return NULL;
    o = cJSON_CreateObject();
    for (int i = 0; o && i < n; i++)
        if (!cJSON_AddStringToObject(o, p[i].key, p[i].value)) {
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

/* Long polls of at most SQS_BATCH_MAX, one per queue (op_pop_batch() says
 * when none can go: the cons array's bound is the calls'); nothing recorded
 * by us (the receive is the record), no restore round, no replay (a delete
 * SQS answered stays done); acks handed over in one call per flush, cut per
 * queue into batches of ten in op_ack(). The lease is set at connect. */
static struct vsession *session_new(struct sqs_broker *b, long prefetch)
{
    struct vsession_config vc;
    vsession_config_default(&vc);
    vc.prefetch = prefetch;
    vc.ack_emulation = 0;
    vc.long_polls = 1;
    vc.batch = SQS_BATCH_MAX;
    vc.calls = MAX_CONSUMERS;
    vc.lease_ms = lease_of(b->conf.visibility_timeout_s);
    vc.replay_max = 0;
    vc.replay_ms = 0;
    return vsession_new(&vc, &session_ops, b);
}

int broker_url_is_sqs(const char *url)
{
    return url && !strncasecmp(url, "sqs://", 6);
}

struct broker *sqs_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                              broker_delivery_fn *on_delivery, broker_conn_fn *on_conn,
                              void *privdata, struct cr_err *err)
{
    struct sqs_broker *b = cr_calloc(1, sizeof(*b));
    const char *opts = cfg->transport_options;
    (void)on_conn;
    if (!b) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    b->base.vt = &sqs_vtab;
    b->loop = loop;
    b->cfg = *cfg;
    b->on_delivery = on_delivery;
    b->privdata = privdata;
    sqs_conf_init(&b->conf);
    if (sqs_conf_parse(&b->conf, cfg->url, opts, opts ? strlen(opts) : 0,
                       (const char *const *)environ, err)) {
        cr_free(b);
        return NULL;
    }
    b->create_attrs = pairs_json(b->conf.create_attrs, b->conf.ncreate_attrs);
    b->tags = pairs_json(b->conf.tags, b->conf.ntags);
    b->vs = session_new(b, cfg->prefetch_count);
    b->http = curl_loop_new(loop, 16L, on_req_done, b);
    if ((b->conf.ncreate_attrs && !b->create_attrs) || (b->conf.ntags && !b->tags) ||
        !b->vs || !b->http) {
        cr_err_set(err, CR_ENOMEM, "sqs: cannot set up the HTTP client");
        vsession_free(b->vs);
        curl_loop_free(b->http);
        cJSON_Delete(b->create_attrs);
        cJSON_Delete(b->tags);
        sqs_conf_release(&b->conf);
        cr_free(b);
        return NULL;
    }
    uv_timer_init(loop, &b->tick);
    b->tick.data = b;
    uv_prepare_init(loop, &b->prepare);
    b->prepare.data = b;
    uv_timer_start(&b->tick, on_tick, TICK_MS, TICK_MS);
    uv_prepare_start(&b->prepare, on_prepare);
    for (int i = 0; i < cfg->nqueues; i++) {
        struct broker_queue q;
        broker_task_queue(&q, cfg->queues[i]);
        if (sqs_add_consumer(&b->base, &q)) {
            cr_err_set(err, CR_EINVAL, "%s",
                       b->last_err[0] ? b->last_err : "sqs: cannot consume a queue");
            sqs_free(&b->base);
            return NULL;
        }
    }
    return &b->base;
}
