"""Fixtures of the core broker's contract tests: real servers on a real Redis."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.client import channel, error_report
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb
from tests.helpers import serve

OPERATOR_TOKEN = "test-operator-token"
ENV = {
    "LIGHTPATH_CB_OPERATOR_TOKEN": OPERATOR_TOKEN,
    "LIGHTPATH_CB_REAPER_INTERVAL_MS": "20",
    "LIGHTPATH_LOG_LEVEL": "warning",
}


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


OP = bearer(OPERATOR_TOKEN)


def ts(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def dur(seconds: float) -> Duration:
    d = Duration()
    d.FromMilliseconds(int(seconds * 1000))
    return d


@dataclass
class Broker:
    """One running broker and a channel to it."""

    address: str
    stub: core_broker_pb2_grpc.CoreBrokerStub
    ch: grpc.aio.Channel

    async def device(self, device_id: str, cores: int, kind=pb.DEVICE_KIND_GPU, **kw) -> None:
        await self.stub.RegisterDevice(
            pb.RegisterDeviceRequest(
                device=pb.Device(device_id=device_id, kind=kind, cores=cores, **kw)
            ),
            metadata=OP,
        )

    async def app(self, app_id: str, qos=pb.QOS_LEVEL_PREMIUM) -> tuple[tuple[str, str], ...]:
        resp = await self.stub.RegisterApplication(
            pb.RegisterApplicationRequest(application_id=app_id, qos_level=qos), metadata=OP
        )
        return bearer(resp.token)

    async def reserve(self, md, rid: str, cores: int, seconds: float, **kw) -> pb.Reservation:
        return await self.stub.Reserve(
            pb.ReserveRequest(
                request=pb.ReservationRequest(
                    reservation_id=rid, cores=cores, duration=dur(seconds), **kw
                )
            ),
            metadata=md,
        )

    async def free_now(self, md=OP) -> dict[str, int]:
        resp = await self.stub.ListDevices(pb.ListDevicesRequest(), metadata=md)
        return {d.device.device_id: d.free_cores for d in resp.devices}


@contextlib.asynccontextmanager
async def running_broker(redis_url: str, **env: str) -> AsyncIterator[Broker]:
    async with serve("core_broker", redis_url, {**ENV, **env}) as svc:
        ch = channel(svc.address)
        try:
            yield Broker(svc.address, core_broker_pb2_grpc.CoreBrokerStub(ch), ch)
        finally:
            await ch.close()


@pytest.fixture
async def broker(redis_url) -> AsyncIterator[Broker]:
    async with running_broker(redis_url) as b:
        yield b


async def fails(call, code: grpc.StatusCode, fields: Sequence[str] = ()):
    """Await `call`, expect `code` (and these field violations); the error report."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    report = error_report(err.value)
    assert report.code == code, report
    if fields:
        assert [f for f, _ in report.field_violations] == list(fields), report
    return report


__all__ = ["OP", "Broker", "common_pb2", "dur", "fails", "pb", "running_broker", "ts"]
