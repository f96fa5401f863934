-- The cell's extension of services/lightpath_services/common/txn.lua (store.py has the keys and says what
-- each op is for). Named keys are the cell's (store.CellTxn); "assumed", "live", "podjobs"
-- and "endpoints" are those of the pod the Txn is about; families "job" and "ev" hold a
-- job's hash and its event list.
local FINAL = {}
for _, s in ipairs(C.FINAL) do FINAL[s] = true end

-- One HSET of a decoded JSON object's fields plus `more` (a flat field, value list).
local function hset_all(jk, fields, more)
  for k, v in pairs(fields) do more[#more + 1] = k; more[#more + 1] = v end
  call("HSET", jk, unpack(more))
end
-- A transition of the cell's, stored once: in the job's history (the stream only says
-- which event of which job). `reason_in_record`: an end, whose reason is the record's and
-- stays so (nothing changes an ended job): the event refers to it (store.history).
local function cell_event(job, from, to, reason, pod, now, reason_in_record)
  local e = {job = job, from = from, to = to, pod = pod, at = tonumber(now)}
  if reason_in_record then e.reason_in = "record" else e.reason = reason end
  job_event(member("job", job), member("ev", job), key("events"), C.EVENT_STREAM_MAXLEN, e,
    {"job", job}, true)
end
local function release_hold(jk, pod)
  local hold = call("HGET", jk, "hold")
  if hold and hold ~= "" then
    for t, n in pairs(cjson.decode(hold)) do call("HINCRBY", key("held"), pod .. "|" .. t, -n) end
  end
  call("HDEL", jk, "hold")
  return hold
end
-- Assumptions (the pod's "assumed" set, and on the job: "asm" = hold | take | free, "asm_n" =
-- the blocks, "tk_at" / "end_at" = the pod's event that took / freed them, once reported):
-- what the cell assumes about a pod's blocks before a capacity report shows it. A report is
-- versioned by the pod's event stream tip read with its state, so it shows an assumption
-- exactly when its version is at or past that event; until then the report's free blocks
-- are corrected by it (a report read before a placement never gives the blocks back).
local function assume(jk, job, kind, needs_json, now)
  call("SADD", key("assumed"), job)
  call("HSET", jk, "asm", kind, "asm_n", needs_json, "asm_ms", now)
end
local function unassume(jk, job)
  call("SREM", key("assumed"), job)
  call("HDEL", jk, "asm", "asm_n", "asm_ms")
end
local function shown(at, version) return at ~= nil and at ~= false and at ~= "" and at <= version end
local function take_hold(jk, pod, needs_json, job, now)
  for t, n in pairs(cjson.decode(needs_json)) do call("HINCRBY", key("held"), pod .. "|" .. t, n) end
  call("HSET", jk, "hold", needs_json)
  call("HDEL", jk, "tk_at", "end_at")
  assume(jk, job, "hold", needs_json, now)
end
local function count_free(pod, hold, sign)
  for t, k in pairs(cjson.decode(hold)) do call("HINCRBY", key("free"), pod .. "|" .. t, sign * k) end
end
-- A pod was heard from: it is no longer suspect, and if it was marked silent its
-- jobs show their last known state again (CS-6). Returns 1 if it was silent.
local function alive(pod, endpoint, now)
  call("ZADD", key("seen"), now, pod)
  if endpoint ~= "" then
    call("HSET", key("endpoints"), endpoint, now)
    call("HSET", key("endpoint"), pod, endpoint)
  end
  call("HDEL", key("suspect"), pod)
  if call("SREM", key("down"), pod) == 0 then return 0 end
  for _, job in ipairs(call("SMEMBERS", key("live"))) do
    local jk = member("job", job)
    local f = call("HMGET", jk, "state", "pod_state", "phase")
    if f[1] == "UNKNOWN" and f[3] == "PLACED" then
      local back = f[2] or "PENDING"
      call("HSET", jk, "state", back, "reason", "pod " .. pod .. " answers again", "updated_ms", now)
      cell_event(job, "UNKNOWN", back, "pod " .. pod .. " answers again", pod, now)
    end
  end
  return 1
end
-- What a job on `pod` shows for the pod's `state`: UNKNOWN while the pod is marked silent
-- (alive() shows its live jobs again once it reports) -- but an end the pod answered is
-- known for good, and shown at once: the job leaves "live", so alive() would never show
-- it again (it stayed UNKNOWN for ever).
local function shown_state(pod, state)
  if FINAL[state] or call("SISMEMBER", key("down"), pod) == 0 then return state end
  return "UNKNOWN"
end
local function queue_again(jk, job)
  local f = call("HMGET", jk, "priority", "seq")
  local score = (C.PRIORITY_ABOVE - tonumber(f[1])) * C.PRIORITY_STRIDE + tonumber(f[2])
  call("ZADD", key("queue"), score, job)
end

-- Quotas (issue 35): a job bound to a pod charges its tenant's chips per node type ("qc" on
-- the job; "usage" field "<tenant>|<type>") until it ends or goes back to the cell queue.
-- "decayed" keeps each tenant's decayed chip-seconds per type ("<tenant>|<type>", and "@"
-- after it: when last integrated), integrated at every change of what it holds. A charge
-- of a tenant with a quota bumps "qver": a decision over quotas is checked against it.
local LN2 = math.log(2)
local function integrate(tenant, t, now)
  local k = tenant .. "|" .. t
  local held = tonumber(call("HGET", key("usage"), k) or "0")
  local v = tonumber(call("HGET", key("decayed"), k) or "0")
  local dt = (tonumber(now) - tonumber(call("HGET", key("decayed"), k .. "@") or now)) / 1000
  if dt > 0 then
    local f = math.pow(0.5, dt / C.HALF_LIFE_S)
    v = v * f + held * C.HALF_LIFE_S / LN2 * (1 - f)
  end
  call("HSET", key("decayed"), k, string.format("%.6f", v), k .. "@", now)
end
-- The chips are also counted on the pod ("<tenant>@<pod>|<type>", the pod kept as "qp" on
-- the job) for the tenant's quota scoped to that pod ("<tenant>@<pod>" in "quotas").
local function charge(jk, tenant, pod, charge_json, now)
  if charge_json == nil or charge_json == "" or charge_json == "{}" then return end
  local scoped = tenant .. "@" .. pod
  for t, n in pairs(cjson.decode(charge_json)) do
    integrate(tenant, t, now)
    call("HINCRBY", key("usage"), tenant .. "|" .. t, n)
    call("HINCRBY", key("usage"), scoped .. "|" .. t, n)
  end
  call("HSET", jk, "qc", charge_json, "qp", pod)
  if call("HEXISTS", key("quotas"), tenant) == 1 or call("HEXISTS", key("quotas"), scoped) == 1 then
    call("HINCRBY", key("qver"), "n", 1)
  end
end
local function uncharge(jk, now)
  local f = call("HMGET", jk, "qc", "tenant", "qp")
  if not f[1] or f[1] == "" then return end
  for t, n in pairs(cjson.decode(f[1])) do
    integrate(f[2], t, now)
    local ks = {f[2] .. "|" .. t}
    if f[3] then ks[2] = f[2] .. "@" .. f[3] .. "|" .. t end
    for _, k in ipairs(ks) do
      if call("HINCRBY", key("usage"), k, -n) <= 0 then call("HDEL", key("usage"), k) end
    end
  end
  call("HDEL", jk, "qc", "qp")
end

-- A pod that may have the job where the cell does not have it (a forward that got no
-- answer, or a pod that reports a job the cell placed elsewhere, queued or ended): the
-- recovery asks that pod, adopts the job or cancels the duplicate, then forgets the pod.
local function mark_maybe(jk, job, pod)
  local raw = call("HGET", jk, "maybe")
  local maybe = (raw and raw ~= "") and cjson.decode(raw) or {}
  if not has(maybe, pod) then table.insert(maybe, pod) end
  call("HSET", jk, "maybe", cjson.encode(maybe))
  call("SADD", key("maybe"), job)
end

-- A job its pod let go (a reclaim of lent quota delayed it, issue 35): back in the cell
-- queue at its first place (priority, then submit order), its quota charge given back,
-- PENDING to its tenant with the pod's reason; the cell may place it on any pod. Only a
-- job PLACED on `pod` (the caller checks): a second delivery of the pod's event finds it
-- QUEUED and changes nothing.
local function requeue_released(jk, job, pod, from, reason, now)
  call("SREM", key("live"), job)
  call("ZREM", key("podjobs"), job)
  uncharge(jk, now)
  local why = "reclaimed on pod " .. pod .. ": " .. reason
  call("HSET", jk, "phase", "QUEUED", "pod", "", "token", "", "pod_state", "", "n", 0,
    "box", "", "state", "PENDING", "reason", why, "updated_ms", now)
  call("HINCRBY", jk, "reclaimed", 1)
  queue_again(jk, job)
  cell_event(job, from, "PENDING", why, pod, now)
end

-- {"not_held", pod, job}: the pod is not held for another job (quota.Hold): the claim of a
-- job that would borrow quota, decided before a replica held the pod, is decided again
if USES.not_held then CHECKS.not_held = function(c)
  local h = call("HMGET", key("hold"), "job", "pod")
  if h[2] == c[2] and h[1] and h[1] ~= c[3] then
    return fail("quota", "pod " .. c[2] .. " was held for another job since the decision", "")
  end
  return nil
end end

-- {"enough", pod, needs JSON}: the pod's free blocks minus those held in flight cover it
if USES.enough then CHECKS.enough = function(c)
  for t, n in pairs(cjson.decode(c[3])) do
    local free = tonumber(call("HGET", key("free"), c[2] .. "|" .. t) or "0")
    local held = tonumber(call("HGET", key("held"), c[2] .. "|" .. t) or "0")
    if free - held < n then return fail("stale", "the blocks went to others", "") end
  end
  return nil
end end

-- {"register", pod, registration, endpoint, now, events tip (padded)}
if USES.register then OPS.register = function(o)
  local pod = o[2]
  call("HSET", key("pods"), pod, o[3])
  if call("HEXISTS", key("ack"), pod) == 0 then call("HSET", key("ack"), pod, o[6]) end
  RESULT.returned = alive(pod, o[4], o[5])
end end

-- {"report", pod, endpoint, now, capacity, version, free JSON, after, until, transitions
-- JSON, how long (ms) an assumption no report shows may stand}
if USES.report then OPS.report = function(o)
  local pod, endpoint, now, cap, version, free_json, after, upto, trs =
    o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10]
  local assume_ms = tonumber(o[11])
  RESULT.returned = alive(pod, endpoint, now)
  RESULT.wake = 0
  RESULT.requeued = 0
  local ack = call("HGET", key("ack"), pod) or ""
  local down = call("SISMEMBER", key("down"), pod) == 1
  if after <= ack then
    for _, tr in ipairs(cjson.decode(trs)) do
      -- tr = {stream id (padded), job, seq, from, to, at, reason, released (1: the pod let
      -- the job go back to the cell queue)}
      if tr[1] > ack then
        local jk = member("job", tr[2])
        local f = call("HMGET", jk, "pod", "phase", "n", "fwd_ms", "asm", "tk_at", "end_at",
          "state")
        -- A transition older than this forward belongs to an earlier attempt on the pod
        -- (one it refused and forgot, numbered from 1 again): never this attempt's state.
        if f[1] == pod and (f[2] == "PLACED" or f[2] == "FORWARDING")
            and tonumber(tr[6]) >= tonumber(f[4] or "0") then
          if tr[8] == 1 and f[2] == "PLACED" and tr[3] > tonumber(f[3] or "0") then
            requeue_released(jk, tr[2], pod, f[8] or "", tr[7], now)
            RESULT.wake = 1
            RESULT.requeued = RESULT.requeued + 1
          elseif tr[3] > tonumber(f[3] or "0") then
            call("HSET", jk, "pod_state", tr[5], "n", tr[3], "updated_ms", tr[6])
            -- A sub-block slice's box stays where the pod's last answer put it only from
            -- WIRING to RUNNING; any other change may move or free it: unknown until the
            -- cell next follows an answer (reclaim names no box of an unknown block).
            if not (tr[4] == "WIRING" and tr[5] == "RUNNING") then
              call("HSET", jk, "box", "")
            end
            if f[2] == "PLACED" then
              call("HSET", jk, "reason", tr[7])
              if not down then call("HSET", jk, "state", tr[5]) end
              if FINAL[tr[5]] then
                call("SREM", key("live"), tr[2])
                uncharge(jk, now)
              end
            end
          end
          -- The events that took and freed the blocks of an assumption: a report at or
          -- past them shows it.
          if f[5] and not f[6] and (tr[5] == "WIRING" or tr[5] == "RUNNING") then
            call("HSET", jk, "tk_at", tr[1])
          elseif f[5] == "free" and not f[7] and FINAL[tr[5]] then
            call("HSET", jk, "end_at", tr[1])
          end
        elseif f[2] and f[1] ~= pod and tr[8] ~= 1 and not FINAL[tr[5]] then
          -- The pod runs a job the cell has queued, ended or on another pod (a forward
          -- whose answer was lost and then found nothing there, which arrived after all):
          -- the recovery's question to the pod settles it.
          mark_maybe(jk, tr[2], pod)
        end
      end
    end
    if upto > ack then
      ack = upto
      call("HSET", key("ack"), pod, ack)
    end
  end
  RESULT.ack = ack
  local old = call("HGET", key("capver"), pod) or ""
  if version < old then return end
  local changed = call("HGET", key("capacity"), pod) ~= cap
  call("HSET", key("capacity"), pod, cap)
  call("HSET", key("capver"), pod, version)
  local free = cjson.decode(free_json)
  -- The report's free blocks, corrected by what the cell assumes that it does not show.
  for _, job in ipairs(call("SMEMBERS", key("assumed"))) do
    local jk = member("job", job)
    local a = call("HMGET", jk, "asm", "asm_n", "tk_at", "end_at", "asm_ms")
    local sign, done = 0, false
    if a[1] == "hold" then
      -- In flight, counted in `held`; once the pod shows the blocks taken, not twice.
      if shown(a[3], version) then sign = 1 end
    elseif a[1] == "take" then
      if shown(a[3], version) then done = true else sign = -1 end
    elseif a[1] == "free" then
      -- Freed through the cell: a report that shows the blocks taken but not freed.
      if shown(a[4], version) then done = true elseif shown(a[3], version) then sign = 1 end
    else
      done = true  -- the job is gone
    end
    if done or (a[1] ~= "hold" and tonumber(now) - tonumber(a[5] or "0") > assume_ms) then
      unassume(jk, job)  -- shown (or past its time: the report is the truth)
      sign = 0
    end
    if sign ~= 0 then
      for t, n in pairs(cjson.decode(a[2])) do
        if free[t] ~= nil then free[t] = free[t] + sign * n end
      end
    end
  end
  for t, n in pairs(free) do call("HSET", key("free"), pod .. "|" .. t, math.max(0, n)) end
  -- New capacity and jobs waiting in the cell queue: time for a dispatch pass.
  if changed and call("ZCARD", key("queue")) > 0 then RESULT.wake = 1 end
end end

-- {"claim_new", job, fields JSON, tenant, pod ("" = queue), needs JSON, token, until, now,
-- event reason, chips per node type JSON (charged to the tenant when bound to a pod)}:
-- RESULT.seq, and bound to a pod RESULT.fence (the next forward number: its token at the pod)
if USES.claim_new then OPS.claim_new = function(o)
  local job, fields, tenant, pod, needs_json, token, upto, now, reason =
    o[2], cjson.decode(o[3]), o[4], o[5], o[6], o[7], o[8], o[9], o[10]
  local jk = member("job", job)
  local seq = call("INCR", key("seq"))
  hset_all(jk, fields, {"seq", seq, "tenant", tenant, "state", "PENDING", "reason", reason,
    "created_ms", now, "updated_ms", now, "n", 0})
  call("ZADD", key("jobs"), seq, job)
  call("ZADD", key("tenantjobs"), seq, job)
  if pod ~= "" then
    call("HSET", jk, "phase", "FORWARDING", "pod", pod, "token", token, "until", upto, "fwd_ms", now)
    take_hold(jk, pod, needs_json, job, now)
    call("ZADD", key("forwarding"), upto, job)
    charge(jk, tenant, pod, o[11], now)
    RESULT.fence = call("INCR", key("fwd"))
  else
    call("HSET", jk, "phase", "QUEUED", "pod", "")
    queue_again(jk, job)
  end
  cell_event(job, "", "PENDING", reason, pod, now)
  RESULT.seq = seq
end end

-- {"claim_queued", job, pod, needs JSON, token, until, now, event reason, chips per node
-- type JSON (charged)}: RESULT.fence, the forward's token at the pod
if USES.claim_queued then OPS.claim_queued = function(o)
  local job, pod, needs_json, token, upto, now, reason = o[2], o[3], o[4], o[5], o[6], o[7], o[8]
  local jk = member("job", job)
  charge(jk, call("HGET", jk, "tenant") or "", pod, o[9], now)
  call("ZREM", key("queue"), job)
  call("HSET", jk, "phase", "FORWARDING", "pod", pod, "token", token, "until", upto,
    "reason", reason, "updated_ms", now, "n", 0, "pod_state", "", "fwd_ms", now)
  take_hold(jk, pod, needs_json, job, now)
  call("ZADD", key("forwarding"), upto, job)
  cell_event(job, "PENDING", "PENDING", reason, pod, now)
  RESULT.fence = call("INCR", key("fwd"))
end end

-- {"placed", job, pod, state, n, reason, fields JSON, now}: FORWARDING -> PLACED
if USES.placed then OPS.placed = function(o)
  local job, pod, state, n, reason, fields, now = o[2], o[3], o[4], tonumber(o[5]), o[6], cjson.decode(o[7]), o[8]
  local jk = member("job", job)
  local f = call("HMGET", jk, "n", "seq")
  local hold = release_hold(jk, pod)
  unassume(jk, job)
  if hold and (state == "WIRING" or state == "RUNNING") then
    -- The blocks are gone: counted so until a report of the pod shows them taken (a report
    -- that shows them already counted them, and held them in flight: net the same).
    count_free(pod, hold, -1)
    if not shown(call("HGET", jk, "tk_at"), call("HGET", key("capver"), pod) or "") then
      assume(jk, job, "take", hold, now)
    end
  end
  if hold then call("HSET", jk, "needs", hold) end
  call("ZREM", key("forwarding"), job)
  hset_all(jk, fields, {"phase", "PLACED", "token", "", "updated_ms", now})
  if n >= tonumber(f[1] or "0") then
    call("HSET", jk, "pod_state", state, "n", n, "reason", reason)
  else
    state = call("HGET", jk, "pod_state")
  end
  call("HSET", jk, "state", shown_state(pod, state))
  call("ZADD", key("podjobs"), f[2], job)
  if not FINAL[state] then call("SADD", key("live"), job) else uncharge(jk, now) end
end end

-- {"unbind", job, pod, "refused" | "uncertain", capacity version, reason, now}
if USES.unbind then OPS.unbind = function(o)
  local job, pod, kind, version, reason, now = o[2], o[3], o[4], o[5], o[6], o[7]
  local jk = member("job", job)
  local refused_raw = call("HGET", jk, "refused")
  local hold = release_hold(jk, pod)
  -- A report showed the blocks taken (the pod may have the job after all) and counted them
  -- in flight too: they stay counted as taken until the next report.
  if hold and call("HGET", jk, "asm") == "hold"
      and shown(call("HGET", jk, "tk_at"), call("HGET", key("capver"), pod) or "") then
    count_free(pod, hold, -1)
  end
  unassume(jk, job)
  uncharge(jk, now)
  call("ZREM", key("forwarding"), job)
  if kind == "refused" then
    local refused = (refused_raw and refused_raw ~= "") and cjson.decode(refused_raw) or {}
    refused[pod] = version
    call("HSET", jk, "refused", cjson.encode(refused))
  else
    mark_maybe(jk, job, pod)
  end
  call("HSET", jk, "phase", "QUEUED", "pod", "", "token", "", "pod_state", "", "n", 0,
    "reason", reason, "updated_ms", now)
  queue_again(jk, job)
  cell_event(job, "PENDING", "PENDING", reason, "", now)
end end

-- {"end_queued", job, final state, reason, now, forget (1: delete the job, when nothing may
-- exist of it)}
if USES.end_queued then OPS.end_queued = function(o)
  local job, final, reason, now, forget = o[2], o[3], o[4], o[5], o[6]
  local jk = member("job", job)
  local maybe = call("HGET", jk, "maybe")
  call("ZREM", key("queue"), job)
  if forget == 1 and (not maybe or maybe == "" or maybe == "[]") then
    call("DEL", jk)
    call("DEL", member("ev", job))
    call("ZREM", key("jobs"), job)
    call("ZREM", key("tenantjobs"), job)
    RESULT.outcome = "forgotten"
    return
  end
  call("HSET", jk, "phase", "ENDED", "state", final, "reason", reason, "updated_ms", now)
  cell_event(job, "PENDING", final, reason, "", now, true)
  RESULT.outcome = final
end end

-- {"mirror", job, pod, state, n, reason, now, ended here (1: the pod's answer to a
-- complete/cancel through the cell: its blocks are free again), the block of a sub-block
-- slice's box ("" none: reclaim reads it)}
if USES.mirror then OPS.mirror = function(o)
  local job, pod, state, n, reason, now, ended = o[2], o[3], o[4], o[5], o[6], o[7], o[8]
  local jk = member("job", job)
  local f = call("HMGET", jk, "pod_state", "needs", "state")
  call("HSET", jk, "pod_state", state, "n", n, "reason", reason, "updated_ms", now,
    "box", o[9] or "")
  local shown = shown_state(pod, state)
  call("HSET", jk, "state", shown)
  if f[3] == "UNKNOWN" and shown ~= "UNKNOWN" then
    cell_event(job, "UNKNOWN", shown, "pod " .. pod .. " answered: " .. reason, pod, now)
  end
  RESULT.freed = 0
  if FINAL[state] then
    call("SREM", key("live"), job)
    uncharge(jk, now)
    if ended == 1 and (f[1] == "RUNNING" or f[1] == "WIRING") and f[2] then
      -- Its blocks are free: counted so until a report of the pod shows them freed.
      count_free(pod, f[2], 1)
      assume(jk, job, "free", f[2], now)
      RESULT.freed = 1
    end
  end
  RESULT.queued = call("ZCARD", key("queue"))
end end

-- {"update", job, request, priority, pod spec ("" = keep), event reason ("" = none: placed),
-- now}: a job's priority or labels changed (UpdateJob)
if USES.update then OPS.update = function(o)
  local job, req, priority, spec, reason, now = o[2], o[3], o[4], o[5], o[6], o[7]
  local jk = member("job", job)
  -- the request as submitted stays the idempotency key of SubmitJob
  call("HSETNX", jk, "req0", call("HGET", jk, "req"))
  call("HSET", jk, "req", req, "priority", priority, "updated_ms", now)
  if spec ~= "" then call("HSET", jk, "spec", spec) end
  if call("HGET", jk, "phase") == "QUEUED" then
    queue_again(jk, job)  -- its new place: priority, then age
    cell_event(job, "PENDING", "PENDING", reason, "", now)
  end
end end

-- {"mark_down", pod, now, timeout ms}: a silent pod marked down, its jobs UNKNOWN (CS-6);
-- the count of them, -1 if it is not (newly) silent
if USES.mark_down then OPS.mark_down = function(o)
  local pod, now, timeout = o[2], tonumber(o[3]), tonumber(o[4])
  local seen = tonumber(call("ZSCORE", key("seen"), pod) or "0")
  RESULT.count = -1
  if seen >= now - timeout or call("SISMEMBER", key("down"), pod) == 1 then return end
  call("SADD", key("down"), pod)
  local count = 0
  local silent = math.floor((now - seen) / 1000)
  for _, job in ipairs(call("SMEMBERS", key("live"))) do
    local jk = member("job", job)
    local f = call("HMGET", jk, "phase", "state")
    if f[1] == "PLACED" and f[2] ~= "UNKNOWN" and not FINAL[f[2]] then
      local why = "pod " .. pod .. " has not answered for " .. silent .. " s; last known: " .. f[2]
      call("HSET", jk, "state", "UNKNOWN", "reason", why, "updated_ms", now)
      cell_event(job, f[2], "UNKNOWN", why, pod, now)
      count = count + 1
    end
  end
  RESULT.count = count
end end

-- {"adopt", job, pod, state, n, reason, fields JSON, now, chips per node type JSON
-- (charged while it lives)}: a queued job found on a pod
if USES.adopt then OPS.adopt = function(o)
  local job, pod, state, n, reason, fields, now = o[2], o[3], o[4], o[5], o[6], cjson.decode(o[7]), o[8]
  local jk = member("job", job)
  call("ZREM", key("queue"), job)
  hset_all(jk, fields, {"phase", "PLACED", "pod", pod, "pod_state", state, "n", n, "state", state,
    "reason", reason, "updated_ms", now})
  call("ZADD", key("podjobs"), call("HGET", jk, "seq"), job)
  if not FINAL[state] then
    call("SADD", key("live"), job)
    charge(jk, call("HGET", jk, "tenant") or "", pod, o[9], now)
  end
  cell_event(job, "PENDING", state, "found on pod " .. pod .. " after it answered again", pod, now)
end end

-- {"released", job, pod, reason, now}: the pod answered that it let the job go back to
-- the cell queue (its event of it was lost: a resync); checked PLACED on `pod`
if USES.released then OPS.released = function(o)
  local jk = member("job", o[2])
  requeue_released(jk, o[2], o[3], call("HGET", jk, "state") or "", o[4], o[5])
end end

-- {"forget_maybe", job, pod}: a pod that may have got the job does not have it (or it was
-- dealt with)
if USES.forget_maybe then OPS.forget_maybe = function(o)
  local job, pod = o[2], o[3]
  local jk = member("job", job)
  local raw = call("HGET", jk, "maybe")
  local left = {}
  if raw and raw ~= "" then
    for _, p in ipairs(cjson.decode(raw)) do if p ~= pod then table.insert(left, p) end end
  end
  if #left == 0 then
    call("HDEL", jk, "maybe")
    call("SREM", key("maybe"), job)
  else
    call("HSET", jk, "maybe", cjson.encode(left))
  end
end end
