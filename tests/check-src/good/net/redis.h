/* redis.h -- fixture: the header beside redis.c. */
#include "../util/buf.h"
