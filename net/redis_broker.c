/* redis_broker.c -- kombu's Redis transport behind net/broker.h. */
#include "broker_int.h"

struct broker *redis_broker_new(uv_loop_t *loop, const struct broker_config *cfg,
                                broker_msg_fn *on_msg, broker_conn_fn *on_conn,
                                void *privdata, struct cr_err *err)
{
    (void)loop;
    (void)cfg;
    (void)on_msg;
    (void)on_conn;
    (void)privdata;
    cr_err_set(err, CR_EINVAL, "the Redis broker transport is not built yet");
    return NULL;
}
