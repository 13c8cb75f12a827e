/* grants.h -- a worker's local stock of request grants for one fleet-wide
 * rpm limit, as pure code with the time passed in (any monotonic ms).
 *
 * When the shared state lets one call through and the limit is fast enough
 * that a round trip per call matters, it may charge up to k more request
 * slots at once, the next ones of its GCRA (grants_fit()); the worker keeps
 * them here and serves its next calls from them without asking. Each slot
 * has its time: a slot the shared state would have let through only later
 * (the limit's burst spent) waits for it here, and lapses GRANTS_LIFE_MS
 * after it, used or not. So each slot goes out within GRANTS_LIFE_MS of when
 * it could have gone with a burst GRANTS_LIFE_MS shorter: never faster than
 * the limit. A cooling drops them all. Only the request part of a limit is
 * prepaid: tokens vary per call and permits are leases named after their
 * call, so a limit with tpm or concurrency keeps asking once per call
 * (grants_apply()). */
#ifndef CR_LLM_GRANTS_H
#define CR_LLM_GRANTS_H

#include <stdint.h>

#define GRANTS_MAX 8       /* extra slots one answer may carry */
#define GRANTS_MIN_RPM 600 /* below this a round trip per call is cheap enough */
#define GRANTS_SPAN_MS 100 /* at most what the limit yields in this time */
#define GRANTS_LIFE_MS 150 /* a slot unused this long after its time lapses */

struct grant {
    int64_t from_ms, until_ms; /* usable from, lapsed at */
};

struct grants {
    struct grant g[GRANTS_MAX]; /* by time */
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
 * while slots are held; else at most what rpm yields in GRANTS_SPAN_MS,
 * GRANTS_MAX, and the calls that asked in the last window less this one (a
 * worker with one call now and then prepays nothing, so no slot of its
 * lapses unused). */
int grants_batch(const struct grants *g, double rpm, int64_t now_ms);

/* The shared side: how many of k extra slots to charge after a call that
 * left the GCRA's tat at tat_after (ms, the shared clock's now_ms), with
 * burst_ms as the shared check uses it. The j-th (1..) is due at
 * *first_ms + (j - 1) * 60000 / rpm from now (*first_ms may be negative:
 * due at once): when a call could go with a burst life_ms shorter. Only the
 * slots due within life_ms + GRANTS_SPAN_MS are charged. */
int grants_fit(double tat_after, int64_t now_ms, double rpm, int64_t burst_ms,
               int64_t life_ms, int k, int64_t *first_ms);

/* n extra slots came, the first due first_ms (grants_fit()) after the
 * question left at sent_ms and its answer came at now_ms: each usable from
 * its due time counted from now_ms and lapsing GRANTS_LIFE_MS after it
 * counted from sent_ms (the shared clock's now lies between). As many as
 * fit are held. */
void grants_put(struct grants *g, int n, int64_t first_ms, double rpm, int64_t sent_ms,
                int64_t now_ms);

/* Serves one call from the stock: 1 if a slot is usable now (taken); else
 * 0, and *wait_ms is the time until the next held slot is usable, or 0 when
 * none is held (ask the shared state). */
int grants_take(struct grants *g, int64_t now_ms, int64_t *wait_ms);

/* Slots held and not lapsed at now. */
int grants_held(const struct grants *g, int64_t now_ms);

/* A cooling: every slot held is dropped. */
void grants_drop(struct grants *g);

#endif
