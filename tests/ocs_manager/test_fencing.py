"""Fencing (issue 32): a change resumed after its lease was taken over moves no mirror,
a caller holding an older lease on a job is refused, and the switches refuse a batch
under an older token than one they have seen for that lease. Real Redis, the real
service; the "pause" is a driver call held at a gate past the change lease."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from lightpath.client import channel
from lightpath.domain.southbound import OCS, SouthboundDevice
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc
from lightpath_services.common.txn import STALE_LEASE, Conflict, Txn
from lightpath_services.ocs_manager import server as ocs_server
from lightpath_services.ocs_manager.metrics import OcsMetrics
from lightpath_services.ocs_manager.store import PROGRAM
from lightpath_services.switch_agent.switches import Batch, SimulatedSwitch
from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient
from tests.helpers import serve
from tests.metrics_reader import install, value
from tests.ocs_manager.conftest import fabric_env, ocs_stub, rpc_error, wire_request
from tests.ocs_manager.test_driver_failures import assert_clean, scripted_ocs, snapshot

C = grpc.StatusCode


async def test_a_change_resumed_after_its_lease_was_taken_over_moves_no_mirror(
    redis_url, redis_client
):
    async with scripted_ocs(redis_url, lease_s=0.3) as (ocs, driver):
        driver.plan = ["pause"]  # the first call stalls before programming
        stalled = asyncio.ensure_future(ocs.WireSlice(wire_request("j", [2, 1, 1], [0, 1])))
        await driver.entered.wait()
        await asyncio.sleep(0.4)  # past its lease
        # Another call takes the change over (a higher token), rolls it back and wires.
        w = await ocs.WireSlice(wire_request("j", [2, 1, 1], [0, 1]))
        assert w.state == pb.SLICE_STATE_WIRED
        before = await snapshot(ocs, driver)
        driver.gate.set()  # the stalled call wakes with its old token
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stalled
        assert err.value.code() == C.ABORTED and "taken over" in (err.value.details() or "")
        # the switches refused it whole: they and the committed tables are as the new
        # holder left them
        assert await snapshot(ocs, driver) == before
        assert int(await redis_client.get("lp:{pod-t}:dev:stale_refused") or 0) >= 1
        await assert_clean(ocs)


async def test_a_caller_with_an_older_lease_on_the_job_is_refused(redis_url, monkeypatch):
    reader = install(monkeypatch, ocs_server, OcsMetrics, refresh_s=0.1)
    async with ocs_stub(redis_url, pod="pod-lease") as ocs:
        assert value(reader, "lightpath.ocs.stale_writes_refused", where="lease") == 0
        lease = {"lease_id": "j#7", "lease_token": 5}
        await ocs.WireSlice(wire_request("j", [1, 1, 1], [2], **lease))
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j", lease_id="j#7", lease_token=6))
        # a holder paused since token 5 wakes and wires its stale view: refused
        err = await rpc_error(
            ocs.WireSlice(wire_request("j", [1, 1, 1], [3], lease_id="j#7", lease_token=5))
        )
        assert err.code == C.FAILED_PRECONDITION and err.reason == STALE_LEASE
        assert "newer holder" in err.message
        assert (await ocs.ListSlices(pb.ListSlicesRequest())).slices == []
        assert value(reader, "lightpath.ocs.stale_writes_refused", where="lease") == 1
        # the same job submitted again is another lease; unfenced calls are not checked
        await ocs.WireSlice(wire_request("j", [1, 1, 1], [3], lease_id="j#9", lease_token=1))
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j"))


async def test_a_scheduler_that_lost_the_job_cannot_release_the_new_holders_slice(
    redis_url, monkeypatch
):
    """The scheduler's client sends its lease on ReleaseSlice as on WireSlice: a replica
    paused while another took the job over (epoch 1 -> 2) and wired it wakes, finds the
    job superseded and releases with its old epoch: refused, the new holder's slice
    stays; the holder's own release (its epoch, or the final one) goes through."""
    reader = install(monkeypatch, ocs_server, OcsMetrics, refresh_s=0.1)
    async with (
        serve("ocs_manager", redis_url, fabric_env(pod="pod-rel")) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        client = OcsManagerClient(ch)
        ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
        await ocs.WireSlice(wire_request("j", [1, 1, 1], [2], lease_id="j#4", lease_token=2))
        with pytest.raises(OcsError) as err:
            await client.release("j", lease=("j#4", 1))
        assert err.value.reason == STALE_LEASE and err.value.code == C.FAILED_PRECONDITION
        listed = (await ocs.ListSlices(pb.ListSlicesRequest())).slices
        assert [(s.job_id, tuple(s.block_ids)) for s in listed] == [("j", (2,))]
        assert value(reader, "lightpath.ocs.stale_writes_refused", where="lease") == 1
        assert await client.release("j", lease=("j#4", 3)) is True  # the holder, finishing
        assert (await ocs.ListSlices(pb.ListSlicesRequest())).slices == []
        # and the stale replica's later wire of its old view is refused too
        with pytest.raises(grpc.aio.AioRpcError):
            await ocs.WireSlice(wire_request("j", [1, 1, 1], [3], lease_id="j#4", lease_token=2))


async def test_the_txn_fence_refuses_an_older_token_and_keeps_the_highest(redis_client):
    script = PROGRAM.bind(redis_client)
    key = "lp:{fence-t}:leases"

    async def write(token: int) -> None:
        t = Txn()
        t.fence(key, "a", token)
        t.hset("lp:{fence-t}:x", {"by": token})
        await script.commit(t)

    await write(3)
    await write(3)  # the same holder again
    with pytest.raises(Conflict) as c:
        await write(2)
    assert c.value.reason == STALE_LEASE and c.value.value == "3"
    assert await redis_client.hget("lp:{fence-t}:x", "by") == "3"  # nothing written
    await write(0)  # unfenced
    await write(8)
    assert await redis_client.hget(key, "a") == "8"


async def test_a_switch_refuses_a_batch_under_an_older_token_of_the_same_lease():
    sw = SimulatedSwitch(SouthboundDevice("ocs-x-0-0", OCS, 16, 0, 0))

    async def nothing() -> None:
        return None

    await sw.apply("b1", Batch(connect=((0, 1),)), settle_s=0, persist=nothing, fence=("j", 4))
    await sw.apply("b2", Batch(disconnect=((0, 1),)), settle_s=0, persist=nothing, fence=("k", 1))
    with pytest.raises(Exception) as err:
        await sw.apply("b3", Batch(connect=((2, 3),)), settle_s=0, persist=nothing, fence=("j", 3))
    assert getattr(err.value, "reason", "") == STALE_LEASE
    assert sw.table == {} and sw.stats.stale_batches_refused == 1
    await sw.apply("b4", Batch(connect=((2, 3),)), settle_s=0, persist=nothing, fence=("j", 5))
    assert sw.table == {2: 3, 3: 2}
