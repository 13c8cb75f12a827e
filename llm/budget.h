/* budget.h -- a provider's daily spend limit across a fleet, as pure
 * bookkeeping: what this worker knows of the fleet's spend today and what it
 * spent itself that the shared count has not taken yet. No I/O, no clock:
 * the day (UTC days since the epoch) is an argument.
 *
 * The shared count is one Redis float per provider and UTC day
 * (INCRBYFLOAT by each worker with each priced answer's cost, read back
 * every few seconds). A worker calls the provider while the spend it knows
 * of (the shared total it last read, plus its own spend not counted there
 * yet) is under the budget; so the fleet overshoots by at most the calls in
 * flight when the budget is reached. While Redis is away the worker counts
 * alone, and hands its spend to the shared count when Redis is back. */
#ifndef CR_LLM_BUDGET_H
#define CR_LLM_BUDGET_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "util/err.h"

#define LLM_BUDGET_MAX_USD 1e9

struct llm_budget {
    double usd_per_day; /* 0: no budget */
    long day;           /* the UTC day the figures below are of; -1: none yet */
    double shared;      /* the fleet's spend today as last read */
    double unsent;      /* this worker's spend the shared count lacks */
    double sending;     /* handed to an increment not answered yet */
};

/* Parses a "budget" object ({"usd_per_day": X}) into b. provider names the
 * entry in messages. Returns 0 or CR_EINVAL. */
int llm_budget_parse(struct llm_budget *b, const cJSON *o, const char *provider,
                     struct cr_err *err);

/* The UTC day of a time in ms since the epoch. */
long llm_budget_day(int64_t epoch_ms);

/* Whether a call may go on day: 1 while the known spend is under the budget
 * (always without a budget). A new day starts from nothing. */
int llm_budget_open(struct llm_budget *b, long day);

/* The spend known on day (the shared total and what it lacks). */
double llm_budget_spent(struct llm_budget *b, long day);

/* An answer on day cost usd (> 0). */
void llm_budget_add(struct llm_budget *b, long day, double usd);

/* The amount to hand to the shared count now (0: nothing); it is then
 * "sending" until llm_budget_sent() says how that went. */
double llm_budget_take(struct llm_budget *b, long day);

/* The increment of day's amount was counted (ok: total is the shared total
 * after it) or not (Redis away: the amount is unsent again). */
void llm_budget_sent(struct llm_budget *b, long day, double amount, int ok, double total);

/* The shared total of day as read (a read of an older day is ignored). */
void llm_budget_read(struct llm_budget *b, long day, double total);

#endif
