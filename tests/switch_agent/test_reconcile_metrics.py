"""The reconcile loop shows in metrics and GetInfo (issue 20): switches it cannot read, the
repairs it sends by reason; a switch agent going away is the fabric's trouble, not the
manager's: the manager stays SERVING and says how many switches it cannot reach."""

from __future__ import annotations

import asyncio

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from lightpath.client import channel
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import optical_switch_pb2 as sb
from lightpath_services.ocs_manager import server as ocs_server
from lightpath_services.ocs_manager.metrics import OcsMetrics
from tests.helpers import serve
from tests.metrics_reader import assert_listed, install, until, value
from tests.ocs_manager.conftest import wire_request
from tests.switch_agent.conftest import POD, admin, agent_process, fabric, inject, manager_env


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, ocs_server, OcsMetrics, refresh_s=0.1)


async def test_unreachable_switches_and_repairs_are_counted(redis_url, tmp_path, reader):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with (
            serve("ocs_manager", redis_url, manager_env(ag)) as svc,
            channel(svc.address, max_attempts=1) as ch,
        ):
            ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
            await ocs.WireSlice(wire_request("s", [2, 2, 1], [0, 1, 2, 3]))
            # A restart is told from a drift by the boot id the loop saw before it: let one
            # pass read every switch first (under load the first pass can come late).
            first = await _passes(ocs)
            for _ in range(1500):
                if await _passes(ocs) > first:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("no reconcile pass in 30 s")
            async with admin(ag.address) as a:
                await a.RestartSwitch(sb.RestartSwitchRequest(switch_id="ocs-y-2-0"))
            await until(
                lambda: (
                    value(reader, "lightpath.ocs.switch_repairs", pod=POD, reason="restarted") == 1
                ),
                "the restarted switch repaired",
                timeout=30,
            )
            await inject(ag.address, "ocs-z-1-0", unreachable=True)
            await until(
                lambda: value(reader, "lightpath.ocs.switches_unreachable", pod=POD) == 1,
                "one switch unreachable",
                timeout=30,
            )
            info = await ocs.GetInfo(common_pb2.GetInfoRequest())
            assert info.attributes["switches_unreachable"] == "1"
            await inject(ag.address, "ocs-z-1-0")
            await until(
                lambda: value(reader, "lightpath.ocs.switches_unreachable", pod=POD) == 0,
                "every switch answers",
                timeout=30,
            )
            ag.kill()  # the whole agent: all 12 switches gone
            await until(
                lambda: value(reader, "lightpath.ocs.switches_unreachable", pod=POD) == 12,
                "every switch unreachable",
                timeout=30,
            )
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            assert_listed(reader)


async def _passes(ocs: ocs_manager_pb2_grpc.OcsManagerStub) -> int:
    info = await ocs.GetInfo(common_pb2.GetInfoRequest())
    return int(info.attributes["switch_reconcile_passes"])
