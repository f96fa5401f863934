-- The routing tables and 1xK states in Redis (lua.py describes the layout), shared by the
-- store's transactions (store.lua) and the default switch driver (driver.py). Commands go
-- through `call` (txn.lua's, which refuses an undeclared key; device.lua's for the driver).
local function nums(s)
  local t = {}
  for n in string.gmatch(s, '-?%d+') do t[#t + 1] = tonumber(n) end
  return t
end
local function words(s)
  local t = {}
  for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
  return t
end

-- The fabric, from the header lua.py's fabric_header makes: K, axes per dimension,
-- (port and axis strides), dimension names.
local K, axes, names, M
local function set_fabric(h)
  K, axes, names = tonumber(h[1]), nums(h[2]), words(h[5])
  M = #axes
end

-- a stored value -> number, or nil for a missing field (dark port, idle switch)
local function val(v)
  if not v or v == '' then return nil end
  return tonumber(v)
end

-- links "d k pa pb" -> {key index -> {f = fields, p = peers}} (both directions, as the
-- argument's own decimal strings); `touched` collects d * K + k of every link (all the
-- OCS of d's axes with that k).
local function expand(s, base, touched)
  local g = {}
  local w = words(s)
  for i = 1, #w, 4 do
    local d, k, pa, pb = tonumber(w[i]), tonumber(w[i + 1]), w[i + 2], w[i + 3]
    local idx = base + d * K + k
    local t = g[idx]
    if not t then t = {f = {}, p = {}, d = d, k = k}; g[idx] = t end
    local f, p = t.f, t.p
    local n = #f
    f[n + 1] = pa; p[n + 1] = pb
    f[n + 2] = pb; p[n + 2] = pa
    if touched then touched[d * K + k] = true end
  end
  return g
end

-- where a table field is, for messages: "port 17 of ocs-x-{0..15}-0"
local function port_of(t, field)
  return 'port ' .. field .. ' of ocs-' .. names[t.d + 1] .. '-{0..' .. (axes[t.d + 1] - 1) ..
    '}-' .. t.k
end

-- 1xK groups "d block before after" -> {key index -> {f, before, after, d}} (-1 = idle)
local function expand_otm(s, base)
  local g = {}
  local w = nums(s)
  for i = 1, #w, 4 do
    local d = w[i]
    local idx = base + d
    local t = g[idx]
    if not t then t = {f = {}, before = {}, after = {}, d = d}; g[idx] = t end
    local n = #t.f + 1
    t.f[n] = w[i + 1]; t.before[n] = w[i + 2]; t.after[n] = w[i + 3]
  end
  return g
end

local CHUNK = 3000  -- stay well under Lua's unpack limit
local function hmget(key, f)
  if #f == 0 then return {} end
  if #f <= CHUNK then return call('HMGET', key, unpack(f)) end
  local out = {}
  for i = 1, #f, CHUNK do
    local part = call('HMGET', key, unpack(f, i, math.min(#f, i + CHUNK - 1)))
    for x = 1, #part do out[#out + 1] = part[x] end
  end
  return out
end
local function hset(key, f, v)
  for i = 1, #f, CHUNK do
    local kv = {}
    for x = i, math.min(#f, i + CHUNK - 1) do kv[#kv + 1] = f[x]; kv[#kv + 1] = v[x] end
    call('HSET', key, unpack(kv))
  end
end
local function hdel(key, f)
  for i = 1, #f, CHUNK do
    call('HDEL', key, unpack(f, i, math.min(#f, i + CHUNK - 1)))
  end
end
-- apply 1xK groups: set the output, or drop the field for idle
local function apply_otm(groups)
  for idx, t in pairs(groups) do
    local sf, sv, idle = {}, {}, {}
    for i = 1, #t.f do
      if t.after[i] < 0 then idle[#idle + 1] = t.f[i]
      else sf[#sf + 1] = t.f[i]; sv[#sv + 1] = t.after[i] end
    end
    hdel(KEYS[idx], idle)
    hset(KEYS[idx], sf, sv)
  end
end

-- Every hash carries a `layout` field, so it outlives its last entry; its value is
-- longer than 64 bytes (Redis' hash-max-ziplist-value / -listpack-value), so the hash
-- is a hash table from the start, however few cross-connects it holds.
local function init_layout(xc_base, otm_base)
  for i = xc_base, xc_base + M * K - 1 do
    call('HSET', KEYS[i], 'layout', 'routing tables of every axis: field port -> ' ..
      'peer port, both directions; a dark port has no field')
  end
  if K > 1 then
    for d = 0, M - 1 do
      call('HSET', KEYS[otm_base + d], 'layout', '1xK switches of every axis: field ' ..
        'block -> output they are set to; an idle switch has no field')
    end
  end
end
