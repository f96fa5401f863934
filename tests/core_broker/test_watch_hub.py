"""The watch fan-out of one replica (CB-6): a watcher that falls behind, or a
view that had to reload, ends its stream with ABORTED instead of silently
missing events."""

from __future__ import annotations

import json

import pytest

from lightpath.errors import Aborted
from lightpath_services.core_broker.broker import WatchHub
from lightpath_services.core_broker.store import Change


def change(version: int, *events: tuple[str, str, str]) -> Change:
    return Change(
        f"{version}-0",
        version,
        parsed_ops=[],
        parsed_events=[[k, rid, app, json.dumps({"id": rid})] for k, rid, app in events],
    )


async def test_events_go_to_the_application_and_the_operator_only():
    hub = WatchHub()
    mine = hub.subscribe("a")
    one = hub.subscribe("a", "r2")
    other = hub.subscribe("b")
    operator = hub.subscribe(None)
    hub.dispatch(change(1, ("CREATED", "r1", "a"), ("CREATED", "r2", "a")))
    assert [(await mine.next())[1]["id"] for _ in range(2)] == ["r1", "r2"]
    assert (await one.next())[1]["id"] == "r2" and one.queue.empty()
    assert other.queue.empty()
    assert (await operator.next())[0] == "CREATED"
    hub.unsubscribe(mine)
    assert hub.watching == 3


async def test_a_watcher_that_falls_behind_or_a_reload_ends_the_stream():
    hub = WatchHub()
    slow = hub.subscribe("a")
    for v in range(slow.queue.maxsize + 5):
        hub.dispatch(change(v + 1, ("STARTED", f"r{v}", "a")))
    with pytest.raises(Aborted, match="fell behind"):
        while True:
            await slow.next()
    fresh = hub.subscribe("a")
    hub.reset()
    with pytest.raises(Aborted, match="reloaded"):
        await fresh.next()
