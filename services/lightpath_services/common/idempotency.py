"""Batches run once per idempotency key, the way the southbound contract says
(docs/ocs_southbound.md, Idempotency): the outcome of the last `kept` accepted keys is
remembered, success or failure, and a repeat of a key waits for the same outcome. A
batch runs to its end even when its caller goes away (the caller asks again under the
same key). The switch agent's simulated switches and the ocs_manager's device drivers
both keep their keys here; what a batch's fingerprint is (the request without its key,
or a digest of its pairs) is theirs to say."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

F = TypeVar("F")  # what tells two batches under one key apart
T = TypeVar("T")  # a batch's outcome


class KeptBatches(Generic[F, T]):
    def __init__(self, kept: int = 1024) -> None:
        self.kept = kept
        self._keys: OrderedDict[str, tuple[F, asyncio.Future[T]]] = OrderedDict()
        self._tasks: set[asyncio.Task[T]] = set()  # held so a running batch is not collected

    def get(self, key: str) -> tuple[F, asyncio.Future[T]] | None:
        """The fingerprint and outcome kept for `key`, or None."""
        return self._keys.get(key)

    def start(
        self,
        key: str,
        fingerprint: F,
        batch: Coroutine[Any, Any, T],
        on_failure: Callable[[], None] = lambda: None,
    ) -> asyncio.Future[T]:
        """Run `batch` under `key`, its outcome kept for repeats; `on_failure` is called
        once if it raises. The oldest key beyond `kept` is forgotten."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._keys[key] = (fingerprint, future)
        while len(self._keys) > self.kept:
            self._keys.popitem(last=False)
        task = asyncio.ensure_future(batch)
        self._tasks.add(task)

        def done(t: asyncio.Task[T]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                future.cancel()
            elif (error := t.exception()) is not None:
                on_failure()
                future.set_exception(error)
                future.exception()  # kept for replays; not an error if nobody waits now
            else:
                future.set_result(t.result())

        task.add_done_callback(done)
        return future

    def forget_unfinished(self, key: str) -> None:
        """Drop `key` while its batch is still running: the batch was not accepted after
        all (nothing reached the switch), so the same key later is a new attempt."""
        kept = self._keys.get(key)
        if kept is not None and not kept[1].done():
            del self._keys[key]

    def clear(self) -> None:
        """Forget every key (the switch restarted: its kept outcomes went with it)."""
        self._keys.clear()
