"""The compute-node side of in-network aggregation (AG-2 … AG-7, AG-9, AG-14).

    async with ComputeNode("n1", "127.0.0.1:50091") as node:
        result = await node.aggregate("cmd-7", np.ones(1 << 20, np.float32))
        result.values          # the sum over every participant

`aggregate` asks any switch what to use (JoinCommand), opens its Results
stream at its leaf switch, streams the vector there in the command's chunks
(tagged late when management predicted this node a straggler, AG-9), and
returns once every chunk of the result came back. When the node is the
command's timeout aggregation node it also combines the root's partial with
the late data arriving on that stream and sends the final chunks up (AG-7).

Failures are gRPC errors: DEADLINE_EXCEEDED when the command's deadline
failed it (every waiting node hears it), ABORTED with the reason when it
failed earlier (AbortCommand; a node's refused chunk not sent again in time),
INVALID_ARGUMENT for a vector of the
wrong dtype or length, NOT_FOUND for an unknown command, PERMISSION_DENIED
for a credential that is not this node's.

Credentials: a compute node acts as itself. The switches accept JoinCommand,
Contribute and Results only from a compute node's own identity
(`spiffe://lightpath/node/<node id>`, or a bearer token issued to
`node:<node id>`), for its own `node_id` and chunks, in commands it takes part
in. Give `ComputeNode` that node's credentials:

    creds = Credentials.from_files(ca, "node-n1.crt", "node-n1.key")
    async with ComputeNode("n1", address, credentials=creds) as node: ...

Without them it uses `Credentials.default()` (LIGHTPATH_TLS_* / the local
stack's / a token), which is right when that is the node's own certificate.
On a local stack, `local_node_credentials` issues nodes their own.

Shared memory: when the leaf switch runs on the same host (it answers the
node's ShmHello on the Results call and each side opens the other's probe),
chunks go as references to the node's shared-memory buffer rather than as
bytes, and results come back the same way; the node copies each result chunk
into its own array and tells the switch (RELEASE). A vector from
`ComputeNode.empty` already lives in shared memory and is handed over without
any copy; any other vector is copied into a pooled buffer once. Do not write
into a vector while `aggregate` runs on it. `transport="grpc"` (or a leaf
that is elsewhere) keeps everything on the gRPC bytes path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from opentelemetry.sdk.trace import TracerProvider

from lightpath.aggregation import wire
from lightpath.aggregation.maths import (
    Kind,
    NodeCommand,
    Op,
    OrderPolicy,
    Packet,
    Reduction,
    chunk_bounds,
)
from lightpath.aggregation.shm import READ_MARGIN_S, Lease, Segment, ShmDomain
from lightpath.client import channel as lp_channel
from lightpath.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument
from lightpath.security.credentials import Credentials
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc

# How long past the command's deadline a node keeps waiting for its switch to
# say how the command ended, before gRPC's own deadline gives up for it (and
# the last moment it reads a buffer it was sent by reference).
DEADLINE_MARGIN_S = READ_MARGIN_S
# How long a node waits for its leaf switch's answer to its shared-memory offer.
HANDSHAKE_S = 5.0
TRANSPORTS = ("auto", "grpc")
TRIM_EVERY_S = 5.0

_OP = {
    pb.AGG_OP_SUM: "sum",
    pb.AGG_OP_MIN: "min",
    pb.AGG_OP_MAX: "max",
    pb.AGG_OP_PROD: "prod",
    pb.AGG_OP_AND: "and",
    pb.AGG_OP_OR: "or",
}
_ORDER = {
    pb.ORDER_POLICY_ARRIVAL: "arrival",
    pb.ORDER_POLICY_PRESET: "preset",
    pb.ORDER_POLICY_EXACT: "exact",
}


@dataclass
class AggregationResult:
    command_id: str
    node_id: str
    values: np.ndarray
    # The root's parameter server sent new parameters rather than the sum (AG-12).
    parameters: bool
    timeout_aggregator: bool
    predicted_timeout: bool
    seconds: float
    # Whether the chunks went through shared memory (the leaf switch is co-located).
    shared_memory: bool = False


def reduction_of(cmd: pb.AggCommand) -> Reduction:
    """What the command computes, from its protobuf form."""
    return Reduction(
        wire.PB_TO_DTYPE[cmd.dtype],
        Op(_OP[cmd.op]),
        OrderPolicy(_ORDER[cmd.order_policy]),
        cmd.exact_fraction_bits,
        len(cmd.participants),
    )


class ComputeNode:
    """One compute node: `aggregate` is the whole data path of one command.

    `transport`: "auto" uses shared memory with a leaf switch that proves it
    shares this host; "grpc" always sends bytes.

    `credentials`: what every channel of this node presents. A compute node
    presents its own node certificate (or a token issued to `node:<node_id>`):
    the switches let a node join, contribute and read results only as itself.
    None means `Credentials.default()`.
    """

    def __init__(
        self,
        node_id: str,
        management: str,
        *,
        tree_id: str = "",
        tracer_provider: TracerProvider | None = None,
        transport: str = "auto",
        shm_idle_s: float = 30.0,
        credentials: Credentials | None = None,
    ):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.node_id = node_id
        self.tree_id = tree_id
        self.transport = transport
        self._tp = tracer_provider
        self._management = management
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._shm_idle_s = shm_idle_s
        self._domain: ShmDomain | None = None
        self._domain_tried = False
        self._trimmed = time.monotonic()

    @property
    def shm(self) -> ShmDomain | None:
        """This node's shared memory (created on first use), None with transport grpc
        or where the host has none."""
        if self.transport != "auto":
            return None
        if not self._domain_tried:
            self._domain_tried = True
            self._domain = ShmDomain.create(idle_s=self._shm_idle_s)
        return self._domain

    def empty(self, length: int, dtype: Any = np.float32) -> np.ndarray:
        """A vector for `aggregate` that lives in this node's shared memory, so a
        co-located leaf switch reads it where it is (no copy). It stays valid until
        the node is closed; a plain numpy array where shared memory is not used."""
        dt = np.dtype(dtype)
        shm = self.shm
        if shm is None:
            return np.empty(length, dt)
        seg = shm.buffer(max(1, length * dt.itemsize))
        return np.frombuffer(seg.buf, dt, count=length)

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = lp_channel(
                address,
                tracer_provider=self._tp,
                default_timeout=None,
                credentials=self._credentials,
            )
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        if self._domain is not None:
            self._domain.close()

    async def __aenter__(self) -> ComputeNode:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def join(self, command_id: str) -> pb.Assignment:
        """What this node must use for `command_id` (its leaf switch, its role)."""
        stub = agg_switch_pb2_grpc.AggSwitchStub(self._channel(self._management))
        return await stub.JoinCommand(
            pb.JoinCommandRequest(
                tree_id=self.tree_id, command_id=command_id, node_id=self.node_id
            ),
            timeout=10.0,
        )

    async def aggregate(
        self,
        command_id: str,
        values: np.ndarray,
        *,
        delay_s: float = 0.0,
        assignment: pb.Assignment | None = None,
        out: np.ndarray | None = None,
    ) -> AggregationResult:
        """Contribute `values` (after `delay_s`, to play a straggler) and return the
        result, written into `out` when given (a receive buffer reused across calls)."""
        started = time.perf_counter()
        a = assignment or await self.join(command_id)
        cmd = a.command
        reduction = reduction_of(cmd)
        values = np.asarray(values)
        if values.dtype != reduction.dtype.numpy or values.ndim != 1:
            raise InvalidArgument(
                "values",
                f"must be a 1-D {reduction.dtype} vector (got {values.dtype}, {values.ndim}-D)",
            )
        if values.size != cmd.length:
            raise InvalidArgument("values", f"must hold {cmd.length} elements (got {values.size})")
        values = np.ascontiguousarray(values)
        shm = self.shm
        if shm is not None and time.monotonic() - self._trimmed > TRIM_EVERY_S:
            shm.trim()  # forget peers' buffers that are gone, free our idle ones
            self._trimmed = time.monotonic()
        leases: dict[int, list[Lease]] = {}  # this node's timeout aggregation work, per chunk

        def alloc(chunk: int, count: int, dt: np.dtype) -> np.ndarray:
            assert shm is not None
            lease = shm.lease(count * dt.itemsize)
            leases.setdefault(chunk, []).append(lease)
            return lease.array(count, dt)

        state = NodeCommand(
            self.node_id,
            command_id,
            reduction,
            cmd.length,
            cmd.chunk_elems,
            timeout_aggregator=a.timeout_aggregator,
            position={n: i for i, n in enumerate(cmd.preset_order)},
            incremental=cmd.trigger == pb.TRIGGER_MODE_INCREMENTAL,
            root=a.root_switch,
            out=out,
            alloc=alloc if shm is not None else None,
        )
        deadline_at = cmd.deadline.ToNanoseconds() / 1e9
        timeout = max(1.0, deadline_at - time.time() + DEADLINE_MARGIN_S)
        ch = self._channel(a.leaf_endpoint)
        request = pb.ResultsRequest(command_id=command_id, node_id=self.node_id)
        if shm is not None:
            request.shm.CopyFrom(wire.hello_to_pb(shm.hello()))
        results = ch.unary_stream(
            wire.RESULTS,
            request_serializer=pb.ResultsRequest.SerializeToString,
            response_deserializer=wire.identity,
        )(request, timeout=timeout)
        contribute = ch.stream_unary(
            wire.CONTRIBUTE,
            request_serializer=wire.identity,
            response_deserializer=pb.ContributeSummary.FromString,
        )
        min_bytes = await self._handshake(results) if shm is not None else None
        by_ref = min_bytes is not None
        send_lease: Lease | None = None
        source: tuple[Segment, int] | None = None
        if by_ref:
            assert shm is not None
            source = shm.locate(values)
            if source is None:  # not from `empty`: one copy into a pooled buffer
                send_lease = shm.lease(values.nbytes)
                staged = send_lease.array(values.size, values.dtype)
                np.copyto(staged, values)
                source = (send_lease.segment, 0)
        finals: asyncio.Queue[bytes | None] = asyncio.Queue()
        results_read = asyncio.Event()

        async def contributions() -> AsyncIterator[bytes]:
            for raw in self._chunks(a, values, source, min_bytes or 0):
                yield raw
            if by_ref:
                # Ending the stream hands back every result buffer the switch lent us:
                # only once all of them are copied.
                await results_read.wait()

        async def send() -> None:
            if delay_s:
                await asyncio.sleep(delay_s)
            await contribute(contributions(), timeout=timeout)

        async def final_stream() -> AsyncIterator[bytes]:
            while (raw := await finals.get()) is not None:
                yield raw

        def final_bytes(pkt: Packet) -> bytes:
            if by_ref and shm is not None and pkt.data is not None:
                found = shm.locate(pkt.data)
                if found is not None and pkt.data.nbytes >= max(1, min_bytes or 0):
                    return wire.encode_ref(pkt, reduction.dtype, found[0].name, found[1])
            return wire.encode(pkt, reduction.dtype)

        async def receive() -> None:
            final_call: Any = None
            async for raw in results:
                header, data = wire.decode(raw)
                if header.HasField("shm"):
                    data = self._read_shared(header, by_ref, deadline_at)
                pkt = wire.to_packet(header, data, raw)
                out = state.accept(pkt)
                if pkt.kind is Kind.RESULT:
                    for lease in leases.pop(pkt.chunk, ()):  # read by the root before this
                        shm.release(lease)  # type: ignore[union-attr]
                if out is not None:  # this node is the timeout aggregation node (S306)
                    if final_call is None:
                        final_call = asyncio.ensure_future(
                            contribute(final_stream(), timeout=timeout)
                        )
                    finals.put_nowait(final_bytes(out))
            results_read.set()
            if final_call is not None:
                finals.put_nowait(None)
                await final_call

        tasks = {asyncio.ensure_future(send()), asyncio.ensure_future(receive())}
        ok = False
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # the first failure (a refused chunk, a failed command) ends it
            await asyncio.gather(*tasks)
            ok = True
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            results.cancel()
            if shm is not None:
                # Done: every reader read before the result came. Failed: someone
                # may still read, so the buffers are unlinked, never reused.
                keep = shm.release if ok else shm.discard
                for lease in [send_lease, *(x for ls in leases.values() for x in ls)]:
                    if lease is not None:
                        keep(lease)
        return AggregationResult(
            command_id,
            self.node_id,
            state.result,
            state.parameters,
            a.timeout_aggregator,
            a.predicted_timeout,
            time.perf_counter() - started,
            by_ref,
        )

    async def _handshake(self, results: Any) -> int | None:
        """The leaf switch's answer to our shared-memory offer: its smallest chunk
        for shared memory when it and we can each open the other's probe, else None."""
        try:
            metadata = await asyncio.wait_for(results.initial_metadata(), HANDSHAKE_S)
        except (TimeoutError, grpc.aio.AioRpcError):
            return None  # the call's own error, if any, surfaces on reading the results
        peer = wire.hello_from_metadata(metadata)
        shm = self.shm
        if peer is None or shm is None or not shm.verify(peer):
            return None
        return peer.min_bytes

    def _read_shared(self, header: pb.AggChunk, by_ref: bool, deadline_at: float) -> memoryview:
        shm = self.shm
        if not by_ref or shm is None:
            raise FailedPrecondition(
                f"chunk {header.index}", "came by shared memory, which this node did not agree to"
            )
        if time.time() > deadline_at + READ_MARGIN_S:
            raise DeadlineExceeded(f"command {header.command_id}: a result came after its deadline")
        return shm.view(header.shm.segment, header.shm.offset, header.shm.nbytes)

    def _chunks(
        self,
        a: pb.Assignment,
        values: np.ndarray,
        source: tuple[Segment, int] | None,
        min_bytes: int,
    ):
        """The contribution chunk by chunk: references into `source` (a shared buffer
        holding `values`) for chunks of at least `min_bytes`, else bytes."""
        cmd = a.command
        predicted = a.predicted_timeout
        dtype = cmd.dtype
        itemsize = values.dtype.itemsize
        for index in range(cmd.chunks):
            lo, hi = chunk_bounds(index, cmd.length, cmd.chunk_elems)
            header = pb.AggChunk(
                command_id=cmd.command_id,
                index=index,
                kind=pb.AGG_CHUNK_KIND_LATE if predicted else pb.AGG_CHUNK_KIND_CONTRIBUTION,
                source=self.node_id,
                destination=cmd.timeout_aggregator if predicted else "",
                timeout_flag=predicted,  # AG-9: a predicted straggler tags its own data
                dtype=dtype,
            )
            nbytes = (hi - lo) * itemsize
            if source is not None and nbytes >= max(1, min_bytes):
                seg, base = source
                header.shm.CopyFrom(
                    pb.ShmRef(segment=seg.name, offset=base + lo * itemsize, nbytes=nbytes)
                )
                yield header.SerializeToString()
            else:
                yield wire.encode_header(header, values[lo:hi])


NodeCredentials = Callable[[str], "Credentials | None"]


async def aggregate_all(
    management: str,
    command_id: str,
    inputs: dict[str, np.ndarray],
    *,
    delays: dict[str, float] | None = None,
    tracer_provider: TracerProvider | None = None,
    credentials: NodeCredentials | None = None,
) -> dict[str, AggregationResult]:
    """Run every compute node of `inputs` in this process (demo, tests, benchmark).

    `credentials(node_id)`: each node's own credentials (see `ComputeNode`), e.g. a
    dict's `get`, or `local_node_credentials(...).get`; None: `Credentials.default()`
    for all, which the switches accept only if it is a node's and there is one node."""
    nodes = [
        ComputeNode(
            n,
            management,
            tracer_provider=tracer_provider,
            credentials=credentials(n) if credentials is not None else None,
        )
        for n in inputs
    ]
    try:
        outs = await asyncio.gather(
            *(
                node.aggregate(
                    command_id, inputs[node.node_id], delay_s=(delays or {}).get(node.node_id, 0.0)
                )
                for node in nodes
            )
        )
    finally:
        for node in nodes:
            await node.close()
    return {r.node_id: r for r in outs}


async def local_node_credentials(
    nodes: Iterable[str], state_dir: Path | None = None
) -> dict[str, Credentials]:
    """Each compute node's own credentials on the local stack (`lightpath up`, or the
    one `ensure_stack` started; `state_dir` defaults to LIGHTPATH_STATE_DIR): a
    certificate issued by the stack's CA, or on a plaintext stack a bearer token
    registered in its Redis. For development and demos: a real cluster hands each
    node its certificate from the cell's CA."""
    from lightpath.paths import default_state_dir, pki_dir
    from lightpath.security.credentials import CredentialsError
    from lightpath.security.identity import NODE, Principal
    from lightpath.security.pki import LocalCA
    from lightpath.stack import issue_local_tokens, running_stack

    state = state_dir or default_state_dir()
    principals = {n: Principal(NODE, n) for n in nodes}
    stack = running_stack(state)
    tls = stack is None or stack.tls
    if tls:
        ca = LocalCA(pki_dir(state))
        if not ca.exists():
            raise CredentialsError(
                f"no local CA in {ca.dir} to issue compute nodes their certificates: "
                "start the stack with `lightpath up` (or give each node its own credentials)"
            )
        for p in principals.values():
            ca.issue(p)
    else:
        assert stack is not None
        await issue_local_tokens(
            state, stack.redis_url, stack.redis_password_file, list(principals.values())
        )
    return {n: Credentials.local(p, state, tls=tls) for n, p in principals.items()}


__all__ = [
    "AggregationResult",
    "ComputeNode",
    "NodeCredentials",
    "aggregate_all",
    "local_node_credentials",
]
