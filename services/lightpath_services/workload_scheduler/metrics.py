"""A pod's domain metrics (issue 18): blocks by state and node type, jobs by state,
the queue, admissions, preemptions, block replacements and wiring times.

Names and attributes are those of lightpath_services.common.metric_names. The gauges read a
snapshot that `run` (a background loop of the service) refreshes every `refresh_s`
(the pod snapshot planning reads, and the per-state job counts the store keeps), so
a scrape never touches Redis and never waits for the event loop. Counters and
histograms are recorded where the event happens.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

from lightpath import __version__
from lightpath_services.common import instruments

if TYPE_CHECKING:
    from lightpath.domain.blocks import PodFabric
    from lightpath_services.workload_scheduler.store import PodStore

METER_NAME = "lightpath.workload_scheduler"
REFRESH_S = 5.0
_ADMITTED = {"RUNNING": "admitted", "WIRING": "admitted", "PENDING": "queued"}
_BLOCK_STATES = ("free", "allocated", "failed")
REPLACEMENT_RESULTS = ("replaced", "lost", "stopped")
ADMISSION_RESULTS = ("admitted", "queued", "refused")
PREEMPTION_ACTIONS = ("terminate", "delay", "shrink")


class BlockOutcome(Protocol):
    """What `PodMetrics.replaced` reads of how a failed block's handling ended
    (core.Outcome is one)."""

    @property
    def replacement(self) -> dict[str, Any] | None: ...

    @property
    def affected(self) -> Sequence[str]: ...


Ended = TypeVar("Ended", bound=BlockOutcome)


class PodMetrics:
    """A pod's instruments and the cached state its gauges show."""

    def __init__(self, meter: Meter | None = None, *, refresh_s: float = REFRESH_S):
        meter = meter or instruments.get_meter(METER_NAME, __version__)
        self.refresh_s = refresh_s
        self._blocks: dict[tuple[str, str, str], int] = {}  # (pod, state, node type) -> blocks
        self._chips: dict[tuple[str, str, str], int] = {}  # (pod, state, node type) -> chips
        self._jobs: dict[tuple[str, str], int] = {}  # (pod, state) -> jobs
        self._queue: dict[str, int] = {}  # pod -> jobs waiting
        meter.create_observable_gauge(
            "lightpath.pod.blocks",
            [self._observe_blocks],
            description="building blocks by state (free, allocated, failed) and node type",
        )
        meter.create_observable_gauge(
            "lightpath.pod.chips",
            [self._observe_chips],
            description="chips by state (used by block or sub-block slices, failed, free) "
            "and node type",
        )
        meter.create_observable_gauge(
            "lightpath.pod.jobs", [self._observe_jobs], description="jobs by state"
        )
        meter.create_observable_gauge(
            "lightpath.pod.queue.depth", [self._observe_queue], description="jobs queued in a pod"
        )
        self._attempts = meter.create_counter(
            "lightpath.pod.admission.attempts", description="admission attempts by result"
        )
        self._admission = meter.create_histogram(
            "lightpath.pod.admission.duration",
            unit="s",
            description="time of one admission attempt",
        )
        self._preemptions = meter.create_counter(
            "lightpath.pod.preemptions",
            description="preemptions by action (terminate, delay, shrink)",
        )
        self._replacements = meter.create_counter(
            "lightpath.pod.block_replacements",
            description="replacements of failed blocks by result",
        )
        self._replacement = meter.create_histogram(
            "lightpath.pod.block_replacement.duration",
            unit="s",
            description="time to replace a failed block",
        )
        self._wiring = meter.create_histogram(
            "lightpath.pod.wiring.duration", unit="s", description="time to wire a slice"
        )
        self._stale_forwards = meter.create_counter(
            "lightpath.pod.stale_forwards_refused",
            description="cell forwards refused for an older forward token (fencing): "
            "another cell replica had taken the forward over",
        )
        self._stale_commits = meter.create_counter(
            "lightpath.pod.stale_commits_refused",
            description="this replica's commits of a wiring refused after its wiring lease "
            "ran out and another replica took the job over (fencing)",
        )

    @classmethod
    def noop(cls) -> PodMetrics:
        return cls(NoOpMeterProvider().get_meter(METER_NAME))

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    # -- series at 0 from the start ------------------------------------------------

    def serving(self, pod: str) -> None:
        """Export this pod's counters at 0 for every label set, before the first event:
        an alert's `increase()` over a counter that appears with its first event sees
        nothing, so the first block replacement of a run would look like none (issue 33)."""
        for result in REPLACEMENT_RESULTS:
            self._replacements.add(0, {"pod": pod, "result": result})
        for result in ADMISSION_RESULTS:
            self._attempts.add(0, {"pod": pod, "result": result})
        for action in PREEMPTION_ACTIONS:
            self._preemptions.add(0, {"pod": pod, "action": action})
        self._stale_forwards.add(0, {"pod": pod})
        self._stale_commits.add(0, {"pod": pod})

    # -- events --------------------------------------------------------------------

    def admitted(self, pod: str, state: str, started: float) -> None:
        """An admission answered with the job in `state`: admitted, queued or refused."""
        self._attempts.add(1, {"pod": pod, "result": _ADMITTED.get(state, "refused")})
        self._admission.record(time.monotonic() - started)

    def stale_forward_refused(self, pod: str) -> None:
        """A cell forward (AdmitJob, a take-over's GetJob) older than one recorded."""
        self._stale_forwards.add(1, {"pod": pod})

    def stale_commit_refused(self, pod: str) -> None:
        """This replica's commit of a wiring whose lease it had lost to a take-over."""
        self._stale_commits.add(1, {"pod": pod})

    def preempted(self, pod: str, victims: Iterable[Any]) -> None:
        """Victims of a committed allocation (each with its action: TERMINATE, DELAY, SHRINK)."""
        for v in victims:
            self._preemptions.add(1, {"pod": pod, "action": v.action.lower()})

    def replaced(self, pod: str, outcome: Ended, started: float) -> Ended:
        """The end of a failed block's handling (WS-5): replaced, lost (the slice was
        suspended or failed: no spare, or the OCS could not swap) or stopped (the job
        changed meanwhile). Answers `outcome`, so a return statement can wrap it."""
        if outcome.replacement is not None:
            result = "replaced"
            self._replacement.record(time.monotonic() - started)
        elif outcome.affected:
            result = "lost"
        else:
            result = "stopped"
        self._replacements.add(1, {"pod": pod, "result": result})
        return outcome

    def wired(self, started: float) -> None:
        """A WireSlice for a slice ended (followed through to its end after a deadline)."""
        self._wiring.record(time.monotonic() - started)

    # -- the gauges' snapshot ------------------------------------------------------

    async def run(self, pod: Any) -> None:
        """Refresh the snapshot every refresh_s once the pod's scheduler exists (a
        supervised background task; `pod` is the server's PodHandle)."""
        while True:
            sched = pod.scheduler
            if sched is not None:
                await self.refresh(sched.store, sched.fabric)
            await asyncio.sleep(self.refresh_s)

    async def refresh(self, store: PodStore, fabric: PodFabric) -> None:
        """Read the pod as its scheduler plans on it (the snapshot of `store` over
        `fabric`) and the per-state job counts the store keeps."""
        pod = store.keys.pod_id
        state = await store.snapshot(fabric)
        counts = await store.state_counts()
        blocks = {
            (pod, s, t): c[s] for t, c in state.counts_by_type().items() for s in _BLOCK_STATES
        }
        self._blocks = {**self._blocks, **blocks}
        self._chips = {
            **self._chips,
            **{
                (pod, s, t): c["chips_" + s]
                for t, c in state.counts_by_type().items()
                for s in ("used", "failed", "free")
            },
        }
        jobs: Counter[tuple[str, str]] = Counter({(pod, s): n for s, n in counts.items()})
        # A state seen once stays, at 0, so its series does not vanish.
        self._jobs = {**{k: 0 for k in self._jobs if k[0] == pod}, **jobs}
        self._queue = {**self._queue, pod: len(state.queue())}

    # -- callbacks (the reader's thread: cached values only) ----------------------

    def _observe_blocks(self, options: CallbackOptions) -> Sequence[Observation]:
        return [
            Observation(n, {"pod": p, "state": s, "node_type": t})
            for (p, s, t), n in self._blocks.items()
        ]

    def _observe_chips(self, options: CallbackOptions) -> Sequence[Observation]:
        return [
            Observation(n, {"pod": p, "state": s, "node_type": t})
            for (p, s, t), n in self._chips.items()
        ]

    def _observe_jobs(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"pod": p, "state": s}) for (p, s), n in self._jobs.items()]

    def _observe_queue(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"pod": p}) for p, n in self._queue.items()]


__all__ = ["PodMetrics"]
