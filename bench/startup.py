#!/usr/bin/env python3
"""What a process spends on imports before it can serve (issue 31: the test suite starts
a few hundred service and CLI processes, each paying this first).

    python3 dev.py bench startup [--baseline DIR] [--rounds 7]

For each service's `__main__` and the CLI's entry point (`lightpath.cli`), the user +
system CPU of a fresh `python -c "import X"` from this tree, and with `--baseline DIR`
(another checkout, e.g. `git worktree add /tmp/base main`) from that tree in the same
run, interleaved round by round so both see the same load. The bytecode of both trees is
compiled first (a warm-up round not counted), as the suite's processes find it.

Prints one JSON line: per module `cpu_ms` (median over the rounds) and, with a baseline,
`baseline_cpu_ms` and `ratio` (this ÷ baseline); `python_ms` (an empty `python -c pass`,
the floor); `total_cpu_ms` / `baseline_total_cpu_ms` over the modules; `rounds`, `cores`
and the 1-minute load before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _common import emit, source_path

ROOT = Path(__file__).resolve().parent.parent
MODULES = [
    *(
        f"lightpath_services.{name}.__main__"
        for name in (
            "agg_switch",
            "cell_scheduler",
            "console",
            "core_broker",
            "ocs_manager",
            "switch_agent",
            "workload_scheduler",
        )
    ),
    "lightpath.cli",
]


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def cpu_ms(statement: str, root: Path) -> float:
    """User + system CPU (ms) of one fresh interpreter running `statement` from `root`."""
    env = {**os.environ, "PYTHONPATH": source_path(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # the suite's processes use cached bytecode
    child = subprocess.Popen([sys.executable, "-c", statement], cwd=root, env=env)
    _, status, used = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"`python -c {statement!r}` failed in {root} (status {status})")
    return (used.ru_utime + used.ru_stime) * 1000


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    statements = {"python": "pass", **{m: f"import {m}" for m in MODULES}}
    load_before = _load()
    for root in trees.values():  # warm-up: compile both trees' bytecode
        for statement in statements.values():
            cpu_ms(statement, root)
    samples: dict[str, dict[str, list[float]]] = {t: {s: [] for s in statements} for t in trees}
    for _ in range(args.rounds):
        for name, statement in statements.items():
            for tree, root in trees.items():
                samples[tree][name].append(cpu_ms(statement, root))
    median = {t: {s: statistics.median(xs) for s, xs in by.items()} for t, by in samples.items()}
    modules: dict[str, dict[str, float]] = {}
    for m in MODULES:
        row = {"cpu_ms": median["this"][m]}
        if "baseline" in median:
            row["baseline_cpu_ms"] = median["baseline"][m]
            row["ratio"] = median["this"][m] / median["baseline"][m]
        modules[m] = row
    result: dict = {
        "modules": modules,
        "python_ms": median["this"]["python"],
        "total_cpu_ms": sum(median["this"][m] for m in MODULES),
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": _load(),
    }
    if "baseline" in median:
        result["baseline_total_cpu_ms"] = sum(median["baseline"][m] for m in MODULES)
        result["baseline"] = str(trees["baseline"])
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
