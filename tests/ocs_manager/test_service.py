"""Contract tests: every ocs_manager RPC and every error of the issue, over real gRPC and Redis."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio as aioredis

from lightpath.v1 import common_pb2
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath_services.common.keys import pod_key
from lightpath_services.common.settings import SettingsError
from lightpath_services.ocs_manager.server import FabricMismatchError
from tests.helpers import serve
from tests.ocs_manager.conftest import POD, fabric_env, ocs_stub, rpc_error, wire_request

C = grpc.StatusCode
COUNTS = pb.WIRING_VIEW_COUNTS

# -- fabric and port map (OCS-1, OCS-7) ----------------------------------------------


async def test_get_info_names_the_pod_and_its_fabric(ocs_k2):
    info = await ocs_k2.GetInfo(common_pb2.GetInfoRequest())
    assert info.service == "lightpath.v1.OcsManager" and info.pod_id == POD
    assert info.attributes["fabric"] == "4x4x4 blocks × 64, K=2, radix 136"
    assert info.attributes["ocs"] == "96"


async def test_get_fabric(ocs, ocs_k2):
    f = await ocs.GetFabric(pb.GetFabricRequest())
    assert f.pod_id == POD
    assert list(f.config.block_shape.dims) == [4, 4, 4]
    assert (f.config.block_count, f.config.ocs_per_axis) == (64, 1)
    assert (f.axes_per_dim, f.ocs_count, f.one_to_many_count) == (16, 48, 0)
    assert f.max_ports_used_per_ocs == 128 and list(f.dim_names) == ["x", "y", "z"]
    f2 = await ocs_k2.GetFabric(pb.GetFabricRequest())
    assert (f2.ocs_count, f2.one_to_many_count, f2.max_ports_used_per_ocs) == (96, 3072, 96)


async def test_plan_fabric_refuses_a_radix_too_small_naming_the_ports_needed(ocs):
    cfg = pb.FabricConfig(
        block_shape=common_pb2.Shape(dims=[4, 4, 4]), block_count=4, ocs_per_axis=2, ocs_radix=8
    )
    plan = await ocs.PlanFabric(pb.PlanFabricRequest(config=cfg))
    assert plan.max_ports_used_per_ocs == 6  # Fig. 12
    cfg.ocs_radix, cfg.block_count, cfg.ocs_per_axis = 100, 64, 1
    err = await rpc_error(ocs.PlanFabric(pb.PlanFabricRequest(config=cfg)))
    assert err.code == C.INVALID_ARGUMENT
    (field, rule), *_ = err.field_violations
    assert field == "config.ocs_radix" and "128" in rule


async def test_get_port_map_and_its_filters(ocs_k2):
    full = await ocs_k2.GetPortMap(pb.GetPortMapRequest())
    assert len(full.entries) == 64 * 48 * 2
    one = await ocs_k2.GetPortMap(pb.GetPortMapRequest(block_id=3, dim=1))
    assert len(one.entries) == 16 * 2
    second = [e for e in one.entries if e.segment.end == pb.SEGMENT_END_SECOND]
    assert all(len(e.ports) == 2 and e.one_to_many_id.startswith("otm-3-y-") for e in second)
    first = [e for e in one.entries if e.segment.end == pb.SEGMENT_END_FIRST]
    assert all(len(e.ports) == 1 and e.ports[0].ocs_id.endswith("-1") for e in first)  # 3 % 2
    on = await ocs_k2.GetPortMap(pb.GetPortMapRequest(ocs_id="ocs-z-7-0"))
    ports = sorted(p.port for e in on.entries for p in e.ports if p.ocs_id == "ocs-z-7-0")
    assert ports == list(range(96))
    err = await rpc_error(ocs_k2.GetPortMap(pb.GetPortMapRequest(block_id=64)))
    assert err.code == C.NOT_FOUND
    err = await rpc_error(ocs_k2.GetPortMap(pb.GetPortMapRequest(dim=3)))
    assert err.code == C.INVALID_ARGUMENT and err.field_violations[0][0] == "dim"
    err = await rpc_error(ocs_k2.GetPortMap(pb.GetPortMapRequest(ocs_id="ocs-x-0-2")))
    assert err.code == C.NOT_FOUND and "K=2" in err.message


# -- wire / release / replace ------------------------------------------------------------------


async def test_wire_answers_the_wiring_and_is_idempotent_by_job_id(ocs):
    req = wire_request("job-1", [2, 1, 1], [10, 3])
    w = await ocs.WireSlice(req)
    assert w.state == pb.SLICE_STATE_WIRED and not w.replayed
    assert w.cross_connect_count == len(w.cross_connects) == 2 * 16 + 2 * 2 * 16
    assert w.wired_at.seconds > 0 and list(w.wrap) == [True, True, True]
    assert [(b.block_id, list(b.position.coords)) for b in w.blocks] == [
        (10, [0, 0, 0]),
        (3, [1, 0, 0]),
    ]
    x = [c for c in w.cross_connects if c.a.dim == 0]
    assert {(c.port_a, c.port_b) for c in x} == {(64 + 10, 3), (64 + 3, 10)}
    assert all(c.job_id == "job-1" and c.a.end == pb.SEGMENT_END_SECOND for c in x)
    again = await ocs.WireSlice(req)
    assert again.replayed and list(again.cross_connects) == list(w.cross_connects)
    # blocks listed in another order: the same placement
    shuffled = wire_request("job-1", [2, 1, 1], [10, 3])
    shuffled.blocks.reverse()
    assert (await ocs.WireSlice(shuffled)).replayed


async def test_wire_with_a_different_placement_for_a_wired_job_is_failed_precondition(ocs):
    await ocs.WireSlice(wire_request("job-1", [2, 1, 1], [10, 3]))
    for other in (
        wire_request("job-1", [2, 1, 1], [3, 10]),
        wire_request("job-1", [2, 1, 1], [10, 3], wrap=[False, True, True]),
    ):
        err = await rpc_error(ocs.WireSlice(other))
        assert err.code == C.FAILED_PRECONDITION and err.reason == "SLICE_EXISTS"


async def test_a_block_wired_to_another_slice_is_failed_precondition(ocs):
    await ocs.WireSlice(wire_request("job-1", [2, 1, 1], [10, 3]))
    err = await rpc_error(ocs.WireSlice(wire_request("job-2", [2, 1, 1], [4, 3])))
    assert err.code == C.FAILED_PRECONDITION and err.reason == "BLOCK_IN_USE"
    assert err.precondition_violations[0][0] == "block 3" and "job-1" in err.message
    # refused without a trace: job-2 does not exist, block 4 is free
    assert (await rpc_error(ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="job-2")))).code == (
        C.NOT_FOUND
    )
    assert (await ocs.WireSlice(wire_request("job-3", [1, 1, 1], [4]))).state == (
        pb.SLICE_STATE_WIRED
    )
    assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))).ok


async def test_a_dimension_mismatch_is_invalid_argument(ocs):
    err = await rpc_error(ocs.WireSlice(wire_request("j", [2, 1], [1, 2])))
    assert err.code == C.INVALID_ARGUMENT and err.field_violations[0][0] == "grid.dims"
    assert "3 dimensions" in err.field_violations[0][1]


async def test_bad_placements_are_invalid_argument_naming_the_field(ocs):
    not_full = wire_request("j", [2, 2, 1], [1, 2, 3, 4])
    del not_full.blocks[3]
    twice_pos = wire_request("j", [2, 1, 1], [1, 2])
    twice_pos.blocks[1].position.coords[0] = 0
    cases = {
        "blocks": not_full,
        "blocks[1].position": twice_pos,
        "blocks[1].block_id": wire_request("j", [2, 1, 1], [5, 5]),
        "job_id": wire_request("bad id", [1, 1, 1], [5]),
        "wrap": wire_request("j", [1, 1, 1], [5], wrap=[True]),
        "grid": wire_request("j", [8, 8, 2], list(range(128))),
    }
    for field, req in cases.items():
        err = await rpc_error(ocs.WireSlice(req))
        assert err.code == C.INVALID_ARGUMENT, field
        assert field in [f for f, _ in err.field_violations], (field, err.field_violations)
    err = await rpc_error(ocs.WireSlice(wire_request("j", [2, 1, 1], [5, 64])))
    assert err.code == C.NOT_FOUND and "64" in err.message
    assert (await ocs.ListSlices(pb.ListSlicesRequest())).slices == []


async def test_expect_fabric_guards_against_a_k_or_radix_the_pod_does_not_have(ocs):
    ok = wire_request(
        "j", [1, 1, 1], [5], expect_fabric=pb.FabricConfig(ocs_per_axis=1, block_count=64)
    )
    assert (await ocs.WireSlice(ok)).cross_connect_count == 48
    bad = wire_request(
        "j2", [1, 1, 1], [6], expect_fabric=pb.FabricConfig(ocs_per_axis=2, ocs_radix=96)
    )
    err = await rpc_error(ocs.WireSlice(bad))
    assert err.code == C.FAILED_PRECONDITION and err.reason == "FABRIC_MISMATCH"
    assert "ocs_per_axis" in err.message and "ocs_radix" in err.message


async def test_counts_view(ocs):
    w = await ocs.WireSlice(wire_request("big", [4, 4, 4], list(range(64)), view=COUNTS))
    assert w.cross_connect_count == 3072 and len(w.cross_connects) == 0
    full = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="big"))
    assert len(full.cross_connects) == 3072
    assert len({(c.ocs_id, c.port_a) for c in full.cross_connects}) == 3072


async def test_release_removes_exactly_the_slice_and_then_not_found(ocs):
    await ocs.WireSlice(wire_request("keep", [1, 1, 1], [0]))
    before = await ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id="ocs-x-0-0"))
    await ocs.WireSlice(wire_request("job-1", [2, 1, 1], [10, 3]))
    rel = await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job-1"))
    assert (rel.cross_connects_removed, rel.one_to_many_cleared) == (96, 0)
    after = await ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id="ocs-x-0-0"))
    assert list(after.cross_connects) == list(before.cross_connects)
    assert after.version == before.version + 2  # wired, then released
    for job in ("job-1", "never"):
        err = await rpc_error(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id=job)))
        assert err.code == C.NOT_FOUND
    # its blocks are free again
    await ocs.WireSlice(wire_request("job-2", [1, 1, 1], [3]))


async def test_replace_block_moves_only_the_failed_blocks_cross_connects(ocs_k2):
    ocs = ocs_k2
    w = await ocs.WireSlice(wire_request("ring", [4, 1, 1], [0, 2, 4, 6]))
    rep = await ocs.ReplaceBlock(
        pb.ReplaceBlockRequest(job_id="ring", failed_block_id=4, new_block_id=5)
    )
    by_pos = {tuple(b.position.coords): b.block_id for b in rep.wiring.blocks}
    assert by_pos[(2, 0, 0)] == 5  # the failed block's logical position
    assert len(rep.removed) == len(rep.added) == 4 * 16  # x: in + out; y, z: self-loops
    assert all(4 in (c.a.block_id, c.b.block_id) for c in rep.removed)
    assert all(5 in (c.a.block_id, c.b.block_id) for c in rep.added)
    assert rep.untouched == w.cross_connect_count - 64
    old = {(c.ocs_id, c.port_a, c.port_b) for c in w.cross_connects}
    new = {(c.ocs_id, c.port_a, c.port_b) for c in rep.wiring.cross_connects}
    assert old - new == {(c.ocs_id, c.port_a, c.port_b) for c in rep.removed}
    assert new - old == {(c.ocs_id, c.port_a, c.port_b) for c in rep.added}
    moved = {(s.segment.block_id, s.idle) for s in rep.one_to_many_changed}
    assert moved == {(2, False), (4, True), (5, False)}  # 2's 1x2 now points at 5's OCS
    # the failed block is free, the new one taken
    await ocs.WireSlice(wire_request("other", [1, 1, 1], [4]))
    err = await rpc_error(ocs.WireSlice(wire_request("other2", [1, 1, 1], [5])))
    assert err.code == C.FAILED_PRECONDITION
    # a retry answers the same change, changing nothing
    again = await ocs.ReplaceBlock(
        pb.ReplaceBlockRequest(job_id="ring", failed_block_id=4, new_block_id=5, view=COUNTS)
    )
    assert again.wiring.replayed and len(again.added) == 64 and not again.wiring.cross_connects
    assert (await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))).ok


async def test_replace_block_errors(ocs):
    await ocs.WireSlice(wire_request("a", [2, 1, 1], [0, 1]))
    await ocs.WireSlice(wire_request("b", [1, 1, 1], [2]))

    def rep(job="a", failed=0, new=9):
        return ocs.ReplaceBlock(
            pb.ReplaceBlockRequest(job_id=job, failed_block_id=failed, new_block_id=new)
        )

    assert (await rpc_error(rep(job="nope"))).code == C.NOT_FOUND
    err = await rpc_error(rep(failed=5))
    assert err.code == C.FAILED_PRECONDITION and err.reason == "BLOCK_NOT_IN_SLICE"
    err = await rpc_error(rep(new=2))
    assert err.code == C.FAILED_PRECONDITION and "slice b" in err.message
    err = await rpc_error(rep(new=1))
    assert err.code == C.FAILED_PRECONDITION and "already in this slice" in err.message
    assert (await rpc_error(rep(new=0))).code == C.INVALID_ARGUMENT
    assert (await rpc_error(rep(new=64))).code == C.NOT_FOUND
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    assert report.ok and report.slices_checked == 2


# -- queries (OCS-7) -------------------------------------------------------------------------


async def test_a_malformed_job_id_is_invalid_argument_on_every_call(ocs):
    for call in (
        ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="a{b}")),
        ocs.ReplaceBlock(pb.ReplaceBlockRequest(job_id="", failed_block_id=1, new_block_id=2)),
        ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="x" * 65)),
        ocs.GetOneToManyStates(pb.GetOneToManyStatesRequest(job_id="a:b")),
        ocs.WireSlice(wire_request("a}", [1, 1, 1], [1])),
    ):
        err = await rpc_error(call)
        assert err.code == C.INVALID_ARGUMENT and err.field_violations[0][0] == "job_id"


async def test_get_slice_wiring_and_list_slices_pages(ocs):
    for i in range(5):
        await ocs.WireSlice(wire_request(f"job-{i}", [1, 1, 1], [i], view=COUNTS))
    w = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="job-3", view=COUNTS))
    assert w.cross_connect_count == 48 and not w.cross_connects and w.blocks[0].block_id == 3
    assert (await rpc_error(ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="x")))).code == (
        C.NOT_FOUND
    )
    seen, token = [], ""
    while True:
        page = await ocs.ListSlices(pb.ListSlicesRequest(page_size=2, page_token=token))
        seen += [(s.job_id, list(s.block_ids), s.cross_connects) for s in page.slices]
        token = page.next_page_token
        if not token:
            break
    assert seen == [(f"job-{i}", [i], 48) for i in range(5)]
    err = await rpc_error(ocs.ListSlices(pb.ListSlicesRequest(page_size=-1)))
    assert err.code == C.INVALID_ARGUMENT


async def test_get_routing_table_versions_and_segments(ocs):
    t0 = await ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id="ocs-y-3-0"))
    assert (t0.dim, t0.axis, t0.k, t0.version, len(t0.cross_connects)) == (1, 3, 0, 0, 0)
    await ocs.WireSlice(wire_request("j", [1, 2, 1], [7, 9]))
    t1 = await ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id="ocs-y-3-0"))
    assert t1.version == 1
    assert {(c.a.block_id, c.b.block_id, c.port_a, c.port_b) for c in t1.cross_connects} == {
        (7, 9, 64 + 7, 9),
        (9, 7, 64 + 9, 7),
    }
    assert all(c.job_id == "j" and c.a.axis == 3 and c.a.dim == 1 for c in t1.cross_connects)
    for bad in ("ocs-y-3-1", "ocs-q-0-0", "nope"):  # K = 1: no k = 1
        assert (
            await rpc_error(ocs.GetRoutingTable(pb.GetRoutingTableRequest(ocs_id=bad)))
        ).code == C.NOT_FOUND


async def test_list_switches_with_port_use_and_pages(ocs):
    await ocs.WireSlice(wire_request("j", [2, 1, 1], [7, 9]))
    switches, token = [], ""
    while True:
        page = await ocs.ListSwitches(pb.ListSwitchesRequest(page_size=20, page_token=token))
        switches += page.switches
        token = page.next_page_token
        if not token:
            break
    assert len(switches) == 48 and len({s.ocs_id for s in switches}) == 48
    assert all(s.radix == 136 and s.ports_cabled == 128 for s in switches)
    # x: 2 cross-connects (4 ports) per OCS; y, z: a self-loop per block (4 ports)
    assert all(s.ports_in_use == 4 and s.version == 1 for s in switches)
    err = await rpc_error(ocs.ListSwitches(pb.ListSwitchesRequest(page_token="zz")))
    assert err.code == C.INVALID_ARGUMENT and err.field_violations[0][0] == "page_token"


async def test_one_to_many_states(ocs, ocs_k2):
    assert not (await ocs.GetOneToManyStates(pb.GetOneToManyStatesRequest())).states  # K = 1
    await ocs_k2.WireSlice(wire_request("r", [2, 1, 1], [0, 1]))
    states = (await ocs_k2.GetOneToManyStates(pb.GetOneToManyStatesRequest(job_id="r"))).states
    assert len(states) == 2 * 48
    x0 = {s.switch_id: s for s in states if s.segment.block_id == 0 and s.segment.dim == 0}
    assert all(
        s.selected_output == 1 and s.job_id == "r" for s in x0.values()
    )  # 0 -> 1 lands on k=1
    assert [o.ocs_id for o in x0["otm-0-x-0"].outputs] == ["ocs-x-0-0", "ocs-x-0-1"]
    idle = (await ocs_k2.GetOneToManyStates(pb.GetOneToManyStatesRequest(block_id=5))).states
    assert len(idle) == 48 and all(s.selected_output == -1 and not s.job_id for s in idle)
    for req in (
        pb.GetOneToManyStatesRequest(block_id=64),
        pb.GetOneToManyStatesRequest(job_id="none"),
    ):
        assert (await rpc_error(ocs_k2.GetOneToManyStates(req))).code == C.NOT_FOUND


async def test_check_invariants_reports_a_tampered_table(ocs, redis_url):
    await ocs.WireSlice(wire_request("j", [2, 1, 1], [7, 9]))
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    assert report.ok and report.slices_checked == 1 and report.cross_connects_checked == 96
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    # a cross-connect behind the manager's back: block 20 (free) looped on ocs-x-*-0
    # (one table holds every axis' OCS of (x, k=0): second end 64 + 20, first end 20)
    await r.hset(pod_key(POD, "ocs", "xc2", "x", 0), mapping={"84": "20", "20": "84"})
    await r.aclose()
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    rules = {v.rule for v in report.violations}
    assert not report.ok
    assert {"UNWIRED_BLOCK_CONNECTED", "SLICE_WIRING_MISMATCH", "SWITCH_STATE_DISAGREES"} <= rules


async def test_every_table_hash_is_a_hash_table_from_the_start(ocs_k2, redis_url):
    # A small hash is a ziplist/listpack that every HMGET / HSET scans: a few small slices
    # on such tables doubled Redis' CPU per wire. The `layout` field prevents that.
    await ocs_k2.WireSlice(wire_request("j", [1, 1, 1], [3]))
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        keys = [
            pod_key(POD, role, kind, *rest)
            for role in ("ocs", "dev")
            for kind, rest in [("xc2", (d, k)) for d in "xyz" for k in (0, 1)]
            + [("otm2", (d,)) for d in "xyz"]
        ] + [pod_key(POD, "ocs", "ver")]
        encodings = {key: await r.object("encoding", key) for key in keys}
    finally:
        await r.aclose()
    assert set(encodings.values()) == {"hashtable"}, encodings


# -- the fabric a pod is wired with ------------------------------------------------------------


async def test_a_restart_with_another_fabric_is_refused_while_slices_are_wired(redis_url):
    async with ocs_stub(redis_url) as ocs:
        await ocs.WireSlice(wire_request("j", [1, 1, 1], [1], view=COUNTS))
    with pytest.raises(FabricMismatchError) as err:
        async with serve("ocs_manager", redis_url, fabric_env(k=2)):
            pass
    assert "K=1" in str(err.value) and "K=2" in str(err.value) and "1 slice" in str(err.value)
    async with ocs_stub(redis_url) as ocs:  # the same fabric: fine
        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="j"))
    async with ocs_stub(redis_url, k=2) as ocs:  # nothing wired: the fabric may change
        assert (await ocs.GetFabric(pb.GetFabricRequest())).config.ocs_per_axis == 2


async def test_an_instance_with_a_stale_fabric_refuses_changes(redis_url):
    async with ocs_stub(redis_url) as old:
        async with ocs_stub(redis_url, k=2):  # nothing wired: this one takes the pod over
            pass
        err = await rpc_error(old.WireSlice(wire_request("j", [1, 1, 1], [1])))
        assert err.code == C.FAILED_PRECONDITION and err.reason == "FABRIC_CHANGED"


def test_settings_refuse_a_radix_too_small():
    from lightpath_services.common.settings import load
    from lightpath_services.ocs_manager.settings import OcsManagerSettings

    with pytest.raises(SettingsError) as err:
        load(OcsManagerSettings, {"LIGHTPATH_FABRIC_OCS_RADIX": "100"})
    assert "LIGHTPATH_FABRIC_OCS_RADIX" in str(err.value) and "128" in str(err.value)
    with pytest.raises(SettingsError) as err:
        load(OcsManagerSettings, {"LIGHTPATH_FABRIC_BLOCK_SHAPE": "4x"})
    assert "LIGHTPATH_FABRIC_BLOCK_SHAPE" in str(err.value)
    s = load(
        OcsManagerSettings,
        {"LIGHTPATH_FABRIC_OCS_PER_AXIS": "2", "LIGHTPATH_FABRIC_OCS_RADIX": "96"},
    )
    assert s.fabric_config.ocs_per_axis == 2
