#!/usr/bin/env python3
"""Cost of the shared runtime: one unary RPC through the server factory's
interceptor (span, metrics, error mapping) and the client channel (span,
deadline, retries), sequential and with 8 concurrent clients; and the time
`lightpath up`'s Stack takes from nothing to every process SERVING.

    python3 dev.py bench foundation [--sequential N] [--calls N] [--clients N]

The service runs as deployed: TLS with required client certificates (mTLS),
its identity and the client's (the operator's) issued by a LocalCA in a temp
dir; the stack is `lightpath up`'s, which makes its own CA and certificates.

Prints one JSON line: getinfo_ms_p50/p99 (sequential), getinfo_per_s_8_clients
(with --clients N: getinfo_per_s_N_clients), stack_start_s.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from _common import emit, percentile, private_redis

from lightpath.client import channel
from lightpath.security.credentials import Credentials
from lightpath.security.identity import Principal, service_principal
from lightpath.security.pki import LocalCA
from lightpath.stack import Stack, default_topology, with_ephemeral_ports
from lightpath.v1 import common_pb2, core_broker_pb2_grpc
from lightpath_services.common.server import running
from lightpath_services.common.settings import load
from lightpath_services.core_broker.server import build
from lightpath_services.core_broker.settings import CoreBrokerSettings

SEQUENTIAL = 2000
CONCURRENT_CALLS = 4000
CLIENTS = 8


async def rpc_costs(
    redis_url: str, pki: Path, sequential: int, calls: int, clients: int
) -> dict[str, float]:
    ca = LocalCA(pki, common_name="Lightpath bench CA").ensure()
    server = ca.issue(service_principal("core_broker"))
    operator = ca.issue(Principal("operator", "operator"))
    creds = Credentials.from_files(operator.ca, operator.cert, operator.key)
    settings = load(
        CoreBrokerSettings,
        {
            "LIGHTPATH_REDIS_URL": redis_url,
            "LIGHTPATH_LISTEN": "127.0.0.1:0",
            "LIGHTPATH_PLAINTEXT": "false",
            "LIGHTPATH_TLS_CERT": str(server.cert),
            "LIGHTPATH_TLS_KEY": str(server.key),
            "LIGHTPATH_TLS_CA": str(server.ca),
            "LIGHTPATH_TLS_CLIENT_AUTH": "require",
            "LIGHTPATH_AUDIT_LOG": "",
            "LIGHTPATH_LOG_LEVEL": "warning",
        },
    )
    async with running("core_broker", settings, build) as svc:
        async with channel(svc.address, credentials=creds) as ch:
            stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
            req = common_pb2.GetInfoRequest()
            for _ in range(200):  # warm up
                await stub.GetInfo(req)
            samples = []
            for _ in range(sequential):
                t0 = time.perf_counter()
                await stub.GetInfo(req)
                samples.append((time.perf_counter() - t0) * 1000)

        async def client(n: int) -> None:
            async with channel(svc.address, credentials=creds) as ch:
                stub = core_broker_pb2_grpc.CoreBrokerStub(ch)
                for _ in range(n):
                    await stub.GetInfo(req)

        per = max(1, calls // clients)
        t0 = time.perf_counter()
        await asyncio.gather(*(client(per) for _ in range(clients)))
        rate = per * clients / (time.perf_counter() - t0)
    return {
        "getinfo_ms_p50": percentile(samples, 50),
        "getinfo_ms_p99": percentile(samples, 99),
        f"getinfo_per_s_{clients}_clients": rate,
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
    parser = argparse.ArgumentParser(
        description="GetInfo over mTLS through the shared runtime; the local stack's start time"
    )
    parser.add_argument("--sequential", type=int, default=SEQUENTIAL, help="sequential calls")
    parser.add_argument("--calls", type=int, default=CONCURRENT_CALLS, help="concurrent calls")
    parser.add_argument("--clients", type=int, default=CLIENTS, help="concurrent clients")
    args = parser.parse_args()
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp:
        result = asyncio.run(
            rpc_costs(url, Path(tmp) / "pki", args.sequential, args.calls, args.clients)
        )
    result["transport"] = "mtls"
    result["stack_start_s"] = stack_start_seconds()
    result["stack_processes"] = len(default_topology()) + 1
    emit(result)


if __name__ == "__main__":
    main()
