/* buf.c -- fixture: util/ includes only util/ and the system. */
#include <stdlib.h>

#include "buf.h"
#include "../util/alloc.h"
#include <util/err.h>
