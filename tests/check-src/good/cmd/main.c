/* main.c -- fixture: cmd/ may include every layer. */
#include "worker/worker.h"
#include "gateway/gw_app.h"
#include "engine/engine.h"
#include "net/rmq_broker.h"
