-- Claim sandboxes whose lifetime has passed. Each is removed from the deadline set and, in one step
-- (so an extension racing with expiry either wins entirely — deadline moved first — or loses
-- entirely):
-- * a sandbox whose record says `onTimeout = pause` and that is running gets a pause operation
--   (args reason `timeout`) queued, unless a pause is already pending or running, and its deadline
--   set ARGV[4] ms later; one pausing or resuming only gets that later deadline. When that later
--   deadline finds the timeout pause failed (the sandbox runs on), it is killed as below: a
--   sandbox never runs on past its lifetime because it could not be paused. A paused one's
--   deadline is its paused retention and ends it as below;
-- * any other is moved to `killing` with reason `timeout` (or `retention` when it is paused: its
--   deadline was then the paused retention) and its delete operation queued.
-- KEYS[1] deadlines zset, KEYS[2] operations queue; ARGV[1] key prefix, ARGV[2] now (ms),
-- ARGV[3] max claims, ARGV[4] retry delay of a timeout pause (ms).
-- Returns { ids moved to killing, ids whose timeout pause was queued }.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local claimed, paused = {}, {}
local now = ARGV[2]
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local sk = ARGV[1] .. 'sandbox:' .. id
  local f = redis.call('HMGET', sk, 'state', 'onTimeout', 'pauseOperationId', 'team')
  local state, team = f[1], f[4] or ''
  local live = state == 'running' or state == 'pausing' or state == 'resuming'
  local pending, timeoutPauseFailed = false, false
  if live and f[2] == 'pause' and f[3] and f[3] ~= '' then
    local op = redis.call('HMGET', ARGV[1] .. 'operation:' .. f[3], 'state', 'args')
    pending = op[1] == 'pending' or op[1] == 'running'
    timeoutPauseFailed = op[1] == 'failed' and op[2] == '{"reason":"timeout"}'
  end
  if live and f[2] == 'pause' and not (state == 'running' and timeoutPauseFailed) then
    redis.call('ZADD', KEYS[1], tonumber(now) + tonumber(ARGV[4]), id)
    if state == 'running' and not pending then
      -- one id per sandbox and instant: `op_p` + the id's random part + now
      local opId = 'op_p' .. (string.gsub(id, '^sbx_?', '')) .. now
      redis.call('HSET', ARGV[1] .. 'operation:' .. opId, 'id', opId, 'kind', 'sandbox.pause', 'target', id,
        'state', 'pending', 'args', '{"reason":"timeout"}', 'createdAt', now, 'updatedAt', now, 'team', team)
      redis.call('XADD', KEYS[2], '*', 'id', opId)
      redis.call('HSET', sk, 'pauseOperationId', opId)
      table.insert(paused, id)
    end
  elseif live or state == 'paused' then
    local reason = 'timeout'
    if state == 'paused' then reason = 'retention' end
    redis.call('HSET', sk, 'state', 'killing', 'killReason', reason, 'updatedAt', now)
    -- one delete per sandbox id: `op_t` + the id's random part (`sbx_…` and DNS-safe `sbx…` ids)
    local opId = 'op_t' .. (string.gsub(id, '^sbx_?', ''))
    redis.call('HSET', ARGV[1] .. 'operation:' .. opId, 'id', opId, 'kind', 'sandbox.delete', 'target', id,
      'state', 'pending', 'args', '{"reason":"' .. reason .. '"}', 'createdAt', now, 'updatedAt', now,
      'team', team)
    redis.call('XADD', KEYS[2], '*', 'id', opId)
    table.insert(claimed, id)
  end
end
return { claimed, paused }
