"""The one place services reach Redis from (X-4).

`connect(url)` returns a `redis.asyncio.Redis` that retries connection errors
with backoff, so a Redis restart costs a few slow calls rather than a crashed
service. Its pool is bounded (LIGHTPATH_REDIS_MAX_CONNECTIONS) and a call waits
for a free connection at most LIGHTPATH_REDIS_POOL_TIMEOUT_S, then fails with a
ConnectionError the server answers as UNAVAILABLE (lightpath_services.common.errors).
Keys come from lightpath_services.common.keys; multi-key changes go through the transaction
primitive (lightpath_services.common.txn: one Lua script per store, re-loaded when a restarted
Redis forgot it) or MULTI/WATCH.

`instrument(client)` (done by `connect` when the process serves metrics) times
every command: lightpath.redis.command.duration (s, by command; a pipeline or
MULTI is one, named PIPELINE or MULTI) and lightpath.redis.command.errors (by
command and exception type), on the Prometheus endpoint. Otherwise the client is
left as it is.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lightpath import __version__, redis_url, telemetry
from lightpath_services.common import instruments, txn
from lightpath_services.common.errors import Unavailable


class _RedisMetrics:
    """lightpath.redis.command.duration and .errors (lightpath_services.common.instruments). Made on
    first use, once per process; a recorder bound per command name (a busy service runs
    several Redis commands per request)."""

    def __init__(self) -> None:
        meter = instruments.get_meter("lightpath.redis", __version__)
        self.duration = meter.create_histogram(
            "lightpath.redis.command.duration",
            unit="s",
            description="time of one Redis command (a pipeline or MULTI counts as one), "
            "retries included",
        )
        self.errors = meter.create_counter(
            "lightpath.redis.command.errors",
            description="Redis commands that failed, by command and exception type",
        )
        # One recorder per command name, bound once: the hot path is a dict get and a call.
        self.timers: dict[Any, Any] = {}

    def timer(self, command: Any) -> Any:
        record = self.timers.get(command)
        if record is None:
            record = self.duration.bind({"command": _name(command)})
            if len(self.timers) < 512:  # command names are a small fixed set
                self.timers[command] = record
        return record


_metrics: _RedisMetrics | None = None


def _redis_metrics() -> _RedisMetrics:
    global _metrics
    if _metrics is None:
        _metrics = _RedisMetrics()
    return _metrics


def _name(command: Any) -> str:
    name = command.decode() if isinstance(command, bytes) else str(command)
    return name.split(" ", 1)[0].upper()


def metrics_enabled() -> bool:
    """True when this process serves metrics (lightpath.telemetry.configure_metrics)."""
    return telemetry.metrics_enabled()


def instrument(client: Any) -> Any:
    """Time `client`'s commands and pipelines (see the module docstring); returns it."""
    if getattr(client, "_lightpath_instrumented", False):
        return client
    execute = client.execute_command
    clock = time.perf_counter
    timer = _redis_metrics().timer

    async def execute_command(*args: Any, **options: Any) -> Any:
        start = clock()
        try:
            result = await execute(*args, **options)
        except BaseException as exc:
            _failed(args[0] if args else "", exc)
            raise
        timer(args[0])(clock() - start)
        return result

    make_pipeline = client.pipeline

    def pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make_pipeline(*args, **kwargs)
        run = pipe.execute

        async def execute_pipeline(*a: Any, **kw: Any) -> Any:
            name = "MULTI" if getattr(pipe, "is_transaction", False) else "PIPELINE"
            start = clock()
            try:
                result = await run(*a, **kw)
            except BaseException as exc:
                _failed(name, exc)
                raise
            timer(name)(clock() - start)
            return result

        pipe.execute = execute_pipeline
        return pipe

    client.execute_command = execute_command
    client.pipeline = pipeline
    client._lightpath_instrumented = True
    return client


def _failed(command: Any, exc: BaseException) -> None:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return  # the caller gave up: not Redis's failure
    _redis_metrics().errors.add(1, {"command": _name(command), "error": type(exc).__name__})


def read_password(path: str) -> str | None:
    """The Redis password kept in `path` (LIGHTPATH_REDIS_PASSWORD_FILE), None when unset."""
    if not path:
        return None
    from pathlib import Path

    return Path(path).read_text().strip()


class _Retry(Retry):
    """Retries connection errors and timeouts, but not a refused password: redis-py's
    AuthenticationError is a ConnectionError, and retrying one only delays the message
    that says what is wrong (by ~18 s)."""

    async def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # type: ignore[override]
        def retryable(error: Exception) -> bool:
            if isinstance(error, AuthenticationError | AuthenticationWrongNumberOfArgsError):
                return False
            return is_retryable(error) if is_retryable else True

        return await super().call_with_retry(do, fail, retryable, with_failure_count)


def connect_with(settings: Any, *, decode_responses: bool = True) -> aioredis.Redis:
    """A client of the Redis a service's settings (CommonSettings) name: its URL, pool
    bounds, password file and how many replicas a commit waits for."""
    client = connect(
        settings.redis_url,
        decode_responses=decode_responses,
        max_connections=settings.redis_max_connections,
        pool_timeout_s=settings.redis_pool_timeout_s,
        password=read_password(settings.redis_password_file),
    )
    durability = txn.Durability(settings.redis_commit_replicas, settings.redis_commit_timeout_ms)
    return txn.require_replicas(client, durability)


def connect(
    url: str,
    *,
    decode_responses: bool = True,
    max_connections: int = 64,
    pool_timeout_s: float = 2.0,
    password: str | None = None,
) -> aioredis.Redis:
    """A client of `url` (one server, a Redis Cluster or the master a Sentinel names:
    lightpath.redis_url) with at most `max_connections` connections (per node of a
    cluster); a command that finds them all busy waits up to `pool_timeout_s` for one
    (then ConnectionError "No connection available."; a cluster node's pool fails at
    once with MaxConnectionsError). `password` (from a file, not the URL) overrides
    the URL's. In a process serving metrics its commands are timed (`instrument`)."""
    client = redis_url.client(
        url,
        decode_responses=decode_responses,
        password=password,
        max_connections=max_connections,
        pool_timeout_s=pool_timeout_s,
        retry=_Retry(ExponentialBackoff(cap=1.0, base=0.02), retries=6),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        socket_connect_timeout=2.0,
        health_check_interval=30,
    )
    return instrument(client) if metrics_enabled() else client


def describe(client: Any) -> str:
    """Which Redis `client` talks to, for people."""
    nodes = getattr(client, "startup_nodes", None)
    if nodes:
        return "the Redis Cluster at " + ",".join(
            getattr(n, "name", str(n))
            for n in (nodes.values() if isinstance(nodes, dict) else nodes)
        )
    pool = client.connection_pool
    if getattr(pool, "service_name", ""):
        return f"the master {pool.service_name!r} named by Redis Sentinel"
    kw = pool.connection_kwargs
    return str(kw.get("path") or f"{kw.get('host')}:{kw.get('port')}")


async def wait_ready(client: aioredis.Redis, timeout: float = 10.0) -> None:
    """PING until Redis answers; raise Unavailable naming the URL after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.ping()
            return
        except (AuthenticationError, AuthenticationWrongNumberOfArgsError) as exc:
            raise Unavailable(
                f"Redis refused this client's credentials ({exc}): give the password in "
                "LIGHTPATH_REDIS_PASSWORD_FILE, or in LIGHTPATH_REDIS_URL as "
                "redis://[user]:PASSWORD@host:port/db"
            ) from exc
        except ResponseError as exc:
            if "NOAUTH" not in str(exc) and "NOPERM" not in str(exc):
                raise
            raise Unavailable(
                f"Redis needs a password ({exc}): give it in LIGHTPATH_REDIS_PASSWORD_FILE, "
                "or in LIGHTPATH_REDIS_URL as redis://[user]:PASSWORD@host:port/db"
            ) from exc
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"Redis at {describe(client)} did not answer within {timeout:.0f} s: {exc}"
                ) from exc
            await asyncio.sleep(0.1)
