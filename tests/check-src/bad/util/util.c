/* util.c -- fixture: util/ reaches up into protocol/; a banned call. */
#include <util/buf.h>
#include <protocol/pyjson.h>

#include "util.h"

void fill(char *b, int n)
{
    sprintf(b, "%d", n);
}
