-- The ocs_manager store's checks and ops (store.py builds the transactions; tables.lua
-- comes first). Keys are KEYS indices; `header` is lua.py's fabric_header.

-- {"fabric", fabric key, record}: the pod is still wired with this fabric
if USES.fabric then CHECKS.fabric = function(c)
  local cur = call('GET', KEYS[c[2]])
  if cur == c[3] then return nil end
  return fail('FABRIC_CHANGED', "the pod's stored fabric configuration differs", cur or '')
end end
-- {"stored", fabric key, {records ("" = none)}}: the record read before is still there
if USES.stored then CHECKS.stored = function(c)
  local cur = call('GET', KEYS[c[2]]) or ''
  if has(c[3], cur) then return nil end
  return fail('FABRIC_MOVED', 'the fabric record changed meanwhile', cur)
end end
-- {"unused", fabric key, record, slices, owner}: another fabric's record is replaced only
-- while nothing is wired on it (value: how many slices are)
if USES.unused then CHECKS.unused = function(c)
  local cur = call('GET', KEYS[c[2]])
  if not cur or cur == c[3] then return nil end
  local n = call('ZCARD', KEYS[c[4]])
  if n + call('HLEN', KEYS[c[5]]) == 0 then return nil end
  return fail('IN_USE', 'slices are wired on the stored fabric', tostring(n))
end end

-- a change in flight on a slice record: nil, or fail(BUSY, op) while its lease runs, or
-- fail(STALE, token) once it ran out (the caller takes it over and rolls it back)
local function in_flight(r_op, r_token, r_deadline)
  if not r_op then return nil end
  if now_ms() < tonumber(r_deadline) then return fail('BUSY', 'a change is in progress', r_op) end
  return fail('STALE', 'a change outlived its lease', r_token)
end
-- {"new_slice", record key, spec}: no such slice yet; else DIFFERENT (its spec), BUSY,
-- STALE, or SAME (its state: wiring | wired)
if USES.new_slice then CHECKS.new_slice = function(c)
  if call('EXISTS', KEYS[c[2]]) == 0 then return nil end
  local r = call('HMGET', KEYS[c[2]], 'spec', 'state', 'op', 'op_token', 'op_deadline')
  if r[1] ~= c[3] then return fail('DIFFERENT', 'wired with another placement', r[1] or '') end
  return in_flight(r[3], r[4], r[5]) or fail('SAME', 'already wired so', r[2] or '')
end end
-- {"idle", record key}: no change in flight (BUSY, STALE)
if USES.idle then CHECKS.idle = function(c)
  local r = call('HMGET', KEYS[c[2]], 'op', 'op_token', 'op_deadline')
  return in_flight(r[1], r[2], r[3])
end end
-- {"free", owner key, blocks...}: no block is claimed (value: "<block> <owner>")
if USES.free then CHECKS.free = function(c)
  for i = 3, #c do
    local o = call('HGET', KEYS[c[2]], c[i])
    if o then return fail('BLOCK_IN_USE', 'block ' .. c[i] .. ' is claimed', c[i] .. ' ' .. o) end
  end
  return nil
end end
-- {"replace", owner key, record key, job, failed, new}: `failed` is the slice's and `new`
-- free; REPLAYED (value: the spec) when this very replacement is done already
if USES.replace then CHECKS.replace = function(c)
  local owner, job, failed, new = KEYS[c[2]], c[4], c[5], c[6]
  if call('HGET', owner, failed) ~= job then
    local r = call('HMGET', KEYS[c[3]], 'spec', 'replaced')
    if r[2] == failed .. ':' .. new and call('HGET', owner, new) == job then
      return fail('REPLAYED', 'replaced already', r[1])
    end
    return fail('NOT_IN_SLICE', 'block ' .. failed .. ' is not in the slice', '')
  end
  local on = call('HGET', owner, new)
  if on then return fail('BLOCK_IN_USE', 'block ' .. new .. ' is claimed', new .. ' ' .. on) end
  return nil
end end
-- {"stale", record key, token}: the change `token` locked outlived its lease
if USES.stale then CHECKS.stale = function(c)
  local r = call('HMGET', KEYS[c[2]], 'op_token', 'op_deadline')
  if r[1] == c[3] and now_ms() >= tonumber(r[2]) then return nil end
  return fail('NOT_STALE', 'finished, or taken over', '')
end end

-- What CHECKS.tables found, for OPS.tables to write (parsed once).
local change = nil
-- {"tables", xc base, otm base, header, disconnect, connect, otm}: every port to remove is
-- cross-connected so, every port to add is free (or removed by this change, and given one
-- peer), every 1xK switch is where the change expects it (CONFLICT, naming it)
if USES.tables then CHECKS.tables = function(c)
  set_fabric(c[4])
  local touched = {}
  local rem = expand(c[5], c[2], touched)
  local add = expand(c[6], c[2], touched)
  local otm = expand_otm(c[7], c[3])
  local removing = {}
  local n_rem, n_add = 0, 0
  for idx, t in pairs(rem) do
    local cur = hmget(KEYS[idx], t.f)
    local set = {}
    for i = 1, #t.f do
      if cur[i] ~= t.p[i] then
        return fail('CONFLICT', port_of(t, t.f[i]) .. ' is not cross-connected to port ' .. t.p[i])
      end
      set[t.f[i]] = true
    end
    removing[idx] = set
    n_rem = n_rem + #t.f / 2 * axes[t.d + 1]
  end
  for idx, t in pairs(add) do
    local cur = hmget(KEYS[idx], t.f)
    local set = removing[idx] or {}
    local seen = {}
    for i = 1, #t.f do
      local f = t.f[i]
      if cur[i] and not set[f] then
        return fail('CONFLICT', port_of(t, f) .. ' is already cross-connected to port ' .. cur[i])
      end
      if seen[f] then
        return fail('CONFLICT', port_of(t, f) .. ' is given two cross-connects by this change')
      end
      seen[f] = true
    end
    n_add = n_add + #t.f / 2 * axes[t.d + 1]
  end
  for idx, t in pairs(otm) do
    local cur = hmget(KEYS[idx], t.f)
    for i = 1, #t.f do
      local want = t.before[i]
      if want < 0 then want = nil end
      if val(cur[i]) ~= want then
        return fail('CONFLICT', 'the 1xK switches of block ' .. t.f[i] .. ' along ' ..
          names[t.d + 1] .. ' are at ' .. (cur[i] and ('output ' .. cur[i]) or 'idle') ..
          ', not ' .. (want and ('output ' .. want) or 'idle'))
      end
    end
  end
  change = {rem = rem, add = add, otm = otm, touched = touched, n_rem = n_rem, n_add = n_add}
  return nil
end end

-- {"tables", versions key}: write what CHECKS.tables checked; every touched OCS table's
-- version + 1. RESULT: removed, added (cross-connect pairs, over every axis).
if USES.tables then OPS.tables = function(o)
  for idx, t in pairs(change.rem) do hdel(KEYS[idx], t.f) end
  for idx, t in pairs(change.add) do hset(KEYS[idx], t.f, t.p) end
  apply_otm(change.otm)
  local ids = {}
  for code in pairs(change.touched) do
    local d, k = math.floor(code / K), code % K
    local pre, suf = 'ocs-' .. names[d + 1] .. '-', '-' .. k
    for a = 0, axes[d + 1] - 1 do ids[#ids + 1] = pre .. a .. suf end
  end
  if #ids > 0 then
    local v = hmget(KEYS[o[2]], ids)
    for i = 1, #ids do v[i] = (tonumber(v[i]) or 0) + 1 end
    hset(KEYS[o[2]], ids, v)
  end
  RESULT.removed, RESULT.added = change.n_rem, change.n_add
end end
-- {"lock", record key, lease ms, fence counter key, field, value, ...}: the fields, a
-- lease from now and its token, the pod's fence counter + 1 (higher for every new holder:
-- the switches refuse a change under an older one). RESULT.token: that token.
if USES.lock then OPS.lock = function(o)
  local token = call('INCR', KEYS[o[4]])
  call('HSET', KEYS[o[2]], 'op_deadline', now_ms() + tonumber(o[3]), 'op_token', token, unpack(o, 5))
  RESULT.token = token
end end
-- {"unclaim", owner key, job, blocks...}: drop the job's claims on these blocks
if USES.unclaim then OPS.unclaim = function(o)
  for i = 4, #o do
    if call('HGET', KEYS[o[2]], o[i]) == o[3] then call('HDEL', KEYS[o[2]], o[i]) end
  end
end end
-- {"wired", record key}: the slice is wired, now
if USES.wired then OPS.wired = function(o)
  call('HSET', KEYS[o[2]], 'state', C.WIRED, 'wired_at', now_ms())
end end
-- {"fabric", fabric key, record, versions key, xc base, otm base, header, old keys...}:
-- record this fabric (dropping the old one's tables, CHECKS.unused allowing) and lay out
-- its tables. RESULT: status NEW | SAME | CHANGED, old (the record replaced, or "").
if USES.fabric then OPS.fabric = function(o)
  local cur = call('GET', KEYS[o[2]])
  RESULT.status, RESULT.old = 'SAME', cur or ''
  if not cur then
    RESULT.status = 'NEW'
  elseif cur ~= o[3] then
    for i = 8, #o do call('DEL', KEYS[o[i]]) end
    RESULT.status = 'CHANGED'
  end
  call('SET', KEYS[o[2]], o[3])
  set_fabric(o[7])
  init_layout(o[5], o[6])
  -- A field longer than 64 bytes keeps the versions a hash table: as a ziplist every
  -- commit's read and write of its OCS' versions would scan the list once per OCS.
  call('HSETNX', KEYS[o[4]], 'layout', 'OCS id -> version of its routing table, + 1 on every committed change')
end end
