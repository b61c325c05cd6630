-- Place a sandbox on a node: pick a node that takes it under the placement rules (ARGV[8], from
-- placement.ts PLACEMENT_RULES: alive, schedulable, holds the template, reads the store asked for,
-- runs a driver that can run the shape, has room), preferring one with a warm slot of the
-- template, then the least loaded; reserve its resources in the same step (placement-lib.lua,
-- loaded in front of this script). A create is placed at admission (admit.lua); this places a
-- hibernated sandbox's resume, and finds a create's node again.
-- Idempotent: a sandbox already placed keeps its node.
-- KEYS[1] node index set, KEYS[2] sandbox hash
-- ARGV[1] key prefix, ARGV[2] sandbox id, ARGV[3] template, ARGV[4] vCPUs in milli-vCPU,
-- ARGV[5] memory MiB, ARGV[6] comma-separated drivers that can run this shape (core/drivers.ts),
-- ARGV[7] hibernation store the node must read ('' = any; a hibernated sandbox resumes only where
-- its snapshot is readable), ARGV[8] the placement rules (JSON array; see placement.ts),
-- ARGV[9..12] the API's last Redis outage: began, ended, now (epoch ms), the alive TTL (ms)
-- (store-outage.ts; missing: none seen)
-- Returns { nodeId, fromWarm (0/1), node URL, node alive (0/1) } or { '', reason } with reason
-- 'no_nodes' | 'full'. A new placement is always on an alive node; a sandbox placed before keeps
-- its node, alive or not (the caller then waits for it or gives up). The URL and liveness spare the
-- caller a read of the node before it dispatches there. Alive follows the outage rule: a node's key
-- that expired while Redis was away is not its death.
local placed = redis.call('HGET', KEYS[2], 'nodeId')
local prefix, id, template = ARGV[1], ARGV[2], ARGV[3]
local outage = outage_of(ARGV[9], ARGV[10], ARGV[11], ARGV[12])
if placed and placed ~= '' then
  local nk = prefix .. 'node:' .. placed
  return { placed, tonumber(redis.call('HGET', KEYS[2], 'fromWarmPool') or '0'),
    redis.call('HGET', nk, 'url') or '', node_up(nk, outage) and 1 or 0 }
end
local cpu, mem = tonumber(ARGV[4]), tonumber(ARGV[5])
local best, warm, why = pick_node(prefix, KEYS[1], template, ARGV[6], ARGV[7], cpu, mem,
  cjson.decode(ARGV[8]), outage)
if not best then return { '', why } end
reserve(prefix, best, warm, KEYS[2], id, template, cpu, mem)
return { best, warm, redis.call('HGET', prefix .. 'node:' .. best, 'url') or '', 1 }
