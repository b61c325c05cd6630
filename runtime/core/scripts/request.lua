-- Ask for a pause or a resume: returns the operation already under way for that kind, or writes
-- and queues a new one, in one step (so racing requests share one operation).
-- KEYS[1] sandbox:<id> hash, KEYS[2] operations queue stream
-- ARGV[1] key prefix, ARGV[2] kind (sandbox.pause | sandbox.resume), ARGV[3] new operation id,
-- ARGV[4] now (ms), ARGV[5] args JSON
-- Returns { operation id ('' when refused), sandbox state ('' when absent), 1 if new else 0 }.
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return { '', '', 0 } end
if state == 'creating' or state == 'killing' or state == 'killed' then return { '', state, 0 } end
local field = 'pauseOperationId'
if ARGV[2] == 'sandbox.resume' then field = 'resumeOperationId' end
local prior = redis.call('HGET', KEYS[1], field)
if prior and prior ~= '' then
  local ps = redis.call('HGET', ARGV[1] .. 'operation:' .. prior, 'state')
  if ps == 'pending' or ps == 'running' then return { prior, state, 0 } end
end
local id, now = ARGV[3], ARGV[4]
redis.call('HSET', ARGV[1] .. 'operation:' .. id, 'id', id, 'kind', ARGV[2],
  'target', redis.call('HGET', KEYS[1], 'id'), 'state', 'pending', 'args', ARGV[5],
  'createdAt', now, 'updatedAt', now, 'team', redis.call('HGET', KEYS[1], 'team') or '')
redis.call('XADD', KEYS[2], '*', 'id', id)
redis.call('HSET', KEYS[1], field, id)
return { id, state, 1 }
