-- Read every registered node in one step: the node list answers in one round trip however many
-- nodes there are (it was one for the index, then one more for the nodes).
-- KEYS[1] node index set; ARGV[1] key prefix
-- Returns { id, alive (0/1), { registration field, value, ... }, { template, warm slots, ... }, ... }
-- in id order; a node in the index whose registration is gone is left out.
local ids = redis.call('SMEMBERS', KEYS[1])
table.sort(ids)
local out = {}
for _, id in ipairs(ids) do
  local nk = ARGV[1] .. 'node:' .. id
  local h = redis.call('HGETALL', nk)
  if #h > 0 then
    table.insert(out, id)
    table.insert(out, redis.call('EXISTS', nk .. ':alive'))
    table.insert(out, h)
    table.insert(out, redis.call('HGETALL', nk .. ':warm'))
  end
end
return out
