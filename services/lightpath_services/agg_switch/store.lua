-- agg_switch's checks and ops (store.py builds the transactions). Keys are KEYS indices.

-- {"lock", lock key, command}: the model's update lock is free or this command's
if USES.lock then CHECKS.lock = function(c)
  local holder = call('GET', KEYS[c[2]])
  if not holder or holder == c[3] then return nil end
  return fail('MODEL_BUSY', 'another command updates the model', holder)
end end
-- {"idle", running key, stale before}: no command runs (the ones past their deadline and
-- grace period do not count)
if USES.idle then CHECKS.idle = function(c)
  local busy = call('ZRANGEBYSCORE', KEYS[c[2]], '(' .. c[3], '+inf', 'LIMIT', 0, 1)
  if #busy == 0 then return nil end
  return fail('TREE_BUSY', 'a command is running', busy[1])
end end
-- {"owner", model key, tenant}: a tenant writes a model only if it is new or its own
if USES.owner then CHECKS.owner = function(c)
  if call('EXISTS', KEYS[c[2]]) == 0 or (call('HGET', KEYS[c[2]], 'tenant') or '') == c[3] then
    return nil
  end
  return fail('MODEL_OWNED', 'the model is another tenant\'s', '')
end end

-- {"finish", command key, running key, lock key, missing key, aborts key, id, state, now,
--  failure, failure reason, spread (1: on the aborts stream), origin, {missing nodes}}:
-- RUNNING -> state once (RESULT.moved 1), freeing the model lock; a FAILED command also
-- records the nodes that never arrived.
if USES.finish then OPS.finish = function(o)
  local cmd, id = KEYS[o[2]], o[7]
  local state = call('HGET', cmd, 'state')
  RESULT.moved = 0
  if not state then return end
  if state == C.RUNNING then
    call('HSET', cmd, 'state', o[8], 'finished_at', o[9], 'failure', o[10], 'failure_reason', o[11])
    call('ZREM', KEYS[o[3]], id)
    if call('GET', KEYS[o[4]]) == id then call('DEL', KEYS[o[4]]) end
    call('EXPIRE', cmd, C.FINISHED_TTL_S)
    state = o[8]
    RESULT.moved = 1
    if o[12] == 1 then
      call('XADD', KEYS[o[6]], 'MAXLEN', '~', C.ABORTS_MAXLEN, '*', 'command', id,
        'reason', o[10], 'code', o[11], 'origin', o[13])
    end
  end
  if state == C.FAILED and #o[14] > 0 then
    call('SADD', KEYS[o[5]], unpack(o[14]))
    call('EXPIRE', KEYS[o[5]], C.FINISHED_TTL_S)
  end
end end
-- {"stale", running key, stale before}: forget the commands past their deadline and grace
if USES.stale then OPS.stale = function(o) call('ZREMRANGEBYSCORE', KEYS[o[2]], '-inf', o[3]) end end
-- {"model", model key, dtype, length, data (ARGV index), tenant}: the parameters; the first
-- writer's tenant owns the model. RESULT.version: the model's new version.
if USES.model then OPS.model = function(o)
  local k = KEYS[o[2]]
  call('HSETNX', k, 'tenant', o[6])
  call('HSET', k, 'dtype', o[3], 'length', o[4], 'data', ARGV[o[5]])
  RESULT.version = call('HINCRBY', k, 'version', 1)
end end
