/* llm.c -- fixture: llm/ reaches into net/ and gateway/. */
#include "llm_client.h"
#include "protocol/sse.h"
#include "net/redis.h"
#include "../gateway/gw_hub.h"
