"""The capacity-over-time index (services/lightpath_services/core_broker/skyline.py, issue 15)
answers exactly what the broker's search answered before it: the old search
(tests/core_broker/capacity_oracle.py) is the oracle, on random schedules
kept incrementally (adds, removals, assumed grants taken back), on the seed's
Fig. 2-4 and ¶24 examples, and on near-saturated schedules at epoch times.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath_services.core_broker.capacity import _DEAD, Allocation, CapacityMap, Device
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Group,
    Outcome,
    PriorityFunction,
    decide,
)
from lightpath_services.core_broker.skyline import _TMAX
from tests.core_broker.capacity_oracle import LegacySchedule
from tests.core_broker.test_decisions import high, low

S = 1000
NOW = 1_700_000_000_000
PRIORITY = PriorityFunction()


def legacy(cap: CapacityMap) -> LegacySchedule:
    """The old allocation table of every row `cap` holds now (keyed and assumed)."""
    n = cap._n
    live = np.flatnonzero(cap._start[:n] != _DEAD)
    return LegacySchedule(
        cap.cores.tolist(),
        zip(
            cap._dev[live].tolist(),
            cap._start[live].tolist(),
            cap._end[live].tolist(),
            cap._cores[live].tolist(),
            strict=True,
        ),
    )


def over_committed(cap: CapacityMap) -> bool:
    old = legacy(cap)
    for t in np.unique(old.start).tolist():
        if (old.peak(t, t + 1) > old.cores).any():
            return True
    return False


class CheckedCapacityMap(CapacityMap):
    """A capacity map that checks every answer a decision asks of it against the oracle."""

    checks = 0

    def free_over(self, start, end, devices=None):
        got = super().free_over(start, end, devices)
        want = self.cores - legacy(self).peak(start, end)
        want[~self.alive] = 0
        mask = self.alive if devices is None else devices
        assert (got[mask] == want[mask]).all(), (start, end)
        CheckedCapacityMap.checks += 1
        return got

    def offers(self, start, end, devices):
        got = super().offers(start, end, devices)
        want = np.maximum(self.cores - legacy(self).peak(start, end), 0)
        want[~(self.alive & devices)] = 0
        assert got.tolist() == want.tolist(), (start, end)
        CheckedCapacityMap.checks += 1
        return got

    def earliest_start(self, need, duration, after, last_start, devices, **kw):
        old = legacy(self)
        if kw.get("no_start_at_after"):  # the caller's word, checked
            free = np.maximum(self.cores - old.peak(after, after + duration), 0)
            free[~self.alive] = 0
            assert int(free[devices].sum()) < need, ("after is a start", after, need)
        got = super().earliest_start(need, duration, after, last_start, devices, **kw)
        same(got, old.brute_earliest_start(need, duration, after, last_start, devices))
        if not over_committed(self):
            same(got, old.earliest_start(need, duration, after, last_start, devices))
        CheckedCapacityMap.checks += 1
        return got


def same(got, want) -> None:
    if want is None:
        assert got is None
        return
    assert got is not None, f"expected a start at {want[0]}"
    assert got[0] == want[0]
    assert got[1].tolist() == want[1].tolist()


def checked(*devices: Device) -> CheckedCapacityMap:
    """A checked map whose coarse grid has one-second cells (so searches of a few
    seconds use it, with the grants a batch assumes)."""
    cap = CheckedCapacityMap(grid_cell_ms=S, grid_cells=64)
    for d in devices:
        cap.upsert_device(d)
    return cap


# -- random schedules, kept incrementally ---------------------------------------

CORES = (4, 6, 8, 5, 3)
rows = st.tuples(
    st.integers(0, len(CORES) - 1),  # device
    st.integers(0, 80),  # start
    st.integers(1, 30),  # length
    st.integers(1, 5),  # cores (devices may be over-committed: the oracle does not care)
)
# dense: every instant is some allocation's end, so blocks of candidates get skipped
dense_rows = st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(1, 8), st.integers(1, 4))


def build(allocs, removed, assumed, cell: int = 3) -> CapacityMap:
    """A map of the allocations (those in `removed` taken out again, `assumed`
    tried and taken back, then two of them assumed), its coarse grid in cells
    of `cell` (so that the small times here use it)."""
    cap = CapacityMap(grid_cell_ms=cell, grid_cells=24)
    for i, c in enumerate(CORES):
        cap.upsert_device(Device(f"d{i}", "GPU", c))
    for k, (dev, start, length, cores) in enumerate(allocs):
        cap.add(f"r{k}:0", f"d{dev}", start, start + length, cores)
    for k in sorted(set(removed)):
        cap.remove(f"r{k}:0")
    mark = cap.savepoint()
    cap.assume(Allocation(f"d{dev}", c, s, s + n) for dev, s, n, c in assumed)
    cap.rollback(mark)  # what a decision tried and took back leaves no trace
    cap.assume(Allocation(f"d{dev}", c, s, s + n) for dev, s, n, c in assumed[:2])
    return cap


@settings(max_examples=300, deadline=None)
@given(
    st.lists(rows, max_size=60),
    st.lists(st.integers(0, 59), max_size=20),
    st.lists(rows, max_size=6),
    st.integers(1, 30),  # need
    st.integers(1, 25),  # duration
    st.integers(-5, 90),  # after
    st.one_of(st.none(), st.integers(0, 120)),  # last start
    st.lists(st.booleans(), min_size=len(CORES), max_size=len(CORES)).filter(any),
    st.sampled_from([1, 2, 3, 5, 60_000]),  # grid cell (60 s: no grid at these times)
)
def test_earliest_start_matches_the_old_search_on_random_schedules(
    allocs, removed, assumed, need, duration, after, last, mask, cell
):
    cap = build(allocs, removed, assumed, cell)
    devices = np.array(mask)
    old = legacy(cap)
    got = cap.earliest_start(need, duration, after, last, devices)
    same(got, old.brute_earliest_start(need, duration, after, last, devices))
    if not over_committed(cap):
        # today's search (its bound over the summed schedule holds without over-commitment)
        same(got, old.earliest_start(need, duration, after, last, devices))


# 400 examples, not 1000: this was a third of the file's CPU, and the same search is
# checked against the same oracle on 300 random schedules and 400 sequences of changes.
@pytest.mark.slow  # runs for many seconds: handed out first
@settings(max_examples=400, deadline=None)
@given(
    st.lists(dense_rows, min_size=5, max_size=40),
    st.integers(1, 14),  # need
    st.integers(1, 12),  # duration
    st.integers(-2, 20),  # after
    st.one_of(st.none(), st.integers(0, 40)),  # last start
    st.sampled_from([1, 2, 4, 60_000]),
)
def test_earliest_start_matches_the_old_search_on_dense_schedules(
    allocs, need, duration, after, last, cell
):
    cap = build(allocs, [], [], cell)
    devices = np.array([True, True, True, False, False])
    old = legacy(cap)
    same(
        cap.earliest_start(need, duration, after, last, devices),
        old.brute_earliest_start(need, duration, after, last, devices),
    )


steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), rows),
        st.tuples(st.just("remove"), st.integers(0, 40)),
        st.tuples(st.just("assume"), rows),
        st.tuples(st.just("rollback"), st.integers(0, 3)),
        st.tuples(
            st.just("search"),
            st.integers(1, 20),  # need
            st.integers(1, 30),  # duration
            st.integers(-5, 60),  # after
            st.one_of(st.none(), st.integers(0, 100)),  # last start
        ),
    ),
    max_size=40,
)


@settings(max_examples=400, deadline=None)
@given(steps, st.sampled_from([1, 2, 4, 7]))
def test_searches_between_changes_and_assumed_grants_match_the_old_search(sequence, cell):
    """Changes, grants assumed and taken back, and searches, in any order: the
    index and its coarse grid kept incrementally answer as the old search does
    on the same rows (assumed grants included) at every step."""
    cap = CapacityMap(grid_cell_ms=cell, grid_cells=24)
    for i, c in enumerate(CORES):
        cap.upsert_device(Device(f"d{i}", "GPU", c))
    keys: list[str] = []
    marks: list[int] = []
    for k, step in enumerate(sequence):
        if step[0] == "add" and not cap.savepoint():
            dev, start, length, cores = step[1]
            keys.append(f"r{k}:0")
            cap.add(keys[-1], f"d{dev}", start, start + length, cores)
        elif step[0] == "remove" and keys and not cap.savepoint():
            cap.remove(keys.pop(step[1] % len(keys)))
        elif step[0] == "assume":
            dev, start, length, cores = step[1]
            marks.append(cap.savepoint())
            cap.assume([Allocation(f"d{dev}", cores, start, start + length)])
        elif step[0] == "rollback" and marks:
            cap.rollback(marks[max(0, len(marks) - 1 - step[1])])
            del marks[max(0, len(marks) - 1 - step[1]) :]
        elif step[0] == "search":
            _, need, duration, after, last = step
            devices = np.ones(len(CORES), bool)
            same(
                cap.earliest_start(need, duration, after, last, devices),
                legacy(cap).brute_earliest_start(need, duration, after, last, devices),
            )


def test_the_grid_is_not_re_read_while_a_grant_is_assumed():
    """A cell re-read with an assumed grant in it would keep that grant's cores
    after it is taken back, and a later search would skip the cell wrongly."""
    cap = CapacityMap(grid_cell_ms=10, grid_cells=32)
    cap.upsert_device(Device("d0", "GPU", 10))
    one = np.array([True])
    cap.add("full:0", "d0", -10, 5, 10)
    assert cap.earliest_start(1, 1, 0, None, one) == (5, np.array([10]))  # anchors the grid
    cap.add("part:0", "d0", 15, 95, 3)  # covers the cell [10, 20) in part
    mark = cap.savepoint()
    cap.assume([Allocation("d0", 6, 12, 18)])
    cap.earliest_start(10, 30, 0, None, one)
    cap.rollback(mark)
    got = cap.earliest_start(7, 30, 0, None, one)
    assert got is not None and got[0] == 5


def test_a_skipped_block_shares_no_more_than_every_window_in_it():
    """The first candidate (1) fails; the next (2) fits just before a busy
    stretch: the block after 1 may not be skipped for that stretch."""
    cap = CapacityMap()
    cap.upsert_device(Device("d0", "GPU", 4))
    cap.add("a:0", "d0", 0, 2, 1)
    cap.add("b:0", "d0", -3, 1, 2)
    cap.add("busy:0", "d0", 7, 9, 4)
    got = cap.earliest_start(4, 5, 0, None, np.array([True]))
    assert got is not None and got[0] == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(rows, max_size=60),
    st.lists(st.integers(0, 59), max_size=20),
    st.lists(rows, max_size=6),
    st.integers(-5, 110),
    st.integers(1, 40),
)
def test_peak_and_free_match_the_old_sweep(allocs, removed, assumed, start, length):
    cap = build(allocs, removed, assumed)
    old = legacy(cap)
    assert cap.peak_used(start, start + length).tolist() == old.peak(start, start + length).tolist()
    mask = np.array([True, False, True, False, True])
    part = cap.free_over(start, start + length, mask)
    want = old.cores - old.peak(start, start + length)
    assert part[mask].tolist() == want[mask].tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(rows, max_size=60),
    st.lists(st.integers(0, 59), max_size=20),
    st.lists(rows, max_size=6),
    st.integers(-5, 110),
    st.integers(1, 40),
    st.integers(-10, 100),  # where the coarse grid is anchored
    st.sampled_from([1, 2, 3, 60_000]),  # its cells (60 s: none inside these windows)
    st.lists(st.booleans(), min_size=len(CORES), max_size=len(CORES)),
)
def test_offers_match_the_old_sweep_whatever_the_grid_holds(
    allocs, removed, assumed, start, length, anchor, cell, mask
):
    """`offers` leaves out, unsearched, the devices the grid shows full in a cell
    inside the window: exact all the same, with removals, grants tried and taken
    back and grants still assumed in the grid's cells, and over-committed devices."""
    cap = build(allocs, removed, [], cell)
    cap._sky_of().anchor(anchor)
    mark = cap.savepoint()
    cap.assume(Allocation(f"d{dev}", c, s, s + n) for dev, s, n, c in assumed)
    cap.rollback(mark)
    cap.assume(Allocation(f"d{dev}", c, s, s + n) for dev, s, n, c in assumed[:3])
    devices = np.array(mask)
    old = legacy(cap)
    want = np.maximum(old.cores - old.peak(start, start + length), 0)
    want[~devices] = 0
    assert cap.offers(start, start + length, devices).tolist() == want.tolist()


@pytest.mark.slow  # runs for many seconds: handed out first
def test_the_grid_slides_with_the_searches_and_keeps_their_answers():
    """Searches from later and later instants (time going on), then an earlier
    one, with changes in between: the coarse grid moves by a few cells, by more
    than half of itself, and back, and never costs an answer."""
    rng = random.Random(5)
    cap = CapacityMap(grid_cell_ms=10, grid_cells=32)
    for i in range(6):
        cap.upsert_device(Device(f"d{i}", "GPU", 16))
    k = 0
    for i in range(6):
        for _lane in range(3):
            t = rng.randrange(0, 40)
            while t < 2000:
                n = rng.randrange(20, 200)
                cap.add(f"r{k}:0", f"d{i}", t, t + n, 5)
                k += 1
                t += n + rng.choice((0, 0, rng.randrange(1, 60)))
    mask = np.ones(6, bool)
    for after in [*range(0, 1900, 37), 5, 1200, 3]:
        if rng.random() < 0.5:
            key = f"r{rng.randrange(k)}:0"
            cap.remove(key)
        old = legacy(cap)
        for need in (1, 8, 30, 96):
            for duration in (15, 60, 250):
                args = (need, duration, after, None, mask)
                same(cap.earliest_start(*args), old.brute_earliest_start(*args))
        assert cap._sky.grid.origin is not None
        assert cap._sky.grid.origin <= after


def test_a_device_with_many_more_breakpoints_moves_to_wider_rows_and_back_to_the_same_answers():
    rng = random.Random(3)
    cap = CapacityMap(grid_cell_ms=50, grid_cells=64)
    for i in range(4):
        cap.upsert_device(Device(f"d{i}", "GPU", 64))
    keys = []
    for k in range(300):  # 600 breakpoints on d0: rows of 16, 32, ..., 1024 columns
        dev = 0 if k % 10 else rng.randrange(1, 4)
        s = rng.randrange(0, 5000)
        cap.add(f"r{k}:0", f"d{dev}", s, s + rng.randrange(1, 400), rng.randrange(1, 8))
        keys.append(f"r{k}:0")
    assert cap._sky.breakpoints(0) > 256
    rng.shuffle(keys)
    for step, key in enumerate(keys):
        cap.remove(key)
        if step % 25 == 0:
            old = legacy(cap)
            for _ in range(10):
                t = rng.randrange(-10, 5500)
                assert cap.peak_used(t, t + 300).tolist() == old.peak(t, t + 300).tolist()
                m = np.array([rng.random() < 0.7 for _ in range(4)])
                if not m.any():
                    continue
                args = (rng.randrange(1, 200), rng.randrange(1, 500), t, None, m)
                same(cap.earliest_start(*args), old.brute_earliest_start(*args))
    assert len(cap) == 0
    assert all(cap._sky.breakpoints(i) == 0 for i in range(4))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_near_saturated_schedules_at_epoch_times_match_the_old_search(seed):
    """Devices tiled with reservations in lanes up to a ragged horizon, as the
    scale bench builds them; requests from a few cores to more than is free."""
    rng = random.Random(seed)
    cap = CapacityMap()
    ndev = 40
    for i in range(ndev):
        cap.upsert_device(Device(f"d{i:02d}", "GPU", rng.choice((16, 32, 64))))
    k = 0
    for i in range(ndev):
        cores = int(cap.cores[i])
        left = cores - rng.randrange(0, 3)
        while left > 0:
            lane = min(left, rng.randrange(2, 12))
            left -= lane
            t = NOW - rng.randrange(0, 600) * S
            for _ in range(rng.randrange(2, 8)):
                n = rng.randrange(60, 900) * S
                cap.add(f"r{k}:0", f"d{i:02d}", t, t + n, lane)
                k += 1
                t += n + rng.choice((0, 0, 0, rng.randrange(1, 300) * S))
    old = legacy(cap)
    assert not over_committed(cap)
    for _ in range(40):
        m = np.array([rng.random() < 0.5 for _ in range(ndev)])
        m[rng.randrange(ndev)] = True
        need = rng.randrange(1, int(cap.cores[m].sum()) + 1)
        duration = rng.randrange(10, 1200) * S
        last = None if rng.random() < 0.5 else NOW + rng.randrange(0, 4000) * S
        args = (need, duration, NOW, last, m)
        got = cap.earliest_start(*args)
        same(got, old.earliest_start(*args))


# -- the seed's worked examples, every answer checked against the oracle ------------


def run(cap: CapacityMap, *requests: CoreRequest):
    before = CheckedCapacityMap.checks
    out = [ds[0] for ds in decide(cap, [Group((r,)) for r in requests], now=NOW, priority=PRIORITY)]
    assert CheckedCapacityMap.checks > before
    return out


def test_fig2_on_the_index_matches_the_oracle():
    cap = checked(Device("gpu-1", "GPU", 64))
    r1 = CoreRequest("req-202-1", 25, 10 * S, earliest_start=NOW, latest_end=NOW + 10 * S)
    r2 = CoreRequest("req-202-2", 21, 10 * S, earliest_start=NOW + 2 * S, latest_end=NOW + 12 * S)
    r3 = CoreRequest("req-202-n", 10, 4 * S, earliest_start=NOW + 5 * S, latest_end=NOW + 9 * S)
    ds = run(cap, r1, r2, r3)
    assert [d.outcome for d in ds] == [Outcome.GRANTED] * 3
    assert len(cap) == 0 and cap.savepoint() == 0


def test_fig3_partial_on_the_index_matches_the_oracle():
    cap = checked(Device("gpu-1", "GPU", 80))
    d_low, d_high = run(
        cap,
        low("req-302-n", 50, 10, accept=frozenset({Outcome.PARTIAL})),
        high("req-302-1", 50, 10),
    )
    assert d_high.outcome is Outcome.GRANTED
    assert d_low.outcome is Outcome.PARTIAL
    assert d_low.allocations == (
        Allocation("gpu-1", 30, NOW, NOW + 10 * S),
        Allocation("gpu-1", 20, NOW + 10 * S, NOW + 20 * S),
    )


def test_fig4_deferred_on_the_index_matches_the_oracle():
    cap = checked(Device("gpu-1", "GPU", 80))
    d_low, d_high = run(
        cap,
        low("req-302-n", 50, 10, accept=frozenset({Outcome.DEFERRED})),
        high("req-302-1", 50, 10),
    )
    assert d_high.outcome is Outcome.GRANTED
    assert d_low.outcome is Outcome.DEFERRED
    assert d_low.allocations == (Allocation("gpu-1", 50, NOW + 10 * S, NOW + 20 * S),)


def test_fig4_rejected_names_the_oracles_earliest_start():
    cap = checked(Device("gpu-1", "GPU", 80))
    d_low, _ = run(cap, low("req-302-n", 50, 10, accept=frozenset()), high("req-302-1", 50, 10))
    assert d_low.outcome is Outcome.REJECTED
    assert d_low.earliest_possible_start == NOW + 10 * S


def test_para24_on_the_index_matches_the_oracle():
    cap = checked(Device("gpu-1", "GPU", 100), Device("gpu-2", "GPU", 100))
    cap.add("busy:0", "gpu-1", NOW - 60 * S, NOW + 15 * S, 70)
    cap.add("busy:1", "gpu-2", NOW - 60 * S, NOW + 15 * S, 50)
    (d,) = run(cap, CoreRequest("r200", 200, 600 * S))
    assert d.outcome is Outcome.PARTIAL
    assert d.summary.startswith("80 cores now, 120 more in 15 s")


requests = st.lists(
    st.tuples(
        st.integers(1, 30),  # cores
        st.integers(1, 20),  # duration (s)
        st.integers(0, 15),  # delay (s)
        st.one_of(st.none(), st.integers(0, 30)),  # slack (s)
        st.sampled_from(
            [
                frozenset(),
                frozenset({Outcome.PARTIAL}),
                frozenset({Outcome.DEFERRED}),
                frozenset({Outcome.PARTIAL, Outcome.DEFERRED}),
            ]
        ),
        st.integers(1, 100),  # priority hint
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(requests, st.booleans())
def test_every_search_of_a_batch_of_decisions_matches_the_oracle(specs, together):
    """Decisions in a batch on a busy map (the seed's 80-core device and two
    more): every free_over and earliest_start they ask, in every assumed
    state, is the oracle's answer; afterwards the map is as it was."""
    cap = checked(
        Device("gpu-1", "GPU", 80), Device("gpu-2", "GPU", 48), Device("tpu-1", "TPU", 32)
    )
    cap.add("busy:0", "gpu-1", NOW - 5 * S, NOW + 10 * S, 50)
    cap.add("busy:1", "gpu-2", NOW, NOW + 25 * S, 40)
    cap.add("busy:2", "tpu-1", NOW + 3 * S, NOW + 8 * S, 32)
    reqs = [
        CoreRequest(
            f"r{i}",
            cores,
            seconds * S,
            earliest_start=NOW + delay * S,
            latest_end=None if slack is None else NOW + (delay + seconds + slack) * S,
            priority_hint=hint,
            accept=accept,
        )
        for i, (cores, seconds, delay, slack, accept, hint) in enumerate(specs)
    ]
    groups = [Group(tuple(reqs), all_or_nothing=True)] if together else [Group((r,)) for r in reqs]
    before = legacy(cap)
    decide(cap, groups, now=NOW, priority=PRIORITY)
    after = legacy(cap)
    assert len(cap) == 3 and cap.savepoint() == 0
    assert sorted(zip(after.start.tolist(), after.end.tolist(), strict=True)) == sorted(
        zip(before.start.tolist(), before.end.tolist(), strict=True)
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(rows, max_size=40),
    st.integers(1, 24),  # need
    st.integers(4, 40),  # duration
    st.integers(0, 60),  # first start of the windows checked
)
def test_the_grid_bounds_of_a_window_leave_out_only_devices_with_nothing_free(
    allocs, need, duration, first
):
    """`_Probe.bounds` may leave a device out of a window only if it has no core
    free for any start in the window's cells, and a whole window only if its
    devices together have fewer than `need`; `free_where` reads the rest exactly."""
    from lightpath_services.core_broker.skyline import _Probe

    cap = build(allocs, [], [], cell=3)
    sky = cap._sky_of()
    sky.anchor(first)
    sky._grid_fresh()
    devices = np.arange(len(CORES))
    probe = _Probe(sky, devices, cap.cores[devices])
    probe.coarse(duration, need)
    grid = sky.grid
    assert grid.origin is not None
    j = grid.index(first + 1)
    probe.first_open(j)
    cells = [(c, c) for c in range(j, j + 4)] + [(j, j + 2), (j + 1, j + 5)]
    sel = probe.bounds([c0 for c0, _ in cells], [c1 for _, c1 in cells[4:]], need)
    if sel is None:
        return
    old = legacy(cap)
    for i, (c0, c1) in enumerate(cells):
        lo, hi = grid.origin + c0 * grid.cell, grid.origin + (c1 + 1) * grid.cell
        for t in range(lo, hi):
            free = np.maximum(old.cores - old.peak(t, t + duration), 0)
            if free.sum() >= need:
                assert (sel[:, i] | (free == 0)).all(), (i, t)
    starts = [grid.origin + c0 * grid.cell for c0, _ in cells]
    order = np.argsort(starts, kind="stable")
    a = [starts[k] for k in order]
    b = [x + duration for x in a]
    exact = probe.free(a, b)
    where = probe.free_where(a, b, sel[:, order])
    assert (where == np.where(sel[:, order].T, exact, 0)).all()


def test_earlier_answers_bound_later_searches_only_while_allocations_are_only_added():
    """CapacityMap.earliest_start begins where an earlier search on the same devices,
    for no more cores and no longer, found its answer (issue 15). Each answer below
    is compared with a fork (which has no such bounds): a bound kept past a
    removal, a rollback or a device's new cores would give a later start."""
    cap = CapacityMap(grid_cell_ms=5, grid_cells=64)
    for dev in ("d0", "d1"):
        cap.upsert_device(Device(dev, "GPU", 8))
    both = np.ones(2, bool)
    cap.add("a1", "d0", 0, 10, 8)
    cap.add("a2", "d1", 0, 20, 8)
    cap.add("a3", "d0", 10, 30, 8)

    def earliest(need: int, devices: np.ndarray = both) -> int:
        found = cap.earliest_start(need, 5, 0, None, devices)
        fresh = cap.copy().earliest_start(need, 5, 0, None, devices)
        assert found is not None and fresh is not None
        assert found[0] == fresh[0] and found[1].tolist() == fresh[1].tolist()
        return found[0]

    assert earliest(8) == 20  # d1 once a2 ends
    assert earliest(8, np.array([False, True])) == 20  # d1 alone: bounded by both's answer
    cap.add("a4", "d1", 20, 40, 8)
    assert earliest(8) == 30  # begun at 20: d0 once a3 ends
    cap.remove("a3")
    assert earliest(8) == 10  # d0 once a1 ends: before the bound, dropped by the removal
    mark = cap.savepoint()
    cap.assume([Allocation("d0", 8, 10, 50)])
    assert earliest(8) == 40
    cap.rollback(mark)
    assert earliest(8) == 10  # the bound found while assumed went with the rollback
    assert earliest(16) == 40  # both devices whole: once a4 ends
    cap.upsert_device(Device("d1", "GPU", 16))
    assert earliest(16) == 10  # d1's 8 more cores: before the bound


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 1), st.integers(0, 12), st.integers(1, 6)),
            st.tuples(st.just("remove"), st.integers(0, 50)),
            st.tuples(st.just("query"), st.integers(-2, 20), st.integers(1, 10)),
        ),
        max_size=60,
    )
)
def test_a_row_kept_through_adds_and_removals_on_shared_instants_stays_whole(steps):
    """Allocations starting and ending on the same few instants (so a change
    finds its breakpoints there already, or leaves them to others): after every
    change each row holds exactly the breakpoints still used, sorted, with the
    padding after them, and every range maximum (rebuilt for the columns in use
    only) is the brute-force one."""
    cap = CapacityMap(grid_cell_ms=3, grid_cells=16)
    for i in range(2):
        cap.upsert_device(Device(f"d{i}", "GPU", 64))
    live: list[tuple[str, int, int, int, int]] = []
    for k, step in enumerate(steps):
        if step[0] == "add":
            _, dev, start, length = step
            cores = 1 + k % 3
            live.append((f"r{k}:0", dev, start, start + length, cores))
            cap.add(live[-1][0], f"d{dev}", start, start + length, cores)
        elif step[0] == "remove" and live:
            cap.remove(live.pop(step[1] % len(live))[0])
        elif step[0] == "query":
            _, t, length = step
            want = [
                max(
                    (
                        sum(c for _, d, s, e, c in live if d == dev and s <= u < e)
                        for u in range(t, t + length)
                    ),
                    default=0,
                )
                for dev in range(2)
            ]
            assert cap.peak_used(t, t + length).tolist() == want
        for dev in range(2):
            sky = cap._sky
            b = sky.buckets[int(sky.bucket_of[dev])]
            r = int(sky.row_of[dev])
            n = int(b.cnt[r])
            times = {s for _, d, s, _, _ in live if d == dev} | {
                e for _, d, _, e, _ in live if d == dev
            }
            keys = (b.key[r, 1:n] & _TMAX).tolist()
            assert keys == sorted(keys) and len(keys) == len(times)
            assert (b.nref[r, 1:n] > 0).all() and (b.nref[r, n:] == 0).all()
            assert (b.key[r, n:] & _TMAX == _TMAX).all()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("note"),
                st.sampled_from([0, 1]),  # device set: all four devices, or the first two
                st.integers(1, 6),  # need
                st.integers(1, 6),  # duration
                st.integers(0, 3),  # after
                st.integers(0, 12),  # start
                st.sampled_from([0, 0, 0, 1]),  # the generation moves on (a device changed)
            ),
            st.tuples(st.just("rollback"), st.integers(0, 6)),
            st.tuples(
                st.just("floor"),
                st.sampled_from([0, 1, 2]),  # all, the first two, the first one
                st.integers(1, 6),
                st.integers(1, 6),
                st.integers(0, 3),
                st.sampled_from([0, 0, 0, 1]),
            ),
        ),
        max_size=60,
    )
)
def test_the_kept_bounds_answer_as_every_bound_found_would(ops):
    """`_Floors` keeps per device set only the bounds no other one outdoes: every
    answer is the best of all the bounds found (and not rolled back) that apply."""
    from lightpath_services.core_broker.capacity import _Floors, _Found

    sets = [np.arange(4), np.arange(2), np.arange(1)]
    floors, every = _Floors(), []
    depth = 0
    generation = 0  # as a map's: it only grows
    for op in ops:
        if op[0] == "note":
            _, which, need, duration, after, start, bump = op
            generation += bump
            gen = generation
            idx = sets[which]
            mask = np.zeros(4, bool)
            mask[idx] = True
            f = _Found(idx.tobytes(), mask, need, duration, after, after + start, depth, gen)
            floors.note(f)
            every.append((which, f))
            depth += 1
        elif op[0] == "rollback":
            depth = max(0, depth - op[1])
            floors.rolled_back(depth)
            every = [(w, f) for w, f in every if f.depth <= depth]
        else:
            _, which, need, duration, after, bump = op
            generation += bump
            gen = generation
            idx = sets[which]
            want = max(
                [after]
                + [
                    f.start
                    for w, f in every
                    if w <= which  # a bound of the same devices or more
                    and f.need <= need
                    and f.duration <= duration
                    and f.after <= after
                    and f.generation == gen
                ]
            )
            assert floors.floor(idx.tobytes(), idx, need, duration, after, gen) == want


def test_bounds_are_kept_for_the_few_device_sets_searched_lately():
    """Requests naming their devices make a device set each: only the last few are kept."""
    from lightpath_services.core_broker.capacity import _Floors, _Found

    floors = _Floors()
    sets = [np.array([d]) for d in range(_Floors.SETS + 5)]
    for idx in sets:
        mask = np.zeros(len(sets), bool)
        mask[idx] = True
        floors.note(_Found(idx.tobytes(), mask, 1, 1, 0, 10, 0, 0))
    assert len(floors.found) == _Floors.SETS
    assert floors.floor(sets[0].tobytes(), sets[0], 1, 1, 0, 0) == 0  # the oldest: gone
    assert floors.floor(sets[-1].tobytes(), sets[-1], 1, 1, 0, 0) == 10
