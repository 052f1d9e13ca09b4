"""The scripts that move a run: its release, its submission, its turn, its take by a worker, its
cancel while queued, its thread's delete and claim, the wake of the run waiting behind it."""

from __future__ import annotations

from shared.contracts.jobs import delete_claim
from shared.redis.keys import (
    QUEUED_BEHIND,
    QUEUED_READY,
    arq_in_progress_key,
    arq_job_key,
    thread_runs_channel,
)
from shared.redis.scripts.ending import END_LUA, LIVE_HEAD_LUA, QUEUED_INDEX_LUA

_JOB, _TAKEN, _DELETE = arq_job_key(""), arq_in_progress_key(""), delete_claim("")
_THREAD_RUNS = thread_runs_channel("")

# Delete ACTIVE_RUNS[conversation] only if it still names this run.
# KEYS: active hash. ARGV: conversation, run (or delete claim).
RELEASE_ACTIVE_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

# Accept a run (shared/redis/queue.py).
# KEYS: active hash, arq job key, arq queue, run hash, wake list, idempotency key, waiting list,
#       the owner's active runs (``user_runs_key``)
# ARGV: conversation, run, job bytes, job ttl ms, score, idempotency ttl s ('0': no key),
#       this request's answer (for the idempotency key), enqueue ('1': wait behind a busy
#       conversation's run instead of refusing), the owner's limit of active runs ('0': none),
#       then run-hash field/value pairs
# false: accepted with the claim; {'behind', holder}: accepted into the waiting list (enqueue);
# {'held', holder}: refused; {'first', answer}: answered before; {'quota', count}: refused, the
# owner has ``limit`` runs queued or running already. An accepted run's id is published on its
# conversation's ``thread_runs_channel`` (a thread's stream waits on it). A conversation is held
# by its claim, or else by a run still waiting for its turn (so nothing overtakes the waiting
# runs), and a delete's claim is never waited behind. An owner's runs leave their set when they end
# (END_LUA); one whose job is gone otherwise (arq dropped it) is pruned here before counting.
SUBMIT_LUA = LIVE_HEAD_LUA + (
    f"local delete_prefix, job, taken, runs_channel = '{_DELETE}', '{_JOB}', '{_TAKEN}', '{_THREAD_RUNS}'\n"
) + """
if ARGV[6] ~= '0' then
  local first = redis.call('GET', KEYS[6])
  if first then
    return {'first', first}
  end
end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if not holder then
  holder = live_head(KEYS[7])
end
if holder and (ARGV[8] ~= '1' or string.sub(holder, 1, #delete_prefix) == delete_prefix) then
  return {'held', holder}
end
if ARGV[9] ~= '0' and redis.call('SISMEMBER', KEYS[8], ARGV[2]) == 0 then
  for _, other in ipairs(redis.call('SMEMBERS', KEYS[8])) do
    if redis.call('EXISTS', job .. other) == 0 and redis.call('EXISTS', taken .. other) == 0 then
      redis.call('SREM', KEYS[8], other)
    end
  end
  local count = redis.call('SCARD', KEYS[8])
  if count >= tonumber(ARGV[9]) then
    return {'quota', tostring(count)}
  end
end
if holder then
  redis.call('RPUSH', KEYS[7], ARGV[2])
  redis.call('PEXPIRE', KEYS[7], ARGV[4])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('HSET', KEYS[4], unpack(ARGV, 10))
redis.call('PEXPIRE', KEYS[4], ARGV[4])
index_queued(ARGV[2], holder and true or false)
redis.call('SADD', KEYS[8], ARGV[2])
redis.call('PEXPIRE', KEYS[8], ARGV[4])
if ARGV[6] ~= '0' then
  redis.call('SET', KEYS[6], ARGV[7], 'EX', ARGV[6])
end
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 15)
redis.call('PUBLISH', runs_channel .. ARGV[1], ARGV[2])
if holder then
  return {'behind', holder}
end
return false
"""

# A waiting run's turn, when the worker takes its job (worker/run/turns.py).
# KEYS: active hash, waiting list, taken key (``taken_key``). ARGV: conversation, run, taker (the
# worker's id; '': one worker, nothing to record), taken ttl (s).
# {'held'}: the run holds the conversation already (a second delivery); {'none'}: it is not
# waiting (a run accepted with the claim); {'behind', holder}: another run holds the
# conversation, or an earlier waiting run comes first; {'claimed'}: its turn, taken now (the
# claim set, the run out of the waiting list). A claim it holds names its taker in the same
# step: a worker that dies the instant after leaves a claim the sweep can free (the taker's
# heartbeat is gone), not one that only arq's day-long in-progress marker would end.
CLAIM_TURN_LUA = LIVE_HEAD_LUA + """
local function taken()
  if ARGV[3] ~= '' then
    redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4])
  end
end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder == ARGV[2] then
  taken()
  index_unqueued(ARGV[2])
  return {'held'}
end
local waiting = false
for _, run in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if run == ARGV[2] then
    waiting = true
    break
  end
end
if not waiting then
  index_unqueued(ARGV[2])
  return {'none'}
end
local head = live_head(KEYS[2])
if holder or head ~= ARGV[2] then
  index_queued(ARGV[2], true)  -- still waiting: deferred, not taken
  return {'behind', holder or head}
end
taken()
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('LPOP', KEYS[2])
index_unqueued(ARGV[2])
return {'claimed'}
"""

# Describe a run that ended without a row (shared/redis/queue.py).
# KEYS: run hash. ARGV: ttl (s), then field/value pairs.
# HSET alone would recreate an expired hash without a TTL: both go in one script.
RECORD_ENDED_LUA = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
"""

# Release the claim of a run that will never start (shared/redis/queue.py, for the sweep).
# KEYS: active hash, queue, arq job, arq in-progress, run hash, events stream, metrics, then
#       hook_run's four (as END_RUN_LUA's)
# ARGV: conversation, run, now (s), record ttl (s), event ttl (s), metrics field, error code, message,
#       then hook_run's four
# 1 if the claim was released (and the run recorded failed, its terminal event published); 2 if
# released only, the run being recorded already (refused by the database: only its release was
# lost); else 0.
DROP_UNSTARTED_LUA = END_LUA + """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[2])
if score and redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
local ended = redis.call('HGET', KEYS[5], 'status')
if ended == 'failed' or ended == 'cancelled' then
  return 2
end
if score and redis.call('HEXISTS', KEYS[5], 'enqueued_at') == 0 then
  redis.call('HSET', KEYS[5], 'enqueued_at', string.format('%.3f', tonumber(score) / 1000))
end
redis.call('HSET', KEYS[5], 'conversation', ARGV[1], 'status', 'failed', 'failed_at', ARGV[3],
           'error_code', ARGV[7], 'error_message', ARGV[8])
redis.call('EXPIRE', KEYS[5], ARGV[4])
end_run(nil, KEYS[6], KEYS[7], ARGV[1], ARGV[2], 'failed', ARGV[7], ARGV[8], nil, 1, ARGV[5], ARGV[6])
hook_run(KEYS[8], KEYS[9], KEYS[10], KEYS[11], ARGV[9], ARGV[10], ARGV[11], ARGV[12])
return 1
"""

# The runs that arq will never run (shared/redis/queue.py, for the sweep).
# KEYS: queue, then each run's arq job and arq in-progress keys. ARGV: the run ids.
# The positions (1-based) of the runs that are neither queued with their job nor taken.
GONE_LUA = """
local gone = {}
for i, run in ipairs(ARGV) do
  local taken = redis.call('EXISTS', KEYS[2 * i + 1]) == 1
  local queued = redis.call('ZSCORE', KEYS[1], run) and redis.call('EXISTS', KEYS[2 * i]) == 1
  if not taken and not queued then
    gone[#gone + 1] = i
  end
end
return gone
"""

# Cancel a queued run (api/runs/cancel.py): 'cancelled', 'already', 'absent' (not queued), 'taken' (by
# the worker), or 'deferring' (a run waiting for its turn, taken for an instant to be deferred).
# KEYS: queue, arq job, arq in-progress, run hash, active hash, events stream, cancelled index, metrics,
#       the conversation's cancelled run, the conversation's waiting list, then hook_run's four
#       (as END_RUN_LUA's)
# ARGV: run id, now (seconds), record retention (s), event retention (s), metrics field, conversation
#       (the one KEYS[9] was named for: read before the script, as a script must be told its keys),
#       then hook_run's four, then who cancelled (the caller's name, '' if unknown)
CANCEL_QUEUED_LUA = END_LUA + """
if redis.call('HGET', KEYS[4], 'status') == 'cancelled' then
  return 'already'
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 'absent'
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  -- Taken while still in its conversation's waiting list: only to be looked at and deferred
  -- (worker/run/turns.py), in a moment queued again. Its turn has not come.
  for _, run in ipairs(redis.call('LRANGE', KEYS[10], 0, -1)) do
    if run == ARGV[1] then
      return 'deferring'
    end
  end
  return 'taken'
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
local conversation = redis.call('HGET', KEYS[4], 'conversation')
redis.call('HSET', KEYS[4], 'status', 'cancelled', 'cancelled_at', ARGV[2])
if ARGV[11] and ARGV[11] ~= '' then
  redis.call('HSET', KEYS[4], 'cancelled_by', ARGV[11])
end
redis.call('EXPIRE', KEYS[4], ARGV[3])
redis.call('ZADD', KEYS[7], score, ARGV[1])
if conversation == ARGV[6] then
  redis.call('SET', KEYS[9], ARGV[1], 'EX', ARGV[3])
  redis.call('LREM', KEYS[10], 0, ARGV[1])  -- a run waiting for its turn: it never takes it
end
-- (end_run frees the conversation only if it is still this run's: compare-and-delete)
end_run(KEYS[5], KEYS[6], KEYS[8], conversation or '', ARGV[1], 'cancelled', nil, nil, nil, 1,
        ARGV[4], ARGV[5])
hook_run(KEYS[11], KEYS[12], KEYS[13], KEYS[14], ARGV[7], ARGV[8], ARGV[9], ARGV[10])
return 'cancelled'
"""

# Claim a conversation for its deletion and enqueue the delete job (api/conversations/deletion.py).
# KEYS: active hash, arq job key, arq queue, wake list, waiting list
# ARGV: conversation, claim (= arq job id), job bytes, job ttl ms, score
# The holder of the conversation if there is one (a run, an earlier delete, or a run still
# waiting for its turn); else claims it, enqueues the job and returns false.
DELETE_LUA = LIVE_HEAD_LUA + """
local holder = redis.call('HGET', KEYS[1], ARGV[1]) or live_head(KEYS[5])
if holder then
  return holder
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
redis.call('LPUSH', KEYS[4], '1')
redis.call('LTRIM', KEYS[4], 0, 15)
return false
"""

# Take a queued job for the worker (worker/queue/wakeup.py).
# KEYS: the job's in-progress key, the queue, the owners' last takes (``OWNERS_TAKEN``), the
#       job's run description (``run_key``: a run's names its owner).
# ARGV: job id, now (ms), in-progress ttl (ms).
# The job's score if it was queued, due and not taken (and is now marked taken, its owner's
# last take now); else nil.
TAKE_LUA = f"""
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then
  return false
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
redis.call('ZREM', '{QUEUED_READY}', ARGV[1])  -- taken: no longer queued (one waiting behind stays)
local owner = redis.call('HGET', KEYS[4], 'owner')
if owner then
  redis.call('HSET', KEYS[3], owner, ARGV[2])
end
return score
"""


# The first run waiting on a conversation (``enqueue``: worker/run/turns.py) due now, and an idle
# worker woken: a rider of a run's ending (worker/run/outcome/ending.py ``wake_next_turn``).
# KEYS: the waiting list, arq's queue, the wake list. ARGV: now in ms. 1 if a run was woken.
WAKE_NEXT_TURN_LUA = QUEUED_INDEX_LUA + f"""
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return 0 end
if redis.call('ZSCORE', '{QUEUED_BEHIND}', head) then
  index_queued(head, false)  -- its thread is free: it waits for a worker now
end
local woken = redis.call('ZADD', KEYS[2], 'XX', 'CH', ARGV[1], head)
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, 15)
return woken
"""

# A protocol thread's record, written whole unless it exists (api/protocol/threads/records.py): of two
# creators one writes it, and the other never sees it half written. The thread is empty: it goes into
# its owner's empty threads, refused when they hold as many as the cap, and is due for the worker's
# look at its expiry (worker/upkeep/expiry.py).
# KEYS: the record, the index of records, the expiry index, the owner's empty threads. ARGV:
# created_at, metadata, owner, the index's score (now, ms), the thread's id, when it is due (ms),
# the cap (0: none), its ttl in minutes ('' for none). 1 if written, 0 if it exists, -1 at the cap.
CLAIM_THREAD_LUA = """
if redis.call('HEXISTS', KEYS[1], 'created_at') == 1 then return 0 end
local cap = tonumber(ARGV[7])
if cap > 0 and redis.call('ZCARD', KEYS[4]) >= cap then return -1 end
redis.call('HSET', KEYS[1], 'created_at', ARGV[1], 'metadata', ARGV[2], 'owner', ARGV[3])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'ttl', ARGV[8]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[5])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[5])
return 1
"""
