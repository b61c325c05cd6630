-- Finish an operation exactly once: sets `succeeded` or `failed` only when it has not finished
-- yet and the caller's run is the latest one (operation-start.lua). A finished operation never
-- changes again.
-- KEYS[1] operation hash, KEYS[2] its pub/sub channel
-- ARGV[1] final state, ARGV[2] run number of the caller, ARGV[3] now (ms), ARGV[4] TTL (s),
-- ARGV[5] error code ('' for none), ARGV[6] error message
-- Publishes the finished hash (HGETALL's flat field/value array, JSON) so long-pollers answer
-- without reading it back.
-- Returns 1 when this call finished it, 0 when it was finished already or another run owns it.
local f = redis.call('HMGET', KEYS[1], 'state', 'run')
if not f[1] then return 0 end
if f[1] == 'succeeded' or f[1] == 'failed' then return 0 end
if (f[2] or '0') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'updatedAt', ARGV[3])
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'errorCode', ARGV[5], 'errorMessage', ARGV[6]) end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
redis.call('PUBLISH', KEYS[2], cjson.encode(redis.call('HGETALL', KEYS[1])))
return 1
