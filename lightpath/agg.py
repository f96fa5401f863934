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
failed it (every waiting node hears it), INVALID_ARGUMENT for a vector of the
wrong dtype or length, NOT_FOUND for an unknown command.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from opentelemetry.sdk.trace import TracerProvider

from lightpath import agg_wire
from lightpath.aggregation import NodeCommand, Op, OrderPolicy, Reduction, chunk_bounds
from lightpath.client import channel as lp_channel
from lightpath.errors import InvalidArgument
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc

# How long past the command's deadline a node keeps waiting for its switch to
# say how the command ended, before gRPC's own deadline gives up for it.
DEADLINE_MARGIN_S = 5.0

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


def reduction_of(cmd: pb.AggCommand) -> Reduction:
    """What the command computes, from its protobuf form."""
    return Reduction(
        agg_wire.PB_TO_DTYPE[cmd.dtype],
        Op(_OP[cmd.op]),
        OrderPolicy(_ORDER[cmd.order_policy]),
        cmd.exact_fraction_bits,
        len(cmd.participants),
    )


class ComputeNode:
    """One compute node: `aggregate` is the whole data path of one command."""

    def __init__(
        self,
        node_id: str,
        management: str,
        *,
        tree_id: str = "",
        tracer_provider: TracerProvider | None = None,
    ):
        self.node_id = node_id
        self.tree_id = tree_id
        self._tp = tracer_provider
        self._management = management
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = lp_channel(
                address, tracer_provider=self._tp, default_timeout=None
            )
        return ch

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()

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
        )
        timeout = max(1.0, cmd.deadline.ToNanoseconds() / 1e9 - time.time() + DEADLINE_MARGIN_S)
        ch = self._channel(a.leaf_endpoint)
        results = ch.unary_stream(
            agg_wire.RESULTS,
            request_serializer=pb.ResultsRequest.SerializeToString,
            response_deserializer=agg_wire.identity,
        )(pb.ResultsRequest(command_id=command_id, node_id=self.node_id), timeout=timeout)
        contribute = ch.stream_unary(
            agg_wire.CONTRIBUTE,
            request_serializer=agg_wire.identity,
            response_deserializer=pb.ContributeSummary.FromString,
        )
        finals: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def send() -> None:
            if delay_s:
                await asyncio.sleep(delay_s)
            await contribute(self._chunks(a, values), timeout=timeout)

        async def final_stream() -> AsyncIterator[bytes]:
            while (raw := await finals.get()) is not None:
                yield raw

        async def receive() -> None:
            final_call: Any = None
            async for raw in results:
                header, data = agg_wire.decode(raw)
                out = state.accept(agg_wire.to_packet(header, data, raw))
                if out is not None:  # this node is the timeout aggregation node (S306)
                    if final_call is None:
                        final_call = asyncio.ensure_future(
                            contribute(final_stream(), timeout=timeout)
                        )
                    finals.put_nowait(agg_wire.encode(out, reduction.dtype))
            if final_call is not None:
                finals.put_nowait(None)
                await final_call

        tasks = {asyncio.ensure_future(send()), asyncio.ensure_future(receive())}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # the first failure (a refused chunk, a failed command) ends it
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            results.cancel()
        return AggregationResult(
            command_id,
            self.node_id,
            state.result,
            state.parameters,
            a.timeout_aggregator,
            a.predicted_timeout,
            time.perf_counter() - started,
        )

    def _chunks(self, a: pb.Assignment, values: np.ndarray):
        cmd = a.command
        predicted = a.predicted_timeout
        dtype = cmd.dtype
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
            yield agg_wire.encode_header(header, values[lo:hi])


async def aggregate_all(
    management: str,
    command_id: str,
    inputs: dict[str, np.ndarray],
    *,
    delays: dict[str, float] | None = None,
    tracer_provider: TracerProvider | None = None,
) -> dict[str, AggregationResult]:
    """Run every compute node of `inputs` in this process (demo, tests, benchmark)."""
    nodes = [ComputeNode(n, management, tracer_provider=tracer_provider) for n in inputs]
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


__all__ = ["AggregationResult", "ComputeNode", "aggregate_all"]
