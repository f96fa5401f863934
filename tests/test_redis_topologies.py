"""Every service on a real Redis Cluster (3 masters, one replica each) and on a real
Sentinel set-up (one master, one replica, three sentinels), and a master killed
under them (issue 16).

The subset of contract calls run on each topology covers each service's main
work: the cell places and completes a job on a pod (workload_scheduler and
ocs_manager behind it, the pod's heartbeat stream), the core_broker grants and
lists reservations (its change stream followed by its live view), the
ocs_manager wires and checks a slice, an agg_switch tree aggregates. After a
master is SIGKILLed and its replica takes over, nothing acknowledged is lost
(the writes were replicated before the kill: Redis replication is asynchronous,
so a write acknowledged in the last milliseconds before a master dies can be
lost — docs/operations.md) and every service serves again by itself.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from lightpath.v1 import cell_scheduler_pb2 as cs
from lightpath.v1 import common_pb2 as c
from tests.cell_scheduler.conftest import Cell, cell_stack
from tests.redis_topologies import redis_cluster, redis_sentinel, with_password
from tests.test_redis_restart_services import three_services

pytestmark = pytest.mark.slow


async def cell_works(cell: Cell, job_id: str) -> None:
    job = await cell.submit(job_id, (4, 4, 4))
    assert job.job.state == c.JOB_STATE_RUNNING, job
    done = await cell.cell.CompleteJob(cs.CompleteCellJobRequest(job_id=job_id))
    assert done.state == c.JOB_STATE_COMPLETED


async def pod_reports_again(cell: Cell, since: float) -> None:
    async def fresh():
        try:
            pod = (await cell.pods_view()).get("pod-a")
        except grpc.aio.AioRpcError as err:  # right after a failover: retryable
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return False
        return (
            pod is not None
            and pod.status == cs.POD_STATUS_READY
            and pod.last_heartbeat.ToMilliseconds() / 1000 > since
        )

    await cell.wait_for(fresh, timeout=30, what="pod-a reporting to the cell again")


async def retried(work, what: str, timeout: float = 30.0) -> None:
    """`work` until it goes through (right after a failover a call may still be
    UNAVAILABLE; the SDK would retry it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await work()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} never went through: {exc}") from exc
            await asyncio.sleep(0.2)


async def run_everything(url: str, kill) -> None:
    async with (
        cell_stack(url, pods=(("pod-a", 8, "tpu"),)) as cell,
        three_services(url) as (svc, _addresses),
    ):
        await cell_works(cell, "before-1")
        await svc.work("before", [0, 1])
        running = await cell.submit("kept-running", (4, 4, 4))
        assert running.job.state == c.JOB_STATE_RUNNING
        await svc.everything_acknowledged_is_there()

        await asyncio.to_thread(kill)
        killed_at = time.time()

        await pod_reports_again(cell, killed_at)
        await cell.wait_state("kept-running", c.JOB_STATE_RUNNING, timeout=30)
        completed = await cell.job("before-1")
        assert completed.state == c.JOB_STATE_COMPLETED
        await retried(svc.everything_acknowledged_is_there, "the acknowledged work read back")
        await retried(lambda: cell_works(cell, "after-1"), "a job on the cell")
        await retried(lambda: svc.work("after", [2, 3]), "a reservation, wiring, aggregation")
        await svc.everything_acknowledged_is_there()


async def test_every_service_on_a_redis_cluster_survives_a_master_failover(tmp_path):
    with redis_cluster(tmp_path / "cluster") as cluster:

        def kill() -> None:
            # The masters of the cell's and the broker's slots, as they were before
            # (one kill if they share one; a promoted replica has none of its own).
            masters = {cluster.master_of(tag): tag for tag in ("{broker}", "{cell}")}
            for tag in masters.values():
                old, new = cluster.kill_master_of(tag)
                assert new != old

        await run_everything(with_password(cluster.url), kill)


async def test_every_service_behind_redis_sentinel_survives_a_master_switch(tmp_path):
    with redis_sentinel(tmp_path / "sentinel") as sentinel:

        def kill() -> None:
            old, new = sentinel.kill_master()
            assert new != old

        await run_everything(with_password(sentinel.url), kill)


def test_lightpath_demo_runs_the_whole_stack_on_a_redis_cluster(tmp_path):
    """`lightpath demo` (and the `lightpath up` stack under it) with LIGHTPATH_REDIS_URL
    naming a 3-master cluster instead of the embedded Redis."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    lightpath = Path(sys.executable).with_name("lightpath")
    with redis_cluster(tmp_path / "cluster") as cluster:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LIGHTPATH_TLS_", "LIGHTPATH_REDIS_"))
        }
        env["LIGHTPATH_REDIS_URL"] = with_password(cluster.url)
        env["LIGHTPATH_STATE_DIR"] = str(tmp_path / "state")
        # Nothing is in flight once the demo finished: a short grace bounds the stop
        # (its agg switches, which hold each other's Relay streams, end them when they
        # drain; before that they waited out the whole 5 s default).
        env["LIGHTPATH_SHUTDOWN_GRACE_S"] = "0.5"
        out = subprocess.run(
            [str(lightpath), "demo"], env=env, capture_output=True, text=True, timeout=240
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "demo finished" in out.stdout
        # The state is in the cluster, spread over its masters by hash tag.
        tags = set()
        for port in cluster.masters():
            with cluster.client(port) as r:
                tags |= {k[k.index("{") : k.index("}") + 1] for k in r.scan_iter(match="*{*}*")}
        assert {"{cell}", "{broker}"} <= tags, tags
        assert any(t.startswith("{pod-") for t in tags) and any(t.startswith("{agg:") for t in tags)
