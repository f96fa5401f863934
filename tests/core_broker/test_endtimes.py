"""The instants at which a device set's reserved cores fall (services/lightpath_services/core_broker/
endtimes.py), which the earliest-start search walks: after any sequence of adds,
removals and assumed grants taken back, `next_ends` answers what the allocation
rows say (every end after t on the set at which some device's reserved cores
fall, distinct, sorted: an end where as many cores start again is none); the
rows' own walk (`_Probe.next_ends_rows`, every end) answers a prefix of the
ends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath_services.core_broker import endtimes
from lightpath_services.core_broker.capacity import Allocation, CapacityMap, Device
from lightpath_services.core_broker.skyline import _Probe

DEVICES = 5

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.integers(0, DEVICES - 1),
            st.integers(0, 40),
            st.integers(1, 20),
            st.integers(1, 3),
        ),
        st.tuples(st.just("remove"), st.integers(0, 200)),
        st.tuples(
            st.just("assume"),
            st.integers(0, DEVICES - 1),
            st.integers(0, 40),
            st.integers(1, 20),
            st.integers(1, 3),
        ),
        st.tuples(st.just("rollback"), st.integers(0, 5)),
        # on the device of an allocation held: back to back from its end, or ending with it
        st.tuples(st.just("chain"), st.integers(0, 200), st.integers(1, 20), st.integers(1, 3)),
        st.tuples(st.just("twin"), st.integers(0, 200), st.integers(1, 20), st.integers(1, 3)),
        st.tuples(st.just("query"), st.integers(0, 2**DEVICES - 1)),
    ),
    max_size=60,
)


def _live(cap: CapacityMap, devices: np.ndarray) -> list[tuple[int, int, int, int]]:
    n = cap._n
    live = (cap._end[:n] > -(1 << 61)) & np.isin(cap._dev[:n], devices)
    return list(
        zip(
            cap._dev[:n][live].tolist(),
            cap._start[:n][live].tolist(),
            cap._end[:n][live].tolist(),
            cap._cores[:n][live].tolist(),
            strict=True,
        )
    )


def ends_on(cap: CapacityMap, devices: np.ndarray) -> list[int]:
    return sorted({e for _, _, e, _ in _live(cap, devices)})


def drops_on(cap: CapacityMap, devices: np.ndarray) -> list[int]:
    """The ends at which some device's reserved cores are fewer than just before."""
    rows = _live(cap, devices)

    def level(d: int, t: int) -> int:
        return sum(c for dd, s, e, c in rows if dd == d and s <= t < e)

    return sorted({e for d, _, e, _ in rows if level(d, e) < level(d, e - 1)})


@settings(max_examples=400, deadline=None)
@given(ops, st.sampled_from([1, 3, 512]))
def test_next_ends_match_the_rows_after_any_changes(sequence, side):
    endtimes_max = endtimes.MAX_SIDE
    endtimes.MAX_SIDE = side  # a small bound: the sets are rebuilt from the rows often
    try:
        cap = CapacityMap(grid_cell_ms=4, grid_cells=16)
        for d in range(DEVICES):
            cap.upsert_device(Device(f"d{d}", "GPU", 4))
        keys: list[str] = []
        held: dict[str, tuple[int, int]] = {}  # key: (device, end)
        marks: list[int] = []
        everyone = np.arange(DEVICES)
        cap._sky_of().end_set(everyone)  # built now: every change below updates it
        for i, op in enumerate(sequence):
            if side == 512:  # kept up to date change by change (never rebuilt)
                assert cap._sky_of().end_set(everyone).next_ends(-100, 100) == drops_on(
                    cap, everyone
                ), i
            if op[0] == "add":
                _, d, s, length, c = op
                keys.append(f"k{i}")
                held[f"k{i}"] = (d, s + length)
                cap.add(f"k{i}", f"d{d}", s, s + length, c)
            elif op[0] in ("chain", "twin") and keys:
                _, which, length, c = op
                d, e = held[keys[which % len(keys)]]
                s = e if op[0] == "chain" else e - length
                keys.append(f"k{i}")
                held[f"k{i}"] = (d, s + length)
                cap.add(f"k{i}", f"d{d}", s, s + length, c)
            elif op[0] == "remove" and keys:
                cap.remove(keys.pop(op[1] % len(keys)))
            elif op[0] == "assume":
                _, d, s, length, c = op
                marks.append(cap.savepoint())
                cap.assume([Allocation(f"d{d}", c, s, s + length)])
            elif op[0] == "rollback" and marks:
                cap.rollback(marks[-min(op[1] + 1, len(marks))])
                del marks[-min(op[1] + 1, len(marks)) :]
            elif op[0] == "query":
                devices = np.array([d for d in range(DEVICES) if op[1] >> d & 1], np.int64)
                if devices.shape[0] == 0:
                    continue
                sky = cap._sky_of()
                want = drops_on(cap, devices)
                every = ends_on(cap, devices)
                probe = _Probe(sky, devices, cap.cores[devices])
                end_set = sky.end_set(devices)
                for t in (-5, 0, 3, 10, 25, 59, 70):
                    for k in (1, 2, 5, 16):
                        got = end_set.next_ends(t, k)
                        exp = [x for x in want if x > t][:k]
                        assert got == exp, (t, k)
                        # the rows' walk (every end) may stop short (it bounds the k-th
                        # end by the k-th device's next end, the last one when there are
                        # fewer devices than k): a prefix, never empty while ends remain
                        ends = [x for x in every if x > t][:k]
                        rows = probe.next_ends_rows(t, k)
                        assert rows == ends[: len(rows)] and bool(rows) == bool(ends), (t, k)
    finally:
        endtimes.MAX_SIDE = endtimes_max


def test_a_set_counts_allocations_so_a_shared_end_outlives_one_removal():
    cap = CapacityMap()
    for d in range(2):
        cap.upsert_device(Device(f"d{d}", "GPU", 4))
    cap.add("a", "d0", 0, 10, 1)
    cap.add("b", "d1", 5, 10, 1)
    sky = cap._sky_of()
    everyone = np.arange(2)
    assert sky.end_set(everyone).next_ends(0, 3) == [10]
    cap.remove("a")
    assert sky.end_set(everyone).next_ends(0, 3) == [10]
    cap.remove("b")
    assert sky.end_set(everyone).next_ends(0, 3) == []
    mark = cap.savepoint()
    cap.assume([Allocation("d0", 1, 3, 7)])
    assert sky.end_set(everyone).next_ends(0, 3) == [7]
    assert sky.end_set(np.array([1])).next_ends(0, 3) == []
    cap.rollback(mark)
    assert sky.end_set(everyone).next_ends(0, 3) == []


def test_an_end_where_as_many_cores_start_again_is_no_candidate():
    """Back-to-back reservations: free cores cannot grow where one ends and the next
    begins with as many cores, so the search does not visit that instant."""
    cap = CapacityMap()
    cap.upsert_device(Device("d0", "GPU", 4))
    cap.add("a", "d0", 0, 10, 2)
    cap.add("b", "d0", 10, 20, 2)
    sky = cap._sky_of()
    one = np.arange(1)
    assert sky.end_set(one).next_ends(0, 3) == [20]
    cap.add("c", "d0", 10, 20, 1)  # more start than end at 10
    assert sky.end_set(one).next_ends(0, 3) == [20]
    cap.remove("b")  # 2 end, 1 starts: a fall
    assert sky.end_set(one).next_ends(0, 3) == [10, 20]
    mark = cap.savepoint()
    cap.assume([Allocation("d0", 1, 10, 15)])  # back to 2 from 10: no fall
    assert sky.end_set(one).next_ends(0, 3) == [15, 20]
    cap.rollback(mark)
    assert sky.end_set(one).next_ends(0, 3) == [10, 20]


@pytest.mark.parametrize("sets", [1, endtimes.MAX_SETS + 3])
def test_only_the_last_few_sets_are_kept(sets):
    cap = CapacityMap()
    for d in range(12):
        cap.upsert_device(Device(f"d{d}", "GPU", 4))
        cap.add(f"a{d}", f"d{d}", 0, 10 + d, 1)
    sky = cap._sky_of()
    for s in range(sets):
        devices = np.arange(s % 12 + 1)
        assert sky.end_set(devices).next_ends(0, 20) == list(range(10, 10 + s % 12 + 1))
    assert len(sky.endsets.sets) <= endtimes.MAX_SETS


def test_the_set_used_last_outlives_newer_ones():
    cap = CapacityMap()
    for d in range(12):
        cap.upsert_device(Device(f"d{d}", "GPU", 4))
        cap.add(f"a{d}", f"d{d}", 0, 10 + d, 1)
    sky = cap._sky_of()
    everyone = np.arange(12)
    kept = sky.end_set(everyone)
    for s in range(3 * endtimes.MAX_SETS):
        sky.end_set(np.array([s % 12]))
        assert sky.end_set(everyone) is kept  # used between the others: never evicted
