"""A peer that comes back after an outage is reached again soon, however long it was away
(lightpath.client: MAX_RECONNECT_BACKOFF_MS). gRPC's own reconnect backoff grows to 120 s:
every Lightpath channel (cell to pods, scheduler to ocs_manager, ocs_manager to switch
agents, the CLI and SDK) would otherwise fail its calls fast for seconds to minutes after
the peer was back."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lightpath.client import MAX_RECONNECT_BACKOFF_MS, channel
from lightpath.embedded_redis import free_port
from tests.helpers import serve

pytestmark = pytest.mark.slow  # waits out an outage: handed out first

# Down this long, a channel on gRPC's defaults (1 s, x1.6 each time, 20 % jitter) has its
# next attempt some 10 s after the peer is back (attempts near 9.3, 15.8 and 26.3 s);
# with the bound, within 2.4 s.
OUTAGE_S = 17.0
BACK_WITHIN_S = MAX_RECONNECT_BACKOFF_MS / 1000 * 1.2 + 3.0  # a bound on waiting


async def test_a_service_back_after_an_outage_is_reached_again_within_the_bound(redis_url):
    address = f"127.0.0.1:{free_port()}"
    env = {"LIGHTPATH_LISTEN": address}
    ask = health_pb2.HealthCheckRequest()
    async with channel(address, max_attempts=1) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        async with serve("cell_scheduler", redis_url, env, grace=None):
            assert (await health.Check(ask)).status == health_pb2.HealthCheckResponse.SERVING
        loop = asyncio.get_running_loop()
        gone = loop.time()
        refused = 0
        while loop.time() - gone < OUTAGE_S:  # callers keep asking while it is down
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health.Check(ask, timeout=0.5)
            assert err.value.code() in {
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
            }, err.value
            refused += 1
            await asyncio.sleep(0.25)
        assert refused > 10
        async with serve("cell_scheduler", redis_url, env, grace=None):
            # waits for the channel to connect (or the deadline): on gRPC's defaults the
            # next attempt would come too late
            answer = await health.Check(ask, wait_for_ready=True, timeout=BACK_WITHIN_S)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
