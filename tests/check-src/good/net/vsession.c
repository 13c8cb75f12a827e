/* vsession.c -- fixture: the pure session uses its header, util/ and protocol/. */
#include "vsession.h"

#include <stdint.h>
#include <string.h>

#include "../util/alloc.h"
#include "protocol/sse.h"
#include "util/err.h"
