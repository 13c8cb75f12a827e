/* fleet_limits.c -- shared provider limits in Redis (see fleet_limits.h). */
#include "fleet_limits.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "llm/grants.h"
#include "llm/limiter.h"
#include "util/alloc.h"
#include "util/log.h"

/* llm/limiter.c's arithmetic, run in Redis. KEYS: req, tok, cool, permits,
 * stats. ARGV[1] is the mode:
 *   try rpm tpm concurrency lease_ms tokens holder burst_ms waited_ms
 *       [extras life_ms span_ms]
 *       -> 0 granted (charged), or the wait in ms before asking again, or
 *          {n, first_ms}: granted with n extra request slots of the GCRA
 *          charged too, the first due in first_ms (llm/grants.h's
 *          grants_fit(): asked for extras, an rpm-only limit)
 *   correct tpm delta_tokens   (the usage came: move the token tat)
 *   cool ms [hold]             (nothing before now + ms; a later one wins;
 *                               "hold": the provider's headers said so, not
 *                               a 429, counted apart)
 *   renew lease_ms holder      (a permit still held lives on)
 *   stats -> {granted, waited, wait_ms, coolings, cooled_until_ms (0: not
 *             cooled), in_flight, requests and tokens in the last minute, holds}
 * A wait on a full set of permits is at most 50 ms: a permit freed by another
 * worker says nothing, so the asker looks again soon. A wait on tokens is at
 * most TOK_POLL_MS for the same reason: the calls before were charged their
 * estimate, and the usage they report, often far less, gives the rest back
 * meanwhile (measured with two workers at 3,000 tpm and calls of about 22
 * tokens estimated at 52: 7.6 s for 14 calls with exact waits against an
 * ideal of 4.9 s; 5.5 s with these polls).
 *
 * The stats hash counts for the whole fleet: calls granted, those that
 * waited (waited_ms > 0: held back at least once) and their wait, and the
 * coolings. The last minute's use is a sliding window of two fixed minutes
 * (fields m: this minute's number, rc/tc: its requests and tokens, rp/tp:
 * the minute before's), the one before weighted by how much of it the last
 * 60 s still cover: cheap, and exact when the pace is even. */
static struct backend_script limit_script = BACKEND_SCRIPT(
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local mode = ARGV[1]\n"
    "local TOK_POLL_MS = 200\n"
    "local function num(k) return tonumber(redis.call('GET', k) or '0') or 0 end\n"
    "local function put(k, v) redis.call('SET', k, string.format('%.3f', v), 'PX',\n"
    "  math.max(1, math.ceil(v - now)) + 60000) end\n"
    "local STATS_TTL_MS = 86400000\n"
    "local function window(reqs, toks)\n"
    "  local m = math.floor(now / 60000)\n"
    "  local h = redis.call('HMGET', KEYS[5], 'm', 'rc', 'tc')\n"
    "  local hm = tonumber(h[1] or '-1') or -1\n"
    "  if hm ~= m then\n"
    "    if hm == m - 1 then\n"
    "      redis.call('HSET', KEYS[5], 'rp', h[2] or '0', 'tp', h[3] or '0')\n"
    "    else redis.call('HSET', KEYS[5], 'rp', '0', 'tp', '0') end\n"
    "    redis.call('HSET', KEYS[5], 'm', m, 'rc', '0', 'tc', '0') end\n"
    "  if reqs ~= 0 then redis.call('HINCRBY', KEYS[5], 'rc', reqs) end\n"
    "  if toks ~= 0 then redis.call('HINCRBY', KEYS[5], 'tc', math.floor(toks)) end\n"
    "end\n"
    "if mode == 'try' then\n"
    "  local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "  local lease, tokens, holder = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]\n"
    "  local burst = tonumber(ARGV[8])\n"
    "  local w = 0\n"
    "  local cool = num(KEYS[3])\n"
    "  if cool > now then w = cool - now end\n"
    "  local function gwait(tat, limit, cost)\n"
    "    local over = math.max(tat, now) + cost * 60000 / limit - now - burst\n"
    "    if over > 0 and tat > now then return math.min(over, tat - now) end\n"
    "    return 0\n"
    "  end\n"
    "  local rtat, ttat = 0, 0\n"
    "  if rpm > 0 then rtat = num(KEYS[1]); w = math.max(w, gwait(rtat, rpm, 1)) end\n"
    "  if tpm > 0 and tokens > 0 then\n"
    "    ttat = num(KEYS[2])\n"
    "    w = math.max(w, math.min(gwait(ttat, tpm, tokens), TOK_POLL_MS)) end\n"
    "  if conc > 0 then\n"
    "    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)\n"
    "    if redis.call('ZCARD', KEYS[4]) >= conc then\n"
    "      local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')\n"
    "      w = math.max(w, math.min(tonumber(first[2]) - now, 50), 1)\n"
    "    end\n"
    "  end\n"
    "  if w > 0 then return math.max(1, math.ceil(w)) end\n"
    "  local extra, first, k = 0, 0, tonumber(ARGV[10] or '0') or 0\n"
    "  if rpm > 0 and k > 0 and tpm <= 0 and conc <= 0 then\n"
    "    local slot = 60000 / rpm\n"
    "    local after = math.max(rtat, now) + slot\n"
    "    first = math.ceil(after + slot - (burst - tonumber(ARGV[11])) - now)\n"
    "    local room = now + burst + tonumber(ARGV[12]) - after\n"
    "    extra = math.max(0, math.min(k, math.floor(room / slot))) end\n"
    "  if rpm > 0 then put(KEYS[1], math.max(rtat, now) + (1 + extra) * 60000 / rpm) "
    "end\n"
    "  if tpm > 0 and tokens > 0 then\n"
    "    put(KEYS[2], math.max(ttat, now) + tokens * 60000 / tpm) end\n"
    "  if conc > 0 then\n"
    "    redis.call('ZADD', KEYS[4], now + lease, holder)\n"
    "    redis.call('PEXPIRE', KEYS[4], lease * 2) end\n"
    "  local waited = tonumber(ARGV[9] or '0') or 0\n"
    "  window(1 + extra, math.max(tokens, 0))\n"
    "  redis.call('HINCRBY', KEYS[5], 'granted', 1 + extra)\n"
    "  if waited > 0 then\n"
    "    redis.call('HINCRBY', KEYS[5], 'waited', 1)\n"
    "    redis.call('HINCRBY', KEYS[5], 'wait_ms', math.floor(waited)) end\n"
    "  redis.call('PEXPIRE', KEYS[5], STATS_TTL_MS)\n"
    "  if extra > 0 then return {extra, first} end\n"
    "  return 0\n"
    "elseif mode == 'correct' then\n"
    "  local tat = num(KEYS[2])\n"
    "  if tat > 0 then put(KEYS[2], tat + tonumber(ARGV[3]) * 60000 / tonumber(ARGV[2])) "
    "end\n"
    "  window(0, tonumber(ARGV[3]))\n"
    "  return 0\n"
    "elseif mode == 'cool' then\n"
    "  local untl = now + tonumber(ARGV[2])\n"
    "  if untl > num(KEYS[3]) then put(KEYS[3], untl) end\n"
    "  local kind = ARGV[3] == 'hold' and 'holds' or 'coolings'\n"
    "  redis.call('HINCRBY', KEYS[5], kind, 1)\n"
    "  redis.call('PEXPIRE', KEYS[5], STATS_TTL_MS)\n"
    "  return 0\n"
    "elseif mode == 'stats' then\n"
    "  local h = redis.call('HMGET', KEYS[5], 'granted', 'waited', 'wait_ms', "
    "'coolings', 'm', 'rc', 'tc', 'rp', 'tp', 'holds')\n"
    "  local v = {}\n"
    "  for i = 1, 10 do v[i] = tonumber(h[i] or '0') or 0 end\n"
    "  local m = math.floor(now / 60000)\n"
    "  local rc, tc, rp, tp = v[6], v[7], v[8], v[9]\n"
    "  if v[5] ~= m then\n"
    "    if v[5] == m - 1 then rp, tp = rc, tc else rp, tp = 0, 0 end\n"
    "    rc, tc = 0, 0 end\n"
    "  local left = 1 - (now - m * 60000) / 60000\n"
    "  local cool = num(KEYS[3])\n"
    "  if cool <= now then cool = 0 end\n"
    "  local inflight = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')\n"
    "  return {v[1], v[2], v[3], v[4], math.floor(cool), inflight,\n"
    "          math.floor(rc + rp * left + 0.5), math.max(0, math.floor(tc + tp * left + "
    "0.5)), v[10]}\n"
    "elseif mode == 'renew' then\n"
    "  redis.call('ZADD', KEYS[4], 'XX', now + tonumber(ARGV[2]), ARGV[3])\n"
    "  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[2]) * 2)\n"
    "  return 0\n"
    "end\n"
    "return redis.error_reply('bad mode')\n");

/* How much less than a second's worth the shared state lets run ahead: a
 * call reaches the provider some milliseconds after Redis granted it, more
 * or fewer than the call before, and a provider refilling its bucket
 * continuously refuses one that comes a little early. Measured with three
 * workers at 600 rpm and 80 calls: 1 refused with no margin, none with 50 ms
 * (one call fewer in the first second's burst). */
#define WIRE_MARGIN_MS 50

/* How often each limit's fleet-wide figures are read back from Redis for
 * /metrics (one script call per limit met), and the worker says it is one
 * of the fleet. */
#define STATS_EVERY_MS 1000

/* A worker that has not said so for this long is no longer counted in the
 * fleet whose size sets the shares while Redis is away. */
#define MEMBER_TTL_MS 15000

/* The workers under limits: a sorted set of worker -> when its word ends.
 * KEYS[1] the set; ARGV: this worker, ttl_ms. Returns how many are live. */
static struct backend_script member_script = BACKEND_SCRIPT(
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local ttl = tonumber(ARGV[2])\n"
    "redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)\n"
    "redis.call('PEXPIRE', KEYS[1], ttl * 2)\n"
    "return redis.call('ZCARD', KEYS[1])\n");

/* The local state of one limit, for while Redis is away, and the last
 * figures read from Redis (lim->data). */
struct local_limit {
    struct lim_state st;
    struct lim_config share; /* st's limits: this worker's share of them */
    long share_n;            /* the fleet size share was cut for */
    struct fleet_limits *f;
    const struct llm_limit *lim; /* borrowed: the router's, outlives us */
    struct fleet_limit_stats stats;
    int reading; /* a stats question is out */
    /* request slots Redis charged ahead for this worker's next calls (an
     * rpm-only limit of GRANTS_MIN_RPM or more), and the calls they served */
    struct grants grants;
    double from_grants;
    struct local_limit *next;
};

/* A question sent to Redis. */
struct ask {
    struct fleet_limits *f;
    struct llm_client *c;
    struct llm_limit *lim;
    uint64_t holder;
    long tokens;
    uint64_t sent_ms;
    int answered; /* locally, after FLEET_LIMITS_ASK_MS */
    struct ask *next, *prev;
};

struct fleet_limits {
    uv_loop_t *loop;
    struct backend *bk;
    char holder_prefix[160];
    struct local_limit *locals;
    struct ask *asks; /* sent, unanswered */
    int alone;        /* 1: Redis away, counting alone (said once) */
    uint64_t stats_read_ms;
    long fleet_n;    /* workers under limits last seen in Redis (1: none seen) */
    int members_out; /* the membership question is out */
};

static struct lim_state *local_of(struct fleet_limits *f, struct llm_limit *lim)
{
    struct local_limit *l = lim->data;
    if (l)
        return &l->st;
    if (!(l = cr_calloc(1, sizeof(*l))))
        return NULL;
    l->share_n = f->fleet_n;
    lim_share(lim->cfg, l->share_n, &l->share);
    if (lim_init(&l->st, &l->share)) {
        cr_free(l);
        return NULL;
    }
    l->f = f;
    l->lim = lim;
    l->next = f->locals;
    f->locals = l;
    lim->data = l;
    return &l->st;
}

static void set_alone(struct fleet_limits *f, int alone, const char *why)
{
    if (alone && !f->alone && f->fleet_n > 1)
        LOG(LOG_WARNING,
            "limits: Redis away (%s): this worker applies its share, 1/%ld, of each "
            "limit (%ld workers were seen sharing them) until it is back",
            why, f->fleet_n, f->fleet_n);
    else if (alone && !f->alone)
        LOG(LOG_WARNING,
            "limits: Redis away (%s): this worker applies the whole of each limit (no "
            "other worker was seen sharing them) until it is back",
            why);
    else if (!alone && f->alone)
        LOG(LOG_WARNING, "limits: shared across the fleet in Redis again");
    f->alone = alone;
}

static int shared(struct fleet_limits *f)
{
    if (!f->bk)
        return 0;
    if (!backend_connected(f->bk)) {
        set_alone(f, 1, "not connected");
        return 0;
    }
    return 1;
}

static void answer_locally(struct fleet_limits *f, struct llm_client *c,
                           struct llm_limit *lim, long tokens, uint64_t holder)
{
    struct lim_state *st = local_of(f, lim);
    int64_t wait = 0;
    int ok;
    if (!st) { /* out of memory: let it go rather than hold it forever */
        llm_client_limit_answer(c, lim, 1, 0);
        return;
    }
    {
        struct local_limit *l = lim->data;
        if (l->share_n != f->fleet_n) {
            /* The fleet seen has changed since this state was cut: cut it
             * again for the new share (a cooling carries over; permits it
             * held were for calls of an earlier spell alone). */
            struct lim_state fresh;
            struct lim_config share;
            lim_share(lim->cfg, f->fleet_n, &share);
            if (lim_init(&fresh, &share) == 0) {
                fresh.cool_until_ms = l->st.cool_until_ms;
                lim_release(&l->st);
                l->st = fresh;
                l->share = share;
                l->share_n = f->fleet_n;
            }
        }
        ok = lim_try(&l->st, &l->share, (int64_t)uv_now(f->loop), tokens, holder, &wait);
    }
    llm_client_limit_answer(c, lim, ok, wait);
}

static void key_of(struct fleet_limits *f, const struct llm_limit *lim, const char *kind,
                   char *out, size_t n)
{
    snprintf(out, n, "%sceleriac:limit:%s:%s", backend_key_prefix(f->bk), lim->key, kind);
}

static void holder_of(struct fleet_limits *f, uint64_t holder, char *out, size_t n)
{
    snprintf(out, n, "%s%llu", f->holder_prefix, (unsigned long long)holder);
}

/* Runs the script in mode with args (after the keys). */
static int run(struct fleet_limits *f, const struct llm_limit *lim, int nargs,
               const char *const *args, backend_reply_fn *cb, void *privdata)
{
    char keys[5][256];
    const char *argv[24];
    int argc = 0;
    static const char *const kinds[] = {"req", "tok", "cool", "permits", "stats"};

    argv[argc++] = "5";
    for (int i = 0; i < 5; i++) {
        key_of(f, lim, kinds[i], keys[i], sizeof(keys[i]));
        argv[argc++] = keys[i];
    }
    for (int i = 0; i < nargs && argc < 24; i++)
        argv[argc++] = args[i];
    return backend_eval(f->bk, &limit_script, argc, argv, NULL, cb, privdata);
}

static void ask_unlink(struct fleet_limits *f, struct ask *a)
{
    if (a->prev)
        a->prev->next = a->next;
    else if (f->asks == a)
        f->asks = a->next;
    if (a->next)
        a->next->prev = a->prev;
    a->next = a->prev = NULL;
}

static double int_at(const redisReply *r, size_t i)
{
    const redisReply *e = i < r->elements ? r->element[i] : NULL;
    return e && e->type == REDIS_REPLY_INTEGER ? (double)e->integer : 0;
}

static void on_ask_reply(struct backend *bk, int status, const redisReply *reply,
                         void *privdata)
{
    struct ask *a = privdata;
    struct fleet_limits *f = a->f;
    int ok = status == 0 && reply &&
             (reply->type == REDIS_REPLY_INTEGER ||
              (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2));
    /* granted: 0, or {extra slots, the first one's due time} */
    long long wait = ok && reply->type == REDIS_REPLY_INTEGER ? reply->integer : 0;
    (void)bk;
    if (status == CR_ECANCELED) { /* backend_free(): the worker is going */
        cr_free(a);
        return;
    }
    ask_unlink(f, a);
    if (a->answered) {
        /* Answered locally meanwhile: a permit Redis granted is handed back. */
        if (ok && wait == 0 && a->lim->cfg->concurrency > 0) {
            char h[200], k[256];
            const char *argv[3] = {"ZREM", k, h};
            key_of(f, a->lim, "permits", k, sizeof(k));
            holder_of(f, a->holder, h, sizeof(h));
            backend_command(f->bk, 3, argv, NULL, NULL, NULL);
        }
        cr_free(a);
        return;
    }
    if (!ok) {
        set_alone(f, 1,
                  reply && reply->type == REDIS_REPLY_ERROR ? reply->str : "no reply");
        answer_locally(f, a->c, a->lim, a->tokens, a->holder);
    } else {
        struct local_limit *l = a->lim->data;
        set_alone(f, 0, NULL);
        if (reply->type == REDIS_REPLY_ARRAY && l)
            grants_put(&l->grants, (int)int_at(reply, 0), (int64_t)int_at(reply, 1),
                       a->lim->cfg->rpm, (int64_t)a->sent_ms, (int64_t)uv_now(f->loop));
        llm_client_limit_answer(a->c, a->lim, wait == 0, wait);
    }
    cr_free(a);
}

static void on_stats_reply(struct backend *bk, int status, const redisReply *reply,
                           void *privdata)
{
    struct local_limit *l = privdata;
    struct fleet_limit_stats *st = &l->stats;
    (void)bk;
    if (status == CR_ECANCELED) /* the worker is going; l is freed after */
        return;
    l->reading = 0;
    if (status || !reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 8)
        return;
    st->known = 1;
    st->granted = int_at(reply, 0);
    st->waited = int_at(reply, 1);
    st->wait_s = int_at(reply, 2) / 1000.0;
    st->coolings = int_at(reply, 3);
    st->cooled_until_ms = (int64_t)int_at(reply, 4);
    st->in_flight = int_at(reply, 5);
    st->requests_last_min = int_at(reply, 6);
    st->tokens_last_min = int_at(reply, 7);
    st->holds = int_at(reply, 8);
    /* Cooled in Redis (another worker's 429, or a hold): the grants held
     * here go too. */
    if (st->cooled_until_ms > 0)
        grants_drop(&l->grants);
}

/* Reads each limit's fleet-wide figures back (one question per limit out
 * at a time; while Redis is away they stay as last read). */
static void on_member_reply(struct backend *bk, int status, const redisReply *reply,
                            void *privdata)
{
    struct fleet_limits *f = privdata;
    (void)bk;
    if (status == CR_ECANCELED) /* the worker is going; f is freed after */
        return;
    f->members_out = 0;
    if (status == 0 && reply && reply->type == REDIS_REPLY_INTEGER &&
        reply->integer > 0) {
        f->fleet_n = (long)reply->integer;
        /* Redis answers: shared again, even before the next call asks. */
        set_alone(f, 0, NULL);
    }
}

/* Says this worker is one of the fleet under limits, and learns its size. */
static void say_member(struct fleet_limits *f)
{
    char key[320], ttl[24];
    const char *argv[5] = {"1", key, f->holder_prefix, ttl};
    if (f->members_out || !f->locals)
        return;
    snprintf(key, sizeof(key), "%sceleriac:limit-workers", backend_key_prefix(f->bk));
    snprintf(ttl, sizeof(ttl), "%d", MEMBER_TTL_MS);
    if (backend_eval(f->bk, &member_script, 4, argv, NULL, on_member_reply, f) == 0)
        f->members_out = 1;
}

static void read_stats(struct fleet_limits *f)
{
    static const char *const args[1] = {"stats"};
    if (!shared(f))
        return;
    say_member(f);
    for (struct local_limit *l = f->locals; l; l = l->next) {
        if (l->reading)
            continue;
        if (run(f, l->lim, 1, args, on_stats_reply, l) == 0)
            l->reading = 1;
    }
}

void fleet_limits_tick(struct fleet_limits *f)
{
    uint64_t now = uv_now(f->loop);
    for (struct ask *a = f->asks; a; a = a->next)
        if (!a->answered && now - a->sent_ms >= FLEET_LIMITS_ASK_MS) {
            a->answered = 1;
            set_alone(f, 1, "no answer");
            answer_locally(f, a->c, a->lim, a->tokens, a->holder);
        }
    if (now - f->stats_read_ms >= STATS_EVERY_MS) {
        f->stats_read_ms = now;
        read_stats(f);
    }
}

int fleet_limits_stats(const struct fleet_limits *f, int i, struct fleet_limit_stats *out)
{
    const struct local_limit *l = f ? f->locals : NULL;
    for (; l && i > 0; i--)
        l = l->next;
    if (!l || i < 0)
        return 0;
    *out = l->stats;
    out->key = l->lim->key;
    out->cfg = l->lim->cfg;
    out->from_grants = l->from_grants;
    out->shared = f->bk && !f->alone && backend_connected(f->bk);
    return 1;
}

static void op_ask(struct llm_client *c, struct llm_limit *lim, long tokens,
                   uint64_t holder, void *data)
{
    struct fleet_limits *f = data;
    const struct lim_config *cfg = lim->cfg;
    char rpm[32], tpm[32], conc[24], lease[24], tok[24], h[200], burst[16], waited[24];
    char extras[16], life[16], span[16];
    const char *args[12] = {"try", rpm,   tpm,    conc,   lease, tok,
                            h,     burst, waited, extras, life,  span};
    struct local_limit *l;
    int64_t now = (int64_t)uv_now(f->loop);
    int k = 0;
    struct ask *a;

    /* Every limit met is listed, for its figures, Redis or not. */
    local_of(f, lim);
    l = lim->data;
    if (!shared(f)) {
        answer_locally(f, c, lim, tokens, holder);
        return;
    }
    if (l && grants_apply(cfg->rpm, cfg->tpm, cfg->concurrency)) {
        /* A slot Redis charged ahead serves this call without asking. */
        int64_t due;
        grants_note_ask(&l->grants, now);
        if (grants_take(&l->grants, now, &due)) {
            l->from_grants++;
            llm_client_limit_answer(c, lim, 1, 0);
            return;
        }
        if (due > 0) { /* a slot held is due soon: wait for it, not Redis */
            llm_client_limit_answer(c, lim, 0, due);
            return;
        }
        k = grants_batch(&l->grants, cfg->rpm, now);
    }
    if (!(a = cr_calloc(1, sizeof(*a)))) {
        answer_locally(f, c, lim, tokens, holder);
        return;
    }
    snprintf(rpm, sizeof(rpm), "%.6f", cfg->rpm);
    snprintf(tpm, sizeof(tpm), "%.6f", cfg->tpm);
    snprintf(conc, sizeof(conc), "%ld", cfg->concurrency);
    snprintf(lease, sizeof(lease), "%lld", (long long)cfg->lease_ms);
    snprintf(tok, sizeof(tok), "%ld", tokens);
    snprintf(burst, sizeof(burst), "%d", LIM_BURST_MS - WIRE_MARGIN_MS);
    snprintf(waited, sizeof(waited), "%lld", (long long)lim->ask_waited_ms);
    snprintf(extras, sizeof(extras), "%d", k);
    snprintf(life, sizeof(life), "%d", GRANTS_LIFE_MS);
    snprintf(span, sizeof(span), "%d", GRANTS_SPAN_MS);
    holder_of(f, holder, h, sizeof(h));
    *a = (struct ask){f, c, lim, holder, tokens, (uint64_t)now, 0, f->asks, NULL};
    if (run(f, lim, 12, args, on_ask_reply, a)) {
        cr_free(a);
        answer_locally(f, c, lim, tokens, holder);
        return;
    }
    if (f->asks)
        f->asks->prev = a;
    f->asks = a;
}

static void op_done(struct llm_client *c, struct llm_limit *lim, uint64_t holder,
                    long est, long actual, void *data)
{
    struct fleet_limits *f = data;
    struct local_limit *l = lim->data;
    (void)c;
    if (l) {
        lim_done(&l->st, (int64_t)uv_now(f->loop), holder);
        if (actual >= 0)
            lim_correct(&l->st, &l->share, est, actual);
    }
    if (!f->bk)
        return;
    if (lim->cfg->concurrency > 0) {
        char h[200], k[256];
        const char *argv[3] = {"ZREM", k, h};
        key_of(f, lim, "permits", k, sizeof(k));
        holder_of(f, holder, h, sizeof(h));
        backend_command(f->bk, 3, argv, NULL, NULL, NULL);
    }
    if (lim->cfg->tpm > 0 && actual >= 0 && actual != est) {
        char tpm[32], delta[24];
        const char *args[3] = {"correct", tpm, delta};
        snprintf(tpm, sizeof(tpm), "%.6f", lim->cfg->tpm);
        snprintf(delta, sizeof(delta), "%ld", actual - est);
        run(f, lim, 3, args, NULL, NULL);
    }
}

static void op_cool(struct llm_client *c, struct llm_limit *lim, int64_t ms, void *data)
{
    struct fleet_limits *f = data;
    struct lim_state *st = local_of(f, lim);
    char n[24];
    const char *args[2] = {"cool", n};
    (void)c;
    if (ms < 1)
        ms = 1;
    if (st) {
        lim_cool(st, (int64_t)uv_now(f->loop) + ms);
        grants_drop(&((struct local_limit *)lim->data)->grants);
    }
    LOG(LOG_INFO, "limits: %s cooled for %lld ms by the provider", lim->key,
        (long long)ms);
    if (!f->bk)
        return;
    snprintf(n, sizeof(n), "%lld", (long long)ms);
    run(f, lim, 2, args, NULL, NULL);
}

static void op_hold(struct llm_client *c, struct llm_limit *lim, int64_t ms, void *data)
{
    struct fleet_limits *f = data;
    struct lim_state *st = local_of(f, lim);
    char n[24];
    const char *args[3] = {"cool", n, "hold"};
    (void)c;
    if (st) {
        lim_cool(st, (int64_t)uv_now(f->loop) + ms);
        grants_drop(&((struct local_limit *)lim->data)->grants);
    }
    LOG(LOG_DEBUG, "limits: %s spent for %lld ms, by the provider's headers", lim->key,
        (long long)ms);
    if (!f->bk)
        return;
    snprintf(n, sizeof(n), "%lld", (long long)ms);
    run(f, lim, 3, args, NULL, NULL);
}

static void op_renew(struct llm_client *c, struct llm_limit *lim, uint64_t holder,
                     void *data)
{
    struct fleet_limits *f = data;
    struct local_limit *l = lim->data;
    char lease[24], h[200];
    const char *args[3] = {"renew", lease, h};
    (void)c;
    if (l)
        lim_renew(&l->st, &l->share, (int64_t)uv_now(f->loop), holder);
    if (!f->bk)
        return;
    snprintf(lease, sizeof(lease), "%lld", (long long)lim->cfg->lease_ms);
    holder_of(f, holder, h, sizeof(h));
    run(f, lim, 3, args, NULL, NULL);
}

const struct llm_limit_ops fleet_limits_ops = {op_ask, op_done, op_cool, op_renew,
                                               op_hold};

struct fleet_limits *fleet_limits_new(uv_loop_t *loop, struct backend *bk,
                                      const char *hostname, struct cr_err *err)
{
    struct fleet_limits *f = cr_calloc(1, sizeof(*f));
    if (!f) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    f->loop = loop;
    f->bk = bk;
    f->fleet_n = 1;
    /* The pid too: two workers of one host may share a name. */
    snprintf(f->holder_prefix, sizeof(f->holder_prefix),
             "%.120s:%ld:", hostname ? hostname : "", (long)getpid());
    return f;
}

void fleet_limits_free(struct fleet_limits *f)
{
    if (!f)
        return;
    /* The backend, freed before, called every question back (cancelled). */
    while (f->locals) {
        struct local_limit *l = f->locals;
        f->locals = l->next;
        lim_release(&l->st);
        cr_free(l);
    }
    cr_free(f);
}
