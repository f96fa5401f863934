"""Redis persistence of a switched pod's reservations (SW-4, SW-6).

Keys (all under the pod's hash tag, so one Lua script may touch any of them):

    lp:{pod}:sw:fabric        the fabric spec this pod runs (SwitchedFabricConfig.spec())
    lp:{pod}:sw:used          bitmap, one bit per channel: reserved by some ring
    lp:{pod}:sw:procs         bitmap, one bit per processor: inside some job's tiles
    lp:{pod}:sw:ver           bumped by every committed change (snapshot caching)
    lp:{pod}:sw:jobs          zset of job ids (score 0: lexicographic pages)
    lp:{pod}:sw:tiles         hash job -> its tiles and degrees (JSON), for the
                              forbidden sets of small jobs and the pod view
    lp:{pod}:sw:job:<job>     hash: plan (JSON), channels / procs (the job's own
                              bitmaps), version, at (ms)
    lp:{pod}:sw:tmp, :tmp2    scratch for BITOP inside the scripts

Every change is one script (`_COMMIT`): it takes the job's old bitmaps out of
the pod's, checks that the new ones do not overlap what is left, and writes
both bitmaps, the plan and the indexes together — or changes nothing. Planning
happens outside on a snapshot (assume); a commit that finds a channel taken
meanwhile answers CONFLICT and the caller plans again (undo is free: nothing
was written). So several replicas on one Redis never put a channel in two rings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import redis.asyncio as aioredis

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Degrees, RingPlan, Tile
from lightpath.errors import Aborted, FailedPrecondition
from services.common.keys import pod_key

# KEYS: used, procs, jobs, tiles, ver, job, tmp, tmp2
# ARGV: job, expect ("" = must not exist, "*" = any, else the job's version),
#       plan ("" = delete), chan bits, proc bits, tiles json, now ms
_COMMIT = r"""
local cur = redis.call('HGET', KEYS[6], 'version')
if ARGV[2] == '' then
  if cur then return {'EXISTS', cur} end
elseif ARGV[2] ~= '*' and cur ~= ARGV[2] then
  return {'STALE', cur or ''}
end
if ARGV[3] == '' and not cur then return {'NOT_FOUND', ''} end
local function rest(pod, field)
  -- tmp := the pod's bitmap without this job's own bits
  if cur then
    local own = redis.call('HGET', KEYS[6], field)
    redis.call('SET', KEYS[7], own)
    redis.call('BITOP', 'NOT', KEYS[7], KEYS[7])
    redis.call('BITOP', 'AND', KEYS[7], KEYS[7], pod)
  else
    redis.call('BITOP', 'OR', KEYS[7], pod, pod)
  end
end
local function overlap(bits)
  redis.call('SET', KEYS[8], bits)
  redis.call('BITOP', 'AND', KEYS[8], KEYS[8], KEYS[7])
  return redis.call('BITCOUNT', KEYS[8])
end
local function apply(pod, bits)
  if bits ~= '' then
    redis.call('SET', KEYS[8], bits)
    redis.call('BITOP', 'OR', pod, KEYS[7], KEYS[8])
  else
    redis.call('BITOP', 'OR', pod, KEYS[7], KEYS[7])
  end
end
local pairs_ = {{KEYS[1], 'channels', ARGV[4], 'CHANNELS'}, {KEYS[2], 'procs', ARGV[5], 'PROCESSORS'}}
if ARGV[3] ~= '' then
  for _, p in ipairs(pairs_) do
    rest(p[1], p[2])
    local n = overlap(p[3])
    if n > 0 then
      redis.call('DEL', KEYS[7], KEYS[8])
      return {p[4], tostring(n)}
    end
  end
end
for _, p in ipairs(pairs_) do
  rest(p[1], p[2])
  apply(p[1], ARGV[3] ~= '' and p[3] or '')
end
redis.call('DEL', KEYS[7], KEYS[8])
local version = 0
if ARGV[3] == '' then
  redis.call('DEL', KEYS[6])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('HDEL', KEYS[4], ARGV[1])
else
  version = tonumber(cur or '0') + 1
  redis.call('HSET', KEYS[6], 'plan', ARGV[3], 'channels', ARGV[4], 'procs', ARGV[5],
             'version', tostring(version), 'at', ARGV[7])
  redis.call('ZADD', KEYS[3], 0, ARGV[1])
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[6])
end
local pod_version = redis.call('INCR', KEYS[5])
return {'OK', tostring(version), tostring(pod_version)}
"""

# KEYS: fabric, jobs. ARGV: spec, replace ("1": may replace a different spec when no job is stored)
_ENSURE_FABRIC = r"""
local cur = redis.call('GET', KEYS[1])
if not cur then redis.call('SET', KEYS[1], ARGV[1]) return {'NEW', ''} end
if cur == ARGV[1] then return {'SAME', cur} end
if redis.call('ZCARD', KEYS[2]) > 0 then return {'IN_USE', cur} end
redis.call('SET', KEYS[1], ARGV[1])
return {'CHANGED', cur}
"""


@dataclass(frozen=True)
class Snapshot:
    """The pod's reservations at one version (read in one MULTI)."""

    version: int
    used: bytearray  # one byte per channel
    procs: bytearray  # one byte per processor
    # job -> (degrees, tiles)
    jobs: dict[str, tuple[Degrees, tuple[Tile, ...]]]

    def forbidden_for(
        self, fabric: SwitchedFabric, job_id: str, tiles: tuple[Tile, ...]
    ) -> set[int]:
        """Processors of other jobs in the groups of these tiles (small jobs share groups)."""
        groups = {t.group for t in tiles}
        return {
            p
            for j, (_, ts) in self.jobs.items()
            if j != job_id
            for t in ts
            if t.group in groups
            for p in t.processors(fabric)
        }


@dataclass(frozen=True)
class StoredPlan:
    plan: RingPlan
    version: int
    at_ms: int


def pack(indices, size: int) -> bytes:
    """A Redis bitmap (bit 0 = most significant bit of byte 0, as SETBIT) of these indices."""
    bits = np.zeros(size + (-size) % 8, dtype=np.uint8)
    bits[np.fromiter(indices, dtype=np.int64)] = 1
    return np.packbits(bits).tobytes()


def unpack(data: bytes | None, size: int) -> bytearray:
    if not data:
        return bytearray(size)
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    if len(bits) < size:
        bits = np.concatenate([bits, np.zeros(size - len(bits), np.uint8)])
    return bytearray(bits[:size].tobytes())


def _tiles_json(degrees: Degrees, tiles: tuple[Tile, ...]) -> str:
    return json.dumps(
        {
            "degrees": list(degrees.as_tuple()),
            "tiles": [[t.group, t.row, t.col, t.height, t.width] for t in tiles],
        },
        separators=(",", ":"),
    )


def _read_tiles(raw: bytes | str) -> tuple[Degrees, tuple[Tile, ...]]:
    d = json.loads(raw)
    return Degrees(*d["degrees"]), tuple(Tile(*t) for t in d["tiles"])


class SwitchedStore:
    """One pod's reservations in Redis. Needs a client with decode_responses=False."""

    def __init__(self, redis: aioredis.Redis, pod_id: str, fabric: SwitchedFabric):
        self.redis = redis
        self.pod_id = pod_id
        self.fabric = fabric
        k = lambda *parts: pod_key(pod_id, "sw", *parts)  # noqa: E731
        self.k_fabric, self.k_used, self.k_procs, self.k_ver = (
            k("fabric"),
            k("used"),
            k("procs"),
            k("ver"),
        )
        self.k_jobs, self.k_tiles, self.k_tmp, self.k_tmp2 = (
            k("jobs"),
            k("tiles"),
            k("tmp"),
            k("tmp2"),
        )
        self._commit = redis.register_script(_COMMIT)
        self._ensure = redis.register_script(_ENSURE_FABRIC)
        self._cache: Snapshot | None = None

    def job_key(self, job_id: str) -> str:
        return pod_key(self.pod_id, "sw", "job", job_id)

    async def ensure_fabric(self) -> str:
        """Record this pod's fabric; refuse to start on a different one while jobs hold links."""
        status, cur = await self._ensure(
            keys=[self.k_fabric, self.k_jobs], args=[self.fabric.config.spec()]
        )
        status = status.decode() if isinstance(status, bytes) else status
        if status == "IN_USE":
            cur = cur.decode() if isinstance(cur, bytes) else cur
            raise FailedPrecondition(
                f"switched pod {self.pod_id}",
                f"stores jobs reserved on fabric '{cur}', this instance is configured with "
                f"'{self.fabric.config.spec()}'",
                reason="FABRIC_MISMATCH",
            )
        return status

    async def snapshot(self) -> Snapshot:
        """A consistent view; reuses the last one while the pod's version is unchanged."""
        ver = await self.redis.get(self.k_ver)
        version = int(ver or 0)
        if self._cache is not None and self._cache.version == version:
            return self._cache
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(self.k_ver)
            pipe.get(self.k_used)
            pipe.get(self.k_procs)
            pipe.hgetall(self.k_tiles)
            ver, used, procs, tiles = await pipe.execute()
        snap = Snapshot(
            int(ver or 0),
            unpack(used, self.fabric.channel_count),
            unpack(procs, self.fabric.processor_count),
            {(j.decode() if isinstance(j, bytes) else j): _read_tiles(t) for j, t in tiles.items()},
        )
        self._cache = snap
        return snap

    async def commit(self, plan: RingPlan | None, job_id: str, expect: str) -> tuple[str, int]:
        """Write `plan` for the job (None: delete it). `expect`: "" the job must be
        new, "*" anything, else the job's stored version. Returns (status, version)
        with status OK, EXISTS, STALE, NOT_FOUND, CHANNELS or PROCESSORS."""
        fab = self.fabric
        args: list[str | bytes]
        if plan is None:
            args = [job_id, expect, "", b"", b"", "", str(int(time.time() * 1000))]
        else:
            procs = [p for t in plan.tiles for p in t.processors(fab)]
            args = [
                job_id,
                expect,
                json.dumps(plan.to_dict(), separators=(",", ":")),
                pack(plan.channels(), fab.channel_count),
                pack(procs, fab.processor_count),
                _tiles_json(plan.degrees, plan.tiles),
                str(int(time.time() * 1000)),
            ]
        keys = [
            self.k_used,
            self.k_procs,
            self.k_jobs,
            self.k_tiles,
            self.k_ver,
            self.job_key(job_id),
            self.k_tmp,
            self.k_tmp2,
        ]
        res = await self._commit(keys=keys, args=args)
        status = res[0].decode() if isinstance(res[0], bytes) else res[0]
        value = res[1].decode() if isinstance(res[1], bytes) else res[1]
        return status, int(value) if value and value.lstrip("-").isdigit() else 0

    async def get(self, job_id: str) -> StoredPlan | None:
        plan, version, at = await self.redis.hmget(self.job_key(job_id), ["plan", "version", "at"])
        if plan is None or version is None:
            return None
        return StoredPlan(RingPlan.from_dict(json.loads(plan)), int(version), int(at or 0))

    async def job_ids(self, after: str = "", limit: int = 100) -> list[str]:
        lo = f"({after}" if after else "-"
        raw = await self.redis.zrangebylex(self.k_jobs, lo, "+", start=0, num=limit)
        return [j.decode() if isinstance(j, bytes) else j for j in raw]


def conflict(status: str, job_id: str) -> Aborted:
    what = "channels" if status == "CHANNELS" else "processors"
    return Aborted(f"{what} of job {job_id}'s plan were reserved by another job meanwhile; retry")
