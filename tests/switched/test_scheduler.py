"""The workload scheduler serving a SWITCHED pod, with the real switched
ocs_manager and Redis over gRPC (SW-2, SW-3, SW-5; rings SW-4)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest

from lightpath.domain.blocks import PodFabric
from lightpath.domain.slices import PENDING, SliceDemand, SliceJob
from lightpath.domain.switched import SwitchedFabricConfig, build_fabric
from lightpath.domain.switched_rings import Degrees
from lightpath.v1 import common_pb2, ocs_manager_pb2_grpc, workload_scheduler_pb2_grpc
from lightpath.v1 import ocs_manager_pb2 as ocs
from lightpath.v1 import workload_scheduler_pb2 as ws
from lightpath_services.workload_scheduler.fabric_kinds import planner_for
from lightpath_services.workload_scheduler.placement import PodState
from lightpath_services.workload_scheduler.planner import Allocation
from tests.helpers import serve
from tests.workload_scheduler.conftest import POD as WS_POD
from tests.workload_scheduler.conftest import pod_stack, rpc_error

POD = WS_POD
SPEC = "group=3x3 cluster=2x4 planes=9 ports=48/16 tier1=2x64"


@dataclass
class SwitchedStack:
    ocs: ocs_manager_pb2_grpc.OcsManagerStub
    schedulers: list[workload_scheduler_pb2_grpc.WorkloadSchedulerStub]
    addresses: list[str]

    @property
    def ws(self):
        return self.schedulers[0]

    async def admit(self, job_id: str, d: int, p: int, l: int, *, replica: int = 0, **spec):  # noqa: E741
        return await self.schedulers[replica].AdmitJob(
            ws.AdmitJobRequest(
                spec=ws.JobSpec(
                    job_id=job_id,
                    parallelism=common_pb2.ParallelismDegrees(data=d, pipeline=p, layer=l),
                    **spec,
                )
            )
        )

    async def job(self, job_id: str, rings: bool = False) -> ws.Job:
        return await self.ws.GetJob(ws.GetJobRequest(job_id=job_id, include_rings=rings))

    async def report(self, group: int, health=common_pb2.BLOCK_HEALTH_FAILED):
        return await self.ws.ReportBlockHealth(
            ws.ReportBlockHealthRequest(block_id=group, health=health, reason="test")
        )

    async def settle(self, timeout: float = 15.0) -> ws.PodView:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last, same = None, 0
        while loop.time() < deadline:
            view = await self.ws.GetPod(ws.GetPodRequest())
            now = [(j.job_id, j.state) for j in view.live_jobs]
            if all(s != common_pb2.JOB_STATE_WIRING for _, s in now) and now == last:
                same += 1
                if same >= 3:
                    return view
            else:
                same = 0
            last = now
            await asyncio.sleep(0.03)
        raise AssertionError(f"pod did not settle: {last}")

    async def assert_consistent(self) -> None:
        """No group in two large jobs, no processor in two small jobs, every RUNNING
        job holds exactly the rings the fabric manager has, and its invariants hold."""
        view = await self.ws.GetPod(ws.GetPodRequest())
        running, procs, groups = {}, set(), {}
        for s in view.live_jobs:
            job = await self.job(s.job_id)
            if job.state == common_pb2.JOB_STATE_RUNNING:
                running[job.job_id] = job
            if job.state in (common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_WIRING):
                for t in job.switched.tiles:
                    cells = {
                        (t.group, t.row + i, t.col + j)
                        for i in range(t.height)
                        for j in range(t.width)
                    }
                    assert not cells & procs, job.job_id
                    procs |= cells
                    if not job.switched.small:
                        assert t.group not in groups, (t.group, groups.get(t.group), job.job_id)
                        groups[t.group] = job.job_id
        listed = await self.ocs.ListRingReservations(
            ocs.ListRingReservationsRequest(page_size=1000)
        )
        assert {r.job_id for r in listed.reservations} == set(running)
        for r in listed.reservations:
            assert sorted((t.group, t.row, t.col, t.height, t.width) for t in r.tiles) == sorted(
                (t.group, t.row, t.col, t.height, t.width) for t in running[r.job_id].switched.tiles
            )
        report = await self.ocs.CheckInvariants(ocs.CheckInvariantsRequest())
        assert report.ok, list(report.violations)


@contextlib.asynccontextmanager
async def switched_stack(
    redis_url: str, *, spec: str = SPEC, small: int = 2, replicas: int = 1
) -> AsyncIterator[SwitchedStack]:
    """issue 4's pod stack with the ocs_manager serving a SWITCHED fabric."""
    async with pod_stack(
        redis_url,
        replicas=replicas,
        types="npu",
        ocs_environ={
            "LIGHTPATH_POD_ID": POD,
            "LIGHTPATH_FABRIC_KIND": "SWITCHED",
            "LIGHTPATH_SWITCHED_FABRIC": spec,
        },
        ws_environ={"LIGHTPATH_SWITCHED_SMALL_GROUPS": str(small)},
    ) as p:
        yield SwitchedStack(p.ocs, p.schedulers, p.addresses)


@pytest.fixture
async def pod(redis_url) -> AsyncIterator[SwitchedStack]:
    async with switched_stack(redis_url) as p:
        yield p


async def test_the_demo_job_runs_under_one_tier0_switch_with_its_rings(pod):
    """(data, pipeline, layer) = (4, 3, 3) on four 3x3 groups (Fig. 9-11)."""
    res = await pod.admit("demo", 4, 3, 3)
    info = await pod.ws.GetInfo(common_pb2.GetInfoRequest())  # once the fabric is known
    assert info.attributes["fabric_kind"] == "SWITCHED"
    job = res.job
    assert job.state == common_pb2.JOB_STATE_RUNNING, job.reason
    assert "33 rings on 4 groups" in job.reason and "(0 through tier 1)" in job.reason
    assert [b.block_id for b in job.blocks] == [0, 1, 2, 3]  # cluster row 0: one row switch
    assert list(job.chips.dims) == [36] and not job.switched.small
    full = await pod.job("demo", rings=True)
    assert len(full.switched.rings.rings) == 33
    assert full.switched.rings.rings[0].hops  # paths included
    view = await pod.ws.GetPod(ws.GetPodRequest())
    assert view.fabric_kind == common_pb2.FABRIC_KIND_SWITCHED
    assert view.switched.fabric.spec == SPEC and list(view.switched.small_groups) == [6, 7]
    used = [s for s in view.switched.switches if s.down_in_use]
    assert used and all(s.switch.startswith(("r0/", "c")) for s in used)
    await pod.assert_consistent()
    done = await pod.ws.CompleteJob(ws.CompleteJobRequest(job_id="demo"))
    assert done.state == common_pb2.JOB_STATE_COMPLETED
    err = await rpc_error(pod.ocs.GetRings(ocs.GetRingsRequest(job_id="demo")))
    assert err.code == grpc.StatusCode.NOT_FOUND  # its rings were released


async def test_small_jobs_are_packed_into_the_small_groups(pod):
    a = (await pod.admit("a", 1, 2, 2)).job
    b = (await pod.admit("b", 3, 1, 1)).job
    c = (await pod.admit("c", 2, 1, 2)).job
    assert a.state == b.state == c.state == common_pb2.JOB_STATE_RUNNING
    assert a.switched.small and b.switched.small
    ta, tb, tc = a.switched.tiles[0], b.switched.tiles[0], c.switched.tiles[0]
    assert (ta.group, ta.row, ta.col, ta.height, ta.width) == (6, 0, 0, 2, 2)
    # b fits beside a in the fuller group (its free bottom row); c's 2x2 no longer does
    assert (tb.group, tb.row, tb.col, tb.height, tb.width) == (6, 2, 0, 1, 3)
    assert tc.group == 7
    view = await pod.ws.GetPod(ws.GetPodRequest())
    assert set(view.switched.small_tiles) == {"a", "b", "c"}
    assert view.blocks[6].availability == common_pb2.BLOCK_AVAILABILITY_ALLOCATED
    await pod.assert_consistent()


async def test_a_failed_group_is_swapped_under_a_shared_switch_and_a_small_job_moves(pod):
    await pod.admit("big", 4, 3, 3)  # groups 0-3 (row 0)
    await pod.admit("small", 1, 3, 3)  # fills small group 6
    resp = await pod.report(1)
    r = resp.replacement
    assert (r.failed_block_id, r.new_block_id) == (1, 5)  # g1.1 shares column switches with g0.1
    assert r.rings_rerouted > 0 and r.rings_untouched > 0 and r.cross_connects_moved == 0
    job = await pod.job("big")
    assert sorted(b.block_id for b in job.blocks) == [0, 2, 3, 5]
    resp = await pod.report(6)  # the small job's group fails: it is packed elsewhere
    assert "small" in resp.affected_jobs
    await pod.settle()
    small = await pod.job("small")
    assert small.state == common_pb2.JOB_STATE_RUNNING
    assert small.switched.tiles[0].group == 7
    await pod.assert_consistent()


async def test_bad_switched_requests_name_the_field(pod):
    err = await rpc_error(
        pod.ws.AdmitJob(
            ws.AdmitJobRequest(spec=ws.JobSpec(job_id="x", shape=common_pb2.Shape(dims=[9])))
        )
    )
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.field_violations[0][0] == "spec.parallelism"
    err = await rpc_error(pod.admit("x", 3, 3, 3, shape=common_pb2.Shape(dims=[26])))
    assert err.field_violations[0] == (
        "spec.shape",
        "in processors must be [27] (data × pipeline × layer), or leave it empty",
    )
    err = await rpc_error(pod.admit("x", 7, 3, 3))  # 7 groups; 6 for large jobs
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.reason == "MORE_BLOCKS_THAN_POD"
    err = await rpc_error(
        pod.admit("x", 2, 3, 3, preemption_policy=common_pb2.PREEMPTION_POLICY_SHRINK)
    )
    assert err.field_violations[0][0] == "spec.preemption_policy"
    err = await rpc_error(pod.ws.PlanRings(ws.PlanRingsRequest(shape=common_pb2.Shape(dims=[9]))))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION and err.reason == "FABRIC_KIND"


async def test_a_higher_priority_large_job_preempts_a_lower_one(pod):
    low = (await pod.admit("low", 5, 3, 3, priority=20)).job
    assert low.state == common_pb2.JOB_STATE_RUNNING
    high = (await pod.admit("high", 4, 3, 3, priority=80)).job
    assert high.state == common_pb2.JOB_STATE_RUNNING, high.reason
    assert (await pod.job("low")).state == common_pb2.JOB_STATE_SUSPENDED
    await pod.assert_consistent()


async def test_two_replicas_admitting_concurrently_stay_consistent(redis_url):
    async with switched_stack(redis_url, replicas=2) as pod:
        jobs = [
            ("l1", (2, 3, 3)),
            ("l2", (2, 3, 3)),
            ("l3", (2, 3, 3)),
            ("s1", (1, 2, 2)),
            ("s2", (1, 2, 2)),
            ("s3", (2, 2, 1)),
            ("s4", (1, 3, 3)),
        ]
        await asyncio.gather(*(pod.admit(j, *d, replica=k % 2) for k, (j, d) in enumerate(jobs)))
        view = await pod.settle()
        states = {j.job_id: j.state for j in view.live_jobs}
        assert all(states[j] == common_pb2.JOB_STATE_RUNNING for j in ("l1", "l2", "l3")), states
        await pod.assert_consistent()


def test_placement_moves_to_the_next_candidate_after_failed_reservations():
    """A job whose rings could not be reserved (attempts) tries the next-best groups."""
    sf = build_fabric(SwitchedFabricConfig.parse(SPEC))
    fabric = PodFabric(POD, (3, 3), ("npu",) * 8, switched=sf, small_groups=frozenset({6, 7}))
    job = SliceJob("j", PENDING, 1, 50, 1, SliceDemand((2,), ("npu", "npu"), ()), degrees=(2, 3, 3))
    state = PodState(fabric, jobs={"j": job})
    planner = planner_for(fabric)
    first = planner.admit(state, job)
    second = planner.admit(state, job.with_(attempts=1))
    assert isinstance(first, Allocation) and isinstance(second, Allocation)
    assert first.placement != second.placement
    assert Degrees(*job.degrees).total == 18


async def test_pod_command_draws_groups_small_jobs_and_switch_use(pod, capsys):
    import json

    from lightpath.cli import main

    await pod.admit("demo", 4, 3, 3)
    await pod.admit("tiny", 1, 2, 2)
    await pod.report(4)  # g1.0 fails
    addr = pod.addresses[0]
    assert await asyncio.to_thread(main, ["pod", POD, "--addr", addr]) == 0
    out = capsys.readouterr().out.splitlines()
    grid = {line.split()[0]: line.split()[1:] for line in out if line.startswith("  r")}
    assert grid["r0"] == ["A", "A", "A", "A"]
    assert grid["r1"] == ["X", ".", "s1", "s"]
    assert any("A  demo  RUNNING" in line for line in out)
    assert any(line.strip().startswith("s  tiny  g1.2 rows 0-1, columns 0-1") for line in out)
    row0 = next(line for line in out if line.strip().startswith("r0/p* (9 row)"))
    down_used = int(row0.split()[3])
    assert down_used > 0  # the demo's pipeline rings close through its row switches
    assert any(line.strip().startswith("t1r/* (18 tier-1)") for line in out)
    assert await asyncio.to_thread(main, ["pod", POD, "--addr", addr, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fabric_kind"] == "FABRIC_KIND_SWITCHED"
    assert data["switched"]["small_tiles"]["tiny"]["group_name"] == "g1.2"


async def test_demo_step_runs_the_4_3_3_job_prints_its_rings_and_cleans_up(
    redis_url, capsys, spans_factory
):
    from lightpath.demo import DemoContext
    from lightpath.demo import switched as demo

    async with contextlib.AsyncExitStack() as stack:
        ocs_svc = await stack.enter_async_context(
            serve(
                "ocs_manager",
                redis_url,
                {
                    "LIGHTPATH_POD_ID": "pod-3",
                    "LIGHTPATH_FABRIC_KIND": "SWITCHED",
                    "LIGHTPATH_SWITCHED_FABRIC": SPEC,
                },
            )
        )
        ws_svc = await stack.enter_async_context(
            serve(
                "workload_scheduler",
                redis_url,
                {
                    "LIGHTPATH_POD_ID": "pod-3",
                    "LIGHTPATH_OCS_ADDR": ocs_svc.address,
                    "LIGHTPATH_BLOCK_TYPES": "npu",
                },
            )
        )
        ctx = DemoContext(
            {"ocs-pod-3": ocs_svc.address, "ws-pod-3": ws_svc.address},
            spans_factory("demo").provider,
        )
        try:
            await demo.run(ctx)
            await demo.run(ctx)  # again: it left the pod as it found it
        finally:
            await ctx.close()
    out = capsys.readouterr().out
    assert out.count("-> RUNNING on g0.0, g0.1, g0.2, g0.3") == 2
    assert "layer(d=0,p=0)     g0.0: pr11 > pr21 > pr31 > (c0/p" in out
    assert "pipeline(d=0,l=0)  g0.0: pr11 > pr12 > pr13 > (r0/p" in out
    assert "data(p=0,l=0)      g0.0/pr11 > " in out
    assert "group 1 -> group 5:" in out
    assert out.count("invariants ok: True") == 2
