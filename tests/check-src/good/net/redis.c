/* redis.c -- fixture: net/ includes its own headers, protocol/, util/, the system. */
#include <net/if.h>
#include <hiredis/hiredis.h>
#include <uv.h>

#include "redis.h"
#include "rmq_url.h"
#include "protocol/rmq_json.h"
#include "../util/err.h"
