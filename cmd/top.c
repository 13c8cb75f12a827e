/* top.c -- `celeriac top`: a live terminal view of one or more workers.
 *
 * Scrapes each worker's /metrics endpoint (--metrics-port) and shows, per
 * worker, slots in use, prefetched tasks, throughput, tokens per second and
 * errors, per consumed queue its depth and consumers, and per shared
 * provider limit its use across the fleet (the last minute's calls and
 * tokens, permits in flight, waits and coolings). Rates are the
 * difference between two scrapes over the time between them. A command-line
 * tool, not part of the worker loop: it may block on its HTTP requests
 * (bounded by a 2 s timeout each). */
#include <curl/curl.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "protocol/prom.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/opts.h"

#define TOP_MAX_WORKERS 32
#define TOP_MAX_QUEUES 32
#define TOP_FETCH_TIMEOUT_MS 2000
#define TOP_MAX_BODY (8 * 1024 * 1024)

struct top_queue {
    char name[128];
    double messages, consumers;
};

#define TOP_MAX_LIMITS 32

/* One shared limit (provider, model): the fleet's figures, the same from
 * every worker that has met it. */
struct top_limit {
    char name[192]; /* provider/model */
    double rpm, tpm, concurrency;
    double shared, granted, waited, wait_s, coolings, cooled_until, in_flight;
    double req_min, tok_min;
};

/* What one scrape of one worker says. */
struct top_sample {
    int up; /* the endpoint answered */
    char hostname[128];
    double t; /* monotonic seconds of the scrape */
    double active, prefetched, concurrency, uptime;
    double ok, failed, revoked, retries, received;
    double tokens_out, llm_errors;
    double broker_up, backend_up;
    int nqueues;
    struct top_queue queues[TOP_MAX_QUEUES];
    int nlimits;
    struct top_limit limits[TOP_MAX_LIMITS];
};

struct top_worker {
    char *url;
    struct top_sample prev, cur; /* prev.up is 0 before a second scrape */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t on_body(char *data, size_t size, size_t n, void *userp)
{
    struct buf *b = userp;
    return buf_append(b, data, size * n) ? 0 : size * n;
}

static int fetch(const char *url, struct buf *out)
{
    CURL *c = curl_easy_init();
    long code = 0;
    CURLcode rc;
    if (!c)
        return -1;
    out->max_bytes = TOP_MAX_BODY;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)TOP_FETCH_TIMEOUT_MS);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    return rc == CURLE_OK && code == 200 ? 0 : -1;
}

static struct top_queue *queue_of(struct top_sample *s, const char *name)
{
    for (int i = 0; i < s->nqueues; i++)
        if (!strcmp(s->queues[i].name, name))
            return &s->queues[i];
    if (s->nqueues == TOP_MAX_QUEUES)
        return NULL;
    memset(&s->queues[s->nqueues], 0, sizeof(s->queues[0]));
    snprintf(s->queues[s->nqueues].name, sizeof(s->queues[0].name), "%s", name);
    return &s->queues[s->nqueues++];
}

static struct top_limit *limit_of(struct top_sample *s, const struct prom_sample *p)
{
    const char *provider = prom_sample_label(p, "provider");
    const char *model = prom_sample_label(p, "model");
    char name[sizeof(s->limits[0].name)];
    if (!provider || !model)
        return NULL;
    snprintf(name, sizeof(name), "%s/%s", provider, model);
    for (int i = 0; i < s->nlimits; i++)
        if (!strcmp(s->limits[i].name, name))
            return &s->limits[i];
    if (s->nlimits == TOP_MAX_LIMITS)
        return NULL;
    memset(&s->limits[s->nlimits], 0, sizeof(s->limits[0]));
    memcpy(s->limits[s->nlimits].name, name, sizeof(name));
    return &s->limits[s->nlimits++];
}

/* A celeriac_limit_* sample; 1 when it was one. */
static int take_limit(struct top_sample *s, const struct prom_sample *p)
{
    static const struct {
        const char *name;
        size_t off;
    } fields[] = {
        {"celeriac_limit_shared", offsetof(struct top_limit, shared)},
        {"celeriac_limit_calls_granted_total", offsetof(struct top_limit, granted)},
        {"celeriac_limit_calls_waited_total", offsetof(struct top_limit, waited)},
        {"celeriac_limit_wait_seconds_total", offsetof(struct top_limit, wait_s)},
        {"celeriac_limit_coolings_total", offsetof(struct top_limit, coolings)},
        {"celeriac_limit_cooled_until_seconds", offsetof(struct top_limit, cooled_until)},
        {"celeriac_limit_in_flight", offsetof(struct top_limit, in_flight)},
        {"celeriac_limit_requests_last_minute", offsetof(struct top_limit, req_min)},
        {"celeriac_limit_tokens_last_minute", offsetof(struct top_limit, tok_min)},
    };
    struct top_limit *l;
    const char *kind;
    if (strncmp(p->name, "celeriac_limit_", 15) || !(l = limit_of(s, p)))
        return 0;
    if (!strcmp(p->name, "celeriac_limit_max") && (kind = prom_sample_label(p, "kind"))) {
        if (!strcmp(kind, "rpm"))
            l->rpm = p->value;
        else if (!strcmp(kind, "tpm"))
            l->tpm = p->value;
        else if (!strcmp(kind, "concurrency"))
            l->concurrency = p->value;
        return 1;
    }
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if (!strcmp(p->name, fields[i].name)) {
            *(double *)((char *)l + fields[i].off) = p->value;
            break;
        }
    return 1;
}

static void take(struct top_sample *s, const struct prom_sample *p)
{
    const char *state = prom_sample_label(p, "state");
    const char *q = prom_sample_label(p, "queue");
    struct top_queue *tq;
    if (take_limit(s, p))
        return;
    if (!strcmp(p->name, "celeriac_worker_info") && prom_sample_label(p, "hostname"))
        snprintf(s->hostname, sizeof(s->hostname), "%s",
                 prom_sample_label(p, "hostname"));
    else if (!strcmp(p->name, "celeriac_tasks_in_flight"))
        s->active = p->value;
    else if (!strcmp(p->name, "celeriac_tasks_prefetched"))
        s->prefetched = p->value;
    else if (!strcmp(p->name, "celeriac_concurrency"))
        s->concurrency = p->value;
    else if (!strcmp(p->name, "celeriac_uptime_seconds"))
        s->uptime = p->value;
    else if (!strcmp(p->name, "celeriac_tasks_received_total"))
        s->received += p->value;
    else if (!strcmp(p->name, "celeriac_tasks_total") && state) {
        if (!strcmp(state, "SUCCESS"))
            s->ok += p->value;
        else if (!strcmp(state, "REVOKED"))
            s->revoked += p->value;
        else
            s->failed += p->value;
    } else if (!strcmp(p->name, "celeriac_task_retries_total"))
        s->retries += p->value;
    else if (!strcmp(p->name, "celeriac_llm_completion_tokens_total"))
        s->tokens_out += p->value;
    else if (!strcmp(p->name, "celeriac_llm_errors_total"))
        s->llm_errors += p->value;
    else if (!strcmp(p->name, "celeriac_broker_connected"))
        s->broker_up = p->value;
    else if (!strcmp(p->name, "celeriac_backend_connected"))
        s->backend_up = p->value;
    else if (!strcmp(p->name, "celeriac_queue_messages") && q && (tq = queue_of(s, q)))
        tq->messages = p->value;
    else if (!strcmp(p->name, "celeriac_queue_consumers") && q && (tq = queue_of(s, q)))
        tq->consumers = p->value;
}

static void scrape(struct top_worker *w)
{
    struct top_sample *s = &w->cur;
    struct buf body;
    memset(s, 0, sizeof(*s));
    buf_init(&body);
    s->t = mono_s();
    if (fetch(w->url, &body) == 0 && body.data) {
        const char *p = body.data, *end = body.data + body.len;
        s->up = 1;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            struct prom_sample ps;
            if (prom_parse_line(p, n, &ps) == 1)
                take(s, &ps);
            p += n + 1;
        }
    }
    buf_release(&body);
}

static void rate(char *out, size_t size, const struct top_worker *w, double now,
                 double before)
{
    double dt = w->cur.t - w->prev.t;
    if (!w->prev.up || !w->cur.up || dt <= 0 || now < before)
        snprintf(out, size, "-");
    else
        snprintf(out, size, "%.1f", (now - before) / dt);
}

/* "used/limit", or "used" when there is no such limit. */
static void use_of(char *out, size_t size, double used, double max)
{
    if (max > 0)
        snprintf(out, size, "%.0f/%.0f", used, max);
    else
        snprintf(out, size, "%.0f", used);
}

/* How far a worker's reading of a limit has got: its counters only grow,
 * so the larger sum is the later read. */
static double progress_of(const struct top_limit *l)
{
    return l->granted + l->waited + l->coolings;
}

/* The shared limits, fleet-wide: each once, as the worker that read it last
 * shows it (every worker reads the same figures, each once a second). */
static void render_limits(FILE *out, struct top_worker *ws, int n)
{
    const struct top_limit *seen[TOP_MAX_LIMITS];
    int nseen = 0;
    double now = (double)time(NULL);
    for (int i = 0; i < n; i++) {
        const struct top_sample *s = &ws[i].cur;
        for (int k = 0; s->up && k < s->nlimits; k++) {
            const struct top_limit *l = &s->limits[k];
            int j;
            for (j = 0; j < nseen && strcmp(seen[j]->name, l->name); j++)
                ;
            if (j < nseen && progress_of(l) > progress_of(seen[j]))
                seen[j] = l;
            else if (j == nseen && nseen < TOP_MAX_LIMITS)
                seen[nseen++] = l;
        }
    }
    if (nseen)
        fprintf(out, "\n%-28s %-6s %13s %17s %9s %8s %7s %8s %8s %s\n", "LIMIT (fleet)",
                "STATE", "RPM (1 MIN)", "TPM (1 MIN)", "IN-FLIGHT", "GRANTED", "WAITED",
                "AVG-WAIT", "COOLINGS", "COOLED");
    for (int k = 0; k < nseen; k++) {
        const struct top_limit *l = seen[k];
        char rpm[40], tpm[40], conc[40], wait[24], cooled[24];
        use_of(rpm, sizeof(rpm), l->req_min, l->rpm);
        use_of(tpm, sizeof(tpm), l->tok_min, l->tpm);
        use_of(conc, sizeof(conc), l->in_flight, l->concurrency);
        if (l->waited > 0)
            snprintf(wait, sizeof(wait), "%.2fs", l->wait_s / l->waited);
        else
            snprintf(wait, sizeof(wait), "-");
        if (l->cooled_until > now)
            snprintf(cooled, sizeof(cooled), "%.1fs left", l->cooled_until - now);
        else if (l->cooled_until > 0)
            snprintf(cooled, sizeof(cooled), "ending");
        else
            snprintf(cooled, sizeof(cooled), "-");
        fprintf(out, "%-28.28s %-6s %13s %17s %9s %8.0f %7.0f %8s %8.0f %s\n", l->name,
                l->shared ? "shared" : "ALONE", rpm, tpm, conc, l->granted, l->waited,
                wait, l->coolings, cooled);
    }
}

static void render(FILE *out, struct top_worker *ws, int n, double interval, int clear)
{
    char when[32];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
    if (clear)
        fputs("\033[H\033[2J", out);
    fprintf(out, "celeriac top - %d worker%s - %s (every %.1fs)\n\n", n,
            n == 1 ? "" : "s", when, interval);
    fprintf(out, "%-28s %-6s %-9s %8s %8s %8s %9s %8s %8s %8s %8s\n", "WORKER", "STATE",
            "SLOTS", "PREFETCH", "TASKS/S", "TOKENS/S", "SUCCEEDED", "FAILED", "REVOKED",
            "RETRIES", "LLM-ERR");
    for (int i = 0; i < n; i++) {
        struct top_worker *w = &ws[i];
        const struct top_sample *s = &w->cur;
        char slots[32], tps[32], tok[32];
        const char *state = !s->up                            ? "DOWN"
                            : !s->broker_up || !s->backend_up ? "DEGR"
                                                              : "up";
        if (!s->up) {
            fprintf(out, "%-28.28s %-6s (%s unreachable)\n", w->url, state, w->url);
            continue;
        }
        snprintf(slots, sizeof(slots), "%.0f/%.0f", s->active, s->concurrency);
        rate(tps, sizeof(tps), w, s->ok + s->failed + s->revoked,
             w->prev.ok + w->prev.failed + w->prev.revoked);
        rate(tok, sizeof(tok), w, s->tokens_out, w->prev.tokens_out);
        fprintf(out, "%-28.28s %-6s %-9s %8.0f %8s %8s %9.0f %8.0f %8.0f %8.0f %8.0f\n",
                s->hostname[0] ? s->hostname : w->url, state, slots, s->prefetched, tps,
                tok, s->ok, s->failed, s->revoked, s->retries, s->llm_errors);
    }
    fprintf(out, "\n%-28s %10s %10s  %s\n", "QUEUE", "DEPTH", "CONSUMERS", "SEEN BY");
    for (int i = 0; i < n; i++) {
        const struct top_sample *s = &ws[i].cur;
        for (int k = 0; s->up && k < s->nqueues; k++)
            fprintf(out, "%-28.28s %10.0f %10.0f  %s\n", s->queues[k].name,
                    s->queues[k].messages, s->queues[k].consumers,
                    s->hostname[0] ? s->hostname : ws[i].url);
    }
    render_limits(out, ws, n);
    fflush(out);
}

struct top_opts {
    char *interval; /* checked here, for top's own messages */
    char *iterations;
    int once;
};

#define OFF(f) offsetof(struct top_opts, f)

static const struct opt opts[] = {
    {"interval", 'i', NULL, OPTS_STR, OFF(interval), NULL, 0, 0,
     "seconds between refreshes (default 2)", "S"},
    {"iterations", 'n', NULL, OPTS_STR, OFF(iterations), NULL, 0, 0,
     "stop after N refreshes (default: until interrupted)", "N"},
    {"once", 0, NULL, OPTS_FLAG, OFF(once), NULL, 0, 0,
     "one refresh, rates measured over one interval"},
};

/* URLs may come before or after the options (OPTS_PERMUTE). */
static const struct opts_spec spec = {
    .opts = opts,
    .n = sizeof(opts) / sizeof(opts[0]),
    .head = "usage: celeriac top [options] URL...\n\n"
            "Live view of celeriac workers, read from their metrics endpoints\n"
            "(start workers with --metrics-port). URL is http://host:port[/metrics]\n"
            "or host:port.\n\n",
    .width = 20,
    .help_line = "this text",
    .bad_option = "unknown option '%s'",
    .flags = OPTS_PERMUTE,
};

static char *metrics_url(const char *arg)
{
    struct buf b;
    const char *rest;
    buf_init(&b);
    if (strncmp(arg, "http://", 7) && strncmp(arg, "https://", 8) &&
        buf_puts(&b, "http://"))
        goto oom;
    if (buf_puts(&b, arg))
        goto oom;
    rest = strstr(b.data, "://") + 3;
    if (!strchr(rest, '/') && buf_puts(&b, "/metrics"))
        goto oom;
    return buf_detach(&b);
oom:
    buf_release(&b);
    return NULL;
}

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

int cmd_top(int argc, char **argv)
{
    struct top_worker ws[TOP_MAX_WORKERS];
    struct top_opts o;
    struct cr_err err;
    char **args;
    double interval = 2.0;
    long iterations = -1;
    int n = 0, nargs = 0, once, rc;

    memset(ws, 0, sizeof(ws));
    memset(&o, 0, sizeof(o));
    memset(&err, 0, sizeof(err));
    args = cr_calloc((size_t)argc + 1, sizeof(*args));
    if (!args) {
        fprintf(stderr, "celeriac top: out of memory\n");
        return 1;
    }
    rc = opts_parse(&spec, &o, argc, argv, NULL, args, &nargs, &err);
    if (rc) {
        if (rc != 1)
            fprintf(stderr, "celeriac top: %s\n", err.msg);
        rc = rc == 1 ? 0 : rc == CR_ENOMEM ? 1 : 2;
        goto out;
    }
    once = o.once;
    rc = 2;
    if (o.interval) {
        char *end;
        interval = strtod(o.interval, &end);
        if (*end || !(interval >= 0.1) || interval > 3600) {
            fprintf(stderr, "celeriac top: invalid interval '%s'\n", o.interval);
            goto out;
        }
    }
    if (o.iterations) {
        char *end;
        iterations = strtol(o.iterations, &end, 10);
        if (*end || iterations < 1) {
            fprintf(stderr, "celeriac top: invalid iterations '%s'\n", o.iterations);
            goto out;
        }
    }
    for (int i = 0; i < nargs; i++) {
        if (n == TOP_MAX_WORKERS) {
            fprintf(stderr, "celeriac top: at most %d workers\n", TOP_MAX_WORKERS);
            goto out;
        }
        if (!(ws[n++].url = metrics_url(args[i]))) {
            fprintf(stderr, "celeriac top: out of memory\n");
            rc = 1;
            goto out;
        }
    }
    if (n == 0) {
        opts_usage(&spec, stderr);
        goto out;
    }
    rc = 0;
    if (once) {
        /* two scrapes one interval apart, so the rates mean something */
        for (int i = 0; i < n; i++)
            scrape(&ws[i]);
        sleep_s(interval);
        iterations = 1;
    }
    for (long it = 0; iterations < 0 || it < iterations; it++) {
        for (int i = 0; i < n; i++) {
            ws[i].prev = ws[i].cur;
            scrape(&ws[i]);
        }
        render(stdout, ws, n, interval, !once && isatty(STDOUT_FILENO));
        if (iterations < 0 || it + 1 < iterations)
            sleep_s(interval);
    }
    for (int i = 0; i < n; i++)
        if (!ws[i].cur.up)
            rc = 1;
out:
    for (int i = 0; i < n; i++)
        cr_free(ws[i].url);
    opts_release(&spec, &o);
    cr_free(args);
    return rc;
}
