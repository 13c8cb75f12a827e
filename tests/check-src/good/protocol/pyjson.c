/* pyjson.c -- fixture: protocol/ uses util/ in both spellings, and itself. */
#include <string.h>

#include "pyjson.h"
#include "../util/buf.h"
#include "util/err.h"
#include <protocol/sse.h>
