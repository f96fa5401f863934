"""The aggregation arithmetic's rules (AG-2, AG-8, AG-14) at their bounds: found
untested by bench/mutation.py (issue 17). Pure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightpath.aggregation.maths import (
    DEFAULT_FRACTION_BITS,
    MAX_FRACTION_BITS,
    DType,
    Kind,
    NodeCommand,
    Op,
    OrderPolicy,
    Packet,
    Reduction,
    chunk_bounds,
    split_chunks,
)


def fields(r: Reduction) -> list[str]:
    return [v.field for v in r.violations()]


def test_defaults():
    r = Reduction(DType.FLOAT32, Op.SUM)
    assert (r.order, r.fraction_bits, r.participants) == (OrderPolicy.PRESET, 32, 1)
    assert (DEFAULT_FRACTION_BITS, MAX_FRACTION_BITS) == (32, 60)
    assert Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT).range_exponent == 30


def test_fraction_bits_bounds():
    ok = lambda f, n=1: fields(Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, f, n))  # noqa: E731
    assert ok(0) == [] and ok(60) == []
    assert ok(-1) == ["exact_fraction_bits"] and ok(61) == ["exact_fraction_bits"]
    # the integer range left: 62 - f - ceil(log2 n) must be at least 1
    assert Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, 60, 2).range_exponent == 1
    assert ok(60, 2) == []
    assert ok(60, 3) == ["exact_fraction_bits"]
    # only EXACT float sums are fixed point: other reductions ignore the range
    assert fields(Reduction(DType.INT64, Op.SUM, OrderPolicy.EXACT, 60, 1000)) == []


def test_which_reductions_are_order_sensitive_preset_or_fixed_point():
    f_sum = Reduction(DType.FLOAT32, Op.SUM)
    assert f_sum.order_sensitive and f_sum.preset and not f_sum.fixed_point
    assert Reduction(DType.FLOAT64, Op.PROD).order_sensitive
    assert not Reduction(DType.FLOAT64, Op.MAX).order_sensitive
    assert not Reduction(DType.INT32, Op.SUM).order_sensitive
    arrival = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.ARRIVAL)
    assert arrival.order_sensitive and not arrival.preset
    exact = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.EXACT)
    assert exact.fixed_point and not exact.preset
    assert exact.partial_dtype() == np.dtype("<i8") and f_sum.partial_dtype() == np.dtype("<f4")
    assert not Reduction(DType.INT32, Op.SUM, OrderPolicy.EXACT).fixed_point
    assert [Reduction(d, Op.MAX).itemsize for d in DType] == [4, 8, 4, 8, 1]
    assert [d.is_float for d in DType] == [False, False, True, True, False]


def test_input_range_of_exact_is_inclusive():
    r = Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, 32, 4)  # 2^28
    lim = math.ldexp(1.0, 28)
    assert r.check_input(np.array([lim, -lim])) is None
    assert r.check_input(np.array([np.nextafter(lim, np.inf)])) is not None
    assert r.check_input(np.array([-np.nextafter(lim, np.inf)])) is not None
    assert r.check_input(np.array([], np.float64)) is None
    assert Reduction(DType.FLOAT64, Op.SUM).check_input(np.array([1e300])) is None


def test_bool_and_integer_op_rules():
    assert (
        fields(Reduction(DType.BOOL, Op.AND)) == [] and fields(Reduction(DType.BOOL, Op.MIN)) == []
    )
    assert fields(Reduction(DType.BOOL, Op.PROD)) == ["op"]
    assert fields(Reduction(DType.INT64, Op.OR)) == ["op"]
    assert fields(Reduction(DType.INT64, Op.PROD, OrderPolicy.EXACT)) == []


def test_chunks():
    assert [split_chunks(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]
    assert chunk_bounds(0, 9, 4) == (0, 4) and chunk_bounds(2, 9, 4) == (8, 9)


def test_a_node_assembles_results_and_refuses_what_is_not_for_it():
    r = Reduction(DType.INT64, Op.SUM)
    node = NodeCommand("n1", "c", r, 5, 2)
    assert node.chunks == 3 and not node.done and node.received == 0
    for k, (lo, hi) in enumerate([(0, 2), (2, 4), (4, 5)]):
        data = np.arange(lo, hi, dtype=np.int64)
        assert node.accept(Packet("c", k, Kind.RESULT, "sw", data)) is None
    node.accept(Packet("c", 1, Kind.RESULT, "sw", np.array([9, 9])))  # a repeat is ignored
    assert node.done and node.received == 3 and node.result.tolist() == [0, 1, 2, 3, 4]
    for bad in (-1, 3):
        with pytest.raises(ValueError):
            node.accept(Packet("c", bad, Kind.RESULT, "sw", np.array([1])))
    with pytest.raises(ValueError):
        node.accept(Packet("c", 0, Kind.LATE, "n2", np.array([1, 2])))  # not its aggregator
    with pytest.raises(ValueError):
        NodeCommand("n1", "c", r, 5, 2, out=np.zeros(4, np.int64))
    with pytest.raises(ValueError):
        NodeCommand("n1", "c", r, 5, 2, out=np.zeros(5, np.int32))


def test_the_timeout_aggregation_node_sends_final_to_the_root():
    r = Reduction(DType.INT64, Op.SUM)
    ta = NodeCommand(
        "n1", "c", r, 2, 2, timeout_aggregator=True, position={"n2": 1, "n3": 2}, root="root"
    )
    part = Packet("c", 0, Kind.ROOT_PARTIAL, "root", np.array([1, 1]), timeout_nodes=("n2",))
    assert ta.accept(part) is None
    final = ta.accept(Packet("c", 0, Kind.LATE, "n2", np.array([2, 3]), timeout_flag=True))
    assert final is not None
    assert (final.kind, final.source, final.destination) == (Kind.FINAL, "n1", "root")
    assert final.data.tolist() == [3, 4]


def test_combine_into_a_given_array_and_accumulate_owns_from_the_second_input():
    r = Reduction(DType.INT64, Op.SUM)
    a, b, c = (np.array([v, v], np.int64) for v in (1, 2, 3))
    made = []

    def alloc(n, dt):
        made.append(np.empty(n, dt))
        return made[-1]

    out = r.combine(a, False, b, alloc)
    assert out is made[0] and out.tolist() == [3, 3] and a.tolist() == [1, 1]
    acc, owned = r.accumulate(None, False, a)
    assert acc is a and owned is False
    acc, owned = r.accumulate(acc, owned, b, alloc)
    assert owned is True and acc is made[1]
    again, owned = r.accumulate(acc, owned, c, alloc)
    assert again is acc and owned is True and acc.tolist() == [6, 6] and len(made) == 2
    assert r.accumulate(acc, owned, None) == (acc, True)


def test_arrival_order_holds_inputs_until_finish_unless_incremental():
    from lightpath.aggregation.maths import Fold

    r = Reduction(DType.FLOAT32, Op.SUM, OrderPolicy.ARRIVAL)
    held = Fold(r, ["a", "b"], incremental=False)
    held.add("b", np.array([1.0], np.float32))
    assert held.pending == 1
    eager = Fold(r, ["a", "b"], incremental=True)
    eager.add("b", np.array([1.0], np.float32))
    assert eager.pending == 0
    eager.add("a", np.array([2.0], np.float32))
    assert eager.finish().tolist() == [3.0]


def test_kinds_are_the_protos_chunk_kinds():
    from lightpath.v1 import agg_switch_pb2 as pb

    for k in Kind:
        assert pb.AggChunkKind.Value(f"AGG_CHUNK_KIND_{k.name}") == k.value


def test_packet_defaults_and_what_equality_ignores():
    p = Packet("c", 0, Kind.RESULT, "s")
    assert (p.data, p.destination, p.timeout_nodes) == (None, "", ())
    assert (p.timeout_flag, p.fixed_point, p.parameters, p.raw, p.raw_ref) == (
        False,
        False,
        False,
        None,
        None,
    )
    q = Packet("c", 0, Kind.RESULT, "s", raw=b"x", raw_ref=b"y")
    assert p == q and "raw" not in repr(q)
    assert q.but(chunk=1).raw is None and q.but(chunk=1).raw_ref is None


def ta_of(incremental: bool, alloc=None):
    from lightpath.aggregation.maths import TimeoutAggregator

    r = Reduction(DType.INT64, Op.SUM)
    return TimeoutAggregator(r, {"a": 1, "b": 2, "c": 3}, incremental, alloc)


def v(x):
    return np.array([x], np.int64)


@pytest.mark.parametrize("incremental", [False, True])
def test_late_partials_reveal_nodes_in_any_order(incremental):
    """The root names a; b's partial arrives first naming c; a names b: the chunk
    waits for c too."""
    ta = ta_of(incremental)
    assert ta.on_partial(0, v(1), ["a"], False) is None
    assert ta.on_late(0, "b", v(10), ["c"], False) is None
    assert ta.on_late(0, "a", v(100), ["b"], False) is None
    assert ta.outstanding(0) == {"c"}
    assert ta.on_late(0, "c", v(1000), [], False).tolist() == [1111]


def test_incremental_folds_the_partial_once():
    ta = ta_of(True)
    assert ta.on_partial(0, v(1), ["a", "b"], False) is None
    assert ta.on_late(0, "a", v(10), [], False) is None
    assert ta.folded(0) == {"a"}
    assert ta.on_late(0, "b", v(100), [], False).tolist() == [111]


def test_a_repeated_partial_or_late_input_counts_once():
    ta = ta_of(False)
    assert ta.on_partial(0, v(1), ["a"], False) is None
    assert ta.on_partial(0, v(1), ["a"], False) is None
    assert ta.on_late(0, "a", v(10), [], False).tolist() == [11]
    assert ta.on_partial(0, v(1), [], False) is None  # after completion too
    assert ta.on_late(0, "a", v(10), [], False) is None
    assert ta.open_chunks == []


def test_the_timeout_aggregator_computes_into_the_given_arrays():
    made = []

    def alloc(chunk, n, dt):
        made.append((chunk, np.empty(n, dt)))
        return made[-1][1]

    ta = ta_of(False, alloc)
    ta.on_partial(3, v(1), ["a"], False)
    out = ta.on_late(3, "a", v(2), [], False)
    assert out.tolist() == [3] and any(a is out for _, a in made)
    assert {c for c, _ in made} == {3}
