"""Protobuf conversions more than one service needs: job events (the workload
scheduler sends them, the cell scheduler relays them), timestamps, and the
switched fabric and its tiles (the ocs_manager serves them, the workload
scheduler shows them in its pod view)."""

from __future__ import annotations

from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from lightpath.domain.switched import SwitchedFabric, SwitchedFabricConfig
from lightpath.domain.switched_rings import Tile
from lightpath.v1 import common_pb2
from lightpath.v1 import ocs_manager_pb2 as pb


def timestamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(int(ms))
    return t


def job_event_pb(event: dict[str, Any], pod_id: str) -> common_pb2.JobEvent:
    return common_pb2.JobEvent(
        job_id=event["job"],
        from_state=common_pb2.JobState.Value("JOB_STATE_" + event["from"])
        if event.get("from")
        else common_pb2.JOB_STATE_UNSPECIFIED,
        to_state=common_pb2.JobState.Value("JOB_STATE_" + event["to"]),
        at=timestamp(event["at"]),
        reason=event.get("reason", ""),
        pod_id=pod_id,
    )


def config_to_proto(c: SwitchedFabricConfig) -> pb.SwitchedFabricConfig:
    return pb.SwitchedFabricConfig(
        group_shape=common_pb2.Shape(dims=list(c.group_shape)),
        cluster_rows=c.cluster_rows,
        cluster_cols=c.cluster_cols,
        planes=c.planes,
        tier0_down_ports=c.tier0_down_ports,
        tier0_up_ports=c.tier0_up_ports,
        tier1_switches=c.tier1_switches,
        tier1_ports=c.tier1_ports,
        tier0_mesh_links=c.tier0_mesh_links,
        row_column_links=c.row_column_links,
    )


def fabric_to_proto(pod_id: str, f: SwitchedFabric) -> pb.SwitchedFabric:
    d = f.describe()
    return pb.SwitchedFabric(
        pod_id=pod_id,
        config=config_to_proto(f.config),
        spec=f.config.spec(),
        groups=d["groups"],
        processors=d["processors"],
        tier0_switches=d["tier0_switches"],
        tier1_switches=d["tier1_switches"],
        links=d["links"],
        lanes=d["lanes"],
    )


def tile_to_proto(f: SwitchedFabric, t: Tile) -> pb.GroupTile:
    return pb.GroupTile(
        group=t.group,
        row=t.row,
        col=t.col,
        height=t.height,
        width=t.width,
        group_name=f.group_name(t.group),
    )
