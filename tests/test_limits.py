"""Issue 30: every input is bounded before it costs anything (lightpath.limits).

Every field of every request of every service has a limit, in one table; a request
over one is INVALID_ARGUMENT naming the field path and the limit, in a short error,
before the servicer runs; a request larger than its service takes at all is refused
by gRPC before it is parsed. The services stay SERVING throughout.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath import limits
from lightpath.client import channel
from lightpath.errors import InvalidArgument
from lightpath.security.identity import service_principal
from lightpath.v1 import (
    agg_switch_pb2,
    cell_scheduler_pb2,
    core_broker_pb2,
    ocs_manager_pb2,
    optical_switch_pb2,
    workload_scheduler_pb2,
)
from tests.helpers import credentials, one_of_each, serve

SERVICES = {
    "cell": ("cell_scheduler", cell_scheduler_pb2),
    "ws": ("workload_scheduler", workload_scheduler_pb2),
    "ocs": ("ocs_manager", ocs_manager_pb2),
    "broker": ("core_broker", core_broker_pb2),
    "agg": ("agg_switch", agg_switch_pb2),
    "agent": ("switch_agent", optical_switch_pb2),
}
# Requests whose nested repeated fields multiply past any sensible size: the
# service's receive size is their aggregate limit (lightpath.limits).
AGGREGATE_BOUNDED = {
    "BatchReserve",
    "PlanGraph",
    "ReserveGraph",
    "RunGraph",
    "ApplyBatches",
    "DefineTopology",
    "ReportGraphMetrics",
}
# Raw-bytes calls: the aggregation data path parses its own frames.
RAW = {"Contribute", "Relay"}
SHORT_ERROR = 600
DENIED = (
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
)  # bytes of message plus google.rpc details
pool = descriptor_pool.Default()


def _pb_class(descriptor: Descriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


# -- the table ------------------------------------------------------------------


def test_every_limit_names_a_real_field():
    for name in limits.FIELDS:
        full = name if name.startswith("google.") else f"lightpath.v1.{name}"
        try:
            pool.FindFieldByName(full)
        except KeyError:
            owner, _, part = full.rpartition(".")
            assert part in ("key", "value"), f"{name} names no field"
            field = pool.FindFieldByName(owner)
            assert field.message_type.GetOptions().map_entry, f"{name}: {owner} is not a map"


def test_each_limit_is_documented_in_the_proto_comment_of_its_field():
    """The protos say what the table says (the numbers as written in the comment)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "protos" / "lightpath" / "v1"
    texts = {p.name: p.read_text() for p in root.glob("*.proto")}
    missing = []
    for name, limit in limits.FIELDS.items():
        if name.startswith("google."):
            continue
        message, field = name.split(".")[:2]
        field_desc = pool.FindFieldByName(f"lightpath.v1.{message}.{field}")
        text = texts[field_desc.file.name.rsplit("/", 1)[1]]
        comment = _comment_of(text, message, field)
        if f"{limit:,}" not in comment and str(limit) not in comment:
            missing.append(f"{name} ({limit})")
    assert not missing, "proto comments do not give these limits: " + ", ".join(missing)


def _comment_of(text: str, message: str, field: str) -> str:
    start = re.search(rf"^message {message} \{{", text, re.M)
    assert start, message
    lines = text[start.end() :].splitlines()
    comment: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("//"):
            comment.append(stripped)
            continue
        if re.search(rf"\b{field} = \d+;", stripped):
            return " ".join(comment) + " " + stripped
        comment = []
        if stripped == "}":
            break
    return ""


@pytest.mark.parametrize(
    ("request_", "field", "rule"),
    [
        (
            cell_scheduler_pb2.CancelCellJobRequest(job_id="j", reason="x" * 1025),
            "reason",
            "at most 1,024 characters (got 1,025)",
        ),
        (
            cell_scheduler_pb2.ListCellJobsRequest(states=[1] * 17),
            "states",
            "at most 16 entries (got 17)",
        ),
        (
            cell_scheduler_pb2.SubmitJobRequest(
                spec=workload_scheduler_pb2.JobSpec(labels={f"k{i}": "v" for i in range(65)})
            ),
            "spec.labels",
            "at most 64 entries (got 65)",
        ),
        (
            cell_scheduler_pb2.SubmitJobRequest(
                spec=workload_scheduler_pb2.JobSpec(labels={"k": "v" * 257})
            ),
            "spec.labels[k]",
            "at most 256 characters (got 257)",
        ),
        (
            cell_scheduler_pb2.SubmitJobRequest(
                spec=workload_scheduler_pb2.JobSpec(labels={"k" * 64: "v"})
            ),
            "spec.labels (a key)",
            "at most 63 characters (got 64)",
        ),
        (
            core_broker_pb2.QueryCapacityRequest(device_ids=["d", "x" * 300]),
            "device_ids[1]",
            "at most 128 characters (got 300)",
        ),
    ],
)
def test_check_names_the_field_and_the_limit(request_, field, rule):
    with pytest.raises(InvalidArgument) as caught:
        limits.check(request_)
    assert [(v.field, v.rule) for v in caught.value.violations] == [(field, rule)]


def test_a_request_within_every_limit_passes():
    limits.check(
        cell_scheduler_pb2.SubmitJobRequest(
            spec=workload_scheduler_pb2.JobSpec(
                job_id="j", labels={f"k{i}": "v" * 256 for i in range(64)}
            ),
            tenant="acme",
        )
    )


def _bound(d: Descriptor, stack: tuple[str, ...] = ()) -> int:
    """A generous upper bound of the encoded size of `d` with every field at its limit."""
    if d.full_name in stack:
        return 0
    total = 0
    rules = limits._rules(d)
    for f in d.fields:
        rule = rules.get(f.name)
        if rule is None:
            total += 11
        elif rule.kind in ("str", "bytes"):
            total += 6 + 4 * rule.limit if rule.kind == "str" else 6 + rule.limit
        elif rule.kind == "msg":
            total += 6 + _bound(f.message_type, (*stack, d.full_name))
        elif rule.kind == "rep":
            total += 6 + rule.limit * 10
        elif rule.kind in ("rep_str", "rep_bytes"):
            total += rule.limit * (6 + 4 * rule.item)
        elif rule.kind == "rep_msg":
            total += rule.limit * (6 + _bound(f.message_type, (*stack, d.full_name)))
        else:
            value_f = f.message_type.fields_by_name["value"]
            value = (
                _bound(value_f.message_type, (*stack, d.full_name))
                if rule.value_msg
                else 4 * rule.value or 11
            )
            total += rule.limit * (12 + 4 * (rule.key or 3) + value)
    return total


@pytest.mark.parametrize("key", sorted(SERVICES))
def test_the_largest_legal_request_fits_its_service(key):
    service, module = SERVICES[key]
    for svc in module.DESCRIPTOR.services_by_name.values():
        for method in svc.methods:
            if method.name in AGGREGATE_BOUNDED | RAW:
                continue
            bound = _bound(method.input_type)
            assert bound <= limits.request_bytes(service), (
                f"{svc.name}.{method.name}: up to {bound:,} bytes, "
                f"{service} takes {limits.request_bytes(service):,}"
            )


# -- over real gRPC ----------------------------------------------------------------


@dataclass
class Case:
    method: MethodDescriptor
    request: Message
    field: str
    limit: int


def cases_for(method: MethodDescriptor) -> Iterator[Case]:
    """One request per bounded field reachable within a few levels, just over its limit."""
    cls = _pb_class(method.input_type)

    def paths(d: Descriptor, depth: int, stack: tuple[str, ...]) -> Iterator[list[tuple]]:
        rules = limits._rules(d)
        for f in d.fields:
            rule = rules.get(f.name)
            if rule is None:
                continue
            if rule.kind == "msg":
                if depth < 3 and f.message_type.full_name not in stack:
                    for rest in paths(f.message_type, depth + 1, (*stack, d.full_name)):
                        yield [(f, rule, "msg"), *rest]
                continue
            if rule.kind == "rep_msg":
                yield [(f, rule, "count")]
                if depth < 3 and f.message_type.full_name not in stack:
                    for rest in paths(f.message_type, depth + 1, (*stack, d.full_name)):
                        yield [(f, rule, "item"), *rest]
                continue
            if rule.kind == "map":
                yield [(f, rule, "count")]
                if rule.key:
                    yield [(f, rule, "key")]
                if rule.value:
                    yield [(f, rule, "value")]
                continue
            yield [(f, rule, "count" if rule.kind.startswith("rep") else "len")]
            if rule.kind in ("rep_str", "rep_bytes"):
                yield [(f, rule, "item_len")]

    for steps in paths(method.input_type, 0, ()):
        request = cls()
        target = request
        path = ""
        for f, _rule, how in steps[:-1]:
            if how == "msg":
                target = getattr(target, f.name)
                path += f"{f.name}."
            else:  # item
                target = getattr(target, f.name).add()
                path += f"{f.name}[0]."
        f, rule, how = steps[-1]
        name, limit = _set_over(target, f, rule, how)
        if f.containing_oneof is None:
            with contextlib.suppress(AttributeError, ValueError):
                target.SetInParent()
        yield Case(method, request, path + name, limit)


def _set_over(target: Message, f: FieldDescriptor, rule: Any, how: str) -> tuple[str, int]:
    value = getattr(target, f.name) if f.is_repeated else None
    if how == "len":
        setattr(
            target,
            f.name,
            "x" * (rule.limit + 1) if rule.kind == "str" else b"x" * (rule.limit + 1),
        )
        return f.name, rule.limit
    if how == "item_len":
        value.append("x" * (rule.item + 1) if rule.kind == "rep_str" else b"x" * (rule.item + 1))
        return f"{f.name}[0]", rule.item
    if rule.kind == "map":
        key_f = f.message_type.fields_by_name["key"]
        value_f = f.message_type.fields_by_name["value"]
        string_key = key_f.type == FieldDescriptor.TYPE_STRING

        def put(key: Any, item: Any = None) -> None:
            if value_f.type == FieldDescriptor.TYPE_MESSAGE:
                value[key].SetInParent()
            elif item is not None:
                value[key] = item
            else:
                value[key] = _zero(value_f)

        if how == "count":
            for i in range(rule.limit + 1):
                put(f"k{i}" if string_key else i)
            return f.name, rule.limit
        if how == "key":
            put("k" * (rule.key + 1))
            return f"{f.name} (a key)", rule.key
        big = "x" * (rule.value + 1)
        put(
            "k" if string_key else 1,
            big if value_f.type == FieldDescriptor.TYPE_STRING else big.encode(),
        )
        return f"{f.name}[{'k' if string_key else 1}]", rule.value
    # count of a repeated field
    if rule.kind == "rep_msg":
        for _ in range(rule.limit + 1):
            value.add()
    else:
        value.extend([_zero(f)] * (rule.limit + 1))
    return f.name, rule.limit


def _zero(f: FieldDescriptor) -> Any:
    if f.type == FieldDescriptor.TYPE_STRING:
        return "x"
    if f.type == FieldDescriptor.TYPE_BYTES:
        return b"x"
    if f.type == FieldDescriptor.TYPE_BOOL:
        return False
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 0.0
    return 0


@contextlib.asynccontextmanager
async def every_service(redis_url: str) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    async with contextlib.AsyncExitStack() as stack:
        services = await one_of_each(stack, redis_url)
        agent = await stack.enter_async_context(
            serve("switch_agent", redis_url, {"LIGHTPATH_POD_ID": "pod-1"})
        )
        channels = {
            name: await stack.enter_async_context(channel(svc.address, max_attempts=1))
            for name, svc in services.items()
        }
        # The southbound writes take the pod's ocs_manager only.
        channels["agent"] = await stack.enter_async_context(
            channel(
                agent.address,
                max_attempts=1,
                credentials=credentials(service_principal("ocs_manager", "pod-1")),
            )
        )
        # The switch's admin calls are the operator's, the broker's reservations the
        # applications', the aggregation data path the nodes'.
        channels["agent+"] = await stack.enter_async_context(channel(agent.address, max_attempts=1))
        for key, who in (("broker", "application:app-1"), ("agg", "node:n1")):
            channels[f"{key}+"] = await stack.enter_async_context(
                channel(services[key].address, max_attempts=1, credentials=credentials(who))
            )
        yield channels


async def _unary(ch: grpc.aio.Channel, method: MethodDescriptor, request: Message) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    kw: dict[str, Any] = {
        "request_serializer": type(request).SerializeToString,
        "response_deserializer": lambda b: b,
    }
    if method.client_streaming:
        if method.server_streaming:
            call = ch.stream_stream(path, **kw)(iter([request]), timeout=10)
            await call.read()
            return
        await ch.stream_unary(path, **kw)(iter([request]), timeout=10)
        return
    if method.server_streaming:
        call = ch.unary_stream(path, **kw)(request, timeout=10)
        await call.read()
        return
    await ch.unary_unary(path, **kw)(request, timeout=10)


def _error_size(err: grpc.aio.AioRpcError) -> int:
    trailers = err.trailing_metadata() or ()
    return len((err.details() or "").encode()) + sum(
        len(v) for k, v in trailers if k == "grpc-status-details-bin"
    )


def _violation(err: grpc.aio.AioRpcError) -> tuple[str, str] | None:
    for k, v in err.trailing_metadata() or ():
        if k == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(v)
            for any_ in status.details:
                if any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    bad = error_details_pb2.BadRequest()
                    any_.Unpack(bad)
                    return bad.field_violations[0].field, bad.field_violations[0].description
    return None


async def _serving(ch: grpc.aio.Channel) -> bool:
    reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_every_oversized_field_of_every_service_is_refused_short(redis_url):
    wrong: list[str] = []
    denied: set[str] = set()
    checked = 0
    async with every_service(redis_url) as channels:
        for key, (_service, module) in SERVICES.items():
            for svc in module.DESCRIPTOR.services_by_name.values():
                for method in svc.methods:
                    if method.name in RAW:
                        continue
                    for case in cases_for(method):
                        where = f"{svc.name}.{method.name} {case.field}"
                        try:
                            try:
                                await _unary(channels[key], method, case.request)
                            except grpc.aio.AioRpcError as err:
                                if f"{key}+" not in channels or err.code() not in DENIED:
                                    raise
                                await _unary(channels[f"{key}+"], method, case.request)
                        except grpc.aio.AioRpcError as err:
                            if err.code() in DENIED:
                                denied.add(f"{svc.name}.{method.name}")
                                continue
                            if err.code() != grpc.StatusCode.INVALID_ARGUMENT:
                                wrong.append(f"{where}: {err.code().name} {err.details()[:200]}")
                                continue
                            found = _violation(err)
                            if (
                                found is None
                                or found[0] != case.field
                                or (f"at most {case.limit:,} " not in found[1])
                            ):
                                wrong.append(f"{where}: {found}")
                            if _error_size(err) > SHORT_ERROR:
                                wrong.append(f"{where}: error of {_error_size(err)} bytes")
                            checked += 1
                        else:
                            wrong.append(f"{where}: answered OK")
            assert await _serving(channels[key]), key
    assert checked > 200, checked
    assert not wrong, "\n".join(wrong[:40])
    assert not denied, denied


async def test_a_request_larger_than_its_service_takes_is_refused_unparsed(redis_url):
    async with every_service(redis_url) as channels:
        for key, (service, module) in SERVICES.items():
            (svc, *_) = module.DESCRIPTOR.services_by_name.values()
            method = next(
                m
                for m in svc.methods
                if not m.client_streaming
                and any(f.type == FieldDescriptor.TYPE_STRING for f in m.input_type.fields)
            )
            request = _pb_class(method.input_type)()
            field = next(
                f for f in method.input_type.fields if f.type == FieldDescriptor.TYPE_STRING
            )
            setattr(request, field.name, "x" * (limits.request_bytes(service) + 1))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _unary(channels[key], method, request)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, key
            assert _error_size(caught.value) < SHORT_ERROR
            assert await _serving(channels[key]), key
