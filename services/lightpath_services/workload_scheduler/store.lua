-- The workload scheduler's extension of services/lightpath_services/common/txn.lua (store.py has the keys).
-- Named keys: owner, failed, wired, free, freewired, wired_count (the indexes, issue 15),
-- and for the reads below the ones they name.

-- The indexes are kept when the free bitmap exists (rebuild_indexes makes it).
local indexed = false
if N.free then indexed = call("EXISTS", key("free")) == 1 end
local touched = {}

-- a wiring mark of `field` set to `job` (nil: removed): keep the per-job counts
local function mark(field, job)
  local old = call("HGET", key("wired"), field)
  if old == job then return end
  if old and call("HINCRBY", key("wired_count"), old, -1) <= 0 then
    call("HDEL", key("wired_count"), old)
  end
  if job then call("HINCRBY", key("wired_count"), job, 1) end
end
local function block_hash(o)
  return indexed and (o[2] == N.owner or o[2] == N.failed or o[2] == N.wired)
end

local hset, hdel = OPS.hset, OPS.hdel
if USES.hset then OPS.hset = function(o)
  if indexed and o[2] == N.wired then
    for i = 3, #o, 2 do mark(o[i], o[i + 1]) end
  end
  if block_hash(o) then
    for i = 3, #o, 2 do touched[o[i]] = true end
  end
  hset(o)
end end
if USES.hdel then OPS.hdel = function(o)
  if indexed and o[2] == N.wired then
    for i = 3, #o do mark(o[i], nil) end
  end
  if block_hash(o) then
    for i = 3, #o do touched[o[i]] = true end
  end
  hdel(o)
end end

-- {"notwhole", failed key, block}: healthy, or failed only in some hosts
if USES.notwhole then CHECKS.notwhole = function(c)
  local f = call("HGET", KEYS[c[2]], c[3])
  if f and not cjson.decode(f)["hosts"] then return fail("whole", "block " .. c[3] .. " failed", "") end
  return nil
end end

-- {"unwire", job}: drop every wiring mark of that job
if USES.unwire then OPS.unwire = function(o)
  local all = call("HGETALL", key("wired"))
  for i = 1, #all, 2 do
    if all[i + 1] == o[2] then
      call("HDEL", key("wired"), all[i])
      touched[all[i]] = true
    end
  end
  if indexed then call("HDEL", key("wired_count"), o[2]) end
end end

-- {"subfree", block, chip fields...}: the block leaves sub-block use once none of its
-- chips is held (the last sub-block slice on it left)
if USES.subfree then OPS.subfree = function(o)
  for i = 3, #o do
    if call("HEXISTS", key("owner"), o[i]) == 1 then return end
  end
  if call("HGET", key("owner"), o[2]) == C.SUB_BLOCK_OWNER then
    call("HDEL", key("owner"), o[2])
    touched[o[2]] = true
  end
end end

-- After the writes: the free bitmap and the marks on free blocks follow every block
-- field written in the owner / failed / wired hashes.
AFTER[#AFTER + 1] = function()
  if not indexed then return end
  for f, _ in pairs(touched) do
    local b = tonumber(f)
    if b then  -- a block (a SWITCHED pod's processors "t<g>.<i>.<j>" are not indexed)
      local free = call("HEXISTS", key("owner"), f) == 0 and call("HEXISTS", key("failed"), f) == 0
      call("SETBIT", key("free"), b, free and 1 or 0)
      local w = free and call("HGET", key("wired"), f)
      if w then call("HSET", key("freewired"), f, w) else call("HDEL", key("freewired"), f) end
    end
  end
end

-- "seq": the next admission sequence (INCR of key "seq"); "tip": the id of the newest
-- event (key "events"; "0-0" if none); "": 0
local function extra(what)
  if what == "seq" then return call("INCR", key("seq")) end
  if what ~= "tip" then return 0 end
  local last = call("XREVRANGE", key("events"), "+", "-", "COUNT", 1)
  return last[1] and last[1][1] or "0-0"
end

-- {"lean", "seq" | "tip" | "", job ids...}: what a decision that takes free blocks needs
-- (store.lean_snapshot), as one read; {0} when the index is missing
if USES.lean then OPS.lean = function(o)
  if call("EXISTS", key("free")) == 0 then READS[#READS + 1] = {0}; return end
  local more = extra(o[2])
  local fw = call("HGETALL", key("freewired"))
  local queued = call("HGETALL", key("queued"))
  local seen, named = {}, {}
  for i = 2, #fw, 2 do
    if not seen[fw[i]] then seen[fw[i]] = true; named[#named + 1] = fw[i] end
  end
  for i = 3, #o do
    if not seen[o[i]] then seen[o[i]] = true; named[#named + 1] = o[i] end
  end
  local jobs, marked = {}, {}
  for i = 1, #queued, 2 do
    if call("HEXISTS", key("wired_count"), queued[i]) == 1 then marked[#marked + 1] = queued[i] end
  end
  for _, j in ipairs(named) do
    local raw = call("HGET", key("live"), j)
    if raw then
      jobs[#jobs + 1] = j; jobs[#jobs + 1] = raw
      if call("HEXISTS", key("wired_count"), j) == 1 then marked[#marked + 1] = j end
    end
  end
  -- hex: a client that decodes replies as UTF-8 cannot take the raw bitmap
  local hex = (string.gsub(call("GET", key("free")) or "", ".", function(c)
    return string.format("%02x", string.byte(c))
  end))
  READS[#READS + 1] = {1, hex, fw, call("HKEYS", key("failed")), queued, jobs, marked, more}
end end

-- {"rebuild", block count}: derive the indexes from the owner / failed / wired / live hashes
if USES.rebuild then OPS.rebuild = function(o)
  local n = o[2]
  for _, name in ipairs({"free", "freewired", "wired_count", "queued", "running"}) do
    call("DEL", key(name))
  end
  call("SETBIT", key("free"), math.max(n - 1, 0), 0)
  for b = 0, n - 1 do
    local f = tostring(b)
    if call("HEXISTS", key("owner"), f) == 0 and call("HEXISTS", key("failed"), f) == 0 then
      call("SETBIT", key("free"), b, 1)
      local w = call("HGET", key("wired"), f)
      if w then call("HSET", key("freewired"), f, w) end
    end
  end
  local wired = call("HGETALL", key("wired"))
  for i = 2, #wired, 2 do call("HINCRBY", key("wired_count"), wired[i], 1) end
  local live = call("HGETALL", key("live"))
  for i = 1, #live, 2 do
    local st = cjson.decode(live[i + 1])["st"]
    if has(C.QUEUED_STATES, st) then call("HSET", key("queued"), live[i], live[i + 1]) end
    if st == C.RUNNING then call("ZADD", key("running"), 0, live[i]) end
  end
  indexed = false  -- written here in full: no hook to follow
end end

-- {"block", block}: {owner or "", 1 if failed else 0, the owner's live JSON or ""}
if USES.block then OPS.block = function(o)
  local owner = call("HGET", key("owner"), o[2])
  local raw = owner and call("HGET", key("live"), owner)
  READS[#READS + 1] = {owner or "", call("HEXISTS", key("failed"), o[2]), raw or ""}
end end

-- {"marks", HSCAN cursor, count}: {next cursor, block/job pairs, job/live JSON pairs}
if USES.marks then OPS.marks = function(o)
  local got = call("HSCAN", key("wired"), o[2], "COUNT", o[3])
  local marks, jobs, seen = got[2], {}, {}
  for i = 2, #marks, 2 do
    local j = marks[i]
    if not seen[j] then
      seen[j] = true
      local raw = call("HGET", key("live"), j)
      if raw then jobs[#jobs + 1] = j; jobs[#jobs + 1] = raw end
    end
  end
  READS[#READS + 1] = {got[1], marks, jobs}
end end

-- {"range", after ("" = from the first), upto ("" = to the last), job ids...}: the live JSON
-- of the RUNNING jobs with ids in (after, upto] and of the jobs named
if USES.range then OPS.range = function(o)
  local lo = o[2] == "" and "-" or "(" .. o[2]
  local hi = o[3] == "" and "+" or "[" .. o[3]
  local ids = call("ZRANGEBYLEX", key("running"), lo, hi)
  for i = 4, #o do ids[#ids + 1] = o[i] end
  local out = {}
  for _, j in ipairs(ids) do
    local raw = call("HGET", key("live"), j)
    if raw then out[#out + 1] = j; out[#out + 1] = raw end
  end
  READS[#READS + 1] = out
end end
