-- The SONiC driver's batch write when the batch was planned on the table the driver last
-- knew, without a read (sonic_driver.py). One script, so Redis runs it whole with
-- nothing in between: it writes only if the switch is as planned for every pair the
-- batch touches, which makes it the batch's compare-and-set. ARGV[1]: the run id it was
-- planned under; ARGV[2]: the cross-connects it removes ("<a> <b>" a line), each must be
-- there; ARGV[3]: those it makes, both ports in no other cross-connect once those are
-- removed; ARGV[4]: the ports it connects with their labels ("<name> <label>" a line),
-- refused when an operator force_blocked one, relabelled where the label differs.
-- ARGV[5..7]: the batch's fence (lease id, token, how long its row is kept).
-- Answers {run id, 'ok'}, {run id, 'moved'} (nothing written), {run id, 'stale', newer
-- token} (nothing written) or {run id, 'blocked', name, ...} (nothing written).
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
if run_id ~= ARGV[1] then return {run_id, 'moved'} end
local seen = older_than_seen(ARGV[5], ARGV[6], ARGV[7])
if seen then return {run_id, 'stale', seen} end
local peer = {}
for _, k in ipairs(redis.call('KEYS', 'OCS_CROSS_CONNECT|*')) do
  local row = redis.call('HMGET', k, 'a_side', 'b_side')
  if row[1] and row[2] then
    peer[row[1]] = row[2]
    peer[row[2]] = row[1]
  end
end
local deletes, adds = {}, {}
for a, b in string.gmatch(ARGV[2], '([^ ]+) ([^\n]+)\n') do
  local key = 'OCS_CROSS_CONNECT|' .. a .. '-' .. b
  if peer[a] ~= b or redis.call('EXISTS', key) == 0 then return {run_id, 'moved'} end
  peer[a], peer[b] = nil, nil
  deletes[#deletes + 1] = key
end
for a, b in string.gmatch(ARGV[3], '([^ ]+) ([^\n]+)\n') do
  if peer[a] or peer[b] then return {run_id, 'moved'} end
  peer[a], peer[b] = b, a
  adds[#adds + 1] = {a, b}
end
local blocked, relabel = {run_id, 'blocked'}, {}
for name, label in string.gmatch(ARGV[4], '([^ ]+) ([^\n]*)\n') do
  local row = redis.call('HMGET', 'OCS_PORT|' .. name, 'state', 'label')
  if row[1] == 'force_blocked' then blocked[#blocked + 1] = name end
  if label ~= '' and row[2] ~= label then relabel[#relabel + 1] = {name, label} end
end
if #blocked > 2 then return blocked end
for _, key in ipairs(deletes) do redis.call('DEL', key) end
for _, ab in ipairs(adds) do
  redis.call('HSET', 'OCS_CROSS_CONNECT|' .. ab[1] .. '-' .. ab[2], 'a_side', ab[1], 'b_side', ab[2])
end
for _, nl in ipairs(relabel) do redis.call('HSET', 'OCS_PORT|' .. nl[1], 'label', nl[2]) end
return {run_id, 'ok'}
