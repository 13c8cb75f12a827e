/* commands.h -- the celeriac subcommands. Each takes the arguments after its own
 * name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef CR_COMMANDS_H
#define CR_COMMANDS_H

int cmd_worker(int argc, char **argv);  /* worker/main.c */
int cmd_dlq(int argc, char **argv);     /* worker/dlq.c */
int cmd_top(int argc, char **argv);     /* worker/top.c */
int cmd_gateway(int argc, char **argv); /* gateway/gw_main.c */

#endif
