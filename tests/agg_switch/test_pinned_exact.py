"""Pinned (issue 17): EXACT rounds each float input to the nearest multiple of
2^-f (ties to even), once, and sums exactly (AG-8). The reference here is
fractions.Fraction: rational arithmetic with no rounding of its own, so the
comparison is bit for bit, not within a tolerance."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.aggregation.maths import BLOCK, DType, Op, OrderPolicy, Reduction


def fixed(x: float, f: int) -> int:
    """x in units of 2^-f, rounded to nearest, ties to even (Python's round of a Fraction)."""
    return round(Fraction(x) * 2**f)


def exact_sum(columns: list[list[float]], f: int, dtype: np.dtype) -> list[float]:
    """The EXACT result per element: the sum of the rounded inputs, as `dtype`."""
    out = []
    for xs in zip(*columns, strict=True):
        total = Fraction(sum(fixed(x, f) for x in xs), 2**f)
        out.append(float(np.array(float(total)).astype(dtype)))
    return out


def test_absorb_rounds_to_nearest_not_towards_zero():
    r = Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, fraction_bits=2)
    x = np.array([0.2, 0.4, -0.2, -0.4, 0.125, 0.375, -0.125, 0.875, 1.3])
    got = r.absorb(x)
    assert got.dtype == np.int64
    # 0.2*4 = 0.8 -> 1; 0.4*4 = 1.6 -> 2; 0.125*4 = 0.5 -> 0 (tie to even); 0.375*4 = 1.5 -> 2
    assert got.tolist() == [1, 2, -1, -2, 0, 2, -0, 4, 5]
    assert got.tolist() == [fixed(v, 2) for v in x.tolist()]


def test_a_sum_of_values_just_below_a_step_is_exact():
    """Truncating would lose almost a whole step per input: 3 × 0.9999 steps."""
    f = 8
    x = [(1 - 2**-10) * 2**-f] * 3
    r = Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, fraction_bits=f, participants=3)
    got = r.reference([np.array([v]) for v in x])
    assert got.tolist() == [3 * 2**-f] == exact_sum([[v] for v in x], f, np.dtype("<f8"))


finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([DType.FLOAT32, DType.FLOAT64]),
    st.integers(0, 40),
    st.integers(1, 5),
    st.integers(1, 6),
    st.data(),
)
def test_exact_equals_the_rational_reference_bit_for_bit(dtype, f, n, length, data):
    r = Reduction(dtype, Op.SUM, OrderPolicy.EXACT, fraction_bits=f, participants=n)
    rows = [
        np.array(data.draw(st.lists(finite, min_size=length, max_size=length)), dtype.numpy)
        for _ in range(n)
    ]
    assert r.check_input(np.concatenate(rows)) is None
    for row in rows:
        assert r.absorb(row).tolist() == [fixed(v, f) for v in row.tolist()]
    want = exact_sum([row.tolist() for row in rows], f, dtype.numpy)
    got = r.reference(rows)
    assert got.dtype == dtype.numpy
    assert got.tolist() == want
    # any order: the same bits
    assert r.reference(rows[::-1]).tobytes() == got.tobytes()


@pytest.mark.parametrize("f", [0, 1, 16, 32])
def test_rounding_holds_across_conversion_blocks(f):
    """Inputs longer than one conversion block round the same in every block."""
    r = Reduction(DType.FLOAT64, Op.SUM, OrderPolicy.EXACT, fraction_bits=f, participants=2)
    n = BLOCK + 3
    x = (np.arange(n, dtype=np.float64) % 7 + 0.75) * math.ldexp(1.0, -f)
    got = r.absorb(x)
    assert got[:7].tolist() == [fixed(v, f) for v in x[:7].tolist()]
    assert got[BLOCK:].tolist() == [fixed(v, f) for v in x[BLOCK:].tolist()]
    out = r.finish(got + got)
    assert out[-3:].tolist() == [float(Fraction(2 * fixed(v, f), 2**f)) for v in x[-3:].tolist()]
