/* health.c -- when a provider's failures are an outage worth a WARNING (see health.h). */
#include "health.h"

#include <string.h>

#include "util/err.h"

void llm_health_init(struct llm_health *h)
{
    memset(h, 0, sizeof(*h));
}

/* Whether a FAILING or STILL line may come now: the one before it is
 * remind_ms old, or there was none. */
static int may_say(const struct llm_health *h, const struct llm_health_rule *r,
                   int64_t now_ms)
{
    return !h->said || now_ms - h->line_ms >= r->remind_ms;
}

static enum llm_health_say said(struct llm_health *h, enum llm_health_say say,
                                int64_t now_ms)
{
    h->said = 1;
    h->line_ms = now_ms;
    h->since_line = 0;
    return say;
}

enum llm_health_say llm_health_note(struct llm_health *h, const struct llm_health_rule *r,
                                    enum llm_health_kind kind, int64_t now_ms,
                                    struct llm_health_report *out)
{
    memset(out, 0, sizeof(*out));
    if (kind == LLM_HEALTH_SUCCESS) {
        int was_failing = h->failing;
        out->failed = h->run;
        out->for_ms = h->run ? now_ms - h->first_ms : 0;
        /* The last line's time stays: it rate-limits the next outage's. */
        h->failing = 0;
        h->run = 0;
        h->since_line = 0;
        return was_failing ? LLM_HEALTH_RECOVERED : LLM_HEALTH_QUIET;
    }
    if (kind != LLM_HEALTH_FAILURE)
        return LLM_HEALTH_QUIET;
    if (h->run++ == 0)
        h->first_ms = now_ms;
    h->since_line++;
    out->failed = h->run;
    out->failed_since = h->since_line;
    out->for_ms = now_ms - h->first_ms;
    if (h->failing)
        return may_say(h, r, now_ms) ? said(h, LLM_HEALTH_STILL, now_ms)
                                     : LLM_HEALTH_QUIET;
    if ((h->run >= r->min_failures || (h->run >= 2 && out->for_ms >= r->min_span_ms)) &&
        may_say(h, r, now_ms)) {
        h->failing = 1;
        return said(h, LLM_HEALTH_FAILING, now_ms);
    }
    return LLM_HEALTH_QUIET;
}

enum llm_health_kind llm_health_kind(const struct llm_result *res)
{
    long st = res->http_status;

    if (res->verdict == LLM_OK)
        return LLM_HEALTH_SUCCESS;
    /* A permanent failure fails its task and logs an ERROR already; the
     * worker's own ends (revoke, time limit, shutdown) and faults say
     * nothing about the provider, nor does a call sent to its fallback
     * unsent because the provider cooled its target (the 429 counted). */
    if (res->verdict != LLM_RETRYABLE || res->code == CR_ECANCELED ||
        res->code == CR_ENOMEM || res->code == CR_ECOOLED)
        return LLM_HEALTH_NEUTRAL;
    /* Timeouts and transport failures, whatever status came before the cut;
     * then the statuses that are the server's (no status at all, or a 2xx,
     * is an exchange or a stream that broke). A retryable 409 or a 4xx with
     * x-should-retry is about the request. */
    if (res->code == CR_ETIMEDOUT || res->curl_code != 0)
        return LLM_HEALTH_FAILURE;
    if (st == 408 || st == 429 || st >= 500 || st < 300)
        return LLM_HEALTH_FAILURE;
    return LLM_HEALTH_NEUTRAL;
}
