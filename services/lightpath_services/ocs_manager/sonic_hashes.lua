-- The SONiC driver's read of many hashes in one command (sonic_driver.py): the switch's
-- Redis run id (its boot id), then HMGET ARGV of every key in KEYS, flattened.
local out = {string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')}
for _, k in ipairs(KEYS) do
  local row = redis.call('HMGET', k, unpack(ARGV))
  for i = 1, #ARGV do out[#out + 1] = row[i] end
end
return out
