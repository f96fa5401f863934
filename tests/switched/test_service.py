"""Contract tests of a SWITCHED pod's fabric manager (ocs_manager with
LIGHTPATH_FABRIC_KIND=SWITCHED) over gRPC with a real Redis (SW-1 … SW-6)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from lightpath.client import channel
from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import RingPlan
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as pb
from tests.helpers import serve
from tests.ocs_manager.conftest import rpc_error
from tests.switched.ringcheck import assert_valid

POD = "pod-sw"
# Fig. 9-11 groups of 3x3 processors, two cluster rows of four groups, 9 planes.
SPEC = "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64"


def env(pod: str = POD, spec: str = SPEC, **extra: str) -> dict[str, str]:
    return {
        "LIGHTPATH_POD_ID": pod,
        "LIGHTPATH_FABRIC_KIND": "SWITCHED",
        "LIGHTPATH_SWITCHED_FABRIC": spec,
        **extra,
    }


@contextlib.asynccontextmanager
async def switched_stub(redis_url: str, **kw) -> AsyncIterator[ocs_manager_pb2_grpc.OcsManagerStub]:
    async with (
        serve("ocs_manager", redis_url, env(**kw)) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        yield ocs_manager_pb2_grpc.OcsManagerStub(ch)


@pytest.fixture
async def sw(redis_url):
    async with switched_stub(redis_url) as stub:
        yield stub


def tiles(*groups: int) -> list[pb.GroupTile]:
    return [pb.GroupTile(group=g) for g in groups]  # unset size: the whole group


def degrees(d: int, p: int, l: int) -> common_pb2.ParallelismDegrees:  # noqa: E741
    return common_pb2.ParallelismDegrees(data=d, pipeline=p, layer=l)


def plan_of(res: pb.RingReservation) -> RingPlan:
    """Rebuild the domain plan from the names and channel ids a client sees."""
    from lightpath.domain.switched_rings import Degrees, Hop, Ring, Tile

    f = build_fabric(SwitchedFabricConfig.parse(SPEC))
    node = {f.node_name(n): n for n in range(f.processor_count + f.switch_count)}
    rings = []
    for r in res.rings:
        other = [a[0] for a in ("data", "pipeline", "layer") if a != r.axis]
        inner = r.name[r.name.index("(") + 1 : -1].split(",")
        key = tuple(int(x.split("=")[1]) for x in inner)
        assert [x.split("=")[0] for x in inner] == other
        rings.append(
            Ring(
                r.axis,
                (key[0], key[1]),
                tuple(node[p] for p in r.processors),
                tuple(Hop(tuple(node[n] for n in h.nodes), tuple(h.channel_ids)) for h in r.hops),
            )
        )
    return RingPlan(
        res.job_id,
        Degrees(res.degrees.data, res.degrees.pipeline, res.degrees.layer),
        tuple(Tile(t.group, t.row, t.col, t.height, t.width) for t in res.tiles),
        tuple(node[p] for p in res.assignment),
        tuple(rings),
    )


async def test_info_and_fabric_say_switched(sw):
    info = await sw.GetInfo(common_pb2.GetInfoRequest())
    assert info.attributes["fabric_kind"] == "SWITCHED"
    assert info.attributes["fabric"] == SPEC
    fab = await sw.GetSwitchedFabric(pb.GetSwitchedFabricRequest())
    assert (fab.groups, fab.processors, fab.lanes) == (8, 72, 3)
    assert list(fab.config.group_shape.dims) == [3, 3] and fab.config.tier0_up_ports == 16
    assert fab.tier0_switches == 2 * 9 + 4 * 9


async def test_the_demo_job_reserves_valid_rings_and_answers_their_paths(sw):
    """(data, pipeline, layer) = (4, 3, 3) on four 3x3 groups under one row switch."""
    res = await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="demo", degrees=degrees(4, 3, 3), tiles=tiles(0, 1, 2, 3))
    )
    assert not res.replayed and res.version == 1
    assert len(res.rings) == 9 + 12 + 12
    assert "up" not in res.channels_by_kind  # one cluster row: no tier-1
    assert res.channel_count == sum(r.channel_count for r in res.rings)
    f = build_fabric(SwitchedFabricConfig.parse(SPEC))
    assert_valid(f, plan_of(res))
    layer = next(r for r in res.rings if r.name == "layer(d=0,p=0)")
    assert layer.processors == ["g0.0/pr11", "g0.0/pr21", "g0.0/pr31"]
    assert layer.hops[-1].nodes[1].startswith("c0/p")  # closes through its column switch
    assert " -> " in layer.hops[0].channels[0]
    # idempotent retry; the stored paths read back
    again = await sw.ReserveRings(
        pb.ReserveRingsRequest(
            job_id="demo",
            degrees=degrees(4, 3, 3),
            tiles=tiles(3, 2, 1, 0),
            view=pb.RING_VIEW_SUMMARY,
        )
    )
    assert again.replayed and not again.rings[0].hops
    got = await sw.GetRings(pb.GetRingsRequest(job_id="demo", rings=["data(p=1,l=1)"]))
    assert [r.name for r in got.rings] == ["data(p=1,l=1)"]
    assert got.rings[0].processors == ["g0.0/pr22", "g0.1/pr22", "g0.2/pr22", "g0.3/pr22"]
    listed = await sw.ListRingReservations(pb.ListRingReservationsRequest())
    assert [r.job_id for r in listed.reservations] == ["demo"]
    report = await sw.CheckInvariants(pb.CheckInvariantsRequest())
    assert report.ok and report.rings_checked == 33 and report.channels_checked == res.channel_count


async def test_link_use_and_free_uplinks(sw):
    await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="a", degrees=degrees(2, 3, 3), tiles=tiles(0, 5))
    )  # g0.0 and g1.1 share no switch: through tier 1
    use = await sw.ListSwitchLinkUse(pb.ListSwitchLinkUseRequest(switches=["r0/p0", "r1/p0"]))
    assert [u.switch for u in use.switches] == ["r0/p0", "r1/p0"]
    assert all(u.down_links == 8 and u.up_links == 16 for u in use.switches)
    free = await sw.GetFreeUplinks(pb.GetFreeUplinksRequest())
    assert free.uplinks == 54 * 16
    used = free.uplinks - free.free_uplinks
    assert used > 0
    assert free.switches[0].free_uplinks < 16  # fewest free first
    page = await sw.ListSwitchLinkUse(pb.ListSwitchLinkUseRequest(tier=1, page_size=10))
    assert len(page.switches) == 10 and all(u.tier == 1 for u in page.switches)
    rest = await sw.ListSwitchLinkUse(
        pb.ListSwitchLinkUseRequest(tier=1, page_size=1000, page_token=page.next_page_token)
    )
    assert len(page.switches) + len(rest.switches) == 2 * (9 + 9) and not rest.next_page_token
    t1_used = sum(u.down_in_use for u in page.switches) + sum(u.down_in_use for u in rest.switches)
    assert t1_used == used


async def test_release_frees_exactly_the_job(sw):
    a = await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="a", degrees=degrees(1, 3, 3), tiles=tiles(0))
    )
    await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="b", degrees=degrees(1, 3, 3), tiles=tiles(1))
    )
    out = await sw.ReleaseRings(pb.ReleaseRingsRequest(job_id="a"))
    assert (out.rings_released, out.channels_released) == (len(a.rings), a.channel_count)
    err = await rpc_error(sw.GetRings(pb.GetRingsRequest(job_id="a")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(sw.ReleaseRings(pb.ReleaseRingsRequest(job_id="a")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    assert (await sw.CheckInvariants(pb.CheckInvariantsRequest())).ok
    # the freed group takes a new job
    await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="c", degrees=degrees(1, 3, 3), tiles=tiles(0))
    )


async def test_a_caller_with_an_older_lease_on_the_job_cannot_change_its_rings(
    redis_url, monkeypatch
):
    """Ring reservations are fenced as slices are (issue 32): the workload scheduler's
    lease on the job travels with ReserveRings, SwapGroup and ReleaseRings; a replica
    that lost the job to a take-over (a higher epoch seen) and wakes is refused
    FAILED_PRECONDITION STALE_LEASE, counted, the new holder's rings untouched."""
    from lightpath_services.ocs_manager import server as ocs_server
    from lightpath_services.ocs_manager.metrics import OcsMetrics
    from lightpath_services.workload_scheduler.ocs import OcsError, OcsManagerClient
    from tests.metrics_reader import install, value

    reader = install(monkeypatch, ocs_server, OcsMetrics, refresh_s=0.1)
    async with (
        serve("ocs_manager", redis_url, env(pod="pod-swl")) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        sw = ocs_manager_pb2_grpc.OcsManagerStub(ch)
        rings = OcsManagerClient(ch).for_rings()
        held = await sw.ReserveRings(
            pb.ReserveRingsRequest(
                job_id="a", degrees=degrees(3, 3, 3), tiles=tiles(0, 1, 2), lease_id="a#3",
                lease_token=4,
            )
        )  # fmt: skip
        # another replica took the job over (epoch 6) and swapped a group
        swapped = await sw.SwapGroup(
            pb.SwapGroupRequest(
                job_id="a", failed_group=1, free_groups=[3], lease_id="a#3", lease_token=6
            )
        )
        stale = [
            sw.ReleaseRings(pb.ReleaseRingsRequest(job_id="a", lease_id="a#3", lease_token=5)),
            sw.SwapGroup(
                pb.SwapGroupRequest(
                    job_id="a", failed_group=0, free_groups=[4], lease_id="a#3", lease_token=4
                )
            ),
        ]
        for call in stale:
            err = await rpc_error(call)
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION, err
            assert err.reason == "STALE_LEASE" and "newer holder" in err.message
        got = await sw.GetRings(pb.GetRingsRequest(job_id="a"))
        assert got.version == swapped.reservation.version == held.version + 1
        assert sorted({t.group for t in got.tiles}) == [0, 2, 3]
        assert value(reader, "lightpath.ocs.stale_writes_refused", where="lease") == 2
        # the scheduler's client sends its lease: the stale one refused, the holder's freed
        with pytest.raises(OcsError) as refused:
            await rings.release("a", lease=("a#3", 5))
        assert refused.value.reason == "STALE_LEASE"
        assert await rings.release("a", lease=("a#3", 6)) is True
        assert (await sw.CheckInvariants(pb.CheckInvariantsRequest())).ok
        # a token beyond what the scripts compare exactly is refused, naming the field
        err = await rpc_error(
            sw.ReleaseRings(pb.ReleaseRingsRequest(job_id="a", lease_token=2**53))
        )
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "lease_token" in err.message


async def test_swap_reroutes_only_the_failed_groups_rings(sw):
    first = await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="a", degrees=degrees(3, 3, 3), tiles=tiles(0, 1, 2))
    )
    out = await sw.SwapGroup(pb.SwapGroupRequest(job_id="a", failed_group=1, free_groups=[7, 3, 5]))
    assert out.new_tile.group_name == "g0.3"  # same cluster row (tier-0 switch) first
    assert out.old_tile.group_name == "g0.1"
    assert out.rings_untouched == len(first.rings) - len(out.rerouted)
    before = {r.name: r for r in first.rings}
    for r in out.reservation.rings:
        if r.name not in out.rerouted:
            assert r == before[r.name]
        else:
            assert any(p.startswith("g0.3/") for p in r.processors)
    assert out.reservation.version == 2
    assert (await sw.CheckInvariants(pb.CheckInvariantsRequest())).ok


async def test_degrees_below_one_are_refused_and_nothing_is_stored(sw):
    """Issue 19: 0/0/0 used to be read as 1/1/1 and stored a reservation the
    workload scheduler did not know, which then kept a valid job off the pod."""
    for given, fields in (
        (degrees(0, 0, 0), ["degrees.data", "degrees.pipeline", "degrees.layer"]),
        (degrees(4, 0, 3), ["degrees.pipeline"]),
        (common_pb2.ParallelismDegrees(), ["degrees.data", "degrees.pipeline", "degrees.layer"]),
    ):
        err = await rpc_error(
            sw.ReserveRings(pb.ReserveRingsRequest(job_id="zero", degrees=given, tiles=tiles(0)))
        )
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
        assert [f for f, _ in err.field_violations] == fields, err
        assert all("must be at least 1" in rule for _, rule in err.field_violations), err
    listed = await sw.ListRingReservations(pb.ListRingReservationsRequest())
    assert not listed.reservations
    assert (await rpc_error(sw.GetRings(pb.GetRingsRequest(job_id="zero")))).code == (
        grpc.StatusCode.NOT_FOUND
    )
    # The pod is not held: the tile is free for a real job.
    ok = await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="real", degrees=degrees(1, 3, 3), tiles=tiles(0))
    )
    assert ok.job_id == "real" and not ok.replayed


async def test_bad_requests_name_the_field(sw):
    cases = [
        (
            pb.ReserveRingsRequest(job_id="bad id", degrees=degrees(1, 3, 3), tiles=tiles(0)),
            "job_id",
        ),
        (pb.ReserveRingsRequest(job_id="x", degrees=degrees(2, 3, 3), tiles=tiles(0)), "degrees"),
        (
            pb.ReserveRingsRequest(
                job_id="x",
                degrees=degrees(1, 1, 2),
                tiles=[pb.GroupTile(group=0, row=2, col=2, height=2, width=2)],
            ),
            "tiles[0]",
        ),
        (pb.ReserveRingsRequest(job_id="x", degrees=degrees(1, 1, 2), tiles=[]), "tiles"),
    ]
    for request, field in cases:
        err = await rpc_error(sw.ReserveRings(request))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
        assert err.field_violations[0][0] == field, err
    err = await rpc_error(
        sw.ReserveRings(
            pb.ReserveRingsRequest(job_id="x", degrees=degrees(1, 3, 3), tiles=tiles(99))
        )
    )
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(sw.ListSwitchLinkUse(pb.ListSwitchLinkUseRequest(switches=["r9/p0"])))
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(sw.GetFreeUplinks(pb.GetFreeUplinksRequest(switches=["t1r/p0/0"])))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    await sw.ReserveRings(
        pb.ReserveRingsRequest(job_id="a", degrees=degrees(1, 3, 3), tiles=tiles(0))
    )
    err = await rpc_error(
        sw.ReserveRings(
            pb.ReserveRingsRequest(job_id="b", degrees=degrees(1, 3, 3), tiles=tiles(0))
        )
    )
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "PROCESSORS_IN_USE"
    err = await rpc_error(
        sw.ReserveRings(
            pb.ReserveRingsRequest(job_id="a", degrees=degrees(1, 3, 3), tiles=tiles(1))
        )
    )
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "JOB_EXISTS"
    err = await rpc_error(
        sw.SwapGroup(pb.SwapGroupRequest(job_id="a", failed_group=4, free_groups=[5]))
    )
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "GROUP_NOT_IN_JOB"
    assert (await sw.CheckInvariants(pb.CheckInvariantsRequest())).ok  # refusals left no trace


async def test_running_out_of_uplinks_is_resource_exhausted_naming_the_switch(redis_url):
    # two cluster rows of 1-D chains, one tier-1 switch, 1 uplink per tier-0 switch
    spec = "group=4 cluster=2x4 planes=1 ports=8/1 tier1=1x8"
    async with switched_stub(redis_url, spec=spec) as sw:
        await sw.ReserveRings(
            pb.ReserveRingsRequest(job_id="a", degrees=degrees(8, 1, 1), tiles=tiles(0, 4))
        )
        err = await rpc_error(
            sw.ReserveRings(
                pb.ReserveRingsRequest(job_id="b", degrees=degrees(8, 1, 1), tiles=tiles(1, 5))
            )
        )
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "tier-0 switch r0/p0 has 0 free uplinks, ring data(p=0,l=0) needs 1" in err.message
        assert err.reason == "UPLINKS_EXHAUSTED"


async def test_each_kind_refuses_the_other_kinds_calls(redis_url, sw):
    err = await rpc_error(sw.WireSlice(pb.WireSliceRequest(job_id="x")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "FABRIC_KIND"
    async with (
        serve("ocs_manager", redis_url, {"LIGHTPATH_POD_ID": "pod-o"}) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        ocs = ocs_manager_pb2_grpc.OcsManagerStub(ch)
        info = await ocs.GetInfo(common_pb2.GetInfoRequest())
        assert info.attributes["fabric_kind"] == "OCS_TORUS"
        err = await rpc_error(ocs.ReserveRings(pb.ReserveRingsRequest(job_id="x")))
        assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "FABRIC_KIND"


async def test_a_bad_switched_fabric_setting_fails_at_start(redis_url):
    from lightpath_services.common.settings import SettingsError

    with pytest.raises(SettingsError, match=r"LIGHTPATH_SWITCHED_FABRIC.*needs 50 down ports"):
        async with switched_stub(
            redis_url, spec="group=4x4 cluster=2x25 planes=4 ports=48/16 tier1=1x64"
        ):
            pass


async def test_three_replicas_reserving_concurrently_never_share_a_channel(redis_url):
    """Jobs race for scarce uplinks through three servers on one Redis."""
    spec = "group=4 cluster=2x6 planes=1 ports=12/3 tier1=1x8"
    async with (
        serve("ocs_manager", redis_url, env(spec=spec)) as s1,
        serve("ocs_manager", redis_url, env(spec=spec)) as s2,
        serve("ocs_manager", redis_url, env(spec=spec)) as s3,
    ):
        chans = [channel(s.address, max_attempts=1) for s in (s1, s2, s3)]
        async with chans[0] as c1, chans[1] as c2, chans[2] as c3:
            stubs = [ocs_manager_pb2_grpc.OcsManagerStub(c) for c in (c1, c2, c3)]

            async def one(k: int):
                try:
                    return await stubs[k % 3].ReserveRings(
                        pb.ReserveRingsRequest(
                            job_id=f"j{k}", degrees=degrees(8, 1, 1), tiles=tiles(k, 6 + k)
                        )
                    )
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        grpc.StatusCode.ABORTED,
                    ), e
                    return None

            results = await asyncio.gather(*(one(k) for k in range(6)))
            assert sum(r is not None for r in results) == 3  # 3 uplinks per tier-0 switch
            report = await stubs[1].CheckInvariants(pb.CheckInvariantsRequest())
            assert report.ok, report.violations
            assert report.slices_checked == 3
