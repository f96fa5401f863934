-- The SONiC driver's settling read (sonic_driver.py): the run id, then which of the ports
-- still settling (ARGV[1], "<name> <status> <peer>" a line each, the end state it waits
-- for) are not there yet; "!<name>" when one read `failed`.
local out = {string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')}
for name, goal, peer in string.gmatch(ARGV[1], '([^ ]+) ([^ ]+) ([^\n]*)\n') do
  local row = redis.call('HMGET', 'OCS_PORT|' .. name, 'status', 'target_simplex_port_id')
  if row[1] == 'failed' then
    out[#out + 1] = '!' .. name
  elseif row[1] ~= goal or (row[2] or '') ~= peer then
    out[#out + 1] = name
  end
end
return out
