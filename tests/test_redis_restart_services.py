"""A Redis restart under the core_broker, the ocs_manager and an agg_switch tree
(issue 14; the cell and the pod's scheduler are in test_redis_restart.py).

While redis-server is away a call is UNAVAILABLE (retryable), never INTERNAL or
UNKNOWN; afterwards every service is back to full function by itself: what was
acknowledged before is still there (AOF on), a write answered otherwise is
retried as a client would and then succeeds, new work is decided, wired and
aggregated, health says SERVING. The broker's needed loops (decide, reap, follow
the stream) go down with Redis and its health says NOT_SERVING until they run
again. Twice: stopped for longer than the clients retry, and restarted over a
large AOF so that it answers LOADING for seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import grpc
import numpy as np
import pytest

from lightpath.aggregation.node import aggregate_all
from lightpath.client import channel
from lightpath.v1 import agg_switch_pb2 as agg
from lightpath.v1 import agg_switch_pb2_grpc, core_broker_pb2_grpc, ocs_manager_pb2_grpc
from lightpath.v1 import core_broker_pb2 as cb
from lightpath.v1 import ocs_manager_pb2 as ocs
from tests.agg_switch.tree import Tree, agg_tree, node_credentials, stack_tree
from tests.core_broker.conftest import Broker, dur, running_broker
from tests.helpers import serve
from tests.ocs_manager.conftest import fabric_env, wire_request
from tests.restarts import (
    DOWN_S,
    FILLER_COPIES,
    NOT_SERVING,
    SERVING,
    HealthLog,
    fill,
    restart,
)

pytestmark = pytest.mark.slow  # runs for many seconds: handed out first

FIVE = ["n1", "n2", "n3", "n4", "n5"]
SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


async def wait_for(predicate, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await predicate():
        if loop.time() > end:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        await asyncio.sleep(0.05)


async def code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


class Services:
    """The three services on one restartable Redis, and what each was asked to keep."""

    def __init__(self, broker: Broker, app_md, ocs_stub, tree: Tree, once: dict):
        self.broker = broker
        # Stubs whose calls are tried once (the SDK would retry UNAVAILABLE); the
        # ocs_manager's is so already.
        self.broker_once = core_broker_pb2_grpc.CoreBrokerStub(once["broker"])
        self.agg_once = agg_switch_pb2_grpc.AggSwitchStub(once["agg"])
        self.app_md = app_md
        self.ocs = ocs_stub
        self.tree = tree
        self.reservations: list[str] = []
        self.slices: set[str] = set()
        self.commands = 0
        self.away = 0
        # writes answered otherwise than OK while Redis was away: their outcome is not
        # known (a retryable answer may come after the write went through, or the
        # caller may stop waiting first), so each is retried once Redis is back, as a
        # client would; the retry must then be answered OK.
        self.unsettled: dict[str, Callable[[], Awaitable[None]]] = {}

    # -- one unit of each service's work -------------------------------------------

    async def reserve(self, rid: str) -> None:
        r = await self.broker.reserve(self.app_md, rid, 2, 3600)
        assert r.state == cb.RESERVATION_STATE_ACTIVE, r
        self.reservations.append(rid)

    async def wire(self, job: str, blocks: list[int]) -> None:
        w = await self.ocs.WireSlice(wire_request(job, [2, 1, 1], blocks))
        assert w.cross_connect_count > 0
        self.slices.add(job)

    async def aggregate(self) -> None:
        self.commands += 1
        cid = f"sum-{self.commands}"
        await self.tree.start(cid, FIVE, 8)
        data = {n: np.arange(8, dtype=np.int64) * (i + 1) for i, n in enumerate(FIVE)}
        results = await aggregate_all(self.tree.address(), cid, data, credentials=node_credentials)
        want = sum(data.values())
        assert all(np.array_equal(r.values, want) for r in results.values())

    async def work(self, tag: str, blocks: list[int]) -> None:
        await self.reserve(f"r-{tag}")
        await self.wire(f"job-{tag}", blocks)
        await self.aggregate()

    # -- what must hold after a restart --------------------------------------------

    async def settle(self) -> None:
        for retry in self.unsettled.values():
            await retry()
        self.unsettled.clear()

    async def everything_acknowledged_is_there(self) -> None:
        await self.settle()
        for rid in self.reservations:
            r = await self.broker.stub.GetReservation(
                cb.GetReservationRequest(reservation_id=rid), metadata=self.app_md
            )
            assert r.state == cb.RESERVATION_STATE_ACTIVE, (rid, r.state)
        # The broker's live view follows the store again: the kept reservations hold cores.
        free = await self.broker.free_now()
        assert sum(free.values()) == 64 - 2 * len(self.reservations), free
        listed = await self.ocs.ListSlices(ocs.ListSlicesRequest())
        assert sorted(s.job_id for s in listed.slices) == sorted(self.slices)
        report = await self.ocs.CheckInvariants(ocs.CheckInvariantsRequest())
        assert report.ok, report
        topo = await self.tree.stub("sub-2").GetTopology(agg.GetTopologyRequest())
        assert [n.id for n in topo.nodes] == [n.id for n in stack_tree()]

    async def calls_while_redis_is_away(self) -> list[grpc.StatusCode]:
        """A write to each service and a read, at once, while redis-server is away. A
        read may be served from what a service holds; a write that was acknowledged
        after all (Redis came back during its retries) is kept in mind: it must then
        be there."""
        self.away += 1
        rid = f"r-away-{self.away}"
        codes = await asyncio.gather(
            code_of(
                self.broker_once.Reserve(
                    cb.ReserveRequest(
                        request=cb.ReservationRequest(
                            reservation_id=rid, cores=2, duration=dur(3600)
                        )
                    ),
                    metadata=self.app_md,
                )
            ),
            code_of(self.ocs.WireSlice(wire_request("job-away", [2, 1, 1], [6, 7]))),
            code_of(self.agg_once.GetTopology(agg.GetTopologyRequest())),
        )
        if codes[0] == grpc.StatusCode.OK:
            self.reservations.append(rid)
        else:
            self.unsettled[rid] = lambda: self.reserve(rid)
        if codes[1] == grpc.StatusCode.OK:
            self.slices.add("job-away")
            self.unsettled.pop("job-away", None)
        elif "job-away" not in self.slices:
            self.unsettled["job-away"] = lambda: self.wire("job-away", [6, 7])
        return list(codes)


@contextlib.asynccontextmanager
async def three_services(redis_url: str):
    async with (
        running_broker(redis_url) as broker,
        serve("ocs_manager", redis_url, fabric_env(blocks=8)) as ocs_svc,
        channel(ocs_svc.address, max_attempts=1) as ocs_ch,
        agg_tree(redis_url) as tree,
        channel(broker.address, max_attempts=1) as broker_ch,
        channel(tree.address(), max_attempts=1) as agg_ch,
    ):
        for i in range(8):
            await broker.device(f"gpu-{i}", 8)
        app_md = await broker.app("restart-app")
        await tree.define(stack_tree(sub_ms=2000, root_ms=6000))
        yield (
            Services(
                broker,
                app_md,
                ocs_manager_pb2_grpc.OcsManagerStub(ocs_ch),
                tree,
                {"broker": broker_ch, "agg": agg_ch},
            ),
            {"broker": broker.address, "ocs": ocs_svc.address, "agg": tree.address()},
        )


async def test_broker_ocs_manager_and_agg_switch_recover_from_redis_restarts(restartable_redis):
    server = restartable_redis
    async with three_services(server.url) as (svc, addresses):
        await svc.work("before", [0, 1])

        # 1. Redis away for longer than the clients retry: calls meanwhile are UNAVAILABLE.
        with HealthLog(addresses["broker"]) as broker_health:
            await asyncio.sleep(0.1)
            # Redis stays away until the calls have answered (however slow a loaded
            # machine makes them), then longer than the clients retry.
            await asyncio.to_thread(server.stop)
            away = await svc.calls_while_redis_is_away()
            await restart(server, down_s=DOWN_S)
            assert away[:2] == [grpc.StatusCode.UNAVAILABLE] * 2, away
            assert not SERVER_ERRORS & set(away), away
            await wait_for(lambda: _now(broker_health.seen[-1] == SERVING), "broker SERVING")
        assert broker_health.seen[0] == SERVING and NOT_SERVING in broker_health.seen
        await svc.everything_acknowledged_is_there()
        await svc.work("after", [2, 3])
        await svc.everything_acknowledged_is_there()

        # 2. Restarted over a large AOF: LOADING for seconds; no call is a server error.
        await asyncio.to_thread(fill, server.port)
        with HealthLog(addresses["broker"]) as broker_health:
            restarting = asyncio.ensure_future(restart(server, down_s=0, copies=FILLER_COPIES))
            seen: list[grpc.StatusCode] = []
            while not restarting.done():
                seen += await svc.calls_while_redis_is_away()
                await asyncio.sleep(0.2)
            heard = await restarting
            assert "LOADING" in heard, heard
            assert not SERVER_ERRORS & set(seen), seen
            assert grpc.StatusCode.UNAVAILABLE in seen, seen
            await wait_for(lambda: _now(broker_health.seen[-1] == SERVING), "broker SERVING")
        for address in addresses.values():
            with HealthLog(address) as health:
                await wait_for(lambda h=health: _now(h.seen[-1:] == [SERVING]), address)
        await svc.everything_acknowledged_is_there()
        await svc.work("after-loading", [4, 5])
        await svc.everything_acknowledged_is_there()


async def _now(value):
    return value
