"""The SDK's aggregation client against real switches (a root and two subs over TLS)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from lightpath.aggregation.node import aggregate_all
from lightpath.cli import main
from lightpath.sdk import Aggregation, AsyncAggregation, InvalidArgument, NotFound
from lightpath.v1 import agg_switch_pb2 as pb
from tests.agg_switch.tree import TREE, agg_tree, node_credentials, stack_tree


async def test_start_wait_list_and_history(redis_url, capsys):
    async with agg_tree(redis_url) as t:
        # a fresh tree: the CLI says how to define its topology
        code = await asyncio.to_thread(main, ["agg", "topology", "--addr", t.address()])
        err = capsys.readouterr().err
        assert code == 1 and "NOT_FOUND" in err
        assert "next: a fresh tree has no topology yet: define one with `lightpath agg" in err
        async with AsyncAggregation(t.address("sub-2")) as agg:
            await agg.stub.DefineTopology(
                pb.DefineTopologyRequest(topology=pb.AggTopology(tree_id=TREE, nodes=stack_tree()))
            )
            nodes = [f"n{i}" for i in range(1, 6)]
            started = await agg.start("sdk-1", nodes, 8, dtype="int64", timeout_aggregator="n2")
            assert started.state == pb.AGG_COMMAND_STATE_RUNNING
            assert started.timeout_aggregator == "n2" and started.dtype == pb.AGG_DTYPE_INT64
            again = await agg.start("sdk-1", nodes, 8, dtype="int64", timeout_aggregator="n2")
            assert again.command_id == "sdk-1"

            with pytest.raises(TimeoutError):  # nobody contributed yet
                await agg.wait("sdk-1", timeout=0.2)
            data = {n: np.arange(8, dtype=np.int64) * i for i, n in enumerate(nodes, 1)}
            waiter = asyncio.create_task(agg.wait("sdk-1", timeout=30))
            await aggregate_all(t.address(), "sdk-1", data, credentials=node_credentials)
            done = await waiter
            assert done.state == pb.AGG_COMMAND_STATE_COMPLETED

            await agg.start("sdk-2", nodes[:2], 4)
            assert [c.command_id async for c in agg.list_commands(page_size=1)] == [
                "sdk-2",
                "sdk-1",
            ]
            assert [c.command_id async for c in agg.list_commands(limit=1)] == ["sdk-2"]
            await t.settled("sdk-1")
            history = await agg.history()
            assert [e.command_id for e in history.entries] == ["sdk-1"]

            with pytest.raises(InvalidArgument) as bad:
                await agg.start("sdk-3", ["n1", "zz"], 0)
            assert any(v.field.startswith("participants[1]") for v in bad.value.violations)
            with pytest.raises(NotFound):
                await agg.get("ghost")
            with pytest.raises(ValueError, match="unknown op 'avg'"):
                await agg.start("sdk-4", nodes, 8, op="avg")

        # the CLI's `agg status` pages on the same client
        addr = ["--addr", t.address("sub-1")]
        code = await asyncio.to_thread(main, ["agg", "status", "--limit", "1", *addr])
        out, err = capsys.readouterr()
        assert code == 0 and "sdk-2" in out and "sdk-1" not in out
        assert "more commands: --all lists every one, --page-token " in err
        code = await asyncio.to_thread(main, ["agg", "status", "--all", "-o", "name", *addr])
        assert code == 0 and capsys.readouterr().out.split() == ["sdk-2", "sdk-1"]

        def blocking() -> str:
            with Aggregation(t.address("root")) as agg:
                return pb.AggCommandState.Name(agg.get("sdk-1").state)

        assert await asyncio.to_thread(blocking) == "AGG_COMMAND_STATE_COMPLETED"


async def test_abort_and_combine_at_switch_through_the_blocking_client(redis_url):
    from lightpath.sdk import Aborted, FailedPrecondition

    async with agg_tree(redis_url) as t:
        await t.define(stack_tree())

        def blocking() -> tuple[pb.AggCommand, pb.AggCommand]:
            with Aggregation(t.address("sub-2")) as agg:
                started = agg.start(
                    "sdk-abort", ["n1", "n4"], 8, timeout_aggregator="n4", combine_at_switch=True
                )
                return started, agg.abort("sdk-abort", "operator says stop")

        started, aborted = await asyncio.to_thread(blocking)
        assert (started.timeout_aggregator, started.combined_for) == ("sub-2", "n4")
        assert aborted.state == pb.AGG_COMMAND_STATE_FAILED
        assert aborted.failure_reason == "ABORTED" and "operator says stop" in aborted.failure
        # A node of the aborted command hears it as a typed error through the SDK's decoding.
        from lightpath.client import rpc_error

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await aggregate_all(
                t.address(),
                "sdk-abort",
                {"n1": np.zeros(8, np.float32)},
                credentials=node_credentials,
            )
        decoded = rpc_error(err.value)
        assert isinstance(decoded, Aborted) and decoded.reason == "ABORTED"
        done = pb.AggCommand()
        async with AsyncAggregation(t.address()) as agg:
            await agg.start("sdk-done", ["n1"], 4, dtype="int64")
            await aggregate_all(
                t.address(),
                "sdk-done",
                {"n1": np.arange(4, dtype=np.int64)},
                credentials=node_credentials,
            )
            done = await agg.wait("sdk-done", timeout=30)
            with pytest.raises(FailedPrecondition):
                await agg.abort("sdk-done", "too late")
        assert done.state == pb.AGG_COMMAND_STATE_COMPLETED
