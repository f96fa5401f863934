"""Fail-static (issue 20): killing the ocs_manager leaves every switch's cross-connects as
they were, and a restarted manager adopts them without rewiring anything that is right
(counted on the agent: not one ApplyBatch for a switch that was right)."""

from __future__ import annotations

import asyncio

from lightpath.client import channel
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import optical_switch_pb2 as sb
from tests.ocs_manager.conftest import wire_request
from tests.switch_agent.conftest import (
    ManagerProcess,
    admin,
    agent_process,
    as_manager,
    fabric,
    manager_env,
)


async def all_tables(address: str, ids: list[str]) -> dict[str, set[tuple[int, int]]]:
    async with as_manager(address) as s:
        out = {}
        for sid in ids:
            st = await s.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=sid))
            out[sid] = {(x.port_a, x.port_b) for x in st.cross_connects}
        return out


async def stats(address: str, ids: list[str]) -> dict[str, int]:
    async with admin(address) as a:
        return {
            sid: (await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=sid))).apply_calls
            for sid in ids
        }


async def passes(ocs) -> int:
    info = await ocs.GetInfo(common_pb2.GetInfoRequest())
    return int(info.attributes["switch_reconcile_passes"])


async def after_passes(ocs, n: int, timeout: float = 30.0) -> None:
    """Until the manager's reconcile loop has finished `n` more passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    start = await passes(ocs)
    while await passes(ocs) < start + n:
        assert loop.time() < deadline, "the reconcile loop does not run"
        await asyncio.sleep(0.05)


async def test_killing_the_manager_leaves_the_switches_and_a_new_one_adopts_them(
    redis_url, tmp_path
):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        mgr = ManagerProcess(
            redis_url, tmp_path, {**manager_env(ag), "LIGHTPATH_SHUTDOWN_GRACE_S": "0.2"}
        )
        mgr.start()
        try:
            async with channel(mgr.address, max_attempts=1) as ch:
                ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                await ocs.WireSlice(wire_request("a", [2, 2, 1], [0, 1, 2, 3]))
                await ocs.WireSlice(wire_request("b", [2, 1, 1], [4, 5]))
                fabric_view = await ocs.GetFabric(pb.GetFabricRequest())
                ids = [
                    s.ocs_id for s in (await ocs.ListSwitches(pb.ListSwitchesRequest())).switches
                ]
                assert len(ids) == fabric_view.ocs_count
                await after_passes(ocs, 2)
            held = await all_tables(ag.address, ids)
            assert sum(len(t) for t in held.values()) > 0
            mgr.kill()  # SIGKILL: no goodbye, nothing cleaned up

            # fail-static: the switches keep every cross-connect
            assert await all_tables(ag.address, ids) == held
            # while the manager is away one switch loses power and comes back empty
            async with admin(ag.address) as a:
                await a.RestartSwitch(sb.RestartSwitchRequest(switch_id="ocs-y-1-0"))
            calls = await stats(ag.address, ids)

            mgr.start()
            async with channel(mgr.address, max_attempts=1) as ch:
                ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
                await after_passes(ocs, 3)
                report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
                assert report.ok, list(report.violations)
                now = await stats(ag.address, ids)
                # adopted: not one batch for a switch that was right; one for the one that lost
                # its tables
                assert {s: now[s] - calls[s] for s in ids if now[s] != calls[s]} == {"ocs-y-1-0": 1}
                assert await all_tables(ag.address, ids) == held
                # and it still programs them
                await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="b"))
                report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
                assert report.ok, list(report.violations)
        finally:
            mgr.stop()
