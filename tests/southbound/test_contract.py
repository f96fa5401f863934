"""The southbound contract through each driver (issue 34): the same ocs_manager programs
switch agents, SONiC OCS (CONFIG_DB / STATE_DB with the orchagent emulator) and
Polatis-style NETCONF switches (a NETCONF server process over SSH), with the same
outcomes: changes all or nothing, a failing switch answered UNAVAILABLE naming it and
rolled back everywhere, and a switch that restarted empty repaired by the reconcile loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from lightpath.client import channel, error_report
from lightpath.domain.torus import Fabric, FabricConfig
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from tests.helpers import serve
from tests.ocs_manager.conftest import wire_request
from tests.southbound.labs import netconf_lab, sonic_lab, start_netconf
from tests.switch_agent.conftest import agent_process, fabric, inject
from tests.switch_agent.test_manager_faults import eventually_consistent, invariants_hold

SW = "ocs-x-0-0"  # carries the x links of blocks 0..7
FABRIC = Fabric.build(FabricConfig((2, 2, 2), 8, 1, 24))


@dataclass
class Switches:
    """The pod's switches behind one driver, with the drills every driver supports."""

    env: dict[str, str]
    lab: Any

    async def fail(self, sid: str) -> None: ...

    async def restart_empty(self, sid: str) -> None: ...


class AgentSwitches(Switches):
    async def fail(self, sid: str) -> None:
        await inject(self.lab.address, sid, unreachable=True)

    async def restart_empty(self, sid: str) -> None:
        from lightpath.v1 import optical_switch_pb2 as sb
        from tests.switch_agent.conftest import admin

        await inject(self.lab.address, sid)
        async with admin(self.lab.address) as a:
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=sid))


class SonicSwitches(Switches):
    async def fail(self, sid: str) -> None:
        await self.lab[sid].orchagent.stop()
        self.lab[sid].server.stop()  # its Redis is gone

    async def restart_empty(self, sid: str) -> None:
        self.lab[sid].server.start()
        await self.lab[sid].orchagent.start()


class NetconfSwitches(Switches):
    solo: Any = None  # the process serving SW alone, so it can fail alone
    workdir: Any = None

    async def fail(self, sid: str) -> None:
        assert sid == SW
        self.solo.stop()

    async def restart_empty(self, sid: str) -> None:
        self.solo = start_netconf([SW], self.solo.ports, self.workdir, reuse=self.solo)


@contextlib.asynccontextmanager
async def switches(kind: str, redis_url: str, tmp_path) -> AsyncIterator[Switches]:
    if kind == "agent":
        with agent_process(redis_url, tmp_path, **fabric()) as ag:
            yield AgentSwitches({"LIGHTPATH_OCS_SWITCH_AGENTS": ag.address}, ag)
    elif kind == "sonic":
        async with sonic_lab(FABRIC, tmp_path) as lab:
            yield SonicSwitches({"LIGHTPATH_OCS_SWITCHES": lab.switch_map()}, lab)
    else:
        others = {d for d in FABRIC.ocs_ids if d != SW}
        with netconf_lab(FABRIC, tmp_path / "main", only=others) as main:
            solo = start_netconf([SW], main.ports, tmp_path / "solo", keys_from=main)
            try:
                env = main.settings()
                env["LIGHTPATH_OCS_SWITCHES"] += f",{SW}={solo.url(SW)}"
                sw = NetconfSwitches(env, main)
                sw.solo, sw.workdir = solo, tmp_path / "solo"
                yield sw
            finally:
                sw.solo.stop()


@contextlib.asynccontextmanager
async def manager(redis_url: str, sw: Switches) -> AsyncIterator[Any]:
    env = {
        **fabric(),
        "LIGHTPATH_OCS_SWITCH_TIMEOUT_S": "2",
        "LIGHTPATH_OCS_CHANGE_LEASE_S": "6",
        "LIGHTPATH_OCS_RECONCILE_S": "0.2",
        **sw.env,
    }
    async with (
        serve("ocs_manager", redis_url, env) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch)


DRIVERS = ["agent", "sonic", "netconf"]


@pytest.mark.parametrize("kind", DRIVERS)
async def test_the_contract_holds_through_every_driver(redis_url, tmp_path, kind):
    async with switches(kind, redis_url, tmp_path) as sw, manager(redis_url, sw) as ocs:
        info = await ocs.GetInfo(common_pb2.GetInfoRequest())
        assert (
            info.attributes["switch_driver"]
            == {"agent": "agents", "sonic": "SONiC", "netconf": "NETCONF"}[kind]
        )
        assert info.attributes["switches_mismatched"] == ""
        assert info.attributes["health"] == "ok"
        await ocs.WireSlice(wire_request("beside", [2, 1, 1], [6, 7]))
        await ocs.WireSlice(wire_request("job", [2, 2, 1], [0, 1, 2, 3]))
        await invariants_hold(ocs)  # the switches hold exactly the committed tables

        # one switch fails: the change is undone everywhere and the caller is told which
        await sw.fail(SW)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ocs.ReplaceBlock(
                pb.ReplaceBlockRequest(job_id="job", failed_block_id=3, new_block_id=4)
            )
        rep = error_report(err.value)
        assert rep.code == grpc.StatusCode.UNAVAILABLE and SW in rep.message
        w = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="job"))
        assert [b.block_id for b in w.blocks] == [0, 1, 2, 3]

        # it comes back empty: the reconcile loop puts back what it held
        await sw.restart_empty(SW)
        await eventually_consistent(ocs)
        await ocs.ReplaceBlock(
            pb.ReplaceBlockRequest(job_id="job", failed_block_id=3, new_block_id=4)
        )
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
        await invariants_hold(ocs)


async def test_a_switch_described_before_its_ports_are_back_is_repaired_once_they_are(
    redis_url, tmp_path
):
    """A SONiC switch restarted empty whose Redis is back before orchagent has written
    its metadata and ports is described as not matching; it is described again on later
    passes and repaired once orchagent is up, without another restart."""
    async with sonic_lab(FABRIC, tmp_path) as lab:
        sw = SonicSwitches({"LIGHTPATH_OCS_SWITCHES": lab.switch_map()}, lab)
        async with manager(redis_url, sw) as ocs:
            await ocs.WireSlice(wire_request("job", [2, 2, 1], [0, 1, 2, 3]))
            await sw.fail(SW)
            lab[SW].server.start()  # back empty: no metadata, no ports yet
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                info = await ocs.GetInfo(common_pb2.GetInfoRequest())
                if info.attributes["switches_mismatched"].startswith(
                    f"{SW} (it is SWITCH_KIND_UNSPECIFIED"  # no switch_type in its metadata
                ):
                    break
                assert loop.time() < deadline, info.attributes
                await asyncio.sleep(0.05)
            await lab[SW].orchagent.start()  # the same boot: the metadata and ports appear
            await eventually_consistent(ocs)
            info = await ocs.GetInfo(common_pb2.GetInfoRequest())
            assert info.attributes["switches_mismatched"] == ""
            assert info.attributes["health"] == "ok"
            await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
            await invariants_hold(ocs)


async def test_a_switch_that_does_not_match_the_fabric_is_never_programmed(redis_url, tmp_path):
    async with sonic_lab(FABRIC, tmp_path, short={SW}) as lab:
        sw = SonicSwitches({"LIGHTPATH_OCS_SWITCHES": lab.switch_map()}, lab)
        async with manager(redis_url, sw) as ocs:
            info = await ocs.GetInfo(common_pb2.GetInfoRequest())
            assert info.attributes["switches_mismatched"].startswith(
                f"{SW} (it has 8 ports, the fabric cables 16)"  # its A side only: 7 B ports < 8
            )
            assert info.attributes["health"] == (
                f"degraded: switch {SW} does not match the fabric (it has 8 ports, the fabric "
                "cables 16): never programmed, changes needing it are refused"
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            rep = error_report(err.value)
            assert rep.code == grpc.StatusCode.ABORTED
            assert f"switch {SW} does not match the fabric" in rep.message
            # the other switches were not touched either
            report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
            assert report.ok, list(report.violations)
