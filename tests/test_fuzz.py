"""Fuzzing every RPC of every service (issue 14, X-3): whatever a client sends,
no call answers INTERNAL or UNKNOWN, every service still answers its health
check afterwards, and the OCS pod's invariants still hold.

One of each service runs in-process (real gRPC with TLS, one real Redis, as in
tests/test_bad_input.py) on an event loop of this module's own, so hypothesis
drives plain functions. Per method, hypothesis builds random *well-formed*
requests from the method's input descriptor (extreme integers, unicode and
id-like strings, unknown enum numbers, short repeated and map fields, nested
messages, Timestamps and Durations out of range) and random bytes sent raw.
Streaming calls send 1-3 messages; a server stream is read for one message at
most, under a short deadline. Calls run as the operator (full rights) where the
method allows it, else as the one kind of caller it takes (an application, a
node, an aggregation switch), so that every call reaches the servicer.

Bounded: LIGHTPATH_FUZZ_EXAMPLES examples over all methods (default 300, the CI
profile, ~10 s on 2 cores); set it higher for a longer run, e.g. 20000 (~1 min).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from functools import cache
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightpath.client import channel, error_report
from lightpath.security.identity import APPLICATION, NODE, OPERATOR, service_principal
from lightpath.v1 import (
    agg_switch_pb2,
    cell_scheduler_pb2,
    core_broker_pb2,
    ocs_manager_pb2,
    optical_switch_pb2,
    workload_scheduler_pb2,
)
from lightpath_services.common import policy
from tests.helpers import credentials, one_of_each, serve

TOTAL_EXAMPLES = int(os.environ.get("LIGHTPATH_FUZZ_EXAMPLES", "300"))
MODULES = {
    "cell": cell_scheduler_pb2,
    "ws": workload_scheduler_pb2,
    "ocs": ocs_manager_pb2,
    "broker": core_broker_pb2,
    "agg": agg_switch_pb2,
    "agent": optical_switch_pb2,  # a switch agent of pod-1 (the southbound and its admin)
}
METHODS = [
    (name, method)
    for name, module in MODULES.items()
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
# Three quarters of the budget to well-formed messages, a quarter to raw bytes.
WELL_FORMED = max(2, round(TOTAL_EXAMPLES * 0.75 / len(METHODS)))
RAW = max(1, round(TOTAL_EXAMPLES * 0.25 / len(METHODS)))
SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
# What lightpath_services.common.auth.Guard answers before a call reaches its servicer.
GUARD_REASONS = {
    "MALFORMED_CREDENTIAL",
    "INVALID_CREDENTIAL",
    "UNKNOWN_IDENTITY",
    "MISSING_CREDENTIAL",
    "ROLE_REQUIRED",
    "WRONG_SCOPE",
    "NO_AUTHORIZATION_RULE",
    "UNKNOWN_APPLICATION",
}
UNARY_TIMEOUT_S = 5.0
STREAM_TIMEOUT_S = 0.3
NOW_S = int(time.time())

F = descriptor.FieldDescriptor
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
UINT32 = (0, 2**32 - 1)
UINT64 = (0, 2**64 - 1)
INT_RANGES = {
    F.TYPE_INT32: INT32,
    F.TYPE_SINT32: INT32,
    F.TYPE_SFIXED32: INT32,
    F.TYPE_INT64: INT64,
    F.TYPE_SINT64: INT64,
    F.TYPE_SFIXED64: INT64,
    F.TYPE_UINT32: UINT32,
    F.TYPE_FIXED32: UINT32,
    F.TYPE_UINT64: UINT64,
    F.TYPE_FIXED64: UINT64,
}
IDS = ["pod-1", "job-1", "dev-1", "app-1", "tree-1", "root", "n1", "tpu", "g0.1", "r0/p0"]
ODD_STRINGS = [
    "",
    "0",
    "-1",
    "1e400",
    "nan",
    "1700000000000-0",
    "99999999999999999999-1",
    "x-y",
    "MTIz",  # base64 of "123": a page token's shape
    "!!!",
    "../../etc",
    "a:b{c}",
    "127.0.0.1:1",
    "∑ü\u0000",
    "a" * 300,
]
EXTREME_SECONDS = [
    INT64[0],
    INT64[1],
    -62_135_596_801,  # one second before 0001-01-01
    -1,
    0,
    253_402_300_799,  # 9999-12-31T23:59:59Z
    253_402_300_800,
    315_576_000_001,
    NOW_S,
    NOW_S + 3600,
]
EXTREME_NANOS = [INT32[0], -(10**9), -1_000_000_000 + 1, -1, 0, 999_999_999, 10**9, INT32[1]]


def _int_strategy(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({lo, hi, 0, 1, 2, 3, 7, 64, 1000, *([-1] if lo < 0 else [])})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi), st.integers(0, 16))


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t == F.TYPE_STRING:
        return st.one_of(
            st.sampled_from(IDS),
            st.sampled_from(ODD_STRINGS),
            st.from_regex(r"[A-Za-z0-9._-]{1,16}", fullmatch=True),
            st.text(max_size=24),
        )
    if t == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == F.TYPE_BOOL:
        return st.booleans()
    if t == F.TYPE_DOUBLE:
        return st.floats()
    if t == F.TYPE_FLOAT:
        return st.floats(width=32)
    if t == F.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(values), st.sampled_from([99, -1, INT32[1]]))
    return _int_strategy(*INT_RANGES[t])


def _time_strategy(cls: type[Message]) -> st.SearchStrategy[Message]:
    seconds = st.one_of(st.sampled_from(EXTREME_SECONDS), st.integers(*INT64))
    nanos = st.one_of(st.sampled_from(EXTREME_NANOS), st.integers(*INT32))
    return st.builds(cls, seconds=seconds, nanos=nanos)


def _field_values(field: descriptor.FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    """Random values of one field: a dict for a map, a list for a repeated field."""

    def value(f: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
        if f.message_type is not None:
            return st.deferred(lambda: messages(f.message_type, depth + 1))
        return _scalar(f)

    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        key_f, val_f = (field.message_type.fields_by_name[k] for k in ("key", "value"))
        return st.dictionaries(_scalar(key_f), value(val_f), max_size=2)
    if field.is_repeated:
        return st.lists(value(field), max_size=3)
    return value(field)


def _with(base: Message, values: dict[str, Any]) -> Message:
    """A copy of `base` with the fields in `values` replaced."""
    msg = type(base)()
    msg.CopyFrom(base)
    for name, v in values.items():
        msg.ClearField(name)
        target = getattr(msg, name)
        if isinstance(v, dict):
            for k, item in v.items():
                if isinstance(item, Message):
                    target[k].CopyFrom(item)
                else:
                    target[k] = item
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, Message):
                    target.add().CopyFrom(item)
                else:
                    target.append(item)
        elif isinstance(v, Message):
            target.CopyFrom(v)
        else:
            setattr(msg, name, v)
    return msg


@cache
def messages(desc: descriptor.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random well-formed messages of type `desc` (nested ones to depth 3)."""
    cls = message_factory.GetMessageClass(desc)
    if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        return _time_strategy(cls)
    if depth > 3:
        return st.just(cls())
    parts = {f.name: _field_values(f, depth) for f in desc.fields}
    return st.fixed_dictionaries({}, optional=parts).map(lambda v: _with(cls(), v))


def mutated(seed: Message, depth: int = 0) -> st.SearchStrategy[Message]:
    """`seed` (a valid request) with some fields, at any depth, replaced at random:
    random messages alone rarely get past validation into the deeper code."""
    desc = seed.DESCRIPTOR
    if desc.full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        return st.one_of(st.just(seed), _time_strategy(type(seed)))
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        options = [_field_values(f, depth)]
        if f.message_type is not None and not f.is_repeated and seed.HasField(f.name):
            options.insert(0, mutated(getattr(seed, f.name), depth + 1))
        parts[f.name] = st.one_of(options)
    return st.fixed_dictionaries({}, optional=parts).map(lambda v: _with(seed, v))


def _classes(method: descriptor.MethodDescriptor) -> tuple[type[Message], type[Message]]:
    return (
        message_factory.GetMessageClass(method.input_type),
        message_factory.GetMessageClass(method.output_type),
    )


class Cell:
    """The five services on this module's own event loop, and a channel to each per caller."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        channels: dict[tuple[str, str], grpc.aio.Channel],
    ):
        self.loop = loop
        self._channels = channels
        self.channels = {name: ch for (name, who), ch in channels.items() if who == OPERATOR}

    def channel(self, name: str, method: descriptor.MethodDescriptor) -> grpc.aio.Channel:
        return self._channels[(name, str(_caller(method) or OPERATOR))]

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    async def _call(self, name: str, method: descriptor.MethodDescriptor, requests: list[Any]):
        """Send `requests` (messages, or bytes sent raw) to `method`; read at most one answer."""
        ch = self.channel(name, method)
        path = f"/{method.containing_service.full_name}/{method.name}"
        request_cls, response_cls = _classes(method)
        raw = isinstance(requests[0], bytes)
        kw = {
            "request_serializer": (lambda b: b) if raw else request_cls.SerializeToString,
            "response_deserializer": response_cls.FromString,
        }
        if method.client_streaming:
            # Written one by one, not from an iterator, so that a write the server
            # did not wait for (it ended the call early) is told apart from its status.
            if method.server_streaming:  # none today; kept for a future bidi method
                call = ch.stream_stream(path, **kw)(timeout=STREAM_TIMEOUT_S)
                if await self._write_all(call, requests):
                    await self._read_one(call)
                return None
            call = ch.stream_unary(path, **kw)(timeout=UNARY_TIMEOUT_S)
            await self._write_all(call, requests)
            try:
                return await call  # the server's status, unless grpc stamped its own
            except grpc.aio.AioRpcError as err:
                if not _client_stamped(err):
                    raise
                return None
        if method.server_streaming:
            call = ch.unary_stream(path, **kw)(requests[0], timeout=STREAM_TIMEOUT_S)
            return await self._read_one(call)
        return await ch.unary_unary(path, **kw)(requests[0], timeout=UNARY_TIMEOUT_S)

    @staticmethod
    async def _write_all(call, requests: list[Any]) -> bool:
        """Write `requests`; False when the server ended the call before taking them all."""
        try:
            for r in requests:
                await call.write(r)
            await call.done_writing()
        except asyncio.InvalidStateError:
            return False  # the call is over: awaiting it gives the server's status
        except grpc.aio.AioRpcError as err:
            if not _client_stamped(err):
                raise
            return False
        return True

    @staticmethod
    async def _read_one(call) -> None:
        try:
            await call.read()
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        finally:
            call.cancel()

    def call(self, name: str, method: descriptor.MethodDescriptor, requests: list[Any]):
        """The error a call ends with, or None."""
        try:
            self.run(self._call(name, method, requests))
        except grpc.aio.AioRpcError as err:
            return err
        return None

    def assert_healthy(self) -> None:
        """Every service answers its health check, and the OCS pod's invariants hold."""

        async def check():
            for name, ch in self.channels.items():
                reply = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=5
                )
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, name
            from lightpath.v1 import ocs_manager_pb2_grpc

            report = await ocs_manager_pb2_grpc.OcsManagerStub(
                self.channels["ocs"]
            ).CheckInvariants(
                ocs_manager_pb2.CheckInvariantsRequest(compare_switches=True), timeout=10
            )
            assert report.ok, report

        self.run(check())


def _caller(method: descriptor.MethodDescriptor):
    """Who calls `method` in the fuzz: the operator (full rights) where it may, else
    the one kind of caller the method takes, so every call reaches the servicer."""
    rule = policy.rule_for(f"/{method.containing_service.full_name}/{method.name}")
    if rule is None or rule.public or OPERATOR in rule.roles:
        return None
    if APPLICATION in rule.roles:
        return "application:app-1"
    if NODE in rule.roles:
        return "node:n1"
    if policy.AGG in rule.roles:
        return service_principal("agg_switch", "root")
    if policy.OCS in rule.roles:
        return service_principal("ocs_manager", "pod-1")
    raise AssertionError(f"no caller for {method.full_name}: {rule.roles}")


@contextlib.asynccontextmanager
async def _whole_cell(redis_url: str):
    """One of each service on one Redis (as tests/test_bad_input.py runs them), and a
    channel to each for the operator and for every other caller a method needs."""
    async with contextlib.AsyncExitStack() as stack:
        addresses = {k: svc.address for k, svc in (await one_of_each(stack, redis_url)).items()}
        agent = await stack.enter_async_context(
            serve(
                "switch_agent",
                redis_url,
                {
                    "LIGHTPATH_POD_ID": "pod-1",
                    "LIGHTPATH_FABRIC_BLOCKS": "8",
                    "LIGHTPATH_AGENT_SETTLE_MS": "0",
                },
            )
        )
        addresses["agent"] = agent.address
        channels: dict[tuple[str, str], grpc.aio.Channel] = {}
        for name, method in [(n, None) for n in addresses] + METHODS:
            who = (_caller(method) if method is not None else None) or OPERATOR
            if (name, str(who)) in channels:
                continue
            creds = {} if who == OPERATOR else {"credentials": credentials(who)}
            channels[(name, str(who))] = await stack.enter_async_context(
                channel(addresses[name], max_attempts=1, **creds)
            )
        yield channels


@pytest.fixture(scope="module")
def cell(redis_server) -> Iterator[Cell]:
    import redis

    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        channels = loop.run_until_complete(stack.enter_async_context(_whole_cell(redis_server.url)))
        yield Cell(loop, channels)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.run_until_complete(_cancel_leftovers())
        loop.close()


async def _cancel_leftovers() -> None:
    """What the services leave behind (a watch's reader) ends with the loop."""
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in leftover:
        task.cancel()
    await asyncio.gather(*leftover, return_exceptions=True)


async def _seed(channels: dict[str, grpc.aio.Channel]) -> None:
    """A little state for the fuzzed calls to find: a device and an application at the
    broker, a tree at the switch (again before each method: a fuzzed call may have
    removed them)."""
    from lightpath.v1 import core_broker_pb2_grpc

    broker = core_broker_pb2_grpc.CoreBrokerStub(channels["broker"])
    with contextlib.suppress(grpc.aio.AioRpcError):
        await broker.RegisterDevice(
            core_broker_pb2.RegisterDeviceRequest(
                device=core_broker_pb2.Device(
                    device_id="dev-1", kind=core_broker_pb2.DEVICE_KIND_GPU, cores=8
                )
            ),
            timeout=5,
        )
    with contextlib.suppress(grpc.aio.AioRpcError):
        await broker.RegisterApplication(
            core_broker_pb2.RegisterApplicationRequest(application_id="app-1"), timeout=5
        )
    from lightpath.v1 import agg_switch_pb2_grpc, common_pb2, workload_scheduler_pb2_grpc

    # a job for UpdateJob (and the other job calls) to find
    with contextlib.suppress(grpc.aio.AioRpcError):
        await workload_scheduler_pb2_grpc.WorkloadSchedulerStub(channels["ws"]).AdmitJob(
            workload_scheduler_pb2.AdmitJobRequest(
                spec=workload_scheduler_pb2.JobSpec(
                    job_id="job-1", shape=common_pb2.Shape(dims=[4, 4, 4])
                )
            ),
            timeout=10,
        )
    with contextlib.suppress(grpc.aio.AioRpcError):
        await agg_switch_pb2_grpc.AggSwitchStub(channels["agg"]).DefineTopology(
            agg_switch_pb2.DefineTopologyRequest(topology=_topology()), timeout=5
        )


def _client_stamped(err: grpc.aio.AioRpcError) -> bool:
    """The server ended a client-streaming call while this client was still writing:
    grpc fails the write and stamps the call INTERNAL "Internal error from Core" on
    the client side (the server's own status is lost)."""
    return err.code() == grpc.StatusCode.INTERNAL and "execute_batch" in (
        err.debug_error_string() or ""
    )


def _topology() -> agg_switch_pb2.AggTopology:
    sw, cn = agg_switch_pb2.AGG_NODE_KIND_SWITCH, agg_switch_pb2.AGG_NODE_KIND_COMPUTE
    return agg_switch_pb2.AggTopology(
        tree_id="tree-1",
        nodes=[
            agg_switch_pb2.AggNode(id="root", kind=sw, threshold_ms=300),
            agg_switch_pb2.AggNode(id="n1", kind=cn, parent="root"),
            agg_switch_pb2.AggNode(id="n2", kind=cn, parent="root"),
        ],
    )


@cache
def _seed_requests() -> dict[str, Message]:
    """Valid requests of the methods whose random requests rarely pass validation,
    for `mutated` to start from (keyed "Service.Method")."""
    from google.protobuf.field_mask_pb2 import FieldMask

    from lightpath.v1 import common_pb2

    cell_pb, ws_pb, broker_pb, agg_pb = (
        cell_scheduler_pb2,
        workload_scheduler_pb2,
        core_broker_pb2,
        agg_switch_pb2,
    )
    spec = ws_pb.JobSpec(job_id="job-1", shape=common_pb2.Shape(dims=[4, 4, 4]))
    reservation = broker_pb.ReservationRequest(
        reservation_id="r-1",
        cores=2,
        duration=_d(60),
        window=common_pb2.TimeWindow(earliest_start=_ts(NOW_S), latest_end=_ts(NOW_S + 3600)),
        device_ids=["dev-1"],
    )
    return {
        "CellScheduler.SubmitJob": cell_pb.SubmitJobRequest(
            spec=ws_pb.JobSpec(job_id="job-1"),
            demand=cell_pb.ComputeDemand(chip_hours=1, deadline=_ts(NOW_S + 3600)),
        ),
        "CellScheduler.ReportPodStatus": cell_pb.ReportPodStatusRequest(
            pod_id="pod-1",
            capacity=cell_pb.PodCapacity(version="1-0", at=_ts(NOW_S)),
            events_after="0-0",
            events_until="1-0",
        ),
        "CellScheduler.SetQuota": cell_pb.SetQuotaRequest(
            quota=cell_pb.Quota(
                tenant="acme",
                nominal_chips={"tpu": 64},
                cohort="team",
                lending_limit={"tpu": 32},
                weight=2.0,
            )
        ),
        # a quota's pod scope: a registered pod's name reaches the store's quota field
        "CellScheduler.DeleteQuota": cell_pb.DeleteQuotaRequest(tenant="acme", pod="pod-1"),
        "WorkloadScheduler.AdmitJob": ws_pb.AdmitJobRequest(spec=spec, validate_only=True),
        "CellScheduler.UpdateJob": cell_pb.UpdateCellJobRequest(
            spec=ws_pb.JobSpec(job_id="job-1", priority=70, labels={"team": "ml"}),
            update_mask=FieldMask(paths=["priority", "labels.team"]),
        ),
        "WorkloadScheduler.UpdateJob": ws_pb.UpdateJobRequest(
            spec=ws_pb.JobSpec(job_id="job-1", priority_class=common_pb2.PRIORITY_CLASS_HIGH),
            update_mask=FieldMask(paths=["priority_class", "labels"]),
        ),
        "CoreBroker.Reserve": broker_pb.ReserveRequest(request=reservation),
        "CoreBroker.BatchReserve": broker_pb.BatchReserveRequest(requests=[reservation]),
        "CoreBroker.QueryCapacity": broker_pb.QueryCapacityRequest(
            start=_ts(NOW_S), end=_ts(NOW_S + 3600), include_schedule=True
        ),
        "CoreBroker.ExtendReservation": broker_pb.ExtendReservationRequest(
            reservation_id="r-1", new_end=_ts(NOW_S + 7200)
        ),
        "CoreBroker.RegisterDevice": broker_pb.RegisterDeviceRequest(
            device=broker_pb.Device(device_id="dev-2", kind=broker_pb.DEVICE_KIND_GPU, cores=4)
        ),
        "OcsManager.WireSlice": ocs_manager_pb2.WireSliceRequest(
            job_id="job-1",
            grid=common_pb2.Shape(dims=[2, 1, 1]),
            blocks=[
                ocs_manager_pb2.BlockPlacement(
                    position=common_pb2.Coordinate(coords=[i, 0, 0]), block_id=i
                )
                for i in range(2)
            ],
        ),
        "OpticalSwitch.ApplyBatch": optical_switch_pb2.ApplyBatchRequest(
            switch_id="ocs-x-0-0",
            batch_id="b-1",
            connect=[optical_switch_pb2.PortPair(port_a=8, port_b=0)],
        ),
        "OpticalSwitchAdmin.InjectFault": optical_switch_pb2.InjectFaultRequest(
            switch_id="ocs-x-0-0", faults=optical_switch_pb2.SwitchFaults(reject_batches=1)
        ),
        "AggSwitch.DefineTopology": agg_pb.DefineTopologyRequest(topology=_topology()),
        "AggSwitch.StartCommand": agg_pb.StartCommandRequest(
            tree_id="tree-1",
            command_id="c-1",
            participants=["n1", "n2"],
            dtype=agg_pb.AGG_DTYPE_INT64,
            op=agg_pb.AGG_OP_SUM,
            length=4,
            deadline=_d(20),
        ),
        "CoreBroker.RunGraph": broker_pb.RunGraphRequest(
            graph=_graph_spec(), run_id="run-1", reservation_id="r-1"
        ),
        "AggSwitch.AbortCommand": agg_pb.AbortCommandRequest(
            tree_id="tree-1", command_id="c-1", reason="fuzz"
        ),
    }


def _graph_spec():
    from lightpath.graph.examples import fig3a
    from lightpath.graph.spec import to_proto

    return to_proto(fig3a("in.{part}", "out.{part}", 2))


def _is_server_error(err: grpc.aio.AioRpcError | None) -> bool:
    return err is not None and err.code() in SERVER_ERRORS


FUZZ_SETTINGS = settings(
    deadline=None,
    derandomize=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


def _id(item: tuple[str, descriptor.MethodDescriptor]) -> str:
    return f"{item[1].containing_service.name}.{item[1].name}"


@pytest.mark.parametrize("target", METHODS, ids=_id)
def test_well_formed_requests_never_fail_inside(cell: Cell, target) -> None:
    name, method = target
    count = st.integers(1, 3) if method.client_streaming else st.just(1)
    cell.run(_seed(cell.channels))

    reached: list[bool] = []
    seed = _seed_requests().get(_id(target))
    one = messages(method.input_type)
    if seed is not None:
        one = st.one_of(mutated(seed), one)  # the seed itself first: the simplest example

    @settings(FUZZ_SETTINGS, max_examples=WELL_FORMED)
    @given(st.lists(one, min_size=1, max_size=3), count)
    def fuzz(requests: list[Message], n: int) -> None:
        err = cell.call(name, method, requests[:n])
        assert not _is_server_error(err), (
            f"{_id(target)}({requests[:n]}) -> {error_report(err)}"  # type: ignore[arg-type]
        )
        reached.append(err is None or error_report(err).reason not in GUARD_REASONS)

    fuzz()
    # a fuzz that never gets past authentication would prove nothing
    assert any(reached), f"every call to {_id(target)} was stopped by the guard"
    cell.assert_healthy()


@pytest.mark.parametrize("target", METHODS, ids=_id)
def test_random_bytes_never_fail_inside(cell: Cell, target) -> None:
    name, method = target
    count = 3 if method.client_streaming else 1
    cell.run(_seed(cell.channels))

    @settings(FUZZ_SETTINGS, max_examples=RAW)
    @given(st.lists(st.binary(min_size=1, max_size=256), min_size=1, max_size=count))
    def fuzz(chunks: list[bytes]) -> None:
        err = cell.call(name, method, chunks)
        # bytes that do not parse are the caller's mistake: INVALID_ARGUMENT, never UNKNOWN
        assert not _is_server_error(err), f"{_id(target)}({chunks!r}) -> {error_report(err)}"  # type: ignore[arg-type]

    fuzz()
    cell.assert_healthy()


def _ts(seconds: int, nanos: int = 0):
    from google.protobuf.timestamp_pb2 import Timestamp

    return Timestamp(seconds=seconds, nanos=nanos)


def _d(seconds: int, nanos: int = 0):
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=seconds, nanos=nanos)


def _reservation(rid: str, **kw) -> core_broker_pb2.ReservationRequest:
    return core_broker_pb2.ReservationRequest(reservation_id=rid, cores=1, duration=_d(60), **kw)


def _known_cases():
    from lightpath.v1 import common_pb2

    cell_pb, broker_pb, agg_pb = cell_scheduler_pb2, core_broker_pb2, agg_switch_pb2
    return [
        (  # was INTERNAL: ValueError in pad_id
            "cell",
            "ReportPodStatus",
            cell_pb.ReportPodStatusRequest(
                pod_id="pod-1", capacity=cell_pb.PodCapacity(version="v7")
            ),
            {"capacity.version"},
        ),
        (
            "cell",
            "ReportPodStatus",
            cell_pb.ReportPodStatusRequest(
                pod_id="pod-1",
                transitions=[
                    cell_pb.PodJobTransition(
                        stream_id="1-0",
                        seq=1,
                        event=common_pb2.JobEvent(
                            job_id="job-1",
                            to_state=common_pb2.JOB_STATE_RUNNING,
                            at=_ts(2**62),
                        ),
                    )
                ],
            ),
            {"transitions[0].event.at"},
        ),
        (
            "cell",
            "RegisterPod",
            cell_pb.RegisterPodRequest(
                pod=cell_pb.PodRegistration(pod_id="pod-9", events_tip="tip")
            ),
            {"pod.events_tip"},
        ),
        (
            "cell",
            "SubmitJob",
            cell_pb.SubmitJobRequest(
                spec=workload_scheduler_pb2.JobSpec(job_id="job-9"),
                demand=cell_pb.ComputeDemand(chip_hours=1, deadline=_ts(NOW_S, -5)),
            ),
            {"demand.deadline"},
        ),
        (  # str.isdigit() takes "²", int() does not
            "cell",
            "ListJobs",
            cell_pb.ListCellJobsRequest(page_token="wrI="),
            {"page_token"},
        ),
        (  # was INTERNAL: ValueError "Timestamp is not valid"
            "broker",
            "QueryCapacity",
            broker_pb.QueryCapacityRequest(start=_ts(-(2**63))),
            {"start"},
        ),
        (
            "broker",
            "ExtendReservation",
            broker_pb.ExtendReservationRequest(reservation_id="r-1", new_end=_ts(NOW_S, 10**9)),
            {"new_end"},
        ),
        (  # a Duration with nanos out of range was silently normalised
            "broker",
            "Reserve",
            broker_pb.ReserveRequest(
                request=broker_pb.ReservationRequest(
                    reservation_id="r-1", cores=1, duration=_d(1, 10**9)
                )
            ),
            {"request.duration"},
        ),
        (
            "broker",
            "BatchReserve",
            broker_pb.BatchReserveRequest(
                requests=[
                    _reservation("r-1"),
                    _reservation(
                        "r-2",
                        window=common_pb2.TimeWindow(
                            earliest_start=_ts(NOW_S, -1), latest_end=_ts(2**40)
                        ),
                    ),
                ]
            ),
            {"requests[1].window.earliest_start", "requests[1].window.latest_end"},
        ),
        (
            "agg",
            "StartCommand",
            agg_pb.StartCommandRequest(command_id="c-1", deadline=_d(1, -1)),
            {"deadline"},
        ),
        (  # the fuzz found it: a ring through 2^64 chips took the process down
            "ws",
            "PlanRings",
            workload_scheduler_pb2.PlanRingsRequest(
                shape=common_pb2.Shape(dims=[2**32 - 1, 2**32 - 1]),
                parallelism=common_pb2.ParallelismDegrees(
                    data=2**32 - 1, pipeline=2**32 - 1, layer=1
                ),
            ),
            {"shape"},
        ),
    ]


def test_bad_times_and_parsed_strings_are_named(cell: Cell) -> None:
    """The failures issue 14 names, and their kin: INVALID_ARGUMENT naming the field."""
    cell.run(_seed(cell.channels))
    for name, method_name, request, fields in _known_cases():
        module = MODULES[name]
        (service,) = module.DESCRIPTOR.services_by_name.values()
        method = service.methods_by_name[method_name]
        err = cell.call(name, method, [request])
        assert err is not None, f"{method_name} accepted {request}"
        report = error_report(err)
        assert report.code == grpc.StatusCode.INVALID_ARGUMENT, f"{method_name}: {report}"
        named = {f for f, _ in report.field_violations}
        assert fields <= named, f"{method_name}: {report.field_violations}"
