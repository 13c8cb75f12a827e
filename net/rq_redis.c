/* rq_redis.c -- an RQ worker's Redis commands, each step one EVAL (see
 * rq_redis.h). The scripts write what RQ 1.13's worker writes at the same
 * step (rq-protocol.md sections 7 and 8), field for field. */
#include "rq_redis.h"

#include <stdio.h>
#include <string.h>

#include "protocol/progress.h"
#include "protocol/rq_job.h"

/* KEYS: worker hash, rq:workers, rq:workers:<q>...
 * ARGV: ts, queues, pid, hostname, version, ttl */
static const char birth_lua[] =
    "if redis.call('EXISTS', KEYS[1]) == 1 and "
    "redis.call('HEXISTS', KEYS[1], 'death') == 0 then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('HSET', KEYS[1], 'birth', ARGV[1], 'last_heartbeat', ARGV[1], "
    "'queues', ARGV[2], 'pid', ARGV[3], 'hostname', ARGV[4], 'ip_address', 'unknown', "
    "'version', ARGV[5], 'python_version', 'celeriac (native)', 'state', 'idle')\n"
    "for i = 2, #KEYS do redis.call('SADD', KEYS[i], KEYS[1]) end\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[6])\n"
    "return 1\n";

/* KEYS: as birth. ARGV: ts, queues, pid, hostname, version, ttl, state */
static const char idle_lua[] =
    "local r = 1\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then\n"
    "  redis.call('HSET', KEYS[1], 'birth', ARGV[1], 'queues', ARGV[2], 'pid', ARGV[3], "
    "'hostname', ARGV[4], 'ip_address', 'unknown', 'version', ARGV[5], "
    "'python_version', 'celeriac (native)')\n"
    "  for i = 2, #KEYS do redis.call('SADD', KEYS[i], KEYS[1]) end\n"
    "  r = 0\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'last_heartbeat', ARGV[1], 'state', ARGV[7])\n"
    "redis.call('EXPIRE', KEYS[1], ARGV[6])\n"
    "return r\n";

/* KEYS: as birth. ARGV: ts */
static const char death_lua[] =
    "for i = 2, #KEYS do redis.call('SREM', KEYS[i], KEYS[1]) end\n"
    "redis.call('HSET', KEYS[1], 'death', ARGV[1])\n"
    "redis.call('EXPIRE', KEYS[1], 60)\n"
    "return 1\n";

/* KEYS: job, started registry, worker, execution, executions, rq:suspended,
 * the queue.
 * ARGV: id, worker name, ts, score, ttl, execution id ("": layout 1), now
 *       (epoch float), "1" when a suspension puts the job back */
static const char start_lua[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return false end\n"
    "if ARGV[8] == '1' and redis.call('EXISTS', KEYS[6]) == 1 then\n"
    "  redis.call('LPUSH', KEYS[7], ARGV[1])\n"
    "  return -1\n"
    "end\n"
    "redis.call('HSET', KEYS[3], 'current_job', ARGV[1], 'current_job_working_time', "
    "'0', 'last_heartbeat', ARGV[3], 'state', 'busy')\n"
    "redis.call('EXPIRE', KEYS[3], ARGV[5])\n"
    "local member = ARGV[1]\n"
    "if ARGV[6] ~= '' then\n"
    "  member = ARGV[1] .. ':' .. ARGV[6]\n"
    "  redis.call('HSET', KEYS[4], 'id', ARGV[6], 'created_at', ARGV[7], "
    "'last_heartbeat', ARGV[7])\n"
    "  redis.call('EXPIRE', KEYS[4], ARGV[5])\n"
    "  redis.call('ZADD', KEYS[5], tonumber(ARGV[4]) + 60, ARGV[6])\n"
    "  redis.call('EXPIRE', KEYS[5], tonumber(ARGV[5]) + 60)\n"
    "end\n"
    "redis.call('ZADD', KEYS[2], ARGV[4], member)\n"
    "redis.call('HSET', KEYS[1], 'last_heartbeat', ARGV[3], 'status', 'started', "
    "'started_at', ARGV[3], 'worker_name', ARGV[2])\n"
    "redis.call('PERSIST', KEYS[1])\n"
    "return redis.call('HGETALL', KEYS[1])\n";

/* KEYS: job, started registry, worker, execution, executions.
 * ARGV: id, ts, score, ttl, working time, execution id ("": layout 1), now */
static const char busy_lua[] =
    "redis.call('HSET', KEYS[3], 'last_heartbeat', ARGV[2], 'current_job_working_time', "
    "ARGV[5])\n"
    "redis.call('EXPIRE', KEYS[3], ARGV[4])\n"
    "if redis.call('EXISTS', KEYS[1]) == 1 then\n"
    "  redis.call('HSET', KEYS[1], 'last_heartbeat', ARGV[2])\n"
    "end\n"
    "local member = ARGV[1]\n"
    "if ARGV[6] ~= '' then\n"
    "  member = ARGV[1] .. ':' .. ARGV[6]\n"
    "  redis.call('HSET', KEYS[4], 'last_heartbeat', ARGV[7])\n"
    "  redis.call('EXPIRE', KEYS[4], ARGV[4])\n"
    "  redis.call('ZADD', KEYS[5], tonumber(ARGV[3]) + 60, ARGV[6])\n"
    "  redis.call('EXPIRE', KEYS[5], tonumber(ARGV[4]) + 60)\n"
    "end\n"
    "redis.call('ZADD', KEYS[2], 'XX', ARGV[3], member)\n"
    "return 1\n";

/* KEYS: job, started registry, worker, results, dependents, dependencies,
 *       the registry the job goes to (finished, failed or scheduled), the
 *       origin queue, rq:queues, execution, executions.
 * ARGV: how, id, ts, working time, ttl, score, value (return_value or
 *       exc_string, "" for none), retries left, interval, 1 when the stream
 *       takes the failure TTL, execution id ("": layout 1), worker name,
 *       execution started and ended (epoch floats). */
static const char end_lua[] =
    /* Queue.enqueue_dependents: a dependent goes to its queue once every
     * job it waits for has finished (or failed, when it allows failures). */
    "local function release(parent, failed)\n"
    "  local deps = redis.call('SMEMBERS', KEYS[5])\n"
    "  if #deps == 0 then return end\n"
    "  local done, all = {}, true\n"
    "  for _, d in ipairs(deps) do\n"
    "    local jk = 'rq:job:' .. d\n"
    "    local h = redis.call('HMGET', jk, 'origin', 'enqueue_at_front', "
    "'allow_dependency_failures', 'status')\n"
    "    local ready = h[1] ~= false and h[4] ~= 'canceled'\n"
    "    if ready and failed and h[3] ~= '1' then ready = false end\n"
    "    if ready then\n"
    "      for _, o in ipairs(redis.call('SMEMBERS', 'rq:job::' .. d .. "
    "':dependencies')) do\n"
    "        if o ~= parent then\n"
    "          local st = redis.call('HGET', 'rq:job:' .. o, 'status')\n"
    "          if not (st == 'finished' or (st == 'failed' and h[3] == '1')) then\n"
    "            ready = false\n"
    "          end\n"
    "        end\n"
    "      end\n"
    "    end\n"
    "    if ready then\n"
    "      local q = 'rq:queue:' .. h[1]\n"
    "      redis.call('ZREM', 'rq:deferred:' .. h[1], d)\n"
    "      redis.call('SADD', 'rq:queues', q)\n"
    "      redis.call('HSET', jk, 'status', 'queued', 'enqueued_at', ARGV[3])\n"
    "      if h[2] == '1' then redis.call('LPUSH', q, d) else redis.call('RPUSH', q, d) "
    "end\n"
    "      done[#done + 1] = d\n"
    "    else\n"
    "      all = false\n"
    "    end\n"
    "  end\n"
    "  if all then redis.call('DEL', KEYS[5])\n"
    "  elseif #done > 0 then redis.call('SREM', KEYS[5], unpack(done)) end\n"
    "end\n"
    "local how = ARGV[1]\n"
    "local member, extra = ARGV[2], {}\n"
    "if ARGV[11] ~= '' then\n"
    "  member = ARGV[2] .. ':' .. ARGV[11]\n"
    "  redis.call('DEL', KEYS[10])\n"
    "  redis.call('ZREM', KEYS[11], ARGV[11])\n"
    "  extra = {'worker_name', ARGV[12], 'execution_id', ARGV[11], "
    "'execution_started_at', ARGV[13], 'execution_ended_at', ARGV[14]}\n"
    "end\n"
    "local function xadd(...)\n"
    "  local f = {...}\n"
    "  for _, v in ipairs(extra) do f[#f + 1] = v end\n"
    "  redis.call('XADD', KEYS[4], 'MAXLEN', '~', '10', '*', unpack(f))\n"
    "end\n"
    "redis.call('ZREM', KEYS[2], member)\n"
    "redis.call('HDEL', KEYS[3], 'current_job')\n"
    "redis.call('HSET', KEYS[3], 'current_job_working_time', '0', 'state', 'idle')\n"
    "redis.call('HINCRBYFLOAT', KEYS[3], 'total_working_time', ARGV[4])\n"
    "if how == 'finished' then\n"
    "  redis.call('HINCRBY', KEYS[3], 'successful_job_count', 1)\n"
    "else\n"
    "  redis.call('HINCRBY', KEYS[3], 'failed_job_count', 1)\n"
    "end\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
    "local ttl = tonumber(ARGV[5])\n"
    "if how == 'finished' then\n"
    "  release(ARGV[2], false)\n"
    "  if ttl == 0 then\n"
    "    redis.call('DEL', KEYS[1], KEYS[5], KEYS[6])\n"
    "    return 1\n"
    "  end\n"
    "  redis.call('HSET', KEYS[1], 'status', 'finished', 'ended_at', ARGV[3])\n"
    "  if ARGV[7] ~= '' then\n"
    "    xadd('type', '1', 'return_value', ARGV[7])\n"
    "  else\n"
    "    xadd('type', '1')\n"
    "  end\n"
    "  redis.call('ZADD', KEYS[7], ARGV[6], ARGV[2])\n"
    "  if ttl > 0 then\n"
    "    for i = 4, 6 do redis.call('EXPIRE', KEYS[i], ttl) end\n"
    "    redis.call('EXPIRE', KEYS[1], ttl)\n"
    "  else\n"
    "    redis.call('PERSIST', KEYS[1])\n"
    "    redis.call('PERSIST', KEYS[4])\n"
    "  end\n"
    "elseif how == 'failed' or how == 'stopped' then\n"
    "  redis.call('HSET', KEYS[1], 'status', how, 'ended_at', ARGV[3])\n"
    "  xadd('type', '2', 'exc_string', ARGV[7])\n"
    "  redis.call('ZADD', KEYS[7], ARGV[6], ARGV[2])\n"
    "  release(ARGV[2], true)\n"
    "  if ttl == -1 then\n"
    "    redis.call('PERSIST', KEYS[1])\n"
    "  else\n"
    "    redis.call('EXPIRE', KEYS[1], ttl)\n"
    "    redis.call('EXPIRE', KEYS[5], ttl)\n"
    "    redis.call('EXPIRE', KEYS[6], ttl)\n"
    "    if ARGV[10] == '1' then redis.call('EXPIRE', KEYS[4], ttl) end\n"
    "  end\n"
    "else\n"
    "  redis.call('HSET', KEYS[1], 'retries_left', ARGV[8])\n"
    "  if tonumber(ARGV[9]) > 0 then\n"
    "    redis.call('HSET', KEYS[1], 'status', 'scheduled')\n"
    "    redis.call('ZADD', KEYS[7], ARGV[6], ARGV[2])\n"
    "  else\n"
    "    redis.call('SADD', KEYS[9], KEYS[8])\n"
    "    redis.call('HSET', KEYS[1], 'status', 'queued', 'enqueued_at', ARGV[3])\n"
    "    redis.call('RPUSH', KEYS[8], ARGV[2])\n"
    "  end\n"
    "end\n"
    "return 1\n";

/* RQScheduler's loop for one queue (rq-protocol.md 10), under its lock
 * (the value is our pid, as 1.13's Queue.scheduler_pid reads it).
 * KEYS: scheduled registry, queue, rq:queues, lock. ARGV: now, ts, pid.
 * Reply: -1 when another scheduler holds the lock, else the jobs moved. */
static const char schedule_lua[] =
    "local v = redis.call('GET', KEYS[4])\n"
    "if v and v ~= ARGV[3] then return -1 end\n"
    "redis.call('SET', KEYS[4], ARGV[3], 'EX', 61)\n"
    "local ids = redis.call('ZRANGEBYSCORE', KEYS[1], 0, ARGV[1], 'LIMIT', 0, 1000)\n"
    "for _, id in ipairs(ids) do\n"
    "  local jk = 'rq:job:' .. id\n"
    "  if redis.call('EXISTS', jk) == 1 then\n"
    "    redis.call('SADD', KEYS[3], KEYS[2])\n"
    "    redis.call('HSET', jk, 'status', 'queued', 'enqueued_at', ARGV[2])\n"
    "    if redis.call('HGET', jk, 'enqueue_at_front') == '1' then\n"
    "      redis.call('LPUSH', KEYS[2], id)\n"
    "    else\n"
    "      redis.call('RPUSH', KEYS[2], id)\n"
    "    end\n"
    "  end\n"
    "  redis.call('ZREM', KEYS[1], id)\n"
    "end\n"
    "return #ids\n";

/* KEYS: lock. ARGV: pid */
static const char unlock_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end\n"
    "return 1\n";

/* KEYS: the queues in priority order. ARGV: the most ids to take.
 * Reply: [queue key, id, queue key, id...], the first queue drained first. */
/* KEYS: the queues, then rq:suspended. ARGV: how many at most */
static const char pop_many_lua[] =
    "if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return -1 end\n"
    "local n, out = tonumber(ARGV[1]), {}\n"
    "for i = 1, #KEYS - 1 do\n"
    "  local k = KEYS[i]\n"
    "  while #out < 2 * n do\n"
    "    local id = redis.call('LPOP', k)\n"
    "    if not id then break end\n"
    "    out[#out + 1] = k\n"
    "    out[#out + 1] = id\n"
    "  end\n"
    "  if #out >= 2 * n then break end\n"
    "end\n"
    "return out\n";

/* KEYS: job. ARGV: meta */
static const char meta_lua[] = "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n"
                               "redis.call('HSET', KEYS[1], 'meta', ARGV[1])\n"
                               "return 1\n";

static void key_arg(struct redis_args *a, enum rq_key_kind kind, const char *name)
{
    char k[RQ_KEY_SIZE];
    if (rq_key(k, kind, name))
        a->oom = 1; /* an impossible name: refused as a whole at argv time */
    redis_args_s(a, k);
}

static void num_arg(struct redis_args *a, long long v)
{
    char s[32];
    snprintf(s, sizeof(s), "%lld", v);
    redis_args_s(a, s);
}

static void eval_head(struct redis_args *a, const char *script, int nkeys)
{
    redis_args_s(a, "EVAL");
    redis_args_s(a, script);
    num_arg(a, nkeys);
}

void rq_redis_pop(struct redis_args *a, const char *const *queues, int nqueues,
                  int timeout_s)
{
    redis_args_s(a, "BLPOP");
    for (int i = 0; i < nqueues; i++)
        key_arg(a, RQ_KEY_QUEUE, queues[i]);
    num_arg(a, timeout_s);
}

void rq_redis_pop_many(struct redis_args *a, const char *const *queues, int nqueues,
                       int max)
{
    eval_head(a, pop_many_lua, nqueues + 1);
    for (int i = 0; i < nqueues; i++)
        key_arg(a, RQ_KEY_QUEUE, queues[i]);
    redis_args_s(a, RQ_SUSPENDED_KEY);
    num_arg(a, max);
}

static void worker_keys(struct redis_args *a, const char *script,
                        const struct rq_worker_info *w)
{
    eval_head(a, script, 2 + w->nqueues);
    key_arg(a, RQ_KEY_WORKER, w->name);
    redis_args_s(a, RQ_WORKERS_KEY);
    for (int i = 0; i < w->nqueues; i++)
        key_arg(a, RQ_KEY_WORKERS_OF, w->queue_names[i]);
}

static void worker_fields(struct redis_args *a, const struct rq_worker_info *w)
{
    redis_args_s(a, w->ts);
    redis_args_s(a, w->queues);
    num_arg(a, w->pid);
    redis_args_s(a, w->hostname);
    redis_args_s(a, w->version);
    num_arg(a, w->ttl_s);
}

void rq_redis_birth(struct redis_args *a, const struct rq_worker_info *w)
{
    worker_keys(a, birth_lua, w);
    worker_fields(a, w);
}

void rq_redis_idle_beat(struct redis_args *a, const struct rq_worker_info *w,
                        const char *state)
{
    worker_keys(a, idle_lua, w);
    worker_fields(a, w);
    redis_args_s(a, state);
}

void rq_redis_death(struct redis_args *a, const struct rq_worker_info *w)
{
    worker_keys(a, death_lua, w);
    redis_args_s(a, w->ts);
}

static void epoch_arg(struct redis_args *a, double t)
{
    char s[64];
    snprintf(s, sizeof(s), "%.6f", t);
    redis_args_s(a, s);
}

/* The execution hash and registry keys (layout 2), or unused names. */
static void exec_keys(struct redis_args *a, const char *id, const struct rq_exec *x)
{
    char composite[RQ_MAX_ID + 40];
    snprintf(composite, sizeof(composite), "%s:%s", id, x ? x->eid : "");
    key_arg(a, RQ_KEY_EXECUTION, composite);
    key_arg(a, RQ_KEY_EXECUTIONS, id);
}

void rq_redis_start(struct redis_args *a, const char *worker, const char *id,
                    const char *queue, const char *ts, int64_t wip_score,
                    long worker_ttl_s, const struct rq_exec *x, int bounce)
{
    eval_head(a, start_lua, 7);
    key_arg(a, RQ_KEY_JOB, id);
    key_arg(a, RQ_KEY_STARTED, queue);
    key_arg(a, RQ_KEY_WORKER, worker);
    exec_keys(a, id, x);
    redis_args_s(a, RQ_SUSPENDED_KEY);
    key_arg(a, RQ_KEY_QUEUE, queue);
    redis_args_s(a, id);
    redis_args_s(a, worker);
    redis_args_s(a, ts);
    num_arg(a, wip_score);
    num_arg(a, worker_ttl_s);
    redis_args_s(a, x ? x->eid : "");
    epoch_arg(a, x ? x->now_s : 0);
    redis_args_s(a, bounce ? "1" : "0");
}

void rq_redis_busy_beat(struct redis_args *a, const char *worker, const char *id,
                        const char *queue, const char *ts, int64_t wip_score,
                        long worker_ttl_s, double working_s, const struct rq_exec *x)
{
    eval_head(a, busy_lua, 5);
    key_arg(a, RQ_KEY_JOB, id);
    key_arg(a, RQ_KEY_STARTED, queue);
    key_arg(a, RQ_KEY_WORKER, worker);
    exec_keys(a, id, x);
    redis_args_s(a, id);
    redis_args_s(a, ts);
    num_arg(a, wip_score);
    num_arg(a, worker_ttl_s);
    epoch_arg(a, working_s);
    redis_args_s(a, x ? x->eid : "");
    epoch_arg(a, x ? x->now_s : 0);
}

void rq_redis_end(struct redis_args *a, const struct rq_end_info *e)
{
    static const char *const how[] = {"finished", "failed", "stopped", "retry"};
    enum rq_key_kind reg = e->how == RQ_END_FINISHED ? RQ_KEY_FINISHED
                           : e->how == RQ_END_RETRY  ? RQ_KEY_SCHEDULED
                                                     : RQ_KEY_FAILED;
    char score[32], w[64];
    long ttl = 0;
    const char *value = "";
    int stream_ttl = 0;

    switch (e->how) {
    case RQ_END_FINISHED:
        ttl = e->result_ttl_s;
        rq_expiry_score(score, e->now_s, ttl, 1);
        value = e->return_b64 ? e->return_b64 : "";
        break;
    case RQ_END_FAILED:
    case RQ_END_STOPPED:
        ttl = e->failure_ttl_s == -2 ? RQ_DEFAULT_FAILURE_TTL_S : e->failure_ttl_s;
        stream_ttl = e->failure_ttl_s != -2 && e->failure_ttl_s != -1;
        rq_expiry_score(score, e->now_s, ttl, 0);
        value = e->exc_b64 ? e->exc_b64 : "";
        break;
    case RQ_END_RETRY:
        /* A second up: the scheduler compares whole seconds, and the wait
         * must not come out shorter than asked. */
        snprintf(score, sizeof(score), "%lld", (long long)(e->now_s + e->interval_s + 1));
        break;
    }
    eval_head(a, end_lua, 11);
    key_arg(a, RQ_KEY_JOB, e->id);
    key_arg(a, RQ_KEY_STARTED, e->queue);
    key_arg(a, RQ_KEY_WORKER, e->worker);
    key_arg(a, RQ_KEY_RESULTS, e->id);
    key_arg(a, RQ_KEY_DEPENDENTS, e->id);
    key_arg(a, RQ_KEY_DEPENDENCIES, e->id);
    key_arg(a, reg, e->queue);
    key_arg(a, RQ_KEY_QUEUE, e->queue);
    redis_args_s(a, RQ_QUEUES_KEY);
    exec_keys(a, e->id, e->exec);
    redis_args_s(a, how[e->how]);
    redis_args_s(a, e->id);
    redis_args_s(a, e->ts);
    snprintf(w, sizeof(w), "%.6f", e->working_s);
    redis_args_s(a, w);
    num_arg(a, ttl);
    redis_args_s(a, score);
    redis_args_s(a, value);
    num_arg(a, e->retries_left);
    num_arg(a, e->interval_s);
    redis_args_s(a, stream_ttl ? "1" : "0");
    redis_args_s(a, e->exec ? e->exec->eid : "");
    redis_args_s(a, e->worker);
    epoch_arg(a, e->exec ? e->exec->started_s : 0);
    epoch_arg(a, e->exec ? e->exec->now_s : 0);
}

void rq_redis_schedule(struct redis_args *a, const char *queue, int64_t now_s,
                       const char *ts, long pid)
{
    eval_head(a, schedule_lua, 4);
    key_arg(a, RQ_KEY_SCHEDULED, queue);
    key_arg(a, RQ_KEY_QUEUE, queue);
    redis_args_s(a, RQ_QUEUES_KEY);
    key_arg(a, RQ_KEY_SCHED_LOCK, queue);
    num_arg(a, now_s);
    redis_args_s(a, ts);
    num_arg(a, pid);
}

void rq_redis_unlock_scheduler(struct redis_args *a, const char *queue, long pid)
{
    eval_head(a, unlock_lua, 1);
    key_arg(a, RQ_KEY_SCHED_LOCK, queue);
    num_arg(a, pid);
}

void rq_redis_meta(struct redis_args *a, const char *id, const char *meta, size_t n)
{
    eval_head(a, meta_lua, 1);
    key_arg(a, RQ_KEY_JOB, id);
    redis_args_add(a, meta, n);
}

void rq_redis_progress(struct redis_args *a, const char *id, const char *run, long n,
                       long ttl_s, const struct rq_progress_entry *e, int k)
{
    char key[sizeof(PROGRESS_KEY_PREFIX) + RQ_MAX_ID];
    snprintf(key, sizeof(key), "%s%s", PROGRESS_KEY_PREFIX, id);
    if (k > RQ_PROGRESS_ENTRIES_MAX)
        k = RQ_PROGRESS_ENTRIES_MAX;
    eval_head(a, PROGRESS_WRITE_LUA, 2);
    redis_args_s(a, key);
    redis_args_s(a, key); /* the meta key: untouched, the meta being "" */
    redis_args_s(a, run);
    num_arg(a, n);
    redis_args_s(a, "1"); /* the attempt: the script counts runs */
    num_arg(a, PROGRESS_STREAM_MAXLEN);
    num_arg(a, ttl_s);
    redis_args_s(a, "");
    num_arg(a, k);
    for (int i = 0; i < k; i++) {
        int x = (e[i].error != NULL) + (e[i].result != NULL);
        redis_args_s(a, e[i].state);
        redis_args_add(a, e[i].text ? e[i].text : "", e[i].text ? e[i].text_len : 0);
        num_arg(a, e[i].tokens);
        num_arg(a, x);
        if (e[i].error) {
            redis_args_s(a, "error");
            redis_args_s(a, e[i].error);
        }
        if (e[i].result) {
            redis_args_s(a, "result");
            redis_args_s(a, e[i].result);
        }
    }
}

void rq_redis_suspended(struct redis_args *a)
{
    redis_args_s(a, "EXISTS");
    redis_args_s(a, RQ_SUSPENDED_KEY);
}
