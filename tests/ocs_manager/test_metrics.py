"""A pod's fabric metrics move with its changes (issue 18): the real ocs_manager on a real
Redis, read through an in-memory reader of the test's own provider."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.common.keys import pod_key
from lightpath_services.ocs_manager import server as ocs_server
from lightpath_services.ocs_manager.metrics import OcsMetrics
from tests.metrics_reader import assert_listed, install, points, until, value
from tests.ocs_manager.conftest import POD, ocs_stub, rpc_error, wire_request


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, ocs_server, OcsMetrics, refresh_s=0.1)


async def test_wire_and_release_move_cross_connects_ports_1xk_states_and_change_times(
    redis_url, reader
):
    async with ocs_stub(redis_url, k=2, blocks=16) as ocs:
        switches = 16 * 3 * 16  # a 1xK switch per block, dim and axis (4x4 axes a dim)
        await until(
            lambda: (
                value(reader, "lightpath.ocs.one_to_many.states", pod=POD, output="none")
                == switches
            ),
            "every 1xK switch idle",
        )
        assert value(reader, "lightpath.ocs.cross_connects", pod=POD) == 0
        # an OCS per dim, axis and k
        assert len(points(reader, "lightpath.ocs.cross_connects")) == 3 * 16 * 2

        w = await ocs.WireSlice(wire_request("job-1", [2, 1, 1], [10, 3]))
        assert w.cross_connect_count > 0
        assert value(reader, "lightpath.ocs.change.duration", op="wire", outcome="ok") == 1
        await until(
            lambda: value(reader, "lightpath.ocs.cross_connects", pod=POD) == w.cross_connect_count,
            "the slice's cross-connects counted",
        )
        assert value(reader, "lightpath.ocs.port_utilization", pod=POD) > 0
        assert value(reader, "lightpath.ocs.one_to_many.states", pod=POD, output="none") < switches
        assert value(reader, "lightpath.ocs.one_to_many.states", pod=POD) == switches

        assert (await ocs.WireSlice(wire_request("job-1", [2, 1, 1], [10, 3]))).replayed
        assert value(reader, "lightpath.ocs.change.duration", op="wire", outcome="replayed") == 1
        err = await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="no-such-job")))
        assert err.code == grpc.StatusCode.NOT_FOUND
        assert (
            value(reader, "lightpath.ocs.change.duration", op="release", outcome="not_found") == 1
        )

        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job-1"))
        assert value(reader, "lightpath.ocs.change.duration", op="release", outcome="ok") == 1
        await until(
            lambda: (
                value(reader, "lightpath.ocs.cross_connects", pod=POD) == 0
                and value(reader, "lightpath.ocs.port_utilization", pod=POD) == 0
            ),
            "no cross-connect left",
        )
        assert_listed(reader)


async def test_a_failed_invariant_check_counts_its_rules(redis_url, reader):
    async with ocs_stub(redis_url) as ocs:
        assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest())).ok
        assert value(reader, "lightpath.ocs.invariant_failures") == 0
        r = aioredis.Redis.from_url(redis_url, decode_responses=True)
        # a cross-connect behind the manager's back (as test_service does)
        await r.hset(pod_key(POD, "ocs", "xc2", "x", 0), mapping={"84": "20", "20": "84"})
        await r.aclose()
        report = await ocs.CheckInvariants(pb.CheckInvariantsRequest())
        assert not report.ok
        rule = report.violations[0].rule
        assert value(reader, "lightpath.ocs.invariant_failures", pod=POD, rule=rule) == sum(
            1 for v in report.violations if v.rule == rule
        )
        assert_listed(reader)


async def test_a_switched_pod_counts_the_ring_channels_it_reserves(redis_url, reader):
    from lightpath.client import channel
    from lightpath.v1 import ocs_manager_pb2_grpc
    from tests.helpers import serve
    from tests.switched.test_service import POD as SW_POD
    from tests.switched.test_service import degrees, env, tiles

    async with (
        serve("ocs_manager", redis_url, env()) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        sw = ocs_manager_pb2_grpc.OcsManagerStub(ch)
        await until(
            lambda: points(reader, "lightpath.ocs.ring_channels"), "the ring channels gauge"
        )
        assert value(reader, "lightpath.ocs.ring_channels", pod=SW_POD) == 0
        res = await sw.ReserveRings(
            pb.ReserveRingsRequest(job_id="demo", degrees=degrees(2, 3, 3), tiles=tiles(0, 1))
        )
        assert res.channel_count > 0
        assert value(reader, "lightpath.ocs.change.duration", pod=SW_POD, op="wire") == 1
        await until(
            lambda: value(reader, "lightpath.ocs.ring_channels", pod=SW_POD) == res.channel_count,
            "the reserved channels counted",
        )
        await sw.ReleaseRings(pb.ReleaseRingsRequest(job_id="demo"))
        assert value(reader, "lightpath.ocs.change.duration", pod=SW_POD, op="release") == 1
        await until(
            lambda: value(reader, "lightpath.ocs.ring_channels", pod=SW_POD) == 0,
            "the channels released",
        )
        assert_listed(reader)


def test_the_rules_exported_at_0_are_every_rule_a_check_reports():
    """OcsMetrics.serving exports invariant failures at 0 for each rule of RULES, so an
    alert's increase() sees a rule's first failure (issue 33): RULES must name every
    rule the checks can report."""
    import re
    from pathlib import Path

    from lightpath_services.ocs_manager import invariants
    from lightpath_services.ocs_manager.switched import invariants as switched

    here = Path(invariants.__file__).parent
    rule = re.compile(r'(?:bad\(|Violation\()\s*"([A-Z_]+)"')
    torus = {
        r for f in (here / "invariants.py", here / "server.py") for r in rule.findall(f.read_text())
    }
    rings = set(rule.findall((here / "switched" / "invariants.py").read_text()))
    assert torus == set(invariants.RULES)
    assert rings == set(switched.RULES)
