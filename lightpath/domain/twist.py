"""Twisted tori (issue 28): which slice shapes can be twisted and where their wraparounds land.

Pure: no I/O. The definition is Cámara, Moretó, Vallejo, Beivide, Miguel-Alonso,
Martínez and Navaridas, "Twisted Torus Topologies for Enhanced Interconnection
Networks" (IEEE TPDS 21(12), 2010), as the TPU v4 paper (Jouppi et al., ISCA 2023)
uses it for its "twisted" slices:

* k x k x 2k (two short dimensions of k, one long of 2k): leaving a short
  dimension through its wraparound also moves k along the long one;
* k x 2k x 2k (one short dimension of k, two long of 2k): leaving the short
  dimension through its wraparound also moves k along each long one.

In any axis order. Every other link is the regular torus's. Each chip keeps six
distinct neighbours, and the diameter and average distance drop below the
regular torus of the same shape (4x4x8: diameter 6 instead of 8).

On an OCS pod the twist is whole blocks: k is a multiple of the block edge, so a
chip that wraps keeps its place inside its block and only the block at the other
end changes: the same ports on the same OCS of that logical axis, another block.
`skews` gives the shift in the unit of the grid it is given (chips or blocks).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

# Shift of a wraparound: {short dimension: {long dimension: shift}}.
Skews = dict[int, dict[int, int]]

TWIST_RULE = (
    "a twisted torus needs a shape k x k x 2k or k x 2k x 2k (any axis order, "
    "e.g. 4x4x8, 4x8x8, 8x8x16, 8x16x16)"
)


def skews(shape: Sequence[int]) -> Skews | None:
    """The twisted wraparounds of `shape`, or None when it cannot be twisted."""
    if len(shape) != 3 or any(e < 1 for e in shape):
        return None
    k = min(shape)
    short = [d for d, e in enumerate(shape) if e == k]
    long = [d for d, e in enumerate(shape) if e == 2 * k]
    if len(short) + len(long) != 3 or not long or not short:
        return None
    return {s: {lg: k for lg in long} for s in short}


def twist_violation(
    chips: Sequence[int], block_shape: Sequence[int], wrap: Sequence[bool]
) -> str | None:
    """Why a slice of `chips` cannot be twisted on blocks of `block_shape`, or None."""
    if skews(chips) is None:
        shape = "x".join(map(str, chips))
        return f"{shape} cannot be twisted: {TWIST_RULE}"
    k = min(chips)
    if len(block_shape) != 3 or any(e % b for e, b in zip(chips, block_shape, strict=True)):
        return (
            f"k = {k} must be a multiple of the block's edge "
            f"({'x'.join(map(str, block_shape))} blocks): the twist is made of whole blocks"
        )
    if not all(wrap):
        return "a twisted torus wraps in every dimension: leave wrap empty or all true"
    return None


def neighbours(
    coords: Sequence[int], shape: Sequence[int], twist: Skews | None
) -> Iterator[tuple[int, ...]]:
    """The six neighbours of a point of a torus of `shape` (twisted by `twist`, if given)."""
    for d in range(len(shape)):
        for step in (1, -1):
            n = list(coords)
            n[d] += step
            if not 0 <= n[d] < shape[d]:
                n[d] %= shape[d]
                for e, shift in (twist or {}).get(d, {}).items():
                    n[e] = (n[e] + step * shift) % shape[e]
            yield tuple(n)
