/* commands.h -- the celeriac subcommands. Each takes the arguments after its own
 * name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef CR_COMMANDS_H
#define CR_COMMANDS_H

#include <uv.h>

int cmd_worker(int argc, char **argv);  /* cmd/main.c */
int cmd_dlq(int argc, char **argv);     /* cmd/dlq.c */
int cmd_top(int argc, char **argv);     /* cmd/top.c */
int cmd_gateway(int argc, char **argv); /* cmd/gateway.c */
int cmd_rq(int argc, char **argv);      /* cmd/rq.c */

/* Batches log lines from now on and flushes them once per turn of loop, from
 * h (caller-embedded, unref'd: it never keeps the loop alive). Call right
 * before running the loop: lines before it are written at once. */
void cmd_log_attach(uv_loop_t *loop, uv_prepare_t *h);
/* Flushes, writes each line at once again, and closes h (the loop must run
 * once more for the close, before uv_loop_close()). */
void cmd_log_detach(uv_prepare_t *h);

#endif
