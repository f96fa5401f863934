"""`lightpath pod <id>` and `lightpath rings`: a superpod's block map (WS-9) and ring plans (WS-10).

    lightpath pod pod-1              # the block map of seed Fig. 2, counts, jobs, queue
    lightpath pod pod-3              # a SWITCHED pod: its groups, small jobs, switch use
    lightpath pod pod-1 --json       # the PodView as JSON
    lightpath pod pod-1 --events     # follow job transitions and block health changes
    lightpath rings 8x8x4 --data 8 --pipeline 4 --layer 8 [--json]

`pod` goes through the cell scheduler (the local stack's, or --cell /
$LIGHTPATH_CELL_ADDR), which relays the pod's view: no pod address is needed
(--addr HOST:PORT asks a workload scheduler directly instead).
`rings` asks a pod's workload scheduler directly (the `ws-<pod>` process of the
local stack, or --addr / $LIGHTPATH_WS_ADDR): it plans, it changes nothing.
"""

from __future__ import annotations

import argparse
import math
import string
import sys
from collections.abc import Collection

from lightpath.cli._common import add_json_flag, add_parallelism_flags, print_json, run_rpc
from lightpath.cli.switched_view import render_switched_pod
from lightpath.client import channel
from lightpath.sdk.cell import state_name
from lightpath.v1 import common_pb2, workload_scheduler_pb2, workload_scheduler_pb2_grpc

FREE, FAILED = ".", "X"
# Issue 28: a block given over to sub-block slices (boxes of chips), and one with a
# failed host (it takes no block slice; its other hosts serve sub-block slices).
SHARED, HOST_FAILED = "+", "!"
JOB_SYMBOLS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def register(sub: argparse._SubParsersAction) -> None:
    pod = sub.add_parser("pod", help="a superpod's block map, counts and jobs")
    pod.add_argument("pod_id", help="e.g. pod-1")
    pod.add_argument("--cell", help="cell scheduler host:port (default: the local stack's)")
    pod.add_argument(
        "--addr", help="ask this workload scheduler host:port directly instead of the cell"
    )
    pod.add_argument(
        "--events", action="store_true", help="follow the pod's job and block events (Ctrl-C ends)"
    )
    add_json_flag(pod)
    pod.set_defaults(func=cmd_pod)

    rings = sub.add_parser("rings", help="ring plan of data/pipeline/layer parallelism on a slice")
    rings.add_argument("shape", help="slice shape in chips, e.g. 8x8x4")
    add_parallelism_flags(
        rings, default=0, note=" (those not given: what makes the product, then 1)"
    )
    rings.add_argument("--no-wrap", action="store_true", help="a mesh: no wraparound links")
    rings.add_argument("--pod", default="pod-1", help="whose workload scheduler plans it")
    rings.add_argument(
        "--addr",
        metavar="HOST:PORT",
        help="the workload scheduler to ask (default: $LIGHTPATH_WS_ADDR, else --pod's in the "
        "local stack)",
    )
    add_json_flag(rings)
    rings.set_defaults(func=cmd_rings)


def scheduler_address(pod_id: str, addr: str | None) -> str:
    from lightpath.stack import endpoint

    if addr:
        return addr
    try:
        return endpoint(f"ws-{pod_id}", "LIGHTPATH_WS_ADDR")
    except KeyError:
        raise SystemExit(
            f"no workload scheduler known for pod {pod_id!r}; give --addr host:port"
        ) from None


def cmd_pod(args: argparse.Namespace) -> int:
    if args.addr:
        return _pod_direct(args)
    from lightpath.cli.cell import STATUS, cell_address
    from lightpath.v1 import cell_scheduler_pb2, cell_scheduler_pb2_grpc

    address = cell_address(args.cell)

    async def run() -> int:
        async with channel(address, default_timeout=None if args.events else 10.0) as ch:
            cell = cell_scheduler_pb2_grpc.CellSchedulerStub(ch)
            if args.events:
                request = cell_scheduler_pb2.WatchCellPodRequest(pod_id=args.pod_id)
                async for event in cell.WatchPod(request):
                    if args.json:
                        print_json(event)
                    else:
                        print(describe_event(event), flush=True)
                return 0
            pod = await cell.GetPod(
                cell_scheduler_pb2.GetCellPodRequest(pod_id=args.pod_id, include_view=True)
            )
            if args.json:
                print_json(pod)
                return 0
            twisted = {j.job_id for j in pod.view.live_jobs if j.twisted}
            print(render_pod(pod.view, twisted=twisted))
            status = STATUS.get(pod.status, "?")
            print(
                f"cell:   {status}{f' ({pod.status_reason})' if pod.status_reason else ''}, "
                f"{pod.cell_jobs} live job(s) placed by the cell, scheduler at "
                f"{pod.registration.endpoint}"
            )
            return 0

    try:
        return run_rpc(run)
    except KeyboardInterrupt:
        return 0


def _pod_direct(args: argparse.Namespace) -> int:
    """`lightpath pod ID --addr HOST:PORT`: the pod's workload scheduler itself (no cell)."""
    address = args.addr

    async def run() -> int:
        async with channel(address, default_timeout=None if args.events else 10.0) as ch:
            stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)
            if args.events:
                async for event in stub.WatchPod(workload_scheduler_pb2.WatchPodRequest()):
                    if args.json:
                        print_json(event)
                    else:
                        print(describe_event(event), flush=True)
                return 0
            view = await stub.GetPod(workload_scheduler_pb2.GetPodRequest())
            if view.pod_id != args.pod_id:
                print(
                    f"error: {address} serves pod {view.pod_id}, not {args.pod_id}",
                    file=sys.stderr,
                )
                return 1
            if args.json:
                print_json(view)
            elif view.fabric_kind == common_pb2.FABRIC_KIND_SWITCHED:
                print(render_switched_pod(view, JOB_SYMBOLS))
            else:
                print(render_pod(view))
            return 0

    try:
        return run_rpc(run)
    except KeyboardInterrupt:
        return 0


def describe_event(event: workload_scheduler_pb2.PodEvent) -> str:
    if event.HasField("block"):
        b = event.block
        health = common_pb2.BlockHealth.Name(b.health).removeprefix("BLOCK_HEALTH_")
        host = f" host {b.host}" if b.HasField("host") else ""
        return f"{b.at.ToJsonString()}  block {b.block_id}{host} {health}  {b.reason}"
    j = event.job
    return (
        f"{j.at.ToJsonString()}  {j.job_id}: {state_name(j.from_state) if j.from_state else '-'}"
        f" -> {state_name(j.to_state)}  {j.reason}"
    )


def _coords(values) -> str:
    return "(" + ",".join(map(str, values)) + ")"


def _shared(b: workload_scheduler_pb2.BlockView) -> bool:
    """A block given over to sub-block slices (boxes of chips)."""
    return bool(b.boxes) or (
        b.availability == common_pb2.BLOCK_AVAILABILITY_ALLOCATED and not b.job_id
    )


def render_pod(view: workload_scheduler_pb2.PodView, twisted: Collection[str] = ()) -> str:
    """The block map of seed Fig. 2 for people: '.' free, 'X' failed, a letter per slice,
    '+' a block shared by sub-block slices, '!' a block with a failed host (issue 28);
    the jobs in `twisted` are said to be twisted tori."""
    n = view.block_count
    width = 8 if n % 8 == 0 else max(1, math.ceil(math.sqrt(n)))
    symbols: dict[str, str] = {}
    boxes = {x.job_id: x for b in view.blocks for x in b.boxes}
    holding = {b.job_id for b in view.blocks if b.job_id} | set(boxes)
    order = [j.job_id for j in view.live_jobs] + sorted(holding)
    for job_id in order:
        if job_id in holding and job_id not in symbols:
            symbols[job_id] = JOB_SYMBOLS[len(symbols) % len(JOB_SYMBOLS)]
    shape = "x".join(map(str, view.block_shape.dims))
    lines = [
        f"pod {view.pod_id}: {n} blocks of {shape} chips, K={view.ocs_per_axis}",
        "",
        "block  " + " ".join(f"{c:<2}" for c in range(width)),
    ]
    types = [b.node_type for b in view.blocks]
    primary = types[0] if types else ""
    for row in range(0, n, width):
        cells = []
        for b in view.blocks[row : row + width]:
            if b.failed_hosts:  # (its health is FAILED too: it takes no block slice)
                cell = HOST_FAILED
            elif b.health == common_pb2.BLOCK_HEALTH_FAILED:
                cell = FAILED
            elif b.job_id:
                cell = symbols[b.job_id]
            elif _shared(b):
                cell = SHARED
            else:
                cell = FREE
            # A block of another node type than the pod's first is marked with a '
            cells.append(f"{cell}{chr(39) if b.node_type != primary else ' '}")
        lines.append(f"{row:>5}  " + " ".join(cells).rstrip())
    lines.append("")
    legend = f"legend: {FREE} free   {FAILED} failed   ' not {primary}"
    if any(_shared(b) or b.failed_hosts for b in view.blocks):
        legend += f"   {SHARED} shared by sub-block slices   {HOST_FAILED} a host failed"
    lines.append(legend)
    live = {j.job_id: j for j in view.live_jobs}
    for job_id, sym in symbols.items():
        j = live.get(job_id)
        held = ""
        if job_id in boxes:
            x = boxes[job_id]
            held = (
                f"chips {'x'.join(map(str, x.chips.dims))} at {_coords(x.offset.coords)} "
                f"of block {x.block_id}, a mesh"
            )
        if j is None:
            lines.append(f"  {sym}  {job_id}" + (f"  {held}" if held else ""))
            continue
        held = held or f"{'x'.join(map(str, j.grid.dims))} blocks"
        if job_id in twisted:
            held += ", a twisted torus"
        lines.append(f"  {sym}  {job_id}  {state_name(j.state)}  priority {j.priority}  {held}")
    shared = [b for b in view.blocks if _shared(b) or b.failed_hosts]
    if shared:
        host = "x".join(map(str, view.host_shape.dims)) or "?"
        lines.append("")
        lines.append(f"sub-block blocks (hosts of {host} chips):")
        for b in shared:
            inside = " ".join(
                f"{symbols[x.job_id]}{_coords(x.offset.coords)}{'x'.join(map(str, x.chips.dims))}"
                for x in b.boxes
            )
            lines.append(
                f"  block {b.block_id}: {b.chips_free} chips free"
                + (
                    f", hosts {', '.join(map(str, b.failed_hosts))} failed"
                    if b.failed_hosts
                    else ""
                )
                + (f"; {inside}" if inside else "")
            )
    lines.append("")
    lines.append(
        "blocks: "
        + "; ".join(
            f"{t.node_type} {t.total} ({t.free} free, {t.allocated} allocated, {t.failed} failed)"
            for t in view.types
        )
    )
    if any(t.chips_total for t in view.types):
        lines.append(
            "chips:  "
            + "; ".join(
                f"{t.node_type} {t.chips_total} ({t.chips_free} free, {t.chips_used} used, "
                f"{t.chips_failed} failed)"
                for t in view.types
                if t.chips_total
            )
        )
    if view.jobs_by_state:
        lines.append(
            "jobs:   " + ", ".join(f"{k} {v}" for k, v in sorted(view.jobs_by_state.items()))
        )
    queued = [
        j
        for j in view.live_jobs
        if j.state in (common_pb2.JOB_STATE_PENDING, common_pb2.JOB_STATE_SUSPENDED)
    ]
    if queued:
        lines.append(
            "queue:  "
            + ", ".join(
                f"{j.job_id} ({state_name(j.state)}, p{j.priority}, {'x'.join(map(str, j.grid.dims))})"
                for j in queued
            )
        )
    return "\n".join(lines)


def parse_shape(raw: str) -> list[int]:
    try:
        dims = [int(p) for p in raw.lower().split("x")]
    except ValueError:
        raise SystemExit(f"shape {raw!r} must look like 8x8x4") from None
    return dims


def cmd_rings(args: argparse.Namespace) -> int:
    from lightpath.sdk.cell import fill_degrees

    address = scheduler_address(args.pod, args.addr)
    dims = parse_shape(args.shape)
    data, pipeline, layer = fill_degrees(math.prod(dims), args.data, args.pipeline, args.layer)

    async def run() -> int:
        async with channel(address) as ch:
            stub = workload_scheduler_pb2_grpc.WorkloadSchedulerStub(ch)
            plan = await stub.PlanRings(
                workload_scheduler_pb2.PlanRingsRequest(
                    shape=common_pb2.Shape(dims=dims),
                    wrap=[not args.no_wrap] * len(dims),
                    parallelism=common_pb2.ParallelismDegrees(
                        data=data, pipeline=pipeline, layer=layer
                    ),
                )
            )
            if args.json:
                print_json(plan)
                return 0
            names = "xyzwvu"
            for axis in plan.axes:
                along = "+".join(names[d] for d in axis.dims) or "-"
                print(
                    f"{axis.axis:<8} degree {axis.degree:<4} along {along:<6} "
                    f"{len(axis.rings)} rings"
                )
                if axis.rings and axis.degree > 1:
                    first = " ".join(
                        "(" + ",".join(map(str, c.coords)) + ")" for c in axis.rings[0].chips
                    )
                    print(f"         first ring: {first}")
            return 0

    return run_rpc(run)
