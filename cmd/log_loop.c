/* log_loop.c -- flushes util/log's batched lines once per loop turn.
 *
 * util/ knows no loop, so the commands that run one (worker, gateway) attach
 * this prepare handle: it runs right before the loop polls, so every line of
 * a turn is written before the process sleeps, in one write(2). */
#include "commands.h"

#include "util/log.h"

static void on_prepare(uv_prepare_t *h)
{
    (void)h;
    log_flush();
}

void cmd_log_attach(uv_loop_t *loop, uv_prepare_t *h)
{
    uv_prepare_init(loop, h);
    uv_prepare_start(h, on_prepare);
    /* A flush is no reason to keep the loop running. */
    uv_unref((uv_handle_t *)h);
    log_batch_start();
}

void cmd_log_detach(uv_prepare_t *h)
{
    log_batch_stop();
    uv_close((uv_handle_t *)h, NULL);
}
