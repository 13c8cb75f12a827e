/* fleet_pools.c -- the fleet's cooling and calls in flight, for pools and
 * fallbacks (see fleet_pools.h). */
#include "fleet_pools.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/alloc.h"

/* KEYS: per limit, its busy hash and its cool key. ARGV: this worker's
 * name, the lease in ms, then per limit this worker's calls on it (-1: not
 * a pool target, its hash is neither written nor read). Returns per limit
 * the other workers' calls on it and the ms of cooling left. An entry is
 * "calls:expiry" so that one HGETALL both sums and sweeps. */
static struct backend_script view_script = BACKEND_SCRIPT(
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local me, lease = ARGV[1], tonumber(ARGV[2])\n"
    "local out = {}\n"
    "for i = 1, #KEYS / 2 do\n"
    "  local busy, cool = KEYS[2 * i - 1], KEYS[2 * i]\n"
    "  local mine = tonumber(ARGV[2 + i])\n"
    "  local others = 0\n"
    "  if mine >= 0 then\n"
    "    if mine > 0 then\n"
    "      redis.call('HSET', busy, me, mine .. ':' .. (now + lease))\n"
    "    else redis.call('HDEL', busy, me) end\n"
    "    local all = redis.call('HGETALL', busy)\n"
    "    for j = 1, #all, 2 do\n"
    "      if all[j] ~= me then\n"
    "        local n, exp = string.match(all[j + 1], '^(%d+):(%d+)$')\n"
    "        if not exp or tonumber(exp) <= now then redis.call('HDEL', busy, all[j])\n"
    "        else others = others + tonumber(n) end\n"
    "      end\n"
    "    end\n"
    "    if #all > 0 then redis.call('PEXPIRE', busy, lease * 2) end\n"
    "  end\n"
    "  local c = tonumber(redis.call('GET', cool) or '0') or 0\n"
    "  out[#out + 1] = others\n"
    "  out[#out + 1] = math.max(0, math.ceil(c - now))\n"
    "end\n"
    "return out\n");

struct fleet_pools {
    uv_loop_t *loop;
    struct backend *bk;
    struct llm_router *rt;
    struct llm_client *client;
    char me[160];
    uint64_t last_view_ms;
    /* the view out: the limits it asked for, from first, n of them (limits
     * are only ever prepended to the router's list, so these stay in order) */
    int out;
    uint64_t out_sent_ms;
    int alone; /* the fleet's counts are left out (no answer) */
};

/* The view out has gone unanswered too long, or Redis is away: the other
 * workers' counts are unknown, so they count for nothing. */
static void forget_fleet(struct fleet_pools *p)
{
    for (struct llm_limit *l = llm_router_limits(p->rt); l; l = l->next)
        l->fleet_busy = 0;
    p->alone = 1;
}

struct view {
    struct fleet_pools *p;
    struct llm_limit *first;
    int n;
};

static void on_view(struct backend *bk, int status, const redisReply *reply, void *data)
{
    struct view *v = data;
    struct fleet_pools *p = v->p;
    struct llm_limit *l = v->first;
    uint64_t now;
    int raised = 0;
    (void)bk;

    if (status == CR_ECANCELED) { /* backend_free(): the worker is going */
        cr_free(v);
        return;
    }
    p->out = 0;
    if (status || !reply || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements != (size_t)v->n * 2) {
        forget_fleet(p);
        cr_free(v);
        return;
    }
    now = llm_client_now(p->client);
    p->alone = 0;
    for (int i = 0; i < v->n && l; i++, l = l->next) {
        const redisReply *busy = reply->element[2 * i], *cool = reply->element[2 * i + 1];
        if (busy->type == REDIS_REPLY_INTEGER)
            l->fleet_busy = busy->integer > 0 ? busy->integer : 0;
        if (cool->type == REDIS_REPLY_INTEGER && cool->integer > 0 &&
            now + (uint64_t)cool->integer > l->cool_until) {
            l->cool_until = now + (uint64_t)cool->integer;
            raised = 1;
        }
    }
    if (raised)
        llm_client_limits_changed(p->client);
    cr_free(v);
}

void fleet_pools_tick(struct fleet_pools *p)
{
    uint64_t now = p ? uv_now(p->loop) : 0;
    struct llm_limit *first = p ? llm_router_limits(p->rt) : NULL, *l;
    char(*keys)[256], counts[FLEET_POOLS_MAX_KEYS][24];
    const char *argv[1 + FLEET_POOLS_MAX_KEYS * 3 + 2];
    char nkeys[16], lease[24];
    struct view *v;
    int n = 0, argc = 0;

    if (!p || !first)
        return;
    if (p->out && now - p->out_sent_ms >= FLEET_POOLS_VIEW_MS * 5 && !p->alone)
        forget_fleet(p);
    if (p->out || now - p->last_view_ms < FLEET_POOLS_VIEW_MS)
        return;
    p->last_view_ms = now;
    if (!p->bk || !backend_connected(p->bk)) {
        if (!p->alone)
            forget_fleet(p);
        return;
    }
    if (!(keys = cr_malloc(FLEET_POOLS_MAX_KEYS * 2 * sizeof(*keys))))
        return;
    for (l = first; l && n < FLEET_POOLS_MAX_KEYS; l = l->next, n++) {
        const char *pre = backend_key_prefix(p->bk);
        snprintf(keys[2 * n], sizeof(keys[0]), "%sceleriac:pool:%s:busy", pre, l->key);
        snprintf(keys[2 * n + 1], sizeof(keys[0]), "%sceleriac:limit:%s:cool", pre,
                 l->key);
        snprintf(counts[n], sizeof(counts[0]), "%ld", l->pooled ? l->calls : -1L);
    }
    snprintf(nkeys, sizeof(nkeys), "%d", n * 2);
    snprintf(lease, sizeof(lease), "%d", FLEET_POOLS_LEASE_MS);
    argv[argc++] = nkeys;
    for (int i = 0; i < n * 2; i++)
        argv[argc++] = keys[i];
    argv[argc++] = p->me;
    argv[argc++] = lease;
    for (int i = 0; i < n; i++)
        argv[argc++] = counts[i];
    v = cr_calloc(1, sizeof(*v));
    if (v)
        *v = (struct view){p, first, n};
    /* argv is copied: keys can go at once */
    if (!v || backend_eval(p->bk, &view_script, argc, argv, NULL, on_view, v)) {
        cr_free(v);
        cr_free(keys);
        return;
    }
    cr_free(keys);
    p->out = 1;
    p->out_sent_ms = now;
}

struct fleet_pools *fleet_pools_new(uv_loop_t *loop, struct backend *bk,
                                    struct llm_router *rt, struct llm_client *client,
                                    const char *hostname, struct cr_err *err)
{
    struct fleet_pools *p = cr_calloc(1, sizeof(*p));
    if (!p) {
        cr_err_set(err, CR_ENOMEM, "out of memory");
        return NULL;
    }
    p->loop = loop;
    p->bk = bk;
    p->rt = rt;
    p->client = client;
    /* The pid too: two workers of one host may share a name. */
    snprintf(p->me, sizeof(p->me), "%.120s:%ld", hostname ? hostname : "",
             (long)getpid());
    return p;
}

void fleet_pools_free(struct fleet_pools *p)
{
    cr_free(p);
}
