"""A run's ending in Redis, the one Lua function every script that ends a run begins with, and
the pieces it shares with the scripts that move a run: the index of queued runs, the head of a
conversation's waiting list."""

from __future__ import annotations

from shared.contracts.events import ENDS_NORMALLY, EventType
from shared.contracts.jobs import delete_claim
from shared.redis.keys import (
    QUEUED_BEHIND,
    QUEUED_READY,
    arq_in_progress_key,
    arq_job_key,
    run_key,
    thread_runs_channel,
    user_runs_key,
)

_RUN, _USER_RUNS = run_key(""), user_runs_key("")
_NORMAL = " or ".join(f"status == '{s.value}'" for s in ENDS_NORMALLY)

#: Lua: the index of the runs queued and not yet taken (``QUEUED_READY``, ``QUEUED_BEHIND``), what a
#: ``/metrics`` scrape counts without reading the queue (``QUEUE_FIGURES_LUA``). Every script that
#: moves a run keeps it: accepted (``SUBMIT_LUA``: behind when it waits for its thread), its thread
#: freed (``WAKE_NEXT_TURN_LUA``: no longer behind), taken by a worker (``TAKE_LUA``; a run taken only
#: to be deferred stays behind), its turn claimed (``CLAIM_TURN_LUA``), dropped from its waiting list
#: (``LIVE_HEAD_LUA``), ended (``END_LUA``), put back by the start-up recovery
#: (``INDEX_REQUEUED_LUA``). The score is the enqueue time (ms) its description holds, kept when the
#: run moves from one set to the other.
QUEUED_INDEX_LUA = f"""
local function index_queued(run, behind)
  local into, from = '{QUEUED_READY}', '{QUEUED_BEHIND}'
  if behind then into, from = from, into end
  local score = redis.call('ZSCORE', from, run) or redis.call('ZSCORE', into, run)
  if not score then
    local at = tonumber(redis.call('HGET', '{_RUN}' .. run, 'enqueued_at') or '') or 0
    score = math.floor(at * 1000)
  end
  redis.call('ZREM', from, run)
  redis.call('ZADD', into, score, run)
end
local function index_unqueued(run)
  redis.call('ZREM', '{QUEUED_READY}', run)
  redis.call('ZREM', '{QUEUED_BEHIND}', run)
end
"""

#: Lua: a run's ending in Redis, prepended to every script that ends a run (the worker's
#: :data:`END_RUN_LUA`, the queued cancel, the sweep's drop of a run that never started).
#: ``end_run`` compares-and-deletes the conversation's claim, appends the ``approval``
#: event (when ``requests`` is a JSON list) and the terminal event of
#: :func:`shared.contracts.events.terminal_event` to the run's stream, with ids after both the
#: stream's last entry and ``first_id``, sets the stream's expiry and counts the outcome.
#: It returns the terminal event's id. A stream that already ends with this very terminal
#: event is left as it is (the ending is safe to retry). The run leaves its owner's active runs
#: (``user_runs_key``, named from the owner its description holds: one Redis, not a cluster).
END_LUA = QUEUED_INDEX_LUA + f"""
local function end_run(active, stream, metrics, conversation, run, status, code, message,
                       requests, first_id, ttl, counter)
  index_unqueued(run)
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
    -- entry <first>-<k> holds events first..first+k (tokens written together: shared/contracts/events.py)
    local first, seq = string.match(last[1][1], '^(%d+)-(%d+)')
    local after = tonumber(first) + tonumber(seq) + 1
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
_THREAD_RUNS = thread_runs_channel("")
LIVE_HEAD_LUA = QUEUED_INDEX_LUA + f"""
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
    index_unqueued(head)
  end
end
"""

# The worker's ending of a run it executed or found orphaned (worker/run/outcome/ending.py).
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
