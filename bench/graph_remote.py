"""A graph run over gRPC on the core broker against the same run here (issue 19): one JSON line.

    python3 dev.py bench graph_remote [--records 200000] [--reps 3]

Seed Fig. 3A (a 2-way input through filter, reformat and sort into a 2-way
output), --records records per partition. Alternately, --reps times each:

* local_s: `lightpath.graph.runner.run_graph` in this process's host, as the
  SDK runs it;
* broker_s: RunGraph on a core broker process (mTLS, its own Redis, the
  graph reserved first) until GetGraphRun says SUCCEEDED, asked every 20 ms:
  what a client of any language waits. broker_overhead_s = broker_s - local_s
  (medians): the reservation check, the run's record, its heartbeat, the
  metrics kept, and the polling.

The broker runs as deployed (`python -m lightpath_services.core_broker`, its own
certificate); the bench calls as a registered application (its token over
TLS with the operator's certificate, as `lightpath graph` does).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from _common import bench_ca, emit, operator_credentials, private_redis, start_service

DEGREE = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per partition")
    parser.add_argument("--reps", type=int, default=3, help="runs of each kind")
    args = parser.parse_args()

    from lightpath.graph.examples import write_records
    from lightpath.security.identity import service_principal

    with tempfile.TemporaryDirectory(prefix="lightpath-bench-") as tmp, private_redis() as url:
        work = Path(tmp)
        data = work / "data"
        data.mkdir()
        for part in range(DEGREE):
            write_records(data / f"in.{part}", args.records, seed=part)
        ca = bench_ca(work / "pki")
        operator = operator_credentials(ca)
        proc, address = start_service(
            "core_broker",
            service_principal("core_broker"),
            ca,
            operator,
            work,
            {
                "LIGHTPATH_REDIS_URL": url,
                "LIGHTPATH_CB_GRAPH_DATA_DIR": str(data),
                "LIGHTPATH_CB_GRAPH_RUN_DIR": str(work / "runs"),
            },
        )
        try:
            local, remote = asyncio.run(run(args, address, operator, data, work))
        finally:
            proc.terminate()
            proc.wait(10)

    emit(
        {
            "bench": "graph_remote",
            "records": args.records * DEGREE,
            "processes": DEGREE,
            "reps": args.reps,
            "local_s": statistics.median(local),
            "broker_s": statistics.median(remote),
            "broker_overhead_s": statistics.median(remote) - statistics.median(local),
            "local_runs_s": local,
            "broker_runs_s": remote,
        }
    )


async def run(args, address: str, operator, data: Path, work: Path):
    from lightpath.graph.examples import fig3a
    from lightpath.graph.runner import run_graph
    from lightpath.sdk.cores import AsyncCores
    from lightpath.v1 import core_broker_pb2 as pb

    async with AsyncCores(address, credentials=operator) as op:
        await op.register_device(pb.Device(device_id="npu-1", kind=pb.DEVICE_KIND_NPU, cores=64))
        token = (await op.register_application("bench-graphs")).token
    spec = fig3a("in.{part}", "out.{part}", DEGREE)
    local_spec = fig3a(str(data / "in.{part}"), str(work / "local-out.{part}"), DEGREE)
    local: list[float] = []
    remote: list[float] = []
    async with AsyncCores(address, credentials=operator.with_token(token)) as cores:
        for i in range(args.reps):
            t0 = time.perf_counter()
            await asyncio.to_thread(run_graph, local_spec, run_dir=work / f"local-{i}")
            local.append(time.perf_counter() - t0)

            await cores.reserve_graph(spec, f"g-{i}", cores=1, duration=3600)
            t0 = time.perf_counter()
            await cores.run_graph(spec, f"run-{i}", f"g-{i}")
            while True:
                done = await cores.graph_run(f"run-{i}")
                if done.state != pb.GRAPH_RUN_STATE_RUNNING:
                    break
                await asyncio.sleep(0.02)
            remote.append(time.perf_counter() - t0)
            if done.state != pb.GRAPH_RUN_STATE_SUCCEEDED:
                raise SystemExit(f"run-{i} ended {done.state}: {done.failure}")
    return local, remote


if __name__ == "__main__":
    main()
