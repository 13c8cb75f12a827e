/* test_vsession.c -- the virtual transport's bookkeeping against a recording
 * fake store: a model of Redis's lists and unacked table that logs every
 * command the session asks for and answers as each test tells it.
 *
 * What is asserted: every message popped is, in the end, removed (acked) or
 * put back (restored) exactly once and its data freed exactly once; nothing
 * is popped while the window is full; the narrow/wide and batch/blocking
 * switches; every held record's lease is refreshed before it would look
 * stale; restore rounds end once; acks replay after a reconnect; a lost pop
 * call's records are looked up once, when the store can be asked, and a
 * refused look-up or restore goes again after retry_ms and not before;
 * allocation-failure sweeps over pop, deliver and ack, and over a lost call;
 * and SQS's long polls (long_polls): batch calls only, one per queue, at most
 * the room, refusals left to the owner, with an allocation-failure sweep. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/vsession.h"
#include "util/alloc.h"
#include "util/err.h"

#define NMSG 2048 /* messages a fake store may hold */
#define NLOG 4096

/* The owner's data of one record: which message it is. */
struct payload {
    int msg;
};

enum cmd_kind {
    C_BATCH,
    C_BLOCK,
    C_RECORD,
    C_ACK,
    C_REFRESH,
    C_RESTORE,
    C_LOCK,
    C_SCAN,
    C_UNLOCK,
    C_SCAN_LOST,
    C_AGAIN
};

struct cmd {
    enum cmd_kind kind;
    long max;                       /* C_BATCH */
    int wide;                       /* C_BATCH */
    int tasks;                      /* C_BLOCK */
    char side;                      /* C_RESTORE */
    int round;                      /* C_RESTORE */
    int n;                          /* C_ACK, C_REFRESH: tags */
    char score[VSESSION_SCORE_MAX]; /* C_SCAN_LOST */
};

/* An ack batch sent, not answered. */
struct ack_out {
    char **tags;
    int *had; /* what the removal found, to undo it on a refusal */
    int n;
};

struct fake {
    struct vsession *s;
    uint64_t now;
    int store_up, pop_up;
    /* the store: messages 0..nmsg-1; next_msg is the next one a pop takes */
    int nmsg, next_msg;
    int in_list[NMSG];  /* still in its list (or pushed back there) */
    int recorded[NMSG]; /* an unacked entry exists */
    int settled[NMSG];  /* acks of the last copy the session took */
    int lost[NMSG];     /* acks it could not take (left to the visibility timeout) */
    int restored[NMSG]; /* restores asked */
    int released[NMSG]; /* data freed by the session */
    int taken[NMSG];    /* data handed over by a restore */
    int popped[NMSG];
    uint64_t lease_at[NMSG]; /* last score written (pop or refresh) */
    int live_payloads;
    /* commands, in order */
    struct cmd log[NLOG];
    int nlog;
    /* waiting for an answer */
    long batches[64];
    int nbatches;
    int block_out;
    char *recording[NMSG];
    int nrecording;
    struct ack_out acks[256];
    int nacks;
    /* refusals the fake makes at the call */
    int fail_batch, fail_block, fail_record, fail_ack, fail_lock, fail_scan;
    int fail_scan_lost;
    /* long polls: one call out per queue at most (0: no bound) */
    int poll_slots;
    /* the stale records a scan finds */
    const char *stale[8];
    int nstale;
};

static int msg_of(const char *tag)
{
    return atoi(tag + 1);
}

static void tag_of(int i, char *out, size_t n)
{
    snprintf(out, n, "t%d", i);
}

static void note(struct fake *f, struct cmd c)
{
    ck_assert_int_lt(f->nlog, NLOG);
    f->log[f->nlog++] = c;
}

static int count(const struct fake *f, enum cmd_kind k, int from)
{
    int n = 0;
    for (int i = from; i < f->nlog; i++)
        n += f->log[i].kind == k;
    return n;
}

/* ------------------------------------------------------------ the ops */

static int op_link_up(void *ctx, enum vsession_link l)
{
    struct fake *f = ctx;
    return l == VSESSION_LINK_STORE ? f->store_up : f->pop_up;
}

static int op_pop_batch(void *ctx, long max, int wide)
{
    struct fake *f = ctx;
    ck_assert_int_gt(max, 0);
    if (f->fail_batch || !f->pop_up || (f->poll_slots && f->nbatches >= f->poll_slots))
        return CR_EBROKER;
    note(f, (struct cmd){.kind = C_BATCH, .max = max, .wide = wide});
    ck_assert_int_lt(f->nbatches, 64);
    f->batches[f->nbatches++] = max;
    return 0;
}

static void op_pop_wide(void *ctx, int wide)
{
    (void)ctx;
    (void)wide;
}

static int op_pop_block(void *ctx, int tasks)
{
    struct fake *f = ctx;
    if (f->fail_block || !f->pop_up || !tasks)
        return CR_EBROKER; /* no no-ack queue here: nothing to pop */
    ck_assert(!f->block_out);
    note(f, (struct cmd){.kind = C_BLOCK, .tasks = tasks});
    f->block_out = 1;
    return 0;
}

static int op_record(void *ctx, struct vsession_rec *r)
{
    struct fake *f = ctx;
    char *t;
    if (f->fail_record || !f->store_up)
        return CR_EBROKER;
    t = strdup(r->tag);
    ck_assert_ptr_nonnull(t);
    note(f, (struct cmd){.kind = C_RECORD});
    /* the store runs commands in order: the effect is now, the answer later */
    f->recorded[msg_of(t)] = 1;
    f->lease_at[msg_of(t)] = f->now;
    f->recording[f->nrecording++] = t;
    return 0;
}

static int op_ack(void *ctx, const char *const *tags, int n)
{
    struct fake *f = ctx;
    struct ack_out *a;
    if (f->fail_ack || !f->store_up)
        return CR_EBROKER;
    ck_assert_int_gt(n, 0);
    ck_assert_int_lt(f->nacks, 256);
    note(f, (struct cmd){.kind = C_ACK, .n = n});
    a = &f->acks[f->nacks++];
    a->tags = calloc((size_t)n, sizeof(*a->tags));
    a->had = calloc((size_t)n, sizeof(*a->had));
    a->n = n;
    for (int i = 0; i < n; i++) {
        int m = msg_of(tags[i]);
        a->tags[i] = strdup(tags[i]);
        a->had[i] = f->recorded[m];
        f->recorded[m] = 0;
    }
    return 0;
}

static void op_refresh(void *ctx, const char *const *tags, int n)
{
    struct fake *f = ctx;
    note(f, (struct cmd){.kind = C_REFRESH, .n = n});
    for (int i = 0; i < n; i++) {
        int m = msg_of(tags[i]);
        if (f->recorded[m]) /* ZADD XX */
            f->lease_at[m] = f->now;
    }
}

static void op_release(void *ctx, void *data)
{
    struct fake *f = ctx;
    struct payload *p = data;
    f->released[p->msg]++;
    f->live_payloads--;
    free(p);
}

static void op_restore(void *ctx, const char *tag, void *data, enum vsession_rec_state st,
                       char side, int round)
{
    struct fake *f = ctx;
    int m = msg_of(tag);
    note(f, (struct cmd){.kind = C_RESTORE, .side = side, .round = round});
    if (data) {
        struct payload *p = data;
        ck_assert_int_eq(p->msg, m);
        f->taken[m]++;
        f->live_payloads--;
        free(p);
    }
    (void)st;
    f->restored[m]++;
    f->recorded[m] = 0;
    if (round)
        vsession_on_round_job(f->s); /* owed once: answered at once here */
}

static int op_round_lock(void *ctx)
{
    struct fake *f = ctx;
    if (f->fail_lock)
        return CR_EBROKER;
    note(f, (struct cmd){.kind = C_LOCK});
    return 0;
}

static int op_round_scan(void *ctx)
{
    struct fake *f = ctx;
    if (f->fail_scan)
        return CR_EBROKER;
    note(f, (struct cmd){.kind = C_SCAN});
    return 0;
}

static void op_round_unlock(void *ctx)
{
    struct fake *f = ctx;
    note(f, (struct cmd){.kind = C_UNLOCK});
}

static int op_scan_lost(void *ctx, const char *score)
{
    struct fake *f = ctx;
    struct cmd c = {.kind = C_SCAN_LOST};
    if (f->fail_scan_lost || !f->store_up)
        return CR_EBROKER;
    snprintf(c.score, sizeof(c.score), "%s", score);
    note(f, c);
    return 0;
}

static void op_restores_again(void *ctx)
{
    struct fake *f = ctx;
    note(f, (struct cmd){.kind = C_AGAIN});
}

static const struct vsession_ops fake_ops = {
    .link_up = op_link_up,
    .pop_batch = op_pop_batch,
    .pop_wide = op_pop_wide,
    .pop_block = op_pop_block,
    .record = op_record,
    .ack = op_ack,
    .refresh = op_refresh,
    .restore = op_restore,
    .release = op_release,
    .round_lock = op_round_lock,
    .round_scan = op_round_scan,
    .round_unlock = op_round_unlock,
    .scan_lost = op_scan_lost,
    .restores_again = op_restores_again,
};

/* SQS's: no blocking pop, no record write, no round, no lost call. */
static const struct vsession_ops long_ops = {
    .link_up = op_link_up,
    .pop_batch = op_pop_batch,
    .ack = op_ack,
    .refresh = op_refresh,
    .restore = op_restore,
    .release = op_release,
};

/* ------------------------------------------------------------ the fake */

static void fake_init(struct fake *f, long prefetch, int nmsg)
{
    struct vsession_config c;
    memset(f, 0, sizeof(*f));
    ck_assert_int_le(nmsg, NMSG);
    f->nmsg = nmsg;
    for (int i = 0; i < nmsg; i++)
        f->in_list[i] = 1;
    f->store_up = f->pop_up = 1;
    f->now = 1000;
    vsession_config_default(&c);
    c.prefetch = prefetch;
    c.lease_ms = 1000;
    c.restore_ms = 60000;
    f->s = vsession_new(&c, &fake_ops, f);
    ck_assert_ptr_nonnull(f->s);
}

/* As SQS configures it: long polls of at most ten, one per queue (queues
 * of them), nothing recorded by the session. */
static void fake_init_long(struct fake *f, long prefetch, int nmsg, int queues)
{
    struct vsession_config c;
    fake_init(f, prefetch, nmsg);
    vsession_free(f->s);
    vsession_config_default(&c);
    c.prefetch = prefetch;
    c.ack_emulation = 0;
    c.long_polls = 1;
    c.batch = 10;
    c.calls = 1024;
    c.lease_ms = 1000;
    c.replay_max = 0;
    c.replay_ms = 0;
    f->poll_slots = queues;
    f->s = vsession_new(&c, &long_ops, f);
    ck_assert_ptr_nonnull(f->s);
}

static void fake_free_acks(struct fake *f)
{
    for (int i = 0; i < f->nacks; i++) {
        for (int k = 0; k < f->acks[i].n; k++)
            free(f->acks[i].tags[k]);
        free(f->acks[i].tags);
        free(f->acks[i].had);
    }
    f->nacks = 0;
    for (int i = 0; i < f->nrecording; i++)
        free(f->recording[i]);
    f->nrecording = 0;
}

static void fake_release(struct fake *f)
{
    vsession_free(f->s);
    f->s = NULL;
    fake_free_acks(f);
    ck_assert_int_eq(f->live_payloads, 0);
}

/* The next message a pop takes, or -1 when the lists are dry. */
static int take(struct fake *f)
{
    while (f->next_msg < f->nmsg && !f->in_list[f->next_msg])
        f->next_msg++;
    if (f->next_msg == f->nmsg)
        return -1;
    f->in_list[f->next_msg] = 0;
    return f->next_msg++;
}

/* Hands message m to the session as the owner would; a refused hold pushes
 * it back. */
static void feed(struct fake *f, int m, int recorded)
{
    char tag[16];
    struct payload *p;
    int rc;
    tag_of(m, tag, sizeof(tag));
    f->in_list[m] = 0;
    if (recorded) {
        f->recorded[m] = 1;
        f->lease_at[m] = f->now;
    }
    if (vsession_held(f->s, tag)) {
        rc = vsession_hold(f->s, tag, NULL, recorded);
        ck_assert_int_eq(rc, 1);
        f->popped[m]++;
        return;
    }
    p = cr_malloc(sizeof(*p));
    if (!p) {
        f->in_list[m] = 1; /* pushed back with its record removed */
        f->recorded[m] = 0;
        return;
    }
    p->msg = m;
    f->live_payloads++;
    rc = vsession_hold(f->s, tag, p, recorded);
    if (rc) {
        ck_assert_int_eq(rc, CR_ENOMEM);
        f->live_payloads--;
        cr_free(p);
        f->in_list[m] = 1;
        f->recorded[m] = 0;
        return;
    }
    f->popped[m]++;
}

/* Answers batch call i (the oldest first) with what the lists have. */
static long answer_batch(struct fake *f, enum vsession_reply rep)
{
    long asked, got = 0;
    ck_assert_int_gt(f->nbatches, 0);
    asked = f->batches[0];
    memmove(f->batches, f->batches + 1, sizeof(f->batches[0]) * (size_t)--f->nbatches);
    vsession_on_batch(f->s, asked, rep, f->now);
    if (rep != VSESSION_OK)
        return 0;
    while (got < asked) {
        int m = take(f);
        if (m < 0)
            break;
        feed(f, m, 1);
        got++;
    }
    vsession_on_batch_end(f->s, asked, got, 0);
    return got;
}

static void answer_block(struct fake *f, enum vsession_reply rep)
{
    int m = rep == VSESSION_OK ? take(f) : -1;
    ck_assert(f->block_out);
    f->block_out = 0;
    vsession_on_block(f->s, rep, m >= 0, f->now);
    if (m >= 0)
        feed(f, m, 0);
}

static void answer_records(struct fake *f, enum vsession_reply rep)
{
    while (f->nrecording) {
        char *t = f->recording[--f->nrecording];
        if (rep != VSESSION_OK)
            f->recorded[msg_of(t)] = 0; /* refused, or lost before it ran */
        vsession_on_recorded(f->s, t, rep);
        free(t);
    }
}

/* Answers the oldest ack batch. */
static void answer_acks(struct fake *f, enum vsession_reply rep)
{
    struct ack_out a;
    ck_assert_int_gt(f->nacks, 0);
    a = f->acks[0];
    memmove(f->acks, f->acks + 1, sizeof(f->acks[0]) * (size_t)--f->nacks);
    if (rep == VSESSION_REFUSED)
        for (int i = 0; i < a.n; i++)
            f->recorded[msg_of(a.tags[i])] |= a.had[i];
    vsession_on_acked(f->s, (const char *const *)a.tags, a.n, rep, f->now);
    for (int i = 0; i < a.n; i++)
        free(a.tags[i]);
    free(a.tags);
    free(a.had);
}

static int ack_msg(struct fake *f, int m)
{
    char tag[16];
    struct vsession_rec *r;
    int rc;
    tag_of(m, tag, sizeof(tag));
    r = vsession_held(f->s, tag);
    if (r && r->copies == 1)
        f->settled[m]++;
    rc = vsession_ack(f->s, tag);
    if (rc) {
        ck_assert_int_eq(rc, CR_ENOMEM);
        f->settled[m]--;
        f->lost[m]++;
        f->recorded[m] = 0; /* what the visibility timeout does */
    }
    return rc;
}

/* Acks every message held. */
static void ack_all(struct fake *f)
{
    for (int m = 0; m < f->nmsg; m++) {
        char tag[16];
        tag_of(m, tag, sizeof(tag));
        while (vsession_held(f->s, tag))
            ack_msg(f, m);
    }
}

static int dry(struct fake *f)
{
    for (int m = f->next_msg; m < f->nmsg; m++)
        if (f->in_list[m])
            return 0;
    return 1;
}

/* Answers everything in flight until nothing is, pumping between; a
 * blocking pop or a long poll on dry lists is left out, as it waits on a
 * real store. */
static void settle_all(struct fake *f)
{
    for (int rounds = 0; rounds < 1000; rounds++) {
        int polls_wait = f->poll_slots && dry(f);
        if (f->nrecording)
            answer_records(f, VSESSION_OK);
        while (f->nacks)
            answer_acks(f, VSESSION_OK);
        while (f->nbatches && !polls_wait)
            answer_batch(f, VSESSION_OK);
        if (f->block_out && !dry(f))
            answer_block(f, VSESSION_OK);
        vsession_pump(f->s, f->now);
        if ((!f->nbatches || polls_wait) && (!f->block_out || dry(f)) && !f->nrecording &&
            !f->nacks)
            return;
    }
    ck_abort_msg("the fake never went quiet");
}

/* Every message popped was settled by an ack or restored, exactly once, no
 * record of it is left in the store, and its data was freed or handed over
 * exactly once (none is held any more). */
static void check_once(const struct fake *f)
{
    for (int m = 0; m < f->nmsg; m++) {
        if (!f->popped[m])
            continue;
        ck_assert_msg(f->settled[m] + f->restored[m] + f->lost[m] == 1,
                      "message %d: acked %d, restored %d, lost %d", m, f->settled[m],
                      f->restored[m], f->lost[m]);
        ck_assert_msg(!f->recorded[m], "message %d: its record is left", m);
        ck_assert_msg(f->released[m] + f->taken[m] == 1,
                      "message %d: released %d, taken %d", m, f->released[m],
                      f->taken[m]);
    }
    ck_assert_int_eq(f->live_payloads, 0);
}

/* ------------------------------------------------------------ tests */

START_TEST(test_window_full_pops_nothing)
{
    struct fake f;
    int from;
    fake_init(&f, 10, 100);
    vsession_pump(f.s, f.now);
    /* narrow: two calls in flight, at most the room between them */
    ck_assert_int_eq(count(&f, C_BATCH, 0), 1);
    ck_assert_int_eq(f.log[0].max, 10);
    ck_assert_int_eq(vsession_room(f.s), 0);
    ck_assert_int_eq(answer_batch(&f, VSESSION_OK), 10);
    ck_assert_int_eq(vsession_nheld(f.s), 10);
    from = f.nlog;
    for (int i = 0; i < 5; i++)
        vsession_pump(f.s, f.now);
    vsession_tick(f.s, f.now + 100);
    vsession_pop(f.s, f.now + 100);
    ck_assert_int_eq(count(&f, C_BATCH, from), 0);
    ck_assert_int_eq(count(&f, C_BLOCK, from), 0);
    /* one ack: room for one */
    ck_assert_int_eq(ack_msg(&f, 3), 0);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_ACK, from), 1);
    ck_assert_int_eq(count(&f, C_BATCH, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].max, 1);
    settle_all(&f);
    while (vsession_nheld(f.s)) {
        ck_assert_int_le(vsession_nheld(f.s), 10);
        ack_all(&f);
        settle_all(&f);
    }
    ck_assert_int_eq(f.next_msg, 100);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_wide_narrow)
{
    struct fake f;
    /* a wide window: wide calls, four in flight */
    fake_init(&f, 5000, 2000);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, 0), 4);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(f.log[i].max, 256);
        ck_assert_int_eq(f.log[i].wide, 1);
    }
    for (int i = 0; i < 4; i++)
        answer_batch(&f, VSESSION_OK);
    /* 1024 held, 3976 free: still wide */
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(f.log[f.nlog - 1].wide, 1);
    while (f.nbatches)
        answer_batch(&f, VSESSION_OK);
    vsession_pump(f.s, f.now);
    while (f.nbatches)
        answer_batch(&f, VSESSION_OK);
    /* 3072 held: room 1928, still wide; then below 1024: narrow */
    ck_assert_int_eq(vsession_nheld(f.s), 2000);
    fake_release(&f);

    /* no bound: wide */
    fake_init(&f, 0, 10);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(vsession_room(f.s), LONG_MAX);
    ck_assert_int_eq(f.log[0].wide, 1);
    fake_release(&f);

    /* a narrow window: calls of 64, two in flight */
    fake_init(&f, 100, 200);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, 0), 2);
    ck_assert_int_eq(f.log[0].max, 64);
    ck_assert_int_eq(f.log[0].wide, 0);
    ck_assert_int_eq(f.log[1].max, 36);
    fake_release(&f);
}
END_TEST

START_TEST(test_cold_warm_and_script_off)
{
    struct fake f;
    int from;
    fake_init(&f, 100, 3);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_WARM);
    answer_batch(&f, VSESSION_OK); /* 3 of 64: dry */
    ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_COLD);
    answer_batch(&f, VSESSION_OK); /* 0 of 36 */
    from = f.nlog;
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, from), 0);
    ck_assert_int_eq(count(&f, C_BLOCK, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].tasks, 1);
    ck_assert_int_eq(vsession_block_state(f.s), VSESSION_BLOCK_OUT);
    vsession_pump(f.s, f.now); /* one blocking pop at a time */
    ck_assert_int_eq(count(&f, C_BLOCK, from), 1);
    /* a message comes: warm again, batch calls */
    f.nmsg = 5;
    f.in_list[3] = f.in_list[4] = 1;
    answer_block(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_WARM);
    answer_records(&f, VSESSION_OK);
    from = f.nlog;
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, from), 2);
    /* a refused blocking pop pauses everything for pause_ms */
    answer_batch(&f, VSESSION_OK);
    answer_batch(&f, VSESSION_OK);
    vsession_pump(f.s, f.now);
    answer_block(&f, VSESSION_REFUSED);
    ck_assert_int_eq(vsession_block_state(f.s), VSESSION_BLOCK_PAUSED);
    from = f.nlog;
    vsession_pump(f.s, f.now + 999);
    ck_assert_int_eq(f.nlog, from);
    vsession_pump(f.s, f.now + 1000);
    ck_assert_int_eq(count(&f, C_BLOCK, from), 1);
    answer_block(&f, VSESSION_OK); /* nil: nothing came */
    /* script refused ten times in a row: the blocking pop alone for a minute */
    for (int i = 0; vsession_script_state(f.s) != VSESSION_SCRIPT_OFF; i++) {
        ck_assert_int_lt(i, 10);
        vsession_on_link(f.s, VSESSION_LINK_POP, 1, f.now); /* warm again */
        vsession_pump(f.s, f.now);
        ck_assert_int_ge(f.nbatches, 1);
        while (f.nbatches)
            answer_batch(&f, i % 2 ? VSESSION_NOSCRIPT : VSESSION_REFUSED);
        ck_assert_int_eq(vsession_script_state(f.s), vsession_script_fails(f.s) < 10
                                                         ? VSESSION_SCRIPT_FAILING
                                                         : VSESSION_SCRIPT_OFF);
    }
    ck_assert_int_eq(vsession_script_fails(f.s), 10);
    vsession_on_link(f.s, VSESSION_LINK_POP, 1, f.now);
    from = f.nlog;
    vsession_pump(f.s, f.now + 59999);
    ck_assert_int_eq(count(&f, C_BATCH, from), 0);
    ck_assert_int_eq(count(&f, C_BLOCK, from), 1);
    answer_block(&f, VSESSION_OK);
    from = f.nlog;
    vsession_pump(f.s, f.now + 60000);
    ck_assert_int_ge(count(&f, C_BATCH, from), 1);
    answer_batch(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_script_state(f.s), VSESSION_SCRIPT_ON);
    while (f.nbatches)
        answer_batch(&f, VSESSION_OK);
    ack_all(&f);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_lease_refreshed_before_expiry)
{
    struct fake f;
    const uint64_t visibility_ms = 3000; /* lease_ms is a third of it */
    fake_init(&f, 20, 40);
    for (int step = 0; step < 400; step++) {
        f.now += 250;
        vsession_tick(f.s, f.now);
        vsession_pump(f.s, f.now);
        settle_all(&f);
        /* every record in the store that we hold looks alive */
        for (int m = 0; m < f.nmsg; m++) {
            char tag[16];
            tag_of(m, tag, sizeof(tag));
            if (f.recorded[m] && vsession_held(f.s, tag))
                ck_assert_msg(f.now - f.lease_at[m] < visibility_ms,
                              "message %d stale at %llu", m, (unsigned long long)f.now);
        }
        if (step % 37 == 36) /* ack a few now and then */
            for (int m = 0; m < f.nmsg; m += 7) {
                char tag[16];
                tag_of(m, tag, sizeof(tag));
                if (vsession_held(f.s, tag))
                    ack_msg(&f, m);
            }
    }
    ck_assert_int_gt(count(&f, C_REFRESH, 0), 50);
    vsession_drain(f.s, f.now);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_exactly_once_with_faults)
{
    struct fake f;
    unsigned seed = 7 + (unsigned)_i;
    fake_init(&f, 30, 500);
    for (int step = 0; step < 3000; step++) {
        int r = (int)((seed = seed * 1103515245u + 12345u) >> 16) % 100;
        f.now += 10;
        if (r < 30) {
            vsession_pump(f.s, f.now);
        } else if (r < 45 && f.nbatches) {
            answer_batch(&f, r < 43 ? VSESSION_OK : VSESSION_LOST);
        } else if (r < 50 && f.block_out) {
            answer_block(&f, VSESSION_OK);
        } else if (r < 55 && f.nrecording) {
            answer_records(&f, r < 54 ? VSESSION_OK : VSESSION_REFUSED);
        } else if (r < 65 && f.nacks) {
            answer_acks(&f, r < 60   ? VSESSION_OK
                            : r < 62 ? VSESSION_REFUSED
                                     : VSESSION_LOST);
        } else if (r < 80) {
            /* settle something held */
            struct vsession_rec *h = vsession_first(f.s);
            if (h) {
                char tag[16];
                snprintf(tag, sizeof(tag), "%s", h->tag);
                if (r < 77)
                    ack_msg(&f, msg_of(tag));
                else
                    vsession_requeue(f.s, tag);
            }
        } else if (r < 83) {
            /* the store goes and comes back: what was in flight is lost */
            f.store_up = 0;
            while (f.nacks)
                answer_acks(&f, VSESSION_LOST);
            answer_records(&f, VSESSION_LOST);
            vsession_pump(f.s, f.now);
            f.store_up = 1;
            vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
        } else if (r < 90) {
            vsession_tick(f.s, f.now);
        }
        ck_assert_int_le(vsession_nheld(f.s), 30);
    }
    /* the stop: what is held goes back */
    vsession_stop_consuming(f.s);
    settle_all(&f);
    vsession_drain(f.s, f.now);
    settle_all(&f);
    ck_assert_int_eq(vsession_nheld(f.s), 0);
    /* requeues and restores never removed what they put back */
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_copies_and_requeue_sides)
{
    struct fake f;
    fake_init(&f, 10, 3);
    vsession_pump(f.s, f.now);
    answer_batch(&f, VSESSION_OK);
    /* a peer restored t1 and we popped it again: a second copy */
    feed(&f, 1, 1);
    ck_assert_int_eq(vsession_nheld(f.s), 4);
    vsession_requeue(f.s, "t1"); /* one copy settled: nothing put back */
    ck_assert_int_eq(count(&f, C_RESTORE, 0), 0);
    vsession_requeue(f.s, "t1");
    ck_assert_int_eq(count(&f, C_RESTORE, 0), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].side, 'L');
    vsession_stop_consuming(f.s);
    vsession_requeue(f.s, "t0");
    ck_assert_int_eq(f.log[f.nlog - 1].side, 'R');
    /* unknown and settled tags are nothing */
    ck_assert_int_eq(vsession_ack(f.s, "t0"), 0);
    ck_assert_int_eq(vsession_ack(f.s, "nope"), 0);
    vsession_requeue(f.s, "nope");
    vsession_drain(f.s, f.now);
    ck_assert_int_eq(f.log[f.nlog - 1].kind, C_RESTORE);
    ck_assert_int_eq(f.log[f.nlog - 1].side, 'R');
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_acks_batched_refused_and_replayed)
{
    struct fake f;
    int from;
    fake_init(&f, 2000, 1200);
    while (f.next_msg < 1200) {
        vsession_pump(f.s, f.now);
        while (f.nbatches)
            answer_batch(&f, VSESSION_OK);
    }
    ack_all(&f);
    ck_assert_uint_eq(vsession_nacks(f.s), 1200);
    f.pop_up = 0; /* pops aside */
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(f.nacks, 3); /* 512 + 512 + 176 */
    ck_assert_int_eq(f.acks[0].n, 512);
    ck_assert_int_eq(f.acks[2].n, 176);
    /* refused: held a tick, then sent again */
    answer_acks(&f, VSESSION_REFUSED);
    ck_assert_int_eq(vsession_acks_state(f.s), VSESSION_ACKS_REFUSED);
    from = f.nlog;
    vsession_pump(f.s, f.now + 100);
    ck_assert_int_eq(count(&f, C_ACK, from), 0);
    vsession_pump(f.s, f.now + 250);
    ck_assert_int_eq(count(&f, C_ACK, from), 1);
    while (f.nacks)
        answer_acks(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_acks_state(f.s), VSESSION_ACKS_OPEN);
    check_once(&f);
    /* a failover: the acks of the last 10 s go again, once */
    f.now += 5000;
    from = f.nlog;
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(count(&f, C_ACK, from), 3);
    while (f.nacks)
        answer_acks(&f, VSESSION_OK);
    check_once(&f); /* removing twice removed nothing twice */
    /* and again, later than the replay span: nothing */
    f.now += 10001;
    from = f.nlog;
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(count(&f, C_ACK, from), 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_restore_round)
{
    struct fake f;
    int from;
    fake_init(&f, 10, 2);
    vsession_pump(f.s, f.now);
    answer_batch(&f, VSESSION_OK);
    vsession_tick(f.s, f.now);
    ck_assert_int_eq(vsession_round_state(f.s), VSESSION_ROUND_LOCKING);
    vsession_tick(f.s, f.now + 60000); /* one round at a time */
    ck_assert_int_eq(count(&f, C_LOCK, 0), 1);
    /* out of order: a scan answer before the lock's is ignored */
    vsession_on_round_stale(f.s, NULL, 0, VSESSION_OK);
    ck_assert_int_eq(vsession_round_state(f.s), VSESSION_ROUND_LOCKING);
    vsession_on_round_locked(f.s, 1);
    ck_assert_int_eq(vsession_round_state(f.s), VSESSION_ROUND_SCANNING);
    {
        /* a dead peer's two and one of ours (a slow refresh) */
        const char *stale[] = {"t900", "t0", "t901"};
        f.nmsg = 902;
        vsession_on_round_stale(f.s, stale, 3, VSESSION_OK);
    }
    ck_assert_int_eq(count(&f, C_RESTORE, 0), 2);
    ck_assert_int_eq(f.restored[0], 0);
    ck_assert_int_eq(count(&f, C_UNLOCK, 0), 1);
    ck_assert_int_eq(vsession_round_state(f.s), VSESSION_ROUND_IDLE);
    /* the lock held by another: no scan, no unlock */
    from = f.nlog;
    vsession_tick(f.s, f.now + 120000);
    vsession_on_round_locked(f.s, 0);
    ck_assert_int_eq(count(&f, C_SCAN, from), 0);
    ck_assert_int_eq(count(&f, C_UNLOCK, from), 0);
    /* a malformed scan reply ends the round with the unlock */
    vsession_tick(f.s, f.now + 180000);
    vsession_on_round_locked(f.s, 1);
    vsession_on_round_stale(f.s, NULL, 0, VSESSION_MALFORMED);
    ck_assert_int_eq(count(&f, C_UNLOCK, from), 1);
    f.restored[900] = f.restored[901] = 0; /* not ours to count */
    f.nmsg = 2;
    ack_all(&f);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_malformed_and_out_of_order)
{
    struct fake f;
    fake_init(&f, 10, 4);
    /* answers to nothing asked */
    ck_assert_ptr_null(vsession_on_recorded(f.s, "t0", VSESSION_OK));
    vsession_on_round_locked(f.s, 1);
    vsession_on_block(f.s, VSESSION_OK, 0, f.now);
    ck_assert_int_eq(count(&f, C_SCAN, 0), 0);
    /* a batch answered with something unreadable changes no mode */
    vsession_pump(f.s, f.now);
    {
        long asked = f.batches[0];
        f.nbatches = 0;
        vsession_on_batch(f.s, asked, VSESSION_MALFORMED, f.now);
        ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_WARM);
        ck_assert_int_eq(vsession_script_state(f.s), VSESSION_SCRIPT_ON);
        ck_assert_int_eq(vsession_room(f.s), 10);
    }
    /* more than asked, then a cut batch: still warm */
    vsession_pump(f.s, f.now);
    answer_batch(&f, VSESSION_OK);
    vsession_on_batch_end(f.s, 1, 5, 0);
    vsession_on_batch_end(f.s, 5, 0, 1);
    ck_assert_int_eq(vsession_pop_state(f.s),
                     VSESSION_POP_COLD); /* the real one was dry */
    /* a record answered after its ack: nothing */
    ack_all(&f);
    f.nmsg = 5;
    feed(&f, 4, 0);
    ck_assert_int_eq(f.nrecording, 1);
    ack_msg(&f, 4);
    answer_records(&f, VSESSION_OK);
    /* an ack answer for tags never sent, twice */
    {
        const char *tags[] = {"t1", "zz"};
        vsession_on_acked(f.s, tags, 2, VSESSION_CANCELED, f.now);
        vsession_on_acked(f.s, tags, 0, VSESSION_OK, f.now);
    }
    ack_all(&f);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_untracked_and_pending_records)
{
    struct fake f;
    fake_init(&f, 10, 3);
    /* the store refuses the record write: POPPED, written again on a tick */
    f.fail_record = 1;
    feed(&f, 0, 0);
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_POPPED);
    f.fail_record = 0;
    vsession_tick(f.s, f.now);
    /* written on the store's return (send_pending_records), not earlier */
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_POPPED);
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_RECORDING);
    answer_records(&f, VSESSION_REFUSED);
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_POPPED);
    vsession_tick(f.s, f.now + 250);
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_RECORDING);
    answer_records(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_held(f.s, "t0")->state, VSESSION_REC_HELD);
    /* a record never written: its ack removes nothing */
    f.fail_record = 1;
    feed(&f, 1, 0);
    ack_msg(&f, 1);
    ck_assert_uint_eq(vsession_nacks(f.s), 0);
    ack_msg(&f, 0);
    settle_all(&f);
    ack_all(&f); /* what the pump popped meanwhile */
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

/* The i-th lost look-up sent since from (its score), or NULL. */
static const char *scanned(const struct fake *f, int from, int i)
{
    for (int k = from; k < f->nlog; k++)
        if (f->log[k].kind == C_SCAN_LOST && i-- == 0)
            return f->log[k].score;
    return NULL;
}

/* A batch call ran in the store (two messages popped and recorded) and its
 * reply was lost with the link. */
static void lose_batch(struct fake *f, const char *score, int *taken)
{
    for (int i = 0; i < 2; i++) {
        taken[i] = take(f);
        ck_assert_int_ge(taken[i], 0);
        f->recorded[taken[i]] = 1;
    }
    answer_batch(f, VSESSION_LOST);
    vsession_on_pop_lost(f->s, score);
}

START_TEST(test_lost_call_recovered_once)
{
    struct fake f;
    int taken[2], from;
    char t0[16], t1[16];
    const char *tags[3];
    struct vsession_rec *ours;
    fake_init(&f, 10, 12);
    vsession_pump(f.s, f.now);
    ck_assert_int_gt(f.nbatches, 0);
    /* the store is away when the second call's reply is lost: kept, not
     * asked */
    f.store_up = 0;
    from = f.nlog;
    lose_batch(&f, "1700000000.5", taken);
    feed(&f, take(&f), 1); /* one delivered otherwise (a blocking pop) */
    ck_assert_int_eq(vsession_nlost(f.s), 1);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 0);
    /* ticks do not ask it (the store is down, nothing refused) */
    vsession_tick(f.s, f.now + 10000);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 0);
    /* the store is back: looked up once, with the waiting restores */
    f.store_up = 1;
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    ck_assert_str_eq(scanned(&f, from, 0), "1700000000.5");
    ck_assert_int_eq(count(&f, C_AGAIN, from), 1);
    ck_assert_int_eq(vsession_nlost(f.s), 0);
    /* and only then: neither another link up nor ticks ask it again */
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    vsession_tick(f.s, f.now + 20000);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    /* the answer: t0 is ours (a copy popped again), the two lost go back */
    tag_of(taken[0], t0, sizeof(t0));
    tag_of(taken[1], t1, sizeof(t1));
    ours = vsession_first(f.s);
    ck_assert_ptr_nonnull(ours);
    tags[0] = t0;
    tags[1] = ours->tag;
    tags[2] = t1;
    from = f.nlog;
    vsession_on_lost_scan(f.s, "1700000000.5", tags, 3, VSESSION_OK, f.now);
    ck_assert_int_eq(count(&f, C_RESTORE, from), 2);
    ck_assert_int_eq(f.log[from].side, 'R');
    ck_assert_int_eq(f.log[from].round, 0);
    ck_assert_int_eq(f.restored[msg_of(ours->tag)], 0);
    ck_assert_int_eq(f.restored[taken[0]] + f.restored[taken[1]], 2);
    ck_assert(!f.recorded[taken[0]] && !f.recorded[taken[1]]);
    /* with the store up, a lost call is asked at once */
    from = f.nlog;
    vsession_on_pop_lost(f.s, "1700000001.25");
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    /* a lost look-up is kept for the link's return, not for a tick */
    vsession_on_lost_scan(f.s, "1700000001.25", NULL, 0, VSESSION_LOST, f.now);
    ck_assert_int_eq(vsession_nlost(f.s), 1);
    ck_assert_int_eq(vsession_again_state(f.s), VSESSION_AGAIN_NONE);
    vsession_tick(f.s, f.now + 30000);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 2);
    /* a malformed or cancelled answer drops it */
    vsession_on_lost_scan(f.s, "1700000001.25", NULL, 0, VSESSION_MALFORMED, f.now);
    vsession_on_lost_scan(f.s, "1700000001.25", NULL, 0, VSESSION_CANCELED, f.now);
    ck_assert_int_eq(vsession_nlost(f.s), 0);
    f.restored[taken[0]] = f.restored[taken[1]] = 0; /* not popped by the session */
    f.popped[taken[0]] = f.popped[taken[1]] = 0;
    ack_all(&f);
    settle_all(&f);
    ack_all(&f);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_refused_goes_again_after_retry)
{
    struct fake f;
    int from;
    uint64_t t;
    fake_init(&f, 10, 0);
    vsession_on_pop_lost(f.s, "5.5");
    ck_assert_int_eq(count(&f, C_SCAN_LOST, 0), 1);
    /* refused (LOADING): held for retry_ms (250 ms) */
    t = f.now;
    vsession_on_lost_scan(f.s, "5.5", NULL, 0, VSESSION_REFUSED, t);
    ck_assert_int_eq(vsession_again_state(f.s), VSESSION_AGAIN_DUE);
    ck_assert_int_eq(vsession_nlost(f.s), 1);
    from = f.nlog;
    vsession_tick(f.s, t + 249);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 0);
    ck_assert_int_eq(count(&f, C_AGAIN, from), 0);
    vsession_tick(f.s, t + 250);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    ck_assert_str_eq(scanned(&f, from, 0), "5.5");
    ck_assert_int_eq(count(&f, C_AGAIN, from), 1);
    ck_assert_int_eq(vsession_again_state(f.s), VSESSION_AGAIN_NONE);
    /* once: the next tick asks nothing */
    vsession_tick(f.s, t + 500);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    ck_assert_int_eq(count(&f, C_AGAIN, from), 1);
    /* a refused restore: the waiting ones go again after retry_ms */
    from = f.nlog;
    vsession_on_restore_refused(f.s, t + 1000);
    vsession_on_restore_refused(f.s, t + 1100); /* a later one moves it on */
    vsession_tick(f.s, t + 1250);
    ck_assert_int_eq(count(&f, C_AGAIN, from), 0);
    vsession_tick(f.s, t + 1350);
    ck_assert_int_eq(count(&f, C_AGAIN, from), 1);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 0);
    /* a look-up the store link could not send waits for it */
    f.fail_scan_lost = 1;
    vsession_on_pop_lost(f.s, "6.5");
    ck_assert_int_eq(vsession_nlost(f.s), 1);
    f.fail_scan_lost = 0;
    from = f.nlog;
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, t + 2000);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, from), 1);
    /* closed: nothing kept, nothing asked */
    vsession_close(f.s);
    from = f.nlog;
    vsession_on_pop_lost(f.s, "7.5");
    vsession_on_lost_scan(f.s, "6.5", NULL, 0, VSESSION_REFUSED, t + 3000);
    vsession_on_restore_refused(f.s, t + 3000);
    ck_assert_int_eq(vsession_nlost(f.s), 0);
    ck_assert_int_eq(f.nlog, from);
    fake_release(&f);
}
END_TEST

/* Past VSESSION_LOST_MAX lost calls the oldest go; the newest are asked
 * first. */
START_TEST(test_lost_bound)
{
    struct fake f;
    char score[16];
    fake_init(&f, 10, 0);
    f.store_up = 0;
    for (int i = 0; i < VSESSION_LOST_MAX + 2; i++) {
        snprintf(score, sizeof(score), "%d.5", i);
        vsession_on_pop_lost(f.s, score);
    }
    ck_assert_int_eq(vsession_nlost(f.s), VSESSION_LOST_MAX);
    f.store_up = 1;
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    ck_assert_int_eq(count(&f, C_SCAN_LOST, 0), VSESSION_LOST_MAX);
    for (int i = 0; i < VSESSION_LOST_MAX; i++) {
        snprintf(score, sizeof(score), "%d.5", VSESSION_LOST_MAX + 1 - i);
        ck_assert_str_eq(scanned(&f, 0, i), score);
    }
    /* a score too long for the table is cut, not overrun */
    vsession_on_pop_lost(f.s, "12345678901234567890123456789012345678");
    ck_assert_int_eq(strlen(scanned(&f, 0, VSESSION_LOST_MAX)), VSESSION_SCORE_MAX - 1);
    fake_release(&f);
}
END_TEST

/* Every allocation of a lost call's life fails in turn (the session keeps
 * its scores in place: none should): the call is looked up exactly once and
 * both its records go back. */
START_TEST(test_lost_oom_sweep)
{
    long n;
    for (n = 1; n < 1000; n++) {
        struct fake f;
        const char *tags[] = {"t0", "t1"};
        long failed;
        fake_init(&f, 10, 2);
        f.store_up = 0;
        cr_alloc_fail_after(n);
        vsession_on_pop_lost(f.s, "9.5");
        f.store_up = 1;
        vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
        vsession_on_lost_scan(f.s, "9.5", NULL, 0, VSESSION_REFUSED, f.now);
        vsession_tick(f.s, f.now + 250);
        vsession_on_lost_scan(f.s, "9.5", tags, 2, VSESSION_OK, f.now);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        ck_assert_int_eq(count(&f, C_SCAN_LOST, 0), 2);
        ck_assert_int_eq(f.restored[0] + f.restored[1], 2);
        ck_assert_int_eq(vsession_nlost(f.s), 0);
        fake_release(&f);
        if (failed == 0)
            break;
    }
    ck_assert_int_eq(n, 1); /* nothing allocated on the way */
}
END_TEST

START_TEST(test_names)
{
    ck_assert_str_eq(vsession_state_name(VSESSION_DRAINING), "DRAINING");
    ck_assert_str_eq(vsession_pop_name(VSESSION_POP_COLD), "COLD");
    ck_assert_str_eq(vsession_script_name(VSESSION_SCRIPT_OFF), "OFF");
    ck_assert_str_eq(vsession_block_name(VSESSION_BLOCK_PAUSED), "PAUSED");
    ck_assert_str_eq(vsession_acks_name(VSESSION_ACKS_REFUSED), "REFUSED");
    ck_assert_str_eq(vsession_round_name(VSESSION_ROUND_RESTORING), "RESTORING");
    ck_assert_str_eq(vsession_rec_name(VSESSION_REC_UNTRACKED), "UNTRACKED");
    ck_assert_str_eq(vsession_again_name(VSESSION_AGAIN_DUE), "DUE");
    ck_assert_str_eq(vsession_again_name(VSESSION_AGAIN_NSTATES), "?");
    ck_assert_str_eq(vsession_rec_name((enum vsession_rec_state)99), "?");
}
END_TEST

/* Every allocation of pop -> deliver -> ack fails in turn: each pass ends
 * with every message acked once or back in its list, and the pass where
 * nothing failed acks all five. */
START_TEST(test_oom_sweep)
{
    long n;
    for (n = 1; n < 1000; n++) {
        struct fake f;
        long failed;
        int acked = 0;
        fake_init(&f, 10, 5);
        cr_alloc_fail_after(n);
        vsession_pump(f.s, f.now);
        while (f.nbatches)
            answer_batch(&f, VSESSION_OK);
        ack_all(&f);
        vsession_pump(f.s, f.now);
        while (f.nacks)
            answer_acks(&f, VSESSION_OK);
        f.now += 20000; /* past the replay span: the ring is not reused */
        vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        settle_all(&f);
        ack_all(&f);
        settle_all(&f);
        check_once(&f);
        for (int m = 0; m < 5; m++)
            acked += f.settled[m];
        fake_release(&f);
        if (failed == 0) {
            ck_assert_int_eq(acked, 5);
            break;
        }
    }
    ck_assert_int_gt(n, 10); /* failures were met on the way */
    ck_assert_int_lt(n, 1000);
}
END_TEST

/* ------------------------------------------------------------ long polls */

START_TEST(test_long_polls_window)
{
    struct fake f;
    int from;
    /* three queues, a window of 25: 10, 10 and 5 asked, then nothing */
    fake_init_long(&f, 25, 100, 3);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, 0), 3);
    ck_assert_int_eq(f.log[0].max, 10);
    ck_assert_int_eq(f.log[1].max, 10);
    ck_assert_int_eq(f.log[2].max, 5);
    ck_assert_int_eq(f.log[0].wide, 0);
    ck_assert_int_eq(vsession_room(f.s), 0);
    from = f.nlog;
    vsession_pump(f.s, f.now);
    vsession_tick(f.s, f.now + 100);
    vsession_pop(f.s, f.now + 100);
    ck_assert_int_eq(f.nlog, from);
    /* a poll that found nothing: polled again at once, never a blocking pop */
    f.nmsg = 0;
    ck_assert_int_eq(answer_batch(&f, VSESSION_OK), 0);
    ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_WARM);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].max, 10);
    /* messages: held, counted against the window */
    f.nmsg = 100;
    ck_assert_int_eq(answer_batch(&f, VSESSION_OK), 10);
    ck_assert_int_eq(vsession_nheld(f.s), 10);
    from = f.nlog;
    vsession_pump(f.s, f.now); /* room 0: 10 held, 5 and 10 asked */
    ck_assert_int_eq(f.nlog, from);
    ck_assert_int_eq(answer_batch(&f, VSESSION_OK), 5);
    vsession_pump(f.s, f.now); /* room 0 still: 15 held, 10 asked */
    ck_assert_int_eq(f.nlog, from);
    ck_assert_int_eq(ack_msg(&f, 0), 0);
    ck_assert_int_eq(ack_msg(&f, 1), 0);
    vsession_pump(f.s, f.now); /* the acks, and a poll of 2 */
    ck_assert_int_eq(count(&f, C_ACK, from), 1);
    ck_assert_int_eq(count(&f, C_BATCH, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].max, 2);
    ck_assert_int_eq(count(&f, C_BLOCK, 0), 0);
    while (vsession_nheld(f.s) || !dry(&f)) {
        ack_all(&f);
        settle_all(&f);
        ck_assert_int_le(vsession_nheld(f.s), 25);
    }
    ck_assert_int_eq(f.nbatches, 3); /* the polls wait on the dry queues */
    ck_assert_int_eq(f.next_msg, 100);
    ck_assert_int_eq(count(&f, C_BLOCK, 0), 0);
    check_once(&f);
    fake_release(&f);

    /* no window: ten a poll, one poll per queue */
    fake_init_long(&f, 0, 100, 2);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_BATCH, 0), 2);
    ck_assert_int_eq(f.log[0].max, 10);
    ck_assert_int_eq(f.log[1].max, 10);
    ck_assert_int_eq(f.log[1].wide, 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_long_polls_refused_and_stopped)
{
    struct fake f;
    int from;
    fake_init_long(&f, 10, 20, 1);
    /* refusals, lost and unreadable replies: the owner's; polls go on */
    for (int i = 0; i < 25; i++) {
        static const enum vsession_reply reps[] = {VSESSION_REFUSED, VSESSION_NOSCRIPT,
                                                   VSESSION_LOST, VSESSION_MALFORMED};
        vsession_pump(f.s, f.now);
        ck_assert_int_eq(f.nbatches, 1);
        answer_batch(&f, reps[i % 4]);
        ck_assert_int_eq(vsession_script_state(f.s), VSESSION_SCRIPT_ON);
        ck_assert_int_eq(vsession_pop_state(f.s), VSESSION_POP_WARM);
        ck_assert_int_eq(vsession_room(f.s), 10);
    }
    /* a queue paused by the owner: nothing asked, nothing blocks */
    f.fail_batch = 1;
    from = f.nlog;
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(f.nlog, from);
    ck_assert(!vsession_popping(f.s));
    f.fail_batch = 0;
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(answer_batch(&f, VSESSION_OK), 10);
    /* stopped: no poll at all, acks still go */
    vsession_stop_consuming(f.s);
    ack_all(&f);
    from = f.nlog;
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_ACK, from), 1);
    ck_assert_int_eq(count(&f, C_BATCH, from) + count(&f, C_BLOCK, from), 0);
    settle_all(&f);
    check_once(&f);
    fake_release(&f);
}
END_TEST

START_TEST(test_long_polls_lease_requeue_drain)
{
    struct fake f;
    int from;
    fake_init_long(&f, 10, 30, 2);
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now);
    vsession_on_link(f.s, VSESSION_LINK_POP, 1, f.now);
    vsession_pump(f.s, f.now);
    answer_batch(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_nheld(f.s), 10);
    /* held at once: nothing written */
    ck_assert_int_eq(count(&f, C_RECORD, 0), 0);
    for (int m = 0; m < 10; m++) {
        char tag[16];
        tag_of(m, tag, sizeof(tag));
        ck_assert_int_eq(vsession_held(f.s, tag)->state, VSESSION_REC_HELD);
    }
    /* leases every lease_ms; a shorter period from the next refresh on */
    from = f.nlog;
    vsession_tick(f.s, f.now + 999);
    ck_assert_int_eq(count(&f, C_REFRESH, from), 0);
    vsession_set_lease_ms(f.s, 300);
    vsession_tick(f.s, f.now + 999);
    ck_assert_int_eq(count(&f, C_REFRESH, from), 0);
    vsession_tick(f.s, f.now + 1000);
    ck_assert_int_eq(count(&f, C_REFRESH, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].n, 10);
    vsession_tick(f.s, f.now + 1299);
    ck_assert_int_eq(count(&f, C_REFRESH, from), 1);
    vsession_tick(f.s, f.now + 1300);
    ck_assert_int_eq(count(&f, C_REFRESH, from), 2);
    /* a requeue while consuming goes to the tail, no ack sent */
    from = f.nlog;
    vsession_requeue(f.s, "t4");
    ck_assert_int_eq(count(&f, C_RESTORE, from), 1);
    ck_assert_int_eq(f.log[f.nlog - 1].side, 'L');
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(count(&f, C_ACK, from), 0);
    ck_assert_int_eq(f.log[f.nlog - 1].max, 1); /* the room it left */
    /* the owner's stop: every record back, the acks out, no more polls */
    ck_assert_int_eq(ack_msg(&f, 2), 0);
    vsession_stop_consuming(f.s);
    from = f.nlog;
    vsession_drain(f.s, f.now);
    ck_assert_int_eq(count(&f, C_RESTORE, from), 8);
    ck_assert_int_eq(count(&f, C_ACK, from), 1);
    for (int i = from; i < f.nlog; i++)
        if (f.log[i].kind == C_RESTORE)
            ck_assert_int_eq(f.log[i].side, 'R');
    answer_batch(&f, VSESSION_OK); /* a poll answered late: held, freed at the end */
    while (f.nacks)
        answer_acks(&f, VSESSION_OK);
    ck_assert_int_eq(vsession_nheld(f.s), 1);
    vsession_close(f.s);
    fake_release(&f);
    ck_assert_int_eq(f.released[10], 1);
}
END_TEST

/* An ack given up on by the owner (CANCELED) is not sent again. */
START_TEST(test_long_polls_ack_given_up)
{
    struct fake f;
    int from;
    fake_init_long(&f, 10, 5, 1);
    vsession_pump(f.s, f.now);
    answer_batch(&f, VSESSION_OK);
    ack_all(&f);
    vsession_pump(f.s, f.now);
    ck_assert_int_eq(f.nacks, 1);
    answer_acks(&f, VSESSION_CANCELED);
    from = f.nlog;
    vsession_pump(f.s, f.now + 1000);
    vsession_on_link(f.s, VSESSION_LINK_STORE, 1, f.now + 1000);
    ck_assert_int_eq(count(&f, C_ACK, from), 0);
    ck_assert_int_eq(vsession_nacks(f.s), 0);
    fake_release(&f);
}
END_TEST

START_TEST(test_long_polls_oom_sweep)
{
    long n;
    for (n = 1; n < 1000; n++) {
        struct fake f;
        long failed;
        int acked = 0;
        fake_init_long(&f, 10, 5, 2);
        cr_alloc_fail_after(n);
        vsession_pump(f.s, f.now);
        while (f.nbatches)
            answer_batch(&f, VSESSION_OK);
        vsession_requeue(f.s, "t0");
        ack_all(&f);
        vsession_pump(f.s, f.now);
        while (f.nacks)
            answer_acks(&f, VSESSION_OK);
        failed = cr_alloc_failed();
        cr_alloc_fail_after(0);
        settle_all(&f);
        ack_all(&f);
        settle_all(&f);
        check_once(&f);
        for (int m = 0; m < 5; m++)
            acked += f.settled[m];
        fake_release(&f);
        if (failed == 0) {
            ck_assert_int_eq(acked, 4);
            ck_assert_int_eq(f.restored[0], 1);
            break;
        }
    }
    ck_assert_int_gt(n, 5); /* failures were met on the way */
    ck_assert_int_lt(n, 1000);
}
END_TEST

Suite *suite(void)
{
    Suite *s = suite_create("vsession");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_window_full_pops_nothing);
    tcase_add_test(tc, test_wide_narrow);
    tcase_add_test(tc, test_cold_warm_and_script_off);
    tcase_add_test(tc, test_lease_refreshed_before_expiry);
    tcase_add_loop_test(tc, test_exactly_once_with_faults, 0, 8);
    tcase_add_test(tc, test_copies_and_requeue_sides);
    tcase_add_test(tc, test_acks_batched_refused_and_replayed);
    tcase_add_test(tc, test_restore_round);
    tcase_add_test(tc, test_malformed_and_out_of_order);
    tcase_add_test(tc, test_untracked_and_pending_records);
    tcase_add_test(tc, test_lost_call_recovered_once);
    tcase_add_test(tc, test_refused_goes_again_after_retry);
    tcase_add_test(tc, test_lost_bound);
    tcase_add_test(tc, test_lost_oom_sweep);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_oom_sweep);
    tcase_add_test(tc, test_long_polls_window);
    tcase_add_test(tc, test_long_polls_refused_and_stopped);
    tcase_add_test(tc, test_long_polls_lease_requeue_drain);
    tcase_add_test(tc, test_long_polls_ack_given_up);
    tcase_add_test(tc, test_long_polls_oom_sweep);
    suite_add_tcase(s, tc);
    return s;
}
