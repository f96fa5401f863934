"""Restarting the real redis-server under running services (issue 14): a Redis of a
test's own on a fixed port, restarts that stop it for a while or make it load a
large AOF for seconds, and a log of what a service's health said meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath import embedded_redis
from lightpath.client import channel
from lightpath.embedded_redis import EmbeddedRedis, free_port

# Longer than redis_store.connect's retries (~2 s), so calls fail and tasks go down.
DOWN_S = 3.0
# Filler (in db 15, away from the services' db 0) that takes ~5 s to load, longer
# than a client's retries: the services' own calls hit BusyLoadingError.
FILLER_MEMBERS = 200_000
FILLER_COPIES = 80
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def restartable_redis(tmp_path, monkeypatch) -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own (AOF on), on a fixed port so it restarts where it was.

    Restarted from a thread of the event loop's executor, which ends with the loop: a
    death signal follows the thread that spawned the child, so this Redis has none."""
    monkeypatch.setattr(embedded_redis, "dies_with_parent", list)
    server = EmbeddedRedis(tmp_path / "redis", port=free_port(), appendonly=True)
    server.start()
    yield server
    server.stop()


class HealthLog:
    """Every status change one service's health reports (polled)."""

    def __init__(self, address: str):
        self.address = address
        self.seen: list[int] = []
        self._task: asyncio.Task | None = None

    async def _poll(self) -> None:
        async with channel(self.address, max_attempts=1) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                try:
                    resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    status = resp.status
                except grpc.aio.AioRpcError:
                    status = -1
                if not self.seen or self.seen[-1] != status:
                    self.seen.append(status)
                await asyncio.sleep(0.02)

    def __enter__(self) -> HealthLog:
        self._task = asyncio.ensure_future(self._poll())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def restart(server: EmbeddedRedis, *, down_s: float, copies: int = 0) -> list[str]:
    """Stop redis-server, wait, start it again; what a plain client heard meanwhile
    (LOADING while the AOF loads). Blocking parts run in threads: the services run on
    this event loop."""
    await asyncio.to_thread(server.stop)
    if copies:
        append_copies(server.data_dir / "appendonly.aof", copies)
    await asyncio.sleep(down_s)
    heard: list[str] = []

    async def listen() -> None:
        """PING over a bare socket (redis-py would retry a LOADING answer)."""
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                try:
                    writer.write(b"PING\r\n")
                    answer = await asyncio.wait_for(reader.readline(), 1.0)
                finally:
                    writer.close()
                if answer.startswith(b"+PONG"):
                    heard.append("PONG")
                    return
                if answer.startswith(b"-LOADING"):
                    heard.append("LOADING")
            except (OSError, TimeoutError):
                pass
            await asyncio.sleep(0.05)

    listening = asyncio.ensure_future(listen())
    try:
        await asyncio.to_thread(server.start, 60.0)
        await asyncio.wait_for(listening, 10)
    finally:
        listening.cancel()
    return heard


def fill(port: int) -> None:
    """A set of FILLER_MEMBERS in db 15, written by pipeline; the AOF stays commands
    (no rewrite into an RDB preamble, which would load fast)."""
    with redis.Redis(port=port, db=15) as r:
        r.config_set("auto-aof-rewrite-percentage", 0)
        with r.pipeline(transaction=False) as p:
            for i in range(0, FILLER_MEMBERS, 1000):
                p.sadd("filler:set", *range(i, i + 1000))
            p.execute()


def append_copies(aof: Path, n: int) -> None:
    """With redis-server stopped: `n` SUNIONSTOREs of the filler set at the end of its
    AOF, a few bytes each but a full copy each to replay — seconds of LOADING. Between
    them, cheap SELECTs: a loading Redis answers clients (LOADING) only every ~1000
    commands it replays."""
    select = b"*2\r\n$6\r\nSELECT\r\n$2\r\n15\r\n"
    copy = b"*3\r\n" + b"".join(
        b"$%d\r\n%s\r\n" % (len(x), x) for x in (b"SUNIONSTORE", b"filler:copy", b"filler:set")
    )
    with aof.open("ab") as f:
        f.write((select * 1000 + copy) * n)


def caused_by(exc: BaseException | None, kind: type[BaseException]) -> bool:
    while exc is not None:
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
