"""Reading the queue: where queued jobs stand, the queued index's figures, and the index put back
by the start-up recovery."""

from __future__ import annotations

from shared.redis.keys import ACTIVE_RUNS, arq_job_key, waiting_key
from shared.redis.scripts.ending import QUEUED_INDEX_LUA

_JOB = arq_job_key("")

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

# The queue's figures for a /metrics scrape (api/ops/metrics.py), read from the index of queued runs
# (``QUEUED_INDEX_LUA``) and never from the queue itself: a scrape costs the same at any queue length.
# Runs whose job is gone (neither queued nor taken: arq dropped it, or its record expired) are
# pruned first from each set's oldest end, at most ARGV[3] each: such runs are the oldest, and the
# age of the oldest run is what a scrape reports.
# KEYS: ``QUEUED_READY``, ``QUEUED_BEHIND``. ARGV: the prefixes of arq's job record and in-progress
# marker, the most runs pruned per set.
# Returns {runs queued, of them waiting for their thread, the oldest enqueue time in ms ('' when none)}.
QUEUE_FIGURES_LUA = """
local function prune(set)
  for _ = 1, tonumber(ARGV[3]) do
    local head = redis.call('ZRANGE', set, 0, 0)[1]
    if not head then return end
    if redis.call('EXISTS', ARGV[1] .. head) == 1 or redis.call('EXISTS', ARGV[2] .. head) == 1 then
      return
    end
    redis.call('ZREM', set, head)
  end
end
prune(KEYS[1])
prune(KEYS[2])
local ready, behind = redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {ready + behind, behind, first[2] or ''}
"""

# A run the start-up recovery gives back to the queue (worker/run/lifetime/recovery.py): taken by the worker
# that died, never recorded, its in-progress marker deleted so that it runs after all. Back in the
# index of queued runs, behind when it waits for its thread (in its waiting list after another, or
# behind the run holding the conversation). KEYS: the run's description. ARGV: the run's id.
INDEX_REQUEUED_LUA = QUEUED_INDEX_LUA + f"""
local conversation = redis.call('HGET', KEYS[1], 'conversation')
if not conversation or redis.call('EXISTS', '{_JOB}' .. ARGV[1]) == 0 then
  return 0
end
local holder = redis.call('HGET', '{ACTIVE_RUNS}', conversation)
local behind = false
for position, run in ipairs(redis.call('LRANGE', '{waiting_key("")}' .. conversation, 0, -1)) do
  if run == ARGV[1] then
    behind = position > 1 or (holder ~= false and holder ~= ARGV[1])
    break
  end
end
index_queued(ARGV[1], behind)
return 1
"""
