"""The fabric manager of a SWITCHED pod: plan on a snapshot, commit in one
script, plan again when another replica won the race (SW-4, SW-5, SW-6).

Electrical tier-0/tier-1 switches need no programming step per ring here:
the seed routes rings by policy over links marked used (¶59-60), so a ring
exists once its channels are reserved. The servicer translates protobuf and
calls this; everything it decides comes from `rings` (pure).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import (
    Degrees,
    RingPlan,
    SwapResult,
    Tile,
    job_tile_in,
    plan_rings,
    replacement_order,
    swap_first,
)
from lightpath.errors import (
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from lightpath_services.common.keys import ID_RULE, is_valid_id
from lightpath_services.common.txn import STALE_LEASE, Conflict
from lightpath_services.ocs_manager.driver import Fence
from lightpath_services.ocs_manager.metrics import OcsMetrics, timed
from lightpath_services.ocs_manager.switched.queries import SwitchIndex, SwitchLinkUse
from lightpath_services.ocs_manager.switched.store import (
    Snapshot,
    StoredPlan,
    SwitchedStore,
    conflict,
)

log = logging.getLogger("lightpath.ocs_manager.switched")

ATTEMPTS = 5
# Plans bigger than this many groups run in a worker thread so the event loop
# keeps answering other calls meanwhile.
_THREAD_GROUPS = 8


def check_job_id(job_id: str) -> str:
    if not is_valid_id(job_id):
        raise InvalidArgument("job_id", ID_RULE)
    return job_id


@dataclass(frozen=True)
class Reserved:
    plan: RingPlan
    replayed: bool
    attempts: int


class SwitchedFabricManager:
    def __init__(
        self, fabric: SwitchedFabric, store: SwitchedStore, metrics: OcsMetrics | None = None
    ):
        self.metrics = metrics or OcsMetrics.noop()
        self.fabric = fabric
        self.store = store
        self.index = SwitchIndex(fabric)

    async def _plan(
        self, snap: Snapshot, job_id: str, degrees: Degrees, tiles: Sequence[Tile]
    ) -> RingPlan:
        forbidden = snap.forbidden_for(self.fabric, job_id, tuple(tiles))
        args = (self.fabric, snap.used, job_id, degrees, list(tiles))
        if len(tiles) > _THREAD_GROUPS:
            return await asyncio.to_thread(plan_rings, *args, forbidden=forbidden)
        return plan_rings(*args, forbidden=forbidden)

    def _check_processors_free(self, snap: Snapshot, job_id: str, tiles: Sequence[Tile]) -> None:
        fab = self.fabric
        for t in tiles:
            t.check(fab, "tiles")
            busy = [p for p in t.processors(fab) if snap.procs[p]]
            if busy:
                holders = sorted(
                    j
                    for j, (_, ts) in snap.jobs.items()
                    if j != job_id and any(set(x.processors(fab)) & set(busy) for x in ts)
                )
                raise FailedPrecondition(
                    f"group {fab.group_name(t.group)}",
                    f"{len(busy)} of the tile's processors are held by {', '.join(holders) or 'another job'}",
                    reason="PROCESSORS_IN_USE",
                )

    def _refuse_stale(self, job_id: str, c: Conflict) -> None:
        """A caller's lease older than one seen for the job (fencing, issue 32)."""
        if c.reason == STALE_LEASE:
            self.metrics.stale_write_refused(self.store.pod_id, "lease")
            raise FailedPrecondition(
                f"job {job_id}",
                f"the caller's lease on its rings is older than one seen before (token "
                f"{c.value}): a newer holder of the job took over; this caller's view is stale",
                reason=STALE_LEASE,
            )

    @timed("wire")
    async def reserve(
        self,
        job_id: str,
        degrees: Degrees,
        tiles: Sequence[Tile],
        caller: Fence | None = None,
    ) -> Reserved:
        """SW-4: plan and reserve the job's rings. Idempotent by job id: the same
        degrees and tiles again answer the stored plan. `caller`: the caller's lease on
        the job (fencing: an older one than seen is refused, STALE_LEASE)."""
        check_job_id(job_id)
        degrees.validate()
        if not tiles:
            raise InvalidArgument("tiles", "must name at least one group")
        for attempt in range(1, ATTEMPTS + 1):
            stored = await self.store.get(job_id)
            if stored is not None:
                return Reserved(self._same_request(stored, degrees, tiles), True, attempt)
            snap = await self.store.snapshot()
            self._check_processors_free(snap, job_id, tiles)
            plan = await self._plan(snap, job_id, degrees, tiles)
            try:
                await self.store.commit(plan, job_id, "", caller)
            except Conflict as c:
                self._refuse_stale(job_id, c)
                log.info("reserve %s: %s on attempt %d, planning again", job_id, c.reason, attempt)
                continue
            return Reserved(plan, False, attempt)
        raise conflict("CHANNELS", job_id)

    def _same_request(
        self, stored: StoredPlan, degrees: Degrees, tiles: Sequence[Tile]
    ) -> RingPlan:
        plan = stored.plan
        if plan.degrees != degrees or sorted(plan.tiles) != sorted(tiles):
            raise FailedPrecondition(
                f"job {plan.job_id}",
                "already holds rings for other degrees or groups; release it first",
                reason="JOB_EXISTS",
            )
        return plan

    async def get(self, job_id: str) -> StoredPlan:
        check_job_id(job_id)
        stored = await self.store.get(job_id)
        if stored is None:
            raise NotFound("job", job_id, hint="no rings are reserved for it on this pod")
        return stored

    @timed("release")
    async def release(self, job_id: str, caller: Fence | None = None) -> RingPlan:
        """Free exactly the job's channels and processors (`caller`: as for reserve)."""
        for _ in range(ATTEMPTS):
            stored = await self.get(job_id)
            try:
                await self.store.commit(None, job_id, str(stored.version), caller)
            except Conflict as c:
                self._refuse_stale(job_id, c)
                if c.reason == "NOT_FOUND":
                    break
                continue
            return stored.plan
        await self.get(job_id)  # NOT_FOUND when a concurrent release won
        raise Aborted(f"job {job_id} kept changing while being released; retry")

    @timed("replace")
    async def swap(
        self,
        job_id: str,
        failed_group: int,
        free_groups: Sequence[int] = (),
        new_tiles: Sequence[Tile] = (),
        caller: Fence | None = None,
    ) -> SwapResult:
        """SW-5: move the job's tile in `failed_group` to the first of `new_tiles`
        (or of `free_groups` in replacement order: same tier-0 switch first)
        whose rings route; every other ring keeps its channels (`caller`: as for
        reserve)."""
        fab = self.fabric
        if not 0 <= failed_group < fab.group_count:
            raise InvalidArgument(
                "failed_group", f"must be a group of this pod (0..{fab.group_count - 1})"
            )
        for attempt in range(1, ATTEMPTS + 1):
            stored = await self.get(job_id)
            plan = stored.plan
            old = job_tile_in(fab, plan, failed_group)
            snap = await self.store.snapshot()
            candidates = list(new_tiles) or [
                Tile(g, old.row, old.col, old.height, old.width)
                for g in replacement_order(fab, failed_group, free_groups)
            ]
            for n, t in enumerate(candidates):
                t.check(fab, f"new_tiles[{n}]")
            free = [t for t in candidates if not any(snap.procs[p] for p in t.processors(fab))]
            if candidates and not free:
                raise ResourceExhausted(
                    f"no free group can take the place of {fab.group_name(failed_group)} in "
                    f"job {job_id} ({len(candidates)} offered, all in use)",
                    reason="NO_FREE_GROUP",
                )
            result = swap_first(
                fab,
                snap.used,
                plan,
                old,
                free,
                forbidden_for=functools.partial(snap.forbidden_for, fab, job_id),
            )
            try:
                await self.store.commit(result.plan, job_id, str(stored.version), caller)
            except Conflict as c:
                self._refuse_stale(job_id, c)
                log.info("swap %s: %s on attempt %d, planning again", job_id, c.reason, attempt)
                continue
            return result
        raise Aborted(f"job {job_id} or its groups kept changing during the swap; retry")

    async def switch_use(self, names: Sequence[str] = ()) -> list[SwitchLinkUse]:
        """SW-6: link use of the named switches (all when empty)."""
        fab = self.fabric
        ids = []
        for name in names:
            try:
                ids.append(fab.switch_id(name))
            except KeyError:
                raise NotFound(
                    "switch", name, hint="names look like r3/p7, c0/p2, t1r/p7/0"
                ) from None
        snap = await self.store.snapshot()
        return self.index.use(snap.used, ids or None)

    async def snapshot(self) -> Snapshot:
        return await self.store.snapshot()
