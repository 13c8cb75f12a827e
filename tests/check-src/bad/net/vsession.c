/* vsession.c -- fixture: the pure session reaches for the loop, hiredis,
 * another net/ module and the engine (rule "vsession"). */
#include "vsession.h"
#include <uv.h>
#include <hiredis/hiredis.h>
#include "redis.h"
#include "engine/tasks.h"
