"""The shared server runtime over real gRPC and a real Redis: health, reflection,
GetInfo per service, error mapping, trace propagation, logs, graceful stop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from lightpath import __version__
from lightpath.client import channel, error_report, service_stub
from lightpath.embedded_redis import free_port
from lightpath.security.credentials import Credentials
from lightpath.security.identity import service_principal
from lightpath.stack import health_status
from lightpath.v1 import common_pb2
from lightpath_services.common.errors import FailedPrecondition, InvalidArgument, NotFound
from lightpath_services.common.policy import RULES, read
from lightpath_services.common.server import ServiceDefinition, running
from lightpath_services.common.settings import CommonSettings, load
from lightpath_services.common.telemetry import (
    REFUSAL_LOG_S,
    REFUSALS_LOGGED,
    JsonFormatter,
    RefusalLog,
    TraceContextFilter,
)
from tests.helpers import SERVICES, serve, tls_env

FULL_NAMES = {
    "cell_scheduler": "lightpath.v1.CellScheduler",
    "workload_scheduler": "lightpath.v1.WorkloadScheduler",
    "ocs_manager": "lightpath.v1.OcsManager",
    "core_broker": "lightpath.v1.CoreBroker",
    "agg_switch": "lightpath.v1.AggSwitch",
    "switch_agent": "lightpath.v1.OpticalSwitchAdmin",  # its GetInfo; OpticalSwitch beside it
}


async def reflect(ch: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest):
    stub = reflection_pb2_grpc.ServerReflectionStub(ch)
    async for resp in stub.ServerReflectionInfo([request]):
        return resp
    raise AssertionError("no reflection answer")


async def reflect_v1(ch: grpc.aio.Channel, request: reflection_pb2.ServerReflectionRequest):
    """grpc.reflection.v1, as grpcurl and newer tools ask first (its messages are
    v1alpha's, field for field, under another package)."""
    call = ch.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    async for resp in call(iter([request])):
        return resp
    raise AssertionError("no reflection answer")


@pytest.mark.parametrize("service", SERVICES)
async def test_service_contract_smoke(service, redis_url):
    scoped = {"ocs_manager", "workload_scheduler", "switch_agent"}
    env = {"LIGHTPATH_POD_ID": "pod-7"} if service in scoped else {}
    async with serve(service, redis_url, env) as svc, channel(svc.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for name in ("", FULL_NAMES[service]):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING

        listed = await reflect(ch, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {FULL_NAMES[service], "grpc.health.v1.Health"} <= names

        by_symbol = await reflect(
            ch, reflection_pb2.ServerReflectionRequest(file_containing_symbol=FULL_NAMES[service])
        )
        files = [
            descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in by_symbol.file_descriptor_response.file_descriptor_proto
        ]
        assert any(
            s.name == FULL_NAMES[service].rsplit(".", 1)[1] for f in files for s in f.service
        )

        # Issue 19: reflection v1 is served besides v1alpha, and describes itself.
        listed = await reflect_v1(ch, reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in listed.list_services_response.service}
        assert {
            FULL_NAMES[service],
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        } <= names
        for symbol, package in (
            (FULL_NAMES[service], "lightpath.v1"),
            ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1"),
        ):
            by_symbol = await reflect_v1(
                ch, reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
            )
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(b)
                for b in by_symbol.file_descriptor_response.file_descriptor_proto
            ]
            assert any(f.package == package and f.service for f in files), symbol

        info = await service_stub(service, ch).GetInfo(common_pb2.GetInfoRequest())
        assert info.service == FULL_NAMES[service]
        assert info.version == __version__
        assert info.instance_id
        assert abs(info.started_at.ToDatetime().timestamp() - time.time()) < 60
        assert info.pod_id == ("pod-7" if env else "")


# -- a probe service whose handlers raise, to test the runtime's error mapping --

PROBE = "lightpath.test.Probe"


def _probe_definition(log: list[str]) -> ServiceDefinition:
    async def invalid(request, context):
        raise InvalidArgument("shape.dims[1]", "must be a multiple of the block shape (4)")

    async def missing(request, context):
        raise NotFound("job", "job-42")

    async def busy(request, context):
        raise FailedPrecondition("block 7", "is wired to slice job-3", reason="BLOCK_IN_USE")

    async def boom(request, context):
        raise RuntimeError("a bug")

    async def slow(request, context):
        log.append("slow started")
        await asyncio.sleep(0.6)
        log.append("slow finished")
        return common_pb2.ServiceInfo(service="slow")

    async def stream(request, context):
        yield common_pb2.ServiceInfo(service="first")
        raise FailedPrecondition("job job-1", "is not RUNNING")

    def unary(fn):
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=common_pb2.GetInfoRequest.FromString,
            response_serializer=common_pb2.ServiceInfo.SerializeToString,
        )

    handlers = {
        "Invalid": unary(invalid),
        "Missing": unary(missing),
        "Busy": unary(busy),
        "Boom": unary(boom),
        "Slow": unary(slow),
    }
    handlers["Stream"] = grpc.unary_stream_rpc_method_handler(
        stream,
        request_deserializer=common_pb2.GetInfoRequest.FromString,
        response_serializer=common_pb2.ServiceInfo.SerializeToString,
    )
    generic = grpc.method_handlers_generic_handler(PROBE, handlers)
    return ServiceDefinition(
        PROBE, None, lambda _servicer, server: server.add_generic_rpc_handlers((generic,))
    )


def _call(ch: grpc.aio.Channel, method: str):
    return ch.unary_unary(
        f"/{PROBE}/{method}",
        request_serializer=common_pb2.GetInfoRequest.SerializeToString,
        response_deserializer=common_pb2.ServiceInfo.FromString,
    )


def _settings(redis_url: str) -> CommonSettings:
    return load(
        CommonSettings,
        {
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": "127.0.0.1:0",
            **tls_env(service_principal("probe")),
        },
    )


@pytest.fixture(autouse=True)
def probe_rules(monkeypatch):
    """The probe's methods get rows in the policy (a method without one is refused)."""
    for name in ("Invalid", "Missing", "Busy", "Boom", "Slow", "Stream"):
        monkeypatch.setitem(RULES, f"/{PROBE}/{name}", read("operator"))


async def _build_probe(log: list[str]):
    async def build(runtime):
        return [_probe_definition(log)]

    return build


async def test_domain_errors_become_statuses_naming_field_and_rule(redis_url):
    async with (
        running("probe", _settings(redis_url), await _build_probe([])) as svc,
        channel(svc.address) as ch,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Invalid")(common_pb2.GetInfoRequest())
        report = error_report(err.value)
        assert report.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "shape.dims[1]" in report.message and "multiple of the block shape" in report.message
        assert report.field_violations == [
            ("shape.dims[1]", "must be a multiple of the block shape (4)")
        ]
        assert report.reason == "INVALID_ARGUMENT"

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Missing")(common_pb2.GetInfoRequest())
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert (
            error_report(err.value).reason == "JOB_NOT_FOUND" and '"job-42"' in err.value.details()
        )

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Busy")(common_pb2.GetInfoRequest())
        report = error_report(err.value)
        assert (
            report.code == grpc.StatusCode.FAILED_PRECONDITION and report.reason == "BLOCK_IN_USE"
        )
        assert report.precondition_violations == [("block 7", "is wired to slice job-3")]

        stream = ch.unary_stream(
            f"/{PROBE}/Stream",
            request_serializer=common_pb2.GetInfoRequest.SerializeToString,
            response_deserializer=common_pb2.ServiceInfo.FromString,
        )(common_pb2.GetInfoRequest())
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for item in stream:
                got.append(item.service)
        assert got == ["first"] and err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_unexpected_exception_is_internal_with_trace_id_and_logged(
    redis_url, spans_factory, caplog
):
    spans = spans_factory("probe")
    caplog.set_level(logging.INFO, logger="lightpath.rpc")
    async with (
        running(
            "probe", _settings(redis_url), await _build_probe([]), tracer_provider=spans.provider
        ) as svc,
        channel(svc.address) as ch,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Boom")(common_pb2.GetInfoRequest())
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "a bug" not in err.value.details()  # no internals leak to the client
    server_span = next(s for s in spans.finished() if s.name == f"{PROBE}/Boom")
    trace_id = format(server_span.context.trace_id, "032x")
    assert trace_id in err.value.details()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].exc_info and "RuntimeError" in errors[0].getMessage()


async def test_trace_context_crosses_a_real_grpc_hop(redis_url, spans_factory):
    server_spans, client_spans = spans_factory("server"), spans_factory("client")
    async with serve("core_broker", redis_url, tracer_provider=server_spans.provider) as svc:
        async with channel(svc.address, tracer_provider=client_spans.provider) as ch:
            await service_stub("core_broker", ch).GetInfo(common_pb2.GetInfoRequest())
        for _ in range(50):  # the client span ends from the call's done callback
            if client_spans.finished():
                break
            await asyncio.sleep(0.02)
    (client,) = [s for s in client_spans.finished() if s.name.endswith("GetInfo")]
    (server,) = [s for s in server_spans.finished() if s.name.endswith("GetInfo")]
    assert client.kind.name == "CLIENT" and server.kind.name == "SERVER"
    assert client.context.trace_id == server.context.trace_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.attributes["rpc.service"] == "lightpath.v1.CoreBroker"
    assert client.resource.attributes["service.name"] == "client"


async def test_logs_are_json_and_carry_the_trace_id(redis_url, spans_factory):
    spans = spans_factory("probe")
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    handler = Collect()
    handler.addFilter(TraceContextFilter())
    handler.setFormatter(JsonFormatter("probe", "probe-1"))
    logger = logging.getLogger("lightpath.rpc")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        async with (
            running(
                "probe",
                _settings(redis_url),
                await _build_probe([]),
                tracer_provider=spans.provider,
            ) as svc,
            channel(svc.address) as ch,
        ):
            with pytest.raises(grpc.aio.AioRpcError):
                await _call(ch, "Invalid")(common_pb2.GetInfoRequest())
    finally:
        logger.removeHandler(handler)
    record = json.loads(lines[-1])
    span = next(s for s in spans.finished() if s.name.endswith("/Invalid"))
    assert record["trace_id"] == format(span.context.trace_id, "032x")
    assert (
        record["service"] == "probe"
        and record["level"] == "info"
        and record["code"] == "INVALID_ARGUMENT"
    )


def test_refused_calls_are_logged_one_by_one_up_to_a_few_a_second_and_counted_beyond(caplog):
    caplog.set_level(logging.INFO, logger="lightpath.rpc")
    now = [100.0]
    refusals = RefusalLog(clock=lambda: now[0])
    submit, cancel = (
        "/lightpath.v1.CellScheduler/SubmitJob",
        "/lightpath.v1.CellScheduler/CancelJob",
    )
    first = [refusals.admit(submit, "INVALID_ARGUMENT") for _ in range(REFUSALS_LOGGED + 5)]
    assert first == [True] * REFUSALS_LOGGED + [False] * 5
    assert refusals.admit(cancel, "INVALID_ARGUMENT")  # its own count
    assert refusals.admit(submit, "NOT_FOUND")  # and per code
    assert not caplog.records  # the counts wait for the interval's end
    now[0] += REFUSAL_LOG_S
    assert refusals.admit(submit, "INVALID_ARGUMENT")  # a new interval: written again
    (summary,) = caplog.records
    assert summary.levelno == logging.INFO
    assert summary.getMessage() == (
        f"{submit} -> INVALID_ARGUMENT: 5 more refused call(s), not logged one by one (the "
        f"first {REFUSALS_LOGGED} of each method and code in {REFUSAL_LOG_S:g} s are)"
    )
    assert summary.refused == 5  # type: ignore[attr-defined]


async def test_a_flood_of_refused_calls_writes_a_few_lines_not_one_each(redis_url, caplog):
    caplog.set_level(logging.INFO, logger="lightpath.rpc")
    async with (
        running("probe", _settings(redis_url), await _build_probe([])) as svc,
        channel(svc.address) as ch,
    ):
        for _ in range(5 * REFUSALS_LOGGED):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch, "Invalid")(common_pb2.GetInfoRequest())
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # every one answered
    lines = [r for r in caplog.records if r.name == "lightpath.rpc" and "Invalid" in r.getMessage()]
    one_by_one = [r for r in lines if "more refused" not in r.getMessage()]
    # a slow machine may spread the calls over more than one interval
    assert REFUSALS_LOGGED <= len(one_by_one) < 5 * REFUSALS_LOGGED


async def test_graceful_stop_drains_in_flight_calls_and_refuses_new_ones(redis_url):
    log: list[str] = []
    async with channel_pair(redis_url, log, grace=3.0) as (stop, ch):
        call = asyncio.ensure_future(_call(ch, "Slow")(common_pb2.GetInfoRequest()))
        while "slow started" not in log:
            await asyncio.sleep(0.01)
        await stop()
        assert (await call).service == "slow"
        assert log == ["slow started", "slow finished"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Slow")(common_pb2.GetInfoRequest(), timeout=1.0)
        assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_grace_period_bounds_the_wait(redis_url):
    log: list[str] = []
    async with channel_pair(redis_url, log, grace=0.1) as (stop, ch):
        call = asyncio.ensure_future(_call(ch, "Slow")(common_pb2.GetInfoRequest()))
        while "slow started" not in log:
            await asyncio.sleep(0.01)
        await stop()
        # Stopped within the grace period, not after the 0.6 s call: the call was cut
        # short (no wall-clock assertion: what happened to the call says it).
        assert "slow finished" not in log
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        assert "slow finished" not in log


class channel_pair:
    """A probe server plus a client channel; `stop()` stops the server early."""

    def __init__(self, redis_url: str, log: list[str], grace: float):
        self.redis_url, self.log, self.grace = redis_url, log, grace

    async def __aenter__(self):
        self._cm = running(
            "probe", _settings(self.redis_url), await _build_probe(self.log), grace=self.grace
        )
        svc = await self._cm.__aenter__()
        self._ch = channel(svc.address, max_attempts=1)
        self._stopped = False

        async def stop():
            self._stopped = True
            await self._cm.__aexit__(None, None, None)

        return stop, self._ch

    async def __aexit__(self, *exc):
        await self._ch.close()
        if not self._stopped:
            await self._cm.__aexit__(*exc)


def _run_service_process(
    redis_url: str, extra_env: dict[str, str]
) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = {
        **os.environ,
        **tls_env(service_principal("core_broker")),
        "LIGHTPATH_REDIS_URL": redis_url,
        "LIGHTPATH_LISTEN": f"127.0.0.1:{port}",
        **extra_env,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "lightpath_services.core_broker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while health_status(f"127.0.0.1:{port}", timeout=0.5) != "SERVING":
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return proc, port


def test_rpc_metrics_are_served_on_the_metrics_endpoint(redis_url):
    from prometheus_client.parser import text_string_to_metric_families

    from lightpath.embedded_redis import free_port

    metrics_port = free_port()
    proc, port = _run_service_process(
        redis_url,
        {
            "LIGHTPATH_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
            "LIGHTPATH_SHUTDOWN_GRACE_S": "1",
        },
    )
    try:
        import grpc as sync_grpc

        from lightpath.v1 import core_broker_pb2_grpc

        creds = Credentials.default().channel_credentials()
        assert creds is not None  # the tests' operator certificate (tests/conftest.py)
        with sync_grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
            core_broker_pb2_grpc.CoreBrokerStub(ch).GetInfo(common_pb2.GetInfoRequest(), timeout=5)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("rpc_grpc_status_code", "OK"), ("rpc_method", "/lightpath.v1.CoreBroker/GetInfo"))
    assert samples[("rpc_server_duration_milliseconds_count", labels)] == 1
    info = [dict(k[1]) for k in samples if k[0] == "target_info"]
    assert [i["service_name"] for i in info] == ["lightpath-core_broker"]


def test_sigterm_stops_a_service_process_cleanly(redis_url):
    proc, _port = _run_service_process(redis_url, {"LIGHTPATH_SHUTDOWN_GRACE_S": "1"})
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        logs = [
            json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")
        ]
        assert any("stopping" in rec["msg"] for rec in logs)
        assert all(rec["service"] == "core_broker" for rec in logs)
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_shutdown_does_not_hang_on_a_task_that_swallows_a_cancellation(redis_url):
    """redis.asyncio can swallow a CancelledError that lands mid-command; a background
    loop that goes on after one must still be stopped when the service stops."""
    swallowed: list[str] = []
    stopped = asyncio.Event()

    async def stubborn_loop() -> None:
        try:
            while True:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if not swallowed:  # the first cancel vanishes, as in redis-py#2028
                        swallowed.append("once")
                        continue
                    raise
        finally:
            stopped.set()

    async def build(runtime):
        runtime.spawn(stubborn_loop(), "stubborn")
        return [_probe_definition([])]

    async with running("probe", _settings(redis_url), build):
        await asyncio.sleep(0.05)
    # Stopped although it swallowed a cancellation (a hang would meet the test timeout).
    assert swallowed == ["once"] and stopped.is_set()
