-- Atomically move a sandbox from one of the allowed states to a new state.
-- KEYS[1] sandbox hash, KEYS[2] deadlines zset
-- ARGV[1] target state, ARGV[2] comma-separated allowed current states, ARGV[3] now (ms),
-- ARGV[4..] extra field/value pairs to set with the change.
-- Lifetime: only running time counts. Entering `paused` stores the running time left
-- (`timeLeftMs`) and sets the deadline to the paused retention (field `retentionMs`, which the
-- caller passes); leaving `resuming` for `running` gives the time left back, or the whole
-- `timeoutSec` when the deadline itself paused it (`pauseReason` timeout: onTimeout = pause).
-- Entering `killing`/`killed` deletes the sandbox's E2B envd access token.
-- Entering `killed` returns the sandbox's reservation of its team's quotas (see admit.lua) and
-- takes it out of its team's index of sandboxes not yet killed (`team:<team>:sandboxes:live`).
-- Returns { 1, target } on success, { 0, current } (current = '' when the sandbox is gone) otherwise.
local current = redis.call('HGET', KEYS[1], 'state')
if not current then return { 0, '' } end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do
  if s == current then allowed = true end
end
if not allowed then return { 0, current } end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updatedAt', ARGV[3])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
local id = redis.call('HGET', KEYS[1], 'id')
local now = tonumber(ARGV[3])
if ARGV[1] == 'paused' and current == 'pausing' then
  local left = math.max(0, tonumber(redis.call('HGET', KEYS[1], 'expiresAtMs')) - now)
  local retention = tonumber(redis.call('HGET', KEYS[1], 'retentionMs') or '0')
  redis.call('HSET', KEYS[1], 'timeLeftMs', left, 'pausedAtMs', now, 'expiresAtMs', now + retention)
  redis.call('ZADD', KEYS[2], now + retention, id)
elseif ARGV[1] == 'running' and current == 'resuming' then
  local left = tonumber(redis.call('HGET', KEYS[1], 'timeLeftMs') or '0')
  if redis.call('HGET', KEYS[1], 'pauseReason') == 'timeout' then
    left = tonumber(redis.call('HGET', KEYS[1], 'timeoutSec') or '0') * 1000
  end
  redis.call('HSET', KEYS[1], 'expiresAtMs', now + left)
  redis.call('HDEL', KEYS[1], 'pauseMode', 'pauseReason', 'pausedAtMs', 'timeLeftMs', 'retentionMs',
    'hibernateStore', 'hibernatePath')
  redis.call('ZADD', KEYS[2], now + left, id)
elseif ARGV[1] == 'running' then
  -- the lifetime clock is enforced only for live sandboxes
  redis.call('ZADD', KEYS[2], redis.call('HGET', KEYS[1], 'expiresAtMs'), id)
elseif ARGV[1] == 'killing' or ARGV[1] == 'killed' then
  redis.call('ZREM', KEYS[2], id)
  -- its E2B envd access token (redis-keys.ts e2bEnvdToken) signs no more /files URLs
  redis.call('DEL', string.match(KEYS[1], '^(.*)sandbox:') .. 'e2b:envd-token:' .. id)
end
if ARGV[1] == 'killed' then
  local team = redis.call('HGET', KEYS[1], 'team') or 'default'
  redis.call('ZREM', string.match(KEYS[1], '^(.*)sandbox:') .. 'team:' .. team .. ':sandboxes:live', id)
end
-- a killed sandbox returns what it reserved of its team's quotas (admit.lua), exactly once
if ARGV[1] == 'killed' and redis.call('HGET', KEYS[1], 'quotaHeld') == '1' then
  local f = redis.call('HMGET', KEYS[1], 'team', 'vcpus', 'memoryMiB')
  local prefix = string.match(KEYS[1], '^(.*)sandbox:')
  local tk = prefix .. 'team:' .. (f[1] or 'default') .. ':reserved'
  redis.call('HINCRBY', tk, 'sandboxes', -1)
  redis.call('HINCRBY', tk, 'vcpusMilli', -math.floor(tonumber(f[2]) * 1000 + 0.5))
  redis.call('HINCRBY', tk, 'memoryMiB', -tonumber(f[3]))
  redis.call('HSET', KEYS[1], 'quotaHeld', '0')
end
return { 1, ARGV[1] }
