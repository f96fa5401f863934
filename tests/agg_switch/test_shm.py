"""The shared-memory transport: buffers, their lifetimes, co-location checks,
and the same bits as the gRPC bytes path (real /dev/shm, real gRPC, real Redis)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightpath.aggregation import wire
from lightpath.aggregation.maths import DType, Fold, Op, OrderPolicy, Reduction
from lightpath.aggregation.node import ComputeNode, aggregate_all
from lightpath.aggregation.shm import SHM_DIR, Hello, ShmDomain, ShmError, sweep
from lightpath.client import channel
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import common_pb2
from lightpath_services.agg_switch.transport import Buffers
from tests.agg_switch.test_contract import (
    FIVE,
    expect_error,
    late_at,
    straggle,
    vectors,
    wait_for,
)
from tests.agg_switch.tree import agg_tree, node_credentials, patient_tree, stack_tree

SWITCHES = ("root", "sub-1", "sub-2")


@pytest.fixture
def domain():
    d = ShmDomain.create(idle_s=60.0)
    assert d is not None, "these tests need /dev/shm"
    yield d
    d.close()


def buffer_files(prefix: str) -> list[str]:
    """A domain's buffers in /dev/shm (not its .owner and .probe)."""
    return sorted(p.name for p in SHM_DIR.glob(f"{prefix}-*"))


def all_files(prefix: str) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{prefix}*"))


# -- ShmDomain ---------------------------------------------------------------------


def test_a_released_buffer_is_reused_a_discarded_one_is_gone(domain):
    a = domain.lease(10_000)
    name = a.segment.name
    a.array(100, np.dtype(np.float32))[:] = 7.0
    domain.release(a)
    assert (domain.leased, domain.pooled) == (0, 1)
    b = domain.lease(12_000)  # the same size class: the same buffer again
    assert b.segment.name == name
    view = np.frombuffer(domain.view(name, 0, 400), np.float32)
    assert view.tolist() == [7.0] * 100 and not view.flags.writeable
    domain.discard(b)
    assert not (SHM_DIR / name).exists() and domain.pooled == 0
    assert domain.lease(10_000).segment.name != name  # names never repeat


def test_idle_buffers_are_trimmed_and_close_removes_every_file(domain):
    lease = domain.lease(5000)
    domain.release(lease)
    held = domain.lease(70_000)
    domain.trim(now=lease.segment.last_used + 61.0)
    assert buffer_files(domain.prefix) == [held.segment.name]  # the leased one stays
    assert f"{domain.prefix}.owner" in all_files(domain.prefix)
    domain.close()
    assert all_files(domain.prefix) == []


def test_a_domain_dropped_without_close_removes_its_files():
    import gc

    d = ShmDomain.create()
    assert d is not None
    prefix = d.prefix
    d.lease(1 << 12)
    assert len(all_files(prefix)) == 3
    del d
    gc.collect()
    assert all_files(prefix) == []


def test_peers_verify_each_others_probe(domain):
    other = ShmDomain.create()
    assert other is not None
    try:
        assert domain.verify(other.hello()) and other.verify(domain.hello())
        good = other.hello()
        assert not domain.verify(Hello(good.host, good.probe, "00" * 16))
        assert not domain.verify(Hello("another-host/1", good.probe, good.token))
        assert not domain.verify(Hello(good.host, "../../etc/passwd", good.token))
        (SHM_DIR / good.probe).unlink()  # e.g. another container's /dev/shm
        assert not domain.verify(good)
    finally:
        other.close()


def test_views_are_checked(domain):
    lease = domain.lease(4096)
    for name, offset, nbytes in (
        ("../etc/passwd", 0, 8),
        ("lpagg-0123456789abcdef-99999", 0, 8),  # no such buffer
        (lease.segment.name, 4000, 200),  # out of range
    ):
        with pytest.raises(ShmError):
            domain.view(name, offset, nbytes)


def test_locate_finds_arrays_in_own_and_mapped_buffers(domain):
    lease = domain.lease(8 * 1000)
    arr = lease.array(1000, np.dtype(np.float64))
    seg, offset = domain.locate(arr[250:500])
    assert (seg.name, offset) == (lease.segment.name, 2000)
    assert domain.locate(np.zeros(10)) is None
    assert domain.locate(arr[::2]) is None  # not contiguous
    other = ShmDomain.create()
    assert other is not None
    try:
        mapped = np.frombuffer(other.view(lease.segment.name, 800, 800), np.float64)
        seg, offset = other.locate(mapped)
        assert (seg.name, offset) == (lease.segment.name, 800)
        assert other.lease_of(mapped) is None  # mapped, not ours
    finally:
        other.close()


def test_a_crashed_process_leaves_nothing_after_the_next_sweep(domain):
    """A process killed with SIGKILL cannot clean up: its owner lock is free, so
    the next domain to start (any switch or SDK node) unlinks its files."""
    script = textwrap.dedent(
        """
        import sys, time
        from lightpath.aggregation.shm import ShmDomain
        d = ShmDomain.create()
        d.lease(1 << 16); d.buffer(1 << 12)
        print(d.prefix, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        prefix = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert len(all_files(prefix)) == 4  # .owner, .probe, two buffers
        assert not any(f.startswith(prefix) for f in sweep())  # alive: kept
        assert len(all_files(prefix)) == 4
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        fresh = ShmDomain.create()  # a new domain sweeps as it starts
        assert fresh is not None
        fresh.close()
        assert all_files(prefix) == []
        assert all_files(domain.prefix)  # a live one is left alone
    finally:
        proc.kill()
        proc.wait(10)


# -- the arithmetic into provided buffers -------------------------------------------


@settings(max_examples=40)
@given(
    st.sampled_from([DType.FLOAT32, DType.FLOAT64, DType.INT64]),
    st.sampled_from([OrderPolicy.PRESET, OrderPolicy.EXACT, OrderPolicy.ARRIVAL]),
    st.integers(1, 6),
    st.integers(1, 300),
    st.integers(0, 2**32 - 1),
)
def test_partials_computed_into_given_buffers_have_the_same_bits(dtype, order, n, size, seed):
    """Where a partial is computed (numpy's memory or a shared buffer) never
    changes its bits (AG-8), including EXACT's conversions."""
    rng = np.random.default_rng(seed)
    r = Reduction(dtype, Op.SUM, order, participants=n)
    xs = [
        (rng.standard_normal(size) * 100).astype(dtype.numpy)
        if dtype.is_float
        else rng.integers(-1000, 1000, size)
        for _ in range(n)
    ]
    given_buffers: list[np.ndarray] = []

    def alloc(count: int, dt: np.dtype) -> np.ndarray:
        given_buffers.append(np.full(count, 99, dt))  # stale garbage must not leak in
        return given_buffers[-1]

    order_keys = [f"k{i}" for i in range(n)]
    outs = []
    for a in (None, alloc):
        fold = Fold(r, order_keys, incremental=False, alloc=a)
        for key, x in reversed(list(zip(order_keys, xs, strict=True))):
            fold.add(key, r.absorb(x, alloc=a))
        partial = fold.finish()
        assert partial is not None
        outs.append(r.finish(partial, a).tobytes())
    assert outs[0] == outs[1]
    if n > 1 or r.fixed_point:
        assert given_buffers  # the allocator was used


# -- Buffers: who may reuse what when ---------------------------------------------------


def test_a_result_buffer_returns_only_when_every_receiver_released_it(domain):
    b = Buffers(domain)
    result = b.alloc("c", 0, 1000, np.dtype(np.float32))  # a root's fold output
    result[:] = 1.0
    assert b.pin("c", 0, "sub-1", result, "") and b.pin("c", 0, "n9", result, "")
    b.chunk_passed("c", 0)  # the result went out: the chunk's own hold goes
    assert domain.leased == 1
    assert b.released("c", 0, "sub-1") is None and domain.leased == 1
    assert b.released("c", 0, "sub-1") is None  # twice counts once
    assert domain.leased == 1
    b.released("c", 0, "n9")
    assert (domain.leased, domain.pooled) == (0, 1)
    assert not b.complete("c")  # nothing left to wait for


def test_a_borrowed_result_is_released_upstream_after_its_last_reader(domain):
    root = ShmDomain.create()
    assert root is not None
    try:
        owned = root.lease(4000)
        view = np.frombuffer(domain.view(owned.segment.name, 0, 4000), np.float32)
        b = Buffers(domain)
        assert b.pin("c", 3, "n1", view, "root") and b.pin("c", 3, "n2", view, "root")
        assert not b.settled("c", 3)
        assert b.released("c", 3, "n1") is None
        assert b.released("c", 3, "n2") == "root"  # now tell the parent
        assert b.settled("c", 3)
        assert b.pin("c", 4, "n1", view, "root")
        assert b.receiver_gone("c", "n1") == [(4, "root")]
        assert not b.pin("c", 5, "n1", np.zeros(10, np.float32), "root")  # not shared: bytes
    finally:
        root.close()


def test_a_failed_command_unlinks_its_buffers_and_takes_no_new_ones(domain):
    b = Buffers(domain)
    partial = b.alloc("f", 0, 100, np.dtype(np.int64))
    partial[:] = 5
    result = b.alloc("f", 1, 100, np.dtype(np.int64))
    b.pin("f", 1, "n1", result, "")
    names = [s.name for s in (domain.locate(partial)[0], domain.locate(result)[0])]
    b.fail("f")
    assert domain.leased == domain.pooled == 0
    assert not any((SHM_DIR / n).exists() for n in names)
    assert partial.tolist() == [5] * 100  # a reader that mapped it still reads it
    late = b.alloc("f", 2, 10, np.dtype(np.int64))
    assert domain.locate(late) is None and not b.holds("f")


def test_leftovers_of_a_completed_command_are_dropped(domain):
    b = Buffers(domain)
    result = b.alloc("d", 0, 10, np.dtype(np.float64))
    b.pin("d", 0, "n1", result, "")
    b.chunk_passed("d", 0)
    assert b.complete("d")  # n1 never answered: the caller drops it later
    b.drop("d")
    assert domain.leased == domain.pooled == 0 and not b.holds("d")


# -- over real gRPC ------------------------------------------------------------------


async def counters(tree) -> dict[str, dict[str, int]]:
    return {s: dict((await tree.state(s)).counters) for s in SWITCHES}


async def prefixes(tree) -> dict[str, str]:
    out = {}
    for s in SWITCHES:
        info = await tree.stub(s).GetInfo(common_pb2.GetInfoRequest())
        out[s] = info.attributes["shm_prefix"]
    return out


SCENARIOS = {
    "on-time": {},
    "straggler": {"late": ("n4", "sub-2"), "ta": "n1"},
    "exact-straggler": {
        "late": ("n5", "sub-2"),
        "order_policy": pb.ORDER_POLICY_EXACT,
        "trigger": pb.TRIGGER_MODE_INCREMENTAL,
    },
}


async def run_scenario(redis_url, transport: str, name: str, data) -> dict:
    sc = SCENARIOS[name]
    tree_id = f"{transport}-{name}"
    async with agg_tree(redis_url, transport=transport, tree=tree_id) as t:
        # Only the late node's switch times a child out, its timer started by the late
        # node's one sibling there: an on-time node cut off would change the order of
        # the sums, and no machine is slow enough for that (tests/agg_switch/tree.py).
        late = sc.get("late")
        await t.define(patient_tree({late[1]: 300} if late else {}), tree=tree_id)
        kw = {}
        if "ta" in sc:
            kw["timeout_aggregator"] = pb.TimeoutAggregatorSelection(node=sc["ta"])
        for key in ("order_policy", "trigger"):
            if key in sc:
                kw[key] = sc[key]
        await t.start(
            "same",
            FIVE,
            3000,
            dtype=pb.AGG_DTYPE_FLOAT32,
            chunk_bytes=4096,
            tree_id=tree_id,
            **kw,
        )
        on_time = asyncio.ensure_future(
            aggregate_all(
                t.address(),
                "same",
                {n: data[n] for n in FIVE if not late or n != late[0]},
                credentials=node_credentials,
            )
        )
        results = {}
        if late:
            results[late[0]] = await straggle_in(t, late[0], late[1], tree_id, data[late[0]])
        results.update(await on_time)
        return {"results": results, "counters": await counters(t)}


async def straggle_in(t, node_id, switch, tree_id, values):
    await wait_for(lambda: late_at(t, node_id, switch, "same"))
    async with ComputeNode(
        node_id, t.address(), credentials=node_credentials(node_id), tree_id=tree_id
    ) as cn:
        return await cn.aggregate("same", values)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_shared_memory_and_grpc_give_the_same_bits(redis_url, scenario):
    """The same inputs and late nodes through the shared-memory path and the
    gRPC bytes path: bit-identical results at every node (AG-8)."""
    data = vectors(3000, np.float32)
    shm = await run_scenario(redis_url, "shm", scenario, data)
    via_grpc = await run_scenario(redis_url, "grpc", scenario, data)
    want = via_grpc["results"]["n1"].values.tobytes()
    for n in FIVE:
        assert shm["results"][n].values.tobytes() == want, n
        assert via_grpc["results"][n].values.tobytes() == want, n
        assert shm["results"][n].shared_memory and not via_grpc["results"][n].shared_memory
    if scenario == "on-time":  # the documented preset order: ((n1+n2)+n3) + (n4+n5)
        d = data
        preset = ((d["n1"] + d["n2"]) + d["n3"]) + (d["n4"] + d["n5"])
        assert want == preset.tobytes()
    for s in SWITCHES:
        assert shm["counters"][s]["chunks_in_shm"] > 0, s
        assert shm["counters"][s]["chunks_in_bytes"] == 0, s
        assert via_grpc["counters"][s]["chunks_in_shm"] == 0, s
        assert via_grpc["counters"][s]["chunks_in_bytes"] > 0, s


async def test_nothing_is_left_in_shared_memory_after_commands_end_fail_or_never_start(
    redis_url,
):
    idle = {s: {"LIGHTPATH_AGG_SHM_IDLE_S": "0.3"} for s in SWITCHES}
    async with agg_tree(redis_url, env=idle) as t:
        # n5 alone is ever late: sub-2 (n4 on time) alone times a child out.
        await t.define(patient_tree({"sub-2": 200}))
        names = await prefixes(t)
        # 1. Completed, with a straggler (bypass to the timeout aggregation node n1).
        await t.start(
            "done",
            FIVE,
            2048,
            dtype=pb.AGG_DTYPE_FLOAT64,
            chunk_bytes=4096,
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1"),
        )
        data = vectors(2048, np.float64)
        nodes = {n: ComputeNode(n, t.address(), credentials=node_credentials(n)) for n in FIVE}
        on_time = asyncio.gather(*(nodes[n].aggregate("done", data[n]) for n in FIVE if n != "n5"))
        late = await straggle(t, "n5", "sub-2", "done", data["n5"])
        assert late.shared_memory and all(r.shared_memory for r in await on_time)
        await t.settled("done")

        async def nothing_leased() -> bool:
            c = await counters(t)
            return all(c[s]["shm_buffers_leased"] == 0 for s in SWITCHES)

        await wait_for(nothing_leased)
        c = await counters(t)
        # Every result chunk (4) came back from both sub-switches, which had their
        # nodes' word for it (the end of their Contribute streams).
        assert c["root"]["shm_releases_in"] == 8
        node_prefixes = [nodes[n].shm.prefix for n in FIVE]  # type: ignore[union-attr]
        for node in nodes.values():
            await node.close()
        assert not any(all_files(p) for p in node_prefixes)

        async def only_owner_and_probe() -> bool:
            return not any(buffer_files(p) for p in names.values())

        await wait_for(only_owner_and_probe)  # pooled buffers idle past 0.3 s
        # 2. A node that never arrives: the deadline fails the command.
        await t.start(
            "never", FIVE, 2048, dtype=pb.AGG_DTYPE_FLOAT64, chunk_bytes=4096, deadline_s=1.5
        )
        nodes = {
            n: ComputeNode(n, t.address(), credentials=node_credentials(n))
            for n in FIVE
            if n != "n5"
        }
        outcomes = await asyncio.gather(
            *(node.aggregate("never", data[n]) for n, node in nodes.items()),
            return_exceptions=True,
        )
        node_prefixes = [node.shm.prefix for node in nodes.values()]  # type: ignore[union-attr]
        assert all(not buffer_files(p) for p in node_prefixes)  # failed: unlinked at once
        for node in nodes.values():
            await node.close()
        assert all(
            isinstance(o, grpc.aio.AioRpcError) and o.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            for o in outcomes
        ), outcomes
        c = await counters(t)
        assert all(c[s]["shm_buffers_leased"] == 0 for s in SWITCHES)
        await wait_for(only_owner_and_probe)
    # 3. The switches stopped: nothing of theirs at all.
    assert not any(all_files(p) for p in names.values())


async def test_a_node_whose_probe_does_not_check_out_uses_the_bytes_path(redis_url):
    async with agg_tree(redis_url) as t:
        await t.define(stack_tree(sub_ms=5000, root_ms=5000))
        await t.start("mixed", FIVE, 1000, dtype=pb.AGG_DTYPE_FLOAT32, chunk_bytes=1000)
        data = vectors(1000, np.float32)
        nodes = {n: ComputeNode(n, t.address(), credentials=node_credentials(n)) for n in FIVE}
        try:
            stranger = nodes["n2"].shm
            assert stranger is not None
            # As if n2 ran in another container: its probe is not where sub-1 looks.
            (SHM_DIR / stranger.hello().probe).unlink()
            results = await asyncio.gather(*(nodes[n].aggregate("mixed", data[n]) for n in FIVE))
        finally:
            for node in nodes.values():
                await node.close()
        want = sum(data.values())
        by_node = dict(zip(FIVE, results, strict=True))
        for n, r in by_node.items():
            assert r.values.tobytes() == results[0].values.tobytes()
            assert np.allclose(r.values, want, atol=1e-4)
            assert r.shared_memory == (n != "n2"), n
        sub1 = (await t.state("sub-1")).counters
        assert sub1["chunks_in_bytes"] == 4  # n2's four chunks
        assert sub1["chunks_in_shm"] == 8 + 4  # n1's and n3's, and the root's four results


async def test_switches_fall_back_per_link(redis_url):
    """sub-1 runs with LIGHTPATH_AGG_TRANSPORT=grpc: its links and its nodes use
    bytes while sub-2's use shared memory, within one command."""
    env = {"sub-1": {"LIGHTPATH_AGG_TRANSPORT": "grpc"}}
    async with agg_tree(redis_url, env=env) as t:
        await t.define(stack_tree(sub_ms=5000, root_ms=5000))
        await t.start("links", FIVE, 512, dtype=pb.AGG_DTYPE_FLOAT64, chunk_bytes=2048)
        data = vectors(512, np.float64)
        results = await aggregate_all(t.address(), "links", data, credentials=node_credentials)
        want = results["n1"].values.tobytes()
        assert all(r.values.tobytes() == want for r in results.values())
        assert [n for n, r in results.items() if r.shared_memory] == ["n4", "n5"]
        c = await counters(t)
        assert c["root"]["chunks_in_bytes"] == 2 and c["root"]["chunks_in_shm"] == 2
        assert c["sub-1"]["chunks_in_shm"] == 0 and "shm_buffers_leased" not in c["sub-1"]
        assert c["sub-2"]["chunks_in_bytes"] == 0


async def test_references_are_refused_from_a_node_that_did_not_agree(redis_url):
    async with agg_tree(redis_url) as t:
        await t.define(stack_tree(sub_ms=5000, root_ms=5000))
        await t.start("refs", FIVE, 4, chunk_bytes=32)
        ch = channel(t.address("sub-1"), credentials=node_credentials("n1"))
        try:
            contribute = ch.stream_unary(
                wire.CONTRIBUTE,
                request_serializer=wire.identity,
                response_deserializer=pb.ContributeSummary.FromString,
            )
            header = pb.AggChunk(
                command_id="refs",
                index=0,
                kind=pb.AGG_CHUNK_KIND_CONTRIBUTION,
                source="n1",
                dtype=pb.AGG_DTYPE_INT64,
                shm=pb.ShmRef(segment="lpagg-0123456789abcdef-1", offset=0, nbytes=32),
            )

            async def one():
                yield header.SerializeToString()

            report = await expect_error(
                contribute(one(), timeout=10), grpc.StatusCode.INVALID_ARGUMENT
            )
            assert report.field_violations[0][0] == "shm"
            assert "has not shown it shares" in report.field_violations[0][1]
        finally:
            await ch.close()
        assert (await t.state("sub-1")).slots_in_use == 0


async def test_a_vector_from_empty_is_handed_over_without_a_copy(redis_url):
    async with agg_tree(redis_url) as t:
        await t.define(stack_tree(sub_ms=5000, root_ms=5000))
        await t.start("zero", FIVE, 1 << 14, dtype=pb.AGG_DTYPE_FLOAT32, chunk_bytes=1 << 14)
        nodes = {n: ComputeNode(n, t.address(), credentials=node_credentials(n)) for n in FIVE}
        try:
            vectors_ = {}
            for i, (n, node) in enumerate(nodes.items()):
                vectors_[n] = node.empty(1 << 14, np.float32)
                vectors_[n][:] = i + 1
            before = {n: node.shm.files() for n, node in nodes.items()}  # type: ignore[union-attr]
            results = await asyncio.gather(*(nodes[n].aggregate("zero", vectors_[n]) for n in FIVE))
            for n, node in nodes.items():
                assert node.shm.files() == before[n]  # type: ignore[union-attr]  # no staging buffer
            for r, node in zip(results, nodes.values(), strict=True):
                assert r.shared_memory and r.values.tolist() == [15.0] * (1 << 14)
                # The result is the node's own array, not a view of anyone's buffer.
                assert r.values.flags.writeable and node.shm.locate(r.values) is None  # type: ignore[union-attr]
        finally:
            for node in nodes.values():
                await node.close()
        assert results[0].values[0] == 15.0  # still there after the node closed
