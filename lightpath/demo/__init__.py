"""`lightpath demo`: a scenario that exercises every service of the stack.

Each topic contributes an async step `(DemoContext) -> None` to SCENARIOS;
the steps run in order against one stack and print what they show.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from opentelemetry.sdk.trace import TracerProvider

from lightpath.client import channel
from lightpath.telemetry import configure_tracing


@dataclass
class DemoContext:
    endpoints: dict[str, str]
    tracer_provider: TracerProvider
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def channel(self, process: str) -> grpc.aio.Channel:
        if process not in self._channels:
            self._channels[process] = channel(
                self.endpoints[process], tracer_provider=self.tracer_provider
            )
        return self._channels[process]

    @property
    def tracer(self):
        return self.tracer_provider.get_tracer("lightpath.demo")

    @staticmethod
    def section(title: str) -> None:
        print(f"\n== {title} " + "=" * max(0, 66 - len(title)), flush=True)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()


Scenario = Callable[[DemoContext], Awaitable[None]]


def scenarios() -> list[Scenario]:
    from lightpath.demo import agg, cell, cores, foundation, graph, ocs, security, switched

    return [
        foundation.run,
        ocs.run,
        cell.run,
        security.run,
        switched.run,
        cores.run,
        graph.run,
        agg.run,
    ]


async def run_demo(endpoints: dict[str, str]) -> int:
    ctx = DemoContext(endpoints, configure_tracing("lightpath-demo", set_global=False))
    try:
        for step in scenarios():
            await step(ctx)
    finally:
        await ctx.close()
    print("\ndemo finished", flush=True)
    return 0
