"""CS-1, CS-5, CS-6: the cell's state in Redis — the pod registry, the cell's jobs, the queue.

Every key is under the `{cell}` hash tag (services.common.keys.cell_key), so
all of them live in one Redis Cluster slot and one Lua script may change any
of them together. Scripts that walk a set of jobs (a pod's live jobs, a
report's transitions) build those jobs' keys from the same prefix.

Registry (CS-1):

    lp:{cell}:pods                hash  pod -> registration (PodRegistration, base64)
    lp:{cell}:seen                zset  pod -> last heartbeat (ms)
    lp:{cell}:endpoints:<pod>     hash  scheduler replica address -> last heartbeat (ms)
    lp:{cell}:endpoint            hash  pod -> the replica heard from last (where calls go)
    lp:{cell}:capacity            hash  pod -> last capacity report (PodCapacity, base64)
    lp:{cell}:capver              hash  pod -> version of that report (padded stream id)
    lp:{cell}:free                hash  "<pod>|<type>" -> healthy free blocks (reported, minus placed since);
                                        "<pod>|<type>#chips" -> chips free for sub-block slices (same)
    lp:{cell}:held                hash  "<pod>|<type>" -> blocks of forwards in flight to that pod
                                        ("<pod>|<type>#chips": chips of sub-block slices in flight)
    lp:{cell}:pod:<p>:assumed     set   jobs whose blocks the cell counts as taken (a forward, a
                                        placement) or freed (an end through the cell) before a
                                        capacity report of the pod shows it (see _REPORT)
    lp:{cell}:ack                 hash  pod -> last job transition applied (padded stream id)
    lp:{cell}:suspect             hash  pod -> until (ms): a forward failed to reach it
    lp:{cell}:down                set   pods marked silent (their jobs show UNKNOWN, CS-6)

Jobs (CS-5):

    lp:{cell}:job:<id>            hash  the job: request (as updated; req0 as first submitted),
                                        tenant, phase, pod, state, ...
    lp:{cell}:job:<id>:events     list  the cell's own transitions of the job (JSON)
    lp:{cell}:jobs                zset  every job by submission sequence
    lp:{cell}:tenant:<t>:jobs     zset  a tenant's jobs by sequence
    lp:{cell}:pod:<p>:jobs        zset  jobs placed on a pod by sequence
    lp:{cell}:pod:<p>:live        set   jobs on a pod that have not ended
    lp:{cell}:queue               zset  the cell queue: priority, then age
    lp:{cell}:forwarding          zset  jobs being forwarded -> until (ms)
    lp:{cell}:maybe               set   jobs a forward may have reached on a pod that then went silent
    lp:{cell}:seq                 string submission sequence
    lp:{cell}:events              stream the cell's job transitions (WatchJob)

A job's phase in the cell: QUEUED (in the cell queue, no pod) → FORWARDING
(claimed by one replica, bound to one pod, with a token and a deadline) →
PLACED (the pod has it; its state mirrors the pod's, versioned by the pod's
per-job transition number) — or ENDED without ever reaching a pod (cancelled
in the queue). A forward that the pod refused, or whose outcome is unknown,
goes back to QUEUED. Only the holder of the FORWARDING token may end it, so
no two replicas forward one job at once.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from services.common.keys import cell_key

QUEUED, FORWARDING, PLACED, ENDED = "QUEUED", "FORWARDING", "PLACED", "ENDED"
FINAL = ("COMPLETED", "CANCELLED", "PREEMPTED", "FAILED")
EVENT_STREAM_MAXLEN = 10_000
# Queue score: (101 - priority) * 2^40 + sequence → priority first, then age.
PRIORITY_STRIDE = 1 << 40


def pad_id(stream_id: str) -> str:
    """A Redis stream id as a string that compares like the id ("" and "0-0" lowest)."""
    if not stream_id:
        stream_id = "0-0"
    ms, _, seq = stream_id.partition("-")
    return f"{int(ms):017d}-{int(seq or 0):010d}"


def unpad_id(padded: str) -> str:
    if not padded:
        return "0-0"
    ms, _, seq = padded.partition("-")
    return f"{int(ms)}-{int(seq or 0)}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text.encode())


# The fields of a job record the service reads, in the order scripts return them.
RECORD_FIELDS = (
    "req",
    "tenant",
    "priority",
    "seq",
    "phase",
    "state",
    "reason",
    "pod",
    "created_ms",
    "updated_ms",
    "pod_state",
    "n",
    "token",
    "until",
    "spec",
    "chips",
    "blocks",
    "derived",
    "why",
    "refused",
    "maybe",
    "needs",
    "req0",
)

_PRELUDE = r"""
local FINAL = {COMPLETED=true, CANCELLED=true, PREEMPTED=true, FAILED=true}
local RECORD_FIELDS = {"req", "tenant", "priority", "seq", "phase", "state", "reason", "pod", "created_ms", "updated_ms", "pod_state", "n", "token", "until", "spec", "chips", "blocks", "derived", "why", "refused", "maybe", "needs", "req0"}
local function record(jk) return redis.call("HMGET", jk, unpack(RECORD_FIELDS)) end
-- One HSET of a decoded JSON object's fields plus `more` (a flat field, value list).
local function hset_all(jk, fields, more)
  for k, v in pairs(fields) do more[#more + 1] = k; more[#more + 1] = v end
  redis.call("HSET", jk, unpack(more))
end
local function cell_event(prefix, job, from, to, reason, pod, now)
  local jk = prefix .. "job:" .. job
  local n = redis.call("HINCRBY", jk, "nev", 1)
  local e = cjson.encode({job=job, from=from, to=to, reason=reason, pod=pod, at=tonumber(now), n=n})
  redis.call("RPUSH", jk .. ":events", e)
  redis.call("XADD", prefix .. "events", "MAXLEN", "~", 10000, "*", "job", job, "e", e)
end
local function release_hold(prefix, jk, pod)
  local hold = redis.call("HGET", jk, "hold")
  if hold and hold ~= "" then
    for t, n in pairs(cjson.decode(hold)) do
      redis.call("HINCRBY", prefix .. "held", pod .. "|" .. t, -n)
    end
  end
  redis.call("HDEL", jk, "hold")
  return hold
end
local function enough_free(prefix, pod, needs)
  for t, n in pairs(needs) do
    local free = tonumber(redis.call("HGET", prefix .. "free", pod .. "|" .. t) or "0")
    local held = tonumber(redis.call("HGET", prefix .. "held", pod .. "|" .. t) or "0")
    if free - held < n then return false end
  end
  return true
end
-- Assumptions (pod:<p>:assumed, and on the job: "asm" = hold | take | free, "asm_n" = the
-- blocks, "tk_at" / "end_at" = the pod's event that took / freed them, once reported):
-- what the cell assumes about a pod's blocks before a capacity report shows it. A report is
-- versioned by the pod's event stream tip read with its state, so it shows an assumption
-- exactly when its version is at or past that event; until then the report's free blocks
-- are corrected by it (a report read before a placement never gives the blocks back).
local function assume(prefix, jk, job, pod, kind, needs_json, now)
  redis.call("SADD", prefix .. "pod:" .. pod .. ":assumed", job)
  redis.call("HSET", jk, "asm", kind, "asm_n", needs_json, "asm_ms", now)
end
local function unassume(prefix, jk, job, pod)
  redis.call("SREM", prefix .. "pod:" .. pod .. ":assumed", job)
  redis.call("HDEL", jk, "asm", "asm_n", "asm_ms")
end
local function shown(at, version) return at ~= nil and at ~= false and at ~= "" and at <= version end
local function take_hold(prefix, jk, pod, needs_json, job, now)
  for t, n in pairs(cjson.decode(needs_json)) do
    redis.call("HINCRBY", prefix .. "held", pod .. "|" .. t, n)
  end
  redis.call("HSET", jk, "hold", needs_json)
  redis.call("HDEL", jk, "tk_at", "end_at")
  assume(prefix, jk, job, pod, "hold", needs_json, now)
end
-- A pod was heard from: it is no longer suspect, and if it was marked silent its
-- jobs show their last known state again (CS-6). Returns 1 if it was silent.
local function alive(prefix, pod, endpoint, now)
  redis.call("ZADD", prefix .. "seen", now, pod)
  if endpoint ~= "" then
    redis.call("HSET", prefix .. "endpoints:" .. pod, endpoint, now)
    redis.call("HSET", prefix .. "endpoint", pod, endpoint)
  end
  redis.call("HDEL", prefix .. "suspect", pod)
  if redis.call("SREM", prefix .. "down", pod) == 0 then return 0 end
  for _, job in ipairs(redis.call("SMEMBERS", prefix .. "pod:" .. pod .. ":live")) do
    local jk = prefix .. "job:" .. job
    local f = redis.call("HMGET", jk, "state", "pod_state", "phase")
    if f[1] == "UNKNOWN" and f[3] == "PLACED" then
      local back = f[2] or "PENDING"
      redis.call("HSET", jk, "state", back, "reason", "pod " .. pod .. " answers again", "updated_ms", now)
      cell_event(prefix, job, "UNKNOWN", back, "pod " .. pod .. " answers again", pod, now)
    end
  end
  return 1
end
local function queue_again(prefix, jk, job)
  local f = redis.call("HMGET", jk, "priority", "seq")
  local score = (101 - tonumber(f[1])) * 1099511627776 + tonumber(f[2])
  redis.call("ZADD", prefix .. "queue", score, job)
end
"""

_REGISTER = (
    _PRELUDE
    + r"""
-- ARGV: prefix, pod, registration, endpoint, now, events tip (padded)
local prefix, pod, reg, endpoint, now, tip = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
redis.call("HSET", prefix .. "pods", pod, reg)
if redis.call("HEXISTS", prefix .. "ack", pod) == 0 then
  redis.call("HSET", prefix .. "ack", pod, tip)
end
return alive(prefix, pod, endpoint, now)
"""
)

_REPORT = (
    _PRELUDE
    + r"""
-- ARGV: prefix, pod, endpoint, now, capacity, version, free JSON, after, until, transitions JSON,
--       how long (ms) an assumption no report shows may stand
local prefix, pod, endpoint, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cap, version, free_json, after, upto, trs = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local assume_ms = tonumber(ARGV[11])
if redis.call("HEXISTS", prefix .. "pods", pod) == 0 then return {-1, "", 0, 0} end
local returned = alive(prefix, pod, endpoint, now)
local wake = 0
local assumed = prefix .. "pod:" .. pod .. ":assumed"
local ack = redis.call("HGET", prefix .. "ack", pod) or ""
local down = redis.call("SISMEMBER", prefix .. "down", pod) == 1
if after <= ack then
  for _, tr in ipairs(cjson.decode(trs)) do
    -- tr = {stream id (padded), job, seq, from, to, at, reason}
    if tr[1] > ack then
      local jk = prefix .. "job:" .. tr[2]
      local f = redis.call("HMGET", jk, "pod", "phase", "n", "fwd_ms", "asm", "tk_at", "end_at")
      -- A transition older than this forward belongs to an earlier attempt on the pod
      -- (one it refused and forgot, numbered from 1 again): never this attempt's state.
      if f[1] == pod and (f[2] == "PLACED" or f[2] == "FORWARDING")
          and tonumber(tr[6]) >= tonumber(f[4] or "0") then
        if tr[3] > tonumber(f[3] or "0") then
          redis.call("HSET", jk, "pod_state", tr[5], "n", tr[3], "updated_ms", tr[6])
          if f[2] == "PLACED" then
            redis.call("HSET", jk, "reason", tr[7])
            if not down then redis.call("HSET", jk, "state", tr[5]) end
            if FINAL[tr[5]] then redis.call("SREM", prefix .. "pod:" .. pod .. ":live", tr[2]) end
          end
        end
        -- The events that took and freed the blocks of an assumption: a report at or
        -- past them shows it.
        if f[5] and not f[6] and (tr[5] == "WIRING" or tr[5] == "RUNNING") then
          redis.call("HSET", jk, "tk_at", tr[1])
        elseif f[5] == "free" and not f[7] and FINAL[tr[5]] then
          redis.call("HSET", jk, "end_at", tr[1])
        end
      end
    end
  end
  if upto > ack then
    ack = upto
    redis.call("HSET", prefix .. "ack", pod, ack)
  end
end
local old = redis.call("HGET", prefix .. "capver", pod) or ""
if version >= old then
  local changed = redis.call("HGET", prefix .. "capacity", pod) ~= cap
  redis.call("HSET", prefix .. "capacity", pod, cap)
  redis.call("HSET", prefix .. "capver", pod, version)
  local free = cjson.decode(free_json)
  -- The report's free blocks, corrected by what the cell assumes that it does not show.
  for _, job in ipairs(redis.call("SMEMBERS", assumed)) do
    local jk = prefix .. "job:" .. job
    local a = redis.call("HMGET", jk, "asm", "asm_n", "tk_at", "end_at", "asm_ms")
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
      unassume(prefix, jk, job, pod)  -- shown (or past its time: the report is the truth)
      sign = 0
    end
    if sign ~= 0 then
      for t, n in pairs(cjson.decode(a[2])) do
        if free[t] ~= nil then free[t] = free[t] + sign * n end
      end
    end
  end
  for t, n in pairs(free) do
    redis.call("HSET", prefix .. "free", pod .. "|" .. t, math.max(0, n))
  end
  -- New capacity and jobs waiting in the cell queue: time for a dispatch pass.
  if changed and redis.call("ZCARD", prefix .. "queue") > 0 then wake = 1 end
end
return {1, ack, returned, wake}
"""
)

_CLAIM_NEW = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, fields JSON, tenant, pod ("" = queue), needs JSON, token, until, now,
--       check free (0/1), event reason, check the cell queue is empty (0/1)
local prefix, job, fields, tenant, pod = ARGV[1], ARGV[2], cjson.decode(ARGV[3]), ARGV[4], ARGV[5]
local needs_json, token, upto, now, check, reason = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local jk = prefix .. "job:" .. job
if redis.call("EXISTS", jk) == 1 then return {0, redis.call("HGET", jk, "phase") or ""} end
if pod ~= "" and check == "1" and not enough_free(prefix, pod, cjson.decode(needs_json)) then
  return {-1, "stale"}
end
if ARGV[12] == "1" and redis.call("ZCARD", prefix .. "queue") > 0 then
  return {-1, "queue"}  -- decided as if nobody waited in the cell queue: decide again
end
local seq = redis.call("INCR", prefix .. "seq")
hset_all(jk, fields, {"seq", seq, "tenant", tenant, "state", "PENDING", "reason", reason,
  "created_ms", now, "updated_ms", now, "n", 0})
redis.call("ZADD", prefix .. "jobs", seq, job)
redis.call("ZADD", prefix .. "tenant:" .. tenant .. ":jobs", seq, job)
if pod ~= "" then
  redis.call("HSET", jk, "phase", "FORWARDING", "pod", pod, "token", token, "until", upto,
    "fwd_ms", now)
  take_hold(prefix, jk, pod, needs_json, job, now)
  redis.call("ZADD", prefix .. "forwarding", upto, job)
else
  redis.call("HSET", jk, "phase", "QUEUED", "pod", "")
  queue_again(prefix, jk, job)
end
cell_event(prefix, job, "", "PENDING", reason, pod, now)
return {1, tostring(seq)}
"""
)

_CLAIM_QUEUED = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, pod, needs JSON, token, until, now, check free (0/1), event reason,
--       the request the decision was made for ("" = any)
local prefix, job, pod, needs_json, token, upto, now, check, reason =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local jk = prefix .. "job:" .. job
local phase = redis.call("HGET", jk, "phase")
if phase ~= "QUEUED" then return {0, phase or ""} end
-- an update (UpdateJob) changed the request since the decision: decide again with it
if ARGV[10] ~= "" and redis.call("HGET", jk, "req") ~= ARGV[10] then return {-1, "changed"} end
if check == "1" and not enough_free(prefix, pod, cjson.decode(needs_json)) then return {-1, "stale"} end
redis.call("ZREM", prefix .. "queue", job)
redis.call("HSET", jk, "phase", "FORWARDING", "pod", pod, "token", token, "until", upto,
  "reason", reason, "updated_ms", now, "n", 0, "pod_state", "", "fwd_ms", now)
take_hold(prefix, jk, pod, needs_json, job, now)
redis.call("ZADD", prefix .. "forwarding", upto, job)
cell_event(prefix, job, "PENDING", "PENDING", reason, pod, now)
return {1, ""}
"""
)

_PLACED = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, token, pod, state, n, reason, fields JSON, now
local prefix, job, token, pod, state, n, reason, fields, now =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7], cjson.decode(ARGV[8]), ARGV[9]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "token", "n", "seq")
if f[1] ~= "FORWARDING" or f[2] ~= token then return {0, f[1] or ""} end
local hold = release_hold(prefix, jk, pod)
unassume(prefix, jk, job, pod)
if hold and (state == "WIRING" or state == "RUNNING") then
  -- The blocks are gone: counted so until a report of the pod shows them taken (a report
  -- that shows them already counted them, and held them in flight: net the same).
  for t, k in pairs(cjson.decode(hold)) do redis.call("HINCRBY", prefix .. "free", pod .. "|" .. t, -k) end
  local version = redis.call("HGET", prefix .. "capver", pod) or ""
  if not shown(redis.call("HGET", jk, "tk_at"), version) then
    assume(prefix, jk, job, pod, "take", hold, now)
  end
end
if hold then redis.call("HSET", jk, "needs", hold) end
redis.call("ZREM", prefix .. "forwarding", job)
hset_all(jk, fields, {"phase", "PLACED", "token", "", "updated_ms", now})
if n >= tonumber(f[3] or "0") then
  redis.call("HSET", jk, "pod_state", state, "n", n, "reason", reason)
else
  state = redis.call("HGET", jk, "pod_state")
end
local down = redis.call("SISMEMBER", prefix .. "down", pod) == 1
redis.call("HSET", jk, "state", down and "UNKNOWN" or state)
redis.call("ZADD", prefix .. "pod:" .. pod .. ":jobs", f[4], job)
if not FINAL[state] then redis.call("SADD", prefix .. "pod:" .. pod .. ":live", job) end
return {1, record(jk)}
"""
)

_UNBIND = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, token, pod, kind ("refused" | "uncertain"), capacity version, reason, now
local prefix, job, token, pod, kind, version, reason, now =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "token", "refused", "maybe")
if f[1] ~= "FORWARDING" or f[2] ~= token then return {0, f[1] or ""} end
local hold = release_hold(prefix, jk, pod)
-- A report showed the blocks taken (the pod may have the job after all) and counted them
-- in flight too: they stay counted as taken until the next report.
if hold and redis.call("HGET", jk, "asm") == "hold"
    and shown(redis.call("HGET", jk, "tk_at"), redis.call("HGET", prefix .. "capver", pod) or "") then
  for t, k in pairs(cjson.decode(hold)) do redis.call("HINCRBY", prefix .. "free", pod .. "|" .. t, -k) end
end
unassume(prefix, jk, job, pod)
redis.call("ZREM", prefix .. "forwarding", job)
if kind == "refused" then
  local refused = (f[3] and f[3] ~= "") and cjson.decode(f[3]) or {}
  refused[pod] = version
  redis.call("HSET", jk, "refused", cjson.encode(refused))
else
  local maybe = (f[4] and f[4] ~= "") and cjson.decode(f[4]) or {}
  local seen = false
  for _, p in ipairs(maybe) do if p == pod then seen = true end end
  if not seen then table.insert(maybe, pod) end
  redis.call("HSET", jk, "maybe", cjson.encode(maybe))
  redis.call("SADD", prefix .. "maybe", job)
end
redis.call("HSET", jk, "phase", "QUEUED", "pod", "", "token", "", "pod_state", "", "n", 0,
  "reason", reason, "updated_ms", now)
queue_again(prefix, jk, job)
cell_event(prefix, job, "PENDING", "PENDING", reason, "", now)
return {1, ""}
"""
)

_END_QUEUED = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, final state, reason, now, forget (1: delete the job, when nothing may exist of it)
local prefix, job, final, reason, now, forget = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "maybe", "tenant")
if f[1] ~= "QUEUED" then return {0, f[1] or ""} end
redis.call("ZREM", prefix .. "queue", job)
if forget == "1" and (not f[2] or f[2] == "" or f[2] == "[]") then
  redis.call("DEL", jk, jk .. ":events")
  redis.call("ZREM", prefix .. "jobs", job)
  redis.call("ZREM", prefix .. "tenant:" .. f[3] .. ":jobs", job)
  return {1, "forgotten"}
end
redis.call("HSET", jk, "phase", "ENDED", "state", final, "reason", reason, "updated_ms", now)
cell_event(prefix, job, "PENDING", final, reason, "", now)
return {1, final}
"""
)

_MIRROR = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, pod, state, n, reason, now, ended here (1: the pod's answer to a
-- complete/cancel through the cell: its blocks are free again)
local prefix, job, pod, state, n, reason, now, ended =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "pod", "phase", "n", "pod_state", "needs")
if f[1] ~= pod or f[2] ~= "PLACED" or n < tonumber(f[3] or "0") then
  return {0, 0, record(jk), 0}
end
redis.call("HSET", jk, "pod_state", state, "n", n, "reason", reason, "updated_ms", now)
if redis.call("SISMEMBER", prefix .. "down", pod) == 0 then redis.call("HSET", jk, "state", state) end
local final = state == "COMPLETED" or state == "CANCELLED" or state == "PREEMPTED" or state == "FAILED"
local freed = 0
if final then
  redis.call("SREM", prefix .. "pod:" .. pod .. ":live", job)
  if ended == "1" and (f[4] == "RUNNING" or f[4] == "WIRING") and f[5] then
    -- Its blocks are free: counted so until a report of the pod shows them freed.
    for t, k in pairs(cjson.decode(f[5])) do redis.call("HINCRBY", prefix .. "free", pod .. "|" .. t, k) end
    assume(prefix, jk, job, pod, "free", f[5], now)
    freed = 1
  end
end
return {1, redis.call("ZCARD", prefix .. "queue"), record(jk), freed}
"""
)

_UPDATE = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, phase (QUEUED | PLACED), pod, request, priority, pod spec ("" = keep),
--       event reason ("" = none), now: a job's priority or labels changed (UpdateJob)
local prefix, job, phase, pod, req, priority, spec, reason, now =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "pod", "req")
if f[1] ~= phase or (phase == "PLACED" and f[2] ~= pod) then return {0, f[1] or ""} end
-- the request as submitted stays the idempotency key of SubmitJob
redis.call("HSETNX", jk, "req0", f[3])
redis.call("HSET", jk, "req", req, "priority", priority, "updated_ms", now)
if spec ~= "" then redis.call("HSET", jk, "spec", spec) end
if phase == "QUEUED" then
  queue_again(prefix, jk, job)  -- its new place: priority, then age
  cell_event(prefix, job, "PENDING", "PENDING", reason, "", now)
end
return {1, record(jk)}
"""
)

_MARK_DOWN = (
    _PRELUDE
    + r"""
-- ARGV: prefix, pod, now, timeout ms
local prefix, pod, now, timeout = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local seen = tonumber(redis.call("ZSCORE", prefix .. "seen", pod) or "0")
if seen >= now - timeout or redis.call("SISMEMBER", prefix .. "down", pod) == 1 then return -1 end
redis.call("SADD", prefix .. "down", pod)
local count = 0
local silent = math.floor((now - seen) / 1000)
for _, job in ipairs(redis.call("SMEMBERS", prefix .. "pod:" .. pod .. ":live")) do
  local jk = prefix .. "job:" .. job
  local f = redis.call("HMGET", jk, "phase", "state")
  if f[1] == "PLACED" and f[2] ~= "UNKNOWN" and not FINAL[f[2]] then
    local why = "pod " .. pod .. " has not answered for " .. silent .. " s; last known: " .. f[2]
    redis.call("HSET", jk, "state", "UNKNOWN", "reason", why, "updated_ms", now)
    cell_event(prefix, job, f[2], "UNKNOWN", why, pod, now)
    count = count + 1
  end
end
return count
"""
)

_TAKE_OVER = r"""
-- ARGV: prefix, job, new token, until, now: a forward whose deadline passed (its replica died)
local prefix, job, token, upto, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "until", "pod")
if f[1] ~= "FORWARDING" or tonumber(f[2] or "0") >= now then return {0, ""} end
redis.call("HSET", jk, "token", token, "until", upto)
redis.call("ZADD", prefix .. "forwarding", upto, job)
return {1, f[3]}
"""

_ADOPT = (
    _PRELUDE
    + r"""
-- ARGV: prefix, job, pod, state, n, reason, fields JSON, now: a queued job found on a pod
local prefix, job, pod, state, n, reason, fields, now =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], cjson.decode(ARGV[7]), ARGV[8]
local jk = prefix .. "job:" .. job
local f = redis.call("HMGET", jk, "phase", "seq")
if f[1] ~= "QUEUED" then return 0 end
redis.call("ZREM", prefix .. "queue", job)
hset_all(jk, fields, {"phase", "PLACED", "pod", pod, "pod_state", state, "n", n, "state", state,
  "reason", reason, "updated_ms", now})
redis.call("ZADD", prefix .. "pod:" .. pod .. ":jobs", f[2], job)
if not FINAL[state] then redis.call("SADD", prefix .. "pod:" .. pod .. ":live", job) end
cell_event(prefix, job, "PENDING", state, "found on pod " .. pod .. " after it answered again", pod, now)
return 1
"""
)

_FORGET_MAYBE = r"""
-- ARGV: prefix, job, pod: a pod that may have got the job does not have it (or it was dealt with)
local prefix, job, pod = ARGV[1], ARGV[2], ARGV[3]
local jk = prefix .. "job:" .. job
local raw = redis.call("HGET", jk, "maybe")
local left = {}
if raw and raw ~= "" then
  for _, p in ipairs(cjson.decode(raw)) do if p ~= pod then table.insert(left, p) end end
end
if #left == 0 then
  redis.call("HDEL", jk, "maybe")
  redis.call("SREM", prefix .. "maybe", job)
else
  redis.call("HSET", jk, "maybe", cjson.encode(left))
end
return #left
"""


@dataclass(frozen=True)
class CellJobRecord:
    """A job as the cell stores it."""

    job_id: str
    request_b64: str
    tenant: str
    priority: int
    seq: int
    phase: str
    state: str
    reason: str
    pod: str
    created_ms: int
    updated_ms: int
    pod_state: str = ""
    n: int = 0
    token: str = ""
    until_ms: int = 0
    spec_b64: str = ""
    chips: tuple[int, ...] = ()
    block_count: int = 0
    derived: bool = False
    why: str = ""
    refused: dict[str, str] = field(default_factory=dict)
    maybe: tuple[str, ...] = ()
    needs: dict[str, int] = field(default_factory=dict)  # blocks per node type on its pod
    # The request as submitted, once an update changed `request_b64` (SubmitJob's
    # idempotency key stays the first request).
    first_request_b64: str = ""

    @property
    def submitted_b64(self) -> str:
        return self.first_request_b64 or self.request_b64

    @classmethod
    def of(cls, job_id: str, row: Mapping[str, str]) -> CellJobRecord | None:
        if not row or "phase" not in row:
            return None
        return cls(
            job_id=job_id,
            request_b64=row.get("req", ""),
            tenant=row.get("tenant", ""),
            priority=int(row.get("priority", 0)),
            seq=int(row.get("seq", 0)),
            phase=row["phase"],
            state=row.get("state", "PENDING"),
            reason=row.get("reason", ""),
            pod=row.get("pod", ""),
            created_ms=int(row.get("created_ms", 0)),
            updated_ms=int(row.get("updated_ms", 0)),
            pod_state=row.get("pod_state", ""),
            n=int(row.get("n") or 0),
            token=row.get("token", ""),
            until_ms=int(row.get("until") or 0),
            spec_b64=row.get("spec", ""),
            chips=tuple(int(c) for c in row["chips"].split("x")) if row.get("chips") else (),
            block_count=int(row.get("blocks") or 0),
            derived=row.get("derived") == "1",
            why=row.get("why", ""),
            refused=json.loads(row["refused"]) if row.get("refused") else {},
            maybe=tuple(json.loads(row["maybe"])) if row.get("maybe") else (),
            needs=json.loads(row["needs"]) if row.get("needs") else {},
            first_request_b64=row.get("req0", ""),
        )


@dataclass(frozen=True)
class RegistrySnapshot:
    """The registry as planning reads it (one round trip)."""

    registrations: dict[str, str]  # pod -> base64 PodRegistration
    capacities: dict[str, str]  # pod -> base64 PodCapacity
    versions: dict[str, str]  # pod -> capacity version
    free: dict[str, int]  # "pod|type" -> blocks
    held: dict[str, int]  # "pod|type" -> blocks
    seen: dict[str, int]  # pod -> ms
    suspect: dict[str, int]  # pod -> until ms
    down: set[str]
    endpoint: dict[str, str]  # pod -> the scheduler replica heard from last
    queue: list[str]  # job ids in queue order
    existing: dict[str, str] | None = None  # the job asked about, if any


def _row(values: Sequence[Any]) -> dict[str, str]:
    """RECORD_FIELDS' values (HMGET order) as a dict of the fields that are set."""
    return {f: v for f, v in zip(RECORD_FIELDS, values, strict=True) if v is not None}


def _i(v: Any) -> int:
    return int(float(v)) if v not in (None, "") else 0


class CellStore:
    """Redis persistence of the cell (CS-1, CS-5, CS-6)."""

    def __init__(self, redis: aioredis.Redis):
        # decode_responses=True: every reply is str (the stubs' bytes | str unions do not apply).
        self.redis: Any = redis
        self.prefix = cell_key("x")[: -len("x")]  # "lp:{cell}:"
        self._register = redis.register_script(_REGISTER)
        self._report = redis.register_script(_REPORT)
        self._claim_new = redis.register_script(_CLAIM_NEW)
        self._claim_queued = redis.register_script(_CLAIM_QUEUED)
        self._placed = redis.register_script(_PLACED)
        self._unbind = redis.register_script(_UNBIND)
        self._end_queued = redis.register_script(_END_QUEUED)
        self._mirror = redis.register_script(_MIRROR)
        self._mark_down = redis.register_script(_MARK_DOWN)
        self._take_over = redis.register_script(_TAKE_OVER)
        self._adopt = redis.register_script(_ADOPT)
        self._forget_maybe = redis.register_script(_FORGET_MAYBE)
        self._update = redis.register_script(_UPDATE)

    def key(self, *parts: object) -> str:
        return cell_key(*parts)

    def job_key(self, job_id: str) -> str:
        return cell_key("job", job_id)

    async def _run(self, script, *args: Any) -> Any:
        # Every key is derived from the prefix inside the scripts (one hash tag, one slot);
        # the prefix is passed as the one declared key's sibling so the script's slot is known.
        return await script(keys=[self.key("seq")], args=[self.prefix, *args])

    # -- registry (CS-1) -----------------------------------------------------------

    async def register(
        self, pod_id: str, registration_b64: str, endpoint: str, now_ms: int, tip: str
    ) -> bool:
        """Store a pod's registration; True if it had been marked silent."""
        returned = await self._run(
            self._register, pod_id, registration_b64, endpoint, now_ms, pad_id(tip)
        )
        return bool(int(returned))

    async def report(
        self,
        pod_id: str,
        *,
        endpoint: str,
        now_ms: int,
        capacity_b64: str,
        version: str,
        free: Mapping[str, int],
        after: str,
        until: str,
        transitions: Sequence[Sequence[Any]],
        assume_ms: int,
    ) -> tuple[bool, str, bool, bool]:
        """Apply a heartbeat: (known pod, ack, came back from silent, the cell queue should
        be looked at again). The reported free blocks are corrected by the placements and
        ends through the cell that the report does not show yet (its version predates the
        pod's event of them), each for at most `assume_ms`."""
        ok, ack, returned, wake = await self._run(
            self._report,
            pod_id,
            endpoint,
            now_ms,
            capacity_b64,
            pad_id(version),
            json.dumps(dict(free)),
            pad_id(after),
            pad_id(until),
            json.dumps([[pad_id(t[0]), *t[1:]] for t in transitions]),
            assume_ms,
        )
        return int(ok) == 1, unpad_id(ack), bool(int(returned)), bool(int(wake))

    async def snapshot(self, job_id: str | None = None, *, queue: bool = True) -> RegistrySnapshot:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key("pods"))
            pipe.hgetall(self.key("capacity"))
            pipe.hgetall(self.key("capver"))
            pipe.hgetall(self.key("free"))
            pipe.hgetall(self.key("held"))
            pipe.zrange(self.key("seen"), 0, -1, withscores=True)
            pipe.hgetall(self.key("suspect"))
            pipe.smembers(self.key("down"))
            pipe.hgetall(self.key("endpoint"))
            if queue:
                pipe.zrange(self.key("queue"), 0, -1)
            if job_id is not None:
                pipe.hmget(self.job_key(job_id), RECORD_FIELDS)
            got = await pipe.execute()
        pods, caps, vers, free, held, seen, suspect, down, endpoint = got[:9]
        rest = got[9:]
        q = rest.pop(0) if queue else []
        existing = _row(rest.pop(0)) if job_id is not None else None
        return RegistrySnapshot(
            pods,
            caps,
            vers,
            {k: _i(v) for k, v in free.items()},
            {k: _i(v) for k, v in held.items()},
            {p: int(s) for p, s in seen},
            {p: _i(v) for p, v in suspect.items()},
            set(down),
            dict(endpoint),
            list(q),
            existing or None,
        )

    async def heard_from(self, pod_id: str) -> tuple[int, bool]:
        """(last heartbeat in ms, 0 if never; marked silent) of one pod, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zscore(self.key("seen"), pod_id)
            pipe.sismember(self.key("down"), pod_id)
            seen, down = await pipe.execute()
        return int(seen or 0), bool(down)

    async def mark_suspect(self, pod_id: str, until_ms: int) -> None:
        await self.redis.hset(self.key("suspect"), pod_id, until_ms)

    async def registration(self, pod_id: str) -> str | None:
        return await self.redis.hget(self.key("pods"), pod_id)

    async def endpoint(self, pod_id: str) -> str | None:
        return await self.redis.hget(self.key("endpoint"), pod_id)

    async def endpoints(self, pod_id: str) -> list[tuple[str, int]]:
        raw = await self.redis.hgetall(self.key("endpoints", pod_id))
        return sorted(((a, _i(t)) for a, t in raw.items()), key=lambda e: -e[1])

    async def live_count(self, pod_id: str) -> int:
        return int(await self.redis.scard(self.key("pod", pod_id, "live")))

    async def mark_down(self, pod_id: str, now_ms: int, timeout_ms: int) -> int:
        """Mark a silent pod down and its jobs UNKNOWN (CS-6); -1 if it is not (newly) silent."""
        return int(await self._run(self._mark_down, pod_id, now_ms, timeout_ms))

    async def live_jobs(self, pod_id: str) -> list[str]:
        return sorted(await self.redis.smembers(self.key("pod", pod_id, "live")))

    # -- jobs (CS-2 … CS-5) ----------------------------------------------------------

    async def claim_new(
        self,
        job_id: str,
        *,
        fields: Mapping[str, Any],
        tenant: str,
        pod: str,
        needs: Mapping[str, int],
        token: str,
        until_ms: int,
        now_ms: int,
        check_free: bool,
        reason: str,
        expect_empty_queue: bool = False,
    ) -> tuple[int, str]:
        """Create the job, bound to `pod` (or queued when pod is ""). (1, seq) when
        created; (0, phase) when the id exists; (-1, why) when the pod's free blocks
        (minus forwards in flight) no longer cover it, or jobs wait in the cell queue
        that the decision did not know of."""
        ok, detail = await self._run(
            self._claim_new,
            job_id,
            json.dumps({k: str(v) for k, v in fields.items()}),
            tenant,
            pod,
            json.dumps(dict(needs)),
            token,
            until_ms,
            now_ms,
            "1" if check_free else "0",
            reason,
            "1" if expect_empty_queue else "0",
        )
        return int(ok), detail

    async def claim_queued(
        self,
        job_id: str,
        *,
        pod: str,
        needs: Mapping[str, int],
        token: str,
        until_ms: int,
        now_ms: int,
        check_free: bool,
        reason: str,
        request: str = "",
    ) -> tuple[int, str]:
        """A queued job bound to `pod`: (1, "") claimed; (0, phase) no longer queued; (-1,
        why) its blocks went ("stale") or, with `request`, its request is no longer the
        one the decision was made for ("changed": updated meanwhile)."""
        ok, detail = await self._run(
            self._claim_queued,
            job_id,
            pod,
            json.dumps(dict(needs)),
            token,
            until_ms,
            now_ms,
            "1" if check_free else "0",
            reason,
            request,
        )
        return int(ok), detail

    async def placed(
        self,
        job_id: str,
        *,
        token: str,
        pod: str,
        state: str,
        n: int,
        reason: str,
        fields: Mapping[str, Any],
        now_ms: int,
    ) -> CellJobRecord | None:
        """FORWARDING → PLACED on `pod`, the record as it is then; None if the token no
        longer holds the job."""
        ok, detail = await self._run(
            self._placed,
            job_id,
            token,
            pod,
            state,
            n,
            reason,
            json.dumps({k: str(v) for k, v in fields.items()}),
            now_ms,
        )
        if int(ok) != 1:
            return None
        return CellJobRecord.of(job_id, _row(detail))

    async def unbind(
        self,
        job_id: str,
        *,
        token: str,
        pod: str,
        uncertain: bool,
        version: str,
        reason: str,
        now_ms: int,
    ) -> bool:
        ok, _ = await self._run(
            self._unbind,
            job_id,
            token,
            pod,
            "uncertain" if uncertain else "refused",
            version,
            reason,
            now_ms,
        )
        return int(ok) == 1

    async def end_queued(
        self, job_id: str, final: str, reason: str, now_ms: int, *, forget: bool = False
    ) -> tuple[bool, str]:
        ok, detail = await self._run(
            self._end_queued, job_id, final, reason, now_ms, "1" if forget else "0"
        )
        return int(ok) == 1, detail

    async def mirror(
        self,
        job_id: str,
        *,
        pod: str,
        state: str,
        n: int,
        reason: str,
        now_ms: int,
        ended_here: bool = False,
    ) -> tuple[bool, int, CellJobRecord | None, bool]:
        """Follow the pod's answer about a job (newer than what the cell has): (applied,
        jobs in the cell queue, the record after, its blocks counted free). `ended_here`:
        the answer to a complete or cancel through the cell, whose freed blocks count as
        free until the pod reports."""
        ok, queued, row, freed = await self._run(
            self._mirror, job_id, pod, state, n, reason, now_ms, "1" if ended_here else "0"
        )
        record = CellJobRecord.of(job_id, _row(row))
        return int(ok) == 1, int(queued), record, bool(int(freed))

    async def update(
        self,
        job_id: str,
        *,
        phase: str,
        pod: str,
        request: str,
        priority: int,
        spec: str,
        reason: str,
        now_ms: int,
    ) -> CellJobRecord | None:
        """A job's new request and priority (UpdateJob), if it is still in `phase` (and on
        `pod`): in the cell queue it takes its new place, with an event; the record
        after, or None when the job moved on meanwhile."""
        ok, row = await self._run(
            self._update, job_id, phase, pod, request, priority, spec, reason, now_ms
        )
        if int(ok) != 1:
            return None
        return CellJobRecord.of(job_id, _row(row))

    async def take_over(self, job_id: str, token: str, until_ms: int, now_ms: int) -> str | None:
        """Take a forward whose deadline passed; the pod it was bound to, or None."""
        ok, pod = await self._run(self._take_over, job_id, token, until_ms, now_ms)
        return pod if int(ok) == 1 else None

    async def adopt(
        self,
        job_id: str,
        *,
        pod: str,
        state: str,
        n: int,
        reason: str,
        fields: Mapping[str, Any],
        now_ms: int,
    ) -> bool:
        return bool(
            int(
                await self._run(
                    self._adopt,
                    job_id,
                    pod,
                    state,
                    n,
                    reason,
                    json.dumps({k: str(v) for k, v in fields.items()}),
                    now_ms,
                )
            )
        )

    async def forget_maybe(self, job_id: str, pod: str) -> None:
        await self._run(self._forget_maybe, job_id, pod)

    async def job(self, job_id: str) -> CellJobRecord | None:
        return CellJobRecord.of(
            job_id, _row(await self.redis.hmget(self.job_key(job_id), RECORD_FIELDS))
        )

    async def jobs(self, job_ids: Iterable[str]) -> list[CellJobRecord]:
        ids = list(job_ids)
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for j in ids:
                pipe.hmget(self.job_key(j), RECORD_FIELDS)
            rows = await pipe.execute()
        return [
            r for j, row in zip(ids, rows, strict=True) if (r := CellJobRecord.of(j, _row(row)))
        ]

    async def history(self, job_id: str, start: int = 0) -> list[dict[str, Any]]:
        raw = await self.redis.lrange(self.key("job", job_id, "events"), start, -1)
        return [json.loads(e) for e in raw]

    async def queue_position(self, job_id: str) -> int:
        """1-based place in the cell queue; 0 when the job is not in it."""
        rank = await self.redis.zrank(self.key("queue"), job_id)
        return int(rank) + 1 if rank is not None else 0

    async def queue_positions(self, job_ids: Sequence[str]) -> dict[str, int]:
        """`queue_position` of several jobs in one round trip."""
        if not job_ids:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.zrank(self.key("queue"), job_id)
            ranks = await pipe.execute()
        return {j: int(r) + 1 if r is not None else 0 for j, r in zip(job_ids, ranks, strict=True)}

    async def page(self, index: str, *, before_seq: int | None, count: int) -> list[str]:
        hi = f"({before_seq}" if before_seq is not None else "+inf"
        return list(
            await self.redis.zrevrangebyscore(index, hi, "-inf", start=0, num=count)  # type: ignore[arg-type]
        )

    async def seq_of(self, index: str, job_id: str) -> int | None:
        score = await self.redis.zscore(index, job_id)
        return int(score) if score is not None else None

    async def stuck_forwards(self, now_ms: int) -> list[str]:
        return list(await self.redis.zrangebyscore(self.key("forwarding"), "-inf", now_ms))

    async def maybe_jobs(self) -> list[str]:
        return sorted(await self.redis.smembers(self.key("maybe")))

    async def lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        """A short lease so one replica does a piece of background work at a time."""
        return bool(await self.redis.set(self.key("lease", name), owner, nx=True, px=ttl_ms))

    async def release_lease(self, name: str, owner: str) -> None:
        key = self.key("lease", name)
        if await self.redis.get(key) == owner:
            await self.redis.delete(key)

    async def stream_tip(self) -> str:
        last = await self.redis.xrevrange(self.key("events"), count=1)
        return last[0][0] if last else "0-0"

    async def tail(self, after: str, block_ms: int = 1000) -> list[tuple[str, dict[str, str]]]:
        got = await self.redis.xread({self.key("events"): after}, block=block_ms, count=200)
        return [(eid, fields) for _stream, entries in got or [] for eid, fields in entries]
