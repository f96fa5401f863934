"""Contract tests of the core broker's graph RPCs over real gRPC and a real Redis:
PlanGraph, ReserveGraph (GF-4), ReportGraphMetrics / GetGraphMetrics (GF-6)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from lightpath.graph.examples import fig2a, fig3a, write_records
from lightpath.graph.remote import GraphBroker
from lightpath.graph.runner import run_graph
from lightpath.graph.spec import to_proto
from lightpath.v1 import core_broker_pb2 as pb
from lightpath.v1 import graph_pb2
from tests.core_broker.conftest import OP, anonymous, bearer, dur, fails, running_broker
from tests.helpers import credentials

C = grpc.StatusCode


def per_process(rid: str, cores: int = 1, **kw) -> pb.ReservationRequest:
    return pb.ReservationRequest(reservation_id=rid, cores=cores, duration=dur(60), **kw)


def reserve(b, md, spec, rid, cores=1, **kw):
    extra = {k: kw.pop(k) for k in ("allow_partial", "unfolded") if k in kw}
    return b.stub.ReserveGraph(
        pb.ReserveGraphRequest(
            graph=to_proto(spec), per_process=per_process(rid, cores, **kw), **extra
        ),
        metadata=md,
    )


# -- PlanGraph ------------------------------------------------------------------------


async def test_plan_graph_answers_the_fig_2b_sets_with_the_process_counts(broker):
    md = await broker.app("planner")
    plan = await broker.stub.PlanGraph(
        pb.PlanGraphRequest(graph=to_proto(fig2a("in.tsv", "out"))), metadata=md
    )
    assert [list(s.members) for s in plan.folded_sets] == [
        ["204A", "204B", "204E", "204F", "204G", "204C", "204D"],
        ["204H"],
        ["204I", "204J"],
    ]
    assert [list(s.roots) for s in plan.folded_sets] == [["204A"], ["204H"], ["204I"]]
    assert [s.foldable for s in plan.folded_sets] == [True, False, True]
    assert (plan.processes_before, plan.processes_after) == (10, 3)
    fig3 = await broker.stub.PlanGraph(
        pb.PlanGraphRequest(graph=to_proto(fig3a("a.{part}", "b.{part}", 4))), metadata=OP
    )
    assert [(s.degree, s.processes) for s in fig3.folded_sets] == [(4, 4)]
    unfolded = await broker.stub.PlanGraph(
        pb.PlanGraphRequest(graph=to_proto(fig2a("in.tsv", "out")), unfolded=True), metadata=md
    )
    assert unfolded.processes_after == 10


async def test_plan_graph_refuses_a_bad_graph_naming_the_field(broker):
    md = await broker.app("planner")
    spec = to_proto(fig2a("in.tsv", "out"))
    spec.flows.add(
        source=graph_pb2.GraphEndpoint(node="204J"),
        target=graph_pb2.GraphEndpoint(node="204A", port="nope"),
    )
    report = await fails(
        broker.stub.PlanGraph(pb.PlanGraphRequest(graph=spec), metadata=md),
        C.INVALID_ARGUMENT,
        ["graph.flows[14].target.port"],
    )
    assert '204A has no input port "nope"' in report.message
    spec.flows[14].target.port = "in"
    report = await fails(
        broker.stub.PlanGraph(pb.PlanGraphRequest(graph=spec), metadata=md),
        C.INVALID_ARGUMENT,
        ["graph.flows[14]"],
    )
    assert "closes a cycle 204A -> 204C -> 204D -> 204I -> 204J -> 204A" in report.message
    # who calls is settled before the graph is looked at
    report = await fails(
        broker.stub.PlanGraph(pb.PlanGraphRequest(graph=spec), metadata=bearer("planner:wrong")),
        C.UNAUTHENTICATED,
    )
    assert report.reason == "INVALID_CREDENTIAL"


# -- ReserveGraph (GF-4) -----------------------------------------------------------------


async def test_one_reservation_per_process_of_each_folded_set(broker):
    await broker.device("npu-1", 10, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    held = await reserve(broker, md, fig2a("in.tsv", "out"), "g1", cores=2)
    assert held.complete and held.reservation_id == "g1"
    assert [(p.folded_set, p.instance) for p in held.processes] == [
        ("set-0", 0),
        ("set-1", 0),
        ("set-2", 0),
    ]
    assert list(held.processes[2].members) == ["204I", "204J"]
    for p in held.processes:
        r = p.reservation
        assert r.reservation_id == f"g1.{p.folded_set}.{p.instance}"
        assert r.outcome == pb.OUTCOME_GRANTED and r.application_id == "etl"
        assert [(a.device_id, a.cores) for a in r.allocations] == [("npu-1", 2)]
    assert (await broker.free_now())["npu-1"] == 4
    # N-way sets reserve N processes.
    fig3 = await reserve(broker, md, fig3a("a.{part}", "b.{part}", 4), "g3", cores=1)
    assert [(p.folded_set, p.instance) for p in fig3.processes] == [("set-0", i) for i in range(4)]
    assert (await broker.free_now())["npu-1"] == 0
    # A retry answers what was decided.
    again = await reserve(broker, md, fig2a("in.tsv", "out"), "g1", cores=2)
    assert again == held


async def test_a_graph_that_does_not_fit_reserves_nothing(broker):
    await broker.device("npu-1", 5, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    held = await reserve(broker, md, fig2a("in.tsv", "out"), "big", cores=2)
    assert not held.complete
    assert [p.reservation.outcome for p in held.processes] == [pb.OUTCOME_REJECTED] * 3
    assert (await broker.free_now())["npu-1"] == 5
    listed = await broker.stub.ListReservations(pb.ListReservationsRequest(), metadata=md)
    assert list(listed.reservations) == []
    # Folded it fits where one process per component would not.
    unfolded = await reserve(broker, md, fig2a("in.tsv", "out"), "u", cores=1, unfolded=True)
    assert not unfolded.complete and len(unfolded.processes) == 10
    folded = await reserve(broker, md, fig2a("in.tsv", "out"), "f", cores=1)
    assert folded.complete and (await broker.free_now())["npu-1"] == 2


async def test_allow_partial_reserves_each_process_on_its_own(broker):
    await broker.device("npu-1", 5, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    held = await reserve(
        broker,
        md,
        fig2a("in.tsv", "out"),
        "some",
        cores=2,
        allow_partial=True,
        accept=[pb.OUTCOME_GRANTED],
    )
    outcomes = [p.reservation.outcome for p in held.processes]
    assert sorted(outcomes) == [pb.OUTCOME_GRANTED, pb.OUTCOME_GRANTED, pb.OUTCOME_REJECTED]
    assert not held.complete
    assert (await broker.free_now())["npu-1"] == 1


async def test_reserve_graph_errors_name_the_field(broker):
    await broker.device("npu-1", 5, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    spec = fig2a("in.tsv", "out")
    report = await fails(reserve(broker, md, spec, "x" * 60), C.INVALID_ARGUMENT)
    assert report.field_violations[0][0] == "per_process.reservation_id"
    assert 'room for ".set-0.0"' in report.field_violations[0][1]
    await fails(
        broker.stub.ReserveGraph(
            pb.ReserveGraphRequest(
                graph=to_proto(spec),
                per_process=pb.ReservationRequest(reservation_id="g", cores=1),
            ),
            metadata=md,
        ),
        C.INVALID_ARGUMENT,
        ["per_process.duration"],
    )
    report = await fails(reserve(broker, OP, spec, "g"), C.PERMISSION_DENIED)
    assert report.reason == "ROLE_REQUIRED"
    assert report.message.endswith("may not call ReserveGraph: it needs the role application")
    other = await broker.app("other")
    await reserve(broker, md, spec, "mine")
    report = await fails(reserve(broker, other, spec, "mine"), C.PERMISSION_DENIED)


# -- metrics (GF-6) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> list:
    tmp: Path = tmp_path_factory.mktemp("graph-runs")
    write_records(tmp / "in.tsv", 1500)
    return [
        run_graph(fig2a(tmp / "in.tsv", tmp / "out"), run_dir=tmp / f"run-{i}", run_id=f"run-{i}")
        for i in range(2)
    ]


async def test_reported_metrics_come_back_per_component(broker, two_runs):
    md = await broker.app("etl")
    first, second = (r.metrics for r in two_runs)
    client = GraphBroker(broker.ch, md[0][1].removeprefix("Bearer "))
    assert (await client.report(first)).runs == 1
    assert await client.metrics("fig-2a") == first
    assert (await client.report(second)).runs == 2
    assert (await client.metrics("fig-2a")).run_id == "run-1"  # the latest
    assert await client.metrics("fig-2a", "run-0") == first
    only = await client.metrics("fig-2a", components=["204H"])
    assert [c.component for c in only.components] == ["204H"]
    h = only.components[0]
    assert (h.records_in, h.folded_set, h.cpu_method) == (
        first.component("204H").records_in,
        "set-1",
        "process",
    )
    assert {f.name for f in only.flows} == {"204F.out -> 204H.in", "204H.out -> 204I.in"}
    # The operator reads any graph's metrics.
    await broker.stub.GetGraphMetrics(pb.GetGraphMetricsRequest(graph_id="fig-2a"), metadata=OP)


async def test_metrics_errors(broker, two_runs):
    md = await broker.app("etl")
    other = await broker.app("other")
    m = to_metrics(two_runs[0])
    await broker.stub.ReportGraphMetrics(pb.ReportGraphMetricsRequest(metrics=m), metadata=md)
    report = await fails(
        broker.stub.ReportGraphMetrics(pb.ReportGraphMetricsRequest(metrics=m), metadata=other),
        C.PERMISSION_DENIED,
    )
    assert report.reason == "ID_UNAVAILABLE" and "etl" not in report.message
    await fails(  # another application's graph is not there for it (issue 30)
        broker.stub.GetGraphMetrics(pb.GetGraphMetricsRequest(graph_id="fig-2a"), metadata=other),
        C.NOT_FOUND,
    )
    await fails(
        broker.stub.GetGraphMetrics(pb.GetGraphMetricsRequest(graph_id="nope"), metadata=md),
        C.NOT_FOUND,
    )
    await fails(
        broker.stub.GetGraphMetrics(
            pb.GetGraphMetricsRequest(graph_id="fig-2a", run_id="run-9"), metadata=md
        ),
        C.NOT_FOUND,
    )
    await fails(
        broker.stub.GetGraphMetrics(
            pb.GetGraphMetricsRequest(graph_id="fig-2a", components=["204Z"]), metadata=md
        ),
        C.NOT_FOUND,
    )
    bad = graph_pb2.GraphRunMetrics()
    bad.CopyFrom(m)
    bad.run_id = "a:b"
    bad.components[0].cpu_seconds = -1.0
    await fails(
        broker.stub.ReportGraphMetrics(pb.ReportGraphMetricsRequest(metrics=bad), metadata=md),
        C.INVALID_ARGUMENT,
        ["metrics.run_id", "metrics.components[0].cpu_seconds"],
    )
    await fails(
        broker.stub.ReportGraphMetrics(pb.ReportGraphMetricsRequest(metrics=m), metadata=OP),
        C.PERMISSION_DENIED,
    )


async def test_only_the_latest_runs_are_kept(redis_url, two_runs):
    async with running_broker(redis_url, LIGHTPATH_CB_GRAPH_RUNS_KEPT="2") as b:
        md = await b.app("etl")
        m = to_metrics(two_runs[0])
        for run in ("a", "b", "c"):
            m.run_id = run
            await b.stub.ReportGraphMetrics(pb.ReportGraphMetricsRequest(metrics=m), metadata=md)
        await fails(
            b.stub.GetGraphMetrics(
                pb.GetGraphMetricsRequest(graph_id="fig-2a", run_id="a"), metadata=md
            ),
            C.NOT_FOUND,
        )
        got = await b.stub.GetGraphMetrics(
            pb.GetGraphMetricsRequest(graph_id="fig-2a", run_id="b"), metadata=md
        )
        assert got.run_id == "b"


def to_metrics(result) -> graph_pb2.GraphRunMetrics:
    from lightpath.graph.metrics import to_proto as metrics_to_proto

    return metrics_to_proto(result.metrics)


# -- several replicas --------------------------------------------------------------------


async def test_two_replicas_reserve_whole_graphs_or_nothing_under_contention(redis_url):
    """12 graphs of 3 processes × 2 cores race for 20 cores through two brokers:
    each graph holds all its processes or none, and no instant over-commits."""
    async with running_broker(redis_url) as a, running_broker(redis_url) as b:
        await a.device("npu-1", 20, kind=pb.DEVICE_KIND_NPU)
        md = await a.app("etl")
        spec = fig2a("in.tsv", "out")
        results = await asyncio.gather(
            *(reserve((a, b)[i % 2], md, spec, f"g{i}", cores=2) for i in range(12))
        )
        complete = [r for r in results if r.complete]
        for r in results:
            outcomes = {p.reservation.outcome for p in r.processes}
            assert outcomes == ({pb.OUTCOME_GRANTED} if r.complete else {pb.OUTCOME_REJECTED})
        assert len(complete) == 3  # 3 graphs × 3 processes × 2 cores = 18 of 20
        assert (await a.free_now())["npu-1"] == 20 - 6 * len(complete)
        assert (await b.free_now())["npu-1"] == 20 - 6 * len(complete)
        listed = await a.stub.ListReservations(pb.ListReservationsRequest(), metadata=md)
        assert sorted(r.reservation_id for r in listed.reservations) == sorted(
            p.reservation.reservation_id for r in complete for p in r.processes
        )


GRAPH_CALLS = [
    ("PlanGraph", pb.PlanGraphRequest()),
    ("ReserveGraph", pb.ReserveGraphRequest()),
    ("ReportGraphMetrics", pb.ReportGraphMetricsRequest()),
    ("GetGraphMetrics", pb.GetGraphMetricsRequest(graph_id="g")),
]


@pytest.mark.parametrize(("method", "request_"), GRAPH_CALLS, ids=[m for m, _ in GRAPH_CALLS])
async def test_every_graph_call_needs_a_credential(open_broker, method, request_):
    call = getattr(open_broker.as_(anonymous()), method)
    report = await fails(call(request_), C.UNAUTHENTICATED)
    assert report.reason == "MISSING_CREDENTIAL"
    report = await fails(call(request_, metadata=bearer("etl:wrong")), C.UNAUTHENTICATED)
    assert report.reason == "INVALID_CREDENTIAL"


@pytest.mark.parametrize(("method", "request_"), GRAPH_CALLS, ids=[m for m, _ in GRAPH_CALLS])
async def test_graph_calls_refuse_tenants_and_nodes(broker, method, request_):
    for who in ("tenant:acme", "node:n-1"):
        report = await fails(getattr(broker.as_(who), method)(request_), C.PERMISSION_DENIED)
        assert report.reason == "ROLE_REQUIRED"


async def test_the_sdk_reserves_reports_and_reads_with_mtls_and_the_application_token(
    broker, two_runs
):
    """GraphBroker.connect: TLS with the caller's certificate (here a tenant's, which alone
    may not call the broker) and the application's token on every call."""
    await broker.device("npu-1", 4, kind=pb.DEVICE_KIND_NPU)
    md = await broker.app("etl")
    token = md[0][1].removeprefix("Bearer ")
    spec = fig2a("in.tsv", "out")
    async with GraphBroker.connect(
        broker.address, token, credentials=credentials("tenant:acme")
    ) as sdk:
        assert (await sdk.plan(spec)).processes_after == 3
        held = await sdk.reserve(spec, per_process("sdk-g"))
        assert held.complete
        assert {p.reservation.application_id for p in held.processes} == {"etl"}
        assert (await sdk.report(two_runs[0].metrics)).runs == 1
        assert (await sdk.metrics("fig-2a")).run_id == two_runs[0].metrics.run_id
    # the token is what names the caller: the tenant's certificate alone is refused
    async with GraphBroker.connect(
        broker.address, "", credentials=credentials("tenant:acme")
    ) as sdk:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sdk.plan(spec)
        assert err.value.code() == C.PERMISSION_DENIED
    # and with no certificate at all, mTLS refuses the connection
    async with GraphBroker.connect(broker.address, token, credentials=anonymous()) as sdk:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sdk.plan(spec)
        assert err.value.code() == C.UNAVAILABLE
