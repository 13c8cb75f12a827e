/* net.c -- fixture: net/ reaches into llm/ and engine/. */
#include "rmq_broker.h"
#include "util/alloc.h"
#include "llm/policy.h"
#include "engine/tasks.h"
