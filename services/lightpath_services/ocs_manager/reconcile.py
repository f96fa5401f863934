"""Keeping the switches what the committed tables say (issue 20): fail-static reconcile.

The committed tables (store.py) are the truth; switches keep their cross-connects
whatever happens to the manager. A supervised loop reads every switch (through
the agent driver) every LIGHTPATH_OCS_RECONCILE_S and, for each switch that
differs from the committed tables on a port no change is using, sends one batch
with exactly the difference:

* after a manager restart the first pass finds the switches as committed and
  sends nothing: it adopts them, rewiring nothing that is right;
* a switch that restarted empty (a new boot id) gets back what it should hold;
* a port changed behind the manager's back is put back.

Ports of blocks with a change in flight are skipped (that change programs them,
or its rollback does). The repair carries the switch's boot id and version as
read (`expect_boot_id`, `expect_version`): a change that programmed the switch
in between makes the switch refuse it (VERSION_MISMATCH), and the next pass
looks again. The store is read before and after the switches; a pass whose two
reads differ is skipped.

A pass that finds a change in flight waits for it to end (it looks again every
`defer_poll_s`) before reading the switches: the change's batches and the pass's
reads share each switch's one session (and the manager's CPU), so a read landing
on a wire delays the wire, which a caller waits on, for a repair that cannot touch
the change's blocks anyway; and a change that commits during the read makes the
pass read every switch again. The wait is bounded: after `interval_s` of changes
in flight, one after another, the pass reads anyway, so a pod that never stops
changing still has a restarted switch put back within two intervals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from lightpath.client import error_report
from lightpath.domain.southbound import OCS, SouthboundDevice
from lightpath.domain.torus import Fabric
from lightpath.v1 import optical_switch_pb2 as pb
from lightpath_services.ocs_manager.agent_driver import AgentSwitchDriver
from lightpath_services.ocs_manager.invariants import FabricState
from lightpath_services.ocs_manager.metrics import OcsMetrics
from lightpath_services.ocs_manager.store import OcsStore

log = logging.getLogger("lightpath.ocs_manager")

# Why a switch was repaired (lightpath.ocs.switch_repairs' `reason`): it came back with
# empty tables (a new boot id), or its tables differ from the committed ones.
RESTARTED, DRIFTED = "restarted", "drifted"
REPAIR_REASONS = (RESTARTED, DRIFTED)

Pair = tuple[int, int]


@dataclass(frozen=True)
class Repair:
    """What one switch needs to match the committed tables (pure, see `repair_for`)."""

    disconnect: tuple[Pair, ...] = ()
    outputs: tuple[tuple[int, int | None], ...] = ()
    connect: tuple[Pair, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.disconnect or self.outputs or self.connect)


def busy_blocks(state: FabricState) -> set[int]:
    """Blocks of slices with a change in flight (and the blocks such a change reserved)."""
    return {
        b for s in state.slices.values() if s.changing for b in (*s.placement.blocks, *s.reserved)
    }


def repair_for(
    fabric: Fabric,
    device: SouthboundDevice,
    committed: FabricState,
    have: pb.OpticalSwitchState,
    busy: set[int],
) -> Repair:
    """The batch that makes switch `device` hold what `committed` says, leaving alone every
    port of a block in `busy`. Pure."""
    if device.kind == OCS:
        k = fabric.ocs_of_index(device.index)[2]

        def free(port: int) -> bool:
            seg = fabric.segment_at(k, port)
            return seg is None or seg[0] not in busy

        want = committed.tables.get(device.index, {})
        held: dict[int, int] = {}
        for xc in have.cross_connects:
            held[xc.port_a] = xc.port_b
            held[xc.port_b] = xc.port_a
        disconnect = sorted(
            {
                (min(p, q), max(p, q))
                for p, q in held.items()
                if want.get(p) != q and free(p) and free(q)
            }
        )
        connect = sorted(
            {
                (min(p, q), max(p, q))
                for p, q in want.items()
                if held.get(p) != q and free(p) and free(q)
            }
        )
        return Repair(disconnect=tuple(disconnect), connect=tuple(connect))
    block = device.index
    if block in busy:
        return Repair()
    total = fabric.total_axes
    base = block * total
    wanted = {i - base: o for i, o in committed.one_to_many.items() if base <= i < base + total}
    selected = {s.input: s.output for s in have.outputs if s.HasField("output")}
    return Repair(
        outputs=tuple(
            (i, wanted.get(i))
            for i in sorted(set(wanted) | set(selected))
            if wanted.get(i) != selected.get(i)
        )
    )


@dataclass
class ReconcileReport:
    skipped: bool = False  # the committed tables moved while the switches were read
    deferred: bool = False  # a change was in flight: the switches were not read (yet)
    unreachable: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)  # a new boot id since the last pass
    repaired: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # a repair a switch refused or lost


class SwitchReconciler:
    """The fail-static reconcile loop of an ocs_manager whose switches sit behind agents."""

    def __init__(
        self,
        fabric: Fabric,
        store: OcsStore,
        driver: AgentSwitchDriver,
        *,
        interval_s: float = 5.0,
        metrics: OcsMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fabric = fabric
        self.store = store
        self.driver = driver
        self.interval_s = interval_s
        # how often a deferred pass looks whether the change ended (a wire is ~0.2-0.3 s)
        self.defer_poll_s = min(interval_s / 4, 0.25)
        self.metrics = metrics or OcsMetrics.noop()
        self.clock = clock
        self.boots: dict[str, str] = {}
        self.passes = 0
        self.deferrals = 0  # looks that found a change in flight and waited
        self.last: ReconcileReport | None = None
        self._down: set[str] = set()
        self._deferred_since: float | None = None

    async def run(self) -> None:
        """Reconcile every interval_s (a supervised background task: a pass that raises, e.g.
        Redis down, restarts it with backoff and shows in health)."""
        while True:
            report = await self.reconcile_once()
            await asyncio.sleep(self.defer_poll_s if report.deferred else self.interval_s)

    def _defer(self, committed: FabricState) -> bool:
        """Whether to wait for the changes in flight in `committed` (see the module's doc)."""
        if not busy_blocks(committed):
            self._deferred_since = None
            return False
        now = self.clock()
        if self._deferred_since is None:
            self._deferred_since = now
        if now - self._deferred_since >= self.interval_s:
            self._deferred_since = None  # waited long enough: this pass reads anyway
            return False
        self.deferrals += 1
        return True

    async def reconcile_once(self) -> ReconcileReport:
        report = ReconcileReport()
        pod = self.store.pod_id
        for _ in range(3):
            before = await self.store.snapshot()
            if self._defer(before):
                report.deferred = True
                return report  # not a pass: `passes` and `last` stay
            states = await self.driver.read_all()
            after = await self.store.snapshot()
            if before.tables == after.tables and before.one_to_many == after.one_to_many:
                break
        else:
            report.skipped = True
            self._done(report)
            return report
        busy = busy_blocks(before) | busy_blocks(after)
        repairs: list[tuple[str, pb.ApplyBatchRequest, str]] = []
        rechecks: list[str] = []
        answered = []  # (switch id, its state, its boot id last pass)
        for sid, st in states.items():
            if isinstance(st, grpc.aio.AioRpcError):
                report.unreachable.append(sid)
                continue
            prev = self.boots.get(sid)
            self.boots[sid] = st.boot_id
            answered.append((sid, st, prev))
            if (prev is not None and prev != st.boot_id) or sid in self._down:
                self.driver.reconnected(sid)  # back: Describe it, retry what it lacked
                rechecks.append(sid)
            elif sid in self.driver.undescribed or sid in self.driver.mismatched:
                # out of reach at start and answers now, or did not match: asked every
                # pass, since a switch described mid-boot (its ports not yet listed) or
                # reconfigured by its operator matches without a restart
                rechecks.append(sid)
        if rechecks:
            await self.driver.check_inventory(rechecks)
        for sid, st, prev in answered:
            if sid in self.driver.mismatched:
                continue  # never programmed (health says why)
            restarted = prev is not None and prev != st.boot_id
            if restarted:
                report.restarted.append(sid)
                log.warning(
                    "switch %s restarted (boot %s, was %s): putting back what it should hold",
                    sid,
                    st.boot_id,
                    prev,
                )
            fix = repair_for(self.fabric, self.driver.devices[sid], after, st, busy)
            if fix.empty:
                continue
            req = pb.ApplyBatchRequest(
                disconnect=[pb.PortPair(port_a=p, port_b=q) for p, q in fix.disconnect],
                connect=[pb.PortPair(port_a=p, port_b=q) for p, q in fix.connect],
                expect_boot_id=st.boot_id,
                expect_version=st.version,
            )
            for i, o in fix.outputs:
                sel = req.set_outputs.add(input=i)
                if o is not None:
                    sel.output = o
            repairs.append((sid, req, RESTARTED if restarted else DRIFTED))
        results = await asyncio.gather(
            *(self.driver.apply_batch(sid, req) for sid, req, _ in repairs), return_exceptions=True
        )
        for (sid, req, why), res in zip(repairs, results, strict=True):
            if isinstance(res, grpc.aio.AioRpcError):
                report.refused.append(sid)
                log.info("repair of switch %s not applied (%s); next pass", sid, error_report(res))
            elif isinstance(res, BaseException):
                raise res
            else:
                report.repaired.append(sid)
                self.metrics.switch_repaired(pod, why)
                log.warning(
                    "switch %s %s: repaired %d disconnects, %d 1xK outputs, %d connects",
                    sid,
                    "after a restart" if why == RESTARTED else "differed from the committed tables",
                    len(req.disconnect),
                    len(req.set_outputs),
                    len(req.connect),
                )
        self._done(report)
        return report

    def _done(self, report: ReconcileReport) -> None:
        self.passes += 1
        self.last = report
        if report.skipped:
            return
        self.metrics.switches_unreachable(self.store.pod_id, len(report.unreachable))
        down = set(report.unreachable)
        if down != self._down:  # said once per change, not every pass
            if down:
                log.warning(
                    "%d switches unreachable, e.g. %s; their state is checked again every %.1f s",
                    len(down),
                    sorted(down)[0],
                    self.interval_s,
                )
            else:
                log.info("every switch answers again")
            self._down = down
