/* worker_ctx.h -- what the worker hands its own modules (remote control,
 * events, metrics, progress): the clients, the engine and two callbacks. The
 * worker owns everything here and outlives the modules; they read the fields
 * and never write them. Through the callbacks a module asks the worker for
 * something without including worker.c's face, so no include runs in a circle.
 * Loop thread only. */
#ifndef CR_WORKER_CTX_H
#define CR_WORKER_CTX_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <uv.h>

#include "config.h"
#include "engine/engine.h"
#include "net/broker.h"
#include "net/backend.h"
#include "util/clock.h"
#include "util/redact.h"

struct events;
struct otlp_exporter;
struct fleet_limits;

struct worker_ctx {
    /* read-only */
    const struct config *cfg;
    uv_loop_t *loop;
    struct broker *broker;
    struct backend *backend;
    struct engine *engine;
    const struct broker_config *bcfg;
    const struct redact *secrets; /* config_secrets(): cut out of what is shown */
    struct events *events;        /* NULL until made, and once freed */
    struct otlp_exporter *otlp;   /* NULL unless tracing is on */
    struct fleet_limits *limits;  /* the providers' shared limits (NULL: none) */
    uint64_t started_ms;          /* loop time at start */
    int64_t started_epoch_us;
    /* Warm shutdown, as SIGTERM. */
    void (*request_shutdown)(void *owner);
    /* Text generated so far by a running job, or "" (borrowed). */
    const char *(*job_text)(const struct job *j);
    void *owner;
};

/* The time now, for calls into the engine. */
static inline struct engine_now worker_ctx_now(const struct worker_ctx *wc)
{
    struct engine_now n;
    n.loop_ms = uv_now(wc->loop);
    n.epoch_us = clock_epoch_us();
    return n;
}

/* Copies url into out (size bytes) with every configured secret cut out, to
 * be shown (banner, inspect conf and report); returns out. */
static inline const char *worker_ctx_shown_url(const struct worker_ctx *wc,
                                               const char *url, char *out, size_t size)
{
    snprintf(out, size, "%s", url);
    redact_str(wc->secrets, out);
    return out;
}

#endif
