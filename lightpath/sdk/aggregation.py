"""In-network aggregation commands through any switch of the tree (agg_switch).

    from lightpath.sdk import Aggregation

    with Aggregation() as agg:                  # the local stack's root switch
        agg.start("step-7", ["n1", "n2", "n3"], length=1024, op="sum")
        # ... the compute nodes contribute (lightpath.aggregation.node.ComputeNode) ...
        done = agg.wait("step-7", timeout=30)   # COMPLETED or FAILED: check `state`

Address: $LIGHTPATH_AGG_ADDR, else the local stack's `agg-root`. Compute nodes
send their data with `lightpath.aggregation.node`, not with this client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import timedelta

from google.protobuf import duration_pb2

from lightpath.sdk._base import AsyncClient, SyncClient, blocking, blocking_iter
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath.v1 import agg_switch_pb2_grpc

DTYPES = {
    "int32": pb.AGG_DTYPE_INT32,
    "int64": pb.AGG_DTYPE_INT64,
    "float32": pb.AGG_DTYPE_FLOAT32,
    "float64": pb.AGG_DTYPE_FLOAT64,
    "bool": pb.AGG_DTYPE_BOOL,
}
OPS = {
    "sum": pb.AGG_OP_SUM,
    "min": pb.AGG_OP_MIN,
    "max": pb.AGG_OP_MAX,
    "prod": pb.AGG_OP_PROD,
    "and": pb.AGG_OP_AND,
    "or": pb.AGG_OP_OR,
}
ORDERS = {
    "arrival": pb.ORDER_POLICY_ARRIVAL,
    "preset": pb.ORDER_POLICY_PRESET,
    "exact": pb.ORDER_POLICY_EXACT,
}
TRIGGERS = {"all": pb.TRIGGER_MODE_ALL_OR_THRESHOLD, "incremental": pb.TRIGGER_MODE_INCREMENTAL}
SLOTS = {"wait": pb.SLOT_POLICY_WAIT, "fallback": pb.SLOT_POLICY_FALLBACK}
STRATEGIES = {
    "fixed": pb.TA_STRATEGY_FIXED,
    "random-by-id": pb.TA_STRATEGY_RANDOM_BY_ID,
    "least-load": pb.TA_STRATEGY_LEAST_LOAD,
    "fewest-hops": pb.TA_STRATEGY_FEWEST_HOPS,
    "lowest-link-cost": pb.TA_STRATEGY_LOWEST_LINK_COST,
}


def _pick(table: Mapping[str, int], value: str, what: str) -> int:
    try:
        return table[value.lower()]
    except KeyError:
        raise ValueError(f"unknown {what} {value!r}: one of {', '.join(table)}") from None


def command_request(
    command_id: str,
    participants: Iterable[str],
    length: int,
    *,
    tree: str = "",
    dtype: str = "float32",
    op: str = "sum",
    order: str = "preset",
    trigger: str = "all",
    deadline: float | timedelta = 0.0,
    tenant: str = "",
    slot_policy: str = "wait",
    wait_for_all: bool = False,
    chunk_bytes: int = 0,
    timeout_aggregator: str = "",
    ta_strategy: str = "fixed",
    ta_candidates: Iterable[str] = (),
    combine_at_switch: bool = False,
    predicted: Iterable[str] = (),
    predict_top_k: int = 0,
    predict_threshold_s: float = 0.0,
    exact_fraction_bits: int | None = None,
) -> pb.StartCommandRequest:
    """The StartCommandRequest of `AsyncAggregation.start`'s arguments (see there)."""
    req = pb.StartCommandRequest(
        tree_id=tree,
        command_id=command_id,
        participants=list(participants),
        dtype=_pick(DTYPES, dtype, "dtype"),  # type: ignore[arg-type]
        op=_pick(OPS, op, "op"),  # type: ignore[arg-type]
        length=length,
        order_policy=_pick(ORDERS, order, "order"),  # type: ignore[arg-type]
        trigger=_pick(TRIGGERS, trigger, "trigger"),  # type: ignore[arg-type]
        tenant=tenant,
        slot_policy=_pick(SLOTS, slot_policy, "slot policy"),  # type: ignore[arg-type]
        wait_for_all=wait_for_all,
        chunk_bytes=chunk_bytes,
        timeout_aggregator=pb.TimeoutAggregatorSelection(
            strategy=_pick(STRATEGIES, ta_strategy, "strategy"),  # type: ignore[arg-type]
            node=timeout_aggregator,
            candidates=list(ta_candidates),
            combine_at_switch=combine_at_switch,
        ),
        predicted_timeout_nodes=list(predicted),
        predict_stragglers=pb.StragglerPredictionOptions(
            top_k=predict_top_k, threshold_s=predict_threshold_s
        ),
    )
    seconds = deadline.total_seconds() if isinstance(deadline, timedelta) else deadline
    if seconds:
        d = duration_pb2.Duration()
        d.FromNanoseconds(round(seconds * 1e9))
        req.deadline.CopyFrom(d)
    if exact_fraction_bits is not None:
        req.exact_fraction_bits = exact_fraction_bits
    return req


class AsyncAggregation(AsyncClient):
    """Any switch of an aggregation tree: start, read, list and wait for commands."""

    PROCESS = "agg-root"
    ADDR_ENV = "LIGHTPATH_AGG_ADDR"
    STUB = agg_switch_pb2_grpc.AggSwitchStub

    async def start(
        self,
        command_id: str,
        participants: Iterable[str] = (),
        length: int = 0,
        *,
        request: pb.StartCommandRequest | None = None,
        **options: object,
    ) -> pb.AggCommand:
        """Start aggregation command `command_id` (the idempotency key) over the compute
        nodes `participants`, vectors of `length` elements. Options (`command_request`):
        tree, dtype "int32" | "int64" | "float32" | "float64" | "bool", op "sum" | "min" |
        "max" | "prod" | "and" | "or", order "arrival" | "preset" | "exact", trigger "all"
        | "incremental", deadline (seconds or timedelta; 0: 30 s), tenant, slot_policy
        "wait" | "fallback", wait_for_all, chunk_bytes, timeout_aggregator, ta_strategy,
        ta_candidates, combine_at_switch (a compute node chosen as timeout aggregation
        node hands the combine to its leaf switch: for nodes whose client does not
        implement it), predicted, predict_top_k, predict_threshold_s,
        exact_fraction_bits. Or a complete `request`."""
        if request is None:
            request = command_request(command_id, participants, length, **options)  # type: ignore[arg-type]
        return await self._call("StartCommand", request)  # type: ignore[no-any-return]

    async def get(self, command_id: str, *, tree: str = "") -> pb.AggCommand:
        return await self._call(  # type: ignore[no-any-return]
            "GetCommand", pb.GetCommandRequest(tree_id=tree, command_id=command_id)
        )

    async def abort(self, command_id: str, reason: str, *, tree: str = "") -> pb.AggCommand:
        """Fail a running command across the tree now: every node waiting for it ends
        ABORTED with `reason` (its owner, an operator or a participant may). Aborting
        a failed command again answers it as it is; a completed one raises
        FailedPrecondition."""
        return await self._call(  # type: ignore[no-any-return]
            "AbortCommand",
            pb.AbortCommandRequest(tree_id=tree, command_id=command_id, reason=reason),
        )

    async def list_commands_page(
        self, *, tree: str = "", page_size: int = 50, page_token: str = ""
    ) -> pb.ListCommandsResponse:
        """One page of commands, newest first; `next_page_token` asks for the next."""
        return await self._call(  # type: ignore[no-any-return]
            "ListCommands",
            pb.ListCommandsRequest(tree_id=tree, page_size=page_size, page_token=page_token),
        )

    async def list_commands(
        self,
        *,
        tree: str = "",
        limit: int | None = None,
        page_size: int = 100,
        page_token: str = "",
    ) -> AsyncIterator[pb.AggCommand]:
        """Commands newest first (at most `limit`), fetching pages as the loop goes."""
        first = page_token

        def make(token: str) -> pb.ListCommandsRequest:
            return pb.ListCommandsRequest(
                tree_id=tree, page_size=page_size, page_token=token or first
            )

        async for command in self._pages("ListCommands", make, lambda p: p.commands, limit):
            first = ""
            yield command

    async def wait(
        self, command_id: str, *, tree: str = "", timeout: float | None = None
    ) -> pb.AggCommand:
        """The command once it is no longer RUNNING (COMPLETED or FAILED: check `state`,
        and `failure` / `missing_nodes`), asking every 0.05 s growing to 1 s (there is no
        watch for commands). TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            command = await self.get(command_id, tree=tree)
            if command.state != pb.AGG_COMMAND_STATE_RUNNING:
                return command
            if deadline is not None and time.monotonic() + pause > deadline:
                raise TimeoutError(f"command {command_id} still RUNNING after {timeout:g} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    async def history(self, *, tree: str = "", limit: int = 0) -> pb.AggHistory:
        """Each participant's lateness per finished command (the newest `limit`; 0: 20)."""
        return await self._call(  # type: ignore[no-any-return]
            "GetHistory", pb.GetHistoryRequest(tree_id=tree, limit=limit)
        )


class Aggregation(SyncClient[AsyncAggregation]):
    """`AsyncAggregation` with blocking methods (same arguments and answers)."""

    ASYNC = AsyncAggregation

    start = blocking(AsyncAggregation.start)
    get = blocking(AsyncAggregation.get)
    abort = blocking(AsyncAggregation.abort)
    list_commands_page = blocking(AsyncAggregation.list_commands_page)
    list_commands = blocking_iter(AsyncAggregation.list_commands)
    wait = blocking(AsyncAggregation.wait)
    history = blocking(AsyncAggregation.history)
