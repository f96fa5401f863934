-- The common part of every store's transaction script (services/lightpath_services/common/txn.py says how
-- a script is made of this file, the store's extension file and its constants `C`).
-- ARGV[1]: {"c": checks, "o": ops, "n": {name: KEYS index}, "f": {family: {id: KEYS index}}}.
-- Every key is declared: a check or an op names its keys by KEYS index, a named key or a
-- member of a family; none is built here. Checks run first and write nothing; the first
-- that fails answers {0, reason, message, value}, and then nothing is written. Otherwise
-- the ops run in order, then the AFTER hooks, and the answer is {1, reads, named values}.
local tx = cjson.decode(ARGV[1])
local N, F = tx.n or {}, tx.f or {}
local CHECKS, OPS, AFTER, RESULT, READS = {}, {}, {}, {}, {}
local DECLARED = {}
for _, k in ipairs(KEYS) do DECLARED[k] = true end
-- The checks and ops this Txn uses: only they are defined ("if USES.x then ..."), as every
-- call runs this whole file again and each definition costs a little.
local USES = {}
for _, c in ipairs(tx.c or {}) do USES[c[1]] = true end
for _, o in ipairs(tx.o or {}) do USES[o[1]] = true end

-- Every command goes through `call` (extensions too: never redis.call), which refuses a key
-- that is not declared: tests run every script this way, so none builds a key name.
-- BITOP names its keys after the operation: each of them is checked.
local function call(command, k, ...)
  if command == "BITOP" then
    for _, key in ipairs({...}) do
      if not DECLARED[key] then error("txn: BITOP on undeclared key " .. tostring(key)) end
    end
  elseif not DECLARED[k] then
    error("txn: " .. command .. " on undeclared key " .. tostring(k))
  end
  return redis.call(command, k, ...)
end

-- Redis' clock in ms: one clock for every replica (leases, deadlines).
local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function key(name)
  local i = N[name]
  if not i then error("txn: key " .. name .. " was not declared") end
  return KEYS[i]
end
local function member(family, id)
  local i = F[family] and F[family][id]
  if not i then error("txn: no key declared for " .. family .. " " .. id) end
  return KEYS[i]
end
local function has(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end
local function fail(reason, message, value)
  return {reason, message ~= "" and message or reason, value or ""}
end
-- "{}" in a check's message stands for the value found.
local function say(message, value)
  return (string.gsub(message, "{}", function() return value end))
end

-- Checks: nil when they hold, else fail(...).
-- {"is", key, field, allowed values ("" = absent), reason, message, message when absent}
if USES.is then CHECKS.is = function(c)
  local v = call("HGET", KEYS[c[2]], c[3]) or ""
  if has(c[4], v) then return nil end
  return fail(c[5], say(v == "" and c[7] ~= "" and c[7] or c[6], v), v)
end end
-- {"has", key, field, 1 (present) | 0 (absent), reason, message}
if USES.has then CHECKS.has = function(c)
  if call("HEXISTS", KEYS[c[2]], c[3]) == c[4] then return nil end
  return fail(c[5], c[6], "")
end end
-- {"nokey", key, reason, message}: the key does not exist (an empty set, zset or hash)
if USES.nokey then CHECKS.nokey = function(c)
  if call("EXISTS", KEYS[c[2]]) == 0 then return nil end
  return fail(c[3], c[4], "")
end end
-- {"num", key, field, "<=" | ">=" | "<" | ">", bound, reason, message}: the field (absent:
-- 0) compared with the bound
if USES.num then CHECKS.num = function(c)
  local v = tonumber(call("HGET", KEYS[c[2]], c[3]) or "0") or 0
  local b, op, ok = tonumber(c[5]), c[4], false
  if op == "<=" then ok = v <= b elseif op == ">=" then ok = v >= b
  elseif op == "<" then ok = v < b elseif op == ">" then ok = v > b end
  if ok then return nil end
  return fail(c[6], say(c[7], tostring(v)), tostring(v))
end end
-- {"declared", set key, {families}, guard set key or 0, guard member}: every member of the
-- set has its key declared in each family (when the guard member is in the guard set, if
-- one is given), else "undeclared" (message: the set's KEYS index) with its members: the
-- caller declares them and retries.
if USES.declared then CHECKS.declared = function(c)
  if c[4] ~= 0 and call("SISMEMBER", KEYS[c[4]], c[5]) == 0 then return nil end
  local all = call("SMEMBERS", KEYS[c[2]])
  for _, m in ipairs(all) do
    for _, fam in ipairs(c[3]) do
      if not (F[fam] and F[fam][m]) then return fail("undeclared", tostring(c[2]), cjson.encode(all)) end
    end
  end
  return nil
end end
-- {"fence", key, lease id, token}: no higher token of the lease is recorded (a newer
-- holder wrote: STALE_LEASE, value the newer token)
if USES.fence then CHECKS.fence = function(c)
  local seen = tonumber(call("HGET", KEYS[c[2]], c[3]) or "0") or 0
  if seen <= c[4] then return nil end
  return fail("STALE_LEASE", "lease " .. c[3] .. " has a newer holder (token " .. seen ..
    ", this write's " .. c[4] .. ")", tostring(seen))
end end

-- Ops: writes, and reads whose answers come back in order (READS) or by name (RESULT).
if USES.hset then OPS.hset = function(o) call("HSET", KEYS[o[2]], unpack(o, 3)) end end
if USES.hdel then OPS.hdel = function(o) call("HDEL", KEYS[o[2]], unpack(o, 3)) end end
if USES.hincr then OPS.hincr = function(o) call("HINCRBY", KEYS[o[2]], o[3], o[4]) end end
if USES.zadd then OPS.zadd = function(o) call("ZADD", KEYS[o[2]], o[3], o[4]) end end
if USES.zrem then OPS.zrem = function(o) call("ZREM", KEYS[o[2]], o[3]) end end
if USES.sadd then OPS.sadd = function(o) call("SADD", KEYS[o[2]], o[3]) end end
if USES.srem then OPS.srem = function(o) call("SREM", KEYS[o[2]], o[3]) end end
if USES.del then OPS.del = function(o) call("DEL", KEYS[o[2]]) end end
if USES.setpx then OPS.setpx = function(o) call("SET", KEYS[o[2]], o[3], "PX", o[4]) end end
if USES.expire then OPS.expire = function(o) call("EXPIRE", KEYS[o[2]], o[3]) end end
-- {"fence", key, lease id, token}: record the lease's token, the highest seen
if USES.fence then OPS.fence = function(o)
  local seen = tonumber(call("HGET", KEYS[o[2]], o[3]) or "0") or 0
  if o[4] > seen then call("HSET", KEYS[o[2]], o[3], o[4]) end
end end
-- {"xadd", stream key, maxlen, field, value, ...}
if USES.xadd then OPS.xadd = function(o) call("XADD", KEYS[o[2]], "MAXLEN", "~", o[3], "*", unpack(o, 4)) end end

-- A job's transition: numbered by the job hash's "nev", appended to its history list and
-- to the stream with `extra` fields before "e" (the event's JSON, "n" added) — or, when
-- `brief`, before "n" only (the event is then stored once, in the history).
local function job_event(jk, hk, sk, maxlen, e, extra, brief)
  e["n"] = call("HINCRBY", jk, "nev", 1)
  local s = cjson.encode(e)
  call("RPUSH", hk, s)
  local fields = {}
  for _, x in ipairs(extra) do fields[#fields + 1] = x end
  fields[#fields + 1] = brief and "n" or "e"
  fields[#fields + 1] = brief and e["n"] or s
  call("XADD", sk, "MAXLEN", "~", maxlen, "*", unpack(fields))
end
-- {"event", job key, history key, stream key, maxlen, event JSON, {extra stream fields}}
if USES.event then OPS.event = function(o) job_event(KEYS[o[2]], KEYS[o[3]], KEYS[o[4]], o[5], cjson.decode(o[6]), o[7]) end end

local READABLE = USES.read and {HMGET = true, HGETALL = true, HGET = true, LRANGE = true, ZCARD = true,
  SCARD = true, SMEMBERS = true, INCR = true, GET = true, EXISTS = true}
-- {"read", command, key, args...}: the command's answer, appended to the reads
if USES.read then OPS.read = function(o)
  if not READABLE[o[2]] then error("txn: " .. o[2] .. " is not a read") end
  READS[#READS + 1] = call(o[2], KEYS[o[3]], unpack(o, 4))
end end

local function run()
  for _, c in ipairs(tx.c or {}) do
    local check = CHECKS[c[1]]
    if not check then error("txn: no check " .. c[1]) end
    local bad = check(c)
    if bad then return {0, bad[1], bad[2], bad[3]} end
  end
  for _, o in ipairs(tx.o or {}) do
    local op = OPS[o[1]]
    if not op then error("txn: no op " .. o[1]) end
    op(o)
  end
  for _, hook in ipairs(AFTER) do hook() end
  local named = {}
  for k, v in pairs(RESULT) do named[#named + 1] = k; named[#named + 1] = v end
  return {1, READS, named}
end
