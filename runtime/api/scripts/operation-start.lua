-- Start (or restart) a run of an operation: refuses a finished one, otherwise moves it to
-- `running` and hands the caller a new fencing token (the run number). Only the run holding the
-- latest token may finish the operation (operation-finish.lua), so a run that was presumed dead
-- and reclaimed can never overwrite what the newer run decided.
-- KEYS[1] operation hash, KEYS[2] its pub/sub channel; ARGV[1] now (ms), ARGV[2] owner (worker id)
-- Returns {run number (>= 1), field, value, ...} (the operation as it is now, so the worker need
-- not read it first), {0} when the operation is already finished, {-1} when it is unknown.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-1} end
if state == 'succeeded' or state == 'failed' then return {0} end
local run = redis.call('HINCRBY', KEYS[1], 'run', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[2], 'updatedAt', ARGV[1])
redis.call('PUBLISH', KEYS[2], 'running')
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, run)
return out
