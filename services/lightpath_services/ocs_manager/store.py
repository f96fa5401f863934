"""Redis persistence of one pod's optical fabric (OCS-3, OCS-7): keys, Lua scripts, versions.

Keys (all under the pod's hash tag, so one Lua script may touch any of them):

    lp:{pod}:ocs:fabric          the FabricConfig this pod was wired with (canonical JSON)
    lp:{pod}:ocs:owner           hash block -> job id (the blocks each slice holds or reserves)
    lp:{pod}:ocs:slices          zset of job ids (score 0: lexicographic pages)
    lp:{pod}:ocs:slice:<job>     hash: spec, state (wiring|wired), wired_at, the change in
                                 flight (op, op_token, op_deadline, op_failed, op_new), replaced
    lp:{pod}:ocs:fence           counter: the token of every change's lease (fencing, issue 32)
    lp:{pod}:ocs:leases          hash lease -> the highest token a caller sent under it (the
                                 workload scheduler's epoch of a job's submission: an older
                                 one is refused, STALE_LEASE; one field per submission kept)
    lp:{pod}:ocs:ver             hash OCS id -> version, bumped by every committed change (and
                                 a `layout` field that keeps it a hash table)
    lp:{pod}:ocs:xc2:<dim>:<k>   hash port -> peer port (both directions): the routing table
                                 of each of that dimension's OCS with that k, every axis
                                 alike (lua.py)
    lp:{pod}:ocs:otm2:<dim>      hash block -> output of that block's 1xK switches along dim

Every change to a slice is assume / commit / undo (STYLE.md):

1. `begin_*` (one transaction) claims what the change needs — the slice's blocks
   for a wire, the new block for a replace — and locks the slice with a lease and
   its token (the pod's fence counter + 1), refusing what is taken and a caller's
   lease token older than one already seen for the job;
2. the caller programs the switch driver, every batch fenced by (job, token): a
   switch refuses a batch with a lower token than it has seen for that job, so a
   manager paused past its lease cannot undo or redo what a newer holder did;
3. `commit` (one transaction) re-checks the token, that every port to remove is
   there and every port to add is free, then writes the tables, 1xK settings,
   versions, claims and the slice record together; or `abort` (one transaction)
   drops the claims after the caller has undone the driver.

So the tables only ever hold committed wiring, and neither replicas racing on
one Redis nor a crash between the steps can put a port in two cross-connects or
leave a half-wired slice: a lock whose lease ran out is taken over (`steal`)
and rolled back by the next change to that slice.

Each step is a `Txn` of lightpath_services.common.txn on this store's program (store.lua after
tables.lua): a refusal is a `Conflict` whose reason the manager turns into an error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.errors import Aborted, InvalidArgument
from lightpath_services.common.keys import pod_key
from lightpath_services.common.txn import Conflict, Program, Txn
from lightpath_services.ocs_manager.driver import Fence
from lightpath_services.ocs_manager.invariants import FabricState, StoredSlice
from lightpath_services.ocs_manager.lua import (
    encode_change,
    fabric_header,
    otm_keys,
    read_layout,
    table_keys,
)
from lightpath_services.ocs_manager.wiring import FabricChange, SlicePlacement

WIRED, WIRING = "wired", "wiring"
PROGRAM = Program("lightpath_services.ocs_manager", ["tables.lua", "store.lua"], {"WIRED": WIRED})
_OP_FIELDS = ("op", "op_token", "op_deadline", "op_failed", "op_new")


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
class FabricStatus:
    """What `ensure_fabric` found: NEW, SAME, CHANGED from `old` (nothing was wired on it,
    its tables are dropped), or IN_USE: `old` stays, with `slices` wired on it."""

    status: str
    old: str = ""
    slices: int = 0


@dataclass(frozen=True)
class Committed:
    """A committed change: cross-connect pairs removed and added (over every axis), and the
    slice's wired_at (ms; 0 once released)."""

    removed: int
    added: int
    wired_at_ms: int


class OcsStore:
    """One pod's committed fabric state in Redis. Refusals raise `Conflict`: FABRIC_CHANGED,
    DIFFERENT / SAME (the slice exists: value its spec / state), BUSY (value the op in
    flight), STALE (value its token), BLOCK_IN_USE (value "<block> <owner>"), NOT_FOUND,
    NOT_IN_SLICE, REPLAYED (value the spec), LOST (the lease was taken over), CONFLICT (the
    tables are not as the change expects: the message names the port or switch)."""

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
        self.k_fence = pod_key(pod_id, "ocs", "fence")
        self.k_leases = pod_key(pod_id, "ocs", "leases")
        self.k_tables = table_keys(fabric, pod_key(pod_id, "ocs"))
        self.k_otm = otm_keys(fabric, pod_key(pod_id, "ocs"))
        self._script = PROGRAM.bind(redis)

    def k_record(self, job: str) -> str:
        return pod_key(self.pod_id, "ocs", "slice", job)

    def _layout(self, t: Txn) -> tuple[int, int]:
        """Declare the tables then the 1xK hashes, in a row: (first table's, first 1xK's)."""
        at = [t.k(key) for key in (*self.k_tables, *self.k_otm)]
        assert at == list(range(at[0], at[0] + len(at))), "the layout must be declared in a row"
        return at[0], at[0] + len(self.k_tables)

    def _txn(self) -> Txn:
        t = Txn()
        t.check("fabric", t.k(self.k_fabric), self._fp)
        return t

    # -- the fabric a pod was wired with -----------------------------------------

    async def ensure_fabric(self) -> FabricStatus:
        """Record this fabric for the pod, or check it is the recorded one; lay out its tables."""
        prefix = pod_key(self.pod_id, "ocs")
        for _ in range(5):
            old = await self._r.get(self.k_fabric) or ""
            t = Txn()
            xc, otm = self._layout(t)
            old_keys: list[int] = []
            if old and old != self._fp:
                with contextlib.suppress(ValueError, KeyError, TypeError, InvalidArgument):
                    before = Fabric.build(FabricConfig.from_json(old))
                    old_keys = [
                        t.k(k) for k in (*table_keys(before, prefix), *otm_keys(before, prefix))
                    ]
            f = t.k(self.k_fabric)
            t.check("stored", f, ["", self._fp, old])
            t.check("unused", f, self._fp, t.k(self.k_slices), t.k(self.k_owner))
            t.op("fabric", f, self._fp, t.k(self.k_ver), xc, otm, self._header, *old_keys)
            try:
                done = await self._script.commit(t)
            except Conflict as c:
                if c.reason == "IN_USE":
                    return FabricStatus(c.reason, old, int(c.value))
                if c.reason == "FABRIC_MOVED":
                    continue
                raise
            return FabricStatus(done["status"], done["old"])
        raise Aborted("the pod's fabric configuration kept changing")

    # -- assume / commit / undo -------------------------------------------------

    async def begin_wire(
        self, placement: SlicePlacement, lease_ms: int, caller: Fence | None = None
    ) -> str:
        """Claim the slice's blocks and lock it; answers the change's token (Conflict:
        DIFFERENT, SAME, BUSY, STALE, BLOCK_IN_USE, FABRIC_CHANGED, STALE_LEASE)."""
        job, rec = placement.job_id, self.k_record(placement.job_id)
        spec = placement.spec()
        t = self._txn()
        if caller is not None:
            t.fence(self.k_leases, caller.lease_id, caller.token)
        t.check("new_slice", t.k(rec), spec)
        t.check("free", t.k(self.k_owner), *map(str, placement.blocks))
        t.hset(self.k_owner, dict.fromkeys(placement.blocks, job))
        t.op(
            "lock",
            t.k(rec),
            lease_ms,
            t.k(self.k_fence),
            "spec",
            spec,
            "state",
            WIRING,
            "op",
            "wire",
        )
        t.zadd(self.k_slices, 0, job)
        return str((await self._script.commit(t))["token"])

    async def begin_change(
        self,
        job: str,
        kind: str,
        lease_ms: int,
        failed: int = -1,
        new: int = -1,
        caller: Fence | None = None,
    ) -> tuple[str, str]:
        """Lock the slice for a release or replace (claiming the new block); answers the
        change's token and the slice's spec (Conflict: NOT_FOUND, BUSY, STALE,
        NOT_IN_SLICE, BLOCK_IN_USE, REPLAYED, FABRIC_CHANGED, STALE_LEASE)."""
        rec = self.k_record(job)
        t = self._txn()
        if caller is not None:
            t.fence(self.k_leases, caller.lease_id, caller.token)
        t.expect_field(rec, "spec", True, reason="NOT_FOUND")
        t.check("idle", t.k(rec))
        if kind == "replace":
            t.check("replace", t.k(self.k_owner), t.k(rec), job, str(failed), str(new))
            t.hset(self.k_owner, {new: job})
        t.op(
            "lock",
            t.k(rec),
            lease_ms,
            t.k(self.k_fence),
            "op",
            kind,
            "op_failed",
            failed,
            "op_new",
            new,
        )
        t.read("HGET", rec, "spec")
        done = await self._script.commit(t)
        return str(done["token"]), str(done.reads[0])

    async def steal(self, job: str, stale_token: str, lease_ms: int) -> str | None:
        """Take over the change `stale_token` locked, once its lease ran out: the new
        token (higher: the switches then refuse the old holder's batches), or None."""
        rec = self.k_record(job)
        t = Txn()
        t.check("stale", t.k(rec), stale_token)
        t.op("lock", t.k(rec), lease_ms, t.k(self.k_fence))
        try:
            return str((await self._script.commit(t))["token"])
        except Conflict:
            return None

    async def abort(
        self, job: str, token: str, kind: str, blocks: tuple[int, ...] = (), new: int = -1
    ) -> bool:
        """Drop what the change `token` claimed (a wire: the whole slice); False when the
        change is no longer ours."""
        rec = self.k_record(job)
        t = Txn()
        t.expect(rec, "op_token", [token], reason="LOST")
        if kind == "wire":
            t.op("unclaim", t.k(self.k_owner), job, *map(str, blocks))
            t.delete(rec)
            t.zrem(self.k_slices, job)
        else:
            if kind == "replace":
                t.op("unclaim", t.k(self.k_owner), job, str(new))
            t.hdel(rec, _OP_FIELDS)
        return await self._script.applies(t)

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
    ) -> Committed:
        """Write the change `token` locked (mode wire | replace | release) after re-checking
        the tables (Conflict: FABRIC_CHANGED, LOST, CONFLICT)."""
        enc = encode_change(self.fabric, change)
        rec = self.k_record(job)
        t = Txn()
        xc, otm = self._layout(t)
        t.check("fabric", t.k(self.k_fabric), self._fp)
        t.expect(rec, "op_token", [token], reason="LOST")
        t.check("tables", xc, otm, self._header, enc.disconnect, enc.connect, enc.otm)
        t.op("tables", t.k(self.k_ver))
        if unclaim:
            t.op("unclaim", t.k(self.k_owner), job, *map(str, unclaim))
        if mode == "release":
            t.delete(rec)
            t.zrem(self.k_slices, job)
        else:
            if mode == "wire":
                t.op("wired", t.k(rec))
            else:
                t.hset(rec, {"spec": new_spec, "replaced": replaced})
            t.hdel(rec, _OP_FIELDS)
        t.read("HGET", rec, "wired_at")
        done = await self._script.commit(t)
        return Committed(int(done["removed"]), int(done["added"]), int(done.reads[0] or 0))

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
            raw.get("state") == WIRED,
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
