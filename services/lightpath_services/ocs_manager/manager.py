"""Changes to a pod's optical fabric, made safe: claim, program the switches, commit or undo.

`FabricManager` is what the servicer calls for WireSlice / ReleaseSlice /
ReplaceBlock. Each change follows the same steps (OCS-3, OCS-8):

1. begin  - one Lua script claims the blocks it needs and locks the slice
            (a lease and its token, a number from Redis higher for every new
            holder); a conflict is refused here, before any switch moves, and so
            is a caller whose own lease on the job (`lease_token`) is older than
            one seen before (STALE_LEASE);
2. program - the switch driver applies the change (disconnects, 1xK moves,
            connects) fenced by (job, token), bounded by half the lease;
3. commit - one Lua script re-checks every port and writes tables, 1xK
            settings, versions and the slice record together.

If the driver fails, the manager applies the inverse of what was programmed
and drops the claim: UNAVAILABLE (transient) or ABORTED, no trace left. If the
rollback itself fails the lock stays until its lease runs out; the next call
touching the slice then takes it over and rolls the change back (`_recover`),
as it does for a replica that crashed mid-change.

Fencing (issue 32): a manager paused past its lease (GC, SIGSTOP, a VM moved) whose
change another call took over wakes with a stale view. Its batches carry the old
token, which the switches refuse once they have seen the newer holder's; its commit
finds another token and is refused (LOST). Either way it answers ABORTED LEASE_LOST
and undoes nothing itself: the holder that took over rolls the change back. Each
refusal counts in lightpath.ocs.stale_writes_refused (by where: lease, commit,
switch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lightpath.domain.torus import Fabric
from lightpath.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from lightpath_services.common.txn import STALE_LEASE, Conflict
from lightpath_services.ocs_manager.driver import Fence, SwitchDriver, SwitchDriverError
from lightpath_services.ocs_manager.metrics import OcsMetrics, timed
from lightpath_services.ocs_manager.store import OcsStore, SliceRecord
from lightpath_services.ocs_manager.wiring import (
    FabricChange,
    Replacement,
    SlicePlacement,
    release_change,
    replace_block,
    wire_change,
)

log = logging.getLogger("lightpath.ocs_manager")

_ATTEMPTS = 4


@dataclass(frozen=True)
class WireOutcome:
    record: SliceRecord
    replayed: bool


@dataclass(frozen=True)
class ReleaseOutcome:
    placement: SlicePlacement
    change: FabricChange


@dataclass(frozen=True)
class ReplaceOutcome:
    replacement: Replacement
    record: SliceRecord
    replayed: bool


class FabricManager:
    def __init__(
        self,
        fabric: Fabric,
        store: OcsStore,
        driver: SwitchDriver,
        *,
        lease_s: float = 30.0,
        metrics: OcsMetrics | None = None,
    ):
        self.metrics = metrics or OcsMetrics.noop()
        self.fabric = fabric
        self.store = store
        self.driver = driver
        self._lease_ms = max(1, int(lease_s * 1000))
        self._driver_timeout = lease_s / 2

    # -- WireSlice (OCS-2, OCS-3) ------------------------------------------------

    @timed("wire")
    async def wire(self, placement: SlicePlacement, caller: Fence | None = None) -> WireOutcome:
        """`caller`: the caller's own lease on the job (refused when older than seen)."""
        job = placement.job_id
        for _ in range(_ATTEMPTS):
            try:
                token = await self.store.begin_wire(placement, self._lease_ms, caller)
                break
            except Conflict as c:
                if c.reason == "SAME":
                    record = await self.store.get_slice(job)
                    if record is not None and record.wired and record.op is None:
                        return WireOutcome(record, replayed=True)
                    continue  # changed under us: look again
                if c.reason == "STALE":
                    await self._recover(job, c.value)
                    continue
                self._refuse(job, c)
        else:
            raise Aborted(f"slice {job} kept changing under this call; retry")
        change = wire_change(self.fabric, placement)

        async def abort() -> None:
            await self.store.abort(job, token, "wire", placement.blocks)

        await self._program(job, change, abort, Fence(job, int(token)))
        wired_at = await self._commit(job, token, "wire", change, abort)
        return WireOutcome(SliceRecord(placement, True, wired_at, None, ""), replayed=False)

    # -- ReleaseSlice (OCS-4) ----------------------------------------------------

    @timed("release")
    async def release(self, job: str, caller: Fence | None = None) -> ReleaseOutcome:
        _, token, spec = await self._begin_change(job, "release", caller)
        placement = SlicePlacement.from_spec(job, spec)
        change = release_change(self.fabric, placement)

        async def abort() -> None:
            await self.store.abort(job, token, "release")

        await self._program(job, change, abort, Fence(job, int(token)))
        await self._commit(job, token, "release", change, abort, unclaim=placement.blocks)
        return ReleaseOutcome(placement, change)

    # -- ReplaceBlock (OCS-5) ----------------------------------------------------

    @timed("replace")
    async def replace(
        self, job: str, failed: int, new: int, caller: Fence | None = None
    ) -> ReplaceOutcome:
        if failed == new:
            raise InvalidArgument("new_block_id", "must differ from failed_block_id")
        for field, b in (("failed_block_id", failed), ("new_block_id", new)):
            if b >= self.fabric.block_count:
                raise NotFound(
                    "block",
                    str(b),
                    hint=f"{field}: pod has blocks 0..{self.fabric.block_count - 1}",
                )
        replayed, token, spec = await self._begin_change(job, "replace", caller, failed, new)
        if replayed:
            after = SlicePlacement.from_spec(job, spec)
            index = after.index_of_block(new)
            assert index is not None
            rep = replace_block(self.fabric, after.with_block(index, failed), failed, new)
            record = await self.store.get_slice(job)
            if record is None:
                raise NotFound("slice", job)
            return ReplaceOutcome(rep, record, replayed=True)
        placement = SlicePlacement.from_spec(job, spec)
        rep = replace_block(self.fabric, placement, failed, new)

        async def abort() -> None:
            await self.store.abort(job, token, "replace", new=new)

        await self._program(job, rep.change, abort, Fence(job, int(token)))
        replaced = f"{failed}:{new}"
        wired_at = await self._commit(
            job,
            token,
            "replace",
            rep.change,
            abort,
            new_spec=rep.after.spec(),
            replaced=replaced,
            unclaim=(failed,),
        )
        record = SliceRecord(rep.after, True, wired_at, None, replaced)
        return ReplaceOutcome(rep, record, replayed=False)

    # -- the steps ---------------------------------------------------------------------

    async def _begin_change(
        self, job: str, kind: str, caller: Fence | None, failed: int = -1, new: int = -1
    ) -> tuple[bool, str, str]:
        """(replayed: this very change was done already, the change's token, the slice's
        spec)."""
        for _ in range(_ATTEMPTS):
            try:
                token, spec = await self.store.begin_change(
                    job, kind, self._lease_ms, failed, new, caller
                )
                return False, token, spec
            except Conflict as c:
                if c.reason == "REPLAYED":
                    return True, "", c.value
                if c.reason == "STALE":
                    await self._recover(job, c.value)
                    continue
                self._refuse(job, c, failed=failed, new=new)
        raise Aborted(f"slice {job} kept changing under this call; retry")

    def _refuse(self, job: str, c: Conflict, *, failed: int = -1, new: int = -1) -> None:
        s = c.reason
        if s == "NOT_FOUND":
            raise NotFound("slice", job, hint="not wired, or already released")
        if s == "DIFFERENT":
            raise FailedPrecondition(
                f"slice {job}",
                "is already wired with a different placement (grid, blocks, wrap or twist); "
                "release it first or use another job id",
                reason="SLICE_EXISTS",
            )
        if s == "BUSY":
            raise Aborted(
                f"slice {job} has a {c.value} in progress in another call; retry",
                reason="SLICE_BUSY",
            )
        if s == "BLOCK_IN_USE":
            block, owner = c.value.split(" ", 1)
            what = "already in this slice" if owner == job else f"wired to slice {owner}"
            raise FailedPrecondition(f"block {block}", f"is {what}", reason="BLOCK_IN_USE")
        if s == "NOT_IN_SLICE":
            raise FailedPrecondition(
                f"block {failed}", f"is not in slice {job}", reason="BLOCK_NOT_IN_SLICE"
            )
        if s == "FABRIC_CHANGED":
            raise FailedPrecondition(
                "fabric",
                "the pod's stored fabric configuration differs from this instance's; "
                "restart it with the pod's configuration",
                reason="FABRIC_CHANGED",
            )
        if s == STALE_LEASE:
            self.metrics.stale_write_refused(self.store.pod_id, "lease")
            raise FailedPrecondition(
                f"slice {job}",
                f"the caller's lease on it is older than one seen before (token {c.value}): "
                "a newer holder of the job took over; this caller's view is stale",
                reason=STALE_LEASE,
            )
        raise Aborted(f"unexpected answer {s} from the store")

    async def _program(
        self,
        job: str,
        change: FabricChange,
        abort: Callable[[], Awaitable[None]],
        fence: Fence,
    ) -> None:
        """Apply `change` through the driver; on failure undo what was applied and drop the claim."""
        try:
            async with asyncio.timeout(self._driver_timeout):
                await self.driver.apply(change, fence)
        except (SwitchDriverError, TimeoutError) as exc:
            if isinstance(exc, SwitchDriverError) and exc.stale:
                self._fenced_out(job, "switch")
            # (An undo after our lease was taken over is refused by the switches: fenced.)
            applied = exc.applied if isinstance(exc, SwitchDriverError) else None
            transient = exc.transient if isinstance(exc, SwitchDriverError) else True
            what = str(exc) or f"no answer within {self._driver_timeout:.1f} s"
            log.warning("switch driver failed for slice %s: %s; rolling back", job, what)
            await self._undo(job, applied if applied is not None else change, abort, fence)
            msg = f"switch driver failed, slice {job} left as it was: {what}"
            if transient:
                raise Unavailable(msg, reason="SWITCH_DRIVER_FAILED") from exc
            raise Aborted(msg, reason="SWITCH_DRIVER_FAILED") from exc
        except asyncio.CancelledError:
            # The caller went away mid-change: leave no trace, then stop. Should the
            # rollback fail too, the lease expires and the next call rolls it back.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._undo(job, change, abort, fence))
            raise

    def _fenced_out(self, job: str, where: str) -> None:
        self.metrics.stale_write_refused(self.store.pod_id, where)
        log.warning(
            "the change of slice %s outlived its lease and was taken over; its %s was "
            "refused (fencing): leaving the rollback to the new holder",
            job,
            "commit" if where == "commit" else "switch batch",
        )
        raise Aborted(
            f"the change of slice {job} outlived its lease and was taken over by another "
            "call, which rolls it back; retry",
            reason="LEASE_LOST",
        )

    async def _undo(
        self,
        job: str,
        programmed: FabricChange,
        abort: Callable[[], Awaitable[None]],
        fence: Fence,
    ) -> None:
        try:
            async with asyncio.timeout(self._driver_timeout):
                await self.driver.apply(programmed.inverse(), fence)
        except (SwitchDriverError, TimeoutError) as exc:
            if isinstance(exc, SwitchDriverError) and exc.stale:
                self._fenced_out(job, "switch")
            log.error(
                "rollback of slice %s failed (%s): it stays locked until its lease ends, "
                "then the next change to it rolls it back",
                job,
                exc,
            )
            raise Unavailable(
                f"switch driver failed and so did the rollback for slice {job} ({exc}); "
                "it is rolled back when the lease ends (retry later)",
                reason="SWITCH_DRIVER_FAILED",
            ) from exc
        await abort()

    async def _commit(
        self,
        job: str,
        token: str,
        mode: str,
        change: FabricChange,
        abort: Callable[[], Awaitable[None]],
        **kwargs,
    ) -> int:
        """Commit; answers the slice's wired_at (ms)."""
        try:
            return (await self.store.commit(job, token, mode, change, **kwargs)).wired_at_ms
        except Conflict as c:
            conflict = c
        if conflict.reason == "LOST":
            # Our lease ran out and another call took the change over and rolls it back.
            self._fenced_out(job, "commit")
        log.error("commit of %s for slice %s refused: %s; rolling back", mode, job, conflict)
        await self._undo(job, change, abort, Fence(job, int(token)))
        if conflict.reason == "FABRIC_CHANGED":
            self._refuse(job, conflict)
        raise Aborted(f"the {mode} of slice {job} conflicted: {conflict}", reason="TABLE_CONFLICT")

    async def _recover(self, job: str, stale_token: str) -> None:
        """Take over a change whose lease ran out and roll it back (a crashed or stuck call)."""
        token = await self.store.steal(job, stale_token, self._lease_ms)
        if token is None:
            return  # finished, or another call took it over: the caller looks again
        record = await self.store.get_slice(job)
        if record is None or record.op is None or record.op.token != token:
            return
        op = record.op
        if op.kind == "wire":
            change = wire_change(self.fabric, record.placement)
        elif op.kind == "release":
            change = release_change(self.fabric, record.placement)
        else:
            assert op.failed is not None and op.new is not None
            change = replace_block(self.fabric, record.placement, op.failed, op.new).change

        async def abort() -> None:
            await self.store.abort(
                job, token, op.kind, record.placement.blocks, -1 if op.new is None else op.new
            )

        log.warning("rolling back a %s of slice %s left in flight past its lease", op.kind, job)
        await self._undo(job, change, abort, Fence(job, int(token)))
