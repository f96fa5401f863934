"""X-3 under faults, over real gRPC and a real Redis: a Redis failure is UNAVAILABLE
with a retry delay (never INTERNAL), load shedding is RESOURCE_EXHAUSTED with one,
request bytes that do not parse are INVALID_ARGUMENT naming the message type, and
a bounded Redis pool answers UNAVAILABLE to the calls that wait too long for it."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.message import DecodeError
from redis import exceptions as redis_errors

from lightpath.client import channel, error_report, retry_service_config
from lightpath.embedded_redis import EmbeddedRedis
from lightpath.security.identity import service_principal
from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc, common_pb2
from lightpath_services.common.errors import ResourceExhausted, Unavailable
from lightpath_services.common.policy import RULES, read
from lightpath_services.common.server import ServiceDefinition, running
from lightpath_services.common.settings import CommonSettings, SettingsError, load
from tests.helpers import credentials, serve, tls_env
from tests.test_bad_input import MODULES, MODULES_BY_FILE

PROBE = "lightpath.test.FaultProbe"

# handler name -> (what it raises, the ErrorInfo reason the caller gets)
REDIS_FAILURES: dict[str, tuple[Exception, str]] = {
    "Unreachable": (
        redis_errors.ConnectionError("Error 111 connecting to 10.0.0.9:6379. Connection refused."),
        "REDIS_UNREACHABLE",
    ),
    "Timeout": (redis_errors.TimeoutError("Timeout reading from socket"), "REDIS_TIMEOUT"),
    "Loading": (
        redis_errors.BusyLoadingError("Redis is loading the dataset in memory"),
        "REDIS_LOADING",
    ),
    "ReadOnly": (
        redis_errors.ReadOnlyError("You can't write against a read only replica."),
        "REDIS_READ_ONLY",
    ),
    # What a demoted master answers a script's write and a WAIT (issue 32).
    "ReadOnlyScript": (
        redis_errors.ResponseError(
            "Error running script (call to f_e8c4): @user_script:24: @user_script: 24: "
            "-READONLY You can't write against a read only replica."
        ),
        "REDIS_READ_ONLY",
    ),
    "WaitOnReplica": (
        redis_errors.ResponseError("WAIT cannot be used with replica instances. Please also"),
        "REDIS_READ_ONLY",
    ),
    "PoolFull": (redis_errors.MaxConnectionsError("Too many connections"), "REDIS_POOL_EXHAUSTED"),
    "PoolWait": (redis_errors.ConnectionError("No connection available."), "REDIS_POOL_EXHAUSTED"),
    "ClusterDown": (redis_errors.ClusterDownError("CLUSTERDOWN"), "REDIS_UNAVAILABLE"),
    "TryAgain": (redis_errors.TryAgainError("TRYAGAIN"), "REDIS_UNAVAILABLE"),
    "SlotNotCovered": (redis_errors.SlotNotCoveredError("slot 42"), "REDIS_UNAVAILABLE"),
    "MasterDown": (redis_errors.MasterDownError("MASTERDOWN"), "REDIS_UNAVAILABLE"),
    "WrongPassword": (
        redis_errors.AuthenticationError("invalid username-password pair"),
        "REDIS_AUTH_FAILED",
    ),
}
OTHER_METHODS = (
    "Shed",
    "OutOfMemory",
    "WrongType",
    "StreamLoading",
    "Collect",
    "Hold",
    "Flaky",
    "ShedCounted",
    "Answered",
)


def _probe(runtime, calls: dict[str, int]) -> ServiceDefinition:
    def raising(exc: Exception):
        async def handler(request, context):
            raise exc

        return handler

    async def shed(request, context):
        raise ResourceExhausted("the cell is shedding load", reason="LOAD_SHED", retry_delay_s=1.5)

    async def stream_loading(request, context):
        yield common_pb2.ServiceInfo(service="first")
        raise redis_errors.BusyLoadingError("Redis is loading the dataset in memory")

    async def collect(requests, context):
        count = 0
        async for _ in requests:
            count += 1
        return common_pb2.ServiceInfo(service=str(count))

    async def hold(request, context):
        # Holds one pooled connection for ~1 s (BLPOP on a list nobody pushes to).
        await runtime.redis.blpop(["fault-probe:nothing"], timeout=1)
        return common_pb2.ServiceInfo(service="held")

    async def flaky(request, context):
        calls["Flaky"] += 1
        if calls["Flaky"] < 3:
            raise redis_errors.ConnectionError("Connection reset by peer")
        return common_pb2.ServiceInfo(service=str(calls["Flaky"]))

    async def answered(request, context):
        calls["Answered"] += 1
        done = Unavailable("done and forgotten", reason="WIRING_FAILED")
        done.final = True
        raise done

    async def shed_counted(request, context):
        calls["ShedCounted"] += 1
        raise ResourceExhausted("no capacity now", retry_delay_s=0.5)

    def unary(fn):
        return grpc.unary_unary_rpc_method_handler(
            fn,
            request_deserializer=common_pb2.GetInfoRequest.FromString,
            response_serializer=common_pb2.ServiceInfo.SerializeToString,
        )

    handlers = {name: unary(raising(exc)) for name, (exc, _) in REDIS_FAILURES.items()}
    handlers.update(
        {
            "Shed": unary(shed),
            "OutOfMemory": unary(
                raising(redis_errors.OutOfMemoryError("command not allowed when used memory"))
            ),
            "WrongType": unary(raising(redis_errors.ResponseError("WRONGTYPE Operation"))),
            "Hold": unary(hold),
            "Flaky": unary(flaky),
            "ShedCounted": unary(shed_counted),
            "Answered": unary(answered),
            "StreamLoading": grpc.unary_stream_rpc_method_handler(
                stream_loading,
                request_deserializer=common_pb2.GetInfoRequest.FromString,
                response_serializer=common_pb2.ServiceInfo.SerializeToString,
            ),
            "Collect": grpc.stream_unary_rpc_method_handler(
                collect,
                request_deserializer=common_pb2.GetInfoRequest.FromString,
                response_serializer=common_pb2.ServiceInfo.SerializeToString,
            ),
        }
    )
    generic = grpc.method_handlers_generic_handler(PROBE, handlers)
    return ServiceDefinition(
        PROBE, None, lambda _servicer, server: server.add_generic_rpc_handlers((generic,))
    )


@pytest.fixture(autouse=True)
def probe_rules(monkeypatch):
    """The probe's methods get rows in the policy (a method without one is refused)."""
    for name in (*REDIS_FAILURES, *OTHER_METHODS):
        monkeypatch.setitem(RULES, f"/{PROBE}/{name}", read("operator"))


def _settings(redis_url: str, **env: str) -> CommonSettings:
    return load(
        CommonSettings,
        {
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": "127.0.0.1:0",
            "LIGHTPATH_AUDIT_LOG": "",
            **tls_env(service_principal("probe")),
            **env,
        },
    )


def _running_probe(redis_url: str, calls: dict[str, int] | None = None, **env: str):
    async def build(runtime):
        return [_probe(runtime, calls if calls is not None else {})]

    return running("probe", _settings(redis_url, **env), build)


def _call(ch: grpc.aio.Channel, method: str):
    return ch.unary_unary(
        f"/{PROBE}/{method}",
        request_serializer=common_pb2.GetInfoRequest.SerializeToString,
        response_deserializer=common_pb2.ServiceInfo.FromString,
    )


async def test_every_redis_failure_is_unavailable_with_a_retry_delay(redis_url):
    async with _running_probe(redis_url) as svc, channel(svc.address, max_attempts=1) as ch:
        for name, (exc, reason) in REDIS_FAILURES.items():
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _call(ch, name)(common_pb2.GetInfoRequest())
            report = error_report(err.value)
            assert report.code == grpc.StatusCode.UNAVAILABLE, (name, report)
            assert report.reason == reason, name
            assert report.retry_delay_s is not None and 0 < report.retry_delay_s <= 5, name
            assert type(exc).__name__ in report.message
            if reason != "REDIS_AUTH_FAILED":
                assert "may be retried" in report.message, report.message
            assert "10.0.0.9" not in report.message  # Redis's own text stays in the log

        # a failure in the middle of a stream, after a first message
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for item in ch.unary_stream(
                f"/{PROBE}/StreamLoading",
                request_serializer=common_pb2.GetInfoRequest.SerializeToString,
                response_deserializer=common_pb2.ServiceInfo.FromString,
            )(common_pb2.GetInfoRequest()):
                got.append(item.service)
        report = error_report(err.value)
        assert got == ["first"]
        assert report.code == grpc.StatusCode.UNAVAILABLE and report.reason == "REDIS_LOADING"
        assert report.retry_delay_s == 1.0


async def test_load_shedding_is_resource_exhausted_with_a_delay_and_bugs_stay_internal(
    redis_url,
):
    async with _running_probe(redis_url) as svc, channel(svc.address, max_attempts=1) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Shed")(common_pb2.GetInfoRequest())
        report = error_report(err.value)
        assert report.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert report.reason == "LOAD_SHED" and report.retry_delay_s == 1.5

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "OutOfMemory")(common_pb2.GetInfoRequest())
        report = error_report(err.value)
        assert report.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert report.reason == "REDIS_OUT_OF_MEMORY" and report.retry_delay_s

        # A Redis error that says the code is wrong (not that Redis is down) is a bug.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "WrongType")(common_pb2.GetInfoRequest())
        report = error_report(err.value)
        assert report.code == grpc.StatusCode.INTERNAL and report.retry_delay_s is None


async def test_the_sdk_retries_unavailable_but_not_resource_exhausted(redis_url):
    calls = {"Flaky": 0, "ShedCounted": 0, "Answered": 0}
    assert "RESOURCE_EXHAUSTED" not in retry_service_config()
    async with _running_probe(redis_url, calls) as svc, channel(svc.address) as ch:
        # two UNAVAILABLE answers, then success: the channel's retry policy hides them
        assert (await _call(ch, "Flaky")(common_pb2.GetInfoRequest())).service == "3"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "ShedCounted")(common_pb2.GetInfoRequest())
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert calls["ShedCounted"] == 1  # not retried blindly
        assert error_report(err.value).retry_delay_s == 0.5
        # an UNAVAILABLE the server marks final (it did the work and forgot it: a pod's
        # no-wait job whose wiring failed, issue 34) reaches the caller from one attempt
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(ch, "Answered")(common_pb2.GetInfoRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_report(err.value).reason == "WIRING_FAILED"
        assert calls["Answered"] == 1


async def test_a_service_whose_redis_stopped_answers_unavailable_then_recovers(tmp_path):
    redis_server = EmbeddedRedis(tmp_path, appendonly=False)
    redis_server.start()
    restarted: EmbeddedRedis | None = None
    try:
        async with (
            serve("cell_scheduler", redis_server.url) as svc,
            channel(svc.address, max_attempts=1) as ch,
        ):
            cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            request = cell_scheduler_pb2.GetCellJobRequest(job_id="job-1")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cell.GetJob(request)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND  # Redis is up

            port = redis_server.port
            redis_server.stop()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cell.GetJob(request, timeout=20)
            report = error_report(err.value)
            assert report.code == grpc.StatusCode.UNAVAILABLE, report
            assert report.reason == "REDIS_UNREACHABLE" and report.retry_delay_s

            restarted = EmbeddedRedis(tmp_path, port=port, appendonly=False)
            restarted.start()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await cell.GetJob(request, timeout=20)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND  # the same client reconnected
    finally:
        redis_server.stop()
        if restarted is not None:
            restarted.stop()


async def test_a_full_pool_answers_unavailable_after_the_bounded_wait(redis_url):
    async with (
        _running_probe(
            redis_url,
            LIGHTPATH_REDIS_MAX_CONNECTIONS="1",
            LIGHTPATH_REDIS_POOL_TIMEOUT_S="0.2",
        ) as svc,
        channel(svc.address, max_attempts=1) as ch,
    ):
        pool = svc.runtime.redis.connection_pool
        assert (pool.max_connections, pool.timeout) == (1, 0.2)
        # one call gets the one connection and holds it ~1 s; the others wait 0.2 s
        answers = await asyncio.gather(
            *(_call(ch, "Hold")(common_pb2.GetInfoRequest(), timeout=10) for _ in range(5)),
            return_exceptions=True,
        )
    held = [a for a in answers if isinstance(a, common_pb2.ServiceInfo)]
    refused = [a for a in answers if not isinstance(a, common_pb2.ServiceInfo)]
    assert [h.service for h in held] == ["held"], answers
    assert all(isinstance(e, grpc.aio.AioRpcError) for e in refused), refused
    reports = [error_report(e) for e in refused]
    assert {r.code for r in reports} == {grpc.StatusCode.UNAVAILABLE}, reports
    assert {r.reason for r in reports} == {"REDIS_POOL_EXHAUSTED"}
    assert all(r.retry_delay_s for r in reports)
    assert all("LIGHTPATH_REDIS_POOL_TIMEOUT_S" in r.message for r in reports)


def test_pool_settings_are_checked_at_start():
    settings = load(CommonSettings, {})
    assert (settings.redis_max_connections, settings.redis_pool_timeout_s) == (64, 2.0)
    with pytest.raises(SettingsError, match="LIGHTPATH_REDIS_MAX_CONNECTIONS"):
        load(CommonSettings, {"LIGHTPATH_REDIS_MAX_CONNECTIONS": "0"})
    with pytest.raises(SettingsError, match="LIGHTPATH_REDIS_POOL_TIMEOUT_S"):
        load(CommonSettings, {"LIGHTPATH_REDIS_POOL_TIMEOUT_S": "-1"})


# -- request bytes that do not parse ---------------------------------------------

FIXED_GARBAGE = (
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # a tag varint that never ends
    b"\x0f",  # wire type 7 does not exist
    b"\x0a\x40abc",  # field 1 says 64 bytes follow, 3 do
)


def _garbage(request_type, rng: random.Random) -> list[bytes]:
    """Payloads that do not parse as `request_type` (checked here, so each one counts)."""
    out = list(FIXED_GARBAGE)
    while len(out) < len(FIXED_GARBAGE) + 2:
        candidate = rng.randbytes(rng.randint(1, 40))
        try:
            request_type.FromString(candidate)
        except DecodeError:
            out.append(candidate)
    for raw in out:
        with pytest.raises(DecodeError):
            request_type.FromString(raw)
    return out


async def _raw_call(ch: grpc.aio.Channel, path: str, server_streaming: bool, raw: bytes):
    if server_streaming:
        call = ch.unary_stream(path)(raw, timeout=5)
        await call.read()
        call.cancel()
        return
    await ch.unary_unary(path)(raw, timeout=5)


async def test_probe_bytes_that_do_not_parse_are_invalid_argument(redis_url):
    async with _running_probe(redis_url) as svc, channel(svc.address, max_attempts=1) as ch:
        for raw in FIXED_GARBAGE:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ch.unary_unary(f"/{PROBE}/Shed")(raw)
            report = error_report(err.value)
            assert report.code == grpc.StatusCode.INVALID_ARGUMENT, report
            assert report.reason == "MALFORMED_REQUEST"
            assert "lightpath.v1.GetInfoRequest" in report.message
            assert report.field_violations and report.field_violations[0][0] == "request"

        # a client stream: the good messages pass, the first bad one names its index
        ok = common_pb2.GetInfoRequest().SerializeToString()
        collect = ch.stream_unary(f"/{PROBE}/Collect")
        assert common_pb2.ServiceInfo.FromString(await collect(iter([ok, ok]))).service == "2"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(iter([ok, ok, b"\x0f", ok]))
        report = error_report(err.value)
        assert report.code == grpc.StatusCode.INVALID_ARGUMENT
        assert report.field_violations[0][0] == "request[2]"


# Who calls: the first of these the policy lets through (the Guard runs before a
# request is looked at, so a caller it refuses learns nothing about its bytes).
CALLERS = (
    "operator:operator",
    "application:cam",
    "tenant:acme",
    "node:n1",
    "service:workload_scheduler/pod-1",
    "service:cell_scheduler",
    "service:agg_switch/root",
)


@contextlib.asynccontextmanager
async def _cell(redis_url: str) -> AsyncIterator[dict[str, str]]:
    """One of each service on one Redis (as tests/test_bad_input.py runs them): addresses."""
    async with contextlib.AsyncExitStack() as stack:
        cell = await stack.enter_async_context(serve("cell_scheduler", redis_url))
        ocs = await stack.enter_async_context(
            serve("ocs_manager", redis_url, {"LIGHTPATH_POD_ID": "pod-1"})
        )
        ws_env = {
            "LIGHTPATH_POD_ID": "pod-1",
            "LIGHTPATH_OCS_ADDR": ocs.address,
            "LIGHTPATH_CELL_ADDR": cell.address,
        }
        ws = await stack.enter_async_context(serve("workload_scheduler", redis_url, ws_env))
        broker = await stack.enter_async_context(serve("core_broker", redis_url))
        agg = await stack.enter_async_context(serve("agg_switch", redis_url))
        yield {
            "cell": cell.address,
            "ws": ws.address,
            "ocs": ocs.address,
            "broker": broker.address,
            "agg": agg.address,
        }


async def test_every_rpc_answers_invalid_argument_to_bytes_that_do_not_parse(redis_url):
    rng = random.Random(7)
    wrong: list[str] = []
    checked = 0
    async with _cell(redis_url) as addresses, contextlib.AsyncExitStack() as stack:
        channels: dict[tuple[str, str], grpc.aio.Channel] = {}

        async def answer(name: str, path: str, server_streaming: bool, raw: bytes):
            for caller in CALLERS:
                if (name, caller) not in channels:
                    channels[name, caller] = await stack.enter_async_context(
                        channel(addresses[name], max_attempts=1, credentials=credentials(caller))
                    )
                try:
                    await _raw_call(channels[name, caller], path, server_streaming, raw)
                    return None
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.PERMISSION_DENIED:
                        return error_report(err)
            raise AssertionError(f"no caller in CALLERS may call {path}")

        for name, module in MODULES.items():
            (service,) = module.DESCRIPTOR.services_by_name.values()
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                if method.client_streaming:
                    continue  # agg_switch's data path: raw bytes, decoded by the servicer
                request_type = MODULES_BY_FILE[method.input_type.file.name].__dict__[
                    method.input_type.name
                ]
                for raw in _garbage(request_type, rng):
                    checked += 1
                    report = await answer(name, path, method.server_streaming, raw)
                    if (
                        report is None
                        or report.code != grpc.StatusCode.INVALID_ARGUMENT
                        or report.reason != "MALFORMED_REQUEST"
                        or method.input_type.full_name not in report.message
                    ):
                        wrong.append(f"{path}({raw!r}) -> {report}")
    assert checked > 200
    assert not wrong, "\n".join(wrong[:20])


async def test_the_agg_data_path_keeps_its_raw_codec_and_refuses_garbage_itself(redis_url):
    """Contribute takes raw bytes (no protobuf deserializer to wrap): a compute node's
    garbage chunk is still INVALID_ARGUMENT, from the servicer's own decoding."""
    async with (
        serve("agg_switch", redis_url) as svc,
        channel(svc.address, max_attempts=1, credentials=credentials("node:n1")) as ch,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.stream_unary("/lightpath.v1.AggSwitch/Contribute")(
                iter([b"\xff\xff\xff\x00garbage"]), timeout=5
            )
    report = error_report(err.value)
    assert report.code == grpc.StatusCode.INVALID_ARGUMENT, report
    assert report.field_violations[0][0] == "chunk"
