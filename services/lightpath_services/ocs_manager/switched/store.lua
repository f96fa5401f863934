-- The switched store's checks and ops (store.py builds the transactions; txn.lua comes
-- first). Keys are KEYS indices; a bitmap travels as a blob (its ARGV index; 0: none).

-- {"fabric", fabric key, the record read before ("" = none)}: it is still that one
if USES.fabric then CHECKS.fabric = function(c)
  local cur = call('GET', KEYS[c[2]]) or ''
  if cur == c[3] then return nil end
  return fail('FABRIC_MOVED', 'the fabric record changed meanwhile', cur)
end end
-- {"set", key, value}
if USES.set then OPS.set = function(o) call('SET', KEYS[o[2]], o[3]) end end

-- tmp := the pod's bitmap without the bits the job's record holds now (its `field`)
local function rest(pod, job, field, tmp)
  local own = call('HGET', job, field)
  if own then
    call('SET', tmp, own)
    call('BITOP', 'NOT', tmp, tmp)
    call('BITOP', 'AND', tmp, tmp, pod)
  else
    call('BITOP', 'OR', tmp, pod, pod)
  end
end

-- {"free", pod bitmap, job record, field, tmp, tmp2, blob, reason}: the job's new bits
-- overlap none another job holds, else fail(reason) with how many do. Only the scratch
-- keys tmp and tmp2 are written (and deleted again).
if USES.free then CHECKS.free = function(c)
  local tmp, tmp2 = KEYS[c[5]], KEYS[c[6]]
  rest(KEYS[c[2]], KEYS[c[3]], c[4], tmp)
  call('SET', tmp2, ARGV[c[7]])
  call('BITOP', 'AND', tmp2, tmp2, tmp)
  local n = call('BITCOUNT', tmp2)
  call('DEL', tmp, tmp2)
  if n == 0 then return nil end
  return fail(c[8], c[4] .. ' of the plan are reserved by another job', tostring(n))
end end

-- {"bits", pod bitmap, job record, field, tmp, tmp2, blob}: the pod's bitmap without the
-- job's old bits, with its new ones (none when blob is 0)
if USES.bits then OPS.bits = function(o)
  local pod, tmp, tmp2 = KEYS[o[2]], KEYS[o[5]], KEYS[o[6]]
  rest(pod, KEYS[o[3]], o[4], tmp)
  if o[7] ~= 0 then
    call('SET', tmp2, ARGV[o[7]])
    call('BITOP', 'OR', pod, tmp, tmp2)
  else
    call('BITOP', 'OR', pod, tmp, tmp)
  end
  call('DEL', tmp, tmp2)
end end

-- {"record", job record, field, blob, field, blob, ...}: binary fields of the record
if USES.record then OPS.record = function(o)
  for i = 3, #o, 2 do call('HSET', KEYS[o[2]], o[i], ARGV[o[i + 1]]) end
end end
