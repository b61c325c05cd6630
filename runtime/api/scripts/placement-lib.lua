-- Placement, shared by place.lua and admit.lua (redis-scripts.ts puts this in front of each when
-- it loads them): the node liveness rule, the pick of a node under the placement rules, and the
-- reservation of its share. Defines functions only.
--
-- Liveness (store-outage.ts): a node heartbeats while its alive key exists; one whose key is
-- missing is presumed alive when it is not fenced as lost, it heartbeat within one alive TTL before
-- the API's last Redis outage began, and that outage ended less than one TTL ago — the key expired
-- while Redis was away, through no fault of the node. `outage` = { began, ended, now, ttl } (ms).
local function node_up(nk, outage)
  if redis.call('EXISTS', nk .. ':alive') == 1 then return true end
  if outage.ended == 0 then return false end
  local f = redis.call('HMGET', nk, 'heartbeatAt', 'lostAt')
  if f[2] then return false end
  return tonumber(f[1] or '0') >= outage.began - outage.ttl and outage.now - outage.ended < outage.ttl
end

-- The outage figures from four ARGV strings (missing: no outage seen).
local function outage_of(began, ended, now, ttl)
  return { began = tonumber(began or '0') or 0, ended = tonumber(ended or '0') or 0,
    now = tonumber(now or '0') or 0, ttl = tonumber(ttl or '0') or 0 }
end

local function csv_set(csv)
  local s = {}
  for item in string.gmatch(csv or '', '[^,]+') do s[item] = true end
  return s
end

-- One rule on node view v for ask a (the same semantics as placement.ts `holds`).
local function rule_holds(r, v, a)
  if r.kind == 'flag' then return v[r.field] == true end
  if r.kind == 'has' then return v[r.field][a[r.ask]] == true end
  if r.kind == 'in' then return a[r.ask][v[r.field]] == true end
  if r.kind == 'matches' then return a[r.ask] == '' or v[r.field] == a[r.ask] end
  if r.kind == 'room' then
    local used = 0
    for _, f in ipairs(r.used) do used = used + v[f] end
    return used + a[r.ask] <= v[r.total]
  end
  error('unknown placement rule kind ' .. tostring(r.kind))
end

-- Picks the node of index set `index` that takes a sandbox of `template` (`drivers`: the
-- comma-separated drivers that can run its shape; `store`: the hibernation store the node must read,
-- '' = any; `cpu` milli-vCPU, `mem` MiB) under `rules` now, preferring one with a warm slot of the
-- template, then the least loaded. Returns node id and 1/0 (claims a warm slot), or nil, 0 and why
-- none: 'no_nodes' (none counts as alive) or 'full'.
-- Warm slots hold memory too: a node's warmMemoryMiB (its heartbeat: the slots' measured footprint)
-- counts as held (heldMemoryMiB), less one slot's share (warmSlotFootprintMiB) when this create
-- claims a slot (one of the template with exactly this shape: warmSlot{VcpusMilli,MemoryMiB}).
-- Agents that do not report them (older ones) count as before: slots free, any slot a claim.
-- A node that fails any rule is passed over as if it were full.
local function pick_node(prefix, index, template, drivers, store, cpu, mem, rules, outage)
  local a = { template = template, drivers = csv_set(drivers), store = store or '', vcpusMilli = cpu,
    memoryMiB = mem, one = 1 }
  local best, bestWarm, bestLoad = nil, -1, math.huge
  local alive = 0
  for _, node in ipairs(redis.call('SMEMBERS', index)) do
    local nk = prefix .. 'node:' .. node
    local up = node_up(nk, outage)
    if up then alive = alive + 1 end
    local f = redis.call('HMGET', nk, 'schedulable', 'vcpusMilli', 'memoryMiB', 'maxSandboxes',
      'usedVcpusMilli', 'usedMemoryMiB', 'sandboxes', 'driver', 'hibernateStore',
      'warmMemoryMiB', 'warmSlotFootprintMiB', 'warmSlotVcpusMilli', 'warmSlotMemoryMiB', 'templates',
      'drainRequestedAt')
    local slot = tonumber(redis.call('HGET', nk .. ':warm', a.template) or '0') > 0
    local slotCpu, slotMem = tonumber(f[12] or ''), tonumber(f[13] or '')
    if slot and slotCpu and slotMem then slot = slotCpu == a.vcpusMilli and slotMem == a.memoryMiB end
    local heldMem = tonumber(f[10] or '0')
    if slot then heldMem = math.max(0, heldMem - tonumber(f[11] or '0')) end
    local v = {
      alive = up, schedulable = f[1] == '1' and (f[15] or '') == '', templates = csv_set(f[14]), driver = f[8] or '',
      hibernateStore = f[9] or '', vcpusMilli = tonumber(f[2] or '0'),
      usedVcpusMilli = tonumber(f[5] or '0'), memoryMiB = tonumber(f[3] or '0'),
      usedMemoryMiB = tonumber(f[6] or '0'), heldMemoryMiB = heldMem,
      maxSandboxes = tonumber(f[4] or '0'), sandboxes = tonumber(f[7] or '0'),
    }
    local fits = true
    for _, r in ipairs(rules) do
      if not rule_holds(r, v, a) then
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
  if best then return best, bestWarm end
  if alive == 0 then return nil, 0, 'no_nodes' end
  return nil, 0, 'full'
end

-- Reserves sandbox `id`'s share (vCPUs in milli-vCPU, memory in MiB, one sandbox) on `node`,
-- claims a warm slot of `template` when `warm` is 1, and records the node on the sandbox hash `sk`.
local function reserve(prefix, node, warm, sk, id, template, cpu, mem)
  local nk = prefix .. 'node:' .. node
  redis.call('HINCRBY', nk, 'usedVcpusMilli', cpu)
  redis.call('HINCRBY', nk, 'usedMemoryMiB', mem)
  redis.call('HINCRBY', nk, 'sandboxes', 1)
  if warm == 1 then
    redis.call('HINCRBY', nk .. ':warm', template, -1)
    -- the claimed slot's share now counts as this sandbox's until the node's next heartbeat
    local share = tonumber(redis.call('HGET', nk, 'warmSlotFootprintMiB') or '0')
    if share > 0 then redis.call('HINCRBY', nk, 'warmMemoryMiB', -share) end
  end
  redis.call('SADD', nk .. ':sandboxes', id)
  redis.call('HSET', sk, 'nodeId', node, 'fromWarmPool', tostring(warm), 'released', '0')
end
