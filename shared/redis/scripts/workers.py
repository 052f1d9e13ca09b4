"""The workers' scripts: each one's heartbeat, and the owners of due jobs the fair share reads."""

from __future__ import annotations

# The owners of due jobs and when each owner's run was last taken (worker/queue/fair.py).
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
