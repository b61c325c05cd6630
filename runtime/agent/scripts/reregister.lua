-- Re-register a sandbox this node runs and the control plane still wants, but whose reservation
-- is missing (released, or not listed on the node): reserve its resources on the node again.
-- Mirrors the reservation half of runtime/api/scripts/place.lua; a no-op when nothing is missing.
-- KEYS[1] sandbox hash, KEYS[2] node hash, KEYS[3] node's placed-sandboxes set
-- ARGV[1] node id
-- Returns 1 when the reservation was restored, 0 when there was nothing to do.
local f = redis.call('HMGET', KEYS[1], 'state', 'nodeId', 'released', 'vcpus', 'memoryMiB', 'id')
if not f[1] or f[2] ~= ARGV[1] then return 0 end
if f[1] == 'creating' or f[1] == 'killing' or f[1] == 'killed' then return 0 end
local listed = redis.call('SISMEMBER', KEYS[3], f[6]) == 1
if f[3] ~= '1' and listed then return 0 end
if f[3] == '1' or not listed then
  redis.call('HINCRBY', KEYS[2], 'usedVcpusMilli', math.floor(tonumber(f[4]) * 1000 + 0.5))
  redis.call('HINCRBY', KEYS[2], 'usedMemoryMiB', tonumber(f[5]))
  redis.call('HINCRBY', KEYS[2], 'sandboxes', 1)
  redis.call('SADD', KEYS[3], f[6])
  redis.call('HSET', KEYS[1], 'released', '0')
end
return 1
