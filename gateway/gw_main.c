/* gw_main.c -- `celeriac gateway`: HTTP and WebSocket gateway.
 * NEEDSWORK: stub until issue 5 lands. */
#include <stdio.h>

#include "worker/commands.h"

int cmd_gateway(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "celeriac gateway: not implemented yet\n");
    return 2;
}
