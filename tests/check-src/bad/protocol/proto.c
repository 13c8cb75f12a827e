/* proto.c -- fixture: protocol/ reaches up into net/ and engine/, and sees the loop. */
#include "../util/buf.h"
#include "proto.h"
#include "net/redis.h"
#include "../engine/tasks.h"
#include <uv.h>
