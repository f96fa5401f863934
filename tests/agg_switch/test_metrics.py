"""A switch's metrics move with its aggregations (issue 18): real agg_switch servers
(root over sub-1 and sub-2) on a real Redis, the SDK as compute nodes, read through an
in-memory reader of the test's own provider (one recorder for the three switches of
this process, told apart by their `switch` attribute)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from lightpath.aggregation.node import ComputeNode, aggregate_all
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.agg_switch import server as agg_server
from lightpath_services.agg_switch.metrics import AggMetrics
from tests.agg_switch.test_contract import FIVE, straggle, vectors
from tests.agg_switch.tree import agg_tree, node_credentials, stack_tree
from tests.metrics_reader import assert_listed, install, points, until, value

SWITCHES = ("root", "sub-1", "sub-2")


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, agg_server, AggMetrics, refresh_s=0.05)


async def test_aggregations_move_commands_bytes_timeouts_bypass_entries_and_predictions(
    redis_url, reader
):
    async with agg_tree(redis_url, transport="grpc") as tree:
        await tree.define(stack_tree(sub_ms=1000, root_ms=5000))
        await until(
            lambda: (
                {p.attributes["switch"] for p in points(reader, "lightpath.agg.slots.total")}
                == set(SWITCHES)
            ),
            "every switch's slots",
        )
        assert value(reader, "lightpath.agg.slots.in_use") == 0
        assert value(reader, "lightpath.agg.commands") == 0

        # A whole run, n5 clearly last (so that history predicts it next time).
        length = 4
        data = vectors(length)
        await tree.start("m1", FIVE, length)
        on_time = asyncio.ensure_future(
            aggregate_all(
                tree.address(),
                "m1",
                {n: data[n] for n in FIVE if n != "n5"},
                credentials=node_credentials,
            )
        )
        await asyncio.sleep(0.3)
        async with ComputeNode("n5", tree.address(), credentials=node_credentials("n5")) as n5:
            await n5.aggregate("m1", data["n5"])
        await on_time
        await tree.settled("m1")
        await until(
            lambda: value(reader, "lightpath.agg.commands", outcome="completed") == 1,
            "m1 counted once, by the root",
        )
        # Folded: 3 contributions at sub-1, 2 at sub-2, the two partials at the root.
        assert value(reader, "lightpath.agg.bytes_aggregated") == 7 * length * 8
        assert value(reader, "lightpath.agg.timeouts") == 0

        cmd = await tree.start(
            "p1",
            FIVE,
            length,
            predict_stragglers=pb.StragglerPredictionOptions(top_k=1),
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1"),
        )
        assert list(cmd.predicted_timeout_nodes) == ["n5"]
        assert value(reader, "lightpath.agg.predicted_stragglers") == 1
        await aggregate_all(tree.address(), "p1", data, credentials=node_credentials)
        await tree.settled("p1")

        # n3 misses sub-1's threshold on both chunks: two timeouts, two bypass entries
        # until its late data arrives.
        late = await tree.start(
            "late",
            FIVE,
            length,
            chunk_bytes=8 * 2,
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="n4"),
        )
        assert late.chunks == 2
        on_time = asyncio.ensure_future(
            aggregate_all(
                tree.address(),
                "late",
                {n: data[n] for n in FIVE if n != "n3"},
                credentials=node_credentials,
            )
        )
        await until(
            lambda: value(reader, "lightpath.agg.bypass_entries", switch="sub-1") == 2,
            "two bypass entries on sub-1",
        )
        assert value(reader, "lightpath.agg.timeouts", switch="sub-1") == 2
        assert value(reader, "lightpath.agg.timeouts", switch="root") == 0
        await straggle(tree, "n3", "sub-1", "late", data["n3"])
        await on_time
        await tree.settled("late")
        await until(
            lambda: (
                value(reader, "lightpath.agg.bypass_entries") == 0
                and value(reader, "lightpath.agg.commands", outcome="completed") == 3
            ),
            "the entries matched and the command completed",
        )
        assert_listed(reader)
