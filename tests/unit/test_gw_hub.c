/* test_gw_hub.c -- progress sessions against a fake Redis and fake sockets:
 * replay then live with no gap or repeat, late joins, resume, trimming, retries
 * of failed reads, reconnects, stale answers, the memory limits (per session
 * and in total, byte by byte), and an OOM sweep. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "gateway/gw_hub.h"
#include "util/alloc.h"
#include "util/buf.h"
#include "util/err.h"

/* ------------------------------------------------------------ the fake */

#define MAX_SENT 512

struct fake {
    int subs, unsubs, fetches, metas;
    int fail_subscribe, fail_fetch;
    int fetching;
    int64_t after;
    uint64_t fetch_ticket, meta_ticket;
    char fetch_task[64];
    struct {
        struct gw_session *s;
        char text[256];
        size_t len;
    } sent[MAX_SENT];
    int nsent;
    struct gw_session *closed[64];
    int nclosed;
    struct {
        struct gw_session *s;
        int reason;
    } dropped[64];
    int ndropped;
};

static int f_subscribe(struct gw_hub *h, const char *id, void *p)
{
    struct fake *f = p;
    (void)h;
    (void)id;
    f->subs++;
    return f->fail_subscribe ? CR_EBACKEND : 0;
}

static void f_unsubscribe(struct gw_hub *h, const char *id, void *p)
{
    (void)h;
    (void)id;
    ((struct fake *)p)->unsubs++;
}

static int f_fetch(struct gw_hub *h, const char *id, int64_t after, uint64_t ticket,
                   void *p)
{
    struct fake *f = p;
    (void)h;
    ck_assert_msg(!f->fetching, "two reads at once");
    if (f->fail_fetch)
        return CR_ENOMEM;
    f->fetches++;
    f->fetching = 1;
    f->after = after;
    f->fetch_ticket = ticket;
    snprintf(f->fetch_task, sizeof(f->fetch_task), "%s", id);
    return 0;
}

static int f_get_meta(struct gw_hub *h, const char *id, uint64_t ticket, void *p)
{
    struct fake *f = p;
    (void)h;
    (void)id;
    f->metas++;
    f->meta_ticket = ticket;
    return 0;
}

static void f_send(struct gw_session *s, const char *text, size_t len, void *p)
{
    struct fake *f = p;
    ck_assert_int_lt(f->nsent, MAX_SENT);
    f->sent[f->nsent].s = s;
    f->sent[f->nsent].len = len;
    snprintf(f->sent[f->nsent].text, sizeof(f->sent[0].text), "%.*s", (int)len, text);
    f->nsent++;
}

static void f_close(struct gw_session *s, void *p)
{
    struct fake *f = p;
    f->closed[f->nclosed++] = s;
}

static void f_drop(struct gw_session *s, int reason, void *p)
{
    struct fake *f = p;
    ck_assert_int_lt(f->ndropped, 64);
    f->dropped[f->ndropped].s = s;
    f->dropped[f->ndropped].reason = reason;
    f->ndropped++;
}

static const struct gw_hub_ops ops = {f_subscribe, f_unsubscribe, f_fetch, f_get_meta,
                                      f_send,      f_close,       f_drop};

/* The "Redis stream": entries 1..n with text "t<seq> ". */
struct stream {
    int64_t first, last; /* first kept (after trimming), last written */
    const char *final_state;
    const char *result; /* final entry result (ignore_result) */
};

static char texts[64][16];

/* Answers the pending read from the stream, like XRANGE (after, + COUNT n. */
static void answer(struct gw_hub *h, struct fake *f, const struct stream *st, int count)
{
    struct gw_entry es[64];
    size_t n = 0;
    ck_assert(f->fetching);
    f->fetching = 0;
    for (int64_t q = f->after + 1; q <= st->last && (int)n < count; q++) {
        if (q < st->first)
            continue;
        memset(&es[n], 0, sizeof(es[n]));
        es[n].seq = q;
        es[n].attempt = 1;
        es[n].state = q == 1 ? "STARTED" : "PROGRESS";
        snprintf(texts[q], sizeof(texts[q]), q == 1 ? "" : "t%lld ", (long long)q);
        es[n].text = texts[q];
        es[n].text_len = strlen(texts[q]);
        es[n].tokens = (long)q;
        if (q == st->last && st->final_state) {
            es[n].state = st->final_state;
            es[n].text = "";
            es[n].text_len = 0;
            es[n].result = st->result;
            es[n].result_len = st->result ? strlen(st->result) : 0;
        }
        n++;
    }
    gw_hub_on_entries(h, f->fetch_task, f->fetch_ticket, es, n, (int)n < count);
}

static const char meta_ok[] =
    "{\"status\": \"SUCCESS\", \"result\": \"t2 t3 \", "
    "\"traceback\": null, \"children\": [], \"date_done\": \"d\", "
    "\"task_id\": \"T\"}";

/* The text a session got, and checks: seqs strictly increasing by one (after
 * the resume point), result last, nothing after it. */
static void collect(struct fake *f, struct gw_session *s, int64_t from, struct buf *text,
                    int *got_result, int *gaps)
{
    int64_t expect = from + 1;
    *got_result = 0;
    *gaps = 0;
    for (int i = 0; i < f->nsent; i++) {
        const char *t = f->sent[i].text;
        long long seq;
        if (f->sent[i].s != s)
            continue;
        ck_assert_msg(!*got_result, "message after the result: %s", t);
        if (strstr(t, "\"type\": \"gap\"")) {
            long long a, b;
            ck_assert_int_eq(
                sscanf(t, "{\"type\": \"gap\", \"from\": %lld, \"to\": %lld}", &a, &b),
                2);
            ck_assert_int_eq(a, expect);
            expect = b + 1;
            (*gaps)++;
        } else if (sscanf(t, "{\"type\": \"progress\", \"seq\": %lld", &seq) == 1) {
            const char *x = strstr(t, "\"text\": \"");
            ck_assert_msg(seq == expect, "seq %lld, want %lld", seq, (long long)expect);
            expect++;
            x += 9;
            buf_append(text, x, (size_t)(strchr(x, '"') - x));
        } else if (strstr(t, "\"type\": \"result\"")) {
            *got_result = 1;
        }
    }
}

static struct gw_hub *hub_with(struct fake *f)
{
    struct gw_hub *h;
    memset(f, 0, sizeof(*f));
    h = gw_hub_new(&ops, f);
    ck_assert_ptr_nonnull(h);
    return h;
}

/* ------------------------------------------------------------- scenarios */

START_TEST(test_replay_then_live_then_result)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 2, NULL, NULL};
    struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
    struct buf text;
    int res, gaps;

    ck_assert_int_eq(f.subs, 1);
    ck_assert_int_eq(f.fetches, 0); /* nothing is read before the subscription */
    gw_hub_on_subscribed(h, "T");
    ck_assert_int_eq(f.fetches, 1);
    ck_assert_int_eq(f.metas, 1);
    ck_assert_int_eq(f.after, 0);
    gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0); /* PENDING */
    /* an entry lands while the replay is in flight: the replay sees it too,
     * and its notification asks for one more read */
    st.last = 3;
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.fetches, 2);
    ck_assert_int_eq(f.after, 3);
    answer(h, &f, &st, GW_FETCH_COUNT); /* nothing new: no repeat */
    st.last = 5;
    st.final_state = "SUCCESS";
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 0); /* the meta is not ready yet */
    gw_hub_on_meta_published(h, "T", meta_ok, strlen(meta_ok));
    ck_assert_int_eq(f.fetches, 4); /* the draining read */
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 1);
    ck_assert_ptr_eq(f.closed[0], s);
    buf_init(&text);
    collect(&f, s, 0, &text, &res, &gaps);
    ck_assert(res);
    ck_assert_int_eq(gaps, 0);
    ck_assert_str_eq(text.data, "t2 t3 t4 ");
    ck_assert_str_eq(f.sent[0].text, "{\"type\": \"state\", \"state\": \"PENDING\"}");
    ck_assert(strstr(f.sent[f.nsent - 1].text,
                     "\"state\": \"SUCCESS\", \"result\": \"t2 t3 \""));
    buf_release(&text);
    gw_hub_leave(h, s);
    ck_assert_int_eq(f.unsubs, 1);
    ck_assert_int_eq(gw_hub_watches(h), 0);
    ck_assert_int_eq(gw_hub_sessions(h), 0);
    gw_hub_free(h);
}
END_TEST

/* Table: a second client joins at various moments and resume points; every
 * client sees each entry after its resume point exactly once. */
struct join_vec {
    const char *name;
    int64_t from;      /* the second client's ?from= */
    int join_inflight; /* join while a read is in flight */
    int64_t trimmed;   /* first entry still in the stream */
};

static const struct join_vec joins[] = {
    {"late join from 0", 0, 0, 1},       {"late join during a read", 0, 1, 1},
    {"resume from 3", 3, 0, 1},          {"resume from 3 during a read", 3, 1, 1},
    {"resume past the end", 40, 0, 1},   {"trimmed stream", 0, 0, 4},
    {"trimmed, resume inside", 2, 1, 4},
};

START_TEST(test_joins)
{
    const struct join_vec *v = &joins[_i];
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {v->trimmed, 6, NULL, NULL};
    struct gw_session *a, *b = NULL;
    struct buf ta, tb;
    int res, gaps;

    a = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT); /* a is at 6 */
    st.last = 8;
    gw_hub_on_notify(h, "T"); /* a read from 6 is in flight */
    if (!v->join_inflight)
        answer(h, &f, &st, GW_FETCH_COUNT);
    b = gw_hub_join(h, "T", v->from, (void *)2, 0);
    for (int i = 0; i < 5 && f.fetching; i++)
        answer(h, &f, &st, GW_FETCH_COUNT);
    st.last = 9;
    st.final_state = "SUCCESS";
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    gw_hub_on_meta_published(h, "T", meta_ok, strlen(meta_ok));
    for (int i = 0; i < 5 && f.fetching; i++)
        answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 2);

    buf_init(&ta);
    buf_init(&tb);
    collect(&f, a, 0, &ta, &res, &gaps);
    ck_assert(res);
    ck_assert_int_eq(gaps, v->trimmed > 1);
    collect(&f, b, v->from, &tb, &res, &gaps);
    ck_assert_msg(res, "%s: no result", v->name);
    ck_assert_int_eq(gaps, v->trimmed > v->from + 1 && v->from < 9);
    if (v->trimmed == 1) {
        ck_assert_str_eq(ta.data, "t2 t3 t4 t5 t6 t7 t8 ");
        if (v->from == 0)
            ck_assert_str_eq(tb.data, ta.data);
        else if (v->from == 3)
            ck_assert_str_eq(tb.data, "t4 t5 t6 t7 t8 ");
        else
            ck_assert_ptr_null(tb.data);
    }
    buf_release(&ta);
    buf_release(&tb);
    gw_hub_leave(h, a);
    gw_hub_leave(h, b);
    gw_hub_free(h);
}
END_TEST

START_TEST(test_joining_a_finished_task)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 4, "SUCCESS", NULL};
    struct gw_session *a, *b;
    struct buf t;
    int res, gaps;

    a = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    gw_hub_on_meta(h, "T", f.meta_ticket, meta_ok, strlen(meta_ok)); /* ready at once */
    /* the replay began before the meta was seen: one more read drains */
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 0);
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 1);
    /* another client comes while the first is still connected */
    b = gw_hub_join(h, "T", 0, (void *)2, 0);
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 2);
    buf_init(&t);
    collect(&f, b, 0, &t, &res, &gaps);
    ck_assert(res);
    ck_assert_str_eq(t.data, "t2 t3 ");
    buf_release(&t);
    gw_hub_leave(h, a);
    gw_hub_leave(h, b);
    gw_hub_free(h);
}
END_TEST

START_TEST(test_paged_reads)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 40, NULL, NULL};
    struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
    struct buf t;
    int res, gaps;
    gw_hub_on_subscribed(h, "T");
    while (f.fetching)
        answer(h, &f, &st, 7); /* a short page asks for the next one */
    ck_assert_int_eq(f.fetches, 6);
    buf_init(&t);
    collect(&f, s, 0, &t, &res, &gaps);
    ck_assert(!res);
    ck_assert_int_eq(t.len, 3 * 8 + 4 * 31); /* "tN " for 2..9 and 10..40 */
    buf_release(&t);
    gw_hub_leave(h, s);
    gw_hub_free(h);
}
END_TEST

START_TEST(test_failures_and_reconnects)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 3, NULL, NULL};
    struct gw_session *s;
    uint64_t old;

    f.fail_subscribe = 1;
    s = gw_hub_join(h, "T", 0, (void *)1, 0);
    ck_assert_int_eq(f.subs, 1);
    f.fail_subscribe = 0;
    gw_hub_tick(h, 100); /* asks again */
    ck_assert_int_eq(f.subs, 2);
    gw_hub_on_subscribed(h, "T");
    /* a failed read is retried from the tick, not at once */
    gw_hub_on_fetch_failed(h, "T", f.fetch_ticket);
    f.fetching = 0;
    gw_hub_tick(h, 100 + GW_RETRY_MS - 1);
    ck_assert_int_eq(f.fetches, 1);
    gw_hub_tick(h, 100 + GW_RETRY_MS);
    ck_assert_int_eq(f.fetches, 2);
    /* an answer with a stale ticket is dropped */
    old = f.fetch_ticket;
    f.fetch_ticket = old + 1000;
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nsent, 0);
    f.fetching = 1;
    f.fetch_ticket = old;
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nsent, 3);
    /* the pub/sub connection drops: subscribe again, then read again */
    gw_hub_on_sub_lost(h);
    gw_hub_on_notify(h, "T"); /* not subscribed: no read */
    ck_assert_int_eq(f.fetches, 2);
    gw_hub_resubscribe(h);
    ck_assert_int_eq(f.subs, 3);
    st.last = 5;
    gw_hub_on_subscribed(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nsent, 5);
    /* the meta is polled while waiting */
    gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0);
    f.metas = 0;
    gw_hub_tick(h, 100 + GW_RETRY_MS + GW_META_POLL_MS + 1);
    ck_assert_int_eq(f.metas, 1);
    gw_hub_leave(h, s);
    /* answers for a watch that is gone are ignored */
    gw_hub_on_entries(h, "T", 1, NULL, 0, 1);
    gw_hub_on_meta(h, "T", 1, NULL, 0);
    gw_hub_on_notify(h, "T");
    gw_hub_free(h);
}
END_TEST

START_TEST(test_ignored_result_comes_from_the_stream)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 3, "SUCCESS", "[1, 2.0]"};
    struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0);
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nclosed, 1);
    ck_assert(
        strstr(f.sent[f.nsent - 1].text, "\"state\": \"SUCCESS\", \"result\": [1, 2.0]"));
    gw_hub_leave(h, s);
    gw_hub_free(h);
}
END_TEST

/* An RQ job has no Celery meta: its final entry's result ends the sessions,
 * whatever the end; a Celery FAILURE entry (no result) waits for its meta. */
START_TEST(test_rq_job_ends_from_the_stream)
{
    static const struct {
        const char *state, *result, *want;
    } ends[] = {
        {"FAILURE",
         "{\"exc_type\": \"JobTimeoutException\", \"exc_message\": [\"too long\"], "
         "\"exc_module\": \"rq.timeouts\"}",
         "\"state\": \"FAILURE\""},
        {"REVOKED", "{\"exc_type\": \"Exception\", \"exc_message\": [\"stopped\"]}",
         "\"error\": \"Exception: stopped\""},
        {"SUCCESS", "\"t2 t3 \"", "\"result\": \"t2 t3 \""},
        {"FAILURE", "not json", "\"state\": \"PENDING\""},
    };
    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
        struct fake f;
        struct gw_hub *h = hub_with(&f);
        struct stream st = {1, 3, ends[i].state, ends[i].result};
        struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
        const char *last;
        gw_hub_on_subscribed(h, "T");
        gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0);
        answer(h, &f, &st, GW_FETCH_COUNT);
        ck_assert_int_eq(f.nclosed, 1);
        last = f.sent[f.nsent - 1].text;
        ck_assert_msg(strstr(last, "\"type\": \"result\""), "%s", last);
        ck_assert_msg(strstr(last, ends[i].want), "%s", last);
        if (i == 0)
            ck_assert(strstr(last, "\"error\": \"JobTimeoutException: too long\""));
        gw_hub_leave(h, s);
        gw_hub_free(h);
    }
    {
        struct fake f;
        struct gw_hub *h = hub_with(&f);
        struct stream st = {1, 3, "FAILURE", NULL};
        struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
        gw_hub_on_subscribed(h, "T");
        gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0);
        answer(h, &f, &st, GW_FETCH_COUNT);
        ck_assert_int_eq(f.nclosed, 0);
        gw_hub_leave(h, s);
        gw_hub_free(h);
    }
}
END_TEST

/* An RQ job's state is announced by no PUBLISH: a new STARTED or RETRY
 * entry asks for the meta at once (after the answer awaited, when one is),
 * so "state" follows the job; PROGRESS entries and replays ask nothing. */
START_TEST(test_new_attempt_rereads_the_state)
{
    static const char started[] = "{\"status\": \"STARTED\", \"result\": null}";
    static const char pending[] = "{\"status\": \"PENDING\", \"result\": null}";
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 0, NULL, NULL};
    struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0), *s2;
    int metas;

    gw_hub_on_subscribed(h, "T");
    ck_assert_int_eq(f.metas, 1);
    gw_hub_on_meta(h, "T", f.meta_ticket, NULL, 0); /* queued: PENDING */
    answer(h, &f, &st, GW_FETCH_COUNT);             /* nothing yet */
    ck_assert_int_eq(f.metas, 1);
    /* the job starts: STARTED and its first text */
    st.last = 2;
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.metas, 2);
    gw_hub_on_meta(h, "T", f.meta_ticket, started, strlen(started));
    ck_assert_str_eq(f.sent[f.nsent - 1].text,
                     "{\"type\": \"state\", \"state\": \"STARTED\"}");
    /* more text asks nothing */
    st.last = 4;
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.metas, 2);
    /* the attempt ends with RETRY while a poll is out: one more ask after it */
    gw_hub_tick(h, GW_META_POLL_MS);
    ck_assert_int_eq(f.metas, 3);
    st.last = 5;
    st.final_state = "RETRY";
    gw_hub_on_notify(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.metas, 3);
    gw_hub_on_meta(h, "T", f.meta_ticket, started, strlen(started)); /* read before */
    ck_assert_int_eq(f.metas, 4);
    gw_hub_on_meta(h, "T", f.meta_ticket, pending, strlen(pending));
    ck_assert_int_eq(f.metas, 4);
    ck_assert_str_eq(f.sent[f.nsent - 1].text,
                     "{\"type\": \"state\", \"state\": \"PENDING\"}");
    /* a late session's replay holds STARTED and RETRY: only its join asks */
    s2 = gw_hub_join(h, "T", 0, (void *)2, GW_META_POLL_MS);
    metas = f.metas;
    ck_assert_int_eq(metas, 5);
    answer(h, &f, &st, GW_FETCH_COUNT);
    gw_hub_on_meta(h, "T", f.meta_ticket, pending, strlen(pending));
    ck_assert_int_eq(f.metas, metas);
    gw_hub_leave(h, s2);
    gw_hub_leave(h, s);
    gw_hub_free(h);
}
END_TEST

START_TEST(test_entry_parse)
{
    const char *names[] = {"seq", "attempt", "state", "text", "tokens", "run", "error"};
    const char *values[] = {"3", "2", "RETRY", "abc", "17", "w:1:1", "E: m"};
    size_t nl[7], vl[7];
    struct gw_entry e;
    for (int i = 0; i < 7; i++) {
        nl[i] = strlen(names[i]);
        vl[i] = strlen(values[i]);
    }
    ck_assert_int_eq(gw_entry_parse("0-3", 3, 7, names, nl, values, vl, &e), 0);
    ck_assert_int_eq(e.seq, 3);
    ck_assert_int_eq(e.attempt, 2);
    ck_assert_str_eq(e.state, "RETRY");
    ck_assert_int_eq(e.text_len, 3);
    ck_assert_int_eq(e.tokens, 17);
    ck_assert_str_eq(e.error, "E: m");
    ck_assert_ptr_null(e.result);
    /* malformed ids and missing fields */
    ck_assert_int_eq(gw_entry_parse("3", 1, 7, names, nl, values, vl, &e), CR_EPROTO);
    ck_assert_int_eq(gw_entry_parse("0-", 2, 7, names, nl, values, vl, &e), CR_EPROTO);
    ck_assert_int_eq(gw_entry_parse("0-x", 3, 7, names, nl, values, vl, &e), CR_EPROTO);
    ck_assert_int_eq(gw_entry_parse("0-0", 3, 7, names, nl, values, vl, &e), CR_EPROTO);
    ck_assert_int_eq(gw_entry_parse(NULL, 0, 7, names, nl, values, vl, &e), CR_EPROTO);
    ck_assert_int_eq(gw_entry_parse("0-3", 3, 2, names, nl, values, vl, &e), CR_EPROTO);
}
END_TEST

/* ------------------------------------------------------------- memory */

/* Writes out everything queued to s, as a socket that keeps up would. */
static void drain(struct gw_hub *h, struct fake *f, struct gw_session *s, int *upto)
{
    for (; *upto < f->nsent; (*upto)++)
        if (f->sent[*upto].s == s)
            gw_hub_on_written(h, s, f->sent[*upto].len);
}

/* The next entry lands and is read: st->last becomes seq. */
static void publish(struct gw_hub *h, struct fake *f, struct stream *st, int64_t seq,
                    const char *task)
{
    st->last = seq;
    gw_hub_on_notify(h, task);
    for (int i = 0; i < 5 && f->fetching; i++)
        answer(h, f, st, GW_FETCH_COUNT);
}

static int sent_to(const struct fake *f, const struct gw_session *s)
{
    int n = 0;
    for (int i = 0; i < f->nsent; i++)
        n += f->sent[i].s == s;
    return n;
}

/* Lengths of the messages for entries 1 and 2 (3, 4... are as long as 2). */
static void message_lengths(size_t *l1, size_t *l)
{
    struct fake f;
    struct gw_hub *h = hub_with(&f);
    struct stream st = {1, 2, NULL, NULL};
    struct gw_session *s = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    answer(h, &f, &st, GW_FETCH_COUNT);
    ck_assert_int_eq(f.nsent, 2);
    *l1 = f.sent[0].len;
    *l = f.sent[1].len;
    ck_assert_uint_eq(gw_hub_queued(h), *l1 + *l);
    gw_hub_leave(h, s);
    ck_assert_uint_eq(gw_hub_queued(h), 0);
    gw_hub_free(h);
}

/* Two clients on one task: a reads everything, b nothing. For every total
 * budget from the smallest that holds entry 1 twice up to past what all
 * three entries need, byte by byte: b is dropped exactly when the next
 * message would take the total past the budget, a is never dropped and gets
 * every entry, the count never passes the budget, and b gets nothing more. */
START_TEST(test_total_budget_byte_by_byte)
{
    size_t l1, l;
    message_lengths(&l1, &l);
    for (size_t budget = 2 * l1; budget <= 3 * l + 2; budget++) {
        struct fake f;
        struct gw_hub *h = hub_with(&f);
        struct stream st = {1, 0, NULL, NULL};
        struct gw_session *a, *b;
        int da = 0, drop_step = budget < 2 * l ? 2 : budget < 3 * l ? 3 : 0;
        gw_hub_set_limits(h, 0, budget);
        a = gw_hub_join(h, "T", 0, (void *)1, 0);
        b = gw_hub_join(h, "T", 0, (void *)2, 0);
        gw_hub_on_subscribed(h, "T");
        publish(h, &f, &st, 1, "T"); /* M1 to both; they write it */
        ck_assert_int_eq(f.ndropped, 0);
        drain(h, &f, a, &da);
        gw_hub_on_written(h, b, l1);
        ck_assert_uint_eq(gw_hub_queued(h), 0);
        for (int64_t seq = 2; seq <= 3; seq++) {
            publish(h, &f, &st, seq, "T");
            ck_assert_uint_le(gw_hub_queued(h), budget);
            if (drop_step && seq >= drop_step) {
                ck_assert_int_eq(f.ndropped, 1);
                ck_assert_ptr_eq(f.dropped[0].s, b);
                ck_assert_int_eq(f.dropped[0].reason, GW_DROP_BUDGET);
            } else {
                ck_assert_int_eq(f.ndropped, 0);
            }
            drain(h, &f, a, &da);
            if (seq == 3 && !drop_step)
                ck_assert_uint_eq(gw_hub_queued(h), 2 * l); /* b's M2 and M3 */
        }
        if (drop_step) {
            ck_assert_uint_eq(gw_hub_queued(h), 0);
            ck_assert_uint_eq(gw_hub_drops(h), 1);
            /* b's frames reported late count for nothing */
            gw_hub_on_written(h, b, 1000);
            ck_assert_uint_eq(gw_hub_queued(h), 0);
            /* it was sent its message of the step, then made room for a's */
            ck_assert_int_eq(sent_to(&f, b), drop_step);
        }
        ck_assert_int_eq(sent_to(&f, a), 3);
        /* the end, with room for it: a gets the result and is closed; a
         * dropped b is not */
        gw_hub_set_limits(h, 0, 0);
        st.final_state = "SUCCESS";
        publish(h, &f, &st, 4, "T");
        gw_hub_on_meta_published(h, "T", meta_ok, strlen(meta_ok));
        for (int i = 0; i < 5 && f.fetching; i++)
            answer(h, &f, &st, GW_FETCH_COUNT);
        ck_assert_int_eq(f.nclosed, drop_step ? 1 : 2);
        ck_assert_ptr_eq(f.closed[0], drop_step ? a : b);
        ck_assert(strstr(f.sent[f.nsent - 1].text, "\"type\": \"result\""));
        gw_hub_leave(h, b);
        drain(h, &f, a, &da);
        ck_assert_uint_eq(gw_hub_queued(h), 0);
        gw_hub_leave(h, a);
        gw_hub_free(h);
    }
}
END_TEST

/* A budget smaller than one message: a client with nothing queued still gets
 * it (it keeps up); one that still holds a message when the next comes is
 * dropped. */
START_TEST(test_budget_smaller_than_a_message)
{
    size_t l1, l;
    struct fake f;
    struct gw_hub *h;
    struct stream st = {1, 0, NULL, NULL};
    struct gw_session *a;
    int da = 0;
    message_lengths(&l1, &l);
    h = hub_with(&f);
    gw_hub_set_limits(h, 0, l1);
    a = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    publish(h, &f, &st, 1, "T");
    drain(h, &f, a, &da);
    publish(h, &f, &st, 2, "T"); /* l > l1, but nothing else is queued */
    ck_assert_int_eq(f.ndropped, 0);
    ck_assert_uint_eq(gw_hub_queued(h), l);
    publish(h, &f, &st, 3, "T"); /* M2 not yet written */
    ck_assert_int_eq(f.ndropped, 1);
    ck_assert_int_eq(f.dropped[0].reason, GW_DROP_BUDGET);
    ck_assert_int_eq(sent_to(&f, a), 2);
    ck_assert_uint_eq(gw_hub_queued(h), 0);
    gw_hub_leave(h, a);
    gw_hub_free(h);
}
END_TEST

/* The per-session limit, byte by byte: b (reading nothing) is dropped as
 * GW_DROP_SLOW exactly when its queue would pass the limit; a is not. */
START_TEST(test_session_limit_byte_by_byte)
{
    size_t l1, l;
    message_lengths(&l1, &l);
    for (size_t limit = l1 + l; limit <= l1 + 2 * l + 1; limit++) {
        struct fake f;
        struct gw_hub *h = hub_with(&f);
        struct stream st = {1, 0, NULL, NULL};
        struct gw_session *a, *b;
        int da = 0;
        gw_hub_set_limits(h, limit, 0);
        a = gw_hub_join(h, "T", 0, (void *)1, 0);
        b = gw_hub_join(h, "T", 0, (void *)2, 0);
        gw_hub_on_subscribed(h, "T");
        for (int64_t seq = 1; seq <= 3; seq++) {
            publish(h, &f, &st, seq, "T");
            drain(h, &f, a, &da);
        }
        if (limit < l1 + 2 * l) {
            ck_assert_int_eq(f.ndropped, 1);
            ck_assert_ptr_eq(f.dropped[0].s, b);
            ck_assert_int_eq(f.dropped[0].reason, GW_DROP_SLOW);
            ck_assert_int_eq(sent_to(&f, b), 2);
        } else {
            ck_assert_int_eq(f.ndropped, 0);
            ck_assert_int_eq(sent_to(&f, b), 3);
        }
        ck_assert_int_eq(sent_to(&f, a), 3);
        gw_hub_leave(h, a);
        gw_hub_leave(h, b);
        ck_assert_uint_eq(gw_hub_queued(h), 0);
        gw_hub_free(h);
    }
}
END_TEST

/* The budget is over all tasks: a message for one task's client drops the
 * client furthest behind on another task. */
START_TEST(test_budget_spans_tasks)
{
    size_t l1, l;
    struct fake f;
    struct gw_hub *h;
    struct stream st = {1, 0, NULL, NULL};
    struct gw_session *a, *c;
    message_lengths(&l1, &l);
    h = hub_with(&f);
    gw_hub_set_limits(h, 0, 2 * l1 + l - 1);
    a = gw_hub_join(h, "T", 0, (void *)1, 0);
    gw_hub_on_subscribed(h, "T");
    st.last = 2;
    answer(h, &f, &st, GW_FETCH_COUNT); /* a holds l1 + l */
    c = gw_hub_join(h, "U", 0, (void *)2, 0);
    gw_hub_on_subscribed(h, "U");
    st.last = 1;
    answer(h, &f, &st, GW_FETCH_COUNT); /* c's l1 would make 2 * l1 + l */
    ck_assert_int_eq(f.ndropped, 1);
    ck_assert_ptr_eq(f.dropped[0].s, a);
    ck_assert_uint_eq(gw_hub_queued(h), l1);
    ck_assert_int_eq(sent_to(&f, c), 1);
    gw_hub_leave(h, a);
    gw_hub_leave(h, c);
    gw_hub_free(h);
}
END_TEST

/* Fails allocation 1, 2, ... through a whole scenario: nothing crashes or
 * leaks (valgrind), and a session is either served or told and closed. */
START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1; n < 2000; n++) {
        struct fake f;
        struct gw_hub *h;
        struct gw_session *a, *b;
        struct stream st = {1, 4, NULL, NULL};
        long failed;
        memset(&f, 0, sizeof(f));
        cr_alloc_fail_after(n);
        h = gw_hub_new(&ops, &f);
        if (!h) {
            ck_assert_int_eq(cr_alloc_failed(), 1);
            cr_alloc_fail_after(0);
            continue;
        }
        a = gw_hub_join(h, "T", 0, (void *)1, 0);
        b = gw_hub_join(h, "T", 2, (void *)2, 0);
        gw_hub_on_subscribed(h, "T");
        if (f.fetching)
            answer(h, &f, &st, GW_FETCH_COUNT);
        st.last = 5;
        st.final_state = "SUCCESS";
        gw_hub_on_notify(h, "T");
        if (f.fetching)
            answer(h, &f, &st, GW_FETCH_COUNT);
        gw_hub_on_meta_published(h, "T", meta_ok, strlen(meta_ok));
        for (int i = 0; i < 4 && f.fetching; i++)
            answer(h, &f, &st, GW_FETCH_COUNT);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        gw_hub_leave(h, a);
        gw_hub_leave(h, b);
        gw_hub_free(h);
        if (failed == 0) {
            ck_assert_int_eq(f.nclosed, 2);
            break;
        }
    }
    ck_assert_int_lt(n, 2000);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("gw_hub");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_replay_then_live_then_result);
    tcase_add_loop_test(tc, test_joins, 0, (int)(sizeof(joins) / sizeof(joins[0])));
    tcase_add_test(tc, test_joining_a_finished_task);
    tcase_add_test(tc, test_paged_reads);
    tcase_add_test(tc, test_failures_and_reconnects);
    tcase_add_test(tc, test_ignored_result_comes_from_the_stream);
    tcase_add_test(tc, test_rq_job_ends_from_the_stream);
    tcase_add_test(tc, test_new_attempt_rereads_the_state);
    tcase_add_test(tc, test_entry_parse);
    tcase_add_test(tc, test_total_budget_byte_by_byte);
    tcase_add_test(tc, test_budget_smaller_than_a_message);
    tcase_add_test(tc, test_session_limit_byte_by_byte);
    tcase_add_test(tc, test_budget_spans_tasks);
    tcase_add_test(tc, test_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
