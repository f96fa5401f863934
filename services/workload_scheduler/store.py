"""WS-1, WS-7: the pod's block state, job records and events in Redis.

Keys (all under the pod's hash tag, so one pod's state is one Redis Cluster slot,
and under `ws:` beside the ocs_manager's `ocs:` keys of the same pod):

    lp:{pod}:ws:fabric            hash   block types and fabric facts, for people and peers
    lp:{pod}:ws:block:failed      hash   block id -> JSON {at, reason}   (absent = healthy);
                                         {at, reason, hosts: 1} when only hosts failed, each
                                         one then "h<b>.<host>" -> JSON {at, reason}
    lp:{pod}:ws:block:owner       hash   block id -> job id               (absent = free);
                                         "~sub" for a block given over to sub-block slices,
                                         whose chips are "c<b>.<x>.<y>.<z>" -> job id;
                                         SWITCHED pods also "t<g>.<i>.<j>" -> small job
    lp:{pod}:ws:block:wired       hash   block id -> job id whose OCS slice may still include it
    lp:{pod}:ws:live              hash   job id -> SliceJob JSON, for every non-final job
    lp:{pod}:ws:job:<id>          hash   spec (base64 JobSpec, as updated), admitted (as admitted,
                                         once an update changed spec), state, epoch, summary, ...
    lp:{pod}:ws:job:<id>:events   list   the job's transitions (JSON), oldest first
    lp:{pod}:ws:jobs              zset   every job id by admission sequence (ListJobs)
    lp:{pod}:ws:state_counts      hash   job state -> number of jobs in it
    lp:{pod}:ws:events            stream job transitions and block health changes (WatchPod)
    lp:{pod}:ws:seq               string admission sequence
    lp:{pod}:ws:releasing:<id>    string claim (with expiry) while a queued job's old wiring is released
    lp:{pod}:ws:wiring:diff       hash   "<kind>:<job>" -> JSON {job, kind, detail, since}: where
                                         RUNNING jobs and the ocs_manager's slices disagree,
                                         as the last reconcile round found (GetPod shows it)

Indexes kept by the same commits, so a decision reads only what it needs (issue 15):

    lp:{pod}:ws:block:free        string bitmap, bit b set: block b healthy and unowned
    lp:{pod}:ws:block:freewired   hash   block id -> job id: the wiring marks on free blocks
    lp:{pod}:ws:wired:count       hash   job id -> how many wiring marks it has
    lp:{pod}:ws:queued            hash   job id -> SliceJob JSON, for PENDING / SUSPENDED jobs
    lp:{pod}:ws:running           zset   RUNNING job ids, all scored 0 (ranges by id: the
                                         reconcile loop's sweep over the ocs_manager's slices)

The commit script updates the first three for every block field it writes in the
owner / failed / wired hashes (write_job keeps the queued hash and the running set);
`rebuild_indexes` derives them all from the hashes above (at start, and whenever the bitmap is missing).

Every change goes through `commit(txn)`: one Lua script that first checks what
the caller's decision assumed (a job's state and epoch, a block still free,
healthy, held by a given job, not wired to a live slice) and then applies all
writes, or applies none and says which check failed. So a block is never in
two slices even with several scheduler replicas deciding at once: the loser
of a race gets `Conflict`, takes a new snapshot and decides again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import FINAL_STATES, QUEUED_STATES, RUNNING, SliceJob, chip_keys
from services.common.keys import pod_key
from services.workload_scheduler.placement import PodState

EVENT_STREAM_MAXLEN = 10_000
# Parsed SliceJob summaries kept by their JSON (a job's summary changes with every
# transition, so a snapshot parses only what changed since the last one).
PARSED_CACHE_LIMIT = 4096

# The pod's snapshot in one atomic read: block health, owners, wiring marks, live jobs;
# with a fifth key and ARGV[1], also the next admission sequence ("seq": INCR of the
# key) or the id of the newest event ("tip": the event stream's last id, "0-0" if none).
_SNAPSHOT_LUA = r"""
local extra = 0
if ARGV[1] == "seq" then
  extra = redis.call("INCR", KEYS[5])
elseif ARGV[1] == "tip" then
  local last = redis.call("XREVRANGE", KEYS[5], "+", "-", "COUNT", 1)
  extra = last[1] and last[1][1] or "0-0"
end
return {redis.call("HGETALL", KEYS[1]), redis.call("HGETALL", KEYS[2]),
        redis.call("HGETALL", KEYS[3]), redis.call("HGETALL", KEYS[4]), extra}
"""

# The lean snapshot of a decision that needs only free blocks (issue 15): the free
# bitmap, the wiring marks on free blocks, the failed blocks, the queue, the live JSON of
# the jobs marking free blocks and of the jobs named in ARGV[2..], and how many marks the
# queued and named jobs have. KEYS: free, freewired, failed, queued, live, wired count,
# and a seventh for ARGV[1] "seq" / "tip" as in _SNAPSHOT_LUA. {0} when the index is missing.
_LEAN_LUA = r"""
if redis.call("EXISTS", KEYS[1]) == 0 then return {0} end
local extra = 0
if ARGV[1] == "seq" then
  extra = redis.call("INCR", KEYS[7])
elseif ARGV[1] == "tip" then
  local last = redis.call("XREVRANGE", KEYS[7], "+", "-", "COUNT", 1)
  extra = last[1] and last[1][1] or "0-0"
end
local fw = redis.call("HGETALL", KEYS[2])
local queued = redis.call("HGETALL", KEYS[4])
local seen, named = {}, {}
for i = 2, #fw, 2 do
  if not seen[fw[i]] then seen[fw[i]] = true; named[#named + 1] = fw[i] end
end
for i = 2, #ARGV do
  if not seen[ARGV[i]] then seen[ARGV[i]] = true; named[#named + 1] = ARGV[i] end
end
local jobs, marked = {}, {}
for i = 1, #queued, 2 do
  if redis.call("HEXISTS", KEYS[6], queued[i]) == 1 then marked[#marked + 1] = queued[i] end
end
for _, j in ipairs(named) do
  local raw = redis.call("HGET", KEYS[5], j)
  if raw then
    jobs[#jobs + 1] = j; jobs[#jobs + 1] = raw
    if redis.call("HEXISTS", KEYS[6], j) == 1 then marked[#marked + 1] = j end
  end
end
-- hex: a client that decodes replies as UTF-8 cannot take the raw bitmap
local hex = (string.gsub(redis.call("GET", KEYS[1]) or "", ".", function(c)
  return string.format("%02x", string.byte(c))
end))
return {1, hex, fw, redis.call("HKEYS", KEYS[3]), queued, jobs, marked, extra}
"""

# Derive the indexes from the owner / failed / wired / live hashes (ARGV[1]: block count).
# KEYS: owner, failed, wired, live, free, freewired, wired count, queued, running.
_REBUILD_LUA = r"""
local n = tonumber(ARGV[1])
redis.call("DEL", KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
redis.call("SETBIT", KEYS[5], math.max(n - 1, 0), 0)
for b = 0, n - 1 do
  local f = tostring(b)
  if redis.call("HEXISTS", KEYS[1], f) == 0 and redis.call("HEXISTS", KEYS[2], f) == 0 then
    redis.call("SETBIT", KEYS[5], b, 1)
    local w = redis.call("HGET", KEYS[3], f)
    if w then redis.call("HSET", KEYS[6], f, w) end
  end
end
local wired = redis.call("HGETALL", KEYS[3])
for i = 2, #wired, 2 do redis.call("HINCRBY", KEYS[7], wired[i], 1) end
local live = redis.call("HGETALL", KEYS[4])
for i = 1, #live, 2 do
  local st = cjson.decode(live[i + 1])["st"]
  if st == "PENDING" or st == "SUSPENDED" then redis.call("HSET", KEYS[8], live[i], live[i + 1]) end
  if st == "RUNNING" then redis.call("ZADD", KEYS[9], 0, live[i]) end
end
return 1
"""

# Block ARGV[1] (KEYS: owner, live, failed): {owner or "", 1 if failed else 0, the
# owner's live JSON or ""}.
_BLOCK_LUA = r"""
local owner = redis.call("HGET", KEYS[1], ARGV[1])
local raw = owner and redis.call("HGET", KEYS[2], owner)
return {owner or "", redis.call("HEXISTS", KEYS[3], ARGV[1]), raw or ""}
"""

# One page of the reconcile loop's sweep over the wiring marks (KEYS: wired, live;
# ARGV: HSCAN cursor, count): {next cursor, block/job pairs, job/live JSON pairs}.
_MARKS_LUA = r"""
local got = redis.call("HSCAN", KEYS[1], ARGV[1], "COUNT", ARGV[2])
local marks, jobs, seen = got[2], {}, {}
for i = 2, #marks, 2 do
  local j = marks[i]
  if not seen[j] then
    seen[j] = true
    local raw = redis.call("HGET", KEYS[2], j)
    if raw then jobs[#jobs + 1] = j; jobs[#jobs + 1] = raw end
  end
end
return {got[1], marks, jobs}
"""

# The live JSON of the RUNNING jobs with ids in (ARGV[1], ARGV[2]] (KEYS: running, live;
# ARGV[1] "" = from the first, ARGV[2] "" = to the last) and of the jobs ARGV[3..] name.
_RANGE_LUA = r"""
local lo = ARGV[1] == "" and "-" or "(" .. ARGV[1]
local hi = ARGV[2] == "" and "+" or "[" .. ARGV[2]
local ids = redis.call("ZRANGEBYLEX", KEYS[1], lo, hi)
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
local out = {}
for _, j in ipairs(ids) do
  local raw = redis.call("HGET", KEYS[2], j)
  if raw then out[#out + 1] = j; out[#out + 1] = raw end
end
return out
"""

_TXN_LUA = r"""
local tx = cjson.decode(ARGV[1])
-- Indexes (issue 15): KEYS positions of owner, failed, wired, free, freewired, wired count.
local ix = tx.ix
local indexed = redis.call("EXISTS", KEYS[ix[4]]) == 1
local touched = {}
local function mark(field, job)
  -- a wiring mark of `field` set to `job` (nil: removed): keep the per-job counts
  local old = redis.call("HGET", KEYS[ix[3]], field)
  if old == job then return end
  if old and redis.call("HINCRBY", KEYS[ix[6]], old, -1) <= 0 then
    redis.call("HDEL", KEYS[ix[6]], old)
  end
  if job then redis.call("HINCRBY", KEYS[ix[6]], job, 1) end
end
local function has(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end
for _, c in ipairs(tx.c) do
  local t = c[1]
  if t == "state" then
    -- {"state", job key, {allowed states; "" = absent}, epoch or -1, job id}
    local st = redis.call("HGET", KEYS[c[2]], "state")
    if not st then
      if not has(c[3], "") then return {0, "job " .. c[5] .. " does not exist"} end
    else
      if not has(c[3], st) then return {0, "job " .. c[5] .. " is " .. st} end
      if c[4] >= 0 then
        local ep = tonumber(redis.call("HGET", KEYS[c[2]], "epoch"))
        if ep ~= c[4] then return {0, "job " .. c[5] .. " changed (epoch " .. tostring(ep) .. ")"} end
      end
    end
  elseif t == "owner" then
    -- {"owner", owner key, block, {allowed owners; "" = free}}
    local o = redis.call("HGET", KEYS[c[2]], c[3]) or ""
    if not has(c[4], o) then return {0, "block " .. c[3] .. " is held by " .. (o == "" and "nobody" or o)} end
  elseif t == "health" then
    -- {"health", failed key, block, "HEALTHY" | "FAILED"}
    local f = redis.call("HEXISTS", KEYS[c[2]], c[3]) == 1
    if f ~= (c[4] == "FAILED") then return {0, "block " .. c[3] .. " is not " .. c[4]} end
  elseif t == "nokey" then
    -- {"nokey", key, what}
    if redis.call("EXISTS", KEYS[c[2]]) == 1 then return {0, c[3]} end
  elseif t == "wired" then
    -- {"wired", wired key, block, {allowed jobs}}: unmarked, or marked by an allowed job
    local w = redis.call("HGET", KEYS[c[2]], c[3])
    if w and not has(c[4], w) then return {0, "block " .. c[3] .. " is still wired to " .. w} end
  elseif t == "notwhole" then
    -- {"notwhole", failed key, block}: healthy, or failed only in some hosts
    local f = redis.call("HGET", KEYS[c[2]], c[3])
    if f and not cjson.decode(f)["hosts"] then return {0, "block " .. c[3] .. " failed"} end
  end
end
local out = {}
for _, o in ipairs(tx.o) do
  local t = o[1]
  if t == "hset" then
    if indexed and o[2] == ix[3] then
      for i = 3, #o, 2 do mark(o[i], o[i + 1]) end
    end
    if indexed and (o[2] == ix[1] or o[2] == ix[2] or o[2] == ix[3]) then
      for i = 3, #o, 2 do touched[o[i]] = true end
    end
    redis.call("HSET", KEYS[o[2]], unpack(o, 3))
  elseif t == "hdel" then
    if indexed and o[2] == ix[3] then
      for i = 3, #o do mark(o[i], nil) end
    end
    if indexed and (o[2] == ix[1] or o[2] == ix[2] or o[2] == ix[3]) then
      for i = 3, #o do touched[o[i]] = true end
    end
    redis.call("HDEL", KEYS[o[2]], unpack(o, 3))
  elseif t == "hincr" then
    redis.call("HINCRBY", KEYS[o[2]], o[3], o[4])
  elseif t == "zadd" then
    redis.call("ZADD", KEYS[o[2]], o[3], o[4])
  elseif t == "zrem" then
    redis.call("ZREM", KEYS[o[2]], o[3])
  elseif t == "del" then
    redis.call("DEL", KEYS[o[2]])
  elseif t == "setpx" then
    redis.call("SET", KEYS[o[2]], o[3], "PX", o[4])
  elseif t == "unwire" then
    -- {"unwire", wired key, job}: drop every mark of that job
    local all = redis.call("HGETALL", KEYS[o[2]])
    for i = 1, #all, 2 do
      if all[i + 1] == o[3] then
        redis.call("HDEL", KEYS[o[2]], all[i])
        touched[all[i]] = true
      end
    end
    if indexed then redis.call("HDEL", KEYS[ix[6]], o[3]) end
  elseif t == "event" then
    -- {"event", job key, history key, stream key, maxlen, event JSON}
    local n = redis.call("HINCRBY", KEYS[o[2]], "nev", 1)
    local e = cjson.decode(o[6])
    e["n"] = n
    local s = cjson.encode(e)
    redis.call("RPUSH", KEYS[o[3]], s)
    redis.call("XADD", KEYS[o[4]], "MAXLEN", "~", o[5], "*", "kind", "job", "job", e["job"], "e", s)
  elseif t == "ret" then
    -- {"ret", hash key, fields...}: return these fields' values after the writes
    out[#out + 1] = redis.call("HMGET", KEYS[o[2]], unpack(o, 3))
  elseif t == "retjob" then
    -- {"retjob", job key, history key}: return the job's record after the writes
    out[#out + 1] = {redis.call("HGETALL", KEYS[o[2]]), redis.call("LRANGE", KEYS[o[3]], 0, -1)}
  elseif t == "bevent" then
    -- {"bevent", stream key, maxlen, event JSON}
    redis.call("XADD", KEYS[o[2]], "MAXLEN", "~", o[3], "*", "kind", "block", "e", o[4])
  elseif t == "subfree" then
    -- {"subfree", owner key, block, chip fields...}: the block leaves sub-block use once
    -- none of its chips is held (the last sub-block slice on it left)
    local held = false
    for i = 4, #o do
      if redis.call("HEXISTS", KEYS[o[2]], o[i]) == 1 then held = true; break end
    end
    if not held and redis.call("HGET", KEYS[o[2]], o[3]) == "~sub" then
      redis.call("HDEL", KEYS[o[2]], o[3])
      if indexed then touched[o[3]] = true end
    end
  end
end
if indexed then
  for f, _ in pairs(touched) do
    local b = tonumber(f)
    if b then  -- a block (a SWITCHED pod's processors "t<g>.<i>.<j>" are not indexed)
      local free = redis.call("HEXISTS", KEYS[ix[1]], f) == 0
        and redis.call("HEXISTS", KEYS[ix[2]], f) == 0
      redis.call("SETBIT", KEYS[ix[4]], b, free and 1 or 0)
      local w = free and redis.call("HGET", KEYS[ix[3]], f)
      if w then redis.call("HSET", KEYS[ix[5]], f, w) else redis.call("HDEL", KEYS[ix[5]], f) end
    end
  end
end
return {1, "ok", out}
"""


class Conflict(Exception):
    """A check of a transaction failed: state changed since the snapshot. Decide again."""


class PodKeys:
    def __init__(self, pod_id: str):
        self.pod_id = pod_id
        self.fabric = pod_key(pod_id, "ws", "fabric")
        self.failed = pod_key(pod_id, "ws", "block", "failed")
        self.owner = pod_key(pod_id, "ws", "block", "owner")
        self.wired = pod_key(pod_id, "ws", "block", "wired")
        self.live = pod_key(pod_id, "ws", "live")
        self.jobs = pod_key(pod_id, "ws", "jobs")
        self.state_counts = pod_key(pod_id, "ws", "state_counts")
        self.events = pod_key(pod_id, "ws", "events")
        self.seq = pod_key(pod_id, "ws", "seq")
        self.wiring_diff = pod_key(pod_id, "ws", "wiring", "diff")
        self.free = pod_key(pod_id, "ws", "block", "free")
        self.freewired = pod_key(pod_id, "ws", "block", "freewired")
        self.wired_count = pod_key(pod_id, "ws", "wired", "count")
        self.queued = pod_key(pod_id, "ws", "queued")
        self.running = pod_key(pod_id, "ws", "running")
        self._job_prefix = pod_key(pod_id, "ws", "job") + ":"

    def job(self, job_id: str) -> str:
        """`pod_key(pod, "ws", "job", job_id)`, without re-checking the pod id each time."""
        if not job_id or "{" in job_id or "}" in job_id:
            return pod_key(self.pod_id, "ws", "job", job_id)  # raises, naming the rule
        return self._job_prefix + job_id

    def history(self, job_id: str) -> str:
        return self.job(job_id) + ":events"

    def releasing(self, job_id: str) -> str:
        """Claim held while one replica releases a queued job's leftover OCS wiring."""
        return pod_key(self.pod_id, "ws", "releasing", job_id)


@dataclass
class Txn:
    """Checks and writes for one atomic commit; keys are registered as they are used."""

    keys: PodKeys
    _keys: list[str] = field(default_factory=list)
    _index: dict[str, int] = field(default_factory=dict)
    checks: list[list[Any]] = field(default_factory=list)
    ops: list[list[Any]] = field(default_factory=list)

    def k(self, key: str) -> int:
        if key not in self._index:
            self._keys.append(key)
            self._index[key] = len(self._keys)  # Lua KEYS are 1-based
        return self._index[key]

    # -- checks ----------------------------------------------------------------

    def expect_job(self, job_id: str, states: Iterable[str], epoch: int = -1) -> None:
        self.checks.append(["state", self.k(self.keys.job(job_id)), list(states), epoch, job_id])

    def expect_no_job(self, job_id: str) -> None:
        self.expect_job(job_id, [""])

    def expect_owner(self, block: int | str, owners: Iterable[str]) -> None:
        """Block held by one of `owners` ("" = free)."""
        self.checks.append(["owner", self.k(self.keys.owner), str(block), list(owners)])

    def expect_health(self, block: int, health: str) -> None:
        self.checks.append(["health", self.k(self.keys.failed), str(block), health])

    def expect_wired_by(self, block: int | str, allowed: Iterable[str]) -> None:
        self.checks.append(["wired", self.k(self.keys.wired), str(block), list(allowed)])

    def expect_not_whole_failed(self, block: int) -> None:
        """Block healthy, or failed only in some of its hosts (issue 28)."""
        self.checks.append(["notwhole", self.k(self.keys.failed), str(block)])

    def expect_host_health(self, block: int, host: int, health: str) -> None:
        self.expect_health(f"h{block}.{host}", health)  # type: ignore[arg-type]

    def expect_no_release_claim(self, job_id: str) -> None:
        self.checks.append(
            ["nokey", self.k(self.keys.releasing(job_id)), f"job {job_id} is being released"]
        )

    # -- writes ----------------------------------------------------------------

    def hset(self, key: str, mapping: dict[Any, Any]) -> None:
        if mapping:
            flat: list[str] = []
            for f, v in mapping.items():
                flat += [str(f), str(v)]
            self.ops.append(["hset", self.k(key), *flat])

    def hdel(self, key: str, fields: Sequence[Any]) -> None:
        if fields:
            self.ops.append(["hdel", self.k(key), *map(str, fields)])

    def hincr(self, key: str, f: str, delta: int) -> None:
        self.ops.append(["hincr", self.k(key), f, delta])

    def zadd(self, key: str, score: float, member: str) -> None:
        self.ops.append(["zadd", self.k(key), score, member])

    def zrem(self, key: str, member: str) -> None:
        self.ops.append(["zrem", self.k(key), member])

    def delete(self, key: str) -> None:
        self.ops.append(["del", self.k(key)])

    def set_px(self, key: str, value: str, ttl_ms: int) -> None:
        self.ops.append(["setpx", self.k(key), value, ttl_ms])

    def release_held(self, job: SliceJob, block_shape: Sequence[int]) -> None:
        """Give up what `job` holds: its blocks, or a sub-block slice's chips (then its
        block leaves sub-block use if no other slice holds chips there)."""
        self.hdel(self.keys.owner, job.held_keys())
        if job.offset is not None and job.placement:
            self.leave_block_if_empty(job.placement[0], block_shape)

    def leave_block_if_empty(self, block: int, block_shape: Sequence[int]) -> None:
        every = chip_keys(block, (0,) * len(block_shape), tuple(block_shape))
        self.ops.append(["subfree", self.k(self.keys.owner), str(block), *every])

    def unwire(self, job_id: str) -> None:
        self.ops.append(["unwire", self.k(self.keys.wired), job_id])

    def job_event(self, event: dict[str, Any]) -> None:
        job_id = event["job"]
        self.ops.append(
            [
                "event",
                self.k(self.keys.job(job_id)),
                self.k(self.keys.history(job_id)),
                self.k(self.keys.events),
                EVENT_STREAM_MAXLEN,
                json.dumps(event, separators=(",", ":")),
            ]
        )

    def block_event(self, event: dict[str, Any]) -> None:
        self.ops.append(
            [
                "bevent",
                self.k(self.keys.events),
                EVENT_STREAM_MAXLEN,
                json.dumps(event, separators=(",", ":")),
            ]
        )

    # -- composite writes -----------------------------------------------------

    def write_job(self, job: SliceJob, *, old_state: str | None, reason: str, now_ms: int) -> None:
        """Store `job` (its state, epoch, summary), mirror it in the live set (or drop it
        there when final), count states, and record the transition as an event."""
        k = self.keys.job(job.job_id)
        summary = job.to_json()
        self.hset(
            k,
            {
                "state": job.state,
                "epoch": job.epoch,
                "summary": summary,
                "reason": reason,
                "updated_ms": now_ms,
            },
        )
        if job.state in FINAL_STATES:
            self.hdel(self.keys.live, [job.job_id])
        else:
            self.hset(self.keys.live, {job.job_id: summary})
        if job.state in QUEUED_STATES:
            self.hset(self.keys.queued, {job.job_id: summary})
        elif old_state is None or old_state in QUEUED_STATES:
            self.hdel(self.keys.queued, [job.job_id])
        if job.state == RUNNING:
            self.zadd(self.keys.running, 0, job.job_id)
        elif old_state == RUNNING:
            self.zrem(self.keys.running, job.job_id)
        if old_state != job.state:
            if old_state:
                self.hincr(self.keys.state_counts, old_state, -1)
            self.hincr(self.keys.state_counts, job.state, 1)
        self.job_event(
            {
                "job": job.job_id,
                "from": old_state or "",
                "to": job.state,
                "at": now_ms,
                "reason": reason,
            }
        )

    def read_back(self, key: str, fields: Sequence[str]) -> None:
        """After the writes, return these fields of hash `key` from commit()."""
        self.ops.append(["ret", self.k(key), *fields])

    def read_job(self, job_id: str) -> None:
        """After the writes, return the job's record (with history) from commit()."""
        self.ops.append(
            ["retjob", self.k(self.keys.job(job_id)), self.k(self.keys.history(job_id))]
        )

    def payload(self) -> tuple[list[str], str]:
        k = self.keys
        ix = [self.k(key) for key in (k.owner, k.failed, k.wired, k.free, k.freewired)]
        ix.append(self.k(k.wired_count))
        return list(self._keys), json.dumps({"c": self.checks, "o": self.ops, "ix": ix})


@dataclass(frozen=True)
class JobRecord:
    """A stored job as GetJob answers it."""

    job_id: str
    spec_b64: str
    state: str
    epoch: int
    reason: str
    summary: SliceJob
    created_ms: int
    updated_ms: int
    history: tuple[dict[str, Any], ...] = ()
    # Victims of the preemption that placed it (WS-4), as stored at allocation.
    preempted: tuple[dict[str, Any], ...] = ()
    # The spec as admitted, when an update (UpdateJob) changed `spec_b64` since: a
    # retried AdmitJob of the same request is compared with this one.
    admitted_b64: str = ""

    @property
    def submitted_b64(self) -> str:
        """The spec as admitted (the idempotency key of AdmitJob)."""
        return self.admitted_b64 or self.spec_b64


class PodStore:
    """Redis persistence of one pod's scheduling state (WS-1)."""

    def __init__(self, redis: aioredis.Redis, pod_id: str):
        self.redis = redis
        self.keys = PodKeys(pod_id)
        self._txn = redis.register_script(_TXN_LUA)
        self._snapshot = redis.register_script(_SNAPSHOT_LUA)
        self._lean = redis.register_script(_LEAN_LUA)
        self._rebuild = redis.register_script(_REBUILD_LUA)
        self._block = redis.register_script(_BLOCK_LUA)
        self._marks = redis.register_script(_MARKS_LUA)
        self._range = redis.register_script(_RANGE_LUA)
        self._parsed: dict[str, SliceJob] = {}

    def slice_job(self, raw: str) -> SliceJob:
        """SliceJob.from_json, remembered by its JSON (SliceJob is immutable)."""
        job = self._parsed.get(raw)
        if job is None:
            if len(self._parsed) >= PARSED_CACHE_LIMIT:
                self._parsed.clear()
            job = self._parsed[raw] = SliceJob.from_json(raw)
        return job

    def txn(self) -> Txn:
        return Txn(self.keys)

    async def commit(self, txn: Txn) -> list[Any]:
        """Apply `txn` atomically, or raise Conflict naming the first failed check.
        Returns what `read_back` / `read_job` asked for, in order (a JobRecord for read_job)."""
        keys, arg = txn.payload()
        ok, detail, *rest = await self._txn(keys=keys, args=[arg])
        if int(ok) != 1:
            raise Conflict(detail)
        out: list[Any] = []
        for item in rest[0] if rest else []:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], list):
                flat, history = item
                row = dict(zip(flat[::2], flat[1::2], strict=True))
                job_id = self.slice_job(row["summary"]).job_id if "summary" in row else ""
                out.append(self._record(job_id, row, history))
            else:
                out.append(item)
        return out

    async def next_seq(self) -> int:
        return int(await self.redis.incr(self.keys.seq))

    async def save_fabric(self, fabric: PodFabric, describe: dict[str, str]) -> None:
        mapping: dict[str, str] = {"node_types": json.dumps(list(fabric.node_types)), **describe}
        await self.redis.hset(self.keys.fabric, mapping=mapping)  # type: ignore[arg-type]

    async def snapshot(self, fabric: PodFabric) -> PodState:
        """One round trip (one script, so one atomic read): block health, owners, wiring
        marks and live jobs."""
        k = self.keys
        return self._state(fabric, await self._snapshot(keys=[k.failed, k.owner, k.wired, k.live]))

    async def snapshot_and_seq(self, fabric: PodFabric) -> tuple[PodState, int]:
        """The snapshot and, in the same round trip, the next admission sequence (INCR)."""
        k = self.keys
        reply = await self._snapshot(keys=[k.failed, k.owner, k.wired, k.live, k.seq], args=["seq"])
        return self._state(fabric, reply), int(reply[4])

    async def snapshot_and_tip(self, fabric: PodFabric) -> tuple[PodState, str]:
        """The snapshot and the id of the newest event in the same atomic read: every
        change to the state appends an event in its own commit, so the id versions
        exactly this state (a capacity report carries it; see cell_link)."""
        k = self.keys
        reply = await self._snapshot(
            keys=[k.failed, k.owner, k.wired, k.live, k.events], args=["tip"]
        )
        return self._state(fabric, reply), str(reply[4])

    async def tip(self) -> str:
        """The id of the newest event ("0-0" if none): it changes with every commit that
        changes a job or a block's health."""
        last = await self.redis.xrevrange(self.keys.events, count=1)
        return str(last[0][0]) if last else "0-0"

    async def block(self, block: int) -> tuple[str, bool, SliceJob | None]:
        """One block in one read: who holds it ("" = nobody), whether it failed, and the
        holder as a live job (None when it is not live)."""
        k = self.keys
        owner, failed, raw = await self._block(keys=[k.owner, k.live, k.failed], args=[block])
        return owner, bool(int(failed)), self.slice_job(raw) if raw else None

    async def marks_page(
        self, cursor: int, count: int
    ) -> tuple[int, dict[str, str], dict[str, SliceJob]]:
        """A page of the wiring marks from an HSCAN `cursor` (0 = from the start; the
        next one is 0 after the last page): the next cursor, the marks, and the live jobs
        among those marking."""
        nxt, marks, jobs = await self._marks(
            keys=[self.keys.wired, self.keys.live], args=[cursor, count]
        )
        live = {j: self.slice_job(raw) for j, raw in _pairs(jobs).items()}
        return int(nxt), _pairs(marks), live

    async def live_in_range(
        self, after: str, upto: str | None, also: Sequence[str] = ()
    ) -> dict[str, SliceJob]:
        """RUNNING jobs with ids in (after, upto] (None: to the last), and the live ones
        of `also`."""
        k = self.keys
        flat = await self._range(keys=[k.running, k.live], args=[after, upto or "", *also])
        return {j: self.slice_job(raw) for j, raw in _pairs(flat).items()}

    async def holder(self, block: int) -> SliceJob | None:
        """The live job holding `block`, in one read."""
        return (await self.block(block))[2]

    async def rebuild_indexes(self, fabric: PodFabric) -> None:
        """Derive the free-block and queue indexes from the pod's hashes (one atomic
        script, so safe beside other replicas' commits)."""
        k = self.keys
        await self._rebuild(
            keys=[
                *(k.owner, k.failed, k.wired, k.live),
                *(k.free, k.freewired, k.wired_count, k.queued, k.running),
            ],
            args=[fabric.block_count],
        )

    async def lean_snapshot(
        self, fabric: PodFabric, *, jobs: Sequence[str] = (), extra: str = ""
    ) -> tuple[PodState, Any]:
        """What a decision that takes free blocks needs, independent of the number of
        live jobs (issue 15): free blocks (healthy, unowned), the wiring marks on them
        and their jobs, the failed blocks, the queue, and the jobs named in `jobs`. The
        state is `partial` (PodState): a decision that needs more (preemption) takes a
        full snapshot. With `extra` "seq" / "tip", also what snapshot_and_seq /
        snapshot_and_tip add. OCS_TORUS pods only."""
        k = self.keys
        keys = [k.free, k.freewired, k.failed, k.queued, k.live, k.wired_count]
        if extra:
            keys.append(k.seq if extra == "seq" else k.events)
        for _ in range(2):
            reply = await self._lean(keys=keys, args=[extra, *jobs])
            if int(reply[0]) == 1:
                break
            await self.rebuild_indexes(fabric)  # Redis lost it (or it was never built)
        else:
            raise Conflict("the free-block index is missing")
        _, bitmap, fw, failed, queued, named, marked, tip = reply
        live = {j: self.slice_job(raw) for j, raw in _pairs(named).items()}
        live.update((j, self.slice_job(raw)) for j, raw in _pairs(queued).items())
        state = PodState(
            fabric,
            failed={int(b) for b in failed if b[0] != "h"},
            wired={int(b): j for b, j in _pairs(fw).items()},
            jobs=live,
            free=_bits(bytes.fromhex(bitmap or ""), fabric.block_count),
            marked=frozenset(marked),
        )
        return state, tip

    def _state(self, fabric: PodFabric, reply: list[Any]) -> PodState:
        failed, owner, wired, live = (_pairs(flat) for flat in reply[:4])
        # Small jobs of a SWITCHED pod hold processors ("t<g>.<i>.<j>"), sub-block slices
        # chips ("c<b>.<x>.<y>.<z>"), not blocks; failed hosts are "h<b>.<host>".
        hosts: dict[int, set[int]] = {}
        for f in failed:
            if f[0] == "h":
                b, h = f[1:].split(".")
                hosts.setdefault(int(b), set()).add(int(h))
        only_hosts = {
            b: frozenset(hosts.get(b, ()))
            for b, raw in ((int(f), raw) for f, raw in failed.items() if f[0] != "h")
            if '"hosts"' in raw and json.loads(raw).get("hosts")
        }
        return PodState(
            fabric,
            failed={int(b) for b in failed if b[0] != "h"},
            owner={int(b): j for b, j in owner.items() if b[0] not in "tc"},
            wired={int(b): j for b, j in wired.items() if b[0] != "t"},
            jobs={j: self.slice_job(s) for j, s in live.items()},
            tile_owner={b: j for b, j in owner.items() if b[0] in "tc"},
            tile_wired={b: j for b, j in wired.items() if b[0] == "t"},
            failed_hosts=only_hosts,
        )

    async def wired_jobs(self) -> set[str]:
        """Jobs whose OCS wiring may still exist (their marks)."""
        values: list[str] = await self.redis.hvals(self.keys.wired)  # type: ignore[assignment, misc]
        return set(values)

    async def wiring_report(self) -> dict[str, dict[str, Any]]:
        """The differences the last reconcile round found (see consistency.py), by key."""
        raw: dict[str, str] = await self.redis.hgetall(self.keys.wiring_diff)  # type: ignore[assignment, misc]
        return {k: json.loads(v) for k, v in raw.items()}

    async def save_wiring_report(self, report: dict[str, dict[str, Any]]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.wiring_diff)
            if report:
                pipe.hset(
                    self.keys.wiring_diff,
                    mapping={k: json.dumps(v, separators=(",", ":")) for k, v in report.items()},
                )
            await pipe.execute()

    async def failed_info(self) -> dict[int, dict[str, Any]]:
        """Failed blocks -> {at, reason[, hosts: 1 when only some hosts failed]}."""
        raw = await self.redis.hgetall(self.keys.failed)
        return {int(b): json.loads(v) for b, v in raw.items() if not str(b).startswith("h")}

    async def failed_entry(self, block: int) -> dict[str, Any] | None:
        """A block's failure record ({at, reason[, hosts]}), None when it is healthy."""
        raw = await self.redis.hget(self.keys.failed, str(block))
        return json.loads(raw) if raw else None

    async def job(self, job_id: str, *, history: bool = False) -> JobRecord | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.job(job_id))
            if history:
                pipe.lrange(self.keys.history(job_id), 0, -1)
            results = await pipe.execute()
        return self._record(job_id, results[0], results[1] if history else [])

    async def jobs_page(self, *, before_seq: int | None, count: int) -> list[JobRecord]:
        """Jobs newest first, with admission sequence below `before_seq`."""
        hi = f"({before_seq}" if before_seq is not None else "+inf"
        ids: list[str] = await self.redis.zrevrangebyscore(  # type: ignore[assignment]
            self.keys.jobs, hi, "-inf", start=0, num=count, withscores=False
        )
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hgetall(self.keys.job(job_id))
            rows = await pipe.execute()
        return [
            r for job_id, row in zip(ids, rows, strict=True) if (r := self._record(job_id, row, []))
        ]

    async def state_counts(self) -> dict[str, int]:
        raw: dict[str, str] = await self.redis.hgetall(self.keys.state_counts)  # type: ignore[assignment]
        return {k: int(v) for k, v in raw.items() if int(v) > 0}

    def _record(self, job_id: str, row: dict[str, str], history: list[str]) -> JobRecord | None:
        if not row or "state" not in row:
            return None
        return JobRecord(
            job_id=job_id,
            spec_b64=row.get("spec", ""),
            state=row["state"],
            epoch=int(row.get("epoch", 0)),
            reason=row.get("reason", ""),
            summary=self.slice_job(row["summary"]),
            created_ms=int(row.get("created_ms", 0)),
            updated_ms=int(row.get("updated_ms", 0)),
            history=tuple(json.loads(h) for h in history),
            preempted=tuple(json.loads(row["preempted"])) if row.get("preempted") else (),
            admitted_b64=row.get("admitted", ""),
        )


def _bits(bitmap: bytes, n: int) -> set[int]:
    """The set bits of a Redis bitmap (bit 0 = the high bit of the first byte), below n."""
    out: set[int] = set()
    for i, byte in enumerate(bitmap):
        if byte:
            base = i * 8
            out.update(base + o for o in _BYTE_BITS[byte] if base + o < n)
    return out


_BYTE_BITS = [tuple(o for o in range(8) if byte & (0x80 >> o)) for byte in range(256)]


def _pairs(flat: list[str]) -> dict[str, str]:
    """A flat HGETALL reply from a script -> dict."""
    it = iter(flat)
    return dict(zip(it, it, strict=True))
