-- Admit a new sandbox against its team's quotas and a node's room, and record it, in one step: a
-- concurrent burst of creates admits exactly what the quotas and the nodes allow, and a refused
-- create leaves nothing behind (no record, no index entry, no reservation, no rate-window entry).
-- With a placement ask (ARGV[12]) the sandbox is placed here (placement-lib.lua, loaded in front
-- of this script: the rules of place.lua): a create that no node can take now is refused at once
-- instead of being accepted and failing later, and an admitted one holds its node's share.
-- KEYS[1] sandbox hash, KEYS[2] sandbox index zset, KEYS[3] team reserved hash
-- (`sandboxes`, `vcpusMilli`, `memoryMiB`), KEYS[4] team creates zset (sliding 60 s window),
-- KEYS[5] the team's sandbox index zset, KEYS[6] the create operation's hash, KEYS[7] the operation
-- queue stream, KEYS[8] the team's index of sandboxes not yet killed (transition.lua removes),
-- KEYS[9] the request's idempotency key (unused without a body hash), KEYS[10] the node index set
-- ARGV[1] now (ms), ARGV[2] sandbox id, ARGV[3] sandboxes limit, ARGV[4] vCPU limit (milli),
-- ARGV[5] memory limit (MiB), ARGV[6] creates-per-minute limit (limits: 0 = unlimited),
-- ARGV[7] this sandbox's vCPUs (milli), ARGV[8] its memory (MiB), ARGV[9] the create operation's
-- hash as a JSON object ('' = none: the caller queues it), ARGV[10] the request body's hash
-- ('' = no Idempotency-Key), ARGV[11] the idempotency key's TTL (s), ARGV[12] the placement ask
-- as a JSON object ('' = none: placed later by place.lua): { prefix, template, drivers (comma-
-- separated), rules (placement.ts PLACEMENT_RULES), outage: [began, ended, now, ttl] (ms, the API's
-- last Redis outage, store-outage.ts) }, ARGV[13..] sandbox field/value pairs
-- Returns { 1 } when admitted and recorded ({ 1, nodeId, fromWarm (0/1) } when placed here),
-- { 0, quota, limit, current } when refused by a quota, { 5, reason } when no node takes it now
-- (reason 'no_nodes': none counts as alive; 'full': none has room), and with an
-- idempotency key: { 2, sandboxId, operationId } when the key was used before with the same body
-- (the first request's sandbox: nothing is written), { 3 } when it was used with another body,
-- { 4, sandboxId } when an API from before this script holds the key without an operation yet.
-- The key is claimed in the step that admits the sandbox (claim-or-return): a retry sees either
-- nothing (and admits) or the first request's whole answer, never a half-written one; a refused
-- create writes no key, so the key may be used again with a body that fits.
-- With an operation, an admitted sandbox and its queued create are one step: no record is ever
-- left `creating` without the operation that makes it (an API dying between two writes did that),
-- and the create costs one round trip less.
-- The reservation is returned exactly once when the sandbox reaches `killed` (transition.lua),
-- marked by the record's `quotaHeld` field.
local bodyHash = ARGV[10]
if bodyHash ~= '' then
  local prior = redis.call('GET', KEYS[9])
  if prior then
    local p = cjson.decode(prior)
    if p.bodyHash ~= bodyHash then return { 3 } end
    if not p.operationId then return { 4, p.sandboxId or '' } end
    return { 2, p.sandboxId, p.operationId }
  end
end
local now = tonumber(ARGV[1])
local cpu, mem = tonumber(ARGV[7]), tonumber(ARGV[8])
local r = redis.call('HMGET', KEYS[3], 'sandboxes', 'vcpusMilli', 'memoryMiB')
local used = { tonumber(r[1] or '0'), tonumber(r[2] or '0'), tonumber(r[3] or '0') }
local limits = { tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]) }
local asks = { 1, cpu, mem }
local names = { 'sandboxes', 'vcpus', 'memoryMiB' }
for i = 1, 3 do
  if limits[i] > 0 and used[i] + asks[i] > limits[i] then
    return { 0, names[i], limits[i], used[i] }
  end
end
local perMinute = tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - 60000)
if perMinute > 0 then
  local recent = redis.call('ZCARD', KEYS[4])
  if recent >= perMinute then return { 0, 'createsPerMinute', perMinute, recent } end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return { 0, 'exists', 0, 0 } end
local node, warm, placing = nil, 0, nil
if ARGV[12] ~= '' then
  placing = cjson.decode(ARGV[12])
  local o = placing.outage
  local why
  node, warm, why = pick_node(placing.prefix, KEYS[10], placing.template, placing.drivers, '', cpu,
    mem, placing.rules, outage_of(o[1], o[2], o[3], o[4]))
  if not node then return { 5, why } end
end
redis.call('ZADD', KEYS[4], now, ARGV[2])
redis.call('PEXPIRE', KEYS[4], 120000)
redis.call('HINCRBY', KEYS[3], 'sandboxes', 1)
redis.call('HINCRBY', KEYS[3], 'vcpusMilli', cpu)
redis.call('HINCRBY', KEYS[3], 'memoryMiB', mem)
for i = 13, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'quotaHeld', '1')
if node then reserve(placing.prefix, node, warm, KEYS[1], ARGV[2], placing.template, cpu, mem) end
redis.call('ZADD', KEYS[2], now, ARGV[2])
redis.call('ZADD', KEYS[5], now, ARGV[2])
redis.call('ZADD', KEYS[8], now, ARGV[2])
if ARGV[9] ~= '' then
  local op = cjson.decode(ARGV[9])
  for field, value in pairs(op) do
    redis.call('HSET', KEYS[6], field, value)
  end
  redis.call('XADD', KEYS[7], '*', 'id', op.id)
end
if bodyHash ~= '' then
  local claim = { bodyHash = bodyHash, sandboxId = ARGV[2], operationId = '' }
  if ARGV[9] ~= '' then claim.operationId = cjson.decode(ARGV[9]).id end
  redis.call('SET', KEYS[9], cjson.encode(claim), 'EX', tonumber(ARGV[11]))
end
if node then return { 1, node, warm } end
return { 1 }
