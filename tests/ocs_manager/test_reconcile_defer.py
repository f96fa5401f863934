"""The reconcile loop waits for a change in flight before reading the switches, for at most
one interval (issue 34): its reads share each switch's session with the change's batches.

The committed state is a real OcsStore on a real Redis (a wire begun and not yet ended
is in flight, as the manager's own); the switches are a recording stand-in, since what
is checked is whether the pass reads them at all."""

from __future__ import annotations

import pytest

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath_services.ocs_manager.reconcile import SwitchReconciler
from lightpath_services.ocs_manager.store import OcsStore
from lightpath_services.ocs_manager.wiring import SlicePlacement
from tests.ocs_manager.conftest import POD

FABRIC = Fabric.build(FabricConfig((4, 4, 4), 64))
SLICE = SlicePlacement("job", (2, 1, 1), (7, 8), (False, False, False))


class Wires:
    """Wires begun on the store and ended (aborted: nothing was programmed)."""

    def __init__(self, store: OcsStore) -> None:
        self.store = store
        self.token = ""

    async def begin(self) -> None:
        self.token = await self.store.begin_wire(SLICE, 30_000)

    async def end(self) -> None:
        assert await self.store.abort("job", self.token, "wire", SLICE.blocks)


class Switches:
    """Answers every read with no switch (the pass has nothing to repair); counts reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.undescribed: set[str] = set()
        self.mismatched: dict[str, str] = {}
        self.devices: dict = {}

    async def read_all(self) -> dict:
        self.reads += 1
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def loop_parts(redis_client):
    store = OcsStore(redis_client, POD, FABRIC)
    await store.ensure_fabric()
    switches, clock = Switches(), Clock()
    r = SwitchReconciler(FABRIC, store, switches, interval_s=5.0, clock=clock)  # type: ignore[arg-type]
    return r, Wires(store), switches, clock


async def test_a_pass_waits_for_a_wire_in_flight_then_reads(loop_parts):
    r, wires, switches, clock = loop_parts
    await wires.begin()
    report = await r.reconcile_once()
    assert report.deferred and switches.reads == 0
    assert (r.passes, r.last, r.deferrals) == (0, None, 1)  # not a pass
    assert r.defer_poll_s == 0.25  # looks again soon, not an interval later

    clock.now += 0.3
    await wires.end()
    report = await r.reconcile_once()
    assert not report.deferred and switches.reads == 1 and r.passes == 1


async def test_a_pod_that_never_stops_changing_is_still_read_after_one_interval(loop_parts):
    r, wires, switches, clock = loop_parts
    await wires.begin()  # one change after another: always one in flight
    for _ in range(19):  # looked at every 0.25 s
        assert (await r.reconcile_once()).deferred
        clock.now += 0.25
    assert switches.reads == 0 and clock.now == 104.75
    clock.now += 0.25  # an interval since it first waited: it reads anyway
    report = await r.reconcile_once()
    assert not report.deferred and switches.reads == 1 and r.passes == 1
    # the next pass, still busy, waits again, bounded the same way
    clock.now += 5.0
    assert (await r.reconcile_once()).deferred
    clock.now += 4.75
    assert (await r.reconcile_once()).deferred
    clock.now += 0.25
    assert not (await r.reconcile_once()).deferred
    assert switches.reads == 2


async def test_a_quiet_pod_is_read_every_pass_without_waiting(loop_parts):
    r, _, switches, _ = loop_parts
    for _ in range(3):
        assert not (await r.reconcile_once()).deferred
    assert (switches.reads, r.passes, r.deferrals) == (3, 3, 0)
