"""Twisted tori (issue 28): the wiring, its checks, and the chip graph the switches really hold.

The chip-graph tests wire twisted slices through the real ocs_manager driving a
real switch agent (the open southbound), read back what every switch holds, and
build the graph of chips from it alone: the electrical links inside a block,
and for each cross-connect on the OCS of (d, a) the chip of the second-end
block at the last coordinate along d joined to the chip of the first-end block
at coordinate 0 along d (other coordinates: the logical axis' segment). That
graph must be, edge for edge, the twisted torus `lightpath.domain.twist` builds
independently, with its diameter and average distance, both below the regular
torus of the same shape.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import AsyncIterator, Sequence
from fractions import Fraction

import grpc
import pytest
import redis.asyncio as aioredis

from lightpath.client import channel
from lightpath.domain import twist
from lightpath.domain.torus import FIRST, SECOND, Fabric, FabricConfig
from lightpath.errors import InvalidArgument
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc, optical_switch_pb2_grpc
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath_services.common.keys import pod_key
from lightpath_services.ocs_manager.invariants import StoredSlice, check
from lightpath_services.ocs_manager.wiring import (
    Link,
    SlicePlacement,
    cross_connect_count,
    links,
    replace_block,
    validate_placement,
)
from tests.helpers import serve
from tests.ocs_manager.conftest import POD, ocs_stub, rpc_error, wire_request
from tests.ocs_manager.model import placement, state_of

C = grpc.StatusCode
X, Y, Z = 0, 1, 2
BLOCK = (4, 4, 4)
COUNTS = pb.WIRING_VIEW_COUNTS

Chip = tuple[int, ...]


def pod(k: int = 1, n: int = 64, block=BLOCK) -> Fabric:
    return Fabric.build(FabricConfig(tuple(block), n, k, 2 * n + 8))


def positions(grid: Sequence[int]) -> list[tuple[int, ...]]:
    """Grid positions in row-major order, x fastest (the order of SlicePlacement.blocks)."""
    return [tuple(reversed(c)) for c in itertools.product(*(range(e) for e in reversed(grid)))]


def twistable_grids(max_blocks: int) -> list[tuple[int, ...]]:
    out: set[tuple[int, ...]] = set()
    for k in range(1, max_blocks):
        for shape in ((k, k, 2 * k), (k, 2 * k, 2 * k)):
            if math.prod(shape) <= max_blocks:
                out.update(itertools.permutations(shape))
    return sorted(out)


# -- links() of a twisted placement ------------------------------------------------------


def test_twisted_4x4x8_replaces_the_self_loops_of_its_short_dimensions():
    """The worked example of docs/ocs_manager.md: 4x4x8 chips = 1x1x2 blocks."""
    f = pod()
    regular = placement(f, "r", (1, 1, 2), [7, 9])
    twisted = SlicePlacement("t", (1, 1, 2), (7, 9), (True,) * 3, twisted=True)
    assert links(regular) == (
        Link(X, 7, 7),
        Link(X, 9, 9),
        Link(Y, 7, 7),
        Link(Y, 9, 9),
        Link(Z, 7, 9),
        Link(Z, 9, 7),
    )
    # leaving x or y through the wraparound also moves k = 4 chips = 1 block along z
    assert links(twisted) == (
        Link(X, 7, 9),
        Link(X, 9, 7),
        Link(Y, 7, 9),
        Link(Y, 9, 7),
        Link(Z, 7, 9),
        Link(Z, 9, 7),
    )
    changed = set(links(twisted)) - set(links(regular))
    assert len(changed) == 4 and cross_connect_count(f, changed) == 64
    assert cross_connect_count(f, links(twisted)) == cross_connect_count(f, links(regular)) == 96
    assert check(f, state_of(f, twisted)) == []


@pytest.mark.parametrize("grid", twistable_grids(64))
def test_twisted_links_are_the_twisted_torus_of_the_blocks(grid):
    """For every twistable grid a 64-block pod can hold (any axis order): each block has
    one outgoing and one incoming link per dimension, and the link along d from
    position p goes to p's +1 neighbour along d in the twisted torus of the grid."""
    n = math.prod(grid)
    blocks = tuple(range(10, 10 + n))  # block ids unlike positions
    p = SlicePlacement("t", grid, blocks, (True,) * 3, twisted=True)
    got = links(p)
    for d in range(3):
        along = [lk for lk in got if lk.dim == d]
        assert sorted(lk.src for lk in along) == sorted(blocks)
        assert sorted(lk.dst for lk in along) == sorted(blocks)
    skews = twist.skews(grid)
    want = set()
    for i, pos in enumerate(positions(grid)):
        for d, nb in enumerate(list(twist.neighbours(pos, grid, skews))[::2]):  # the +1 steps
            want.add(Link(d, blocks[i], blocks[p.index_of(nb)]))
    assert set(got) == want and len(got) == 3 * n
    assert check(pod(), state_of(pod(), p)) == []


def test_spec_keeps_the_twist_and_reads_specs_stored_before_it():
    p = SlicePlacement("j", (1, 1, 2), (3, 4), (True,) * 3, twisted=True)
    assert json.loads(p.spec())["twisted"] == 1
    assert SlicePlacement.from_spec("j", p.spec()) == p
    plain = SlicePlacement("j", (1, 1, 2), (3, 4), (True,) * 3)
    old = '{"grid":[1,1,2],"blocks":[3,4],"wrap":[1,1,1]}'  # as stored before issue 28
    assert plain.spec() == old
    assert SlicePlacement.from_spec("j", old) == plain and not plain.twisted
    assert p.with_block(1, 5).twisted


def test_a_replacement_keeps_the_twist():
    f = pod(k=2)
    grid = (2, 2, 4)
    p = SlicePlacement("t", grid, tuple(range(16)), (True,) * 3, twisted=True)
    rep = replace_block(f, p, failed=5, new=40)
    assert rep.after.twisted and rep.after.blocks[5] == 40
    assert set(links(rep.after)) == set(rep.untouched) | set(rep.change.connect)
    assert set(links(p)) == set(rep.untouched) | set(rep.change.disconnect)
    assert all(5 in (lk.src, lk.dst) for lk in rep.change.disconnect)
    assert len(rep.change.connect) == 6  # in and out along each dimension
    assert check(f, state_of(f, rep.after)) == []


# -- bad input ---------------------------------------------------------------------------


def refusal(f: Fabric, grid, wrap=(), blocks=None) -> dict[str, str]:
    blocks = blocks if blocks is not None else range(math.prod(grid))
    with pytest.raises(InvalidArgument) as err:
        validate_placement(
            f, "t", list(grid), list(zip(positions(grid), blocks, strict=True)), wrap, True
        )
    return {v.field: v.rule for v in err.value.violations}


def test_a_grid_that_cannot_be_twisted_is_refused_naming_twisted():
    f = pod()
    for grid in ((2, 2, 2), (1, 1, 3), (1, 2, 4), (4, 4, 4)):
        why = refusal(f, grid)["twisted"]
        assert "cannot be twisted" in why and "k x k x 2k" in why, why
    why = refusal(f, (2, 2, 4), wrap=(True, False, True))["twisted"]
    assert "wraps in every dimension" in why
    # 2x2x4 blocks of 2x2x4 chips are 4x4x16 chips: not k x k x 2k in chips
    why = refusal(pod(block=(2, 2, 4)), (2, 2, 4))["twisted"]
    assert "4x4x16 chips" in why and "whole blocks" in why
    # a bad placement is named as well as the twist
    assert {"twisted", "blocks[1].block_id"} <= set(refusal(f, (2, 2, 2), blocks=[1] * 8))


def test_twisted_placements_are_accepted_in_any_axis_order():
    f = pod()
    for grid in twistable_grids(64):
        p = validate_placement(
            f,
            "t",
            list(grid),
            list(zip(positions(grid), range(math.prod(grid)), strict=True)),
            [],
            True,
        )
        assert p.twisted and p.wrap == (True, True, True)


# -- invariants (OCS-6) -------------------------------------------------------------------


def test_check_tells_a_twisted_wiring_from_a_regular_one():
    f = pod(k=2)
    twisted = SlicePlacement("t", (1, 2, 2), (3, 8, 5, 1), (True,) * 3, twisted=True)
    regular = SlicePlacement("t", (1, 2, 2), (3, 8, 5, 1), (True,) * 3)
    assert check(f, state_of(f, twisted)) == []
    for wired, recorded in ((regular, twisted), (twisted, regular)):
        state = state_of(f, wired)
        state.slices["t"] = StoredSlice(recorded, wired=True)
        violations = check(f, state)
        assert violations and {v.rule for v in violations} == {"SLICE_WIRING_MISMATCH"}


# -- through the service ------------------------------------------------------------------


async def test_wire_twisted_is_stored_listed_and_kept_across_a_restart(redis_url):
    async with ocs_stub(redis_url) as ocs:
        w = await ocs.WireSlice(wire_request("tw", [1, 1, 2], [7, 9], twisted=True))
        assert w.twisted and w.cross_connect_count == 96
        x = {(c.a.block_id, c.b.block_id) for c in w.cross_connects if c.a.dim == X}
        assert x == {(7, 9), (9, 7)}  # no self-loop: the x wraparound moves a block along z
        again = await ocs.WireSlice(wire_request("tw", [1, 1, 2], [7, 9], twisted=True))
        assert again.replayed and again.twisted
        err = await rpc_error(ocs.WireSlice(wire_request("tw", [1, 1, 2], [7, 9])))
        assert err.code == C.FAILED_PRECONDITION and err.reason == "SLICE_EXISTS"
        await ocs.WireSlice(wire_request("plain", [1, 1, 2], [1, 2], view=COUNTS))
    async with ocs_stub(redis_url) as ocs:  # a restarted manager reads the twist back
        listed = await ocs.ListSlices(pb.ListSlicesRequest())
        assert [(s.job_id, s.twisted, s.cross_connects) for s in listed.slices] == [
            ("plain", False, 96),
            ("tw", True, 96),
        ]
        got = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="tw"))
        assert got.twisted and {(c.ocs_id, c.port_a, c.port_b) for c in got.cross_connects} == {
            (c.ocs_id, c.port_a, c.port_b) for c in w.cross_connects
        }
        report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
        assert report.ok and report.slices_checked == 2
        rel = await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="tw"))
        assert rel.cross_connects_removed == 96
        assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))).ok


async def test_wire_refuses_a_twist_the_grid_or_wrap_does_not_allow(ocs):
    cases = {
        "cube": wire_request("j", [2, 2, 2], list(range(8)), twisted=True),
        "open": wire_request("j", [1, 1, 2], [1, 2], wrap=[True, True, False], twisted=True),
        "flat": wire_request("j", [1, 2, 4], list(range(8)), twisted=True),
    }
    for name, req in cases.items():
        err = await rpc_error(ocs.WireSlice(req))
        assert err.code == C.INVALID_ARGUMENT, name
        fields = dict(err.field_violations)
        assert "twisted" in fields, (name, err.field_violations)
        assert "cannot be twisted" in fields["twisted"] or "wraps" in fields["twisted"]
    assert (await ocs.ListSlices(pb.ListSlicesRequest())).slices == []


async def test_check_invariants_reports_a_twist_the_tables_do_not_have(ocs, redis_url):
    """The stored slice says twisted and the tables hold the regular torus, or the reverse:
    SLICE_WIRING_MISMATCH."""
    await ocs.WireSlice(wire_request("tw", [1, 1, 2], [7, 9], twisted=True))
    await ocs.WireSlice(wire_request("rg", [1, 1, 2], [3, 4]))
    assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest())).ok
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as r:
        # (slice, twist recorded instead, a link its recorded wiring lacks on the tables)
        for job, twisted, lacks in (("tw", False, "block 7 -> 7"), ("rg", True, "block 3 -> 4")):
            key = pod_key(POD, "ocs", "slice", job)
            stored = await r.hget(key, "spec")
            spec = json.loads(stored)
            spec.pop("twisted", None)
            if twisted:
                spec["twisted"] = 1
            await r.hset(key, "spec", json.dumps(spec, separators=(",", ":")))
            report = await ocs.CheckInvariants(pb.CheckInvariantsRequest())
            assert not report.ok and {v.rule for v in report.violations} == {
                "SLICE_WIRING_MISMATCH"
            }
            assert any(lacks in v.detail for v in report.violations), job
            await r.hset(key, "spec", stored)
            assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest())).ok


# -- the chip graph the switches hold -------------------------------------------------


def agent_env(k: int) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": POD,
        "LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x4x4",
        "LIGHTPATH_FABRIC_BLOCKS": "64",
        "LIGHTPATH_FABRIC_OCS_PER_AXIS": str(k),
        "LIGHTPATH_FABRIC_OCS_RADIX": "136",
        "LIGHTPATH_AGENT_SETTLE_MS": "0",
    }


@contextlib.asynccontextmanager
async def pod_behind_agent(
    redis_url: str, k: int
) -> AsyncIterator[
    tuple[ocs_manager_pb2_grpc.OcsManagerStub, optical_switch_pb2_grpc.OpticalSwitchStub]
]:
    """A switch agent serving every switch of a 64-block pod, and the ocs_manager driving it:
    (manager stub, the agent's southbound stub as the operator, who may read it)."""
    env = agent_env(k)
    async with (
        serve("switch_agent", redis_url, env) as agent,
        serve(
            "ocs_manager",
            redis_url,
            {
                **env,
                "LIGHTPATH_OCS_SWITCH_AGENTS": agent.address,
                "LIGHTPATH_OCS_RECONCILE_S": "0.2",
            },
        ) as manager,
        channel(manager.address, max_attempts=1) as mch,
        channel(agent.address, max_attempts=1) as ach,
    ):
        yield (
            ocs_manager_pb2_grpc.OcsManagerStub(mch),
            optical_switch_pb2_grpc.OpticalSwitchStub(ach),
        )


async def switch_tables(
    switches: optical_switch_pb2_grpc.OpticalSwitchStub, f: Fabric
) -> tuple[dict[int, list[tuple[int, int]]], dict[int, dict[int, int]]]:
    """What the switches hold: per OCS index its cross-connects, per block its 1xK outputs."""
    tables = {}
    for i, sid in enumerate(f.ocs_ids):
        state = await switches.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=sid))
        tables[i] = [(p.port_a, p.port_b) for p in state.cross_connects]
    banks: dict[int, dict[int, int]] = {}
    if f.k > 1:
        for b in range(f.block_count):
            state = await switches.GetCrossConnects(
                sb.GetCrossConnectsRequest(switch_id=f"otm-{b}")
            )
            banks[b] = {o.input: o.output for o in state.outputs if o.HasField("output")}
    return tables, banks


def chip_graph(
    f: Fabric, tables: dict[int, list[tuple[int, int]]], banks: dict[int, dict[int, int]]
) -> dict[tuple[int, Chip], list[tuple[int, Chip]]]:
    """Chips (block, coordinates inside it) -> neighbours, a multigraph: electrical links
    inside every block, and one link per lit cross-connect."""
    shape = f.config.block_shape
    adj: dict[tuple[int, Chip], list[tuple[int, Chip]]] = {}
    for b in range(f.block_count):
        for c in itertools.product(*(range(e) for e in shape)):
            adj[(b, c)] = []
            for d in range(len(shape)):
                for step in (1, -1):
                    n = list(c)
                    n[d] += step
                    if 0 <= n[d] < shape[d]:
                        adj[(b, c)].append((b, tuple(n)))
    for ocs, pairs in tables.items():
        d, a, k = f.ocs_of_index(ocs)
        others = list(f.segment_coords(d, a))
        for pa, pb_ in pairs:
            ends = [f.segment_at(k, pa), f.segment_at(k, pb_)]
            assert None not in ends, (f.ocs_ids[ocs], pa, pb_)
            by_end = {end: block for block, end in ends}  # type: ignore[misc]
            assert set(by_end) == {FIRST, SECOND}, (f.ocs_ids[ocs], pa, pb_)
            p, q = by_end[SECOND], by_end[FIRST]
            if f.k > 1:  # light reaches this OCS only if P's 1xK switch of (d, a) points at it
                assert banks[p].get(f.axis_offset[d] + a) == k, (p, d, a, k)
            last = tuple([*others[:d], shape[d] - 1, *others[d:]])
            first = tuple([*others[:d], 0, *others[d:]])
            adj[(p, last)].append((q, first))
            adj[(q, first)].append((p, last))
    return adj


def slice_graph(
    adj: dict[tuple[int, Chip], list[tuple[int, Chip]]], wiring: pb.SliceWiring
) -> dict[Chip, list[Chip]]:
    """The chips of one slice in slice coordinates (block position x block shape + the
    chip's place inside its block); fails if a chip of the slice links outside it."""
    shape = BLOCK
    where = {b.block_id: tuple(b.position.coords) for b in wiring.blocks}

    def coords(chip: tuple[int, Chip]) -> Chip:
        b, c = chip
        assert b in where, f"a chip of slice {wiring.job_id} links to block {b}, outside it"
        return tuple(p * e + x for p, e, x in zip(where[b], shape, c, strict=True))

    return {coords(ch): [coords(n) for n in ns] for ch, ns in adj.items() if ch[0] in where}


def torus(shape: Sequence[int], skews: twist.Skews | None) -> dict[Chip, list[Chip]]:
    """The (twisted) torus of `shape` in chips, from lightpath.domain.twist alone."""
    return {
        c: list(twist.neighbours(c, shape, skews))
        for c in itertools.product(*(range(e) for e in shape))
    }


def edges(graph: dict[Chip, list[Chip]]) -> set[frozenset[Chip]]:
    return {frozenset((a, b)) for a, ns in graph.items() for b in ns}


def distances(graph: dict[Chip, list[Chip]]) -> tuple[int, Fraction]:
    """(diameter, average distance over ordered pairs of distinct chips), by breadth-first
    search from every chip at once: after step t, reach[v] is the set (a bitmask) of the
    chips within t hops of v."""
    index = {c: i for i, c in enumerate(graph)}
    nbrs = [[index[n] for n in graph[c]] for c in graph]
    reach = [1 << i for i in range(len(graph))]
    total, step, seen = 0, 0, len(graph)
    full = len(graph) * len(graph)
    while seen < full:
        step += 1
        grown = []
        for v, ns in enumerate(nbrs):
            r = reach[v]
            for u in ns:
                r |= reach[u]
            grown.append(r)
        now = sum(r.bit_count() for r in grown)
        assert now > seen, "the graph is not connected"
        total += step * (now - seen)
        seen, reach = now, grown
    n = len(graph)
    return step, Fraction(total, n * (n - 1))


def assert_twisted_torus(graph: dict[Chip, list[Chip]], chips: Sequence[int]) -> None:
    for c, ns in graph.items():
        assert len(ns) == 6 and len(set(ns)) == 6 and c not in ns, (c, ns)
    twisted = torus(chips, twist.skews(chips))
    assert edges(graph) == edges(twisted)
    got = distances(graph)
    assert got == distances(twisted)
    regular = distances(torus(chips, None))
    assert got[0] < regular[0] and got[1] < regular[1], (got, regular)


SLICES = {  # job: (chips, grid of blocks, blocks in position order)
    "t8x8x16": ((8, 8, 16), (2, 2, 4), [40 + i for i in range(16)]),
    "t4x8x8": ((4, 8, 8), (1, 2, 2), [3, 17, 9, 30]),
    "t4x4x8": ((4, 4, 8), (1, 1, 2), [21, 2]),
}


async def assert_switches_hold_twisted_tori(ocs, switches, f: Fabric) -> None:
    adj = chip_graph(f, *await switch_tables(switches, f))
    for job, (chips, _, _) in SLICES.items():
        wiring = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id=job, view=COUNTS))
        assert wiring.twisted
        assert_twisted_torus(slice_graph(adj, wiring), chips)
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    assert report.ok, list(report.violations)


@pytest.mark.parametrize("k", [1, 2])
async def test_the_switches_hold_twisted_tori_and_a_swap_keeps_the_twist(redis_url, k):
    f = pod(k=k)
    async with pod_behind_agent(redis_url, k) as (ocs, switches):
        for job, (_, grid, blocks) in SLICES.items():
            await ocs.WireSlice(wire_request(job, list(grid), blocks, twisted=True, view=COUNTS))
        await assert_switches_hold_twisted_tori(ocs, switches, f)
        # a failed block of each slice swapped for a free one
        for job, new in (("t8x8x16", 60), ("t4x8x8", 61), ("t4x4x8", 62)):
            failed = SLICES[job][2][1]
            rep = await ocs.ReplaceBlock(
                pb.ReplaceBlockRequest(
                    job_id=job, failed_block_id=failed, new_block_id=new, view=COUNTS
                )
            )
            assert rep.wiring.twisted and rep.untouched + len(rep.added) == (
                rep.wiring.cross_connect_count
            )
        await assert_switches_hold_twisted_tori(ocs, switches, f)
