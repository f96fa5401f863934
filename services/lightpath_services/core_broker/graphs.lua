-- The graph metrics store's checks and ops (graphs.py builds the transactions). Keys are
-- KEYS indices; family "run": a run's hash, by run id.

-- {"owner", owner key, application}: the graph is nobody's yet or this application's
if USES.owner then CHECKS.owner = function(c)
  local o = call('GET', KEYS[c[2]])
  if not o or o == c[3] then return nil end
  return fail('denied', 'another application owns the graph', o)
end end
-- the oldest runs past the `keep` newest of the runs ZSET `k`
local function past(k, keep)
  local n = call('ZCARD', k)
  return n > keep and call('ZRANGE', k, 0, n - keep - 1) or {}
end
-- {"runs_declared", runs key, keep}: every run the trim may drop once one more is added
-- has its key declared (else C.UNDECLARED, value: their ids as JSON; the caller declares
-- them and retries)
if USES.runs_declared then CHECKS.runs_declared = function(c)
  local old = past(KEYS[c[2]], c[3] - 1)
  for _, run in ipairs(old) do
    if not (F.run and F.run[run]) then return fail(C.UNDECLARED, 'runs to drop', cjson.encode(old)) end
  end
  return nil
end end
-- {"setnx", key, value}: set it unless it is set
if USES.setnx then OPS.setnx = function(o) call('SET', KEYS[o[2]], o[3], 'NX') end end
-- {"trim", runs key, keep}: drop the runs past the `keep` newest. RESULT.kept: the runs kept.
if USES.trim then OPS.trim = function(o)
  local k = KEYS[o[2]]
  local old = past(k, o[3])
  for _, run in ipairs(old) do call('DEL', member('run', run)) end
  if #old > 0 then call('ZREMRANGEBYRANK', k, 0, #old - 1) end
  RESULT.kept = call('ZCARD', k)
end end
