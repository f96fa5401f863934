-- The core broker store's checks and ops (store.py builds the transactions). Named keys:
-- changes (the stream), version, cores, devices, timers, all-res, latency; families: res
-- (a reservation's record), app (an application's index), alloc (a device's allocations,
-- ZSET of C.MEMBER scored by start). A change appends its capacity deltas to `deltas` and
-- its events to `events`; "publish" bumps nothing itself: it writes one stream entry when
-- something was changed (`bump`).

local function parse(member, start)
  local e, c = string.match(member, "^[^:]+:%d+:(%d+):(%d+)$")
  return {tonumber(start), tonumber(e), tonumber(c)}
end
-- intervals {s, e, c} of the allocation ZSET `k` overlapping [lo, hi)
local function existing(k, lo, hi)
  local out = {}
  local raw = call("ZRANGEBYSCORE", k, "-inf", "(" .. string.format("%d", hi), "WITHSCORES")
  for i = 1, #raw, 2 do
    local iv = parse(raw[i], raw[i + 1])
    if iv[2] > lo then out[#out + 1] = iv end
  end
  return out
end
-- most cores in use at any instant of [s, e) among intervals `ivs`
local function peak(ivs, s, e)
  local best = 0
  local pts = {s}
  for _, v in ipairs(ivs) do
    if v[1] > s and v[1] < e then pts[#pts + 1] = v[1] end
  end
  for _, t in ipairs(pts) do
    local sum = 0
    for _, v in ipairs(ivs) do
      if v[1] <= t and t < v[2] then sum = sum + v[3] end
    end
    if sum > best then best = sum end
  end
  return best
end
-- the first instant of [s, e) at which `ivs` need more than `cores`, or nil
local function first_over(ivs, s, e, cores)
  local pts = {s}
  for _, v in ipairs(ivs) do if v[1] > s and v[1] < e then pts[#pts + 1] = v[1] end end
  table.sort(pts)
  for _, t in ipairs(pts) do
    local sum = 0
    for _, v in ipairs(ivs) do if v[1] <= t and t < v[2] then sum = sum + v[3] end end
    if sum > cores then return t end
  end
  return nil
end
local function fmt(n) return string.format("%d", n) end
local version = nil
local deltas, events = {}, {}
local function bump()
  if not version then version = call("INCR", key("version")) end
  return version
end
-- the allocation ZSET of `dev`, or nil when the caller did not declare it
local function alloc(dev)
  local i = F.alloc and F.alloc[dev]
  return i and KEYS[i]
end

-- {"publish", maxlen}: the stream entry of this change, if it changed anything.
-- RESULT: version (0: nothing changed), sid (its entry), current (the store's version).
if USES.publish then OPS.publish = function(o)
  RESULT.version, RESULT.sid = version or 0, ""
  if version then
    local d = #deltas > 0 and cjson.encode(deltas) or "[]"
    local ev = #events > 0 and cjson.encode(events) or "[]"
    RESULT.sid = call("XADD", key("changes"), "MAXLEN", "~", o[2], "*", "v", version, "ops", d, "ev", ev)
  end
  RESULT.current = tonumber(call("GET", key("version")) or "0")
end end

-- {"reserve", now, tickets, seen version ("" = unknown), seen stream id}
-- tickets: [{ids: [id, ...], groups: [[reservation, ...], ...]}, ...]; reservation: {id,
-- app, data, created, due, started, parts: [[device, cores, start, end, member], ...]}.
-- RESULT.tickets: per ticket "exists:<id>" (nothing of it written) or {"-", then "ok" |
-- "conflict:<device>" per group}; RESULT.rechecked: 1 if any schedule was read.
-- The decisions were made on the seen version; only devices whose schedules may have filled
-- since are re-checked: none when the store is still at that version and stream entry
-- (compare-and-set), else those that the stream's entries since then add to (a removal only
-- frees cores). Every device is re-checked when those entries cannot be read whole (more
-- than C.MAX_UNSEEN of them, trimmed, or not consecutive) or one changes a device's record.
if USES.reserve then OPS.reserve = function(o)
  local tickets, out = o[3], {}
  local filled = nil -- devices to re-check (a set); nil: every device
  if o[4] ~= "" then
    local seen = tonumber(o[4])
    local cur = tonumber(call("GET", key("version")) or "0")
    if cur == seen then
      local last = call("XREVRANGE", key("changes"), "+", "-", "COUNT", 1)
      if (last[1] and last[1][1] or "0-0") == o[5] then filled = {} end
    elseif cur > seen and cur - seen <= C.MAX_UNSEEN then
      local entries = call("XRANGE", key("changes"), "(" .. o[5], "+", "COUNT", cur - seen)
      if #entries == cur - seen then
        filled = {}
        for i, e in ipairs(entries) do
          local f = {}
          for j = 1, #e[2], 2 do f[e[2][j]] = e[2][j + 1] end
          if tonumber(f.v) ~= seen + i then filled = nil; break end
          for _, op in ipairs(cjson.decode(f.ops)) do
            if op[1] == "+" then filled[op[2]] = true
            elseif op[1] == "d" or op[1] == "D" then filled = nil; break end
          end
          if not filled then break end
        end
      end
    end
  end
  local rechecked = 0
  for ti, ticket in ipairs(tickets) do
    local taken = nil
    for _, id in ipairs(ticket.ids) do
      if not taken and call("EXISTS", member("res", id)) == 1 then taken = id end
    end
    if taken then
      out[ti] = "exists:" .. taken
    else
      local statuses = {"-"}
      for gi, group in ipairs(ticket.groups) do
        local bydev, order = {}, {}
        for _, r in ipairs(group) do
          for _, p in ipairs(r.parts) do
            if not bydev[p[1]] then bydev[p[1]] = {}; order[#order + 1] = p[1] end
            table.insert(bydev[p[1]], p)
          end
        end
        local status = "ok"
        for _, dev in ipairs(order) do
          if not filled or filled[dev] then
            rechecked = 1
            local parts = bydev[dev]
            local cores = tonumber(call("HGET", key("cores"), dev))
            if not cores then status = "conflict:" .. dev; break end
            local lo, hi = parts[1][3], parts[1][4]
            for _, p in ipairs(parts) do
              if p[3] < lo then lo = p[3] end
              if p[4] > hi then hi = p[4] end
            end
            local ivs = existing(member("alloc", dev), lo, hi)
            for _, p in ipairs(parts) do ivs[#ivs + 1] = {p[3], p[4], p[2]} end
            for _, p in ipairs(parts) do
              if peak(ivs, p[3], p[4]) > cores then status = "conflict:" .. dev; break end
            end
            if status ~= "ok" then break end
          end
        end
        if status == "ok" then
          local v = bump()
          for _, r in ipairs(group) do
            for _, p in ipairs(r.parts) do
              call("ZADD", member("alloc", p[1]), fmt(p[3]), p[5])
              deltas[#deltas + 1] = {"+", p[1], p[5], p[3], p[4], p[2]}
            end
            call("HSET", member("res", r.id), "data", r.data, "app", r.app, "v", v)
            call("ZADD", member("app", r.app), fmt(r.created), r.id)
            call("ZADD", key("all-res"), fmt(r.created), r.id)
            call("ZADD", key("timers"), fmt(r.due), r.id)
            events[#events + 1] = {"CREATED", r.id, r.app, r.data}
            if r.started then events[#events + 1] = {"STARTED", r.id, r.app, r.data} end
          end
        end
        statuses[gi + 1] = status
      end
      out[ti] = statuses
    end
  end
  RESULT.tickets, RESULT.rechecked = out, rechecked
end end

-- A reservation's record: nil and why ("missing", "denied": another application's), or
-- the record and its stored fields {data, app, v}.
local function load(id, app)
  local h = call("HMGET", member("res", id), "data", "app", "v")
  if not h[1] then return nil, "missing" end
  if app ~= "" and h[2] ~= app then return nil, "denied" end
  return cjson.decode(h[1]), h
end
-- every unfinished part's allocations declared (the record the caller read first may be
-- older than the one stored: it reads again and retries)
local function declared(rec)
  for _, p in ipairs(rec.parts) do
    if not p.ended and not p.cancelled and not alloc(p.dev) then return false end
  end
  return true
end
local function save(id, rec)
  local data = cjson.encode(rec)
  call("HSET", member("res", id), "data", data, "v", bump())
  return data
end
local function next_due(rec)
  local due = nil
  for _, p in ipairs(rec.parts) do
    if not p.cancelled then
      local t = nil
      if not p.started then t = p.start elseif not p.ended then t = p["end"] end
      if t and (not due or t < due) then due = t end
    end
  end
  return due
end
local function finish(id, retention)
  call("ZREM", key("timers"), id)
  call("PEXPIRE", member("res", id), retention)
end
-- RESULT of release / extend: status, and data + v (the record's JSON and version) or detail
local function answer(status, data, v)
  RESULT.status, RESULT.data, RESULT.v = status, data or "", tonumber(v) or 0
end

-- {"release", now, id, app ("" = operator), retention ms}
if USES.release then OPS.release = function(o)
  local now, id, app, retention = o[2], o[3], o[4], o[5]
  local rec, h = load(id, app)
  if not rec then return answer(h) end
  if rec.state == "RELEASED" then return answer("released", h[1], h[3]) end
  if rec.state == "ENDED" then return answer("ended", h[1], h[3]) end
  if not declared(rec) then return answer(C.UNDECLARED) end
  for _, p in ipairs(rec.parts) do
    if not p.ended and not p.cancelled then
      call("ZREM", alloc(p.dev), p.member)
      deltas[#deltas + 1] = {"-", p.dev, p.member}
      if p.start < now then
        p.started = true
        p["end"] = math.min(p["end"], now)
        p.ended = true
      else
        p.cancelled = true
      end
    end
  end
  rec.state = "RELEASED"
  rec.finished = now
  local data = save(id, rec)
  finish(id, retention)
  events[#events + 1] = {"RELEASED", id, rec.app, data}
  answer("ok", data, version)
end end

-- {"extend", id, app, new end}: every unfinished part ends later by the same amount, if
-- its device has the cores; else "full" and detail {device, the latest end it allows}
if USES.extend then OPS.extend = function(o)
  local id, app, new_end = o[2], o[3], o[4]
  local rec, h = load(id, app)
  if not rec then return answer(h) end
  if rec.state == "RELEASED" or rec.state == "ENDED" then return answer(string.lower(rec.state), h[1], h[3]) end
  local last = nil
  for _, p in ipairs(rec.parts) do
    if not p.cancelled and (not last or p["end"] > last) then last = p["end"] end
  end
  local shift = new_end - last
  if shift == 0 then return answer("ok", h[1], h[3]) end
  if shift < 0 then RESULT.detail = {fmt(last)}; return answer("shorter") end
  if not declared(rec) then return answer(C.UNDECLARED) end
  -- check every unfinished part's extension [end, end + shift), together
  local moving, bydev, order = {}, {}, {}
  for i, p in ipairs(rec.parts) do
    if not p.cancelled and not p.ended then
      moving[#moving + 1] = i
      if not bydev[p.dev] then bydev[p.dev] = {}; order[#order + 1] = p.dev end
      table.insert(bydev[p.dev], p)
    end
  end
  if #moving == 0 then return answer("ended", h[1], h[3]) end
  local worst_dev, worst_limit = nil, nil
  for _, dev in ipairs(order) do
    local cores = tonumber(call("HGET", key("cores"), dev)) or 0
    local parts = bydev[dev]
    local lo, hi = parts[1]["end"], parts[1]["end"] + shift
    for _, p in ipairs(parts) do
      if p["end"] < lo then lo = p["end"] end
      if p["end"] + shift > hi then hi = p["end"] + shift end
    end
    local ivs = existing(alloc(dev), lo, hi)
    local ext = {}
    for _, p in ipairs(parts) do ext[#ext + 1] = {p["end"], p["end"] + shift, p.cores} end
    local all = {}
    for _, v in ipairs(ivs) do all[#all + 1] = v end
    for _, v in ipairs(ext) do all[#all + 1] = v end
    for _, x in ipairs(ext) do
      -- how far could this part go: the first instant its extension would over-commit
      local limit = first_over(all, x[1], x[2], cores)
      if limit and (not worst_limit or limit - x[1] < worst_limit) then
        worst_limit, worst_dev = limit - x[1], dev
      end
    end
  end
  if worst_dev then RESULT.detail = {worst_dev, fmt(last + worst_limit)}; return answer("full") end
  for _, i in ipairs(moving) do
    local p = rec.parts[i]
    local k = alloc(p.dev)
    call("ZREM", k, p.member)
    deltas[#deltas + 1] = {"-", p.dev, p.member}
    p["end"] = p["end"] + shift
    p.member = string.format(C.MEMBER, id, i - 1, p["end"], p.cores)
    call("ZADD", k, fmt(p.start), p.member)
    deltas[#deltas + 1] = {"+", p.dev, p.member, p.start, p["end"], p.cores}
  end
  local data = save(id, rec)
  local due = next_due(rec)
  if due then call("ZADD", key("timers"), fmt(due), id) end
  events[#events + 1] = {"EXTENDED", id, rec.app, data}
  answer("ok", data, version)
end end

-- {"reap", now, retention ms, ids...}: move the due reservations the caller read on (parts
-- start and end, cores return, ended ones expire after the retention); one not due any
-- more, or whose devices were not all declared, waits for the next sweep.
-- RESULT.next: when the next one falls due ("" = none); RESULT.undeclared: the ids skipped
-- for devices not declared.
if USES.reap then OPS.reap = function(o)
  local now, retention = o[2], o[3]
  RESULT.undeclared = {}
  for i = 4, #o do
    local id = o[i]
    local due_at = tonumber(call("ZSCORE", key("timers"), id))
    local rec = due_at and due_at <= now and load(id, "")
    if due_at and due_at <= now and not rec then
      call("ZREM", key("timers"), id)
    elseif rec and not declared(rec) then
      RESULT.undeclared[#RESULT.undeclared + 1] = id
    elseif rec then
      local started_before, new_start, new_end = false, false, false
      for _, p in ipairs(rec.parts) do
        if p.started and not p.cancelled then started_before = true end
      end
      for _, p in ipairs(rec.parts) do
        if not p.cancelled then
          if not p.started and p.start <= now then
            p.started = true
            new_start = true
          end
          if p.started and not p.ended and p["end"] <= now then
            p.ended = true
            call("ZREM", alloc(p.dev), p.member)
            deltas[#deltas + 1] = {"-", p.dev, p.member}
            new_end = true
          end
        end
      end
      local due = next_due(rec)
      local kinds = {}
      if new_start then kinds[#kinds + 1] = started_before and "PART_STARTED" or "STARTED" end
      if not due then
        rec.state = "ENDED"
        rec.finished = now
        kinds[#kinds + 1] = "ENDED"
      else
        if new_end then kinds[#kinds + 1] = "PART_ENDED" end
        if started_before or new_start then rec.state = "ACTIVE" end
      end
      local data = save(id, rec)
      if due then call("ZADD", key("timers"), fmt(due), id) else finish(id, retention) end
      for _, k in ipairs(kinds) do events[#events + 1] = {k, id, rec.app, data} end
    end
  end
  local nxt = call("ZRANGE", key("timers"), 0, 0, "WITHSCORES")
  RESULT.next = nxt[2] or ""
end end

-- {"fits", device, cores}: the device's allocations never need more than `cores` at once
-- (value: the most they need)
if USES.fits then CHECKS.fits = function(c)
  local raw = call("ZRANGE", member("alloc", c[2]), 0, -1, "WITHSCORES")
  local ivs = {}
  for i = 1, #raw, 2 do ivs[#ivs + 1] = parse(raw[i], raw[i + 1]) end
  local most = 0
  for _, v in ipairs(ivs) do
    local p = peak(ivs, v[1], v[2])
    if p > most then most = p end
  end
  if most <= c[3] then return nil end
  return fail("busy", "more cores are reserved at some instant", tostring(most))
end end
-- {"idle", device}: the device holds no allocation (value: how many it holds)
if USES.idle then CHECKS.idle = function(c)
  local n = call("ZCARD", member("alloc", c[2]))
  if n == 0 then return nil end
  return fail("busy", "the device holds allocations", tostring(n))
end end
-- {"changed", delta}: a change to devices or latencies, for the stream
if USES.changed then OPS.changed = function(o)
  bump()
  for i = 2, #o do deltas[#deltas + 1] = o[i] end
end end
-- {"latency", [[site, device, ms or -1], ...]}: set (or, for -1, drop) each entry.
-- RESULT.entries: how many the table holds.
if USES.latency then OPS.latency = function(o)
  bump()
  for _, e in ipairs(o[2]) do
    local field = e[1] .. "|" .. e[2]
    if e[3] < 0 then call("HDEL", key("latency"), field)
    else call("HSET", key("latency"), field, e[3]) end
    deltas[#deltas + 1] = {"l", e[1], e[2], e[3]}
  end
  RESULT.entries = call("HLEN", key("latency"))
end end

-- {"snapshot"}: the version, the stream's last entry, devices, latencies, and every declared
-- device's allocations. RESULT.complete 0: a device the caller did not declare exists
-- (it declares the devices again and retries).
if USES.snapshot then OPS.snapshot = function(o)
  RESULT.version = tonumber(call("GET", key("version")) or "0")
  local last = call("XREVRANGE", key("changes"), "+", "-", "COUNT", 1)
  RESULT.sid = #last > 0 and last[1][1] or "0-0"
  local devs = call("HGETALL", key("devices"))
  local allocs = {}
  RESULT.complete = 1
  for i = 1, #devs, 2 do
    local k = alloc(devs[i])
    if not k then RESULT.complete = 0; return end
    allocs[#allocs + 1] = devs[i]
    allocs[#allocs + 1] = call("ZRANGE", k, 0, -1, "WITHSCORES")
  end
  RESULT.devices, RESULT.latency, RESULT.allocations = devs, call("HGETALL", key("latency")), allocs
end end
