#!/usr/bin/env python3
"""Cost of the shared runtime: one unary RPC through the server factory's
interceptor (span, metrics, error mapping) and the client channel (span,
deadline, retries), sequential and with 8 concurrent clients; and the time
`lightpath up`'s Stack takes from nothing to every process SERVING.

    python3 dev.py bench foundation

Prints one JSON line: getinfo_ms_p50/p99 (sequential), getinfo_per_s_8_clients,
stack_start_s.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from _common import emit, percentile, private_redis

from lightpath.client import channel
from lightpath.stack import Stack, default_topology, with_ephemeral_ports
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from services.common.server import running
from services.common.settings import load
from services.core_broker.server import build
from services.core_broker.settings import CoreBrokerSettings

SEQUENTIAL = 2000
CONCURRENT_CALLS = 4000
CLIENTS = 8


async def rpc_costs(redis_url: str) -> dict[str, float]:
    settings = load(
        CoreBrokerSettings, {"LIGHTPATH_REDIS_URL": redis_url, "LIGHTPATH_LISTEN": "127.0.0.1:0"}
    )
    async with running("core_broker", settings, build) as svc:
        async with channel(svc.address) as ch:
            stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
            req = common_pb2.GetInfoRequest()
            for _ in range(200):  # warm up
                await stub.GetInfo(req)
            samples = []
            for _ in range(SEQUENTIAL):
                t0 = time.perf_counter()
                await stub.GetInfo(req)
                samples.append((time.perf_counter() - t0) * 1000)

        async def client(n: int) -> None:
            async with channel(svc.address) as ch:
                stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
                for _ in range(n):
                    await stub.GetInfo(req)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(CONCURRENT_CALLS // CLIENTS) for _ in range(CLIENTS)))
        rate = CONCURRENT_CALLS / (time.perf_counter() - t0)
    return {
        "getinfo_ms_p50": percentile(samples, 50),
        "getinfo_ms_p99": percentile(samples, 99),
        "getinfo_per_s_8_clients": rate,
    }


def stack_start_seconds() -> float:
    with tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp:
        stack = Stack(
            Path(tmp),
            specs=with_ephemeral_ports(default_topology()),
            redis_port=0,
            log=lambda *_: None,
        )
        t0 = time.perf_counter()
        stack.start()
        elapsed = time.perf_counter() - t0
        stack.stop()
        return elapsed


def main() -> None:
    with private_redis() as url:
        result = asyncio.run(rpc_costs(url))
    result["stack_start_s"] = stack_start_seconds()
    result["stack_processes"] = len(default_topology()) + 1
    emit(result)


if __name__ == "__main__":
    main()
