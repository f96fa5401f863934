"""The broker's metrics move with its reservations (issue 18): the real core_broker on
a real Redis, read through an in-memory reader of the test's own provider."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from lightpath.v1 import core_broker_pb2 as pb
from lightpath_services.core_broker import server as broker_server
from lightpath_services.core_broker.metrics import BrokerMetrics
from tests.core_broker.conftest import running_broker
from tests.metrics_reader import assert_listed, install, until, value


@pytest.fixture
def reader(monkeypatch) -> CollectorRegistry:
    return install(monkeypatch, broker_server, BrokerMetrics, refresh_s=0.1)


async def test_reservations_move_decisions_reserved_cores_and_live_count(redis_url, reader):
    async with running_broker(redis_url) as broker:
        await broker.device("gpu-1", 8)
        app = await broker.app("cam")
        await until(
            lambda: value(reader, "lightpath.broker.cores.total", device="gpu-1") == 8,
            "gpu-1's 8 cores",
        )
        assert value(reader, "lightpath.broker.cores.reserved", device="gpu-1", window="now") == 0
        assert value(reader, "lightpath.broker.reservations.live") == 0

        got = await broker.reserve(app, "r-1", 3, 600)
        assert got.outcome == pb.OUTCOME_GRANTED
        assert value(reader, "lightpath.broker.decisions", outcome="granted") == 1
        assert value(reader, "lightpath.broker.decision.duration") == 1
        await until(
            lambda: (
                value(reader, "lightpath.broker.cores.reserved", device="gpu-1", window="now") == 3
                and value(
                    reader, "lightpath.broker.cores.reserved", device="gpu-1", window="next_hour"
                )
                == 3
                and value(reader, "lightpath.broker.reservations.live") == 1
            ),
            "3 cores of gpu-1 reserved by one live reservation",
        )

        second = await broker.reserve(app, "r-2", 5, 600)  # the rest of gpu-1
        assert second.outcome == pb.OUTCOME_GRANTED
        assert value(reader, "lightpath.broker.decisions", outcome="granted") == 2
        assert value(reader, "lightpath.broker.decision.duration") == 2

        # gpu-1 is full: the next is answered by another outcome, counted under its name.
        third = await broker.reserve(app, "r-3", 1, 600)
        assert third.outcome != pb.OUTCOME_GRANTED
        outcome = pb.Outcome.Name(third.outcome).removeprefix("OUTCOME_").lower()
        assert value(reader, "lightpath.broker.decisions", outcome=outcome) == 1
        assert value(reader, "lightpath.broker.decisions") == 3

        await broker.stub.ReleaseReservation(
            pb.ReleaseReservationRequest(reservation_id="r-1"), metadata=app
        )
        await until(
            lambda: (
                value(reader, "lightpath.broker.cores.reserved", device="gpu-1", window="now") == 5
                and value(reader, "lightpath.broker.reservations.live")
                == (1 if outcome == "rejected" else 2)
            ),
            "r-1 released",
        )
        assert_listed(reader)


async def test_commits_decided_on_the_current_state_are_counted_as_not_re_checked(
    redis_url, reader
):
    """A broker alone on its Redis decides on the store's current state, so Redis
    writes its batches without re-reading schedules: counted rechecked="false".
    (The re-check itself, for a decision on an older state, is tested on the store
    in test_store.py; two replicas under load never over-commit, test_replicas.py.)"""
    async with running_broker(redis_url) as broker:
        await broker.device("gpu-1", 8)
        app = await broker.app("cam")
        for i in range(3):
            assert (await broker.reserve(app, f"r-{i}", 2, 600)).outcome == pb.OUTCOME_GRANTED
        # the fourth asks for more than is left: PARTIAL, committed like the rest
        assert (await broker.reserve(app, "r-3", 4, 600)).outcome == pb.OUTCOME_PARTIAL
        assert value(reader, "lightpath.broker.commits", rechecked="false") == 4
        assert value(reader, "lightpath.broker.commits", rechecked="true") == 0
