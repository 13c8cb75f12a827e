/* fuzz_canvas.c -- libFuzzer target: arbitrary task bodies through the canvas plan
 * builder (protocol/canvas.c), as a finished task's embed reaches it from the
 * network.
 *
 * Input: the first byte picks what the task's "result" is (its low bits) and
 * whether the failure plan is built too; the rest is a protocol v2 body
 * [args, kwargs, embed] decoded with fixed headers naming a chord member
 * (group "g1", group_index 0), so every embed, including a chord body, reaches
 * canvas_on_success, canvas_on_failure, canvas_chord_member and
 * canvas_chord_join. Every call must return 0 or an error code, bounded in
 * time and memory, and every plan must release cleanly (ASan/LSan). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/canvas.h"
#include "protocol/celery_msg.h"
#include "protocol/pyjson.h"
#include "util/alloc.h"

static const char fixed_headers[] =
    "{\"lang\": \"py\", \"task\": \"proj.add\", \"id\": \"6d39b888\", \"shadow\": null, "
    "\"eta\": null, \"expires\": null, \"group\": \"g1\", \"group_index\": 0, "
    "\"retries\": 0, \"timelimit\": [null, null], \"root_id\": \"6d39b888\", "
    "\"parent_id\": null, \"argsrepr\": \"(2, 2)\", \"kwargsrepr\": \"{}\", "
    "\"origin\": \"gen1@host\", \"ignore_result\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void counter_uuid(char out[37], void *arg)
{
    unsigned *n = arg;
    snprintf(out, 37, "00000000-0000-4000-8000-%012x", (*n)++);
}

static void join(const struct task_msg *m, const struct canvas_opts *o, const char *state,
                 const cJSON *result)
{
    struct canvas_chord c;
    struct canvas_plan plan;
    struct cr_err err;
    struct buf member;
    int failed = 0;
    char *body_id = NULL;
    cJSON *exc = NULL;

    if (!canvas_chord_of(m, &c))
        return;
    buf_init(&member);
    if (canvas_chord_member(m->id, state, result, &member) == 0) {
        const char *members[2] = {member.data, "[1, \"x\", \"SUCCESS\", 2]"};
        size_t lens[2] = {member.len, strlen(members[1])};
        canvas_plan_init(&plan);
        memset(&err, 0, sizeof(err));
        canvas_chord_join(m, &c, members, lens, 2, o, &plan, &failed, &body_id, &exc,
                          &err);
        canvas_plan_release(&plan);
        cr_free(body_id);
        cJSON_Delete(exc);
    }
    buf_release(&member);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct celery_raw_msg raw;
    struct task_msg m;
    struct canvas_opts o;
    struct canvas_plan plan;
    struct cr_err err;
    char *routes[] = {(char *)"proj.*=routed", (char *)"llm.?enerate=llm"};
    cJSON *headers = NULL, *result;
    unsigned uuids = 0;
    uint8_t mode;

    if (size < 1)
        return 0;
    cr_alloc_init();
    mode = data[0];
    py_json_parse(fixed_headers, sizeof(fixed_headers) - 1, &headers, NULL);
    memset(&raw, 0, sizeof(raw));
    raw.headers = headers;
    raw.correlation_id = "6d39b888";
    raw.delivery_mode = 2;
    raw.body = (const char *)data + 1;
    raw.body_len = size - 1;

    memset(&o, 0, sizeof(o));
    o.hostname = "celery@fuzz";
    o.default_queue = "celery";
    o.routes = routes;
    o.nroutes = 2;
    o.now_us = 1700000000000000LL;
    o.new_uuid = counter_uuid;
    o.uuid_arg = &uuids;

    task_msg_init(&m);
    memset(&err, 0, sizeof(err));
    if (celery_msg_decode(&raw, &m, &err) == 0) {
        switch (mode & 3) {
        case 0:
            result = cJSON_CreateNumber(4);
            break;
        case 1:
            result = cJSON_CreateString("text");
            break;
        case 2:
            result = cJSON_Duplicate(m.args, 1);
            break;
        default:
            result = cJSON_CreateNull();
            break;
        }
        canvas_has_followups(&m);
        canvas_plan_init(&plan);
        canvas_on_success(&m, result, &o, &plan, &err);
        canvas_plan_release(&plan);
        join(&m, &o, "SUCCESS", result);
        if (mode & 4) {
            cJSON *exc = cJSON_CreateObject();
            cJSON_AddStringToObject(exc, "exc_type", "ValueError");
            cJSON_AddStringToObject(exc, "exc_message", "x");
            cJSON_AddStringToObject(exc, "exc_module", "builtins");
            canvas_plan_init(&plan);
            canvas_on_failure(&m, &o, &plan, &err);
            canvas_plan_release(&plan);
            join(&m, &o, "FAILURE", exc);
            cJSON_Delete(exc);
        }
        cJSON_Delete(result);
    }
    task_msg_release(&m);
    cJSON_Delete(headers);
    return 0;
}
