"""Redis persistence of the core broker (X-4): keys, Lua scripts, the change stream.

Every broker key shares the `{broker}` hash tag (`broker_key`), so one Lua
script may touch any device's schedule together with reservations, timers and
the change stream: Redis is the arbiter of truth and each script is one atomic
step. Application credentials live under their own tenant tag
(`tenant_key(app, "app")`).

    lp:{broker}:devices          HASH  device id -> device JSON
    lp:{broker}:cores            HASH  device id -> cores (what the scripts check)
    lp:{broker}:alloc:<device>   ZSET  "<reservation>:<part>:<end>:<cores>" scored by start (ms)
    lp:{broker}:res:<id>         HASH  data (reservation JSON), app, v (version of its last change)
    lp:{broker}:app:<app>:res    ZSET  the application's reservation ids by creation time
    lp:{broker}:all-res          ZSET  every reservation id by creation time (operator listing)
    lp:{broker}:timers           ZSET  reservation id -> when it next starts or ends a part (ms)
    lp:{broker}:latency          HASH  "<site>|<device>" -> latency ms (CB-7)
    lp:{broker}:version          STRING  change counter, +1 per script that changed anything
    lp:{broker}:changes          STREAM  one entry per change: v, ops (capacity deltas), ev (events)
    lp:{t:<app>}:app             HASH  salt, hash (of the credential), qos, billing, created

CB-9: `commit` re-checks, on each touched device, that at no instant of each
granted interval the reserved cores exceed the device's cores, counting every
allocation already there; a group that would over-commit is refused whole
("conflict") and the caller decides again on fresher state. Allocations are
removed from a device's ZSET when they end (`reap`) or are released, so the
ZSETs hold only live and future allocations.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from services.common.keys import broker_key, tenant_key

PREFIX = broker_key("x")[: -len("x")]  # "lp:{broker}:"
STREAM_MAXLEN = 20_000

# Shared by the scripts: the peak of reserved cores over the new intervals.
_LUA_LIB = r"""
local P = ARGV[1]
local function parse(member, start)
  local e, c = string.match(member, "^[^:]+:%d+:(%d+):(%d+)$")
  return {tonumber(start), tonumber(e), tonumber(c)}
end
-- intervals {s, e, c} of `dev` overlapping [lo, hi)
local function existing(dev, lo, hi)
  local out = {}
  local raw = redis.call("ZRANGEBYSCORE", P .. "alloc:" .. dev, "-inf", "(" .. string.format("%d", hi), "WITHSCORES")
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
local version = nil
local function bump()
  if not version then version = redis.call("INCR", P .. "version") end
  return version
end
local function publish(ops, events, maxlen)
  if not version then return "" end
  local o = #ops > 0 and cjson.encode(ops) or "[]"
  local ev = #events > 0 and cjson.encode(events) or "[]"
  return redis.call("XADD", P .. "changes", "MAXLEN", "~", maxlen, "*", "v", version, "ops", o, "ev", ev)
end
local function fmt(n) return string.format("%d", n) end
"""

# ARGV: prefix, now, payload JSON, stream maxlen, seen version ("" = unknown), seen stream id
# payload: [ticket, ...]; ticket: {ids: [id, ...], groups: [group, ...]}; group: [reservation, ...];
# reservation: {id, app, data, created, due, parts: [[device, cores, start, end, member], ...]}
# Returns {version written or 0, stream id, status per ticket, current version, 1 if re-checked
# else 0}; a ticket's status is
# "exists:<id>" (nothing of it written) or a list of "ok" / "conflict:<device>" per group.
# The decisions were made on the seen version; only devices whose schedules may have filled
# since are re-checked: none when the store is still at that version and stream entry
# (compare-and-set), else those that the stream's entries since then add to (a removal only
# frees cores). Every device is re-checked when those entries cannot be read whole (more than
# MAX_UNSEEN of them, trimmed, or not consecutive) or one changes a device's record.
_COMMIT = (
    _LUA_LIB
    + r"""
local now = tonumber(ARGV[2])
local tickets = cjson.decode(ARGV[3])
local maxlen = ARGV[4]
local ops, events, out = {}, {}, {}
local MAX_UNSEEN = 64
local filled = nil -- devices to re-check (a set); nil: every device
if ARGV[5] ~= "" then
  local seen = tonumber(ARGV[5])
  local cur = tonumber(redis.call("GET", P .. "version") or "0")
  if cur == seen then
    local last = redis.call("XREVRANGE", KEYS[1], "+", "-", "COUNT", 1)
    if (last[1] and last[1][1] or "0-0") == ARGV[6] then filled = {} end
  elseif cur > seen and cur - seen <= MAX_UNSEEN then
    local entries = redis.call("XRANGE", KEYS[1], "(" .. ARGV[6], "+", "COUNT", cur - seen)
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
local rechecked = false
for ti, ticket in ipairs(tickets) do
  local taken = nil
  for _, id in ipairs(ticket.ids) do
    if not taken and redis.call("EXISTS", P .. "res:" .. id) == 1 then taken = id end
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
          rechecked = true
          local parts = bydev[dev]
          local cores = tonumber(redis.call("HGET", P .. "cores", dev))
          if not cores then status = "conflict:" .. dev; break end
          local lo, hi = parts[1][3], parts[1][4]
          for _, p in ipairs(parts) do
            if p[3] < lo then lo = p[3] end
            if p[4] > hi then hi = p[4] end
          end
          local ivs = existing(dev, lo, hi)
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
            redis.call("ZADD", P .. "alloc:" .. p[1], fmt(p[3]), p[5])
            ops[#ops + 1] = {"+", p[1], p[5], p[3], p[4], p[2]}
          end
          redis.call("HSET", P .. "res:" .. r.id, "data", r.data, "app", r.app, "v", v)
          redis.call("ZADD", P .. "app:" .. r.app .. ":res", fmt(r.created), r.id)
          redis.call("ZADD", P .. "all-res", fmt(r.created), r.id)
          redis.call("ZADD", P .. "timers", fmt(r.due), r.id)
          events[#events + 1] = {"CREATED", r.id, r.app, r.data}
          if r.started then events[#events + 1] = {"STARTED", r.id, r.app, r.data} end
        end
      end
      statuses[gi + 1] = status
    end
    out[ti] = statuses
  end
end
local sid = publish(ops, events, maxlen)
return {version or 0, sid, out, tonumber(redis.call("GET", P .. "version") or "0"), rechecked and 1 or 0}
"""
)

# Shared by release / extend / reap: load a reservation and check its owner.
_LUA_RECORD = r"""
local function load(id, app)
  local h = redis.call("HMGET", P .. "res:" .. id, "data", "app", "v")
  if not h[1] then return nil, "missing" end
  if app ~= "" and h[2] ~= app then return nil, "denied" end
  return cjson.decode(h[1]), h
end
local function save(id, rec)
  local data = cjson.encode(rec)
  redis.call("HSET", P .. "res:" .. id, "data", data, "v", bump())
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
local function finish(id, rec, retention)
  redis.call("ZREM", P .. "timers", id)
  redis.call("PEXPIRE", P .. "res:" .. id, retention)
end
"""

# ARGV: prefix, now, id, app ("" = operator), retention ms, maxlen
_RELEASE = (
    _LUA_LIB
    + _LUA_RECORD
    + r"""
local now, id, app, retention, maxlen = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local rec, h = load(id, app)
if not rec then return {h} end
if rec.state == "RELEASED" then return {"released", h[1], tonumber(h[3])} end
if rec.state == "ENDED" then return {"ended", h[1], tonumber(h[3])} end
local ops = {}
for _, p in ipairs(rec.parts) do
  if not p.ended and not p.cancelled then
    redis.call("ZREM", P .. "alloc:" .. p.dev, p.member)
    ops[#ops + 1] = {"-", p.dev, p.member}
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
finish(id, rec, retention)
publish(ops, {{"RELEASED", id, rec.app, data}}, maxlen)
return {"ok", data, version}
"""
)

# ARGV: prefix, now, id, app, new end, maxlen
_EXTEND = (
    _LUA_LIB
    + _LUA_RECORD
    + r"""
local now, id, app, new_end, maxlen = tonumber(ARGV[2]), ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local rec, h = load(id, app)
if not rec then return {h} end
if rec.state == "RELEASED" or rec.state == "ENDED" then return {string.lower(rec.state), h[1], tonumber(h[3])} end
local last = nil
for _, p in ipairs(rec.parts) do
  if not p.cancelled and (not last or p["end"] > last) then last = p["end"] end
end
local shift = new_end - last
if shift == 0 then return {"ok", h[1], tonumber(h[3])} end
if shift < 0 then return {"shorter", fmt(last)} end
-- check every unfinished part's extension [end, end + shift), together
local moving, bydev, order = {}, {}, {}
for i, p in ipairs(rec.parts) do
  if not p.cancelled and not p.ended then
    moving[#moving + 1] = i
    if not bydev[p.dev] then bydev[p.dev] = {}; order[#order + 1] = p.dev end
    table.insert(bydev[p.dev], p)
  end
end
if #moving == 0 then return {"ended", h[1], tonumber(h[3])} end
local worst_dev, worst_limit = nil, nil
for _, dev in ipairs(order) do
  local cores = tonumber(redis.call("HGET", P .. "cores", dev)) or 0
  local parts = bydev[dev]
  local lo, hi = parts[1]["end"], parts[1]["end"] + shift
  for _, p in ipairs(parts) do
    if p["end"] < lo then lo = p["end"] end
    if p["end"] + shift > hi then hi = p["end"] + shift end
  end
  local ivs = existing(dev, lo, hi)
  local ext = {}
  for _, p in ipairs(parts) do ext[#ext + 1] = {p["end"], p["end"] + shift, p.cores} end
  local all = {}
  for _, v in ipairs(ivs) do all[#all + 1] = v end
  for _, v in ipairs(ext) do all[#all + 1] = v end
  for _, x in ipairs(ext) do
    if peak(all, x[1], x[2]) > cores then
      -- how far could this part go: the first instant its extension would over-commit
      local pts = {x[1]}
      for _, v in ipairs(all) do if v[1] > x[1] and v[1] < x[2] then pts[#pts + 1] = v[1] end end
      table.sort(pts)
      local limit = x[1]
      for _, t in ipairs(pts) do
        local sum = 0
        for _, v in ipairs(all) do if v[1] <= t and t < v[2] then sum = sum + v[3] end end
        if sum > cores then limit = t; break end
      end
      if not worst_limit or (limit - x[1]) < worst_limit then worst_limit = limit - x[1]; worst_dev = dev end
    end
  end
end
if worst_dev then return {"full", worst_dev, fmt(last + worst_limit)} end
local ops = {}
for _, i in ipairs(moving) do
  local p = rec.parts[i]
  redis.call("ZREM", P .. "alloc:" .. p.dev, p.member)
  ops[#ops + 1] = {"-", p.dev, p.member}
  p["end"] = p["end"] + shift
  p.member = string.format("%s:%d:%d:%d", id, i - 1, p["end"], p.cores)
  redis.call("ZADD", P .. "alloc:" .. p.dev, fmt(p.start), p.member)
  ops[#ops + 1] = {"+", p.dev, p.member, p.start, p["end"], p.cores}
end
local data = save(id, rec)
local due = next_due(rec)
if due then redis.call("ZADD", P .. "timers", fmt(due), id) end
publish(ops, {{"EXTENDED", id, rec.app, data}}, maxlen)
return {"ok", data, version}
"""
)

# ARGV: prefix, now, limit, retention ms, maxlen. Moves due reservations on:
# parts start and end, cores return, ended reservations expire after `retention`.
_REAP = (
    _LUA_LIB
    + _LUA_RECORD
    + r"""
local now, limit, retention, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ids = redis.call("ZRANGEBYSCORE", P .. "timers", "-inf", fmt(now), "LIMIT", 0, limit)
local ops, events = {}, {}
for _, id in ipairs(ids) do
  local rec = load(id, "")
  if not rec then
    redis.call("ZREM", P .. "timers", id)
  else
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
          redis.call("ZREM", P .. "alloc:" .. p.dev, p.member)
          ops[#ops + 1] = {"-", p.dev, p.member}
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
    if due then redis.call("ZADD", P .. "timers", fmt(due), id) else finish(id, rec, retention) end
    for _, k in ipairs(kinds) do events[#events + 1] = {k, id, rec.app, data} end
  end
end
publish(ops, events, maxlen)
local nxt = redis.call("ZRANGE", P .. "timers", 0, 0, "WITHSCORES")
return {#ids, nxt[2] or ""}
"""
)

# ARGV: prefix, device id, device JSON, cores, maxlen
_UPSERT_DEVICE = (
    _LUA_LIB
    + r"""
local dev, doc, cores, maxlen = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local raw = redis.call("ZRANGE", P .. "alloc:" .. dev, 0, -1, "WITHSCORES")
local ivs = {}
for i = 1, #raw, 2 do ivs[#ivs + 1] = parse(raw[i], raw[i + 1]) end
local most = 0
for _, v in ipairs(ivs) do
  local p = peak(ivs, v[1], v[2])
  if p > most then most = p end
end
if most > cores then return {"busy", most} end
redis.call("HSET", P .. "devices", dev, doc)
redis.call("HSET", P .. "cores", dev, cores)
bump()
publish({{"d", doc}}, {}, maxlen)
return {"ok", version}
"""
)

# ARGV: prefix, device id, maxlen
_REMOVE_DEVICE = (
    _LUA_LIB
    + r"""
local dev, maxlen = ARGV[2], ARGV[3]
if redis.call("HEXISTS", P .. "devices", dev) == 0 then return {"missing"} end
local n = redis.call("ZCARD", P .. "alloc:" .. dev)
if n > 0 then return {"busy", n} end
redis.call("HDEL", P .. "devices", dev)
redis.call("HDEL", P .. "cores", dev)
redis.call("DEL", P .. "alloc:" .. dev)
bump()
publish({{"D", dev}}, {}, maxlen)
return {"ok", version}
"""
)

# ARGV: prefix, entries JSON [[site, device, ms or -1], ...], maxlen
_SET_LATENCY = (
    _LUA_LIB
    + r"""
local entries, maxlen = cjson.decode(ARGV[2]), ARGV[3]
local ops = {}
for _, e in ipairs(entries) do
  local field = e[1] .. "|" .. e[2]
  if e[3] < 0 then redis.call("HDEL", P .. "latency", field)
  else redis.call("HSET", P .. "latency", field, e[3]) end
  ops[#ops + 1] = {"l", e[1], e[2], e[3]}
end
bump()
publish(ops, {}, maxlen)
return {redis.call("HLEN", P .. "latency"), version}
"""
)

_SNAPSHOT = r"""
local P = ARGV[1]
local v = tonumber(redis.call("GET", P .. "version") or "0")
local last = redis.call("XREVRANGE", P .. "changes", "+", "-", "COUNT", 1)
local sid = "0-0"
if #last > 0 then sid = last[1][1] end
local devs = redis.call("HGETALL", P .. "devices")
local allocs = {}
for i = 1, #devs, 2 do
  allocs[#allocs + 1] = devs[i]
  allocs[#allocs + 1] = redis.call("ZRANGE", P .. "alloc:" .. devs[i], 0, -1, "WITHSCORES")
end
return {v, sid, devs, redis.call("HGETALL", P .. "latency"), allocs}
"""


def allocation_member(reservation_id: str, part: int, end: int, cores: int) -> str:
    """The ZSET member of one allocation: what the scripts parse and the view keys rows by."""
    return f"{reservation_id}:{part}:{end}:{cores}"


@dataclass
class Change:
    """One change stream entry: capacity deltas (`ops`) and events
    `[type, reservation id, application id, reservation JSON]`, both parsed on
    first use (a replica skips the entries it applied already unparsed)."""

    stream_id: str
    version: int
    raw_ops: str = "[]"
    raw_events: str = "[]"
    parsed_ops: list[list[Any]] | None = None
    parsed_events: list[list[Any]] | None = None

    @property
    def ops(self) -> list[list[Any]]:
        if self.parsed_ops is None:
            self.parsed_ops = _list(json.loads(self.raw_ops))
        return self.parsed_ops

    @property
    def events(self) -> list[list[Any]]:
        if self.parsed_events is None:
            self.parsed_events = _list(json.loads(self.raw_events))
        return self.parsed_events


@dataclass(frozen=True)
class Snapshot:
    version: int
    stream_id: str
    devices: dict[str, dict[str, Any]]
    latency: dict[tuple[str, str], float]
    allocations: dict[str, list[tuple[str, int]]]  # device -> [(member, start)]


@dataclass
class PendingReservation:
    """A decided reservation to write: its record and its parts."""

    reservation_id: str
    application_id: str
    record: dict[str, Any]
    created: int
    parts: list[tuple[str, int, int, int, str]] = field(default_factory=list)

    @property
    def started(self) -> bool:
        """Some part starts at once (its record says so; the commit announces STARTED)."""
        return any(p["started"] for p in self.record["parts"])

    def payload(self) -> dict[str, Any]:
        # the next time the sweep must look at it: a part's start, or a started part's end
        due = min(p["end"] if p["started"] else p["start"] for p in self.record["parts"])
        return {
            "id": self.reservation_id,
            "app": self.application_id,
            "data": json.dumps(self.record, separators=(",", ":")),
            "created": self.created,
            "due": due,
            "started": self.started,
            "parts": [list(p) for p in self.parts],
        }


@dataclass(frozen=True)
class CommitResult:
    version: int  # of the change written, 0 if nothing was
    stream_id: str
    # per ticket: ("exists", id) or ("groups", ["ok" | "conflict:<device>", ...])
    tickets: list[tuple[str, Any]]
    current_version: int = 0  # the store's version after the call
    rechecked: bool = True  # False: decided on the store's current state, not re-read


@dataclass(frozen=True)
class ScriptResult:
    status: str
    data: dict[str, Any] | None = None
    version: int = 0
    detail: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApplicationRecord:
    application_id: str
    qos_level: str
    billing_model: str
    salt: str
    digest: str


def credential_digest(salt: str, secret: str) -> str:
    return hashlib.sha256((salt + ":" + secret).encode()).hexdigest()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _list(value: Any) -> list:
    """cjson writes an empty array as {}."""
    return value if isinstance(value, list) else []


class BrokerStore:
    """The broker's Redis state. `redis` must decode responses (the runtime's client does)."""

    def __init__(self, redis: aioredis.Redis, *, retention_ms: int, maxlen: int = STREAM_MAXLEN):
        self._r: Any = redis  # decode_responses=True: str in, str out
        self.retention_ms = retention_ms
        self.maxlen = maxlen
        self._commit = redis.register_script(_COMMIT)
        self._release = redis.register_script(_RELEASE)
        self._extend = redis.register_script(_EXTEND)
        self._reap = redis.register_script(_REAP)
        self._upsert_device = redis.register_script(_UPSERT_DEVICE)
        self._remove_device = redis.register_script(_REMOVE_DEVICE)
        self._set_latency = redis.register_script(_SET_LATENCY)
        self._snapshot = redis.register_script(_SNAPSHOT)
        self.changes_key = broker_key("changes")

    # -- reservations ---------------------------------------------------------

    async def commit(
        self,
        tickets: Sequence[tuple[Sequence[str], Sequence[Sequence[PendingReservation]]]],
        now: int,
        seen: tuple[int, str] | None = None,
    ) -> CommitResult:
        """Write decided reservations, re-checking capacity (CB-9). A ticket is
        one caller's share of a batch, (ids, groups): if any of `ids` exists
        already nothing of it is written; otherwise each group (all-or-nothing)
        is written whole or refused on a device that would over-commit.

        `seen` is the (version, stream id) of the view the groups were decided
        on. If the store is still there, nothing has changed since, so the
        decisions hold as they are and the re-check (a read of every touched
        device's schedule) is skipped; otherwise every group is checked."""
        payload = [
            {"ids": list(ids), "groups": [[r.payload() for r in g] for g in groups]}
            for ids, groups in tickets
        ]
        raw = await self._commit(
            keys=[self.changes_key],
            args=[
                PREFIX,
                now,
                json.dumps(payload, separators=(",", ":")),
                self.maxlen,
                "" if seen is None else seen[0],
                "" if seen is None else seen[1],
            ],
        )
        version, sid, out = int(raw[0]), _text(raw[1]), raw[2]
        tickets_out: list[tuple[str, Any]] = []
        for status in out:
            if isinstance(status, list):
                tickets_out.append(("groups", [_text(s) for s in status[1:]]))
            else:
                tickets_out.append(("exists", _text(status).split(":", 1)[1]))
        return CommitResult(version, sid, tickets_out, int(raw[3]), bool(int(raw[4])))

    async def release(self, reservation_id: str, app: str | None, now: int) -> ScriptResult:
        raw = await self._release(
            keys=[self.changes_key],
            args=[PREFIX, now, reservation_id, app or "", self.retention_ms, self.maxlen],
        )
        return self._result(raw)

    async def extend(
        self, reservation_id: str, app: str | None, new_end: int, now: int
    ) -> ScriptResult:
        raw = await self._extend(
            keys=[self.changes_key],
            args=[PREFIX, now, reservation_id, app or "", new_end, self.maxlen],
        )
        return self._result(raw)

    @staticmethod
    def _result(raw: list[Any]) -> ScriptResult:
        status = _text(raw[0])
        if status in {"ok", "released", "ended"} and len(raw) >= 3:
            return ScriptResult(status, json.loads(_text(raw[1])), int(raw[2] or 0))
        return ScriptResult(status, None, 0, tuple(_text(x) for x in raw[1:]))

    async def reap(self, now: int, limit: int = 256) -> tuple[int, int | None]:
        """Start and end the parts that are due (CB-6); returns (how many, next due or None)."""
        raw = await self._reap(
            keys=[self.changes_key],
            args=[PREFIX, now, limit, self.retention_ms, self.maxlen],
        )
        nxt = _text(raw[1])
        return int(raw[0]), (int(float(nxt)) if nxt else None)

    async def get(self, reservation_id: str) -> tuple[dict[str, Any], int] | None:
        data, v = await self._r.hmget(broker_key("res", reservation_id), ["data", "v"])
        if data is None:
            return None
        return json.loads(data), int(v or 0)

    async def get_many(self, ids: Sequence[str]) -> list[tuple[dict[str, Any], int] | None]:
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for rid in ids:
            pipe.hmget(broker_key("res", rid), ["data", "v"])
        out: list[tuple[dict[str, Any], int] | None] = []
        for data, v in await pipe.execute():
            out.append(None if data is None else (json.loads(data), int(v or 0)))
        return out

    async def list_ids(self, app: str | None, offset: int, limit: int) -> list[str]:
        """Reservation ids newest first; those whose record expired are dropped from the index."""
        key = broker_key("all-res") if app is None else broker_key("app", app, "res")
        return list(await self._r.zrevrange(key, offset, offset + limit - 1))

    async def forget(self, app: str | None, ids: Sequence[str]) -> None:
        """Drop ids whose records expired from the listing indexes."""
        if ids:
            if app is not None:
                await self._r.zrem(broker_key("app", app, "res"), *ids)
            await self._r.zrem(broker_key("all-res"), *ids)

    async def all_reservations(self) -> list[tuple[dict[str, Any], int]]:
        """Every stored reservation (tests, post-hoc checks)."""
        ids = await self._r.zrange(broker_key("all-res"), 0, -1)
        return [x for x in await self.get_many(ids) if x is not None]

    # -- devices and latency ----------------------------------------------------

    async def upsert_device(self, device_id: str, doc: dict[str, Any]) -> ScriptResult:
        raw = await self._upsert_device(
            keys=[self.changes_key],
            args=[PREFIX, device_id, json.dumps(doc, sort_keys=True), doc["cores"], self.maxlen],
        )
        return ScriptResult(_text(raw[0]), None, 0, tuple(_text(x) for x in raw[1:]))

    async def remove_device(self, device_id: str) -> ScriptResult:
        raw = await self._remove_device(
            keys=[self.changes_key], args=[PREFIX, device_id, self.maxlen]
        )
        return ScriptResult(_text(raw[0]), None, 0, tuple(_text(x) for x in raw[1:]))

    async def set_latencies(self, entries: Sequence[tuple[str, str, float]]) -> int:
        raw = await self._set_latency(
            keys=[self.changes_key],
            args=[PREFIX, json.dumps([list(e) for e in entries]), self.maxlen],
        )
        return int(raw[0])

    async def device_allocations(self, device_id: str) -> list[tuple[str, int]]:
        raw = await self._r.zrange(broker_key("alloc", device_id), 0, -1, withscores=True)
        return [(_text(m), int(s)) for m, s in raw]

    # -- the change stream --------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        raw = await self._snapshot(keys=[self.changes_key], args=[PREFIX])
        version, sid, devs, lat, allocs = raw
        devices = {_text(devs[i]): json.loads(_text(devs[i + 1])) for i in range(0, len(devs), 2)}
        latency: dict[tuple[str, str], float] = {}
        for i in range(0, len(lat), 2):
            site, _, dev = _text(lat[i]).partition("|")
            latency[(site, dev)] = float(lat[i + 1])
        allocations: dict[str, list[tuple[str, int]]] = {}
        for i in range(0, len(allocs), 2):
            rows = allocs[i + 1]
            allocations[_text(allocs[i])] = [
                (_text(rows[j]), int(float(rows[j + 1]))) for j in range(0, len(rows), 2)
            ]
        return Snapshot(int(version), _text(sid), devices, latency, allocations)

    async def read_changes(
        self, after: str, *, block_ms: int | None = None, count: int = 1000
    ) -> list[Change]:
        raw = await self._r.xread({self.changes_key: after}, count=count, block=block_ms)
        out: list[Change] = []
        for _, entries in raw or []:
            for sid, fields in entries:
                out.append(Change(_text(sid), int(fields["v"]), fields["ops"], fields["ev"]))
        return out

    # -- applications (CB-2) ------------------------------------------------------

    async def register_application(
        self, application_id: str, qos_level: str, billing_model: str, created: int
    ) -> tuple[str, bool]:
        """Store a fresh credential (salted SHA-256 of a 256-bit secret); returns (token, rotated)."""
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_hex(16)
        key = tenant_key(application_id, "app")
        rotated = bool(await self._r.exists(key))
        await self._r.hset(
            key,
            mapping={
                "salt": salt,
                "hash": credential_digest(salt, secret),
                "qos": qos_level,
                "billing": billing_model,
                "created": created,
            },
        )
        return f"{application_id}:{secret}", rotated

    async def application(self, application_id: str) -> ApplicationRecord | None:
        h = await self._r.hgetall(tenant_key(application_id, "app"))
        if not h:
            return None
        return ApplicationRecord(application_id, h["qos"], h["billing"], h["salt"], h["hash"])

    async def remove_application(self, application_id: str) -> bool:
        return bool(await self._r.delete(tenant_key(application_id, "app")))


def verify_secret(app: ApplicationRecord, secret: str) -> bool:
    return hmac.compare_digest(app.digest, credential_digest(app.salt, secret))
