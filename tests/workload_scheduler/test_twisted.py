"""Twisted tori through the workload scheduler (issue 28): JobSpec.twisted reaches the
ocs_manager's wiring, a failed-block swap keeps it, a shrunk slice is wired regular."""

from __future__ import annotations

from lightpath.client import channel
from lightpath.domain.slices import SliceDemand, SliceJob
from lightpath.v1 import common_pb2, ocs_manager_pb2
from lightpath_services.workload_scheduler.ocs import OcsManagerClient
from tests.helpers import serve
from tests.workload_scheduler.conftest import PodStack, ocs_env


def x_links(wiring: ocs_manager_pb2.SliceWiring) -> set[tuple[int, int]]:
    """(P, Q) of the slice's links along x, read off its cross-connects."""
    return {(c.a.block_id, c.b.block_id) for c in wiring.cross_connects if c.a.dim == 0}


async def test_a_twisted_job_is_wired_twisted_and_a_swap_keeps_the_twist(pod16: PodStack):
    await pod16.admit("tw", (4, 4, 8), twisted=True)
    await pod16.settle()
    job = await pod16.job("tw")
    assert job.state == common_pb2.JOB_STATE_RUNNING
    wiring = await pod16.wiring("tw")
    assert wiring is not None and wiring.twisted
    a, b = (p.block_id for p in sorted(wiring.blocks, key=lambda p: tuple(p.position.coords)))
    assert x_links(wiring) == {(a, b), (b, a)}  # 1x1x2 blocks: no x self-loop when twisted
    await pod16.fail(b)
    await pod16.settle()
    await pod16.assert_consistent()
    after = await pod16.wiring("tw")
    assert after is not None and after.twisted
    new = {p.block_id for p in after.blocks} - {a}
    assert b not in new and len(new) == 1
    (c,) = new
    assert x_links(after) == {(a, c), (c, a)}
    (summary,) = [j for j in (await pod16.pod()).live_jobs if j.job_id == "tw"]
    assert summary.twisted and not summary.HasField("box")  # the block map can mark it


async def test_the_client_wires_a_shrunk_twisted_slice_regular(redis_url):
    """SliceDemand.shrunk drops the twist: what WireSlice gets is the regular torus."""
    demand = SliceDemand((1, 2, 2), ("tpu",) * 4, (True, True, True), twisted=True)
    job = SliceJob("tw", "WIRING", 1, 0, 1, demand, placement=(4, 5, 6, 7))
    shrunk = job.with_(demand=demand.shrunk((1, 2, 1)), placement=(10, 11), job_id="sh")
    async with (
        serve("ocs_manager", redis_url, ocs_env(16)) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        client = OcsManagerClient(ch)
        await client.fabric()
        wired = await client.wire_job(job)
        assert wired.twisted and "twisted" in wired.describe()
        got = await client.wire_job(shrunk)
        assert not got.twisted and got.cross_connects == 2 * 3 * 16
        assert (await client.wiring("tw")).twisted  # type: ignore[union-attr]
        assert not (await client.wiring("sh")).twisted  # type: ignore[union-attr]
        replaced = await client.replace_job(job, 5, 9)
        assert replaced.moved == 6 * 16
        assert (await client.wiring("tw")).twisted  # type: ignore[union-attr]
