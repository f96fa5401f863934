-- The emulated orchagent's read (sonic.py): the cross-connects matching ARGV[1] (key,
-- a_side, b_side, ...) and the state of each port named in ARGV[2] (space-separated).
local xcs, states = {}, {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local row = redis.call('HMGET', k, 'a_side', 'b_side')
  xcs[#xcs + 1] = k
  xcs[#xcs + 1] = row[1]
  xcs[#xcs + 1] = row[2]
end
for name in string.gmatch(ARGV[2], '[^ ]+') do
  states[#states + 1] = redis.call('HGET', 'OCS_PORT|' .. name, 'state') or ''
end
return {xcs, states}
