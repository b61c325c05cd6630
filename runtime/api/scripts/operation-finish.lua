-- Finish an operation exactly once: sets `succeeded` or `failed` only when it has not finished
-- yet and the caller's run is the latest one (operation-start.lua). A finished operation never
-- changes again.
-- KEYS[1] operation hash, KEYS[2] its pub/sub channel, KEYS[3] the operation queue stream
-- ARGV[1] final state, ARGV[2] run number of the caller, ARGV[3] now (ms), ARGV[4] TTL (s),
-- ARGV[5] error code ('' for none), ARGV[6] error message, ARGV[7] consumer group, ARGV[8] the
-- caller's queue entry id ('' = none)
-- Publishes the finished hash (HGETALL's flat field/value array, JSON) so long-pollers answer
-- without reading it back.
-- The caller's queue entry is acknowledged and deleted in the same step, whatever the outcome (the
-- entry is done with once this run has ended): a worker never holds an entry of an ended operation,
-- and an operation never ends with its entry still pending for another worker to run again.
-- Returns 1 when this call finished it, 0 when it was finished already or another run owns it.
if ARGV[8] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[7], ARGV[8])
  redis.call('XDEL', KEYS[3], ARGV[8])
end
local f = redis.call('HMGET', KEYS[1], 'state', 'run')
if not f[1] then return 0 end
if f[1] == 'succeeded' or f[1] == 'failed' then return 0 end
if (f[2] or '0') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updatedAt', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'errorCode', ARGV[5], 'errorMessage', ARGV[6]) end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('PUBLISH', KEYS[2], cjson.encode(redis.call('HGETALL', KEYS[1])))
return 1
