"""X-4: a Redis restart is survived — the client reconnects by itself and AOF
keeps what was written."""

from __future__ import annotations

import asyncio

from lightpath.embedded_redis import EmbeddedRedis
from lightpath_services.common import redis_store
from lightpath_services.common.keys import pod_key


async def test_client_survives_a_redis_restart_and_aof_keeps_the_data(tmp_path):
    server = EmbeddedRedis(tmp_path, appendonly=True)
    server.start()
    client = redis_store.connect(server.url)
    try:
        key = pod_key("pod-1", "block", 7)
        await client.hset(key, mapping={"health": "HEALTHY", "job": "job-1"})
        await client.execute_command("BGREWRITEAOF")  # nothing pending when it stops
        port = server.port
        server.stop()
        # a call made while Redis is down waits through the client's backoff …
        pending = asyncio.create_task(client.hgetall(key))
        await asyncio.sleep(0.05)
        assert not pending.done()
        restarted = EmbeddedRedis(tmp_path, port=port, appendonly=True)
        restarted.start()
        try:
            # … and succeeds on the same client once Redis is back, with the AOF's data
            assert await pending == {"health": "HEALTHY", "job": "job-1"}
            assert await client.hset(key, "job", "job-2") == 0
        finally:
            await client.aclose()
            restarted.stop()
    finally:
        server.stop()
