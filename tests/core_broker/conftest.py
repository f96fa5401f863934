"""Fixtures of the core broker's contract tests: real servers on a real Redis.

Every channel presents the operator's certificate from the test CA unless a
test asks for another (tests/conftest.py); OP is the operator token
(LIGHTPATH_CB_OPERATOR_TOKEN, still a supported way in), `Broker.as_(...)` a
stub presenting another principal's certificate."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.client import channel, error_report
from lightpath.security.credentials import Credentials
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath.v1 import core_broker_pb2 as pb
from tests.helpers import credentials, serve, test_ca

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
    _others: list[grpc.aio.Channel] = field(default_factory=list)

    def as_(self, who: str | Credentials, token: str = "") -> core_broker_pb2_grpc.CoreBrokerStub:
        """A stub on a channel of its own presenting `who`'s certificate (`application:cam`)
        or these credentials, and `token` on every call if given."""
        creds = credentials(who, token=token) if isinstance(who, str) else who
        ch = channel(self.address, credentials=creds, max_attempts=1)
        self._others.append(ch)
        return core_broker_pb2_grpc.CoreBrokerStub(ch)

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
        b = Broker(svc.address, core_broker_pb2_grpc.CoreBrokerStub(ch), ch)
        try:
            yield b
        finally:
            for other in [ch, *b._others]:
                await other.close()


@pytest.fixture
async def open_broker(redis_url) -> AsyncIterator[Broker]:
    """A broker that asks for no client certificate (LIGHTPATH_TLS_CLIENT_AUTH=none),
    so a caller may come with no credential at all (`open_broker.as_(anonymous())`)."""
    async with running_broker(redis_url, LIGHTPATH_TLS_CLIENT_AUTH="none") as b:
        yield b


def anonymous() -> Credentials:
    """TLS that trusts the test CA but presents no client certificate."""
    return Credentials.from_files(test_ca().cert_path)


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


__all__ = [
    "OP",
    "Broker",
    "anonymous",
    "common_pb2",
    "dur",
    "fails",
    "pb",
    "running_broker",
    "ts",
]
