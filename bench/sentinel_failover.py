"""Acknowledged writes lost across Redis Sentinel failovers, with and without commits
waiting for a replica, and what the waiting costs per commit (issue 32).

    python3 dev.py bench sentinel_failover [--failovers 20] [--baseline 3] [--commits 2000]

A primary, two replicas and three sentinels on loopback (tests/redis_topologies.py);
a cell with one pod and a core broker on them (in this process, mTLS), clients
submitting and completing jobs and making and releasing reservations the whole time
(tests/failover_history.py). Each failover pauses the master (SIGSTOP) until the
sentinels have promoted a replica, resumes it, and waits until they have made it a
replica of the new master. Afterwards every acknowledged step is checked against what
the services show.

- `failovers` with LIGHTPATH_REDIS_COMMIT_REPLICAS=1: `failover_lost` must be 0;
- `failovers_without_wait` (default 3) with it 0: `lost_without_wait`, the baseline;
- `commit_p50_ms`/`commit_p99_ms` (no WAIT) and `commit_wait_p50_ms`/`commit_wait_p99_ms`
  (WAIT 1) of one transaction (lightpath_services.common.txn, one HSET), alternated on one
  client of the same Sentinel set before any failover, and their p50 ratio.

Prints one JSON line, with the machine's load. `measure(failovers)` is the same as a
function (bench/partitions.py takes its `failovers` and `failover_lost`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from _common import emit, percentile

from lightpath_services.cell_scheduler.store import PROGRAM
from lightpath_services.common import redis_store
from lightpath_services.common.txn import Durability, Txn, require_replicas
from tests.failover_history import durability_env, failovers_under_load, rig
from tests.redis_topologies import redis_sentinel, with_password

COMMIT_REPLICAS = 1  # of the two: the setting docs/operations.md recommends


async def _commit_latency(url: str, commits: int) -> dict[str, float]:
    plain_client = redis_store.connect(url)
    wait_client = require_replicas(redis_store.connect(url), Durability(COMMIT_REPLICAS, 1000))
    try:
        await redis_store.wait_ready(plain_client)
        await redis_store.wait_ready(wait_client)
        scripts = {"plain": PROGRAM.bind(plain_client), "wait": PROGRAM.bind(wait_client)}
        times: dict[str, list[float]] = {"plain": [], "wait": []}
        for i in range(commits * 2):
            which = "plain" if i % 2 else "wait"
            t = Txn()
            t.hset(f"lp:{{bench}}:k{i % 64}", {"n": i})
            start = time.perf_counter()
            await scripts[which].commit(t)
            times[which].append((time.perf_counter() - start) * 1000)
    finally:
        await plain_client.aclose()
        await wait_client.aclose()
    p50, p50w = percentile(times["plain"], 50), percentile(times["wait"], 50)
    return {
        "commit_p50_ms": p50,
        "commit_p99_ms": percentile(times["plain"], 99),
        "commit_wait_p50_ms": p50w,
        "commit_wait_p99_ms": percentile(times["wait"], 99),
        "wait_cost_p50_ratio": p50w / p50,
        "commits": commits,
    }


async def _failovers(directory: Path, count: int, replicas: int) -> dict[str, int]:
    async with rig(directory, durability_env(replicas)) as r:
        history, loss = await failovers_under_load(r, count)
    return {
        "acknowledged": history.acknowledged,
        "unacknowledged": history.unacknowledged,
        "lost": loss.count,
        "lost_jobs": len(loss.jobs),
        "lost_reservations": len(loss.reservations),
    }


async def _measure(failovers: int, baseline: int, commits: int) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lightpath-bench-sentinel-") as tmp:
        with redis_sentinel(Path(tmp) / "latency", replicas=2) as sentinel:
            latency = await _commit_latency(with_password(sentinel.url), commits)
        durable = await _failovers(Path(tmp) / "durable", failovers, COMMIT_REPLICAS)
        plain = await _failovers(Path(tmp) / "plain", baseline, 0) if baseline else None
    result = {
        "failovers": failovers,
        "failover_lost": durable["lost"],
        "failover_lost_jobs": durable["lost_jobs"],
        "failover_lost_reservations": durable["lost_reservations"],
        "failover_acknowledged": durable["acknowledged"],
        "failover_unacknowledged": durable["unacknowledged"],
        "commit_replicas": COMMIT_REPLICAS,
        "replicas": 2,
        "failovers_without_wait": baseline,
        **latency,
        "seconds": time.monotonic() - started,
        "load": list(os.getloadavg()),
    }
    if plain is not None:
        result |= {
            "lost_without_wait": plain["lost"],
            "acknowledged_without_wait": plain["acknowledged"],
        }
    return result


def measure(failovers: int, *, baseline: int = 3, commits: int = 2000) -> dict:
    """`failovers` Sentinel failovers under load with commits waiting for a replica
    (`failover_lost`), `baseline` without (`lost_without_wait`), and the per-commit
    latency with and without WAIT. Runs its own event loop: call it from outside one."""
    return asyncio.run(_measure(failovers, baseline, commits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--baseline", type=int, default=3, help="failovers without WAIT")
    parser.add_argument("--commits", type=int, default=2000, help="per latency column")
    args = parser.parse_args()
    emit(measure(args.failovers, baseline=args.baseline, commits=args.commits))


if __name__ == "__main__":
    main()
