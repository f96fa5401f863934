"""Real agg_switch processes for contract tests: every switch of a tree served
in-process on an ephemeral port, one Redis, real gRPC between them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import duration_pb2

from lightpath.client import channel
from lightpath.security.credentials import Credentials
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc
from lightpath_services.agg_switch.topology import MAX_THRESHOLD_MS
from lightpath_services.common.server import RunningService
from tests.helpers import credentials, serve

TREE = "tree-1"
SW, CN, DN = pb.AGG_NODE_KIND_SWITCH, pb.AGG_NODE_KIND_COMPUTE, pb.AGG_NODE_KIND_DEDICATED
TRANSPORT_ENV = {
    "shm": {"LIGHTPATH_AGG_TRANSPORT": "auto", "LIGHTPATH_AGG_SHM_MIN_BYTES": "0"},
    "grpc": {"LIGHTPATH_AGG_TRANSPORT": "grpc"},
}


_NODE_CREDENTIALS: dict[str, Credentials] = {}


def node_credentials(node_id: str) -> Credentials:
    """A compute node's own credentials (`node:<id>` from the test CA): what the SDK
    must present to join, contribute and read results as that node."""
    creds = _NODE_CREDENTIALS.get(node_id)
    if creds is None:
        creds = _NODE_CREDENTIALS[node_id] = credentials(f"node:{node_id}")
    return creds


def node(id: str, kind: int, parent: str = "", threshold_ms: int = 0, **kw) -> pb.AggNode:
    return pb.AggNode(id=id, kind=kind, parent=parent, threshold_ms=threshold_ms, **kw)


# A threshold beyond every test's deadline (the service's ceiling, an hour): a switch
# given it waits for all of its children, however slow the machine.
NEVER_MS = MAX_THRESHOLD_MS


def stack_tree(
    sub_ms: int = 100,
    root_ms: int = 300,
    per_sub: Sequence[int] = (3, 2),
    thresholds: Mapping[str, int] | None = None,
) -> list[pb.AggNode]:
    """root over sub-1 (n1..n3) and sub-2 (n4, n5): the seed's two-switch cluster.
    `thresholds` overrides `sub_ms` / `root_ms` for the switches it names."""
    ms = {"root": root_ms, "sub-1": sub_ms, "sub-2": sub_ms, **(thresholds or {})}
    nodes = [
        node("root", SW, "", ms["root"]),
        node("sub-1", SW, "root", ms["sub-1"]),
        node("sub-2", SW, "root", ms["sub-2"]),
    ]
    i = 1
    for sub, count in zip(("sub-1", "sub-2"), per_sub, strict=True):
        for _ in range(count):
            nodes.append(node(f"n{i}", CN, sub))
            i += 1
    return nodes


def patient_tree(
    short: Mapping[str, int] | None = None, per_sub: Sequence[int] = (3, 2)
) -> list[pb.AggNode]:
    """The stack tree in which only the switches named in `short` (with their
    thresholds, ms) time a child out; every other switch waits for all of its
    children (NEVER_MS).

    A switch's threshold timer starts at its first child's chunk, so a switch whose
    on-time children are several must have them all within the threshold: a loaded
    machine misses that and an on-time node becomes a straggler. Give the short
    threshold only to the straggler's switch, with exactly one on-time child (sub-2:
    n4 and n5): that child's chunk starts the timer and is by then already in, and
    the straggler sends only once the switch timed it out (`straggle`)."""
    return stack_tree(NEVER_MS, NEVER_MS, per_sub, short)


@dataclass
class Tree:
    switches: dict[str, RunningService]
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _stubs: dict[tuple[str, str | None], agg_switch_pb2_grpc.AggSwitchStub] = field(
        default_factory=dict
    )

    def address(self, switch: str = "root") -> str:
        return self.switches[switch].address

    def stub(
        self, switch: str = "root", *, as_: str | Credentials | None = None
    ) -> agg_switch_pb2_grpc.AggSwitchStub:
        """A stub of `switch` as the operator, or `as_` (`tenant:acme`, `node:n1`, ...):
        one channel per switch and identity named (not per call: the polls of a test
        asked for hundreds, a TLS handshake each); given Credentials, a channel of its own."""
        if isinstance(as_, Credentials):
            return agg_switch_pb2_grpc.AggSwitchStub(self.channel(switch, as_=as_))
        key = (switch, as_)
        if key not in self._stubs:
            self._stubs[key] = agg_switch_pb2_grpc.AggSwitchStub(self.channel(switch, as_=as_))
        return self._stubs[key]

    def channel(self, switch: str = "root", *, as_: str | Credentials | None = None):
        creds = credentials(as_) if isinstance(as_, str) else as_
        ch = channel(self.address(switch), credentials=creds)
        self._channels.append(ch)
        return ch

    async def define(self, nodes: Sequence[pb.AggNode], tree: str = TREE, **kw) -> pb.AggTopology:
        return await self.stub().DefineTopology(
            pb.DefineTopologyRequest(topology=pb.AggTopology(tree_id=tree, nodes=nodes, **kw))
        )

    async def start(
        self, command_id: str, participants: Sequence[str], length: int, **kw
    ) -> pb.AggCommand:
        kw.setdefault("dtype", pb.AGG_DTYPE_INT64)
        kw.setdefault("op", pb.AGG_OP_SUM)
        deadline_s = kw.pop("deadline_s", 20.0)
        stub = self.stub(kw.pop("via", "root"), as_=kw.pop("as_", None))
        return await stub.StartCommand(
            pb.StartCommandRequest(
                command_id=command_id,
                participants=list(participants),
                length=length,
                deadline=duration_pb2.Duration(
                    seconds=int(deadline_s), nanos=int(deadline_s % 1 * 1e9)
                ),
                **kw,
            )
        )

    async def command(self, command_id: str) -> pb.AggCommand:
        return await self.stub().GetCommand(pb.GetCommandRequest(command_id=command_id))

    async def settled(self, command_id: str, timeout: float = 10.0) -> pb.AggCommand:
        """The command once it ended and every switch filed its slot-hold report."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            cmd = await self.command(command_id)
            if cmd.state != pb.AGG_COMMAND_STATE_RUNNING and len(cmd.slot_holds) >= len(
                cmd.bitmaps
            ):
                return cmd
            if loop.time() > end:
                raise AssertionError(f"command {command_id} did not settle: {cmd}")
            await asyncio.sleep(0.02)

    async def state(self, switch: str) -> pb.SwitchState:
        return await self.stub(switch).GetSwitchState(pb.GetSwitchStateRequest())

    async def close(self) -> None:
        for ch in self._channels:
            await ch.close()


# What a switch of `agg_tree` gives in-flight calls when the tree is torn down (s).
GRACE_S = 0.5


@contextlib.asynccontextmanager
async def agg_tree(
    redis_url: str,
    switches: Sequence[str] = ("root", "sub-1", "sub-2"),
    env: Mapping[str, Mapping[str, str]] | None = None,
    tree: str = TREE,
    tracer_provider=None,
    transport: str = "shm",
    grace_s: float = GRACE_S,
) -> AsyncIterator[Tree]:
    """`transport`: "shm" — shared memory between the switches and with the SDK
    for chunks of any size (they all run on this host); "grpc" — bytes only.
    `grace_s`: what each switch gives in-flight calls when the tree is torn down."""
    async with contextlib.AsyncExitStack() as stack:
        running = {}
        for s in switches:
            running[s] = await stack.enter_async_context(
                serve(
                    "agg_switch",
                    redis_url,
                    {
                        "LIGHTPATH_SWITCH_ID": s,
                        "LIGHTPATH_AGG_TREE": tree,
                        **TRANSPORT_ENV[transport],
                        **(env or {}).get(s, {}),
                    },
                    tracer_provider=tracer_provider,
                    grace=grace_s,
                )
            )
        t = Tree(running)
        # Each switch registers its address as it starts.
        from lightpath_services.common import redis_store
        from lightpath_services.common.keys import tree_key

        r = redis_store.connect(redis_url)  # one server, a cluster or a sentinel set
        try:
            for _ in range(500):
                if len(await r.hgetall(tree_key(tree, "endpoints"))) >= len(switches):
                    break
                await asyncio.sleep(0.01)
        finally:
            await r.aclose()
        try:
            yield t
        finally:
            await t.close()
            # Every switch holds a Relay stream from each neighbour until that one drains
            # (services/lightpath_services/agg_switch/dataplane.py, DataPlane.drain): one
            # at a time, each but the last would wait out its grace for them; together,
            # they end at once (the exit stack's stops then find them stopped).
            await asyncio.gather(*(svc.stop(grace_s) for svc in running.values()))
