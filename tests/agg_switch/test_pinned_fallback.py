"""Pinned (issue 17): a FALLBACK chunk records a bypass entry for every other
expected child — not for the child whose arrival found no slot, whose data is
flagged and routed at once — so every entry is matched and none is left over
(AG-4, AG-5, AG-13)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from lightpath.aggregation.maths import Kind, Packet
from lightpath_services.agg_switch.command import SlotPolicy, plan_command
from lightpath_services.agg_switch.switch import SwitchCore
from tests.agg_switch.fixtures import command, two_switch_cluster
from tests.agg_switch.sim import Simulation
from tests.agg_switch.test_properties import run, scenarios


def contribution(cid: str, node: str, value: int) -> Packet:
    return Packet(cid, 0, Kind.CONTRIBUTION, node, np.array([value, value], np.int64))


def entries(core: SwitchCore, cid: str) -> set[tuple[int, str]]:
    return {(e.chunk, e.node) for e in core.bypass_entries() if e.command_id == cid}


def test_fallback_records_entries_for_the_other_children_only():
    topo = two_switch_cluster()
    a, b = (
        command(topo, command_id=cid, length=2, chunk_elems=2, slot_policy=SlotPolicy.FALLBACK)
        for cid in ("A", "B")
    )
    core = SwitchCore("sw1", 1)
    for spec in (a, b):
        core.admit(plan_command(topo, spec), spec.deadline_at)
    core.receive(contribution("A", "n1", 1), "n1", 0.0)  # A holds the only slot
    eff = core.receive(contribution("B", "n2", 2), "n2", 0.001)
    assert [e.what for e in eff.events].count("fallback") == 1
    assert entries(core, "B") == {(0, "n1"), (0, "n3")}
    # n2's own data went straight on, flagged, to the timeout aggregation node
    (late,) = [p for _, p in eff.sends if p.kind is Kind.LATE]
    assert late.source == "n2" and late.timeout_flag
    for node in ("n1", "n3"):
        eff = core.receive(contribution("B", node, 3), node, 0.002)
        assert [e.what for e in eff.events if e.what.startswith("bypass")] == ["bypass_matched"]
    assert entries(core, "B") == set()
    assert not core.holds("B")
    assert core.holds("A")  # A's slot is untouched


def test_a_fallback_run_ends_with_no_leftover_entries_anywhere():
    topo = two_switch_cluster()
    sim = Simulation(topo, slots={"sw1": 1, "sw2": 1, "root": 1})
    specs = [
        command(topo, command_id=cid, length=4, chunk_elems=2, slot_policy=SlotPolicy.FALLBACK)
        for cid in ("A", "B", "C")
    ]
    inputs = {p: np.arange(4, dtype=np.int64) + i for i, p in enumerate(topo.compute_nodes)}
    for spec in specs:  # n3 is slow: its switch's one slot stays taken meanwhile
        sim.add_command(spec, inputs, start={"n3": 0.05, "n5": 0.02}, chunk_gap=0.001)
    sim.run()
    assert sim.events_of("fallback"), "the scenario must fall back somewhere"
    assert sim.events_of("bypass_leftover") == []
    assert sim.bypass_entries() == []
    want = sum(inputs.values())
    for spec in specs:
        for got in sim.results(spec.command_id).values():
            assert got.tolist() == want.tolist()


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_bypass_entry_is_matched_before_its_command_ends(case):
    sim, _ = run(case)
    assert sim.events_of("bypass_leftover") == []
    created = {
        (e.command_id, here, e.chunk, e.node) for _, here, e in sim.events_of("bypass_created")
    }
    matched = {
        (e.command_id, here, e.chunk, e.node) for _, here, e in sim.events_of("bypass_matched")
    }
    assert created == matched
