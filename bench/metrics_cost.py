#!/usr/bin/env python3
"""What the Prometheus metrics cost (issue 18): the cell_scheduler bench's load (8
clients, submit+complete pairs through the cell and directly to pod-1's workload
scheduler, two superpods of 64 blocks, mTLS) with every process's scrape endpoint on
(LIGHTPATH_METRICS_LISTEN, scraped every --scrape-every s: 15 s, the interval
deploy/monitoring's Prometheus configuration uses) and off, in one run: stacks in the
order on, off, off, on, on, off, so neither always goes first and drift over the run
falls on both alike.

    python3 dev.py bench metrics_cost [--seconds 60] [--clients 8] [--rounds 2] [--scrape-every 15] [--together]

With --together the two stacks run at the same time instead, each with its own
clients in a process of its own, three times (--seconds / 3 s each): whatever
else the machine is doing then weighs on both alike, which a shared machine's
load, changing from one minute to the next, does not do to stacks run in turn.

Prints one JSON line: cell_per_s, direct_per_s, their p50/p99 ms and CPU ms per pair
with metrics on ("on") and off ("off"), and metrics_cost_cell_throughput,
metrics_cost_direct_throughput (1 - on / off; the issue's goal is <= 0.05), and
metrics_cost_cell_cpu, metrics_cost_direct_cpu: the CPU time of every process of
the stack per pair, summed, on against off (on / off - 1); "method" ("in turn" or
"together") and the machine's load average at the start and end ("load").
On a shared machine the throughput swings with other work by more than the
metrics cost; the CPU a pair takes is what the metrics add to each process, and
varies far less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
from dataclasses import replace
from pathlib import Path

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


def one_stack(
    mode: str,
    phases: cell_bench.Phases,
    *,
    seconds: float,
    clients: int,
    rounds: int,
    scrape_every: float,
    tag: str,
) -> None:
    """One stack, metrics `mode` ("on" or "off"), measured for `seconds` into `phases`."""
    with private_stack(specs(mode == "on"), tls=True) as stack:
        pids = stack_pids(stack, stack.redis_url)
        with scraping(list(stack.metrics_endpoints.values()), scrape_every):
            asyncio.run(
                cell_bench.segment(
                    stack,
                    phases,
                    pids,
                    seconds=seconds,
                    clients=clients,
                    rounds=rounds,
                    tag=tag,
                )
            )


def in_turn(
    seconds: float, clients: int, rounds: int, scrape_every: float
) -> dict[str, cell_bench.Phases]:
    """The stacks one at a time, in ORDER."""
    phases = {mode: cell_bench.Phases() for mode in ("on", "off")}
    per_segment = seconds / ORDER.count("on")
    for i, mode in enumerate(ORDER):
        one_stack(
            mode,
            phases[mode],
            seconds=per_segment,
            clients=clients,
            rounds=rounds,
            scrape_every=scrape_every,
            tag=f"m{i}",
        )
    return phases


def together(
    seconds: float, clients: int, rounds: int, scrape_every: float
) -> dict[str, cell_bench.Phases]:
    """An on and an off stack at the same time (each with its clients in a child
    process running `--segment`), ORDER.count("on") times."""
    phases = {mode: cell_bench.Phases() for mode in ("on", "off")}
    times = ORDER.count("on")
    for i in range(times):
        for attempt in range(3):
            parts = _side_by_side(
                seconds / times, clients, rounds, scrape_every, tag=f"t{i}.{attempt}"
            )
            if parts is not None:
                break
        else:
            raise SystemExit("the on and off stacks failed to run side by side three times")
        for mode, part in parts.items():
            ph = phases[mode]
            ph.direct_rounds += part["direct_rounds"]
            ph.cell_rounds += part["cell_rounds"]
            for k, v in part["direct_cpu"].items():
                ph.direct_cpu[k] += v
            for k, v in part["cell_cpu"].items():
                ph.cell_cpu[k] += v
    return phases


def _side_by_side(
    seconds: float, clients: int, rounds: int, scrape_every: float, *, tag: str
) -> dict[str, dict] | None:
    """Both stacks at once, each run by a child process (`--segment`): their raw
    figures, or None when either failed (two stacks picking free ports at the same
    time can pick the same one; the round is then run again)."""
    children = {
        mode: subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--segment",
                mode,
                "--seconds",
                str(seconds),
                "--clients",
                str(clients),
                "--rounds",
                str(rounds),
                "--scrape-every",
                str(scrape_every),
                "--tag",
                f"{tag}{mode}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for mode in ("on", "off")
    }
    parts = {}
    for mode, child in children.items():
        out, _ = child.communicate()
        if child.returncode == 0:
            parts[mode] = json.loads(out.strip().splitlines()[-1])
        else:
            print(f"the {mode} stack's run failed (exit {child.returncode})", file=sys.stderr)
    return parts if len(parts) == len(children) else None


def segment_json(phases: cell_bench.Phases) -> str:
    """What a `--segment` child prints for its parent: its rounds and CPU seconds."""
    return json.dumps(
        {
            "direct_rounds": phases.direct_rounds,
            "cell_rounds": phases.cell_rounds,
            "direct_cpu": dict(phases.direct_cpu),
            "cell_cpu": dict(phases.cell_cpu),
        }
    )


def run(
    seconds: float, clients: int, rounds: int, scrape_every: float, *, at_once: bool = False
) -> dict:
    load = [round(x, 2) for x in os.getloadavg()]
    phases = (together if at_once else in_turn)(seconds, clients, rounds, scrape_every)
    common = {
        "clients": clients,
        "seconds": seconds,
        "rounds": rounds * ORDER.count("on"),
        "scrape_every_s": scrape_every,
    }
    on = {**phases["on"].summary(), **common}
    off = {**phases["off"].summary(), **common}
    return {
        "method": "together" if at_once else "in turn",
        "load": {"start": load, "end": [round(x, 2) for x in os.getloadavg()]},
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
    parser.add_argument(
        "--together", action="store_true", help="run the on and off stacks at the same time"
    )
    parser.add_argument("--segment", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="s", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.segment:  # a child of --together: one stack, its raw figures on stdout
        phases = cell_bench.Phases()
        one_stack(
            args.segment,
            phases,
            seconds=args.seconds,
            clients=args.clients,
            rounds=args.rounds,
            scrape_every=args.scrape_every,
            tag=args.tag,
        )
        print(segment_json(phases), flush=True)
        return
    emit(run(args.seconds, args.clients, args.rounds, args.scrape_every, at_once=args.together))


if __name__ == "__main__":
    main()
