"""Invariants of a switched pod's stored reservations (SW-4), checked over a
snapshot: every ring closes and visits its axis line exactly once, every hop
is a path of real links in its direction, no channel is held by two rings,
and the pod's bitmaps agree with the stored plans."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lightpath.domain.switched import SwitchedFabric
from lightpath.domain.switched_rings import RingPlan, ring_members


@dataclass(frozen=True)
class Violation:
    rule: str
    detail: str


# Every rule a check of a switched pod can report; OcsMetrics exports each at 0 from the
# start (tests/ocs_manager/test_metrics.py checks the list against this module).
RULES: tuple[str, ...] = (
    "RING_SET_MISMATCH",
    "RING_NOT_HAMILTONIAN",
    "RING_NOT_CLOSED",
    "HOP_ENDS",
    "HOP_NOT_A_LINK",
    "HOP_LEAVES_JOB",
    "HOP_CROSSES_JOB",
    "CHANNEL_IN_TWO_RINGS",
    "CHANNEL_IN_TWO_JOBS",
    "PROCESSOR_IN_TWO_JOBS",
    "BITMAP_DISAGREES",
)


def ring_violations(
    fabric: SwitchedFabric, plan: RingPlan, forbidden: Iterable[int] = ()
) -> list[Violation]:
    out: list[Violation] = []
    bad = lambda rule, detail: out.append(Violation(rule, f"job {plan.job_id}: {detail}"))  # noqa: E731
    forbidden = set(forbidden)
    gs = fabric.group_size
    whole = {t.group for t in plan.tiles if t.size == gs}
    expected = {
        (axis, key): set(procs) for axis, key, procs in ring_members(plan.assignment, plan.degrees)
    }
    if {(r.axis, r.key) for r in plan.rings} != set(expected):
        bad("RING_SET_MISMATCH", "the rings are not one per line of each axis")
    for ring in plan.rings:
        procs = ring.processors
        n = len(procs)
        if len(set(procs)) != n or set(procs) != expected.get((ring.axis, ring.key), set()):
            bad(
                "RING_NOT_HAMILTONIAN",
                f"{ring.name} does not visit its line's processors exactly once",
            )
        if len(ring.hops) != n:
            bad("RING_NOT_CLOSED", f"{ring.name} has {len(ring.hops)} hops for {n} processors")
            continue
        for k, hop in enumerate(ring.hops):
            a, b = procs[k], procs[(k + 1) % n]
            if hop.nodes[0] != a or hop.nodes[-1] != b or len(hop.channels) != len(hop.nodes) - 1:
                bad("HOP_ENDS", f"{ring.name} hop {k} does not run from processor {k} to the next")
                continue
            for u, v, c in zip(hop.nodes[:-1], hop.nodes[1:], hop.channels, strict=True):
                if not 0 <= c < fabric.channel_count or fabric.channel_ends(c) != (u, v):
                    bad(
                        "HOP_NOT_A_LINK",
                        f"{ring.name} hop {k}: channel {c} does not run {u} -> {v}",
                    )
            for x in hop.nodes[1:-1]:
                if x < fabric.processor_count:
                    if x // gs not in (a // gs, b // gs) and x // gs not in whole:
                        bad(
                            "HOP_LEAVES_JOB",
                            f"{ring.name} hop {k} crosses group {fabric.group_name(x // gs)}",
                        )
                    if x in forbidden:
                        bad(
                            "HOP_CROSSES_JOB",
                            f"{ring.name} hop {k} crosses another job's processor",
                        )
    twice = [c for c, k in Counter(plan.channels()).items() if k > 1]
    if twice:
        bad(
            "CHANNEL_IN_TWO_RINGS",
            f"{len(twice)} channels twice (first {fabric.channel_name(twice[0])})",
        )
    return out


def pod_violations(
    fabric: SwitchedFabric,
    plans: Mapping[str, RingPlan],
    used: bytes | bytearray,
    procs: bytes | bytearray,
) -> list[Violation]:
    out: list[Violation] = []
    owner: dict[int, str] = {}
    proc_owner: dict[int, str] = {}
    for job, plan in sorted(plans.items()):
        groups = {t.group for t in plan.tiles}
        forbidden = {
            p
            for other, op in plans.items()
            if other != job
            for t in op.tiles
            if t.group in groups
            for p in t.processors(fabric)
        }
        out += ring_violations(fabric, plan, forbidden)
        for c in plan.channels():
            if c in owner and owner[c] != job:
                out.append(
                    Violation(
                        "CHANNEL_IN_TWO_JOBS", f"{fabric.channel_name(c)}: {owner[c]} and {job}"
                    )
                )
            owner[c] = job
        for t in plan.tiles:
            for p in t.processors(fabric):
                if p in proc_owner:
                    out.append(
                        Violation(
                            "PROCESSOR_IN_TWO_JOBS",
                            f"{fabric.node_name(p)}: {proc_owner[p]} and {job}",
                        )
                    )
                proc_owner[p] = job
    marked = {i for i, x in enumerate(used) if x}
    if marked != set(owner):
        out.append(
            Violation(
                "BITMAP_DISAGREES",
                f"{len(marked - set(owner))} channels marked without a ring, "
                f"{len(set(owner) - marked)} ring channels unmarked",
            )
        )
    if {i for i, x in enumerate(procs) if x} != set(proc_owner):
        out.append(
            Violation("BITMAP_DISAGREES", "the processor bitmap differs from the jobs' tiles")
        )
    return out
