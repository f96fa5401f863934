"""Hypothesis properties of the fabric manager on a real Redis, 64-block pod (OCS-2 … OCS-6):

* any sequence of wire / release / replace keeps every OCS-6 invariant, and the
  switches (the driver's state) always equal the committed tables;
* wire then release returns every table and 1xK switch to its prior state;
* replace changes only the cross-connects that touched the replaced block;
* a refused request changes nothing.

Plus the same invariants on the pure domain over random placements (many more examples).
"""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.errors import FailedPrecondition
from lightpath_services.common.redis_store import connect
from lightpath_services.ocs_manager.driver import RedisSwitchDriver
from lightpath_services.ocs_manager.invariants import FabricState, check
from lightpath_services.ocs_manager.manager import FabricManager
from lightpath_services.ocs_manager.store import OcsStore
from lightpath_services.ocs_manager.wiring import cross_connects, links, replace_block
from tests.ocs_manager.model import placement, state_of

SHAPES = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (2, 2, 2), (4, 2, 1), (4, 4, 4)]

wraps = st.tuples(st.booleans(), st.booleans(), st.booleans())
ops = st.one_of(
    st.tuples(st.just("wire"), st.sampled_from(SHAPES[:-1]), wraps, st.integers(0, 2**16)),
    st.tuples(st.just("wire_release"), st.sampled_from(SHAPES), wraps, st.integers(0, 2**16)),
    st.tuples(st.just("release"), st.integers(0, 2**16)),
    st.tuples(st.just("replace"), st.integers(0, 2**16)),
    st.tuples(st.just("conflict"), st.integers(0, 2**16)),
)


def xcs(state: FabricState) -> set[tuple[int, int, int]]:
    return {(o, min(p, q), max(p, q)) for o, t in state.tables.items() for p, q in t.items()}


def content(state: FabricState):
    return state.tables, state.one_to_many, state.owners, set(state.slices)


async def run_sequence(redis_url: str, k: int, sequence) -> None:
    fabric = Fabric.build(FabricConfig((4, 4, 4), 64, k, 136))
    r = connect(redis_url)
    await r.flushall()
    try:
        store = OcsStore(r, "pod-p", fabric)
        await store.ensure_fabric()
        driver = RedisSwitchDriver(r, "pod-p", fabric)
        await driver.init()
        m = FabricManager(fabric, store, driver)
        wired: dict[str, tuple[int, ...]] = {}
        n = 0

        def free() -> list[int]:
            used = {b for blocks in wired.values() for b in blocks}
            return [b for b in range(64) if b not in used]

        async def checked() -> FabricState:
            state = await store.snapshot()
            assert check(fabric, state) == []
            dev = await driver.read()
            assert dev.tables == state.tables and dev.one_to_many == state.one_to_many
            return state

        for op in sequence:
            before = await checked()
            kind, rng = op[0], random.Random(op[-1])
            event(kind)
            if kind in ("wire", "wire_release"):
                shape, wrap = op[1], op[2]
                avail = free()
                if len(avail) < math.prod(shape):
                    continue
                n += 1
                p = placement(fabric, f"j{n}", shape, rng.sample(avail, math.prod(shape)), wrap)
                out = await m.wire(p)
                assert not out.replayed and out.record.placement == p
                wired[p.job_id] = p.blocks
                if kind == "wire_release":
                    await m.release(p.job_id)
                    del wired[p.job_id]
                    after = await checked()
                    assert content(after) == content(before)  # every table as it was
            elif kind == "release" and wired:
                job = rng.choice(sorted(wired))
                await m.release(job)
                del wired[job]
            elif kind == "replace" and wired and free():
                job = rng.choice(sorted(wired))
                failed, new = rng.choice(wired[job]), rng.choice(free())
                rec = await store.get_slice(job)
                assert rec is not None
                expected = replace_block(fabric, rec.placement, failed, new)
                await m.replace(job, failed, new)
                wired[job] = expected.after.blocks
                after = await checked()
                removed, added = xcs(before) - xcs(after), xcs(after) - xcs(before)
                touched_old = {
                    (x.ocs, min(x.port_a, x.port_b), max(x.port_a, x.port_b))
                    for x in cross_connects(fabric, links(rec.placement))
                    if failed in (x.src, x.dst)
                }
                assert removed == touched_old  # only the failed block's cross-connects moved
                for x in cross_connects(fabric, links(expected.after)):
                    key = (x.ocs, min(x.port_a, x.port_b), max(x.port_a, x.port_b))
                    assert (key in added) == (new in (x.src, x.dst))
            elif kind == "conflict" and wired:
                victim = rng.choice(sorted(wired))
                taken = rng.choice(wired[victim])
                p = placement(fabric, "intruder", (1, 1, 1), [taken])
                with pytest.raises(FailedPrecondition):
                    await m.wire(p)
                assert content(await checked()) == content(before)  # a refusal changes nothing
        await checked()
    finally:
        await r.aclose()


@settings(max_examples=30)
@given(k=st.sampled_from([1, 2, 3]), sequence=st.lists(ops, min_size=1, max_size=10))
def test_random_sequences_over_a_64_block_pod_keep_every_invariant(redis_url, k, sequence):
    asyncio.run(run_sequence(redis_url, k, sequence))


# -- the pure domain, many more examples -------------------------------------------------


@st.composite
def placements(draw):
    k = draw(st.sampled_from([1, 2, 3, 4]))
    fabric = Fabric.build(FabricConfig((4, 4, 4), 64, k, 136))
    shape = draw(st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)))
    blocks = draw(st.permutations(range(64)))[: math.prod(shape)]
    wrap = draw(wraps)
    return fabric, placement(fabric, "p", shape, blocks, wrap)


@settings(max_examples=200)
@given(placements(), st.data())
def test_any_placement_wires_validly_and_any_replacement_too(fp, data):
    fabric, p = fp
    wiring = links(p)
    # each block has at most one successor and one predecessor per dimension
    for d in range(3):
        srcs = [lk.src for lk in wiring if lk.dim == d]
        dsts = [lk.dst for lk in wiring if lk.dim == d]
        assert len(srcs) == len(set(srcs)) and len(dsts) == len(set(dsts))
        lines = len(p.blocks) // p.grid[d]  # lines of blocks along d
        assert len(srcs) == lines * (p.grid[d] if p.wrap[d] else p.grid[d] - 1)
    assert check(fabric, state_of(fabric, p)) == []
    free = [b for b in range(64) if b not in p.blocks]
    if free:
        failed = data.draw(st.sampled_from(p.blocks))
        new = data.draw(st.sampled_from(free))
        rep = replace_block(fabric, p, failed, new)
        assert check(fabric, state_of(fabric, rep.after)) == []
        assert set(rep.untouched) == set(links(p)) - set(rep.change.disconnect)
        assert set(links(rep.after)) == set(rep.untouched) | set(rep.change.connect)
