/* engine.c -- fixture: engine/ may use the pure LLM policy, protocol/ and util/. */
#include <stdio.h>
#include <cjson/cJSON.h>

#include "engine.h"
#include "tasks.h"
#include "llm/policy.h"
#include "protocol/celery_msg.h"
#include "../util/alloc.h"

/* snprintf and vsnprintf are fine: only the unbounded form is banned. */
int show(char *b, unsigned long n, int v)
{
    return snprintf(b, n, "%d", v);
}
