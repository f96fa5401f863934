"""The arithmetic (AG-8), the wire codec (AG-14), topology rules (AG-1) and the
management decisions (AG-9, AG-10) as pure functions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.aggregation import wire
from lightpath.aggregation.maths import (
    DType,
    Fold,
    Kind,
    Op,
    OrderPolicy,
    Packet,
    Reduction,
    TimeoutAggregator,
)
from lightpath.errors import FailedPrecondition, InvalidArgument
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.agg_switch.command import (
    TaStrategy,
    choose_timeout_aggregator,
    eligible_candidates,
    predict_stragglers,
)
from tests.agg_switch.fixtures import command, hpcc_100, two_switch_cluster

F32_SUM = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.PRESET)


def floats(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(64) * 10.0 ** rng.integers(-4, 5, 64)).astype(np.float32)
        for _ in range(n)
    ]


# -- Fold: preset order whatever the arrival order and trigger mode (AG-3, AG-8) --------


@settings(max_examples=200)
@given(st.integers(2, 6), st.integers(0, 1000), st.data())
def test_preset_fold_has_the_same_bits_for_every_arrival_order(n, seed, data):
    keys = [f"k{i}" for i in range(n)]
    xs = dict(zip(keys, floats(n, seed), strict=True))
    missing = set(data.draw(st.lists(st.sampled_from(keys), max_size=n - 1, unique=True)))
    arrival = data.draw(st.permutations([k for k in keys if k not in missing]))
    want = F32_SUM.reference([xs[k] for k in keys if k not in missing])
    for incremental in (False, True):
        fold = Fold(F32_SUM, keys, incremental)
        for k in arrival:
            fold.add(k, xs[k])
        assert fold.finish().tobytes() == want.tobytes()


def test_arrival_order_changes_float_bits_which_is_why_preset_exists():
    """The seed's 1/3 + 2/3 + 2/3 example, in float32 at scale: some orders differ."""
    xs = floats(4, 3)
    sums = {
        F32_SUM.reference([xs[i] for i in perm]).tobytes()
        for perm in itertools.permutations(range(4))
    }
    assert len(sums) > 1


def test_incremental_preset_fold_combines_the_arrived_prefix_only():
    fold = Fold(F32_SUM, ["a", "b", "c"], incremental=True)
    fold.add("c", np.ones(2, np.float32))
    assert fold.pending == 1  # c waits for a and b
    fold.add("a", np.ones(2, np.float32))
    assert fold.pending == 1  # a folded, c still behind b
    fold.add("b", None)  # b arrived empty: only unblocks the order
    assert fold.pending == 0


# -- EXACT (AG-8) -----------------------------------------------------------------------


@settings(max_examples=100)
@given(st.integers(2, 7), st.integers(0, 10_000), st.data())
def test_exact_sum_has_the_same_bits_for_every_grouping(n, seed, data):
    r = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.EXACT, 32, n)
    xs = floats(n, seed)
    xs = [np.clip(x, -1e6, 1e6).astype(np.float32) for x in xs]
    perm = data.draw(st.permutations(range(n)))
    split = data.draw(st.integers(1, n - 1))
    a = r.reference([xs[i] for i in perm])
    # Group as two partials, combined later (a timeout regrouping).
    left = r.absorb(xs[perm[0]])
    for i in perm[1:split]:
        left = r.combine(left, False, r.absorb(xs[i]))
    right = r.absorb(xs[perm[split]])
    for i in perm[split + 1 :]:
        right = r.combine(right, False, r.absorb(xs[i]))
    b = r.finish(r.combine(right, False, left))
    assert a.tobytes() == b.tobytes()
    exact = sum(np.rint(x.astype(np.float64) * 2.0**32) for x in xs) / 2.0**32
    np.testing.assert_allclose(a, exact.astype(np.float32), rtol=1e-6, atol=1e-9)


def test_exact_refuses_values_out_of_range_and_products():
    r = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.EXACT, 32, 8)
    assert r.range_exponent == 27
    assert r.check_input(np.array([2.0**27], np.float32)) is None
    assert "±2^27" in r.check_input(np.array([2.0**28], np.float32))
    assert r.check_input(np.array([np.nan], np.float32)) is not None
    prod = Reduction(DType.FLOAT64, Op.PROD, OrderPolicy.EXACT)
    assert [v.field for v in prod.violations()] == ["order_policy"]
    assert [v.field for v in Reduction(DType.BOOL, Op.SUM).violations()] == ["op"]
    assert [v.field for v in Reduction(DType.INT32, Op.AND).violations()] == ["op"]


# -- the timeout aggregation node (AG-7) ------------------------------------------------


def test_timeout_aggregator_accounts_for_late_switches_and_early_arrivals():
    pos = {"root": 0, "s1": 1, "a": 2, "b": 3, "s2": 4, "c": 5}
    r = Reduction(DType.INT64, Op.SUM)
    for incremental in (False, True):
        ta = TimeoutAggregator(r, pos, incremental)
        one = np.ones(2, np.int64)
        # b's data (late under the late switch s1) comes before anything else.
        assert ta.on_late(0, "b", one * 4, (), False) is None
        assert ta.on_partial(0, one * 1, ("s1", "c"), False) is None
        assert ta.outstanding(0) == {"s1", "c"}
        assert ta.on_late(0, "s1", one * 2, ("b",), False) is None  # s1 lacked b
        assert ta.outstanding(0) == {"c"}
        assert ta.on_late(0, "s1", one * 100, (), False) is None  # a duplicate: ignored
        out = ta.on_late(0, "c", one * 8, (), False)
        assert out.tolist() == [15, 15]
        assert ta.open_chunks == []


@settings(max_examples=100)
@given(st.integers(0, 1000), st.data())
def test_incremental_and_after_all_timeout_aggregation_agree_bit_for_bit(seed, data):
    xs = floats(5, seed)
    pos = {"p": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    order = data.draw(st.permutations(["partial", "a", "b", "c", "d"]))
    outs = []
    for incremental in (False, True):
        ta = TimeoutAggregator(F32_SUM, pos, incremental)
        got = []
        for who in order:
            if who == "partial":
                got.append(ta.on_partial(0, xs[0], ("a", "b", "c", "d"), False))
            else:
                got.append(ta.on_late(0, who, xs[pos[who]], (), False))
        assert all(g is None for g in got[:-1])  # complete exactly at the last arrival
        outs.append(got[-1])
    assert outs[0].tobytes() == outs[1].tobytes() == F32_SUM.reference(xs).tobytes()


# -- the wire (AG-14) ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DType))
def test_chunks_round_trip_zero_copy_and_read_as_plain_protobuf(dtype):
    data = np.arange(5).astype(dtype.numpy)
    pkt = Packet(
        "cmd",
        3,
        Kind.LATE,
        "n7",
        data,
        destination="ta",
        timeout_nodes=("a", "b"),
        timeout_flag=True,
    )
    raw = wire.encode(pkt, dtype)
    header, view = wire.decode(raw)
    back = wire.to_packet(header, view, raw)
    assert (back.command_id, back.chunk, back.kind, back.source, back.destination) == (
        "cmd",
        3,
        Kind.LATE,
        "n7",
        "ta",
    )
    assert back.timeout_nodes == ("a", "b") and back.timeout_flag
    assert back.data.tobytes() == data.tobytes() and not back.data.flags.writeable
    assert np.shares_memory(back.data, np.frombuffer(raw, np.uint8))
    plain = pb.AggChunk.FromString(raw)
    assert plain.data == data.tobytes() and plain.source == "n7"
    # and the other way: a plain protobuf encoder's bytes decode the same
    header2, view2 = wire.decode(plain.SerializeToString())
    assert bytes(view2) == data.tobytes() and header2.index == 3


def test_garbage_is_not_a_chunk():
    with pytest.raises(wire.WireError):
        wire.decode(b"\xff\xff\xff")


# -- topology (AG-1) and management (AG-9, AG-10) -------------------------------------


def test_routing_and_distances_of_the_seed_cluster():
    topo = hpcc_100()
    assert topo.preorder[:6] == ["240", "201", "250", "111", "112", "113"]
    assert topo.next_hop("250", "121") == "201"
    assert topo.next_hop("240", "121") == "202"
    assert topo.next_hop("202", "121") == "121"
    assert (topo.hops("112"), topo.hops("240"), topo.link_cost_to_root("112")) == (3, 0, 3.0)
    assert topo.in_subtree("112", "201") and not topo.in_subtree("121", "201")


def test_timeout_aggregator_strategies_on_the_seed_cluster():
    topo = two_switch_cluster(dedicated=True)
    parts = ["n1", "n2", "n3", "n4", "n5"]
    assert eligible_candidates(topo, parts) == ["root", "sw1", *parts[:3], "sw2", *parts[3:], "ta"]
    fixed, _ = choose_timeout_aggregator(topo, parts, TaStrategy.FIXED)
    assert fixed == "root"
    hops, scored = choose_timeout_aggregator(
        topo, parts, TaStrategy.FEWEST_HOPS, candidates=["n2", "sw2", "ta"]
    )
    assert hops == "sw2" and [c.hops for c in scored] == [2, 1, 1]
    load, _ = choose_timeout_aggregator(
        topo,
        parts,
        TaStrategy.LEAST_LOAD,
        loads={"root": 5, "sw1": 1, "sw2": 3},
        candidates=["root", "sw1", "sw2"],
    )
    assert load == "sw1"
    picks = {
        choose_timeout_aggregator(topo, parts, TaStrategy.RANDOM_BY_ID, command_id=f"c{i}")[0]
        for i in range(40)
    }
    assert len(picks) >= 4
    with pytest.raises(InvalidArgument) as err:
        choose_timeout_aggregator(topo, ["n1"], TaStrategy.FIXED, node="n2")
    assert err.value.violations[0].field == "node"


def test_predictions_need_one_rule_and_leave_someone_aggregating():
    with pytest.raises(InvalidArgument):
        predict_stragglers([{"a": 1.0}], top_k=1, threshold_s=0.5)
    assert predict_stragglers([{"a": 0.0, "b": 0.0}], top_k=2) == []  # nobody was ever late
    topo = two_switch_cluster()
    with pytest.raises(FailedPrecondition):
        command(topo, ["n1", "n2"], history=[{"n1": 1.0, "n2": 2.0}], top_k=2)
