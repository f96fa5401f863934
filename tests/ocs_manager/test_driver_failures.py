"""OCS-8: a failing switch driver leaves no half-wired slice; a change stuck past its lease
is rolled back by the next call; a slice with a change in flight refuses a second one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from lightpath.client import channel
from lightpath.domain.torus import Fabric
from lightpath.security.identity import service_principal
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import ocs_manager_pb2_grpc
from lightpath_services.common.server import running
from lightpath_services.common.settings import load
from lightpath_services.ocs_manager.driver import Fence, RedisSwitchDriver, SwitchDriverError
from lightpath_services.ocs_manager.server import build
from lightpath_services.ocs_manager.settings import OcsManagerSettings
from lightpath_services.ocs_manager.wiring import FabricChange
from tests.helpers import tls_env
from tests.ocs_manager.conftest import fabric_env, rpc_error, wire_request

C = grpc.StatusCode


class ScriptedDriver:
    """The real (Redis) driver, except for the calls `plan` scripts, in order:
    "ok", "partial" (applies the disconnects and half the connects, then fails),
    "refuse" (fails, not transient), "down" (fails, transient), "hang", "gate"
    (waits for `gate`, then applies), "pause" (the same, deaf to the manager's own
    timeout, as a paused process is)."""

    def __init__(self, inner: RedisSwitchDriver):
        self.inner = inner
        self.plan: list[str] = []
        self.calls: list[FabricChange] = []
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def apply(self, change: FabricChange, fence: Fence | None = None) -> None:
        self.calls.append(change)
        action = self.plan.pop(0) if self.plan else "ok"
        if action == "partial":
            part = FabricChange(
                change.disconnect, change.connect[: len(change.connect) // 2], change.one_to_many
            )
            await self.inner.apply(part, fence)
            raise SwitchDriverError("mirror stuck on one OCS", applied=part)
        if action == "refuse":
            raise SwitchDriverError("switch refused the table", transient=False)
        if action == "down":
            raise SwitchDriverError("switch unreachable")
        if action == "hang":
            await asyncio.sleep(3600)
        if action == "gate":
            self.entered.set()
            await self.gate.wait()
        if action == "pause":  # the process is paused: its own timers do not fire either
            self.entered.set()
            while not self.gate.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await self.gate.wait()
        await self.inner.apply(change, fence)

    async def read(self):
        return await self.inner.read()


@contextlib.asynccontextmanager
async def scripted_ocs(
    redis_url: str, lease_s: float = 30.0, **env
) -> AsyncIterator[tuple[ocs_manager_pb2_grpc.OcsManagerStub, ScriptedDriver]]:
    settings = load(
        OcsManagerSettings,
        {
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": "127.0.0.1:0",
            "LIGHTPATH_OCS_CHANGE_LEASE_S": str(lease_s),
            **tls_env(service_principal("ocs_manager", "pod-1")),
            **fabric_env(**env),
        },
    )
    holder: list[ScriptedDriver] = []

    async def make(runtime):
        fabric = Fabric.build(settings.fabric_config)
        inner = RedisSwitchDriver(runtime.redis, settings.pod_id, fabric)
        await inner.init()
        holder.append(ScriptedDriver(inner))
        return await build(runtime, driver=holder[0])

    async with (
        running("ocs_manager", settings, make, grace=0.2) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch), holder[0]


async def snapshot(stub, driver):
    """Committed tables (via the RPCs) and the switches' own state."""
    tables = {}
    page = await stub.ListSwitches(pb.ListSwitchesRequest(page_size=1000))
    for s in page.switches:
        t = await stub.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id=s.ocs_id))
        tables[s.ocs_id] = sorted((c.port_a, c.port_b) for c in t.cross_connects)
    otm = sorted(
        (s.switch_id, s.selected_output)
        for s in (await stub.GetOneToManyStates(pb.GetOneToManyStatesRequest())).states
    )
    dev = await driver.read()
    return tables, otm, dev.tables, dev.one_to_many


async def assert_clean(stub):
    report = await stub.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    assert report.ok, report.violations


async def test_a_driver_failure_mid_wire_rolls_back_and_answers_unavailable(redis_url):
    async with scripted_ocs(redis_url, k=2, blocks=16) as (ocs, driver):
        await ocs.WireSlice(wire_request("keep", [2, 1, 1], [0, 1]))
        before = await snapshot(ocs, driver)
        driver.plan = ["partial"]
        err = await rpc_error(ocs.WireSlice(wire_request("j", [2, 2, 1], [4, 5, 6, 7])))
        assert err.code == C.UNAVAILABLE and err.reason == "SWITCH_DRIVER_FAILED"
        # the undo was exactly the inverse of what the driver had applied
        failed = driver.calls[-2]
        half = FabricChange(
            failed.disconnect, failed.connect[: len(failed.connect) // 2], failed.one_to_many
        )
        assert driver.calls[-1] == half.inverse()
        assert await snapshot(ocs, driver) == before
        assert (await rpc_error(ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="j")))).code == (
            C.NOT_FOUND
        )
        await assert_clean(ocs)
        # the blocks are free: the same request now succeeds
        w = await ocs.WireSlice(wire_request("j", [2, 2, 1], [4, 5, 6, 7]))
        assert w.state == pb.SLICE_STATE_WIRED and not w.replayed
        await assert_clean(ocs)


async def test_a_refusing_switch_answers_aborted(redis_url):
    async with scripted_ocs(redis_url) as (ocs, driver):
        driver.plan = ["refuse"]
        err = await rpc_error(ocs.WireSlice(wire_request("j", [1, 1, 1], [3])))
        assert err.code == C.ABORTED and "refused" in err.message
        await assert_clean(ocs)
        assert (await ocs.ListSlices(pb.ListSlicesRequest())).slices == []


async def test_a_failed_release_leaves_the_slice_wired(redis_url):
    async with scripted_ocs(redis_url, k=2, blocks=8) as (ocs, driver):
        await ocs.WireSlice(wire_request("j", [2, 2, 2], list(range(8))))
        before = await snapshot(ocs, driver)
        driver.plan = ["down"]
        err = await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j")))
        assert err.code == C.UNAVAILABLE
        assert await snapshot(ocs, driver) == before
        await assert_clean(ocs)
        rel = await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j"))
        assert rel.cross_connects_removed == 384 and rel.one_to_many_cleared == 384
        await assert_clean(ocs)


async def test_a_failed_replace_keeps_the_old_block_and_frees_the_new(redis_url):
    async with scripted_ocs(redis_url, k=2, blocks=8) as (ocs, driver):
        await ocs.WireSlice(wire_request("j", [4, 1, 1], [0, 2, 4, 6]))
        before = await snapshot(ocs, driver)
        driver.plan = ["partial"]
        req = pb.ReplaceBlockRequest(job_id="j", failed_block_id=4, new_block_id=5)
        assert (await rpc_error(ocs.ReplaceBlock(req))).code == C.UNAVAILABLE
        assert await snapshot(ocs, driver) == before
        await assert_clean(ocs)
        await ocs.WireSlice(wire_request("other", [1, 1, 1], [5]))  # 5 was not kept
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="other"))
        rep = await ocs.ReplaceBlock(req)
        assert 5 in [b.block_id for b in rep.wiring.blocks]
        await assert_clean(ocs)


async def test_a_hanging_driver_times_out_and_rolls_back(redis_url):
    async with scripted_ocs(redis_url, lease_s=0.4) as (ocs, driver):
        driver.plan = ["hang"]
        err = await rpc_error(ocs.WireSlice(wire_request("j", [1, 1, 1], [3])))
        assert err.code == C.UNAVAILABLE and "no answer" in err.message
        await assert_clean(ocs)


async def test_when_the_rollback_fails_too_the_next_call_after_the_lease_recovers(redis_url):
    async with scripted_ocs(redis_url, lease_s=0.3) as (ocs, driver):
        driver.plan = ["partial", "down"]  # the change fails, then so does its undo
        req = wire_request("j", [2, 1, 1], [3, 4])
        err = await rpc_error(ocs.WireSlice(req))
        assert err.code == C.UNAVAILABLE and "lease" in err.message
        # while the lease runs the slice and its blocks are held
        err = await rpc_error(ocs.WireSlice(req))
        assert err.code == C.ABORTED and err.reason == "SLICE_BUSY"
        assert (await rpc_error(ocs.WireSlice(wire_request("k", [1, 1, 1], [4])))).code == (
            C.FAILED_PRECONDITION
        )
        await asyncio.sleep(0.4)  # the lease runs out
        w = await ocs.WireSlice(req)  # takes the stuck change over, rolls it back, wires
        assert w.state == pb.SLICE_STATE_WIRED and not w.replayed
        await assert_clean(ocs)


async def test_a_stuck_release_is_rolled_back_by_the_next_release(redis_url):
    async with scripted_ocs(redis_url, lease_s=0.3) as (ocs, driver):
        await ocs.WireSlice(wire_request("j", [2, 1, 1], [3, 4]))
        driver.plan = ["partial", "down"]
        assert (await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j")))).code == (
            C.UNAVAILABLE
        )
        await asyncio.sleep(0.4)
        rel = await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j"))
        assert rel.cross_connects_removed == 96
        await assert_clean(ocs)


async def test_a_second_change_while_one_is_in_flight_is_refused(redis_url):
    async with scripted_ocs(redis_url, k=2, blocks=8) as (ocs, driver):
        driver.plan = ["gate"]
        req = wire_request("j", [2, 1, 1], [0, 1])
        first = asyncio.ensure_future(ocs.WireSlice(req))
        await driver.entered.wait()  # claimed, switches being programmed
        err = await rpc_error(ocs.WireSlice(req))
        assert err.code == C.ABORTED and err.reason == "SLICE_BUSY"
        err = await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j")))
        assert err.code == C.ABORTED
        err = await rpc_error(ocs.WireSlice(wire_request("k", [1, 1, 1], [1])))
        assert err.code == C.FAILED_PRECONDITION and err.reason == "BLOCK_IN_USE"
        w = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="j"))
        assert w.state == pb.SLICE_STATE_WIRING
        await assert_clean(ocs)  # a wire in flight holds blocks, no cross-connects yet
        driver.gate.set()
        assert (await first).state == pb.SLICE_STATE_WIRED
        await assert_clean(ocs)


async def test_a_client_that_goes_away_mid_change_leaves_no_trace(redis_url):
    async with scripted_ocs(redis_url) as (ocs, driver):
        driver.plan = ["gate"]
        call = ocs.WireSlice(wire_request("j", [2, 1, 1], [0, 1]))
        task = asyncio.ensure_future(call)
        await driver.entered.wait()
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await task
        for _ in range(100):  # the server sees the cancel and undoes
            if not (await ocs.ListSlices(pb.ListSlicesRequest())).slices:
                break
            await asyncio.sleep(0.02)
        assert not (await ocs.ListSlices(pb.ListSlicesRequest())).slices
        await assert_clean(ocs)
