-- Return a sandbox's reserved resources to its node, exactly once.
-- KEYS[1] sandbox hash; ARGV[1] key prefix
-- Returns 1 when released now, 0 when there was nothing to release.
local f = redis.call('HMGET', KEYS[1], 'nodeId', 'released', 'vcpus', 'memoryMiB', 'id')
local node = f[1]
if not node or node == '' or f[2] == '1' then return 0 end
local nk = ARGV[1] .. 'node:' .. node
redis.call('HINCRBY', nk, 'usedVcpusMilli', -math.floor(tonumber(f[3]) * 1000 + 0.5))
redis.call('HINCRBY', nk, 'usedMemoryMiB', -tonumber(f[4]))
redis.call('HINCRBY', nk, 'sandboxes', -1)
redis.call('SREM', nk .. ':sandboxes', f[5])
redis.call('HSET', KEYS[1], 'released', '1')
return 1
