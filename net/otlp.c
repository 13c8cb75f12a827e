/* otlp.c -- the OTLP/HTTP span exporter on the loop. */
#include "otlp.h"

#include <string.h>
#include <unistd.h>
#include <curl/curl.h>

#include "net/curl_loop.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"

struct export_req {
    struct otlp_exporter *x;
    CURL *easy;
    struct buf body;
    size_t nspans;
    struct export_req *next;
};

struct otlp_exporter {
    uv_loop_t *loop;
    struct otlp_exporter_config cfg;
    struct otlp_resource res;
    struct curl_loop *http;
    uv_timer_t tick, drain_timer;
    int closed_handles;
    struct curl_slist *headers;
    struct span *head, *tail; /* queued, oldest first */
    size_t nqueued;
    struct export_req *active;
    int ninflight;
    uint64_t exported, dropped;
    int failing;              /* the last request failed: said once, until one succeeds */
    otlp_drained_fn *drained; /* a drain under way */
    void *drained_data;
};

static void send_batch(struct otlp_exporter *x);
static void drain_check(struct otlp_exporter *x);

/* ------------------------------------------------------------ curl on the loop */

static void req_free(struct export_req *r)
{
    if (r->easy)
        curl_easy_cleanup(r->easy);
    buf_release(&r->body);
    cr_free(r);
}

static void on_tick(uv_timer_t *t);

static void req_done(struct otlp_exporter *x, struct export_req *r, CURLcode cc,
                     long status)
{
    x->ninflight--;
    if (cc == CURLE_OK && status >= 200 && status < 300) {
        x->exported += r->nspans;
        if (x->failing)
            LOG(LOG_WARNING, "tracing: the collector at %s takes spans again",
                x->cfg.conf->traces_url);
        x->failing = 0;
    } else {
        x->dropped += r->nspans;
        if (!x->failing)
            LOG(LOG_WARNING,
                "tracing: cannot export spans to %s (%s, HTTP %ld): dropping them "
                "until it answers",
                x->cfg.conf->traces_url, curl_easy_strerror(cc), status);
        x->failing = 1;
    }
    req_free(r);
    /* draining: the next batch, or the drain's end, on the next turn (not
     * from inside curl's callback chain) */
    if (x->drained)
        uv_timer_start(&x->tick, on_tick, 0, x->cfg.interval_ms);
}

/* curl_loop's done: one export request answered (or failed). */
static void on_req_done(void *owner, void *req, CURLcode cc, long status)
{
    struct otlp_exporter *x = owner;
    struct export_req *r = req;
    for (struct export_req **p = &x->active; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    req_done(x, r, cc, status);
}

/* The collector's answer is not read: an ExportTraceServiceResponse with
 * partial success says how many were rejected, which changes nothing here. */
static size_t discard(char *p, size_t size, size_t n, void *userp)
{
    (void)p;
    (void)userp;
    return size * n;
}

/* ------------------------------------------------------------ batching */

static void on_tick(uv_timer_t *t)
{
    struct otlp_exporter *x = t->data;
    while (x->nqueued && x->ninflight < x->cfg.max_inflight) {
        size_t before = x->nqueued;
        send_batch(x);
        if (x->nqueued == before)
            break;
    }
    drain_check(x);
}

/* ------------------------------------------------------------ draining */

static void drain_end(struct otlp_exporter *x)
{
    otlp_drained_fn *done = x->drained;
    x->drained = NULL;
    uv_timer_stop(&x->drain_timer);
    if (done)
        done(x, x->drained_data);
}

static void drain_check(struct otlp_exporter *x)
{
    if (x->drained && !x->nqueued && !x->ninflight)
        drain_end(x);
}

static void on_drain_timeout(uv_timer_t *t)
{
    drain_end(t->data);
}

void otlp_exporter_drain(struct otlp_exporter *x, uint64_t timeout_ms,
                         otlp_drained_fn *done, void *privdata)
{
    x->drained = done;
    x->drained_data = privdata;
    uv_timer_start(&x->drain_timer, on_drain_timeout, timeout_ms, 0);
    /* the first batch on the next turn; each answer sends the next */
    uv_timer_start(&x->tick, on_tick, 0, x->cfg.interval_ms);
}

/* Takes up to batch_max spans off the queue and starts their request; on
 * failure to even start it they are dropped and counted. */
static void send_batch(struct otlp_exporter *x)
{
    struct span *batch[4096], *s;
    size_t n = 0;
    struct export_req *r;
    int rc;

    while (x->head && n < x->cfg.batch_max && n < sizeof(batch) / sizeof(batch[0])) {
        s = x->head;
        x->head = s->next;
        s->next = NULL;
        batch[n++] = s;
    }
    if (!x->head)
        x->tail = NULL;
    x->nqueued -= n;
    r = cr_calloc(1, sizeof(*r));
    if (r) {
        r->x = x;
        r->nspans = n;
        buf_init(&r->body);
        /* One allocation for the whole request rather than a doubling
         * series of copies: a task's span takes 300 to 400 bytes. Should
         * it fail, the encoder grows the buffer as it goes. */
        buf_reserve(&r->body, 512 + n * 400);
        rc = x->cfg.conf->json ? otlp_encode_json(&x->res, batch, n, &r->body)
                               : otlp_encode_proto(&x->res, batch, n, &r->body);
        r->easy = rc ? NULL : curl_easy_init();
    }
    for (size_t i = 0; i < n; i++)
        span_pool_put(x->cfg.pool, batch[i]);
    if (!r || !r->easy) {
        x->dropped += n;
        if (r)
            req_free(r);
        return;
    }
    curl_easy_setopt(r->easy, CURLOPT_URL, x->cfg.conf->traces_url);
    curl_easy_setopt(r->easy, CURLOPT_POST, 1L);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body.data);
    curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE, (long)r->body.len);
    curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, x->headers);
    curl_easy_setopt(r->easy, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(r->easy, CURLOPT_PRIVATE, r);
    curl_easy_setopt(r->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(r->easy, CURLOPT_TIMEOUT_MS, x->cfg.conf->timeout_ms);
    curl_easy_setopt(r->easy, CURLOPT_CONNECTTIMEOUT_MS,
                     x->cfg.conf->timeout_ms < 5000 ? x->cfg.conf->timeout_ms : 5000L);
    if (curl_loop_add(x->http, r->easy)) {
        x->dropped += n;
        req_free(r);
        return;
    }
    r->next = x->active;
    x->active = r;
    x->ninflight++;
}

void otlp_exporter_add(struct otlp_exporter *x, struct span *s)
{
    if (x->nqueued >= x->cfg.queue_max) {
        x->dropped++;
        span_pool_put(x->cfg.pool, s);
        return;
    }
    s->next = NULL;
    if (x->tail)
        x->tail->next = s;
    else
        x->head = s;
    x->tail = s;
    /* A full batch goes out on the next loop turn, not from inside this
     * call (the caller is in the middle of a task's notification). */
    if (++x->nqueued == x->cfg.batch_max && x->ninflight < x->cfg.max_inflight)
        uv_timer_start(&x->tick, on_tick, 0, x->cfg.interval_ms);
}

void otlp_exporter_stats(const struct otlp_exporter *x, struct otlp_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!x)
        return;
    st->exported = x->exported;
    st->dropped = x->dropped;
    st->queued = x->nqueued;
    st->inflight = x->ninflight;
}

/* ------------------------------------------------------------ life */

static struct curl_slist *headers_of(const struct otel_conf *conf)
{
    struct curl_slist *list = curl_slist_append(
                          NULL, conf->json ? "Content-Type: application/json"
                                           : "Content-Type: application/x-protobuf"),
                      *h = list;
    h = h ? curl_slist_append(list, "Expect:") : NULL;
    for (size_t i = 0; h && i < conf->nheaders; i++)
        h = curl_slist_append(list, conf->headers[i]);
    if (!h) {
        curl_slist_free_all(list);
        return NULL;
    }
    return list;
}

struct otlp_exporter *otlp_exporter_new(uv_loop_t *loop,
                                        const struct otlp_exporter_config *cfg,
                                        struct cr_err *err)
{
    struct otlp_exporter *x = cr_calloc(1, sizeof(*x));
    if (!x) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    x->loop = loop;
    x->cfg = *cfg;
    if (!x->cfg.queue_max)
        x->cfg.queue_max = 2048;
    if (!x->cfg.batch_max)
        x->cfg.batch_max = 512;
    if (x->cfg.batch_max > 4096)
        x->cfg.batch_max = 4096;
    if (!x->cfg.interval_ms)
        x->cfg.interval_ms = 1000;
    if (x->cfg.max_inflight <= 0)
        x->cfg.max_inflight = 2;
    x->res.attrs = cfg->conf->resource;
    x->res.nattrs = cfg->conf->nresource;
    x->res.scope_name = "celeriac";
    x->res.scope_version = cfg->scope_version;
    x->headers = headers_of(cfg->conf);
    x->http = curl_loop_new(loop, 4L, on_req_done, x);
    if (!x->headers || !x->http) {
        cr_err_set(err, CR_ENOMEM, "tracing: cannot set up the HTTP client");
        curl_loop_free(x->http);
        curl_slist_free_all(x->headers);
        cr_free(x);
        return NULL;
    }
    uv_timer_init(loop, &x->tick);
    x->tick.data = x;
    uv_timer_init(loop, &x->drain_timer);
    x->drain_timer.data = x;
    uv_timer_start(&x->tick, on_tick, x->cfg.interval_ms, x->cfg.interval_ms);
    /* the ticker alone must not keep a finished loop running */
    uv_unref((uv_handle_t *)&x->tick);
    return x;
}

static void on_handle_closed(uv_handle_t *h)
{
    struct otlp_exporter *x = h->data;
    if (++x->closed_handles < 2)
        return;
    cr_free(x);
}

void otlp_exporter_free(struct otlp_exporter *x)
{
    if (!x)
        return;
    while (x->active) {
        struct export_req *r = x->active;
        x->active = r->next;
        curl_loop_remove(x->http, r->easy);
        req_free(r);
    }
    while (x->head) {
        struct span *s = x->head;
        x->head = s->next;
        span_pool_put(x->cfg.pool, s);
    }
    curl_loop_free(x->http);
    curl_slist_free_all(x->headers);
    uv_close((uv_handle_t *)&x->tick, on_handle_closed);
    uv_close((uv_handle_t *)&x->drain_timer, on_handle_closed);
}

int otlp_setup(const char *const *env, struct otel_conf *conf, struct trace_rng *rng,
               struct cr_err *err)
{
    struct cr_err warn = {0};
    unsigned char seed[8];
    uint64_t s = 0;

    err->code = 0;
    if (otel_conf_load(conf, env, &warn)) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return -1;
    }
    if (warn.code)
        LOG(LOG_WARNING, "tracing: %s", warn.msg);
    if (!conf->enabled) {
        otel_conf_release(conf);
        return 0;
    }
    if (uv_random(NULL, NULL, seed, sizeof(seed), 0, NULL) != 0)
        memcpy(seed, &(uint64_t){uv_hrtime() ^ (uint64_t)clock_epoch_us()}, 8);
    for (int i = 0; i < 8; i++)
        s = s << 8 | seed[i];
    trace_rng_seed(rng, s);
    LOG(LOG_INFO, "tracing: spans go to %s (%s)", conf->traces_url,
        conf->json ? "http/json" : "http/protobuf");
    return 1;
}
