/* gw_app.c -- fixture: gateway/ uses the shared clients, the loop and its own files. */
#include <uv.h>

#include "gw_app.h"
#include "gw_hub.h"
#include "net/redis.h"
#include "net/backend.h"
#include "../protocol/celery_msg.h"
#include "util/log.h"
