"""Issue 28: a pod's capacity report in chips as the cell plans with it — the report's
figures corrected by what the cell assumes since (pure functions over the report)."""

from __future__ import annotations

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath_services.cell_scheduler.choice import PodCapacityView, chips_key
from lightpath_services.cell_scheduler.pods import capacity_view, reported_chips
from lightpath_services.cell_scheduler.store import RegistrySnapshot


def snap(free: dict[str, int], held: dict[str, int] | None = None) -> RegistrySnapshot:
    return RegistrySnapshot(
        registrations={},
        capacities={},
        versions={},
        free={f"p|{k}": v for k, v in free.items()},
        held={f"p|{k}": v for k, v in (held or {}).items()},
        seen={},
        suspect={},
        down=set(),
        endpoint={},
        queue=[],
    )


def report(free: int, chips_free: int = 0, largest: int = 0) -> cs.NodeTypeCapacity:
    return cs.NodeTypeCapacity(
        node_type="tpu",
        total=4,
        free=free,
        chips_total=256 if chips_free or largest else 0,
        chips_free=chips_free,
        largest_free_box=largest,
    )


def view_of(t: cs.NodeTypeCapacity, s: RegistrySnapshot) -> PodCapacityView:
    v = PodCapacityView("p", block_chips=64)
    capacity_view(v, t, s)
    return v


CHIPS = chips_key("tpu")


def test_as_reported_when_the_cell_assumes_nothing():
    v = view_of(report(1, chips_free=80, largest=64), snap({"tpu": 1, CHIPS: 80}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (1, 80, 64)


def test_a_report_without_chip_figures_counts_its_free_blocks_chips():
    assert reported_chips(report(2), 64) == (128, 64)
    assert reported_chips(report(0), 64) == (0, 0)
    v = view_of(report(2), snap({"tpu": 2, CHIPS: 128}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (2, 128, 64)


def test_a_block_placed_since_the_report_takes_its_chips_too():
    # The cell placed a block slice (free 1 -> 0): its 64 chips are gone as well.
    v = view_of(report(1, chips_free=80, largest=64), snap({"tpu": 0, CHIPS: 80}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (0, 16, 16)
    # ... and one in flight (held) alike.
    v = view_of(report(1, 80, 64), snap({"tpu": 1, CHIPS: 80}, held={"tpu": 1}))
    assert (v.free["tpu"], v.chips_free["tpu"]) == (0, 16)


def test_sub_block_boxes_placed_since_leave_no_more_free_blocks_than_their_chips_make():
    # Two free blocks; the cell placed 16 chips and has 8 more in flight: 104 left, so at
    # most one whole block is still free, and no box larger than what is left.
    v = view_of(report(2, 128, 64), snap({"tpu": 2, CHIPS: 112}, held={CHIPS: 8}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (1, 104, 64)
    v = view_of(report(0, 24, 16), snap({"tpu": 0, CHIPS: 12}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (0, 12, 12)


def test_a_block_freed_through_the_cell_gives_its_chips_and_room_for_any_box():
    v = view_of(report(0, 8, 4), snap({"tpu": 1, CHIPS: 8}))
    assert (v.free["tpu"], v.chips_free["tpu"], v.largest_box["tpu"]) == (1, 72, 64)
