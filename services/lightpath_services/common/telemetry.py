"""Server side of telemetry and error mapping (X-1, X-2, X-3).

`ServerInterceptor` wraps every RPC of a service:
  * continues the caller's trace from gRPC metadata in a SERVER span;
  * records rpc.server.duration (on the scrape endpoint, LIGHTPATH_METRICS_LISTEN) and
    counts refused calls (lightpath.auth.failures);
  * asks the service's Guard who is calling and whether they may (UNAUTHENTICATED /
    PERMISSION_DENIED before the servicer runs), and writes the audit log;
  * admits the call through the service's Admission limiter, which queues it or
    sheds it (RESOURCE_EXHAUSTED with a retry delay) when the service is overloaded
    (lightpath_services.common.admission says which calls are never shed); a call
    refused without waiting is answered before its span opens (`_shed_at_door`);
  * turns a LightpathError into its gRPC status with google.rpc details, a Redis
    failure into UNAVAILABLE with a retry delay (lightpath_services.common.errors.from_redis),
    and any other exception into INTERNAL, logged with its trace id;
  * answers INVALID_ARGUMENT, naming the message type, for request bytes that do
    not parse, and naming the field and its limit for a request with a field over
    its limit (lightpath.limits): the request deserializer runs before any handler,
    so the interceptor wraps it, and either becomes a marker the call turns into
    the status once the caller is authenticated.

`configure_logging` makes logs structured (one JSON object per line) and stamps
each record with the current trace and span ids.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from redis.exceptions import RedisError

from lightpath import __version__, limits
from lightpath.telemetry import TRACER_NAME, _rpc_attributes
from lightpath_services.common import heap, instruments
from lightpath_services.common.admission import (
    DOWNSTREAM_BUSY,
    OVERLOADED,
    Admission,
    exempt_principal,
    sheddable,
)
from lightpath_services.common.auth import Guard, count_failure
from lightpath_services.common.errors import (
    MAX_MESSAGE,
    InvalidArgument,
    LightpathError,
    from_redis,
    short,
    to_status_proto,
)

log = logging.getLogger("lightpath.rpc")

# Calls too frequent and too dull to trace (probes, reflection).
UNTRACED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
# The INFO line per refused call, sampled (RefusalLog): this many of each method and
# code per REFUSAL_LOG_S are written one by one, the rest counted.
REFUSALS_LOGGED = 10
REFUSAL_LOG_S = 1.0


class RefusalLog:
    """Which refused calls get their INFO line, as zap's sampler decides: the first
    REFUSALS_LOGGED of each method and status code in an interval of REFUSAL_LOG_S are
    written as they come, the rest are counted and written as one line per method and
    code once the interval is over (at the next refusal, or by a timer). A flood of
    refused calls (a client's mistakes, a pod's refusals relayed) then costs a few
    lines a second, not one each: ~100 us of a ~900 us refusal (issue 30,
    bench/refusal_cost.py). What the audit log writes is not sampled."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._start = -float("inf")
        self._seen: dict[tuple[str, str], int] = {}
        self._flushing = False

    def admit(self, method: str, code: str) -> bool:
        """Whether this refusal of `method` with `code` is written on its own."""
        now = self._clock()
        if now - self._start >= REFUSAL_LOG_S:
            self.flush()
            self._start = now
        key = (method, code)
        seen = self._seen[key] = self._seen.get(key, 0) + 1
        if seen <= REFUSALS_LOGGED:
            return True
        if not self._flushing:
            self._flushing = True
            try:
                asyncio.get_running_loop().call_later(REFUSAL_LOG_S, self.flush)
            except RuntimeError:  # no loop: written with the next interval's first
                pass
        return False

    def flush(self) -> None:
        """One line per method and code whose refusals were not all written."""
        seen, self._seen = self._seen, {}
        self._flushing = False
        self._start = -float("inf")
        for (method, code), n in seen.items():
            if n > REFUSALS_LOGGED:
                log.info(
                    "%s -> %s: %d more refused call(s), not logged one by one (the first %d "
                    "of each method and code in %g s are)",
                    method,
                    code,
                    n - REFUSALS_LOGGED,
                    REFUSALS_LOGGED,
                    REFUSAL_LOG_S,
                    extra={"rpc_method": method, "code": code, "refused": n - REFUSALS_LOGGED},
                )


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return trace.format_trace_id(ctx.trace_id) if ctx.is_valid else ""


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        guard: Guard | None = None,
        admission: Admission | None = None,
    ):
        self._guard = guard
        self._admission = admission
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(
            TRACER_NAME, __version__
        )
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}
        self._refusals = RefusalLog()
        self._duration = instruments.get_meter(TRACER_NAME, __version__).create_histogram(
            "rpc.server.duration", unit="ms", description="time to serve one RPC"
        )

    async def intercept_service(self, continuation, handler_call_details):
        # Handlers are static per method: wrap each once, not on every call.
        method: str = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = wrapped
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        traced = not method.startswith(UNTRACED_PREFIXES)
        admission = (
            self._admission.lane(method)
            if self._admission is not None and sheddable(method, streaming=not handler.unary_unary)
            else None
        )
        deserializer = _tolerant(handler.request_deserializer)
        # Only protobuf deserializers are wrapped: raw-bytes ones (agg_switch's data
        # path) never raise and keep their speed.
        checked = deserializer is not handler.request_deserializer
        kwargs = {
            "request_deserializer": deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method, traced, checked, False, admission),
                **kwargs,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(handler.stream_unary, method, traced, False, checked), **kwargs
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method, traced, checked, False), **kwargs
            )
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(handler.stream_stream, method, traced, False, checked), **kwargs
        )

    def _span(self, method: str, context: grpc.aio.ServicerContext, traced: bool):
        if not traced:
            return trace.use_span(trace.INVALID_SPAN)
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        return self._tracer.start_as_current_span(
            method.lstrip("/"),
            context=propagate.extract(metadata),
            kind=SpanKind.SERVER,
            attributes=_rpc_attributes(method),
            record_exception=False,
            set_status_on_exception=False,
        )

    def _wrap_unary(
        self,
        inner: Callable,
        method: str,
        traced: bool,
        check_one: bool,
        check_each: bool,
        admission: Admission | None = None,
    ):
        async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            gate = _Gate(self._guard, method)
            if admission is not None and admission.would_refuse():
                await self._shed_at_door(gate, admission, request, context, check_one, start)
            code = grpc.StatusCode.OK
            admitted: Admission | None = None
            served = start
            busy = False  # refused further down as too busy (admission: a drop)
            shed = False  # refused by admission after a wait in its queue
            with self._span(method, context, traced) as span:
                try:
                    await gate.enter(context, span)
                    if check_one and type(request) is _Undecodable:
                        raise request.error()  # before admission: it costs no slot
                    if admission is not None and not exempt_principal(gate.principal):
                        shed = True
                        await admission.acquire()
                        shed = False
                        admitted = admission
                        served = time.perf_counter()  # the limit adapts to this part
                    result = inner(_checked(request) if check_each else request, context)
                    if inspect.isawaitable(result):
                        result = await result
                    return result
                except Exception as caught:
                    exc = _mapped(caught)
                    code = _code_of(exc, context)
                    if code in _DENIED:
                        count_failure(getattr(exc, "reason", "") or code.name)
                    busy = getattr(exc, "reason", "") in DOWNSTREAM_BUSY
                    gate.message = short(getattr(exc, "message", ""), MAX_MESSAGE)
                    await _abort_for(exc, span, method, context, self._refusals)
                finally:
                    if admitted is not None:
                        admitted.observe(time.perf_counter() - served, dropped=busy)
                        admitted.release()
                    gate.leave(code, request, shed=shed)
                    self._record(method, code, start)

        return behavior

    async def _shed_at_door(
        self,
        gate: _Gate,
        admission: Admission,
        request: Any,
        context: grpc.aio.ServicerContext,
        check_one: bool,
        start: float,
    ) -> None:
        """Answer a call the limiter refuses at once (every slot taken, no place to
        wait) with RESOURCE_EXHAUSTED and its retry delay, before a span, a log line or
        an exception of its own, and count it in the audit log (issue 30: at 4x the
        load most calls are refused, and a refusal's cost is CPU taken from the calls
        served). The caller is authenticated and authorized first: an anonymous one
        learns only UNAUTHENTICATED, a denied one PERMISSION_DENIED, and those, a
        request that does not parse, a call from another service or one that may now
        wait after all go on (return) to the full path, which answers them."""
        try:
            await gate.enter(context, None)
        except Exception:
            return  # the full path authenticates again, in its span, and answers
        if (check_one and type(request) is _Undecodable) or exempt_principal(gate.principal):
            return
        refusal = admission.refusal_now()
        if refusal is None:
            return
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        try:
            await context.abort(
                code,
                refusal.message,
                trailing_metadata=(
                    ("grpc-status-details-bin", to_status_proto(refusal).SerializeToString()),
                ),
            )
        finally:
            gate.leave(code, request, shed=True)
            self._record(gate.method, code, start)

    def _wrap_stream(
        self, inner: Callable, method: str, traced: bool, check_one: bool, check_each: bool
    ):
        async def behavior(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            with self._span(method, context, traced) as span:
                gate = _Gate(self._guard, method)
                try:
                    await gate.enter(context, span)
                    if check_one and type(request) is _Undecodable:
                        raise request.error()
                    result = inner(_checked(request) if check_each else request, context)
                    if inspect.isasyncgen(result):
                        async for item in result:
                            yield item
                    elif inspect.isawaitable(result):
                        await result
                    else:
                        for item in result:
                            yield item
                except Exception as caught:
                    exc = _mapped(caught)
                    code = _code_of(exc, context)
                    if code in _DENIED:
                        count_failure(getattr(exc, "reason", "") or code.name)
                    gate.message = short(getattr(exc, "message", ""), MAX_MESSAGE)
                    await _abort_for(exc, span, method, context, self._refusals)
                finally:
                    gate.leave(code, request)
                    self._record(method, code, start)

        return behavior

    def _record(self, method: str, code: grpc.StatusCode, start: float) -> None:
        self._duration.record(
            (time.perf_counter() - start) * 1000.0,
            {"rpc.method": method, "rpc.grpc.status_code": code.name},
        )


_DENIED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class _Undecodable:
    """What a wrapped request deserializer gives for bytes that do not parse, or
    for a request with a field over its limit (lightpath.limits): the call answers
    INVALID_ARGUMENT before the servicer sees it."""

    __slots__ = ("detail", "too_large", "type_name")

    def __init__(self, type_name: str, detail: str, too_large: InvalidArgument | None = None):
        self.type_name = type_name
        self.detail = detail
        self.too_large = too_large

    def error(self, index: int | None = None) -> InvalidArgument:
        if self.too_large is not None:
            if index is None:
                return self.too_large
            (v,) = self.too_large.violations[:1]
            return InvalidArgument(
                f"request[{index}].{v.field}", v.rule, reason=self.too_large.reason
            )
        return InvalidArgument(
            "request" if index is None else f"request[{index}]",
            f"the bytes do not parse as a {self.type_name} ({self.detail})",
            reason="MALFORMED_REQUEST",
        )


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserializer` (a generated message class's FromString) returning an
    _Undecodable instead of raising DecodeError or for a field over its limit
    (lightpath.limits.check); any other deserializer as it is."""
    message_type = getattr(deserializer, "__self__", None)
    if deserializer is None or not (
        isinstance(message_type, type) and issubclass(message_type, Message)
    ):
        return deserializer
    parse = deserializer
    type_name = message_type.DESCRIPTOR.full_name
    largest = limits.longest_taken(message_type.DESCRIPTOR)
    # Longer than any request within the limits: refused on its length, before it is
    # parsed (O(1); a parse costs time and memory in proportion to what was sent).
    short_name = type_name.removeprefix("lightpath.v1.")

    def deserialize(raw: bytes) -> Any:
        if len(raw) > largest:
            too_long = InvalidArgument(
                "request",
                f"at most {largest:,} bytes for a {short_name}, every field at its limit "
                f"(got {len(raw):,}); see lightpath.limits",
                reason="REQUEST_TOO_LARGE",
            )
            return _Undecodable(type_name, "", too_long)
        if len(raw) >= limits.PRESCAN_ABOVE:
            # Under the type's bound but perhaps a repeated field far over its limit
            # (a million empty entries are 2 MB): counted on the wire, unparsed.
            too_many = limits.count_check(message_type.DESCRIPTOR, raw)
            if too_many is not None:
                return _Undecodable(type_name, "", too_many)
        try:
            request = parse(raw)
        except DecodeError as exc:
            if len(raw) >= heap.GIVE_BACK_ABOVE:
                heap.give_back()
            # "Error parsing message with type 'X': Wire format was corrupt" -> the why
            return _Undecodable(type_name, str(exc).rpartition(": ")[2] or "malformed")
        try:
            limits.check(request)
        except InvalidArgument as exc:
            # Without its traceback: that holds this frame, and so the parsed request.
            refused = exc.with_traceback(None)
        else:
            return request
        del request
        if len(raw) >= heap.GIVE_BACK_ABOVE:
            heap.give_back()
        return _Undecodable(type_name, "", refused)

    return deserialize


async def _checked(requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """A request stream that raises INVALID_ARGUMENT at the first message that did not parse."""
    index = 0
    async for request in requests:
        if type(request) is _Undecodable:
            raise request.error(index)
        yield request
        index += 1


def _mapped(exc: Exception) -> Exception:
    """`exc` as the domain error it means: a Redis failure is UNAVAILABLE (X-3)."""
    if isinstance(exc, LightpathError | grpc.aio.AbortError):
        return exc
    return from_redis(exc) or exc


class _Gate:
    """One call's pass through the Guard: admit, bind the caller, audit on the way out."""

    __slots__ = ("entered", "guard", "message", "method", "principal", "rule", "token")

    def __init__(self, guard: Guard | None, method: str):
        self.guard = guard
        self.method = method
        self.rule: Any = None
        self.principal: Any = None
        self.token: Any = None
        self.message = ""
        self.entered = False

    async def enter(self, context: grpc.aio.ServicerContext, span: trace.Span | None) -> None:
        """Authenticate and authorize the caller (once: a call the server thought of
        shedding was let in already; again when that failed, now in `span`)."""
        guard = self.guard
        if guard is None:
            return
        if self.entered:
            if span is not None and self.principal is not None:
                span.set_attribute("lightpath.principal", str(self.principal))
            return
        rule = self.rule = guard.rule(self.method)
        if not rule.public:
            principal = self.principal = await guard.authenticate(context)
            if span is not None:
                span.set_attribute("lightpath.principal", str(principal))
            guard.authorize(self.method, rule, principal)
        self.token = guard.bind(self.principal)
        self.entered = True

    def leave(self, code: grpc.StatusCode, request: Any, *, shed: bool = False) -> None:
        """Unbind the caller and write the audit log: a call shed by admission (`shed`)
        is counted there, not written on its own (lightpath_services.common.audit)."""
        guard = self.guard
        if guard is None:
            return
        if self.token is not None:
            guard.unbind(self.token)
        audit = guard.audit
        if audit is None or not audit.enabled:
            return
        if shed and code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            if self.rule is not None and self.rule.audit:
                audit.shed(method=self.method, principal=str(self.principal))
            return
        if (self.rule is not None and self.rule.audit) or code in _DENIED:
            audit.record(
                method=self.method,
                principal=str(self.principal) if self.principal is not None else "anonymous",
                code=code.name,
                request=request,
                trace_id=current_trace_id(),
                message=self.message if code != grpc.StatusCode.OK else "",
            )


def _code_of(exc: BaseException, context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    if isinstance(exc, LightpathError):
        return grpc.StatusCode[exc.code]
    if isinstance(exc, grpc.aio.AbortError):
        return context.code() or grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.INTERNAL


async def _abort_for(
    exc: Exception,
    span: trace.Span,
    method: str,
    context: grpc.aio.ServicerContext,
    refusals: RefusalLog,
) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        raise exc  # the servicer aborted on purpose: its status stands
    if isinstance(exc, LightpathError):
        status = to_status_proto(exc)
        span.set_status(Status(StatusCode.ERROR, f"{exc.code}: {exc.message}"))
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode[exc.code].value[0])
        cause = exc.__cause__
        infrastructure = isinstance(cause, RedisError)  # the operator's concern, not the caller's
        # Shed calls come by the hundred: the limiter logs a summary instead; other
        # refusals are sampled (RefusalLog), the rest at DEBUG.
        level = (
            logging.WARNING
            if infrastructure
            else logging.INFO
            if exc.reason != OVERLOADED and refusals.admit(method, exc.code)
            else logging.DEBUG
        )
        log.log(
            level,
            "%s -> %s: %s%s",
            method,
            exc.code,
            status.message,
            f" [{type(cause).__name__}: {cause}]" if infrastructure else "",
            extra={"rpc_method": method, "code": exc.code},
        )
        trailers = [("grpc-status-details-bin", status.SerializeToString())]
        if exc.final:  # gRPC's "do not retry" (its retry policy honours a negative pushback)
            trailers.append(("grpc-retry-pushback-ms", "-1"))
        await context.abort(
            grpc.StatusCode[exc.code], status.message, trailing_metadata=tuple(trailers)
        )
    trace_id = current_trace_id()
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
    log.exception(
        "%s failed with an unexpected %s", method, type(exc).__name__, extra={"rpc_method": method}
    )
    await context.abort(
        grpc.StatusCode.INTERNAL, f"internal error (trace {trace_id or 'n/a'}); see the service log"
    )


# -- logging ------------------------------------------------------------------

_STD_ATTRS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "trace_id", "span_id"}


class TraceContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = trace.format_trace_id(ctx.trace_id) if ctx.is_valid else ""
        record.span_id = trace.format_span_id(ctx.span_id) if ctx.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, instance_id: str):
        super().__init__()
        self._static = {"service": service, "instance": instance_id}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self._static,
        }
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            out["trace_id"] = trace_id
            out["span_id"] = getattr(record, "span_id", "")
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = (
                    value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
                )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(
    service: str, instance_id: str, level: str = "info", fmt: str = "json"
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TraceContextFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter(service, instance_id))
    else:
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s %(levelname)s {service} %(name)s [trace=%(trace_id)s] %(message)s"
            )
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
