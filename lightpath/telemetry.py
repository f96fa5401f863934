"""OpenTelemetry for Lightpath processes (X-2): tracer set-up and the client side
of trace propagation.

Every outgoing call made through `lightpath.client.channel` gets a CLIENT span
and carries its context in gRPC metadata (W3C traceparent, through the globally
configured propagator); the server side (lightpath_services.common.telemetry) continues
that trace in a SERVER span. Exporters follow the standard OTEL_* variables:
OTEL_TRACES_EXPORTER none (default) | console | otlp.

Metrics are prometheus_client's (lightpath_services.common.instruments): a service with
LIGHTPATH_METRICS_LISTEN records them (`configure_metrics`) and serves them on a scrape
endpoint (`serve_metrics`). The console span exporter writes one JSON object per line
to stdout or to a file (`console_file`), never to stderr, where the JSON-lines logs go.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import IO, Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from lightpath import __version__

TRACER_NAME = "lightpath"


# Bucket boundaries (seconds) of every histogram whose unit is `s`: from a fast Redis
# command (~0.1 ms) to a slow queue wait (minutes). The OTel default boundaries
# (0..10000) are meant for milliseconds.
SECONDS_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

_CONSOLE_FILES: dict[str, IO[str]] = {}


def console_stream(path: str = "") -> IO[str]:
    """Where console exporters write: `path` (appended, line-buffered), or stdout when
    empty. A service never writes them to stderr: that is its JSON-lines log stream
    (lightpath_services.common.telemetry). The CLI, whose stdout is its output, names "stderr"."""
    if not path or path == "-":
        return sys.stdout
    if path == "stderr":
        return sys.stderr
    stream = _CONSOLE_FILES.get(path)
    if stream is None:
        stream = _CONSOLE_FILES[path] = open(path, "a", buffering=1, encoding="utf-8")
    return stream


def _one_line(item: Any) -> str:
    """A span or a metrics export as one JSON object on one line (the SDK's default is
    indented JSON across many lines, which no JSON-lines reader can take)."""
    return item.to_json(indent=None) + "\n"


def configure_tracing(
    service_name: str,
    *,
    exporter: str | None = None,
    instance_id: str = "",
    set_global: bool = True,
    console_file: str = "",
) -> TracerProvider:
    """A TracerProvider for this process.

    Spans are always created (logs carry their trace ids); they are exported
    only when `exporter` (default: $OTEL_TRACES_EXPORTER, else "none") says so;
    the console exporter writes to `console_file` (default stdout), one span per line.
    """
    exporter = (exporter or os.environ.get("OTEL_TRACES_EXPORTER") or "none").lower()
    attrs: dict[str, Any] = {"service.name": service_name, "service.version": __version__}
    if instance_id:
        attrs["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attrs))
    if exporter == "console":
        provider.add_span_processor(
            BatchSpanProcessor(
                ConsoleSpanExporter(out=console_stream(console_file), formatter=_one_line)
            )
        )
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "OTEL_TRACES_EXPORTER=otlp needs `pip install lightpath[otlp]`"
            ) from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif exporter != "none":
        raise RuntimeError(
            f"OTEL_TRACES_EXPORTER={exporter!r} is invalid: must be none, console or otlp"
        )
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


_METRICS = False


def metrics_enabled() -> bool:
    """True once `configure_metrics(prometheus=True)` ran: this process serves metrics,
    so lightpath_services.common.instruments records (else its records are dropped)."""
    return _METRICS


def configure_metrics(
    service_name: str,
    *,
    exporter: str | None = None,
    instance_id: str = "",
    prometheus: bool = False,
) -> None:
    """With `prometheus`, record the services' metrics (lightpath_services.common.instruments, into
    prometheus_client's registry, which `serve_metrics` serves) and show `target_info`
    (service.name, service.version, service.instance.id). OpenTelemetry exports traces
    only: OTEL_METRICS_EXPORTER may only be `none`."""
    global _METRICS
    exporter = (exporter or os.environ.get("OTEL_METRICS_EXPORTER") or "none").lower()
    if exporter != "none":
        raise RuntimeError(
            f"OTEL_METRICS_EXPORTER={exporter!r} is invalid: must be none (metrics are "
            "served to Prometheus on LIGHTPATH_METRICS_LISTEN; OpenTelemetry exports traces)"
        )
    if not prometheus or _METRICS:
        return
    from prometheus_client import REGISTRY
    from prometheus_client.core import GaugeMetricFamily

    labels = {"service_name": service_name, "service_version": __version__}
    if instance_id:
        labels["service_instance_id"] = instance_id

    class _TargetInfo:
        def describe(self) -> list[Any]:
            return []

        def collect(self) -> list[Any]:
            family = GaugeMetricFamily("target_info", "Target metadata", labels=list(labels))
            family.add_metric(list(labels.values()), 1)
            return [family]

    REGISTRY.register(_TargetInfo())  # type: ignore[arg-type]
    _METRICS = True


class MetricsEndpoint:
    """A running Prometheus scrape endpoint (HTTP, GET /metrics) on its own thread."""

    def __init__(self, host: str, port: int, server: Any, thread: Any):
        self.host = host
        self.port = port
        self._server = server
        self._thread = thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(address: str) -> MetricsEndpoint:
    """Serve prometheus_client's registry (the services' metrics, lightpath_services.common.instruments,
    besides the process's CPU, memory and GC metrics) on
    `address` (host:port, [v6]:port; port 0 picks a free one)."""
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    server, thread = start_http_server(int(port), addr=host)
    return MetricsEndpoint(host, server.server_port, server, thread)


def _method_parts(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return service, name


def _rpc_attributes(method: str) -> dict[str, str]:
    service, name = _method_parts(method)
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def _as_text(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


class _ClientTelemetry:
    """Shared body of the four aio client interceptors: span, context injection,
    default deadline for calls that return one response."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        default_timeout: float | None,
        extra_metadata: tuple[tuple[str, str], ...] = (),
    ):
        self._extra = extra_metadata
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            TRACER_NAME, __version__
        )
        self._default_timeout = default_timeout
        # Per method (as the channel gives it): span name and attributes.
        self._names: dict[str | bytes, tuple[str, dict[str, str]]] = {}

    def _start(self, details: grpc.aio.ClientCallDetails, unary_response: bool):
        named = self._names.get(details.method)
        if named is None:
            method = _as_text(details.method)
            named = self._names[details.method] = (method.lstrip("/"), _rpc_attributes(method))
        span = self._tracer.start_span(named[0], kind=SpanKind.CLIENT, attributes=named[1])
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        metadata = grpc.aio.Metadata(*(tuple(details.metadata or ())), *self._extra)
        for k, v in carrier.items():
            metadata[k] = v
        timeout = details.timeout
        if timeout is None and unary_response:
            timeout = self._default_timeout
        new_details = grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=timeout,
            metadata=metadata,
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )
        return span, new_details

    @staticmethod
    def _finish_when_done(span: trace.Span, call: grpc.aio.Call) -> None:
        def done(c: grpc.aio.Call) -> None:
            task = asyncio.ensure_future(_end_span(span, c))
            _ENDING.add(task)
            task.add_done_callback(_ENDING.discard)

        call.add_done_callback(done)


# Tasks that read a finished call's status and end its span; held here so the
# event loop's weak references do not let them be collected half-way.
_ENDING: set[asyncio.Future] = set()


async def _end_span(span: trace.Span, call: grpc.aio.Call) -> None:
    try:
        code = await call.code()
        _set_code(span, code, await call.details() if code != grpc.StatusCode.OK else "")
    finally:
        span.end()


def _set_code(span: trace.Span, code: grpc.StatusCode, details: str) -> None:
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code != grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}"))


class _UnaryUnary(_ClientTelemetry, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        # One response: the span ends when it arrives (or the error does), here, rather
        # than from a task started by the call's done callback (one task less per call).
        # The call is returned as it is, so the caller sees the same response, error,
        # status and metadata.
        span, details = self._start(client_call_details, unary_response=True)
        try:
            call = await continuation(details, request)
            await call
        except grpc.aio.AioRpcError as err:
            _set_code(span, err.code(), err.details() or "")
            span.end()
            raise
        except asyncio.CancelledError:
            _set_code(span, grpc.StatusCode.CANCELLED, "cancelled by the caller")
            span.end()
            raise
        except BaseException:
            span.end()
            raise
        _set_code(span, grpc.StatusCode.OK, "")
        span.end()
        return call


class _UnaryStream(_ClientTelemetry, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        span, details = self._start(client_call_details, unary_response=False)
        call = await continuation(details, request)
        self._finish_when_done(span, call)
        return call


class _StreamUnary(_ClientTelemetry, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        span, details = self._start(client_call_details, unary_response=True)
        call = await continuation(details, request_iterator)
        self._finish_when_done(span, call)
        return call


class _StreamStream(_ClientTelemetry, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        span, details = self._start(client_call_details, unary_response=False)
        call = await continuation(details, request_iterator)
        self._finish_when_done(span, call)
        return call


def client_interceptors(
    tracer_provider: TracerProvider | None = None,
    default_timeout: float | None = 10.0,
    extra_metadata: tuple[tuple[str, str], ...] = (),
) -> list[grpc.aio.ClientInterceptor]:
    """Tracing and default deadlines; `extra_metadata` (a bearer token) goes on every call."""
    return [
        cls(tracer_provider, default_timeout, extra_metadata)
        for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    ]
