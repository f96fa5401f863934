#!/usr/bin/env python3
"""What the wire walk before parsing costs (issue 30): `lightpath.limits.count_check`
on legal requests (a typical AdmitJob and WireSlice, the calls every job makes, and a
WireSlice of 4,096 blocks, a large legal one) and on floods it refuses (a million
entries at the top level, 300,000 one level down), each beside what parsing the same
bytes costs (`FromString`), in one run.

    python3 dev.py bench limits_walk [--number 20000]

Prints one JSON line: for each request `<name>_walk_ns` and `<name>_parse_ns` (the
best of five timeit repeats, per call), `<name>_bytes`, and the machine's load.
Services walk only requests of at least `limits.PRESCAN_ABOVE` bytes; the typical
ones are timed here so a change to the walk shows on them too.
"""

from __future__ import annotations

import argparse
import os
import timeit

from _common import emit

from lightpath import limits
from lightpath.v1 import common_pb2, ocs_manager_pb2, workload_scheduler_pb2


def admit() -> workload_scheduler_pb2.AdmitJobRequest:
    spec = workload_scheduler_pb2.JobSpec(
        job_id="train-llm-0042",
        shape=common_pb2.Shape(dims=[8, 8, 4]),
        priority=50,
        labels={"tenant": "acme", "user": "ada", "team": "pretraining"},
    )
    return workload_scheduler_pb2.AdmitJobRequest(spec=spec, forward_token=17)


def wire(edge: tuple[int, int, int]) -> ocs_manager_pb2.WireSliceRequest:
    a, b, c = edge
    blocks = [
        ocs_manager_pb2.BlockPlacement(
            position=common_pb2.Coordinate(coords=[x, y, z]), block_id=(x * b + y) * c + z
        )
        for x in range(a)
        for y in range(b)
        for z in range(c)
    ]
    return ocs_manager_pb2.WireSliceRequest(
        job_id="train-llm-0042",
        grid=common_pb2.Shape(dims=list(edge)),
        blocks=blocks,
        lease_token=3,
        lease_id="train-llm-0042",
    )


def floods() -> dict[str, tuple[object, bytes]]:
    top = ocs_manager_pb2.WireSliceRequest(job_id="j")
    top.blocks.extend([ocs_manager_pb2.BlockPlacement()] * 1_000_000)
    # one level down: a spec whose node types are 300,000 empty strings
    nested = workload_scheduler_pb2.JobSpec(job_id="j")
    nested.node_types.extend([""] * 300_000)
    down = workload_scheduler_pb2.AdmitJobRequest(spec=nested)
    return {
        "wire_flood": (ocs_manager_pb2.WireSliceRequest, top.SerializeToString()),
        "admit_nested_flood": (workload_scheduler_pb2.AdmitJobRequest, down.SerializeToString()),
    }


def best_ns(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--number", type=int, default=20_000, help="calls per timeit repeat")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    cases: dict[str, tuple[object, bytes]] = {
        "admit": (workload_scheduler_pb2.AdmitJobRequest, admit().SerializeToString()),
        "wire": (ocs_manager_pb2.WireSliceRequest, wire((2, 2, 1)).SerializeToString()),
        "wire_4096": (ocs_manager_pb2.WireSliceRequest, wire((16, 16, 16)).SerializeToString()),
        **floods(),
    }
    out: dict[str, object] = {}
    for name, (cls, raw) in cases.items():
        descriptor = cls.DESCRIPTOR  # type: ignore[attr-defined]
        number = max(1, args.number * 200 // max(200, len(raw)))
        out[f"{name}_bytes"] = len(raw)
        out[f"{name}_refused"] = limits.count_check(descriptor, raw) is not None
        out[f"{name}_walk_ns"] = round(
            best_ns(lambda d=descriptor, r=raw: limits.count_check(d, r), number)
        )
        out[f"{name}_parse_ns"] = round(best_ns(lambda c=cls, r=raw: c.FromString(r), number))
    out["load"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]
    emit(out)


if __name__ == "__main__":
    main()
