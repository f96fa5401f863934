"""What every step of `lightpath demo` is given: the stack's endpoints, one
channel per process, a tracer, and a section heading printer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from opentelemetry.sdk.trace import TracerProvider

from lightpath.client import channel


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
