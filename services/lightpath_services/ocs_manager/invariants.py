"""The OCS-6 invariants, checked over a snapshot of the stored state. Pure.

Used by the CheckInvariants RPC and by the tests (property tests, the
several-replicas concurrency test). Rules (InvariantViolation.rule):

* PORT_IN_TWO_CROSS_CONNECTS  a port is in more than one cross-connect (the
  table is not a symmetric pairing), or is cross-connected to itself
* AXIS_MISMATCH               a cross-connect port is not cabled to a segment
  of that OCS's (dimension, logical axis), or joins two first / two second ends
* SLICES_JOINED               a cross-connect joins blocks of two slices (¶115)
* ONE_TO_MANY_DISAGREES       a 1xK setting without its cross-connect, or a
  second end cross-connected on an OCS its 1xK switch does not point at
* UNWIRED_BLOCK_CONNECTED     a block of no slice (free or failed) has a
  cross-connect or a 1xK setting
* SLICE_WIRING_MISMATCH       a wired slice's cross-connects / 1xK settings are
  not exactly its OCS-2 wiring (half-wired, or stray)
* OWNER_MISMATCH              block claims and slice placements disagree
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lightpath.domain.torus import SECOND, Fabric, dim_name
from lightpath_services.ocs_manager.wiring import SlicePlacement, cross_connects, links

MAX_VIOLATIONS = 200

# Every rule a check of this pod kind can report (CheckInvariants with compare_switches
# adds SWITCH_STATE_DISAGREES). OcsMetrics exports each at 0 from the start, so an alert's
# increase() sees the first failure (tests/ocs_manager/test_metrics.py checks the list).
RULES: tuple[str, ...] = (
    "PORT_IN_TWO_CROSS_CONNECTS",
    "AXIS_MISMATCH",
    "SLICES_JOINED",
    "ONE_TO_MANY_DISAGREES",
    "UNWIRED_BLOCK_CONNECTED",
    "SLICE_WIRING_MISMATCH",
    "OWNER_MISMATCH",
    "SWITCH_STATE_DISAGREES",
)


@dataclass(frozen=True)
class StoredSlice:
    placement: SlicePlacement
    wired: bool  # False while its first wiring is in flight (nothing committed yet)
    reserved: tuple[int, ...] = ()  # blocks claimed by a change in flight (a replacement)
    changing: bool = False  # a wire / replace / release is in flight (switches may differ)


@dataclass
class FabricState:
    """The manager's committed state: OCS tables, 1xK settings, claims, slices."""

    tables: dict[int, dict[int, int]] = field(default_factory=dict)  # OCS -> port -> peer
    one_to_many: dict[int, int] = field(default_factory=dict)  # 1xK index -> output
    owners: dict[int, str] = field(default_factory=dict)  # block -> job
    slices: dict[str, StoredSlice] = field(default_factory=dict)

    @property
    def cross_connect_count(self) -> int:
        return sum(len(t) for t in self.tables.values()) // 2


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str


def _ocs_name(fabric: Fabric, ocs: int) -> str:
    return fabric.ocs_ids[ocs]


def check(fabric: Fabric, state: FabricState) -> list[Violation]:
    """Every OCS-6 violation in `state` (at most MAX_VIOLATIONS), empty when all hold."""
    out: list[Violation] = []

    def bad(rule: str, detail: str) -> None:
        if len(out) < MAX_VIOLATIONS:
            out.append(Violation(rule, detail))

    # cross-connects as (ocs, second-end port, first-end port) -> (P, Q)
    seen: dict[tuple[int, int, int], tuple[int, int]] = {}
    for ocs, table in state.tables.items():
        d, a, k = fabric.ocs_of_index(ocs)
        name = _ocs_name(fabric, ocs)
        for p, q in table.items():
            if p == q:
                bad("PORT_IN_TWO_CROSS_CONNECTS", f"{name} port {p} is cross-connected to itself")
                continue
            if table.get(q) != p:
                bad(
                    "PORT_IN_TWO_CROSS_CONNECTS",
                    f"{name}: port {p} -> {q} but port {q} -> {table.get(q)}",
                )
                continue
            if p > q:
                continue  # each pair once
            end_p, end_q = fabric.segment_at(k, p), fabric.segment_at(k, q)
            if end_p is None or end_q is None:
                dark = p if end_p is None else q
                bad(
                    "AXIS_MISMATCH",
                    f"{name} port {dark} is not cabled to a segment of ({dim_name(d)}, {a})",
                )
                continue
            (b1, e1), (b2, e2) = end_p, end_q
            if e1 == e2:
                bad("AXIS_MISMATCH", f"{name} ports {p}, {q} join two ends of the same kind")
                continue
            (sp, src), (fp, dst) = ((p, b1), (q, b2)) if e1 == SECOND else ((q, b2), (p, b1))
            seen[(ocs, sp, fp)] = (src, dst)
            o1, o2 = state.owners.get(src), state.owners.get(dst)
            if o1 is None or o2 is None:
                free = src if o1 is None else dst
                bad(
                    "UNWIRED_BLOCK_CONNECTED",
                    f"{name} ports {p}-{q}: block {free} belongs to no slice",
                )
            elif o1 != o2:
                bad(
                    "SLICES_JOINED",
                    f"{name} ports {p}-{q} join block {src} ({o1}) and block {dst} ({o2})",
                )
            if fabric.k > 1:
                setting = state.one_to_many.get(fabric.one_to_many_index(src, d, a))
                if setting != k:
                    bad(
                        "ONE_TO_MANY_DISAGREES",
                        f"{fabric.one_to_many_id(src, d, a)} is at {setting} but its second end "
                        f"is cross-connected on {name}",
                    )

    for index, output in state.one_to_many.items():
        block, d, a = fabric.one_to_many_of_index(index)
        sid = fabric.one_to_many_id(block, d, a)
        if block not in state.owners:
            bad("UNWIRED_BLOCK_CONNECTED", f"{sid} is set but block {block} belongs to no slice")
        if not 0 <= output < fabric.k:
            bad("ONE_TO_MANY_DISAGREES", f"{sid} is at output {output}; K={fabric.k}")
            continue
        ocs = fabric.ocs_index(d, a, output)
        port = fabric.second_port(block, output)
        if state.tables.get(ocs, {}).get(port) is None:
            bad(
                "ONE_TO_MANY_DISAGREES",
                f"{sid} points at {_ocs_name(fabric, ocs)} where port {port} is not cross-connected",
            )

    _check_slices(fabric, state, seen, bad)
    return out


def _check_slices(fabric: Fabric, state: FabricState, seen: Mapping, bad) -> None:
    expected_owner: dict[int, str] = {}
    expected_xc: dict[tuple[int, int, int], tuple[int, int]] = {}
    expected_otm: dict[int, int] = {}
    for job, s in state.slices.items():
        for b in (*s.placement.blocks, *s.reserved):
            if b in expected_owner:
                bad("OWNER_MISMATCH", f"block {b} is in slices {expected_owner[b]} and {job}")
            expected_owner[b] = job
        if not s.wired:
            continue
        wiring = links(s.placement)
        for xc in cross_connects(fabric, wiring):
            expected_xc[(xc.ocs, xc.port_a, xc.port_b)] = (xc.src, xc.dst)
        if fabric.k > 1:
            for lk in wiring:
                for a in range(fabric.axes[lk.dim]):
                    expected_otm[fabric.one_to_many_index(lk.src, lk.dim, a)] = fabric.first_ocs(
                        lk.dst
                    )
    for b, job in state.owners.items():
        if expected_owner.get(b) != job:
            bad(
                "OWNER_MISMATCH",
                f"block {b} is claimed by {job} but is in the placement of "
                f"{expected_owner.get(b) or 'no slice'}",
            )
    for b, job in expected_owner.items():
        if b not in state.owners:
            bad("OWNER_MISMATCH", f"block {b} of slice {job} is not claimed")
    missing = [key for key in expected_xc if key not in seen]
    stray = [key for key in seen if key not in expected_xc]
    for ocs, pa, pb in missing[:20]:
        src, dst = expected_xc[(ocs, pa, pb)]
        bad(
            "SLICE_WIRING_MISMATCH",
            f"{_ocs_name(fabric, ocs)} lacks {pa}-{pb} (block {src} -> {dst} of "
            f"{state.owners.get(src, '?')})",
        )
    for ocs, pa, pb in stray[:20]:
        bad("SLICE_WIRING_MISMATCH", f"{_ocs_name(fabric, ocs)} {pa}-{pb} is in no slice's wiring")
    for index, output in expected_otm.items():
        if state.one_to_many.get(index) != output:
            block, d, a = fabric.one_to_many_of_index(index)
            bad(
                "SLICE_WIRING_MISMATCH",
                f"{fabric.one_to_many_id(block, d, a)} should be at output {output}, "
                f"is at {state.one_to_many.get(index)}",
            )
    for index in state.one_to_many:
        if index not in expected_otm:
            block, d, a = fabric.one_to_many_of_index(index)
            bad(
                "SLICE_WIRING_MISMATCH", f"{fabric.one_to_many_id(block, d, a)} is set for no slice"
            )
