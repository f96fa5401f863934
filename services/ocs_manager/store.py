"""Redis persistence of one pod's optical fabric (OCS-3, OCS-7): keys, Lua scripts, versions.

Keys (all under the pod's hash tag, so one Lua script may touch any of them):

    lp:{pod}:ocs:fabric          the FabricConfig this pod was wired with (canonical JSON)
    lp:{pod}:ocs:owner           hash block -> job id (the blocks each slice holds or reserves)
    lp:{pod}:ocs:slices          zset of job ids (score 0: lexicographic pages)
    lp:{pod}:ocs:slice:<job>     hash: spec, state (wiring|wired), wired_at, the change in
                                 flight (op, op_token, op_deadline, op_failed, op_new), replaced
    lp:{pod}:ocs:ver             hash OCS id -> version, bumped by every committed change (and
                                 a `layout` field that keeps it a hash table)
    lp:{pod}:ocs:xc2:<dim>:<k>   hash port -> peer port (both directions): the routing table
                                 of each of that dimension's OCS with that k, every axis
                                 alike (lua.py)
    lp:{pod}:ocs:otm2:<dim>      hash block -> output of that block's 1xK switches along dim

Every change to a slice is assume / commit / undo (STYLE.md):

1. `begin_*` (one script) claims what the change needs — the slice's blocks
   for a wire, the new block for a replace — and locks the slice with a token
   and a lease, refusing what is taken;
2. the caller programs the switch driver;
3. `commit` (one script) re-checks the token, that every port to remove is
   there and every port to add is free, then writes the tables, 1xK settings,
   versions, claims and the slice record together; or `abort` (one script)
   drops the claims after the caller has undone the driver.

So the tables only ever hold committed wiring, and neither replicas racing on
one Redis nor a crash between the steps can put a port in two cross-connects or
leave a half-wired slice: a lock whose lease ran out is taken over (`steal`)
and rolled back by the next change to that slice.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.errors import Aborted, InvalidArgument
from services.common.keys import pod_key
from services.ocs_manager.invariants import FabricState, StoredSlice
from services.ocs_manager.lua import (
    encode_change,
    fabric_header,
    otm_keys,
    read_layout,
    script,
    table_keys,
)
from services.ocs_manager.wiring import FabricChange, SlicePlacement

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: fabric, slices, owner, versions, table hashes (M*K), 1xK hashes (M), then the old
# fabric's keys. ARGV: fabric record, the old record this call expects to replace ("" = none),
# header (7).
_ENSURE_FABRIC = script(
    r"""
local cur = redis.call('GET', KEYS[1])
local status = 'SAME'
local xc_base, otm_base = 5, 5 + M * K
if not cur then
  redis.call('SET', KEYS[1], ARGV[1])
  status = 'NEW'
elseif cur ~= ARGV[1] then
  if cur ~= ARGV[2] then return {'RETRY', cur} end
  local n = redis.call('ZCARD', KEYS[2])
  if n + redis.call('HLEN', KEYS[3]) > 0 then return {'IN_USE', cur, tostring(n)} end
  for i = otm_base + M, #KEYS do redis.call('DEL', KEYS[i]) end
  redis.call('SET', KEYS[1], ARGV[1])
  status = 'CHANGED'
end
init_layout(xc_base, otm_base)
-- A field longer than 64 bytes keeps the versions a hash table: as a ziplist every
-- commit's read and write of its OCS' versions would scan the list once per OCS.
redis.call('HSETNX', KEYS[4], 'layout', 'OCS id -> version of its routing table, + 1 on every committed change')
return {status, cur or ''}
""",
    header_at=3,
)

# KEYS: fabric, owner, slices, record. ARGV: fabric, job, spec, token, lease_ms, blocks...
_BEGIN_WIRE = (
    _NOW
    + r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'FABRIC_CHANGED'} end
if redis.call('EXISTS', KEYS[4]) == 1 then
  local r = redis.call('HMGET', KEYS[4], 'spec', 'state', 'op', 'op_token', 'op_deadline')
  if r[1] ~= ARGV[3] then return {'DIFFERENT', r[1]} end
  if r[3] then
    if now < tonumber(r[5]) then return {'BUSY', r[3]} end
    return {'STALE', r[3], r[4]}
  end
  return {'SAME', r[2]}
end
for i = 6, #ARGV do
  local o = redis.call('HGET', KEYS[2], ARGV[i])
  if o then return {'BLOCK_IN_USE', ARGV[i], o} end
end
for i = 6, #ARGV do redis.call('HSET', KEYS[2], ARGV[i], ARGV[2]) end
redis.call('HSET', KEYS[4], 'spec', ARGV[3], 'state', 'wiring', 'op', 'wire',
  'op_token', ARGV[4], 'op_deadline', now + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[3], 0, ARGV[2])
return {'OK'}
"""
)

# KEYS: fabric, owner, record. ARGV: fabric, job, token, lease_ms, kind, failed, new
_BEGIN_CHANGE = (
    _NOW
    + r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'FABRIC_CHANGED'} end
if redis.call('EXISTS', KEYS[3]) == 0 then return {'NOT_FOUND'} end
local r = redis.call('HMGET', KEYS[3], 'spec', 'op', 'op_token', 'op_deadline', 'replaced')
if r[2] then
  if now < tonumber(r[4]) then return {'BUSY', r[2]} end
  return {'STALE', r[2], r[3]}
end
if ARGV[5] == 'replace' then
  local of = redis.call('HGET', KEYS[2], ARGV[6])
  if of ~= ARGV[2] then
    if r[5] == ARGV[6] .. ':' .. ARGV[7] and redis.call('HGET', KEYS[2], ARGV[7]) == ARGV[2] then
      return {'REPLAYED', r[1]}
    end
    return {'NOT_IN_SLICE', r[1]}
  end
  local on = redis.call('HGET', KEYS[2], ARGV[7])
  if on then return {'BLOCK_IN_USE', ARGV[7], on} end
  redis.call('HSET', KEYS[2], ARGV[7], ARGV[2])
end
redis.call('HSET', KEYS[3], 'op', ARGV[5], 'op_token', ARGV[3],
  'op_deadline', now + tonumber(ARGV[4]), 'op_failed', ARGV[6], 'op_new', ARGV[7])
return {'OK', r[1]}
"""
)

# KEYS: record. ARGV: stale token, new token, lease_ms
_STEAL = (
    _NOW
    + r"""
local r = redis.call('HMGET', KEYS[1], 'op_token', 'op_deadline')
if r[1] ~= ARGV[1] or now < tonumber(r[2]) then return 0 end
redis.call('HSET', KEYS[1], 'op_token', ARGV[2], 'op_deadline', now + tonumber(ARGV[3]))
return 1
"""
)

_CLEAR_OP = "redis.call('HDEL', KEYS[3], 'op', 'op_token', 'op_deadline', 'op_failed', 'op_new')"

# KEYS: owner, slices, record. ARGV: token, job, kind, new block, blocks of the slice...
_ABORT = (
    r"""
if redis.call('HGET', KEYS[3], 'op_token') ~= ARGV[1] then return 0 end
if ARGV[3] == 'wire' then
  for i = 5, #ARGV do
    if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[i]) end
  end
  redis.call('DEL', KEYS[3])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
if ARGV[3] == 'replace' and redis.call('HGET', KEYS[1], ARGV[4]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[4])
end
"""
    + _CLEAR_OP
    + "\nreturn 1\n"
)

# KEYS: fabric, owner, slices, record, ver, table hashes (M*K), 1xK hashes (M).
# ARGV: fabric, token, job, mode (wire|replace|release), new spec, replaced,
#       disconnect, connect, otm, header (7), blocks to unclaim...
_COMMIT = script(
    _NOW
    + r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'FABRIC_CHANGED'} end
if redis.call('HGET', KEYS[4], 'op_token') ~= ARGV[2] then return {'LOST'} end
local xc_base, otm_base = 6, 6 + M * K
local touched = {}
local rem = expand(ARGV[7], xc_base, touched)
local add = expand(ARGV[8], xc_base, touched)
local otm = expand_otm(ARGV[9], otm_base)

-- re-check everything before writing anything
local removing = {}
local n_rem, n_add = 0, 0
for idx, t in pairs(rem) do
  local cur = hmget(KEYS[idx], t.f)
  local set = {}
  for i = 1, #t.f do
    if cur[i] ~= t.p[i] then
      return {'CONFLICT', port_of(t, t.f[i]) .. ' is not cross-connected to port ' .. t.p[i]}
    end
    set[t.f[i]] = true
  end
  removing[idx] = set
  n_rem = n_rem + #t.f / 2 * axes[t.d + 1]
end
for idx, t in pairs(add) do
  local cur = hmget(KEYS[idx], t.f)
  local set = removing[idx] or {}
  local seen = {}
  for i = 1, #t.f do
    local f = t.f[i]
    if cur[i] and not set[f] then
      return {'CONFLICT', port_of(t, f) .. ' is already cross-connected to port ' .. cur[i]}
    end
    if seen[f] then
      return {'CONFLICT', port_of(t, f) .. ' is given two cross-connects by this change'}
    end
    seen[f] = true
  end
  n_add = n_add + #t.f / 2 * axes[t.d + 1]
end
for idx, t in pairs(otm) do
  local cur = hmget(KEYS[idx], t.f)
  for i = 1, #t.f do
    local want = t.before[i]
    if want < 0 then want = nil end
    if val(cur[i]) ~= want then
      return {'CONFLICT', 'the 1xK switches of block ' .. t.f[i] .. ' along ' .. names[t.d + 1] ..
        ' are at ' .. (cur[i] and ('output ' .. cur[i]) or 'idle') .. ', not ' ..
        (want and ('output ' .. want) or 'idle')}
    end
  end
end

-- write
for idx, t in pairs(rem) do hdel(KEYS[idx], t.f) end
for idx, t in pairs(add) do hset(KEYS[idx], t.f, t.p) end
apply_otm(otm)
local ids = {}
for code in pairs(touched) do
  local d, k = math.floor(code / K), code % K
  local pre, suf = 'ocs-' .. names[d + 1] .. '-', '-' .. k
  for a = 0, axes[d + 1] - 1 do ids[#ids + 1] = pre .. a .. suf end
end
if #ids > 0 then  -- every touched OCS table's version + 1
  local v = hmget(KEYS[5], ids)
  for i = 1, #ids do v[i] = (tonumber(v[i]) or 0) + 1 end
  hset(KEYS[5], ids, v)
end
for i = H + 7, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[3] then redis.call('HDEL', KEYS[2], ARGV[i]) end
end
local mode = ARGV[4]
if mode == 'release' then
  redis.call('DEL', KEYS[4])
  redis.call('ZREM', KEYS[3], ARGV[3])
  return {'OK', tostring(n_rem), tostring(n_add), '0'}
end
if mode == 'wire' then
  redis.call('HSET', KEYS[4], 'state', 'wired', 'wired_at', now)
else
  redis.call('HSET', KEYS[4], 'spec', ARGV[5], 'replaced', ARGV[6])
end
redis.call('HDEL', KEYS[4], 'op', 'op_token', 'op_deadline', 'op_failed', 'op_new')
return {'OK', tostring(n_rem), tostring(n_add), redis.call('HGET', KEYS[4], 'wired_at')}
""",
    header_at=10,
)


@dataclass(frozen=True)
class InFlight:
    """A change to a slice that began and has not committed or aborted."""

    kind: str  # wire | replace | release
    token: str
    failed: int | None = None
    new: int | None = None


@dataclass(frozen=True)
class SliceRecord:
    placement: SlicePlacement
    wired: bool
    wired_at_ms: int
    op: InFlight | None
    replaced: str


@dataclass(frozen=True)
class BeginResult:
    """status: OK, SAME, DIFFERENT, BUSY, STALE, BLOCK_IN_USE, NOT_FOUND, NOT_IN_SLICE,
    REPLAYED, FABRIC_CHANGED; `spec` where the script returned it."""

    status: str
    detail: tuple[str, ...] = ()


class OcsStore:
    """One pod's committed fabric state in Redis."""

    def __init__(self, redis: aioredis.Redis, pod_id: str, fabric: Fabric):
        self._r: Any = redis  # decode_responses=True: replies are str
        self.pod_id = pod_id
        self.fabric = fabric
        self._fp = fabric.config.to_json()
        self._header = fabric_header(fabric)
        self.k_fabric = pod_key(pod_id, "ocs", "fabric")
        self.k_owner = pod_key(pod_id, "ocs", "owner")
        self.k_slices = pod_key(pod_id, "ocs", "slices")
        self.k_ver = pod_key(pod_id, "ocs", "ver")
        self.k_tables = table_keys(fabric, pod_key(pod_id, "ocs"))
        self.k_otm = otm_keys(fabric, pod_key(pod_id, "ocs"))
        self._ensure = redis.register_script(_ENSURE_FABRIC)
        self._begin_wire = redis.register_script(_BEGIN_WIRE)
        self._begin_change = redis.register_script(_BEGIN_CHANGE)
        self._steal = redis.register_script(_STEAL)
        self._abort = redis.register_script(_ABORT)
        self._commit = redis.register_script(_COMMIT)

    def k_record(self, job: str) -> str:
        return pod_key(self.pod_id, "ocs", "slice", job)

    # -- the fabric a pod was wired with -----------------------------------------

    async def ensure_fabric(self) -> tuple[str, ...]:
        """Record this fabric for the pod, or check it is the recorded one; lay out its tables.

        ('NEW'|'SAME', '') or ('CHANGED', old json) when nothing was wired on the old
        fabric (its tables are dropped), or ('IN_USE', old json, slices wired)."""
        prefix = pod_key(self.pod_id, "ocs")
        for _ in range(5):
            old = await self._r.get(self.k_fabric) or ""
            old_keys: list[str] = []
            if old and old != self._fp:
                with contextlib.suppress(ValueError, KeyError, TypeError, InvalidArgument):
                    before = Fabric.build(FabricConfig.from_json(old))
                    old_keys = [
                        *table_keys(before, prefix),
                        *otm_keys(before, prefix),
                    ]
            reply = await self._ensure(
                keys=[
                    self.k_fabric,
                    self.k_slices,
                    self.k_owner,
                    self.k_ver,
                    *self.k_tables,
                    *self.k_otm,
                    *old_keys,
                ],
                args=[self._fp, old, *self._header],
            )
            if reply[0] != "RETRY":
                return tuple(reply)
        raise Aborted("the pod's fabric configuration kept changing")

    # -- assume / commit / undo -------------------------------------------------

    async def begin_wire(self, placement: SlicePlacement, token: str, lease_ms: int) -> BeginResult:
        reply = await self._begin_wire(
            keys=[self.k_fabric, self.k_owner, self.k_slices, self.k_record(placement.job_id)],
            args=[self._fp, placement.job_id, placement.spec(), token, lease_ms, *placement.blocks],
        )
        return BeginResult(reply[0], tuple(str(x) for x in reply[1:] if x is not None))

    async def begin_change(
        self, job: str, kind: str, token: str, lease_ms: int, failed: int = -1, new: int = -1
    ) -> BeginResult:
        reply = await self._begin_change(
            keys=[self.k_fabric, self.k_owner, self.k_record(job)],
            args=[self._fp, job, token, lease_ms, kind, failed, new],
        )
        return BeginResult(reply[0], tuple(str(x) for x in reply[1:] if x is not None))

    async def steal(self, job: str, stale_token: str, token: str, lease_ms: int) -> bool:
        return bool(
            await self._steal(keys=[self.k_record(job)], args=[stale_token, token, lease_ms])
        )

    async def abort(
        self, job: str, token: str, kind: str, blocks: tuple[int, ...] = (), new: int = -1
    ) -> bool:
        return bool(
            await self._abort(
                keys=[self.k_owner, self.k_slices, self.k_record(job)],
                args=[token, job, kind, new, *blocks],
            )
        )

    async def commit(
        self,
        job: str,
        token: str,
        mode: str,
        change: FabricChange,
        *,
        new_spec: str = "",
        replaced: str = "",
        unclaim: tuple[int, ...] = (),
    ) -> tuple[str, ...]:
        """('OK', pairs removed, pairs added, wired_at ms) | ('LOST',) | ('CONFLICT', why) |
        ('FABRIC_CHANGED',)."""
        enc = encode_change(self.fabric, change)
        keys = [
            self.k_fabric,
            self.k_owner,
            self.k_slices,
            self.k_record(job),
            self.k_ver,
            *self.k_tables,
            *self.k_otm,
        ]
        args: list[Any] = [
            self._fp,
            token,
            job,
            mode,
            new_spec,
            replaced,
            enc.disconnect,
            enc.connect,
            enc.otm,
            *self._header,
            *unclaim,
        ]
        return tuple(await self._commit(keys=keys, args=args))

    # -- reads (OCS-7) -----------------------------------------------------------

    def _record(self, job: str, raw: dict[str, str]) -> SliceRecord | None:
        if not raw or "spec" not in raw:
            return None
        op = None
        if raw.get("op"):
            op = InFlight(
                raw["op"],
                raw.get("op_token", ""),
                _int_or_none(raw.get("op_failed")),
                _int_or_none(raw.get("op_new")),
            )
        return SliceRecord(
            SlicePlacement.from_spec(job, raw["spec"]),
            raw.get("state") == "wired",
            int(raw.get("wired_at", 0)),
            op,
            raw.get("replaced", ""),
        )

    async def get_slice(self, job: str) -> SliceRecord | None:
        return self._record(job, await self._r.hgetall(self.k_record(job)))

    async def list_slices(self, after: str, limit: int) -> tuple[list[SliceRecord], bool]:
        """Slices with job id > `after`, at most `limit`; and whether more follow."""
        start = f"({after}" if after else "-"
        jobs = await self._r.zrangebylex(self.k_slices, start, "+", start=0, num=limit + 1)
        more = len(jobs) > limit
        jobs = jobs[:limit]
        async with self._r.pipeline(transaction=False) as pipe:
            for job in jobs:
                pipe.hgetall(self.k_record(job))
            raws = await pipe.execute()
        records = [self._record(j, raw) for j, raw in zip(jobs, raws, strict=True)]
        return [r for r in records if r is not None], more

    async def owners(self) -> dict[int, str]:
        return {int(b): j for b, j in (await self._r.hgetall(self.k_owner)).items()}

    async def routing_table(self, ocs: int) -> tuple[dict[int, int], int, dict[int, str]]:
        """(port -> peer, version, block -> job) read together."""
        f = self.fabric
        d, _axis, k = f.ocs_of_index(ocs)  # every axis of (d, k) alike
        ports = range(f.ports_cabled(k))
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.hmget(self.k_tables[d * f.k + k], list(ports))  # the same on every axis a
            pipe.hget(self.k_ver, f.ocs_ids[ocs])
            pipe.hgetall(self.k_owner)
            peers, ver, owners = await pipe.execute()
        return (
            {p: int(q) for p, q in zip(ports, peers, strict=True) if q},
            int(ver or 0),
            {int(b): j for b, j in owners.items()},
        )

    async def switch_use(self, ocs: range) -> list[tuple[int, int]]:
        """(ports in a cross-connect, version) for the OCS indices in `ocs`."""
        if not len(ocs):
            return []
        f = self.fabric
        async with self._r.pipeline(transaction=True) as pipe:
            for key in self.k_tables:
                pipe.hgetall(key)
            pipe.hmget(self.k_ver, [f.ocs_ids[i] for i in ocs])
            replies = await pipe.execute()
        state = read_layout(f, replies[:-1])
        return [
            (len(state.tables.get(i, {})), int(v or 0))
            for i, v in zip(ocs, replies[-1], strict=True)
        ]

    async def one_to_many(self, blocks: list[int]) -> dict[int, dict[tuple[int, int], int]]:
        """block -> {(dim, axis): output} for the blocks given (idle switches left out)."""
        f = self.fabric
        async with self._r.pipeline(transaction=True) as pipe:
            for d in range(f.dims):
                pipe.hmget(self.k_otm[d], blocks)
            replies = await pipe.execute()
        out: dict[int, dict[tuple[int, int], int]] = {b: {} for b in blocks}
        for d, values in enumerate(replies):
            for b, v in zip(blocks, values, strict=True):
                if v:  # every axis of d alike (lua.py)
                    out[b].update({(d, a): int(v) for a in range(f.axes[d])})
        return out

    async def snapshot(self) -> FabricState:
        """Everything the OCS-6 checker needs, read atomically (retried if the slice set moved)."""
        layout = [*self.k_tables, *self.k_otm]
        for _ in range(10):
            jobs = await self._r.zrange(self.k_slices, 0, -1)
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.zrange(self.k_slices, 0, -1)
                pipe.hgetall(self.k_owner)
                for key in layout:
                    pipe.hgetall(key)
                for job in jobs:
                    pipe.hgetall(self.k_record(job))
                replies = await pipe.execute()
            if replies[0] != jobs:
                continue
            state = read_layout(self.fabric, replies[2 : 2 + len(layout)])
            state.owners = {int(b): j for b, j in replies[1].items()}
            for job, raw in zip(jobs, replies[2 + len(layout) :], strict=True):
                rec = self._record(job, raw)
                if rec is None:
                    continue
                reserved = (
                    (rec.op.new,)
                    if rec.op and rec.op.kind == "replace" and rec.op.new is not None
                    else ()
                )
                state.slices[job] = StoredSlice(
                    rec.placement, rec.wired, reserved, changing=rec.op is not None
                )
            return state
        raise Aborted("the slice set kept changing while taking a snapshot; retry")


def _int_or_none(raw: str | None) -> int | None:
    if raw is None or raw == "" or int(raw) < 0:
        return None
    return int(raw)
