"""One supervisor for every long-lived background task of a service (issue 14).

    supervisor.supervise(lambda: reporter.run(), "cell registration and heartbeat")

runs the coroutine the factory makes; when it raises, the failure is logged
with its trace and a fresh coroutine is started after a capped exponential
backoff (0.1 s doubling up to LIGHTPATH_TASK_BACKOFF_MAX_S, back to 0.1 s once
a run has lasted `reset_after_s`). A task that returns is done, unless it is
`forever`. Cancellation (shutdown) ends it without a restart, also when a
library swallowed the CancelledError and the coroutine returned or failed.

A `needed` task that fails takes the service's health to NOT_SERVING until its
next run has lasted `healthy_after_s` or has called `ready()`; the service then
reports SERVING again by itself. Whatever the coroutine keeps across runs must
live outside it (on its object), so a restart resumes rather than starts over.

Metrics: lightpath.task.restarts (counter, by task) counts every restart and
lightpath.task.down (gauge, by task) is 1 while a task is failed or recovering.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from lightpath import __version__
from lightpath_services.common import instruments

Factory = Callable[[], Coroutine[Any, Any, Any]]
HealthHook = Callable[[bool], Awaitable[None]]

BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 5.0
HEALTHY_AFTER_S = 1.0
RESET_AFTER_S = 30.0


class TaskState(enum.Enum):
    RUNNING = "running"  # started, not failed (or healthy again after a restart)
    RECOVERING = "recovering"  # restarted after a failure, not yet healthy
    BACKOFF = "backoff"  # failed, waiting to restart
    DONE = "done"  # returned (a task that is not `forever`)
    STOPPED = "stopped"  # cancelled at shutdown


DOWN = {TaskState.RECOVERING, TaskState.BACKOFF}

_meter = instruments.get_meter("lightpath.supervisor", __version__)
_restarts = _meter.create_counter(
    "lightpath.task.restarts", description="restarts of a supervised background task"
)
_down = _meter.create_gauge(
    "lightpath.task.down",
    description="1 while a supervised background task is failed or recovering, else 0",
)


def _report(entry: SupervisedTask) -> None:
    _down.set(1 if entry.state in DOWN else 0, {"task": entry.name})


@dataclass
class SupervisedTask:
    """One supervised task's state and counts (for logs, GetInfo and metrics)."""

    name: str
    needed: bool
    forever: bool
    state: TaskState = TaskState.RUNNING
    failures: int = 0  # runs that raised
    restarts: int = 0  # runs started after the first
    last_error: str = ""
    task: asyncio.Task | None = field(default=None, repr=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def down(self) -> bool:
        return self.needed and self.state in DOWN


_current: contextvars.ContextVar[SupervisedTask | None] = contextvars.ContextVar(
    "lightpath_supervised_task", default=None
)


def ready() -> None:
    """Called from a supervised coroutine once it does its work again (a report went
    through, a stream is read): its service is healthy without waiting `healthy_after_s`.
    Outside a supervised task it does nothing."""
    current = _current.get()
    if current is not None:
        current._ready.set()


class Supervisor:
    def __init__(
        self,
        log: logging.Logger,
        *,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        healthy_after_s: float = HEALTHY_AFTER_S,
        reset_after_s: float = RESET_AFTER_S,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        """`clock` (seconds, default the event loop's) and `sleep` time the backoff and
        the healthy-again wait; tests pass a manual clock and advance it."""
        self.log = log
        self._clock = clock
        self._sleep = sleep
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = max(backoff_max_s, backoff_initial_s)
        self.healthy_after_s = healthy_after_s
        self.reset_after_s = reset_after_s
        self.tasks: dict[str, SupervisedTask] = {}
        self._health: HealthHook | None = None
        self._serving = True

    # -- health ----------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """False while a needed task is failed or not yet healthy again."""
        return not any(t.down for t in self.tasks.values())

    async def attach_health(self, hook: HealthHook) -> None:
        """Report health through `hook(serving)` from now on (and now, if a task is down)."""
        self._health = hook
        self._serving = True
        await self._publish()

    async def _publish(self) -> None:
        serving = self.serving
        if serving == self._serving:
            return
        self._serving = serving
        down = sorted(t.name for t in self.tasks.values() if t.down)
        if serving:
            self.log.info("every needed background task runs again: SERVING")
        else:
            self.log.warning(
                "needed background task(s) down: NOT_SERVING (%s)",
                ", ".join(down),
                extra={"tasks_down": down},
            )
        if self._health is not None:
            await self._health(serving)

    def counts(self) -> dict[str, dict[str, Any]]:
        """Per task: state, failures, restarts (for a metrics exporter)."""
        return {
            name: {"state": t.state.value, "failures": t.failures, "restarts": t.restarts}
            for name, t in self.tasks.items()
        }

    # -- tasks -----------------------------------------------------------------

    def supervise(
        self, factory: Factory, name: str, *, needed: bool = True, forever: bool = False
    ) -> asyncio.Task:
        """Run `factory()` as the background task `name`, restarted whenever it fails."""
        running = self.tasks.get(name)
        if running is not None and running.task is not None and not running.task.done():
            raise ValueError(f"a background task named {name!r} is running already")
        entry = SupervisedTask(name, needed, forever)
        self.tasks[name] = entry
        _report(entry)
        _restarts.add(0, {"task": name})  # at 0 until the first restart: increase() sees it
        entry.task = asyncio.create_task(self._run(entry, factory), name=name)
        return entry.task

    def _extra(self, entry: SupervisedTask) -> dict[str, Any]:
        return {
            "task": entry.name,
            "task_state": entry.state.value,
            "failures": entry.failures,
            "restarts": entry.restarts,
            "needed": entry.needed,
        }

    async def _run(self, entry: SupervisedTask, factory: Factory) -> None:
        _current.set(entry)
        me = asyncio.current_task()
        assert me is not None
        now = self._clock or asyncio.get_running_loop().time
        backoff = self.backoff_initial_s
        try:
            while True:
                started = now()
                entry._ready.clear()
                watch = (
                    asyncio.create_task(self._until_healthy(entry), name=f"{entry.name} (health)")
                    if entry.state is TaskState.RECOVERING
                    else None
                )
                try:
                    await factory()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if me.cancelling():
                        return  # stopping: the failure is the cancellation's doing
                    entry.failures += 1
                    entry.last_error = f"{type(exc).__name__}: {exc}"
                    if now() - started >= self.reset_after_s:
                        backoff = self.backoff_initial_s
                    entry.state = TaskState.BACKOFF
                    _report(entry)
                    self.log.error(
                        "background task %s failed (%d failures, %d restarts); "
                        "restarting in %.2f s: %s",
                        entry.name,
                        entry.failures,
                        entry.restarts,
                        backoff,
                        entry.last_error,
                        exc_info=exc,
                        extra=self._extra(entry),
                    )
                    await self._publish()
                    await self._sleep(backoff)
                    backoff = min(self.backoff_max_s, backoff * 2)
                    entry.restarts += 1
                    _restarts.add(1, {"task": entry.name})
                    entry.state = TaskState.RECOVERING
                    self.log.info(
                        "background task %s restarting (run %d)",
                        entry.name,
                        entry.restarts + 1,
                        extra=self._extra(entry),
                    )
                    continue
                finally:
                    if watch is not None:
                        watch.cancel()
                if me.cancelling():
                    return  # a library swallowed the cancellation; the loop saw it and ended
                if entry.forever:
                    self.log.warning(
                        "background task %s returned; it runs for ever: restarting",
                        entry.name,
                        extra=self._extra(entry),
                    )
                    entry.restarts += 1
                    _restarts.add(1, {"task": entry.name})
                    await self._sleep(backoff)
                    backoff = min(self.backoff_max_s, backoff * 2)
                    continue
                entry.state = TaskState.DONE
                await self._publish()
                return
        finally:
            if entry.state is not TaskState.DONE:
                entry.state = TaskState.STOPPED
            _report(entry)

    async def _until_healthy(self, entry: SupervisedTask) -> None:
        """Up again once the restarted run has lasted `healthy_after_s` or said ready()."""
        ready = asyncio.ensure_future(entry._ready.wait())
        timer = asyncio.ensure_future(self._sleep(self.healthy_after_s))
        try:
            await asyncio.wait({ready, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            timer.cancel()
        if entry.state is TaskState.RECOVERING:
            entry.state = TaskState.RUNNING
            _report(entry)
            self.log.info(
                "background task %s runs again after %d failures",
                entry.name,
                entry.failures,
                extra=self._extra(entry),
            )
            await self._publish()
