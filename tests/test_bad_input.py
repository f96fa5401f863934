"""X-3 across the whole API: whatever a client sends, no call answers INTERNAL
or UNKNOWN (a client's mistake is never a server error).

Every RPC of every service is called, over real gRPC against the real services
on one real Redis, with an empty request and with requests whose fields are
filled at random (valid-looking ids, garbage, huge and negative numbers,
unknown enum values, nested messages, repeated and map fields). Streaming calls
are read for a moment and then cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf import descriptor
from google.protobuf.message import Message

from lightpath.client import channel, error_report
from lightpath.v1 import (
    agg_switch_pb2,
    cell_scheduler_pb2,
    core_broker_pb2,
    ocs_manager_pb2,
    workload_scheduler_pb2,
)
from tests.helpers import one_of_each

OPERATOR = "bad-input-operator"
EXAMPLES_PER_METHOD = 6
STRINGS = [
    "",
    "x",
    "pod-1",
    "job-1",
    "tree-1",
    "root",
    "n1",
    "tpu",
    "../../etc",
    "a:b{c}",
    "∑ü",
    "a" * 300,
]
INTS = [0, 1, 2, 3, 7, 64, 1000, 2**31 - 1]
SIGNED = [-1, -(2**31)]
FLOATS = [0.0, 0.5, -1.0, 1e12, float("nan"), float("inf")]
SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
MODULES = {
    "cell": cell_scheduler_pb2,
    "ws": workload_scheduler_pb2,
    "ocs": ocs_manager_pb2,
    "broker": core_broker_pb2,
    "agg": agg_switch_pb2,
}

F = descriptor.FieldDescriptor


def _scalar(rng: random.Random, field: descriptor.FieldDescriptor):
    t = field.type
    if t == F.TYPE_STRING:
        return rng.choice(STRINGS)
    if t == F.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 8, 64]))
    if t == F.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return rng.choice(FLOATS)
    if t == F.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return rng.choice([*values, 99])
    signed = t in (
        F.TYPE_INT32,
        F.TYPE_INT64,
        F.TYPE_SINT32,
        F.TYPE_SINT64,
        F.TYPE_SFIXED32,
        F.TYPE_SFIXED64,
    )
    value = rng.choice(INTS + (SIGNED if signed else []))
    if t in (F.TYPE_UINT32, F.TYPE_FIXED32, F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return max(min(value, 2**31 - 1), -(2**31))
    return value


def fill(msg: Message, rng: random.Random, depth: int = 0) -> Message:
    """Fill `msg` at random (about half of its fields), recursing a few levels."""
    for field in msg.DESCRIPTOR.fields:
        if rng.random() < 0.5 or (field.message_type is not None and depth >= 3):
            continue
        if field.containing_oneof is not None and msg.WhichOneof(field.containing_oneof.name):
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map:
            key_f, val_f = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            target = getattr(msg, field.name)
            for _ in range(rng.randint(0, 2)):
                key = _scalar(rng, key_f)
                if val_f.message_type is not None:
                    fill(target[key], rng, depth + 1)
                else:
                    target[key] = _scalar(rng, val_f)
        elif field.is_repeated:
            target = getattr(msg, field.name)
            for _ in range(rng.randint(0, 3)):
                if field.message_type is not None:
                    fill(target.add(), rng, depth + 1)
                else:
                    target.append(_scalar(rng, field))
        elif field.message_type is not None:
            fill(getattr(msg, field.name), rng, depth + 1)
            getattr(msg, field.name).SetInParent()
        else:
            setattr(msg, field.name, _scalar(rng, field))
    return msg


@contextlib.asynccontextmanager
async def whole_cell(redis_url: str) -> AsyncIterator[dict[str, grpc.aio.Channel]]:
    """One of each service on one Redis: a cell with one OCS pod, a broker, a switch."""
    async with contextlib.AsyncExitStack() as stack:
        services = await one_of_each(
            stack, redis_url, {"broker": {"LIGHTPATH_CB_OPERATOR_TOKEN": OPERATOR}}
        )
        channels = {}
        for name, svc in services.items():
            channels[name] = await stack.enter_async_context(channel(svc.address, max_attempts=1))
        yield channels


async def _call(
    ch: grpc.aio.Channel, method: descriptor.MethodDescriptor, request: Message, metadata
):
    path = f"/{method.containing_service.full_name}/{method.name}"
    response_type = MODULES_BY_FILE[method.output_type.file.name].__dict__[method.output_type.name]
    kw = dict(
        request_serializer=type(request).SerializeToString,
        response_deserializer=response_type.FromString,
    )
    if method.client_streaming:
        requests = [request]
        if method.server_streaming:
            call = ch.stream_stream(path, **kw)(iter(requests), metadata=metadata, timeout=1.5)
            with contextlib.suppress(StopAsyncIteration):
                await call.read()
            call.cancel()
            return call
        return await ch.stream_unary(path, **kw)(iter(requests), metadata=metadata, timeout=1.5)
    if method.server_streaming:
        call = ch.unary_stream(path, **kw)(request, metadata=metadata, timeout=1.5)
        await call.read()
        call.cancel()
        return call
    return await ch.unary_unary(path, **kw)(request, metadata=metadata, timeout=5)


MODULES_BY_FILE = {m.DESCRIPTOR.name: m for m in MODULES.values()}
MODULES_BY_FILE.update(
    {
        dep.name: __import__(f"lightpath.v1.{dep.name.rsplit('/', 1)[1][:-6]}_pb2", fromlist=["x"])
        for m in MODULES.values()
        for dep in m.DESCRIPTOR.dependencies
        if dep.name.startswith("lightpath/")
    }
)


@pytest.mark.parametrize("seed", [1, 2])
async def test_no_request_makes_any_rpc_answer_internal(redis_url, seed):
    rng = random.Random(seed)
    server_errors: list[str] = []
    calls = 0

    async def attempt(ch, service, method, request, metadata) -> None:
        try:
            await _call(ch, method, request, metadata)
        except grpc.aio.AioRpcError as err:
            if err.code() in SERVER_ERRORS:
                server_errors.append(
                    f"{service.name}.{method.name}({request}) -> {error_report(err)}"
                )
        except asyncio.CancelledError:
            pass

    async with whole_cell(redis_url) as channels:
        for name, module in MODULES.items():
            (service,) = module.DESCRIPTOR.services_by_name.values()
            for method in service.methods:
                request_type = MODULES_BY_FILE[method.input_type.file.name].__dict__[
                    method.input_type.name
                ]
                requests = [request_type()] + [
                    fill(request_type(), rng) for _ in range(EXAMPLES_PER_METHOD)
                ]
                attempts = [
                    attempt(
                        channels[name],
                        service,
                        method,
                        request,
                        (("authorization", f"Bearer {OPERATOR}"),)
                        if name == "broker" and i % 2
                        else None,
                    )
                    for i, request in enumerate(requests)
                ]
                calls += len(attempts)
                if method.server_streaming:
                    # An idle watch is read until its deadline: its requests' streams are
                    # open side by side, each read as long as alone, instead of one by one.
                    await asyncio.gather(*attempts)
                else:
                    for one in attempts:  # in order: a call may act on what an earlier made
                        await one
    assert calls > 400
    assert not server_errors, (
        "\n".join(sorted({e.split("(")[0] for e in server_errors}))
        + "\n\n"
        + "\n".join(server_errors[:10])
    )
