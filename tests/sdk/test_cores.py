"""The SDK's core broker client against a real broker (TLS, real Redis)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from lightpath.cli import main
from lightpath.sdk import AsyncCores, Cores, InvalidArgument, ResourceExhausted, Unauthenticated
from lightpath.v1 import core_broker_pb2 as pb
from tests.core_broker.conftest import running_broker


async def test_reserve_extend_list_watch_release(redis_url, monkeypatch, capsys):
    monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
    async with running_broker(redis_url, LIGHTPATH_CB_OPERATOR_TOKEN="") as b:
        async with AsyncCores(b.address, operator=True) as op:
            await op.register_device(
                pb.Device(device_id="gpu-1", kind=pb.DEVICE_KIND_GPU, cores=80)
            )
            token = (await op.register_application("cam", qos="premium")).token

        async with AsyncCores(b.address, token=token) as cores:
            r = await cores.reserve("r-1", cores=50, duration=600)
            assert r.outcome == pb.OUTCOME_GRANTED and r.allocations[0].cores == 50
            again = await cores.reserve("r-1", cores=50, duration=600)  # the id is the key
            assert again.reservation_id == "r-1" and again.version == r.version
            partial = await cores.reserve("r-2", 50, timedelta(minutes=1), accept=["partial"])
            assert partial.outcome == pb.OUTCOME_PARTIAL

            longer = await cores.extend("r-1", by=60)
            assert longer.end.ToMilliseconds() - r.end.ToMilliseconds() == 60_000
            ids = [x.reservation_id async for x in cores.list_reservations(page_size=1)]
            assert ids == ["r-2", "r-1"]
            first = await cores.list_reservations_page(page_size=1)
            assert [x.reservation_id for x in first.reservations] == ["r-2"]
            assert first.next_page_token

            async for event in cores.watch("r-1"):
                assert event.type == pb.RESERVATION_EVENT_TYPE_CURRENT
                break
            free = await cores.devices(kind="gpu")
            assert free.devices[0].reserved_cores == 80

            with pytest.raises(InvalidArgument) as bad:
                await cores.reserve("r-3", cores=0, duration=60)
            assert any(v.field == "request.cores" for v in bad.value.violations)
            with pytest.raises(ResourceExhausted) as full:  # gpu-1 is full after r-1's end
                await cores.extend("r-2", by=3600)
            assert "extend to at most" in str(full.value)
            released = await cores.release("r-1")
            assert released.state == pb.RESERVATION_STATE_RELEASED

        # the CLI's graph commands ride on the same client; a graph without metrics
        # says how metrics get there
        code = await asyncio.to_thread(main, ["graph", "metrics", "g-1", "--addr", b.address])
        err = capsys.readouterr().err
        assert code == 1 and "NOT_FOUND" in err
        assert (
            "next: a run's metrics reach the broker with `lightpath graph run SPEC --report`" in err
        )

        async with AsyncCores(b.address, token="cam:wrong") as stranger:
            with pytest.raises(Unauthenticated):
                await stranger.get("r-1")


async def test_the_blocking_client(redis_url, monkeypatch):
    monkeypatch.delenv("LIGHTPATH_CB_TOKEN", raising=False)
    async with running_broker(redis_url) as b:

        def app() -> list[str]:
            with Cores(b.address, operator=True) as op:
                op.register_device(pb.Device(device_id="tpu-1", kind=pb.DEVICE_KIND_TPU, cores=8))
                token = op.register_application("sync-app").token
            with Cores(b.address, token=token) as cores:
                out = [cores.reserve("s-1", 4, 30, kind="tpu").summary]
                out += [r.reservation_id for r in cores.list_reservations()]
                out.append(pb.ReservationState.Name(cores.release("s-1").state))
                return out

        summary, listed, state = await asyncio.to_thread(app)
        assert summary and listed == "s-1" and state == "RESERVATION_STATE_RELEASED"


async def test_graphs_plan_and_reserve(redis_url, tmp_path):
    from lightpath.graph.examples import fig2a, write_records
    from lightpath.sdk import NotFound

    write_records(tmp_path / "202.tsv", 10)
    spec = fig2a(tmp_path / "202.tsv", tmp_path / "out")
    async with running_broker(redis_url) as b:
        await b.device("npu-1", 4, kind=pb.DEVICE_KIND_NPU)
        app = await b.app("etl")
        token = app[0][1].removeprefix("Bearer ")
        async with AsyncCores(b.address, token=token) as cores:
            plan = await cores.plan_graph(spec)
            assert (plan.processes_before, plan.processes_after) == (10, 3)
            assert (await cores.plan_graph(spec, unfolded=True)).processes_after == 10
            held = await cores.reserve_graph(spec, "g-1", cores=1, duration=600)
            assert held.complete and [p.reservation.reservation_id for p in held.processes] == [
                "g-1.set-0.0",
                "g-1.set-1.0",
                "g-1.set-2.0",
            ]
            with pytest.raises(NotFound):
                await cores.graph_metrics("fig-2a")


async def test_a_graph_run_on_the_broker_through_the_blocking_client(redis_url, tmp_path):
    from lightpath.graph.examples import fig3a, write_records
    from lightpath.sdk import FailedPrecondition, NotFound

    for part in range(2):
        write_records(tmp_path / f"in.{part}", 50, seed=part)
    spec = fig3a("in.{part}", "out.{part}", 2)
    async with running_broker(redis_url, LIGHTPATH_CB_GRAPH_DATA_DIR=str(tmp_path)) as b:
        await b.device("npu-1", 4, kind=pb.DEVICE_KIND_NPU)
        token = (await b.app("etl"))[0][1].removeprefix("Bearer ")

        def blocking() -> tuple[pb.GraphRun, pb.GraphRun]:
            with Cores(b.address, token=token) as cores:
                with pytest.raises(NotFound):  # nothing reserved yet
                    cores.run_graph(spec, "sdk-run", "g-1")
                cores.reserve_graph(spec, "g-1", cores=1, duration=600)
                started = cores.run_graph(spec, "sdk-run", "g-1")
                done = cores.wait_graph_run("sdk-run", timeout=120)
                assert cores.cancel_graph_run("sdk-run") == done  # ended: as it is
                with pytest.raises(FailedPrecondition):  # the id names another request
                    cores.run_graph(spec, "sdk-run", "g-1", checkpoint_every=5)
                return started, done

        started, done = await asyncio.to_thread(blocking)
    assert started.state == pb.GRAPH_RUN_STATE_RUNNING
    assert done.state == pb.GRAPH_RUN_STATE_SUCCEEDED, done.failure
    assert done.metrics.records_read == 100
    assert (tmp_path / "out.0").exists() and (tmp_path / "out.1").exists()
