"""Seed 003's worked examples, step by step, on the real switch logic
(discrete-event simulation; packets round-trip through the wire codec)."""

from __future__ import annotations

import numpy as np
import pytest

from lightpath.aggregation.maths import Kind
from lightpath_services.agg_switch.command import plan_command, predict_stragglers
from tests.agg_switch.fixtures import (
    HISTORY_LATENESS,
    HPCC_COMPUTE,
    command,
    hpcc_100,
    two_switch_cluster,
)
from tests.agg_switch.sim import Simulation

BASE = np.array([1, 10, 100], dtype=np.int64)


def data_of(i: int) -> np.ndarray:
    """Compute node i's vector (length 3, two chunks of 2 elements)."""
    return i * BASE


def inputs(nodes: dict[str, int]) -> dict[str, np.ndarray]:
    return {n: data_of(i) for n, i in nodes.items()}


FIVE = {"n1": 1, "n2": 2, "n3": 3, "n4": 4, "n5": 5}


def chunk_of(values: np.ndarray, chunk: int) -> list[int]:
    return values[chunk * 2 : chunk * 2 + 2].tolist()


def deliveries(sim: Simulation, frm: str, to: str, kind: Kind) -> list:
    return [d for d in sim.deliveries if d.frm == frm and d.to == to and d.kind is kind]


@pytest.mark.parametrize("ta", ["n4", "root", "sw2", "ta"])
def test_threshold_timeout_at_the_first_switch(ta):
    """The seed's first cluster embodiment: within the first duration the first
    switch gets nodes 1 and 2 but not 3, the second gets 4 and 5; node 3's data
    comes after the threshold and is bypassed to the timeout aggregation node
    (any node of the cluster: a compute node, the root, a switch, a dedicated node)."""
    topo = two_switch_cluster(sub_ms=100, root_ms=300, dedicated=True)
    spec = command(topo, list(FIVE), ta=ta)
    sim = Simulation(topo)
    sim.add_command(spec, inputs(FIVE), start={"n3": 0.5})

    sim.run(until=0.3)
    # The first switch aggregated 1 and 2 (the fifth data) and sent it up at the
    # threshold, carrying node 3's id, with a bypass entry (3, X) per chunk; the
    # second switch aggregated 4 and 5 (the sixth data) at once.
    up1 = deliveries(sim, "sw1", "root", Kind.PARTIAL)
    assert [(d.chunk, d.at, d.timeout_nodes) for d in up1] == [
        (0, 0.1, ("n3",)),
        (1, 0.1, ("n3",)),
    ]
    assert [chunk_of(data_of(1) + data_of(2), c) for c in (0, 1)] == [d.data.tolist() for d in up1]
    up2 = deliveries(sim, "sw2", "root", Kind.PARTIAL)
    assert [(d.at, d.timeout_nodes) for d in up2] == [(0.0, ()), (0.0, ())]
    assert [d.data.tolist() for d in up2] == [chunk_of(data_of(4) + data_of(5), c) for c in (0, 1)]
    entries = sim.bypass_entries()
    assert sorted((e.command_id, e.chunk, e.node) for e in entries) == [
        ("X", 0, "n3"),
        ("X", 1, "n3"),
    ]
    assert {n for _, n, _ in sim.events_of("bypass_created")} == {"sw1"}
    # Both switches and the root freed their slots when their partials went up.
    released = sim.events_of("slot_released")
    assert {(n, t) for t, n, _ in released} == {("sw1", 0.1), ("sw2", 0.0), ("root", 0.1)}
    assert sim.cores["sw1"].pool.in_use == sim.cores["root"].pool.in_use == 0
    # The root aggregated both into the seventh data, carrying node 3's id, and
    # sent it towards the timeout aggregation node (S301) — kept it when it is that node.
    seventh = data_of(1) + data_of(2) + data_of(4) + data_of(5)
    root_partials = sim.events_of("root_partial")
    assert [(n, e.chunk, e.detail) for _, n, e in root_partials] == [
        ("root", 0, "n3"),
        ("root", 1, "n3"),
    ]
    if ta != "root":
        sent = [d for d in sim.deliveries if d.kind is Kind.ROOT_PARTIAL and d.frm == "root"]
        assert [d.data.tolist() for d in sent] == [chunk_of(seventh, c) for c in (0, 1)]
        assert all(d.destination == ta and d.timeout_nodes == ("n3",) for d in sent)
    # Nobody has a result yet.
    assert all(not n.done for n in sim.commands["X"].nodes.values())

    sim.run()
    # After the duration node 3's (eighth) data reached the first switch, matched
    # the entry, was flagged with node 3's id and forwarded; the entry is gone.
    matched = sim.events_of("bypass_matched")
    assert [(t, n, e.node) for t, n, e in matched] == [(0.5, "sw1", "n3"), (0.5, "sw1", "n3")]
    late = deliveries(sim, "sw1", "root", Kind.LATE)
    assert [(d.source, d.timeout_flag, d.destination) for d in late] == [("n3", True, ta)] * 2
    assert [d.data.tolist() for d in late] == [chunk_of(data_of(3), c) for c in (0, 1)]
    assert sim.bypass_entries() == []
    # Flagged data is forwarded, never aggregated on the way (AG-5).
    assert not [e for _, _, e in sim.events_of("aggregated") if e.node == "n3"]
    # The timeout aggregation node combined the seventh and eighth data into the
    # ninth and every compute node got it (S305-S306).
    ninth = sum(data_of(i) for i in range(1, 6))
    finals = sim.events_of("ta_final")
    if ta in ("root", "sw2", "ta"):
        assert {n for _, n, _ in finals} == {ta}
    else:
        assert [d.data.tolist() for d in deliveries(sim, "n4", "sw2", Kind.FINAL)] == [
            chunk_of(ninth, c) for c in (0, 1)
        ]
    for node, result in sim.results("X").items():
        assert result.tolist() == ninth.tolist(), node
    assert sim.holding("X") == []
    assert all(core.pool.in_use == 0 for core in sim.cores.values())


def test_predicted_timeout_with_the_bitmap():
    """The seed's second cluster embodiment: management predicts node 1 late from
    history, clears its bit in the first switch's bitmap and tells it; node 1
    tags its own data, which the first switch passes on to the timeout
    aggregation node while it aggregates 2 and 3."""
    topo = two_switch_cluster()
    history = [{"n1": 2.5, "n2": 0.1, "n3": 0.4, "n4": 0.0, "n5": 0.2}]
    spec = command(topo, list(FIVE), ta="n4", history=history, top_k=1)
    assert spec.predicted == ("n1",)
    plan = plan_command(topo, spec)
    assert plan.bitmaps() == [
        ("root", ("sw1", "sw2"), (True, True)),
        ("sw1", ("n1", "n2", "n3"), (False, True, True)),
        ("sw2", ("n4", "n5"), (True, True)),
    ]
    sim = Simulation(topo)
    sim.add_command(spec, inputs(FIVE))
    sim.run()

    tagged = deliveries(sim, "n1", "sw1", Kind.LATE)
    assert [(d.timeout_flag, d.destination) for d in tagged] == [(True, "n4")] * 2
    sixth = deliveries(sim, "sw1", "root", Kind.PARTIAL)
    assert [(d.at, d.timeout_nodes) for d in sixth] == [(0.0, ("n1",)), (0.0, ("n1",))]
    assert [d.data.tolist() for d in sixth] == [
        chunk_of(data_of(2) + data_of(3), c) for c in (0, 1)
    ]
    seventh = deliveries(sim, "sw2", "root", Kind.PARTIAL)
    assert [d.data.tolist() for d in seventh] == [
        chunk_of(data_of(4) + data_of(5), c) for c in (0, 1)
    ]
    bypassed = deliveries(sim, "sw1", "root", Kind.LATE)
    assert [(d.source, d.timeout_flag) for d in bypassed] == [("n1", True)] * 2
    eighth = [d for d in sim.deliveries if d.kind is Kind.ROOT_PARTIAL and d.frm == "root"]
    assert [(d.timeout_nodes, d.data.tolist()) for d in eighth] == [
        (("n1",), chunk_of(sum(data_of(i) for i in (2, 3, 4, 5)), c)) for c in (0, 1)
    ]
    # No switch waited or timed out, and no bypass entry was needed.
    assert sim.events_of("timeout") == [] and sim.events_of("bypass_created") == []
    ninth = sum(data_of(i) for i in range(1, 6))
    assert all(r.tolist() == ninth.tolist() for r in sim.results("X").values())
    assert sim.holding("X") == []


def test_hpcc_100_timeout_at_switch_250_bypassed_through_the_tree():
    """S31-S35 and S301-S306: 112 misses the threshold of switch 250; its data
    goes 250 → 201 → 240 → 202 → 121 (the timeout aggregation node), forwarded
    without aggregation at every hop; 121 completes the sum and notifies all."""
    topo = hpcc_100()
    nodes = {n: i + 1 for i, n in enumerate(HPCC_COMPUTE)}
    spec = command(topo, HPCC_COMPUTE, ta="121")
    sim = Simulation(topo)
    sim.add_command(spec, inputs(nodes), start={"112": 0.5})
    sim.run(until=0.45)
    # S31-S33: 250 got only 111 in time, sent a (with 112's id) up, made the entry.
    a = deliveries(sim, "250", "201", Kind.PARTIAL)
    assert [(d.timeout_nodes, d.data.tolist()) for d in a] == [
        (("112",), chunk_of(data_of(1), c)) for c in (0, 1)
    ]
    assert {(e.chunk, e.node) for e in sim.cores["250"].bypass_entries()} == {
        (0, "112"),
        (1, "112"),
    }
    # S34-S35: 201 aggregated a with 113's c; its first aggregate carries 112's id.
    first = deliveries(sim, "201", "240", Kind.PARTIAL)
    assert [(d.timeout_nodes, d.data.tolist()) for d in first] == [
        (("112",), chunk_of(data_of(1) + data_of(3), c)) for c in (0, 1)
    ]
    # S21-S22 / S301: the root's first data goes via 202 to 121.
    assert [
        (d.frm, d.to) for d in sim.deliveries if d.kind is Kind.ROOT_PARTIAL and d.chunk == 0
    ] == [("240", "202"), ("202", "121")]
    sim.run()
    # S303: second data from 112 along 250, 201, 240, 202 to 121, flagged all the way.
    hops = [(d.frm, d.to) for d in sim.deliveries if d.kind is Kind.LATE and d.chunk == 0]
    assert hops == [("250", "201"), ("201", "240"), ("240", "202"), ("202", "121")]
    assert all(d.source == "112" and d.timeout_flag for d in sim.deliveries if d.kind is Kind.LATE)
    forwarded_by = {n for _, n, e in sim.events_of("forwarded") if e.node == "112"}
    assert forwarded_by == {"250", "201", "240", "202"}
    assert not [e for _, _, e in sim.events_of("aggregated") if e.node == "112"]
    # S305-S306: 121 combined; its third data went up to 240 and down to everyone.
    assert [(d.frm, d.to) for d in sim.deliveries if d.kind is Kind.FINAL and d.chunk == 0] == [
        ("121", "202"),
        ("202", "240"),
    ]
    total = sum(data_of(i) for i in nodes.values())
    assert {n: r.tolist() for n, r in sim.results("X").items()} == {
        n: total.tolist() for n in HPCC_COMPUTE
    }
    assert sim.holding("X") == [] and sim.bypass_entries() == []


def test_hpcc_100_predicted_112_tags_its_own_data():
    """S41-S47: management marks 112 late, clears its bit at 250; 112 tags its
    data, 250 sends a (with 112's id) to 201 and b around to 121."""
    topo = hpcc_100()
    nodes = {n: i + 1 for i, n in enumerate(HPCC_COMPUTE)}
    spec = command(topo, HPCC_COMPUTE, ta="121", predicted=["112"])
    bitmaps = {
        s: dict(zip(kids, bits, strict=True))
        for s, kids, bits in plan_command(topo, spec).bitmaps()
    }
    assert bitmaps["250"] == {"111": True, "112": False}
    sim = Simulation(topo)
    sim.add_command(spec, inputs(nodes))
    sim.run()
    a = deliveries(sim, "250", "201", Kind.PARTIAL)
    assert [(d.timeout_nodes, d.data.tolist()) for d in a] == [
        (("112",), chunk_of(data_of(1), c)) for c in (0, 1)
    ]
    b = deliveries(sim, "250", "201", Kind.LATE)
    assert [(d.source, d.timeout_flag, d.data.tolist()) for d in b] == [
        ("112", True, chunk_of(data_of(2), c)) for c in (0, 1)
    ]
    first = deliveries(sim, "201", "240", Kind.PARTIAL)
    assert [d.timeout_nodes for d in first] == [("112",), ("112",)]
    assert sim.events_of("timeout") == []
    total = sum(data_of(i) for i in nodes.values())
    assert all(r.tolist() == total.tolist() for r in sim.results("X").values())


def test_history_example_threshold_and_top_k():
    """The text after S302: lateness 0, 2.1, 4.5, 1.3, 0.5, 0.5, 0.3, 1.5, 6, 2,
    3, 4 s; more than 4 s → 113 and 134; the largest one → 134."""
    history = [dict(zip(HPCC_COMPUTE, HISTORY_LATENESS, strict=True))]
    topo = hpcc_100()
    assert predict_stragglers(history, threshold_s=4.0, order=topo.position) == [
        ("134", 6),
        ("113", 4.5),
    ]
    assert predict_stragglers(history, top_k=1, order=topo.position) == [("134", 6)]
    # Split over two earlier aggregations ("前2次聚合操作"): each node's worst counts.
    early = [{n: v / 2 for n, v in history[0].items()}, history[0]]
    assert [n for n, _ in predict_stragglers(early, threshold_s=4.0)] == ["134", "113"]
    # Applied to a command: their bits are cleared at their switches.
    spec = command(topo, HPCC_COMPUTE, ta="121", history=history, threshold_s=4.0)
    assert spec.predicted == ("113", "134")
    bitmaps = {s: dict(zip(k, b, strict=True)) for s, k, b in plan_command(topo, spec).bitmaps()}
    assert bitmaps["201"] == {"250": True, "113": False}
    assert bitmaps["203"]["134"] is False
    assert sum(not bit for bm in bitmaps.values() for bit in bm.values()) == 2
    top1 = command(topo, HPCC_COMPUTE, ta="121", history=history, top_k=1)
    assert top1.predicted == ("134",)


def test_regrouping_around_a_late_node_changes_preset_bits_but_not_exact():
    """AG-8: a float32 partial regrouped around a late node changes part of the
    sums compared with the normal path (the issue measures about a quarter of
    1M elements); PRESET makes that reproducible, EXACT makes it vanish."""
    from lightpath.aggregation.maths import DType, OrderPolicy

    topo = two_switch_cluster(sub_ms=100, root_ms=300)
    rng = np.random.default_rng(11)
    length = 1 << 20
    data = {n: rng.standard_normal(length).astype(np.float32) for n in FIVE}

    def run(order, late: bool, command_id: str) -> np.ndarray:
        spec = command(
            topo,
            list(FIVE),
            command_id=command_id,
            dtype=DType.FLOAT32,
            length=length,
            chunk_elems=1 << 18,
            order=order,
            ta="n4",
        )
        sim = Simulation(topo, wire=False)
        sim.add_command(spec, data, start={"n3": 0.5} if late else None)
        sim.run()
        results = sim.results(command_id)
        assert len({r.tobytes() for r in results.values()}) == 1
        return results["n1"]

    normal = run(OrderPolicy.PRESET, False, "normal")
    late = run(OrderPolicy.PRESET, True, "late")
    again = run(OrderPolicy.PRESET, True, "late-again")
    changed = float(np.mean(normal != late))
    assert 0.05 < changed < 0.6  # regrouping moves the last bits of many sums ...
    assert late.tobytes() == again.tobytes()  # ... the same way every time
    exact_normal = run(OrderPolicy.EXACT, False, "exact-normal")
    exact_late = run(OrderPolicy.EXACT, True, "exact-late")
    assert exact_normal.tobytes() == exact_late.tobytes()


def test_several_late_nodes_combine_incrementally_or_after_all():
    """S305, conditions one and two: with two timeout nodes the timeout
    aggregation node either waits for both, or folds each as it comes."""
    from lightpath.aggregation.maths import Trigger

    topo = two_switch_cluster(sub_ms=100, root_ms=300)
    for trigger in (Trigger.INCREMENTAL, Trigger.ALL_OR_THRESHOLD):
        spec = command(topo, list(FIVE), ta="root", trigger=trigger)
        sim = Simulation(topo)
        sim.add_command(spec, inputs(FIVE), start={"n2": 0.5, "n5": 0.9})
        sim.run(until=0.7)
        ta = sim.cores["root"].timeout_aggregator("X")
        assert ta.outstanding(0) == {"n5"}
        assert ta.folded(0) == ({"n2"} if trigger is Trigger.INCREMENTAL else set())
        sim.run()
        partial = [e for _, _, e in sim.events_of("ta_partial") if e.chunk == 0]
        assert [e.detail for e in partial] == ["n2,n5"]
        lates = [(t, e.node) for t, _, e in sim.events_of("ta_late") if e.chunk == 0]
        assert lates == [(0.5, "n2"), (0.9, "n5")]
        final = [t for t, _, e in sim.events_of("ta_final") if e.chunk == 0]
        assert final == [0.9]  # complete only once the last timeout node is in
        total = sum(data_of(i) for i in range(1, 6))
        assert all(r.tolist() == total.tolist() for r in sim.results("X").values())
        assert sim.holding("X") == []
