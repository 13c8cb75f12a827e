/* fuzz_gw_submit.c -- libFuzzer target: bytes -> the gateway's POST /v1/tasks
 * body parser (gateway/gw_msg.c, pure), once allowing any task and queue and
 * once with lists of known ones, as the gateway runs with and without them.
 *
 * Every accepted body is built into the Celery message the gateway would
 * publish, and that message must decode (celery_msg_decode) to the same task
 * name and id: what the gateway accepts, a worker has to be able to run. Every
 * refusal must carry a 4xx status, a code and a message, and encode as the
 * JSON error reply. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gw_msg.h"
#include "protocol/celery_msg.h"
#include "util/alloc.h"
#include "util/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const known_tasks[] = {"llm.generate", "llm.chat", "proj.add"};
static const char *const known_queues[] = {"celery", "hipri"};
static const struct gw_rules strict_rules = {known_tasks, 3, known_queues, 2, "celery"};

static void accepted(const struct gw_submit *s)
{
    struct task_msg tm, back;
    struct gw_props props;
    struct celery_raw_msg raw;
    struct cr_err err;
    struct buf body;
    cJSON *headers = NULL;

    task_msg_init(&tm);
    task_msg_init(&back);
    buf_init(&body);
    if (gw_submit_to_task(s, s->task_id ? s->task_id : "id-1", "gw@host",
                          1700000000000000LL, &tm, &props) == 0 &&
        celery_msg_encode_v2(&tm, &body, &headers) == 0) {
        memset(&raw, 0, sizeof(raw));
        raw.content_type = "application/json";
        raw.headers = headers;
        raw.correlation_id = tm.id;
        raw.delivery_mode = 2;
        raw.body = body.data;
        raw.body_len = body.len;
        if (celery_msg_decode(&raw, &back, &err) != 0 || strcmp(back.id, tm.id) ||
            strcmp(back.task, s->task))
            abort();
    }
    cJSON_Delete(headers);
    buf_release(&body);
    task_msg_release(&back);
    task_msg_release(&tm);
}

static void one(const uint8_t *data, size_t size, const struct gw_rules *rules)
{
    struct gw_submit s;
    struct gw_error e;
    struct buf out;
    int rc;

    gw_submit_init(&s);
    memset(&e, 0, sizeof(e));
    rc = gw_submit_parse((const char *)data, size, rules, &s, &e);
    if (rc == 0) {
        accepted(&s);
    } else if (rc == CR_EINVAL) {
        if (e.status < 400 || e.status > 499 || !e.code || !e.message[0])
            abort();
        buf_init(&out);
        gw_error_json(&e, &out);
        buf_release(&out);
    }
    gw_submit_release(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct buf out;

    cr_alloc_init();
    one(data, size, NULL);
    one(data, size, &strict_rules);
    /* The reply writer sees what clients send too (task ids, names). */
    buf_init(&out);
    gw_json_str(&out, (const char *)data, size);
    buf_release(&out);
    return 0;
}
