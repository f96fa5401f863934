"""A real local stack with its web console (issue 21), shared by the console's tests: every
service as its own process over mTLS, the console over HTTPS with its own certificate, two
tenants with certificates and bearer tokens, devices and reservations on the core broker,
and an aggregation tree."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from lightpath.client import channel
from lightpath.embedded_redis import free_port
from lightpath.sdk import Cell, Cores
from lightpath.security.credentials import Credentials
from lightpath.security.identity import OPERATOR, TENANT, Principal
from lightpath.stack import Stack, default_topology, issue_local_tokens, with_ephemeral_ports
from lightpath.v1 import agg_switch_pb2 as agg
from lightpath.v1 import agg_switch_pb2_grpc
from lightpath.v1 import core_broker_pb2 as cb

TENANTS = ("acme", "globex")


@dataclass
class ConsoleStack:
    stack: Stack
    url: str
    ca: Path
    tokens: dict[str, str]  # tenant -> bearer token

    def creds(self, who: str) -> Credentials:
        principal = Principal(OPERATOR, OPERATOR) if who == "operator" else Principal(TENANT, who)
        return Credentials.local(principal, self.stack.state_dir, tls=True)

    def cell(self, who: str = "operator") -> Cell:
        return Cell(self.stack.endpoints["cell-scheduler"], credentials=self.creds(who))

    def http(self, **kw) -> httpx.Client:
        """A client of the console that checks its certificate against the stack's CA."""
        return httpx.Client(base_url=self.url, verify=self.tls(), timeout=15, **kw)

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


# Package scope, not session: the stack idles at ~0.07 of a core (pods heartbeating, the
# console polling), which over a whole run on one worker was ~70 CPU-s spent on nothing.
# Its users (test_browser, test_http) share one xdist group, so they run back to back.
@pytest.fixture(scope="package")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleStack]:
    state_dir = tmp_path_factory.mktemp("console-stack")
    stack = Stack(
        state_dir,
        specs=with_ephemeral_ports(default_topology()),
        redis_port=0,
        console_port=free_port(),
        log=lambda *_: None,
    )
    stack.start(timeout=180)
    try:
        for tenant in TENANTS:
            stack.ca.issue(Principal(TENANT, tenant))
        issued = asyncio.run(
            issue_local_tokens(
                state_dir,
                stack.redis_url,
                stack.redis_password_file,
                [Principal(TENANT, t) for t in TENANTS],
            )
        )
        tokens = {p.name: t for p, t in issued.items()}
        cs = ConsoleStack(stack, stack.console_url, stack.ca.cert_path, tokens)
        _populate(cs)
        yield cs
    finally:
        stack.stop()


def _populate(cs: ConsoleStack) -> None:
    """Devices and reservations on the core broker, and the aggregation tree."""
    operator = cs.creds("operator")
    broker = cs.stack.endpoints["core-broker"]
    with Cores(broker, credentials=operator) as cores:
        for i in range(3):
            cores.register_device(
                cb.Device(device_id=f"edge-{i}", kind=cb.DEVICE_KIND_GPU, cores=16)
            )
        token = cores.register_application("console-test").token
    with Cores(broker, credentials=operator.with_token(token)) as app:
        now = time.time()
        # minutes long, as the issue's were: the timeline fits them (about half an hour)
        app.reserve("r-now", 6, 600, devices=["edge-0"])
        app.reserve("r-later", 10, 1200, devices=["edge-0"], start=now + 600)
        app.reserve("r-other", 4, 900, devices=["edge-1"], start=now + 300)

    async def define_tree() -> None:
        sw, cn = agg.AGG_NODE_KIND_SWITCH, agg.AGG_NODE_KIND_COMPUTE
        nodes = [
            agg.AggNode(id="root", kind=sw, threshold_ms=600),
            agg.AggNode(id="sub-1", kind=sw, parent="root", threshold_ms=200),
            agg.AggNode(id="sub-2", kind=sw, parent="root", threshold_ms=200),
            *(
                agg.AggNode(id=f"n{i}", kind=cn, parent="sub-1" if i < 3 else "sub-2")
                for i in range(5)
            ),
        ]
        async with channel(cs.stack.endpoints["agg-root"], credentials=operator) as ch:
            await agg_switch_pb2_grpc.AggSwitchStub(ch).DefineTopology(
                agg.DefineTopologyRequest(topology=agg.AggTopology(tree_id="tree-1", nodes=nodes))
            )

    asyncio.run(define_tree())
