"""A pod's fabric metrics (issue 18): cross-connects and port use per OCS, 1xK switch
states, the time and outcome of each wire / release / replace, invariant-check
failures, and ring channels reserved on a SWITCHED pod.

Names and attributes are those of lightpath_services.common.metric_names. The gauges read a
snapshot that a background loop of the service refreshes every `refresh_s`: it reads
the OCS versions (one HMGET) and reads the routing tables and 1xK settings again only
when a version moved, so an idle fabric costs one small read per refresh and a scrape
never touches Redis. The histogram and the counter are recorded where the change or
the check happens.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

from lightpath import __version__
from lightpath.errors import LightpathError
from lightpath_services.common import instruments

if TYPE_CHECKING:
    from lightpath.domain.torus import Fabric
    from lightpath_services.ocs_manager.store import OcsStore

METER_NAME = "lightpath.ocs_manager"
REFRESH_S = 5.0
# Where a write under an older lease token is refused (lightpath.ocs.stale_writes_refused).
STALE_WRITES = ("lease", "commit", "switch")

T = TypeVar("T")


class OcsMetrics:
    """A pod's fabric instruments and the cached state its gauges show."""

    def __init__(self, meter: Meter | None = None, *, refresh_s: float = REFRESH_S):
        meter = meter or instruments.get_meter(METER_NAME, __version__)
        self.refresh_s = refresh_s
        self._cross_connects: dict[tuple[str, str], int] = {}  # (pod, ocs) -> cross-connects
        self._utilization: dict[tuple[str, str], float] = {}  # (pod, ocs) -> ports used / cabled
        self._one_to_many: dict[tuple[str, str], int] = {}  # (pod, output) -> 1xK switches
        self._ring_channels: dict[str, int] = {}  # pod -> channels reserved
        self._unreachable: dict[str, int] = {}  # pod -> switches its reconcile could not read
        self._versions: list[Any] | None = None
        meter.create_observable_gauge(
            "lightpath.ocs.cross_connects",
            [self._observe_cross_connects],
            description="cross-connects in use per OCS",
        )
        meter.create_observable_gauge(
            "lightpath.ocs.port_utilization",
            [self._observe_utilization],
            unit="1",
            description="fraction of an OCS's ports in a cross-connect",
        )
        meter.create_observable_gauge(
            "lightpath.ocs.one_to_many.states",
            [self._observe_one_to_many],
            description="1xK switches by selected output",
        )
        meter.create_observable_gauge(
            "lightpath.ocs.ring_channels",
            [self._observe_ring_channels],
            description="ring channels reserved (switched pods)",
        )
        meter.create_observable_gauge(
            "lightpath.ocs.switches_unreachable",
            [self._observe_unreachable],
            description="switches the last reconcile pass could not read (switch agents)",
        )
        self._repairs = meter.create_counter(
            "lightpath.ocs.switch_repairs",
            description="batches the reconcile loop sent to make a switch match the committed "
            "tables, by reason (restarted, drifted)",
        )
        self._change = meter.create_histogram(
            "lightpath.ocs.change.duration",
            unit="s",
            description="time of a wire, release or replace, by outcome",
        )
        self._invariants = meter.create_counter(
            "lightpath.ocs.invariant_failures", description="invariant checks that failed, by rule"
        )
        self._stale = meter.create_counter(
            "lightpath.ocs.stale_writes_refused",
            description="writes refused for an older lease token (fencing): a caller's stale "
            "lease (lease), this manager's commit (commit) or batches (switch) after its "
            "change lease was taken over",
        )

    @classmethod
    def noop(cls) -> OcsMetrics:
        return cls(NoOpMeterProvider().get_meter(METER_NAME))

    # -- series at 0 from the start ------------------------------------------------

    def serving(self, pod: str, rules: Iterable[str], *, repairs: Iterable[str] = ()) -> None:
        """Export, at 0, every series the alert rules read of this pod before its first
        event: invariant failures by rule and, behind switch agents, switch repairs by
        reason and the unreachable switches. An `increase()` over a counter that appears
        with its first event sees nothing, so a first failure would go unseen (issue 33)."""
        for rule in rules:
            self._invariants.add(0, {"pod": pod, "rule": rule})
        for reason in repairs:
            self._repairs.add(0, {"pod": pod, "reason": reason})
        for where in STALE_WRITES:
            self._stale.add(0, {"pod": pod, "where": where})
        if repairs:
            self._unreachable.setdefault(pod, 0)

    # -- events --------------------------------------------------------------------

    def changed(self, pod: str, op: str, outcome: str, started: float) -> None:
        self._change.record(time.monotonic() - started, {"pod": pod, "op": op, "outcome": outcome})

    def violations(self, pod: str, found: Iterable[Any]) -> None:
        """An invariant check (OCS-6) found these violations (each with its rule)."""
        for rule, n in Counter(v.rule for v in found).items():
            self._invariants.add(n, {"pod": pod, "rule": rule})

    def stale_write_refused(self, pod: str, where: str) -> None:
        self._stale.add(1, {"pod": pod, "where": where})

    def switch_repaired(self, pod: str, reason: str) -> None:
        self._repairs.add(1, {"pod": pod, "reason": reason})

    def switches_unreachable(self, pod: str, n: int) -> None:
        self._unreachable[pod] = n

    # -- the gauges' snapshot ------------------------------------------------------

    async def run(self, store: OcsStore, f: Fabric, redis: Any) -> None:
        """Refresh the fabric's gauges every refresh_s (a supervised background task)."""
        while True:
            await self.refresh(store, f, redis)
            await asyncio.sleep(self.refresh_s)

    async def refresh(self, store: OcsStore, f: Fabric, redis: Any) -> None:
        pod = store.pod_id
        versions = await redis.hmget(store.k_ver, f.ocs_ids)
        if versions == self._versions:
            return  # no switch changed since the last read
        use = await store.switch_use(range(f.ocs_count))
        xc, util = {}, {}
        for i, (in_use, _) in enumerate(use):
            cabled = f.ports_cabled(f.ocs_of_index(i)[2])
            xc[(pod, f.ocs_ids[i])] = in_use // 2  # a cross-connect joins two ports
            util[(pod, f.ocs_ids[i])] = in_use / cabled if cabled else 0.0
        otm: Counter[tuple[str, str]] = Counter()
        if f.k > 1:
            states = await store.one_to_many(list(range(f.block_count)))
            for b in range(f.block_count):
                for d in range(f.dims):
                    for a in range(f.axes[d]):
                        selected = states[b].get((d, a), -1)
                        otm[(pod, str(selected) if selected >= 0 else "none")] += 1
        self._cross_connects, self._utilization = xc, util
        self._one_to_many = {**dict.fromkeys(self._one_to_many, 0), **otm}
        self._versions = versions

    async def run_switched(self, store: Any) -> None:
        """A SWITCHED pod: the channels its rings reserve (BITCOUNT of the used bitmap)."""
        while True:
            self._ring_channels = {store.pod_id: int(await store.redis.bitcount(store.k_used))}
            await asyncio.sleep(self.refresh_s)

    # -- callbacks (the reader's thread: cached values only) ----------------------

    def _observe_cross_connects(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"pod": p, "ocs": o}) for (p, o), n in self._cross_connects.items()]

    def _observe_utilization(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(u, {"pod": p, "ocs": o}) for (p, o), u in self._utilization.items()]

    def _observe_one_to_many(self, options: CallbackOptions) -> Sequence[Observation]:
        return [
            Observation(n, {"pod": p, "output": out}) for (p, out), n in self._one_to_many.items()
        ]

    def _observe_unreachable(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"pod": p}) for p, n in self._unreachable.items()]

    def _observe_ring_channels(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"pod": p}) for p, n in self._ring_channels.items()]


def timed(op: str) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """Time a change method of FabricManager (self.metrics, self.store.pod_id) into
    lightpath.ocs.change.duration: outcome ok, replayed (answered from the stored
    slice) or the gRPC code of the error it raised (aborted, unavailable, ...)."""

    def wrap(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        @functools.wraps(fn)
        async def timed_change(self: Any, *args: Any, **kwargs: Any) -> T:
            started = time.monotonic()
            outcome = "error"
            try:
                result = await fn(self, *args, **kwargs)
                outcome = "replayed" if getattr(result, "replayed", False) else "ok"
                return result
            except LightpathError as err:
                outcome = err.code.lower()
                raise
            finally:
                self.metrics.changed(self.store.pod_id, op, outcome, started)

        return timed_change

    return wrap


__all__ = ["OcsMetrics", "timed"]
