"""The ocs_manager driving real switch agents (issue 20): every fault during a wire, a
release and a replace leaves no half-wired slice, the committed tables and the switches
agree, and a switch that restarts empty is repaired by the reconcile loop."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from lightpath.client import error_report
from lightpath.v1 import ocs_manager_pb2 as pb
from lightpath.v1 import optical_switch_pb2 as sb
from tests.ocs_manager.conftest import wire_request
from tests.switch_agent.conftest import (
    admin,
    agent_process,
    apply_calls,
    as_manager,
    fabric,
    inject,
    manager,
)

C = grpc.StatusCode
SW = "ocs-x-0-0"  # where blocks 0..7 meet along x (K = 1: one OCS per logical axis)

# fault -> (what InjectFault sets, the status the manager answers)
FAULTS = {
    "unreachable": ({"unreachable": True}, C.UNAVAILABLE),
    "reject": ({"reject_batches": 1}, C.ABORTED),
    "partial": ({"partial_batches": 1}, C.UNAVAILABLE),
}


async def invariants_hold(ocs) -> None:
    report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
    assert report.ok, list(report.violations)


async def eventually_consistent(ocs, timeout: float = 30.0) -> None:
    """Until CheckInvariants (with the switches) passes: the reconcile loop or a lease."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        report = await ocs.CheckInvariants(pb.CheckInvariantsRequest(compare_switches=True))
        if report.ok:
            return
        assert loop.time() < deadline, list(report.violations)
        await asyncio.sleep(0.1)


async def switch_table(address: str, sid: str = SW) -> set[tuple[int, int]]:
    async with as_manager(address) as s:
        state = await s.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id=sid))
    return {(x.port_a, x.port_b) for x in state.cross_connects}


async def slice_blocks(ocs, job: str) -> list[int] | None:
    try:
        w = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id=job))
    except grpc.aio.AioRpcError as err:
        assert err.code() == C.NOT_FOUND
        return None
    assert w.state == pb.SLICE_STATE_WIRED
    return [b.block_id for b in w.blocks]


async def failed(call) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return error_report(err.value).code


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("op", ["wire", "release", "replace"])
async def test_a_fault_on_one_switch_leaves_no_half_wired_slice(redis_url, tmp_path, fault, op):
    faults, code = FAULTS[fault]
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with manager(redis_url, ag) as ocs:
            # a slice beside, whose cross-connects must stay as they are
            await ocs.WireSlice(wire_request("beside", [2, 1, 1], [6, 7]))
            if op != "wire":
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            before = await switch_table(ag.address)
            await inject(ag.address, SW, **faults)
            if op == "wire":
                call = ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            elif op == "release":
                call = ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
            else:
                call = ocs.ReplaceBlock(
                    pb.ReplaceBlockRequest(job_id="job", failed_block_id=1, new_block_id=3)
                )
            assert await failed(call) == code
            # all or nothing: the slice is as it was, on the switches too
            assert await slice_blocks(ocs, "job") == (None if op == "wire" else [0, 1])
            assert await slice_blocks(ocs, "beside") == [6, 7]
            await inject(ag.address, SW)  # cleared
            await invariants_hold(ocs)
            assert await switch_table(ag.address) == before
            # and the change goes through once the switch is well
            if op == "wire":
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
                assert await slice_blocks(ocs, "job") == [0, 1]
            elif op == "release":
                await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
                assert await slice_blocks(ocs, "job") is None
            else:
                await ocs.ReplaceBlock(
                    pb.ReplaceBlockRequest(job_id="job", failed_block_id=1, new_block_id=3)
                )
                assert await slice_blocks(ocs, "job") == [0, 3]
            await invariants_hold(ocs)


@pytest.mark.parametrize("op", ["wire", "release", "replace"])
async def test_a_switch_slower_than_the_deadline_is_rolled_back_when_the_lease_ends(
    redis_url, tmp_path, op
):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with manager(redis_url, ag) as ocs:  # a call to a switch: 2 s at most
            await ocs.WireSlice(wire_request("beside", [2, 1, 1], [6, 7]))
            if op != "wire":
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            await inject(ag.address, SW, extra_delay={"seconds": 5})
            if op == "wire":
                call = ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            elif op == "release":
                call = ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
            else:
                call = ocs.ReplaceBlock(
                    pb.ReplaceBlockRequest(job_id="job", failed_block_id=1, new_block_id=3)
                )
            # the slow switch's answer is lost (its deadline passed): the manager cannot know
            # what it applied, so the change is undone everywhere; the slow switch's undo is
            # lost too, so the slice stays locked until its lease ends
            assert await failed(call) == C.UNAVAILABLE
            await inject(ag.address, SW)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:  # the next call on the slice takes the lapsed change over, rolls it back
                try:
                    w = await ocs.GetSliceWiring(pb.GetSliceWiringRequest(job_id="job"))
                    state = w.state
                except grpc.aio.AioRpcError as err:
                    assert err.code() == C.NOT_FOUND
                    state = None
                assert state != pb.SLICE_STATE_WIRED or op != "wire"
                try:
                    if op == "wire":
                        await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
                    elif op == "release":
                        await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
                    else:
                        await ocs.ReplaceBlock(
                            pb.ReplaceBlockRequest(job_id="job", failed_block_id=1, new_block_id=3)
                        )
                    break
                except grpc.aio.AioRpcError as err:
                    assert err.code() in (C.ABORTED, C.UNAVAILABLE), err
                    assert loop.time() < deadline, "the lapsed change was never rolled back"
                    await asyncio.sleep(0.2)
            await eventually_consistent(ocs)
            expect = {"wire": [0, 1], "release": None, "replace": [0, 3]}[op]
            assert await slice_blocks(ocs, "job") == expect


async def test_one_slow_switch_holds_back_none_of_the_others(redis_url, tmp_path):
    """Issue 34: the batches of one ApplyBatches call each have their own deadline, so a
    slow switch answers DEADLINE_EXCEEDED alone, the others answer at once, and the
    rollback reaches every switch that applied (not the whole call lost)."""
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with manager(redis_url, ag) as ocs, as_manager(ag.address) as s:
            await ocs.WireSlice(wire_request("beside", [2, 1, 1], [6, 7]))
            others = ["ocs-x-1-0", "ocs-x-2-0", "ocs-x-3-0"]  # the slice's other x switches
            before = {sid: await switch_table(ag.address, sid) for sid in others}
            await inject(ag.address, SW, extra_delay={"seconds": 30})
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            report = error_report(err.value)
            assert report.code == C.UNAVAILABLE
            assert f"switch {SW}: DEADLINE_EXCEEDED" in report.message, report.message
            assert "more switches" not in report.message, report.message  # it alone
            # the others applied and were rolled back within the call
            for sid in others:
                assert await switch_table(ag.address, sid) == before[sid], sid
            # inside one call: the slow switch's result, the others' outcomes
            reqs = [
                sb.ApplyBatchRequest(switch_id=sid, batch_id=f"direct-{sid}")
                for sid in [SW, *others]
            ]
            for r in reqs:
                r.timeout.FromMilliseconds(300)
            reply = await s.ApplyBatches(sb.ApplyBatchesRequest(batches=reqs), timeout=10)
            codes = [r.error.code if r.HasField("error") else 0 for r in reply.results]
            assert codes == [C.DEADLINE_EXCEEDED.value[0], 0, 0, 0], codes
            await inject(ag.address, SW)


@pytest.mark.parametrize("op", ["wire", "release", "replace"])
async def test_a_switch_restarting_empty_mid_change(redis_url, tmp_path, op):
    """The change fails (its batch on the restarted switch is gone), the others are rolled
    back, and the reconcile loop puts back what the restarted switch held."""
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with (
            manager(redis_url, ag) as ocs,
            as_manager(ag.address) as s,
            admin(ag.address) as a,
        ):
            await ocs.WireSlice(wire_request("beside", [2, 1, 1], [6, 7]))
            if op != "wire":
                await ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            committed = await switch_table(ag.address)
            await inject(ag.address, SW, extra_delay={"seconds": 1})
            if op == "wire":
                call = ocs.WireSlice(wire_request("job", [2, 1, 1], [0, 1]))
            elif op == "release":
                call = ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="job"))
            else:
                call = ocs.ReplaceBlock(
                    pb.ReplaceBlockRequest(job_id="job", failed_block_id=1, new_block_id=3)
                )
            task = asyncio.ensure_future(call)
            while True:  # until the change's batch is settling on the switch
                ports = await s.GetPortStatus(sb.GetPortStatusRequest(switch_id=SW))
                if any(p.state == sb.PORT_STATE_SETTLING for p in ports.ports):
                    break
                await asyncio.sleep(0.01)
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=SW))
            await inject(ag.address, SW)
            assert await failed(task) == C.UNAVAILABLE
            assert await slice_blocks(ocs, "job") == (None if op == "wire" else [0, 1])
            await eventually_consistent(ocs)
            assert await switch_table(ag.address) == committed


async def test_a_switch_restarted_empty_is_repaired_and_only_it(redis_url, tmp_path):
    with agent_process(redis_url, tmp_path, **fabric()) as ag:
        async with manager(redis_url, ag) as ocs, admin(ag.address) as a:
            await ocs.WireSlice(wire_request("all", [2, 2, 2], list(range(8))))
            held = await switch_table(ag.address)
            assert len(held) == 8  # the 8 x links of the 2x2x2 slice, on every x axis
            other = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id="ocs-y-0-0"))
            mine = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=SW))
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id=SW))
            assert await switch_table(ag.address) == set()
            await eventually_consistent(ocs)
            assert await switch_table(ag.address) == held
            # the loop wrote to the restarted switch only
            after = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id="ocs-y-0-0"))
            assert after.apply_calls == other.apply_calls
            repaired = await a.GetSwitchStats(sb.GetSwitchStatsRequest(switch_id=SW))
            assert repaired.apply_calls == mine.apply_calls + 1  # one batch put it all back


async def test_one_to_many_banks_are_programmed_and_repaired(redis_url, tmp_path):
    env = fabric(k=2)
    with agent_process(redis_url, tmp_path, **env) as ag:
        async with (
            manager(redis_url, ag, **env) as ocs,
            as_manager(ag.address) as s,
            admin(ag.address) as a,
        ):
            await ocs.WireSlice(wire_request("k2", [2, 2, 2], list(range(8))))
            await invariants_hold(ocs)
            bank = await s.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id="otm-3"))
            assert len(bank.outputs) == 12  # every (dim, axis) of block 3 selects an output
            await a.RestartSwitch(sb.RestartSwitchRequest(switch_id="otm-3"))
            await eventually_consistent(ocs)
            again = await s.GetCrossConnects(sb.GetCrossConnectsRequest(switch_id="otm-3"))
            assert list(again.outputs) == list(bank.outputs)
            # partial apply on a bank during a release: all or nothing
            await inject(ag.address, "otm-3", partial_batches=1)
            assert (
                await failed(ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="k2"))) == C.UNAVAILABLE
            )
            await invariants_hold(ocs)
            await ocs.ReleaseSlice(pb.ReleaseSliceRequest(job_id="k2"))
            await invariants_hold(ocs)
            assert await apply_calls(ag.address) > 0
