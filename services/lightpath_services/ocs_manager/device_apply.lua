-- KEYS: the device table hashes (d * K + k), then the device 1xK hashes (d), then the
-- switches' fences (lease -> highest token) and their refusal count.
-- ARGV: fabric header (7), disconnect, connect, otm, lease id ("" = unfenced), token.
-- Answers 1, or 0 when the fence is older than one seen (nothing applied).
set_fabric({unpack(ARGV, 1, 7)})
local xc_base, otm_base = 1, 1 + M * K
local ch = 8
local fences, refused = KEYS[#KEYS - 1], KEYS[#KEYS]
local lease, token = ARGV[ch + 3], tonumber(ARGV[ch + 4])
if lease ~= "" then
  local seen = tonumber(redis.call("HGET", fences, lease) or "0")
  if seen > token then
    redis.call("INCR", refused)
    return 0
  end
  redis.call("HSET", fences, lease, token)
end

-- disconnect: a pair that is connected goes dark (absolute: else nothing to do)
for idx, t in pairs(expand(ARGV[ch], xc_base)) do
  local cur = hmget(KEYS[idx], t.f)
  local f = {}
  for i = 1, #t.f do
    if cur[i] == t.p[i] then f[#f + 1] = t.f[i] end
  end
  hdel(KEYS[idx], f)
end

apply_otm(expand_otm(ARGV[ch + 2], otm_base))

-- connect: a port joins one peer, so an old peer of either port goes dark first
for idx, t in pairs(expand(ARGV[ch + 1], xc_base)) do
  local cur = hmget(KEYS[idx], t.f)
  local old = {}
  for i = 1, #t.f do
    local o = cur[i]
    if o and o ~= t.p[i] then old[#old + 1] = o end
  end
  hdel(KEYS[idx], old)
  hset(KEYS[idx], t.f, t.p)
end
return 1
