"""The agent driver's batches and the reconcile's repairs, as pure functions (issue 20):
every cross-connect and 1xK move of a change lands in exactly one switch's batch, in the
order of the change; a ScopedChange keeps to its switches (and so does its inverse); a
repair is exactly the difference between a switch and the committed tables."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from lightpath.domain.southbound import bank_id, devices
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath_services.ocs_manager.agent_driver import ScopedChange, batches, to_fabric_state
from lightpath_services.ocs_manager.invariants import FabricState
from lightpath_services.ocs_manager.reconcile import repair_for
from lightpath_services.ocs_manager.wiring import release_change, replace_block, wire_change
from tests.ocs_manager.model import placement, state_of

SHAPES = [(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2), (4, 2, 1)]


def _change(fabric: Fabric, shape, wrap, seed: int, kind: str):
    rng = random.Random(seed)
    blocks = rng.sample(range(fabric.block_count), math.prod(shape) + 1)
    p = placement(fabric, "j", shape, blocks[:-1], wrap)
    if kind == "wire":
        return wire_change(fabric, p)
    if kind == "release":
        return release_change(fabric, p)
    return replace_block(fabric, p, rng.choice(p.blocks), blocks[-1]).change


def _expanded(fabric: Fabric, change) -> dict[str, tuple[list, list, list]]:
    """What the change does to each switch, from the slow expansion (ocs_ops)."""
    out: dict[str, tuple[list, list, list]] = {}
    for ocs, (disc, conn) in change.ocs_ops(fabric).items():
        out[fabric.ocs_ids[ocs]] = (sorted(disc), [], sorted(conn))
    for index, output in change.one_to_many_ops(fabric):
        block, inp = divmod(index, fabric.total_axes)
        out.setdefault(bank_id(block), ([], [], []))[1].append((inp, output))
    return out


def _seen(reqs) -> dict[str, tuple[list, list, list]]:
    return {
        sid: (
            sorted((p.port_a, p.port_b) for p in r.disconnect),
            [(o.input, o.output if o.HasField("output") else None) for o in r.set_outputs],
            sorted((p.port_a, p.port_b) for p in r.connect),
        )
        for sid, r in reqs.items()
    }


@given(
    st.sampled_from([1, 2, 3]),
    st.sampled_from(SHAPES),
    st.tuples(st.booleans(), st.booleans(), st.booleans()),
    st.integers(0, 2**16),
    st.sampled_from(["wire", "release", "replace"]),
    st.integers(0, 2**16),
)
def test_batches_hold_exactly_the_change_and_a_scope_keeps_to_its_switches(
    k, shape, wrap, seed, kind, scope_seed
):
    fabric = Fabric.build(FabricConfig((4, 4, 4), 16, k, 136))
    change = _change(fabric, shape, wrap, seed, kind)
    want = _expanded(fabric, change)
    assert _seen(batches(fabric, change)) == want
    # narrowed to some switches: only those, and the inverse too
    rng = random.Random(scope_seed)
    keep = {d for d in want if rng.random() < 0.5}
    by_id = {d.id: d for d in devices(fabric)}
    scoped = ScopedChange(
        change.disconnect,
        change.connect,
        change.one_to_many,
        frozenset(by_id[d].index for d in keep if d.startswith("ocs-")),
        frozenset(by_id[d].index for d in keep if d.startswith("otm-")),
    )
    assert _seen(batches(fabric, scoped)) == {d: want[d] for d in keep}
    inverse = _expanded(fabric, change.inverse())
    assert _seen(batches(fabric, scoped.inverse())) == {d: inverse[d] for d in keep}
    assert scoped.empty == (not keep)


@given(st.sampled_from([1, 2]), st.integers(0, 2**16), st.integers(0, 2**16))
def test_a_repair_is_exactly_the_difference_and_spares_busy_blocks(k, seed, noise_seed):
    fabric = Fabric.build(FabricConfig((2, 2, 2), 8, k, 24))
    rng = random.Random(seed)
    blocks = rng.sample(range(8), 6)
    a = placement(fabric, "a", (2, 1, 1), blocks[:2])
    b = placement(fabric, "b", (2, 2, 1), blocks[2:])
    committed = state_of(fabric, a, b)
    # the switches: committed, then damaged (some switches emptied, some strays)
    noise = random.Random(noise_seed)
    held = state_of(fabric, a, b)
    for ocs in list(held.tables):
        if noise.random() < 0.3:
            del held.tables[ocs]
    for index in list(held.one_to_many):
        if noise.random() < 0.2:
            del held.one_to_many[index]
    busy = set(b.blocks) if noise.random() < 0.5 else set()
    for d in devices(fabric):
        have = _state(fabric, d, held)
        fix = repair_for(fabric, d, committed, have, busy)
        after = _apply(fabric, d, held, fix)
        want = FabricState(
            tables={d.index: committed.tables.get(d.index, {})} if d.kind == "OCS" else {},
            one_to_many={
                i: o
                for i, o in committed.one_to_many.items()
                if d.kind != "OCS" and i // fabric.total_axes == d.index
            },
        )
        if not busy:
            assert _norm(after, d) == _norm(want, d)
        else:  # busy blocks' ports untouched, every other port as committed
            assert not any(_block_of(fabric, d, p) in busy for p in _touched(fix))


def _state(fabric, d, state: FabricState) -> sb.OpticalSwitchState:
    out = sb.OpticalSwitchState(switch_id=d.id)
    if d.kind == "OCS":
        for p, q in state.tables.get(d.index, {}).items():
            if p < q:
                out.cross_connects.add(port_a=p, port_b=q)
    else:
        base = d.index * fabric.total_axes
        for i, o in state.one_to_many.items():
            if base <= i < base + fabric.total_axes:
                out.outputs.add(input=i - base, output=o)
    return out


def _apply(fabric, d, state: FabricState, fix) -> FabricState:
    have = _state(fabric, d, state)
    table = {}
    for x in have.cross_connects:
        table[x.port_a], table[x.port_b] = x.port_b, x.port_a
    for p, q in fix.disconnect:
        if table.get(p) == q:
            del table[p], table[q]
    for p, q in fix.connect:
        for port in (p, q):
            old = table.pop(port, None)
            if old is not None:
                table.pop(old, None)
        table[p], table[q] = q, p
    outs = {s.input: s.output for s in have.outputs}
    for i, o in fix.outputs:
        if o is None:
            outs.pop(i, None)
        else:
            outs[i] = o
    out = sb.OpticalSwitchState(switch_id=d.id)
    for p, q in table.items():
        if p < q:
            out.cross_connects.add(port_a=p, port_b=q)
    for i, o in sorted(outs.items()):
        out.outputs.add(input=i, output=o)
    return to_fabric_state(fabric, {d.id: d}, {d.id: out})


def _norm(state: FabricState, d):
    return (
        {o: t for o, t in state.tables.items() if t and o == d.index},
        dict(state.one_to_many),
    )


def _touched(fix):
    return [p for pair in (*fix.disconnect, *fix.connect) for p in pair] + [
        i for i, _ in fix.outputs
    ]


def _block_of(fabric, d, port):
    if d.kind != "OCS":
        return d.index
    seg = fabric.segment_at(fabric.ocs_of_index(d.index)[2], port)
    return None if seg is None else seg[0]
