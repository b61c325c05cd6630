-- Record that a sandbox entered an activity state, closing the interval it was in.
-- Every time is Redis's own clock (TIME), so agents and API replicas with skewed clocks agree,
-- and an interval left open by a process that died is closed by whoever reports next.
-- KEYS[1] usage:open:<id> hash, KEYS[2] usage:sandbox:<id> hash, KEYS[3] autopause zset,
-- KEYS[4] sandbox:<id> hash, KEYS[5] usage:open set
-- ARGV[1] key prefix, ARGV[2] sandbox id, ARGV[3] new state: active | idle | paused | ended,
-- ARGV[4] retention of usage data (s), ARGV[5] only when the open state is this ('' = always),
-- ARGV[6] how long ago the change happened, ms (the boundary: now minus it, kept within
-- [the open interval's start, now]; '0' or absent = now)
-- The sandbox's dimensions (vcpus, memoryMiB, template, apiKey, team) and its autoPauseSec are read from
-- its record, so every reporter agrees on them.
-- Returns { previous state ('' if none), closed interval (ms), now (ms), state now ('' if ended) }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prefix, id, want = ARGV[1], ARGV[2], ARGV[3]
local retention = tonumber(ARGV[4])
local sstate = redis.call('HGET', KEYS[4], 'state')
-- a sandbox that is ending (or whose record is gone) never gets an interval reopened
if not sstate or sstate == 'killing' or sstate == 'killed' then want = 'ended' end

local prev = redis.call('HMGET', KEYS[1], 'state', 'since')
local old, since = prev[1], tonumber(prev[2])
if ARGV[5] and ARGV[5] ~= '' and old ~= ARGV[5] and want ~= 'ended' then
  return { old or '', 0, now, old or '' }
end
-- the boundary between the closed interval and the new one
local ago = tonumber(ARGV[6] or '0') or 0
if ago > 0 then
  now = now - ago
  if since and now < since then now = since end
end
local delta = 0
if old and since and now > since then
  delta = now - since
  -- spread [since, now) over one-minute buckets (older than the retention: dropped)
  local from = math.max(since, now - retention * 1000)
  local m = math.floor(from / 60000)
  while m * 60000 < now do
    local lo = math.max(from, m * 60000)
    local hi = math.min(now, (m + 1) * 60000)
    if hi > lo then
      local bk = prefix .. 'usage:m:' .. m
      redis.call('HINCRBY', bk, id .. '|' .. old, hi - lo)
      redis.call('EXPIRE', bk, retention)
    end
    m = m + 1
  end
  redis.call('HINCRBY', KEYS[2], old .. 'Ms', delta)
end

if want == 'ended' then
  if old then
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[5], id)
    redis.call('HSET', KEYS[2], 'endedAt', now)
    redis.call('EXPIRE', KEYS[2], retention)
  end
  redis.call('ZREM', KEYS[3], id)
  return { old or '', delta, now, '' }
end

redis.call('HSET', KEYS[1], 'state', want, 'since', now)
redis.call('SADD', KEYS[5], id)
local dims = redis.call('HMGET', KEYS[4], 'vcpus', 'memoryMiB', 'template', 'apiKey', 'autoPauseSec', 'team')
if redis.call('HEXISTS', KEYS[2], 'startedAt') == 0 then
  redis.call('HSET', KEYS[2], 'startedAt', now, 'vcpus', dims[1] or '0', 'memoryMiB', dims[2] or '0',
    'template', dims[3] or '', 'apiKey', dims[4] or '', 'team', dims[6] or '')
end
local autoPause = tonumber(dims[5] or '0') or 0
if want == 'idle' and autoPause > 0 and sstate == 'running' then
  if old == 'idle' then
    redis.call('ZADD', KEYS[3], 'NX', now + autoPause * 1000, id)
  else
    redis.call('ZADD', KEYS[3], now + autoPause * 1000, id)
  end
else
  redis.call('ZREM', KEYS[3], id)
end
return { old or '', delta, now, want }
