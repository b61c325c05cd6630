-- Claim sandboxes whose lifetime has passed: each is removed from the deadline set and moved to
-- `killing` with reason `timeout` (or `retention` when it is paused: its deadline was then the
-- paused retention) in one step, so an extension racing with expiry either wins
-- entirely (deadline moved first) or loses entirely (the sandbox is already killing).
-- KEYS[1] deadlines zset; ARGV[1] key prefix, ARGV[2] now (ms), ARGV[3] max claims
-- Returns the claimed sandbox ids.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local claimed = {}
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  local sk = ARGV[1] .. 'sandbox:' .. id
  local state = redis.call('HGET', sk, 'state')
  if state == 'running' or state == 'paused' or state == 'pausing' or state == 'resuming' then
    local reason = 'timeout'
    if state == 'paused' then reason = 'retention' end
    redis.call('HSET', sk, 'state', 'killing', 'killReason', reason, 'updatedAt', ARGV[2])
    -- one delete per sandbox id: `op_t` + the id's random part (`sbx_…` and DNS-safe `sbx…` ids)
    local opId = 'op_t' .. (string.gsub(id, '^sbx_?', ''))
    redis.call('HSET', ARGV[1] .. 'operation:' .. opId, 'id', opId, 'kind', 'sandbox.delete', 'target', id,
      'state', 'pending', 'args', '{"reason":"' .. reason .. '"}', 'createdAt', ARGV[2], 'updatedAt', ARGV[2],
      'team', redis.call('HGET', sk, 'team') or '')
    redis.call('XADD', KEYS[2], '*', 'id', opId)
    table.insert(claimed, id)
  end
end
return claimed
