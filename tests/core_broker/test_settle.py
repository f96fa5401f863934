"""A decision round keeps its grants assumed in the capacity map until the commit
answers, then `CapacityMap.settle` makes the stored ones keyed rows and takes the
rest back (issue 15: no taking out and putting back of every grant). After it the
map must be the one the stored allocations `add`ed would make: the same rows and
keys, the same answers to every query (free cores, end sets, earliest starts,
the grid's bounds), and `add` of a stored key (the change stream bringing the
commit) a no-op."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath_services.core_broker.capacity import Allocation, CapacityMap, Device

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

CORES = [4, 6, 8]
CELL = 5


def fresh() -> CapacityMap:
    cap = CapacityMap(grid_cell_ms=CELL, grid_cells=32)
    for d, c in enumerate(CORES):
        cap.upsert_device(Device(f"d{d}", "GPU", c))
    return cap


span = st.tuples(
    st.integers(0, len(CORES) - 1), st.integers(0, 60), st.integers(1, 30), st.integers(1, 3)
)


def as_alloc(s: tuple[int, int, int, int]) -> Allocation:
    d, start, length, cores = s
    return Allocation(f"d{d}", cores, start, start + length)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(span, max_size=15),  # keyed before the round
    st.lists(span, max_size=15),  # assumed by the round (duplicates allowed)
    st.lists(st.booleans(), max_size=15),  # which of those the commit stored
    st.lists(span, max_size=3),  # stored, but never assumed here
    st.booleans(),  # the stream brought one stored allocation before the commit answered
    st.integers(0, 40),  # where the grid was anchored before the round
)
def test_settling_a_round_leaves_the_map_the_stored_adds_would_make(
    before, assumed, stored_flags, unassumed, early, anchor
):
    cap, want = fresh(), fresh()
    for i, s in enumerate(before):
        a = as_alloc(s)
        for m in (cap, want):
            m.add(f"b{i}:0", a.device_id, a.start, a.end, a.cores)
    cap.earliest_start(1, 3, anchor, None, np.ones(len(CORES), bool))  # anchors the grid
    mark = cap.savepoint()
    for s in assumed:
        cap.assume([as_alloc(s)])
        # a search between grants, as a round makes (the grid is not re-anchored meanwhile)
        cap.earliest_start(2, 4, anchor + 3, None, np.ones(len(CORES), bool))
    stored = []
    for i, s in enumerate(assumed):
        if i < len(stored_flags) and stored_flags[i]:
            a = as_alloc(s)
            stored.append((f"r{i}:0", a.device_id, a.start, a.end, a.cores))
    for i, s in enumerate(unassumed):
        a = as_alloc(s)
        stored.append((f"u{i}:0", a.device_id, a.start, a.end, a.cores))
    if early and stored:
        key, dev, start, end, cores = stored[0]
        cap.add(key, dev, start, end, cores)  # the stream, first
    kept = cap.settle(mark, stored)
    # (an assumed row like a stored one may be kept for it: rows alike are interchangeable)
    assert kept <= min(len(stored), len(assumed))
    # the commit's change applied as the view does: adds, idempotent
    for key, dev, start, end, cores in stored:
        cap.add(key, dev, start, end, cores)
        want.add(key, dev, start, end, cores)
    assert cap.savepoint() == mark == 0
    assert sorted(cap.allocations()) == sorted(want.allocations())
    assert sorted(cap.keys()) == sorted(want.keys())
    assert cap.reservations() == want.reservations()
    every = np.ones(len(CORES), bool)
    for a, b in ((0, 1), (0, 100), (7, 19), (20, 21), (33, 90)):
        assert cap.free_over(a, b).tolist() == want.free_over(a, b).tolist(), (a, b)
        assert cap.offers(a, b, every).tolist() == want.offers(a, b, every).tolist(), (a, b)
    for need, duration, after in ((1, 1, 0), (5, 10, 3), (12, 7, 20), (18, 30, 0)):
        got = cap.earliest_start(need, duration, after, None, every)
        exp = want.earliest_start(need, duration, after, None, every)
        assert (got is None) == (exp is None)
        if got is not None:
            assert got[0] == exp[0] and got[1].tolist() == exp[1].tolist(), (need, duration)
    sky, ref = cap._sky_of(), want._sky_of()
    assert sky.assumed == 0
    devices = np.arange(len(CORES))
    assert sky.end_set(devices).next_ends(-1, 100) == ref.end_set(devices).next_ends(-1, 100)
    # the grid: once re-read, each cell exactly what the rows say (the same as a map
    # that only ever had the adds, anchored alike)
    sky._grid_fresh()
    origin = sky.grid.origin
    assert origin is not None
    adds = fresh()
    for key, a in want.allocations():
        adds.add(key, a.device_id, a.start, a.end, a.cores)
    grid = adds._sky_of()
    grid.anchor(origin + 2 * CELL)
    assert grid.grid.origin == origin
    assert (sky.grid.m[:, : len(CORES)] == grid.grid.m[:, : len(CORES)]).all()
    # a removal after settling works on a promoted row like on any other
    for key, *_ in stored:
        assert cap.remove(key) and want.remove(key)
    assert sorted(cap.allocations()) == sorted(want.allocations())
    assert cap.free_over(0, 100).tolist() == want.free_over(0, 100).tolist()


def test_a_failed_commit_takes_every_assumed_grant_back():
    cap = fresh()
    cap.add("a:0", "d0", 0, 10, 2)
    mark = cap.savepoint()
    cap.assume([Allocation("d1", 3, 0, 10), Allocation("d0", 2, 5, 20)])
    assert cap.free_over(0, 10).tolist() == [0, 3, 8]
    assert cap.settle(mark, []) == 0
    assert cap.free_over(0, 10).tolist() == [2, 6, 8]
    assert [k for k, _ in cap.allocations()] == ["a:0"]


def test_a_kept_round_leaves_every_grant_assumed_and_settles_to_the_adds():
    """`decide(keep=True)`: each grant's allocations stay assumed, the last one's
    too; settled with their keys, the map is the one the adds would make."""
    from lightpath_services.core_broker.decisions import (
        CoreRequest,
        Group,
        PriorityFunction,
        decide,
    )

    cap, want = fresh(), fresh()
    requests = [CoreRequest(f"r{i}", cores=c, duration_ms=10) for i, c in enumerate((5, 7, 9))]
    mark = cap.savepoint()
    decided = decide(
        cap, [Group((r,)) for r in requests], now=0, priority=PriorityFunction(), keep=True
    )
    grants = [d for ds in decided for d in ds if d.granted]
    assert len(grants) == 3  # 21 of 18 cores now: the last is deferred or partial
    held = sum(len(d.allocations) for d in grants)
    assert cap.savepoint() - mark == held
    assert cap.free_over(0, 1).sum() == sum(CORES) - sum(
        a.cores for d in grants for a in d.allocations if a.start == 0
    )
    stored = [
        (f"{d.request.reservation_id}:{i}", a.device_id, a.start, a.end, a.cores)
        for d in grants
        for i, a in enumerate(d.allocations)
    ]
    assert cap.settle(mark, stored) == held
    for key, dev, start, end, cores in stored:
        assert not cap.add(key, dev, start, end, cores)  # the commit's change: held already
        want.add(key, dev, start, end, cores)
    assert sorted(cap.allocations()) == sorted(want.allocations())
    assert cap.reservations() == 3
