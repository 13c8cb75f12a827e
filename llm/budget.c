/* budget.c -- a provider's daily spend limit: the bookkeeping. */
#include "budget.h"

#include <string.h>

int llm_budget_parse(struct llm_budget *b, const cJSON *o, const char *provider,
                     struct cr_err *err)
{
    const cJSON *k;
    memset(b, 0, sizeof(*b));
    b->day = -1;
    if (!cJSON_IsObject(o))
        return cr_err_set(err, CR_EINVAL,
                          "llm provider '%s': 'budget' must be an object such as "
                          "{\"usd_per_day\": 50}",
                          provider);
    cJSON_ArrayForEach(k, o)
    {
        if (strcmp(k->string, "usd_per_day"))
            return cr_err_set(
                err, CR_EINVAL,
                "llm provider '%s': budget: unknown key '%.40s' (usd_per_day)", provider,
                k->string);
    }
    k = cJSON_GetObjectItemCaseSensitive(o, "usd_per_day");
    if (!cJSON_IsNumber(k) || !(k->valuedouble > 0) ||
        k->valuedouble > LLM_BUDGET_MAX_USD)
        return cr_err_set(
            err, CR_EINVAL,
            "llm provider '%s': budget: usd_per_day must be a number of USD "
            "in (0, %.0f]",
            provider, LLM_BUDGET_MAX_USD);
    b->usd_per_day = k->valuedouble;
    return 0;
}

long llm_budget_day(int64_t epoch_ms)
{
    int64_t d = epoch_ms / 86400000;
    if (epoch_ms < 0 && d * 86400000 != epoch_ms)
        d--;
    return (long)d;
}

/* A new day: what was known of the last one counts no more. */
static void roll(struct llm_budget *b, long day)
{
    if (day == b->day)
        return;
    if (day < b->day)
        return; /* a clock stepped back: keep the later day's figures */
    b->day = day;
    b->shared = b->unsent = b->sending = 0;
}

double llm_budget_spent(struct llm_budget *b, long day)
{
    roll(b, day);
    return day == b->day ? b->shared + b->unsent + b->sending : 0;
}

int llm_budget_open(struct llm_budget *b, long day)
{
    if (b->usd_per_day <= 0)
        return 1;
    return llm_budget_spent(b, day) < b->usd_per_day;
}

void llm_budget_add(struct llm_budget *b, long day, double usd)
{
    roll(b, day);
    if (usd > 0 && day == b->day)
        b->unsent += usd;
}

double llm_budget_take(struct llm_budget *b, long day)
{
    double a;
    roll(b, day);
    if (day != b->day || b->unsent <= 0)
        return 0;
    a = b->unsent;
    b->unsent = 0;
    b->sending += a;
    return a;
}

void llm_budget_sent(struct llm_budget *b, long day, double amount, int ok, double total)
{
    if (day != b->day)
        return; /* an answer about a day that is over */
    b->sending -= amount;
    if (b->sending < 1e-12)
        b->sending = 0;
    if (!ok) {
        b->unsent += amount;
        return;
    }
    /* The total includes our amount; increments still out are not in it
     * if they were sent after, so they stay counted in sending. */
    if (total > b->shared)
        b->shared = total;
}

void llm_budget_read(struct llm_budget *b, long day, double total)
{
    roll(b, day);
    if (day == b->day && total > b->shared)
        b->shared = total;
}
