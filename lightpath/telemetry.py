"""OpenTelemetry for Lightpath processes (X-2): tracer set-up and the client side
of trace propagation.

Every outgoing call made through `lightpath.client.channel` gets a CLIENT span
and carries its context in gRPC metadata (W3C traceparent, through the globally
configured propagator); the server side (services.common.telemetry) continues
that trace in a SERVER span. Exporters follow the standard OTEL_* variables:
OTEL_TRACES_EXPORTER none (default) | console | otlp.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from lightpath import __version__

TRACER_NAME = "lightpath"


def configure_tracing(
    service_name: str,
    *,
    exporter: str | None = None,
    instance_id: str = "",
    set_global: bool = True,
) -> TracerProvider:
    """A TracerProvider for this process.

    Spans are always created (logs carry their trace ids); they are exported
    only when `exporter` (default: $OTEL_TRACES_EXPORTER, else "none") says so.
    """
    exporter = (exporter or os.environ.get("OTEL_TRACES_EXPORTER") or "none").lower()
    attrs: dict[str, Any] = {"service.name": service_name, "service.version": __version__}
    if instance_id:
        attrs["service.instance.id"] = instance_id
    provider = TracerProvider(resource=Resource.create(attrs))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
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


def configure_metrics(
    service_name: str, *, exporter: str | None = None, instance_id: str = ""
) -> Any:
    """Install a global MeterProvider exporting per OTEL_METRICS_EXPORTER
    (none by default: instruments then cost nothing). Returns the provider, to
    be shut down (flushed) at exit, or None."""
    exporter = (exporter or os.environ.get("OTEL_METRICS_EXPORTER") or "none").lower()
    if exporter == "none":
        return None
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    if exporter == "console":
        metric_exporter: Any = ConsoleMetricExporter()
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "OTEL_METRICS_EXPORTER=otlp needs `pip install lightpath[otlp]`"
            ) from exc
        metric_exporter = OTLPMetricExporter()
    else:
        raise RuntimeError(
            f"OTEL_METRICS_EXPORTER={exporter!r} is invalid: must be none, console or otlp"
        )
    attrs: dict[str, Any] = {"service.name": service_name, "service.version": __version__}
    if instance_id:
        attrs["service.instance.id"] = instance_id
    provider = MeterProvider(
        resource=Resource.create(attrs),
        metric_readers=[PeriodicExportingMetricReader(metric_exporter)],
    )
    metrics.set_meter_provider(provider)
    return provider


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
