/* dlq.c -- `celeriac dlq`: inspect, replay and purge dead letters.
 * NEEDSWORK: stub until issue 3's tooling lands. */
#include <stdio.h>

#include "commands.h"

int cmd_dlq(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "celeriac dlq: not implemented yet\n");
    return 2;
}
