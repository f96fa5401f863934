#!/usr/bin/env python3
"""Write the Grafana dashboards under deploy/monitoring/dashboards/ (one JSON file each).

    python deploy/monitoring/gen_dashboards.py

Every query names only metrics of services/common/metric_names.py (and Prometheus's
own `up`, and the process metrics prometheus_client adds); tests/test_monitoring.py
checks that, that the files are what this script writes, and that they are valid
JSON. Panels use the `datasource` variable, so the dashboards import into any
Grafana; the compose stack provisions them (grafana/provisioning).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"

DS = {"type": "prometheus", "uid": "${datasource}"}


class Board:
    def __init__(self, uid: str, title: str, description: str, variables: list[dict[str, Any]]):
        self.uid = uid
        self.title = title
        self.description = description
        self.variables = variables
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0

    def row(self, title: str) -> None:
        if self._x:
            self._x, self._y = 0, self._y + 8
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self._y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self._y += 1

    def panel(
        self,
        title: str,
        *targets: tuple[str, str],
        unit: str = "short",
        kind: str = "timeseries",
        description: str = "",
        width: int = 8,
        stack: bool = False,
    ) -> None:
        if self._x + width > 24:
            self._x, self._y = 0, self._y + 8
        defaults: dict[str, Any] = {"unit": unit}
        if kind == "timeseries":
            defaults["custom"] = {
                "drawStyle": "line",
                "lineWidth": 1,
                "fillOpacity": 20 if stack else 0,
                "stacking": {"mode": "normal" if stack else "none", "group": "A"},
                "showPoints": "never",
            }
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": kind,
                "title": title,
                "description": description,
                "datasource": DS,
                "gridPos": {"x": self._x, "y": self._y, "w": width, "h": 8},
                "fieldConfig": {"defaults": defaults, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                if kind == "timeseries"
                else {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}},
                "targets": [
                    {
                        "refId": chr(ord("A") + i),
                        "datasource": DS,
                        "expr": expr,
                        "legendFormat": legend,
                    }
                    for i, (expr, legend) in enumerate(targets)
                ],
            }
        )
        self._x += width

    def json(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["lightpath"],
            "timezone": "utc",
            "schemaVersion": 39,
            "version": 1,
            "editable": True,
            "refresh": "30s",
            "time": {"from": "now-6h", "to": "now"},
            "templating": {"list": [DATASOURCE, *self.variables]},
            "annotations": {"list": []},
            "links": [
                {
                    "title": "Lightpath",
                    "type": "dashboards",
                    "tags": ["lightpath"],
                    "asDropdown": True,
                }
            ],
            "panels": self.panels,
        }


DATASOURCE = {
    "name": "datasource",
    "label": "Prometheus",
    "type": "datasource",
    "query": "prometheus",
    "current": {},
    "hide": 0,
}


def query_var(name: str, label: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-query"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "current": {},
        "hide": 0,
    }


def p(q: float, metric: str, by: str = "", where: str = "") -> str:
    """The q-quantile of a histogram over 5 minutes, by `by`."""
    keys = ", ".join(k for k in ("le", by) if k)
    return f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket{where}[5m])))"


def cell() -> Board:
    b = Board(
        "lightpath-cell",
        "Lightpath / Cell overview",
        "The cell scheduler: jobs, its queue, pods and their heartbeats, forwards and requeues.",
        [],
    )
    b.row("Jobs")
    b.panel(
        "Jobs by state",
        ("sum by (state) (max by (state, pod) (lightpath_cell_jobs))", "{{state}}"),
        stack=True,
    )
    b.panel(
        "Jobs by pod",
        ("sum by (pod) (max by (state, pod) (lightpath_cell_jobs))", "{{pod}}"),
        stack=True,
    )
    b.panel("Cell queue depth", ("max(lightpath_cell_queue_depth)", "queued"))
    b.panel(
        "Submit to running",
        (p(0.5, "lightpath_cell_submit_to_running_duration_seconds"), "p50"),
        (p(0.95, "lightpath_cell_submit_to_running_duration_seconds"), "p95"),
        (
            "histogram_quantile(0.5, sum by (le) "
            "(rate(lightpath_cell_submit_to_running_duration_seconds_bucket[30m])))",
            "p50 over 30 min (alert above 60 s)",
        ),
        unit="s",
        description="LightpathSubmitToRunningSlow fires when the 30-minute median stays above "
        "1 min for 15 min",
    )
    b.panel(
        "Forwards to pods",
        ("sum by (result) (rate(lightpath_cell_forwards_total[5m]))", "{{result}}"),
        unit="ops",
    )
    b.panel(
        "Requeues",
        ("sum by (reason) (rate(lightpath_cell_requeues_total[5m]))", "{{reason}}"),
        unit="ops",
    )
    b.row("Pods")
    b.panel("Pods by status", ("max by (status) (lightpath_cell_pods)", "{{status}}"), kind="stat")
    b.panel(
        "Heartbeat age",
        ("max by (pod) (lightpath_cell_heartbeat_age_seconds)", "{{pod}}"),
        unit="s",
        description="LightpathPodSilent fires above 30 s for a minute",
    )
    b.panel(
        "Cell RPCs",
        (
            'sum by (rpc_method, rpc_grpc_status_code) (rate(rpc_server_duration_milliseconds_count{service="cell-scheduler"}[5m]))',
            "{{rpc_method}} {{rpc_grpc_status_code}}",
        ),
        unit="reqps",
    )
    return b


def pod() -> Board:
    where = '{pod="$pod"}'
    b = Board(
        "lightpath-pod",
        "Lightpath / Pod blocks and OCS",
        "One pod: its building blocks, jobs, admissions, preemptions, block replacements and "
        "wiring (workload_scheduler), and its optical circuit switches (ocs_manager).",
        [query_var("pod", "pod", "label_values(lightpath_pod_blocks, pod)")],
    )
    b.row("Blocks and jobs")
    b.panel(
        "Blocks by state",
        (f"sum by (state) (max by (state, node_type) (lightpath_pod_blocks{where}))", "{{state}}"),
        stack=True,
    )
    b.panel(
        "Blocks by node type and state",
        (
            f"max by (node_type, state) (lightpath_pod_blocks{where})",
            "{{node_type}} {{state}}",
        ),
    )
    b.panel(
        "Failed blocks",
        ('max(lightpath_pod_blocks{pod="$pod", state="failed"})', "failed"),
        kind="stat",
    )
    b.panel(
        "Jobs by state", (f"max by (state) (lightpath_pod_jobs{where})", "{{state}}"), stack=True
    )
    b.panel("Pod queue depth", (f"max(lightpath_pod_queue_depth{where})", "queued"))
    b.row("Admission, preemption, replacement")
    b.panel(
        "Admission attempts",
        (
            f"sum by (result) (rate(lightpath_pod_admission_attempts_total{where}[5m]))",
            "{{result}}",
        ),
        unit="ops",
    )
    b.panel(
        "Admission time",
        (p(0.5, "lightpath_pod_admission_duration_seconds"), "p50"),
        (p(0.99, "lightpath_pod_admission_duration_seconds"), "p99"),
        unit="s",
    )
    b.panel(
        "Preemptions",
        (f"sum by (action) (rate(lightpath_pod_preemptions_total{where}[5m]))", "{{action}}"),
        unit="ops",
    )
    b.panel(
        "Block replacements",
        (
            f"sum by (result) (increase(lightpath_pod_block_replacements_total{where}[5m]))",
            "{{result}}",
        ),
    )
    b.panel(
        "Block replacement time",
        (p(0.5, "lightpath_pod_block_replacement_duration_seconds"), "p50"),
        (p(0.99, "lightpath_pod_block_replacement_duration_seconds"), "p99"),
        unit="s",
    )
    b.panel(
        "Wiring time",
        (p(0.5, "lightpath_pod_wiring_duration_seconds"), "p50"),
        (p(0.99, "lightpath_pod_wiring_duration_seconds"), "p99"),
        unit="s",
    )
    b.row("Optical circuit switches")
    b.panel(
        "Cross-connects per OCS", (f"max by (ocs) (lightpath_ocs_cross_connects{where})", "{{ocs}}")
    )
    b.panel(
        "Port utilisation per OCS",
        (f"max by (ocs) (lightpath_ocs_port_utilization{where})", "{{ocs}}"),
        unit="percentunit",
    )
    b.panel(
        "Change time (p99)",
        (p(0.99, "lightpath_ocs_change_duration_seconds", "op", where), "{{op}}"),
        unit="s",
    )
    b.panel(
        "Changes by outcome",
        (
            f"sum by (op, outcome) (rate(lightpath_ocs_change_duration_seconds_count{where}[5m]))",
            "{{op}} {{outcome}}",
        ),
        unit="ops",
    )
    b.panel(
        "1xK switch states",
        (f"max by (output) (lightpath_ocs_one_to_many_states{where})", "output {{output}}"),
        stack=True,
    )
    b.panel(
        "Invariant failures",
        (
            f"sum by (rule) (increase(lightpath_ocs_invariant_failures_total{where}[5m]))",
            "{{rule}}",
        ),
        description="LightpathInvariantCheckFailing fires on any",
    )
    b.panel("Ring channels reserved", (f"max(lightpath_ocs_ring_channels{where})", "channels"))
    b.row("Switch agents")
    b.panel(
        "Switches unreachable",
        (f"max(lightpath_ocs_switches_unreachable{where})", "unreachable"),
        description="switches the last reconcile pass could not read; "
        "LightpathSwitchesUnreachable fires on any for 2 min",
    )
    b.panel(
        "Switch repairs",
        (
            f"sum by (reason) (increase(lightpath_ocs_switch_repairs_total{where}[15m]))",
            "{{reason}}",
        ),
        description="batches the reconcile loop sent to put a switch back: restarted (came "
        "back empty) or drifted (LightpathSwitchDrifted fires on any)",
    )
    return b


def broker() -> Board:
    b = Board(
        "lightpath-core-broker",
        "Lightpath / Core broker",
        "Decisions, their latency, reserved against total cores per device now and over the "
        "next hour, live reservations.",
        [
            query_var(
                "device", "device", "label_values(lightpath_broker_cores_total, device)", multi=True
            )
        ],
    )
    b.row("Decisions")
    b.panel(
        "Decisions by outcome",
        ("sum by (outcome) (rate(lightpath_broker_decisions_total[5m]))", "{{outcome}}"),
        unit="ops",
        stack=True,
    )
    b.panel(
        "Decision time",
        (p(0.5, "lightpath_broker_decision_duration_seconds"), "p50"),
        (p(0.99, "lightpath_broker_decision_duration_seconds"), "p99"),
        unit="s",
    )
    b.panel(
        "Commits re-checked by Redis (replica contention)",
        (
            'sum(rate(lightpath_broker_commits_total{rechecked="true"}[5m])) / sum(rate(lightpath_broker_commits_total[5m]))',
            "re-checked",
        ),
        unit="percentunit",
    )
    b.panel("Live reservations", ("max(lightpath_broker_reservations_live)", "live"))
    b.row("Capacity")
    b.panel(
        "Reserved share of all cores",
        (
            'sum(max by (device) (lightpath_broker_cores_reserved{window="now"})) / sum(max by (device) (lightpath_broker_cores_total))',
            "now",
        ),
        (
            'sum(max by (device) (lightpath_broker_cores_reserved{window="next_hour"})) / sum(max by (device) (lightpath_broker_cores_total))',
            "next hour",
        ),
        unit="percentunit",
        description="LightpathReservationCapacityExhausted fires above 95 % (now) for 10 minutes",
    )
    b.panel(
        "Reserved cores per device (now)",
        (
            'max by (device) (lightpath_broker_cores_reserved{window="now", device=~"$device"})',
            "{{device}}",
        ),
    )
    b.panel(
        "Reserved / total per device",
        (
            'max by (device) (lightpath_broker_cores_reserved{window="now", device=~"$device"}) / max by (device) (lightpath_broker_cores_total{device=~"$device"})',
            "{{device}}",
        ),
        unit="percentunit",
    )
    b.panel(
        "Refused calls",
        (
            'sum by (reason) (rate(lightpath_auth_failures_total{service="core-broker"}[5m]))',
            "{{reason}}",
        ),
        unit="ops",
    )
    return b


def agg() -> Board:
    b = Board(
        "lightpath-agg",
        "Lightpath / Aggregation tree",
        "The agg_switch tree: slots, commands, timeouts, bypass entries, stragglers, bytes.",
        [
            query_var(
                "switch", "switch", "label_values(lightpath_agg_slots_total, switch)", multi=True
            )
        ],
    )
    where = '{switch=~"$switch"}'
    b.row("Slots")
    b.panel("Slots in use", (f"max by (switch) (lightpath_agg_slots_in_use{where})", "{{switch}}"))
    b.panel(
        "Slot occupancy",
        (
            f"max by (switch) (lightpath_agg_slots_in_use{where}) / max by (switch) (lightpath_agg_slots_total{where})",
            "{{switch}}",
        ),
        unit="percentunit",
    )
    b.panel(
        "Bypass entries", (f"max by (switch) (lightpath_agg_bypass_entries{where})", "{{switch}}")
    )
    b.row("Traffic")
    b.panel(
        "Commands by outcome",
        ("sum by (outcome) (rate(lightpath_agg_commands_total[5m]))", "{{outcome}}"),
        unit="ops",
    )
    b.panel(
        "Timeouts",
        (f"sum by (switch) (rate(lightpath_agg_timeouts_total{where}[5m]))", "{{switch}}"),
        unit="ops",
    )
    b.panel(
        "Predicted stragglers",
        ("sum by (process) (rate(lightpath_agg_predicted_stragglers_total[5m]))", "{{process}}"),
        unit="ops",
    )
    b.panel(
        "Bytes aggregated",
        ("sum by (process) (rate(lightpath_agg_bytes_aggregated_bytes_total[5m]))", "{{process}}"),
        unit="Bps",
    )
    return b


def services() -> Board:
    where = '{process=~"$process"}'
    b = Board(
        "lightpath-services",
        "Lightpath / Services",
        "What every service exports: RPCs, Redis, background tasks, refused calls, the process.",
        [query_var("process", "process", 'label_values(up{job="lightpath"}, process)', multi=True)],
    )
    b.row("RPCs")
    b.panel("Up", ('up{job="lightpath", process=~"$process"}', "{{process}}"), kind="stat")
    b.panel(
        "RPC rate by code",
        (
            f"sum by (process, rpc_grpc_status_code) (rate(rpc_server_duration_milliseconds_count{where}[5m]))",
            "{{process}} {{rpc_grpc_status_code}}",
        ),
        unit="reqps",
    )
    b.panel(
        "RPC time p99",
        (
            f"histogram_quantile(0.99, sum by (le, process) (rate(rpc_server_duration_milliseconds_bucket{where}[5m])))",
            "{{process}}",
        ),
        unit="ms",
    )
    b.row("Redis")
    b.panel(
        "Redis command time p99",
        (p(0.99, "lightpath_redis_command_duration_seconds", "process", where), "{{process}}"),
        unit="s",
    )
    b.panel(
        "Redis commands by command",
        (
            f"sum by (command) (rate(lightpath_redis_command_duration_seconds_count{where}[5m]))",
            "{{command}}",
        ),
        unit="ops",
    )
    b.panel(
        "Redis errors",
        (
            f"sum by (process, error) (rate(lightpath_redis_command_errors_total{where}[5m]))",
            "{{process}} {{error}}",
        ),
        unit="ops",
    )
    b.row("Background tasks and security")
    b.panel(
        "Task restarts",
        (
            f"sum by (process, task) (increase(lightpath_task_restarts_total{where}[10m]))",
            "{{process}} {{task}}",
        ),
    )
    b.panel(
        "Tasks down",
        (f"max by (process, task) (lightpath_task_down{where})", "{{process}} {{task}}"),
    )
    b.panel(
        "Refused calls",
        (
            f"sum by (process, reason) (rate(lightpath_auth_failures_total{where}[5m]))",
            "{{process}} {{reason}}",
        ),
        unit="ops",
    )
    b.row("Web console")
    b.panel("Console up", ('up{job="lightpath", service="console"}', "{{process}}"), kind="stat")
    b.panel(
        "Console watches down",
        ('max by (task) (lightpath_task_down{service="console"})', "{{task}}"),
        description="1 while a watch or poll of the console fails: the view it feeds is stale "
        "(LightpathConsoleStale after 5 min)",
    )
    b.row("Process")
    b.panel(
        "CPU",
        (f"rate(process_cpu_seconds_total{where}[5m])", "{{process}}"),
        unit="percentunit",
    )
    b.panel(
        "Resident memory",
        (f"process_resident_memory_bytes{where}", "{{process}}"),
        unit="bytes",
    )
    b.panel("Open files", (f"process_open_fds{where}", "{{process}}"))
    return b


BOARDS = {
    "cell.json": cell,
    "pod.json": pod,
    "core_broker.json": broker,
    "agg.json": agg,
    "services.json": services,
}


def files() -> dict[str, str]:
    return {name: json.dumps(make().json(), indent=2) + "\n" for name, make in BOARDS.items()}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, text in files().items():
        (OUT / name).write_text(text)
    print(f"wrote {len(BOARDS)} dashboards under {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
