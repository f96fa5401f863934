"""The one server factory and runtime all five services use (X-1).

    server, port = create_server("[::]:0", [definition], tracer_provider=tp)

gives a grpc.aio server with health checking (grpc.health.v1), reflection (v1
and v1alpha, lightpath_services.common.reflection),
tracing and error mapping. `running(...)` wraps the whole life of a service —
Redis, build, serve, graceful stop — and is what `__main__` (through `main`)
and the contract tests both use, so the tests run the real thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import grpc
import redis.asyncio as aioredis
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

from lightpath import __version__, limits
from lightpath.client import channel as client_channel
from lightpath.security.credentials import Credentials
from lightpath.security.tokens import TokenRegistry
from lightpath.telemetry import MetricsEndpoint, configure_metrics, configure_tracing, serve_metrics
from lightpath.v1 import common_pb2
from lightpath_services.common import heap, redis_store, reflection, tls
from lightpath_services.common.admission import Admission
from lightpath_services.common.audit import AuditLog
from lightpath_services.common.auth import Guard
from lightpath_services.common.settings import CommonSettings, SettingsError, load
from lightpath_services.common.supervisor import Factory, Supervisor
from lightpath_services.common.telemetry import ServerInterceptor, configure_logging

S = TypeVar("S", bound=CommonSettings)
log = logging.getLogger("lightpath.server")

# Answers may be large (a full pod's wiring, a page of jobs); what a service takes
# in is bounded by lightpath.limits.MAX_REQUEST_BYTES, per service.
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


@dataclass(frozen=True)
class ServiceDefinition:
    """One gRPC service to serve: its full name, servicer and generated `add_*_to_server`."""

    name: str
    servicer: Any
    register: Callable[[Any, grpc.aio.Server], None]


class Server:
    """A grpc.aio server with its health servicer, so stop() can drain gracefully."""

    def __init__(
        self,
        grpc_server: grpc.aio.Server,
        health_servicer: health.aio.HealthServicer,
        names: list[str],
    ):
        self.grpc = grpc_server
        self.health = health_servicer
        self.names = names

    async def start(self) -> None:
        await self.grpc.start()
        for name in ["", *self.names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        """NOT_SERVING first (load balancers stop sending), then let calls drain for `grace` s."""
        await self.health.enter_graceful_shutdown()
        await self.grpc.stop(grace)

    async def wait_for_termination(self) -> None:
        await self.grpc.wait_for_termination()

    async def set_serving(self, serving: bool) -> None:
        """Every name this server answers health for ("" too): SERVING or NOT_SERVING
        (ignored once a graceful stop has begun)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *self.names]:
            await self.health.set(name, status)


def create_server(
    address: str,
    services: Sequence[ServiceDefinition],
    *,
    tracer_provider: TracerProvider | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    credentials: grpc.ServerCredentials | None = None,
    guard: Guard | None = None,
    admission: Admission | None = None,
    max_request_bytes: int = limits.DEFAULT_REQUEST_BYTES,
) -> tuple[Server, int]:
    """Build (not start) a server for `services` on `address`; `127.0.0.1:0` binds an
    ephemeral port. With `credentials` it serves TLS; with a `guard` every call is
    authenticated, authorized and audited (lightpath_services.common.auth); with an `admission`
    limiter outside callers' unary calls are queued or shed under overload
    (lightpath_services.common.admission). gRPC refuses a request larger than
    `max_request_bytes` before it is parsed (RESOURCE_EXHAUSTED)."""
    server = grpc.aio.server(
        interceptors=[ServerInterceptor(tracer_provider, guard, admission), *interceptors],
        options=[*GRPC_OPTIONS, ("grpc.max_receive_message_length", max_request_bytes)],
    )
    for svc in services:
        svc.register(svc.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [svc.name for svc in services]
    reflection.enable([*names, health.SERVICE_NAME], server)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return Server(server, health_servicer, names), port


@dataclass
class Runtime(Generic[S]):
    """What a service's build function gets: its typed settings, Redis, tracing,
    and places to hang background tasks, peer channels and shutdown hooks."""

    service: str
    settings: S
    redis: aioredis.Redis
    tracer_provider: TracerProvider
    instance_id: str
    guard: Guard
    credentials: Credentials = field(default_factory=Credentials)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    port: int = 0  # the gRPC port, once bound (`listening` is then set)
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task] = field(default_factory=set)
    _channels: list[grpc.aio.Channel] = field(default_factory=list)
    _on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _on_drain: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    supervisor: Supervisor = field(init=False)

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(
            self.log, backoff_max_s=getattr(self.settings, "task_backoff_max_s", 5.0)
        )

    @property
    def log(self) -> logging.Logger:
        return logging.getLogger(f"lightpath.{self.service}")

    def supervise(
        self, factory: Factory, name: str, *, needed: bool = True, forever: bool = False
    ) -> asyncio.Task:
        """Run a long-lived background task (a loop: heartbeat, reconcile, watcher,
        reaper) under the supervisor: restarted with backoff when it fails, and while a
        `needed` one is down the service reports NOT_SERVING (lightpath_services.common.supervisor)."""
        task = self.supervisor.supervise(factory, name, needed=needed, forever=forever)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task:
        """Run the one-shot `coro` in the background until shutdown; a crash is logged,
        not swallowed silently, and not retried (loops go under `supervise`)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                self.log.error("background task %s crashed", name, exc_info=t.exception())

        task.add_done_callback(done)
        return task

    def channel(self, address: str, **kwargs: Any) -> grpc.aio.Channel:
        """A traced channel to a peer service, with this service's own credentials
        (its certificate: mTLS), closed at shutdown."""
        kwargs.setdefault("credentials", self.credentials)
        ch = client_channel(address, tracer_provider=self.tracer_provider, **kwargs)
        self._channels.append(ch)
        return ch

    def on_stop(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` at shutdown, after background tasks have stopped (last added, first run)."""
        self._on_stop.append(hook)

    def on_drain(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` when a graceful stop begins, while the server's calls drain: to end,
        once its own calls no longer need them, the streams this service holds open to
        peers that are stopping too (each peer's drain waits for them). Cancelled when
        the drain ends."""
        self._on_drain.append(hook)

    async def drain(self) -> None:
        """Every `on_drain` hook at once (a failure is logged)."""
        done = await asyncio.gather(*(hook() for hook in self._on_drain), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, Exception):
                self.log.error("drain hook failed", exc_info=outcome)

    def info(
        self, service_name: str, *, pod_id: str = "", **attributes: str
    ) -> common_pb2.ServiceInfo:
        """The GetInfo answer every service gives."""
        info = common_pb2.ServiceInfo(
            service=service_name,
            version=__version__,
            instance_id=self.instance_id,
            pod_id=pod_id,
            attributes={k: str(v) for k, v in attributes.items()},
        )
        info.started_at.FromDatetime(self.started_at)
        return info

    async def close(self) -> None:
        # Background tasks first: the hooks release what they use (clients, channels, buffers).
        await self._cancel_background()
        for hook in reversed(self._on_stop):
            try:
                await hook()
            except Exception:
                self.log.exception("shutdown hook failed")
        for ch in self._channels:
            await ch.close()

    async def _cancel_background(self, timeout: float = 5.0) -> None:
        """Cancel every background task, again and again until it ends: redis.asyncio
        can swallow a cancellation that lands mid-command (redis/redis-py#2028,
        #2551), and one swallowed cancel must not hang a shutdown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            _done, pending = await asyncio.wait(pending, timeout=0.05)
            if pending and loop.time() >= deadline:
                names = ", ".join(sorted(t.get_name() for t in pending))
                self.log.error("background tasks did not stop within %.0f s: %s", timeout, names)
                return


Build = Callable[[Runtime[Any]], Awaitable[Sequence[ServiceDefinition]]]


@dataclass
class RunningService:
    port: int
    runtime: Runtime[Any]
    server: Server
    metrics: MetricsEndpoint | None = None  # the scrape endpoint (LIGHTPATH_METRICS_LISTEN)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float) -> None:
        """Stop serving now, as the end of `running` does (which then finds it stopped):
        for services stopped together, each draining while the others do."""
        await stop_serving(self.server, self.runtime, grace)


async def stop_serving(server: Server, runtime: Runtime[Any], grace: float) -> None:
    """NOT_SERVING, then in-flight calls get up to `grace` s while the service's drain
    hooks (Runtime.on_drain) end what it holds open to its peers."""
    draining = asyncio.create_task(runtime.drain(), name=f"{runtime.service} drain")
    try:
        await server.stop(grace)
    finally:
        draining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await draining


@contextlib.asynccontextmanager
async def running(
    service: str,
    settings: CommonSettings,
    build: Build,
    *,
    tracer_provider: TracerProvider | None = None,
    redis_client: aioredis.Redis | None = None,
    grace: float | None = None,
) -> AsyncIterator[RunningService]:
    """Serve `service` until the block exits, then stop gracefully and release everything."""
    instance_id = settings.resolved_instance_id
    provider = tracer_provider or configure_tracing(
        settings.otel_service_name or f"lightpath-{service}",
        instance_id=instance_id,
        set_global=False,
    )
    tls.check(settings)
    server_credentials = tls.server_credentials(settings)
    credentials = tls.client_credentials(settings)
    own_redis = redis_client is None
    client = redis_client or redis_store.connect_with(settings)
    await redis_store.wait_ready(client)
    audit = AuditLog(service, instance_id, settings.audit_log, settings.audit_level)
    guard = Guard(
        service,
        scope=str(getattr(settings, "pod_id", "") or getattr(settings, "switch_id", "")),
        verifiers=[TokenRegistry(client)],
        audit=audit,
    )
    runtime = Runtime(service, settings, client, provider, instance_id, guard, credentials)
    server: Server | None = None
    endpoint: MetricsEndpoint | None = None
    try:
        if settings.metrics_listen:
            # Before build: a service that cannot be scraped where it was told to be is
            # misconfigured, and should say so at start.
            endpoint = serve_metrics(settings.metrics_listen)
            log.info(
                "%s metrics on %s",
                service,
                endpoint.url,
                extra={"metrics_url": endpoint.url},
            )
        definitions = await build(runtime)
        server, port = create_server(
            settings.listen,
            definitions,
            tracer_provider=provider,
            credentials=server_credentials,
            guard=guard,
            admission=Admission(
                settings.max_inflight,
                settings.max_queued,
                settings.queue_wait_s,
                service=service,
                target_s=settings.target_latency_s,
                queue_target_s=settings.queue_target_s,
            ),
            max_request_bytes=limits.request_bytes(service),
        )
        runtime.port = port
        runtime.listening.set()
        await server.start()
        # A needed task may have failed already (during build): say so now.
        await runtime.supervisor.attach_health(server.set_serving)
        host = settings.listen.rpartition(":")[0]
        security = (
            "plaintext, loopback only"
            if server_credentials is None
            else "TLS, client certificates "
            + ("required" if settings.tls_client_auth == "require" else "not asked for")
        )
        log.info(
            "%s serving on %s:%d (%s)",
            service,
            host,
            port,
            security,
            extra={"port": port, "bind": host, "security": security},
        )
        yield RunningService(port, runtime, server, endpoint)
    finally:
        if server is not None:
            await stop_serving(
                server, runtime, settings.shutdown_grace_s if grace is None else grace
            )
        await runtime.close()
        if endpoint is not None:
            endpoint.close()
        audit.close()
        if own_redis:
            await client.aclose()


def main(service: str, settings_cls: type[S], build: Build, argv: list[str] | None = None) -> None:
    """Entry point of `python -m services.<name>`: settings, logging, tracing, serve until SIGTERM/SIGINT."""
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in {"-h", "--help"}:
        from lightpath_services.common.settings import describe

        print(f"lightpath {service}: configured by environment variables\n")
        for d in describe(settings_cls):
            print(f"  {d.env:<36} default {d.default:<28} {d.doc}")
        return
    heap.bound_heap()
    try:
        settings = load(settings_cls)
    except SettingsError as exc:
        print(f"lightpath {service}: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    instance_id = settings.resolved_instance_id
    configure_logging(service, instance_id, settings.log_level, settings.log_format)
    try:
        provider = configure_tracing(
            settings.otel_service_name or f"lightpath-{service}",
            exporter=settings.otel_traces_exporter,
            instance_id=instance_id,
            console_file=settings.otel_console_file,
        )
        configure_metrics(
            settings.otel_service_name or f"lightpath-{service}",
            exporter=settings.otel_metrics_exporter,
            instance_id=instance_id,
            prometheus=bool(settings.metrics_listen),
        )
    except (RuntimeError, OSError) as exc:
        print(f"lightpath {service}: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        tls.check(settings)
    except tls.TransportError as exc:
        print(f"lightpath {service}: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with running(service, settings, build, tracer_provider=provider):
            await stop.wait()
            log.info(
                "%s stopping: draining calls for up to %.1f s", service, settings.shutdown_grace_s
            )
        provider.shutdown()

    try:
        asyncio.run(serve())
    except Exception as exc:
        logging.getLogger("lightpath.server").critical(
            "%s could not start: %s", service, exc, exc_info=True
        )
        raise SystemExit(1) from None
