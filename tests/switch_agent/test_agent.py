"""The southbound contract (optical_switch.proto, docs/ocs_southbound.md) on a real agent
process: absolute semantics and order, idempotency keys, what an error says was applied,
preconditions, faults, restarts, the state file; and properties of a simulated switch."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightpath.client import error_report
from lightpath.domain.southbound import OCS, SouthboundDevice
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath_services.switch_agent.switches import Batch, SimulatedSwitch
from tests.switch_agent.conftest import (
    admin,
    agent_process,
    as_manager,
    credentials,
    fabric,
    inject,
)

C = grpc.StatusCode
X = "ocs-x-0-0"


def pairs(*ps: tuple[int, int]) -> list[sb.PortPair]:
    return [sb.PortPair(port_a=a, port_b=b) for a, b in ps]


async def table(stub, sid: str = X) -> set[tuple[int, int]]:
    state = await stub.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=sid))
    return {(x.port_a, x.port_b) for x in state.cross_connects}


async def failure(call):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_report(err.value)


async def test_describe_names_kinds_ports_and_settling(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric(k=2), LIGHTPATH_AGENT_SETTLE_MS="7") as ag:
        async with as_manager(ag.address) as s:
            ocs = await s.Describe(sb.DescribeSwitchRequest(switch_id="ocs-y-3-1"))
            assert ocs.kind == sb.SWITCH_KIND_OCS and ocs.ports == 24 and ocs.outputs == 0
            assert ocs.settling_time.ToMilliseconds() == 7 and ocs.boot_id
            bank = await s.Describe(sb.DescribeSwitchRequest(switch_id="otm-5"))
            assert bank.kind == sb.SWITCH_KIND_ONE_TO_K and bank.ports == 12 and bank.outputs == 2
            err = await failure(s.Describe(sb.DescribeSwitchRequest(switch_id="otm-8")))
            assert err.code == C.NOT_FOUND
            err = await failure(s.Describe(sb.DescribeSwitchRequest()))
            assert err.code == C.INVALID_ARGUMENT and "switch_id" in err.message


async def test_batches_are_absolute_ordered_and_idempotent(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s, admin(ag.address) as a:
            r = await s.ApplyBatch(
                sb.ApplyBatchRequest(switch_id=X, batch_id="b1", connect=pairs((8, 1), (9, 2)))
            )
            assert (r.applied.connects, r.version, r.replayed) == (2, 1, False)
            # connect takes a port from its old peer; disconnect of an absent pair is a no-op;
            # disconnects go first, so (8, 1) can be dropped and 8 joined to 3 in one batch
            r = await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id=X,
                    batch_id="b2",
                    disconnect=pairs((8, 1), (10, 5)),
                    connect=pairs((8, 3), (11, 2)),
                )
            )
            assert r.version == 2
            assert await table(s) == {(3, 8), (2, 11)}
            # the same key again: the first answer, nothing moves
            before = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=X))
            again = await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id=X,
                    batch_id="b2",
                    disconnect=pairs((8, 1), (10, 5)),
                    connect=pairs((8, 3), (11, 2)),
                )
            )
            assert again.replayed and again.version == 2
            after = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=X))
            assert after.batches_applied == before.batches_applied
            assert after.batches_replayed == before.batches_replayed + 1
            # the same key with another batch is the client's mistake
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="b2", connect=pairs((9, 4)))
                )
            )
            assert err.code == C.INVALID_ARGUMENT and err.reason == "BATCH_ID_REUSED"
            assert await table(s) == {(3, 8), (2, 11)}


async def test_a_bad_batch_applies_nothing_and_says_so(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s:
            for req, field in (
                (
                    sb.ApplyBatchRequest(switch_id=X, batch_id="c1", connect=pairs((1, 99))),
                    "connect[0]",
                ),
                (
                    sb.ApplyBatchRequest(switch_id=X, batch_id="c2", connect=pairs((1, 1))),
                    "connect[0]",
                ),
                (
                    sb.ApplyBatchRequest(
                        switch_id=X, batch_id="c3", connect=pairs((1, 9), (1, 10))
                    ),
                    "connect[1]",
                ),
                (
                    sb.ApplyBatchRequest(switch_id=X, batch_id="bad id!", connect=pairs((1, 9))),
                    "batch_id",
                ),
                (
                    sb.ApplyBatchRequest(
                        switch_id=X,
                        batch_id="c5",
                        set_outputs=[sb.OutputSelection(input=0, output=1)],
                    ),
                    "set_outputs",
                ),
            ):
                err = await failure(s.ApplyBatch(req))
                assert err.code == C.INVALID_ARGUMENT, err
                assert field in {f for f, _ in err.field_violations}, err
                assert err.metadata["applied_connects"] == "0"
            assert await table(s) == set()


async def test_preconditions_refuse_a_stale_writer(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s:
            d = await s.Describe(sb.DescribeSwitchRequest(switch_id=X))
            await s.ApplyBatch(
                sb.ApplyBatchRequest(switch_id=X, batch_id="p1", connect=pairs((8, 0)))
            )
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(
                        switch_id=X,
                        batch_id="p2",
                        disconnect=pairs((8, 0)),
                        expect_boot_id=d.boot_id,
                        expect_version=d.version,
                    )
                )
            )
            assert err.code == C.FAILED_PRECONDITION and err.reason == "VERSION_MISMATCH"
            assert err.metadata["applied_disconnects"] == "0"
            assert await table(s) == {(0, 8)}


async def test_faults_reject_partial_unreachable_and_restart(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s, admin(ag.address) as a:
            await inject(ag.address, X, reject_batches=1)
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="f1", connect=pairs((8, 0)))
                )
            )
            assert (err.code, err.reason) == (C.ABORTED, "BATCH_REJECTED")
            assert await table(s) == set()
            # a repeat of the rejected key answers the same, and the next key goes through
            again = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="f1", connect=pairs((8, 0)))
                )
            )
            assert again.reason == "BATCH_REJECTED"

            await inject(ag.address, X, partial_batches=1)
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(
                        switch_id=X,
                        batch_id="f2",
                        disconnect=pairs((8, 0)),
                        connect=pairs((8, 1), (9, 2), (10, 3)),
                    )
                )
            )
            assert (err.code, err.reason) == (C.UNAVAILABLE, "PARTIALLY_APPLIED")
            # half of the 4 operations, in order: the disconnect and the first connect
            assert (err.metadata["applied_disconnects"], err.metadata["applied_connects"]) == (
                "1",
                "1",
            )
            assert await table(s) == {(1, 8)}

            await inject(ag.address, X, unreachable=True)
            err = await failure(s.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=X)))
            assert (err.code, err.reason) == (C.UNAVAILABLE, "SWITCH_UNREACHABLE")
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="f3", connect=pairs((9, 2)))
                )
            )
            assert err.metadata["applied_connects"] == "0"
            await inject(ag.address, X)  # cleared
            assert await table(s) == {(1, 8)}

            boot = (await s.Describe(sb.DescribeSwitchRequest(switch_id=X))).boot_id
            restarted = await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=X))
            assert restarted.boot_id != boot and restarted.version == 0
            assert await table(s) == set()
            # the other switches kept theirs: only the one restarted
            await s.ApplyBatch(
                sb.ApplyBatchRequest(switch_id="ocs-y-0-0", batch_id="g1", connect=pairs((8, 0)))
            )
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=X))
            assert await table(s, "ocs-y-0-0") == {(0, 8)}


async def test_a_restart_mid_batch_fails_it_with_nothing_left(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s, admin(ag.address) as a:
            await inject(ag.address, X, extra_delay={"seconds": 30})
            call = asyncio.ensure_future(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="r1", connect=pairs((8, 0)))
                )
            )
            while True:  # until the batch is moving mirrors
                ports = await s.GetPortStatus(sb.GetPortStatusRequest(switch_id=X))
                if ports.ports[8].state == sb.PORT_STATE_SETTLING:
                    break
                await asyncio.sleep(0.02)
            assert ports.ports[8].peer == 0
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=X))
            err = await failure(call)
            assert (err.code, err.reason) == (C.UNAVAILABLE, "SWITCH_RESTARTED")
            assert err.metadata["applied_connects"] == "0"
            assert await table(s) == set()


async def test_the_state_file_keeps_tables_across_an_agent_restart(redis_url, tmp_path):
    state = tmp_path / "switches.json"
    with agent_process(
        redis_url, tmp_path, **fabric(), LIGHTPATH_AGENT_STATE_FILE=str(state)
    ) as ag:
        async with as_manager(ag.address) as s:
            await s.ApplyBatch(
                sb.ApplyBatchRequest(switch_id=X, batch_id="s1", connect=pairs((8, 0)))
            )
            boot = (await s.Describe(sb.DescribeSwitchRequest(switch_id=X))).boot_id
        ag.kill()  # no goodbye: what was answered is on disk
        ag.start()
        async with as_manager(ag.address) as s:
            assert await table(s) == {(0, 8)}
            d = await s.Describe(sb.DescribeSwitchRequest(switch_id=X))
            assert (d.boot_id, d.version) == (boot, 1)
    with agent_process(redis_url, tmp_path, **fabric()) as ag:  # no state file: empty
        async with as_manager(ag.address) as s:
            assert await table(s) == set()


async def test_a_restarted_agent_still_refuses_an_older_fence_token(redis_url, tmp_path):
    """Fences live in the state file beside the tables (issue 32): a manager whose change
    lease was taken over (token 5 after 7) is refused by an agent restarted since."""
    state = tmp_path / "switches.json"
    with agent_process(
        redis_url, tmp_path, **fabric(), LIGHTPATH_AGENT_STATE_FILE=str(state)
    ) as ag:
        async with as_manager(ag.address) as s:
            await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id=X,
                    batch_id="new-holder",
                    connect=pairs((8, 0)),
                    fence=sb.Fence(lease_id="job-a", token=7),
                )
            )
        ag.kill()  # no goodbye: what was answered is on disk
        ag.start()
        async with as_manager(ag.address) as s, admin(ag.address) as a:
            err = await failure(
                s.ApplyBatch(
                    sb.ApplyBatchRequest(
                        switch_id=X,
                        batch_id="stale-undo",
                        disconnect=pairs((8, 0)),
                        fence=sb.Fence(lease_id="job-a", token=5),
                    )
                )
            )
            assert (err.code, err.reason) == (C.FAILED_PRECONDITION, "STALE_LEASE")
            assert await table(s) == {(0, 8)}
            stats = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=X))
            assert stats.stale_batches_refused == 1
            # the newer holder (and later ones) still go through
            await s.ApplyBatch(
                sb.ApplyBatchRequest(
                    switch_id=X,
                    batch_id="newer",
                    disconnect=pairs((8, 0)),
                    fence=sb.Fence(lease_id="job-a", token=8),
                )
            )
            assert await table(s) == set()


async def test_only_the_pods_manager_programs_and_only_operators_inject(redis_url, tmp_path):
    from lightpath.client import channel
    from lightpath.v1 import optical_switch_pb2_grpc

    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with channel(
            ag.address, max_attempts=1, credentials=credentials("service:ocs_manager/pod-other")
        ) as ch:
            err = await failure(
                optical_switch_pb2_grpc.OpticalSwitchStub(ch).ApplyBatch(
                    sb.ApplyBatchRequest(switch_id=X, batch_id="z", connect=pairs((8, 0)))
                )
            )
            assert (err.code, err.reason) == (C.PERMISSION_DENIED, "WRONG_SCOPE")
        async with as_manager(ag.address) as s:
            assert await table(s) == set()
        async with channel(
            ag.address, max_attempts=1, credentials=credentials("service:ocs_manager/pod-sb")
        ) as ch:
            err = await failure(
                optical_switch_pb2_grpc.OpticalSwitchAdminStub(ch).RestartSwitch(
                    sb.RestartSwitchRequest(switch_id=X)
                )
            )
            assert (err.code, err.reason) == (C.PERMISSION_DENIED, "ROLE_REQUIRED")


# -- properties of one simulated switch (no gRPC: the semantics alone) -------------------

RADIX = 12
_pair = st.tuples(st.integers(0, RADIX - 1), st.integers(0, RADIX - 1)).filter(
    lambda p: p[0] != p[1]
)


def _distinct_ports(ps: list[tuple[int, int]]) -> bool:
    seen = [x for p in ps for x in p]
    return len(seen) == len(set(seen))


_batch = st.builds(
    Batch,
    st.lists(_pair, max_size=4).map(tuple),
    st.just(()),
    st.lists(_pair, max_size=4).filter(_distinct_ports).map(tuple),
)


def _model(table: dict[int, int], batch: Batch, limit: int) -> dict[int, int]:
    """What the contract says, written plainly: in order, absolute, the first `limit` ops."""
    t = dict(table)
    ops = [("d", p) for p in batch.disconnect] + [("c", p) for p in batch.connect]
    for kind, (p, q) in ops[:limit]:
        if kind == "d":
            if t.get(p) == q:
                del t[p], t[q]
        else:
            for port in (p, q):
                old = t.pop(port, None)
                if old is not None:
                    t.pop(old, None)
            t[p], t[q] = q, p
    return t


@given(st.lists(st.tuples(_batch, st.booleans()), max_size=8))
def test_any_batches_keep_a_pairing_and_a_partial_one_is_a_prefix(steps):
    async def run() -> None:
        sw = SimulatedSwitch(SouthboundDevice("ocs-x-0-0", OCS, RADIX, 0, 0))

        async def nothing() -> None:
            return None

        expect: dict[int, int] = {}
        for i, (batch, partial) in enumerate(steps):
            sw.faults.partial_batches = int(partial)
            limit = batch.size // 2 if partial and batch.size else batch.size
            try:
                out, _ = await sw.apply(f"k{i}", batch, settle_s=0, persist=nothing)
                assert out.progress.total == batch.size
            except Exception as exc:
                assert partial and batch.size, exc
                assert (
                    int(exc.metadata["applied_disconnects"])
                    + int(  # type: ignore[attr-defined]
                        exc.metadata["applied_connects"]  # type: ignore[attr-defined]
                    )
                    == limit
                )
            expect = _model(expect, batch, limit)
            assert sw.table == expect
            assert all(sw.table[q] == p and p != q for p, q in sw.table.items())

    asyncio.run(run())


async def test_apply_batches_answers_each_switch_as_apply_batch_would(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with as_manager(ag.address) as s:
            await inject(ag.address, "ocs-y-0-0", reject_batches=1)
            reply = await s.ApplyBatches(
                sb.ApplyBatchesRequest(
                    batches=[
                        sb.ApplyBatchRequest(switch_id=X, batch_id="m1", connect=pairs((8, 0))),
                        sb.ApplyBatchRequest(
                            switch_id="ocs-y-0-0", batch_id="m1", connect=pairs((8, 0))
                        ),
                        sb.ApplyBatchRequest(switch_id="nope", batch_id="m1"),
                    ]
                )
            )
            ok, rejected, unknown = reply.results
            assert ok.applied.applied.connects == 1 and ok.applied.switch_id == X
            assert rejected.error.code == C.ABORTED.value[0]
            assert "refused" in rejected.error.message
            assert unknown.error.code == C.NOT_FOUND.value[0]
            assert await table(s) == {(0, 8)} and await table(s, "ocs-y-0-0") == set()
            # the same keys again: the first outcomes, replayed
            again = await s.ApplyBatches(
                sb.ApplyBatchesRequest(
                    batches=[
                        sb.ApplyBatchRequest(switch_id=X, batch_id="m1", connect=pairs((8, 0)))
                    ]
                )
            )
            assert again.results[0].applied.replayed
            # a switch twice in one call is the client's mistake, and nothing is applied
            err = await failure(
                s.ApplyBatches(
                    sb.ApplyBatchesRequest(
                        batches=[
                            sb.ApplyBatchRequest(switch_id=X, batch_id="m2", connect=pairs((9, 1))),
                            sb.ApplyBatchRequest(switch_id=X, batch_id="m3", connect=pairs((9, 2))),
                        ]
                    )
                )
            )
            assert (
                err.code == C.INVALID_ARGUMENT
                and ("batches[1].switch_id", err.field_violations[0][1]) == err.field_violations[0]
            )
            assert await table(s) == {(0, 8)}
