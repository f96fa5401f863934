"""Hypothesis properties of the capacity map and the decision function (CB-4, CB-6, CB-9).

Oracles are brute force over small integer times: the reserved cores of a
device at every instant are summed directly from the allocations made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from lightpath_services.core_broker.capacity import Allocation, CapacityMap, Device
from lightpath_services.core_broker.decisions import (
    CoreRequest,
    Group,
    Outcome,
    Placement,
    PriorityFunction,
    decide,
)

HORIZON = 60
CORES = (4, 6, 8)

intervals = st.tuples(
    st.integers(0, 3),  # device
    st.integers(0, HORIZON - 1),  # start
    st.integers(1, 20),  # length
    st.integers(1, 4),  # cores
)


def feasible(allocs):
    """The allocations that fit in turn: a state CB-9 allows (no device over its cores)."""
    kept: list[tuple[int, int, int, int]] = []
    for a in allocs:
        dev, start, length, _ = a
        if all(
            used_at([*kept, a], dev, t) <= (*CORES, 5)[dev] for t in range(start, start + length)
        ):
            kept.append(a)
    return kept


def build(allocs) -> CapacityMap:
    cap = CapacityMap()
    for i, cores in enumerate((*CORES, 5)):
        cap.upsert_device(Device(f"d{i}", "GPU", cores))
    for k, (dev, start, length, cores) in enumerate(allocs):
        cap.add(f"r{k}:0", f"d{dev}", start, start + length, cores)
    return cap


def used_at(allocs, dev: int, t: int) -> int:
    return sum(c for d, s, n, c in allocs if d == dev and s <= t < s + n)


@given(st.lists(intervals, max_size=25), st.integers(0, HORIZON), st.integers(1, 30))
def test_free_over_is_the_minimum_of_free_cores_over_the_range(allocs, start, length):
    cap = build(allocs)
    free = cap.free_over(start, start + length)
    for dev, cores in enumerate((*CORES, 5)):
        expected = cores - max(used_at(allocs, dev, t) for t in range(start, start + length))
        assert free[dev] == expected
    # restricted to some devices, those devices are still exact
    mask = np.array([True, False, False, True])
    part = cap.free_over(start, start + length, mask)
    assert part[0] == free[0] and part[3] == free[3]


@given(
    st.lists(intervals, max_size=25),
    st.integers(1, 20),  # need
    st.integers(1, 15),  # duration
    st.integers(0, 30),  # after
    st.one_of(st.none(), st.integers(0, 80)),  # last start
    st.lists(st.booleans(), min_size=4, max_size=4).filter(any),
)
def test_earliest_start_is_the_first_instant_with_room(allocs, need, duration, after, last, mask):
    allocs = feasible(allocs)
    cap = build(allocs)
    devices = np.array(mask)
    got = cap.earliest_start(need, duration, after, last, devices)
    # brute force over every instant in [after, last]; callers check `after` itself
    expected = None
    limit = last if last is not None else HORIZON + 25
    for t in range(after, limit + 1):
        total = sum(
            max(0, cores - max(used_at(allocs, dev, u) for u in range(t, t + duration)))
            for dev, cores in enumerate((*CORES, 5))
            if mask[dev]
        )
        if total >= need:
            expected = t
            break
    assume(expected != after)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got[0] == expected
        assert int(got[1].sum()) >= need


# -- sequences of operations on the broker's domain ------------------------------


@dataclass
class Model:
    """A capacity map driven like the broker drives it, plus the full history."""

    cap: CapacityMap
    now: int = 0
    # reservation id -> its parts: [key, device, start, end, cores]
    live: dict[str, list[list]] = field(default_factory=dict)
    history: list[tuple[str, int, int, int]] = field(default_factory=list)  # final intervals

    def record(self, parts) -> None:
        for _, dev, start, end, cores in parts:
            if end > start:
                self.history.append((dev, start, end, cores))


requests = st.fixed_dictionaries(
    {
        "cores": st.integers(1, 14),
        "duration": st.integers(1, 12),
        "delay": st.integers(0, 10),
        "slack": st.one_of(st.none(), st.integers(0, 25)),
        "accept": st.sampled_from(
            [
                frozenset(),
                frozenset({Outcome.PARTIAL}),
                frozenset({Outcome.DEFERRED}),
                frozenset({Outcome.PARTIAL, Outcome.DEFERRED}),
            ]
        ),
        "placement": st.sampled_from(list(Placement)),
        "hint": st.integers(1, 100),
    }
)
ops = st.one_of(
    st.tuples(st.just("reserve"), st.lists(requests, min_size=1, max_size=3)),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.integers(1, 8)),
    st.tuples(st.just("extend"), st.integers(0, 50), st.integers(1, 10)),
)


def _request(rid: str, spec: dict, now: int) -> CoreRequest:
    start = now + spec["delay"]
    latest = None if spec["slack"] is None else start + spec["duration"] + spec["slack"]
    return CoreRequest(
        rid,
        spec["cores"],
        spec["duration"],
        earliest_start=start,
        latest_end=latest,
        priority_hint=spec["hint"],
        placement=spec["placement"],
        task_type="vision",
        site="s",
        location=(0.0, 0.0),
        accept=spec["accept"],
    )


@settings(max_examples=150)
@given(st.lists(ops, max_size=30))
def test_no_sequence_of_reserve_release_expire_extend_over_commits_a_device(sequence):
    cap = CapacityMap()
    for i, cores in enumerate(CORES):
        cap.upsert_device(
            Device(f"d{i}", "GPU", cores, x_km=float(i), task_affinities=("vision",) * (i % 2))
        )
        cap.set_latency("s", f"d{i}", float(3 - i))
    m = Model(cap)
    prio = PriorityFunction()
    n = 0
    for op in sequence:
        if op[0] == "reserve":
            reqs = []
            for spec in op[1]:
                n += 1
                reqs.append(_request(f"r{n}", spec, m.now))
            decided = decide(cap, [Group((r,)) for r in reqs], now=m.now, priority=prio)
            for r, (d,) in zip(reqs, decided, strict=True):
                _check_decision(r, d, m.now)
                event(d.outcome.value)
                if d.granted:
                    parts = []
                    for i, a in enumerate(d.allocations):
                        key = f"{r.reservation_id}:{i}"
                        cap.add(key, a.device_id, a.start, a.end, a.cores)
                        parts.append([key, a.device_id, a.start, a.end, a.cores])
                    m.live[r.reservation_id] = parts
        elif op[0] == "release" and m.live:
            rid = sorted(m.live)[op[1] % len(m.live)]
            parts = m.live.pop(rid)
            for p in parts:
                cap.remove(p[0])
                p[3] = max(p[2], min(p[3], m.now))  # held until now, or never
            m.record(parts)
        elif op[0] == "advance":
            m.now += op[1]
            for rid in list(m.live):  # expiry: parts that ended return their cores
                keep = []
                for p in m.live[rid]:
                    if p[3] <= m.now:
                        cap.remove(p[0])
                        m.record([p])
                    else:
                        keep.append(p)
                if keep:
                    m.live[rid] = keep
                else:
                    del m.live[rid]
        elif op[0] == "extend" and m.live:
            rid = sorted(m.live)[op[1] % len(m.live)]
            shift = op[2]
            parts = m.live[rid]
            trial = cap.copy()
            fits = True
            for p in parts:
                i = cap.index_of(p[1])
                assert i is not None
                if trial.free_over(p[3], p[3] + shift)[i] < p[4]:
                    fits = False
                    break
                trial.assume([Allocation(p[1], p[4], p[3], p[3] + shift)])
            if fits:
                for p in parts:
                    cap.remove(p[0])
                    p[3] += shift
                    cap.add(p[0], p[1], p[2], p[3], p[4])
        _check_never_over_committed(m)


def _check_decision(r: CoreRequest, d, now: int) -> None:
    start = max(now, r.earliest_start or now)
    if d.outcome is Outcome.REJECTED:
        assert d.allocations == ()
        assert d.earliest_possible_start is not None and d.earliest_possible_start >= start
        return
    assert d.outcome is Outcome.GRANTED or d.outcome in r.accept
    assert sum(a.cores for a in d.allocations) == r.cores
    for a in d.allocations:
        assert a.end - a.start == r.duration_ms
        assert a.start >= start  # inside the window
        if r.latest_end is not None:
            assert a.end <= r.latest_end
    starts = {a.start for a in d.allocations}
    if d.outcome is Outcome.GRANTED:
        assert starts == {start}
    elif d.outcome is Outcome.DEFERRED:
        assert len(starts) == 1 and min(starts) > start
    else:
        assert min(starts) == start and len(starts) >= 2


def _check_never_over_committed(m: Model) -> None:
    every = list(m.history)
    for parts in m.live.values():
        every += [(p[1], p[2], p[3], p[4]) for p in parts]
    by_dev: dict[str, list[tuple[int, int, int]]] = {}
    for dev, s, e, c in every:
        by_dev.setdefault(dev, []).append((s, e, c))
    for dev, ivs in by_dev.items():
        cores = CORES[int(dev[1:])]
        for t in {s for s, _, _ in ivs}:
            assert sum(c for s, e, c in ivs if s <= t < e) <= cores, (dev, t)
