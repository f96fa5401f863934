"""Folded versus one process per component: the seed's Fig. 2A graph (GF-7).

    python3 dev.py bench folding [--records 1000000] [--repeat 3]

Runs the Fig. 2A graph (lightpath.graph.examples.fig2a: filters, reformats,
a replicate, a hash rollup, an interface piping through `tr`, a gather and a
sort) over the same input, folded (3 processes) and one process per component
(10 processes, buffered channels between them), alternating, `--repeat` times
each, and prints the median run of each mode:

- records: input records per run;
- *_records_per_s: input records / wall time of the run, start-up included;
- *_processes: processes the run started (the interface's `tr` not counted);
- *_startup_s: from the first process started to the last one ready;
- *_peak_mb: peak RSS of the run's processes, summed (the graph's footprint);
- speedup: folded / unfolded records per second; target >= 3 with <= 1/3 of
  the processes.

Also: CPU seconds of each mode (and their ratio), wall seconds, the CPU
seconds of each folded process (the busiest one is the folded run's
critical path: the whole graph waits for it, then for the sort's shutdown),
and whether the outputs of the two modes were byte-identical.

Both modes run the same executor and component code: members that take
batches (`Component.compute_batch`) get one call per batch, folded (a direct
call from the member upstream) or not (a call per channel frame).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit
from lightpath.graph.examples import fig2a, write_records
from lightpath.graph.runner import run_graph


def _run(data: Path, out: Path, run_dir: Path, *, folded: bool, batch: int) -> dict:
    result = run_graph(
        fig2a(data, out), folded=folded, run_dir=run_dir, channel_batch=batch, run_id="bench"
    )
    m = result.metrics
    return {
        "records_per_s": m.records_read / m.wall_seconds,
        "wall_s": m.wall_seconds,
        "processes": len(m.processes),
        "startup_s": m.startup_seconds,
        "peak_mb": m.peak_rss_mb,
        "cpu_s": sum(p.cpu_seconds for p in m.processes),
        "process_cpu_s": {f"{p.folded_set}.{p.instance}": p.cpu_seconds for p in m.processes},
        "records": m.records_read,
    }


def _median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    return ordered[len(ordered) // 2]


def _compare(tmp: Path, data: Path, repeat: int, batch: int, tag: str) -> tuple[dict, dict, bool]:
    """Median run of each mode, alternating folded and unfolded so both see the same load."""
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for i in range(repeat):
        for folded in (True, False):
            mode = "folded" if folded else "unfolded"
            runs[folded].append(
                _run(
                    data,
                    tmp / f"{tag}-{mode}",
                    tmp / f"{tag}-run-{mode}-{i}",
                    folded=folded,
                    batch=batch,
                )
            )
    same = all(
        (tmp / f"{tag}-folded" / name).read_bytes() == (tmp / f"{tag}-unfolded" / name).read_bytes()
        for name in ("206A.tsv", "206B.tsv", "206C.tsv")
    )
    return _median_run(runs[True]), _median_run(runs[False]), same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1024, help="records per channel frame")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lightpath-folding-") as tmpdir:
        tmp = Path(tmpdir)
        data = tmp / "202.tsv"
        write_records(data, args.records)
        started = time.perf_counter()
        folded, unfolded, same = _compare(tmp, data, args.repeat, args.batch, "buffered")
        emit(
            {
                "records": folded["records"],
                "folded_records_per_s": folded["records_per_s"],
                "unfolded_records_per_s": unfolded["records_per_s"],
                "speedup": folded["records_per_s"] / unfolded["records_per_s"],
                "folded_processes": folded["processes"],
                "unfolded_processes": unfolded["processes"],
                "folded_startup_s": folded["startup_s"],
                "unfolded_startup_s": unfolded["startup_s"],
                "folded_peak_mb": folded["peak_mb"],
                "unfolded_peak_mb": unfolded["peak_mb"],
                "folded_cpu_s": folded["cpu_s"],
                "unfolded_cpu_s": unfolded["cpu_s"],
                "cpu_ratio": unfolded["cpu_s"] / folded["cpu_s"],
                "folded_wall_s": folded["wall_s"],
                "folded_process_cpu_s": folded["process_cpu_s"],
                "unfolded_wall_s": unfolded["wall_s"],
                "channel_batch": args.batch,
                "repeat": args.repeat,
                "outputs_identical": same,
                "bench_s": time.perf_counter() - started,
            }
        )


if __name__ == "__main__":
    main()
