"""A switch's metrics move with its aggregations (issue 18): real agg_switch servers
(root over sub-1 and sub-2) on a real Redis, the SDK as compute nodes, read through an
in-memory reader of the test's own provider (one recorder for the three switches of
this process, told apart by their `switch` attribute)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from lightpath.aggregation.node import aggregate_all
from lightpath.v1 import agg_switch_pb2 as pb
from lightpath_services.agg_switch import server as agg_server
from lightpath_services.agg_switch.metrics import AggMetrics
from tests.agg_switch.test_contract import FIVE, n5_clearly_last, straggle, vectors
from tests.agg_switch.tree import agg_tree, node_credentials, patient_tree
from tests.metrics_reader import assert_listed, install, points, until, value

SWITCHES = ("root", "sub-1", "sub-2")


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, agg_server, AggMetrics, refresh_s=0.05)


async def test_aggregations_move_commands_bytes_timeouts_bypass_entries_and_predictions(
    redis_url, reader
):
    async with agg_tree(redis_url, transport="grpc") as tree:
        # No switch times a child out (until the last command): none is cut off.
        await tree.define(patient_tree())
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
        await n5_clearly_last(tree, "m1", data)
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

        # n5 misses sub-2's threshold on both chunks: two timeouts, two bypass entries
        # until its late data arrives. Only sub-2 times a child out now, its timer
        # started by n4's chunk: no on-time node can be cut off.
        await tree.define(patient_tree({"sub-2": 300}))
        late = await tree.start(
            "late",
            FIVE,
            length,
            chunk_bytes=8 * 2,
            timeout_aggregator=pb.TimeoutAggregatorSelection(node="n1"),
        )
        assert late.chunks == 2
        on_time = asyncio.ensure_future(
            aggregate_all(
                tree.address(),
                "late",
                {n: data[n] for n in FIVE if n != "n5"},
                credentials=node_credentials,
            )
        )
        await until(
            lambda: value(reader, "lightpath.agg.bypass_entries", switch="sub-2") == 2,
            "two bypass entries on sub-2",
        )
        assert value(reader, "lightpath.agg.timeouts", switch="sub-2") == 2
        assert value(reader, "lightpath.agg.timeouts", switch="root") == 0
        await straggle(tree, "n5", "sub-2", "late", data["n5"])
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
