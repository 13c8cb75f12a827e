/* events.c -- Celery events on the celeryev exchange, from the worker loop.
 *
 * Bodies come from protocol/celery_events (pure); this file adds what only the
 * process knows (time, pid, load, the Lamport clock) and publishes. Every
 * event is sent singly: Celery's receivers accept single events and lists
 * alike, and one event per message keeps the routing keys exact. */
#include "events.h"

#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/version.h"
#include "util/log.h"
#include "worker_ctx.h"
#include "protocol/celery_events.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"

#define EVENT_EXCHANGE "celeryev"
#define HEARTBEAT_CMD_FREQ 5.0

struct events {
    const struct worker_ctx *w;
    uv_timer_t *timer; /* heap: freed in its close callback */
    cJSON *headers;    /* {"hostname": nodename}, on every event */
    int enabled;       /* task events */
    unsigned long clock;
    char sw_sys[sizeof(((struct utsname *)0)->sysname)];
    unsigned long dropped; /* events not published (broker down, OOM) */
};

/* Events are fire-and-forget; the confirm only keeps broker_publish's
 * contract. */
static void on_confirm(struct broker *b, int ok, void *privdata)
{
    (void)b;
    (void)ok;
    (void)privdata;
}

/* Read each time: a DST change moves it while the worker runs. */
static int utcoffset_now(void)
{
    time_t t = time(NULL);
    struct tm tm;
    if (!localtime_r(&t, &tm))
        return 0;
    return cev_utcoffset(tm.tm_gmtoff);
}

static void fill_common(struct events *ev, struct cev_common *c)
{
    c->hostname = ev->w->cfg->hostname;
    c->utcoffset = utcoffset_now();
    c->pid = (long)getpid();
    c->clock = events_clock_tick(ev);
    c->timestamp = (double)clock_epoch_us() / 1e6;
}

static void publish(struct events *ev, const char *type, const struct buf *body)
{
    struct outbound p;
    char key[64];
    if (cev_routing_key(type, key, sizeof(key)))
        return;
    memset(&p, 0, sizeof(p));
    p.content_type = "application/json";
    p.content_encoding = "utf-8";
    p.delivery_mode = 1;
    p.priority = 0;
    p.headers = ev->headers;
    p.no_hold = 1; /* an event held through a broker alarm would be stale news */
    p.exchange = EVENT_EXCHANGE;
    p.routing_key = key;
    p.body = body->data;
    p.body_len = body->len;
    if (broker_publish(ev->w->broker, &p, on_confirm, NULL))
        ev->dropped++;
}

static void send_worker_event(struct events *ev, const char *type, int sw_only)
{
    const struct worker_ctx *w = ev->w;
    struct cev_common c;
    struct cev_worker wk;
    struct engine_stats st;
    struct buf b;

    engine_stats(w->engine, &st);
    memset(&wk, 0, sizeof(wk));
    wk.freq = sw_only ? HEARTBEAT_CMD_FREQ : w->cfg->event_heartbeat;
    wk.active = st.active;
    wk.processed = st.processed;
    if (getloadavg(wk.loadavg, 3) < 0)
        memset(wk.loadavg, 0, sizeof(wk.loadavg));
    wk.sw_ident = EVENTS_SW_IDENT;
    wk.sw_ver = CELERIAC_VERSION;
    wk.sw_sys = ev->sw_sys;
    wk.sw_only = sw_only;
    fill_common(ev, &c);
    buf_init(&b);
    if (cev_worker_encode(&c, type, &wk, &b) == 0)
        publish(ev, type, &b);
    else
        ev->dropped++;
    buf_release(&b);
}

static void on_heartbeat(uv_timer_t *t)
{
    struct events *ev = t->data;
    if (ev)
        send_worker_event(ev, "worker-heartbeat", 0);
}

struct events *events_new(const struct worker_ctx *w)
{
    struct events *ev = cr_calloc(1, sizeof(*ev));
    struct utsname un;
    uint64_t every_ms;

    if (!ev)
        return NULL;
    ev->w = w;
    ev->enabled = w->cfg->task_events;
    snprintf(ev->sw_sys, sizeof(ev->sw_sys), "%s",
             uname(&un) == 0 ? un.sysname : "Linux");
    ev->headers = cJSON_CreateObject();
    ev->timer = cr_malloc(sizeof(*ev->timer));
    if (!ev->headers || !ev->timer ||
        !cJSON_AddStringToObject(ev->headers, "hostname", w->cfg->hostname)) {
        cJSON_Delete(ev->headers);
        cr_free(ev->timer);
        cr_free(ev);
        return NULL;
    }
    /* Celery's events switch the exchange to fanout on Redis (PUBLISH), as
     * celery/events/event.py does for transports without topic routing. */
    if (broker_declare_exchange(
            w->broker, EVENT_EXCHANGE,
            strcmp(broker_transport(w->broker), "redis") ? "topic" : "fanout", 1))
        LOG(LOG_WARNING, "events: cannot declare exchange '%s'", EVENT_EXCHANGE);
    uv_timer_init(w->loop, ev->timer);
    ev->timer->data = ev;
    every_ms = (uint64_t)(w->cfg->event_heartbeat * 1000.0);
    if (every_ms == 0)
        every_ms = 1;
    uv_timer_start(ev->timer, on_heartbeat, every_ms, every_ms);
    send_worker_event(ev, "worker-online", 0);
    return ev;
}

static void on_timer_closed(uv_handle_t *h)
{
    cr_free(h);
}

void events_free(struct events *ev)
{
    if (!ev)
        return;
    if (broker_connected(ev->w->broker))
        send_worker_event(ev, "worker-offline", 0);
    ev->timer->data = NULL;
    uv_timer_stop(ev->timer);
    uv_close((uv_handle_t *)ev->timer, on_timer_closed);
    cJSON_Delete(ev->headers);
    cr_free(ev);
}

int events_set_enabled(struct events *ev, int on)
{
    if (!ev || ev->enabled == (on != 0))
        return 0;
    ev->enabled = on != 0;
    LOG(LOG_INFO, "Events of group {task} %s by remote.", on ? "enabled" : "disabled");
    return 1;
}

int events_enabled(const struct events *ev)
{
    return ev && ev->enabled;
}

void events_heartbeat_now(struct events *ev)
{
    if (ev)
        send_worker_event(ev, "worker-heartbeat", 1);
}

unsigned long events_clock_tick(struct events *ev)
{
    return ev ? ++ev->clock : 0;
}

unsigned long events_clock_adjust(struct events *ev, unsigned long seen)
{
    if (!ev)
        return seen;
    ev->clock = (seen > ev->clock ? seen : ev->clock) + 1;
    return ev->clock;
}

unsigned long events_clock_value(const struct events *ev)
{
    return ev ? ev->clock : 0;
}

const char *events_job_model(const struct job *j)
{
    return job_model(j);
}

/* ---------------------------------------------------------- task events */

static void fill_llm(const struct job *j, const struct llm_result *llm,
                     struct cev_task *t)
{
    t->has_llm = 1;
    t->model = events_job_model(j);
    /* Named as in the task's result: "default" for the worker's own. */
    t->provider = llm->provider && llm->provider[0] ? llm->provider : "default";
    t->prompt_tokens = -1;
    t->completion_tokens = -1;
    if (llm->text) {
        t->prompt_tokens = llm->prompt_tokens;
        t->completion_tokens = llm->completion_tokens;
    } else if (llm->embed_tokens >= 0) {
        t->prompt_tokens = llm->embed_tokens;
        t->completion_tokens = 0;
    }
    t->ttft = llm->ttft_s;
    t->has_cost = llm->cost_usd >= 0;
    t->cost = llm->cost_usd;
    t->tokens_per_second =
        cev_tokens_per_second(t->completion_tokens, llm->elapsed_s, llm->ttft_s);
}

/* The traceback text Celery tools print: ours names the task, not Python
 * frames, and is kept the same shape as the one stored with the result. */
static int traceback_text(const struct job *j, const struct task_event_info *info,
                          struct buf *out)
{
    if (info->traceback)
        return buf_puts(out, info->traceback);
    return result_traceback(out, j->tm.task, NULL, info->exc_type, info->exc_message);
}

void events_on_task(struct events *ev, struct job *j, const struct task_event_info *info)
{
    struct cev_common c;
    struct cev_task t;
    struct buf body, args, kwargs, result, exc, tb;
    int rc = 0;

    /* A fallback is no event of Celery's: the task goes on. */
    if (!ev || !ev->enabled || !j->tm.id || info->type == TEV_FALLBACK)
        return;
    memset(&t, 0, sizeof(t));
    t.uuid = j->tm.id;
    buf_init(&body);
    buf_init(&args);
    buf_init(&kwargs);
    buf_init(&result);
    buf_init(&exc);
    buf_init(&tb);
    switch (info->type) {
    case TEV_RECEIVED:
        t.type = CEV_TASK_RECEIVED;
        t.name = job_name(j);
        if (j->tm.argsrepr)
            t.args = j->tm.argsrepr;
        else if ((rc = cev_args_repr(j->tm.args, &args, CEV_REPR_MAX)) == 0)
            t.args = args.data;
        if (j->tm.kwargsrepr)
            t.kwargs = j->tm.kwargsrepr;
        else if (!rc && (rc = py_repr(j->tm.kwargs, &kwargs, CEV_REPR_MAX)) == 0)
            t.kwargs = kwargs.data;
        t.root_id = j->tm.root_id;
        t.parent_id = j->tm.parent_id;
        t.retries = j->tm.retries;
        t.eta = j->tm.eta;
        t.expires = j->tm.expires;
        break;
    case TEV_STARTED:
        t.type = CEV_TASK_STARTED;
        break;
    case TEV_SUCCEEDED:
        t.type = CEV_TASK_SUCCEEDED;
        if (info->result && (rc = py_repr(info->result, &result, CEV_REPR_MAX)) == 0)
            t.result = result.data;
        t.runtime = info->runtime_s;
        if (info->llm)
            fill_llm(j, info->llm, &t);
        break;
    case TEV_FAILED:
    case TEV_RETRIED:
        t.type = info->type == TEV_FAILED ? CEV_TASK_FAILED : CEV_TASK_RETRIED;
        rc = cev_exception_repr(info->exc_type, info->exc_message, &exc);
        if (!rc)
            rc = traceback_text(j, info, &tb);
        t.exception = exc.data;
        t.traceback = tb.data;
        if (info->llm)
            fill_llm(j, info->llm, &t);
        break;
    case TEV_REJECTED:
        t.type = CEV_TASK_REJECTED;
        t.requeue = info->requeue;
        break;
    case TEV_REVOKED:
        t.type = CEV_TASK_REVOKED;
        t.terminated = info->terminated;
        t.expired = info->expired;
        t.signum = info->terminated ? 15 : 0; /* SIGTERM, Celery's default */
        break;
    default:
        rc = CR_EINVAL;
        break;
    }
    if (!rc) {
        fill_common(ev, &c);
        rc = cev_task_encode(&c, &t, &body);
    }
    if (!rc)
        publish(ev, cev_task_type_name(t.type), &body);
    else
        ev->dropped++;
    buf_release(&body);
    buf_release(&args);
    buf_release(&kwargs);
    buf_release(&result);
    buf_release(&exc);
    buf_release(&tb);
}
