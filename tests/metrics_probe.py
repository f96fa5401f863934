"""A service with its Prometheus endpoint on, in a process of its own (tests/common/test_metrics.py).

    python -m tests.metrics_probe REDIS_URL

installs the global MeterProvider as a service's `main` does (the registry of
prometheus_client is per process, so each probe needs its own), serves
core_broker in-process on ephemeral ports (plaintext: callers authenticate by
bearer token) with LIGHTPATH_METRICS_LISTEN=127.0.0.1:0, and supervises one
extra background task that fails, with a Redis error, whenever the Redis key
`metrics-probe:fail` is set. It prints {"grpc": ..., "metrics": ...} on one
line and serves until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys

from lightpath.telemetry import configure_metrics
from tests.helpers import serve

FAIL_KEY = "metrics-probe:fail"
TASK = "metrics probe"


async def main(redis_url: str) -> None:
    configure_metrics("lightpath-core_broker", exporter="none", prometheus=True)
    env = {"LIGHTPATH_METRICS_LISTEN": "127.0.0.1:0", "LIGHTPATH_PLAINTEXT": "true"}
    async with serve("core_broker", redis_url, env) as svc:
        redis = svc.runtime.redis

        async def flaky() -> None:
            while True:
                if await redis.get(FAIL_KEY):
                    await redis.execute_command("LIGHTPATH.NO.SUCH.COMMAND")  # ResponseError
                await asyncio.sleep(0.05)

        svc.runtime.supervise(flaky, TASK, needed=False)
        assert svc.metrics is not None
        print(json.dumps({"grpc": svc.address, "metrics": svc.metrics.url}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
