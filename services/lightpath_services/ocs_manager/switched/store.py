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
    lp:{pod}:sw:leases        hash lease id -> the highest fencing token seen (a caller's
                              lease on its job: an older one is refused, STALE_LEASE;
                              one field per job submission kept)
    lp:{pod}:sw:tmp, :tmp2    scratch for BITOP inside the scripts

Every change is one transaction (lightpath_services.common.txn, with store.lua): it checks the
job's version, then that the job's new bitmaps do not overlap what the other jobs hold,
then takes the job's old bits out of the pod's, puts the new ones in and writes the plan
and the indexes together — or changes nothing and raises `Conflict`. Planning happens
outside on a snapshot (assume); a commit that finds a channel taken meanwhile raises
Conflict(CHANNELS) and the caller plans again (undo is free: nothing was written). So
several replicas on one Redis never put a channel in two rings.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import Degrees, RingPlan, Tile
from lightpath.errors import Aborted, FailedPrecondition
from lightpath_services.common.keys import pod_key
from lightpath_services.common.txn import Conflict, Program, Txn
from lightpath_services.ocs_manager.driver import Fence

PROGRAM = Program("lightpath_services.ocs_manager.switched", "store.lua", {})


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
    # numpy on first use: only a switched pod packs bitmaps, every ocs_manager imports
    # this module (issue 31)
    import numpy as np

    bits = np.zeros(size + (-size) % 8, dtype=np.uint8)
    bits[np.fromiter(indices, dtype=np.int64)] = 1
    return np.packbits(bits).tobytes()


def unpack(data: bytes | None, size: int) -> bytearray:
    if not data:
        return bytearray(size)
    import numpy as np

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
        self.k_leases = k("leases")
        self._script = PROGRAM.bind(redis)
        self._cache: Snapshot | None = None

    def job_key(self, job_id: str) -> str:
        return pod_key(self.pod_id, "sw", "job", job_id)

    async def ensure_fabric(self) -> str:
        """Record this pod's fabric: NEW, SAME or CHANGED (from another, on which no job held
        rings); refuse to start on a different one while jobs hold links."""
        spec = self.fabric.config.spec()
        for _ in range(5):
            raw = await self.redis.get(self.k_fabric)
            old = raw.decode() if isinstance(raw, bytes) else raw or ""
            if old == spec:
                return "SAME"
            t = Txn()
            t.check("fabric", t.k(self.k_fabric), old)
            if old:
                t.expect_no_key(self.k_jobs, reason="IN_USE")
            t.op("set", t.k(self.k_fabric), spec)
            try:
                await self._script.commit(t)
            except Conflict as c:
                if c.reason == "FABRIC_MOVED":
                    continue
                raise FailedPrecondition(
                    f"switched pod {self.pod_id}",
                    f"stores jobs reserved on fabric '{old}', this instance is configured "
                    f"with '{spec}'",
                    reason="FABRIC_MISMATCH",
                ) from None
            return "CHANGED" if old else "NEW"
        raise Aborted(f"switched pod {self.pod_id}: the fabric record kept changing")

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

    async def commit(
        self, plan: RingPlan | None, job_id: str, expect: str, caller: Fence | None = None
    ) -> int:
        """Write `plan` for the job (None: delete it). `expect`: "" the job must be new,
        "*" anything, else the job's stored version; `caller`: the caller's lease on the
        job (fencing). Answers the job's new version (0 once deleted), or raises
        Conflict: EXISTS, STALE (value: the stored version), NOT_FOUND, CHANNELS or
        PROCESSORS (value: how many are reserved by another job), STALE_LEASE (value:
        the newer token)."""
        job = self.job_key(job_id)
        t = Txn()
        if caller is not None:
            t.fence(self.k_leases, caller.lease_id, caller.token)
        if expect == "":
            t.expect(job, "version", [""], reason="EXISTS", message="the job holds rings")
        elif expect != "*":
            t.expect(job, "version", [expect], reason="STALE", message="the job changed")
        if plan is None:
            t.expect_field(job, "version", True, reason="NOT_FOUND")
        scratch = (t.k(self.k_tmp), t.k(self.k_tmp2))
        sides = [(t.k(self.k_used), "channels"), (t.k(self.k_procs), "procs")]
        if plan is None:
            for bitmap, field in sides:
                t.op("bits", bitmap, t.k(job), field, *scratch, 0)
            t.delete(job)
            t.zrem(self.k_jobs, job_id)
            t.hdel(self.k_tiles, [job_id])
        else:
            fab = self.fabric
            procs = [p for tile in plan.tiles for p in tile.processors(fab)]
            blobs = [
                t.blob(pack(plan.channels(), fab.channel_count)),
                t.blob(pack(procs, fab.processor_count)),
            ]
            for (bitmap, field), blob, reason in zip(
                sides, blobs, ("CHANNELS", "PROCESSORS"), strict=True
            ):
                t.check("free", bitmap, t.k(job), field, *scratch, blob, reason)
            for (bitmap, field), blob in zip(sides, blobs, strict=True):
                t.op("bits", bitmap, t.k(job), field, *scratch, blob)
            t.op("record", t.k(job), "channels", blobs[0], "procs", blobs[1])
            plan_json = json.dumps(plan.to_dict(), separators=(",", ":"))
            t.hset(job, {"plan": plan_json, "at": int(time.time() * 1000)})
            t.hincr(job, "version", 1)
            t.read("HGET", job, "version")
            t.zadd(self.k_jobs, 0, job_id)
            t.hset(self.k_tiles, {job_id: _tiles_json(plan.degrees, plan.tiles)})
        t.read("INCR", self.k_ver)
        done = await self._script.commit(t)
        return int(done.reads[0]) if plan is not None else 0

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
