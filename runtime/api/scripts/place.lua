-- Place a sandbox on a node: pick an alive, schedulable node with room, preferring one with a
-- warm slot of the template, then the least loaded; reserve its resources in the same step.
-- Idempotent: a sandbox already placed keeps its node.
-- KEYS[1] node index set, KEYS[2] sandbox hash
-- ARGV[1] key prefix, ARGV[2] sandbox id, ARGV[3] template, ARGV[4] vCPUs in milli-vCPU,
-- ARGV[5] memory MiB, ARGV[6] comma-separated drivers that can run this shape (core/drivers.ts),
-- ARGV[7] hibernation store the node must read ('' = any; a hibernated sandbox resumes only where
-- its snapshot is readable)
-- Returns { nodeId, fromWarm (0/1), node URL, node alive (0/1) } or { '', reason } with reason
-- 'no_nodes' | 'full'. A new placement is always on an alive node; a sandbox placed before keeps
-- its node, alive or not (the caller then waits for it or gives up). The URL and liveness spare the
-- caller a read of the node before it dispatches there.
-- A node whose driver cannot run the shape is passed over as if it were full.
-- Warm slots hold memory too: a node's warmMemoryMiB (its heartbeat: the slots' measured footprint)
-- counts as used, less one slot's share (warmSlotFootprintMiB) when this create claims a slot (one
-- of the template with exactly this shape: warmSlot{VcpusMilli,MemoryMiB}).
-- Agents that do not report them (older ones) count as before: slots free, any slot a claim.
local placed = redis.call('HGET', KEYS[2], 'nodeId')
local prefix, id, template = ARGV[1], ARGV[2], ARGV[3]
if placed and placed ~= '' then
  local nk = prefix .. 'node:' .. placed
  return { placed, tonumber(redis.call('HGET', KEYS[2], 'fromWarmPool') or '0'),
    redis.call('HGET', nk, 'url') or '', redis.call('EXISTS', nk .. ':alive') }
end
local cpu, mem = tonumber(ARGV[4]), tonumber(ARGV[5])
local drivers = ',' .. (ARGV[6] or '') .. ','
local store = ARGV[7] or ''
local best, bestWarm, bestLoad = nil, -1, math.huge
local alive = 0
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local nk = prefix .. 'node:' .. node
  if redis.call('EXISTS', nk .. ':alive') == 1 then
    alive = alive + 1
    local f = redis.call('HMGET', nk, 'schedulable', 'vcpusMilli', 'memoryMiB', 'maxSandboxes',
      'usedVcpusMilli', 'usedMemoryMiB', 'sandboxes', 'driver', 'hibernateStore',
      'warmMemoryMiB', 'warmSlotFootprintMiB', 'warmSlotVcpusMilli', 'warmSlotMemoryMiB')
    local slot = tonumber(redis.call('HGET', nk .. ':warm', template) or '0') > 0
    local slotCpu, slotMem = tonumber(f[12] or ''), tonumber(f[13] or '')
    if slot and slotCpu and slotMem then slot = slotCpu == cpu and slotMem == mem end
    local heldMem = tonumber(f[10] or '0')
    if slot then heldMem = math.max(0, heldMem - tonumber(f[11] or '0')) end
    local fits = f[1] == '1'
      and (store == '' or f[9] == store)
      and string.find(drivers, ',' .. (f[8] or '') .. ',', 1, true) ~= nil
      and tonumber(f[5] or '0') + cpu <= tonumber(f[2] or '0')
      and tonumber(f[6] or '0') + heldMem + mem <= tonumber(f[3] or '0')
      and tonumber(f[7] or '0') + 1 <= tonumber(f[4] or '0')
    if fits then
      local warm = slot and 1 or 0
      local load = tonumber(f[7] or '0')
      if warm > bestWarm or (warm == bestWarm and load < bestLoad) then
        best, bestWarm, bestLoad = node, warm, load
      end
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
