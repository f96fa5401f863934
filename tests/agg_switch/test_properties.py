"""Properties of the aggregation tree (hypothesis, on the pure core in the
discrete-event simulation): random trees, thresholds, delays, late and
predicted nodes, duplicates, slot pools and trigger modes.

* Every participant receives the same result, equal to the direct reduction
  of all inputs: exactly for integers, bool, min/max and EXACT; bit for bit
  the documented PRESET order (each switch folds its on-time children in
  topology order, the timeout aggregation node folds the root's partial and
  then the late contributions in preorder) for float sum and product.
* No bypass entry, slot or waiting arrival outlives its command, completed or failed.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lightpath.aggregation.maths import DType, Op, OrderPolicy, Reduction, Trigger
from lightpath_services.agg_switch.command import CommandPlan, CommandSpec, SlotPolicy, plan_command
from lightpath_services.agg_switch.topology import NodeSpec, Topology, validate_topology
from tests.agg_switch.fixtures import C, D, S, command
from tests.agg_switch.sim import Simulation

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

KINDS = [
    (DType.INT64, Op.SUM, OrderPolicy.PRESET),
    (DType.INT32, Op.SUM, OrderPolicy.ARRIVAL),
    (DType.INT64, Op.MIN, OrderPolicy.PRESET),
    (DType.INT32, Op.PROD, OrderPolicy.PRESET),
    (DType.BOOL, Op.AND, OrderPolicy.PRESET),
    (DType.BOOL, Op.OR, OrderPolicy.ARRIVAL),
    (DType.FLOAT32, Op.SUM, OrderPolicy.PRESET),
    (DType.FLOAT64, Op.SUM, OrderPolicy.PRESET),
    (DType.FLOAT32, Op.PROD, OrderPolicy.PRESET),
    (DType.FLOAT32, Op.MAX, OrderPolicy.ARRIVAL),
    (DType.FLOAT32, Op.SUM, OrderPolicy.EXACT),
    (DType.FLOAT64, Op.SUM, OrderPolicy.EXACT),
    (DType.FLOAT32, Op.SUM, OrderPolicy.ARRIVAL),
]


@st.composite
def trees(draw) -> Topology:
    n_switches = draw(st.integers(1, 5))
    nodes = [NodeSpec("s0", S, "", draw(st.sampled_from([50, 100, 200, 400])))]
    for i in range(1, n_switches):
        parent = f"s{draw(st.integers(0, i - 1))}"
        nodes.append(NodeSpec(f"s{i}", S, parent, draw(st.sampled_from([50, 100, 200, 400]))))
    n_compute = draw(st.integers(1, 9))
    for j in range(n_compute):
        nodes.append(NodeSpec(f"c{j}", C, f"s{draw(st.integers(0, n_switches - 1))}"))
    if draw(st.booleans()):
        nodes.append(NodeSpec("ded", D, "s0"))
    return validate_topology("prop", nodes)


@st.composite
def scenarios(draw):
    topo = draw(trees())
    computes = topo.compute_nodes
    participants = draw(
        st.lists(st.sampled_from(computes), min_size=1, max_size=len(computes), unique=True)
    )
    dtype, op, order = draw(st.sampled_from(KINDS))
    length = draw(st.integers(1, 9))
    chunk_elems = draw(st.integers(1, 4))
    predicted = draw(
        st.lists(st.sampled_from(participants), max_size=len(participants) - 1, unique=True)
    )
    plan_probe = command(topo, participants, length=1, chunk_elems=1)
    eligible = [
        n
        for n in topo.preorder
        if n in participants or n in plan_command(topo, plan_probe).switches or n == "ded"
    ]
    ta = draw(st.sampled_from(eligible))
    spec = command(
        topo,
        participants,
        dtype=dtype,
        op=op,
        order=order,
        length=length,
        chunk_elems=chunk_elems,
        ta=ta,
        predicted=predicted,
        trigger=draw(st.sampled_from(list(Trigger))),
        wait_for_all=draw(st.booleans()) if not predicted else False,
        slot_policy=draw(st.sampled_from(list(SlotPolicy))),
    )
    start = {p: draw(st.sampled_from([0.0, 0.0, 0.01, 0.03, 0.2, 0.6, 1.5])) for p in participants}
    delays = draw(st.lists(st.sampled_from([0.0, 0.001, 0.005, 0.03]), min_size=8, max_size=8))
    return {
        "topo": topo,
        "spec": spec,
        "start": start,
        "delays": delays,
        "slots": draw(st.integers(1, 6)),
        "gap": draw(st.sampled_from([0.0, 0.002, 0.05])),
        "duplicate": draw(st.lists(st.sampled_from(participants), max_size=2, unique=True)),
        "seed": draw(st.integers(0, 2**16)),
    }


def inputs_for(spec: CommandSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for p in spec.participants:
        if spec.dtype is DType.BOOL:
            out[p] = rng.random(spec.length) < 0.8
        elif spec.dtype.is_float:
            v = (
                rng.uniform(0.5, 2.0, spec.length)
                if spec.op is Op.PROD
                else rng.standard_normal(spec.length) * 10.0 ** rng.integers(-3, 4)
            )
            out[p] = v.astype(spec.dtype.numpy)
        elif spec.op is Op.PROD:
            out[p] = rng.integers(-3, 4, spec.length).astype(spec.dtype.numpy)
        else:
            out[p] = rng.integers(-(2**20), 2**20, spec.length).astype(spec.dtype.numpy)
    return out


def documented_order(
    plan: CommandPlan, inputs: dict[str, np.ndarray], late: dict[tuple[str, int], set[str]]
) -> np.ndarray:
    """The PRESET result, computed independently from the late sets the switches saw."""
    spec, topo = plan.spec, plan.topology
    r: Reduction = spec.reduction
    out = np.empty(spec.length, dtype=spec.dtype.numpy)

    def fold(acc, x):
        if x is None:
            return acc
        return x if acc is None else r.ufunc(acc, x)

    def value(node: str, k: int, part: slice, lates: list) -> np.ndarray | None:
        """What `node` sends up for chunk k; the late children's values go to `lates`."""
        if topo.is_compute(node):
            return r.absorb(inputs[node][part])
        acc = None
        for child in plan.switches[node].expected:
            v = value(child, k, part, lates)
            if child in late.get((node, k), set()):
                lates.append((child, v))
            else:
                acc = fold(acc, v)
        return acc

    for k in range(spec.chunks):
        part = slice(k * spec.chunk_elems, min(spec.length, (k + 1) * spec.chunk_elems))
        lates: list[tuple[str, np.ndarray | None]] = []
        acc = value(topo.root, k, part, lates)
        lates.extend((q, r.absorb(inputs[q][part])) for q in spec.predicted)
        for _, v in sorted(lates, key=lambda nv: topo.position[nv[0]]):
            acc = fold(acc, v)
        out[part] = r.finish(acc)
    return out


def late_sets(
    sim: Simulation, spec: CommandSpec, plan: CommandPlan
) -> dict[tuple[str, int], set[str]]:
    late: dict[tuple[str, int], set[str]] = {}
    for _, here, ev in sim.events_of("timeout", spec.command_id):
        late.setdefault((here, ev.chunk), set()).update(filter(None, ev.detail.split(",")))
    for _, here, ev in sim.events_of("fallback", spec.command_id):
        late.setdefault((here, ev.chunk), set()).update(plan.switches[here].expected)
    return late


def run(case) -> tuple[Simulation, dict[str, np.ndarray]]:
    topo, spec = case["topo"], case["spec"]
    links = {}
    delays = case["delays"]

    def delay(a: str, b: str) -> float:
        key = tuple(sorted((a, b)))
        if key not in links:
            links[key] = delays[len(links) % len(delays)]
        return links[key]

    sim = Simulation(topo, slots=case["slots"], link_delay=delay)
    inputs = inputs_for(spec, case["seed"])
    sim.add_command(
        spec, inputs, start=case["start"], chunk_gap=case["gap"], duplicate=case["duplicate"]
    )
    sim.run()
    return sim, inputs


def assert_nothing_held(sim: Simulation, command_id: str) -> None:
    assert sim.holding(command_id) == []
    assert sim.bypass_entries() == []
    for name, core in sim.cores.items():
        assert core.pool.in_use == 0, name
        assert core.parked == 0, name
        assert not core.knows(command_id), name


@settings(max_examples=500)
@given(scenarios())
def test_every_node_gets_the_reduction_of_all_inputs(case):
    spec: CommandSpec = case["spec"]
    sim, inputs = run(case)
    for what in ("timeout", "fallback", "parked", "bypass_matched", "duplicate", "ta_final"):
        if sim.events_of(what):
            event(what)
    if any(
        not case["topo"].is_compute(n)
        for _, _, e in sim.events_of("timeout")
        for n in e.detail.split(",")
        if n
    ):
        event("late switch")
    if spec.predicted:
        event("predicted")
    results = sim.results(spec.command_id)
    assert set(results) == set(spec.participants)
    first = next(iter(results.values()))
    for node, r in results.items():
        assert r.tobytes() == first.tobytes(), f"{node} got different bits"
    r: Reduction = spec.reduction
    direct = r.reference([inputs[p] for p in spec.participants])
    if r.preset:
        plan = plan_command(case["topo"], spec)
        expected = documented_order(plan, inputs, late_sets(sim, spec, plan))
        assert first.tobytes() == expected.tobytes()
        np.testing.assert_allclose(first, direct, rtol=1e-4, atol=1e-4 * np.abs(direct).max())
    elif r.order_sensitive and not r.fixed_point:  # ARRIVAL floats: the sum, up to rounding
        np.testing.assert_allclose(first, direct, rtol=1e-4, atol=1e-4 * np.abs(direct).max())
    else:  # order-free: integers, bool, min/max, EXACT
        assert first.tobytes() == direct.tobytes()
    assert_nothing_held(sim, spec.command_id)
    assert [f for c in sim.commands.values() for f in c.failures] == []


@settings(max_examples=150)
@given(scenarios(), st.data())
def test_a_node_that_never_arrives_fails_cleanly(case, data):
    spec: CommandSpec = case["spec"]
    aggregating = [p for p in spec.participants if p not in spec.predicted]
    never = data.draw(st.lists(st.sampled_from(spec.participants), min_size=1, unique=True))
    if set(never) >= set(aggregating) and not spec.predicted:
        never = never[:1]
    sim = Simulation(case["topo"], slots=case["slots"])
    sim.add_command(spec, inputs_for(spec, case["seed"]), start=case["start"], never=never)
    sim.run()
    cmd = sim.commands[spec.command_id]
    assert all(not n.done for n in cmd.nodes.values())
    assert cmd.failures, "the deadline must fail the command"
    # Every participant still waiting hears of it from its switch.
    assert cmd.notified_failure >= set(spec.participants)
    for f in cmd.failures:
        assert "deadline" in f.reason
    assert_nothing_held(sim, spec.command_id)


@settings(max_examples=150)
@given(scenarios(), scenarios(), st.integers(1, 3))
def test_concurrent_tenants_on_small_slot_pools_do_not_corrupt_each_other(a, b, slots):
    topo = a["topo"]
    spec_a = a["spec"]
    spec_b = command(
        topo,
        spec_a.participants,
        command_id="Y",
        dtype=DType.INT64,
        length=7,
        chunk_elems=2,
        tenant="other",
        slot_policy=b["spec"].slot_policy,
        ta=spec_a.participants[-1],
    )
    sim = Simulation(topo, slots=slots)
    in_a = inputs_for(spec_a, a["seed"])
    in_b = inputs_for(spec_b, b["seed"])
    sim.add_command(spec_a, in_a, start=a["start"], chunk_gap=a["gap"])
    sim.add_command(spec_b, in_b, start=b["start"] if set(b["start"]) == set(a["start"]) else None)
    sim.run()
    want_b = spec_b.reduction.reference([in_b[p] for p in spec_b.participants])
    assert all(r.tobytes() == want_b.tobytes() for r in sim.results("Y").values())
    got_a = sim.results(spec_a.command_id)
    assert len({r.tobytes() for r in got_a.values()}) == 1
    for cid in (spec_a.command_id, "Y"):
        assert_nothing_held(sim, cid)
