"""An aggregation switch's metrics (issue 18): slots in use and in all, commands by
outcome, threshold timeouts, bypass entries, predicted stragglers and bytes aggregated.

Names and attributes are those of lightpath_services.common.metric_names. The gauges read
values that `run` (a background loop of the service, on the event loop that owns the
switch's state) copies from the switch's memory every `refresh_s`, so the reader's
thread never walks the switch's dicts while the loop changes them. The counters are
recorded from the effects of each packet or timer (DataPlane._apply) and where a
command starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import CallbackOptions, Meter, NoOpMeterProvider, Observation

from lightpath import __version__
from lightpath_services.common import instruments

if TYPE_CHECKING:
    from lightpath_services.agg_switch.command import CommandPlan
    from lightpath_services.agg_switch.switch import Effects, SwitchCore

METER_NAME = "lightpath.agg_switch"
REFRESH_S = 5.0


class AggMetrics:
    """A switch's instruments and the cached state its gauges show (keyed by switch, so
    several switches served by one process share one recorder)."""

    def __init__(self, meter: Meter | None = None, *, refresh_s: float = REFRESH_S):
        meter = meter or instruments.get_meter(METER_NAME, __version__)
        self.refresh_s = refresh_s
        self._in_use: dict[str, int] = {}
        self._total: dict[str, int] = {}
        self._bypass: dict[str, int] = {}
        meter.create_observable_gauge(
            "lightpath.agg.slots.in_use",
            [self._gauge(self._in_use)],
            description="aggregation slots in use",
        )
        meter.create_observable_gauge(
            "lightpath.agg.slots.total", [self._gauge(self._total)], description="aggregation slots"
        )
        meter.create_observable_gauge(
            "lightpath.agg.bypass_entries",
            [self._gauge(self._bypass)],
            description="bypass entries installed",
        )
        self._commands = meter.create_counter(
            "lightpath.agg.commands", description="commands by outcome"
        )
        self._timeouts = meter.create_counter(
            "lightpath.agg.timeouts", description="aggregations timed out"
        )
        self._predicted = meter.create_counter(
            "lightpath.agg.predicted_stragglers", description="stragglers predicted"
        )
        self._bytes = meter.create_counter(
            "lightpath.agg.bytes_aggregated", unit="By", description="bytes aggregated"
        )

    @classmethod
    def noop(cls) -> AggMetrics:
        return cls(NoOpMeterProvider().get_meter(METER_NAME))

    # -- events --------------------------------------------------------------------

    def started(self, predicted: Sequence[str]) -> None:
        """A new command, planned around these predicted stragglers (AG-9)."""
        if predicted:
            self._predicted.add(len(predicted))

    def applied(self, switch: str, eff: Effects, plan_of: Callable[[str], CommandPlan]) -> None:
        """What one packet or timer did at `switch`: contributions folded (their
        bytes), chunks timed out (AG-4), commands that ended. A command is counted
        once, by the root switch of its plan: completed or failed. `plan_of` gives
        the plan of a command the effects name (the data plane has loaded it)."""
        folded = 0
        for ev in eff.events:
            if ev.what == "aggregated":
                spec = plan_of(ev.command_id).spec
                folded += spec.chunk_len(ev.chunk) * spec.dtype.numpy.itemsize
            elif ev.what == "timeout":
                self._timeouts.add(1, {"switch": switch})
        if folded:
            self._bytes.add(folded)
        for report in eff.reports:
            here = plan_of(report.command_id).switch(switch)
            if here is not None and here.is_root:
                self._commands.add(1, {"outcome": "failed" if report.failed else "completed"})

    # -- the gauges' snapshot ------------------------------------------------------

    async def run(self, core: SwitchCore) -> None:
        """Copy the switch's state every refresh_s (a supervised background task)."""
        while True:
            self.refresh(core)
            await asyncio.sleep(self.refresh_s)

    def refresh(self, core: SwitchCore) -> None:
        switch = core.switch_id
        self._in_use[switch] = core.pool.in_use
        self._total[switch] = core.pool.capacity
        self._bypass[switch] = len(core.bypass_entries())

    # -- callbacks (the reader's thread: cached values only) ----------------------

    @staticmethod
    def _gauge(values: dict[str, int]) -> Any:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"switch": s}) for s, n in list(values.items())]

        return observe


__all__ = ["AggMetrics"]
