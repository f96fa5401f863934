"""Issue 19: a graph runs over gRPC (RunGraph, GetGraphRun, CancelGraphRun) on a real
broker with a real Redis; the run's worker processes are real OS processes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from lightpath.errors import InvalidArgument
from lightpath.graph.examples import fig2a, fig3a, read_records, write_records
from lightpath.graph.runner import run_graph
from lightpath.graph.spec import to_proto
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import graph_pb2
from tests.core_broker.conftest import OP, dur, fails, running_broker

C = grpc.StatusCode
DEGREE = 2


@pytest.fixture
async def broker(redis_url, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    async with running_broker(
        redis_url,
        LIGHTPATH_CB_GRAPH_DATA_DIR=str(data),
        LIGHTPATH_CB_GRAPH_RUN_DIR=str(tmp_path / "runs"),
    ) as b:
        b.data = data  # type: ignore[attr-defined]
        yield b


async def _reserve(broker, md, spec, rid: str, cores: int = 1) -> pb.GraphReservation:
    held = await broker.stub.ReserveGraph(
        pb.ReserveGraphRequest(
            graph=to_proto(spec),
            per_process=pb.ReservationRequest(reservation_id=rid, cores=cores, duration=dur(600)),
        ),
        metadata=md,
    )
    assert held.complete
    return held


async def _ended(broker, md, run_id: str) -> pb.GraphRun:
    for _ in range(3000):
        run = await broker.stub.GetGraphRun(pb.GetGraphRunRequest(run_id=run_id), metadata=md)
        if run.state != pb.GRAPH_RUN_STATE_RUNNING:
            return run
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} did not end: {run}")


def _workers_of(run_dir: Path) -> list[int]:
    """Live worker processes started for `run_dir` (from /proc)."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lightpath.graph.worker" in cmd and any(str(run_dir).encode() in c for c in cmd):
            out.append(int(proc.name))
    return out


async def test_a_reserved_graph_runs_over_grpc_with_the_local_runs_outputs_and_metrics(
    broker, tmp_path
):
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    for part in range(DEGREE):
        write_records(broker.data / f"in.{part}", 400, seed=part, start=part * 400)
    spec = fig3a("in.{part}", "out.{part}", DEGREE)  # relative: inside the data directory
    await _reserve(broker, md, spec, "g1")
    request = pb.RunGraphRequest(graph=to_proto(spec), run_id="run-1", reservation_id="g1")
    started = await broker.stub.RunGraph(request, metadata=md)
    assert started.state == pb.GRAPH_RUN_STATE_RUNNING
    assert (started.application_id, started.graph_id) == ("etl", "fig-3a")
    assert started.plan.processes_after == DEGREE
    run = await _ended(broker, md, "run-1")
    assert run.state == pb.GRAPH_RUN_STATE_SUCCEEDED, run.failure
    # The same graph run here, locally, on copies of the inputs.
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    for part in range(DEGREE):
        (local_dir / f"in.{part}").write_bytes((broker.data / f"in.{part}").read_bytes())
    local = run_graph(
        fig3a(str(local_dir / "in.{part}"), str(local_dir / "out.{part}"), DEGREE),
        run_dir=tmp_path / "local-run",
    )
    for part in range(DEGREE):
        assert read_records(broker.data / f"out.{part}") == read_records(local_dir / f"out.{part}")
    got = {c.component: c for c in run.metrics.components}
    assert set(got) == {"304A", "304B", "304C"}
    for c in local.metrics.components:
        assert (got[c.component].records_in, got[c.component].records_out) == (
            c.records_in,
            c.records_out,
        )
    assert got["304A"].records_in == 400 * DEGREE
    assert run.metrics.run_id == "run-1" and run.finished_at.seconds > 0
    # Kept as reported metrics are, and the same request again answers the same run.
    kept = await broker.stub.GetGraphMetrics(
        pb.GetGraphMetricsRequest(graph_id="fig-3a", run_id="run-1"), metadata=md
    )
    assert kept == run.metrics
    assert await broker.stub.RunGraph(request, metadata=md) == run
    request.checkpoint_every = 7
    report = await fails(broker.stub.RunGraph(request, metadata=md), C.FAILED_PRECONDITION)
    assert report.reason == "RUN_EXISTS"


async def test_run_graph_refuses_what_may_not_run_here_naming_the_field(broker, tmp_path):
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    ok = fig3a("in.{part}", "out.{part}", DEGREE)

    def run(spec, **kw):
        kw.setdefault("run_id", "r")
        kw.setdefault("reservation_id", "g")
        return broker.stub.RunGraph(pb.RunGraphRequest(graph=to_proto(spec), **kw), metadata=md)

    await fails(
        run(ok, run_id="", reservation_id=""), C.INVALID_ARGUMENT, ["run_id", "reservation_id"]
    )
    # An external program (204H, interface) and a file outside the data directory.
    report = await fails(
        run(fig2a("/etc/hostname", "out")),
        C.INVALID_ARGUMENT,
        ["graph.datasets[0].path", "graph.components[7].kind"],
    )
    assert report.reason == "NOT_RUNNABLE_HERE" and "run_graph" in report.message
    await fails(run(fig3a("../in.{part}", "out.{part}", DEGREE)), C.INVALID_ARGUMENT)
    # No reservation, then one released: nothing starts.
    report = await fails(run(ok), C.NOT_FOUND)
    await _reserve(broker, md, ok, "g")
    await broker.stub.ReleaseReservation(
        pb.ReleaseReservationRequest(reservation_id="g.set-0.1"), metadata=md
    )
    report = await fails(run(ok), C.FAILED_PRECONDITION)
    assert report.reason == "RESERVATION_NOT_HELD" and "g.set-0.1" in report.message
    # Another application's reservation is not this one's to run on, nor its graph id.
    other = await broker.app("other")
    await broker.stub.ReportGraphMetrics(
        pb.ReportGraphMetricsRequest(
            metrics=graph_pb2.GraphRunMetrics(graph_id="owned", run_id="x")
        ),
        metadata=other,
    )
    report = await fails(
        run(fig3a("in.{part}", "out.{part}", DEGREE, graph_id="owned")), C.PERMISSION_DENIED
    )
    assert report.reason == "ID_UNAVAILABLE"
    await _reserve(broker, other, ok, "theirs")
    await fails(run(ok, reservation_id="theirs"), C.NOT_FOUND)  # not there for it (issue 30)
    await fails(
        broker.stub.GetGraphRun(pb.GetGraphRunRequest(run_id="r"), metadata=md), C.NOT_FOUND
    )
    await fails(
        broker.stub.RunGraph(pb.RunGraphRequest(graph=to_proto(ok)), metadata=OP),
        C.PERMISSION_DENIED,
    )


async def test_a_failing_component_fails_the_run_naming_it(broker):
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    spec = fig3a("missing.{part}", "out.{part}", DEGREE)
    await _reserve(broker, md, spec, "g2")
    await broker.stub.RunGraph(
        pb.RunGraphRequest(graph=to_proto(spec), run_id="run-2", reservation_id="g2"), metadata=md
    )
    run = await _ended(broker, md, "run-2")
    assert run.state == pb.GRAPH_RUN_STATE_FAILED
    assert "missing.0" in run.failure or "missing.1" in run.failure, run.failure
    # Named relative to the data directory: the broker's own directories are not shown.
    assert str(broker.data.parent) not in run.failure, run.failure
    assert not run.HasField("metrics")


async def test_cancel_stops_the_workers_and_ends_the_run_cancelled(broker, tmp_path):
    """Its input is a named pipe nobody writes: the run waits until it is cancelled."""
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    for part in range(DEGREE):
        os.mkfifo(broker.data / f"fifo.{part}")
    spec = fig3a("fifo.{part}", "out.{part}", DEGREE)
    await _reserve(broker, md, spec, "g3")
    await broker.stub.RunGraph(
        pb.RunGraphRequest(graph=to_proto(spec), run_id="run-3", reservation_id="g3"), metadata=md
    )
    run_dir = tmp_path / "runs" / "run-3"
    for _ in range(3000):
        if len(_workers_of(run_dir)) == DEGREE:
            break
        await asyncio.sleep(0.02)
    assert len(_workers_of(run_dir)) == DEGREE
    other = await broker.app("other")
    await fails(
        broker.stub.CancelGraphRun(pb.CancelGraphRunRequest(run_id="run-3"), metadata=other),
        C.NOT_FOUND,
    )
    await broker.stub.CancelGraphRun(pb.CancelGraphRunRequest(run_id="run-3"), metadata=md)
    run = await _ended(broker, md, "run-3")
    assert run.state == pb.GRAPH_RUN_STATE_CANCELLED and "etl" in run.failure
    assert _workers_of(run_dir) == []
    # An operator sees every application's runs; cancelling an ended run answers it.
    again = await broker.stub.CancelGraphRun(pb.CancelGraphRunRequest(run_id="run-3"), metadata=OP)
    assert again.state == pb.GRAPH_RUN_STATE_CANCELLED


def test_confine_takes_relative_paths_into_the_data_directory_and_refuses_the_rest(tmp_path):
    from lightpath_services.core_broker.graph_runs import confine

    spec = to_proto(fig3a("in.{part}", "sub/out.{part}", DEGREE))
    out = confine(spec, tmp_path)
    assert [d.path for d in out.datasets] == [
        str(tmp_path / "in.{part}"),
        str(tmp_path / "sub" / "out.{part}"),
    ]
    assert [d.path for d in spec.datasets] == ["in.{part}", "sub/out.{part}"]  # a copy
    for bad in ("/etc/passwd", "../x", "a/../../x", "bad\0path", str(tmp_path) + "-twin/x"):
        spec.datasets[0].path = bad
        with pytest.raises(InvalidArgument) as err:
            confine(spec, tmp_path)
        assert [v.field for v in err.value.violations] == ["graph.datasets[0].path"], bad
    # User code and outside access only where the broker allows any code.
    spec.datasets[0].path = "in.{part}"
    spec.components[0].kind = "mypkg.mod:Thing"
    with pytest.raises(InvalidArgument) as err:
        confine(spec, tmp_path)
    assert [v.field for v in err.value.violations] == ["graph.components[0].kind"]
    assert confine(spec, tmp_path, any_code=True).components[0].kind == "mypkg.mod:Thing"


async def test_a_run_whose_reservation_is_released_is_stopped_naming_it(broker, tmp_path):
    await broker.device("npu-1", 8, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    for part in range(DEGREE):
        os.mkfifo(broker.data / f"fifo.{part}")
    spec = fig3a("fifo.{part}", "out.{part}", DEGREE)
    await _reserve(broker, md, spec, "g4")
    await broker.stub.RunGraph(
        pb.RunGraphRequest(graph=to_proto(spec), run_id="run-4", reservation_id="g4"), metadata=md
    )
    run_dir = tmp_path / "runs" / "run-4"
    for _ in range(3000):
        if len(_workers_of(run_dir)) == DEGREE:
            break
        await asyncio.sleep(0.02)
    await broker.stub.ReleaseReservation(
        pb.ReleaseReservationRequest(reservation_id="g4.set-0.1"), metadata=md
    )
    run = await _ended(broker, md, "run-4")
    assert run.state == pb.GRAPH_RUN_STATE_FAILED
    assert 'reservation "g4.set-0.1" is released' in run.failure
    assert _workers_of(run_dir) == []
