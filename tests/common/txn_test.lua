-- A store extension for tests/common/test_txn.py.
-- {"even", key, field}: the field's number is even
if USES.even then CHECKS.even = function(c)
  local v = tonumber(call("HGET", KEYS[c[2]], c[3]) or "0")
  if v % 2 == 0 then return nil end
  return fail("odd", c[3] .. " is odd", tostring(v))
end end
-- {"tally"}: every job of the "jobs" set counted, its hash's "n" times C.STRIDE
if USES.tally then OPS.tally = function(o)
  local total = 0
  for _, j in ipairs(call("SMEMBERS", key("jobs"))) do
    total = total + tonumber(call("HGET", member("job", j), "n") or "0") * C.STRIDE
  end
  RESULT.total = total
end end
-- {"sneak", key name}: a key built here, never declared
if USES.sneak then OPS.sneak = function(o) call("SET", o[2], "1") end end
-- {"sneak_bitop", declared key, key name}: BITOP into a declared key from one never declared
if USES.sneak_bitop then OPS.sneak_bitop = function(o) call("BITOP", "OR", KEYS[o[2]], o[3]) end end
-- {"text"}: C.TEXT, as a read
if USES.text then OPS.text = function(o) READS[#READS + 1] = C.TEXT end end
