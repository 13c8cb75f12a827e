/* test_engine.c -- the engine driven by the recording fake engine_ops of
 * fake_engine.c, fed real Celery messages (tests/fixtures/messages). Every
 * effect is written to one log line ("call1 store1 ack1 release1"), so each
 * test states the exact effects and their order: exactly one settle per
 * delivery, an ack never before its store or confirm, none on a cold shutdown
 * or a lost connection. The answers the tests give are logged too ("stored",
 * "confirm", "done"). Ends with an allocation-failure sweep over
 * engine_on_delivery(). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/unit/unit.h"
#include "tests/unit/fake_engine.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "protocol/delayed.h"
#include "protocol/result.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/log.h"

#define FIXTURES "tests/fixtures/messages/"

/* ------------------------------------------------------------ the fake */

/* FAKE_T0_US (2023-11-14) is before every eta and expiry of the fixtures. */
static void fake_init(struct fake *f, const char *alias)
{
    fake_base_init(f);
    f->aliases[0] = (char *)(alias ? alias : "proj.add=celery.accumulate");
    f->cfg.naliases = 1;
    f->cfg.dead_letter_exchange = "celeriac.dlx";
}

/* ------------------------------------------------------------ messages */

static char *opt_dup(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? strdup(v->valuestring) : NULL;
}

/* A delivery of fixture `name`. task, when not NULL, renames the task and
 * body replaces the body (a generate call needs a prompt, the captures add
 * numbers). */
static struct delivery *fixture(struct fake *f, const char *name, const char *task,
                                const char *body)
{
    char path[256];
    struct fake_msg *m;
    cJSON *root, *props, *info, *h;
    char *text;

    snprintf(path, sizeof(path), FIXTURES "%s.json", name);
    text = unit_read_file(path, NULL);
    root = cJSON_Parse(text);
    free(text);
    ck_assert_ptr_nonnull(root);
    props = cJSON_GetObjectItemCaseSensitive(root, "properties");
    info = cJSON_GetObjectItemCaseSensitive(props, "delivery_info");
    h = cJSON_DetachItemFromObjectCaseSensitive(root, "headers");
    if (task) {
        cJSON_DeleteItemFromObjectCaseSensitive(h, "task");
        cJSON_AddStringToObject(h, "task", task);
    }
    m = fake_msg_new(
        f, body ? body : cJSON_GetObjectItemCaseSensitive(root, "body")->valuestring,
        "celery", h);
    free(m->d.content_type);
    free(m->d.content_encoding);
    free(m->d.exchange);
    free(m->d.routing_key);
    m->d.content_type = opt_dup(root, "content_type");
    m->d.content_encoding = opt_dup(root, "content_encoding");
    m->d.correlation_id = opt_dup(props, "correlation_id");
    m->d.reply_to = opt_dup(props, "reply_to");
    m->d.exchange = opt_dup(info, "exchange");
    m->d.routing_key = opt_dup(info, "routing_key");
    m->d.delivery_mode =
        cJSON_GetObjectItemCaseSensitive(props, "delivery_mode")->valueint;
    m->d.priority = m->d.wire_priority =
        cJSON_GetObjectItemCaseSensitive(props, "priority")->valueint;
    m->d.caps = MSG_CAP_CONFIRMS | MSG_CAP_PRIORITY | MSG_CAP_PREFETCH | MSG_CAP_PARK;
    cJSON_Delete(root);
    return &m->d;
}

#define GENERATE_BODY "[[\"hello\"], {}, {\"callbacks\": null, \"errbacks\": null}]"

static struct delivery *generate(struct fake *f, const char *name)
{
    return fixture(f, name, "llm.generate", GENERATE_BODY);
}

/* -------------------------------------------------------------- driving */

/* The answers, each noted in the log before the engine hears it. */

static void deliver(struct fake *f, struct delivery *d)
{
    engine_on_delivery(f->e, f->now, d);
}

static void stored(struct fake *f, int i, int status)
{
    fake_note(f, "stored", 0);
    fake_stored(f, i, status);
}

static void confirm(struct fake *f, int i, int ok)
{
    fake_note(f, ok ? "confirm" : "nack", 0);
    fake_confirm(f, i, ok);
}

/* Answers chord command i; members (NULL: not complete) for a part-return. */
static void chord_done(struct fake *f, int i, int status, const char *const *members,
                       size_t n)
{
    fake_note(f, members ? "complete" : "chord-done", 0);
    fake_chord_done(f, i, status, members, n);
}

static void llm_done(struct fake *f, int i, enum llm_verdict v, const char *exc,
                     int64_t retry_after_ms, const char *text)
{
    fake_note(f, "done", 0);
    fake_llm_done(f, i, v, exc, retry_after_ms, text);
}

static const char *meta_status(struct fake *f, int i, char *st, size_t n)
{
    st[0] = '\0';
    result_meta_status(f->metas[i], strlen(f->metas[i]), st, n);
    return st;
}

/* ---------------------------------------------------------------- tests */

START_TEST(test_success_accumulate)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "group_member", NULL, NULL));
    /* no read for a first delivery; stored before acked */
    log_is(&f, "store-SUCCESS");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "[2, 2]"));
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    ck_assert_int_eq(f.notes[TEV_RECEIVED], 1);
    ck_assert_int_eq(f.notes[TEV_STARTED], 1);
    ck_assert_int_eq(f.notes[TEV_SUCCEEDED], 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_success_llm)
{
    struct fake f;
    char st[32];
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    log_is(&f, "call1");
    llm_done(&f, 0, LLM_OK, NULL, -1, "hi there");
    log_is(&f, "done store-SUCCESS");
    ck_assert_str_eq(meta_status(&f, 0, st, sizeof(st)), "SUCCESS");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "hi there"));
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_ignore_result_acks_without_store)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "ignore_result", NULL, NULL));
    log_is(&f, "ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_fallback_moves_on_at_once)
{
    struct fake f;
    char st[32];
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    log_is(&f, "call1");
    /* retryable, another provider follows, no text yet: the next one is
     * asked at once, with no retry published and no progress run closed */
    f.fallback_left = 1;
    llm_done(&f, 0, LLM_RETRYABLE, "OverloadedError", -1, NULL);
    log_is(&f, "done call1");
    ck_assert_int_eq(f.steps[1], 1);
    ck_assert_int_eq(f.notes[TEV_FALLBACK], 0);
    ck_assert_int_eq(f.notes[TEV_RETRIED], 0);
    /* text had come: the run is closed as void before the next provider */
    llm_done(&f, 1, LLM_RETRYABLE, "APIError", -1, "half an answ");
    log_is(&f, "done call1");
    ck_assert_int_eq(f.steps[2], 2);
    ck_assert_int_eq(f.notes[TEV_FALLBACK], 1);
    f.fallback_left = 0;
    llm_done(&f, 2, LLM_OK, NULL, -1, "whole answer");
    log_is(&f, "done store-SUCCESS");
    ck_assert_str_eq(meta_status(&f, 0, st, sizeof(st)), "SUCCESS");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_fallback_not_for_permanent_or_last)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.dead_letter_exchange = NULL;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    f.fallback_left = 1;
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "call1 done store-FAILURE");
    stored(&f, 0, 0);
    fake_release(&f);
    /* the last provider's retryable failure is a retry as before */
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "OverloadedError", -1, NULL);
    log_is(&f, "call1 done publish:celery");
    ck_assert_int_eq(f.notes[TEV_RETRIED], 1);
    fake_release(&f);
}
END_TEST

START_TEST(test_retry_with_retry_after)
{
    struct fake f;
    const cJSON *eta, *retries;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "RateLimitError", 1500, NULL);
    /* the retry goes to the original routing; nothing stored until confirmed */
    log_is(&f, "call1 done publish:celery");
    eta = cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "eta");
    retries = cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "retries");
    ck_assert(cJSON_IsString(eta));
    ck_assert_str_eq(eta->valuestring, "2023-11-14T22:13:21.500000+00:00");
    ck_assert_int_eq(retries->valueint, 1);
    ck_assert_int_eq(f.notes[TEV_RETRIED], 1);
    confirm(&f, 0, 1);
    log_is(&f, "confirm store-RETRY");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_retry_not_confirmed_leaves_it_unacked)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "APIConnectionError", -1, NULL);
    confirm(&f, 0, 0);
    log_is(&f, "call1 done publish:celery nack release1");
    ck_assert_int_eq(f.acks[1] + f.rejects[1], 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_retry_broker_away_leaves_it_unacked)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    f.fail_publish = CR_EBROKER;
    llm_done(&f, 0, LLM_RETRYABLE, "APIConnectionError", -1, NULL);
    log_is(&f, "call1 done release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A final failure: dead letter confirmed, then FAILURE stored, then acked. */
static void final_failure(enum llm_verdict v, int max_retries, const char *reason)
{
    struct fake f;
    const cJSON *r;
    fake_init(&f, NULL);
    f.cfg.max_retries = max_retries;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, v, "RateLimitError", -1, NULL);
    log_is(&f, "call1 done publish:celeriac.dlx");
    ck_assert_str_eq(f.pubs[0].routing_key, "celery");
    r = cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "x-celeriac-reason");
    ck_assert_str_eq(r->valuestring, reason);
    ck_assert_int_eq(f.notes[TEV_FAILED], 1);
    ck_assert_int_eq(f.notes[TEV_DEAD_LETTERED], 1);
    confirm(&f, 0, 1);
    log_is(&f, "confirm store-FAILURE");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}

START_TEST(test_exhausted_retries)
{
    final_failure(LLM_RETRYABLE, 0, "retries exhausted");
}
END_TEST

START_TEST(test_permanent_failure)
{
    final_failure(LLM_PERMANENT, 3, "permanent failure");
}
END_TEST

static const char *pub_header(struct fake *f, int i, const char *key);

/* A dead letter the broker did not take (nack, or the broker away), the
 * connection lost with it: the delivery stays unacked, and the FAILURE is
 * stored with the dead letter pending, so the redelivery finishes it without
 * a second call (below). */
static void dead_letter_lost(struct fake *f, int broker_away)
{
    const cJSON *dl;
    cJSON *meta;
    fake_init(f, NULL);
    f->cfg.max_retries = 0;
    fake_start(f);
    deliver(f, generate(f, "send_task_args"));
    f->connected = 0;
    if (broker_away)
        f->fail_publish = CR_EBROKER;
    llm_done(f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    if (broker_away) {
        log_is(f, "call1 done store-FAILURE");
    } else {
        confirm(f, 0, 0);
        log_is(f, "call1 done publish:celeriac.dlx nack store-FAILURE");
    }
    f->fail_publish = 0;
    ck_assert_int_eq(f->store_attempt[0], 0);
    meta = cJSON_Parse(f->metas[0]);
    ck_assert_ptr_nonnull(meta);
    dl = cJSON_GetObjectItemCaseSensitive(meta, ENGINE_DEAD_LETTER_PENDING);
    ck_assert(cJSON_IsObject(dl));
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(dl, "reason")->valuestring,
                     "permanent failure");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(dl, "exc_type")->valuestring,
                     "BadRequestError");
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(dl, "http_status")));
    cJSON_Delete(meta);
    stored(f, 0, 0);
    /* not acked: the message comes back */
    log_is(f, "stored release1");
    ck_assert_int_eq(f->acks[1] + f->rejects[1], 0);
    f->connected = 1;
}

START_TEST(test_dead_letter_lost_with_the_connection)
{
    struct fake f;
    dead_letter_lost(&f, _i);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A nack while the delivery can still be acked: once the FAILURE with its
 * pending dead letter is stored, the dead letter goes once more at once. */
START_TEST(test_dead_letter_not_confirmed)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.max_retries = 0;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    confirm(&f, 0, 0);
    log_is(&f, "call1 done publish:celeriac.dlx nack store-FAILURE");
    ck_assert_ptr_nonnull(strstr(f.metas[0], ENGINE_DEAD_LETTER_PENDING));
    stored(&f, 0, 0);
    log_is(&f, "stored publish:celeriac.dlx");
    confirm(&f, 1, 1);
    log_is(&f, "confirm store-FAILURE");
    ck_assert_ptr_null(strstr(f.metas[1], ENGINE_DEAD_LETTER_PENDING));
    stored(&f, 1, 0);
    log_is(&f, "stored ack1 release1");
    ck_assert_int_eq(f.ncalls, 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* x-celeriac-first-received: a retry carries this attempt's receipt time when
 * the message had none, and the one the message carried when it had one; a
 * dead letter keeps the carried time, not its own attempt's. */
START_TEST(test_first_received_kept_across_retries)
{
    struct fake f;
    struct delivery *d;
    const char *first = "2023-11-14T22:00:00.250000+00:00";
    fake_init(&f, NULL);
    f.cfg.max_retries = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "RateLimitError", 1500, NULL);
    log_is(&f, "call1 done publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "x-celeriac-first-received"),
                     "2023-11-14T22:13:20+00:00");
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-RETRY stored ack1 release1");

    /* a later attempt of a task first received earlier */
    d = generate(&f, "send_task_args");
    cJSON_AddStringToObject((cJSON *)d->headers, "x-celeriac-first-received", first);
    deliver(&f, d);
    llm_done(&f, 1, LLM_RETRYABLE, "RateLimitError", 1500, NULL);
    log_is(&f, "call2 done publish:celery");
    ck_assert_str_eq(pub_header(&f, 1, "x-celeriac-first-received"), first);
    confirm(&f, 1, 1);
    stored(&f, 1, 0);
    log_is(&f, "confirm store-RETRY stored ack2 release2");

    d = generate(&f, "send_task_args");
    cJSON_AddStringToObject((cJSON *)d->headers, "x-celeriac-first-received", first);
    deliver(&f, d);
    llm_done(&f, 2, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "call3 done publish:celeriac.dlx");
    ck_assert_str_eq(pub_header(&f, 2, "x-celeriac-first-received"), first);
    ck_assert_str_eq(pub_header(&f, 2, "x-celeriac-failed-at"),
                     "2023-11-14T22:13:20+00:00");
    confirm(&f, 2, 1);
    stored(&f, 2, 0);
    log_is(&f, "confirm store-FAILURE stored ack3 release3");
    fake_release(&f);
}
END_TEST

/* The redelivery that finds the FAILURE with its dead letter pending does
 * not call the provider: it dead-letters the task with what the first run's
 * dead letter would have said, stores the FAILURE without the mark, acks. */
START_TEST(test_redelivery_finishes_a_pending_dead_letter)
{
    struct fake f;
    struct delivery *d;
    struct job *j;
    char *pending;
    dead_letter_lost(&f, _i);
    pending = cr_strdup(f.metas[0]);
    d = generate(&f, "send_task_args");
    d->redelivered = 1;
    deliver(&f, d);
    log_is(&f, "read2");
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, pending, strlen(pending));
    ck_assert_int_eq(f.ncalls, 1);
    log_is(&f, "publish:celeriac.dlx");
    ck_assert_str_eq(pub_header(&f, f.npubs - 1, "x-celeriac-reason"),
                     "permanent failure");
    ck_assert_str_eq(pub_header(&f, f.npubs - 1, "x-celeriac-exception-type"),
                     "BadRequestError");
    confirm(&f, f.npubs - 1, 1);
    log_is(&f, "confirm store-FAILURE");
    ck_assert_ptr_null(strstr(f.metas[1], ENGINE_DEAD_LETTER_PENDING));
    ck_assert_msg(!strncmp(f.metas[1], "{\"status\": \"FAILURE\", \"result\": {", 33),
                  "%s", f.metas[1]);
    stored(&f, 1, 0);
    log_is(&f, "stored ack2 release2");
    ck_assert_int_eq(f.ncalls, 1);
    check_once(&f);
    cr_free(pending);
    fake_release(&f);
}
END_TEST

/* The redelivery comes while the FAILURE with its pending dead letter is
 * still being stored: it joins the job, which sends the dead letter for it
 * once the store is answered, then stores the FAILURE without the mark and
 * acks; one call in all. */
START_TEST(test_redelivery_joins_while_the_pending_failure_is_stored)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    f.cfg.max_retries = 0;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    f.connected = 0;
    f.fail_publish = CR_EBROKER;
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "call1 done store-FAILURE");
    f.connected = 1;
    f.fail_publish = 0;
    d = generate(&f, "send_task_args");
    d->redelivered = 1;
    deliver(&f, d);
    log_is(&f, "");
    stored(&f, 0, 0);
    log_is(&f, "stored publish:celeriac.dlx");
    ck_assert_str_eq(pub_header(&f, 0, "x-celeriac-reason"), "permanent failure");
    confirm(&f, 0, 1);
    log_is(&f, "confirm store-FAILURE");
    ck_assert_ptr_null(strstr(f.metas[1], ENGINE_DEAD_LETTER_PENDING));
    stored(&f, 1, 0);
    ck_assert_int_eq(f.acks[2], 1);
    ck_assert_int_eq(f.ncalls, 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A RETRY is stored once its retry is published, when the message's retries
 * already count the next attempt: it goes with its own attempt, so that it
 * never lands over what the next attempt stored. */
START_TEST(test_retry_stored_with_its_own_attempt)
{
    struct fake f;
    char st[16];
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "RateLimitError", 5, NULL);
    confirm(&f, 0, 1);
    log_is(&f, "call1 done publish:celery confirm store-RETRY");
    ck_assert_str_eq(meta_status(&f, 0, st, sizeof(st)), "RETRY");
    ck_assert_int_eq(f.store_attempt[0], 0);
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_unregistered_task)
{
    struct fake f;
    fake_init(&f, "other=celery.accumulate");
    fake_start(&f);
    deliver(&f, fixture(&f, "group_member", NULL, NULL));
    log_is(&f, "publish:celeriac.dlx");
    ck_assert_str_eq(
        cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "x-celeriac-reason")
            ->valuestring,
        "unregistered task");
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-FAILURE stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_bad_arguments_fail_without_call)
{
    struct fake f;
    fake_init(&f, "proj.add=llm.generate");
    f.cfg.dead_letter_exchange = "";
    fake_start(&f);
    deliver(&f, fixture(&f, "send_task_args", NULL, NULL)); /* generate(2, 3) */
    log_is(&f, "store-FAILURE");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_revoked_before_delivery)
{
    struct fake f;
    char st[32];
    fake_init(&f, NULL);
    fake_start(&f);
    ck_assert_int_eq(engine_revoke(f.e, f.now, "0f0b8c1e-0001-4000-8000-000000000001", 0),
                     0);
    deliver(&f, generate(&f, "send_task_args"));
    log_is(&f, "store-REVOKED");
    ck_assert_str_eq(meta_status(&f, 0, st, sizeof(st)), "REVOKED");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    ck_assert_int_eq(f.notes[TEV_REVOKED], 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_revoked_during_call)
{
    struct fake f;
    const char *id;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    id = f.calls[0]->tm.id;
    ck_assert_int_eq(engine_revoke(f.e, f.now, id, 1), 1);
    ck_assert_str_eq(f.last_abort, "TaskRevokedError");
    llm_done(&f, 0, LLM_PERMANENT, "TaskRevokedError", -1, "partial te");
    log_is(&f, "call1 abort1 done store-REVOKED");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "partial te"));
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_expired)
{
    struct fake f;
    fake_init(&f, NULL);
    f.now.epoch_us = 2000000000000000LL; /* 2033: after its expiry */
    fake_start(&f);
    deliver(&f, generate(&f, "expires"));
    log_is(&f, "store-REVOKED");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "expired"));
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_eta_held_then_run)
{
    struct fake f;
    struct engine_stats st;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "eta"));
    log_is(&f, "");
    engine_stats(f.e, &st);
    ck_assert_uint_eq(st.neta, 1);
    /* held eta tasks widen the prefetch window */
    ck_assert_int_eq(f.prefetch, 4 * 4 + 1);
    engine_on_tick(f.e, f.now);
    log_is(&f, "");
    f.now.epoch_us = 1893553446000000LL; /* just after 2030-01-02T03:04:05.678901 */
    engine_on_tick(f.e, f.now);
    ck_assert_int_eq(f.prefetch, 16);
    llm_done(&f, 0, LLM_OK, NULL, -1, "later");
    stored(&f, 0, 0);
    log_is(&f, "call1 done store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_duplicate_joins_running_job)
{
    struct fake f;
    struct delivery *again;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    again = generate(&f, "send_task_args");
    again->redelivered = 1;
    deliver(&f, again);
    /* no second call, no read: it rides on the first */
    log_is(&f, "call1");
    llm_done(&f, 0, LLM_OK, NULL, -1, "once");
    stored(&f, 0, 0);
    log_is(&f, "done store-SUCCESS stored ack1 ack2 release1 release2");
    ck_assert_int_eq(f.ncalls, 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_redelivery_with_success_stored)
{
    struct fake f;
    struct delivery *d;
    struct job *j;
    static const char meta[] = "{\"status\": \"SUCCESS\", \"result\": \"hi\"}";
    fake_init(&f, NULL);
    fake_start(&f);
    d = generate(&f, "send_task_args");
    d->redelivered = 1;
    deliver(&f, d);
    log_is(&f, "read1");
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, meta, strlen(meta));
    /* durable already: acked without a second call */
    log_is(&f, "ack1 release1");
    ck_assert_int_eq(f.ncalls, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_redelivery_with_nothing_stored_runs)
{
    struct fake f;
    struct delivery *d;
    struct job *j;
    fake_init(&f, NULL);
    fake_start(&f);
    d = generate(&f, "send_task_args");
    d->redelivered = 1;
    deliver(&f, d);
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, NULL, 0);
    llm_done(&f, 0, LLM_OK, NULL, -1, "again");
    stored(&f, 0, 0);
    log_is(&f, "read1 call1 done store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_parking_far_eta)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.park_after = 60;
    fake_start(&f);
    deliver(&f, generate(&f, "eta"));
    log_is(&f, "publish:celeriac.park.celery");
    confirm(&f, 0, 1);
    /* the copy is in: the original is acked and the job let go */
    log_is(&f, "confirm ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_parking_running_keeps_a_lease)
{
    struct fake f;
    const cJSON *h;
    fake_init(&f, NULL);
    f.cfg.park_after = 60;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    f.now.loop_ms += 61000;
    engine_on_tick(f.e, f.now);
    log_is(&f, "call1 publish:celeriac.park.celery lease-set");
    h = cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "x-celeriac-parked");
    ck_assert_str_eq(h->valuestring, "celery@test");
    confirm(&f, 0, 1);
    llm_done(&f, 0, LLM_OK, NULL, -1, "long");
    stored(&f, 0, 0);
    /* acked once (by the park), the lease dropped when it is done */
    log_is(&f, "confirm ack1 done store-SUCCESS stored lease-del release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* -------------------------------------------------------- delayed delivery */

#define ETA_FIXTURE_US                                                                   \
    1893553445678901LL /* the eta fixture's 2030-01-02T03:04:05.678901 */

/* An eta past the horizon on a transport with native delayed delivery: a copy
 * to celery_delayed_27 spelling the whole seconds left, then the ack. */
START_TEST(test_delayed_far_eta)
{
    struct fake f;
    struct delivery *d;
    uint64_t s;
    size_t off;
    const char *rk;
    fake_init(&f, NULL);
    f.cfg.delayed_horizon_s = 3;
    fake_start(&f);
    d = generate(&f, "eta");
    d->caps |= MSG_CAP_DELAYED;
    cJSON_AddNumberToObject(d->headers, "x-delivery-count", 2);
    deliver(&f, d);
    log_is(&f, "publish:celery_delayed_27");
    rk = f.pubs[0].routing_key;
    ck_assert_int_eq(delayed_parse_routing_key(rk, strlen(rk), &s, &off), 0);
    ck_assert_uint_eq(s, (uint64_t)((ETA_FIXTURE_US - FAKE_T0_US) / 1000000));
    ck_assert_str_eq(rk + off, "celery");
    /* the count is the original queue's, not the copy's */
    ck_assert_ptr_null(
        cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "x-delivery-count"));
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "eta"));
    confirm(&f, 0, 1);
    log_is(&f, "confirm ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* Not confirmed: the delivery stays and is held here. */
START_TEST(test_delayed_nack_holds_it)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    f.cfg.delayed_horizon_s = 3;
    fake_start(&f);
    d = generate(&f, "eta");
    d->caps |= MSG_CAP_DELAYED;
    deliver(&f, d);
    log_is(&f, "publish:celery_delayed_27");
    confirm(&f, 0, 0);
    log_is(&f, "nack");
    f.now.epoch_us = ETA_FIXTURE_US + 1000;
    engine_on_tick(f.e, f.now);
    llm_done(&f, 0, LLM_OK, NULL, -1, "later");
    stored(&f, 0, 0);
    log_is(&f, "call1 done store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* Within the horizon, or without the capability, or from a queue added at run
 * time (not bound to celery_delayed_delivery): held here. */
START_TEST(test_delayed_near_or_unbound_eta_is_held)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    f.cfg.delayed_horizon_s = 3;
    f.now.epoch_us = ETA_FIXTURE_US - 2500000;
    fake_start(&f);
    d = generate(&f, "eta");
    d->caps |= MSG_CAP_DELAYED;
    deliver(&f, d);
    log_is(&f, "");
    f.now.epoch_us = ETA_FIXTURE_US - 60000000;
    d = generate(&f, "eta");
    cJSON_ReplaceItemInObjectCaseSensitive(d->headers, "id",
                                           cJSON_CreateString("other-id-1"));
    deliver(&f, d); /* no MSG_CAP_DELAYED */
    log_is(&f, "");
    d = generate(&f, "eta");
    cJSON_ReplaceItemInObjectCaseSensitive(d->headers, "id",
                                           cJSON_CreateString("other-id-2"));
    d->caps |= MSG_CAP_DELAYED;
    free(d->queue);
    d->queue = strdup("added-later");
    deliver(&f, d);
    log_is(&f, "");
    fake_release(&f);
}
END_TEST

/* ---------------------------------------------------------- delivery limit */

static const struct {
    int count, limit, dead;
} limits[] = {
    {19, 20, 1}, {25, 20, 1}, {18, 20, 0}, {0, 1, 1}, {3, 4, 1}, {2, 4, 0}, {1000, 0, 0},
};

START_TEST(test_delivery_limit)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    f.cfg.delivery_limit = limits[_i].limit;
    fake_start(&f);
    d = generate(&f, "send_task_args");
    cJSON_AddNumberToObject(d->headers, "x-delivery-count", limits[_i].count);
    deliver(&f, d);
    if (!limits[_i].dead) {
        log_is(&f, "call1");
        fake_release(&f);
        return;
    }
    log_is(&f, "publish:celeriac.dlx");
    ck_assert_str_eq(
        cJSON_GetObjectItemCaseSensitive(f.pubs[0].headers, "x-celeriac-reason")
            ->valuestring,
        "delivery limit");
    confirm(&f, 0, 1);
    ck_assert_ptr_nonnull(strstr(f.metas[0], "\"DeliveryLimitExceeded\""));
    stored(&f, 0, 0);
    log_is(&f, "confirm store-FAILURE stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_delivery_limit_rule)
{
    ck_assert(!engine_delivery_limit_reached(-1, 20)); /* no header */
    ck_assert(!engine_delivery_limit_reached(18, 20));
    ck_assert(engine_delivery_limit_reached(19, 20));
    ck_assert(!engine_delivery_limit_reached(1000000, 0)); /* off */
    ck_assert(engine_delivery_limit_reached(0, 1));
}
END_TEST

START_TEST(test_revoked_meta_of_unseen_id)
{
    struct fake f;
    char *meta;
    cJSON *m, *res;
    fake_init(&f, NULL);
    fake_start(&f);
    meta = engine_revoked_meta(f.e, "never-seen-1", f.now);
    ck_assert_ptr_nonnull(meta);
    m = cJSON_Parse(meta);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(m, "status")->valuestring,
                     "REVOKED");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(m, "task_id")->valuestring,
                     "never-seen-1");
    res = cJSON_GetObjectItemCaseSensitive(m, "result");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(res, "exc_type")->valuestring,
                     "TaskRevokedError");
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(res, "exc_module")->valuestring,
                     "celery.exceptions");
    ck_assert(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "date_done")));
    cJSON_Delete(m);
    cr_free(meta);
    /* nothing happened to the engine */
    log_is(&f, "");
    fake_release(&f);
}
END_TEST

START_TEST(test_time_limits)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "time_limits")); /* timelimit [30, 20.5] */
    f.now.loop_ms += 20499;
    engine_on_tick(f.e, f.now);
    log_is(&f, "call1");
    f.now.loop_ms += 1;
    engine_on_tick(f.e, f.now);
    ck_assert_str_eq(f.last_abort, "SoftTimeLimitExceeded");
    llm_done(&f, 0, LLM_PERMANENT, "SoftTimeLimitExceeded", -1, NULL);
    log_is(&f, "abort1 done publish:celeriac.dlx");
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-FAILURE stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_cold_shutdown_settles_nothing)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    engine_shutdown(f.e, f.now, 1);
    llm_done(&f, 0, LLM_OK, NULL, -1, "too late");
    log_is(&f, "call1 stop-cold done release1");
    ck_assert_int_eq(f.acks[1] + f.rejects[1], 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_warm_shutdown)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.concurrency = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    deliver(&f, generate(&f, "delay_kwargs"));
    engine_shutdown(f.e, f.now, 0);
    /* the one not started goes back now; the running one finishes */
    log_is(&f, "call1 requeue2 release2");
    llm_done(&f, 0, LLM_OK, NULL, -1, "done");
    stored(&f, 0, 0);
    log_is(&f, "done store-SUCCESS stored ack1 release1 stop-warm");
    ck_assert_int_eq(f.stopped, 1);
    /* after it a delivery is given back at once */
    deliver(&f, generate(&f, "eta"));
    log_is(&f, "requeue3 release3");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_lost_connection_before_start)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.concurrency = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    deliver(&f, generate(&f, "delay_kwargs"));
    f.connected = 0;
    llm_done(&f, 0, LLM_OK, NULL, -1, "ok");
    /* the second is not started: its delivery went back with the connection */
    log_is(&f, "call1 done store-SUCCESS release2");
    stored(&f, 0, CR_ECANCELED);
    /* the store went away too: nothing acked */
    log_is(&f, "stored release1");
    ck_assert_int_eq(f.acks[1] + f.acks[2], 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_track_started)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.track_started = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    log_is(&f, "store-STARTED call1");
    llm_done(&f, 0, LLM_OK, NULL, -1, "x");
    stored(&f, 1, 0);
    /* the ack waits for the final state only, and the job for both */
    log_is(&f, "done store-SUCCESS stored ack1");
    stored(&f, 0, 0);
    log_is(&f, "stored release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_parked_copy_of_a_live_runner_is_parked_again)
{
    struct fake f;
    struct delivery *d;
    struct job *j;
    fake_init(&f, NULL);
    f.cfg.park_after = 60;
    fake_start(&f);
    d = generate(&f, "send_task_args");
    cJSON_AddStringToObject(d->headers, "x-celeriac-parked", "celery@other");
    deliver(&f, d);
    /* it came back through a dead-letter path: read first, then the lease */
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, NULL, 0);
    log_is(&f, "read1 lease-get");
    f.leases[0] = NULL;
    engine_on_lease(f.e, f.now, j, 0, "celery@other");
    log_is(&f, "publish:celeriac.park.celery");
    confirm(&f, 0, 1);
    log_is(&f, "confirm ack1 release1");
    ck_assert_int_eq(f.ncalls, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_parked_copy_with_lapsed_lease_runs)
{
    struct fake f;
    struct delivery *d;
    struct job *j;
    fake_init(&f, NULL);
    f.cfg.park_after = 60;
    fake_start(&f);
    d = generate(&f, "send_task_args");
    cJSON_AddStringToObject(d->headers, "x-celeriac-parked", "celery@other");
    deliver(&f, d);
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, NULL, 0);
    f.leases[0] = NULL;
    engine_on_lease(f.e, f.now, j, 0, NULL);
    log_is(&f, "read1 lease-get call1");
    llm_done(&f, 0, LLM_OK, NULL, -1, "mine now");
    stored(&f, 0, 0);
    log_is(&f, "done store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_revoke_waiting_job)
{
    struct fake f;
    struct engine_stats st;
    fake_init(&f, NULL);
    f.cfg.concurrency = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    deliver(&f, generate(&f, "delay_kwargs"));
    engine_stats(f.e, &st);
    ck_assert_int_eq(st.active, 1);
    ck_assert_uint_eq(st.nready, 1);
    ck_assert_int_eq(engine_revoke(f.e, f.now, "0f0b8c1e-0002-4000-8000-000000000002", 1),
                     0);
    log_is(&f, "call1 store-REVOKED");
    stored(&f, 0, 0);
    log_is(&f, "stored ack2 release2");
    ck_assert(engine_is_revoked(f.e, "0f0b8c1e-0002-4000-8000-000000000002", f.now));
    llm_done(&f, 0, LLM_OK, NULL, -1, "first");
    stored(&f, 1, 0);
    log_is(&f, "done store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_acks_early)
{
    struct fake f;
    fake_init(&f, NULL);
    f.cfg.acks_early = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_OK, NULL, -1, "x");
    stored(&f, 0, 0);
    /* acked when it started, never again */
    log_is(&f, "ack1 call1 done store-SUCCESS stored release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

static void count_job(struct job *j, void *arg)
{
    (void)j;
    ++*(int *)arg;
}

START_TEST(test_queries)
{
    struct fake f;
    int running = 0, ready = 0, eta = 0;
    fake_init(&f, NULL);
    f.cfg.concurrency = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    deliver(&f, generate(&f, "delay_kwargs"));
    deliver(&f, generate(&f, "eta"));
    engine_each_job(f.e, ENGINE_JOBS_RUNNING, count_job, &running);
    engine_each_job(f.e, ENGINE_JOBS_READY, count_job, &ready);
    engine_each_job(f.e, ENGINE_JOBS_ETA, count_job, &eta);
    ck_assert_int_eq(running, 1);
    ck_assert_int_eq(ready, 1);
    ck_assert_int_eq(eta, 1);
    ck_assert_ptr_nonnull(engine_find_job(f.e, "0f0b8c1e-0001-4000-8000-000000000001"));
    ck_assert_int_eq(engine_set_rate_limit(f.e, f.now, "nope", "1/s"), CR_ENOTFOUND);
    ck_assert_int_eq(engine_set_rate_limit(f.e, f.now, "llm.generate", "x/s"), CR_EINVAL);
    ck_assert_int_eq(engine_set_rate_limit(f.e, f.now, "llm.generate", "10/m"), 0);
    ck_assert_str_eq(engine_rate_limit(f.e, "llm.generate"), "10/m");
    /* more slots start the waiting one (the bucket starts full) */
    engine_set_concurrency(f.e, f.now, 2);
    log_is(&f, "call1 call2");
    ck_assert_int_eq(f.prefetch, 2 * 4 + 1);
    fake_release(&f);
}
END_TEST

/* ---------------------------------------------------------------- canvas */

/* Asserts j's canvas plan is at step want, reached from *at by a move
 * engine__fu_step_legal() allows (or still there), and notes it in *at. */
static void step_is(struct job *j, enum fu_step want, enum fu_step *at)
{
    enum fu_step s = engine__followup_step(j);
    ck_assert_msg(s == want, "step %s, want %s", engine__fu_step_names[s],
                  engine__fu_step_names[want]);
    ck_assert_msg(s == *at || engine__fu_step_legal(*at, s), "%s -> %s is not a move",
                  engine__fu_step_names[*at], engine__fu_step_names[s]);
    *at = s;
}

#define CHORD_GID "bc6f0b24-2613-4ad2-ba83-c4e89f89676f"
#define CHORD_MEMBER "[1, \"0f0b8c1e-0013-4000-8000-000000000013\", \"SUCCESS\", [1, 1]]"

static void set_header(struct delivery *d, const char *key, cJSON *v)
{
    cJSON_DeleteItemFromObjectCaseSensitive(d->headers, key);
    cJSON_AddItemToObject(d->headers, key, v);
}

static const char *pub_header(struct fake *f, int i, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(f->pubs[i].headers, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* A callback is published, confirmed, and only then the result is stored. */
START_TEST(test_callback_before_store)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    fake_start(&f);
    d = fixture(&f, "link", NULL, NULL);
    set_header(d, "ignore_result", cJSON_CreateFalse());
    deliver(&f, d);
    log_is(&f, "publish:celery");
    ck_assert_str_eq(f.pubs[0].exchange, "");
    ck_assert_str_eq(pub_header(&f, 0, "task"), "proj.add");
    ck_assert_str_eq(pub_header(&f, 0, "parent_id"),
                     "0f0b8c1e-0010-4000-8000-000000000010");
    ck_assert_str_eq(pub_header(&f, 0, "root_id"),
                     "0f0b8c1e-0010-4000-8000-000000000010");
    /* the result first in the callback's args */
    ck_assert_msg(!strncmp(f.pubs[0].body, "[[[2, 2], 10], {}", 17), "%s",
                  f.pubs[0].body);
    confirm(&f, 0, 1);
    log_is(&f, "confirm store-SUCCESS");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_callback_ignore_result)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "link", NULL, NULL));
    /* nothing to store, the callback all the same */
    log_is(&f, "publish:celery");
    confirm(&f, 0, 1);
    log_is(&f, "confirm ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_callback_nack_leaves_it_unacked)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    fake_start(&f);
    d = fixture(&f, "link", NULL, NULL);
    set_header(d, "ignore_result", cJSON_CreateFalse());
    deliver(&f, d);
    confirm(&f, 0, 0);
    /* nothing stored: the redelivery runs it and publishes again */
    log_is(&f, "publish:celery nack release1");
    ck_assert_int_eq(f.acks[1] + f.rejects[1], 0);
    ck_assert_int_eq(f.nstores, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_callback_broker_away)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    f.fail_publish = CR_EBROKER;
    fake_start(&f);
    d = fixture(&f, "link", NULL, NULL);
    set_header(d, "ignore_result", cJSON_CreateFalse());
    deliver(&f, d);
    log_is(&f, "release1");
    ck_assert_int_eq(f.nstores, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_chain_next_step)
{
    struct fake f;
    const cJSON *embed;
    cJSON *body;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chain", NULL, NULL));
    log_is(&f, "publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "id"), "0f0b8c1e-0111-4000-8000-000000000111");
    ck_assert_str_eq(pub_header(&f, 0, "parent_id"),
                     "0f0b8c1e-0011-4000-8000-000000000011");
    body = cJSON_Parse(f.pubs[0].body);
    ck_assert_ptr_nonnull(body);
    /* accumulate(1, 2) -> [1, 2], then the step's own 3; the rest of the chain */
    ck_assert_msg(!strncmp(f.pubs[0].body, "[[[1, 2], 3], {}", 16), "%s", f.pubs[0].body);
    embed = cJSON_GetArrayItem(body, 2);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(embed, "chain")),
                     1);
    cJSON_Delete(body);
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* What a job publishes (a chain's next step, its retry) passes through
 * outbound_headers first: the switchboard's trace context goes with it. */
START_TEST(test_outbound_headers_hook)
{
    struct fake f;
    fake_init(&f, NULL);
    f.mark_outbound = 1;
    fake_start(&f);
    deliver(&f, fixture(&f, "chain", NULL, NULL));
    log_is(&f, "publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "x-from"), "0f0b8c1e-0011-4000-8000-000000000011");
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-SUCCESS stored ack1 release1");
    fake_release(&f);

    fake_init(&f, NULL);
    f.mark_outbound = 1;
    fake_start(&f);
    deliver(&f, generate(&f, "send_task_args"));
    llm_done(&f, 0, LLM_RETRYABLE, "RateLimitError", 1500, NULL);
    log_is(&f, "call1 done publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "x-from"), pub_header(&f, 0, "id"));
    confirm(&f, 0, 1);
    stored(&f, 0, 0);
    fake_release(&f);
}
END_TEST

#define CHAIN_GENERATE_BODY                                                              \
    "[[\"hello\"], {}, {\"callbacks\": null, \"errbacks\": null, \"chain\": "            \
    "[{\"task\": \"proj.add\", \"args\": [4], \"kwargs\": {}, \"options\": "             \
    "{\"task_id\": \"0f0b8c1e-0211-4000-8000-000000000211\"}, \"subtask_type\": null, "  \
    "\"immutable\": false}, {\"task\": \"proj.add\", \"args\": [3], \"kwargs\": {}, "    \
    "\"options\": {\"task_id\": \"0f0b8c1e-0111-4000-8000-000000000111\"}, "             \
    "\"subtask_type\": null, \"immutable\": false}], \"chord\": null}]"

/* A failed chain step: its FAILURE goes to every later step, then its own;
 * the ack waits for all three. */
START_TEST(test_chain_failure_fails_later_steps)
{
    struct fake f;
    char st[32];
    fake_init(&f, NULL);
    f.cfg.dead_letter_exchange = "";
    fake_start(&f);
    deliver(&f, fixture(&f, "chain", "llm.generate", CHAIN_GENERATE_BODY));
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "call1 done store-for-FAILURE:0211 store-for-FAILURE:0111 store-FAILURE");
    ck_assert_str_eq(meta_status(&f, 0, st, sizeof(st)), "FAILURE");
    ck_assert_ptr_nonnull(strstr(f.metas[0], "\"task_id\": \"0f0b8c1e-0211"));
    ck_assert_ptr_nonnull(strstr(f.metas[1], "BadRequestError"));
    stored(&f, 2, 0);
    stored(&f, 0, 0);
    log_is(&f, "stored stored");
    stored(&f, 1, 0);
    log_is(&f, "stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A chord header member that does not complete its chord: stored, then its
 * part-return, then acked. */
START_TEST(test_chord_member_not_last)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    log_is(&f, "store-SUCCESS");
    stored(&f, 0, 0);
    log_is(&f, "stored chord-part");
    ck_assert_str_eq(f.chords[0].group_id, CHORD_GID);
    ck_assert_int_eq(f.chords[0].group_index, 0);
    ck_assert_str_eq(f.chords[0].member, CHORD_MEMBER);
    chord_done(&f, 0, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    ck_assert_int_eq(f.npubs, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* The last member publishes the body with the results in order, confirmed,
 * deletes the chord's keys, then acks. */
START_TEST(test_chord_member_completes)
{
    static const char *const members[] = {
        CHORD_MEMBER, "[1, \"0f0b8c1e-0014-4000-8000-000000000014\", \"SUCCESS\", 4]"};
    struct fake f;
    enum fu_step at = FU_NONE;
    struct job *j;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    j = f.stores[0];
    step_is(j, FU_STORES, &at);
    stored(&f, 0, 0);
    step_is(j, FU_PART, &at);
    chord_done(&f, 0, 0, members, 2);
    step_is(j, FU_JOIN_MSGS, &at);
    log_is(&f, "store-SUCCESS stored chord-part complete publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "id"), "0f0b8c1e-0813-4000-8000-000000000813");
    ck_assert_str_eq(pub_header(&f, 0, "task"), "proj.tsum");
    ck_assert_msg(!strncmp(f.pubs[0].body, "[[[[1, 1], 4]], {}", 18), "%s",
                  f.pubs[0].body);
    confirm(&f, 0, 1);
    step_is(j, FU_CLEAR, &at);
    log_is(&f, "confirm chord-clear");
    ck_assert_str_eq(f.chords[1].group_id, CHORD_GID);
    chord_done(&f, 1, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    ck_assert_int_eq(f.npubs, 1);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A failed member: the body gets a ChordError FAILURE, the keys go. */
START_TEST(test_chord_member_failed)
{
    static const char *const members[] = {
        CHORD_MEMBER, "[1, \"0f0b8c1e-0014-4000-8000-000000000014\", \"FAILURE\", "
                      "{\"exc_type\": \"ValueError\", \"exc_message\": [\"x\"], "
                      "\"exc_module\": \"builtins\"}]"};
    struct fake f;
    enum fu_step at = FU_NONE;
    struct job *j;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    j = f.stores[0];
    step_is(j, FU_STORES, &at);
    stored(&f, 0, 0);
    step_is(j, FU_PART, &at);
    chord_done(&f, 0, 0, members, 2);
    step_is(j, FU_BODY, &at);
    log_is(&f, "store-SUCCESS stored chord-part complete store-for-FAILURE:0813");
    ck_assert_ptr_nonnull(strstr(f.metas[1], "ChordError"));
    ck_assert_ptr_nonnull(strstr(f.metas[1], "0f0b8c1e-0014"));
    stored(&f, 1, 0);
    step_is(j, FU_CLEAR, &at);
    log_is(&f, "stored chord-clear");
    chord_done(&f, 1, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    ck_assert_int_eq(f.npubs, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* The body's publish not confirmed: unacked, so the redelivery joins again. */
START_TEST(test_chord_body_nack)
{
    static const char *const members[] = {CHORD_MEMBER};
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    stored(&f, 0, 0);
    chord_done(&f, 0, 0, members, 1);
    confirm(&f, 0, 0);
    log_is(&f, "store-SUCCESS stored chord-part complete publish:celery nack release1");
    ck_assert_int_eq(f.acks[1], 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A crash between the store and the ack: the redelivery finds SUCCESS,
 * does the part-return again with the same member, and publishes nothing
 * else (here it completes the chord: the body goes once). */
static void redelivered_chord_member(int completes)
{
    static const char meta[] =
        "{\"status\": \"SUCCESS\", \"result\": [1, 1], \"traceback\": null, "
        "\"children\": "
        "[], \"date_done\": \"2023-11-14T22:13:20.000000+00:00\", \"group_id\": "
        "\"" CHORD_GID "\", \"task_id\": \"0f0b8c1e-0013-4000-8000-000000000013\"}";
    static const char *const members[] = {CHORD_MEMBER};
    struct fake f;
    struct delivery *d;
    struct job *j;
    enum fu_step at = FU_NONE;
    fake_init(&f, NULL);
    fake_start(&f);
    d = fixture(&f, "chord_header", NULL, NULL);
    d->redelivered = 1;
    deliver(&f, d);
    log_is(&f, "read1");
    j = f.reads[0];
    f.reads[0] = NULL;
    step_is(j, FU_NONE, &at);
    engine_on_state(f.e, f.now, j, 0, meta, strlen(meta));
    step_is(j, FU_PART, &at);
    log_is(&f, "chord-part");
    ck_assert_str_eq(f.chords[0].member, CHORD_MEMBER);
    if (!completes) {
        chord_done(&f, 0, 0, NULL, 0);
        log_is(&f, "chord-done ack1 release1");
        ck_assert_int_eq(f.npubs, 0);
    } else {
        chord_done(&f, 0, 0, members, 1);
        step_is(j, FU_JOIN_MSGS, &at);
        log_is(&f, "complete publish:celery");
        ck_assert_str_eq(pub_header(&f, 0, "task"), "proj.tsum");
        confirm(&f, 0, 1);
        step_is(j, FU_CLEAR, &at);
        chord_done(&f, 1, 0, NULL, 0);
        log_is(&f, "confirm chord-clear chord-done ack1 release1");
        ck_assert_int_eq(f.npubs, 1);
    }
    ck_assert_int_eq(f.ncalls + f.nstores, 0);
    check_once(&f);
    fake_release(&f);
}

START_TEST(test_redelivered_chord_member)
{
    redelivered_chord_member(0);
}
END_TEST

START_TEST(test_redelivered_chord_member_completes)
{
    redelivered_chord_member(1);
}
END_TEST

/* A redelivered chain step whose SUCCESS is stored: its next step was
 * confirmed before the store, so nothing is published again. */
START_TEST(test_redelivered_chain_publishes_nothing)
{
    static const char meta[] = "{\"status\": \"SUCCESS\", \"result\": [1, 2]}";
    struct fake f;
    struct delivery *d;
    struct job *j;
    fake_init(&f, NULL);
    fake_start(&f);
    d = fixture(&f, "chain", NULL, NULL);
    d->redelivered = 1;
    deliver(&f, d);
    j = f.reads[0];
    f.reads[0] = NULL;
    engine_on_state(f.e, f.now, j, 0, meta, strlen(meta));
    log_is(&f, "read1 ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A revoked chord member still does its part-return (REVOKED). */
START_TEST(test_revoked_chord_member)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    engine_revoke(f.e, f.now, "0f0b8c1e-0013-4000-8000-000000000013", 0);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    log_is(&f, "store-REVOKED");
    stored(&f, 0, 0);
    log_is(&f, "stored chord-part");
    ck_assert_ptr_nonnull(strstr(f.chords[0].member, "\"REVOKED\", {\"exc_type\": "
                                                     "\"TaskRevokedError\""));
    chord_done(&f, 0, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A part-return Redis refused: unacked, so the redelivery does it again. */
START_TEST(test_chord_part_refused)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, NULL));
    stored(&f, 0, 0);
    chord_done(&f, 0, CR_EBACKEND, NULL, 0);
    log_is(&f, "store-SUCCESS stored chord-part chord-done release1");
    ck_assert_int_eq(f.acks[1], 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A callback Celery could not apply either: dropped with a log line, the
 * task's own result stored and acked. */
START_TEST(test_bad_callback_dropped)
{
    struct fake f;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f,
            fixture(&f, "group_member", NULL,
                    "[[2, 2], {}, {\"callbacks\": [42], \"errbacks\": null, \"chain\": "
                    "null, \"chord\": null}]"));
    log_is(&f, "store-SUCCESS");
    stored(&f, 0, 0);
    log_is(&f, "stored ack1 release1");
    ck_assert_int_eq(f.npubs, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* An errback: published (confirmed) with the failed task's id, before the
 * dead letter and the FAILURE. */
START_TEST(test_errback_on_failure)
{
    struct fake f;
    struct delivery *d;
    fake_init(&f, NULL);
    fake_start(&f);
    d = fixture(&f, "link", "llm.generate",
                "[[\"hello\"], {}, {\"callbacks\": null, \"errbacks\": [{\"task\": "
                "\"proj.onerr\", \"args\": [], \"kwargs\": {}, \"options\": {}, "
                "\"subtask_type\": null, \"immutable\": false}], \"chain\": null, "
                "\"chord\": null}]");
    set_header(d, "ignore_result", cJSON_CreateFalse());
    deliver(&f, d);
    llm_done(&f, 0, LLM_PERMANENT, "BadRequestError", -1, NULL);
    log_is(&f, "call1 done publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "task"), "proj.onerr");
    ck_assert_msg(
        !strncmp(f.pubs[0].body, "[[\"0f0b8c1e-0010-4000-8000-000000000010\"]", 40), "%s",
        f.pubs[0].body);
    confirm(&f, 0, 1);
    log_is(&f, "confirm publish:celeriac.dlx");
    confirm(&f, 1, 1);
    stored(&f, 0, 0);
    log_is(&f, "confirm store-FAILURE stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* The body of a canvas capture (tests/fixtures/messages/canvas/NAME.json). */
static char *canvas_body(const char *name)
{
    char path[256], *text, *body;
    cJSON *root;
    snprintf(path, sizeof(path), FIXTURES "canvas/%s.json", name);
    text = unit_read_file(path, NULL);
    root = cJSON_Parse(text);
    free(text);
    ck_assert_ptr_nonnull(root);
    body = strdup(cJSON_GetObjectItemCaseSensitive(
                      cJSON_GetObjectItemCaseSensitive(root, "input"), "body")
                      ->valuestring);
    cJSON_Delete(root);
    return body;
}

/* A chain whose next step is a chord: its size goes to Redis before any of
 * its header members is published. */
START_TEST(test_chain_launches_a_chord)
{
    struct fake f;
    char *body = canvas_body("chain_chord");
    enum fu_step at = FU_NONE;
    struct job *j;
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chain", NULL, body));
    free(body);
    log_is(&f, "chord-size");
    j = f.chords[0].j;
    step_is(j, FU_SIZES, &at);
    /* a fresh group id, as Celery 5.2.6 draws one for a chord in a chain */
    ck_assert_int_eq(strlen(f.chords[0].group_id), 36);
    ck_assert_int_eq(f.chords[0].size, 2);
    chord_done(&f, 0, 0, NULL, 0);
    step_is(j, FU_MSGS, &at);
    log_is(&f, "chord-done publish:celery publish:celery");
    ck_assert_str_eq(pub_header(&f, 0, "id"), "c11e0000-0000-4000-8000-000000001002");
    ck_assert_str_eq(pub_header(&f, 1, "group"), f.chords[0].group_id);
    confirm(&f, 1, 1);
    step_is(j, FU_MSGS, &at);
    confirm(&f, 0, 1);
    step_is(j, FU_STORES, &at);
    stored(&f, 0, 0);
    log_is(&f, "confirm confirm store-SUCCESS stored ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_chord_size_refused)
{
    struct fake f;
    char *body = canvas_body("chain_chord");
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chain", NULL, body));
    free(body);
    chord_done(&f, 0, CR_EBACKEND, NULL, 0);
    /* nothing published, nothing stored: the redelivery tries again */
    log_is(&f, "chord-size chord-done release1");
    ck_assert_int_eq(f.npubs + f.nstores, 0);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* Every step has its own name, and the moves are exactly these. */
START_TEST(test_followup_step_names_and_moves)
{
    static const struct {
        enum fu_step a, b;
    } moves[] = {
        {FU_NONE, FU_SIZES},      {FU_NONE, FU_MSGS},
        {FU_NONE, FU_STORES},     {FU_NONE, FU_PART},
        {FU_SIZES, FU_MSGS},      {FU_SIZES, FU_STORES},
        {FU_MSGS, FU_STORES},     {FU_STORES, FU_PART},
        {FU_PART, FU_PART},       {FU_PART, FU_JOIN_SIZES},
        {FU_PART, FU_JOIN_MSGS},  {FU_PART, FU_BODY},
        {FU_PART, FU_CLEAR},      {FU_JOIN_SIZES, FU_JOIN_MSGS},
        {FU_JOIN_SIZES, FU_BODY}, {FU_JOIN_SIZES, FU_CLEAR},
        {FU_JOIN_MSGS, FU_BODY},  {FU_JOIN_MSGS, FU_CLEAR},
        {FU_BODY, FU_CLEAR},      {FU_CLEAR, FU_PART},
    };
    for (int a = 0; a < FU_NSTEPS; a++) {
        ck_assert_ptr_nonnull(engine__fu_step_names[a]);
        ck_assert_int_gt(strlen(engine__fu_step_names[a]), 0);
        for (int b = 0; b < a; b++)
            ck_assert_str_ne(engine__fu_step_names[a], engine__fu_step_names[b]);
        for (int b = 0; b < FU_NSTEPS; b++) {
            int want = 0;
            for (size_t k = 0; k < sizeof(moves) / sizeof(moves[0]); k++)
                want |= moves[k].a == (enum fu_step)a && moves[k].b == (enum fu_step)b;
            ck_assert_msg(engine__fu_step_legal(a, b) == want, "%s -> %s",
                          engine__fu_step_names[a], engine__fu_step_names[b]);
        }
    }
    ck_assert_str_eq(engine__fu_step_names[FU_CLEAR], "CLEAR");
    ck_assert_int_eq(engine__fu_step_legal(FU_NSTEPS, FU_NONE), 0);
    ck_assert_int_eq(engine__fu_step_legal(FU_NONE, FU_NSTEPS), 0);
}
END_TEST

/* A chord whose body is a chord: its join sets the inner chord's size, then
 * publishes its header, then the keys go: the join's plan has both steps. */
START_TEST(test_chord_body_is_a_chord)
{
    static const char *const members[] = {CHORD_MEMBER};
    struct fake f;
    enum fu_step at = FU_NONE;
    char *inner = canvas_body("chain_chord"), *body;
    cJSON *in = cJSON_Parse(inner), *own;
    struct job *j;
    ck_assert_ptr_nonnull(in);
    /* the header member's message, its chord body the chain's chord step */
    own = cJSON_Parse("[[1, 1], {}, {\"callbacks\": null, \"errbacks\": null, "
                      "\"chain\": null}]");
    cJSON_AddItemToObject(
        cJSON_GetArrayItem(own, 2), "chord",
        cJSON_DetachItemFromArray(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(in, 2), "chain"), 0));
    body = cJSON_PrintUnformatted(own);
    cJSON_Delete(own);
    cJSON_Delete(in);
    free(inner);
    fake_init(&f, NULL);
    fake_start(&f);
    deliver(&f, fixture(&f, "chord_header", NULL, body));
    cJSON_free(body);
    j = f.stores[0];
    stored(&f, 0, 0);
    step_is(j, FU_PART, &at);
    chord_done(&f, 0, 0, members, 1);
    step_is(j, FU_JOIN_SIZES, &at);
    log_is(&f, "store-SUCCESS stored chord-part complete chord-size");
    ck_assert_int_eq(f.chords[1].size, 2);
    chord_done(&f, 1, 0, NULL, 0);
    step_is(j, FU_JOIN_MSGS, &at);
    log_is(&f, "chord-done publish:celery publish:celery");
    confirm(&f, 0, 1);
    confirm(&f, 1, 1);
    step_is(j, FU_CLEAR, &at);
    log_is(&f, "confirm confirm chord-clear");
    chord_done(&f, 2, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* A failed task whose next chain step is a chord header member: the step
 * gets the FAILURE, and its part-return is done for it. */
START_TEST(test_chain_step_in_a_chord_header_fails)
{
    struct fake f;
    char *body = canvas_body("chord_header_chain");
    fake_init(&f, NULL);
    f.cfg.dead_letter_exchange = "";
    fake_start(&f);
    /* generate(1, 1): a TypeError before any call */
    deliver(&f, fixture(&f, "chain", "llm.generate", body));
    free(body);
    log_is(&f, "store-for-FAILURE:0001 store-FAILURE");
    ck_assert_str_eq(f.store_ids[0], "0f0b8c1e-0001-4000-8000-000000000162");
    stored(&f, 0, 0);
    stored(&f, 1, 0);
    log_is(&f, "stored stored chord-part");
    ck_assert_str_eq(f.chords[0].group_id, "c11e0000-0000-4000-8000-000000001001");
    ck_assert_ptr_nonnull(strstr(f.chords[0].member,
                                 "[1, \"0f0b8c1e-0001-4000-8000-000000000162\", "
                                 "\"FAILURE\", {\"exc_type\": \"TypeError\""));
    chord_done(&f, 0, 0, NULL, 0);
    log_is(&f, "chord-done ack1 release1");
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* The canvas flows swept for allocation failures. */
static const struct {
    const char *fixture, *task, *body;
    int fail; /* the LLM call fails */
} sweeps[] = {
    {"chord_header", NULL, NULL, 0},                   /* part-return, join */
    {"chain", NULL, NULL, 0},                          /* next chain step */
    {"chain", "llm.generate", CHAIN_GENERATE_BODY, 1}, /* later steps fail */
    {"link", "llm.generate",                           /* errback, dead letter */
     "[[\"hello\"], {}, {\"callbacks\": null, \"errbacks\": [{\"task\": \"e\", "
     "\"args\": [], \"kwargs\": {}, \"options\": {}, \"subtask_type\": null, "
     "\"immutable\": false}], \"chain\": null, \"chord\": null}]",
     1},
};

/* Drives a canvas flow to its end with every allocation failing in turn (a
 * part-return completes its chord): whatever fails, each delivery is
 * released once, settled at most once, and never acked before its stores. */
START_TEST(test_canvas_oom_sweep)
{
    static const char *const members[] = {CHORD_MEMBER};
    long n;
    for (n = 1; n < 5000; n++) {
        struct fake f;
        long failed;
        int rounds = 0;
        struct delivery *d;
        fake_init(&f, NULL);
        fake_start(&f);
        d = fixture(&f, sweeps[_i].fixture, sweeps[_i].task, sweeps[_i].body);
        cr_alloc_fail_after(n);
        deliver(&f, d);
        while (rounds++ < 10) {
            int busy = 0;
            for (int i = 0; i < f.ncalls; i++)
                if (f.calls[i]) {
                    llm_done(&f, i, sweeps[_i].fail ? LLM_PERMANENT : LLM_OK,
                             sweeps[_i].fail ? "BadRequestError" : NULL, -1, "fine");
                    busy = 1;
                }
            for (int i = 0; i < f.npubs; i++)
                if (f.pubs[i].p) {
                    confirm(&f, i, 1);
                    busy = 1;
                }
            for (int i = 0; i < f.nstores; i++)
                if (f.stores[i]) {
                    ck_assert_int_eq(f.acks[1], 0);
                    stored(&f, i, 0);
                    busy = 1;
                }
            for (int i = 0; i < f.nchords; i++)
                if (f.chords[i].j) {
                    if (f.chords[i].op == ENGINE_CHORD_PART)
                        chord_done(&f, i, 0, members, 1);
                    else
                        chord_done(&f, i, 0, NULL, 0);
                    busy = 1;
                }
            if (!busy)
                break;
        }
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        check_once(&f);
        /* with nothing failing, the whole flow ran to its ack */
        if (failed == 0)
            ck_assert_int_eq(f.acks[1], 1);
        fake_release(&f);
        if (failed == 0)
            break;
    }
    ck_assert_int_lt(n, 5000);
}
END_TEST

/* Every allocation of engine_on_delivery() fails in turn; whatever happens,
 * the delivery is released exactly once, settled at most once, and an ack
 * comes only after a store completed. */
START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1; n < 5000; n++) {
        struct fake f;
        struct delivery *d;
        long failed;
        int rounds = 0;
        fake_init(&f, NULL);
        fake_start(&f);
        d = generate(&f, "link");
        cr_alloc_fail_after(n);
        deliver(&f, d);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        /* run whatever it started to its end */
        while (rounds++ < 10) {
            int busy = 0;
            for (int i = 0; i < f.ncalls; i++)
                if (f.calls[i]) {
                    llm_done(&f, i, LLM_OK, NULL, -1, "fine");
                    busy = 1;
                }
            for (int i = 0; i < f.npubs; i++)
                if (f.pubs[i].p) {
                    confirm(&f, i, 1);
                    busy = 1;
                }
            for (int i = 0; i < f.nstores; i++)
                if (f.stores[i]) {
                    ck_assert_int_eq(f.acks[1], 0);
                    stored(&f, i, 0);
                    busy = 1;
                }
            if (!busy)
                break;
        }
        check_once(&f);
        fake_release(&f);
        if (failed == 0)
            break;
    }
    ck_assert_int_lt(n, 5000);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("core");
    log_threshold = LOG_CRITICAL + 1;
    tcase_add_test(tc, test_success_accumulate);
    tcase_add_test(tc, test_success_llm);
    tcase_add_test(tc, test_ignore_result_acks_without_store);
    tcase_add_test(tc, test_retry_with_retry_after);
    tcase_add_test(tc, test_first_received_kept_across_retries);
    tcase_add_test(tc, test_fallback_moves_on_at_once);
    tcase_add_test(tc, test_fallback_not_for_permanent_or_last);
    tcase_add_test(tc, test_retry_not_confirmed_leaves_it_unacked);
    tcase_add_test(tc, test_retry_broker_away_leaves_it_unacked);
    tcase_add_test(tc, test_exhausted_retries);
    tcase_add_test(tc, test_permanent_failure);
    tcase_add_test(tc, test_dead_letter_not_confirmed);
    tcase_add_loop_test(tc, test_dead_letter_lost_with_the_connection, 0, 2);
    tcase_add_loop_test(tc, test_redelivery_finishes_a_pending_dead_letter, 0, 2);
    tcase_add_test(tc, test_retry_stored_with_its_own_attempt);
    tcase_add_test(tc, test_redelivery_joins_while_the_pending_failure_is_stored);
    tcase_add_test(tc, test_unregistered_task);
    tcase_add_test(tc, test_bad_arguments_fail_without_call);
    tcase_add_test(tc, test_revoked_before_delivery);
    tcase_add_test(tc, test_revoked_during_call);
    tcase_add_test(tc, test_expired);
    tcase_add_test(tc, test_eta_held_then_run);
    tcase_add_test(tc, test_duplicate_joins_running_job);
    tcase_add_test(tc, test_redelivery_with_success_stored);
    tcase_add_test(tc, test_redelivery_with_nothing_stored_runs);
    tcase_add_test(tc, test_parking_far_eta);
    tcase_add_test(tc, test_delayed_far_eta);
    tcase_add_test(tc, test_delayed_nack_holds_it);
    tcase_add_test(tc, test_delayed_near_or_unbound_eta_is_held);
    tcase_add_loop_test(tc, test_delivery_limit, 0,
                        (int)(sizeof(limits) / sizeof(limits[0])));
    tcase_add_test(tc, test_delivery_limit_rule);
    tcase_add_test(tc, test_revoked_meta_of_unseen_id);
    tcase_add_test(tc, test_parking_running_keeps_a_lease);
    tcase_add_test(tc, test_time_limits);
    tcase_add_test(tc, test_cold_shutdown_settles_nothing);
    tcase_add_test(tc, test_warm_shutdown);
    tcase_add_test(tc, test_lost_connection_before_start);
    tcase_add_test(tc, test_track_started);
    tcase_add_test(tc, test_parked_copy_of_a_live_runner_is_parked_again);
    tcase_add_test(tc, test_parked_copy_with_lapsed_lease_runs);
    tcase_add_test(tc, test_revoke_waiting_job);
    tcase_add_test(tc, test_acks_early);
    tcase_add_test(tc, test_queries);
    tcase_add_test(tc, test_oom_sweep);
    tcase_add_test(tc, test_callback_before_store);
    tcase_add_test(tc, test_callback_ignore_result);
    tcase_add_test(tc, test_callback_nack_leaves_it_unacked);
    tcase_add_test(tc, test_callback_broker_away);
    tcase_add_test(tc, test_chain_next_step);
    tcase_add_test(tc, test_outbound_headers_hook);
    tcase_add_test(tc, test_chain_failure_fails_later_steps);
    tcase_add_test(tc, test_chord_member_not_last);
    tcase_add_test(tc, test_chord_member_completes);
    tcase_add_test(tc, test_chord_member_failed);
    tcase_add_test(tc, test_chord_body_nack);
    tcase_add_test(tc, test_redelivered_chord_member);
    tcase_add_test(tc, test_redelivered_chord_member_completes);
    tcase_add_test(tc, test_redelivered_chain_publishes_nothing);
    tcase_add_test(tc, test_revoked_chord_member);
    tcase_add_test(tc, test_chord_part_refused);
    tcase_add_test(tc, test_bad_callback_dropped);
    tcase_add_test(tc, test_errback_on_failure);
    tcase_add_test(tc, test_chain_launches_a_chord);
    tcase_add_test(tc, test_chord_size_refused);
    tcase_add_test(tc, test_chain_step_in_a_chord_header_fails);
    tcase_add_test(tc, test_chord_body_is_a_chord);
    tcase_add_test(tc, test_followup_step_names_and_moves);
    tcase_add_loop_test(tc, test_canvas_oom_sweep, 0, sizeof(sweeps) / sizeof(sweeps[0]));
    suite_add_tcase(s, tc);
    return s;
}
