"""The Redis protocol's scripts, in one place.

The keys are in :mod:`shared.redis.keys`; the events' shapes are in
:mod:`shared.contracts.events`; this module owns what is *done* with them atomically, the
Lua scripts. A run's ending in Redis is one Lua function, :data:`END_LUA` (with
``hook_run``, which enqueues its webhook), used by the three scripts that end a run:
the worker's (:data:`END_RUN_LUA`, whatever ended the run), the queued cancel and the
sweep's drop of a run that never started.

Scripts are registered once per Redis client (:func:`scripts`) with redis-py's
``register_script``: each call is an ``EVALSHA`` of the script's SHA-1, not the
whole text again, and on ``NOSCRIPT`` (Redis restarted, or ``SCRIPT FLUSH``)
redis-py loads the script and retries by itself. Queued in a pipeline, redis-py
checks the pipeline's scripts with one ``SCRIPT EXISTS`` and loads those missing
before sending it. Every script below is atomic: that is why each is a script.
"""

from __future__ import annotations

from hashlib import sha1
from weakref import WeakKeyDictionary

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from shared.contracts.events import ENDS_NORMALLY, EventType
from shared.contracts.jobs import delete_claim
from shared.redis.keys import arq_in_progress_key, arq_job_key, run_key, user_runs_key

# --- a run's ending -------------------------------------------------------------

_RUN, _USER_RUNS = run_key(""), user_runs_key("")
_NORMAL = " or ".join(f"status == '{s.value}'" for s in ENDS_NORMALLY)

#: Lua: a run's ending in Redis, prepended to every script that ends a run (the worker's
#: :data:`END_RUN_LUA`, the queued cancel, the sweep's drop of a run that never started).
#: ``end_run`` compares-and-deletes the conversation's claim, appends the ``approval``
#: event (when ``requests`` is a JSON list) and the terminal event of
#: :func:`shared.contracts.events.terminal_event` to the run's stream, with ids after both the
#: stream's last entry and ``first_id``, sets the stream's expiry and counts the outcome.
#: It returns the terminal event's id. A stream that already ends with this very terminal
#: event is left as it is (the ending is safe to retry). The run leaves its owner's active runs
#: (``user_runs_key``, named from the owner its description holds: one Redis, not a cluster).
END_LUA = f"""
local function end_run(active, stream, metrics, conversation, run, status, code, message,
                       requests, first_id, ttl, counter)
  if active and redis.call('HGET', active, conversation) == run then
    redis.call('HDEL', active, conversation)
  end
  local owner = redis.call('HGET', '{_RUN}' .. run, 'owner')
  if owner then
    redis.call('SREM', '{_USER_RUNS}' .. owner, run)
  end
  local event = '{EventType.END.value}'
  local body = {{conversation = conversation, run = run, status = status}}
  if not ({_NORMAL}) then
    event = '{EventType.CHAT_ERROR.value}'
    body.code = code
    body.message = message
  end
  local data = cjson.encode(body)
  local n = tonumber(first_id) or 1
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if last[1] then
    local after = tonumber(string.match(last[1][1], '^(%d+)')) + 1
    if after > n then n = after end
    local fields = last[1][2]
    if fields[2] == event and fields[4] == data then
      return after - 1  -- this very ending is there already: a retry whose first try landed
    end
  end
  if requests and requests ~= '' then
    redis.call('XADD', stream, n .. '-0', 'type', '{EventType.APPROVAL.value}', 'data',
      '{{"conversation":' .. cjson.encode(conversation) .. ',"run":' .. cjson.encode(run)
      .. ',"requests":' .. requests .. '}}')
    n = n + 1
  end
  redis.call('XADD', stream, n .. '-0', 'type', event, 'data', data)
  redis.call('EXPIRE', stream, ttl)
  redis.call('HINCRBY', metrics, counter, 1)
  return n
end

-- The run's webhook (shared/contracts/webhooks.py): when its protocol record has one, enqueue the
-- delivery job, once (webhook_outcome is set with HSETNX, so an ending retried enqueues
-- nothing more), and wake the worker.
local function hook_run(record, job, queue, wake, job_id, payload, job_ttl, score)
  if redis.call('HEXISTS', record, 'webhook') == 0 then
    return
  end
  if redis.call('HSETNX', record, 'webhook_outcome', 'pending') == 0 then
    return
  end
  redis.call('SET', job, payload, 'PX', job_ttl)
  redis.call('ZADD', queue, score, job_id)
  redis.call('LPUSH', wake, '1')
  redis.call('LTRIM', wake, 0, 15)
end
"""

#: Lua: the first run still waiting in a conversation's waiting list (``waiting_key``), or nil.
#: A run leaves the list when it claims the conversation (``CLAIM_TURN_LUA``) or is cancelled;
#: one whose job is gone otherwise (arq dropped it, its record expired) is neither queued nor
#: taken and never will be, so it is dropped from the head here rather than hold the others
#: back for ever. Its job's keys are named from its id inside the script (the head is known
#: only there): one Redis, as Sophos runs it, not a cluster.
_JOB, _TAKEN, _DELETE = arq_job_key(""), arq_in_progress_key(""), delete_claim("")
LIVE_HEAD_LUA = f"""
local function live_head(waiting)
  while true do
    local head = redis.call('LINDEX', waiting, 0)
    if not head then
      return nil
    end
    if redis.call('EXISTS', '{_JOB}' .. head) == 1 or redis.call('EXISTS', '{_TAKEN}' .. head) == 1 then
      return head
    end
    redis.call('LPOP', waiting)
  end
end
"""

# The worker's ending of a run it executed or found orphaned (worker/run/ending.py).
# KEYS: active hash, events stream, metrics, then hook_run's: protocol record, webhook job,
#       queue, wake list (shared/contracts/webhooks.py hook_keys_args)
# ARGV: conversation, run, status, code, message, requests (JSON list, or ''), first event id,
#       event retention (s), metrics field, then hook_run's: job id, job bytes, job ttl ms, score
END_RUN_LUA = END_LUA + """
local n = end_run(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
                  ARGV[6], ARGV[7], ARGV[8], ARGV[9])
hook_run(KEYS[4], KEYS[5], KEYS[6], KEYS[7], ARGV[10], ARGV[11], ARGV[12], ARGV[13])
return n
"""

# A run's webhook enqueued by the API, for a run that ended before its protocol record named the
# webhook (shared/contracts/webhooks.py). KEYS and ARGV: hook_run's four each (as END_RUN_LUA's).
HOOK_LUA = END_LUA + """
hook_run(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
"""

# --- scripts --------------------------------------------------------------------

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
# owner has ``limit`` runs queued or running already. A conversation is held by its claim, or
# else by a run still waiting for its turn (so nothing overtakes the waiting runs), and a
# delete's claim is never waited behind. An owner's runs leave their set when they end
# (END_LUA); one whose job is gone otherwise (arq dropped it) is pruned here before counting.
SUBMIT_LUA = LIVE_HEAD_LUA + f"local delete_prefix, job, taken = '{_DELETE}', '{_JOB}', '{_TAKEN}'\n" + """
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
redis.call('SADD', KEYS[8], ARGV[2])
redis.call('PEXPIRE', KEYS[8], ARGV[4])
if ARGV[6] ~= '0' then
  redis.call('SET', KEYS[6], ARGV[7], 'EX', ARGV[6])
end
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 15)
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
  return {'none'}
end
local head = live_head(KEYS[2])
if holder then
  return {'behind', holder}
end
if head ~= ARGV[2] then
  return {'behind', head}
end
taken()
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('LPOP', KEYS[2])
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

# Take a queued job for the worker (worker/wakeup.py).
# KEYS: the job's in-progress key, the queue, the owners' last takes (``OWNERS_TAKEN``), the
#       job's run description (``run_key``: a run's names its owner).
# ARGV: job id, now (ms), in-progress ttl (ms).
# The job's score if it was queued, due and not taken (and is now marked taken, its owner's
# last take now); else nil.
TAKE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > tonumber(ARGV[2]) then
  return false
end
redis.call('SET', KEYS[1], '1', 'PX', ARGV[3])
local owner = redis.call('HGET', KEYS[4], 'owner')
if owner then
  redis.call('HSET', KEYS[3], owner, ARGV[2])
end
return score
"""

# The owners of due jobs and when each owner's run was last taken (worker/fair.py).
# KEYS: the owners' last takes (``OWNERS_TAKEN``), then each job's run description.
# Per job, {owner, last take in ms}: {'', '0'} for a job that is not a run.
OWNERS_LUA = """
local out = {}
for i = 2, #KEYS do
  local owner = redis.call('HGET', KEYS[i], 'owner')
  if owner then
    out[#out + 1] = {owner, redis.call('HGET', KEYS[1], owner) or '0'}
  else
    out[#out + 1] = {'', '0'}
  end
end
return out
"""

# A worker's heartbeat (worker/resources.py), timed by Redis's clock so that workers
# on hosts whose clocks differ never trim each other from the set.
# KEYS: the worker's own heartbeat key, the workers set, the aggregate heartbeat, the last beat
# ARGV: worker id, beat (JSON), ttl (s)
BEAT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - ttl))
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('SET', KEYS[3], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[4], ARGV[2])
"""

# A worker stops beating: its own key and member go; the aggregate heartbeat goes only if
# it holds this worker's beat, and then is handed the newest other live beat (with what
# is left of its TTL), so older readers of the aggregate see no gap either.
# KEYS: the worker's own heartbeat key, the workers set, the aggregate heartbeat
# ARGV: worker id, the prefix of the per-worker heartbeat keys
# 0: the aggregate was another's; 1: handed to another live worker; 2: deleted (none left).
STOP_BEATING_LUA = """
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
local held = redis.call('GET', KEYS[3])
if not held then
  return 2
end
local ok, body = pcall(cjson.decode, held)
if not ok or type(body) ~= 'table' or body['id'] ~= ARGV[1] then
  return 0
end
for _, other in ipairs(redis.call('ZREVRANGE', KEYS[2], 0, -1)) do
  local key = ARGV[2] .. other
  local beat = redis.call('GET', key)
  local left = redis.call('PTTL', key)
  if beat and left > 0 then
    redis.call('SET', KEYS[3], beat, 'PX', left)
    return 1
  end
end
redis.call('DEL', KEYS[3])
return 2
"""


# The first run waiting on a conversation (``enqueue``: worker/run/turns.py) due now, and an idle
# worker woken: a rider of a run's ending (worker/run/ending.py ``wake_next_turn``).
# KEYS: the waiting list, arq's queue, the wake list. ARGV: now in ms. 1 if a run was woken.
WAKE_NEXT_TURN_LUA = """
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then return 0 end
local woken = redis.call('ZADD', KEYS[2], 'XX', 'CH', ARGV[1], head)
redis.call('LPUSH', KEYS[3], '1')
redis.call('LTRIM', KEYS[3], 0, 15)
return woken
"""

# A protocol thread's record, written whole unless it exists (api/protocol/threads.py): of two
# creators one writes it, and the other never sees it half written.
# KEYS: the record, the index of records. ARGV: created_at, metadata, owner, the index's score, the
# thread's id. 1 if written.
CLAIM_THREAD_LUA = """
if redis.call('HEXISTS', KEYS[1], 'created_at') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'created_at', ARGV[1], 'metadata', ARGV[2], 'owner', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
"""

# --- reading the queue ---------------------------------------------------------

# Where queued jobs stand (api/runs/queue.py): ids of arq's queue, each with its rank and the jobs
# ahead of it that are not runs (a rename, a delete, a webhook: their ids hold a ':', a run's id is
# a UUID). The jobs ahead are walked as ids only, a thousand at a time, up to the last rank asked
# for: no key is read per job, so a page's positions cost one pass over strings in Redis.
# KEYS: the queue. ARGV: job ids, or ``#<rank>`` where the caller knows the rank already (a window
# of the queue read with its place). Per item: {rank, jobs ahead that are not runs}; {-1, 0}: not queued.
QUEUE_RANKS_LUA = """
local ranks, wanted, top = {}, {}, -1
for i, id in ipairs(ARGV) do
  local rank
  if string.sub(id, 1, 1) == '#' then
    rank = tonumber(string.sub(id, 2))
  else
    rank = redis.call('ZRANK', KEYS[1], id)
  end
  ranks[i] = rank or -1
  if rank then
    wanted[#wanted + 1] = rank
    if rank > top then top = rank end
  end
end
table.sort(wanted)
local ahead, seen, w, start = {}, 0, 1, 0
while w <= #wanted do
  local chunk = redis.call('ZRANGE', KEYS[1], start, math.min(start + 999, top))
  if #chunk == 0 then break end
  for j, id in ipairs(chunk) do
    local rank = start + j - 1
    while w <= #wanted and wanted[w] == rank do
      ahead[rank] = seen
      w = w + 1
    end
    if string.find(id, ':', 1, true) then seen = seen + 1 end
  end
  start = start + #chunk
end
local out = {}
for i, rank in ipairs(ranks) do
  out[i] = {rank, ahead[rank] or 0}
end
return out
"""

# The queue's figures for a /metrics scrape (api/ops/metrics.py), in one pass inside Redis: the
# runs queued, those waiting behind another run of their conversation (``waiting_key``) and the
# oldest enqueue time (s) of the others ('' when none). A run whose job a worker holds (arq's
# in-progress marker) is left out of the figures and listed instead, as {id, behind (0/1),
# enqueued_at}: the caller asks the database which of them started (their jobs stay in arq's
# queue until they end).
# KEYS: the queue, the active hash. ARGV: the prefixes of ``run_key``, ``waiting_key`` and arq's
# in-progress marker.
# Returns {count, behind, oldest, taken...}.
QUEUE_FIGURES_LUA = """
local holders, waiting, taken = {}, {}, {}
local count, behind, oldest, start = 0, 0, nil, 0
while true do
  local chunk = redis.call('ZRANGE', KEYS[1], start, start + 999)
  if #chunk == 0 then break end
  start = start + #chunk
  for _, id in ipairs(chunk) do
    if not string.find(id, ':', 1, true) then
      local fields = redis.call('HMGET', ARGV[1] .. id, 'conversation', 'enqueued_at')
      local conversation = fields[1]
      if conversation and conversation ~= '' then
        if holders[conversation] == nil then
          holders[conversation] = redis.call('HGET', KEYS[2], conversation) or false
          waiting[conversation] = redis.call('LRANGE', ARGV[2] .. conversation, 0, -1)
        end
        local is_behind = false
        for position, run in ipairs(waiting[conversation]) do
          if run == id then
            local holder = holders[conversation]
            is_behind = position > 1 or (holder ~= false and holder ~= id)
            break
          end
        end
        local at = tonumber(fields[2] or '') or 0
        if redis.call('EXISTS', ARGV[3] .. id) == 1 then
          taken[#taken + 1] = id
          taken[#taken + 1] = is_behind and 1 or 0
          taken[#taken + 1] = tostring(at)
        else
          count = count + 1
          if is_behind then
            behind = behind + 1
          elseif at > 0 and (oldest == nil or at < oldest) then
            oldest = at
          end
        end
      end
    end
  end
end
local out = {count, behind, oldest and tostring(oldest) or ''}
for _, v in ipairs(taken) do out[#out + 1] = v end
return out
"""


class Scripts:
    """The scripts, registered with one Redis client: call one with ``keys=``, ``args=``
    (and ``client=pipe`` to queue it in a pipeline of that client)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self.release_active: AsyncScript = redis.register_script(RELEASE_ACTIVE_LUA)
        self.end_run: AsyncScript = redis.register_script(END_RUN_LUA)
        self.hook: AsyncScript = redis.register_script(HOOK_LUA)
        self.submit: AsyncScript = redis.register_script(SUBMIT_LUA)
        self.claim_turn: AsyncScript = redis.register_script(CLAIM_TURN_LUA)
        self.record_ended: AsyncScript = redis.register_script(RECORD_ENDED_LUA)
        self.drop_unstarted: AsyncScript = redis.register_script(DROP_UNSTARTED_LUA)
        self.gone: AsyncScript = redis.register_script(GONE_LUA)
        self.cancel_queued: AsyncScript = redis.register_script(CANCEL_QUEUED_LUA)
        self.delete: AsyncScript = redis.register_script(DELETE_LUA)
        self.take: AsyncScript = redis.register_script(TAKE_LUA)
        self.owners: AsyncScript = redis.register_script(OWNERS_LUA)
        self.beat: AsyncScript = redis.register_script(BEAT_LUA)
        self.stop_beating: AsyncScript = redis.register_script(STOP_BEATING_LUA)
        self.queue_ranks: AsyncScript = redis.register_script(QUEUE_RANKS_LUA)
        self.queue_figures: AsyncScript = redis.register_script(QUEUE_FIGURES_LUA)
        self.wake_next_turn: AsyncScript = redis.register_script(WAKE_NEXT_TURN_LUA)
        self.claim_thread: AsyncScript = redis.register_script(CLAIM_THREAD_LUA)

    async def load(self) -> None:
        """SCRIPT LOAD every script (after a Redis restart emptied its cache): for the scripts
        queued by SHA in a pipeline, which redis-py does not load by itself."""
        for script in vars(self).values():
            if isinstance(script, AsyncScript):
                await self._redis.script_load(script.script)


#: the SHA-1 of :data:`WAKE_NEXT_TURN_LUA`, to queue it by SHA in a run's ending's pipeline
WAKE_NEXT_TURN_SHA = sha1(WAKE_NEXT_TURN_LUA.encode()).hexdigest()  # noqa: S324 - Redis's script id

_registered: WeakKeyDictionary[Redis, Scripts] = WeakKeyDictionary()


def scripts(redis: Redis) -> Scripts:
    """The scripts registered with ``redis``, once for the client's life."""
    registered = _registered.get(redis)
    if registered is None:
        registered = _registered[redis] = Scripts(redis)
    return registered
