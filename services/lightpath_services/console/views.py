"""Protobuf answers -> the JSON each view of the console draws. Pure: no I/O, no clock
(the caller passes `now`), so each shape is testable on its own."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.v1 import (
    agg_switch_pb2,
    cell_scheduler_pb2,
    common_pb2,
    core_broker_pb2,
    ocs_manager_pb2,
)


def as_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def seconds(ts: Timestamp) -> float:
    """A Timestamp as Unix seconds (0 when unset)."""
    return ts.seconds + ts.nanos / 1e9


def age(ts: Timestamp, now: float) -> float | None:
    return round(max(0.0, now - seconds(ts)), 1) if ts.seconds or ts.nanos else None


def enum_name(enum: Any, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix)


def shape_text(dims: Iterable[int]) -> str:
    return "x".join(str(d) for d in dims)


def job_state(value: int) -> str:
    return enum_name(common_pb2.JobState, value, "JOB_STATE_")


# -- cell --------------------------------------------------------------------------------


def pod_row(pod: cell_scheduler_pb2.Pod, now: float) -> dict[str, Any]:
    reg, cap = pod.registration, pod.capacity
    return {
        "pod_id": reg.pod_id,
        "status": enum_name(cell_scheduler_pb2.PodStatus, pod.status, "POD_STATUS_"),
        "status_reason": pod.status_reason,
        "fabric_kind": enum_name(common_pb2.FabricKind, reg.fabric_kind, "FABRIC_KIND_"),
        "block_shape": shape_text(reg.block_shape.dims),
        "ocs_per_axis": reg.ocs_per_axis,
        "heartbeat_age_s": age(pod.last_heartbeat, now),
        "queued_jobs": cap.queued_jobs,
        "running_jobs": cap.running_jobs,
        "cell_jobs": pod.cell_jobs,
        "capacity": [
            {
                "node_type": t.node_type,
                "total": t.total,
                "free": t.free,
                "allocated": t.allocated,
                "failed": t.failed,
                # Chips for sub-block slices (issue 28): free, and the largest box one gets.
                "chips_total": t.chips_total,
                "chips_free": t.chips_free,
                "largest_free_box": t.largest_free_box,
            }
            for t in cap.types
        ],
    }


def box_of(box: Any) -> dict[str, Any]:
    """A ChipBox: a sub-block slice's box of chips inside one block (issue 28)."""
    return {
        "job_id": box.job_id,
        "block_id": box.block_id,
        "offset": list(box.offset.coords),
        "chips": list(box.chips.dims),
    }


def job_row(job: cell_scheduler_pb2.CellJob, now: float) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "tenant": job.tenant,
        "state": job_state(job.state),
        "reason": job.reason,
        "pod_id": job.pod_id,
        "priority": job.priority,
        "shape": shape_text(job.chips.dims),
        "blocks": job.block_count,
        "age_s": age(job.created_at, now),
        "queue_position": job.cell_queue_position,
        "twisted": job.spec.twisted or job.pod_job.spec.twisted,
        "box": box_of(job.pod_job.box) if job.pod_job.HasField("box") else None,
    }


def quota_row(q: cell_scheduler_pb2.TenantQuota) -> dict[str, Any]:
    """A tenant's quota and usage per node type (issue 35): chips it is owed, holds, and
    holds above its quota (borrowed from its cohort); `pod`: the row's scope, a pod's
    cap on what the tenant holds there ("": the cell)."""
    quota = q.quota if q.HasField("quota") else None
    types = sorted(set(q.used_chips) | set(quota.nominal_chips if quota else ()))
    return {
        "tenant": q.tenant,
        "pod": q.pod,
        "has_quota": quota is not None,
        "cohort": quota.cohort if quota else "",
        "no_borrowing": bool(quota and quota.no_borrowing),
        "types": [
            {
                "node_type": t,
                "quota": quota.nominal_chips.get(t, 0) if quota else None,
                "used": q.used_chips.get(t, 0),
                "borrowed": q.borrowed_chips.get(t, 0),
            }
            for t in types
        ],
        "waiting": q.waiting_jobs,
        "waiting_for_quota": q.waiting_for_quota,
    }


def hold_row(hold: cell_scheduler_pb2.PodHold, now: float) -> dict[str, Any]:
    """The pod the cell holds for an owner's job (issue 35): whose job ("" when the
    viewer is another tenant: the cell leaves it out) and for how long."""
    return {
        "pod": hold.pod,
        "job_id": hold.job_id,
        "tenant": hold.tenant,
        "age_s": age(hold.since, now),
    }


def cell_view(
    pods: Sequence[cell_scheduler_pb2.Pod] | None,
    jobs: Sequence[cell_scheduler_pb2.CellJob],
    now: float,
    pods_error: str = "",
    quotas: Sequence[cell_scheduler_pb2.TenantQuota] = (),
    hold: cell_scheduler_pb2.PodHold | None = None,
) -> dict[str, Any]:
    return {
        "pods": [pod_row(p, now) for p in sorted(pods or (), key=lambda p: p.registration.pod_id)],
        "pods_error": pods_error,
        "jobs": [job_row(j, now) for j in jobs],
        "quotas": [quota_row(q) for q in quotas],
        "hold": hold_row(hold, now) if hold is not None else None,
    }


def job_view(
    job: cell_scheduler_pb2.CellJob,
    now: float,
    trace_id: str,
    wiring: ocs_manager_pb2.SliceWiring | None = None,
    wiring_error: str = "",
) -> dict[str, Any]:
    pj = job.pod_job
    out = job_row(job, now)
    out.update(
        trace_id=trace_id,
        placement_reason=job.placement_reason,
        grid=shape_text(pj.grid.dims),
        wrap=list(pj.wrap),
        history=[
            {
                "at": seconds(e.at),
                "from": job_state(e.from_state),
                "to": job_state(e.to_state),
                "reason": e.reason,
                "pod_id": e.pod_id,
            }
            for e in pj.history
        ],
        block_list=[
            {"block_id": b.block_id, "node_type": b.node_type, "position": list(b.position.coords)}
            for b in pj.blocks
        ],
        switched=as_dict(pj.switched) if pj.HasField("switched") else None,
        wiring=None,
        wiring_error=wiring_error,
    )
    if wiring is not None:
        out["wiring"] = {
            "state": enum_name(ocs_manager_pb2.SliceState, wiring.state, "SLICE_STATE_"),
            "cross_connects": wiring.cross_connect_count or len(wiring.cross_connects),
            "one_to_many": wiring.one_to_many_count or len(wiring.one_to_many),
            "wired_at": seconds(wiring.wired_at),
            "grid": shape_text(wiring.grid.dims),
        }
    return out


# -- superpod ----------------------------------------------------------------------------


def pod_view(
    pod: cell_scheduler_pb2.Pod,
    now: float,
    rings: Sequence[ocs_manager_pb2.RingReservationSummary] = (),
    twisted: Collection[str] = (),
) -> dict[str, Any]:
    """The superpod view. Issue 28: a block given over to sub-block slices (`shared`) lists
    the box of chips each holds, its failed hosts and its free chips; `block_dims` and
    `host_shape` let the page draw it split into chips and hosts; the jobs in `twisted`
    (twisted tori, from the cell's jobs) are marked on their blocks and in the job list."""
    view = pod.view
    out = pod_row(pod, now)
    boxes = {x.job_id: box_of(x) for b in view.blocks for x in b.boxes}
    out.update(
        block_count=view.block_count,
        block_dims=list(view.block_shape.dims),
        host_shape=list(view.host_shape.dims),
        blocks=[
            {
                "block_id": b.block_id,
                "node_type": b.node_type,
                "health": enum_name(common_pb2.BlockHealth, b.health, "BLOCK_HEALTH_"),
                "availability": enum_name(
                    common_pb2.BlockAvailability, b.availability, "BLOCK_AVAILABILITY_"
                ),
                "job_id": b.job_id,
                "position": list(b.position.coords),
                "boxes": [box_of(x) for x in b.boxes],
                "failed_hosts": list(b.failed_hosts),
                "chips_free": b.chips_free,
                "shared": bool(b.boxes)
                or (b.availability == common_pb2.BLOCK_AVAILABILITY_ALLOCATED and not b.job_id),
                "twisted": bool(b.job_id) and b.job_id in twisted,
            }
            for b in view.blocks
        ],
        live_jobs=[
            {
                "job_id": j.job_id,
                "state": job_state(j.state),
                "priority": j.priority,
                "grid": shape_text(j.grid.dims),
                "blocks": j.block_count,
                "box": boxes.get(j.job_id),
                "twisted": j.job_id in twisted,
            }
            for j in view.live_jobs
        ],
        chips=[
            {
                "node_type": t.node_type,
                "total": t.chips_total,
                "used": t.chips_used,
                "failed": t.chips_failed,
                "free": t.chips_free,
            }
            for t in view.types
            if t.chips_total
        ],
        jobs_by_state=dict(view.jobs_by_state),
        wiring_differences=[as_dict(d) for d in view.wiring_differences],
        switched=None,
    )
    if view.HasField("switched"):
        sw = view.switched
        out["switched"] = {
            "fabric": as_dict(sw.fabric),
            "small_groups": list(sw.small_groups),
            "small_tiles": {k: as_dict(v) for k, v in sw.small_tiles.items()},
            "switches": [as_dict(s) for s in sw.switches],
            "rings": [as_dict(r) for r in rings],
        }
    return out


def block_detail(
    block: Mapping[str, Any],
    ports: Sequence[ocs_manager_pb2.PortMapEntry],
    wiring: ocs_manager_pb2.SliceWiring | None,
) -> dict[str, Any]:
    """One block: its job, its segments (each end's OCS ports, the 1xK switch between) and
    the cross-connects of its slice that touch it."""
    bid = block["block_id"]
    segments = [
        {
            "dim": e.segment.dim,
            "axis": e.segment.axis,
            "end": enum_name(ocs_manager_pb2.SegmentEnd, e.segment.end, "SEGMENT_END_"),
            "ports": [f"{p.ocs_id}:{p.port}" for p in e.ports],
            "one_to_many": e.one_to_many_id,
        }
        for e in ports
    ]
    touching = []
    if wiring is not None:
        for c in wiring.cross_connects:
            if bid in (c.a.block_id, c.b.block_id):
                touching.append(
                    {
                        "ocs_id": c.ocs_id,
                        "ports": [c.port_a, c.port_b],
                        "a": f"block {c.a.block_id} dim {c.a.dim} axis {c.a.axis}",
                        "b": f"block {c.b.block_id} dim {c.b.dim} axis {c.b.axis}",
                    }
                )
    return {**block, "segments": segments, "cross_connects": touching}


# -- OCS ---------------------------------------------------------------------------------


def ocs_view(
    pod_id: str,
    switches: Sequence[ocs_manager_pb2.SwitchUse],
    states: Sequence[ocs_manager_pb2.OneToManyState],
) -> dict[str, Any]:
    """Per switch its use (the heat map: rows by dimension, columns by axis and K index)
    and the 1xK switches' states."""
    rows = [
        {
            "ocs_id": s.ocs_id,
            "dim": s.dim,
            "axis": s.axis,
            "k": s.k,
            "radix": s.radix,
            "ports_cabled": s.ports_cabled,
            "ports_in_use": s.ports_in_use,
            "use": round(s.ports_in_use / s.ports_cabled, 4) if s.ports_cabled else 0.0,
        }
        for s in sorted(switches, key=lambda s: (s.dim, s.axis, s.k))
    ]
    one_to_many = [
        {
            "switch_id": st.switch_id,
            "block_id": st.segment.block_id,
            "dim": st.segment.dim,
            "axis": st.segment.axis,
            "outputs": [f"{p.ocs_id}:{p.port}" for p in st.outputs],
            "selected": st.selected_output,
            "job_id": st.job_id,
        }
        for st in states
    ]
    return {"pod_id": pod_id, "switches": rows, "one_to_many": one_to_many}


def slice_view(pod_id: str, wiring: ocs_manager_pb2.SliceWiring) -> dict[str, Any]:
    return {
        "pod_id": pod_id,
        "job_id": wiring.job_id,
        "state": enum_name(ocs_manager_pb2.SliceState, wiring.state, "SLICE_STATE_"),
        "grid": shape_text(wiring.grid.dims),
        "blocks": [
            {"block_id": b.block_id, "position": list(b.position.coords)} for b in wiring.blocks
        ],
        "cross_connects": [
            {
                "ocs_id": c.ocs_id,
                "port_a": c.port_a,
                "port_b": c.port_b,
                "a": [c.a.block_id, c.a.dim, c.a.axis],
                "b": [c.b.block_id, c.b.dim, c.b.axis],
            }
            for c in wiring.cross_connects
        ],
        "one_to_many": [
            {
                "switch_id": o.switch_id,
                "block_id": o.segment.block_id,
                "output": o.output,
                "ocs_id": o.ocs_id,
                "idle": o.idle,
            }
            for o in wiring.one_to_many
        ],
    }


# -- core broker -------------------------------------------------------------------------


# The core broker's timeline reaches the end of the last live reservation, so a 10-minute
# reservation is not a sliver on a fixed 6-hour axis: rounded up to a whole tick, ticks
# from this list (about 4 to 8 of them), within [CORES_MIN_S, CORES_MAX_S].
TICKS_S = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
CORES_MIN_S, CORES_MAX_S = 600.0, 7 * 86400.0
LIVE_RESERVATIONS = (
    core_broker_pb2.RESERVATION_STATE_SCHEDULED,
    core_broker_pb2.RESERVATION_STATE_ACTIVE,
)


def live_reservations(
    reservations: Iterable[core_broker_pb2.Reservation], now: float
) -> list[core_broker_pb2.Reservation]:
    """Those granted and not yet over, by start."""
    live = [r for r in reservations if r.state in LIVE_RESERVATIONS and seconds(r.end) > now]
    return sorted(live, key=lambda r: (seconds(r.start), r.reservation_id))


def cores_window(
    reservations: Sequence[core_broker_pb2.Reservation], now: float
) -> tuple[float, float]:
    """(end, tick): the timeline from `now` to the last live reservation's end, in whole
    ticks."""
    last = max((seconds(r.end) for r in reservations), default=now)
    span = min(CORES_MAX_S, max(CORES_MIN_S, last - now))
    tick = next((t for t in TICKS_S if span / t <= 8), TICKS_S[-1])
    return now + min(CORES_MAX_S, -(-span // tick) * tick), float(tick)


def reservation_row(r: core_broker_pb2.Reservation, now: float) -> dict[str, Any]:
    devices: dict[str, int] = {}
    for a in r.allocations:
        devices[a.device_id] = max(devices.get(a.device_id, 0), a.cores)
    return {
        "reservation_id": r.reservation_id,
        "application_id": r.application_id,
        "state": enum_name(core_broker_pb2.ReservationState, r.state, "RESERVATION_STATE_"),
        "cores": r.request.cores or r.cores_at_start,
        "devices": [{"device_id": d, "cores": c} for d, c in sorted(devices.items())],
        "start": seconds(r.start),
        "end": seconds(r.end),
        "starts_in_s": round(seconds(r.start) - now, 1),
        "ends_in_s": round(seconds(r.end) - now, 1),
        "summary": r.summary,
    }


def cores_view(
    capacity: core_broker_pb2.QueryCapacityResponse,
    start: float,
    end: float,
    reservations: Sequence[core_broker_pb2.Reservation] = (),
    tick: float = 3600.0,
    listed_all: bool = True,
) -> dict[str, Any]:
    """Per device its reservations over [start, end) (the Gantt bars) and its free cores
    as a step function: (time, free) at every instant the reserved sum changes; the live
    reservations as a table (`listed_all` False: the console read only the first ones)."""
    devices = []
    for d in sorted(capacity.devices, key=lambda d: d.device.device_id):
        total = d.device.cores
        bars = [
            {
                "reservation_id": s.reservation_id,
                "start": max(start, seconds(s.start)),
                "end": min(end, seconds(s.end)),
                "cores": s.cores,
            }
            for s in d.schedule
            if seconds(s.end) > start and seconds(s.start) < end
        ]
        devices.append(
            {
                "device_id": d.device.device_id,
                "kind": enum_name(core_broker_pb2.DeviceKind, d.device.kind, "DEVICE_KIND_"),
                "cores": total,
                "free_cores": d.free_cores,
                "peak_reserved": d.peak_reserved_cores,
                "bars": bars,
                "free": free_steps(total, bars, start),
            }
        )
    return {
        "start": start,
        "end": end,
        "tick": tick,
        "devices": devices,
        "reservations": [reservation_row(r, start) for r in reservations],
        "reservations_complete": listed_all,
    }


def free_steps(total: int, bars: Sequence[Mapping[str, Any]], start: float) -> list[list[float]]:
    """[[t, free cores from t on], ...]: starting at `start`, one step per change."""
    deltas: dict[float, int] = {}
    for b in bars:
        deltas[b["start"]] = deltas.get(b["start"], 0) + b["cores"]
        deltas[b["end"]] = deltas.get(b["end"], 0) - b["cores"]
    steps = [[start, float(total)]]
    used = 0
    for t in sorted(deltas):
        used += deltas[t]
        if t <= start:
            steps[0][1] = float(total - used)
        elif float(total - used) != steps[-1][1]:
            steps.append([t, float(total - used)])
    return steps


# -- aggregation -------------------------------------------------------------------------


def agg_view(
    tree_id: str,
    topology: agg_switch_pb2.AggTopology | None,
    states: Mapping[str, agg_switch_pb2.SwitchState | str],
    commands: Sequence[agg_switch_pb2.AggCommand],
    now: float,
) -> dict[str, Any]:
    nodes = []
    if topology is not None:
        for n in topology.nodes:
            nodes.append(
                {
                    "id": n.id,
                    "kind": enum_name(agg_switch_pb2.AggNodeKind, n.kind, "AGG_NODE_KIND_"),
                    "parent": n.parent,
                    "threshold_ms": n.threshold_ms,
                }
            )
    switches: dict[str, dict[str, Any]] = {}
    for name, st in states.items():
        if isinstance(st, str):
            switches[name] = {"error": st}
            continue
        switches[st.switch_id or name] = {
            "slots_total": st.slots_total,
            "slots_in_use": st.slots_in_use,
            "parked": st.parked,
            "bypass": [
                {
                    "command_id": b.command_id,
                    "chunk": b.chunk,
                    "timeout_node": b.timeout_node,
                    "age_s": age(b.created_at, now),
                }
                for b in st.bypass_entries
            ],
            "commands": [as_dict(c) for c in st.commands],
        }
    return {
        "tree_id": tree_id,
        "timeout_aggregator": topology.timeout_aggregator if topology is not None else "",
        "nodes": nodes,
        "switches": switches,
        "commands": [
            {
                "command_id": c.command_id,
                "tenant": c.tenant,
                "state": enum_name(agg_switch_pb2.AggCommandState, c.state, "AGG_COMMAND_STATE_"),
                "participants": len(c.participants),
                "chunks": c.chunks,
                "timeout_nodes": list(c.timeout_nodes),
                "age_s": age(c.created_at, now),
            }
            for c in commands
        ],
    }
