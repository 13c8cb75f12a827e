/* fuzz_pidbox_msg.c -- libFuzzer target: bytes -> remote-control request parser,
 * node matching, argument readers, reply encoding; and the statedb reader.
 * Matching goes through one pattern cache kept across inputs, as the mailbox
 * keeps it, and must give what a fresh compile gives. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "protocol/pidbox_msg.h"
#include "util/alloc.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void count(const char *id, int64_t expires, void *arg)
{
    (void)id;
    (void)expires;
    ++*(int *)arg;
}

static struct pidbox_matcher *matcher;

static void match(const struct pidbox_request *rq, const char *node)
{
    int cached = pidbox_match(matcher, rq, node, NULL);
    if (cached != pidbox_match(matcher, rq, node, NULL) ||
        cached != pidbox_match(NULL, rq, node, NULL))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct pidbox_request rq;
    struct cr_err err;
    int n = 0;

    if (pidbox_request_parse((const char *)data, size, &rq, &err) == 0) {
        const char *s;
        double d;
        int b;
        cJSON *ids = NULL, *reply;
        struct buf out;
        if (!matcher && !(matcher = pidbox_matcher_new()))
            abort();
        match(&rq, "celery@host");
        match(&rq, "");
        pidbox_arg_str(rq.arguments, "queue", &s);
        pidbox_arg_num(rq.arguments, "n", &d);
        pidbox_arg_bool(rq.arguments, "terminate", &b);
        if (pidbox_arg_ids(rq.arguments, "task_id", &ids) == 1) {
            reply = pidbox_revoke_reply(ids, 1, ids);
            buf_init(&out);
            pidbox_reply_encode("celery@host", reply, &out);
            buf_release(&out);
            cJSON_Delete(reply);
        }
        cJSON_Delete(ids);
        reply = pidbox_error_exc("KeyError", rq.method);
        cJSON_Delete(reply);
    }
    pidbox_request_release(&rq);
    pidbox_statedb_parse((const char *)data, size, 0, count, &n);
    return 0;
}
