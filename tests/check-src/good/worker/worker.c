/* worker.c -- fixture: the switchboard includes the engine, the clients and the loop. */
#include <uv.h>

#include "worker.h"
#include "pidbox.h"
#include "../engine/engine.h"
#include "net/rmq_broker.h"
#include "llm/llm_client.h"
#include "protocol/celery_msg.h"
#include "util/log.h"
