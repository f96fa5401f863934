"""What changed, and when: the services' watch streams, and a tick for what has none.

The hub follows, as the console itself, each superpod's WatchPod stream on the cell (job
transitions and block health changes) and the core broker's WatchReservations, and ticks
every `poll_s` for what no stream covers (OCS use, 1xK states, aggregation switches,
heartbeat ages). It keeps no data, only a version per topic ("pod:pod-1", "jobs",
"cores", "tick"): each open event stream re-reads its view with its own viewer's
credential when a topic it shows moves, so what one viewer may see never reaches another.

Every stream runs under the supervisor (restarted with backoff, logged, and the console's
/healthz answers 503 while one is down).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable

from lightpath.errors import LightpathError
from lightpath_services.common.supervisor import Supervisor
from lightpath_services.console.backends import CONSOLE, Backends, stream_items

log = logging.getLogger("lightpath.console.hub")


class Hub:
    def __init__(self, backends: Backends, supervisor: Supervisor, poll_s: float):
        self.backends = backends
        self.supervisor = supervisor
        self.poll_s = poll_s
        self.versions: dict[str, int] = {}
        self.pods: list[str] = []
        self._changed = asyncio.Condition()

    async def bump(self, *topics: str) -> None:
        async with self._changed:
            for t in topics:
                self.versions[t] = self.versions.get(t, 0) + 1
            self._changed.notify_all()

    def version(self, topics: Iterable[str]) -> tuple[int, ...]:
        return tuple(self.versions.get(t, 0) for t in topics)

    async def wait(self, topics: Iterable[str], seen: tuple[int, ...], timeout: float) -> bool:
        """Until a topic of `topics` moves past `seen` (True), or `timeout` seconds (False)."""
        wanted = list(topics)

        async def moved() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.version(wanted) != seen)

        try:
            await asyncio.wait_for(moved(), timeout)
        except TimeoutError:
            return False
        return True

    # -- background tasks ------------------------------------------------------------

    def start(self) -> None:
        self.supervisor.supervise(self._discover, "console: superpods", forever=True)
        self.supervisor.supervise(self._tick, "console: tick", forever=True)
        if self.backends.broker is not None:
            self.supervisor.supervise(
                self._watch_reservations, "console: core broker watch", forever=True
            )

    async def _discover(self) -> None:
        """The superpods the cell knows (again every 10 ticks), each with its watch."""
        while True:
            pods = sorted(p.registration.pod_id for p in await self.backends.list_pods(CONSOLE))
            for pod in pods:
                if pod not in self.pods:
                    self.pods.append(pod)
                    self.supervisor.supervise(
                        functools.partial(self._watch_pod, pod),
                        f"console: watch {pod}",
                        forever=True,
                    )
            await asyncio.sleep(self.poll_s * 10)

    async def _watch_pod(self, pod_id: str) -> None:
        call = self.backends.watch_pod(pod_id)
        try:
            await self.bump(f"pod:{pod_id}", "jobs")  # anything missed while not watching
            async for _ in stream_items(call):
                await self.bump(f"pod:{pod_id}", "jobs")
        finally:
            call.cancel()
        raise LightpathError(f"the cell ended the watch of {pod_id}")

    async def _watch_reservations(self) -> None:
        call = self.backends.watch_reservations()
        try:
            await self.bump("cores")
            async for _ in stream_items(call):
                await self.bump("cores")
        finally:
            call.cancel()
        raise LightpathError("the core broker ended the reservations watch")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.bump("tick")
