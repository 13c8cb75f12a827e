/* dlq.c -- `celeriac dlq`: list, show, replay and purge dead-lettered tasks.
 *
 * A command-line client, not part of the worker loop, so it uses rabbitmq-c's
 * blocking calls. Dead letters are read with basic.get and left unacked unless
 * acted on; closing the connection puts every untouched one back in place. */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/rmq_url.h"
#include "commands.h"
#include "dlq_int.h"
#include "net/broker.h"
#include "worker/config.h"
#include "protocol/rmq_json.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/esc.h"
#include "util/opts.h"

#define CH 1

#define OFF(f) offsetof(struct dlq_opts, f)

static const struct opt opts[] = {
    {"broker", 'b', "CELERY_BROKER_URL", OPTS_STR, OFF(broker),
     "amqp://guest:guest@localhost:5672//", 0, 0, "broker URL (AMQP, Redis or SQS)",
     "URL", OPT_HIDE_DEFAULT},
    {"broker-transport-options", 0, "CELERY_BROKER_TRANSPORT_OPTIONS", OPTS_STR,
     OFF(transport_options), NULL, 0, 0,
     "Redis or SQS broker: Celery's broker_transport_options as JSON, as the worker "
     "has them",
     "JSON"},
    {"queue", 0, "CELERIAC_DEAD_LETTER_QUEUE", OPTS_STR, OFF(queue), "celeriac.dead", 0,
     0, "dead-letter queue", "NAME", OPT_HIDE_ENV},
    {"task", 0, NULL, OPTS_STR, OFF(task), NULL, 0, 0, "only dead letters of this task",
     "NAME"},
    {"reason", 0, NULL, OPTS_STR, OFF(reason), NULL, 0, 0,
     "only dead letters whose reason or exception contains TEXT", "TEXT"},
    {"json", 0, NULL, OPTS_FLAG, OFF(json), NULL, 0, 0, "list as JSON lines"},
};

/* Options may come before or after the verb (OPTS_PERMUTE). */
static const struct opts_spec spec = {
    .opts = opts,
    .n = sizeof(opts) / sizeof(opts[0]),
    .head =
        "usage: celeriac dlq [options] list | show ID | replay [ID...] | purge "
        "[ID...]\n\n"
        "  list      one line per dead letter: id, task, reason, exception, failed at\n"
        "  show ID   every header and the body of one dead letter\n"
        "  replay    put dead letters back on their original queue, retries reset\n"
        "  purge     drop dead letters (all of them when no filter is given)\n\n"
        "options:\n",
    .width = 20,
    .flags = OPTS_PERMUTE,
};

static amqp_bytes_t cs(const char *s)
{
    amqp_bytes_t b;
    b.len = strlen(s);
    b.bytes = (void *)s;
    return b;
}

static int rpc_ok(amqp_connection_state_t c, const char *what)
{
    amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return 1;
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        fprintf(stderr, "celeriac dlq: %s: %s\n", what,
                amqp_error_string2(r.library_error));
    else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *m = r.reply.decoded;
        fprintf(stderr, "celeriac dlq: %s: %d %.*s\n", what, m->reply_code,
                (int)m->reply_text.len, (char *)m->reply_text.bytes);
    } else {
        fprintf(stderr, "celeriac dlq: %s failed\n", what);
    }
    return 0;
}

static amqp_connection_state_t open_one(const char *url)
{
    struct rmq_url u;
    struct cr_err err;
    char red[512];
    amqp_connection_state_t c;
    amqp_socket_t *s;
    struct timeval tv = {10, 0};

    config_redact_url(url, red, sizeof(red));
    if (rmq_url_parse(url, &u, &err)) {
        fprintf(stderr, "celeriac dlq: invalid broker URL '%s': %s\n", red, err.msg);
        return NULL;
    }
    c = amqp_new_connection();
    s = c ? amqp_tcp_socket_new(c) : NULL;
    if (!s || amqp_socket_open_noblock(s, u.host, u.port, &tv) != AMQP_STATUS_OK) {
        fprintf(stderr, "celeriac dlq: cannot connect to broker '%s'\n", red);
        if (c)
            amqp_destroy_connection(c);
        return NULL;
    }
    if (amqp_login(c, u.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, u.user, u.password)
            .reply_type != AMQP_RESPONSE_NORMAL) {
        fprintf(stderr, "celeriac dlq: cannot log in to broker '%s'\n", red);
        amqp_destroy_connection(c);
        return NULL;
    }
    amqp_channel_open(c, CH);
    if (!rpc_ok(c, "channel.open")) {
        amqp_destroy_connection(c);
        return NULL;
    }
    return c;
}

/* A failover list: the first node that answers, in the order given. */
static amqp_connection_state_t open_conn(const char *url)
{
    struct rmq_url_list *l = cr_malloc(sizeof(*l));
    struct cr_err err;
    amqp_connection_state_t c = NULL;

    if (!l)
        return NULL;
    if (rmq_url_list_parse(url, l, &err)) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        free(l);
        return NULL;
    }
    for (int i = 0; !c && i < l->n; i++)
        c = open_one(l->url[i]);
    free(l);
    return c;
}

const char *dlq__hstr(const cJSON *h, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* A header value as it may go to the terminal: escaped into out (see esc.h),
 * as anyone who could publish to a task queue chose it. */
const char *dlq__tty(const char *s, char *out, size_t size)
{
    esc_ctl(out, size, s, strlen(s), 0);
    return out;
}

int dlq__matches(const struct dlq_opts *o, const cJSON *h)
{
    const char *id = dlq__hstr(h, "id");
    if (o->task && strcmp(dlq__hstr(h, "task"), o->task))
        return 0;
    if (o->reason && !strstr(dlq__hstr(h, "x-celeriac-reason"), o->reason) &&
        !strstr(dlq__hstr(h, "x-celeriac-exception-type"), o->reason) &&
        !strstr(dlq__hstr(h, "x-celeriac-exception-message"), o->reason))
        return 0;
    if (o->nids) {
        for (int i = 0; i < o->nids; i++)
            if (!strcmp(o->ids[i], id))
                return 1;
        return 0;
    }
    return 1;
}

/* Waits for the broker's confirm of the last publish. */
static int wait_confirm(amqp_connection_state_t c)
{
    for (;;) {
        amqp_frame_t f;
        if (amqp_simple_wait_frame(c, &f) != AMQP_STATUS_OK)
            return 0;
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        if (f.payload.method.id == AMQP_BASIC_ACK_METHOD)
            return 1;
        if (f.payload.method.id == AMQP_BASIC_NACK_METHOD)
            return 0;
    }
}

void dlq__reset_headers(cJSON *h)
{
    const cJSON *item, *next;
    for (item = h->child; item; item = next) {
        next = item->next;
        /* (a quorum queue's x-delivery-count would send a dead letter of
         * reason "delivery limit" straight back to the dead letters) */
        if (!strncmp(item->string, "x-celeriac-", 11) ||
            !strcmp(item->string, "x-delivery-count"))
            cJSON_DeleteItemFromObjectCaseSensitive(h, item->string);
    }
    if (cJSON_GetObjectItemCaseSensitive(h, "retries"))
        cJSON_ReplaceItemInObjectCaseSensitive(h, "retries", cJSON_CreateNumber(0));
}

/* Republishes a dead letter where it first came from, without our headers and
 * with the retry count back at 0. */
static int replay_one(amqp_connection_state_t c, const amqp_message_t *msg, cJSON *h)
{
    amqp_basic_properties_t p = msg->properties;
    amqp_pool_t pool;
    struct cr_err err;
    char *exchange = cr_strdup(dlq__hstr(h, "x-celeriac-original-exchange"));
    char *rk = cr_strdup(dlq__hstr(h, "x-celeriac-original-routing-key"));
    int ok;

    if (!exchange || !rk) {
        cr_free(exchange);
        cr_free(rk);
        return 0;
    }
    dlq__reset_headers(h);
    init_amqp_pool(&pool, 4096);
    if (rmq_json_to_table(h, &pool, &p.headers, &err)) {
        empty_amqp_pool(&pool);
        cr_free(exchange);
        cr_free(rk);
        return 0;
    }
    p._flags |= AMQP_BASIC_HEADERS_FLAG;
    ok = amqp_basic_publish(c, CH, cs(exchange), cs(rk), 0, 0, &p, msg->body) ==
             AMQP_STATUS_OK &&
         wait_confirm(c);
    empty_amqp_pool(&pool);
    cr_free(exchange);
    cr_free(rk);
    return ok;
}

void dlq__print_show(const cJSON *h, const char *content_type, size_t ct_len,
                     const char *body, size_t body_len)
{
    char *text = cJSON_Print(h);
    size_t shown = body_len > 65536 ? 65536 : body_len;
    char ct[512];
    char *safe = cr_malloc(4 * 65536 + 1);

    /* cJSON escapes C0 controls inside strings but not DEL or C1; its own
     * newlines and tabs are layout and stay. */
    if (text && safe)
        esc_ctl(safe, 4 * 65536 + 1, text, strlen(text), ESC_KEEP_LAYOUT);
    printf("headers: %s\n", text && safe ? safe : "{}");
    esc_ctl(ct, sizeof(ct), content_type, ct_len, 0);
    printf("content-type: %s\n", ct);
    if (safe)
        esc_ctl(safe, 4 * 65536 + 1, body, shown, 0);
    printf("body (%zu bytes): %s\n", body_len, safe ? safe : "(out of memory)");
    cr_free(safe);
    cr_free(text);
}

void dlq__print_head(const struct dlq_opts *o, enum dlq_action a)
{
    if (a == A_LIST && !o->json)
        printf("%-36s  %-24s  %-18s  %-24s  %s\n", "ID", "TASK", "REASON", "EXCEPTION",
               "FAILED AT");
}

void dlq__print_line(const struct dlq_opts *o, const cJSON *h)
{
    if (o->json) {
        cJSON *line = cJSON_CreateObject();
        char *text;
        cJSON_AddStringToObject(line, "id", dlq__hstr(h, "id"));
        cJSON_AddStringToObject(line, "task", dlq__hstr(h, "task"));
        cJSON_AddStringToObject(line, "reason", dlq__hstr(h, "x-celeriac-reason"));
        cJSON_AddStringToObject(line, "exception",
                                dlq__hstr(h, "x-celeriac-exception-type"));
        cJSON_AddStringToObject(line, "message",
                                dlq__hstr(h, "x-celeriac-exception-message"));
        cJSON_AddStringToObject(line, "queue", dlq__hstr(h, "x-celeriac-original-queue"));
        cJSON_AddStringToObject(line, "failed_at", dlq__hstr(h, "x-celeriac-failed-at"));
        text = cJSON_PrintUnformatted(line);
        printf("%s\n", text ? text : "{}");
        cr_free(text);
        cJSON_Delete(line);
        return;
    }
    {
        char id[1024], task[1024], reason[1024], exc[1024], at[256];
        printf("%-36s  %-24s  %-18s  %-24s  %s\n",
               *dlq__hstr(h, "id") ? dlq__tty(dlq__hstr(h, "id"), id, sizeof(id)) : "-",
               *dlq__hstr(h, "task") ? dlq__tty(dlq__hstr(h, "task"), task, sizeof(task))
                                     : "-",
               dlq__tty(dlq__hstr(h, "x-celeriac-reason"), reason, sizeof(reason)),
               dlq__tty(dlq__hstr(h, "x-celeriac-exception-type"), exc, sizeof(exc)),
               dlq__tty(dlq__hstr(h, "x-celeriac-failed-at"), at, sizeof(at)));
    }
}

int dlq__summary(const struct dlq_opts *o, enum dlq_action a, unsigned long acted,
                 unsigned long seen, int rc)
{
    if (a == A_SHOW && !acted) {
        fprintf(stderr, "celeriac dlq: no dead letter with id %s\n",
                o->nids ? o->ids[0] : "?");
        return 1;
    }
    if (a == A_REPLAY)
        printf("replayed %lu of %lu dead letters\n", acted, seen);
    else if (a == A_PURGE)
        printf("purged %lu of %lu dead letters\n", acted, seen);
    return rc;
}

static int run(const struct dlq_opts *o, enum dlq_action a)
{
    amqp_connection_state_t c;
    unsigned long seen = 0, acted = 0;
    int rc = 0;

    if (broker_url_is_redis(o->broker))
        return dlq__run_redis(o, a);
    if (broker_url_is_sqs(o->broker))
        return dlq__run_sqs(o, a);
    if (o->transport_options && *o->transport_options) {
        fprintf(stderr,
                "celeriac dlq: broker transport options are for a Redis or SQS broker\n");
        return 2;
    }
    c = open_conn(o->broker);
    if (!c)
        return 1;
    if (a == A_PURGE && !o->task && !o->reason && !o->nids) {
        amqp_queue_purge_ok_t *ok = amqp_queue_purge(c, CH, cs(o->queue));
        if (!ok || !rpc_ok(c, "queue.purge"))
            rc = 1;
        else
            printf("purged %u dead letters\n", ok->message_count);
        amqp_connection_close(c, AMQP_REPLY_SUCCESS);
        amqp_destroy_connection(c);
        return rc;
    }
    if (a == A_REPLAY) {
        amqp_confirm_select(c, CH);
        if (!rpc_ok(c, "confirm.select"))
            goto out;
    }
    dlq__print_head(o, a);
    for (;;) {
        amqp_rpc_reply_t r = amqp_basic_get(c, CH, cs(o->queue), 0);
        amqp_basic_get_ok_t *g;
        amqp_message_t msg;
        cJSON *h = NULL;
        struct cr_err err;

        if (r.reply_type != AMQP_RESPONSE_NORMAL) {
            rpc_ok(c, "basic.get");
            rc = 1;
            break;
        }
        if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
            break; /* get-empty: every message has been looked at */
        g = r.reply.decoded;
        if (amqp_read_message(c, CH, &msg, 0).reply_type != AMQP_RESPONSE_NORMAL) {
            rc = 1;
            break;
        }
        seen++;
        /* A bad entry leaves out only itself (replay then drops it). */
        if ((msg.properties._flags & AMQP_BASIC_HEADERS_FLAG) &&
            rmq_json_from_table_partial(&msg.properties.headers, &h, &err) == CR_ENOMEM)
            h = NULL;
        if (!h)
            h = cJSON_CreateObject();
        if (dlq__matches(o, h)) {
            if (a == A_LIST)
                dlq__print_line(o, h);
            else if (a == A_SHOW) {
                dlq__print_show(h, msg.properties.content_type.bytes,
                                msg.properties.content_type.len, msg.body.bytes,
                                msg.body.len);
                acted++;
            } else if (a == A_REPLAY) {
                char *id = cr_strdup(dlq__hstr(h, "id"));
                char shown_id[1024];
                dlq__tty(id ? id : "?", shown_id, sizeof(shown_id));
                if (replay_one(c, &msg, h)) {
                    amqp_basic_ack(c, CH, g->delivery_tag, 0);
                    printf("replayed %s\n", shown_id);
                    acted++;
                } else {
                    fprintf(stderr, "celeriac dlq: cannot replay %s\n", shown_id);
                    rc = 1;
                }
                cr_free(id);
            } else {
                amqp_basic_ack(c, CH, g->delivery_tag, 0);
                acted++;
            }
        }
        cJSON_Delete(h);
        amqp_destroy_message(&msg);
        amqp_maybe_release_buffers(c);
    }
    rc = dlq__summary(o, a, acted, seen, rc);
out:
    /* Closing returns every unacked dead letter to the queue. */
    amqp_channel_close(c, CH, AMQP_REPLY_SUCCESS);
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
    return rc;
}

int cmd_dlq(int argc, char **argv)
{
    struct dlq_opts o;
    struct cr_err err;
    enum dlq_action a;
    const char *verb;
    char **args;
    int nargs, rc;

    memset(&o, 0, sizeof(o));
    memset(&err, 0, sizeof(err));
    args = cr_calloc((size_t)argc + 1, sizeof(*args));
    if (!args) {
        fprintf(stderr, "celeriac dlq: out of memory\n");
        return 1;
    }
    rc = opts_parse(&spec, &o, argc, argv, NULL, args, &nargs, &err);
    if (rc == 1) {
        rc = 0;
        goto out;
    }
    if (rc) {
        fprintf(stderr, "celeriac dlq: %s\n", err.msg);
        rc = rc == CR_ENOMEM ? 1 : 2;
        goto out;
    }
    rc = 2;
    if (nargs == 0) {
        opts_usage(&spec, stderr);
        goto out;
    }
    verb = args[0];
    o.ids = args + 1;
    o.nids = nargs - 1;
    if (!strcmp(verb, "list"))
        a = A_LIST;
    else if (!strcmp(verb, "show"))
        a = A_SHOW;
    else if (!strcmp(verb, "replay"))
        a = A_REPLAY;
    else if (!strcmp(verb, "purge"))
        a = A_PURGE;
    else {
        fprintf(stderr, "celeriac dlq: unknown action '%s'\n", verb);
        opts_usage(&spec, stderr);
        goto out;
    }
    if (a == A_SHOW && o.nids != 1) {
        fprintf(stderr, "celeriac dlq: show takes one task id\n");
        goto out;
    }
    rc = run(&o, a);
out:
    opts_release(&spec, &o);
    cr_free(args);
    return rc;
}
