-- A team's open command streams, counted with leases so that an agent that dies with streams open
-- (or loses Redis while they close) cannot hold the team's count up for longer than one lease.
-- KEYS[1] the team's streams zset (member = stream id, score = lease expiry, ms on Redis's clock)
-- ARGV[1] 'admit' | 'renew' | 'remove', ARGV[2] stream id, ARGV[3] lease (ms), ARGV[4] limit (admit; 0 = unlimited)
-- admit: prunes expired leases, then { 1, open } when admitted (open counts this one) or
--   { 0, open } when `open` streams already fill the limit (nothing is written).
-- renew: moves a still-held lease's expiry on ({ 1 }); a lease that was pruned or removed is not
--   brought back ({ 0 }), so a renewal racing the removal never re-adds a closed stream.
-- remove: { 1 } (idempotent).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, id, lease = ARGV[1], ARGV[2], tonumber(ARGV[3])
if op == 'remove' then
  redis.call('ZREM', KEYS[1], id)
  return { 1 }
end
if op == 'renew' then
  local n = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, id)
  if n == 0 and not redis.call('ZSCORE', KEYS[1], id) then return { 0 } end
  redis.call('PEXPIRE', KEYS[1], lease)
  return { 1 }
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local open = redis.call('ZCARD', KEYS[1])
local limit = tonumber(ARGV[4])
if limit > 0 and open >= limit then return { 0, open } end
redis.call('ZADD', KEYS[1], now + lease, id)
-- the key outlives its newest lease by nothing: an idle team leaves no key behind
redis.call('PEXPIRE', KEYS[1], lease)
return { 1, open + 1 }
