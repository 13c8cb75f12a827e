/* top.c -- `celeriac top`: a live terminal view of workers.
 * NEEDSWORK: stub until issue 4 lands. */
#include <stdio.h>

#include "commands.h"

int cmd_top(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "celeriac top: not implemented yet\n");
    return 2;
}
