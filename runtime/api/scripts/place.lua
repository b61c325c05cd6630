-- Place a sandbox on a node: pick a node that takes it under the placement rules (ARGV[8], from
-- placement.ts PLACEMENT_RULES: alive, schedulable, holds the template, reads the store asked for,
-- runs a driver that can run the shape, has room), preferring one with a warm slot of the
-- template, then the least loaded; reserve its resources in the same step.
-- Idempotent: a sandbox already placed keeps its node.
-- KEYS[1] node index set, KEYS[2] sandbox hash
-- ARGV[1] key prefix, ARGV[2] sandbox id, ARGV[3] template, ARGV[4] vCPUs in milli-vCPU,
-- ARGV[5] memory MiB, ARGV[6] comma-separated drivers that can run this shape (core/drivers.ts),
-- ARGV[7] hibernation store the node must read ('' = any; a hibernated sandbox resumes only where
-- its snapshot is readable), ARGV[8] the placement rules (JSON array; see placement.ts)
-- Returns { nodeId, fromWarm (0/1), node URL, node alive (0/1) } or { '', reason } with reason
-- 'no_nodes' | 'full'. A new placement is always on an alive node; a sandbox placed before keeps
-- its node, alive or not (the caller then waits for it or gives up). The URL and liveness spare the
-- caller a read of the node before it dispatches there.
-- A node that fails any rule is passed over as if it were full.
-- Warm slots hold memory too: a node's warmMemoryMiB (its heartbeat: the slots' measured footprint)
-- counts as held (heldMemoryMiB), less one slot's share (warmSlotFootprintMiB) when this create
-- claims a slot (one of the template with exactly this shape: warmSlot{VcpusMilli,MemoryMiB}).
-- Agents that do not report them (older ones) count as before: slots free, any slot a claim.
local placed = redis.call('HGET', KEYS[2], 'nodeId')
local prefix, id, template = ARGV[1], ARGV[2], ARGV[3]
if placed and placed ~= '' then
  local nk = prefix .. 'node:' .. placed
  return { placed, tonumber(redis.call('HGET', KEYS[2], 'fromWarmPool') or '0'),
    redis.call('HGET', nk, 'url') or '', redis.call('EXISTS', nk .. ':alive') }
end
local cpu, mem = tonumber(ARGV[4]), tonumber(ARGV[5])
local function set(csv)
  local s = {}
  for item in string.gmatch(csv or '', '[^,]+') do s[item] = true end
  return s
end
local ask = { template = template, drivers = set(ARGV[6]), store = ARGV[7] or '',
  vcpusMilli = cpu, memoryMiB = mem, one = 1 }
local rules = cjson.decode(ARGV[8])
-- one rule on node view v (the same semantics as placement.ts `holds`)
local function holds(r, v)
  if r.kind == 'flag' then return v[r.field] == true end
  if r.kind == 'has' then return v[r.field][ask[r.ask]] == true end
  if r.kind == 'in' then return ask[r.ask][v[r.field]] == true end
  if r.kind == 'matches' then return ask[r.ask] == '' or v[r.field] == ask[r.ask] end
  if r.kind == 'room' then
    local used = 0
    for _, f in ipairs(r.used) do used = used + v[f] end
    return used + ask[r.ask] <= v[r.total]
  end
  error('unknown placement rule kind ' .. tostring(r.kind))
end
local best, bestWarm, bestLoad = nil, -1, math.huge
local alive = 0
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local nk = prefix .. 'node:' .. node
  local up = redis.call('EXISTS', nk .. ':alive') == 1
  if up then alive = alive + 1 end
  local f = redis.call('HMGET', nk, 'schedulable', 'vcpusMilli', 'memoryMiB', 'maxSandboxes',
    'usedVcpusMilli', 'usedMemoryMiB', 'sandboxes', 'driver', 'hibernateStore',
    'warmMemoryMiB', 'warmSlotFootprintMiB', 'warmSlotVcpusMilli', 'warmSlotMemoryMiB', 'templates')
  local slot = tonumber(redis.call('HGET', nk .. ':warm', template) or '0') > 0
  local slotCpu, slotMem = tonumber(f[12] or ''), tonumber(f[13] or '')
  if slot and slotCpu and slotMem then slot = slotCpu == cpu and slotMem == mem end
  local heldMem = tonumber(f[10] or '0')
  if slot then heldMem = math.max(0, heldMem - tonumber(f[11] or '0')) end
  local v = {
    alive = up, schedulable = f[1] == '1', templates = set(f[14]), driver = f[8] or '',
    hibernateStore = f[9] or '', vcpusMilli = tonumber(f[2] or '0'),
    usedVcpusMilli = tonumber(f[5] or '0'), memoryMiB = tonumber(f[3] or '0'),
    usedMemoryMiB = tonumber(f[6] or '0'), heldMemoryMiB = heldMem,
    maxSandboxes = tonumber(f[4] or '0'), sandboxes = tonumber(f[7] or '0'),
  }
  local fits = true
  for _, r in ipairs(rules) do
    if not holds(r, v) then
      fits = false
      break
    end
  end
  if fits then
    local warm = slot and 1 or 0
    local load = v.sandboxes
    if warm > bestWarm or (warm == bestWarm and load < bestLoad) then
      best, bestWarm, bestLoad = node, warm, load
    end
  end
end
if not best then
  if alive == 0 then return { '', 'no_nodes' } end
  return { '', 'full' }
end
local nk = prefix .. 'node:' .. best
redis.call('HINCRBY', nk, 'usedVcpusMilli', cpu)
redis.call('HINCRBY', nk, 'usedMemoryMiB', mem)
redis.call('HINCRBY', nk, 'sandboxes', 1)
if bestWarm == 1 then
  redis.call('HINCRBY', nk .. ':warm', template, -1)
  -- the claimed slot's share now counts as this sandbox's until the node's next heartbeat
  local share = tonumber(redis.call('HGET', nk, 'warmSlotFootprintMiB') or '0')
  if share > 0 then redis.call('HINCRBY', nk, 'warmMemoryMiB', -share) end
end
redis.call('SADD', nk .. ':sandboxes', id)
redis.call('HSET', KEYS[2], 'nodeId', best, 'fromWarmPool', tostring(bestWarm), 'released', '0')
return { best, bestWarm, redis.call('HGET', nk, 'url') or '', 1 }
