-- The SONiC driver's batch write (sonic_driver.py), queued between MULTI and EXEC so
-- that it runs under the batch's WATCH: every delete (ARGV[1], "<a> <b>" a line), then
-- every create (ARGV[2]), then the labels of the ports it connects (ARGV[3], "<name>
-- <label>" a line). One queued command, not one per entry: the client parsed an answer
-- (QUEUED) per command, 66 for a full pod's switch, 48 times a wire. ARGV[4..6]: the
-- batch's fence (lease id, token, how long its row is kept): an older token than the
-- lease's last writes nothing and answers {'stale', newer token}.
local seen = older_than_seen(ARGV[4], ARGV[5], ARGV[6])
if seen then return {'stale', seen} end
for a, b in string.gmatch(ARGV[1], '([^ ]+) ([^\n]+)\n') do
  redis.call('DEL', 'OCS_CROSS_CONNECT|' .. a .. '-' .. b)
end
for a, b in string.gmatch(ARGV[2], '([^ ]+) ([^\n]+)\n') do
  redis.call('HSET', 'OCS_CROSS_CONNECT|' .. a .. '-' .. b, 'a_side', a, 'b_side', b)
end
for name, label in string.gmatch(ARGV[3], '([^ ]+) ([^\n]*)\n') do
  redis.call('HSET', 'OCS_PORT|' .. name, 'label', label)
end
return 1
