/* pidbox.c -- Celery remote control on the worker loop, and the revoked-ids file.
 *
 * A request is decoded and matched by protocol/pidbox_msg (pure), run by one
 * handler from the table below, and answered on the reply exchange. Handlers
 * change the worker only through the engine's control API (engine/engine.h). Reply shapes
 * follow the Python worker exactly; Flower's pages break on anything else. */
#include "pidbox.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "events.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/version.h"
#include "worker_ctx.h"
#include "protocol/pidbox_msg.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "engine/ratelimit.h"
#include "engine/revoked.h"
#include "protocol/pyjson.h"

#define MAILBOX_EXCHANGE "celery.pidbox"
#define REPLY_EXCHANGE "reply.celery.pidbox"
#define MAILBOX_EXPIRES_MS 10000
#define MAILBOX_TTL_MS 300000
#define STATEDB_SAVE_DELAY_MS 1000
#define STATEDB_MAX_BYTES (64 * 1024 * 1024)
/* What Celery's scheduled entries show as the timer priority. */
#define SCHEDULED_PRIORITY 6
#define NO_REPLY 1

struct statedb;

struct pidbox {
    const struct worker_ctx *w;
    char *queue;
    struct statedb *db; /* NULL without --statedb */
    struct pidbox_matcher *matcher;
    unsigned long bad_messages;
    unsigned long bad_patterns;
};

/* ================================================================ statedb */

/* The state file is written off the loop: a snapshot is taken on the loop
 * (fast), then written to "<path>.tmp", fsynced and renamed in libuv's thread
 * pool, so a crash leaves the old file or the new one, never half of one.
 * Three things keep the struct alive (refs): the owning pidbox, the debounce
 * timer until closed, and a write in flight. */
struct statedb {
    char *path;
    uv_loop_t *loop;
    const struct worker_ctx *w; /* NULL once the pidbox is freed */
    uv_timer_t timer;
    uv_work_t work;
    struct buf snapshot; /* owned by the thread-pool write while inflight */
    int inflight;
    int dirty;
    int write_err; /* errno of the last write, from the thread */
    int logged_err;
    int refs;
    int has_final; /* a final snapshot waits for the write in flight */
    struct buf final;
};

static void statedb_unref(struct statedb *db)
{
    if (--db->refs > 0)
        return;
    buf_release(&db->snapshot);
    buf_release(&db->final);
    cr_free(db->path);
    cr_free(db);
}

struct snap_arg {
    struct buf *out;
    int rc;
};

static void snap_one(const char *id, int64_t expires, void *arg)
{
    struct snap_arg *a = arg;
    if (!a->rc)
        a->rc = pidbox_statedb_line(id, expires, a->out);
}

static int take_snapshot(const struct worker_ctx *w, struct buf *out)
{
    struct snap_arg a = {out, 0};
    buf_reset(out);
    a.rc = pidbox_statedb_header(out);
    if (!a.rc)
        engine_each_revoked(w->engine, worker_ctx_now(w), snap_one, &a);
    return a.rc;
}

/* Writes data to path atomically. Returns 0 or an errno value. Runs in the
 * thread pool, or on the loop at exit. */
static int write_file(const char *path, const char *data, size_t len)
{
    char tmp[4096];
    int fd, e = 0;
    size_t off = 0;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return ENAMETOOLONG;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            e = n < 0 ? errno : EIO;
            break;
        }
        off += (size_t)n;
    }
    if (!e && fsync(fd))
        e = errno;
    if (close(fd) && !e)
        e = errno;
    if (!e && rename(tmp, path))
        e = errno;
    if (e)
        unlink(tmp);
    return e;
}

static void statedb_work(uv_work_t *req)
{
    struct statedb *db = req->data;
    db->write_err = write_file(db->path, db->snapshot.data ? db->snapshot.data : "",
                               db->snapshot.len);
}

static void statedb_log_result(struct statedb *db)
{
    if (db->write_err && !db->logged_err) {
        LOG(LOG_ERROR, "statedb: cannot write '%s': %s", db->path,
            strerror(db->write_err));
        db->logged_err = 1;
    } else if (!db->write_err) {
        db->logged_err = 0;
    }
}

static void statedb_save_now(struct statedb *db);

static void statedb_after_work(uv_work_t *req, int status)
{
    struct statedb *db = req->data;
    (void)status;
    db->inflight = 0;
    statedb_log_result(db);
    if (db->has_final) {
        /* The pidbox is gone and the loop is winding down: the last state is
         * written here, after the older write, so it is the one that stays. */
        db->write_err = write_file(db->path, db->final.data, db->final.len);
        statedb_log_result(db);
        db->has_final = 0;
    } else if (db->dirty && db->w) {
        statedb_save_now(db);
    }
    statedb_unref(db);
}

static void statedb_save_now(struct statedb *db)
{
    if (db->inflight || !db->w)
        return;
    if (take_snapshot(db->w, &db->snapshot)) {
        LOG(LOG_ERROR, "statedb: out of memory taking a snapshot");
        return;
    }
    db->dirty = 0;
    db->work.data = db;
    if (uv_queue_work(db->loop, &db->work, statedb_work, statedb_after_work) == 0) {
        db->inflight = 1;
        db->refs++;
    } else {
        db->dirty = 1;
    }
}

static void on_save_timer(uv_timer_t *t)
{
    struct statedb *db = t->data;
    if (db->inflight) {
        db->dirty = 1; /* after_work saves again */
        return;
    }
    statedb_save_now(db);
}

static void on_statedb_timer_closed(uv_handle_t *h)
{
    statedb_unref(h->data);
}

struct load_arg {
    const struct worker_ctx *w;
};

static void load_one(const char *id, int64_t expires, void *arg)
{
    struct load_arg *a = arg;
    engine_remember_revoked(a->w->engine, id, expires, worker_ctx_now(a->w));
}

/* Reads the state file at start-up (blocking is fine then). A missing file is
 * a first start; an unreadable or foreign one is reported and left alone. */
static void statedb_load(struct statedb *db, const struct worker_ctx *w)
{
    struct load_arg a = {w};
    struct buf b;
    char chunk[65536];
    FILE *f = fopen(db->path, "rb");
    size_t n;
    int count;

    if (!f) {
        if (errno != ENOENT)
            LOG(LOG_WARNING, "statedb: cannot read '%s': %s", db->path, strerror(errno));
        return;
    }
    buf_init(&b);
    b.max_bytes = STATEDB_MAX_BYTES;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (buf_append(&b, chunk, n)) {
            LOG(LOG_WARNING, "statedb: '%s' is too large; ignoring it", db->path);
            fclose(f);
            buf_release(&b);
            return;
        }
    }
    fclose(f);
    count = pidbox_statedb_parse(b.data ? b.data : "", b.len, clock_epoch_us() / 1000000,
                                 load_one, &a);
    if (count < 0)
        LOG(LOG_WARNING, "statedb: '%s' is not a celeriac state file; ignoring it",
            db->path);
    else
        LOG(LOG_INFO, "statedb: %d revoked task id(s) loaded from '%s'", count, db->path);
    buf_release(&b);
}

static struct statedb *statedb_new(const struct worker_ctx *w, const char *path)
{
    struct statedb *db = cr_calloc(1, sizeof(*db));
    if (!db)
        return NULL;
    db->path = cr_strdup(path);
    if (!db->path) {
        cr_free(db);
        return NULL;
    }
    db->loop = w->loop;
    db->w = w;
    buf_init(&db->snapshot);
    buf_init(&db->final);
    uv_timer_init(w->loop, &db->timer);
    db->timer.data = db;
    db->refs = 2; /* the pidbox and the timer */
    statedb_load(db, w);
    return db;
}

static void statedb_close(struct statedb *db)
{
    if (!db)
        return;
    if (take_snapshot(db->w, &db->final) == 0) {
        if (db->inflight) {
            db->has_final = 1;
        } else {
            db->write_err = write_file(db->path, db->final.data, db->final.len);
            statedb_log_result(db);
        }
    }
    db->w = NULL;
    uv_timer_stop(&db->timer);
    uv_close((uv_handle_t *)&db->timer, on_statedb_timer_closed);
    statedb_unref(db);
}

void pidbox_revoked_changed(struct pidbox *pb)
{
    struct statedb *db = pb ? pb->db : NULL;
    if (!db)
        return;
    db->dirty = 1;
    if (!uv_is_active((uv_handle_t *)&db->timer))
        uv_timer_start(&db->timer, on_save_timer, STATEDB_SAVE_DELAY_MS, 0);
}

/* ================================================================ helpers */

static int concurrency(const struct pidbox *pb)
{
    struct engine_stats st;
    engine_stats(pb->w->engine, &st);
    return st.concurrency;
}

static double job_started_epoch(const struct worker_ctx *w, const struct job *j)
{
    if (!j->t_started)
        return -1;
    return (double)w->started_epoch_us / 1e6 +
           ((double)j->t_started - (double)w->started_ms) / 1000.0;
}

static cJSON *job_info(struct pidbox *pb, struct job *j, int safe)
{
    const struct worker_ctx *w = pb->w;
    const struct delivery *m = j->nmsgs > 0 ? j->msgs[0] : NULL;
    struct pidbox_task_info ti;
    int running = j->state == JOB_RUNNING;

    engine_job_args(j); /* a running call dropped them */
    memset(&ti, 0, sizeof(ti));
    ti.id = j->tm.id;
    ti.name = job_name(j);
    ti.args = j->tm.args;
    ti.kwargs = j->tm.kwargs;
    ti.argsrepr = j->tm.argsrepr;
    ti.kwargsrepr = j->tm.kwargsrepr;
    ti.hostname = w->cfg->hostname;
    ti.time_start = running ? job_started_epoch(w, j) : -1;
    ti.acknowledged = running && w->cfg->acks_early;
    ti.exchange = m ? m->exchange : "";
    ti.routing_key = m ? m->routing_key : "";
    ti.priority = m ? m->priority : 0;
    ti.redelivered = m ? m->redelivered : 0;
    ti.worker_pid = running ? (long)getpid() : 0;
    return pidbox_task_info_new(&ti, safe);
}

/* Appends v to arr, taking it. 0 or CR_ENOMEM. */
static int push(cJSON *arr, cJSON *v)
{
    if (!v)
        return CR_ENOMEM;
    if (!cJSON_AddItemToArray(arr, v)) {
        cJSON_Delete(v);
        return CR_ENOMEM;
    }
    return 0;
}

/* A handler's TypeError for a missing argument, as Python words it. */
static int missing(const char *fn, const char *arg, cJSON **reply)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "%s() missing 1 required positional argument: '%s'", fn,
             arg);
    *reply = pidbox_error_exc("TypeError", msg);
    return *reply ? 0 : CR_ENOMEM;
}

static int bad_type(const char *fn, const char *arg, cJSON **reply)
{
    char msg[160];
    snprintf(msg, sizeof(msg), "%s(): bad type for argument '%s'", fn, arg);
    *reply = pidbox_error_exc("TypeError", msg);
    return *reply ? 0 : CR_ENOMEM;
}

static int ok_reply(const char *text, cJSON **reply)
{
    *reply = pidbox_ok(text);
    return *reply ? 0 : CR_ENOMEM;
}

static int error_reply(const char *text, cJSON **reply)
{
    *reply = pidbox_error(text);
    return *reply ? 0 : CR_ENOMEM;
}

/* ================================================================ inspect */

/* A handler fills *reply (NULL means a null reply) and returns 0, NO_REPLY,
 * or CR_ENOMEM. */
typedef int cmd_fn(struct pidbox *pb, const cJSON *args, cJSON **reply);

static int cmd_ping(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)pb;
    (void)args;
    return ok_reply("pong", reply);
}

static int cmd_clock(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)args;
    *reply = cJSON_CreateObject();
    if (!*reply || !cJSON_AddNumberToObject(*reply, "clock",
                                            (double)events_clock_value(pb->w->events))) {
        cJSON_Delete(*reply);
        return CR_ENOMEM;
    }
    return 0;
}

struct totals_arg {
    cJSON *o;
    int rc;
};

static void total_one(const char *name, unsigned long n, void *arg)
{
    struct totals_arg *a = arg;
    if (!a->rc && !cJSON_AddNumberToObject(a->o, name, (double)n))
        a->rc = CR_ENOMEM;
}

static int cmd_stats(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const struct worker_ctx *w = pb->w;
    struct pidbox_broker_info bi;
    struct pidbox_stats st;
    struct engine_stats es;
    struct pidbox_rusage ru;
    struct rusage r;
    struct totals_arg ta = {cJSON_CreateObject(), 0};
    cJSON *topts = NULL;
    (void)args;

    if (!ta.o)
        return CR_ENOMEM;
    engine_each_total(w->engine, total_one, &ta);
    if (ta.rc) {
        cJSON_Delete(ta.o);
        return ta.rc;
    }
    if (pidbox_broker_info_parse(w->cfg->broker, &bi))
        pidbox_broker_info_parse("amqp://", &bi);
    memset(&st, 0, sizeof(st));
    st.total = ta.o;
    st.pid = (long)getpid();
    st.clock = events_clock_value(w->events);
    st.uptime_s = (long)((uv_now(w->loop) - w->started_ms) / 1000);
    st.pool_implementation = "celeriac:libuv";
    engine_stats(w->engine, &es);
    st.max_concurrency = es.concurrency;
    st.soft_time_limit = w->cfg->soft_time_limit;
    st.hard_time_limit = w->cfg->time_limit;
    st.broker = &bi;
    /* As Celery shows them, less the sentinels' credentials. */
    if (w->cfg->broker_transport_options && *w->cfg->broker_transport_options &&
        (topts = cJSON_Parse(w->cfg->broker_transport_options)) != NULL)
        cJSON_DeleteItemFromObjectCaseSensitive(topts, "sentinel_kwargs");
    st.transport_options = cJSON_IsObject(topts) ? topts : NULL;
    st.broker_heartbeat = w->cfg->heartbeat;
    st.broker_connect_timeout = w->bcfg->connect_timeout;
    st.prefetch_count = es.prefetch_count;
    if (getrusage(RUSAGE_SELF, &r) == 0) {
        memset(&ru, 0, sizeof(ru));
        ru.utime = (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec / 1e6;
        ru.stime = (double)r.ru_stime.tv_sec + (double)r.ru_stime.tv_usec / 1e6;
        ru.maxrss = r.ru_maxrss;
        ru.ixrss = r.ru_ixrss;
        ru.idrss = r.ru_idrss;
        ru.isrss = r.ru_isrss;
        ru.minflt = r.ru_minflt;
        ru.majflt = r.ru_majflt;
        ru.nswap = r.ru_nswap;
        ru.inblock = r.ru_inblock;
        ru.oublock = r.ru_oublock;
        ru.msgsnd = r.ru_msgsnd;
        ru.msgrcv = r.ru_msgrcv;
        ru.nsignals = r.ru_nsignals;
        ru.nvcsw = r.ru_nvcsw;
        ru.nivcsw = r.ru_nivcsw;
        st.rusage = &ru;
    }
    *reply = pidbox_stats_new(&st);
    cJSON_Delete(ta.o);
    cJSON_Delete(topts);
    return *reply ? 0 : CR_ENOMEM;
}

struct collect_arg {
    struct pidbox *pb;
    cJSON *arr;
    int safe;
    int scheduled; /* wrap each as a scheduled entry */
    int rc;
};

static void collect_one(struct job *j, void *arg)
{
    struct collect_arg *a = arg;
    if (a->rc)
        return;
    if (a->scheduled)
        a->rc = push(a->arr, pidbox_scheduled_item_new(j->tm.eta, SCHEDULED_PRIORITY,
                                                       job_info(a->pb, j, a->safe)));
    else
        a->rc = push(a->arr, job_info(a->pb, j, a->safe));
}

/* The jobs of the given sets, in order, as a new array in *reply. */
static int collect(struct pidbox *pb, const cJSON *args, const enum engine_job_set *sets,
                   int nsets, int scheduled, cJSON **reply)
{
    struct collect_arg a = {pb, NULL, 0, scheduled, 0};
    pidbox_arg_bool(args, "safe", &a.safe);
    *reply = a.arr = cJSON_CreateArray();
    if (!a.arr)
        return CR_ENOMEM;
    for (int i = 0; i < nsets && !a.rc; i++)
        engine_each_job(pb->w->engine, sets[i], collect_one, &a);
    return a.rc;
}

static int cmd_active(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    static const enum engine_job_set sets[] = {ENGINE_JOBS_RUNNING};
    return collect(pb, args, sets, 1, 0, reply);
}

/* Received and not running, not held for an eta: the ready queue, then the
 * jobs still checking the backend for a stored result. */
static int cmd_reserved(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    static const enum engine_job_set sets[] = {ENGINE_JOBS_READY, ENGINE_JOBS_CHECKING};
    return collect(pb, args, sets, 2, 0, reply);
}

static int cmd_scheduled(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    static const enum engine_job_set sets[] = {ENGINE_JOBS_ETA};
    return collect(pb, args, sets, 1, 1, reply);
}

struct ids_arg {
    cJSON *arr;
    int rc;
};

static void revoked_one(const char *id, int64_t expires, void *arg)
{
    struct ids_arg *a = arg;
    (void)expires;
    if (!a->rc)
        a->rc = push(a->arr, cJSON_CreateString(id));
}

static int cmd_revoked(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    struct ids_arg a = {cJSON_CreateArray(), 0};
    (void)args;
    *reply = a.arr;
    if (!a.arr)
        return CR_ENOMEM;
    engine_each_revoked(pb->w->engine, worker_ctx_now(pb->w), revoked_one, &a);
    return a.rc;
}

static int cmd_registered(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const struct config *c = pb->w->cfg;
    const char *names[64 + CONFIG_MAX_LIST];
    const char *rates[64 + CONFIG_MAX_LIST];
    char alias[CONFIG_MAX_LIST][256];
    int n = 0;
    (void)args;
    for (int i = 0; tasks_builtin_names[i] && n < 64; i++)
        names[n++] = tasks_builtin_names[i];
    for (int i = 0; i < c->aliases.n; i++) {
        const char *eq = strchr(c->aliases.items[i], '=');
        size_t len =
            eq ? (size_t)(eq - c->aliases.items[i]) : strlen(c->aliases.items[i]);
        snprintf(alias[i], sizeof(alias[i]), "%.*s", (int)len, c->aliases.items[i]);
        names[n++] = alias[i];
    }
    for (int i = 0; i < n; i++) {
        rates[i] = engine_rate_limit(pb->w->engine, names[i]);
    }
    *reply = pidbox_registered_new(names, rates, n);
    return *reply ? 0 : CR_ENOMEM;
}

struct queues_arg {
    cJSON *arr;
    int rc;
};

static void queue_one(const struct broker_queue *q, void *arg)
{
    struct queues_arg *a = arg;
    struct pidbox_queue_info qi;
    if (a->rc || q->no_ack) /* the mailbox is not a task queue */
        return;
    qi.name = q->name;
    qi.exchange = q->exchange ? q->exchange : "";
    qi.exchange_type = q->exchange_type ? q->exchange_type : "direct";
    qi.exchange_durable = q->exchange_durable;
    qi.routing_key = q->routing_key;
    qi.durable = q->durable;
    qi.exclusive = q->exclusive;
    qi.auto_delete = q->auto_delete;
    qi.no_ack = q->no_ack;
    qi.arguments = q->arguments;
    a->rc = push(a->arr, pidbox_queue_info_new(&qi));
}

static int cmd_active_queues(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    struct queues_arg a = {cJSON_CreateArray(), 0};
    (void)args;
    *reply = a.arr;
    if (!a.arr)
        return CR_ENOMEM;
    broker_each_consumer(pb->w->broker, queue_one, &a);
    return a.rc;
}

static const char *job_place(const struct job *j)
{
    switch (j->state) {
    case JOB_RUNNING:
        return "active";
    case JOB_CHECKING:
    case JOB_ETA:
    case JOB_READY:
        return "reserved";
    default:
        return "ready";
    }
}

static int cmd_query_task(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    cJSON *ids = NULL;
    const cJSON *id;
    int rc = pidbox_arg_ids(args, "ids", &ids);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc < 0)
        return bad_type("query_task", "ids", reply);
    *reply = cJSON_CreateObject();
    rc = *reply ? 0 : CR_ENOMEM;
    cJSON_ArrayForEach(id, ids)
    {
        struct job *j = engine_find_job(pb->w->engine, id->valuestring);
        cJSON *pair;
        if (rc || !j)
            continue;
        pair = cJSON_CreateArray();
        if (!pair || push(pair, cJSON_CreateString(job_place(j))) ||
            push(pair, job_info(pb, j, 0))) {
            cJSON_Delete(pair);
            rc = CR_ENOMEM;
            break;
        }
        if (!cJSON_AddItemToObject(*reply, id->valuestring, pair)) {
            cJSON_Delete(pair);
            rc = CR_ENOMEM;
        }
    }
    cJSON_Delete(ids);
    return rc;
}

static int cmd_conf(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const struct config *c = pb->w->cfg;
    char broker[512], backend[512], llm[512];
    cJSON *o = cJSON_CreateObject();
    cJSON *queues = cJSON_CreateArray();
    int ok = o && queues;
    (void)args;
    config_redact_url(c->broker, broker, sizeof(broker));
    config_redact_url(c->result_backend, backend, sizeof(backend));
    for (int i = 0; ok && i < c->queues.n; i++)
        ok = push(queues, cJSON_CreateString(c->queues.items[i])) == 0;
    if (ok) {
        ok = cJSON_AddItemToObject(o, "celeriac_queues", queues);
        if (!ok)
            cJSON_Delete(queues);
        queues = NULL;
    }
#define S(k, v) ok = ok && cJSON_AddStringToObject(o, k, v)
#define N(k, v) ok = ok && cJSON_AddNumberToObject(o, k, v)
#define B(k, v) ok = ok && cJSON_AddBoolToObject(o, k, v)
    S("broker_url", broker);
    S("result_backend", backend);
    S("task_default_queue", c->queues.n ? c->queues.items[0] : "celery");
    N("worker_concurrency", c->concurrency);
    N("worker_prefetch_multiplier", c->prefetch_multiplier);
    B("task_acks_late", !c->acks_early);
    N("result_expires", c->result_expires);
    B("result_extended", c->result_extended);
    B("task_track_started", c->track_started);
    B("worker_send_task_events", events_enabled(pb->w->events));
    S("event_exchange", "celeryev");
    S("control_exchange", "celery");
    N("worker_heartbeat", c->event_heartbeat);
    N("broker_heartbeat", c->heartbeat);
    N("task_time_limit", c->time_limit);
    N("task_soft_time_limit", c->soft_time_limit);
    N("task_max_retries", c->max_retries);
    S("worker_state_db", c->statedb);
    S("celeriac_llm_base_url",
      worker_ctx_shown_url(pb->w, c->llm_base_url, llm, sizeof(llm)));
    S("celeriac_llm_model", c->llm_model);
    S("celeriac_llm_embed_model", c->llm_embed_model);
    S("celeriac_dead_letter_exchange", c->dead_letter_exchange);
#undef S
#undef N
#undef B
    cJSON_Delete(queues);
    if (!ok) {
        cJSON_Delete(o);
        return CR_ENOMEM;
    }
    *reply = o;
    return 0;
}

static int cmd_report(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const struct config *c = pb->w->cfg;
    char broker[512], backend[512], llm[512];
    struct buf b;
    int rc;
    (void)args;
    config_redact_url(c->broker, broker, sizeof(broker));
    config_redact_url(c->result_backend, backend, sizeof(backend));
    buf_init(&b);
    rc = buf_printf(&b,
                    "\nsoftware -> %s:%s (libuv %s) events:%s\n"
                    "platform -> pid:%ld node:%s\n"
                    "settings -> transport:amqp results:redis\n\n"
                    "broker_url: '%s'\nresult_backend: '%s'\n"
                    "worker_concurrency: %d\nllm_base_url: '%s'\nllm_model: '%s'\n",
                    EVENTS_SW_IDENT, CELERIAC_VERSION, uv_version_string(),
                    events_enabled(pb->w->events) ? "on" : "off", (long)getpid(),
                    c->hostname, broker, backend, concurrency(pb),
                    worker_ctx_shown_url(pb->w, c->llm_base_url, llm, sizeof(llm)),
                    c->llm_model);
    if (!rc)
        rc = ok_reply(b.data, reply);
    buf_release(&b);
    return rc;
}

struct hello_arg {
    cJSON *o;
    int rc;
};

static void hello_one(const char *id, int64_t expires, void *arg)
{
    struct hello_arg *a = arg;
    /* Celery's LimitedSet sends the time each id was added, as a float. */
    cJSON *ts = a->rc ? NULL : py_json_float((double)(expires - ENGINE_REVOKE_EXPIRES_S));
    if (a->rc)
        return;
    if (!ts || !cJSON_AddItemToObject(a->o, id, ts)) {
        cJSON_Delete(ts);
        a->rc = CR_ENOMEM;
    }
}

/* Mingle: another node starting up sends its revoked ids and asks for ours. */
static int cmd_hello(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const struct worker_ctx *w = pb->w;
    const char *from = NULL;
    const cJSON *revoked = cJSON_GetObjectItemCaseSensitive(args, "revoked"), *r;
    struct hello_arg a = {NULL, 0};
    int merged = 0;

    if (pidbox_arg_str(args, "from_node", &from) != 1)
        return missing("hello", "from_node", reply);
    if (!strcmp(from, w->cfg->hostname)) {
        *reply = NULL;
        return 0;
    }
    LOG(LOG_INFO, "sync with %s", from);
    if (!cJSON_IsObject(revoked))
        revoked = NULL;
    cJSON_ArrayForEach(r, revoked)
    {
        const cJSON *t = cJSON_IsArray(r) ? cJSON_GetArrayItem(r, 0) : r;
        if (cJSON_IsNumber(t) && t->valuedouble > 0) {
            engine_remember_revoked(w->engine, r->string,
                                    (int64_t)t->valuedouble + ENGINE_REVOKE_EXPIRES_S,
                                    worker_ctx_now(w));
            merged++;
        }
    }
    if (merged)
        pidbox_revoked_changed(pb);
    *reply = cJSON_CreateObject();
    a.o = cJSON_CreateObject();
    if (!*reply || !a.o) {
        cJSON_Delete(a.o);
        return CR_ENOMEM;
    }
    engine_each_revoked(w->engine, worker_ctx_now(w), hello_one, &a);
    if (a.rc || !cJSON_AddItemToObject(*reply, "revoked", a.o)) {
        cJSON_Delete(a.o);
        return CR_ENOMEM;
    }
    if (!cJSON_AddNumberToObject(*reply, "clock", (double)events_clock_tick(w->events)))
        return CR_ENOMEM;
    return 0;
}

/* ================================================================ control */

static void on_revoked_stored(struct backend *bk, int status, int skipped, void *privdata)
{
    (void)bk;
    (void)skipped;
    if (status)
        LOG(LOG_WARNING, "revoke: cannot store REVOKED for '%s': %s",
            privdata ? (const char *)privdata : "?", cr_strerror(status));
    cr_free(privdata);
}

/* Celery 5.6: a revoke stores REVOKED at once, so a client waiting on the id
 * hears of it before any worker receives the task (never over a SUCCESS: the
 * store's own rule). Only for an id without a job here; a job's own revoke
 * stores it (or, running, its outcome stands). */
static void store_unseen_revoked(const struct worker_ctx *w, const char *id)
{
    char *meta = engine_revoked_meta(w->engine, id, worker_ctx_now(w));
    char *copy = meta ? cr_strdup(id) : NULL;
    if (!meta || !copy) {
        cr_free(meta);
        LOG(LOG_WARNING, "revoke: out of memory storing REVOKED for '%s'", id);
        return;
    }
    if (backend_store(w->backend, id, -1, meta, strlen(meta), on_revoked_stored, copy))
        cr_free(copy);
}

static int do_revoke(struct pidbox *pb, const cJSON *args, int terminate, const char *fn,
                     cJSON **reply)
{
    const struct worker_ctx *w = pb->w;
    cJSON *ids = NULL, *terminated = NULL;
    const cJSON *id;
    const char *sig = NULL;
    int rc = pidbox_arg_ids(args, "task_id", &ids);

    if (rc == CR_ENOMEM)
        return rc;
    if (rc == 0)
        return missing(fn, "task_id", reply);
    if (rc < 0)
        return bad_type(fn, "task_id", reply);
    if (pidbox_arg_str(args, "signal", &sig) == 1 && terminate)
        LOG(LOG_DEBUG, "revoke: signal %s (an LLM call is aborted whatever the signal)",
            sig);
    terminated = cJSON_CreateArray();
    if (!terminated) {
        cJSON_Delete(ids);
        return CR_ENOMEM;
    }
    rc = 0;
    cJSON_ArrayForEach(id, ids)
    {
        const struct job *j = engine_find_job(w->engine, id->valuestring);
        int known = j && j->state != JOB_SETTLING && j->state != JOB_DONE;
        /* Any signal ends an LLM call the same way: its transfer is aborted
         * (engine_revoke logs it). */
        engine_revoke(w->engine, worker_ctx_now(w), id->valuestring, terminate);
        if (!j)
            store_unseen_revoked(w, id->valuestring);
        if (terminate && known && !rc)
            rc = push(terminated, cJSON_CreateString(id->valuestring));
    }
    if (!terminate && cJSON_GetArraySize(ids) > 0) {
        struct buf b;
        buf_init(&b);
        cJSON_ArrayForEach(id, ids)
        {
            if (buf_printf(&b, "%s%s", b.len ? ", " : "", id->valuestring))
                break;
        }
        LOG(LOG_INFO, "Tasks flagged as revoked: %s", b.data ? b.data : "");
        buf_release(&b);
    }
    pidbox_revoked_changed(pb);
    if (!rc) {
        *reply = pidbox_revoke_reply(ids, terminate, terminated);
        rc = *reply ? 0 : CR_ENOMEM;
    }
    cJSON_Delete(ids);
    cJSON_Delete(terminated);
    return rc;
}

/* revoke_by_stamped_headers's headers as a dict: given as one, or as Celery's
 * list of "name=value" strings (the value is what lies between the first '='
 * and the next, as Python's split gives it). New object, or NULL (OOM or a
 * list item that is not such a string: *bad set). */
static cJSON *stamp_headers_arg(const cJSON *h, int *bad)
{
    const cJSON *it;
    cJSON *out;
    *bad = 0;
    if (cJSON_IsObject(h))
        return cJSON_Duplicate(h, 1);
    if (!cJSON_IsArray(h) || !(out = cJSON_CreateObject())) {
        *bad = cJSON_IsArray(h) ? 0 : 1;
        return NULL;
    }
    cJSON_ArrayForEach(it, h)
    {
        const char *eq = cJSON_IsString(it) ? strchr(it->valuestring, '=') : NULL;
        char name[256], value[1024];
        size_t nl, vl;
        if (!eq) {
            *bad = 1;
            cJSON_Delete(out);
            return NULL;
        }
        nl = (size_t)(eq - it->valuestring);
        vl = strcspn(eq + 1, "=");
        if (nl >= sizeof(name) || vl >= sizeof(value)) {
            *bad = 1;
            cJSON_Delete(out);
            return NULL;
        }
        memcpy(name, it->valuestring, nl);
        name[nl] = '\0';
        memcpy(value, eq + 1, vl);
        value[vl] = '\0';
        cJSON_DeleteItemFromObjectCaseSensitive(out, name); /* a later one wins */
        if (!cJSON_AddStringToObject(out, name, value)) {
            cJSON_Delete(out);
            return NULL;
        }
    }
    return out;
}

/* Python's repr of {name: {values}} as Celery's defaultdict(set) prints it. */
static int repr_stamp_sets(const cJSON *m, struct buf *b)
{
    const cJSON *n, *v;
    int rc = buf_puts(b, "defaultdict(<class 'set'>, {");
    cJSON_ArrayForEach(n, m)
    {
        cJSON key;
        memset(&key, 0, sizeof(key));
        key.type = cJSON_String;
        key.valuestring = n->string;
        if (!rc && n != m->child)
            rc = buf_puts(b, ", ");
        if (!rc)
            rc = py_repr(&key, b, 0);
        if (!rc)
            rc = buf_puts(b, ": {");
        cJSON_ArrayForEach(v, n)
        {
            if (!rc && v != n->child)
                rc = buf_puts(b, ", ");
            if (!rc)
                rc = py_repr(v, b, 0);
        }
        if (!rc)
            rc = buf_putc(b, '}');
    }
    if (!rc)
        rc = buf_puts(b, "})");
    return rc;
}

/* Celery 5.3+: revoke every task stamped with one of these values. Stamps are
 * kept in memory (bounded), as Celery keeps them; nothing is stored in the
 * result backend until a stamped task arrives or would start. */
static int cmd_revoke_by_stamped_headers(struct pidbox *pb, const cJSON *args,
                                         cJSON **reply)
{
    const struct worker_ctx *w = pb->w;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(args, "headers");
    cJSON *headers, *terminated = NULL;
    int terminate = 0, bad, rc;
    struct buf b, r;

    if (!h)
        return missing("revoke_by_stamped_headers", "headers", reply);
    headers = stamp_headers_arg(h, &bad);
    if (!headers)
        return bad ? bad_type("revoke_by_stamped_headers", "headers", reply) : CR_ENOMEM;
    pidbox_arg_bool(args, "terminate", &terminate);
    if (terminate && !(terminated = cJSON_CreateObject())) {
        cJSON_Delete(headers);
        return CR_ENOMEM;
    }
    rc = engine_revoke_stamps(w->engine, worker_ctx_now(w), headers, terminate,
                              terminated);
    if (rc == CR_ETOOBIG)
        LOG(LOG_WARNING,
            "revoke_by_stamped_headers: over %d revoked stamps kept; "
            "the newest were not added",
            REVOKED_STAMPS_MAX);
    buf_init(&b);
    buf_init(&r);
    rc = rc == CR_ENOMEM ? rc : py_repr(headers, &r, 0);
    if (!rc && !terminate)
        rc = buf_printf(&b, "headers %s flagged as revoked, but not terminated", r.data);
    else if (!rc && !terminated->child)
        rc = buf_printf(&b, "headers %s were not terminated", r.data);
    else if (!rc) {
        buf_reset(&r);
        rc = repr_stamp_sets(terminated, &r);
        if (!rc)
            rc = buf_printf(&b, "headers %s revoked", r.data);
    }
    if (!rc) {
        LOG(LOG_INFO, "Tasks flagged as revoked by stamp: %s", r.data);
        rc = ok_reply(b.data, reply);
    }
    buf_release(&b);
    buf_release(&r);
    cJSON_Delete(headers);
    cJSON_Delete(terminated);
    return rc;
}

static int cmd_revoke(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    int terminate = 0;
    pidbox_arg_bool(args, "terminate", &terminate);
    return do_revoke(pb, args, terminate, "revoke", reply);
}

static int cmd_terminate(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    return do_revoke(pb, args, 1, "terminate", reply);
}

static int cmd_enable_events(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)args;
    return ok_reply(events_set_enabled(pb->w->events, 1) ? "task events enabled"
                                                         : "task events already enabled",
                    reply);
}

static int cmd_disable_events(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)args;
    return ok_reply(events_set_enabled(pb->w->events, 0) ? "task events disabled"
                                                         : "task events already disabled",
                    reply);
}

static int cmd_heartbeat(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)args;
    LOG(LOG_DEBUG, "Heartbeat requested by remote.");
    events_heartbeat_now(pb->w->events);
    *reply = NULL;
    return 0;
}

static int cmd_rate_limit(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const char *task = NULL, *rate = NULL;
    const cJSON *rv = cJSON_GetObjectItemCaseSensitive(args, "rate_limit");
    char num[64];
    int rc;

    if (pidbox_arg_str(args, "task_name", &task) != 1)
        return missing("rate_limit", "task_name", reply);
    if (!rv)
        return missing("rate_limit", "rate_limit", reply);
    if (cJSON_IsString(rv)) {
        rate = rv->valuestring;
    } else if (cJSON_IsNumber(rv)) {
        snprintf(num, sizeof(num), "%g", rv->valuedouble);
        rate = num;
    } else if (!cJSON_IsNull(rv)) {
        return bad_type("rate_limit", "rate_limit", reply);
    }
    rc = engine_set_rate_limit(pb->w->engine, worker_ctx_now(pb->w), task, rate);
    if (rc == CR_ENOTFOUND)
        return error_reply("unknown task", reply);
    if (rc == CR_EINVAL) {
        char msg[160];
        struct buf b;
        buf_init(&b);
        snprintf(msg, sizeof(msg), "invalid rate limit '%s'", rate ? rate : "");
        rc = buf_puts(&b, "Invalid rate limit string: ");
        if (!rc) {
            cJSON *s = cJSON_CreateString(msg);
            /* Python prints the ValueError's repr */
            rc = s ? buf_puts(&b, "ValueError(") : CR_ENOMEM;
            if (!rc)
                rc = py_repr(s, &b, 0);
            if (!rc)
                rc = buf_putc(&b, ')');
            cJSON_Delete(s);
        }
        if (!rc)
            rc = error_reply(b.data, reply);
        buf_release(&b);
        return rc;
    }
    if (rc)
        return rc;
    if (!rate || !*rate || ratelimit_parse(rate) == 0) {
        LOG(LOG_INFO, "Rate limits disabled for tasks of type %s", task);
        return ok_reply("rate limit disabled successfully", reply);
    }
    LOG(LOG_INFO, "New rate limit for tasks of type %s: %s.", task, rate);
    return ok_reply("new rate limit set successfully", reply);
}

static int cmd_time_limit(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const char *task = NULL;
    double soft = 0, hard = 0;
    int rc;
    pidbox_arg_str(args, "task_name", &task);
    if (pidbox_arg_num(args, "soft", &soft) < 0)
        return bad_type("time_limit", "soft", reply);
    if (pidbox_arg_num(args, "hard", &hard) < 0)
        return bad_type("time_limit", "hard", reply);
    rc = task ? engine_set_time_limit(pb->w->engine, task, soft, hard) : CR_ENOTFOUND;
    if (rc == CR_ENOTFOUND)
        return error_reply("unknown task", reply);
    if (rc)
        return rc;
    LOG(LOG_INFO, "New time limits for tasks of type %s: soft=%g hard=%g", task, soft,
        hard);
    return ok_reply("time limits set successfully", reply);
}

static int pool_n(const cJSON *args, int *n)
{
    double d = 1;
    if (pidbox_arg_num(args, "n", &d) < 0 || d < 0 || d > CONFIG_MAX_CONCURRENCY)
        return CR_EINVAL;
    *n = (int)d;
    return 0;
}

static int cmd_pool_grow(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    int n, room;
    char text[80];
    if (pool_n(args, &n))
        return bad_type("pool_grow", "n", reply);
    /* Both terms are at most CONFIG_MAX_CONCURRENCY, so repeated grows can
     * neither overflow the count nor, through it, the prefetch window. */
    room = CONFIG_MAX_CONCURRENCY - concurrency(pb);
    if (n > 0 && room <= 0) {
        LOG(LOG_WARNING, "Concurrency stays %d, its maximum (pool_grow by %d)",
            concurrency(pb), n);
        snprintf(text, sizeof(text), "pool is at its maximum of %d",
                 CONFIG_MAX_CONCURRENCY);
        return error_reply(text, reply);
    }
    engine_set_concurrency(pb->w->engine, worker_ctx_now(pb->w),
                           concurrency(pb) + (n < room ? n : room));
    if (n > room) {
        LOG(LOG_WARNING, "Concurrency is now %d, its maximum (pool_grow by %d)",
            concurrency(pb), n);
        snprintf(text, sizeof(text), "pool will grow to its maximum of %d",
                 CONFIG_MAX_CONCURRENCY);
        return ok_reply(text, reply);
    }
    LOG(LOG_INFO, "Concurrency is now %d (pool_grow)", concurrency(pb));
    return ok_reply("pool will grow", reply);
}

static int cmd_pool_shrink(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    int n;
    if (pool_n(args, &n))
        return bad_type("pool_shrink", "n", reply);
    engine_set_concurrency(pb->w->engine, worker_ctx_now(pb->w),
                           concurrency(pb) - n > 1 ? concurrency(pb) - n : 1);
    LOG(LOG_INFO, "Concurrency is now %d (pool_shrink)", concurrency(pb));
    return ok_reply("pool will shrink", reply);
}

static int cmd_autoscale(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)pb;
    (void)args;
    *reply = pidbox_error_exc("ValueError", "Autoscale not enabled");
    return *reply ? 0 : CR_ENOMEM;
}

static int cmd_pool_restart(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)pb;
    (void)args;
    *reply = pidbox_error_exc("ValueError", "Pool restarts not enabled");
    return *reply ? 0 : CR_ENOMEM;
}

static int cmd_add_consumer(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const char *queue = NULL, *exchange = NULL, *type = NULL, *key = NULL;
    struct broker_queue q;
    char text[300];
    int rc;

    if (pidbox_arg_str(args, "queue", &queue) != 1 || !*queue)
        return missing("add_consumer", "queue", reply);
    pidbox_arg_str(args, "exchange", &exchange);
    pidbox_arg_str(args, "exchange_type", &type);
    pidbox_arg_str(args, "routing_key", &key);
    /* A task queue as Celery declares one by name, unless told otherwise. */
    broker_task_queue(&q, queue);
    if (exchange && *exchange)
        q.exchange = exchange;
    if (type && *type)
        q.exchange_type = type;
    if (key && *key)
        q.routing_key = key;
    rc = broker_add_consumer(pb->w->broker, &q);
    if (rc == CR_ENOMEM)
        return rc;
    if (rc)
        return error_reply("too many queues consumed", reply);
    LOG(LOG_INFO, "Started consuming from %s", queue);
    snprintf(text, sizeof(text), "add consumer %s", queue);
    return ok_reply(text, reply);
}

static int cmd_cancel_consumer(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const char *queue = NULL;
    char text[300];
    if (pidbox_arg_str(args, "queue", &queue) != 1)
        return missing("cancel_consumer", "queue", reply);
    if (broker_cancel_consumer(pb->w->broker, queue) == 0)
        LOG(LOG_INFO, "Stopped consuming from %s", queue);
    snprintf(text, sizeof(text), "no longer consuming from %s", queue);
    return ok_reply(text, reply);
}

static int cmd_shutdown(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    const char *msg = NULL;
    pidbox_arg_str(args, "msg", &msg);
    LOG(LOG_WARNING, "%s", msg ? msg : "Got shutdown from remote");
    pb->w->request_shutdown(pb->w->owner);
    *reply = NULL;
    return NO_REPLY;
}

static int cmd_null(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)pb;
    (void)args;
    *reply = NULL;
    return 0;
}

static int cmd_unsupported(struct pidbox *pb, const cJSON *args, cJSON **reply)
{
    (void)pb;
    (void)args;
    *reply = pidbox_error_exc("NotImplementedError", "not available in celeriac");
    return *reply ? 0 : CR_ENOMEM;
}

static const struct command {
    const char *name;
    cmd_fn *fn;
} commands[] = {
    /* inspect */
    {"ping", cmd_ping},
    {"stats", cmd_stats},
    {"active", cmd_active},
    {"dump_active", cmd_active},
    {"reserved", cmd_reserved},
    {"dump_reserved", cmd_reserved},
    {"scheduled", cmd_scheduled},
    {"dump_schedule", cmd_scheduled},
    {"registered", cmd_registered},
    {"dump_tasks", cmd_registered},
    {"revoked", cmd_revoked},
    {"dump_revoked", cmd_revoked},
    {"active_queues", cmd_active_queues},
    {"query_task", cmd_query_task},
    {"conf", cmd_conf},
    {"dump_conf", cmd_conf},
    {"report", cmd_report},
    {"clock", cmd_clock},
    {"hello", cmd_hello},
    {"memsample", cmd_unsupported},
    {"memdump", cmd_unsupported},
    {"objgraph", cmd_unsupported},
    /* control */
    {"revoke", cmd_revoke},
    {"revoke_by_stamped_headers", cmd_revoke_by_stamped_headers},
    {"terminate", cmd_terminate},
    {"enable_events", cmd_enable_events},
    {"disable_events", cmd_disable_events},
    {"heartbeat", cmd_heartbeat},
    {"rate_limit", cmd_rate_limit},
    {"time_limit", cmd_time_limit},
    {"pool_grow", cmd_pool_grow},
    {"pool_shrink", cmd_pool_shrink},
    {"autoscale", cmd_autoscale},
    {"pool_restart", cmd_pool_restart},
    {"add_consumer", cmd_add_consumer},
    {"cancel_consumer", cmd_cancel_consumer},
    {"shutdown", cmd_shutdown},
    {"election", cmd_null},
};

/* ================================================================ mailbox */

static void on_reply_confirm(struct broker *b, int ok, void *privdata)
{
    (void)b;
    (void)ok;
    (void)privdata;
}

static void send_reply(struct pidbox *pb, const struct pidbox_request *rq,
                       const cJSON *reply)
{
    const struct worker_ctx *w = pb->w;
    struct outbound p;
    struct buf body;
    cJSON *headers;
    int ok;

    /* Publishing to an exchange that does not exist closes the channel: make
     * sure any reply exchange a client names exists, as kombu does. */
    if (strcmp(rq->reply_exchange, REPLY_EXCHANGE) &&
        broker_declare_exchange(w->broker, rq->reply_exchange, "direct", 0)) {
        LOG(LOG_WARNING, "pidbox: cannot declare reply exchange '%s'",
            rq->reply_exchange);
        return;
    }
    buf_init(&body);
    headers = cJSON_CreateObject();
    ok =
        headers &&
        cJSON_AddItemToObject(headers, "ticket",
                              rq->ticket ? cJSON_CreateString(rq->ticket)
                                         : cJSON_CreateNull()) &&
        cJSON_AddNumberToObject(headers, "clock", (double)events_clock_tick(w->events)) &&
        pidbox_reply_encode(w->cfg->hostname, reply, &body) == 0;
    if (ok) {
        memset(&p, 0, sizeof(p));
        p.content_type = "application/json";
        p.content_encoding = "utf-8";
        p.delivery_mode = 1;
        p.priority = -1;
        p.headers = headers;
        p.exchange = rq->reply_exchange;
        p.routing_key = rq->reply_routing_key;
        p.body = body.data;
        p.body_len = body.len;
        if (broker_publish(w->broker, &p, on_reply_confirm, NULL))
            LOG(LOG_WARNING, "pidbox: cannot send the reply to %s", rq->method);
    } else {
        LOG(LOG_ERROR, "pidbox: out of memory replying to %s", rq->method);
    }
    cJSON_Delete(headers);
    buf_release(&body);
}

void pidbox_on_message(struct pidbox *pb, struct delivery *m)
{
    struct pidbox_request rq;
    struct cr_err err;
    const struct command *cmd = NULL;
    cJSON *reply = NULL;
    const cJSON *clock;
    int rc;

    if (!pb) {
        delivery_free(m);
        return;
    }
    memset(&err, 0, sizeof(err));
    rc = pidbox_request_parse(m->body, m->body_len, &rq, &err);
    if (rc) {
        /* Logged once: a broken client must not flood the log. */
        if (pb->bad_messages++ == 0)
            LOG(LOG_WARNING, "pidbox: ignoring a bad control message: %s", err.msg);
        goto out;
    }
    rc = pidbox_match(pb->matcher, &rq, pb->w->cfg->hostname, &err);
    if (rc < 0) {
        /* Not for us, as in kombu; logged once, since anyone who can publish
         * to the broker can send these, and as often as they like. */
        if (pb->bad_patterns++ == 0)
            LOG(LOG_WARNING, "pidbox: %s for no node, its pattern matches nothing: %s",
                rq.method, err.msg);
        goto out;
    }
    if (rc == 0)
        goto out;
    clock = m->headers ? cJSON_GetObjectItemCaseSensitive(m->headers, "clock") : NULL;
    if (cJSON_IsNumber(clock) && clock->valuedouble > 0)
        events_clock_adjust(pb->w->events, (unsigned long)clock->valuedouble);
    else
        events_clock_tick(pb->w->events);
    LOG(LOG_DEBUG, "pidbox received method %s [reply_to:%s ticket:%s]", rq.method,
        rq.reply_routing_key ? rq.reply_routing_key : "None",
        rq.ticket ? rq.ticket : "None");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, rq.method))
            cmd = &commands[i];
    if (!cmd) {
        reply = pidbox_error_exc("KeyError", rq.method);
        rc = reply ? 0 : CR_ENOMEM;
    } else {
        rc = cmd->fn(pb, rq.arguments, &reply);
    }
    if (rc == CR_ENOMEM) {
        cJSON_Delete(reply);
        reply = pidbox_error_exc("MemoryError", NULL);
        rc = 0;
    }
    if (rc == 0 && rq.reply_exchange)
        send_reply(pb, &rq, reply);
    cJSON_Delete(reply);
out:
    pidbox_request_release(&rq);
    delivery_free(m);
}

int pidbox_owns(const struct pidbox *pb, const struct delivery *m)
{
    (void)pb;
    return m->no_ack;
}

struct pidbox *pidbox_new(const struct worker_ctx *w)
{
    struct pidbox *pb = cr_calloc(1, sizeof(*pb));
    struct broker_queue q;
    struct buf name;
    cJSON *args = NULL;

    if (!pb)
        return NULL;
    pb->w = w;
    buf_init(&name);
    pb->matcher = pidbox_matcher_new();
    if (!pb->matcher)
        goto oom;
    if (buf_printf(&name, "%s.celery.pidbox", w->cfg->hostname))
        goto oom;
    pb->queue = buf_detach(&name);
    args = cJSON_CreateObject();
    if (!pb->queue || !args ||
        !cJSON_AddNumberToObject(args, "x-expires", MAILBOX_EXPIRES_MS) ||
        !cJSON_AddNumberToObject(args, "x-message-ttl", MAILBOX_TTL_MS))
        goto oom;
    if (w->cfg->statedb && w->cfg->statedb[0]) {
        pb->db = statedb_new(w, w->cfg->statedb);
        if (!pb->db)
            goto oom;
    }
    if (broker_declare_exchange(w->broker, REPLY_EXCHANGE, "direct", 0))
        goto oom;
    memset(&q, 0, sizeof(q));
    q.name = pb->queue;
    q.exchange = MAILBOX_EXCHANGE;
    q.exchange_type = "fanout";
    q.exchange_durable = 0;
    q.routing_key = "";
    /* Exclusive, as Celery 5.7's kombu declares it: RabbitMQ 4.3 refuses a
     * transient queue that is not exclusive, and a mailbox is one
     * connection's anyway. */
    q.exclusive = 1;
    q.auto_delete = 1;
    q.arguments = args;
    q.no_ack = 1;
    if (broker_add_consumer(w->broker, &q))
        goto oom;
    cJSON_Delete(args);
    return pb;
oom:
    LOG(LOG_ERROR, "pidbox: out of memory; remote control is off");
    cJSON_Delete(args);
    buf_release(&name);
    if (pb->db)
        statedb_close(pb->db);
    pidbox_matcher_free(pb->matcher);
    cr_free(pb->queue);
    cr_free(pb);
    return NULL;
}

void pidbox_free(struct pidbox *pb)
{
    if (!pb)
        return;
    statedb_close(pb->db);
    pidbox_matcher_free(pb->matcher);
    cr_free(pb->queue);
    cr_free(pb);
}
