"""Typed settings from environment variables (X-1).

A settings class is a frozen dataclass whose fields are declared with
`setting(ENV_VAR, default, doc)`. `load(cls)` reads the environment, parses
each value by the field's type (or its own parser), and fails at start with a
message naming the variable when a value is bad. `describe(cls)` lists the
variables with their defaults and docs (docs/configuration.md, the compose-file
check).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from lightpath import redis_url
from lightpath.domain.torus import FabricConfig, format_shape, parse_shape, validate_config
from lightpath.errors import InvalidArgument

T = TypeVar("T")


class SettingsError(ValueError):
    """A bad environment value; the message names the variable."""


def setting(env: str, default: Any, doc: str, *, parse: Callable[[str], Any] | None = None) -> Any:
    """Declare a dataclass field read from `env`. `default=None` makes it required."""
    return dataclasses.field(default=default, metadata={"env": env, "doc": doc, "parse": parse})


# -- parsers: each raises ValueError with the rule the value broke -------------


def parse_bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in {"1", "true", "yes", "on"}:
        return True
    if v in {"0", "false", "no", "off"}:
        return False
    raise ValueError("must be one of true/false/1/0/yes/no/on/off")


def parse_address(raw: str) -> str:
    """host:port, [v6]:port; port 0 means ephemeral."""
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("must look like host:port, e.g. 127.0.0.1:50051 or [::]:0")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("port must be an integer 0..65535")
    return raw.strip()


def parse_optional_address(raw: str) -> str:
    return "" if not raw.strip() else parse_address(raw)


def parse_metrics_listen(raw: str) -> str:
    """Empty (off), a port (on loopback: 127.0.0.1:PORT), or host:port."""
    raw = raw.strip()
    if not raw:
        return ""
    if raw.isdigit():
        raw = f"127.0.0.1:{raw}"
    return parse_address(raw)


def parse_redis_url(raw: str) -> str:
    redis_url.parse(raw)  # ValueError naming the rule
    return raw


def parse_positive_float(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def parse_positive_int(raw: str) -> int:
    value = int(raw.strip())
    if value <= 0:
        raise ValueError("must be an integer > 0")
    return value


def parse_non_negative_int(raw: str) -> int:
    value = int(raw.strip())
    if value < 0:
        raise ValueError("must be an integer >= 0")
    return value


def parse_non_negative_float(raw: str) -> float:
    value = float(raw)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def parse_id(raw: str) -> str:
    from services.common.keys import validate_id

    return validate_id(raw)


def choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        v = raw.strip().lower()
        if v not in options:
            raise ValueError("must be one of " + ", ".join(options))
        return v

    return parse


def _parse_int(raw: str) -> int:
    return int(raw.strip())


_BY_TYPE: dict[Any, Callable[[str], Any]] = {
    str: str,
    int: _parse_int,
    float: float,
    bool: parse_bool,
}


def load(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    """Build `cls` from `environ` (default os.environ)."""
    env = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        name = f.metadata.get("env")
        if not name:
            continue
        raw = env.get(name)
        if raw is None:
            if f.default is None:
                raise SettingsError(f"{name} is required: {f.metadata['doc']}")
            continue
        parse = f.metadata.get("parse") or _BY_TYPE.get(hints[f.name])
        if parse is None:
            raise TypeError(f"no parser for {cls.__name__}.{f.name}")
        try:
            values[f.name] = parse(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r} is invalid: {exc}") from None
    return cls(**values)


@dataclass(frozen=True)
class SettingDoc:
    env: str
    default: str
    doc: str


def describe(cls: type) -> list[SettingDoc]:
    return [
        SettingDoc(
            f.metadata["env"],
            "(required)" if f.default is None else repr(f.default),
            f.metadata["doc"],
        )
        for f in dataclasses.fields(cls)
        if f.metadata.get("env")
    ]


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class CommonSettings:
    """What every service reads. Subclasses add their own and override `listen`."""

    redis_url: str = setting(
        "LIGHTPATH_REDIS_URL",
        "redis://127.0.0.1:6379/0",
        "Redis holding all shared state: redis://, rediss://, unix://, "
        "redis+cluster://h1:p1,h2:p2 (a Redis Cluster) or "
        "redis+sentinel://h1:p1,h2:p2/service_name[/db] (the master Sentinel names)",
        parse=parse_redis_url,
    )
    redis_password_file: str = setting(
        "LIGHTPATH_REDIS_PASSWORD_FILE",
        "",
        "file holding the Redis password (AUTH / requirepass); overrides a password in the URL",
    )
    redis_max_connections: int = setting(
        "LIGHTPATH_REDIS_MAX_CONNECTIONS",
        64,
        "connections this process may open to Redis (per client); a call that finds them "
        "all busy waits up to LIGHTPATH_REDIS_POOL_TIMEOUT_S",
        parse=parse_positive_int,
    )
    redis_pool_timeout_s: float = setting(
        "LIGHTPATH_REDIS_POOL_TIMEOUT_S",
        2.0,
        "seconds a call waits for a free Redis connection before it answers UNAVAILABLE "
        "(retryable)",
        parse=parse_positive_float,
    )
    listen: str = setting(
        "LIGHTPATH_LISTEN",
        "127.0.0.1:0",
        "gRPC listen address; port 0 picks a free one",
        parse=parse_address,
    )
    tls_cert: str = setting(
        "LIGHTPATH_TLS_CERT", "", "PEM certificate this service serves with (and presents to peers)"
    )
    tls_key: str = setting("LIGHTPATH_TLS_KEY", "", "PEM private key of LIGHTPATH_TLS_CERT")
    tls_ca: str = setting(
        "LIGHTPATH_TLS_CA",
        "",
        "PEM CA certificate(s) that client and peer certificates must chain to",
    )
    tls_client_auth: str = setting(
        "LIGHTPATH_TLS_CLIENT_AUTH",
        "require",
        "require: every caller presents a certificate from LIGHTPATH_TLS_CA (mTLS; a bearer token "
        "may still name the caller); none: server-only TLS, callers authenticate by bearer token",
        parse=choice("require", "none"),
    )
    plaintext: bool = setting(
        "LIGHTPATH_PLAINTEXT",
        False,
        "serve without TLS (callers then authenticate by bearer token); allowed on loopback only",
    )
    token_file: str = setting(
        "LIGHTPATH_TOKEN_FILE",
        "",
        "file holding this service's bearer token for calls to its peers",
    )
    audit_log: str = setting(
        "LIGHTPATH_AUDIT_LOG",
        "-",
        "where the audit log goes: a file (JSON lines, appended), - for the log stream, empty for nowhere",
    )
    audit_level: str = setting(
        "LIGHTPATH_AUDIT_LEVEL",
        "metadata",
        "none, metadata (who, what, outcome) or request (also the request body)",
        parse=choice("none", "metadata", "request"),
    )
    log_level: str = setting(
        "LIGHTPATH_LOG_LEVEL",
        "info",
        "debug, info, warning or error",
        parse=choice("debug", "info", "warning", "error"),
    )
    log_format: str = setting(
        "LIGHTPATH_LOG_FORMAT",
        "json",
        "json (one object per line) or text",
        parse=choice("json", "text"),
    )
    max_inflight: int = setting(
        "LIGHTPATH_MAX_INFLIGHT",
        64,
        "calls from outside callers this process serves at once (health, GetInfo, streams, "
        "pods' heartbeats and calls between Lightpath services are not counted); more wait "
        "in a queue",
        parse=parse_positive_int,
    )
    max_queued: int = setting(
        "LIGHTPATH_MAX_QUEUED",
        128,
        "calls that may wait for one of LIGHTPATH_MAX_INFLIGHT; a call finding the queue full "
        "answers RESOURCE_EXHAUSTED (OVERLOADED) with a retry delay",
        parse=parse_non_negative_int,
    )
    queue_wait_s: float = setting(
        "LIGHTPATH_QUEUE_WAIT_S",
        0.5,
        "seconds a queued call waits for a slot before it answers RESOURCE_EXHAUSTED "
        "(OVERLOADED) with a retry delay (with LIGHTPATH_TARGET_LATENCY_S, at most half "
        "of that); the retry delay starts from it",
        parse=parse_non_negative_float,
    )
    target_latency_s: float = setting(
        "LIGHTPATH_TARGET_LATENCY_S",
        0.5,
        "latency the calls served should keep: a call whose service (from its slot to its "
        "answer) is slower than it lowers the number "
        "served at once (down to 4), faster ones raise it again (up to "
        "LIGHTPATH_MAX_INFLIGHT); the rest answer RESOURCE_EXHAUSTED (OVERLOADED) with a "
        "retry delay; 0 keeps LIGHTPATH_MAX_INFLIGHT fixed",
        parse=parse_non_negative_float,
    )
    shutdown_grace_s: float = setting(
        "LIGHTPATH_SHUTDOWN_GRACE_S",
        5.0,
        "seconds in-flight calls may finish after SIGTERM",
        parse=parse_non_negative_float,
    )
    task_backoff_max_s: float = setting(
        "LIGHTPATH_TASK_BACKOFF_MAX_S",
        5.0,
        "longest wait before a failed background task (heartbeat, reconcile, ...) restarts",
        parse=parse_non_negative_float,
    )
    instance_id: str = setting(
        "LIGHTPATH_INSTANCE_ID", "", "unique name of this process; default host-pid"
    )
    otel_traces_exporter: str = setting(
        "OTEL_TRACES_EXPORTER",
        "none",
        "none, console or otlp (otlp needs the [otlp] extra)",
        parse=choice("none", "console", "otlp"),
    )
    otel_metrics_exporter: str = setting(
        "OTEL_METRICS_EXPORTER",
        "none",
        "none: OpenTelemetry exports traces only; the metrics (rpc.server.duration and "
        "the services' own, deploy/monitoring/README.md) are served on LIGHTPATH_METRICS_LISTEN",
        parse=choice("none"),
    )
    metrics_listen: str = setting(
        "LIGHTPATH_METRICS_LISTEN",
        "",
        "Prometheus scrape endpoint (HTTP GET /metrics, plaintext) of this process: host:port, "
        "or a port alone for 127.0.0.1:PORT; empty: none. Bind a non-loopback host only where "
        "the network is trusted (deploy/monitoring)",
        parse=parse_metrics_listen,
    )
    otel_console_file: str = setting(
        "LIGHTPATH_OTEL_CONSOLE_FILE",
        "",
        "file the console span exporter appends to (one JSON object per line); "
        "empty: stdout (the logs go to stderr)",
    )
    otel_service_name: str = setting(
        "OTEL_SERVICE_NAME", "", "service.name of spans; default lightpath-<service>"
    )

    @property
    def resolved_instance_id(self) -> str:
        return self.instance_id or _default_instance_id()


# The OCS torus fabric of one pod (OCS-1), which its ocs_manager and its switch agents
# both read: the agents serve the switches the manager derives from the same settings.
_FABRIC_ENV = {
    "block_shape": "LIGHTPATH_FABRIC_BLOCK_SHAPE",
    "block_count": "LIGHTPATH_FABRIC_BLOCKS",
    "ocs_per_axis": "LIGHTPATH_FABRIC_OCS_PER_AXIS",
    "ocs_radix": "LIGHTPATH_FABRIC_OCS_RADIX",
}


def _fabric_shape(raw: str) -> str:
    return format_shape(parse_shape(raw))


@dataclass(frozen=True)
class TorusFabricSettings(CommonSettings):
    """A pod's OCS torus fabric; `check_fabric` refuses an impossible one at start."""

    fabric_block_shape: str = setting(
        "LIGHTPATH_FABRIC_BLOCK_SHAPE",
        "4x4x4",
        "chips per building block along each dimension (its length is the number of dimensions)",
        parse=_fabric_shape,
    )
    fabric_blocks: int = setting(
        "LIGHTPATH_FABRIC_BLOCKS",
        64,
        "building blocks in the pod (ids 0..N-1)",
        parse=parse_positive_int,
    )
    fabric_ocs_per_axis: int = setting(
        "LIGHTPATH_FABRIC_OCS_PER_AXIS",
        1,
        "K, OCS per logical axis; K >= 2 puts a 1xK switch on every segment's second end",
        parse=parse_positive_int,
    )
    fabric_ocs_radix: int = setting(
        "LIGHTPATH_FABRIC_OCS_RADIX",
        136,
        "ports of one OCS; must be >= ceil(N/K) + N",
        parse=parse_positive_int,
    )

    @property
    def fabric_config(self) -> FabricConfig:
        return FabricConfig(
            parse_shape(self.fabric_block_shape),
            self.fabric_blocks,
            self.fabric_ocs_per_axis,
            self.fabric_ocs_radix,
        )

    def check_fabric(self) -> None:
        """OCS-1: an impossible fabric is a SettingsError naming the variables and the need."""
        try:
            validate_config(self.fabric_config)
        except InvalidArgument as exc:
            raise SettingsError(
                "; ".join(f"{_FABRIC_ENV[v.field]}: {v.rule}" for v in exc.violations)
            ) from None
