/* grants.h -- a worker's local stock of request grants for one fleet-wide
 * rpm limit, as pure code with the time passed in (any monotonic ms).
 *
 * When the shared state lets one call through and the limit is fast enough
 * that a round trip per call matters, it may charge up to k more request
 * slots at once (grants_fit()); the worker keeps them here and serves its
 * next calls from them without asking. Each lapses GRANTS_LIFE_MS after it
 * was charged, unused or not; a cooling drops them all. Only the request
 * part of a limit is prepaid: tokens vary per call and permits are leases
 * named after their call, so a limit with tpm or concurrency keeps asking
 * once per call (grants_apply()). */
#ifndef CR_LLM_GRANTS_H
#define CR_LLM_GRANTS_H

#include <stdint.h>

#define GRANTS_MAX 8       /* extra slots one answer may carry */
#define GRANTS_MIN_RPM 600 /* below this a round trip per call is cheap enough */
#define GRANTS_SPAN_MS 100 /* at most what the limit yields in this time */
#define GRANTS_LIFE_MS 150 /* a grant unused this long after it was charged lapses */

struct grants {
    int64_t exp[GRANTS_MAX]; /* each held grant's lapse time, ascending */
    int n;
    /* calls that asked in this window of GRANTS_LIFE_MS and the one before */
    int64_t win_ms;
    long asks_now, asks_prev;
};

/* 1 when a limit of rpm (tpm, concurrency) may be prepaid at all. */
int grants_apply(double rpm, double tpm, long concurrency);

/* Notes that a call asked for the limit at now (served or not). */
void grants_note_ask(struct grants *g, int64_t now_ms);

/* The extra slots to ask for with this call: none under GRANTS_MIN_RPM or
 * when the stock is not spent; else at most what rpm yields in
 * GRANTS_SPAN_MS, GRANTS_MAX, and the calls that asked in the last window
 * less this one (a worker with one call now and then prepays nothing, so
 * its grants do not lapse unused). */
int grants_batch(const struct grants *g, double rpm, int64_t now_ms);

/* How many of k extra slots fit the shared GCRA now: its tat after this
 * call's own charge is tat_after; burst_ms as the shared check uses it. The
 * extras must fit life_ms inside the burst, since one may go out up to
 * life_ms after it was charged. */
int grants_fit(double tat_after, int64_t now_ms, double rpm, int64_t burst_ms,
               int64_t life_ms, int k);

/* n extra slots charged at now: held until now + GRANTS_LIFE_MS (as many
 * as fit; the rest are lost). */
void grants_put(struct grants *g, int n, int64_t now_ms);

/* Serves one call from the stock: 1 if a grant not lapsed was there. */
int grants_take(struct grants *g, int64_t now_ms);

/* Grants held and not lapsed at now. */
int grants_held(const struct grants *g, int64_t now_ms);

/* A cooling: every grant held is dropped. */
void grants_drop(struct grants *g);

#endif
