"""The core broker's metrics (issue 18): decisions by outcome and their latency, cores
reserved (now and at the busiest instant of the next hour) against cores per device,
and live reservations.

Names and attributes are those of lightpath_services.common.metric_names. The gauges read a
snapshot that `run` (a background loop of the service, on the event loop that owns the
capacity map) computes every `refresh_s` from the replica's in-memory view, so a
scrape never reads Redis nor touches the map from the reader's thread. The counter and
the histogram are recorded where a request is decided.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

from lightpath import __version__
from lightpath_services.common import instruments

if TYPE_CHECKING:
    from lightpath_services.core_broker.view import LiveView

METER_NAME = "lightpath.core_broker"
REFRESH_S = 5.0
HOUR_MS = 3_600_000


class BrokerMetrics:
    """The broker's instruments and the cached state its gauges show."""

    def __init__(
        self,
        meter: Meter | None = None,
        *,
        refresh_s: float = REFRESH_S,
        clock: Any = time.time,
    ):
        meter = meter or instruments.get_meter(METER_NAME, __version__)
        self.refresh_s = refresh_s
        self._clock = clock
        self._reserved: dict[tuple[str, str], int] = {}  # (device, window) -> cores
        self._total: dict[str, int] = {}  # device -> cores
        self._live: int | None = None
        meter.create_observable_gauge(
            "lightpath.broker.cores.reserved",
            [self._observe_reserved],
            description="cores reserved per device, now and over the next hour",
        )
        meter.create_observable_gauge(
            "lightpath.broker.cores.total", [self._observe_total], description="cores per device"
        )
        meter.create_observable_gauge(
            "lightpath.broker.reservations.live",
            [self._observe_live],
            description="live reservations",
        )
        self._decisions = meter.create_counter(
            "lightpath.broker.decisions",
            description="decisions by outcome (granted, partial, deferred, rejected)",
        )
        self._commits = meter.create_counter(
            "lightpath.broker.commits",
            description="decision batches committed, by whether Redis re-read a device's "
            "schedule (true: another writer, e.g. a replica, reserved on it meanwhile)",
        )
        self._duration = meter.create_histogram(
            "lightpath.broker.decision.duration", unit="s", description="time of one decision"
        )

    @classmethod
    def noop(cls) -> BrokerMetrics:
        return cls(NoOpMeterProvider().get_meter(METER_NAME))

    # -- events --------------------------------------------------------------------

    def serving(self) -> None:
        """Export the decision counter at 0 for every outcome before the first decision
        (an alert's rate() or increase() then sees the first one)."""
        from lightpath_services.core_broker.decisions import Outcome

        for outcome in Outcome:
            self._decisions.add(0, {"outcome": str(outcome).lower()})

    def decided(self, decisions: Iterable[Any]) -> None:
        """Committed decisions (each with its Outcome: GRANTED, PARTIAL, DEFERRED, REJECTED)."""
        for d in decisions:
            self._decisions.add(1, {"outcome": str(d.outcome).lower()})

    def committed(self, *, rechecked: bool) -> None:
        """A batch's commit reached Redis: written as decided, or re-checked on some device."""
        self._commits.add(1, {"rechecked": "true" if rechecked else "false"})

    def answered(self, started: float) -> None:
        """A Reserve call's requests were decided and committed (or failed): from the
        request's arrival at the decision worker's queue to its answer."""
        self._duration.record(time.monotonic() - started)

    # -- the gauges' snapshot ------------------------------------------------------

    async def run(self, view: LiveView) -> None:
        """Refresh the snapshot every refresh_s (a supervised background task)."""
        while True:
            self.refresh(view)
            await asyncio.sleep(self.refresh_s)

    def refresh(self, view: LiveView) -> None:
        cap = view.capacity
        now = int(self._clock() * 1000)
        devices = cap.devices()
        reserved: dict[tuple[str, str], int] = {}
        total: dict[str, int] = {}
        if devices:
            used_now = cap.used_at(now)
            used_hour = cap.peak_used(now, now + HOUR_MS)
            for d in devices:
                i = cap.index_of(d.device_id)
                if i is None:
                    continue
                total[d.device_id] = d.cores
                reserved[(d.device_id, "now")] = int(used_now[i])
                reserved[(d.device_id, "next_hour")] = int(used_hour[i])
        # The map holds live and future allocations only (the reaper removes ended ones).
        self._live = cap.reservations()
        self._reserved, self._total = reserved, total

    # -- callbacks (the reader's thread: cached values only) ----------------------

    def _observe_reserved(self, options: CallbackOptions) -> Sequence[Observation]:
        return [
            Observation(n, {"device": dev, "window": w}) for (dev, w), n in self._reserved.items()
        ]

    def _observe_total(self, options: CallbackOptions) -> Sequence[Observation]:
        return [Observation(n, {"device": dev}) for dev, n in self._total.items()]

    def _observe_live(self, options: CallbackOptions) -> Sequence[Observation]:
        return [] if self._live is None else [Observation(self._live)]


__all__ = ["BrokerMetrics"]
