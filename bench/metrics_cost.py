#!/usr/bin/env python3
"""What the Prometheus metrics cost (issue 18): the cell_scheduler bench's load (8
clients, submit+complete pairs through the cell and directly to pod-1's workload
scheduler, two superpods of 64 blocks, mTLS) with every process's scrape endpoint on
(LIGHTPATH_METRICS_LISTEN, scraped every --scrape-every s: 15 s, the interval
deploy/monitoring's Prometheus configuration uses) and off, in one run: stacks in the
order on, off, off, on, on, off, so neither always goes first and drift over the run
falls on both alike.

    python3 dev.py bench metrics_cost [--seconds 60] [--clients 8] [--rounds 2] [--scrape-every 15]

Prints one JSON line: cell_per_s, direct_per_s, their p50/p99 ms and CPU ms per pair
with metrics on ("on") and off ("off"), and metrics_cost_cell_throughput,
metrics_cost_direct_throughput (1 - on / off; the issue's goal is <= 0.05), and
metrics_cost_cell_cpu, metrics_cost_direct_cpu: the CPU time of every process of
the stack per pair, summed, on against off (on / off - 1). On a shared machine
the throughput swings with other work by more than the metrics cost; the CPU a
pair takes is what the metrics add to each process, and varies far less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import urllib.request
from dataclasses import replace

import cell_scheduler as cell_bench
from _common import emit, private_stack, stack_pids

from lightpath.embedded_redis import free_port

ORDER = ("on", "off", "off", "on", "on", "off")


def specs(metrics: bool):
    out = cell_bench.specs()
    return [replace(s, metrics_port=free_port()) for s in out] if metrics else out


@contextlib.contextmanager
def scraping(urls: list[str], every_s: float = 1.0):
    """GET every endpoint once a second in a thread while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            for url in urls:
                with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
                    r.read()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def cost(on: float, off: float) -> float:
    """The share of the throughput the metrics cost: 1 - on / off (negative: faster)."""
    return 1.0 - on / off if off else float("nan")


def cpu_cost(on: dict[str, float], off: dict[str, float]) -> float:
    """The CPU the metrics add to a pair, over every process: sum(on) / sum(off) - 1."""
    total_off = sum(off.values())
    return sum(on.values()) / total_off - 1.0 if total_off else float("nan")


def run(seconds: float, clients: int, rounds: int, scrape_every: float) -> dict:
    phases = {mode: cell_bench.Phases() for mode in ("on", "off")}
    per_segment = seconds / ORDER.count("on")
    for i, mode in enumerate(ORDER):
        with private_stack(specs(mode == "on"), tls=True) as stack:
            pids = stack_pids(stack, stack.redis_url)
            with scraping(list(stack.metrics_endpoints.values()), scrape_every):
                asyncio.run(
                    cell_bench.segment(
                        stack,
                        phases[mode],
                        pids,
                        seconds=per_segment,
                        clients=clients,
                        rounds=rounds,
                        tag=f"m{i}",
                    )
                )
    common = {
        "clients": clients,
        "seconds": seconds,
        "rounds": rounds * ORDER.count("on"),
        "scrape_every_s": scrape_every,
    }
    on = {**phases["on"].summary(), **common}
    off = {**phases["off"].summary(), **common}
    return {
        "on": on,
        "off": off,
        "cell_per_s_on": on["cell_per_s"],
        "cell_per_s_off": off["cell_per_s"],
        "direct_per_s_on": on["direct_per_s"],
        "direct_per_s_off": off["direct_per_s"],
        "metrics_cost_cell_throughput": cost(on["cell_per_s"], off["cell_per_s"]),
        "metrics_cost_direct_throughput": cost(on["direct_per_s"], off["direct_per_s"]),
        "metrics_cost_cell_cpu": cpu_cost(on["cell_cpu_ms_per_pair"], off["cell_cpu_ms_per_pair"]),
        "metrics_cost_direct_cpu": cpu_cost(
            on["direct_cpu_ms_per_pair"], off["direct_cpu_ms_per_pair"]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="recorded s per mode")
    parser.add_argument(
        "--scrape-every", type=float, default=15.0, help="seconds between scrapes of each endpoint"
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    emit(run(args.seconds, args.clients, args.rounds, args.scrape_every))


if __name__ == "__main__":
    main()
