"""Settings of core_broker, from environment variables."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

from lightpath.paths import default_state_dir
from lightpath_services.common.settings import (
    Address,
    CommonSettings,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    choice,
    rule,
    setting,
)
from lightpath_services.core_broker.decisions import (
    BILLING_MODELS,
    QOS_LEVELS,
    Placement,
    PriorityFunction,
    default_billing_weights,
    default_mix,
    default_qos_weights,
    default_task_weights,
    parse_weights,
)


def _fmt(weights: Mapping[str, float]) -> str:
    return ",".join(f"{k.lower()}={v:g}" for k, v in weights.items())


def _weights(known: tuple[str, ...] | None, upper: bool = False) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        weights = parse_weights(raw)
        if upper:
            weights = {k.upper(): v for k, v in weights.items()}
        if known is not None:
            bad = sorted(set(weights) - set(known))
            if bad:
                raise ValueError(f"unknown names {bad}: use {', '.join(n.lower() for n in known)}")
        return raw

    return parse


class CoreBrokerSettings(CommonSettings):
    listen: Address = setting("LIGHTPATH_LISTEN", "127.0.0.1:50081", "gRPC listen address")
    operator_token: str = setting(
        "LIGHTPATH_CB_OPERATOR_TOKEN",
        "",
        "a bearer token that also names the operator (devices, applications, latencies); "
        "empty: the operator calls with its certificate or a Lightpath token",
    )
    batch_window_ms: NonNegativeFloat = setting(
        "LIGHTPATH_CB_BATCH_WINDOW_MS",
        2.0,
        "requests arriving within this many ms are decided together, by priority (CB-5)",
    )
    max_batch: PositiveInt = setting(
        "LIGHTPATH_CB_MAX_BATCH", 64, "most requests decided in one batch"
    )
    default_placement: Annotated[str, choice(*(p.value.lower() for p in Placement))] = setting(
        "LIGHTPATH_CB_DEFAULT_PLACEMENT",
        "spread",
        "placement when a request names none: spread, pack, nearest, affinity, lowest_latency",
    )
    priority_mix: Annotated[str, rule(_weights(("hint", "task", "qos", "billing")))] = setting(
        "LIGHTPATH_CB_PRIORITY_MIX",
        _fmt(default_mix()),
        "share of hint, task, qos and billing in the priority score (CB-3)",
    )
    task_weights: Annotated[str, rule(_weights(None))] = setting(
        "LIGHTPATH_CB_TASK_WEIGHTS",
        _fmt(default_task_weights()),
        "priority weight 0..1 per task type; * for the rest",
    )
    qos_weights: Annotated[str, rule(_weights(QOS_LEVELS, upper=True))] = setting(
        "LIGHTPATH_CB_QOS_WEIGHTS",
        _fmt(default_qos_weights()),
        "priority weight 0..1 per QoS level",
    )
    billing_weights: Annotated[str, rule(_weights(BILLING_MODELS, upper=True))] = setting(
        "LIGHTPATH_CB_BILLING_WEIGHTS",
        _fmt(default_billing_weights()),
        "priority weight 0..1 per billing model",
    )
    reaper_interval_ms: PositiveFloat = setting(
        "LIGHTPATH_CB_REAPER_INTERVAL_MS",
        1000.0,
        "longest wait between expiry sweeps (starts and ends are also swept when due, "
        "and the next due time is read again on every change to the reservations)",
    )
    retention_s: PositiveFloat = setting(
        "LIGHTPATH_CB_RETENTION_S",
        3600.0,
        "how long an ended or released reservation stays readable",
    )
    auth_cache_s: NonNegativeFloat = setting(
        "LIGHTPATH_CB_AUTH_CACHE_S",
        2.0,
        "how long a verified application credential is trusted without Redis",
    )
    max_duration_s: PositiveFloat = setting(
        "LIGHTPATH_CB_MAX_DURATION_S",
        86400.0,
        "longest reservation a request may ask for",
    )

    graph_runs_kept: PositiveInt = setting(
        "LIGHTPATH_CB_GRAPH_RUNS_KEPT",
        100,
        "runs of each graph whose per-component metrics are kept (GF-6)",
    )

    graph_data_dir: str = setting(
        "LIGHTPATH_CB_GRAPH_DATA_DIR",
        "",
        "the only directory RunGraph's files may be in (relative paths are taken there); "
        "default <state dir>/graph-data",
    )
    graph_run_dir: str = setting(
        "LIGHTPATH_CB_GRAPH_RUN_DIR",
        "",
        "where RunGraph keeps each run's logs, spill files and checkpoints; "
        "default <state dir>/graph-runs",
    )
    graph_max_runs: PositiveInt = setting(
        "LIGHTPATH_CB_GRAPH_MAX_RUNS",
        2,
        "graph runs this broker process runs at once (more: RESOURCE_EXHAUSTED)",
    )
    graph_code: Annotated[str, choice("library", "any")] = setting(
        "LIGHTPATH_CB_GRAPH_CODE",
        "library",
        "what RunGraph runs: library (the component library's kinds without outside "
        "access) or any (also user code, interface and kv_lookup, with the broker's "
        "privileges: only where every application is trusted)",
    )

    @property
    def graph_data_path(self) -> Path:
        return (
            Path(self.graph_data_dir) if self.graph_data_dir else default_state_dir() / "graph-data"
        )

    @property
    def graph_run_path(self) -> Path:
        return (
            Path(self.graph_run_dir) if self.graph_run_dir else default_state_dir() / "graph-runs"
        )

    def priority_function(self) -> PriorityFunction:
        return PriorityFunction(
            mix=parse_weights(self.priority_mix),
            task_types=parse_weights(self.task_weights),
            qos_levels={k.upper(): v for k, v in parse_weights(self.qos_weights).items()},
            billing_models={k.upper(): v for k, v in parse_weights(self.billing_weights).items()},
        )

    @property
    def placement(self) -> Placement:
        return Placement(self.default_placement.upper())
