-- The SONiC driver's read before a batch (sonic_driver.py): the run id, the
-- cross-connects matching ARGV[1] (a_side, b_side, ...), and of the ports a batch connects
-- (ARGV[2], a line "<name> <label>" each) those an operator force_blocked and those whose
-- label is not the one given.
local pairs, blocked, relabel = {}, {}, {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
  local row = redis.call('HMGET', k, 'a_side', 'b_side')
  pairs[#pairs + 1] = row[1]
  pairs[#pairs + 1] = row[2]
end
for name, label in string.gmatch(ARGV[2] or '', '([^ ]+) ([^\n]*)\n') do
  local row = redis.call('HMGET', 'OCS_PORT|' .. name, 'state', 'label')
  if row[1] == 'force_blocked' then blocked[#blocked + 1] = name end
  if label ~= '' and row[2] ~= label then relabel[#relabel + 1] = name end
end
return {string.match(redis.call('INFO', 'server'), 'run_id:(%w+)'), pairs, blocked, relabel}
