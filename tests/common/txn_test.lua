-- A store extension for tests/common/test_txn.py.
-- {"even", key, field}: the field's number is even
CHECKS.even = function(c)
  local v = tonumber(call("HGET", KEYS[c[2]], c[3]) or "0")
  if v % 2 == 0 then return nil end
  return fail("odd", c[3] .. " is odd", tostring(v))
end
-- {"tally"}: every job of the "jobs" set counted, its hash's "n" times C.STRIDE
OPS.tally = function(o)
  local total = 0
  for _, j in ipairs(call("SMEMBERS", key("jobs"))) do
    total = total + tonumber(call("HGET", member("job", j), "n") or "0") * C.STRIDE
  end
  RESULT.total = total
end
-- {"sneak", key name}: a key built here, never declared
OPS.sneak = function(o) call("SET", o[2], "1") end
