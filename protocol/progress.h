/* progress.h -- the progress stream's wire format, shared by its writer
 * (worker/progress.c) and its readers (the gateway, any Redis client). Pure:
 * names and encodings only, no I/O.
 *
 *   stream key   "celeriac:progress:<task_id>" (PROGRESS_KEY_PREFIX; an RQ
 *                job's id alike, in RQ's database), expiring with the result
 *                (result_expires; an RQ job's result_ttl) and trimmed to about
 *                PROGRESS_STREAM_MAXLEN entries.
 *   entry id     "0-<seq>": seq counts 1, 2, 3... over the whole life of the
 *                task id, across attempts and workers, so XRANGE "(0-<seq>" "+"
 *                resumes exactly after a given entry (progress_range_after()).
 *   fields       seq, attempt, state, text, tokens, run, n [, error] [, result]
 *     state    STARTED (opens an attempt, text ""; written together with the
 *              attempt's first text, or with its end if it had none),
 *              PROGRESS (new text), or the end of an attempt: SUCCESS,
 *              FAILURE, RETRY, REVOKED.
 *     attempt  1 for the first run; every new run of the task id (a retry,
 *              or a redelivery after a crash) gets a higher number, so text of
 *              one attempt is never mixed with the next.
 *     text     text produced since the previous entry of the same attempt.
 *     tokens   deltas (or, at the end, completion tokens) so far this attempt.
 *     run, n   writer identity and its entry counter: they make a command sent
 *              again after a Redis reconnect a no-op instead of a duplicate.
 *     error    "ExcType: message" on FAILURE, RETRY and REVOKED entries.
 *     result   the JSON result on SUCCESS when the task ignores results (no
 *              meta will be stored, so the stream is the only place for it),
 *              and on every end of an RQ job (worker/rq_worker.c: its results
 *              are RQ's, not Celery metas), a failure's as Celery stores one
 *              ({"exc_type", "exc_message"[, "exc_module"]}).
 *   channel      after each write (one or more entries), PUBLISH
 *                "celeriac:progress:<task_id>" <seq of the last one>.
 *   meta         {"status": "PROGRESS", "result": {"text": <all text so far>,
 *                "tokens": N}, ...} stored like Celery's update_state(), at most
 *                every PROGRESS_META_MIN_MS (worker/progress.h), never over
 *                SUCCESS/FAILURE/REVOKED.
 * The gateway's reader of the fields is gw_entry_parse() (gateway/gw_msg.h). */
#ifndef CR_PROTOCOL_PROGRESS_H
#define CR_PROTOCOL_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"

#define PROGRESS_KEY_PREFIX "celeriac:progress:"
#define PROGRESS_STREAM_MAXLEN 10000

/* The write of one or more entries as one Redis script, so that it is atomic
 * and costs one round trip; its callers are worker/progress.c (Celery tasks,
 * through the result backend) and worker/rq_worker.c (RQ jobs). It numbers
 * the entries after the stream's last one (so seq continues across workers
 * and attempts), decides the attempt (a new run of the id is a new attempt),
 * drops a command resent after a reconnect (same run, entry counter not
 * newer), appends, trims, sets the TTL and notifies once; then it stores the
 * meta unless a final state is already there.
 * KEYS: stream, meta (never touched when the meta argument is "").
 * ARGV: run, n of the last entry, attempt hint, maxlen, ttl (0: none), meta
 * JSON or "", entry count, then per entry: state, text, tokens, number of
 * extra field/value pairs, the pairs. Reply: the last seq, or -1 for a
 * resent command. */
#define PROGRESS_WRITE_LUA                                                               \
    "local at=tonumber(ARGV[3]) local seq=0 local k=tonumber(ARGV[7])\n"                 \
    "if k>0 then\n"                                                                      \
    " local last=redis.call('XREVRANGE',KEYS[1],'+','-','COUNT',1)[1]\n"                 \
    " if last then\n"                                                                    \
    "  seq=tonumber(string.match(last[1],'%-(%d+)$'))\n"                                 \
    "  local f,run,n,la=last[2],nil,0,0\n"                                               \
    "  for i=1,#f,2 do\n"                                                                \
    "   if f[i]=='run' then run=f[i+1] elseif f[i]=='n' then n=tonumber(f[i+1])\n"       \
    "   elseif f[i]=='attempt' then la=tonumber(f[i+1]) end\n"                           \
    "  end\n"                                                                            \
    "  if run==ARGV[1] then\n"                                                           \
    "   if n>=tonumber(ARGV[2]) then return -1 end\n"                                    \
    "   at=la\n"                                                                         \
    "  elseif la>=at then at=la+1 end\n"                                                 \
    " end\n"                                                                             \
    " local i,n0=8,tonumber(ARGV[2])-k\n"                                                \
    " for e=1,k do\n"                                                                    \
    "  seq=seq+1\n"                                                                      \
    "  local a={'XADD',KEYS[1],'MAXLEN','~',ARGV[4],'0-'..seq,'seq',seq,'attempt',at,\n" \
    "   'state',ARGV[i],'text',ARGV[i+1],'tokens',ARGV[i+2],'run',ARGV[1],'n',n0+e}\n"   \
    "  local x=tonumber(ARGV[i+3])\n"                                                    \
    "  for q=1,2*x do a[#a+1]=ARGV[i+3+q] end\n"                                         \
    "  redis.call(unpack(a))\n"                                                          \
    "  i=i+4+2*x\n"                                                                      \
    " end\n"                                                                             \
    " if tonumber(ARGV[5])>0 then redis.call('EXPIRE',KEYS[1],ARGV[5]) end\n"            \
    " redis.call('PUBLISH',KEYS[1],seq)\n"                                               \
    "end\n"                                                                              \
    "if ARGV[6]~='' then\n"                                                              \
    " local cur=redis.call('GET',KEYS[2])\n"                                             \
    " if cur and (string.find(cur,'^{\"status\": *\"SUCCESS\"') or\n"                    \
    "  string.find(cur,'^{\"status\": *\"FAILURE\"') or\n"                               \
    "  string.find(cur,'^{\"status\": *\"REVOKED\"')) then return seq end\n"             \
    " if tonumber(ARGV[5])>0 then redis.call('SETEX',KEYS[2],ARGV[5],ARGV[6])\n"         \
    " else redis.call('SET',KEYS[2],ARGV[6]) end\n"                                      \
    " redis.call('PUBLISH',KEYS[2],ARGV[6])\n"                                           \
    "end\n"                                                                              \
    "return seq\n"

/* Appends the stream key (also the channel name) of task_id to out. Returns
 * 0, or CR_ENOMEM (out unchanged in length). */
int progress_key(struct buf *out, const char *task_id);

/* Writes the exclusive XRANGE start that resumes after entry seq, "(0-<seq>",
 * into out (size bytes). Returns 0, or CR_ERANGE when it does not fit. */
int progress_range_after(char *out, size_t size, int64_t seq);

#endif
