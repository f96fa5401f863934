"""Typed settings from environment variables (X-1), through pydantic-settings.

A settings class is a frozen `Settings` (a pydantic-settings BaseSettings) whose fields
are declared with `setting(ENV_VAR, default, doc)` and typed with the rule their value
must keep: a constrained number (`PositiveInt`, `Field(ge=..)` in Annotated), a `choice`,
or a domain parser of the raw string (`rule`). `load(cls)` reads the environment and fails at
start with a `SettingsError` naming the variable and the rule when a value is bad;
`describe(cls)` lists the variables with their defaults and docs (docs/configuration.md,
the compose-file check).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from lightpath import redis_url
from lightpath.domain.torus import FabricConfig, format_shape, parse_shape, validate_config
from lightpath.errors import InvalidArgument

T = TypeVar("T", bound="Settings")


class SettingsError(ValueError):
    """A bad environment value; the message names the variable."""


class Settings(BaseSettings):
    """Read from the environment by the exact variable names (case-sensitive), raw: every
    value is a string its field's type and validators parse (defaults are not: each is
    already the parsed value)."""

    model_config = SettingsConfigDict(
        frozen=True,
        case_sensitive=True,
        extra="ignore",
        enable_decoding=False,
        validate_default=False,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The process environment (pydantic-settings' own source), or the mapping `load`
        was given instead; nothing else (no .env file, no secrets directory)."""
        environ = _ENVIRON.get()
        if environ is None:
            return (env_settings,)
        return (_Mapping(settings_cls, environ),)


# The mapping `load(cls, environ)` reads instead of os.environ, for the call it makes.
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("settings_environ", default=None)


class _Mapping(PydanticBaseSettingsSource):
    """A given mapping of variables, read like the environment (exact names, raw values)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.environ.get(field.alias), field.alias, False

    def __call__(self) -> dict[str, Any]:
        names = [str(f.alias) for f in self.settings_cls.model_fields.values()]
        return {name: self.environ[name] for name in names if name in self.environ}


def setting(env: str, default: Any, doc: str) -> Any:
    """A field read from `env`; `default=...` makes it required."""
    return Field(default, alias=env, description=doc)


# -- the rules a value keeps: each parser raises ValueError with the rule it broke ------


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


def parse_id(raw: str) -> str:
    from lightpath_services.common.keys import validate_id

    return validate_id(raw)


def choice(*options: str) -> BeforeValidator:
    """One of `options`, any case (kept lower-case): Annotated[str, choice(...)]."""

    def parse(raw: str) -> str:
        v = raw.strip().lower()
        if v not in options:
            raise ValueError("must be one of " + ", ".join(options))
        return v

    return BeforeValidator(parse)


def rule(parse: Callable[[str], Any]) -> BeforeValidator:
    """A parser of the raw string (ValueError naming the rule) as a field's validator; what
    it answers is then checked against the field's type."""
    return BeforeValidator(parse)


def checked(parse: Callable[[str], Any]) -> BeforeValidator:
    """`parse` only checks the raw string (ValueError naming the rule): the field keeps
    it, stripped, and the service parses it again where it uses it."""

    def keep(raw: str) -> str:
        parse(raw)
        return raw.strip()

    return BeforeValidator(keep)


Address = Annotated[str, rule(parse_address)]
OptionalAddress = Annotated[str, rule(parse_optional_address)]
MetricsListen = Annotated[str, rule(parse_metrics_listen)]
RedisUrl = Annotated[str, rule(parse_redis_url)]
Id = Annotated[str, rule(parse_id)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


def _bounds(field: Any) -> str:
    """The rule a constrained number keeps, in words, from its declared constraints."""
    c = {
        k: v
        for m in field.metadata  # annotated_types' Gt, Ge, Le, MultipleOf
        for k in ("gt", "ge", "le", "multiple_of")
        if (v := getattr(m, k, None)) is not None
    }
    kind = "an integer" if field.annotation is int else ""
    kind = f"a multiple of {c['multiple_of']}" if "multiple_of" in c else kind
    bound = f"> {c['gt']}" if "gt" in c else f">= {c['ge']}" if "ge" in c else ""
    if "le" in c:
        bound = f"within {c['ge']}..{c['le']}" if "ge" in c else f"within ({c['gt']}, {c['le']}]"
    return " ".join(["must be", *filter(None, (kind, bound))]) if kind or bound else ""


def _field(cls: type[Settings], env: str) -> Any:
    return next(f for f in cls.model_fields.values() if f.alias == env)


def _explain(cls: type[Settings], error: Mapping[str, Any]) -> str:
    """What a bad value broke, in the words the rule is documented with."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind == "bool_parsing":
        return "must be one of true/false/1/0/yes/no/on/off"
    field = _field(cls, error["loc"][0])
    bounds = _bounds(field)
    if kind.endswith("_parsing") or kind.endswith("_type") or kind == "int_from_float":
        what = "an integer" if field.annotation is int else "a number"
        return f"could not convert it to {what}" + (f"; {bounds}" if bounds else "")
    return bounds or str(error["msg"])


def load(cls: type[T], environ: Mapping[str, str] | None = None) -> T:
    """Build `cls` from `environ` (default: os.environ, read by pydantic-settings)."""
    token = _ENVIRON.set(environ)
    try:
        return cls()
    except ValidationError as exc:
        error = exc.errors()[0]
        if not error["loc"]:  # a check across settings (a model validator): its own message
            raise SettingsError(_explain(cls, error)) from None
        name = str(error["loc"][0])
        if error["type"] == "missing":
            raise SettingsError(f"{name} is required: {_field(cls, name).description}") from None
        raw = (os.environ if environ is None else environ).get(name, "")
        raise SettingsError(f"{name}={raw!r} is invalid: {_explain(cls, error)}") from None
    finally:
        _ENVIRON.reset(token)


@dataclass(frozen=True)
class SettingDoc:
    env: str
    default: str
    doc: str


def describe(cls: type[Settings]) -> list[SettingDoc]:
    return [
        SettingDoc(
            str(f.alias),
            "(required)" if f.is_required() else repr(f.default),
            f.description or "",
        )
        for f in cls.model_fields.values()
    ]


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class CommonSettings(Settings):
    """What every service reads. Subclasses add their own and override `listen`."""

    redis_url: RedisUrl = setting(
        "LIGHTPATH_REDIS_URL",
        "redis://127.0.0.1:6379/0",
        "Redis holding all shared state: redis://, rediss://, unix://, "
        "redis+cluster://h1:p1,h2:p2 (a Redis Cluster) or "
        "redis+sentinel://h1:p1,h2:p2/service_name[/db] (the master Sentinel names)",
    )
    redis_password_file: str = setting(
        "LIGHTPATH_REDIS_PASSWORD_FILE",
        "",
        "file holding the Redis password (AUTH / requirepass); overrides a password in the URL",
    )
    redis_max_connections: PositiveInt = setting(
        "LIGHTPATH_REDIS_MAX_CONNECTIONS",
        64,
        "connections this process may open to Redis (per client); a call that finds them "
        "all busy waits up to LIGHTPATH_REDIS_POOL_TIMEOUT_S",
    )
    redis_pool_timeout_s: PositiveFloat = setting(
        "LIGHTPATH_REDIS_POOL_TIMEOUT_S",
        2.0,
        "seconds a call waits for a free Redis connection before it answers UNAVAILABLE "
        "(retryable)",
    )
    redis_commit_replicas: NonNegativeInt = setting(
        "LIGHTPATH_REDIS_COMMIT_REPLICAS",
        0,
        "replicas that must hold a commit before a service acknowledges it (Redis WAIT "
        "after each transaction); 0: the primary's answer is enough, and a failover can "
        "lose the last acknowledged writes (docs/operations.md); one server or Sentinel only",
    )
    redis_commit_timeout_ms: PositiveInt = setting(
        "LIGHTPATH_REDIS_COMMIT_TIMEOUT_MS",
        1000,
        "milliseconds a commit waits for LIGHTPATH_REDIS_COMMIT_REPLICAS replicas; then the "
        "call answers UNAVAILABLE (retryable: the write may or may not have been kept)",
    )
    listen: Address = setting(
        "LIGHTPATH_LISTEN",
        "127.0.0.1:0",
        "gRPC listen address; port 0 picks a free one",
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
    tls_client_auth: Annotated[str, choice("require", "none")] = setting(
        "LIGHTPATH_TLS_CLIENT_AUTH",
        "require",
        "require: every caller presents a certificate from LIGHTPATH_TLS_CA (mTLS; a bearer token "
        "may still name the caller); none: server-only TLS, callers authenticate by bearer token",
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
    audit_level: Annotated[str, choice("none", "metadata", "request")] = setting(
        "LIGHTPATH_AUDIT_LEVEL",
        "metadata",
        "none, metadata (who, what, outcome) or request (also the request body)",
    )
    log_level: Annotated[str, choice("debug", "info", "warning", "error")] = setting(
        "LIGHTPATH_LOG_LEVEL",
        "info",
        "debug, info, warning or error",
    )
    log_format: Annotated[str, choice("json", "text")] = setting(
        "LIGHTPATH_LOG_FORMAT",
        "json",
        "json (one object per line) or text",
    )
    max_inflight: PositiveInt = setting(
        "LIGHTPATH_MAX_INFLIGHT",
        64,
        "calls from outside callers this process serves at once (health, GetInfo, streams, "
        "pods' heartbeats and calls between Lightpath services are not counted); more wait "
        "in a queue",
    )
    max_queued: NonNegativeInt = setting(
        "LIGHTPATH_MAX_QUEUED",
        128,
        "calls that may wait for one of LIGHTPATH_MAX_INFLIGHT; a call finding the queue full "
        "answers RESOURCE_EXHAUSTED (OVERLOADED) with a retry delay",
    )
    queue_wait_s: NonNegativeFloat = setting(
        "LIGHTPATH_QUEUE_WAIT_S",
        0.5,
        "seconds a queued call waits for a slot before it answers RESOURCE_EXHAUSTED "
        "(OVERLOADED) with a retry delay",
    )
    queue_target_s: NonNegativeFloat = setting(
        "LIGHTPATH_QUEUE_TARGET_S",
        0.1,
        "seconds a queued call waits at most once the queue has not been empty for 1 s "
        "(more is offered than served; CoDel's target): a call that waited longer answers "
        "RESOURCE_EXHAUSTED (OVERLOADED) with a retry delay; 0 lets every queued call "
        "wait LIGHTPATH_QUEUE_WAIT_S",
    )
    target_latency_s: NonNegativeFloat = setting(
        "LIGHTPATH_TARGET_LATENCY_S",
        0.5,
        "time the calls admitted should be served in (their wait in the queue not "
        "counted): a call slower than it lowers the number served at once (down to 4), "
        "faster ones raise it again (up to LIGHTPATH_MAX_INFLIGHT); the rest answer "
        "RESOURCE_EXHAUSTED (OVERLOADED) with a retry delay; 0 keeps "
        "LIGHTPATH_MAX_INFLIGHT fixed",
    )
    shutdown_grace_s: NonNegativeFloat = setting(
        "LIGHTPATH_SHUTDOWN_GRACE_S",
        5.0,
        "seconds in-flight calls may finish after SIGTERM",
    )
    task_backoff_max_s: NonNegativeFloat = setting(
        "LIGHTPATH_TASK_BACKOFF_MAX_S",
        5.0,
        "longest wait before a failed background task (heartbeat, reconcile, ...) restarts",
    )
    instance_id: str = setting(
        "LIGHTPATH_INSTANCE_ID", "", "unique name of this process; default host-pid"
    )
    otel_traces_exporter: Annotated[str, choice("none", "console", "otlp")] = setting(
        "OTEL_TRACES_EXPORTER",
        "none",
        "none, console or otlp (otlp needs the [otlp] extra)",
    )
    otel_metrics_exporter: Annotated[str, choice("none")] = setting(
        "OTEL_METRICS_EXPORTER",
        "none",
        "none: OpenTelemetry exports traces only; the metrics (rpc.server.duration and "
        "the services' own, deploy/monitoring/README.md) are served on LIGHTPATH_METRICS_LISTEN",
    )
    metrics_listen: MetricsListen = setting(
        "LIGHTPATH_METRICS_LISTEN",
        "",
        "Prometheus scrape endpoint (HTTP GET /metrics, plaintext) of this process: host:port, "
        "or a port alone for 127.0.0.1:PORT; empty: none. Bind a non-loopback host only where "
        "the network is trusted (deploy/monitoring)",
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

    @model_validator(mode="after")
    def check_commit_replicas(self) -> CommonSettings:
        if self.redis_commit_replicas and redis_url.parse(self.redis_url).kind == "cluster":
            # WAIT counts one node's replicas, and a cluster pipeline routes it anywhere.
            raise SettingsError(
                "LIGHTPATH_REDIS_COMMIT_REPLICAS works with one server or Sentinel, not a "
                "Redis Cluster: set it to 0 there and use min-replicas-to-write on the primaries"
            )
        return self

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


class TorusFabricSettings(CommonSettings):
    """A pod's OCS torus fabric; `check_fabric` refuses an impossible one at start."""

    fabric_block_shape: Annotated[str, rule(_fabric_shape)] = setting(
        "LIGHTPATH_FABRIC_BLOCK_SHAPE",
        "4x4x4",
        "chips per building block along each dimension (its length is the number of dimensions)",
    )
    fabric_blocks: PositiveInt = setting(
        "LIGHTPATH_FABRIC_BLOCKS",
        64,
        "building blocks in the pod (ids 0..N-1)",
    )
    fabric_ocs_per_axis: PositiveInt = setting(
        "LIGHTPATH_FABRIC_OCS_PER_AXIS",
        1,
        "K, OCS per logical axis; K >= 2 puts a 1xK switch on every segment's second end",
    )
    fabric_ocs_radix: PositiveInt = setting(
        "LIGHTPATH_FABRIC_OCS_RADIX",
        136,
        "ports of one OCS; must be >= ceil(N/K) + N",
    )

    @property
    def fabric_config(self) -> FabricConfig:
        return FabricConfig(
            parse_shape(self.fabric_block_shape),
            self.fabric_blocks,
            self.fabric_ocs_per_axis,
            self.fabric_ocs_radix,
        )

    @model_validator(mode="after")
    def check_fabric(self) -> TorusFabricSettings:
        """OCS-1: an impossible fabric is a SettingsError naming the variables and the need."""
        try:
            validate_config(self.fabric_config)
        except InvalidArgument as exc:
            raise SettingsError(
                "; ".join(f"{_FABRIC_ENV[v.field]}: {v.rule}" for v in exc.violations)
            ) from None
        return self
