-- Set a live sandbox's deadline (POST /v1/sandboxes/:id/timeout). Atomic with expire.lua.
-- A paused sandbox's clock is stopped: the new lifetime becomes its running time left, and its
-- deadline (the paused retention) stays.
-- KEYS[1] sandbox hash, KEYS[2] deadlines zset
-- ARGV[1] new deadline (ms), ARGV[2] timeoutSec, ARGV[3] now (ms)
-- Returns { 1, state } when set, { 0, state } when the sandbox is not live ('' if absent).
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return { 0, '' } end
if state ~= 'running' and state ~= 'paused' and state ~= 'pausing' and state ~= 'resuming' then
  return { 0, state }
end
if state == 'paused' then
  redis.call('HSET', KEYS[1], 'timeLeftMs', tonumber(ARGV[2]) * 1000, 'timeoutSec', ARGV[2], 'updatedAt', ARGV[3])
  return { 1, state }
end
redis.call('HSET', KEYS[1], 'expiresAtMs', ARGV[1], 'timeoutSec', ARGV[2], 'updatedAt', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[1], redis.call('HGET', KEYS[1], 'id'))
return { 1, state }
