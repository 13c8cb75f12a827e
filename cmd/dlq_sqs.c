/* dlq_sqs.c -- `celeriac dlq` over an SQS broker.
 *
 * On SQS the dead-letter queue is an SQS queue like the others (named as
 * kombu names them, prefix included), each dead letter kombu's envelope
 * published there by the worker. SQS cannot browse: a message is only seen
 * by receiving it, which hides it for a visibility timeout. So the command
 * receives page by page with a short hold (DLQ_SQS_HOLD_S: the pages already
 * seen stay out of the later ones), and at its end makes every message it did
 * not act on visible again at once; a command that dies gives them back when
 * the hold ends. Replay sends the dead letter to its queue and only then
 * deletes it, one at a time, so a failure loses nothing (at worst a dead
 * letter is both replayed and still listed, and a second replay runs it
 * twice).
 *
 * A command-line client: each call is one blocking libcurl request
 * (net/sqs_call.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "dlq_int.h"
#include "net/sqs_call.h"
#include "net/sqs_url.h"
#include "protocol/kombu.h"
#include "protocol/sqs.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/uuid.h"

extern char **environ;

#define CALL_TIMEOUT_MS 15000
#define CONNECT_TIMEOUT_MS 5000

/* Where one queue's calls go. */
struct where {
    struct sqs_dest dest;
    char *url; /* new */
    char name[SQS_QUEUE_NAME_MAX + 8];
};

struct sdlq {
    struct sqs_conf conf;
    struct sqs_answer ans;
    struct where dead;
    struct where to; /* the last replay target, kept for the next */
    char **kept;     /* receipts of what was received and not acted on */
    size_t nkept, cap;
};

/* ------------------------------------------------------------ pure parts */

const char *dlq__sqs_target(const cJSON *h)
{
    const char *ex = dlq__hstr(h, "x-celeriac-original-exchange");
    const char *rk = dlq__hstr(h, "x-celeriac-original-routing-key");
    const char *q = dlq__hstr(h, "x-celeriac-original-queue");
    if (!*ex && *rk)
        return rk;
    if (*q)
        return q;
    return *rk ? rk : NULL;
}

int dlq__sqs_next_wait(int got, int last_wait_s, unsigned long seen, long elapsed_ms)
{
    if (seen >= DLQ_SQS_SCAN_MAX || elapsed_ms >= DLQ_SQS_SCAN_MS)
        return -1;
    if (got > 0)
        return 0;
    return last_wait_s > 0 ? -1 : 1;
}

/* ------------------------------------------------------------ calls */

/* One call to w; the answer in s->ans. Returns the HTTP status, or 0 after
 * saying why there is none. body is released. */
static long call(struct sdlq *s, const struct where *w, enum sqs_action a,
                 struct buf *body, int wait_s)
{
    struct cr_err err;
    long status = 0;

    memset(&err, 0, sizeof(err));
    if (sqs_call_blocking(&w->dest, a, body, CALL_TIMEOUT_MS + 1000L * wait_s,
                          CONNECT_TIMEOUT_MS, &status, &s->ans, &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        status = 0;
    }
    buf_release(body);
    return status;
}

/* Says what a refused call was refused for. */
static void refused(struct sdlq *s, long status, const char *what, const char *queue)
{
    struct sqs_error e;
    sqs_answer_error(&s->ans, status, &e);
    fprintf(stderr, "celeriac dlq: sqs: %s %s: HTTP %ld %s %s\n", what, queue, status,
            e.code, e.message);
}

/* Finds Celery queue name's SQS queue into w: predefined, or GetQueueUrl
 * (never created: a missing queue is CR_ENOTFOUND, said by the caller). */
static int locate(struct sdlq *s, const char *queue, struct where *w)
{
    struct cr_err err;
    struct buf body;
    const struct sqs_queue_def *d;
    long status;

    memset(&err, 0, sizeof(err));
    cr_free(w->url);
    w->url = NULL;
    if (sqs_queue_name(s->conf.prefix, queue, w->name, sizeof(w->name), &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return CR_EINVAL;
    }
    w->dest.endpoint = s->conf.endpoint;
    w->dest.region = s->conf.region;
    w->dest.creds = &s->conf.creds;
    if (s->conf.npredefined) {
        d = sqs_conf_queue(&s->conf, w->name);
        if (!d) {
            fprintf(stderr,
                    "celeriac dlq: queue '%s' (SQS name '%s') is not in "
                    "predefined_queues\n",
                    queue, w->name);
            return CR_EINVAL;
        }
        w->dest.endpoint = d->endpoint;
        w->dest.region = d->region;
        w->dest.creds = &d->creds;
        w->url = cr_strdup(d->url);
        return w->url ? 0 : CR_ENOMEM;
    }
    buf_init(&body);
    if (sqs_req_get_queue_url(&body, w->name, &err)) {
        buf_release(&body);
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return CR_EINVAL;
    }
    status = call(s, w, SQS_GET_QUEUE_URL, &body, 0);
    if (status == 200) {
        if (sqs_parse_queue_url(s->ans.resp.data ? s->ans.resp.data : "", s->ans.resp.len,
                                &w->url, &err)) {
            fprintf(stderr, "celeriac dlq: %s\n", err.msg);
            return CR_EPROTO;
        }
        return 0;
    }
    if (status) {
        struct sqs_error e;
        if (sqs_answer_error(&s->ans, status, &e) == SQS_ERR_QUEUE_MISSING)
            return CR_ENOTFOUND;
        refused(s, status, "GetQueueUrl", w->name);
    }
    return CR_EBROKER;
}

/* Keeps a receipt to give back at the end. */
static int keep(struct sdlq *s, const char *receipt)
{
    if (s->nkept == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = cr_realloc(s->kept, cap * sizeof(*v));
        if (!v)
            return CR_ENOMEM;
        s->kept = v;
        s->cap = cap;
    }
    s->kept[s->nkept] = cr_strdup(receipt);
    if (!s->kept[s->nkept])
        return CR_ENOMEM;
    s->nkept++;
    return 0;
}

/* Makes every kept dead letter visible again, ten per call. A failure only
 * means they come back when their hold ends. */
static void give_back(struct sdlq *s)
{
    for (size_t i = 0; i < s->nkept; i += SQS_BATCH_MAX) {
        struct sqs_entry e[SQS_BATCH_MAX];
        char ids[SQS_BATCH_MAX][16];
        struct cr_err err;
        struct buf body;
        int n = 0;
        long status;
        memset(&err, 0, sizeof(err));
        for (size_t j = i; j < s->nkept && n < SQS_BATCH_MAX; j++, n++) {
            snprintf(ids[n], sizeof(ids[n]), "m%d", n);
            e[n].id = ids[n];
            e[n].receipt_handle = s->kept[j];
            e[n].visibility_timeout_s = 0;
        }
        buf_init(&body);
        if (sqs_req_change_visibility_batch(&body, s->dead.url, e, n, &err)) {
            buf_release(&body);
            continue;
        }
        status = call(s, &s->dead, SQS_CHANGE_MESSAGE_VISIBILITY_BATCH, &body, 0);
        if (status && status != 200)
            refused(s, status, "ChangeMessageVisibilityBatch", s->dead.name);
    }
}

static int delete_one(struct sdlq *s, const char *receipt)
{
    struct cr_err err;
    struct buf body;
    long status;
    memset(&err, 0, sizeof(err));
    buf_init(&body);
    if (sqs_req_delete(&body, s->dead.url, receipt, &err)) {
        buf_release(&body);
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return 0;
    }
    status = call(s, &s->dead, SQS_DELETE_MESSAGE, &body, 0);
    if (status && status != 200)
        refused(s, status, "DeleteMessage", s->dead.name);
    return status == 200;
}

/* Sends the dead letter m back to its queue, headers reset, as the worker
 * publishes on SQS; returns 1 once SQS has it. */
static int send_back(struct sdlq *s, struct kombu_msg *m)
{
    const char *target = dlq__sqs_target(m->headers);
    char *queue = target ? cr_strdup(target) : NULL;
    char tag[CR_UUID_LEN + 1], dedup[CR_UUID_LEN + 1];
    unsigned char rnd[32];
    struct outbound o;
    struct sqs_send snd;
    struct cr_err err;
    struct buf env, body;
    long status;
    int ok = 0;

    memset(&err, 0, sizeof(err));
    buf_init(&env);
    buf_init(&body);
    if (!target) {
        fprintf(stderr,
                "celeriac dlq: the dead letter does not say where it came from\n");
        return 0;
    }
    if (!queue || getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        goto out;
    cr_uuid4(rnd, tag);
    cr_uuid4(rnd + 16, dedup);
    if (!s->to.url || strcmp(s->to.name, queue)) {
        int rc = locate(s, queue, &s->to);
        if (rc == CR_ENOTFOUND)
            fprintf(stderr, "celeriac dlq: queue '%s' (SQS name '%s') does not exist\n",
                    queue, s->to.name);
        if (rc) {
            cr_free(s->to.url);
            s->to.url = NULL;
            goto out;
        }
        /* (the cache is keyed by the Celery name from here on) */
        snprintf(s->to.name, sizeof(s->to.name), "%s", queue);
    }
    dlq__reset_headers(m->headers);
    kombu_msg_outbound(m, &o);
    o.exchange = "";
    o.routing_key = queue;
    if (sqs_body_encode(&o, tag, !s->conf.base64, 0, &env))
        goto out;
    memset(&snd, 0, sizeof(snd));
    snd.queue_url = s->to.url;
    snd.body = env.data;
    snd.body_len = env.len;
    snd.delay_s = -1;
    snd.dedup_id = dedup;
    if (sqs_req_send(&body, &snd, &err)) {
        buf_release(&body);
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        goto out;
    }
    status = call(s, &s->to, SQS_SEND_MESSAGE, &body, 0);
    ok = status == 200;
    if (status && !ok)
        refused(s, status, "SendMessage", queue);
out:
    buf_release(&env);
    cr_free(queue);
    return ok;
}

/* ------------------------------------------------------------ actions */

/* PurgeQueue, with SQS's count of what it held first. */
static int purge_all(struct sdlq *s)
{
    static const char *const names[] = {"ApproximateNumberOfMessages"};
    struct sqs_queue_attrs qa;
    struct cr_err err;
    struct buf body;
    long status, count = -1;

    memset(&err, 0, sizeof(err));
    buf_init(&body);
    if (!sqs_req_get_queue_attributes(&body, s->dead.url, names, 1, &err) &&
        call(s, &s->dead, SQS_GET_QUEUE_ATTRIBUTES, &body, 0) == 200 &&
        !sqs_parse_queue_attrs(s->ans.resp.data ? s->ans.resp.data : "", s->ans.resp.len,
                               &qa, &err))
        count = qa.messages;
    buf_release(&body);
    if (sqs_req_purge_queue(&body, s->dead.url, &err)) {
        buf_release(&body);
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return 1;
    }
    status = call(s, &s->dead, SQS_PURGE_QUEUE, &body, 0);
    if (status != 200) {
        if (status)
            refused(s, status, "PurgeQueue", s->dead.name);
        return 1;
    }
    if (count >= 0)
        printf("purged %ld dead letters (SQS removes them within 60 s)\n", count);
    else
        printf("purged the dead letters (SQS removes them within 60 s)\n");
    return 0;
}

/* One received dead letter: acted on, or kept to be given back. Returns 0,
 * or 1 when an action failed; *acted counts what was done. */
static int one(struct sdlq *s, const struct dlq_opts *o, enum dlq_action a,
               const struct sqs_message *sm, unsigned long *acted)
{
    struct kombu_msg m;
    struct cr_err err;
    int rc = 0, done = 0;

    memset(&err, 0, sizeof(err));
    if (sm->oversize || !sm->body ||
        sqs_body_decode(&m, sm->body, sm->body_len, 0, &err)) {
        /* Not an envelope: nothing to show or replay; left where it is. */
        return keep(s, sm->receipt_handle) ? 1 : 0;
    }
    if (!m.headers)
        m.headers = cJSON_CreateObject();
    if (m.headers && dlq__matches(o, m.headers)) {
        if (a == A_LIST) {
            dlq__print_line(o, m.headers);
        } else if (a == A_SHOW) {
            dlq__print_show(m.headers, m.content_type, strlen(m.content_type), m.body,
                            m.body_len);
            (*acted)++;
        } else if (a == A_REPLAY) {
            char shown_id[1024];
            dlq__tty(dlq__hstr(m.headers, "id"), shown_id, sizeof(shown_id));
            if (!send_back(s, &m)) {
                fprintf(stderr, "celeriac dlq: cannot replay %s\n", shown_id);
                rc = 1;
            } else if (!delete_one(s, sm->receipt_handle)) {
                /* (sent: a second replay would run it twice) */
                fprintf(stderr,
                        "celeriac dlq: replayed %s but could not remove it from the "
                        "dead letters\n",
                        shown_id);
                rc = 1;
            } else {
                printf("replayed %s\n", shown_id);
                (*acted)++;
                done = 1;
            }
        } else if (delete_one(s, sm->receipt_handle)) {
            (*acted)++;
            done = 1;
        }
    }
    kombu_msg_release(&m);
    if (!done && keep(s, sm->receipt_handle))
        rc = 1;
    return rc;
}

static long elapsed_ms(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)(t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Receives page after page (held DLQ_SQS_HOLD_S) until SQS has no more for us. */
static int scan(struct sdlq *s, const struct dlq_opts *o, enum dlq_action a,
                unsigned long *seen, unsigned long *acted)
{
    struct timespec t0;
    int wait_s = 0, rc = 0;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (wait_s >= 0 && !(a == A_SHOW && *acted)) {
        struct sqs_receive rv;
        struct sqs_messages ms;
        struct cr_err err;
        struct buf body;
        long status;

        memset(&rv, 0, sizeof(rv));
        memset(&err, 0, sizeof(err));
        rv.queue_url = s->dead.url;
        rv.max_messages = SQS_BATCH_MAX;
        rv.wait_time_s = wait_s;
        rv.visibility_timeout_s = DLQ_SQS_HOLD_S;
        buf_init(&body);
        if (sqs_req_receive(&body, &rv, &err)) {
            buf_release(&body);
            fprintf(stderr, "celeriac dlq: %s\n", err.msg);
            return 1;
        }
        status = call(s, &s->dead, SQS_RECEIVE_MESSAGE, &body, wait_s);
        if (status != 200) {
            if (status)
                refused(s, status, "ReceiveMessage", s->dead.name);
            return 1;
        }
        if (sqs_parse_receive(s->ans.resp.data ? s->ans.resp.data : "", s->ans.resp.len,
                              0, &ms, &err)) {
            fprintf(stderr, "celeriac dlq: %s\n", err.msg);
            return 1;
        }
        for (int i = 0; i < ms.n; i++) {
            (*seen)++;
            rc |= one(s, o, a, &ms.v[i], acted);
        }
        wait_s = dlq__sqs_next_wait(ms.n, wait_s, *seen, elapsed_ms(&t0));
        if (wait_s < 0 && ms.n > 0)
            fprintf(stderr,
                    "celeriac dlq: stopped after %lu dead letters; run again for the "
                    "rest\n",
                    *seen);
        sqs_messages_release(&ms);
    }
    return rc;
}

int dlq__run_sqs(const struct dlq_opts *o, enum dlq_action a)
{
    struct sdlq s;
    struct cr_err err;
    const char *opts = o->transport_options ? o->transport_options : "";
    unsigned long seen = 0, acted = 0;
    int rc;

    memset(&s, 0, sizeof(s));
    memset(&err, 0, sizeof(err));
    sqs_answer_init(&s.ans);
    sqs_conf_init(&s.conf);
    if (sqs_conf_parse(&s.conf, o->broker, opts, strlen(opts),
                       (const char *const *)environ, &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        return 2;
    }
    rc = locate(&s, o->queue, &s.dead);
    if (rc == CR_ENOTFOUND) {
        /* The worker creates it with its first dead letter: none yet. */
        dlq__print_head(o, a);
        rc = dlq__summary(o, a, 0, 0, 0);
        goto out;
    }
    if (rc) {
        rc = rc == CR_EINVAL ? 2 : 1;
        goto out;
    }
    if (a == A_PURGE && !o->task && !o->reason && !o->nids) {
        rc = purge_all(&s);
        goto out;
    }
    dlq__print_head(o, a);
    rc = scan(&s, o, a, &seen, &acted);
    give_back(&s);
    rc = dlq__summary(o, a, acted, seen, rc);
out:
    for (size_t i = 0; i < s.nkept; i++)
        cr_free(s.kept[i]);
    cr_free(s.kept);
    cr_free(s.dead.url);
    cr_free(s.to.url);
    sqs_answer_release(&s.ans);
    sqs_conf_release(&s.conf);
    return rc;
}
