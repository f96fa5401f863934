-- The emulated orchagent's write (sonic.py), one atomic command.
-- ARGV[1]: JSON [keys to delete, [[key, field, value, ...], ...] to HSET]
local w = cjson.decode(ARGV[1])
for _, k in ipairs(w[1]) do redis.call('DEL', k) end
for _, row in ipairs(w[2]) do redis.call('HSET', unpack(row)) end
return #w[1] + #w[2]
