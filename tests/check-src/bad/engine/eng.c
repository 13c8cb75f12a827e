/* eng.c -- fixture: engine/ includes the network, the LLM client and the loop. */
#include <stdio.h>
#include <uv.h>

#include "engine.h"
#include "net/rmq_broker.h"
#include "../llm/llm_client.h"
#include "llm/policy.h"
