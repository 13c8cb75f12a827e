/* health.h -- when a provider's failures are an outage worth a WARNING (no I/O).
 *
 * A retried LLM failure is logged at INFO only, so with every call to a
 * provider failing a worker at the default level (WARNING) said nothing.
 * One struct llm_health per provider follows its calls' outcomes and says
 * when a line is due: once when failures start, a reminder at most every
 * remind_ms while they last, and once at the first success after. The caller
 * writes the line. Pure: the time is an argument; no allocation, no clock.
 *
 * What counts (llm_health_kind()): only failures that blame the provider
 * rather than the request, and that the worker would retry, so that they are
 * otherwise quiet:
 *   - no answer or a cut one: a connection error, a reset, a curl timeout or
 *     one of the client's own (first byte, first token, idle);
 *   - HTTP 408, 429 (but not a quota exhausted) and 5xx (a 503 storm,
 *     Anthropic's 529);
 *   - a 2xx whose stream broke or carried a server error (overloaded).
 * A success (any complete answer) ends a run of failures. Neither counts nor
 * ends one: a permanent failure of one request (a 400, 401, 404, a quota
 * exhausted, an answer that is not the JSON asked for; its task fails and
 * logs an ERROR already), a retryable 4xx other than 408 and 429 (409), and a
 * call the worker ended itself (revoked, time limit, shutdown, out of
 * memory). Failures in a row means in the order calls ended: under a partial
 * outage where some calls still succeed, the runs stay short and nothing is
 * said (NEEDSWORK: a failure ratio over a window would catch that case). */
#ifndef CR_LLM_HEALTH_H
#define CR_LLM_HEALTH_H

#include <stdint.h>

#include "llm_types.h"

/* What one call's end says about its provider. */
enum llm_health_kind {
    LLM_HEALTH_NEUTRAL = 0, /* says nothing: the request's fault, or ours */
    LLM_HEALTH_SUCCESS = 1, /* the provider answered */
    LLM_HEALTH_FAILURE = 2, /* the provider failed (see the list above) */
};

/* Which line is due after an outcome. */
enum llm_health_say {
    LLM_HEALTH_QUIET = 0,     /* nothing to say */
    LLM_HEALTH_FAILING = 1,   /* failures have started: the first line */
    LLM_HEALTH_STILL = 2,     /* still failing: the rate-limited reminder */
    LLM_HEALTH_RECOVERED = 3, /* the first success after a FAILING line */
};

/* The rule; LLM_HEALTH_RULE_DEFAULT is what the worker uses. */
struct llm_health_rule {
    long min_failures;   /* this many failures in a row start an outage... */
    int64_t min_span_ms; /* ...or two or more spanning this long (slow timeouts) */
    int64_t remind_ms;   /* FAILING and STILL lines at least this far apart */
};

/* Three calls in a row (one timed-out call may be one bad request; three are
 * rarely a coincidence), or two 10 s apart, which catches calls that take
 * long to fail at low concurrency; a reminder at most every minute. */
#define LLM_HEALTH_RULE_DEFAULT                                                          \
    {                                                                                    \
        3, 10000, 60000                                                                  \
    }

/* One provider's state. */
struct llm_health {
    /* read-only */
    int failing;      /* 1 from a FAILING line to the RECOVERED line */
    long run;         /* failures in a row, since the last success */
    long since_line;  /* failures since the last FAILING or STILL line */
    int64_t first_ms; /* when this run's first failure came */
    int64_t line_ms;  /* when the last FAILING or STILL line was due */
    int said;         /* 1 once line_ms is set */
};

/* What the caller's line reports, filled with every outcome. */
struct llm_health_report {
    long failed;       /* failures in a row, this one included (RECOVERED: the run's) */
    long failed_since; /* STILL: failures since the previous line, this one included */
    int64_t for_ms;    /* from the run's first failure to now */
};

/* Zeroes h: no failure seen. */
void llm_health_init(struct llm_health *h);

/* Takes one call's outcome at now_ms (a monotonic clock, never going back)
 * and returns the line now due, with out filled for it. A FAILING line comes
 * when a run reaches min_failures (or min_span_ms with two failures or more)
 * and the previous FAILING or STILL line is remind_ms old or more: a provider
 * that flaps says so at most once per remind_ms. A STILL line comes with the
 * first failure remind_ms after the previous line; none comes while no call
 * ends. RECOVERED comes with the first success after a FAILING line, never
 * twice. A NEUTRAL outcome changes nothing and returns LLM_HEALTH_QUIET. */
enum llm_health_say llm_health_note(struct llm_health *h, const struct llm_health_rule *r,
                                    enum llm_health_kind kind, int64_t now_ms,
                                    struct llm_health_report *out);

/* Which kind of outcome this call's result is (see the list at the top). */
enum llm_health_kind llm_health_kind(const struct llm_result *res);

#endif
