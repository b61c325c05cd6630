-- Start (or restart) a run of an operation: refuses a finished one, otherwise moves it to
-- `running` and hands the caller a new fencing token (the run number). Only the run holding the
-- latest token may finish the operation (operation-finish.lua), so a run that was presumed dead
-- and reclaimed can never overwrite what the newer run decided.
-- KEYS[1] operation hash, KEYS[2] its pub/sub channel; ARGV[1] now (ms), ARGV[2] owner (worker id),
-- ARGV[3] key prefix
-- Returns {run number (>= 1), {field, value, ...}, {field, value, ...}}: the operation as it is now
-- and, for a `sandbox.*` operation, its target sandbox's hash as it is now (empty when there is
-- none), so the worker reads neither before it acts; {0} when the operation is already finished,
-- {-1} when it is unknown.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-1} end
if state == 'succeeded' or state == 'failed' then return {0} end
local run = redis.call('HINCRBY', KEYS[1], 'run', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[2], 'updatedAt', ARGV[1])
redis.call('PUBLISH', KEYS[2], 'running')
local op = redis.call('HGETALL', KEYS[1])
local target = {}
local kind = redis.call('HGET', KEYS[1], 'kind') or ''
if string.sub(kind, 1, 8) == 'sandbox.' then
  target = redis.call('HGETALL', ARGV[3] .. 'sandbox:' .. (redis.call('HGET', KEYS[1], 'target') or ''))
end
return { run, op, target }
