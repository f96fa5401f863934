"""Every metric a Lightpath service exports, in one list (issue 18).

Each is listed under an OpenTelemetry-style name, kind, unit and attributes;
lightpath_services.common.instruments makes it a prometheus_client metric under the name
`prometheus_name` gives, which is what opentelemetry-exporter-prometheus made of it
when the metrics went through that exporter (so queries keep working):

  1. the name is sanitized: every run of characters other than [a-zA-Z0-9:]
     becomes one `_` (`lightpath.cell.queue.depth` -> `lightpath_cell_queue_depth`);
  2. the unit is mapped to a Prometheus word (`s` -> seconds, `ms` ->
     milliseconds, `By` -> bytes, `1` and `{annotation}` -> nothing) and
     appended as `_<unit>` unless the name already ends with it
     (`lightpath.redis.command.duration`, s -> `..._duration_seconds`);
  3. a counter gets `_total`; a histogram is the series `_bucket` (with `le`),
     `_sum` and `_count`; a gauge, an up-down counter and an observable gauge
     are gauges, under the bare name.

Attribute keys are sanitized the same way (`rpc.grpc.status_code` ->
`rpc_grpc_status_code`). `target_info` carries the process (service.name,
service.instance.id, service.version).

The services' own instruments (services/<name>/metrics.py) and the common ones use
these names and units; the dashboards and alert rules under deploy/monitoring may
name only these metrics (a test checks). `rpc.server.duration` keeps its
OpenTelemetry semantic-convention name (and unit, ms); every other metric starts
with `lightpath`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lightpath.telemetry import SECONDS_BUCKETS

COUNTER = "counter"
GAUGE = "gauge"  # a synchronous or observable gauge, or an up-down counter
HISTOGRAM = "histogram"

__all__ = ["ALL", "COMMON", "DOMAIN", "SECONDS_BUCKETS", "MetricName", "prometheus_name"]


@dataclass(frozen=True)
class MetricName:
    otel: str
    kind: str  # COUNTER | GAUGE | HISTOGRAM
    unit: str  # UCUM, as given to create_*: s, ms, By, 1 or ""
    labels: tuple[str, ...]
    service: str  # "common" (every service) or the service that exports it
    description: str

    @property
    def prometheus(self) -> str:
        """The metric family's name on a Prometheus endpoint (without _total/_bucket)."""
        return prometheus_name(self.otel, self.unit)

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this metric."""
        base = self.prometheus
        if self.kind == COUNTER:
            return (base + "_total",)
        if self.kind == HISTOGRAM:
            return (base + "_bucket", base + "_sum", base + "_count")
        return (base,)


# The Prometheus word for each unit the list uses ("" and "1": none).
_UNIT_WORDS = {"": "", "1": "", "s": "seconds", "ms": "milliseconds", "By": "bytes"}


def prometheus_name(otel: str, unit: str = "") -> str:
    """`otel` as opentelemetry-exporter-prometheus named it (the family name): runs of
    characters outside [a-zA-Z0-9:] become `_`, then the unit's word unless it ends so."""
    name = re.sub(r"[^a-zA-Z0-9:]+", "_", otel)
    suffix = _UNIT_WORDS[unit]  # KeyError: a unit the dashboards' names were not made for
    if suffix and not name.endswith("_" + suffix):
        name = f"{name}_{suffix}"
    return name


def _m(otel, kind, unit, labels, service, description) -> MetricName:
    return MetricName(otel, kind, unit, tuple(labels), service, description)


COMMON: tuple[MetricName, ...] = (
    _m(
        "rpc.server.duration",
        HISTOGRAM,
        "ms",
        ("rpc.method", "rpc.grpc.status_code"),
        "common",
        "time to serve one RPC, by method and status code",
    ),
    _m(
        "lightpath.redis.command.duration",
        HISTOGRAM,
        "s",
        ("command",),
        "common",
        "time of one Redis command (a pipeline or MULTI counts as one), retries included",
    ),
    _m(
        "lightpath.redis.command.errors",
        COUNTER,
        "",
        ("command", "error"),
        "common",
        "Redis commands that failed, by command and exception type",
    ),
    _m(
        "lightpath.task.restarts",
        COUNTER,
        "",
        ("task",),
        "common",
        "restarts of a supervised background task",
    ),
    _m(
        "lightpath.task.down",
        GAUGE,
        "",
        ("task",),
        "common",
        "1 while a supervised background task is failed or recovering, else 0",
    ),
    _m(
        "lightpath.auth.failures",
        COUNTER,
        "",
        ("reason",),
        "common",
        "calls refused as UNAUTHENTICATED or PERMISSION_DENIED, by reason",
    ),
)

# The services' domain instruments (services/<name>/metrics.py).
DOMAIN: tuple[MetricName, ...] = (
    # cell_scheduler
    _m(
        "lightpath.cell.jobs",
        GAUGE,
        "",
        ("state", "pod"),
        "cell_scheduler",
        "jobs by state and pod",
    ),
    _m(
        "lightpath.cell.queue.depth",
        GAUGE,
        "",
        (),
        "cell_scheduler",
        "jobs waiting in the cell queue",
    ),
    _m(
        "lightpath.cell.submit_to_running.duration",
        HISTOGRAM,
        "s",
        (),
        "cell_scheduler",
        "time from submit to running",
    ),
    _m("lightpath.cell.pods", GAUGE, "", ("status",), "cell_scheduler", "pods by status"),
    _m(
        "lightpath.cell.heartbeat.age",
        GAUGE,
        "s",
        ("pod",),
        "cell_scheduler",
        "seconds since a pod's last heartbeat",
    ),
    _m(
        "lightpath.cell.forwards",
        COUNTER,
        "",
        ("result",),
        "cell_scheduler",
        "jobs forwarded to pods",
    ),
    _m("lightpath.cell.requeues", COUNTER, "", ("reason",), "cell_scheduler", "jobs requeued"),
    # tenants' quotas (issue 35); operators scrape these, tenants never see them
    _m(
        "lightpath.cell.tenant.chips",
        GAUGE,
        "",
        ("tenant", "pod", "node_type", "kind"),
        "cell_scheduler",
        "a tenant's chips per node type: its quota, what it holds, what of that it borrows "
        "(on the cell, or on one pod for a quota of that pod)",
    ),
    _m(
        "lightpath.cell.tenant.waiting",
        GAUGE,
        "",
        ("tenant", "cause"),
        "cell_scheduler",
        "a tenant's jobs in the cell queue, waiting for its quota or for room",
    ),
    _m(
        "lightpath.cell.pod.held",
        GAUGE,
        "s",
        ("pod", "tenant"),
        "cell_scheduler",
        "seconds since the cell held the pod for a tenant's job within its nominal quota "
        "that no pod could make room for (jobs that would borrow stay off it); none: no "
        "pod is held",
    ),
    # workload_scheduler
    _m(
        "lightpath.pod.blocks",
        GAUGE,
        "",
        ("pod", "state", "node_type"),
        "workload_scheduler",
        "building blocks by state (free, allocated, failed) and node type",
    ),
    _m(
        "lightpath.pod.chips",
        GAUGE,
        "",
        ("pod", "state", "node_type"),
        "workload_scheduler",
        "chips by state (used by block or sub-block slices, failed, free) and node type",
    ),
    _m("lightpath.pod.jobs", GAUGE, "", ("pod", "state"), "workload_scheduler", "jobs by state"),
    _m(
        "lightpath.pod.admission.attempts",
        COUNTER,
        "",
        ("pod", "result"),
        "workload_scheduler",
        "admission attempts by result (admitted, queued, refused)",
    ),
    _m(
        "lightpath.pod.admission.duration",
        HISTOGRAM,
        "s",
        (),
        "workload_scheduler",
        "time of one admission attempt",
    ),
    _m(
        "lightpath.pod.preemptions",
        COUNTER,
        "",
        ("pod", "action"),
        "workload_scheduler",
        "preemptions by action (terminate, delay, shrink)",
    ),
    _m(
        "lightpath.pod.stale_forwards_refused",
        COUNTER,
        "",
        ("pod",),
        "workload_scheduler",
        "cell forwards refused for an older forward token (fencing): another cell replica "
        "had taken the forward over",
    ),
    _m(
        "lightpath.pod.stale_commits_refused",
        COUNTER,
        "",
        ("pod",),
        "workload_scheduler",
        "this replica's commits of a wiring refused after its wiring lease ran out and "
        "another replica took the job over (fencing)",
    ),
    _m(
        "lightpath.pod.block_replacements",
        COUNTER,
        "",
        ("pod", "result"),
        "workload_scheduler",
        "replacements of failed blocks by result (replaced, lost, stopped)",
    ),
    _m(
        "lightpath.pod.block_replacement.duration",
        HISTOGRAM,
        "s",
        (),
        "workload_scheduler",
        "time to replace a failed block",
    ),
    _m(
        "lightpath.pod.queue.depth",
        GAUGE,
        "",
        ("pod",),
        "workload_scheduler",
        "jobs queued in a pod",
    ),
    _m(
        "lightpath.pod.wiring.duration",
        HISTOGRAM,
        "s",
        (),
        "workload_scheduler",
        "time to wire a slice",
    ),
    # ocs_manager
    _m(
        "lightpath.ocs.cross_connects",
        GAUGE,
        "",
        ("pod", "ocs"),
        "ocs_manager",
        "cross-connects in use per OCS",
    ),
    _m(
        "lightpath.ocs.port_utilization",
        GAUGE,
        "1",
        ("pod", "ocs"),
        "ocs_manager",
        "fraction of an OCS's ports in a cross-connect",
    ),
    _m(
        "lightpath.ocs.change.duration",
        HISTOGRAM,
        "s",
        ("pod", "op", "outcome"),
        "ocs_manager",
        "time of a wire, release or replace, by outcome",
    ),
    _m(
        "lightpath.ocs.one_to_many.states",
        GAUGE,
        "",
        ("pod", "output"),
        "ocs_manager",
        "1xK switches by selected output",
    ),
    _m(
        "lightpath.ocs.invariant_failures",
        COUNTER,
        "",
        ("pod", "rule"),
        "ocs_manager",
        "invariant checks that failed, by rule",
    ),
    _m(
        "lightpath.ocs.stale_writes_refused",
        COUNTER,
        "",
        ("pod", "where"),
        "ocs_manager",
        "writes refused for an older lease token (fencing): a caller's stale lease (lease), "
        "this manager's commit (commit) or batches (switch) after its change lease was taken over",
    ),
    _m(
        "lightpath.ocs.switches_unreachable",
        GAUGE,
        "",
        ("pod",),
        "ocs_manager",
        "switches the last reconcile pass could not read (switch agents)",
    ),
    _m(
        "lightpath.ocs.switch_repairs",
        COUNTER,
        "",
        ("pod", "reason"),
        "ocs_manager",
        "batches the reconcile loop sent to make a switch match the committed tables, by reason",
    ),
    _m(
        "lightpath.ocs.ring_channels",
        GAUGE,
        "",
        ("pod",),
        "ocs_manager",
        "ring channels reserved (switched pods)",
    ),
    # core_broker
    _m(
        "lightpath.broker.decisions",
        COUNTER,
        "",
        ("outcome",),
        "core_broker",
        "decisions by outcome (granted, partial, deferred, rejected)",
    ),
    _m(
        "lightpath.broker.commits",
        COUNTER,
        "",
        ("rechecked",),
        "core_broker",
        "decision batches committed, by whether Redis re-read a device's schedule (true: "
        "another writer, e.g. a replica, reserved on it meanwhile)",
    ),
    _m(
        "lightpath.broker.decision.duration",
        HISTOGRAM,
        "s",
        (),
        "core_broker",
        "time of one decision",
    ),
    _m(
        "lightpath.broker.cores.reserved",
        GAUGE,
        "",
        ("device", "window"),
        "core_broker",
        "cores reserved per device, now and over the next hour",
    ),
    _m("lightpath.broker.cores.total", GAUGE, "", ("device",), "core_broker", "cores per device"),
    _m("lightpath.broker.reservations.live", GAUGE, "", (), "core_broker", "live reservations"),
    # agg_switch
    _m(
        "lightpath.agg.slots.in_use",
        GAUGE,
        "",
        ("switch",),
        "agg_switch",
        "aggregation slots in use",
    ),
    _m("lightpath.agg.slots.total", GAUGE, "", ("switch",), "agg_switch", "aggregation slots"),
    _m("lightpath.agg.commands", COUNTER, "", ("outcome",), "agg_switch", "commands by outcome"),
    _m("lightpath.agg.timeouts", COUNTER, "", ("switch",), "agg_switch", "aggregations timed out"),
    _m(
        "lightpath.agg.bypass_entries",
        GAUGE,
        "",
        ("switch",),
        "agg_switch",
        "bypass entries installed",
    ),
    _m(
        "lightpath.agg.predicted_stragglers",
        COUNTER,
        "",
        (),
        "agg_switch",
        "stragglers predicted",
    ),
    _m(
        "lightpath.agg.bytes_aggregated",
        COUNTER,
        "By",
        (),
        "agg_switch",
        "bytes aggregated",
    ),
)

ALL: tuple[MetricName, ...] = COMMON + DOMAIN
BY_OTEL: dict[str, MetricName] = {m.otel: m for m in ALL}

# Series every endpoint shows besides the instruments: the OTel resource, and what
# prometheus_client's default registry adds about the process.
EXPOSITION_EXTRAS: tuple[str, ...] = (
    "target_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "python_info",
)


def exported_series() -> set[str]:
    """Every sample name a Lightpath endpoint may show (what queries may name)."""
    return {s for m in ALL for s in m.series} | set(EXPOSITION_EXTRAS)
